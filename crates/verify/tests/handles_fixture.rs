//! The verifier against a deliberately broken 2026-07-28 server whose application handles ignore
//! the caller (any token presenting a live handle is served, and may close it): the handle
//! checks meant for that flaw FAIL with their controls accepted, the ones it gets right pass, no
//! handle it issued or was sent reaches any report, and its destructive `basket_delete` is never
//! called; with identities that declare a `subject` only, the cross-subject checks still run and
//! FAIL; and without `--allow-mutations` the module sends nothing and creates nothing.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_verify::check::Verdict;
use palisade_verify::report::{Format, Report};
use palisade_verify::{VerifyArgs, verify};
use serde_json::{Value, json};
use support::{Scratch, assert_no_token, identity, identity_of};

/// What the fixture saw: every request, every create, every handle issued and every handle
/// argument received; the live baskets by handle.
#[derive(Default)]
struct Shop {
    requests: usize,
    creates: usize,
    /// Calls by tool name.
    calls: HashMap<String, usize>,
    issued: Vec<String>,
    received: Vec<String>,
    baskets: HashMap<String, Vec<Value>>,
}

type Shared = Arc<Mutex<Shop>>;

fn answer(id: &Value, result: Value) -> Response {
    axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response()
}

fn error(status: StatusCode, id: &Value, code: i64, message: &str) -> Response {
    let body = json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } });
    (status, axum::Json(body)).into_response()
}

fn tools() -> Value {
    let handle = json!({ "type": "string", "minLength": 43, "maxLength": 43, "description": "A basket handle." });
    json!([
        { "name": "basket_create", "inputSchema": { "type": "object" },
          "outputSchema": { "type": "object", "properties": { "basket": { "type": "string" } }, "required": ["basket"] } },
        { "name": "basket_view", "annotations": { "readOnlyHint": true },
          "inputSchema": { "type": "object", "properties": { "basket": handle }, "required": ["basket"] } },
        { "name": "basket_add_item", "annotations": { "readOnlyHint": false },
          "inputSchema": { "type": "object", "required": ["basket", "sku", "quantity"], "properties": {
              "basket": handle,
              "sku": { "type": "string", "description": "Stock-keeping unit, e.g. `TEA-001`." },
              "quantity": { "type": "integer", "minimum": 1, "maximum": 99 } } } },
        { "name": "basket_delete", "annotations": { "destructiveHint": true },
          "inputSchema": { "type": "object", "properties": { "basket": handle }, "required": ["basket"] } },
        { "name": "basket_close", "description": "Closes the basket: its handle stops working.",
          "inputSchema": { "type": "object", "properties": { "basket": handle }, "required": ["basket"] } },
        { "name": "catalog_search", "annotations": { "readOnlyHint": true },
          "inputSchema": { "type": "object", "properties": { "query": { "type": "string" } } } }
    ])
}

fn structured(value: Value) -> Value {
    json!({ "content": [{ "type": "text", "text": value.to_string() }], "structuredContent": value, "resultType": "complete" })
}

async fn broken(State(shop): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let mut shop = shop.lock().unwrap();
    shop.requests += 1;
    if !headers.contains_key(header::AUTHORIZATION) {
        return error(StatusCode::UNAUTHORIZED, &id, -32600, "authentication required");
    }
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    match message.get("method").and_then(Value::as_str) {
        Some("tools/list") => answer(&id, json!({ "tools": tools(), "resultType": "complete" })),
        Some("resources/list") => answer(&id, json!({ "resources": [], "resultType": "complete" })),
        Some("prompts/list") => answer(&id, json!({ "prompts": [], "resultType": "complete" })),
        Some("tools/call") => {
            let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
            let arguments = params.get("arguments").cloned().unwrap_or(Value::Null);
            *shop.calls.entry(name.to_owned()).or_default() += 1;
            if name == "basket_create" {
                let mut raw = [0u8; 32];
                aws_lc_rs::rand::fill(&mut raw).unwrap();
                let handle = URL_SAFE_NO_PAD.encode(raw);
                shop.creates += 1;
                shop.issued.push(handle.clone());
                shop.baskets.insert(handle.clone(), Vec::new());
                return answer(&id, structured(json!({ "basket": handle })));
            }
            let Some(handle) = arguments.get("basket").and_then(Value::as_str).map(str::to_owned) else {
                return error(StatusCode::BAD_REQUEST, &id, -32602, "unknown tool or arguments");
            };
            shop.received.push(handle.clone());
            // The flaw: a live handle is all it takes, whoever presents it.
            let Some(items) = shop.baskets.get_mut(&handle) else {
                return error(StatusCode::BAD_REQUEST, &id, -32602, "no such basket");
            };
            match name {
                "basket_view" => {
                    let items = items.clone();
                    answer(&id, structured(json!({ "items": items, "totalCents": 450 * items.len() })))
                }
                "basket_add_item" => {
                    items.push(json!({ "sku": arguments.get("sku"), "quantity": arguments.get("quantity") }));
                    let items = items.clone();
                    answer(&id, structured(json!({ "items": items, "totalCents": 450 * items.len() })))
                }
                "basket_delete" | "basket_close" => {
                    shop.baskets.remove(&handle);
                    answer(&id, structured(json!({ "closed": true })))
                }
                _ => error(StatusCode::BAD_REQUEST, &id, -32602, "unknown tool"),
            }
        }
        _ => error(StatusCode::NOT_FOUND, &id, -32601, "method not found"),
    }
}

