//! One clock for every part: a single advance of the `ManualClock` the parts share expires a
//! bearer token, a handle, a sealed request state, an open listen stream and the kill switch's
//! authority heads together (two servers on the one clock: one with handles, one with a kill
//! switch, because the kill switch's refusal comes before the handle and state checks). A part
//! on another clock is refused at build time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use palisade_auth::dev_issuer::DevIssuer;
use palisade_auth::{JwksPolicy, ResourceServerConfig, TokenVerifier};
use palisade_killswitch::dev::DevAuthorityFiles;
use palisade_server::auth::Authenticator;
use palisade_server::clock::{Clock, ManualClock, SystemClock};
use palisade_server::context::NotificationSink;
use palisade_server::killswitch::exposed_operations;
use palisade_server::pipeline::TransportHeaders;
use palisade_server::secret::ServerSecret;
use palisade_server::{
    App, BuildError, CallToolResult, HandleObject, HandlePolicy, HandleService, HandleType, InputRequired, Outcome,
    Server, ServerConfig, SubjectKey, ToolDef,
};
use palisade_store::SqliteStore;
use palisade_wire::{Request, RequestId};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

const RESOURCE: &str = "http://127.0.0.1:1/mcp";
const ISSUER: &str = "http://127.0.0.1:1/dev-issuer";
/// Every lifetime in the test; the clock then moves past all of them at once.
const LIFETIME: Duration = Duration::from_secs(60);

fn app() -> App {
    let doc = HandleType::new(
        "doc",
        |_tenant: String, doc: String| async move {
            Ok(Some(HandleObject { object_ref: doc.clone(), version: "1".into(), value: json!({ "doc": doc }) }))
        },
        |_principal, _object, _scope, _phase| async { true },
    );
    App::builder("one-clock-test", "0")
        .handle_type(doc)
        .tool(ToolDef::new("open").handler(|ctx, _| async move {
            let handle = ctx.mint_handle("doc", "d1", "1", &["docs:read"]).await?;
            Ok(Outcome::Complete(CallToolResult::structured(json!({ "handle": handle }))))
        }))
        .tool(
            ToolDef::new("read")
                .handle_argument("doc", "doc", "docs:read")
                .handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("read"))) }),
        )
        .tool(ToolDef::new("ask").handler(|ctx, _| async move {
            if ctx.request_state().is_some() {
                return Ok(Outcome::Complete(CallToolResult::text("answered")));
            }
            let schema = json!({ "type": "object", "properties": {} });
            Ok(Outcome::InputRequired(InputRequired::new().elicit("q", "go on?", schema).with_state(json!({ "s": 1 }))))
        }))
        .build()
        .unwrap()
}

fn request(method: &str, params: Value) -> Request {
    let mut params: Map<String, Value> = params.as_object().cloned().unwrap();
    params.insert(
        "_meta".into(),
        json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} } }),
    );
    Request { id: RequestId::Number(1), method: method.into(), params }
}

/// The headers an HTTP client sends with `request`: the bearer token and the routing headers.
fn headers(token: &str, request: &Request) -> TransportHeaders {
    TransportHeaders {
        authorization: Some(format!("Bearer {token}").into_bytes()),
        protocol_version: Some(b"2026-07-28".to_vec()),
        method: Some(request.method.clone().into_bytes()),
        name: request.params.get("name").and_then(Value::as_str).map(|name| name.as_bytes().to_vec()),
        ..TransportHeaders::default()
    }
}

async fn send(server: &Server, token: &str, request: Request) -> Value {
    let (sink, _frames) = NotificationSink::channel(16);
    let headers = headers(token, &request);
    server.handle_request(request, Some(&headers), sink, CancellationToken::new()).await.frame
}

fn verifier(issuer: &DevIssuer, clock: &Arc<dyn Clock>) -> Authenticator {
    let metadata = "http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp";
    let mut config = ResourceServerConfig::new(RESOURCE, metadata, vec![issuer.issuer_config()]);
    config.scopes_supported = vec!["docs:read".into()];
    Authenticator::Bearer(Arc::new(
        TokenVerifier::with_clock_and_policy(config, clock.clone(), JwksPolicy::default()).unwrap(),
    ))
}

