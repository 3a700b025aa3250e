//! The verifier's tasks module against a deliberately broken 2026-07-28 server speaking the
//! tasks extension (one task tool that waits for a confirmation; `tasks/get | update | cancel`)
//! that lets ANY authenticated caller read, answer and cancel ANY task: the cross-identity and
//! existence-oracle checks FAIL next to accepted controls, what it gets right passes, no task id
//! it issued reaches any report, and without `--allow-mutations` no task is created at all.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use base64::Engine as _;
use palisade_verify::check::Verdict;
use palisade_verify::report::{Format, Report};
use palisade_verify::{VerifyArgs, verify};
use serde_json::{Value, json};
use support::{Scratch, assert_no_token};

const EXTENSION: &str = "io.modelcontextprotocol/tasks";

struct FixtureTask {
    id: String,
    /// The Authorization header that created it.
    owner: String,
    status: &'static str,
    result: Option<Value>,
}

/// Every task ever created, how many `tools/call`s created one, and the fixture's flaw.
#[derive(Default)]
struct Tasks {
    all: Vec<FixtureTask>,
    created: usize,
    /// `false`: any caller reads, answers and cancels any task. `true`: only its owner does, but
    /// another caller's refusal (403) differs from an unknown id's (400 / -32602).
    owner_checked: bool,
}

type Shared = Arc<Mutex<Tasks>>;

fn error(status: StatusCode, id: &Value, code: i64, message: &str) -> Response {
    let body = json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } });
    (status, axum::Json(body)).into_response()
}