/// An unsigned JWT-shaped token (the fixture checks only that one is present) whose payload
/// claims `scope`, so the verifier can tell which identity holds fewer scopes.
fn token(subject: &str, client: &str, scope: &str) -> String {
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#);
    let claims =
        json!({ "sub": subject, "client_id": client, "scope": scope, "jti": format!("{subject}-{client}-{scope}") });
    format!("{header}.{}.fixture-signature-0123456789", URL_SAFE_NO_PAD.encode(claims.to_string()))
}

struct Fixture {
    url: String,
    shop: Shared,
    scratch: Scratch,
    tokens: Vec<String>,
}

async fn fixture(tag: &str) -> Fixture {
    let shop: Shared = Arc::default();
    let router = axum::Router::new().fallback(broken).with_state(shop.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let both = "shop:read shop:basket";
    let tokens = vec![
        token("alice", "c1", both),
        token("bob", "c1", both),
        token("carol", "c2", both),
        token("alice", "c2", both),
        token("alice", "c1", "shop:read"),
    ];
    Fixture { url: format!("http://127.0.0.1:{port}/mcp"), shop, scratch: Scratch::new(tag), tokens }
}

impl Fixture {
    /// alice (t1, c1), bob (t1, c1), carol (t2, c2), alice through client c2, and alice with
    /// fewer scopes.
    fn args(&self, extra: &[&str]) -> VerifyArgs {
        let files = [
            identity(&self.scratch, "alice", &self.tokens[0], "t1", "c1"),
            identity(&self.scratch, "bob", &self.tokens[1], "t1", "c1"),
            identity(&self.scratch, "carol", &self.tokens[2], "t2", "c2"),
            identity_of(&self.scratch, "alice-cli", "alice", &self.tokens[3], "t1", "c2"),
            identity_of(&self.scratch, "alice-read", "alice", &self.tokens[4], "t1", "c1"),
        ];
        let mut argv = vec![self.url.clone(), "--i-am-authorized".into(), "--module".into(), "handles".into()];
        for file in &files {
            argv.extend(["--identity".into(), file.to_str().unwrap().to_owned()]);
        }
        argv.extend(extra.iter().map(|s| (*s).to_owned()));
        VerifyArgs::parse_from(argv).unwrap()
    }
}

fn verdict(report: &Report, id: &str) -> Verdict {
    report.entries.iter().find(|entry| entry.check.id == id).unwrap_or_else(|| panic!("no {id}")).outcome.verdict
}

/// The checks the caller-blind handles must fail: every substitution across subject, tenant,
/// client and scope, the oracle cases (the foreign handle is served) and revocation by another.
const MEANT_TO_FAIL: [&str; 12] = [
    "handles.read.other_subject",
    "handles.read.other_tenant",
    "handles.read.other_client",
    "handles.write.other_subject",
    "handles.write.other_tenant",
    "handles.write.other_client",
    "handles.substitution.foreign_handle",
    "handles.oracle.other_subject",
    "handles.oracle.other_tenant",
    "handles.oracle.no_echo",
    "handles.scope.escalation",
    "handles.lifecycle.revoke_other",
];

/// What it gets right: handles exist only once issued, are random, never listed, need a token,
/// and die when their owner closes them.
const MEANT_TO_PASS: [&str; 13] = [
    "handles.discover.create",
    "handles.read.no_token",
    "handles.write.no_token",
    "handles.forge.random",
    "handles.forge.last_char",
    "handles.forge.first_char",
    "handles.forge.truncated",
    "handles.forge.appended",
    "handles.forge.case_flipped",
    "handles.issue.distinct",
    "handles.issue.entropy",
    "handles.issue.not_listed",
    "handles.lifecycle.revoked",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_that_ignore_the_caller_are_caught() {
    let fixture = fixture("handles-fixture").await;
    let report = verify(&fixture.args(&["--allow-mutations"]), &mut |_, _| {}).await.unwrap();
    assert!(report.entries.len() >= 22, "{} handle checks", report.entries.len());
    assert!(report.entries.iter().all(|entry| entry.check.id.starts_with("handles.")));

    for id in MEANT_TO_FAIL {
        let entry = report.entries.iter().find(|entry| entry.check.id == id).unwrap();
        assert_eq!(entry.outcome.verdict, Verdict::Fail, "{id}: {}", entry.outcome.detail);
        // The create, then the owner's own use (served: a result), then the foreign use (served too).
        let results = entry.outcome.transcript.iter().filter(|t| t.contains("\"result\"")).count();
        assert!(
            results >= 3,
            "{id}: the create, the control and the negative were served\n{:?}",
            entry.outcome.transcript
        );
        assert!(entry.outcome.detail.contains("served"), "{id}: {}", entry.outcome.detail);
    }
    for id in MEANT_TO_PASS {
        let entry = report.entries.iter().find(|entry| entry.check.id == id).unwrap();
        assert_eq!(entry.outcome.verdict, Verdict::Pass, "{id}: {}", entry.outcome.detail);
        assert!(entry.outcome.transcript.len() >= 2, "{id}");
    }
    // No tool takes two baskets, replaces one, or announces an expiry.
    for id in ["handles.substitution.other_position", "handles.lifecycle.replaced", "handles.lifecycle.expired"] {
        assert_eq!(verdict(&report, id), Verdict::NotTestable, "{id}");
    }
    assert!(report.entries.iter().all(|entry| entry.outcome.verdict != Verdict::Inconclusive));
    assert_eq!(report.exit_code(), 1);

    // No handle it issued or was sent (real, guessed, near-miss), and no token, reaches any report.
    let (issued, received) = {
        let shop = fixture.shop.lock().unwrap();
        (shop.issued.clone(), shop.received.clone())
    };
    assert!(issued.len() >= 22, "{} creates", issued.len());
    assert!(received.iter().any(|handle| !issued.contains(handle)), "forged handles were sent");
    for format in [Format::Json, Format::Junit, Format::Markdown, Format::Sarif] {
        let text = report.render(format);
        for handle in issued.iter().chain(&received).filter(|handle| handle.len() >= 8) {
            assert!(!text.contains(handle.as_str()), "{format:?} report shows a handle");
            // Not even a piece of one (a transcript cut in the middle of a handle).
            assert!(!text.contains(&handle[..16]), "{format:?} report shows part of a handle");
        }
        assert_no_token(&text, &fixture.tokens, "handles fixture report");
    }
    let json = report.render(Format::Json);
    assert!(json.contains("[redacted:handle-alice]"), "the transcripts show where the handles were");
    assert!(json.contains("[redacted:handle-near-miss-"));

    // The destructive tool was never called: revocation went through `basket_close`.
    let calls = fixture.shop.lock().unwrap().calls.clone();
    assert_eq!(calls.get("basket_delete"), None, "{calls:?}");
    assert!(calls.get("basket_close").is_some_and(|n| *n >= 2), "{calls:?}");
}

/// Two identities that declare a `subject` only (`tenant` and `client` are optional): two
/// subjects are two callers, so every cross-subject check runs and FAILs against handles that
/// ignore the caller; the tenant and client cases are NOT TESTABLE (nothing says how the two
/// relate there), and a detail says the tenant is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subject_only_identities_catch_handles_that_ignore_the_caller() {
    let fixture = fixture("handles-fixture-subject-only").await;
    let mut argv = vec![fixture.url.clone(), "--i-am-authorized".into(), "--allow-mutations".into()];
    argv.extend(["--module".into(), "handles".into()]);
    for (name, token) in [("alice", &fixture.tokens[0]), ("bob", &fixture.tokens[1])] {
        let file = fixture
            .scratch
            .file(&format!("{name}.toml"), &format!("name = \"{name}\"\ntoken = \"{token}\"\nsubject = \"{name}\"\n"));
        argv.extend(["--identity".into(), file.to_str().unwrap().to_owned()]);
    }
    let report = verify(&VerifyArgs::parse_from(argv).unwrap(), &mut |_, _| {}).await.unwrap();
    for id in [
        "handles.read.other_subject",
        "handles.write.other_subject",
        "handles.substitution.foreign_handle",
        "handles.oracle.other_subject",
        "handles.oracle.no_echo",
        "handles.lifecycle.revoke_other",
    ] {
        let entry = report.entries.iter().find(|entry| entry.check.id == id).unwrap();
        assert_eq!(entry.outcome.verdict, Verdict::Fail, "{id}: {}", entry.outcome.detail);
    }
    for id in ["handles.read.other_subject", "handles.substitution.foreign_handle", "handles.oracle.other_subject"] {
        let detail = &report.entries.iter().find(|entry| entry.check.id == id).unwrap().outcome.detail;
        assert!(detail.contains("do not both declare a `tenant`"), "{id}: {detail}");
    }
    for id in ["handles.read.other_tenant", "handles.read.other_client", "handles.oracle.other_tenant"] {
        assert_eq!(verdict(&report, id), Verdict::NotTestable, "{id}");
    }
    assert_eq!(report.exit_code(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_without_allow_mutations_are_not_testable_and_nothing_is_sent() {
    let fixture = fixture("handles-fixture-read-only").await;
    let report = verify(&fixture.args(&[]), &mut |_, _| {}).await.unwrap();
    assert!(report.entries.len() >= 22);
    for entry in &report.entries {
        assert_eq!(entry.outcome.verdict, Verdict::NotTestable, "{}", entry.check.id);
        assert!(entry.outcome.detail.contains("--allow-mutations"), "{}: {}", entry.check.id, entry.outcome.detail);
        assert!(entry.outcome.transcript.is_empty(), "{}", entry.check.id);
    }
    let shop = fixture.shop.lock().unwrap();
    assert_eq!((shop.creates, shop.requests), (0, 0));
    assert_eq!(report.exit_code(), 0);
}
