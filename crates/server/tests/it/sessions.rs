//! 2025-era sessions are not identity (seed 004: the `Mcp-Session-Id` is protected like a handle
//! and never proof of who is calling). Over real HTTP with real tokens, on SQLite and PostgreSQL
//! (`DATABASE_URL`): a live session id presented by another subject, client or tenant, without a
//! token, after its idle or absolute expiry (clock-driven), or after DELETE is refused (404, or
//! 401 without a token) and dispatches nothing (a handler-invocation counter stays put).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use palisade_auth::dev_issuer::DevIssuer;
use palisade_auth::{JwksPolicy, ResourceServerConfig, TokenVerifier};
use palisade_server::auth::Authenticator;
use palisade_server::clock::{Clock, ManualClock};
use palisade_server::secret::ServerSecret;
use palisade_server::{App, CallToolResult, LegacyConfig, Outcome, Server, ServerConfig, ToolDef};
use palisade_store::{PostgresOptions, PostgresStore, SessionStore, SqliteStore, Store};
use serde_json::{Value, json};

const RESOURCE: &str = "http://127.0.0.1:1/mcp";
const ISSUER: &str = "http://127.0.0.1:1/dev-issuer";
const START_MS: u64 = 1_800_000_000_000;
const IDLE: Duration = Duration::from_secs(60);
const ABSOLUTE: Duration = Duration::from_secs(300);
const VERSION: &str = "2025-11-25";

#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

use crate::common::unique;

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir() -> TempDir {
    let path = std::env::temp_dir().join(format!("palisade-{}", unique("sessions")));
    std::fs::create_dir_all(&path).unwrap();
    TempDir(path)
}

async fn fresh_store(backend: Backend, dir: &TempDir) -> Arc<dyn Store> {
    match backend {
        Backend::Sqlite => Arc::new(SqliteStore::open(dir.0.join("store.db").to_str().unwrap()).await.unwrap()),
        Backend::Postgres => {
            let url = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| {
                panic!("DATABASE_URL is not set: the PostgreSQL session tests need a running PostgreSQL server")
            });
            let schema = unique("sessions_test");
            let admin = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&admin).await.unwrap();
            admin.close().await;
            let url = format!("{url}{}options[search_path]={schema}", if url.contains('?') { '&' } else { '?' });
            let options = PostgresOptions { max_connections: 4, acquire_timeout: Duration::from_secs(2) };
            Arc::new(PostgresStore::connect_with(&url, options).await.unwrap())
        }
    }
}

struct Fixture {
    url: String,
    store: Arc<dyn Store>,
    issuer: DevIssuer,
    clock: Arc<ManualClock>,
    /// Handler invocations of `count`.
    runs: Arc<AtomicUsize>,
    server: Arc<Server>,
    _dir: TempDir,
}

async fn start(backend: Backend) -> Fixture {
    palisade_auth::install_crypto_provider();
    let dir = temp_dir();
    let store = fresh_store(backend, &dir).await;
    let clock = Arc::new(ManualClock::new(START_MS as i64));
    let clock_arc: Arc<dyn Clock> = clock.clone();
    let issuer = DevIssuer::load_or_create(&dir.0.join("issuer"), ISSUER).unwrap().with_clock(clock_arc.clone());
    let metadata = "http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp";
    let mut config = ResourceServerConfig::new(RESOURCE, metadata, vec![issuer.issuer_config()]);
    config.scopes_supported = vec!["docs:use".into()];
    let verifier = TokenVerifier::with_clock_and_policy(config, clock_arc.clone(), JwksPolicy::default()).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = App::builder("sessions-test", "0")
        .tool(ToolDef::new("count").scopes(&["docs:use"]).handler(move |_, _| {
            let runs = counted.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(Outcome::Complete(CallToolResult::text("counted")))
            }
        }))
        .resource(palisade_server::ResourceDef::new("test://r", "r").reader(|_, uri| async move {
            Ok(Outcome::Complete(vec![palisade_server::ResourceContents::text(uri, "text/plain", "r")]))
        }))
        .build()
        .unwrap();
    let legacy = LegacyConfig { idle_timeout: IDLE, absolute_timeout: ABSOLUTE, ..LegacyConfig::default() };
    let config = ServerConfig { legacy, ..ServerConfig::default() };
    let sessions: Arc<dyn SessionStore> = store.clone();
    let server = Server::builder(app, config, Authenticator::Bearer(Arc::new(verifier)), ServerSecret::random())
        .sessions(sessions)
        .audit(store.clone())
        .clock(clock_arc)
        .build()
        .unwrap();
    let server = Arc::new(server);
    let url = crate::common::serve_on_loopback(&server).await;
    Fixture { url, store, issuer, clock, runs, server, _dir: dir }
}

