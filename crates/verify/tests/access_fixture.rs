//! The `access` module against a fixture that gets list filtering wrong, one flaw at a time (on
//! 2026-07-28, and on the 2025-era session wire with `server/discover` refused), and against the
//! real demo under an operator policy set that hides a tool from one identity:
//!
//! - the fixture hides `report_view` from bob's list but serves his calls of it (its input
//!   validation answers them): `access.tool.unlisted_callable` FAILs, on either wire;
//! - it lists `notes_read` to bob but refuses his calls of it by authorization:
//!   `access.tool.listed_refused` is a WARNING (never a FAIL) saying it may be an
//!   argument-dependent rule;
//! - done right (the hidden tool refused as unknown, the listed one reaching its validation)
//!   both PASS; listing the same to everyone makes the first NOT TESTABLE, saying why;
//! - `palisade serve --app demo` with Cedar policies that hide `catalog_search` from the globex
//!   tenant (and an argument rule that lists it to the others): both PASS.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use palisade_verify::check::Verdict;
use palisade_verify::report::{Entry, Report};
use palisade_verify::{VerifyArgs, verify};
use serde_json::{Value, json};
use support::{Demo, Scratch, identity};

const UNLISTED: &str = "access.tool.unlisted_callable";
const LISTED: &str = "access.tool.listed_refused";
const TOKENS: [(&str, &str); 2] =
    [("alice", "access-token-alice-0123456789abcdefghij"), ("bob", "access-token-bob-0123456789abcdefghijkl")];
const SESSION: &str = "access-session-0123456789abcdefghijklmn";

/// What the fixture gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// Hides `report_view` from bob's list, and serves his calls of it anyway.
    HiddenButServed,
    /// Lists `notes_read` to bob, and refuses his calls of it by authorization (403).
    ListedButRefused,
    /// Hides `report_view` from bob and refuses his calls as unknown; serves what it lists.
    Nothing,
    /// Lists the same tools to everyone (and serves them to everyone).
    SameLists,
}

#[derive(Clone)]
struct Fixture {
    flaw: Flaw,
    /// Speaks only the 2025-era session wire (`server/discover` refused).
    legacy: bool,
    /// Every `tools/call`: (caller, tool).
    calls: Arc<Mutex<Vec<(String, String)>>>,
}

fn tool(name: &str, required: &str) -> Value {
    json!({ "name": name, "annotations": { "readOnlyHint": true },
        "inputSchema": { "type": "object", "properties": { required: { "type": "string" } }, "required": [required] } })
}

fn frame(id: &Value, body: Value) -> Response {
    let mut message = json!({ "jsonrpc": "2.0", "id": id });
    let key = if body.get("code").is_some() { "error" } else { "result" };
    message[key] = body;
    axum::Json(message).into_response()
}

async fn serve(State(fixture): State<Fixture>, headers: HeaderMap, body: Bytes) -> Response {
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let method = message.get("method").and_then(Value::as_str).unwrap_or_default();
    let bearer = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let Some((caller, _)) = TOKENS.iter().find(|(_, token)| bearer == format!("Bearer {token}")) else {
        return (StatusCode::UNAUTHORIZED, [("www-authenticate", "Bearer")]).into_response();
    };
    if fixture.legacy {
        if method == "initialize" {
            let result = json!({ "protocolVersion": "2025-11-25", "capabilities": { "tools": {} },
                "serverInfo": { "name": "access-fixture", "version": "0" } });
            return ([("mcp-session-id", format!("{SESSION}-{caller}"))], frame(&id, result)).into_response();
        }
        // A session is its opener's.
        if headers.get("mcp-session-id").is_none_or(|value| *value != *format!("{SESSION}-{caller}")) {
            let error = json!({ "code": -32000, "message": "Bad Request: Server not initialized" });
            return (StatusCode::BAD_REQUEST, frame(&Value::Null, error)).into_response();
        }
        if message.get("id").is_none() || method == "session/delete" {
            return StatusCode::ACCEPTED.into_response();
        }
    }
    let bob = *caller == "bob";
    match method {
        "server/discover" if !fixture.legacy => frame(
            &id,
            json!({ "resultType": "complete", "supportedVersions": ["2026-07-28"], "capabilities": { "tools": {} } }),
        ),
        "tools/list" => {
            let mut tools = vec![tool("notes_read", "note")];
            if !bob || fixture.flaw == Flaw::SameLists {
                tools.push(tool("report_view", "report"));
            }
            frame(&id, json!({ "resultType": "complete", "tools": tools }))
        }
        "tools/call" => {
            let name = message.pointer("/params/name").and_then(Value::as_str).unwrap_or_default().to_owned();
            fixture.calls.lock().unwrap().push(((*caller).to_owned(), name.clone()));
            let hidden = bob && name == "report_view" && fixture.flaw != Flaw::SameLists;
            if hidden && fixture.flaw != Flaw::HiddenButServed {
                return frame(&id, json!({ "code": -32602, "message": "invalid params: unknown tool" }));
            }
            if bob && name == "notes_read" && fixture.flaw == Flaw::ListedButRefused {
                let error = json!({ "code": -32600, "message": "forbidden: not allowed for this caller" });
                return (StatusCode::FORBIDDEN, frame(&id, error)).into_response();
            }
            let arguments = message.pointer("/params/arguments").cloned().unwrap_or(Value::Null);
            let property = if name == "report_view" { "report" } else { "note" };
            if arguments.get(property).is_none() {
                return frame(
                    &id,
                    json!({ "code": -32602, "message": format!("invalid params: {property} is required") }),
                );
            }
            frame(&id, json!({ "resultType": "complete", "content": [{ "type": "text", "text": "ok" }] }))
        }
        _ => frame(&id, json!({ "code": -32601, "message": "method not found" })),
    }
}

