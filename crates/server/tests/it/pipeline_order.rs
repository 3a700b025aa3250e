//! The request path's order, proven from outside: a handler cannot run before authentication
//! and authorization, every decision is audited without secrets, and an audit log that cannot
//! record the allow decision stops the request (fail closed).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use palisade_auth::dev_issuer::DevIssuer;
use palisade_auth::{ResourceServerConfig, TokenVerifier};
use palisade_server::auth::Authenticator;
use palisade_server::secret::ServerSecret;
use palisade_server::{App, CallToolResult, Outcome, Server, ServerConfig, ToolDef};
use palisade_store::{AuditStore, PostgresOptions, PostgresStore, SqliteStore};
use serde_json::{Value, json};

const RESOURCE: &str = "http://127.0.0.1:1/mcp";
const ISSUER: &str = "http://127.0.0.1:1/dev-issuer";

struct Fixture {
    url: String,
    calls: Arc<AtomicUsize>,
    issuer: DevIssuer,
    server: Arc<Server>,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> TempDir {
    let path = std::env::temp_dir().join(format!("palisade-order-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).unwrap();
    TempDir(path)
}

async fn start(name: &str, store: Arc<dyn AuditStore>) -> Fixture {
    palisade_auth::install_crypto_provider();
    let dir = temp_dir(name);
    let issuer = DevIssuer::load_or_create(&dir.0, ISSUER).unwrap();
    let metadata = "http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp";
    let mut config = ResourceServerConfig::new(RESOURCE, metadata, vec![issuer.issuer_config()]);
    config.scopes_supported = vec!["orders:read".into()];
    let verifier = TokenVerifier::new(config).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let app = App::builder("order-test", "0")
        .tool(ToolDef::new("counted").description("counts its calls").scopes(&["orders:read"]).handler(move |_, _| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(Outcome::Complete(CallToolResult::text("ran")))
            }
        }))
        .build()
        .unwrap();
    let server = Server::builder(
        app,
        ServerConfig::default(),
        Authenticator::Bearer(Arc::new(verifier)),
        ServerSecret::random(),
    )
    .audit(store)
    .build()
    .unwrap();
    let server = Arc::new(server);
    let url = crate::common::serve_on_loopback(&server).await;
    Fixture { url, calls, issuer, server, _dir: dir }
}

async fn call(url: &str, token: Option<&str>) -> (u16, Option<String>, Value) {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": "counted", "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {} } } });
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "counted")
        .body(body.to_string());
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let challenge = response.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_owned());
    (status, challenge, response.json().await.unwrap())
}

#[tokio::test]
async fn no_handler_runs_before_authentication_and_authorization() {
    let store: Arc<dyn AuditStore> = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let fixture = start("order", store.clone()).await;
    let other_dir = temp_dir("impostor");
    // Same issuer name, different key: the signature cannot verify.
    let impostor = DevIssuer::load_or_create(&other_dir.0, ISSUER).unwrap();

    let (status, challenge, _) = call(&fixture.url, None).await;
    assert_eq!(status, 401);
    assert!(challenge.unwrap().contains("resource_metadata="));
    let forged = impostor.mint("mallory", "t1", "c1", &["orders:read"], RESOURCE, 300).unwrap();
    assert_eq!(call(&fixture.url, Some(&forged)).await.0, 401);
    let wrong_audience =
        fixture.issuer.mint("alice", "t1", "c1", &["orders:read"], "http://127.0.0.1:2/mcp", 300).unwrap();
    assert_eq!(call(&fixture.url, Some(&wrong_audience)).await.0, 401);
    let unscoped = fixture.issuer.mint("alice", "t1", "c1", &["other"], RESOURCE, 300).unwrap();
    let (status, challenge, body) = call(&fixture.url, Some(&unscoped)).await;
    assert_eq!(status, 403);
    assert!(challenge.unwrap().contains(r#"error="insufficient_scope", scope="orders:read""#));
    assert_eq!(body["error"]["data"]["requiredScopes"], json!(["orders:read"]));
    assert_eq!(fixture.calls.load(Ordering::SeqCst), 0, "no handler ran for any refused request");

    // Step up: the same call with the named scope succeeds, and only now the handler runs.
    let scoped = fixture.issuer.mint("alice", "t1", "c1", &["other", "orders:read"], RESOURCE, 300).unwrap();
    let (status, _, body) = call(&fixture.url, Some(&scoped)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(fixture.calls.load(Ordering::SeqCst), 1);

    // Every decision is in the hash-chained log; no token appears in it.
    let report = store.verify_chain().await.unwrap();
    assert!(report.is_intact());
    let records = store.recent(100).await.unwrap();
    let text = format!("{records:?}");
    for token in [&forged, &wrong_audience, &unscoped, &scoped] {
        assert!(!text.contains(token.as_str()), "a raw token reached the audit log");
    }
    let decisions: Vec<(String, String)> =
        records.iter().map(|r| (r.record.stage.clone(), r.record.decision.as_str().to_owned())).collect();
    assert_eq!(decisions.iter().filter(|(s, d)| s == "authenticate" && d == "deny").count(), 3, "{decisions:?}");
    assert_eq!(decisions.iter().filter(|(s, d)| s == "authorize" && d == "deny").count(), 1, "{decisions:?}");
    assert_eq!(decisions.iter().filter(|(s, d)| s == "authorize" && d == "allow").count(), 1, "{decisions:?}");
}

#[tokio::test]
async fn an_unavailable_audit_log_stops_the_request() {
    let options = PostgresOptions { max_connections: 1, acquire_timeout: Duration::from_millis(300) };
    // Nothing listens on port 1: every append fails.
    let store: Arc<dyn AuditStore> =
        Arc::new(PostgresStore::connect_lazy_with("postgres://postgres@127.0.0.1:1/none", options).unwrap());
    let fixture = start("down", store).await;
    let token = fixture.issuer.mint("alice", "t1", "c1", &["orders:read"], RESOURCE, 300).unwrap();
    let (status, _, body) = call(&fixture.url, Some(&token)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["message"], "temporarily unavailable");
    assert_eq!(fixture.calls.load(Ordering::SeqCst), 0, "the handler must not run without a durable allow record");
    // The operator sees it: the allow that could not be made durable is counted.
    let exposition = fixture.server.metrics().render();
    let failures = exposition
        .lines()
        .find_map(|line| line.strip_prefix("palisade_audit_append_failures_total "))
        .and_then(|value| value.parse::<f64>().ok());
    assert!(failures.is_some_and(|count| count >= 1.0), "{exposition}");
}
