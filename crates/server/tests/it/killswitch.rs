//! The kill switch in the pipeline (control C5), through `Server::handle_request` with a real
//! reference authority on loopback (mutual TLS, generated certificates) and a signed policy:
//! an incomplete registry refuses to start; DISABLE refuses calls before any handler runs and is
//! audited at stage `killswitch`; ENABLE restores them; an unreachable authority fails closed;
//! a fenced tool obtains its fence, and one that completes without asking for it is refused
//! (audited at stage `killswitch`; as a task, the task fails). (DISABLE between the fence and
//! the commit: the demo's checkout tests in `palisade-apps`.)

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use palisade_killswitch::dev::{DevAuthorityFiles, RunningDevAuthority};
use palisade_killswitch::{KillSwitch, TargetKey, TargetKind};
use palisade_server::auth::{Authenticator, EnvironmentPrincipal};
use palisade_server::clock::{Clock, ManualClock, SystemClock};
use palisade_server::context::NotificationSink;
use palisade_server::killswitch::exposed_operations;
use palisade_server::reply::Reply;
use palisade_server::secret::ServerSecret;
use palisade_server::{
    App, CallToolResult, Effect, Outcome, Server, ServerConfig, SubjectKey, TaskConfig, TaskService, TaskSupport,
    ToolDef,
};
use palisade_store::{AuditStore, Decision, SqliteStore};
use palisade_wire::{Request, RequestId};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

const RELEASE: &str = "9.9.9-test";

#[derive(Default)]
struct Counters {
    counted: AtomicUsize,
    prepared: AtomicUsize,
    committed: AtomicUsize,
    unfenced: AtomicUsize,
}

/// A read-only tool that counts its invocations, a fenced tool that counts preparations and
/// commits (a commit happens only with a fence), and two side-effecting tools (one run as a
/// task) whose handlers never ask for their fence.
fn app(counters: Arc<Counters>) -> App {
    let (counted, fenced, unfenced) = (counters.clone(), counters.clone(), counters);
    let skips_its_fence = move |_, _| {
        let counters = unfenced.clone();
        async move {
            counters.unfenced.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Complete(CallToolResult::text("committed without a fence")))
        }
    };
    App::builder("killswitch-test", "0")
        .tool(ToolDef::new("unfenced").effect(Effect::SideEffecting).handler(skips_its_fence.clone()))
        .tool(
            ToolDef::new("unfenced_task")
                .effect(Effect::SideEffecting)
                .task_support(TaskSupport::Optional)
                .handler(skips_its_fence),
        )
        .tool(ToolDef::new("counted").effect(Effect::ReadOnly).handler(move |_, _| {
            let counters = counted.clone();
            async move {
                counters.counted.fetch_add(1, Ordering::SeqCst);
                Ok(Outcome::Complete(CallToolResult::text("ran")))
            }
        }))
        .tool(ToolDef::new("fenced").effect(Effect::SideEffecting).handler(move |ctx, _| {
            let counters = fenced.clone();
            async move {
                counters.prepared.fetch_add(1, Ordering::SeqCst);
                let fence = ctx.pre_side_effect().await?;
                assert!(fence.is_required() && !fence.tokens().is_empty());
                counters.committed.fetch_add(1, Ordering::SeqCst);
                Ok(Outcome::Complete(CallToolResult::text("committed")))
            }
        }))
        .build()
        .unwrap()
}

struct World {
    _dir: tempfile::TempDir,
    files: DevAuthorityFiles,
    authority: Option<RunningDevAuthority>,
    server: Arc<Server>,
    switch: Arc<KillSwitch>,
    counters: Arc<Counters>,
    audit: Arc<SqliteStore>,
}

fn principal() -> Authenticator {
    Authenticator::Environment(EnvironmentPrincipal {
        subject: "alice".into(),
        tenant: Some("acme".into()),
        client_id: Some("it".into()),
        scopes: BTreeSet::new(),
    })
}

/// `reachable = false`: the kill switch asks an address where no authority listens.
async fn world(reachable: bool) -> World {
    world_with_clock(reachable, Arc::new(SystemClock)).await
}