fn missing_extension(id: &Value) -> Response {
    let body = json!({ "jsonrpc": "2.0", "id": id, "error": {
        "code": -32021, "message": "missing required client capability",
        "data": { "requiredCapabilities": { "extensions": { EXTENSION: {} } } } } });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

fn result(id: &Value, mut result: Value) -> Response {
    result["resultType"] = result.get("resultType").cloned().unwrap_or(json!("complete"));
    axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response()
}

fn wire(task: &FixtureTask, detailed: bool) -> Value {
    let mut value = json!({
        "taskId": task.id, "status": task.status, "createdAt": "2026-07-28T00:00:00.000Z",
        "lastUpdatedAt": "2026-07-28T00:00:00.000Z", "ttlMs": 60_000, "pollIntervalMs": 100
    });
    if detailed && task.status == "input_required" {
        value["inputRequests"] = json!({ "confirm": { "method": "elicitation/create", "params": {
            "mode": "form", "message": "Export?",
            "requestedSchema": { "type": "object", "properties": { "confirm": { "type": "boolean" } }, "required": ["confirm"] } } } });
    }
    if detailed && let Some(result) = &task.result {
        value["result"] = result.clone();
    }
    value
}

fn terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

async fn broken(State(tasks): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(caller) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        return error(StatusCode::UNAUTHORIZED, &Value::Null, -32600, "authentication required");
    };
    // Strict JSON (a duplicate member name is refused): the one thing about bodies it gets right.
    let Ok(message) = palisade_wire::strict::from_slice(&body) else {
        return error(StatusCode::BAD_REQUEST, &Value::Null, -32700, "parse error");
    };
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let method = message.get("method").and_then(Value::as_str).unwrap_or_default().to_owned();
    let params = message.get("params").and_then(Value::as_object).cloned().unwrap_or_default();
    let declared = params
        .get("_meta")
        .and_then(|meta| meta.get("io.modelcontextprotocol/clientCapabilities"))
        .and_then(|caps| caps.pointer(&format!("/extensions/{}", EXTENSION.replace('/', "~1"))))
        .is_some();
    let name = headers.get("mcp-name").and_then(|v| v.to_str().ok()).map(str::to_owned);
    match method.as_str() {
        "server/discover" => result(
            &id,
            json!({
                "supportedVersions": ["2026-07-28"],
                "capabilities": { "tools": {}, "extensions": { EXTENSION: {} } },
                "serverInfo": { "name": "broken-tasks", "version": "0" }
            }),
        ),
        "tools/list" => result(
            &id,
            json!({ "tools": [{
            "name": "export", "description": "Exports your data after a confirmation. Runs as a task.",
            "inputSchema": { "type": "object", "properties": {} }, "annotations": { "readOnlyHint": true }
        }] }),
        ),
        "tools/call" if params.get("name") == Some(&json!("export")) => {
            if !declared {
                return missing_extension(&id);
            }
            let mut raw = [0u8; 32];
            aws_lc_rs::rand::fill(&mut raw).unwrap();
            let task = FixtureTask {
                id: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw),
                owner: caller,
                status: "working",
                result: None,
            };
            let mut created = wire(&task, false);
            created["resultType"] = json!("task");
            let task_id = task.id.clone();
            {
                let mut tasks = tasks.lock().unwrap();
                tasks.created += 1;
                tasks.all.push(task);
            }
            // The "worker": it asks for the confirmation a moment later.
            let later = tasks.clone();
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                let mut tasks = later.lock().unwrap();
                if let Some(task) = tasks.all.iter_mut().find(|task| task.id == task_id && task.status == "working") {
                    task.status = "input_required";
                }
            });
            result(&id, created)
        }
        "tasks/get" | "tasks/update" | "tasks/cancel" => {
            if !declared {
                return missing_extension(&id);
            }
            let task_id = params.get("taskId");
            match (&name, task_id) {
                (None, _) => return error(StatusCode::BAD_REQUEST, &id, -32020, "Mcp-Name is required"),
                (Some(name), Some(Value::String(task_id))) if name != task_id => {
                    return error(StatusCode::BAD_REQUEST, &id, -32020, "Mcp-Name does not match");
                }
                _ => {}
            }
            let Some(task_id) = task_id.and_then(Value::as_str) else {
                return error(StatusCode::BAD_REQUEST, &id, -32602, "unknown taskId");
            };
            let mut tasks = tasks.lock().unwrap();
            let owner_checked = tasks.owner_checked;
            // The flaw: the task is looked up by id alone, whoever asks (or, checked, another
            // caller is told the task exists).
            let Some(task) = tasks.all.iter_mut().find(|task| task.id == task_id) else {
                return error(StatusCode::BAD_REQUEST, &id, -32602, "unknown taskId");
            };
            if owner_checked && task.owner != caller {
                return error(StatusCode::FORBIDDEN, &id, -32600, "this task belongs to someone else");
            }
            match method.as_str() {
                "tasks/get" => result(&id, wire(task, true)),
                "tasks/update" => {
                    let Some(responses) = params.get("inputResponses").and_then(Value::as_object) else {
                        return error(StatusCode::BAD_REQUEST, &id, -32602, "inputResponses must be an object");
                    };
                    // Unknown keys are ignored; a terminal task takes nothing.
                    if task.status == "input_required"
                        && let Some(answer) = responses.get("confirm")
                    {
                        let confirmed = answer.pointer("/content/confirm") == Some(&json!(true));
                        task.status = "completed";
                        task.result = Some(json!({
                            "content": [{ "type": "text", "text": if confirmed { "exported" } else { "not confirmed" } }],
                            "isError": !confirmed
                        }));
                    }
                    result(&id, json!({}))
                }
                _ => {
                    if !terminal(task.status) {
                        task.status = "cancelled";
                    }
                    result(&id, json!({}))
                }
            }
        }
        _ => error(StatusCode::NOT_FOUND, &id, -32601, "method not found"),
    }
}

const TOKENS: [&str; 4] = [
    "tasks-token-alice-0123456789abcdefghij",
    "tasks-token-bob-0123456789abcdefghijkl",
    "tasks-token-carol-0123456789abcdefghij",
    "tasks-token-alicecli-0123456789abcdefg",
];

fn verdict(report: &Report, id: &str) -> Verdict {
    entry(report, id).outcome.verdict
}

