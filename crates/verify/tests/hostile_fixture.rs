//! The verifier against a hostile target: it lists a destructive `wipe_everything`, a consuming
//! `checkout_all`, a `purge_cache` that claims to be read-only and destructive at once (each
//! first in the listing, each inviting: no arguments, "runs as a task"), and a tool whose name
//! carries terminal escape sequences. With `--allow-mutations`, every module run (the pinning
//! change command included) never calls the first three (counted at the fixture) while it does
//! call the others; and the escape sequences reach no progress line, summary or Markdown cell,
//! in process and through the `palisade verify` binary, only their visible escapes.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse as _, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_verify::report::{Format, progress_line};
use palisade_verify::{VerifyArgs, verify};
use serde_json::{Value, json};
use support::{Scratch, identity, palisade_binary};

/// The tools no check may ever call.
const NEVER_CALLED: [&str; 3] = ["wipe_everything", "checkout_all", "purge_cache"];
/// A tool name that, printed raw, erases the line and moves the cursor up (over a FAIL row).
const ESCAPING_NAME: &str = "report\u{1b}[2K\u{1b}[1A";
/// The same name as the terminal outputs must show it.
const ESCAPED_NAME: &str = "report\\u{1b}[2K\\u{1b}[1A";

const TASKS: &str = "io.modelcontextprotocol/tasks";

/// Calls by tool name.
type Calls = Arc<Mutex<HashMap<String, usize>>>;

fn tools() -> Value {
    let task = "Runs as a task.";
    json!([
        { "name": "wipe_everything", "description": task, "annotations": { "destructiveHint": true },
          "inputSchema": { "type": "object" }, "execution": { "taskSupport": "required" } },
        { "name": "checkout_all", "description": task, "inputSchema": { "type": "object" } },
        { "name": "purge_cache", "description": task, "annotations": { "readOnlyHint": true, "destructiveHint": true },
          "inputSchema": { "type": "object" }, "execution": { "taskSupport": "required" } },
        { "name": ESCAPING_NAME, "description": task, "annotations": { "readOnlyHint": true },
          "inputSchema": { "type": "object" } },
        { "name": "note_create", "description": "Makes a note and returns its handle.",
          "inputSchema": { "type": "object" },
          "outputSchema": { "type": "object", "properties": { "note": { "type": "string" } } } },
        { "name": "note_view", "annotations": { "readOnlyHint": true },
          "inputSchema": { "type": "object", "properties": { "note": { "type": "string" } }, "required": ["note"] } }
    ])
}

fn reply(id: &Value, result: Value) -> Response {
    axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response()
}

/// Serves anything to anyone: lists, every tool call (counted), a discover that advertises tasks.
async fn hostile(State(calls): State<Calls>, body: Bytes) -> Response {
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    match message.get("method").and_then(Value::as_str).unwrap_or_default() {
        "server/discover" => reply(
            &id,
            json!({ "resultType": "complete", "supportedVersions": ["2026-07-28"],
                "capabilities": { "tools": {}, "extensions": { TASKS: {} } } }),
        ),
        "tools/list" => reply(&id, json!({ "resultType": "complete", "tools": tools() })),
        "resources/list" => reply(&id, json!({ "resultType": "complete", "resources": [] })),
        "prompts/list" => reply(&id, json!({ "resultType": "complete", "prompts": [] })),
        "tools/call" => {
            let name = params.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
            *calls.lock().unwrap().entry(name.clone()).or_default() += 1;
            let content = if name == "note_create" {
                let mut raw = [0u8; 32];
                aws_lc_rs::rand::fill(&mut raw).unwrap();
                json!({ "note": URL_SAFE_NO_PAD.encode(raw) })
            } else {
                json!({ "text": format!("{name} done") })
            };
            reply(
                &id,
                json!({ "resultType": "complete", "structuredContent": content,
                    "content": [{ "type": "text", "text": content.to_string() }] }),
            )
        }
        _ => {
            axum::Json(json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32601, "message": "no such method" } }))
                .into_response()
        }
    }
}

struct Fixture {
    url: String,
    calls: Calls,
    scratch: Scratch,
}

async fn fixture(tag: &str) -> Fixture {
    let calls = Calls::default();
    let router = axum::Router::new().fallback(hostile).with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    Fixture { url: format!("http://127.0.0.1:{port}/mcp"), calls, scratch: Scratch::new(tag) }
}

impl Fixture {
    /// `verify`'s arguments: alice and bob, `--allow-mutations`, then `extra`.
    fn argv(&self, extra: &[&str]) -> Vec<String> {
        let alice = identity(&self.scratch, "alice", "hostile-token-alice-0123456789abcdef", "t1", "c1");
        let bob = identity(&self.scratch, "bob", "hostile-token-bob-0123456789abcdefghi", "t1", "c1");
        let mut argv = vec![self.url.clone(), "--i-am-authorized".into(), "--allow-mutations".into()];
        for file in [alice, bob] {
            argv.extend(["--identity".into(), file.to_str().unwrap().to_owned()]);
        }
        argv.extend(extra.iter().map(|s| (*s).to_owned()));
        argv
    }

