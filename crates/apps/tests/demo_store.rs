//! The demo's baskets in the shared store, through `Server::handle_request`: a basket created on
//! one instance is filled and read on another sharing the store (SQLite file, and PostgreSQL at
//! `DATABASE_URL`; without it the PostgreSQL case fails naming it), a basket outlives a restart,
//! and a store that is gone or refuses a write refuses the call and changes nothing.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use palisade_apps::demo::{self, BasketStore};
use palisade_server::auth::{Authenticator, EnvironmentPrincipal};
use palisade_server::clock::SystemClock;
use palisade_server::context::NotificationSink;
use palisade_server::reply::Reply;
use palisade_server::secret::ServerSecret;
use palisade_server::{HandleService, Server, ServerConfig, SubjectKey, TaskConfig, TaskService};
use palisade_store::Store;
use palisade_wire::{Request, RequestId};
use serde_json::{Map, Value, json};
use sqlx::SqlitePool;
use tokio_util::sync::CancellationToken;

/// One demo instance: its own server, handle service and basket pool, on a shared store.
struct Instance {
    server: Server,
}

async fn instance(store: Arc<dyn Store>, baskets: BasketStore) -> Instance {
    let app = demo::app_with_store(baskets, None);
    let handles = HandleService::new(
        store.clone(),
        SubjectKey::from_bytes(&[7; 32]).unwrap(),
        app.handle_types(),
        &BTreeMap::new(),
        Arc::new(SystemClock),
    )
    .unwrap();
    let tasks = TaskService::new(
        store.clone(),
        SubjectKey::from_bytes(&[8; 32]).unwrap(),
        TaskConfig::default(),
        Arc::new(SystemClock),
    );
    let principal = Authenticator::Environment(EnvironmentPrincipal {
        subject: "alice".into(),
        tenant: Some("acme".into()),
        client_id: Some("it".into()),
        scopes: ["shop:read", "shop:basket"].into_iter().map(str::to_owned).collect::<BTreeSet<_>>(),
    });
    let server = Server::builder(app, ServerConfig::default(), principal, ServerSecret::from_bytes([3; 32]))
        .once_store(store.clone())
        .audit(store)
        .handles(Arc::new(handles))
        .tasks(Arc::new(tasks))
        .build()
        .unwrap();
    Instance { server }
}

/// An instance on the store at `url`, its baskets in the same database through a pool of its own.
async fn instance_at(url: &str) -> Instance {
    let store = palisade_store::open_store(url).await.unwrap();
    instance(store, BasketStore::open(url).await.unwrap()).await
}

impl Instance {
    async fn call(&self, tool: &str, arguments: Value) -> Reply {
        let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {} });
        let params: Map<String, Value> =
            json!({ "name": tool, "arguments": arguments, "_meta": meta }).as_object().cloned().unwrap();
        let request = Request { id: RequestId::Number(1), method: "tools/call".into(), params };
        let (sink, _receiver) = NotificationSink::channel(16);
        self.server.handle_request(request, None, sink, CancellationToken::new()).await
    }

    async fn create(&self) -> String {
        let created = self.call("basket_create", json!({})).await;
        assert_eq!(created.status, 200, "{}", created.frame);
        created.frame["result"]["structuredContent"]["basket"].as_str().unwrap().to_owned()
    }

    /// Adds, expecting success; the basket as the answer shows it.
    async fn add(&self, basket: &str, sku: &str, quantity: u32) -> Value {
        let added = self.call("basket_add_item", json!({ "basket": basket, "sku": sku, "quantity": quantity })).await;
        assert_eq!(added.status, 200, "{}", added.frame);
        assert!(added.frame["result"]["isError"] != true, "{}", added.frame);
        added.frame["result"]["structuredContent"].clone()
    }

    async fn view(&self, basket: &str) -> Value {
        let viewed = self.call("basket_view", json!({ "basket": basket })).await;
        assert_eq!(viewed.status, 200, "{}", viewed.frame);
        viewed.frame["result"]["structuredContent"].clone()
    }
}

