//! Verdicts that were wrong on real servers (leg j of scripts/interop), each reproduced by a
//! fixture doing what that server did, and the same check still failing where it should:
//! - `killswitch.unlisted.prompt` against a target that offers no prompts at all (its
//!   `prompts/list` answers "method not found", as the TypeScript SDK's servers without a prompt
//!   do): NOT TESTABLE, saying so, not INCONCLUSIVE; a target serving any prompt name FAILs;
//! - `transport.http.get` / `transport.http.delete` against a target that answers a GET or
//!   DELETE without a session with HTTP 200 and a JSON-RPC error ("session id required", as
//!   mcp-proxy 0.6.0 does): nothing was opened or ended, so a WARNING (not the 405 required),
//!   not a FAIL; a GET answered with an event stream still FAILs.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use axum::body::Bytes;
use axum::http::Method;
use axum::response::{IntoResponse as _, Response};
use palisade_verify::check::Verdict;
use palisade_verify::report::Report;
use palisade_verify::{VerifyArgs, verify};
use serde_json::{Value, json};
use support::{Scratch, identity};

/// A fixture with one tool; with `prompts` false it knows no prompts/* method, with `prompts`
/// true it lists one prompt and serves prompts/get for any name.
async fn answer(body: Bytes, prompts: bool) -> Response {
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let method = message.get("method").and_then(Value::as_str).unwrap_or_default();
    let result = match method {
        "server/discover" => json!({ "supportedVersions": ["2026-07-28"], "capabilities": { "tools": {} } }),
        "tools/list" => json!({ "tools": [{ "name": "echo", "inputSchema": { "type": "object" } }] }),
        "tools/call" => json!({ "content": [{ "type": "text", "text": "echo" }] }),
        "prompts/list" if prompts => json!({ "prompts": [{ "name": "hello" }] }),
        "prompts/get" if prompts => {
            json!({ "messages": [{ "role": "user", "content": { "type": "text", "text": "hi" } }] })
        }
        _ => {
            let error = json!({ "code": -32601, "message": "Method not found" });
            return axum::Json(json!({ "jsonrpc": "2.0", "id": id, "error": error })).into_response();
        }
    };
    axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response()
}

async fn run_killswitch(prompts: bool) -> Report {
    let router = axum::Router::new().fallback(move |body: Bytes| answer(body, prompts));
    run(router, "killswitch").await
}

async fn run(router: axum::Router, module: &str) -> Report {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let scratch = Scratch::new("noprompts-fixture");
    let alice = identity(&scratch, "alice", "noprompts-token-alice-0123456789abcdefgh", "t1", "c1");
    let bob = identity(&scratch, "bob", "noprompts-token-bob-0123456789abcdefghijk", "t2", "c1");
    let argv = [
        format!("http://127.0.0.1:{port}/mcp"),
        "--i-am-authorized".into(),
        "--module".into(),
        module.into(),
        "--identity".into(),
        alice.to_str().unwrap().into(),
        "--identity".into(),
        bob.to_str().unwrap().into(),
    ];
    verify(&VerifyArgs::parse_from(argv).unwrap(), &mut |_, _| {}).await.unwrap()
}

fn entry<'a>(report: &'a Report, id: &str) -> &'a palisade_verify::report::Entry {
    report.entries.iter().find(|entry| entry.check.id == id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_without_prompts_makes_the_unlisted_prompt_check_not_testable() {
    let report = run_killswitch(false).await;
    let prompt = entry(&report, "killswitch.unlisted.prompt");
    assert_eq!(prompt.outcome.verdict, Verdict::NotTestable, "{}", report.summary_table());
    assert!(
        prompt.outcome.detail.starts_with("the target offers no prompts (prompts/list: "),
        "{}",
        prompt.outcome.detail
    );
    assert!(prompt.outcome.detail.contains("-32601"), "{}", prompt.outcome.detail);
    assert_eq!(prompt.outcome.transcript.len(), 1, "the refused listing is its evidence");
    // The tool and method checks still run and pass on this fixture.
    assert_eq!(entry(&report, "killswitch.unlisted.method").outcome.verdict, Verdict::Pass);
    assert_eq!(report.count(Verdict::Inconclusive), 0, "{}", report.summary_table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_serving_any_prompt_name_still_fails_the_unlisted_prompt_check() {
    let report = run_killswitch(true).await;
    let prompt = entry(&report, "killswitch.unlisted.prompt");
    assert_eq!(prompt.outcome.verdict, Verdict::Fail, "{}", report.summary_table());
}

/// A GET or DELETE without a session: with `stream` false answered HTTP 200 with a JSON-RPC
/// error (as mcp-proxy 0.6.0 does), with `stream` true a GET gets an event stream.
async fn sessionless(method: Method, body: Bytes, stream: bool) -> Response {
    if method == Method::GET && stream {
        return ([("content-type", "text/event-stream")], ": open\n\n").into_response();
    }
    if method == Method::GET || method == Method::DELETE {
        let error = json!({ "code": -32006, "message": "MCP-Session-Id header is required for this request." });
        return axum::Json(json!({ "jsonrpc": "2.0", "id": null, "error": error })).into_response();
    }
    answer(body, false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_or_delete_refused_in_a_200_body_is_a_warning_and_an_opened_stream_still_fails() {
    let router = axum::Router::new().fallback(|method: Method, body: Bytes| sessionless(method, body, false));
    let report = run(router, "transport").await;
    for id in ["transport.http.get", "transport.http.delete"] {
        let found = entry(&report, id);
        assert_eq!(found.outcome.verdict, Verdict::Warning, "{id}: {}", report.summary_table());
        assert!(found.outcome.detail.starts_with("refused in the body: HTTP 200"), "{id}: {}", found.outcome.detail);
        assert!(found.outcome.detail.contains("-32006") && found.outcome.detail.contains("405 expected"));
    }
    let router = axum::Router::new().fallback(|method: Method, body: Bytes| sessionless(method, body, true));
    let report = run(router, "transport").await;
    let get = entry(&report, "transport.http.get");
    assert_eq!(get.outcome.verdict, Verdict::Fail, "{}", report.summary_table());
    assert_eq!(get.outcome.detail, "a GET without a session was answered 200");
}
