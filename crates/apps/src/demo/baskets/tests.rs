//! Unit tests of the demo's basket store: its tenancy, quantities and URL schemes.

#![allow(clippy::unwrap_used)]

use super::*;

fn empty(owner: &str) -> Basket {
    Basket { owner: owner.into(), client: "it".into(), generation: 1, items: BTreeMap::new() }
}

#[tokio::test]
async fn a_basket_id_never_crosses_tenants() {
    tenancy(BasketStore::memory()).await;
}

/// The same on a file database, where one basket is read inline on its own connections: every
/// write through the pool is seen by the next inline read.
#[tokio::test]
async fn a_basket_id_never_crosses_tenants_in_a_file_read_inline() {
    let dir = tempfile::tempdir().unwrap();
    let store = BasketStore::open(&format!("sqlite:{}", dir.path().join("shop.db").display())).await.unwrap();
    assert!(store.inline.is_some(), "a file database reads one basket inline");
    tenancy(store.clone()).await;
    store.insert("acme", "b2", &empty("carol")).await.unwrap();
    store.add_item("acme", "b2", "TEA-002", 3).await.unwrap();
    let basket = store.get("acme", "b2").await.unwrap().unwrap();
    assert_eq!((basket.owner.as_str(), basket.client.as_str(), basket.generation), ("carol", "it", 1));
    assert_eq!(basket.items, BTreeMap::from([("TEA-002".to_owned(), 3)]));
    // A closed reader set fails closed, naming no SQL.
    store.inline.as_ref().unwrap().close();
    let Err(error) = store.get("acme", "b2").await else { panic!("a closed reader set still answered") };
    assert!(!error.to_string().contains("SELECT"), "{error}");
}

async fn tenancy(store: BasketStore) {
    store.insert("acme", "b1", &empty("alice")).await.unwrap();
    assert!(store.get("globex", "b1").await.unwrap().is_none(), "another tenant does not see it");
    assert!(store.add_item("globex", "b1", "TEA-001", 2).await.unwrap().is_none());
    assert!(store.get("acme", "b1").await.unwrap().unwrap().items.is_empty(), "and cannot fill it");
    // The same id in another tenant is another basket.
    store.insert("globex", "b1", &empty("bob")).await.unwrap();
    store.add_item("globex", "b1", "TEA-001", 2).await.unwrap().unwrap();
    assert!(store.get("acme", "b1").await.unwrap().unwrap().items.is_empty());
    assert_eq!(store.get("globex", "b1").await.unwrap().unwrap().owner, "bob");
    // A second basket with an id already used in the tenant is refused, the first unchanged.
    assert!(store.insert("acme", "b1", &empty("mallory")).await.is_err());
    assert_eq!(store.get("acme", "b1").await.unwrap().unwrap().owner, "alice");
    assert_eq!(store.items_of("acme", "alice", "it").await.unwrap().len(), 1);
    assert!(store.items_of("acme", "bob", "it").await.unwrap().is_empty());
    assert!(store.items_of("acme", "alice", "other-client").await.unwrap().is_empty());
    store.remove("acme", "b1").await.unwrap();
    assert!(store.get("acme", "b1").await.unwrap().is_none());
    assert!(store.get("globex", "b1").await.unwrap().is_some(), "removing one tenant's basket leaves the other's");
}

#[tokio::test]
async fn quantities_add_up_and_stop_at_999() {
    let store = BasketStore::memory();
    store.insert("acme", "b1", &empty("alice")).await.unwrap();
    store.add_item("acme", "b1", "TEA-001", 99).await.unwrap();
    let items = store.add_item("acme", "b1", "TEA-002", 1).await.unwrap().unwrap();
    assert_eq!(items, BTreeMap::from([("TEA-001".to_owned(), 99), ("TEA-002".to_owned(), 1)]));
    for _ in 0..10 {
        store.add_item("acme", "b1", "TEA-001", 99).await.unwrap();
    }
    assert_eq!(store.get("acme", "b1").await.unwrap().unwrap().items["TEA-001"], 999);
}

#[tokio::test]
async fn open_refuses_an_unknown_scheme() {
    let error = BasketStore::open("mysql://root:hunter2@db/shop").await.unwrap_err();
    assert!(matches!(error, sqlx::Error::Configuration(_)), "{error:?}");
    assert!(!format!("{error} {error:?}").contains("hunter2"));
}
