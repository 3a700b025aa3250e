//! The verifier against a deliberately broken server (any Host, any Origin, batches answered,
//! every id accepted): the checks meant for those flaws FAIL with their controls accepted; the
//! safety gates refuse before a single request (counted at the fixture); a baseline turns the
//! failures into exit 0 and reports an entry whose check passes as stale.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use palisade_verify::check::Verdict;
use palisade_verify::report::Report;
use palisade_verify::{Refusal, VerifyArgs, run, verify};
use serde_json::{Value, json};
use support::{Scratch, assert_no_token, identity};

/// A server that checks nothing but the presence of a token (so `transport.auth.missing`
/// passes) and answers every JSON-RPC message, batches included, with a result.
async fn broken(State(requests): State<Arc<AtomicUsize>>, headers: HeaderMap, body: Bytes) -> Response {
    requests.fetch_add(1, Ordering::SeqCst);
    if !headers.contains_key(header::AUTHORIZATION) {
        let challenge = "Bearer resource_metadata=\"http://127.0.0.1/.well-known/oauth-protected-resource\"";
        let error =
            json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32600, "message": "authentication required" } });
        return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, challenge)], axum::Json(error)).into_response();
    }
    let answer = |message: &Value| json!({ "jsonrpc": "2.0", "id": message.get("id").cloned().unwrap_or(Value::Null), "result": { "tools": [], "resultType": "complete" } });
    match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Array(messages)) => axum::Json(Value::Array(messages.iter().map(answer).collect())).into_response(),
        Ok(message) => axum::Json(answer(&message)).into_response(),
        Err(_) => axum::Json(answer(&Value::Null)).into_response(),
    }
}

struct Fixture {
    port: u16,
    requests: Arc<AtomicUsize>,
}

