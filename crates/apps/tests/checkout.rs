//! The demo's `basket_checkout` under the kill switch, through `Server::handle_request` with the
//! development authority on loopback (mutual TLS) and the order table in the authority's
//! database: the happy path writes exactly one order and consumes the basket; a DISABLE that
//! lands between the commit fence and the order transaction rolls the order back, every time.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use palisade_apps::demo::{self, Orders};
use palisade_killswitch::authority::AuthorityDb;
use palisade_killswitch::dev::{DevAuthorityFiles, RunningDevAuthority};
use palisade_killswitch::{Clock as _, SystemClock, TargetKey, TargetKind};
use palisade_server::auth::{Authenticator, EnvironmentPrincipal};
use palisade_server::clock::SystemClock as ServerClock;
use palisade_server::context::NotificationSink;
use palisade_server::killswitch::exposed_operations;
use palisade_server::pipeline::Reply;
use palisade_server::secret::ServerSecret;
use palisade_server::{HandleService, Server, ServerConfig, SubjectKey};
use palisade_store::SqliteStore;
use palisade_wire::{Request, RequestId};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

struct Shop {
    _dir: tempfile::TempDir,
    _authority: RunningDevAuthority,
    server: Server,
    orders: Orders,
    db: AuthorityDb,
    target_key: TargetKey,
}

/// `disable_before_commit`: when set, the hook between the fence and the order transaction
/// switches `basket_checkout` off (and clears the flag).
async fn shop(disable_before_commit: Arc<AtomicBool>) -> Shop {
    let dir = tempfile::tempdir().unwrap();
    let files = DevAuthorityFiles::new(dir.path().join("ks"));
    let exposed = exposed_operations(&demo::app());
    let checkout = exposed.iter().find(|operation| operation.key == "tools/call:basket_checkout").unwrap();
    assert!(checkout.has_side_effect, "the skeleton gives checkout a commit fence");
    files.prepare(&exposed, SystemClock.now_ms()).unwrap();
    let authority = files.start_authority().await.unwrap();
    let keys = exposed.iter().map(|operation| operation.key.clone()).collect();
    let switch = files.kill_switch(&authority.url, keys).await.unwrap();
    let target_key = TargetKey::read(&files.target_key()).unwrap();
    let db = authority.db.clone();
    let hook_db = db.clone();
    let hook_target = target_key.digest(TargetKind::Tool, "basket_checkout");
    let orders = Orders::open(authority.db.pool().clone()).await.unwrap().before_commit(Arc::new(move || {
        let (db, target, flag) = (hook_db.clone(), hook_target.clone(), disable_before_commit.clone());
        Box::pin(async move {
            if flag.swap(false, Ordering::SeqCst) {
                db.disable(&target, "race", SystemClock.now_ms()).await.unwrap();
            }
        })
    }));
    let app = demo::app_with_orders(Some(orders.clone()));
    let store = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let handles = HandleService::new(
        store.clone(),
        SubjectKey::from_bytes(&[7; 32]).unwrap(),
        app.handle_types(),
        &BTreeMap::new(),
        Arc::new(ServerClock),
    )
    .unwrap();
    let principal = Authenticator::Environment(EnvironmentPrincipal {
        subject: "alice".into(),
        tenant: Some("acme".into()),
        client_id: Some("it".into()),
        scopes: ["shop:read", "shop:basket"].into_iter().map(str::to_owned).collect::<BTreeSet<_>>(),
    });
    let server = Server::new(app, ServerConfig::default(), principal, ServerSecret::random())
        .with_audit(store)
        .with_handles(Arc::new(handles))
        .with_kill_switch(Arc::new(switch), "test")
        .unwrap();
    Shop { _dir: dir, _authority: authority, server, orders, db, target_key }
}

impl Shop {
    async fn call(&self, tool: &str, arguments: Value) -> Reply {
        let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {} });
        let params: Map<String, Value> =
            json!({ "name": tool, "arguments": arguments, "_meta": meta }).as_object().cloned().unwrap();
        let request = Request { id: RequestId::Number(1), method: "tools/call".into(), params };
        let (sink, _receiver) = NotificationSink::channel(16);
        self.server.handle_request(request, None, sink, CancellationToken::new()).await
    }

    async fn basket(&self) -> String {
        let created = self.call("basket_create", json!({})).await;
        let basket = created.frame["result"]["structuredContent"]["basket"].as_str().unwrap().to_owned();
        let added = self.call("basket_add_item", json!({ "basket": basket, "sku": "TEA-002", "quantity": 3 })).await;
        assert_eq!(added.status, 200, "{}", added.frame);
        basket
    }

    async fn enable_checkout(&self) {
        let target = self.target_key.digest(TargetKind::Tool, "basket_checkout");
        self.db.enable(&target, "test", SystemClock.now_ms()).await.unwrap();
    }
}

#[tokio::test]
async fn checkout_writes_exactly_one_order_and_consumes_the_basket() {
    let shop = shop(Arc::default()).await;
    let basket = shop.basket().await;
    let placed = shop.call("basket_checkout", json!({ "basket": basket })).await;
    assert_eq!(placed.status, 200, "{}", placed.frame);
    assert_eq!(placed.frame["result"]["structuredContent"]["totalCents"], 2700);
    assert_eq!(shop.orders.count().await.unwrap(), 1);
    // The basket handle is revoked: a second checkout is the generic handle refusal, no order.
    let again = shop.call("basket_checkout", json!({ "basket": basket })).await;
    assert_eq!(again.frame["error"]["code"], -32602, "{}", again.frame);
    assert_eq!(shop.orders.count().await.unwrap(), 1);
    // An empty basket is a tool error before any fence is asked for.
    let created = shop.call("basket_create", json!({})).await;
    let empty = created.frame["result"]["structuredContent"]["basket"].as_str().unwrap().to_owned();
    let refused = shop.call("basket_checkout", json!({ "basket": empty })).await;
    assert_eq!(refused.frame["result"]["isError"], true, "{}", refused.frame);
    assert_eq!(shop.orders.count().await.unwrap(), 1);
}

#[tokio::test]
async fn a_disable_between_the_fence_and_the_commit_rolls_the_order_back() {
    let flag = Arc::new(AtomicBool::new(false));
    let shop = shop(flag.clone()).await;
    for round in 0..5 {
        let basket = shop.basket().await;
        // The fence is issued under ENABLE; the DISABLE commits before the order transaction.
        flag.store(true, Ordering::SeqCst);
        let refused = shop.call("basket_checkout", json!({ "basket": basket })).await;
        assert_eq!(refused.frame["error"]["code"], -32030, "round {round}: {}", refused.frame);
        assert!(!flag.load(Ordering::SeqCst), "the hook ran: the fence had been issued");
        assert_eq!(shop.orders.count().await.unwrap(), 0, "round {round}: no order row");
        // The basket was not consumed: after ENABLE the same basket checks out once.
        shop.enable_checkout().await;
        let placed = shop.call("basket_checkout", json!({ "basket": basket })).await;
        assert_eq!(placed.status, 200, "round {round}: {}", placed.frame);
        assert_eq!(shop.orders.count().await.unwrap(), 1);
        sqlx::query("DELETE FROM orders").execute(shop.db.pool()).await.unwrap();
    }
}
