//! The demo's `basket_checkout` under the kill switch, through `Server::handle_request` with the
//! development authority on loopback (mutual TLS) and the order table in the authority's
//! database: the happy path asks the user to confirm the basket's items and total, then writes
//! exactly one order and consumes the basket; a DISABLE that lands between the commit fence and
//! the order transaction rolls the order back, every time. The confirmation is bound to the
//! caller, the basket and what was shown, and is spent by its first use.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use palisade_apps::demo::{self, Orders};
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_killswitch::authority::AuthorityDb;
use palisade_killswitch::dev::{DevAuthorityFiles, RunningDevAuthority};
use palisade_killswitch::{TargetKey, TargetKind};
use palisade_server::auth::{Authenticator, EnvironmentPrincipal};
use palisade_server::clock::SystemClock as ServerClock;
use palisade_server::context::NotificationSink;
use palisade_server::killswitch::exposed_operations;
use palisade_server::reply::Reply;
use palisade_server::secret::ServerSecret;
use palisade_server::{HandleService, Server, ServerConfig, SubjectKey, TaskConfig, TaskService};
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
    let secret = ServerSecret::from_bytes([3; 32]);
    // The demo's export runs only as a task: the server needs a task service.
    let tasks = TaskService::new(
        store.clone(),
        SubjectKey::from_bytes(&[8; 32]).unwrap(),
        TaskConfig::default(),
        Arc::new(ServerClock),
    );
    let server = Server::builder(app, ServerConfig::default(), principal, secret)
        .once_store(store.clone())
        .audit(store.clone())
        .handles(Arc::new(handles))
        .tasks(Arc::new(tasks))
        .kill_switch(Arc::new(switch), "test")
        .build()
        .unwrap();
    Shop { _dir: dir, _authority: authority, server, orders, db, target_key }
}

const ACCEPT: &str = r#"{"palisade.confirm": {"action": "accept", "content": {"confirm": true}}}"#;

impl Shop {
    async fn call(&self, tool: &str, arguments: Value) -> Reply {
        self.call_with(tool, arguments, json!({})).await
    }

    /// A call with extra params (`requestState`, `inputResponses`), declaring elicitation.
    async fn call_with(&self, tool: &str, arguments: Value, extra: Value) -> Reply {
        let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} } });
        let mut params: Map<String, Value> =
            json!({ "name": tool, "arguments": arguments, "_meta": meta }).as_object().cloned().unwrap();
        params.extend(extra.as_object().cloned().unwrap());
        let request = Request { id: RequestId::Number(1), method: "tools/call".into(), params };
        let (sink, _receiver) = NotificationSink::channel(16);
        self.server.handle_request(request, None, sink, CancellationToken::new()).await
    }

    /// Asks to check out `basket`: the confirmation question's text and sealed state.
    async fn ask_checkout(&self, basket: &str) -> (String, String) {
        let asked = self.call("basket_checkout", json!({ "basket": basket })).await;
        let result = &asked.frame["result"];
        assert_eq!(result["resultType"], "input_required", "{}", asked.frame);
        let question = result["inputRequests"]["palisade.confirm"]["params"]["message"].as_str().unwrap().to_owned();
        (question, result["requestState"].as_str().unwrap().to_owned())
    }

    /// Answers a checkout's question with accept.
    async fn accept_checkout(&self, basket: &str, state: &str) -> Reply {
        let extra = json!({ "requestState": state, "inputResponses": serde_json::from_str::<Value>(ACCEPT).unwrap() });
        self.call_with("basket_checkout", json!({ "basket": basket }), extra).await
    }

    /// Asks, accepts, and returns the final answer.
    async fn checkout(&self, basket: &str) -> Reply {
        let (_, state) = self.ask_checkout(basket).await;
        self.accept_checkout(basket, &state).await
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
    // The user is shown what the order is, and nothing is placed before they accept.
    let (question, state) = shop.ask_checkout(&basket).await;
    assert!(question.contains("3 x TEA-002") && question.contains("total EUR 27.00"), "{question}");
    assert_eq!(shop.orders.count().await.unwrap(), 0, "no order before the confirmation");
    let declined = json!({ "requestState": state,
        "inputResponses": { "palisade.confirm": { "action": "decline" } } });
    let declined = shop.call_with("basket_checkout", json!({ "basket": basket }), declined).await;
    assert_eq!(declined.frame["result"]["isError"], true, "{}", declined.frame);
    assert_eq!(shop.orders.count().await.unwrap(), 0, "a declined checkout places nothing");
    let placed = shop.checkout(&basket).await;
    assert_eq!(placed.status, 200, "{}", placed.frame);
    assert_eq!(placed.frame["result"]["structuredContent"]["totalCents"], 2700);
    assert_eq!(shop.orders.count().await.unwrap(), 1);
    // The basket handle is revoked: a second checkout is the generic handle refusal, no order.
    let again = shop.checkout_refused(&basket).await;
    assert_eq!(again.frame["error"]["code"], -32602, "{}", again.frame);
    assert_eq!(shop.orders.count().await.unwrap(), 1);
    // An empty basket is a tool error before any fence is asked for.
    let created = shop.call("basket_create", json!({})).await;
    let empty = created.frame["result"]["structuredContent"]["basket"].as_str().unwrap().to_owned();
    let refused = shop.checkout(&empty).await;
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
        let refused = shop.checkout(&basket).await;
        assert_eq!(refused.frame["error"]["code"], -32030, "round {round}: {}", refused.frame);
        assert!(!flag.load(Ordering::SeqCst), "the hook ran: the fence had been issued");
        assert_eq!(shop.orders.count().await.unwrap(), 0, "round {round}: no order row");
        // The basket was not consumed: after ENABLE the same basket checks out once.
        shop.enable_checkout().await;
        let placed = shop.checkout(&basket).await;
        assert_eq!(placed.status, 200, "round {round}: {}", placed.frame);
        assert_eq!(shop.orders.count().await.unwrap(), 1);
        sqlx::query("DELETE FROM orders").execute(shop.db.pool()).await.unwrap();
    }
}

