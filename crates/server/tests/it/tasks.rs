//! Durable, partitioned Tasks through the whole request path (seed 002, "Verify safely"): the
//! missing extension, invalid and foreign ids, durable-before-response, flat fields, partial and
//! duplicate updates, terminal immutability, cancel races, restart recovery, removed methods,
//! routing names, cross-user/client/tenant authorization, listen delivery re-authorized per event,
//! and two instances sharing one PostgreSQL store. Real tokens, real HTTP, SQLite and PostgreSQL.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use palisade_auth::dev_issuer::DevIssuer;
use palisade_auth::{JwksPolicy, ResourceServerConfig, TokenVerifier};
use palisade_server::auth::Authenticator;
use palisade_server::clock::{Clock, ManualClock};
use palisade_server::secret::ServerSecret;
use palisade_server::{
    App, CallToolResult, InputRequired, Outcome, ProtocolError, Server, ServerConfig, SubjectKey, TaskConfig,
    TaskService, TaskSupport, ToolDef,
};
use palisade_store::Store;
use serde_json::{Value, json};

use crate::common::{Backend, TempDir, fresh_store, rpc, temp_dir, unique, wait_until};

const RESOURCE: &str = "http://127.0.0.1:1/mcp";
const ISSUER: &str = "http://127.0.0.1:1/dev-issuer";
const START_MS: u64 = 1_800_000_000_000;

fn tasks_caps() -> Value {
    json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } })
}

/// Handler runs started, per tool, and runs of `job` ended (returned or dropped).
#[derive(Clone, Default)]
struct Counters {
    job_runs: Arc<AtomicUsize>,
    job_ends: Arc<AtomicUsize>,
    resumable_runs: Arc<AtomicUsize>,
    once_runs: Arc<AtomicUsize>,
}

impl Counters {
    fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }
}

/// Counts one on drop: a handler's future that returns or is dropped has ended either way.
struct CountOnDrop(Arc<AtomicUsize>);

impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn app(counters: &Counters) -> App {
    let (job_runs, job_ends) = (counters.job_runs.clone(), counters.job_ends.clone());
    let (resumable_runs, once_runs) = (counters.resumable_runs.clone(), counters.once_runs.clone());
    let sleepy = |ms: u64, ctx: palisade_server::RequestContext| async move {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(ms)) => Ok(Outcome::Complete(CallToolResult::text(format!("slept {ms}")))),
            () = ctx.cancellation().cancelled() => Err(ProtocolError::Internal),
        }
    };
    App::builder("tasks-test", "0")
        .tool(
            ToolDef::new("job")
                .scopes(&["jobs:run"])
                .input_schema(json!({ "type": "object", "properties": { "ms": { "type": "integer" } } }))
                .task_support(TaskSupport::Optional)
                .handler(move |ctx, args| {
                    let (runs, ends) = (job_runs.clone(), job_ends.clone());
                    async move {
                        let _ended = CountOnDrop(ends);
                        runs.fetch_add(1, Ordering::SeqCst);
                        sleepy(args["ms"].as_u64().unwrap_or(0), ctx).await
                    }
                }),
        )
        .tool(
            ToolDef::new("resumable")
                .scopes(&["jobs:run"])
                .input_schema(json!({ "type": "object", "properties": { "ms": { "type": "integer" } } }))
                .task_support(TaskSupport::Optional)
                .idempotent()
                .handler(move |ctx, args| {
                    let runs = resumable_runs.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        sleepy(args["ms"].as_u64().unwrap_or(0), ctx).await
                    }
                }),
        )
        .tool(
            ToolDef::new("once")
                .scopes(&["jobs:run"])
                .input_schema(json!({ "type": "object", "properties": { "ms": { "type": "integer" } } }))
                .task_support(TaskSupport::Optional)
                .handler(move |ctx, args| {
                    let runs = once_runs.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        sleepy(args["ms"].as_u64().unwrap_or(0), ctx).await
                    }
                }),
        )
        .tool(ToolDef::new("ask").scopes(&["jobs:run"]).task_support(TaskSupport::Optional).handler(
            |ctx, _| async move {
                let (a, b) = (ctx.input_response("a").cloned(), ctx.input_response("b").cloned());
                match (a, b) {
                    (Some(a), Some(b)) => Ok(Outcome::Complete(CallToolResult::structured(json!({ "a": a, "b": b })))),
                    (a, b) => {
                        let mut input = InputRequired::new();
                        if a.is_none() {
                            input = input.elicit("a", "First?", json!({ "type": "object" }));
                        }
                        if b.is_none() {
                            input = input.elicit("b", "Second?", json!({ "type": "object" }));
                        }
                        Ok(Outcome::InputRequired(input))
                    }
                }
            },
        ))
        .tool(ToolDef::new("boom").scopes(&["jobs:run"]).task_support(TaskSupport::Optional).handler(|_, _| async {
            let crash: Result<Outcome<CallToolResult>, ProtocolError> = Err(ProtocolError::Internal);
            if crash.is_err() {
                panic!("the tool crashed");
            }
            crash
        }))
        .tool(
            ToolDef::new("must_task")
                .scopes(&["jobs:run"])
                .task_support(TaskSupport::Required)
                .handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("done"))) }),
        )
        .build()
        .unwrap()
}