/// [`world`] with the kill switch reading `clock`.
async fn world_with_clock(reachable: bool, clock: Arc<dyn Clock>) -> World {
    let dir = tempfile::tempdir().unwrap();
    let files = DevAuthorityFiles::new(dir.path().join("ks"));
    let counters = Arc::new(Counters::default());
    let app = app(counters.clone());
    let exposed = exposed_operations(&app);
    files.prepare(&exposed, SystemClock.now_ms()).unwrap();
    let authority = files.start_authority().await.unwrap();
    let url = if reachable { authority.url.clone() } else { "https://127.0.0.1:9".to_owned() };
    let keys = exposed.iter().map(|operation| operation.key.clone()).collect();
    let switch = Arc::new(files.kill_switch_with_clock(&url, keys, clock.clone()).await.unwrap());
    let audit = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let key = SubjectKey::from_bytes(&[9u8; 32]).unwrap();
    // One clock for every part (the builder refuses two).
    let tasks = Arc::new(TaskService::new(audit.clone(), key, TaskConfig::default(), clock.clone()));
    let server = Server::builder(app, ServerConfig::default(), principal(), ServerSecret::random())
        .clock(clock)
        .audit(audit.clone())
        .tasks(tasks)
        .kill_switch(switch.clone(), RELEASE)
        .build()
        .unwrap();
    World { _dir: dir, files, authority: Some(authority), server: Arc::new(server), switch, counters, audit }
}

impl World {
    async fn call(&self, tool: &str) -> Reply {
        self.send(request("tools/call", json!({ "name": tool, "arguments": {} }))).await
    }

    async fn send(&self, request: Request) -> Reply {
        let (sink, _receiver) = NotificationSink::channel(16);
        self.server.handle_request(request, None, sink, CancellationToken::new()).await
    }

    async fn set(&self, kind: TargetKind, value: &str, disable: bool) {
        let key = TargetKey::read(&self.files.target_key()).unwrap();
        let db = &self.authority.as_ref().unwrap().db;
        let target = key.digest(kind, value);
        if disable {
            db.disable(&target, "test", SystemClock.now_ms()).await.unwrap();
        } else {
            db.enable(&target, "test", SystemClock.now_ms()).await.unwrap();
        }
    }
}

fn request(method: &str, params: Value) -> Request {
    request_with(method, params, json!({}))
}

fn request_with(method: &str, params: Value, capabilities: Value) -> Request {
    let mut params: Map<String, Value> = params.as_object().cloned().unwrap();
    let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities });
    params.insert("_meta".into(), meta);
    Request { id: RequestId::Number(1), method: method.into(), params }
}

fn tasks_capabilities() -> Value {
    json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } })
}

fn error_code(reply: &Reply) -> Option<i64> {
    reply.frame["error"]["code"].as_i64()
}

#[tokio::test]
async fn a_registry_missing_an_exposed_operation_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let files = DevAuthorityFiles::new(dir.path().join("ks"));
    let app = app(Arc::default());
    let mut exposed = exposed_operations(&app);
    assert!(exposed.iter().any(|operation| operation.key == "tools/call:fenced"));
    assert!(exposed.iter().any(|operation| operation.key == "tools/list"));
    exposed.retain(|operation| operation.key != "tools/call:fenced");
    // A policy signed for a registry without `fenced` …
    files.prepare(&exposed, SystemClock.now_ms()).unwrap();
    let keys = exposed.iter().map(|operation| operation.key.clone()).collect();
    let switch = files.kill_switch("https://127.0.0.1:9", keys).await.unwrap();
    // … cannot guard a server that exposes it.
    let refused = Server::builder(app, ServerConfig::default(), principal(), ServerSecret::random())
        .without_audit()
        .kill_switch(Arc::new(switch), RELEASE)
        .build()
        .err()
        .expect("start must be refused");
    let palisade_server::BuildError::KillSwitchRegistry(refused) = refused else { panic!("{refused}") };
    assert_eq!(refused.missing, vec!["tools/call:fenced".to_owned()]);
}

