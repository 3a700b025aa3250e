//! The verifier against a deliberately broken 2026-07-28 server: its listen streams deliver every
//! task event to every listener (any identity, any tenant, whatever the filter), and its
//! `requestState` is unsigned base64 JSON it never checks (any non-empty state completes the
//! round, for anyone, on any call). The listen and state checks meant for those flaws FAIL with
//! their controls accepted, the ones it gets right pass, and no token, task id or state it
//! issued reaches any report.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::StreamExt as _;
use palisade_verify::check::Verdict;
use palisade_verify::report::{Format, Report};
use palisade_verify::{VerifyArgs, verify};
use serde_json::{Map, Value, json};
use support::{Scratch, assert_no_token, identity};
use tokio::sync::broadcast;

const TOKENS: [&str; 3] = [
    "listen-fixture-token-alice-0123456789abcdef",
    "listen-fixture-token-bob-0123456789abcdefgh",
    "listen-fixture-token-carol-0123456789abcdefg",
];
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
const TASKS: &str = "io.modelcontextprotocol/tasks";

/// The fixture's state: tasks (id → owner, status), every task id and state it issued, and the
/// one event bus every listener hears.
struct Fixture {
    tasks: Mutex<HashMap<String, (usize, String)>>,
    issued: Mutex<Vec<String>>,
    events: broadcast::Sender<Value>,
    counter: AtomicU64,
}

type Shared = Arc<Fixture>;

fn reply(id: &Value, result: Value) -> Response {
    axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response()
}

fn error(status: StatusCode, id: &Value, code: i64, message: &str) -> Response {
    let body = json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } });
    (status, axum::Json(body)).into_response()
}

fn fresh(fixture: &Fixture, tag: &str) -> String {
    let n = fixture.counter.fetch_add(1, Ordering::SeqCst);
    let id = format!("{tag}-{n:04}-0123456789abcdefghijklmnopqrstuvwxyz");
    fixture.issued.lock().unwrap().push(id.clone());
    id
}

fn tool(name: &str) -> Value {
    json!({ "name": name, "annotations": { "readOnlyHint": true }, "inputSchema": { "type": "object" } })
}