struct Instance {
    url: String,
    tasks: Arc<TaskService>,
    server: Arc<Server>,
}

struct Fixture {
    a: Instance,
    store: Arc<dyn Store>,
    issuer: DevIssuer,
    clock: Arc<ManualClock>,
    counters: Counters,
    _dir: TempDir,
    _issuer_dir: TempDir,
}

fn task_config() -> TaskConfig {
    TaskConfig {
        ttl: Some(Duration::from_secs(60)),
        poll_interval: Duration::from_millis(100),
        lease: Duration::from_secs(30),
        cancel_poll: Duration::from_millis(20),
    }
}

async fn instance(
    store: Arc<dyn Store>,
    issuer: &DevIssuer,
    clock: &Arc<ManualClock>,
    counters: &Counters,
) -> Instance {
    let metadata = "http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp";
    let config = ResourceServerConfig::new(RESOURCE, metadata, vec![issuer.issuer_config()]);
    let clock: Arc<dyn Clock> = clock.clone();
    let verifier = TokenVerifier::with_clock_and_policy(config, clock.clone(), JwksPolicy::default()).unwrap();
    let key = SubjectKey::from_bytes(&[9u8; 32]).unwrap();
    let tasks = Arc::new(TaskService::new(store.clone(), key, task_config(), clock.clone()));
    let server = Server::builder(
        app(counters),
        ServerConfig::default(),
        Authenticator::Bearer(Arc::new(verifier)),
        ServerSecret::random(),
    )
    .audit(store)
    .tasks(tasks.clone())
    .clock(clock)
    .build()
    .unwrap();
    let server = Arc::new(server);
    let url = crate::common::serve_on_loopback(&server).await;
    Instance { url, tasks, server }
}

async fn start(backend: Backend) -> Fixture {
    palisade_auth::install_crypto_provider();
    let (store, dir) = fresh_store(backend, None).await;
    let issuer_dir = temp_dir(&unique("task-issuer"));
    let clock = Arc::new(ManualClock::new(START_MS as i64));
    let issuer = DevIssuer::load_or_create(&issuer_dir.0, ISSUER).unwrap().with_clock(clock.clone());
    let counters = Counters::default();
    let a = instance(store.clone(), &issuer, &clock, &counters).await;
    Fixture { a, store, issuer, clock, counters, _dir: dir, _issuer_dir: issuer_dir }
}

impl Fixture {
    fn token(&self, subject: &str, tenant: &str, client: &str) -> String {
        self.issuer.mint(subject, tenant, client, &["jobs:run"], RESOURCE, 600).unwrap()
    }
    fn alice(&self) -> String {
        self.token("alice", "acme", "cli")
    }
}

async fn call_tool(url: &str, token: &str, tool: &str, arguments: Value, caps: Value) -> (u16, Value) {
    rpc(url, Some(token), "tools/call", json!({ "name": tool, "arguments": arguments }), caps).await
}

async fn create(url: &str, token: &str, tool: &str, arguments: Value) -> String {
    let (status, body) = call_tool(url, token, tool, arguments, tasks_caps()).await;
    assert_eq!(status, 200, "{body}");
    let result = &body["result"];
    assert_eq!(result["resultType"], "task", "{body}");
    for key in ["inputRequests", "result", "error", "task", "requestState"] {
        assert!(result.get(key).is_none(), "CreateTaskResult is flat: {key} present in {body}");
    }
    result["taskId"].as_str().unwrap().to_owned()
}