#[tokio::test]
async fn one_advance_expires_token_handle_request_state_stream_and_kill_switch_heads() {
    palisade_auth::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    // Just ahead of the authority's wall clock, so that its heads are never from the future.
    let manual = Arc::new(ManualClock::new(SystemClock.now_ms() + 1_000));
    let clock: Arc<dyn Clock> = manual.clone();
    let issuer = DevIssuer::load_or_create(&dir.path().join("issuer"), ISSUER).unwrap().with_clock(clock.clone());
    let store = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let app = app();
    let policy = HandlePolicy { ttl: LIFETIME, allowed_scopes: vec!["docs:read".into()], max_scopes: 1, version: 1 };
    let policies = BTreeMap::from([("doc".to_owned(), policy)]);
    let key = SubjectKey::from_bytes(&[3u8; 32]).unwrap();
    let handles =
        Arc::new(HandleService::new(store.clone(), key, app.handle_types(), &policies, clock.clone()).unwrap());
    let config = ServerConfig { request_state_ttl: LIFETIME, ..ServerConfig::default() };
    let with_handles = Server::builder(app, config.clone(), verifier(&issuer, &clock), ServerSecret::random())
        .without_audit()
        .handles(handles)
        .clock(clock.clone())
        .build()
        .unwrap();
    let with_handles = Arc::new(with_handles);

    // The kill switch's server, on the same clock, against a real authority.
    let files = DevAuthorityFiles::new(dir.path().join("ks"));
    let ks_app = self::app();
    let exposed = exposed_operations(&ks_app);
    files.prepare(&exposed, SystemClock.now_ms()).unwrap();
    let _authority = files.start_authority().await.unwrap();
    let url = _authority.url.clone();
    let keys = exposed.iter().map(|operation| operation.key.clone()).collect();
    let switch = Arc::new(files.kill_switch_with_clock(&url, keys, clock.clone()).await.unwrap());
    let ks_handles = Arc::new(
        HandleService::new(
            store.clone(),
            SubjectKey::from_bytes(&[3u8; 32]).unwrap(),
            ks_app.handle_types(),
            &policies,
            clock.clone(),
        )
        .unwrap(),
    );
    let with_kill_switch = Server::builder(ks_app, config, verifier(&issuer, &clock), ServerSecret::random())
        .without_audit()
        .handles(ks_handles)
        .kill_switch(switch, "1.0.0-test")
        .clock(clock.clone())
        .build()
        .unwrap();

    // Before: everything works.
    let token = issuer.mint("alice", "acme", "cli", &["docs:read"], RESOURCE, LIFETIME.as_secs()).unwrap();
    let opened = send(&with_handles, &token, request("tools/call", json!({ "name": "open", "arguments": {} }))).await;
    let handle =
        opened["result"]["structuredContent"]["handle"].as_str().unwrap_or_else(|| panic!("{opened}")).to_owned();
    let read = json!({ "name": "read", "arguments": { "doc": handle } });
    assert_eq!(
        send(&with_handles, &token, request("tools/call", read.clone())).await["result"]["content"][0]["text"],
        "read"
    );
    let asked = send(&with_handles, &token, request("tools/call", json!({ "name": "ask", "arguments": {} }))).await;
    let state = asked["result"]["requestState"].as_str().expect("a sealed state").to_owned();
    let retry = json!({ "name": "ask", "arguments": {}, "requestState": state, "inputResponses": { "q": { "action": "accept" } } });
    assert_eq!(
        send(&with_handles, &token, request("tools/call", retry.clone())).await["result"]["content"][0]["text"],
        "answered"
    );
    let covered = json!({ "name": "ask", "arguments": {} });
    let before = send(&with_kill_switch, &token, request("tools/call", covered.clone())).await;
    assert_eq!(before["result"]["resultType"], "input_required", "{before}");
    let (sink, mut frames) = NotificationSink::channel(16);
    let listen_server = with_handles.clone();
    let listen_token = token.clone();
    let stream = tokio::spawn(async move {
        let listen = request("subscriptions/listen", json!({ "notifications": { "toolsListChanged": true } }));
        let headers = headers(&listen_token, &listen);
        listen_server.handle_request(listen, Some(&headers), sink, CancellationToken::new()).await
    });
    assert_eq!(frames.recv().await.unwrap()["method"], "notifications/subscriptions/acknowledged");

    // One advance.
    manual.advance(LIFETIME * 2);

    // The token.
    let expired = send(&with_handles, &token, request("tools/call", read.clone())).await;
    assert_eq!(expired["error"]["message"], "authentication required", "{expired}");
    // The listen stream opened with it.
    let ended = tokio::time::timeout(Duration::from_secs(10), stream).await.expect("the stream ends").unwrap();
    assert_eq!(ended.frame["result"]["resultType"], "complete", "{}", ended.frame);
    // With a fresh token (minted on the same clock): the handle, and the sealed state.
    let fresh = issuer.mint("alice", "acme", "cli", &["docs:read"], RESOURCE, LIFETIME.as_secs()).unwrap();
    let stale_handle = send(&with_handles, &fresh, request("tools/call", read)).await;
    assert_eq!(stale_handle["error"]["code"], -32602, "{stale_handle}");
    let stale_state = send(&with_handles, &fresh, request("tools/call", retry)).await;
    assert_eq!(stale_state["error"]["code"], -32602, "{stale_state}");
    assert_eq!(stale_state["error"]["message"], "invalid params: invalid requestState");
    // The kill switch: its authority's heads (issued on the wall clock) have expired on this one.
    let doubt = send(&with_kill_switch, &fresh, request("tools/call", covered)).await;
    assert_eq!(doubt["error"]["code"], -32603, "{doubt}");
}

/// A part keeping time by another clock than the server's is refused at build time.
#[tokio::test]
async fn a_part_on_another_clock_is_refused() {
    palisade_auth::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let server_clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_000));
    let other: Arc<dyn Clock> = Arc::new(ManualClock::new(1_000));
    let issuer = DevIssuer::load_or_create(&dir.path().join("issuer"), ISSUER).unwrap();
    let refused = Server::builder(app(), ServerConfig::default(), verifier(&issuer, &other), ServerSecret::random())
        .without_audit()
        .clock(server_clock)
        .build()
        .err()
        .expect("refused");
    assert!(matches!(refused, BuildError::ClockMismatch { part: "token verifier" }), "{refused}");
    assert!(refused.to_string().contains("another clock"), "{refused}");
}