#[tokio::test]
async fn disable_refuses_before_the_handler_and_enable_restores() {
    let world = world(true).await;
    let ok = world.call("counted").await;
    assert_eq!(ok.status, 200, "{}", ok.frame);
    assert_eq!(world.counters.counted.load(Ordering::SeqCst), 1);

    world.set(TargetKind::Tool, "counted", true).await;
    for _ in 0..3 {
        let refused = world.call("counted").await;
        // An application refusal: a JSON-RPC error in a 200 (clients show it as an error).
        assert_eq!((refused.status, error_code(&refused)), (200, Some(-32030)), "{}", refused.frame);
        assert_eq!(refused.frame["error"]["message"], "operation disabled");
    }
    assert_eq!(world.counters.counted.load(Ordering::SeqCst), 1, "no handler ran while disabled");
    // Another tool is untouched by a tool-scoped DISABLE.
    assert_eq!(world.call("fenced").await.status, 200);

    // The refusal is audited at stage killswitch with the policy generation.
    let recent = world.audit.recent(20).await.unwrap();
    let deny = recent.iter().find(|stored| stored.record.stage == "killswitch").expect("a killswitch deny");
    assert_eq!(deny.record.operation, "tools/call:counted");
    assert_eq!(deny.record.code, Some(-32030));
    assert!(deny.record.policy_version.as_deref().is_some_and(|v| v.starts_with("killswitch:")));

    world.set(TargetKind::Tool, "counted", false).await;
    assert_eq!(world.call("counted").await.status, 200);
    assert_eq!(world.counters.counted.load(Ordering::SeqCst), 2);

    // A DISABLE of the server release (every operation's target) stops everything.
    world.set(TargetKind::ServerRelease, RELEASE, true).await;
    assert_eq!(error_code(&world.call("counted").await), Some(-32030));
    world.set(TargetKind::ServerRelease, RELEASE, false).await;
    assert_eq!(world.call("counted").await.status, 200);
}

#[tokio::test]
async fn an_unreachable_authority_fails_closed() {
    let world = world(false).await;
    for tool in ["counted", "fenced"] {
        let refused = world.call(tool).await;
        assert_eq!(refused.status, 503, "{}", refused.frame);
    }
    assert_eq!(world.counters.counted.load(Ordering::SeqCst), 0);
    assert_eq!(world.counters.prepared.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_observed_disable_ends_the_listen_streams_it_covers() {
    let world = world(true).await;
    let (sink, mut frames) = NotificationSink::channel(16);
    let listen = request("subscriptions/listen", json!({ "notifications": { "toolsListChanged": true } }));
    let server = world.server.clone();
    let stream = tokio::spawn(async move { server.handle_request(listen, None, sink, CancellationToken::new()).await });
    let ack = frames.recv().await.unwrap();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    // The listen operation's targets include the server release; once any check observes its
    // DISABLE, the stream ends with its complete result.
    world.set(TargetKind::ServerRelease, RELEASE, true).await;
    assert_eq!(error_code(&world.call("counted").await), Some(-32030));
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), stream).await.unwrap().unwrap();
    assert_eq!(ended.frame["result"]["resultType"], "complete", "{}", ended.frame);
    // A new stream is refused while disabled.
    let (sink, _frames) = NotificationSink::channel(16);
    let listen = request("subscriptions/listen", json!({ "notifications": { "toolsListChanged": true } }));
    let refused = world.server.handle_request(listen, None, sink, CancellationToken::new()).await;
    assert_eq!((refused.status, error_code(&refused)), (200, Some(-32030)));
}

/// Waits (real time, bounded) until the kill switch has sent more than `before` batches.
async fn batches_beyond(switch: &KillSwitch, before: u64) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while switch.batch_stats().unwrap().0 <= before {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a re-check was sent");
}

/// Open listen streams re-check their targets every `stream_recheck` on the kill switch's clock
/// (moved here by hand), through the batched path: ENABLE keeps them open, a DISABLE no request
/// observed ends them, and so does any doubt (the authority gone).
#[tokio::test]
async fn open_listen_streams_recheck_on_the_clock_and_end_on_disable_or_doubt() {
    // Ahead of the authority's clock by a second, so its heads are never "from the future".
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms() + 1_000));
    let world = world_with_clock(true, clock.clone()).await;
    assert_eq!(world.switch.stream_recheck(), Duration::from_secs(5), "the default");
    world.switch.set_stream_recheck(Duration::from_secs(1));
    let listen = || request("subscriptions/listen", json!({ "notifications": { "toolsListChanged": true } }));
    let open = |world: &World| {
        let (sink, frames) = NotificationSink::channel(16);
        let server = world.server.clone();
        let listen = listen();
        (tokio::spawn(async move { server.handle_request(listen, None, sink, CancellationToken::new()).await }), frames)
    };
    let (stream, mut frames) = open(&world);
    assert_eq!(frames.recv().await.unwrap()["method"], "notifications/subscriptions/acknowledged");

    // The clock moves: the stream re-checks (one more batch), finds ENABLE and stays open.
    let before = world.switch.batch_stats().unwrap().0;
    clock.advance_ms(1_000);
    batches_beyond(&world.switch, before).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!stream.is_finished(), "ENABLE keeps the stream open");

    // A DISABLE that no request observes: nothing happens until the clock moves again.
    world.set(TargetKind::Tenant, "acme", true).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!stream.is_finished(), "no re-check before the interval has passed on the clock");
    clock.advance_ms(1_000);
    let ended = tokio::time::timeout(Duration::from_secs(5), stream).await.unwrap().unwrap();
    assert_eq!(ended.frame["result"]["resultType"], "complete", "{}", ended.frame);
    world.set(TargetKind::Tenant, "acme", false).await;

    // Doubt: the clock jumps past the freshness bound; the next re-check's answer cannot be
    // fresh, and the stream ends.
    let (stream, mut frames) = open(&world);
    assert_eq!(frames.recv().await.unwrap()["method"], "notifications/subscriptions/acknowledged");
    clock.advance_ms(10_000);
    let ended = tokio::time::timeout(Duration::from_secs(10), stream).await.unwrap().unwrap();
    assert_eq!(ended.frame["result"]["resultType"], "complete", "{}", ended.frame);
}

