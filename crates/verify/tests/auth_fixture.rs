//! The auth module against deliberately broken resource servers: one decodes the JWT payload
//! without verifying the signature and accepts any `alg` (and echoes the credential it got in
//! every answer), a variant also takes `?access_token=`. The forgery checks FAIL with their
//! controls accepted, the exit code is 1, and neither a real nor a forged token reaches a report.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::ExitCode;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse as _, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_verify::check::Verdict;
use palisade_verify::report::{Format, Report};
use palisade_verify::{VerifyArgs, run, verify};
use serde_json::{Value, json};
use support::{Scratch, assert_no_token};

struct Broken {
    base: String,
    accepts_query: bool,
}

/// The subject of a JWT's payload, read without looking at the header or the signature.
fn unverified_subject(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("sub").and_then(Value::as_str).map(str::to_owned)
}

async fn mcp(State(broken): State<Arc<Broken>>, uri: Uri, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let id =
        serde_json::from_slice::<Value>(&body).ok().and_then(|frame| frame.get("id").cloned()).unwrap_or(Value::Null);
    let credential = headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()).unwrap_or_default();
    let bearer = credential.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")).map(|(_, t)| t);
    let from_query = url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
        .find(|(name, _)| name == "access_token" && broken.accepts_query)
        .map(|(_, value)| value.into_owned());
    let token = bearer.map(str::to_owned).or(from_query).unwrap_or_default();
    let token = token.as_str();
    if unverified_subject(token).is_some() {
        let result = json!({ "tools": [], "resultType": "complete", "echo": token });
        return axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response();
    }
    let challenge = format!(
        "Bearer error=\"invalid_token\", resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
        broken.base
    );
    let error = json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32600, "message": format!("bad token {credential}") } });
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, challenge)], axum::Json(error)).into_response()
}

async fn metadata(State(broken): State<Arc<Broken>>) -> Response {
    axum::Json(json!({
        "resource": format!("{}/mcp", broken.base),
        "authorization_servers": [format!("{}/issuer", broken.base)],
    }))
    .into_response()
}

async fn fixture(accepts_query: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let state = Arc::new(Broken { base: base.clone(), accepts_query });
    let router = axum::Router::new()
        .route("/mcp", axum::routing::post(mcp))
        .route("/.well-known/oauth-protected-resource/mcp", axum::routing::get(metadata))
        .with_state(state);
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("{base}/mcp")
}

/// A JWT-shaped token (ES256 header, a made-up signature) for `subject` and `audience`.
fn jwt(subject: &str, audience: &str) -> String {
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"ES256","kid":"fixture-key-1","typ":"at+jwt"}"#);
    let claims = json!({ "sub": subject, "aud": audience, "exp": 4_102_444_800_i64, "scope": "read" });
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signature = URL_SAFE_NO_PAD.encode(format!("fixture-signature-of-{subject}-for-{audience}-0123456789"));
    format!("{header}.{payload}.{signature}")
}

struct Identities {
    _scratch: Scratch,
    argv: Vec<String>,
    tokens: Vec<String>,
}

fn identities(url: &str) -> Identities {
    let scratch = Scratch::new("auth-fixture");
    let tokens = vec![jwt("alice", url), jwt("bob", url), jwt("alice", "http://127.0.0.1:1/other")];
    let alice = scratch.file(
        "alice.toml",
        &format!(
            "name = \"alice\"\ntoken = \"{}\"\nsubject = \"alice\"\nother_resource_token = \"{}\"\n",
            tokens[0], tokens[2]
        ),
    );
    let bob = scratch.file("bob.toml", &format!("name = \"bob\"\ntoken = \"{}\"\nsubject = \"bob\"\n", tokens[1]));
    let argv = vec![
        url.to_owned(),
        "--i-am-authorized".to_owned(),
        "--identity".to_owned(),
        alice.to_str().unwrap().to_owned(),
        "--identity".to_owned(),
        bob.to_str().unwrap().to_owned(),
    ];
    Identities { _scratch: scratch, argv, tokens }
}

fn verdict(report: &Report, id: &str) -> Verdict {
    report.entries.iter().find(|entry| entry.check.id == id).unwrap_or_else(|| panic!("no {id}")).outcome.verdict
}