async fn serve(State(fixture): State<Shared>, method: Method, headers: HeaderMap, body: Bytes) -> Response {
    if method != Method::POST {
        return (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "POST")]).into_response();
    }
    let bearer =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let Some(caller) = bearer.and_then(|token| TOKENS.iter().position(|known| *known == token)) else {
        return error(StatusCode::UNAUTHORIZED, &Value::Null, -32600, "authentication required");
    };
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, &Value::Null, -32700, "parse error");
    };
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let params = message.get("params").cloned().unwrap_or(json!({}));
    let tasks_declared = params
        .pointer("/_meta/io.modelcontextprotocol~1clientCapabilities/extensions")
        .and_then(|e| e.get(TASKS))
        .is_some();
    let task_id = params.get("taskId").and_then(Value::as_str).unwrap_or_default().to_owned();
    match message.get("method").and_then(Value::as_str).unwrap_or_default() {
        "server/discover" => reply(
            &id,
            json!({ "resultType": "complete", "supportedVersions": ["2026-07-28"], "ttlMs": 0, "cacheScope": "public",
                "capabilities": { "tools": {}, "resources": {}, "extensions": { TASKS: {} } } }),
        ),
        "tools/list" => reply(
            &id,
            json!({ "resultType": "complete", "ttlMs": 0, "cacheScope": "public",
            "tools": [tool("catalog"), tool("export"), tool("confirm_note")] }),
        ),
        "resources/list" => reply(
            &id,
            json!({ "resultType": "complete", "ttlMs": 0, "cacheScope": "public",
            "resources": [{ "uri": "fix://doc", "name": "doc" }] }),
        ),
        // Reads ignore any requestState (so does the catalogue).
        "resources/read" => reply(
            &id,
            json!({ "resultType": "complete", "ttlMs": 0, "cacheScope": "public",
            "contents": [{ "uri": "fix://doc", "text": "a document" }] }),
        ),
        "tools/call" => match params.get("name").and_then(Value::as_str).unwrap_or_default() {
            "catalog" => {
                reply(&id, json!({ "resultType": "complete", "content": [{ "type": "text", "text": "tea" }] }))
            }
            "export" if !tasks_declared => error(StatusCode::BAD_REQUEST, &id, -32021, "needs the tasks extension"),
            "export" => {
                let task = fresh(&fixture, "fixture-task");
                fixture.tasks.lock().unwrap().insert(task.clone(), (caller, "input_required".into()));
                reply(
                    &id,
                    json!({ "resultType": "task", "taskId": task, "status": "input_required",
                    "createdAt": "2026-07-28T00:00:00Z", "lastUpdatedAt": "2026-07-28T00:00:00Z", "ttlMs": null }),
                )
            }
            // The flaw: any non-empty state with an accepted answer completes the round, whoever
            // presents it, however changed.
            "confirm_note" => {
                let state = params.get("requestState").and_then(Value::as_str).unwrap_or_default();
                let accepted = params.pointer("/inputResponses/confirm/action") == Some(&json!("accept"));
                if !state.is_empty() && accepted {
                    return reply(
                        &id,
                        json!({ "resultType": "complete", "content": [{ "type": "text", "text": "noted" }] }),
                    );
                }
                let n = fixture.counter.fetch_add(1, Ordering::SeqCst);
                let state = URL_SAFE_NO_PAD.encode(
                    json!({ "tool": "confirm_note", "confirmed": false, "round": n, "pad": "0123456789" }).to_string(),
                );
                fixture.issued.lock().unwrap().push(state.clone());
                reply(
                    &id,
                    json!({ "resultType": "input_required", "requestState": state, "inputRequests": { "confirm": {
                    "method": "elicitation/create", "params": { "mode": "form", "message": "Order?",
                        "requestedSchema": { "type": "object", "properties": { "confirm": { "type": "boolean" } } } } } } }),
                )
            }
            _ => error(StatusCode::BAD_REQUEST, &id, -32602, "unknown tool"),
        },
        "tasks/get" | "tasks/update" | "tasks/cancel" => {
            let mut tasks = fixture.tasks.lock().unwrap();
            let Some((owner, status)) = tasks.get_mut(&task_id).filter(|(owner, _)| *owner == caller) else {
                return error(StatusCode::BAD_REQUEST, &id, -32602, "unknown task");
            };
            let _ = owner;
            match message.get("method").and_then(Value::as_str).unwrap_or_default() {
                "tasks/get" => {
                    let mut task =
                        json!({ "resultType": "complete", "taskId": task_id, "status": status, "ttlMs": null });
                    if status == "input_required" {
                        task["inputRequests"] = json!({ "confirm": { "method": "elicitation/create", "params": {
                            "mode": "form", "message": "Export?",
                            "requestedSchema": { "type": "object", "properties": { "confirm": { "type": "boolean" } } } } } });
                    }
                    reply(&id, task)
                }
                verb => {
                    *status = if verb == "tasks/update" { "completed".into() } else { "cancelled".into() };
                    let event = json!({ "taskId": task_id, "status": status, "ttlMs": null });
                    let _ = fixture.events.send(event);
                    reply(&id, json!({ "resultType": "complete" }))
                }
            }
        }
        "subscriptions/listen" => listen(&fixture, caller, &id, &params, tasks_declared),
        _ => error(StatusCode::NOT_FOUND, &id, -32601, "method not found"),
    }
}