struct Answer {
    status: u16,
    session: Option<String>,
    body: Value,
}

impl Fixture {
    fn token(&self, subject: &str, tenant: &str, client: &str) -> String {
        self.issuer.mint(subject, tenant, client, &["docs:use"], RESOURCE, 600).unwrap()
    }

    fn alice(&self) -> String {
        self.token("alice", "acme", "cli")
    }

    async fn send(
        &self,
        method: reqwest::Method,
        token: Option<&str>,
        session: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let mut request = reqwest::Client::new()
            .request(method, &self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(session) = session {
            request = request.header("mcp-session-id", session).header("mcp-protocol-version", VERSION);
        }
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let session = response.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
        let is_stream = response
            .headers()
            .get("content-type")
            .is_some_and(|v| v.to_str().unwrap_or_default().starts_with("text/event-stream"));
        let body = if is_stream {
            // The GET stream stays open: its headers are the answer.
            Value::Null
        } else {
            let text = response.text().await.unwrap();
            serde_json::from_str(&text).unwrap_or(Value::Null)
        };
        Answer { status, session, body }
    }

    async fn initialize(&self, token: &str) -> String {
        let body = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": VERSION, "capabilities": {}, "clientInfo": { "name": "t", "version": "0" } } });
        let answer = self.send(reqwest::Method::POST, Some(token), None, Some(body)).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.body["result"]["protocolVersion"], VERSION);
        let session = answer.session.expect("initialize returns an Mcp-Session-Id");
        assert!(session.len() >= 43 && session.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{session}");
        session
    }

    async fn count(&self, token: Option<&str>, session: Option<&str>) -> Answer {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": "count", "arguments": {} } });
        self.send(reqwest::Method::POST, token, session, Some(body)).await
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// The session works for its owner (one more run).
    async fn assert_live(&self, token: &str, session: &str) {
        let before = self.runs();
        let answer = self.count(Some(token), Some(session)).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.body["result"]["content"][0]["text"], "counted");
        assert!(answer.body["result"].get("resultType").is_none(), "2026-only keys leak: {}", answer.body);
        assert_eq!(self.runs(), before + 1);
    }

    /// The session is refused with `status` and nothing runs.
    async fn assert_refused(&self, token: Option<&str>, session: &str, status: u16) {
        let before = self.runs();
        let answer = self.count(token, Some(session)).await;
        assert_eq!(answer.status, status, "{}", answer.body);
        assert!(answer.body.get("error").is_some(), "{}", answer.body);
        assert_eq!(self.runs(), before, "a refused request ran the handler");
    }
}

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Postgres).await;
                }
            )*
        }
    };
}

on_both_backends!(
    a_publication_reaches_the_get_stream_as_list_changed,
    another_principal_presenting_a_live_session_is_refused,
    a_session_from_another_tenant_is_refused,
    a_session_id_without_a_token_is_refused,
    an_idle_session_expires,
    an_active_session_expires_at_its_absolute_limit,
    a_deleted_session_is_refused,
    malformed_session_traffic_is_refused_and_changes_nothing,
    a_store_outage_fails_closed,
    routing_headers_and_member_names_are_checked_on_the_session_wire,
);

