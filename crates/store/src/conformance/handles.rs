//! The handle store's checks: owner-bound lookups, expiry, uniqueness, revocation, listing and purge.

use super::*;

/// A handle row numbered `n`, owned by `owner`, live from 1_000 to 2_000.
pub fn sample_handle(n: u8, owner: &HandleOwner) -> NewHandle {
    NewHandle {
        digest: [n; 32],
        owner: owner.clone(),
        object_type: "basket".into(),
        object_ref: format!("basket-{n}"),
        object_version: "3".into(),
        scopes: vec!["shop:basket".into(), "shop:read".into()],
        policy_version: 2,
        created_ms: 1_000,
        expires_ms: 2_000,
    }
}

fn revocation(reason: &str) -> Revocation {
    Revocation { reason: reason.into(), receipt: Some("receipt-1".into()), at_ms: 1_500 }
}

async fn live(store: &dyn HandleStore, digest: u8, owner: &HandleOwner, now_ms: i64) -> bool {
    store.lookup_handle([digest; 32], owner, now_ms).await.expect("lookup_handle").is_some()
}

/// A handle comes back field for field to its owner, and to nobody who differs in subject,
/// tenant or client (each alone and every pair).
pub async fn handle_round_trips_for_its_owner_only(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_handle(sample_handle(7, &alice)).await.expect("insert");
    let found = store.lookup_handle([7; 32], &alice, 1_500).await.expect("lookup").expect("live for its owner");
    assert_eq!(found.object_type, "basket");
    assert_eq!(found.object_ref, "basket-7");
    assert_eq!(found.object_version, "3");
    assert_eq!(found.scopes, ["shop:basket", "shop:read"]);
    assert_eq!((found.policy_version, found.expires_ms), (2, 2_000));
    for other in [
        owner(2, "shop", "cli"),
        owner(1, "other", "cli"),
        owner(1, "shop", "web"),
        owner(2, "other", "cli"),
        owner(2, "shop", "web"),
        owner(1, "other", "web"),
        owner(2, "other", "web"),
    ] {
        assert!(!live(store.as_ref(), 7, &other, 1_500).await, "{other:?} must not see the handle");
    }
    // A near-miss digest (one bit) and an unknown one find nothing.
    let mut near = [7u8; 32];
    near[31] ^= 1;
    assert!(store.lookup_handle(near, &alice, 1_500).await.expect("lookup").is_none());
    assert!(!live(store.as_ref(), 8, &alice, 1_500).await);
    fixture.cleanup().await;
}

/// Live one millisecond before `expires_ms`, dead at it.
pub async fn handle_expires_at_the_exact_instant(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_handle(sample_handle(1, &alice)).await.expect("insert");
    assert!(live(store.as_ref(), 1, &alice, 1_999).await);
    assert!(!live(store.as_ref(), 1, &alice, 2_000).await);
    assert!(!live(store.as_ref(), 1, &alice, 2_001).await);
    fixture.cleanup().await;
}

/// A second row with the same digest is a conflict and leaves the first untouched.
pub async fn handle_digest_is_unique(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_handle(sample_handle(1, &alice)).await.expect("insert");
    let mallory = owner(9, "evil", "cli");
    let result = store.insert_handle(sample_handle(1, &mallory)).await;
    assert!(matches!(result, Err(StoreError::Conflict { .. })), "{result:?}");
    assert!(live(store.as_ref(), 1, &alice, 1_500).await);
    assert!(!live(store.as_ref(), 1, &mallory, 1_500).await);
    fixture.cleanup().await;
}

/// Rows breaking an invariant are refused before the database, and nothing is stored.
pub async fn invalid_handles_are_refused(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    let mut no_scopes = sample_handle(1, &alice);
    no_scopes.scopes.clear();
    let mut expired = sample_handle(1, &alice);
    expired.expires_ms = expired.created_ms;
    let mut no_tenant = sample_handle(1, &owner(1, "", "cli"));
    no_tenant.object_ref = "basket-1".into();
    for bad in [no_scopes, expired, no_tenant] {
        let result = store.insert_handle(bad).await;
        assert!(matches!(result, Err(StoreError::InvalidRecord { .. })), "{result:?}");
    }
    assert!(!live(store.as_ref(), 1, &alice, 1_500).await);
    let empty_reason = Revocation { reason: String::new(), receipt: None, at_ms: 1 };
    let result = store.revoke_handles(RevokeSelector::Digest([1; 32]), empty_reason).await;
    assert!(matches!(result, Err(StoreError::InvalidRecord { .. })), "{result:?}");
    fixture.cleanup().await;
}