fn filled() -> Value {
    json!({ "items": [
        { "sku": "MUG-001", "quantity": 1, "priceCents": 1450 },
        { "sku": "TEA-002", "quantity": 5, "priceCents": 900 },
    ], "totalCents": 5950 })
}

/// Creates on `a`, fills through `b` and `a`, reads on both.
async fn shared_between(a: &Instance, b: &Instance) {
    let basket = a.create().await;
    assert_eq!(b.view(&basket).await, json!({ "items": [], "totalCents": 0 }), "B sees the basket A created");
    b.add(&basket, "TEA-002", 3).await;
    let after_a = a.add(&basket, "TEA-002", 2).await;
    assert_eq!(after_a["items"][0]["quantity"], 5, "A adds to what B added: {after_a}");
    b.add(&basket, "MUG-001", 1).await;
    assert_eq!(a.view(&basket).await, filled());
    assert_eq!(b.view(&basket).await, filled());
}

/// The refusal a call gets when the basket store cannot be used.
fn assert_unavailable(reply: &Reply) {
    assert_eq!(reply.status, 503, "{}", reply.frame);
    assert_eq!(reply.frame["error"]["code"], -32603, "{}", reply.frame);
    assert_eq!(reply.frame["error"]["message"], "temporarily unavailable", "{}", reply.frame);
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}", dir.path().join("palisade.db").display())
}

async fn basket_rows(url: &str) -> Vec<(String, String, String)> {
    let pool = SqlitePool::connect(url).await.unwrap();
    let rows = sqlx::query_as("SELECT tenant, owner, items FROM demo_baskets ORDER BY created_ms")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    rows
}

#[tokio::test]
async fn a_basket_made_on_one_instance_is_filled_and_read_on_another_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let a = instance_at(&url).await;
    let b = instance_at(&url).await;
    shared_between(&a, &b).await;
    let rows = basket_rows(&url).await;
    assert_eq!(
        rows,
        vec![("acme".to_owned(), "environment#alice".to_owned(), r#"{"MUG-001":1,"TEA-002":5}"#.to_owned())],
        "one row, in the caller's tenant"
    );
}

fn postgres_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "DATABASE_URL is not set: the PostgreSQL basket test needs a running PostgreSQL server \
             (e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5433/palisade_test)"
        ),
    }
}

/// A fresh schema on `DATABASE_URL`, as a store URL.
async fn postgres_schema_url() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let url = postgres_url();
    let mut random = [0u8; 8];
    palisade_server::secret::fill_random(&mut random).unwrap();
    let schema = format!(
        "demo_baskets_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        palisade_base::hex::hex(&random)
    );
    let admin = sqlx::PgPool::connect(&url).await.expect("connect to DATABASE_URL");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&admin).await.unwrap();
    admin.close().await;
    format!("{url}{}options[search_path]={schema}", if url.contains('?') { '&' } else { '?' })
}