    fn calls(&self) -> HashMap<String, usize> {
        self.calls.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_module_calls_a_destructive_or_consuming_tool() {
    let fixture = fixture("hostile-tools").await;
    // Every module, the pinning change command a no-op so its calls are made too.
    let argv = fixture.argv(&["--change-upstream-command", "true", "--pin-wait-secs", "1"]);
    let report = verify(&VerifyArgs::parse_from(argv).unwrap(), &mut |_, _| {}).await.unwrap();
    assert!(report.entries.len() >= 150, "every module ran: {} checks", report.entries.len());
    let calls = fixture.calls();
    for name in NEVER_CALLED {
        assert_eq!(calls.get(name), None, "{name} was called: {calls:?}");
    }
    // The modules did call what the rule permits: the run was no empty one.
    for name in [ESCAPING_NAME, "note_create", "note_view"] {
        assert!(calls.get(name).is_some_and(|n| *n > 0), "{name:?} was never called: {calls:?}");
    }
    // The tasks module says why it found no task without naming a tool it must not call.
    let tasks = report.entries.iter().find(|entry| entry.check.id == "tasks.get.other_subject").unwrap();
    assert!(!NEVER_CALLED.iter().any(|name| tasks.outcome.detail.contains(name)), "{}", tasks.outcome.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_name_s_escape_sequences_are_shown_escaped_in_every_output() {
    let fixture = fixture("hostile-escapes").await;
    let argv = fixture.argv(&["--module", "tasks"]);
    let mut lines = Vec::new();
    let report = verify(&VerifyArgs::parse_from(argv.clone()).unwrap(), &mut |check, outcome| {
        lines.push(progress_line(check, outcome))
    })
    .await
    .unwrap();
    // The name reached the details (the tasks module lists the tools it tried).
    assert!(report.entries.iter().any(|entry| entry.outcome.detail.contains(ESCAPING_NAME)));
    let progress = lines.join("\n");
    let summary = report.summary_table();
    for (what, text) in [("progress lines", &progress), ("summary", &summary)] {
        assert!(!text.contains('\u{1b}'), "{what} carry an escape character:\n{text}");
        assert!(text.contains(ESCAPED_NAME), "{what} show the name escaped:\n{text}");
    }
    let markdown = report.render(Format::Markdown);
    assert!(!markdown.contains('\u{1b}'), "{markdown}");
    assert!(markdown.contains("report&#92;u{1b}&#91;2K&#92;u{1b}&#91;1A"), "{markdown}");
    for line in markdown.lines().filter(|line| line.starts_with("| `")) {
        assert_eq!(line.matches('|').count(), 5, "one row, four cells: {line}");
    }
    let junit = report.render(Format::Junit);
    assert!(!junit.contains('\u{1b}') && junit.contains(ESCAPED_NAME), "{junit}");
    // JSON keeps the name itself, escaped the JSON way (SARIF holds only failures and warnings).
    let text = report.render(Format::Json);
    assert!(!text.contains('\u{1b}') && text.contains("report\\u001b[2K\\u001b[1A"), "{text}");
    assert!(!report.render(Format::Sarif).contains('\u{1b}'));
    let json: Value = serde_json::from_str(&report.render(Format::Json)).unwrap();
    assert!(json["checks"].as_array().unwrap().iter().any(|c| c["detail"].as_str().unwrap().contains(ESCAPING_NAME)));

    // Through the binary: stderr (plain progress lines), stdout (the summary), the Markdown file.
    let output_file = fixture.scratch.0.join("report.md");
    let mut cli = vec!["verify".to_owned()];
    cli.extend(argv);
    cli.extend(["--format".into(), "markdown".into(), "--output".into(), output_file.to_str().unwrap().to_owned()]);
    let output = tokio::task::spawn_blocking(move || std::process::Command::new(palisade_binary()).args(&cli).output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let written = std::fs::read_to_string(&output_file).unwrap();
    for (what, text, shown) in [
        ("stdout", &*stdout, ESCAPED_NAME),
        ("stderr", &*stderr, ESCAPED_NAME),
        ("the Markdown report", written.as_str(), "report&#92;u{1b}&#91;2K&#92;u{1b}&#91;1A"),
    ] {
        assert!(!text.contains('\u{1b}'), "{what} carries an escape character:\n{text}");
        assert!(text.contains(shown), "{what} shows the name escaped:\n{text}");
    }
    let calls = fixture.calls();
    assert!(NEVER_CALLED.iter().all(|name| !calls.contains_key(*name)), "{calls:?}");
}
