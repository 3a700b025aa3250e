//! The verifier against a deliberately broken 2025-era server that treats a session id as
//! identity (once a live `Mcp-Session-Id` is presented, the token is ignored, for requests and
//! for `DELETE`): the session checks meant for that flaw FAIL with their controls accepted, the
//! ones it gets right pass, and no session id it issued reaches any report.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use palisade_verify::check::Verdict;
use palisade_verify::report::{Format, Report};
use palisade_verify::{VerifyArgs, verify};
use serde_json::{Value, json};
use support::{Scratch, assert_no_token, identity};

/// Every session id issued (live or not) and the live ones.
#[derive(Default)]
struct Sessions {
    issued: Vec<String>,
    live: Vec<String>,
}

type Shared = Arc<Mutex<Sessions>>;

fn error(status: StatusCode, id: Value, code: i64, message: &str) -> Response {
    let body = json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } });
    (status, axum::Json(body)).into_response()
}

async fn broken(State(sessions): State<Shared>, method: Method, headers: HeaderMap, body: Bytes) -> Response {
    let session = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let token = headers.contains_key(header::AUTHORIZATION);
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    if let Some(session) = &session {
        // The flaw: a live session id is the caller, whatever the token says (or if none).
        let mut sessions = sessions.lock().unwrap();
        let Some(position) = sessions.live.iter().position(|live| live == session) else {
            return error(StatusCode::NOT_FOUND, id, -32001, "session not found");
        };
        if method == Method::DELETE {
            sessions.live.remove(position);
            return StatusCode::OK.into_response();
        }
        if message.get("id").is_none() {
            return StatusCode::ACCEPTED.into_response();
        }
        return axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": { "tools": [] } })).into_response();
    }
    if !token {
        return error(StatusCode::UNAUTHORIZED, Value::Null, -32600, "authentication required");
    }
    let modern = message.pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion").is_some();
    if message.get("method").and_then(Value::as_str) == Some("initialize") && modern {
        // A 2026-07-28 initialize (the transport module's removed-method case) is not the session wire.
        return error(StatusCode::NOT_FOUND, id, -32601, "method not found");
    }
    if message.get("method").and_then(Value::as_str) == Some("initialize") {
        let mut sessions = sessions.lock().unwrap();
        let new = format!("fixture-session-{:04}-0123456789abcdefghijklmnop", sessions.issued.len());
        sessions.issued.push(new.clone());
        sessions.live.push(new.clone());
        let result = json!({
            "protocolVersion": "2025-11-25",
            "capabilities": { "tools": {} },
            "serverInfo": { "name": "broken-sessions", "version": "0" }
        });
        let body = json!({ "jsonrpc": "2.0", "id": id, "result": result });
        return ([("mcp-session-id", new)], axum::Json(body)).into_response();
    }
    axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": { "tools": [] } })).into_response()
}

const TOKENS: [&str; 2] = ["sessions-token-alice-0123456789abcdef", "sessions-token-bob-0123456789abcdefgh"];

fn verdict(report: &Report, id: &str) -> Verdict {
    report.entries.iter().find(|entry| entry.check.id == id).unwrap_or_else(|| panic!("no {id}")).outcome.verdict
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_treats_the_session_id_as_identity_is_caught() {
    let sessions: Shared = Arc::default();
    let router = axum::Router::new().fallback(broken).with_state(sessions.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });

    let scratch = Scratch::new("sessions-fixture");
    // Same tenant and client: the other-tenant and other-client cases have no one to test with.
    let alice = identity(&scratch, "alice", TOKENS[0], "t1", "c1");
    let bob = identity(&scratch, "bob", TOKENS[1], "t1", "c1");
    let argv = [
        format!("http://127.0.0.1:{port}/mcp"),
        "--i-am-authorized".into(),
        "--identity".into(),
        alice.to_str().unwrap().into(),
        "--identity".into(),
        bob.to_str().unwrap().into(),
    ];
    let report = verify(&VerifyArgs::parse_from(argv).unwrap(), &mut |_, _| {}).await.unwrap();

    for id in ["sessions.other_identity", "sessions.no_token"] {
        let entry = report.entries.iter().find(|entry| entry.check.id == id).unwrap();
        assert_eq!(entry.outcome.verdict, Verdict::Fail, "{id}: {}", entry.outcome.detail);
        // initialize, initialized, the owner's control (accepted), the negative (served too).
        assert_eq!(entry.outcome.transcript.len(), 4, "{id}");
        assert!(entry.outcome.transcript[2].contains("\"result\""), "{id}: {}", entry.outcome.transcript[2]);
        assert!(entry.outcome.transcript[3].contains("\"result\""), "{id}: {}", entry.outcome.transcript[3]);
        assert!(entry.outcome.detail.contains("served"), "{id}: {}", entry.outcome.detail);
    }
    // Its DELETE ignores the token too: another identity ends the owner's session.
    assert_eq!(verdict(&report, "sessions.delete.other_identity"), Verdict::Fail);
    // What it gets right is not reported as a failure.
    for id in ["sessions.open", "sessions.unknown", "sessions.near_miss", "sessions.after_delete"] {
        let entry = report.entries.iter().find(|entry| entry.check.id == id).unwrap();
        assert_eq!(entry.outcome.verdict, Verdict::Pass, "{id}: {}", entry.outcome.detail);
    }
    for id in ["sessions.other_tenant", "sessions.other_client"] {
        assert_eq!(verdict(&report, id), Verdict::NotTestable, "{id}");
    }
    assert_eq!(report.exit_code(), 1);

    // No session id it issued, and no token, appears in any report format.
    let issued = sessions.lock().unwrap().issued.clone();
    // One session per check that ran (seven: the other-tenant and other-client cases did not).
    assert_eq!(issued.len(), 7, "{issued:?}");
    for format in [Format::Json, Format::Junit, Format::Markdown, Format::Sarif] {
        let text = report.render(format);
        for session in &issued {
            assert!(!text.contains(session.as_str()), "{format:?} report shows a session id");
        }
        assert_no_token(&text, &TOKENS.map(str::to_owned), "sessions fixture report");
    }
    assert!(report.render(Format::Json).contains("mcp-session-id: [redacted:session-"));
}
