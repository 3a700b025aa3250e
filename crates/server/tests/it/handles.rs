//! Explicit application handles through the whole request path (seed 000, "Verify safely"):
//! guessing, substitution across subject / tenant / client, expiry at the exact edge, scope
//! escalation, object version change and deletion, policy version change, the revocation race,
//! concurrent use, store outage, digest uniqueness and digest-only audit. Every case runs on
//! SQLite and on PostgreSQL (`DATABASE_URL`; without it the PostgreSQL cases fail naming it), with
//! real tokens over real HTTP, and counts handler invocations: a refused call runs nothing.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_auth::dev_issuer::DevIssuer;
use palisade_auth::{JwksPolicy, ResourceServerConfig, TokenVerifier};
use palisade_server::auth::Authenticator;
use palisade_server::clock::{Clock, ManualClock};
use palisade_server::secret::ServerSecret;
use palisade_server::{
    App, CallToolResult, HandleObject, HandlePolicy, HandleService, HandleType, Outcome, PrincipalEvent, Server,
    ServerConfig, SubjectKey, ToolDef,
};
use palisade_store::Store;
use serde_json::{Value, json};

use crate::common::{Backend, TempDir, fresh_store, pg_address, temp_dir, unique, wait_until};

const RESOURCE: &str = "http://127.0.0.1:1/mcp";
const ISSUER: &str = "http://127.0.0.1:1/dev-issuer";
const TTL: Duration = Duration::from_secs(60);
const START_MS: u64 = 1_800_000_000_000;

// ---- The application under test ----------------------------------------------------------------

/// Documents by (tenant, ref): version and whether the application still authorizes them.
#[derive(Default)]
struct Documents(Mutex<HashMap<(String, String), (u64, bool)>>);

impl Documents {
    fn put(&self, tenant: &str, doc: &str, version: u64) {
        self.0.lock().unwrap().insert((tenant.into(), doc.into()), (version, true));
    }
    fn remove(&self, tenant: &str, doc: &str) {
        self.0.lock().unwrap().remove(&(tenant.to_owned(), doc.to_owned()));
    }
    fn forbid(&self, tenant: &str, doc: &str) {
        if let Some(entry) = self.0.lock().unwrap().get_mut(&(tenant.to_owned(), doc.to_owned())) {
            entry.1 = false;
        }
    }
}

struct Fixture {
    url: String,
    store: Arc<dyn Store>,
    issuer: DevIssuer,
    docs: Arc<Documents>,
    clock: Arc<ManualClock>,
    handles: Arc<HandleService>,
    /// Handler invocations of the handle-taking tools.
    runs: Arc<AtomicUsize>,
    /// What the handle-taking handler saw: its arguments and the resolved object.
    seen: Arc<Mutex<Vec<Value>>>,
    _dir: TempDir,
    _issuer_dir: TempDir,
}

fn policy(version: i64) -> HandlePolicy {
    HandlePolicy { ttl: TTL, allowed_scopes: vec!["docs:read".into(), "docs:write".into()], max_scopes: 2, version }
}