const FORGERIES: [&str; 17] = [
    "auth.token.other_resource",
    "auth.jwt.alg_none",
    "auth.jwt.alg_none_capitalized",
    "auth.jwt.alg_none_uppercase",
    "auth.jwt.alg_none_signature_kept",
    "auth.jwt.kid_unknown",
    "auth.jwt.kid_path_traversal",
    "auth.jwt.kid_sql_injection",
    "auth.jwt.jku_foreign",
    "auth.jwt.x5u_foreign",
    "auth.jwt.payload_sub",
    "auth.jwt.payload_exp",
    "auth.jwt.payload_aud",
    "auth.jwt.signature_flipped",
    "auth.jwt.signature_stripped",
    "auth.jwt.signature_missing",
    "auth.token.trailing_garbage",
];

/// Every credential the fixture echoed is shown redacted.
fn assert_echoes_redacted(report: &Report) {
    let mut echoes = 0;
    for entry in &report.entries {
        for transcript in &entry.outcome.transcript {
            for (at, _) in transcript.match_indices("\"echo\":\"") {
                echoes += 1;
                let shown = &transcript[at + 8..];
                assert!(shown.starts_with("[redacted:"), "{}: {}", entry.check.id, &shown[..shown.len().min(60)]);
            }
        }
    }
    assert!(echoes > FORGERIES.len(), "the fixture echoed the credentials it accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_checks_signatures_fails_every_forgery_check() {
    let url = fixture(false).await;
    let run_of = identities(&url);
    let args = VerifyArgs::parse_from(&run_of.argv).unwrap();
    let report = verify(&args, &mut |_, _| {}).await.unwrap();
    for id in FORGERIES {
        let entry = report.entries.iter().find(|entry| entry.check.id == id).unwrap();
        assert_eq!(entry.outcome.verdict, Verdict::Fail, "{id}: {}", entry.outcome.detail);
        // The positive control (the identity's own token) was accepted first.
        assert!(entry.outcome.transcript[0].contains("\"result\""), "{id}: {}", entry.outcome.transcript[0]);
    }
    // What it does right is not a finding: the challenge, its metadata, refusing what is no JWT.
    for id in [
        "auth.challenge.resource_metadata",
        "auth.metadata.resource",
        "auth.metadata.authorization_servers",
        "auth.token.not_jwt",
        "auth.token.empty",
        "auth.token.query_string",
        "auth.scheme.basic",
        "auth.scheme.token",
        "auth.scheme.lowercase",
    ] {
        assert_eq!(verdict(&report, id), Verdict::Pass, "{id}");
    }
    // It takes the first of two Authorization headers: a weakness, not a violation.
    assert_eq!(verdict(&report, "auth.header.repeated"), Verdict::Warning);
    // No key set is published, no expired token was given: never passed, not testable.
    for id in ["auth.jwt.hs256_public_key", "auth.token.expired", "auth.scope.insufficient"] {
        assert_eq!(verdict(&report, id), Verdict::NotTestable, "{id}");
    }
    assert_eq!(report.exit_code(), 1);
    assert_echoes_redacted(&report);
    for format in [Format::Json, Format::Sarif, Format::Junit, Format::Markdown] {
        assert_no_token(&report.render(format), &run_of.tokens, &format!("{format:?} report"));
    }
    assert_eq!(run(VerifyArgs::parse_from(&run_of.argv).unwrap()).await.unwrap(), ExitCode::from(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_takes_the_token_from_the_query_string_is_caught() {
    let url = fixture(true).await;
    let run_of = identities(&url);
    let report = verify(&VerifyArgs::parse_from(&run_of.argv).unwrap(), &mut |_, _| {}).await.unwrap();
    let entry = report.entries.iter().find(|entry| entry.check.id == "auth.token.query_string").unwrap();
    assert_eq!(entry.outcome.verdict, Verdict::Fail, "{}", entry.outcome.detail);
    // The URL that carried the token is shown with the value redacted.
    assert!(entry.outcome.transcript[1].contains("access_token=%5Bredacted%5D"), "{}", entry.outcome.transcript[1]);
    assert_eq!(report.exit_code(), 1);
    assert_no_token(&report.render(Format::Json), &run_of.tokens, "JSON report");
}
