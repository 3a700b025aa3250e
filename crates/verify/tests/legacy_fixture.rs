//! The verifier against a server that speaks only the 2025-era wire (every request outside a
//! session refused, as the 2025 SDKs' streamable HTTP servers do): one line in every format says
//! it does not speak 2026-07-28, and the checks that need 2026-07-28 are NOT TESTABLE with that
//! reason, none INCONCLUSIVE.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use palisade_verify::check::Verdict;
use palisade_verify::report::Format;
use palisade_verify::{VerifyArgs, verify};
use serde_json::{Value, json};
use support::{Scratch, identity, palisade_binary};

const SESSION: &str = "legacy-session-0123456789abcdefghijklmnop";

async fn legacy(headers: HeaderMap, body: Bytes) -> Response {
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let method = message.get("method").and_then(Value::as_str).unwrap_or_default();
    let in_session = headers.get("mcp-session-id").is_some_and(|value| value == SESSION);
    if method == "initialize" && message.pointer("/params/protocolVersion").is_some() {
        let result = json!({
            "protocolVersion": "2025-11-25",
            "capabilities": { "tools": {} },
            "serverInfo": { "name": "legacy", "version": "0" }
        });
        return ([("mcp-session-id", SESSION)], axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })))
            .into_response();
    }
    if !in_session {
        let error = json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32000, "message": "Bad Request: Server not initialized" } });
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    if message.get("id").is_none() {
        return StatusCode::ACCEPTED.into_response();
    }
    axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": { "tools": [] } })).into_response()
}

const TOKENS: [&str; 2] = ["legacy-token-alice-0123456789abcdefghij", "legacy-token-bob-0123456789abcdefghijkl"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_without_2026_07_28_gets_one_line_and_not_testable_checks() {
    let router = axum::Router::new().fallback(legacy);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });

    let scratch = Scratch::new("legacy-fixture");
    let alice = identity(&scratch, "alice", TOKENS[0], "t1", "c1");
    let bob = identity(&scratch, "bob", TOKENS[1], "t2", "c1");
    let argv = vec![
        format!("http://127.0.0.1:{port}/mcp"),
        "--i-am-authorized".into(),
        "--identity".into(),
        alice.to_str().unwrap().into(),
        "--identity".into(),
        bob.to_str().unwrap().into(),
    ];
    let report = verify(&VerifyArgs::parse_from(&argv).unwrap(), &mut |_, _| {}).await.unwrap();
    let line = report.protocol.clone().expect("the run says the target does not speak 2026-07-28");
    assert!(line.starts_with("the target does not speak 2026-07-28: server/discover"), "{line}");
    assert!(line.contains("HTTP 400, error -32000"), "{line}");

    let inconclusive: Vec<&str> = report
        .entries
        .iter()
        .filter(|entry| entry.outcome.verdict == Verdict::Inconclusive)
        .map(|entry| entry.check.id)
        .collect();
    assert!(inconclusive.iter().all(|id| id.starts_with("sessions.")), "{inconclusive:?}");
    let for_protocol = report
        .entries
        .iter()
        .filter(|entry| entry.outcome.verdict == Verdict::NotTestable)
        .filter(|entry| entry.outcome.detail.starts_with("needs 2026-07-28, not spoken by the target"))
        .count();
    assert!(for_protocol >= 50, "{for_protocol} checks not testable for the protocol");
    // The 2025-era session checks still run on the 2025 wire.
    let open = report.entries.iter().find(|entry| entry.check.id == "sessions.open").unwrap();
    assert_eq!(open.outcome.verdict, Verdict::Pass, "{}", open.outcome.detail);

    // One line in every format.
    let summary = report.summary_table();
    assert!(summary.starts_with(&format!("{line}; the checks that need it are NOT TESTABLE\n")), "{summary}");
    let json: Value = serde_json::from_str(&report.render(Format::Json)).unwrap();
    assert_eq!(json["protocol"]["spoken"], false);
    assert_eq!(json["protocol"]["detail"], line.as_str());
    let markdown = report.render(Format::Markdown);
    assert_eq!(markdown.matches("- **Protocol:** the target does not speak 2026-07-28").count(), 1, "{markdown}");
    let junit = report.render(Format::Junit);
    assert!(junit.contains("<property name=\"protocol\" value=\"the target does not speak 2026-07-28"), "{junit}");
    let sarif: Value = serde_json::from_str(&report.render(Format::Sarif)).unwrap();
    let note = &sarif["runs"][0]["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"];
    assert!(note.as_str().unwrap().starts_with("the target does not speak 2026-07-28"), "{note}");

    // Through the binary: the line is the first of stdout.
    let mut cli = vec!["verify".to_owned()];
    cli.extend(argv);
    let output = tokio::task::spawn_blocking(move || std::process::Command::new(palisade_binary()).args(&cli).output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("the target does not speak 2026-07-28: server/discover"), "{stdout}");
}