fn app(docs: Arc<Documents>, runs: Arc<AtomicUsize>, seen: Arc<Mutex<Vec<Value>>>) -> App {
    let loader_docs = docs.clone();
    let doc_type = HandleType::new(
        "doc",
        move |tenant: String, doc: String| {
            let docs = loader_docs.clone();
            async move {
                let found = docs.0.lock().unwrap().get(&(tenant, doc.clone())).copied();
                Ok(found.map(|(version, allowed)| HandleObject {
                    object_ref: doc.clone(),
                    version: version.to_string(),
                    value: json!({ "doc": doc, "allowed": allowed }),
                }))
            }
        },
        |_principal, object, _scope, _phase| async move { object.value["allowed"] == json!(true) },
    );
    let counted = |name: &str, scope: &str| {
        let (runs, seen) = (runs.clone(), seen.clone());
        ToolDef::new(name).scopes(&["docs:use"]).handle_argument("doc", "doc", scope).handler(move |ctx, args| {
            let (runs, seen) = (runs.clone(), seen.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let resolved = ctx.handle("doc").unwrap();
                seen.lock()
                    .unwrap()
                    .push(json!({ "args": args, "object": resolved.object, "ref": resolved.object_ref }));
                Ok(Outcome::Complete(CallToolResult::structured(json!({ "doc": resolved.object_ref }))))
            }
        })
    };
    App::builder("handles-test", "0")
        .handle_type(doc_type)
        .tool(
            ToolDef::new("doc_open")
                .scopes(&["docs:use"])
                .input_schema(json!({ "type": "object", "properties": {
                    "doc": { "type": "string" }, "version": { "type": "string" },
                    "scopes": { "type": "array", "items": { "type": "string" } } }, "required": ["doc", "scopes"] }))
                .handler(|ctx, args| async move {
                    let doc = args["doc"].as_str().unwrap_or_default().to_owned();
                    let version = args.get("version").and_then(Value::as_str).unwrap_or("1").to_owned();
                    let scopes: Vec<String> =
                        args["scopes"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect();
                    let scopes: Vec<&str> = scopes.iter().map(String::as_str).collect();
                    match ctx.mint_handle("doc", &doc, &version, &scopes).await {
                        Ok(handle) => Ok(Outcome::Complete(CallToolResult::structured(json!({ "handle": handle })))),
                        Err(error) => Err(error.into()),
                    }
                }),
        )
        .tool(counted("doc_read", "docs:read"))
        .tool(counted("doc_write", "docs:write"))
        .build()
        .unwrap()
}

async fn start_with(store: Arc<dyn Store>, dir: TempDir, version: i64, shared: Option<&Fixture>) -> Fixture {
    palisade_auth::install_crypto_provider();
    let issuer_dir = temp_dir(&unique("issuer"));
    // Instances of one deployment share the issuer key, the subject key, the clock and the
    // application's data; a policy change is a new instance with a new version.
    let issuer_path = shared.map_or(issuer_dir.0.clone(), |f| f._issuer_dir.0.clone());
    let clock = shared.map_or_else(|| Arc::new(ManualClock::new(START_MS as i64)), |f| f.clock.clone());
    let clock_arc: Arc<dyn Clock> = clock.clone();
    let issuer = DevIssuer::load_or_create(&issuer_path, ISSUER).unwrap().with_clock(clock_arc.clone());
    let metadata = "http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp";
    let mut config = ResourceServerConfig::new(RESOURCE, metadata, vec![issuer.issuer_config()]);
    config.scopes_supported = vec!["docs:use".into(), "docs:read".into(), "docs:write".into()];
    let verifier = TokenVerifier::with_clock_and_policy(config, clock_arc.clone(), JwksPolicy::default()).unwrap();
    let docs = shared.map_or_else(|| Arc::new(Documents::default()), |f| f.docs.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = app(docs.clone(), runs.clone(), seen.clone());
    let policies = BTreeMap::from([("doc".to_owned(), policy(version))]);
    let key = SubjectKey::from_bytes(&[7u8; 32]).unwrap();
    let handles =
        Arc::new(HandleService::new(store.clone(), key, app.handle_types(), &policies, clock_arc.clone()).unwrap());
    let server = Server::builder(
        app,
        ServerConfig::default(),
        Authenticator::Bearer(Arc::new(verifier)),
        ServerSecret::random(),
    )
    .audit(store.clone())
    .handles(handles.clone())
    .clock(clock_arc)
    .build()
    .unwrap();
    let server = Arc::new(server);
    let url = crate::common::serve_on_loopback(&server).await;
    Fixture { url, store, issuer, docs, clock, handles, runs, seen, _dir: dir, _issuer_dir: issuer_dir }
}

async fn start(backend: Backend) -> Fixture {
    let (store, dir) = fresh_store(backend, None).await;
    start_with(store, dir, 1, None).await
}

impl Fixture {
    fn token(&self, subject: &str, tenant: &str, client: &str, scopes: &[&str]) -> String {
        self.issuer.mint(subject, tenant, client, scopes, RESOURCE, 600).unwrap()
    }

    fn alice(&self) -> String {
        self.token("alice", "acme", "cli", &["docs:use", "docs:read", "docs:write"])
    }

    async fn call(&self, token: &str, tool: &str, arguments: Value) -> (u16, Value) {
        crate::common::rpc(
            &self.url,
            Some(token),
            "tools/call",
            json!({ "name": tool, "arguments": arguments }),
            json!({}),
        )
        .await
    }

    /// Mints a handle for `token`'s principal on `doc` (created at version 1 in `tenant`).
    async fn open(&self, token: &str, tenant: &str, doc: &str, scopes: &[&str]) -> String {
        self.docs.put(tenant, doc, 1);
        let (status, body) = self.call(token, "doc_open", json!({ "doc": doc, "scopes": scopes })).await;
        assert_eq!(status, 200, "{body}");
        body["result"]["structuredContent"]["handle"].as_str().unwrap_or_else(|| panic!("no handle: {body}")).to_owned()
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Calls `tool` with `handle` and asserts the one generic refusal, with no handler run.
    async fn expect_refused(&self, token: &str, tool: &str, handle: &str, why: &str) {
        let before = self.runs();
        let (status, body) = self.call(token, tool, json!({ "doc": handle })).await;
        assert_eq!(status, 400, "{why}: {body}");
        assert_eq!(body["error"]["code"], -32602, "{why}: {body}");
        assert_eq!(body["error"]["message"], "invalid params: the handle is not valid for this call", "{why}: {body}");
        assert_eq!(self.runs(), before, "{why}: the handler ran");
    }

    async fn expect_ok(&self, token: &str, tool: &str, handle: &str, why: &str) {
        let before = self.runs();
        let (status, body) = self.call(token, tool, json!({ "doc": handle })).await;
        assert_eq!(status, 200, "{why}: {body}");
        assert!(body.get("result").is_some(), "{why}: {body}");
        assert_eq!(self.runs(), before + 1, "{why}");
    }
}

// ---- The cases ---------------------------------------------------------------------------------

async fn guessing_finds_nothing(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    let handle = f.open(&alice, "acme", "d1", &["docs:read"]).await;
    f.expect_ok(&alice, "doc_read", &handle, "the real handle").await;
    for _ in 0..20 {
        let mut bytes = [0u8; 32];
        palisade_server::secret::fill_random(&mut bytes).unwrap();
        let guess = base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, bytes);
        f.expect_refused(&alice, "doc_read", &guess, "a random handle").await;
    }
    // Near misses: one character changed at each end and in the middle.
    for index in [0, 21, 42] {
        let mut near: Vec<u8> = handle.clone().into_bytes();
        near[index] = if near[index] == b'A' { b'B' } else { b'A' };
        f.expect_refused(&alice, "doc_read", std::str::from_utf8(&near).unwrap(), "a near-miss handle").await;
    }
    // Malformed values are refused by the same stage, with the same answer.
    for bad in ["", "short", &format!("{handle}x"), &handle.replace(|c: char| c.is_ascii_alphabetic(), "+")] {
        f.expect_refused(&alice, "doc_read", bad, "a malformed handle").await;
    }
}

async fn substitution_across_subject_tenant_and_client(backend: Backend) {
    let f = start(backend).await;
    let handle = f.open(&f.alice(), "acme", "d1", &["docs:read"]).await;
    let scopes = ["docs:use", "docs:read", "docs:write"];
    for (subject, tenant, client) in [
        ("mallory", "acme", "cli"),
        ("alice", "evil", "cli"),
        ("alice", "acme", "web"),
        ("mallory", "evil", "cli"),
        ("mallory", "acme", "web"),
        ("alice", "evil", "web"),
        ("mallory", "evil", "web"),
    ] {
        // The other tenant has a document with the same reference: still nothing.
        f.docs.put(tenant, "d1", 1);
        let token = f.token(subject, tenant, client, &scopes);
        f.expect_refused(&token, "doc_read", &handle, &format!("{subject}/{tenant}/{client}")).await;
    }
    f.expect_ok(&f.alice(), "doc_read", &handle, "the owner").await;
}

async fn expiry_is_exact(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    let handle = f.open(&alice, "acme", "d1", &["docs:read"]).await;
    let ttl_ms = u64::try_from(TTL.as_millis()).unwrap();
    f.clock.advance_ms((ttl_ms - 1) as i64);
    f.expect_ok(&alice, "doc_read", &handle, "one millisecond before expiry").await;
    f.clock.advance_ms(1);
    f.expect_refused(&alice, "doc_read", &handle, "at the expiry instant").await;
}

async fn no_scope_escalation(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    let read_only = f.open(&alice, "acme", "d1", &["docs:read"]).await;
    f.expect_refused(&alice, "doc_write", &read_only, "a read handle used to write").await;
    // The token must still hold the scope the handle grants.
    let both = f.open(&alice, "acme", "d2", &["docs:read", "docs:write"]).await;
    let narrowed = f.token("alice", "acme", "cli", &["docs:use", "docs:read"]);
    f.expect_refused(&narrowed, "doc_write", &both, "a token without docs:write").await;
    f.expect_ok(&narrowed, "doc_read", &both, "the scope it still holds").await;
    // Minting: outside the policy's set, beyond the token's grant, or too many.
    let (_, body) = f.call(&alice, "doc_open", json!({ "doc": "d3", "scopes": ["docs:admin"] })).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
    let (_, body) = f.call(&narrowed, "doc_open", json!({ "doc": "d3", "scopes": ["docs:write"] })).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
    let (_, body) = f.call(&alice, "doc_open", json!({ "doc": "d3", "scopes": [] })).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
}

async fn object_version_change_and_deletion(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    let handle = f.open(&alice, "acme", "d1", &["docs:read"]).await;
    f.docs.put("acme", "d1", 2);
    f.expect_refused(&alice, "doc_read", &handle, "the object changed version").await;
    f.docs.put("acme", "d1", 1);
    f.expect_ok(&alice, "doc_read", &handle, "back at the recorded version").await;
    // The application's own authorization is asked again on every use.
    f.docs.forbid("acme", "d1");
    f.expect_refused(&alice, "doc_read", &handle, "the application no longer authorizes it").await;
    // Deletion: the loader finds nothing; the deletion hook revokes the rows too.
    let other = f.open(&alice, "acme", "d2", &["docs:read"]).await;
    f.docs.remove("acme", "d2");
    f.expect_refused(&alice, "doc_read", &other, "the object was deleted").await;
    assert_eq!(f.handles.object_deleted("acme", "doc", "d2").await.unwrap(), 1);
    f.docs.put("acme", "d2", 1);
    f.expect_refused(&alice, "doc_read", &other, "a new object under the deleted one's reference").await;
    // Minting at a version the object is not at is refused.
    let (_, body) = f.call(&alice, "doc_open", json!({ "doc": "d2", "version": "9", "scopes": ["docs:read"] })).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
}

async fn policy_version_change(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    let handle = f.open(&alice, "acme", "d1", &["docs:read"]).await;
    // The same deployment restarted with the policy raised to version 2.
    let (store, dir) = (f.store.clone(), temp_dir(&unique("v2")));
    let v2 = start_with(store, dir, 2, Some(&f)).await;
    v2.expect_refused(&alice, "doc_read", &handle, "minted under policy version 1").await;
    let fresh = v2.open(&alice, "acme", "d2", &["docs:read"]).await;
    v2.expect_ok(&alice, "doc_read", &fresh, "minted under version 2").await;
    // Old rows can also be revoked in bulk.
    let revoked = v2
        .handles
        .revoke(palisade_store::RevokeSelector::PolicyBelow { object_type: "doc".into(), below: 2 }, "policy 2", None)
        .await
        .unwrap();
    assert_eq!(revoked, 1);
}

async fn revocation_hooks_and_race(backend: Backend) {
    let f = Arc::new(start(backend).await);
    let alice = f.alice();
    // The hook: token revocation ends every handle of the principal.
    let first = f.open(&alice, "acme", "d1", &["docs:read"]).await;
    let revoked = f
        .handles
        .on_principal_event(PrincipalEvent::TokensRevoked { issuer: ISSUER.into(), subject: "alice".into() })
        .await
        .unwrap();
    assert_eq!(revoked, 1);
    f.expect_refused(&alice, "doc_read", &first, "after token revocation").await;
    // Tenant switch ends the handles in the tenant left.
    let second = f.open(&alice, "acme", "d2", &["docs:read"]).await;
    let event =
        PrincipalEvent::TenantSwitched { issuer: ISSUER.into(), subject: "alice".into(), from_tenant: "acme".into() };
    assert_eq!(f.handles.on_principal_event(event).await.unwrap(), 1);
    f.expect_refused(&alice, "doc_read", &second, "after a tenant switch").await;

    // The race: calls in flight while the handle is revoked. Any call that starts after the
    // revocation returned must be refused.
    for round in 0..5 {
        let handle = f.open(&alice, "acme", &format!("r{round}"), &["docs:read"]).await;
        let runs_before = f.runs();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut callers = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (f, alice, handle, done) = (f.clone(), alice.clone(), handle.clone(), done.clone());
            callers.spawn(async move {
                for _ in 0..10 {
                    let after = done.load(Ordering::SeqCst);
                    let (_, body) = f.call(&alice, "doc_read", json!({ "doc": handle })).await;
                    assert!(!(after && body.get("result").is_some()), "a call after the revocation succeeded");
                }
            });
        }
        // Calls are in flight: one has reached the handler before the revocation.
        wait_until("a call to reach the handler", || f.runs() > runs_before).await;
        let digest = palisade_server::handles::handle_digest(&handle);
        let count =
            f.handles.revoke(palisade_store::RevokeSelector::Digest(digest), "race", Some("r-1")).await.unwrap();
        done.store(true, Ordering::SeqCst);
        assert_eq!(count, 1);
        while let Some(joined) = callers.join_next().await {
            joined.unwrap();
        }
        f.expect_refused(&alice, "doc_read", &handle, "after the race").await;
    }
}

async fn concurrent_use_and_unique_digests(backend: Backend) {
    let f = Arc::new(start(backend).await);
    let alice = f.alice();
    let handle = f.open(&alice, "acme", "d1", &["docs:read"]).await;
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let (f, alice, handle) = (f.clone(), alice.clone(), handle.clone());
        callers.spawn(async move { f.call(&alice, "doc_read", json!({ "doc": handle })).await });
    }
    while let Some(joined) = callers.join_next().await {
        let (status, body) = joined.unwrap();
        assert_eq!(status, 200);
        assert!(body.get("result").is_some(), "{body}");
    }
    assert_eq!(f.runs(), 40);
    // Many handles on one object: all distinct, each resolving only as itself.
    let mut minted = BTreeSet::new();
    for _ in 0..50 {
        let (_, body) = f.call(&alice, "doc_open", json!({ "doc": "d1", "scopes": ["docs:read"] })).await;
        assert!(minted.insert(body["result"]["structuredContent"]["handle"].as_str().unwrap().to_owned()));
    }
    assert_eq!(f.handles.list(ISSUER, "alice", 1_000).await.unwrap().len(), 51);
}