/// The session wire checks what a header-routing proxy in front would see, as the 2026 wire
/// does: `Mcp-Method`/`Mcp-Name` where sent must equal the body, a routing header is sent at
/// most once, the version header has no encoded form, and a message with a repeated member
/// name is refused (a first-wins parser in front would read another request). Durable tasks
/// are not on this wire. Nothing runs.
async fn routing_headers_and_member_names_are_checked_on_the_session_wire(backend: Backend) {
    let fixture = start(backend).await;
    let alice = fixture.alice();
    let session = fixture.initialize(&alice).await;
    let post = |headers: &[(&str, &str)], body: String| {
        let mut request = reqwest::Client::new()
            .post(&fixture.url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .header("authorization", format!("Bearer {alice}"))
            .header("mcp-session-id", session.as_str());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        async move {
            let response = request.body(body).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let call =
        json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": "count", "arguments": {} } })
            .to_string();
    let before = fixture.runs();
    let version = ("mcp-protocol-version", VERSION);
    for (headers, code) in [
        (vec![version, ("mcp-method", "tools/list")], -32020),
        (vec![version, ("mcp-method", "tools/call"), ("mcp-name", "other")], -32020),
        (vec![version, ("mcp-method", "tools/call"), ("mcp-method", "tools/call")], -32020),
        (vec![("mcp-protocol-version", "=?base64?MjAyNS0xMS0yNQ==?=")], -32022),
    ] {
        let (status, body) = post(&headers, call.clone()).await;
        assert_eq!((status, body["error"]["code"].as_i64()), (400, Some(code)), "{headers:?}: {body}");
    }
    for duplicated in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"count"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"nope","name":"count"}}"#,
    ] {
        let (status, body) = post(&[version], duplicated.to_owned()).await;
        assert_eq!((status, body["error"]["code"].as_i64()), (400, Some(-32600)), "{duplicated}: {body}");
    }
    for tasks in ["tasks/get", "tasks/cancel"] {
        let body = json!({ "jsonrpc": "2.0", "id": 2, "method": tasks, "params": { "taskId": "x" } }).to_string();
        let (status, body) = post(&[version], body).await;
        assert_eq!((status, body["error"]["code"].as_i64()), (404, Some(-32601)), "{tasks}: {body}");
        assert_eq!(body["error"]["message"], "method not found", "no client string is echoed");
    }
    assert_eq!(fixture.runs(), before, "a refused request ran the handler");
    // The same call with agreeing headers runs.
    let (status, body) = post(&[version, ("mcp-method", "tools/call"), ("mcp-name", "count")], call).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(fixture.runs(), before + 1);
}

/// With the store down, neither a new session nor a request of a live one gets through: 503,
/// no session id, nothing runs.
async fn a_store_outage_fails_closed(backend: Backend) {
    let fixture = start(backend).await;
    let alice = fixture.alice();
    let session = fixture.initialize(&alice).await;
    fixture.assert_live(&alice, &session).await;
    fixture.store.close().await;
    fixture.assert_refused(Some(&alice), &session, 503).await;
    let body = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": VERSION, "capabilities": {} } });
    let answer = fixture.send(reqwest::Method::POST, Some(&alice), None, Some(body)).await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(answer.session.is_none());
    assert_eq!(fixture.send(reqwest::Method::DELETE, Some(&alice), Some(&session), None).await.status, 503);
}

/// Bob (same tenant and client) and Alice's own subject through another client present Alice's
/// live session id: 404 for requests, the GET stream, notifications and DELETE; her session is
/// untouched.
async fn another_principal_presenting_a_live_session_is_refused(backend: Backend) {
    let fixture = start(backend).await;
    let alice = fixture.alice();
    let session = fixture.initialize(&alice).await;
    fixture.assert_live(&alice, &session).await;
    let bob = fixture.token("bob", "acme", "cli");
    let alice_elsewhere = fixture.token("alice", "acme", "web");
    for intruder in [&bob, &alice_elsewhere] {
        fixture.assert_refused(Some(intruder), &session, 404).await;
        let stream = fixture.send(reqwest::Method::GET, Some(intruder), Some(&session), None).await;
        assert_eq!(stream.status, 404);
        let ping = json!({ "jsonrpc": "2.0", "id": 2, "method": "ping" });
        assert_eq!(fixture.send(reqwest::Method::POST, Some(intruder), Some(&session), Some(ping)).await.status, 404);
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        assert_eq!(fixture.send(reqwest::Method::POST, Some(intruder), Some(&session), Some(note)).await.status, 404);
        let answer = json!({ "jsonrpc": "2.0", "id": "palisade-00", "result": { "action": "accept" } });
        assert_eq!(fixture.send(reqwest::Method::POST, Some(intruder), Some(&session), Some(answer)).await.status, 404);
        let delete = fixture.send(reqwest::Method::DELETE, Some(intruder), Some(&session), None).await;
        assert_eq!(delete.status, 404);
    }
    // Bob's own session does not open Alice's either.
    let bobs = fixture.initialize(&bob).await;
    assert_ne!(bobs, session);
    fixture.assert_live(&bob, &bobs).await;
    fixture.assert_live(&alice, &session).await;
    // The owner's GET stream opens.
    let stream = fixture.send(reqwest::Method::GET, Some(&alice), Some(&session), None).await;
    assert_eq!(stream.status, 200);
}