/// Each selector revokes exactly the rows it names; a second revocation changes nothing and the
/// first reason stands.
pub async fn handle_revocation_selectors_cover_exactly_their_rows(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let a = owner(1, "shop", "cli");
    let b = owner(2, "shop", "cli");
    let c = owner(1, "other", "web");
    // 1,2: a; 3: b; 4: c; 5: b on object basket-1 (same object as 1); 6: a, old policy.
    for (n, who) in [(1, &a), (2, &a), (3, &b), (4, &c)] {
        store.insert_handle(sample_handle(n, who)).await.expect("insert");
    }
    let mut same_object = sample_handle(5, &b);
    same_object.object_ref = "basket-1".into();
    store.insert_handle(same_object).await.expect("insert");
    let mut old_policy = sample_handle(6, &a);
    old_policy.policy_version = 1;
    store.insert_handle(old_policy).await.expect("insert");
    let owners = [(1, &a), (2, &a), (3, &b), (4, &c), (5, &b), (6, &a)];
    let alive = |store: Arc<dyn Store>| async move {
        let mut alive = Vec::new();
        for (n, who) in owners {
            if live(store.as_ref(), n, who, 1_600).await {
                alive.push(n);
            }
        }
        alive
    };

    // Each revocation revokes exactly what `count_handles` counted just before it.
    let revoke = |selector: RevokeSelector| {
        let store = store.clone();
        async move {
            let counted = store.count_handles(selector.clone()).await.expect("count");
            let revoked = store.revoke_handles(selector, revocation("test")).await;
            if let Ok(revoked) = &revoked {
                assert_eq!(*revoked, counted, "count_handles and revoke_handles disagree");
            }
            revoked
        }
    };
    assert_eq!(store.count_handles(RevokeSelector::Subject([1; 32])).await.expect("count"), 4);
    assert_eq!(
        revoke(RevokeSelector::PolicyBelow { object_type: "basket".into(), below: 2 }).await.expect("revoke"),
        1
    );
    assert_eq!(alive(store.clone()).await, [1, 2, 3, 4, 5]);
    let object =
        RevokeSelector::Object { tenant: "shop".into(), object_type: "basket".into(), object_ref: "basket-1".into() };
    assert_eq!(revoke(object).await.expect("revoke"), 2);
    assert_eq!(alive(store.clone()).await, [2, 3, 4]);
    // The owner-bound form refuses someone else's handle.
    let foreign = RevokeSelector::Owned { digest: [2; 32], owner: b.clone() };
    assert_eq!(revoke(foreign).await.expect("revoke"), 0);
    assert_eq!(revoke(RevokeSelector::Owned { digest: [2; 32], owner: a.clone() }).await.expect("revoke"), 1);
    assert_eq!(alive(store.clone()).await, [3, 4]);
    assert_eq!(revoke(RevokeSelector::Client("web".into())).await.expect("revoke"), 1);
    assert_eq!(alive(store.clone()).await, [3]);
    assert_eq!(
        revoke(RevokeSelector::SubjectInTenant { subject_key: [2; 32], tenant: "other".into() }).await.expect("revoke"),
        0
    );
    assert_eq!(revoke(RevokeSelector::Tenant("shop".into())).await.expect("revoke"), 1);
    assert!(alive(store.clone()).await.is_empty());
    assert_eq!(store.count_handles(RevokeSelector::Subject([1; 32])).await.expect("count"), 0);
    // Already revoked: nothing changes, the first reason and receipt stand.
    let again = Revocation { reason: "later".into(), receipt: None, at_ms: 1_700 };
    assert_eq!(store.revoke_handles(RevokeSelector::Subject([1; 32]), again).await.expect("revoke"), 0);
    let listed = store.list_handles([1; 32], 10).await.expect("list");
    assert!(listed.iter().all(|row| row.revocation_reason.as_deref() == Some("test")), "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|row| row.revocation_receipt.as_deref() == Some("receipt-1") && row.revoked_ms == Some(1_500))
    );
    fixture.cleanup().await;
}