async fn handlers_and_audit_see_digests_only(backend: Backend) {
    let f = start(backend).await;
    let alice = f.alice();
    let handle = f.open(&alice, "acme", "d1", &["docs:read"]).await;
    f.expect_ok(&alice, "doc_read", &handle, "a valid call").await;
    f.expect_refused(&f.token("mallory", "acme", "cli", &["docs:use", "docs:read"]), "doc_read", &handle, "foreign")
        .await;
    // The handler got the resolved object and no handle argument at all.
    let seen = f.seen.lock().unwrap().clone();
    assert_eq!(seen, [json!({ "args": {}, "object": { "doc": "d1", "allowed": true }, "ref": "d1" })]);
    // The audit log names the handle by digest prefix only, and never a raw handle or subject.
    let records = f.store.recent(100).await.unwrap();
    let text = format!("{records:?}");
    assert!(!text.contains(&handle), "a raw handle reached the audit log");
    assert!(!text.contains("alice") && !text.contains("mallory"), "a raw subject reached the audit log");
    let prefix = palisade_store::hex_prefix(&palisade_server::handles::handle_digest(&handle));
    let handle_records: Vec<_> = records.iter().filter(|r| r.record.stage == "handles").collect();
    assert_eq!(handle_records.len(), 2, "{records:?}");
    for record in handle_records {
        assert_eq!(record.record.detail.as_deref(), Some(format!("doc={prefix}").as_str()));
    }
    assert!(f.store.verify_chain().await.unwrap().is_intact());
}