impl Shop {
    /// A checkout of a basket whose handle no longer resolves: refused before any question.
    async fn checkout_refused(&self, basket: &str) -> Reply {
        self.call("basket_checkout", json!({ "basket": basket })).await
    }
}

/// A confirmation authorizes one execution: presented again (here after the first attempt was
/// refused by a DISABLE, so the basket still exists and its handle still resolves) it is refused,
/// even after ENABLE; a fresh confirmation then places the order once.
#[tokio::test]
async fn an_accepted_confirmation_is_spent_by_its_first_use() {
    let flag = Arc::new(AtomicBool::new(false));
    let shop = shop(flag.clone()).await;
    let basket = shop.basket().await;
    let (_, state) = shop.ask_checkout(&basket).await;
    flag.store(true, Ordering::SeqCst);
    let refused = shop.accept_checkout(&basket, &state).await;
    assert_eq!(refused.frame["error"]["code"], -32030, "{}", refused.frame);
    shop.enable_checkout().await;
    let replayed = shop.accept_checkout(&basket, &state).await;
    assert_eq!(replayed.frame["error"]["code"], -32602, "{}", replayed.frame);
    assert_eq!(replayed.frame["error"]["message"], "invalid params: this confirmation was already used");
    assert_eq!(shop.orders.count().await.unwrap(), 0);
    let placed = shop.checkout(&basket).await;
    assert_eq!(placed.status, 200, "{}", placed.frame);
    assert_eq!(shop.orders.count().await.unwrap(), 1);
}

/// The accepted state of one basket does not check out another; and a basket that changed
/// after the question was answered is not checked out on the old answer.
#[tokio::test]
async fn a_confirmation_is_bound_to_its_basket_and_to_what_was_shown() {
    let shop = shop(Arc::default()).await;
    let (first, second) = (shop.basket().await, shop.basket().await);
    let (_, state) = shop.ask_checkout(&first).await;
    let other = shop.accept_checkout(&second, &state).await;
    assert_eq!(other.frame["error"]["message"], "invalid params: invalid requestState", "{}", other.frame);
    assert_eq!(shop.orders.count().await.unwrap(), 0);

    let (question, state) = shop.ask_checkout(&first).await;
    assert!(question.contains("total EUR 27.00"), "{question}");
    let added = shop.call("basket_add_item", json!({ "basket": first, "sku": "POT-001", "quantity": 1 })).await;
    assert_eq!(added.status, 200, "{}", added.frame);
    let stale = shop.accept_checkout(&first, &state).await;
    assert_eq!(stale.frame["result"]["isError"], true, "{}", stale.frame);
    assert_eq!(shop.orders.count().await.unwrap(), 0, "the changed basket is not ordered on the old answer");
    let (question, _) = shop.ask_checkout(&first).await;
    assert!(question.contains("1 x POT-001") && question.contains("total EUR 76.00"), "{question}");
}