/// The same subject and client in another tenant is another owner.
async fn a_session_from_another_tenant_is_refused(backend: Backend) {
    let fixture = start(backend).await;
    let alice = fixture.alice();
    let session = fixture.initialize(&alice).await;
    let other_tenant = fixture.token("alice", "globex", "cli");
    fixture.assert_refused(Some(&other_tenant), &session, 404).await;
    let theirs = fixture.initialize(&other_tenant).await;
    fixture.assert_refused(Some(&alice), &theirs, 404).await;
    fixture.assert_live(&alice, &session).await;
}

/// A session id alone is nothing: 401 with a challenge, nothing runs.
async fn a_session_id_without_a_token_is_refused(backend: Backend) {
    let fixture = start(backend).await;
    let alice = fixture.alice();
    let session = fixture.initialize(&alice).await;
    fixture.assert_refused(None, &session, 401).await;
    fixture.assert_refused(Some("not-a-token"), &session, 401).await;
    // Authentication comes first whatever the session id: a malformed one is 401 too, with the
    // challenge, on every kind of session request.
    for malformed in ["short", "has spaces in the session id"] {
        fixture.assert_refused(None, malformed, 401).await;
        for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
            let answer = fixture.send(method.clone(), None, Some(malformed), None).await;
            assert_eq!(answer.status, 401, "{method} with {malformed:?}");
        }
    }
    let stream = fixture.send(reqwest::Method::GET, None, Some(&session), None).await;
    assert_eq!(stream.status, 401);
    assert_eq!(fixture.send(reqwest::Method::DELETE, None, Some(&session), None).await.status, 401);
    fixture.assert_live(&alice, &session).await;
}

/// Idle timeout: live one millisecond before it, 404 at it; activity restarts it.
async fn an_idle_session_expires(backend: Backend) {
    let fixture = start(backend).await;
    let alice = fixture.alice();
    let session = fixture.initialize(&alice).await;
    let idle_ms = u64::try_from(IDLE.as_millis()).unwrap();
    fixture.clock.advance_ms((idle_ms - 1) as i64);
    fixture.assert_live(&alice, &session).await;
    fixture.clock.advance_ms((idle_ms - 1) as i64);
    fixture.assert_live(&alice, &session).await;
    fixture.clock.advance_ms((idle_ms) as i64);
    fixture.assert_refused(Some(&alice), &session, 404).await;
    // Dead stays dead.
    fixture.assert_refused(Some(&alice), &session, 404).await;
}

/// Absolute timeout: however active, the session dies at its limit.
async fn an_active_session_expires_at_its_absolute_limit(backend: Backend) {
    let fixture = start(backend).await;
    let alice = fixture.alice();
    let session = fixture.initialize(&alice).await;
    let step = u64::try_from(IDLE.as_millis()).unwrap() / 2;
    let absolute = u64::try_from(ABSOLUTE.as_millis()).unwrap();
    let mut elapsed = 0;
    while elapsed + step < absolute {
        fixture.clock.advance_ms((step) as i64);
        elapsed += step;
        fixture.assert_live(&alice, &session).await;
    }
    fixture.clock.advance_ms((absolute - elapsed) as i64);
    fixture.assert_refused(Some(&alice), &session, 404).await;
}

/// After its owner's DELETE the id is dead for everything.
async fn a_deleted_session_is_refused(backend: Backend) {
    let fixture = start(backend).await;
    let alice = fixture.alice();
    let session = fixture.initialize(&alice).await;
    fixture.assert_live(&alice, &session).await;
    let delete = fixture.send(reqwest::Method::DELETE, Some(&alice), Some(&session), None).await;
    assert_eq!(delete.status, 200);
    fixture.assert_refused(Some(&alice), &session, 404).await;
    assert_eq!(fixture.send(reqwest::Method::GET, Some(&alice), Some(&session), None).await.status, 404);
    assert_eq!(fixture.send(reqwest::Method::DELETE, Some(&alice), Some(&session), None).await.status, 404);
}