// ---- Store outage (PostgreSQL through a proxy the test cuts; SQLite closed) --------------------

/// A TCP proxy to PostgreSQL that the test can cut (existing connections dropped, new ones
/// refused) and restore: the database "going away" and coming back.
struct Proxy {
    address: String,
    up: Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Proxy {
    async fn start(target: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let (accept_up, accept_cut) = (up.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !accept_up.load(Ordering::SeqCst) {
                    continue; // dropped: connection refused in effect
                }
                let target = target.clone();
                let mut cuts = accept_cut.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Proxy { address, up, cut }
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
        if !up {
            self.cut.send_modify(|n| *n += 1);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_fails_closed_and_recovers() {
    let proxy = Proxy::start(pg_address()).await;
    let (store, dir) = fresh_store(Backend::Postgres, Some(proxy.address.clone())).await;
    let f = start_with(store, dir, 1, None).await;
    let alice = f.alice();
    let handle = f.open(&alice, "acme", "d1", &["docs:read"]).await;
    f.expect_ok(&alice, "doc_read", &handle, "before the outage").await;

    proxy.set_up(false);
    for _ in 0..3 {
        let (status, body) = f.call(&alice, "doc_read", json!({ "doc": handle })).await;
        assert_eq!(status, 503, "{body}");
        let (status, body) = f.call(&alice, "doc_open", json!({ "doc": "d2", "scopes": ["docs:read"] })).await;
        assert_eq!(status, 503, "{body}");
    }
    assert_eq!(f.runs(), 1, "nothing ran while the store was down");

    proxy.set_up(true);
    let mut recovered = false;
    for _ in 0..50 {
        let (status, body) = f.call(&alice, "doc_read", json!({ "doc": handle })).await;
        if status == 200 && body.get("result").is_some() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "the service did not recover when the store came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_outage_fails_closed() {
    let f = start(Backend::Sqlite).await;
    let alice = f.alice();
    let handle = f.open(&alice, "acme", "d1", &["docs:read"]).await;
    f.store.close().await;
    let (status, body) = f.call(&alice, "doc_read", json!({ "doc": handle })).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(f.runs(), 0, "nothing ran while the store was down");
}

crate::on_both_backends!(
    guessing_finds_nothing,
    substitution_across_subject_tenant_and_client,
    expiry_is_exact,
    no_scope_escalation,
    object_version_change_and_deletion,
    policy_version_change,
    revocation_hooks_and_race,
    concurrent_use_and_unique_digests,
    handlers_and_audit_see_digests_only,
);
