//! The verifier against a server that needs no authentication at all (every request served,
//! with or without a token, whatever the token): the `auth.*` FAILs that follow from it are
//! grouped under one root cause, `auth.none`, in the summary and in every report format, each
//! keeping its own verdict; its Host and Origin FAILs under a second,
//! `transport.no_rebinding_protection`.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use axum::body::Bytes;
use axum::response::{IntoResponse as _, Response};
use palisade_verify::check::Verdict;
use palisade_verify::report::{Format, NO_AUTHENTICATION};
use palisade_verify::{VerifyArgs, verify};
use serde_json::{Value, json};
use support::{Scratch, identity};

async fn open(body: Bytes) -> Response {
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let result = match message.get("method").and_then(Value::as_str).unwrap_or_default() {
        "server/discover" => json!({ "supportedVersions": ["2026-07-28"], "capabilities": { "tools": {} } }),
        "tools/list" => json!({ "tools": [{ "name": "echo", "inputSchema": { "type": "object" } }] }),
        _ => json!({}),
    };
    axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response()
}

const TOKENS: [&str; 2] = ["noauth-token-alice-0123456789abcdefghij", "noauth-token-bob-0123456789abcdefghijkl"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failures_of_a_target_without_authentication_are_grouped_under_one_root_cause() {
    let router = axum::Router::new().fallback(open);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });

    let scratch = Scratch::new("noauth-fixture");
    let alice = identity(&scratch, "alice", TOKENS[0], "t1", "c1");
    let bob = identity(&scratch, "bob", TOKENS[1], "t2", "c1");
    let argv = [
        format!("http://127.0.0.1:{port}/mcp"),
        "--i-am-authorized".into(),
        "--module".into(),
        "transport".into(),
        "--module".into(),
        "auth".into(),
        "--identity".into(),
        alice.to_str().unwrap().into(),
        "--identity".into(),
        bob.to_str().unwrap().into(),
    ];
    let report = verify(&VerifyArgs::parse_from(argv).unwrap(), &mut |_, _| {}).await.unwrap();

    // Two root causes: no authentication, and (the fixture serves any Host and Origin) no
    // DNS-rebinding protection, each grouping its own FAILs.
    let ids: Vec<&str> = report.root_causes.iter().map(|cause| cause.id).collect();
    assert_eq!(ids, [NO_AUTHENTICATION, "transport.no_rebinding_protection"], "{}", report.summary_table());
    let cause = &report.root_causes[0];
    let rebinding = &report.root_causes[1];
    assert!(
        rebinding.checks.contains(&"transport.host.foreign") && rebinding.checks.contains(&"transport.origin.foreign")
    );
    assert!(
        cause.detail.starts_with("a request with no token was served (tools/list without a token"),
        "{}",
        cause.detail
    );
    // Every auth.* FAIL is under it, and keeps its own verdict.
    let auth_failures: Vec<&str> = report
        .entries
        .iter()
        .filter(|entry| entry.check.id.starts_with("auth.") && entry.outcome.verdict == Verdict::Fail)
        .map(|entry| entry.check.id)
        .collect();
    assert!(auth_failures.len() >= 5, "{auth_failures:?}");
    for id in &auth_failures {
        assert!(cause.checks.contains(id), "{id} is not under the root cause");
    }
    assert!(cause.checks.contains(&"transport.auth.missing"), "{:?}", cause.checks);
    for entry in &report.entries {
        let expected = [cause, rebinding].into_iter().find(|c| c.checks.contains(&entry.check.id)).map(|c| c.id);
        assert_eq!(entry.root_cause, expected, "{}", entry.check.id);
    }
    assert!(report.count(Verdict::Fail) >= cause.checks.len());

    // The summary: the root cause once, its checks indented under it, not among the others.
    let summary = report.summary_table();
    assert_eq!(summary.matches("ROOT CAUSE auth.none").count(), 1, "{summary}");
    let (others, under) = summary.split_once("ROOT CAUSE auth.none").unwrap();
    for id in &cause.checks {
        assert!(under.contains(&format!("\n  {id} ")), "{id} not under the root cause\n{summary}");
        assert!(!others.contains(&format!("\n{id} ")), "{id} also among the other checks\n{summary}");
    }

    // JSON: the root cause with its checks; each check names it and keeps its verdict.
    let json: Value = serde_json::from_str(&report.render(Format::Json)).unwrap();
    assert_eq!(json["root_causes"][0]["id"], "auth.none");
    assert_eq!(json["root_causes"][0]["checks"].as_array().unwrap().len(), cause.checks.len());
    let grouped = json["checks"].as_array().unwrap().iter().filter(|c| c["root_cause"] == "auth.none");
    assert!(grouped.clone().count() == cause.checks.len() && grouped.into_iter().all(|c| c["verdict"] == "fail"));

    // Markdown: a section for the root cause holding its checks, before the other checks.
    let markdown = report.render(Format::Markdown);
    let (head, rest) = markdown.split_once("## Root cause `auth.none`").unwrap();
    assert!(head.contains("- **Verdicts:**"), "{markdown}");
    let (section, other) = rest.split_once("## Other checks").unwrap();
    for id in &cause.checks {
        assert!(section.contains(&format!("| `{id}` | fail |")), "{id}\n{markdown}");
        assert!(!other.contains(&format!("| `{id}` |")), "{id}\n{markdown}");
    }

    // SARIF: one error for the root cause; its checks are notes pointing at it.
    let sarif: Value = serde_json::from_str(&report.render(Format::Sarif)).unwrap();
    let results = sarif["runs"][0]["results"].as_array().unwrap();
    let root: Vec<&Value> = results.iter().filter(|r| r["ruleId"] == "auth.none").collect();
    assert_eq!(root.len(), 1);
    assert_eq!(root[0]["level"], "error");
    for id in &cause.checks {
        let result = results.iter().find(|r| r["ruleId"] == *id).unwrap();
        assert_eq!(result["level"], "note", "{id}");
        assert_eq!(result["properties"]["rootCause"], "auth.none", "{id}");
        assert_eq!(result["properties"]["verdict"], "fail", "{id}");
    }
    assert!(sarif["runs"][0]["tool"]["driver"]["rules"].as_array().unwrap().iter().any(|r| r["id"] == "auth.none"));

    // JUnit: a suite of the root cause holding its checks, each still a failure.
    let junit = report.render(Format::Junit);
    let (main, suite) = junit.split_once("<testsuite name=\"palisade-verify root cause auth.none\"").unwrap();
    for id in &cause.checks {
        assert!(suite.contains(&format!("name=\"{id}\"><failure")), "{id}\n{junit}");
        assert!(!main.contains(&format!("name=\"{id}\"")), "{id}\n{junit}");
    }
}