/// Guessed, malformed and missing ids, `initialize` with an id, a foreign version header and a
/// task-augmented call: each refused with a clear error; nothing runs.
async fn malformed_session_traffic_is_refused_and_changes_nothing(backend: Backend) {
    let fixture = start(backend).await;
    let alice = fixture.alice();
    let session = fixture.initialize(&alice).await;
    let guessed = format!("{}A", &session[..session.len() - 1]);
    let guessed = if guessed == session { format!("{}B", &session[..session.len() - 1]) } else { guessed };
    fixture.assert_refused(Some(&alice), &guessed, 404).await;
    fixture.assert_refused(Some(&alice), "short", 404).await;
    fixture.assert_refused(Some(&alice), "has spaces in the session id", 404).await;
    let before = fixture.runs();
    // No session id on a request after initialize.
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": "count" } });
    let request = reqwest::Client::new()
        .post(&fixture.url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("mcp-protocol-version", VERSION)
        .header("authorization", format!("Bearer {alice}"))
        .body(body.to_string());
    assert_eq!(request.send().await.unwrap().status().as_u16(), 400);
    // initialize carrying a session id.
    let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": VERSION, "capabilities": {} } });
    let answer = fixture.send(reqwest::Method::POST, Some(&alice), Some(&session), Some(init)).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    // A task-augmented call (2025-11-25 in-core tasks are not served).
    let task = json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "count", "arguments": {}, "task": { "ttl": 1000 } } });
    let answer = fixture.send(reqwest::Method::POST, Some(&alice), Some(&session), Some(task)).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(answer.body["error"]["code"], -32602);
    // A bad log level.
    let level = json!({ "jsonrpc": "2.0", "id": 4, "method": "logging/setLevel", "params": { "level": "loud" } });
    let answer = fixture.send(reqwest::Method::POST, Some(&alice), Some(&session), Some(level)).await;
    assert_eq!(answer.body["error"]["code"], -32602, "{}", answer.body);
    // Subscribing to an unknown resource.
    let subscribe =
        json!({ "jsonrpc": "2.0", "id": 5, "method": "resources/subscribe", "params": { "uri": "test://nope" } });
    let answer = fixture.send(reqwest::Method::POST, Some(&alice), Some(&session), Some(subscribe)).await;
    assert_eq!(answer.body["error"]["code"], -32602, "{}", answer.body);
    let subscribe =
        json!({ "jsonrpc": "2.0", "id": 6, "method": "resources/subscribe", "params": { "uri": "test://r" } });
    let answer = fixture.send(reqwest::Method::POST, Some(&alice), Some(&session), Some(subscribe)).await;
    assert_eq!(answer.body["result"], json!({}), "{}", answer.body);
    // The 2026-07-28 wire is still there beside it, and ignores nothing it should not.
    let discover = reqwest::Client::new()
        .post(&fixture.url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "server/discover")
        .header("authorization", format!("Bearer {alice}"))
        .body(json!({ "jsonrpc": "2.0", "id": 7, "method": "server/discover", "params": { "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {} } } })
            .to_string());
    let discover: Value = discover.send().await.unwrap().json().await.unwrap();
    assert_eq!(discover["result"]["supportedVersions"], json!(["2026-07-28", "2025-11-25", "2025-06-18"]));
    assert_eq!(fixture.runs(), before, "refused requests ran the handler");
    fixture.assert_live(&alice, &session).await;
}

/// A publication that changes the tool list reaches an open 2025-era GET stream as
/// `notifications/tools/list_changed` (the listen side's exactly-once property is tested in
/// `snapshots.rs`; the GET stream shares its events).
async fn a_publication_reaches_the_get_stream_as_list_changed(backend: Backend) {
    use futures::StreamExt as _;
    let fixture = start(backend).await;
    let alice = fixture.alice();
    let session = fixture.initialize(&alice).await;
    let stream = reqwest::Client::new()
        .get(&fixture.url)
        .header("accept", "text/event-stream")
        .header("authorization", format!("Bearer {alice}"))
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", VERSION)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut body = stream.bytes_stream();
    let app = |extra: Option<&'static str>| {
        let mut app = App::builder("sessions-test", "0").tool(
            ToolDef::new("count")
                .scopes(&["docs:use"])
                .handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("counted"))) }),
        );
        if let Some(name) = extra {
            app =
                app.tool(ToolDef::new(name).handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("x"))) }));
        }
        app.resource(palisade_server::ResourceDef::new("test://r", "r").reader(|_, uri| async move {
            Ok(Outcome::Complete(vec![palisade_server::ResourceContents::text(uri, "text/plain", "r")]))
        }))
        .build()
        .unwrap()
    };
    // The stream is open once the server holds its subscription: publish until it has one frame.
    let mut received = String::new();
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        let mut extra = ["a", "b"].into_iter().cycle();
        loop {
            assert!(fixture.server.publish(app(extra.next())).unwrap().tools_changed);
            if let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_millis(200), body.next()).await {
                received.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
                if received.contains("\n\n") {
                    return;
                }
            }
        }
    })
    .await;
    first.expect("a list_changed frame arrives");
    assert!(received.contains("notifications/tools/list_changed"), "{received}");
}