#[tokio::test]
async fn a_fenced_tool_that_never_asks_for_its_fence_is_refused_and_audited() {
    let world = world(true).await;
    let refused = world.call("unfenced").await;
    // The generic internal error, nothing more: no result, no kill-switch detail.
    assert_eq!(refused.status, 500, "{}", refused.frame);
    assert_eq!(refused.frame["error"], json!({ "code": -32603, "message": "internal error" }));
    assert!(refused.frame.get("result").is_none(), "{}", refused.frame);
    assert_eq!(world.counters.unfenced.load(Ordering::SeqCst), 1, "refused after the handler ran");

    // Audited as a deny at stage killswitch (after the allow that let the handler run).
    let recent = world.audit.recent(20).await.unwrap();
    let deny = recent.iter().find(|stored| stored.record.stage == "killswitch").expect("a killswitch deny");
    assert_eq!(deny.record.decision, Decision::Deny);
    assert_eq!(deny.record.operation, "tools/call:unfenced");
    assert_eq!(deny.record.code, Some(-32603));
    assert!(deny.record.policy_version.as_deref().is_some_and(|v| v.starts_with("killswitch:")));

    // A fenced tool that asks for its fence, and a tool that needs none, are unaffected.
    assert_eq!(world.call("fenced").await.status, 200);
    assert_eq!(world.call("counted").await.status, 200);
    assert_eq!(world.counters.committed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_fenced_task_that_never_asks_for_its_fence_fails() {
    let world = world(true).await;
    let call = json!({ "name": "unfenced_task", "arguments": {} });
    let created = world.send(request_with("tools/call", call, tasks_capabilities())).await;
    assert_eq!(created.frame["result"]["resultType"], "task", "{}", created.frame);
    let task_id = created.frame["result"]["taskId"].as_str().unwrap().to_owned();
    let task = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let get = request_with("tasks/get", json!({ "taskId": task_id }), tasks_capabilities());
            let task = world.send(get).await.frame["result"].clone();
            if task["status"] != "working" {
                return task;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the task ends");
    assert_eq!(task["status"], "failed", "{task}");
    assert_eq!(task["error"], json!({ "code": -32603, "message": "internal error" }));
    assert!(task.get("result").is_none(), "{task}");
    assert_eq!(world.counters.unfenced.load(Ordering::SeqCst), 1);

    // The worker's own decisions are in the audit log: the execution-time check that let the
    // handler run, then the refusal; both name the task by digest prefix and the principal by
    // digest, never by value.
    let recent = world.audit.recent(50).await.unwrap();
    let segment: Vec<_> =
        recent.iter().rev().filter(|stored| stored.record.stage == "killswitch").map(|stored| &stored.record).collect();
    assert_eq!(segment.len(), 2, "{segment:?}");
    assert_eq!((segment[0].decision, segment[0].code), (Decision::Allow, None));
    assert_eq!((segment[1].decision, segment[1].code), (Decision::Deny, Some(-32603)));
    let creation = recent
        .iter()
        .find(|stored| stored.record.stage == "authorize" && stored.record.operation == "tools/call:unfenced_task")
        .expect("the creating request's allow");
    for record in &segment {
        assert_eq!(record.operation, "tools/call:unfenced_task");
        assert!(record.detail.as_deref().is_some_and(|d| d.starts_with("task=")), "{record:?}");
        assert!(!record.detail.as_deref().unwrap_or("").contains(&task_id), "the raw task id is in the log");
        assert!(record.policy_version.as_deref().is_some_and(|v| v.starts_with("killswitch:")));
        assert!(record.principal_digest.is_some());
        assert_eq!(record.principal_digest, creation.record.principal_digest, "the stored principal");
        assert_eq!(record.tenant_digest, creation.record.tenant_digest);
    }
    assert!(world.audit.verify_chain().await.unwrap().is_intact());
}

/// Every order of permutations of `items`.
fn permutations<T: Copy>(items: &[T]) -> Vec<Vec<T>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut all = Vec::new();
    for (i, first) in items.iter().enumerate() {
        let rest: Vec<T> = items.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, item)| *item).collect();
        for mut tail in permutations(&rest) {
            tail.insert(0, *first);
            all.push(tail);
        }
    }
    all
}