async fn task(url: &str, token: &str, method: &str, id: &str, extra: Value) -> (u16, Value) {
    let mut params = json!({ "taskId": id });
    if let Value::Object(extra) = extra {
        params.as_object_mut().unwrap().extend(extra);
    }
    rpc(url, Some(token), method, params, tasks_caps()).await
}

async fn get(url: &str, token: &str, id: &str) -> Value {
    let (status, body) = task(url, token, "tasks/get", id, json!({})).await;
    assert_eq!(status, 200, "{body}");
    body["result"].clone()
}

async fn settle(url: &str, token: &str, id: &str) -> Value {
    for _ in 0..200 {
        let current = get(url, token, id).await;
        if ["completed", "failed", "cancelled", "input_required"].contains(&current["status"].as_str().unwrap()) {
            return current;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("task {id} did not settle");
}

fn expect_invalid(status: u16, body: &Value, why: &str) {
    assert_eq!((status, body["error"]["code"].as_i64()), (400, Some(-32602)), "{why}: {body}");
    assert_eq!(body["error"]["message"], "invalid params: unknown or expired taskId", "{why}: {body}");
}

// ---- The cases ---------------------------------------------------------------------------------

async fn extension_gates_and_removed_methods(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    // Without the extension: a task-capable tool runs synchronously; a required one is -32021.
    let (_, body) = call_tool(&f.a.url, &alice, "job", json!({ "ms": 0 }), json!({})).await;
    assert_eq!(body["result"]["resultType"], "complete", "{body}");
    assert!(body["result"].get("taskId").is_none());
    let (_, body) = call_tool(&f.a.url, &alice, "must_task", json!({}), json!({})).await;
    assert_eq!(body["error"]["code"], -32021, "{body}");
    assert_eq!(body["error"]["data"]["requiredCapabilities"], tasks_caps());
    // tasks/* without the extension: -32021 before the id is even looked at.
    let id = create(&f.a.url, &alice, "job", json!({ "ms": 0 })).await;
    for method in ["tasks/get", "tasks/update", "tasks/cancel"] {
        let (_, body) =
            rpc(&f.a.url, Some(&alice), method, json!({ "taskId": id, "inputResponses": {} }), json!({})).await;
        assert_eq!(body["error"]["code"], -32021, "{method}: {body}");
    }
    for method in ["tasks/list", "tasks/result"] {
        let (_, body) = rpc(&f.a.url, Some(&alice), method, json!({ "taskId": id }), tasks_caps()).await;
        assert_eq!(body["error"]["code"], -32601, "{method}: {body}");
    }
    // Mcp-Name must be the task id.
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": { "taskId": id, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": tasks_caps() } } });
    let response = reqwest::Client::new()
        .post(&f.a.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tasks/get")
        .header("mcp-name", "another-task")
        .header("authorization", format!("Bearer {alice}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(response.json::<Value>().await.unwrap()["error"]["code"], -32020);
}

async fn foreign_unknown_and_expired_ids_look_the_same(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    let id = create(&f.a.url, &alice, "job", json!({ "ms": 0 })).await;
    // Durable before the response: an immediate get resolves, with every flat field.
    let now = get(&f.a.url, &alice, &id).await;
    assert_eq!(now["taskId"], id.as_str());
    assert_eq!(now["ttlMs"], 60_000);
    assert!(now["createdAt"].as_str().unwrap().ends_with('Z') && now["pollIntervalMs"] == 100);
    for (subject, tenant, client) in [("mallory", "acme", "cli"), ("alice", "evil", "cli"), ("alice", "acme", "web")] {
        let other = f.token(subject, tenant, client);
        for method in ["tasks/get", "tasks/update", "tasks/cancel"] {
            let (status, body) = task(&f.a.url, &other, method, &id, json!({ "inputResponses": {} })).await;
            expect_invalid(status, &body, &format!("{subject}/{tenant}/{client} {method}"));
        }
    }
    let (status, body) = task(&f.a.url, &alice, "tasks/get", "no-such-task", json!({})).await;
    expect_invalid(status, &body, "unknown id");
    // The foreign cancel changed nothing.
    let settled = settle(&f.a.url, &alice, &id).await;
    assert_eq!(settled["status"], "completed", "{settled}");
    f.clock.advance_ms(60_000);
    let (status, body) = task(&f.a.url, &alice, "tasks/get", &id, json!({})).await;
    expect_invalid(status, &body, "expired (ttl)");
}

async fn lifecycle_results_errors_and_terminal_immutability(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    let done = create(&f.a.url, &alice, "job", json!({ "ms": 10 })).await;
    let settled = settle(&f.a.url, &alice, &done).await;
    assert_eq!(settled["status"], "completed");
    assert_eq!(settled["result"]["content"][0]["text"], "slept 10");
    assert!(settled.get("error").is_none() && settled.get("inputRequests").is_none());
    // A crashing tool fails the task (protocol error inlined), not the server.
    let crashed = create(&f.a.url, &alice, "boom", json!({})).await;
    let failed = settle(&f.a.url, &alice, &crashed).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], -32603);
    assert!(failed.get("result").is_none());
    // Terminal is final: cancel and update acknowledge and change nothing.
    for (method, extra) in [("tasks/cancel", json!({})), ("tasks/update", json!({ "inputResponses": { "a": 1 } }))] {
        let (status, body) = task(&f.a.url, &alice, method, &done, extra).await;
        assert_eq!(status, 200);
        assert_eq!(body["result"]["resultType"], "complete");
        assert!(body["result"].get("taskId").is_none(), "acks carry no task envelope: {body}");
    }
    assert_eq!(get(&f.a.url, &alice, &done).await["status"], "completed");
    // History: every status passed through, in order.
    let principal_history = f.store.task_history(palisade_server::tasks::task_digest(&done)).await.unwrap();
    let statuses: Vec<&str> = principal_history.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(statuses, ["working", "completed"]);
}

