//! The session store's checks: owner-bound round trips, idle and absolute expiry, shared state.

use super::*;

fn session_owner(subject: u8, tenant: &str, client: &str) -> SessionOwner {
    SessionOwner { subject_key: [subject; 32], tenant: tenant.into(), client: client.into() }
}

/// A session row numbered `n`, owned by `owner`: created at 1_000, idle timeout 100, absolute
/// expiry 2_000.
pub fn sample_session(n: u8, owner: &SessionOwner) -> NewSession {
    NewSession {
        digest: [n; 32],
        owner: owner.clone(),
        protocol_version: "2025-11-25".into(),
        client_capabilities: r#"{"sampling":{}}"#.into(),
        client_info: Some(r#"{"name":"client","version":"1"}"#.into()),
        created_ms: 1_000,
        idle_ms: 100,
        expires_ms: 2_000,
    }
}

/// A session comes back to its owner, and to nobody who differs in subject, tenant or client;
/// a duplicate digest is a conflict; invalid rows are refused.
pub async fn session_round_trips_for_its_owner_only(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = session_owner(1, "", "cli");
    store.insert_session(sample_session(7, &alice)).await.expect("insert");
    let found = store.touch_session([7; 32], &alice, 1_050).await.expect("touch").expect("live for its owner");
    assert_eq!(found.protocol_version, "2025-11-25");
    assert_eq!(found.client_capabilities, r#"{"sampling":{}}"#);
    assert_eq!(found.client_info.as_deref(), Some(r#"{"name":"client","version":"1"}"#));
    assert_eq!((found.created_ms, found.last_seen_ms, found.expires_ms, found.log_level), (1_000, 1_050, 2_000, None));
    for other in [session_owner(2, "", "cli"), session_owner(1, "acme", "cli"), session_owner(1, "", "web")] {
        assert!(store.touch_session([7; 32], &other, 1_050).await.expect("touch").is_none(), "{other:?}");
        assert!(!store.set_session_log_level([7; 32], &other, "debug", 1_050).await.expect("level"));
        assert!(!store.subscribe_session([7; 32], &other, "test://x", 1_050).await.expect("subscribe"));
        assert!(store.session_subscriptions([7; 32], &other, 1_050).await.expect("list").is_none());
        assert!(!store.delete_session([7; 32], &other).await.expect("delete"), "{other:?} deleted it");
    }
    assert!(store.touch_session([8; 32], &alice, 1_050).await.expect("touch").is_none());
    let duplicate = store.insert_session(sample_session(7, &session_owner(9, "", "cli"))).await;
    assert!(matches!(duplicate, Err(StoreError::Conflict { .. })), "{duplicate:?}");
    let mut bad = sample_session(3, &alice);
    bad.client_capabilities = "[1]".into();
    assert!(matches!(store.insert_session(bad).await, Err(StoreError::InvalidRecord { .. })));
    assert!(store.touch_session([3; 32], &alice, 1_050).await.expect("touch").is_none());
    assert!(store.touch_session([7; 32], &alice, 1_060).await.expect("touch").is_some());
    fixture.cleanup().await;
}

/// Idle expiry (restarted by every touch) and absolute expiry (not restarted), at the exact
/// instant; dead sessions are purged in bounded batches.
pub async fn session_expires_idle_and_absolute(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = session_owner(1, "t", "c");
    store.insert_session(sample_session(1, &alice)).await.expect("insert");
    store.insert_session(sample_session(2, &alice)).await.expect("insert");
    // Idle: last seen at 1_000, idle 100: live at 1_099, dead at 1_100.
    assert!(store.touch_session([1; 32], &alice, 1_099).await.expect("touch").is_some());
    // The touch at 1_099 restarted the idle timeout: live until 1_199.
    assert!(store.touch_session([1; 32], &alice, 1_198).await.expect("touch").is_some());
    assert!(store.touch_session([2; 32], &alice, 1_100).await.expect("touch").is_none(), "idle expiry missed");
    // A dead session stays dead: a later touch does not revive it.
    assert!(store.touch_session([2; 32], &alice, 1_101).await.expect("touch").is_none());
    // Absolute: keep it active right up to 2_000, then it dies whatever the activity.
    let mut now = 1_198;
    while now < 1_999 {
        now = (now + 90).min(1_999);
        assert!(store.touch_session([1; 32], &alice, now).await.expect("touch").is_some(), "at {now}");
    }
    assert!(store.touch_session([1; 32], &alice, 2_000).await.expect("touch").is_none(), "absolute expiry missed");
    store.insert_session(sample_session(3, &alice)).await.expect("insert");
    assert_eq!(store.purge_sessions(2_000, 1).await.expect("purge"), 1);
    assert_eq!(store.purge_sessions(2_000, 10).await.expect("purge"), 2);
    assert_eq!(store.purge_sessions(2_000, 10).await.expect("purge"), 0);
    fixture.cleanup().await;
}

/// Log level and subscriptions are stored per session, visible from another instance, bounded,
/// and gone with the session once deleted.
pub async fn session_state_is_shared_and_deleted_with_the_session(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let alice = session_owner(1, "t", "c");
    store.insert_session(sample_session(1, &alice)).await.expect("insert");
    assert!(store.set_session_log_level([1; 32], &alice, "warning", 1_010).await.expect("level"));
    assert!(store.subscribe_session([1; 32], &alice, "test://b", 1_010).await.expect("subscribe"));
    assert!(store.subscribe_session([1; 32], &alice, "test://a", 1_010).await.expect("subscribe"));
    assert!(store.subscribe_session([1; 32], &alice, "test://a", 1_010).await.expect("subscribe again"));
    let seen = other.touch_session([1; 32], &alice, 1_020).await.expect("touch").expect("live on another instance");
    assert_eq!(seen.log_level.as_deref(), Some("warning"));
    let uris = other.session_subscriptions([1; 32], &alice, 1_020).await.expect("list").expect("live");
    assert_eq!(uris, ["test://a", "test://b"]);
    assert!(other.unsubscribe_session([1; 32], &alice, "test://b", 1_030).await.expect("unsubscribe"));
    assert_eq!(store.session_subscriptions([1; 32], &alice, 1_030).await.expect("list").expect("live"), ["test://a"]);
    // Bad input changes nothing.
    let empty = store.subscribe_session([1; 32], &alice, "", 1_030).await;
    assert!(matches!(empty, Err(StoreError::InvalidRecord { .. })), "{empty:?}");
    let long_level = store.set_session_log_level([1; 32], &alice, &"x".repeat(17), 1_030).await;
    assert!(matches!(long_level, Err(StoreError::InvalidRecord { .. })), "{long_level:?}");
    for n in 1..crate::MAX_SESSION_SUBSCRIPTIONS {
        let uri = format!("test://n/{n}");
        assert!(store.subscribe_session([1; 32], &alice, &uri, 1_040).await.expect("subscribe"));
    }
    let full = store.subscribe_session([1; 32], &alice, "test://one-too-many", 1_040).await;
    assert!(matches!(full, Err(StoreError::InvalidRecord { .. })), "{full:?}");
    assert!(store.delete_session([1; 32], &alice).await.expect("delete"));
    assert!(!store.delete_session([1; 32], &alice).await.expect("delete again"));
    assert!(other.touch_session([1; 32], &alice, 1_050).await.expect("touch").is_none());
    assert!(other.session_subscriptions([1; 32], &alice, 1_050).await.expect("list").is_none());
    // A new session under the same digest starts with no subscriptions.
    store.insert_session(sample_session(1, &alice)).await.expect("insert");
    assert_eq!(store.session_subscriptions([1; 32], &alice, 1_050).await.expect("list"), Some(Vec::new()));
    fixture.cleanup().await;
}

/// A store that is down refuses every session operation with `Unavailable` (fail closed).
pub async fn closed_store_refuses_session_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = session_owner(1, "t", "c");
    store.insert_session(sample_session(1, &alice)).await.expect("insert");
    store.close().await;
    expect_unavailable(store.touch_session([1; 32], &alice, 1_010).await, "touch_session");
    expect_unavailable(store.insert_session(sample_session(2, &alice)).await, "insert_session");
    expect_unavailable(store.set_session_log_level([1; 32], &alice, "info", 1_010).await, "set_session_log_level");
    expect_unavailable(store.subscribe_session([1; 32], &alice, "test://a", 1_010).await, "subscribe_session");
    expect_unavailable(store.delete_session([1; 32], &alice).await, "delete_session");
    expect_unavailable(store.purge_sessions(5_000, 5).await, "purge_sessions");
    fixture.cleanup().await;
}