/// The builder wires the parts together at `build`, so the order they are given in cannot
/// leave the task workers without the kill switch (it once could: `with_kill_switch` before
/// `with_tasks` gave workers no execution-time check). In each of the 24 orders, a task's
/// worker makes its own kill-switch decision, on the record, before its handler runs.
#[tokio::test]
async fn in_every_order_of_parts_the_task_worker_checks_the_kill_switch() {
    #[derive(Clone, Copy)]
    enum Part {
        Audit,
        Tasks,
        KillSwitch,
        Once,
    }
    let world = world(true).await;
    let orders = permutations(&[Part::Audit, Part::Tasks, Part::KillSwitch, Part::Once]);
    assert_eq!(orders.len(), 24);
    for order in orders {
        let audit = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
        let key = SubjectKey::from_bytes(&[9u8; 32]).unwrap();
        let tasks = Arc::new(TaskService::new(audit.clone(), key, TaskConfig::default(), Arc::new(SystemClock)));
        let mut builder =
            Server::builder(app(world.counters.clone()), ServerConfig::default(), principal(), ServerSecret::random())
                .without_audit();
        for part in order {
            builder = match part {
                Part::Audit => builder.audit(audit.clone()),
                Part::Tasks => builder.tasks(tasks.clone()),
                Part::KillSwitch => builder.kill_switch(world.switch.clone(), RELEASE),
                Part::Once => builder.once_store(audit.clone()),
            };
        }
        let server = builder.build().unwrap();
        let (sink, _receiver) = NotificationSink::channel(16);
        let call = json!({ "name": "unfenced_task", "arguments": {} });
        let created = server
            .handle_request(
                request_with("tools/call", call, tasks_capabilities()),
                None,
                sink,
                CancellationToken::new(),
            )
            .await;
        assert_eq!(created.frame["result"]["resultType"], "task", "{}", created.frame);
        let segment = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let recent = audit.recent(20).await.unwrap();
                // The allow that let the handler run (the handler skips its fence, so a deny follows).
                let found = recent.into_iter().find(|stored| {
                    stored.record.stage == "killswitch"
                        && stored.record.decision == Decision::Allow
                        && stored.record.detail.as_deref().is_some_and(|d| d.starts_with("task="))
                });
                if let Some(found) = found {
                    return found.record;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the worker's own kill-switch decision is recorded");
        assert_eq!(segment.decision, Decision::Allow);
        assert!(segment.policy_version.as_deref().is_some_and(|v| v.starts_with("killswitch:")));
    }
}

/// A snapshot the kill switch's signed registry does not cover is refused while serving, as it
/// is at build time; the snapshot in force stays.
#[tokio::test]
async fn publishing_an_uncovered_snapshot_is_refused_and_changes_nothing() {
    let world = world(true).await;
    let mut bigger = App::builder("killswitch-test", "0");
    for name in ["counted", "unlisted"] {
        bigger = bigger
            .tool(ToolDef::new(name).handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("ran"))) }));
    }
    let refused = world.server.publish(bigger.build().unwrap()).expect_err("an uncovered snapshot");
    assert!(refused.to_string().contains("tools/call:unlisted"), "{refused}");
    assert!(world.server.app().tools().iter().any(|tool| tool.name() == "fenced"), "the old snapshot stays");
    let reply = world.call("counted").await;
    assert_eq!(reply.frame["result"]["content"][0]["text"], "ran", "{}", reply.frame);
}