fn entry<'a>(report: &'a Report, id: &str) -> &'a palisade_verify::report::Entry {
    report.entries.iter().find(|entry| entry.check.id == id).unwrap_or_else(|| panic!("no {id}"))
}

/// Starts the fixture and runs the tasks module against it with four identities: alice and bob
/// (tenant t1, client c1), carol (t2, c2) and alice through another client (t1, c2).
async fn run(mutations: bool, owner_checked: bool) -> (Report, Shared) {
    let tasks: Shared = Arc::new(Mutex::new(Tasks { owner_checked, ..Tasks::default() }));
    let router = axum::Router::new().fallback(broken).with_state(tasks.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });

    let scratch = Scratch::new("tasks-fixture");
    let people = [
        ("alice", "alice", "t1", "c1"),
        ("bob", "bob", "t1", "c1"),
        ("carol", "carol", "t2", "c2"),
        ("alice-cli", "alice", "t1", "c2"),
    ];
    let mut argv =
        vec![format!("http://127.0.0.1:{port}/mcp"), "--i-am-authorized".into(), "--module".into(), "tasks".into()];
    if mutations {
        argv.push("--allow-mutations".into());
    }
    for ((name, subject, tenant, client), token) in people.iter().zip(TOKENS) {
        let text = format!(
            "name = \"{name}\"\ntoken = \"{token}\"\nsubject = \"{subject}\"\ntenant = \"{tenant}\"\nclient = \"{client}\"\n"
        );
        let file = scratch.file(&format!("{name}.toml"), &text);
        argv.extend(["--identity".into(), file.to_str().unwrap().to_owned()]);
    }
    let report = verify(&VerifyArgs::parse_from(argv).unwrap(), &mut |_, _| {}).await.unwrap();
    (report, tasks)
}