/// Lookups racing a revocation (on another instance): any lookup that starts after the
/// revocation returned finds nothing.
pub async fn no_lookup_sees_a_handle_after_its_revocation_committed(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let alice = owner(1, "shop", "cli");
    for round in 0..20u8 {
        store.insert_handle(sample_handle(round, &alice)).await.expect("insert");
        let revoked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut lookups = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (other, alice, revoked) = (other.clone(), alice.clone(), revoked.clone());
            lookups.spawn(async move {
                for _ in 0..25 {
                    let after_revoke = revoked.load(std::sync::atomic::Ordering::SeqCst);
                    let found = live(other.as_ref(), round, &alice, 1_500).await;
                    assert!(!(after_revoke && found), "a lookup started after the revocation saw the handle");
                    tokio::task::yield_now().await;
                }
            });
        }
        tokio::task::yield_now().await;
        let revoked_rows = store.revoke_handles(RevokeSelector::Digest([round; 32]), revocation("race")).await;
        revoked.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(revoked_rows.expect("revoke"), 1);
        while let Some(joined) = lookups.join_next().await {
            joined.expect("lookup task");
        }
        assert!(!live(other.as_ref(), round, &alice, 1_500).await);
    }
    fixture.cleanup().await;
}

/// Listing shows a subject's rows (digests, never handles) newest first; purging removes only
/// expired or revoked rows older than the cut-off, at most `limit` per call.
pub async fn handle_list_shows_digests_and_purge_is_bounded(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    for n in 1..=5u8 {
        let mut handle = sample_handle(n, &alice);
        handle.created_ms = 1_000 + i64::from(n);
        handle.expires_ms = if n <= 3 { 1_100 } else { 5_000 };
        store.insert_handle(handle).await.expect("insert");
    }
    let mut someone_else = sample_handle(9, &owner(2, "shop", "cli"));
    someone_else.expires_ms = 5_000;
    store.insert_handle(someone_else).await.expect("insert");
    store.revoke_handles(RevokeSelector::Digest([4; 32]), revocation("test")).await.expect("revoke");
    let listed = store.list_handles([1; 32], 100).await.expect("list");
    let digests: Vec<u8> = listed.iter().map(|row| row.digest[0]).collect();
    assert_eq!(digests, [5, 4, 3, 2, 1]);
    assert_eq!(store.list_handles([1; 32], 2).await.expect("list").len(), 2);
    // At 3_000: 1..=3 expired (1_100) and 4 revoked (1_500) are purgeable; 5 and 9 are not.
    assert_eq!(store.purge_handles(3_000, 3).await.expect("purge"), 3);
    assert_eq!(store.purge_handles(3_000, 100).await.expect("purge"), 1);
    assert_eq!(store.purge_handles(3_000, 100).await.expect("purge"), 0);
    let left: Vec<u8> = store.list_handles([1; 32], 100).await.expect("list").iter().map(|row| row.digest[0]).collect();
    assert_eq!(left, [5]);
    assert!(live(store.as_ref(), 9, &owner(2, "shop", "cli"), 1_500).await);
    fixture.cleanup().await;
}

/// A store that is down refuses every handle operation with `Unavailable` (the pipeline then
/// refuses the call: fail closed).
pub async fn closed_store_refuses_handle_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_handle(sample_handle(1, &alice)).await.expect("insert");
    store.close().await;
    expect_unavailable(store.lookup_handle([1; 32], &alice, 1_500).await, "lookup_handle");
    expect_unavailable(store.insert_handle(sample_handle(2, &alice)).await, "insert_handle");
    expect_unavailable(store.revoke_handles(RevokeSelector::Digest([1; 32]), revocation("x")).await, "revoke");
    expect_unavailable(store.count_handles(RevokeSelector::Digest([1; 32])).await, "count");
    expect_unavailable(store.list_handles([1; 32], 5).await, "list_handles");
    expect_unavailable(store.purge_handles(5_000, 5).await, "purge_handles");
    fixture.cleanup().await;
}