async fn partial_and_duplicate_updates(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    let id = create(&f.a.url, &alice, "ask", json!({})).await;
    let waiting = settle(&f.a.url, &alice, &id).await;
    assert_eq!(waiting["status"], "input_required");
    let mut keys: Vec<&String> = waiting["inputRequests"].as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["a", "b"]);
    // A subset plus an unknown key: the unknown one is ignored, the task keeps waiting for "b".
    let (_, body) =
        task(&f.a.url, &alice, "tasks/update", &id, json!({ "inputResponses": { "a": 1, "zzz": 9 } })).await;
    assert_eq!(body["result"]["resultType"], "complete", "{body}");
    let partial = get(&f.a.url, &alice, &id).await;
    assert_eq!(partial["status"], "input_required");
    assert_eq!(partial["inputRequests"].as_object().unwrap().keys().collect::<Vec<_>>(), ["b"]);
    // Answering "a" again (a duplicate) changes nothing; answering "b" resumes and completes.
    task(&f.a.url, &alice, "tasks/update", &id, json!({ "inputResponses": { "a": 2 } })).await;
    task(&f.a.url, &alice, "tasks/update", &id, json!({ "inputResponses": { "b": 3 } })).await;
    let done = settle(&f.a.url, &alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"], json!({ "a": 1, "b": 3 }), "the first answer to a key stands");
}

async fn cancellation_races(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    // A running task observes the recorded intent and settles cancelled.
    let started = Counters::get(&f.counters.job_runs);
    let id = create(&f.a.url, &alice, "job", json!({ "ms": 30_000 })).await;
    wait_until("the job's handler to start", || Counters::get(&f.counters.job_runs) > started).await;
    let (_, ack) = task(&f.a.url, &alice, "tasks/cancel", &id, json!({})).await;
    assert_eq!(ack["result"], json!({ "resultType": "complete", "_meta": ack["result"]["_meta"] }));
    assert_eq!(settle(&f.a.url, &alice, &id).await["status"], "cancelled");
    // A task waiting for input is cancelled at once.
    let waiting = create(&f.a.url, &alice, "ask", json!({})).await;
    settle(&f.a.url, &alice, &waiting).await;
    task(&f.a.url, &alice, "tasks/cancel", &waiting, json!({})).await;
    assert_eq!(get(&f.a.url, &alice, &waiting).await["status"], "cancelled");
    // Cancel racing completion: whichever wins, the task ends in exactly one terminal state and
    // stays there.
    for _ in 0..10 {
        let id = create(&f.a.url, &alice, "job", json!({ "ms": 5 })).await;
        task(&f.a.url, &alice, "tasks/cancel", &id, json!({})).await;
        let end = settle(&f.a.url, &alice, &id).await["status"].as_str().unwrap().to_owned();
        assert!(end == "completed" || end == "cancelled", "{end}");
        // Once every handler run has ended (none is left to write a result), and a second
        // cancel, the state is still the one it settled in.
        wait_until("every job handler to end", || {
            Counters::get(&f.counters.job_ends) == Counters::get(&f.counters.job_runs)
        })
        .await;
        task(&f.a.url, &alice, "tasks/cancel", &id, json!({})).await;
        assert_eq!(get(&f.a.url, &alice, &id).await["status"], end.as_str());
    }
}