/// Validates and acknowledges the filter as a careful server would; then (the flaw) forwards
/// every event on the bus, whoever's it is and whatever was asked.
fn listen(fixture: &Fixture, caller: usize, id: &Value, params: &Value, tasks_declared: bool) -> Response {
    let invalid = |message: &str| error(StatusCode::BAD_REQUEST, id, -32602, message);
    let Some(filter) = params.get("notifications").and_then(Value::as_object) else {
        return invalid("notifications filter is required");
    };
    let mut honoured = Map::new();
    for flag in ["toolsListChanged", "promptsListChanged", "resourcesListChanged"] {
        match filter.get(flag) {
            None | Some(Value::Bool(false)) => {}
            // It has no prompts: that flag is left out of the acknowledgement.
            Some(Value::Bool(true)) if flag == "promptsListChanged" => {}
            Some(Value::Bool(true)) => {
                honoured.insert(flag.into(), json!(true));
            }
            Some(_) => return invalid("flags are booleans"),
        }
    }
    match filter.get("resourceSubscriptions") {
        None => {}
        Some(Value::Array(uris)) => {
            let known: Vec<&Value> = uris.iter().filter(|uri| uri.as_str() == Some("fix://doc")).collect();
            if !known.is_empty() {
                honoured.insert("resourceSubscriptions".into(), json!(known));
            }
        }
        Some(_) => return invalid("resourceSubscriptions is an array"),
    }
    match filter.get("taskIds") {
        None => {}
        Some(_) if !tasks_declared => return error(StatusCode::BAD_REQUEST, id, -32021, "needs the tasks extension"),
        Some(Value::Array(ids)) => {
            let tasks = fixture.tasks.lock().unwrap();
            let owned: Vec<&Value> = ids
                .iter()
                .filter(|task| task.as_str().and_then(|t| tasks.get(t)).is_some_and(|(owner, _)| *owner == caller))
                .collect();
            honoured.insert("taskIds".into(), json!(owned));
        }
        Some(_) => return invalid("taskIds is an array"),
    }
    let subscription = id.clone();
    let ack = json!({ "jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
        "params": { "notifications": honoured, "_meta": { SUBSCRIPTION_ID: subscription } } });
    let receiver = fixture.events.subscribe();
    let events = futures::stream::unfold((receiver, subscription), |(mut receiver, subscription)| async move {
        loop {
            match receiver.recv().await {
                Ok(mut event) => {
                    event["_meta"] = json!({ SUBSCRIPTION_ID: subscription });
                    let frame = json!({ "jsonrpc": "2.0", "method": "notifications/tasks", "params": event });
                    return Some((
                        Ok::<_, Infallible>(Bytes::from(format!("data: {frame}\n\n"))),
                        (receiver, subscription),
                    ));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let first = futures::stream::once(async move { Ok::<_, Infallible>(Bytes::from(format!("data: {ack}\n\n"))) });
    ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(first.chain(events))).into_response()
}

async fn start() -> (u16, Shared) {
    let fixture = Arc::new(Fixture {
        tasks: Mutex::default(),
        issued: Mutex::default(),
        events: broadcast::channel(256).0,
        counter: AtomicU64::new(0),
    });
    let router = axum::Router::new().fallback(serve).with_state(fixture.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (port, fixture)
}

/// Runs `module` with mutations allowed as alice (t1), bob (t1) and carol (t2).
async fn run(port: u16, module: &str) -> Report {
    let scratch = Scratch::new("listen-fixture");
    let files = [
        identity(&scratch, "alice", TOKENS[0], "t1", "c1"),
        identity(&scratch, "bob", TOKENS[1], "t1", "c1"),
        identity(&scratch, "carol", TOKENS[2], "t2", "c2"),
    ];
    let mut argv = vec![format!("http://127.0.0.1:{port}/mcp"), "--i-am-authorized".into(), "--allow-mutations".into()];
    for file in &files {
        argv.extend(["--identity".into(), file.to_str().unwrap().to_owned()]);
    }
    argv.extend(["--module".into(), module.into()]);
    verify(&VerifyArgs::parse_from(argv).unwrap(), &mut |_, _| {}).await.unwrap()
}

fn expect(report: &Report, id: &str, verdict: Verdict) {
    let entry = report.entries.iter().find(|entry| entry.check.id == id).unwrap_or_else(|| panic!("no {id}"));
    assert_eq!(
        entry.outcome.verdict,
        verdict,
        "{id}: {}\n{}",
        entry.outcome.detail,
        entry.outcome.transcript.join("\n")
    );
}

/// No token, and nothing the fixture issued (task ids, states), in any report format.
fn assert_nothing_leaks(report: &Report, fixture: &Fixture) {
    let issued = fixture.issued.lock().unwrap().clone();
    assert!(!issued.is_empty());
    for format in [Format::Json, Format::Junit, Format::Markdown, Format::Sarif] {
        let text = report.render(format);
        for secret in &issued {
            assert!(!text.contains(secret.as_str()), "{format:?} report shows {secret}");
        }
        assert_no_token(&text, &TOKENS.map(str::to_owned), "listen fixture report");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_listen_streams_cross_identities_is_caught() {
    let (port, fixture) = start().await;
    let report = run(port, "listen").await;

    for id in ["listen.delivery.other_identity", "listen.delivery.other_tenant"] {
        expect(&report, id, Verdict::Fail);
        let entry = report.entries.iter().find(|entry| entry.check.id == id).unwrap();
        assert!(entry.outcome.detail.contains("reached another identity's stream"), "{id}: {}", entry.outcome.detail);
        // The control (the owner's stream) was acknowledged and showed its own task's event.
        assert!(entry.outcome.transcript.iter().any(|t| t.contains("notifications/subscriptions/acknowledged")));
        assert!(entry.outcome.transcript.iter().any(|t| t.contains("[redacted:task-alice]")), "{id}");
    }
    // What it gets right passes: acknowledgements, filters, owned task ids, authentication,
    // resumption and the GET stream.
    for id in [
        "listen.ack.string_id",
        "listen.ack.integer_id",
        "listen.ack.honoured_subset",
        "listen.filter.unknown_key",
        "listen.filter.forged_resource",
        "listen.filter.missing",
        "listen.filter.not_object",
        "listen.filter.flag_type",
        "listen.filter.subscriptions_type",
        "listen.filter.task_ids_capability",
        "listen.task.other_identity",
        "listen.task.existence_oracle",
        "listen.delivery.own_events",
        "listen.auth.no_token",
        "listen.resume.session_id",
        "listen.resume.last_event_id",
        "listen.get.stream",
    ] {
        expect(&report, id, Verdict::Pass);
    }
    for id in ["listen.auth.other_resource", "listen.auth.expired"] {
        expect(&report, id, Verdict::NotTestable);
    }
    assert_eq!(report.exit_code(), 1);
    assert_nothing_leaks(&report, &fixture);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_request_state_is_unsigned_json_is_caught() {
    let (port, fixture) = start().await;
    let report = run(port, "state").await;

    for id in [
        "state.tamper.flipped",
        "state.tamper.last_char",
        "state.tamper.truncated",
        "state.tamper.garbage",
        "state.tamper.payload",
        "state.replay.other_identity",
        "state.replay.other_tenant",
    ] {
        expect(&report, id, Verdict::Fail);
        let entry = report.entries.iter().find(|entry| entry.check.id == id).unwrap();
        assert!(entry.outcome.detail.contains("proceeded with the altered state"), "{id}: {}", entry.outcome.detail);
        // The control (a fresh state echoed by its owner) went through too.
        assert!(entry.outcome.transcript.iter().any(|t| t.contains("noted")), "{id}");
    }
    // Its catalogue, its reads and a completed round take any state: warnings, not failures.
    for id in ["state.replay.other_tool", "state.replay.other_method", "state.replay.after_use"] {
        expect(&report, id, Verdict::Warning);
    }
    // An empty state asks again; the exact echo proceeds; foreign and made-up states are
    // answered alike (both taken).
    for id in ["state.round.echo", "state.tamper.empty", "state.replay.existence_oracle"] {
        expect(&report, id, Verdict::Pass);
    }
    // The call takes no arguments to vary, and no state expires within the run.
    for id in ["state.replay.other_arguments", "state.expired"] {
        expect(&report, id, Verdict::NotTestable);
    }
    assert_eq!(report.exit_code(), 1);
    assert_nothing_leaks(&report, &fixture);
}