#[tokio::test]
async fn a_basket_made_on_one_instance_is_filled_and_read_on_another_postgres() {
    let url = postgres_schema_url().await;
    let a = instance_at(&url).await;
    let b = instance_at(&url).await;
    shared_between(&a, &b).await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT tenant, items FROM demo_baskets").fetch_all(&pool).await.unwrap();
    assert_eq!(rows, vec![("acme".to_owned(), r#"{"MUG-001":1,"TEA-002":5}"#.to_owned())]);
    // After a restart of both, the basket is still there and still usable.
    drop((a, b));
    let c = instance_at(&url).await;
    let basket_count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM demo_baskets").fetch_one(&pool).await.unwrap();
    assert_eq!(basket_count, 1);
    pool.close().await;
    let empty = c.create().await;
    assert_eq!(c.view(&empty).await["items"], json!([]));
}

#[tokio::test]
async fn a_basket_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let first = instance_at(&url).await;
    let basket = first.create().await;
    first.add(&basket, "TEA-002", 5).await;
    first.add(&basket, "MUG-001", 1).await;
    drop(first);
    let second = instance_at(&url).await;
    assert_eq!(second.view(&basket).await, filled(), "the basket and its handle outlive the process");
    let more = second.add(&basket, "MUG-001", 2).await;
    assert_eq!(more["items"][0]["quantity"], 3, "{more}");
}

#[tokio::test]
async fn a_store_that_is_gone_refuses_the_call_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let store = palisade_store::open_store(&url).await.unwrap();
    let pool = SqlitePool::connect(&url).await.unwrap();
    let shop = instance(store.clone(), BasketStore::from_sqlite(pool.clone()).await.unwrap()).await;
    let basket = shop.create().await;
    shop.add(&basket, "TEA-002", 2).await;
    let before = basket_rows(&url).await;
    pool.close().await;
    assert_unavailable(
        &shop.call("basket_add_item", json!({ "basket": basket, "sku": "TEA-002", "quantity": 1 })).await,
    );
    assert_unavailable(&shop.call("basket_view", json!({ "basket": basket })).await);
    assert_unavailable(&shop.call("basket_create", json!({})).await);
    assert_eq!(basket_rows(&url).await, before, "nothing was written");
    // Another instance, its store working, still sees the basket as it was.
    let other = instance_at(&url).await;
    assert_eq!(other.view(&basket).await["items"], json!([{ "sku": "TEA-002", "quantity": 2, "priceCents": 900 }]));
}

#[tokio::test]
async fn a_refused_write_refuses_the_call_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let shop = instance_at(&url).await;
    let basket = shop.create().await;
    shop.add(&basket, "TEA-002", 2).await;
    let before = basket_rows(&url).await;
    // The store now refuses every basket write (the handle lookup and the read still work).
    let admin = SqlitePool::connect(&url).await.unwrap();
    for trigger in [
        "CREATE TRIGGER refuse_update BEFORE UPDATE ON demo_baskets BEGIN SELECT RAISE(ABORT, 'refused'); END",
        "CREATE TRIGGER refuse_insert BEFORE INSERT ON demo_baskets BEGIN SELECT RAISE(ABORT, 'refused'); END",
    ] {
        sqlx::query(trigger).execute(&admin).await.unwrap();
    }
    assert_unavailable(
        &shop.call("basket_add_item", json!({ "basket": basket, "sku": "MUG-001", "quantity": 1 })).await,
    );
    assert_unavailable(&shop.call("basket_create", json!({})).await);
    assert_eq!(basket_rows(&url).await, before, "nothing was written");
    assert_eq!(shop.view(&basket).await["totalCents"], 1800, "the basket is as it was");
    let handles: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM handles").fetch_one(&admin).await.unwrap();
    assert_eq!(handles, 1, "no handle minted for a basket that was not recorded");
    admin.close().await;
}

/// Adds from two instances at once (each its own pool on the store at `url`): none is lost.
async fn concurrent_adds_are_all_kept(url: &str) {
    let a = Arc::new(instance_at(url).await);
    let b = Arc::new(instance_at(url).await);
    let basket = a.create().await;
    let mut adds = tokio::task::JoinSet::new();
    for round in 0..20 {
        let (shop, basket) = (if round % 2 == 0 { a.clone() } else { b.clone() }, basket.clone());
        adds.spawn(async move { shop.add(&basket, "INF-001", 1).await });
    }
    while let Some(added) = adds.join_next().await {
        added.unwrap();
    }
    assert_eq!(b.view(&basket).await["items"], json!([{ "sku": "INF-001", "quantity": 20, "priceCents": 390 }]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_on_two_instances_are_all_kept_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    concurrent_adds_are_all_kept(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_on_two_instances_are_all_kept_postgres() {
    concurrent_adds_are_all_kept(&postgres_schema_url().await).await;
}