async fn fixture() -> Fixture {
    let requests = Arc::new(AtomicUsize::new(0));
    let router = axum::Router::new().fallback(broken).with_state(requests.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    Fixture { port, requests }
}

const TOKENS: [&str; 2] = ["fixture-token-alice-0123456789abcdef", "fixture-token-bob-0123456789abcdefgh"];

fn identities(scratch: &Scratch) -> Vec<String> {
    let alice = identity(scratch, "alice", TOKENS[0], "t1", "c1");
    let bob = identity(scratch, "bob", TOKENS[1], "t1", "c1");
    vec!["--identity".into(), alice.to_str().unwrap().into(), "--identity".into(), bob.to_str().unwrap().into()]
}

fn args(url: String, extra: &[&str], scratch: &Scratch) -> VerifyArgs {
    let mut argv = vec![url];
    argv.extend(identities(scratch));
    argv.extend(extra.iter().map(|s| (*s).to_owned()));
    VerifyArgs::parse_from(argv).unwrap()
}

async fn run_against(args: &VerifyArgs) -> Report {
    verify(args, &mut |_, _| {}).await.unwrap()
}

fn verdict(report: &Report, id: &str) -> Verdict {
    report.entries.iter().find(|entry| entry.check.id == id).unwrap_or_else(|| panic!("no {id}")).outcome.verdict
}

const MEANT_TO_FAIL: [&str; 5] = [
    "transport.host.foreign",
    "transport.host.lookalike",
    "transport.origin.foreign",
    "transport.origin.null",
    "transport.batch.array",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broken_fixture_fails_the_checks_meant_for_it() {
    let fixture = fixture().await;
    let scratch = Scratch::new("fixture");
    let url = format!("http://127.0.0.1:{}/mcp", fixture.port);
    let report = run_against(&args(url, &["--i-am-authorized"], &scratch)).await;
    for id in MEANT_TO_FAIL {
        let entry = report.entries.iter().find(|entry| entry.check.id == id).unwrap();
        assert_eq!(entry.outcome.verdict, Verdict::Fail, "{id}: {}", entry.outcome.detail);
        // The positive control (first exchange) was accepted: a result for its id.
        assert_eq!(entry.outcome.transcript.len(), 2, "{id}");
        assert!(entry.outcome.transcript[0].contains("\"result\""), "{id}: {}", entry.outcome.transcript[0]);
    }
    for id in
        ["transport.id.null", "transport.id.float", "transport.header.method_mismatch", "transport.version.unsupported"]
    {
        assert_eq!(verdict(&report, id), Verdict::Fail, "{id}");
    }
    // What the fixture does right is not reported as a failure.
    assert_eq!(verdict(&report, "transport.auth.missing"), Verdict::Pass);
    // It lists no resource or prompt: the Mcp-Name cases cannot be made.
    assert_eq!(verdict(&report, "transport.header.name_mismatch"), Verdict::NotTestable);
    assert_eq!(report.exit_code(), 1);
    for format in [palisade_verify::report::Format::Json, palisade_verify::report::Format::Sarif] {
        let text = report.render(format);
        assert_no_token(&text, &TOKENS.map(str::to_owned), "fixture report");
    }
    let sarif: Value = serde_json::from_str(&report.render(palisade_verify::report::Format::Sarif)).unwrap();
    let rules: Vec<&str> =
        sarif["runs"][0]["results"].as_array().unwrap().iter().map(|r| r["ruleId"].as_str().unwrap()).collect();
    assert!(MEANT_TO_FAIL.iter().all(|id| rules.contains(id)), "{rules:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_safety_gates_refuse_before_any_request() {
    let fixture = fixture().await;
    let scratch = Scratch::new("gates");
    let loopback = format!("http://127.0.0.1:{}/mcp", fixture.port);
    // No confirmation: refused, exit 2, nothing sent.
    let unconfirmed = args(loopback.clone(), &[], &scratch);
    assert!(matches!(verify(&unconfirmed, &mut |_, _| {}).await, Err(Refusal::NotAuthorized)));
    assert_eq!(run(unconfirmed).await.unwrap(), ExitCode::from(2));
    // 0.0.0.0 reaches this machine's listeners but is not a loopback address: it needs
    // --target-host; without it nothing is sent.
    let unspecified = format!("http://0.0.0.0:{}/mcp", fixture.port);
    let unnamed = args(unspecified.clone(), &["--i-am-authorized"], &scratch);
    assert!(matches!(verify(&unnamed, &mut |_, _| {}).await, Err(Refusal::HostNotAllowed(_))));
    assert_eq!(run(unnamed).await.unwrap(), ExitCode::from(2));
    let misnamed = args(unspecified.clone(), &["--i-am-authorized", "--target-host", "mcp.example.com"], &scratch);
    assert_eq!(run(misnamed).await.unwrap(), ExitCode::from(2));
    // One identity is not enough: refused before any request too.
    let mut one = vec![loopback.clone(), "--i-am-authorized".to_owned()];
    one.extend(identities(&scratch).into_iter().take(2));
    let one = VerifyArgs::parse_from(one).unwrap();
    assert!(matches!(verify(&one, &mut |_, _| {}).await, Err(Refusal::Identity(_))));
    assert_eq!(fixture.requests.load(Ordering::SeqCst), 0, "a refused run sent a request");
    // The same host named: the run goes ahead and reaches the fixture.
    let named = args(unspecified, &["--i-am-authorized", "--target-host", "0.0.0.0"], &scratch);
    let report = run_against(&named).await;
    assert!(fixture.requests.load(Ordering::SeqCst) > 0);
    assert_eq!(verdict(&report, "transport.origin.foreign"), Verdict::Fail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_baseline_accepts_failures_and_reports_stale_entries() {
    let fixture = fixture().await;
    let scratch = Scratch::new("baseline");
    let url = format!("http://127.0.0.1:{}/mcp", fixture.port);
    let first = run_against(&args(url.clone(), &["--i-am-authorized"], &scratch)).await;
    let failing: Vec<&str> =
        first.entries.iter().filter(|e| e.outcome.verdict == Verdict::Fail).map(|e| e.check.id).collect();
    assert!(failing.len() >= MEANT_TO_FAIL.len());
    let mut baseline = String::new();
    for id in &failing {
        baseline.push_str(&format!(
            "[[accepted]]\nid = \"{id}\"\nreason = \"fixture is broken on purpose\"\njudgement = \"real\"\n\
             evidence = \"the fixture serves it\"\nbreaks = \"the check's requirement\"\n\n"
        ));
    }
    baseline.push_str(
        "[[accepted]]\nid = \"transport.auth.missing\"\nreason = \"was broken once\"\njudgement = \"real\"\n\
         evidence = \"served once\"\nbreaks = \"authorization\"\n",
    );
    let file = scratch.file("baseline.toml", &baseline);
    let path = file.to_str().unwrap();
    let report = run_against(&args(url.clone(), &["--i-am-authorized", "--baseline", path], &scratch)).await;
    assert_eq!(report.exit_code(), 0);
    assert!(report.count(Verdict::Fail) >= MEANT_TO_FAIL.len(), "still reported as failures");
    let stale: Vec<&str> = report.stale.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(stale, ["transport.auth.missing"]);
    assert!(report.summary_table().contains("stale baseline entry: transport.auth.missing"));
    let json: Value = serde_json::from_str(&report.render(palisade_verify::report::Format::Json)).unwrap();
    assert_eq!(json["summary"]["unbaselined_failures"], 0);
    assert_eq!(json["stale_baseline"][0]["id"], "transport.auth.missing");
    assert_eq!(
        run(args(url.clone(), &["--i-am-authorized", "--baseline", path], &scratch)).await.unwrap(),
        ExitCode::SUCCESS
    );
    // Without the baseline the same run exits 1; a baseline entry without a reason is refused (2).
    assert_eq!(run(args(url.clone(), &["--i-am-authorized"], &scratch)).await.unwrap(), ExitCode::from(1));
    let bad = scratch.file("bad.toml", "[[accepted]]\nid = \"transport.batch.array\"\nreason = \" \"\n");
    let bad_args = args(url, &["--i-am-authorized", "--baseline", bad.to_str().unwrap()], &scratch);
    assert_eq!(run(bad_args).await.unwrap(), ExitCode::from(2));
}