/// The checks that need no task: they run (and pass here) with or without --allow-mutations.
const READ_ONLY: [&str; 11] = [
    "tasks.negotiation.advertised",
    "tasks.negotiation.get",
    "tasks.negotiation.update",
    "tasks.negotiation.cancel",
    "tasks.id.empty",
    "tasks.id.unknown",
    "tasks.id.long",
    "tasks.id.non_string",
    "tasks.id.missing",
    "tasks.removed.list",
    "tasks.removed.result",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_lets_any_caller_read_and_cancel_any_of_its_tasks_is_caught() {
    let (report, tasks) = run(true, false).await;

    let foreign = ["other_subject", "other_tenant", "other_client"];
    for op in ["get", "update", "cancel"] {
        for role in foreign {
            let id = format!("tasks.{op}.{role}");
            let entry = entry(&report, &id);
            assert_eq!(entry.outcome.verdict, Verdict::Fail, "{id}: {}", entry.outcome.detail);
            // The creating call, the owner's control (served), the foreign call (served too).
            let transcript = &entry.outcome.transcript;
            assert!(transcript.len() >= 3, "{id}");
            assert!(transcript[1].contains("\"result\"") && transcript[1].contains("input_required"), "{id}");
            assert!(transcript[2].contains("\"result\""), "{id}: {}", transcript[2]);
            assert!(entry.outcome.detail.contains("served"), "{id}: {}", entry.outcome.detail);
        }
        // Its authentication is right: without a token every call is refused.
        assert_eq!(verdict(&report, &format!("tasks.{op}.no_token")), Verdict::Pass, "{op}");
        // And a foreign task answers differently from an unknown one: an existence oracle.
        let oracle = entry(&report, &format!("tasks.oracle.{op}"));
        assert_eq!(oracle.outcome.verdict, Verdict::Fail, "{op}: {}", oracle.outcome.detail);
    }
    // The foreign cancel did cancel, and the foreign answers were taken.
    assert!(entry(&report, "tasks.cancel.other_tenant").outcome.detail.contains("to cancelled"));
    assert!(entry(&report, "tasks.update.other_subject").outcome.detail.contains("foreign answers were taken"));
    // What it gets right is not reported as a failure.
    let mut right: Vec<&str> = READ_ONLY.to_vec();
    right.extend([
        "tasks.negotiation.tool_call",
        "tasks.mcp_name.mismatch",
        "tasks.mcp_name.missing",
        "tasks.terminal.cancel_completed",
        "tasks.terminal.update_completed",
        "tasks.terminal.cancel_cancelled",
        "tasks.terminal.update_cancelled",
        "tasks.input.duplicate_keys",
        "tasks.input.unknown_keys",
        "tasks.create.flat",
        "tasks.create.id_entropy",
    ]);
    for id in right {
        let entry = entry(&report, id);
        assert_eq!(entry.outcome.verdict, Verdict::Pass, "{id}: {}", entry.outcome.detail);
        assert!(entry.outcome.transcript.len() >= 2, "{id}");
    }
    assert!(report.entries.len() >= 22);
    assert_eq!(report.exit_code(), 1);

    // Every task created was left finished (the owner cancels what it made), and no task id it
    // issued, and no token, appears in any report format.
    let tasks = tasks.lock().unwrap();
    assert!(tasks.created >= 25, "{}", tasks.created);
    assert!(tasks.all.iter().all(|task| terminal(task.status)), "a task was left running");
    for format in [Format::Json, Format::Junit, Format::Markdown, Format::Sarif] {
        let text = report.render(format);
        for task in &tasks.all {
            assert!(!text.contains(&task.id[..12]), "{format:?} report shows a task id");
        }
        assert_no_token(&text, &TOKENS.map(str::to_owned), "tasks fixture report");
    }
    assert!(report.render(Format::Json).contains("[redacted:task-alice]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_allow_mutations_no_tasks_are_created() {
    let (report, tasks) = run(false, false).await;
    assert_eq!(tasks.lock().unwrap().created, 0, "a task was created without --allow-mutations");
    for entry in &report.entries {
        let id = entry.check.id;
        if READ_ONLY.contains(&id) {
            assert_eq!(entry.outcome.verdict, Verdict::Pass, "{id}: {}", entry.outcome.detail);
        } else {
            assert_eq!(entry.outcome.verdict, Verdict::NotTestable, "{id}: {}", entry.outcome.detail);
            assert!(entry.outcome.detail.contains("--allow-mutations"), "{id}: {}", entry.outcome.detail);
            assert!(entry.outcome.transcript.is_empty(), "{id} sent something");
        }
    }
    assert_eq!(report.exit_code(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_that_reveal_foreign_tasks_are_caught_by_the_tasks_oracle() {
    let (report, tasks) = run(true, true).await;
    for op in ["get", "update", "cancel"] {
        // Refused, and nothing changed: only the shape of the refusal is off (403, not -32602).
        for role in ["other_subject", "other_tenant", "other_client"] {
            let id = format!("tasks.{op}.{role}");
            let entry = entry(&report, &id);
            assert_eq!(entry.outcome.verdict, Verdict::Warning, "{id}: {}", entry.outcome.detail);
            assert!(entry.outcome.detail.contains("-32602"), "{id}: {}", entry.outcome.detail);
        }
        // Next to an unknown id's 400 / -32602 that 403 says the task exists.
        let oracle = entry(&report, &format!("tasks.oracle.{op}"));
        assert_eq!(oracle.outcome.verdict, Verdict::Fail, "{op}: {}", oracle.outcome.detail);
        assert!(oracle.outcome.detail.contains("HTTP 403"), "{op}: {}", oracle.outcome.detail);
        assert_eq!(oracle.outcome.transcript.len(), 4, "{op}: creation, control, foreign id, unknown id");
    }
    for id in ["tasks.terminal.cancel_completed", "tasks.input.unknown_keys", "tasks.create.flat"] {
        assert_eq!(verdict(&report, id), Verdict::Pass, "{id}");
    }
    assert!(tasks.lock().unwrap().all.iter().all(|task| terminal(task.status)), "a task was left running");
}