async fn listen_delivers_only_owned_tasks_with_full_state(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    let mallory = f.token("mallory", "acme", "cli");
    let mine = create(&f.a.url, &alice, "ask", json!({})).await;
    let theirs = create(&f.a.url, &mallory, "ask", json!({})).await;
    settle(&f.a.url, &alice, &mine).await;
    let mut reader = open_listen(&f.a.url, &alice, json!([mine, theirs, "made-up"])).await;
    let mut frames: Vec<Value> = Vec::new();
    let ack = reader.next().await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([mine]), "unowned ids dropped: {ack}");
    // Mallory's task changes: nothing for Alice. Alice's task changes: the full DetailedTask.
    task(&f.a.url, &mallory, "tasks/cancel", &theirs, json!({})).await;
    task(&f.a.url, &alice, "tasks/update", &mine, json!({ "inputResponses": { "a": 1, "b": 2 } })).await;
    loop {
        let frame = reader.next().await;
        assert_eq!(frame["method"], "notifications/tasks", "{frame}");
        assert_eq!(frame["params"]["taskId"], mine.as_str(), "only the listener's own task: {frame}");
        assert_eq!(frame["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "L1");
        let status = frame["params"]["status"].as_str().unwrap().to_owned();
        frames.push(frame);
        if status == "completed" {
            break;
        }
    }
    let last = frames.last().unwrap();
    assert_eq!(last["params"]["result"]["structuredContent"], json!({ "a": 1, "b": 2 }), "{last}");
}

/// Opens a listen stream (id "L1") for `task_ids`.
async fn open_listen(url: &str, token: &str, task_ids: Value) -> SseReader {
    let body = json!({ "jsonrpc": "2.0", "id": "L1", "method": "subscriptions/listen", "params": {
        "notifications": { "taskIds": task_ids }, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": tasks_caps() } } });
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .header("authorization", format!("Bearer {token}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    SseReader { stream: Box::pin(response.bytes_stream()), buffer: String::new() }
}

type ByteStream = std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// Reads `data:` frames off an SSE response.
struct SseReader {
    stream: ByteStream,
    buffer: String,
}

impl SseReader {
    async fn next(&mut self) -> Value {
        use futures::StreamExt as _;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                    return serde_json::from_str(data).unwrap();
                }
                continue;
            }
            let chunk =
                tokio::time::timeout(Duration::from_secs(10), self.stream.next()).await.unwrap().unwrap().unwrap();
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

crate::on_both_backends!(
    extension_gates_and_removed_methods,
    foreign_unknown_and_expired_ids_look_the_same,
    lifecycle_results_errors_and_terminal_immutability,
    partial_and_duplicate_updates,
    cancellation_races,
    listen_delivers_only_owned_tasks_with_full_state,
);

// ---- Across instances and restarts (PostgreSQL) ------------------------------------------------

/// A task created on A is read and cancelled on B, and B's listener hears about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_tasks_through_postgres() {
    let f = start(Backend::Postgres).await;
    let b = instance(f.store.clone(), &f.issuer, &f.clock, &f.counters).await;
    let alice = f.alice();
    let id = create(&f.a.url, &alice, "job", json!({ "ms": 30_000 })).await;
    assert_eq!(get(&b.url, &alice, &id).await["status"], "working", "B reads A's task at once");
    let mut listener = open_listen(&b.url, &alice, json!([id])).await;
    assert_eq!(listener.next().await["params"]["notifications"]["taskIds"], json!([id]));
    let (_, ack) = task(&b.url, &alice, "tasks/cancel", &id, json!({})).await;
    assert_eq!(ack["result"]["resultType"], "complete");
    // A's worker observes the intent recorded through B, and records `cancelled`; that change,
    // made on A, reaches B's listener through PostgreSQL.
    assert_eq!(settle(&f.a.url, &alice, &id).await["status"], "cancelled");
    loop {
        let frame = listener.next().await;
        assert_eq!(frame["method"], "notifications/tasks", "{frame}");
        if frame["params"]["status"] == "cancelled" {
            break;
        }
    }
    assert_eq!(get(&b.url, &alice, &id).await["status"], "cancelled");
    let _ = &b.server;
}

/// Two tenants listening to their own tasks while both tenants' tasks change hundreds of times:
/// every delivered event belongs to the listener, and each listener sees all of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_in_two_tenants_never_see_each_others_events() {
    const TASKS: usize = 60;
    let f = start(Backend::Sqlite).await;
    let tokens = [f.token("alice", "acme", "cli"), f.token("alice", "globex", "cli")];
    let mut ids: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    for (tenant, token) in tokens.iter().enumerate() {
        for _ in 0..TASKS {
            ids[tenant].push(create(&f.a.url, token, "ask", json!({})).await);
        }
    }
    for (tenant, token) in tokens.iter().enumerate() {
        settle(&f.a.url, token, ids[tenant].last().unwrap()).await;
    }
    // Each listener also names the other tenant's ids: they must be dropped from the ack.
    let mut streams = Vec::new();
    for (tenant, token) in tokens.iter().enumerate() {
        let mut named = ids[tenant].clone();
        named.extend(ids[1 - tenant].iter().take(10).cloned());
        let mut stream = open_listen(&f.a.url, token, json!(named)).await;
        let ack = stream.next().await;
        let acknowledged = ack["params"]["notifications"]["taskIds"].as_array().unwrap().clone();
        assert_eq!(acknowledged.len(), TASKS, "only the listener's own ids are acknowledged");
        assert!(acknowledged.iter().all(|id| ids[tenant].iter().any(|own| id == own.as_str())));
        streams.push(stream);
    }
    for (tenant, token) in tokens.iter().enumerate() {
        for id in &ids[tenant] {
            task(&f.a.url, token, "tasks/update", id, json!({ "inputResponses": { "a": tenant, "b": tenant } })).await;
        }
    }
    for (tenant, stream) in streams.iter_mut().enumerate() {
        let mut completed = std::collections::BTreeSet::new();
        while completed.len() < TASKS {
            let frame = stream.next().await;
            let id = frame["params"]["taskId"].as_str().unwrap().to_owned();
            assert!(ids[tenant].contains(&id), "tenant {tenant} received another tenant's task event: {frame}");
            if frame["params"]["status"] == "completed" {
                assert_eq!(frame["params"]["result"]["structuredContent"]["a"], tenant);
                completed.insert(id);
            }
        }
    }
}

/// Revoking the principal (the identity system's hook) ends its open listen streams; another
/// principal's stream stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_ends_when_the_principal_is_revoked() {
    let f = start(Backend::Sqlite).await;
    let alice = f.alice();
    let bob = f.token("bob", "acme", "cli");
    let mine = create(&f.a.url, &alice, "ask", json!({})).await;
    let theirs = create(&f.a.url, &bob, "ask", json!({})).await;
    let mut alice_stream = open_listen(&f.a.url, &alice, json!([mine])).await;
    let mut bob_stream = open_listen(&f.a.url, &bob, json!([theirs])).await;
    alice_stream.next().await;
    bob_stream.next().await;
    let running = create(&f.a.url, &alice, "job", json!({ "ms": 30_000 })).await;
    let bobs_running = create(&f.a.url, &bob, "job", json!({ "ms": 30_000 })).await;
    let event = palisade_server::PrincipalEvent::TokensRevoked { issuer: ISSUER.into(), subject: "alice".into() };
    f.a.server.principal_event(event).await.unwrap();
    // Her stream may first carry her own task's cancellation, then it ends.
    loop {
        let frame = alice_stream.next().await;
        if frame.get("result").is_some() {
            assert_eq!(frame["result"]["resultType"], "complete");
            break;
        }
        assert_eq!(frame["params"]["taskId"], mine.as_str(), "{frame}");
    }
    // Her unfinished tasks stop: the waiting one at once, the running one through its worker.
    // (Her token itself still verifies: revocation at the issuer is the identity system's part.)
    assert_eq!(get(&f.a.url, &alice, &mine).await["status"], "cancelled");
    assert_eq!(settle(&f.a.url, &alice, &running).await["status"], "cancelled");
    assert_eq!(get(&f.a.url, &bob, &bobs_running).await["status"], "working", "another principal's task runs on");
    // Bob's stream still delivers.
    task(&f.a.url, &bob, "tasks/cancel", &theirs, json!({})).await;
    assert_eq!(bob_stream.next().await["method"], "notifications/tasks");
}

/// A listen stream ends with the graceful `complete` result when its token expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_ends_when_the_credential_expires() {
    let f = start(Backend::Sqlite).await;
    let short = f.issuer.mint("alice", "acme", "cli", &["jobs:run"], RESOURCE, 2).unwrap();
    let id = create(&f.a.url, &short, "ask", json!({})).await;
    let mut listener = open_listen(&f.a.url, &short, json!([id])).await;
    assert_eq!(listener.next().await["method"], "notifications/subscriptions/acknowledged");
    // The server's clock (the token verifier's too) reaches the token's expiry: the stream ends.
    f.clock.advance_ms(2_000);
    let end = listener.next().await;
    assert_eq!(end["result"]["resultType"], "complete", "{end}");
}

/// An instance dies mid-task (its runtime is dropped): once its lease runs out, another instance
/// resumes an idempotent tool and fails the others, saying why. Nothing is lost or run twice
/// without the declaration.
#[test]
fn restart_recovery_resumes_idempotent_tasks_and_fails_the_rest() {
    palisade_auth::install_crypto_provider();
    let issuer_dir = temp_dir(&unique("restart-issuer"));
    let clock = Arc::new(ManualClock::new(START_MS as i64));
    let issuer = DevIssuer::load_or_create(&issuer_dir.0, ISSUER).unwrap().with_clock(clock.clone());
    let counters = Counters::default();
    let token = issuer.mint("alice", "acme", "cli", &["jobs:run"], RESOURCE, 600).unwrap();
    // Instance A in its own runtime, on its own store connections.
    let schema_url = {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async { schema_store_url().await })
    };
    let (resumable, once) = {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let ids = runtime.block_on(async {
            let store = open_pg(&schema_url).await;
            let a = instance(store, &issuer, &clock, &counters).await;
            let resumable = create(&a.url, &token, "resumable", json!({ "ms": 60_000 })).await;
            let once = create(&a.url, &token, "once", json!({ "ms": 60_000 })).await;
            // Both workers hold their leases and run their handlers when the process dies.
            wait_until("both handlers to start on A", || {
                Counters::get(&counters.resumable_runs) == 1 && Counters::get(&counters.once_runs) == 1
            })
            .await;
            (resumable, once)
        });
        // The process dies: every task of the runtime (HTTP, workers, lease renewals) stops.
        runtime.shutdown_background();
        ids
    };
    assert_eq!(counters.resumable_runs.load(Ordering::SeqCst), 1);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let store = open_pg(&schema_url).await;
        let b = instance(store, &issuer, &clock, &counters).await;
        // Before the lease ends nothing is taken over.
        assert_eq!(b.tasks.recover(&b.server.app(), b.server.events(), 10).await.unwrap(), 0);
        assert_eq!(get(&b.url, &token, &resumable).await["status"], "working");
        clock.advance_ms(31_000);
        assert_eq!(b.tasks.recover(&b.server.app(), b.server.events(), 10).await.unwrap(), 2);
        let failed = get(&b.url, &token, &once).await;
        assert_eq!(failed["status"], "failed", "{failed}");
        assert!(failed["error"]["message"].as_str().unwrap().contains("not declared idempotent"));
        wait_until("the idempotent tool to run again on B", || Counters::get(&counters.resumable_runs) >= 2).await;
        assert_eq!(counters.resumable_runs.load(Ordering::SeqCst), 2, "the idempotent tool runs again on B");
        assert_eq!(counters.once_runs.load(Ordering::SeqCst), 1, "the tool not declared idempotent never runs again");
        assert_eq!(get(&b.url, &token, &resumable).await["status"], "working");
        task(&b.url, &token, "tasks/cancel", &resumable, json!({})).await;
        assert_eq!(settle(&b.url, &token, &resumable).await["status"], "cancelled");
    });
}

/// A fresh schema on `DATABASE_URL`, as a store URL.
async fn schema_store_url() -> String {
    let url = crate::common::database_url();
    let schema = unique("tasks_restart");
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&admin).await.unwrap();
    admin.close().await;
    format!("{url}{}options[search_path]={schema}", if url.contains('?') { '&' } else { '?' })
}

async fn open_pg(url: &str) -> Arc<dyn Store> {
    let options = palisade_store::PostgresOptions { max_connections: 4, acquire_timeout: Duration::from_secs(2) };
    Arc::new(palisade_store::PostgresStore::connect_with(url, options).await.unwrap())
}