/// Starts the fixture and runs the `access` module against it as alice and bob.
async fn run(flaw: Flaw, legacy: bool) -> (Report, Vec<(String, String)>) {
    let fixture = Fixture { flaw, legacy, calls: Arc::default() };
    let router = axum::Router::new().fallback(serve).with_state(fixture.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let scratch = Scratch::new("access-fixture");
    let mut argv = vec![format!("http://127.0.0.1:{port}/mcp"), "--i-am-authorized".into()];
    for (name, token) in TOKENS {
        let file = identity(&scratch, name, token, "t1", "c1");
        argv.extend(["--identity".into(), file.to_str().unwrap().to_owned()]);
    }
    argv.extend(["--module".into(), "access".into()]);
    let report = verify(&VerifyArgs::parse_from(&argv).unwrap(), &mut |_, _| {}).await.unwrap();
    let calls = fixture.calls.lock().unwrap().clone();
    (report, calls)
}

fn entry<'a>(report: &'a Report, id: &str) -> &'a Entry {
    report.entries.iter().find(|entry| entry.check.id == id).unwrap()
}

fn shown(entry: &Entry) -> String {
    format!("{:?}: {}\n{}", entry.outcome.verdict, entry.outcome.detail, entry.outcome.transcript.join("\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_hidden_from_a_caller_but_served_to_it_fails_on_either_wire() {
    for legacy in [false, true] {
        let (report, calls) = run(Flaw::HiddenButServed, legacy).await;
        let unlisted = entry(&report, UNLISTED);
        assert_eq!(unlisted.outcome.verdict, Verdict::Fail, "legacy {legacy}: {}", shown(unlisted));
        let detail = &unlisted.outcome.detail;
        assert!(detail.starts_with("report_view is listed to alice but not to bob, yet bob's call"), "{detail}");
        assert!(detail.contains("failing its input schema (`report` is required)"), "{detail}");
        assert!(detail.contains("the tool's input validation: HTTP 200, error -32602"), "{detail}");
        // The evidence: bob's list without the tool, alice's with it, bob's call.
        let transcript = unlisted.outcome.transcript.join("\n");
        assert_eq!(unlisted.outcome.transcript.len(), 3, "{transcript}");
        assert!(transcript.contains("\"name\":\"report_view\""), "{transcript}");
        assert!(transcript.contains("[redacted:bob]") && !transcript.contains(TOKENS[1].1), "{transcript}");
        if legacy {
            assert!(transcript.contains("> mcp-session-id: [redacted:session-"), "{transcript}");
        }
        assert!(calls.contains(&("bob".into(), "report_view".into())), "{calls:?}");
        // Every call failed its input schema: empty arguments, never a `report`.
        let listed = entry(&report, LISTED);
        assert_eq!(listed.outcome.verdict, Verdict::Pass, "{}", shown(listed));
        assert_eq!(report.exit_code(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_tool_refused_by_authorization_is_a_warning_not_a_failure() {
    let (report, _) = run(Flaw::ListedButRefused, false).await;
    let listed = entry(&report, LISTED);
    assert_eq!(listed.outcome.verdict, Verdict::Warning, "{}", shown(listed));
    let detail = &listed.outcome.detail;
    assert!(detail.starts_with("1 listed tool was refused by authorization, not answered by the tool's input validation, though the caller is listed it"), "{detail}");
    assert!(detail.contains("notes_read to bob with empty arguments, failing its input schema"), "{detail}");
    assert!(detail.contains("HTTP 403, error -32600"), "{detail}");
    assert!(detail.contains("This may be a rule that reads the arguments"), "{detail}");
    let transcript = listed.outcome.transcript.join("\n");
    assert!(transcript.contains("< HTTP 403") || transcript.contains("403"), "{transcript}");
    // The hidden tool is refused as unknown: no failure, and a warning does not fail the run.
    assert_eq!(entry(&report, UNLISTED).outcome.verdict, Verdict::Pass, "{}", shown(entry(&report, UNLISTED)));
    assert_eq!(report.exit_code(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_that_agree_with_the_calls_pass_and_equal_lists_are_not_testable() {
    let (report, calls) = run(Flaw::Nothing, false).await;
    let unlisted = entry(&report, UNLISTED);
    assert_eq!(unlisted.outcome.verdict, Verdict::Pass, "{}", shown(unlisted));
    assert!(unlisted.outcome.detail.contains("report_view to bob (HTTP 200, error -32602, calling the tool unknown)"));
    assert_eq!(entry(&report, LISTED).outcome.verdict, Verdict::Pass, "{}", shown(entry(&report, LISTED)));
    // alice's two tools and bob's one by their own lists, and bob's hidden one: four calls.
    assert_eq!(calls.len(), 4, "{calls:?}");

    let (report, _) = run(Flaw::SameLists, false).await;
    let unlisted = entry(&report, UNLISTED);
    assert_eq!(unlisted.outcome.verdict, Verdict::NotTestable, "{}", shown(unlisted));
    assert_eq!(
        unlisted.outcome.detail,
        "every identity is listed the same tools (alice 2, bob 2, on 2026-07-28): no tool is hidden from one \
         identity and shown to another, so list filtering cannot be told from access control here"
    );
    assert_eq!(entry(&report, LISTED).outcome.verdict, Verdict::Pass);
}

/// Cedar policies for the demo: everything for everyone, but `catalog_search` never for the
/// globex tenant (hidden from its list), and never a search for anything secret (a rule reading
/// the arguments: listed to the others, decided at the call).
const POLICIES: &str = r#"@id("shop")
permit (principal, action, resource);

@id("globex-no-search")
forbid (principal, action == Palisade::Action::"tools/call", resource == Palisade::Tool::"catalog_search")
when { principal.tenant == "globex" };

@id("no-secret-search")
forbid (principal, action == Palisade::Action::"tools/call", resource == Palisade::Tool::"catalog_search")
when { context.arguments has query && context.arguments.query like "*secret*" };
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_under_a_policy_set_that_hides_a_tool_passes_both() {
    let config_dir = Scratch::new("access-policies");
    let policy_file = config_dir.file("shop.cedar", POLICIES);
    let config = config_dir.file("palisade.toml", &format!("[policies]\nfiles = [{policy_file:?}]\n"));
    let demo = Demo::start_with(&["--config".into(), config.to_str().unwrap().to_owned()]);
    let scratch = Scratch::new("access-demo-identities");
    let scope = "shop:read shop:basket";
    let files = [
        identity(&scratch, "alice", &demo.token("alice", "acme", "shop-web", scope), "acme", "shop-web"),
        identity(&scratch, "bob", &demo.token("bob", "acme", "shop-web", scope), "acme", "shop-web"),
        identity(&scratch, "carol", &demo.token("carol", "globex", "shop-cli", scope), "globex", "shop-cli"),
    ];
    let mut argv = vec![demo.url.clone(), "--i-am-authorized".into(), "--allow-mutations".into()];
    for file in &files {
        argv.extend(["--identity".into(), file.to_str().unwrap().to_owned()]);
    }
    argv.extend(["--module".into(), "access".into()]);
    let report = verify(&VerifyArgs::parse_from(&argv).unwrap(), &mut |_, _| {}).await.unwrap();
    let unlisted = entry(&report, UNLISTED);
    assert_eq!(unlisted.outcome.verdict, Verdict::Pass, "{}", shown(unlisted));
    // carol is not listed catalog_search, and the operator policy refuses her call (-32033).
    assert!(
        unlisted.outcome.detail.contains("catalog_search to carol (HTTP 200, error -32033)"),
        "{}",
        shown(unlisted)
    );
    let transcript = unlisted.outcome.transcript.join("\n");
    assert!(transcript.contains("refused by operator policy"), "{transcript}");
    let listed = entry(&report, LISTED);
    assert_eq!(listed.outcome.verdict, Verdict::Pass, "{}", shown(listed));
    // The argument rule lists catalog_search to alice, and her call reaches the tool.
    assert!(listed.outcome.detail.contains("catalog_search as alice"), "{}", shown(listed));
    assert!(!listed.outcome.detail.contains("catalog_search as carol"), "{}", shown(listed));
    assert_eq!(report.exit_code(), 0);
}
