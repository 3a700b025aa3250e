//! The connection store's checks: versioned rows, client approvals, flows and registrations.

use super::*;

/// The keyed digest of the principal numbered `n` in the connection checks.
fn connection_principal(n: u8) -> [u8; 32] {
    let mut key = [n; 32];
    key[0] = 0xc0;
    key
}

/// A connection of the principal numbered `who` to `upstream`, stored at `created_ms`, whose
/// sealed tokens and times depend on `generation`.
pub fn sample_connection(who: u8, upstream: &str, created_ms: i64, generation: u8) -> ConnectionRow {
    ConnectionRow {
        principal_key: connection_principal(who),
        principal: format!("https://idp.example principal-{who} tenant ünïcode"),
        upstream: upstream.into(),
        issuer: format!("https://{upstream}.example/oauth"),
        client_id: format!("palisade-at-{upstream}"),
        scopes: format!("read write:{generation}"),
        sealed: (0..64).map(|index: u8| index ^ generation ^ who).collect(),
        version: 1,
        created_ms,
        updated_ms: created_ms + i64::from(generation),
        expires_ms: Some(created_ms + 3_600_000 + i64::from(generation)),
    }
}

async fn expect_connection(store: &dyn Store, who: u8, upstream: &str) -> ConnectionRow {
    store
        .connection(connection_principal(who), upstream)
        .await
        .expect("connection")
        .unwrap_or_else(|| panic!("the connection of {who} to {upstream} should exist"))
}

/// Every connection and every approval: what a refused call must leave as it was.
async fn connection_rows(store: &dyn Store) -> (Vec<ConnectionRow>, Vec<ApprovedClient>) {
    let connections = store.connections(None, crate::MAX_CONNECTION_LIST).await.expect("connections");
    let approvals = store.approved_clients(None, crate::MAX_CONNECTION_LIST).await.expect("approved_clients");
    (connections, approvals)
}

/// A put reads back whole (version 1), from this instance and another; a put over it replaces
/// every field but its creation time and bumps the version; a replacement from the current
/// version sets `expected + 1`. Nothing else is touched.
pub async fn connection_round_trips_and_every_write_bumps_the_version(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    assert!(store.connection(connection_principal(1), "github").await.expect("connection").is_none());
    let first = sample_connection(1, "github", 1_000, 0);
    store.put_connection(&first).await.expect("put_connection");
    store.put_connection(&sample_connection(2, "github", 1_100, 0)).await.expect("put_connection");
    store.put_connection(&sample_connection(1, "linear", 1_200, 0)).await.expect("put_connection");
    assert_eq!(expect_connection(store.as_ref(), 1, "github").await, first);
    assert_eq!(expect_connection(other.as_ref(), 1, "github").await, first, "seen from another instance");

    // A put over an existing row: a caller's version and creation time are not taken.
    let again = ConnectionRow { version: 40, created_ms: 5_000, ..sample_connection(1, "github", 5_000, 1) };
    other.put_connection(&again).await.expect("put_connection");
    let stored = expect_connection(store.as_ref(), 1, "github").await;
    assert_eq!(stored, ConnectionRow { version: 2, created_ms: 1_000, ..again.clone() });

    // The compare-and-swap from the current version.
    let refreshed =
        ConnectionRow { expires_ms: None, principal: String::new(), ..sample_connection(1, "github", 6_000, 2) };
    assert!(store.replace_connection(&refreshed, 2).await.expect("replace_connection"), "from the current version");
    let stored = expect_connection(other.as_ref(), 1, "github").await;
    assert_eq!(stored, ConnectionRow { version: 3, created_ms: 1_000, ..refreshed.clone() });
    assert!(stored.sealed != again.sealed && stored.expires_ms.is_none(), "{stored:?}");
    // A put after a replacement continues the count.
    store.put_connection(&sample_connection(1, "github", 9_000, 3)).await.expect("put_connection");
    assert_eq!(expect_connection(store.as_ref(), 1, "github").await.version, 4);
    // The other rows did not move.
    assert_eq!(expect_connection(store.as_ref(), 2, "github").await, sample_connection(2, "github", 1_100, 0));
    assert_eq!(expect_connection(store.as_ref(), 1, "linear").await, sample_connection(1, "linear", 1_200, 0));
    assert!(store.connection(connection_principal(3), "github").await.expect("connection").is_none());
    assert!(store.connection(connection_principal(1), "GitHub").await.expect("connection").is_none());
    // The largest sealed value fits.
    let largest = ConnectionRow { sealed: vec![0xa5; crate::MAX_CONNECTION_SEALED_BYTES], ..first.clone() };
    store.put_connection(&largest).await.expect("put_connection");
    assert_eq!(expect_connection(store.as_ref(), 1, "github").await.sealed, largest.sealed);
    other.close().await;
    fixture.cleanup().await;
}

/// A replacement from a stale version (or of an unknown connection) is refused and changes
/// nothing; racing refreshes from the same version on two instances: exactly one stores its
/// tokens.
pub async fn stale_connection_replacements_are_refused_and_change_nothing(harness: &dyn Harness) {
    const RACERS: u8 = 8;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    let store = instances[0].as_ref();
    store.put_connection(&sample_connection(1, "github", 1_000, 0)).await.expect("put_connection");
    store.put_connection(&sample_connection(1, "github", 1_000, 1)).await.expect("put_connection");
    let before = expect_connection(store, 1, "github").await;
    assert_eq!(before.version, 2);
    for stale in [1, 3, 99] {
        let refused = store.replace_connection(&sample_connection(1, "github", 1_000, 7), stale).await;
        assert!(!refused.expect("replace_connection"), "version {stale} is not the stored one");
        assert_eq!(expect_connection(store, 1, "github").await, before, "version {stale}: the row changed");
    }
    let unknown = store.replace_connection(&sample_connection(2, "github", 1_000, 7), 1).await;
    assert!(!unknown.expect("replace_connection"), "no such connection");
    assert!(store.connection(connection_principal(2), "github").await.expect("connection").is_none(), "not created");

    for round in 0..3u8 {
        let expected = expect_connection(store, 1, "github").await.version;
        let mut tasks = tokio::task::JoinSet::new();
        for racer in 0..RACERS {
            let instance = instances[usize::from(racer) % instances.len()].clone();
            let row = sample_connection(1, "github", 1_000, 10 + racer);
            tasks.spawn(async move { instance.replace_connection(&row, expected).await.map(|won| (won, racer)) });
        }
        let mut winners = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let (won, racer) = joined.expect("refresh task").expect("replace_connection");
            if won {
                winners.push(racer);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?} of {RACERS} racing refreshes won");
        let stored = expect_connection(instances[1].as_ref(), 1, "github").await;
        assert_eq!(stored.version, expected + 1, "round {round}");
        assert_eq!(stored.sealed, sample_connection(1, "github", 1_000, 10 + winners[0]).sealed, "the winner's");
    }
    instances[1].close().await;
    fixture.cleanup().await;
}

/// Listing by principal returns only that principal's connections, newest first (then by
/// upstream), at most the limit; without a principal, every connection (then by principal key).
pub async fn connections_are_listed_by_principal_newest_first(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    assert!(store.connections(None, 100).await.expect("connections").is_empty());
    // (principal, upstream, created_ms): b and c of principal 1 share a creation time.
    let rows = [(1, "a", 1_000), (2, "a", 1_500), (1, "c", 3_000), (1, "b", 3_000), (1, "d", 2_000), (2, "b", 50)];
    for (who, upstream, created_ms) in rows {
        store.put_connection(&sample_connection(who, upstream, created_ms, 0)).await.expect("put_connection");
    }
    // Replacing a row keeps its place (its creation time).
    store.put_connection(&sample_connection(1, "a", 9_000, 5)).await.expect("put_connection");
    let names = |rows: Vec<ConnectionRow>| -> Vec<(u8, String)> {
        rows.into_iter().map(|row| (row.principal_key[1], row.upstream)).collect()
    };
    let named = |pairs: &[(u8, &str)]| -> Vec<(u8, String)> {
        pairs.iter().map(|(who, upstream)| (*who, (*upstream).to_owned())).collect()
    };
    let first = store.connections(Some(connection_principal(1)), 100).await.expect("connections");
    assert!(first.iter().all(|row| row.principal_key == connection_principal(1)), "{first:?}");
    assert_eq!(names(first), named(&[(1, "b"), (1, "c"), (1, "d"), (1, "a")]));
    let two = store.connections(Some(connection_principal(1)), 2).await.expect("connections");
    assert_eq!(names(two), named(&[(1, "b"), (1, "c")]));
    let second = store.connections(Some(connection_principal(2)), 100).await.expect("connections");
    assert_eq!(names(second), named(&[(2, "a"), (2, "b")]));
    assert!(store.connections(Some(connection_principal(3)), 100).await.expect("connections").is_empty());
    assert!(store.connections(Some(connection_principal(1)), 0).await.expect("connections").is_empty());
    let all = store.connections(None, 100).await.expect("connections");
    assert_eq!(names(all), named(&[(1, "b"), (1, "c"), (1, "d"), (2, "a"), (1, "a"), (2, "b")]));
    let three = store.connections(None, 3).await.expect("connections");
    assert_eq!(names(three), named(&[(1, "b"), (1, "c"), (1, "d")]));
    assert_eq!(store.connections(None, u32::MAX).await.expect("connections").len(), 6);
    fixture.cleanup().await;
}

/// Deleting one connection removes exactly it (once); deleting a principal's connections
/// removes all of them and nothing of anyone else's (nor that principal's approvals).
pub async fn connection_deletes_cover_exactly_their_rows(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    for (who, upstream) in [(1, "a"), (1, "b"), (1, "c"), (2, "a"), (2, "b")] {
        store.put_connection(&sample_connection(who, upstream, 1_000, 0)).await.expect("put_connection");
    }
    store.approve_client(connection_principal(1), "a", "cursor", 1_000).await.expect("approve_client");
    assert!(store.delete_connection(connection_principal(1), "a").await.expect("delete_connection"));
    assert!(!other.delete_connection(connection_principal(1), "a").await.expect("delete_connection"), "gone");
    assert!(!store.delete_connection(connection_principal(3), "a").await.expect("delete_connection"), "unknown");
    assert!(store.connection(connection_principal(1), "a").await.expect("connection").is_none());
    assert_eq!(expect_connection(store.as_ref(), 2, "a").await, sample_connection(2, "a", 1_000, 0));
    assert_eq!(other.delete_connections_of(connection_principal(1)).await.expect("delete_connections_of"), 2);
    assert_eq!(store.delete_connections_of(connection_principal(1)).await.expect("delete_connections_of"), 0);
    assert!(store.connections(Some(connection_principal(1)), 100).await.expect("connections").is_empty());
    let left = store.connections(None, 100).await.expect("connections");
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|row| row.principal_key == connection_principal(2)), "{left:?}");
    assert!(store.client_approved(connection_principal(1), "a", "cursor").await.expect("client_approved"));
    // A deleted connection can be made again, from version 1.
    store.put_connection(&sample_connection(1, "a", 2_000, 1)).await.expect("put_connection");
    assert_eq!(expect_connection(store.as_ref(), 1, "a").await.version, 1);
    other.close().await;
    fixture.cleanup().await;
}

/// An approval is per principal, upstream and client: visible from every instance, invisible to
/// another principal, another upstream or another client; approving again keeps the first time;
/// revoking succeeds once and touches nothing else.
pub async fn client_approvals_are_per_principal_and_upstream_and_revocable(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let alice = connection_principal(1);
    let bob = connection_principal(2);
    assert!(!store.client_approved(alice, "github", "cursor").await.expect("client_approved"));
    store.approve_client(alice, "github", "cursor", 1_000).await.expect("approve_client");
    other.approve_client(alice, "github", "cursor", 5_000).await.expect("approve again");
    store.approve_client(alice, "linear", "claude", 2_000).await.expect("approve_client");
    store.approve_client(bob, "github", "claude", 3_000).await.expect("approve_client");
    store.approve_client(alice, "github", "zed", 2_000).await.expect("approve_client");
    for instance in [&store, &other] {
        assert!(instance.client_approved(alice, "github", "cursor").await.expect("client_approved"));
        assert!(!instance.client_approved(bob, "github", "cursor").await.expect("client_approved"), "bob");
        assert!(!instance.client_approved(alice, "linear", "cursor").await.expect("client_approved"), "upstream");
        assert!(!instance.client_approved(alice, "github", "claude").await.expect("client_approved"), "client");
        assert!(!instance.client_approved(alice, "github", "Cursor").await.expect("client_approved"), "exact id");
    }
    let listed = |rows: Vec<ApprovedClient>| -> Vec<(u8, String, String, i64)> {
        rows.into_iter().map(|row| (row.principal_key[1], row.upstream, row.client_id, row.approved_ms)).collect()
    };
    let row = |who: u8, upstream: &str, client: &str, at: i64| (who, upstream.to_owned(), client.to_owned(), at);
    let of_alice = store.approved_clients(Some(alice), 100).await.expect("approved_clients");
    assert!(of_alice.iter().all(|approval| approval.principal_key == alice));
    assert_eq!(
        listed(of_alice),
        vec![row(1, "github", "zed", 2_000), row(1, "linear", "claude", 2_000), row(1, "github", "cursor", 1_000)],
        "newest first, the first approval's time kept"
    );
    assert_eq!(listed(store.approved_clients(Some(alice), 1).await.expect("approved_clients")).len(), 1);
    let all = other.approved_clients(None, 100).await.expect("approved_clients");
    assert_eq!(
        listed(all),
        vec![
            row(2, "github", "claude", 3_000),
            row(1, "github", "zed", 2_000),
            row(1, "linear", "claude", 2_000),
            row(1, "github", "cursor", 1_000),
        ]
    );
    assert!(store.approved_clients(Some(connection_principal(3)), 100).await.expect("approved").is_empty());
    assert!(!store.revoke_client(bob, "github", "cursor").await.expect("revoke_client"), "not bob's approval");
    assert!(store.revoke_client(alice, "github", "cursor").await.expect("revoke_client"));
    assert!(!other.revoke_client(alice, "github", "cursor").await.expect("revoke_client"), "revoked already");
    assert!(!other.client_approved(alice, "github", "cursor").await.expect("client_approved"), "revoked");
    assert!(other.client_approved(alice, "github", "zed").await.expect("client_approved"), "the others stay");
    assert!(other.client_approved(bob, "github", "claude").await.expect("client_approved"));
    assert_eq!(store.approved_clients(None, 100).await.expect("approved_clients").len(), 3);
    // Approved again after a revocation: a new approval with its own time.
    store.approve_client(alice, "github", "cursor", 7_000).await.expect("approve_client");
    let newest = store.approved_clients(Some(alice), 1).await.expect("approved_clients");
    assert_eq!(listed(newest), vec![row(1, "github", "cursor", 7_000)]);
    other.close().await;
    fixture.cleanup().await;
}

/// The digest of the flow numbered `n`.
fn flow_digest(n: u8) -> [u8; 32] {
    let mut digest = [n; 32];
    digest[0] = 0xf1;
    digest
}

/// A flow is read without being consumed, taken once (from any instance) and then gone; of 8
/// concurrent takers over two instances exactly one gets it, in every round.
pub async fn flows_are_taken_exactly_once(harness: &dyn Harness) {
    const TAKERS: usize = 8;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    let store = instances[0].as_ref();
    let body = r#"{"upstream":"github","verifier":"ünïcode"}"#;
    store.put_flow(flow_digest(1), "connect", body, 10_000).await.expect("put_flow");
    store.put_flow(flow_digest(2), "connect", "{}", 10_000).await.expect("put_flow");
    for _ in 0..3 {
        assert_eq!(instances[1].flow(flow_digest(1), "connect", 5_000).await.expect("flow").as_deref(), Some(body));
    }
    assert_eq!(store.take_flow(flow_digest(1), "connect", 5_000).await.expect("take_flow").as_deref(), Some(body));
    assert_eq!(store.take_flow(flow_digest(1), "connect", 5_000).await.expect("take_flow"), None, "taken");
    assert_eq!(instances[1].take_flow(flow_digest(1), "connect", 5_000).await.expect("take_flow"), None, "taken");
    assert_eq!(store.flow(flow_digest(1), "connect", 5_000).await.expect("flow"), None, "gone");
    assert_eq!(store.take_flow(flow_digest(9), "connect", 5_000).await.expect("take_flow"), None, "unknown");
    assert_eq!(store.flow(flow_digest(2), "connect", 5_000).await.expect("flow").as_deref(), Some("{}"), "untouched");

    for round in 10..15u8 {
        let digest = flow_digest(round);
        let body = format!(r#"{{"round":{round}}}"#);
        instances[usize::from(round) % 2].put_flow(digest, "state", &body, 60_000).await.expect("put_flow");
        let mut tasks = tokio::task::JoinSet::new();
        for taker in 0..TAKERS {
            let instance = instances[taker % instances.len()].clone();
            tasks.spawn(async move { instance.take_flow(digest, "state", 5_000).await });
        }
        let mut taken = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            if let Some(body) = joined.expect("taker task").expect("take_flow") {
                taken.push(body);
            }
        }
        assert_eq!(taken, vec![body], "round {round}: {} of {TAKERS} racing takers got the flow", taken.len());
        assert_eq!(store.flow(digest, "state", 5_000).await.expect("flow"), None, "round {round}: gone");
    }
    instances[1].close().await;
    fixture.cleanup().await;
}

/// An expired flow (at the exact instant) is neither read nor taken, and taking it deletes it; a
/// flow asked for under another kind is neither read nor taken, and stays takable under its own.
pub async fn expired_or_other_kind_flows_are_not_taken(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let store = store.as_ref();
    store.put_flow(flow_digest(1), "signin", r#"{"n":1}"#, 2_000).await.expect("put_flow");
    assert_eq!(store.flow(flow_digest(1), "signin", 1_999).await.expect("flow").as_deref(), Some(r#"{"n":1}"#));
    assert_eq!(store.flow(flow_digest(1), "signin", 2_000).await.expect("flow"), None, "at expiry");
    assert_eq!(store.flow(flow_digest(1), "signin", 3_000).await.expect("flow"), None, "after expiry");
    assert_eq!(store.take_flow(flow_digest(1), "signin", 2_000).await.expect("take_flow"), None, "at expiry");
    // The expired take deleted it: even a caller whose clock is earlier finds nothing.
    assert_eq!(store.flow(flow_digest(1), "signin", 0).await.expect("flow"), None, "the expired flow is gone");
    assert_eq!(store.take_flow(flow_digest(1), "signin", 0).await.expect("take_flow"), None);
    assert_eq!(store.purge_flows(i64::MAX, 10).await.expect("purge_flows"), 0, "nothing left to purge");

    store.put_flow(flow_digest(2), "connect", r#"{"n":2}"#, 9_000).await.expect("put_flow");
    assert_eq!(store.flow(flow_digest(2), "signin", 1_000).await.expect("flow"), None, "another kind");
    assert_eq!(store.take_flow(flow_digest(2), "signin", 1_000).await.expect("take_flow"), None, "another kind");
    assert_eq!(store.take_flow(flow_digest(2), "Connect", 1_000).await.expect("take_flow"), None, "exact kind");
    assert_eq!(store.flow(flow_digest(2), "connect", 1_000).await.expect("flow").as_deref(), Some(r#"{"n":2}"#));
    let taken = store.take_flow(flow_digest(2), "connect", 8_999).await.expect("take_flow");
    assert_eq!(taken.as_deref(), Some(r#"{"n":2}"#), "still takable under its own kind, just before expiry");
    assert_eq!(store.take_flow(flow_digest(2), "connect", 1_000).await.expect("take_flow"), None);
    fixture.cleanup().await;
}

/// A digest stored already is refused (from either instance, whatever the kind, body or expiry,
/// and even once expired) and the first flow is kept; once taken, the digest can be stored again.
pub async fn an_existing_flow_digest_is_never_overwritten(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    store.put_flow(flow_digest(1), "connect", r#"{"first":true}"#, 2_000).await.expect("put_flow");
    for (instance, kind, body, expires_ms) in
        [(&store, "connect", r#"{"second":true}"#, 9_000), (&other, "signin", r#"{"third":true}"#, 2_000)]
    {
        let refused = instance.put_flow(flow_digest(1), kind, body, expires_ms).await;
        expect_invalid(refused, "an existing digest");
    }
    assert_eq!(other.flow(flow_digest(1), "connect", 1_000).await.expect("flow").as_deref(), Some(r#"{"first":true}"#));
    assert_eq!(other.flow(flow_digest(1), "signin", 1_000).await.expect("flow"), None, "the kind was kept");
    assert_eq!(other.flow(flow_digest(1), "connect", 1_999).await.expect("flow").as_deref(), Some(r#"{"first":true}"#));
    assert_eq!(other.flow(flow_digest(1), "connect", 2_000).await.expect("flow"), None, "the expiry was kept");
    expect_invalid(store.put_flow(flow_digest(1), "connect", "{}", 9_000).await, "an expired, unpurged digest");
    assert_eq!(store.purge_flows(2_000, 10).await.expect("purge_flows"), 1);
    store.put_flow(flow_digest(1), "connect", r#"{"again":true}"#, 9_000).await.expect("put_flow after purge");
    assert_eq!(
        store.take_flow(flow_digest(1), "connect", 3_000).await.expect("take").as_deref(),
        Some(r#"{"again":true}"#)
    );
    store.put_flow(flow_digest(1), "connect", "{}", 9_000).await.expect("put_flow after take");
    other.close().await;
    fixture.cleanup().await;
}

/// A purge deletes only flows whose expiry is at or before `now_ms` (the exact instant included),
/// at most `limit` per call; live flows stay readable and takable.
pub async fn flow_purge_takes_only_expired_flows_and_is_bounded(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let store = store.as_ref();
    let expiries = [(1, 1_000), (2, 1_999), (3, 2_000), (4, 2_001), (5, 3_000), (6, 3_000), (7, 3_000), (8, 3_001)];
    for (n, expires_ms) in expiries {
        store.put_flow(flow_digest(n), "state", &format!("{n}"), expires_ms).await.expect("put_flow");
    }
    assert_eq!(store.purge_flows(999, 10).await.expect("purge_flows"), 0, "nothing expired yet");
    assert_eq!(store.purge_flows(2_000, 0).await.expect("purge_flows"), 0, "limit 0");
    assert_eq!(store.purge_flows(2_000, 10).await.expect("purge_flows"), 3, "1, 2 and 3 (at the instant)");
    assert_eq!(store.purge_flows(2_000, 10).await.expect("purge_flows"), 0);
    for n in 1..=3 {
        assert_eq!(store.flow(flow_digest(n), "state", 0).await.expect("flow"), None, "{n} was purged");
    }
    for n in 4..=8 {
        let body = store.flow(flow_digest(n), "state", 2_000).await.expect("flow");
        assert_eq!(body, Some(format!("{n}")), "{n} must survive the purge");
    }
    assert_eq!(store.purge_flows(3_000, 2).await.expect("purge_flows"), 2, "bounded by the limit");
    assert_eq!(store.purge_flows(3_000, 2).await.expect("purge_flows"), 2);
    assert_eq!(store.purge_flows(3_000, 2).await.expect("purge_flows"), 0, "only 8 is left, live");
    assert_eq!(store.take_flow(flow_digest(8), "state", 3_000).await.expect("take_flow"), Some("8".into()), "live");
    fixture.cleanup().await;
}

/// A registration reads back for its issuer and redirect URI only, from either instance, and a
/// second put replaces it.
pub async fn oauth_client_registrations_round_trip_and_are_replaced(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let issuer = "https://auth.github.example";
    let callback = "https://gateway.example/oauth/callback";
    assert_eq!(store.oauth_client(issuer, callback).await.expect("oauth_client"), None);
    let first = r#"{"client_id":"abc","client_id_issued_at":1}"#;
    store.put_oauth_client(issuer, callback, first, 1_000).await.expect("put_oauth_client");
    store.put_oauth_client(issuer, "https://other.example/cb", "{}", 1_000).await.expect("put_oauth_client");
    store.put_oauth_client("https://auth.linear.example", callback, "[]", 1_000).await.expect("put_oauth_client");
    assert_eq!(other.oauth_client(issuer, callback).await.expect("oauth_client").as_deref(), Some(first));
    assert_eq!(other.oauth_client(issuer, "https://gateway.example/oauth/callback/").await.expect("get"), None);
    assert_eq!(other.oauth_client("https://auth.github.example/", callback).await.expect("get"), None);
    let second = r#"{"client_id":"def","client_id_issued_at":2}"#;
    other.put_oauth_client(issuer, callback, second, 2_000).await.expect("put_oauth_client");
    assert_eq!(store.oauth_client(issuer, callback).await.expect("oauth_client").as_deref(), Some(second));
    let unchanged = store.oauth_client(issuer, "https://other.example/cb").await.expect("oauth_client");
    assert_eq!(unchanged.as_deref(), Some("{}"), "other registrations stay");
    let largest = format!(r#"{{"x":"{}"}}"#, "b".repeat(crate::MAX_OAUTH_BODY_BYTES - 8));
    store.put_oauth_client(issuer, callback, &largest, 3_000).await.expect("the largest body fits");
    assert_eq!(store.oauth_client(issuer, callback).await.expect("oauth_client"), Some(largest));
    other.close().await;
    fixture.cleanup().await;
}

/// `InvalidRecord`, with a text that quotes none of the values the checks plant (`hunter2`).
fn expect_quiet_invalid<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    if let Err(error) = &result {
        let text = format!("{error} {error:?}");
        assert!(!text.contains("hunter2"), "{what}: the reason quotes a value: {text}");
    }
    expect_invalid(result, what);
}

/// Breaks one field of a connection.
type BreakConnection = fn(&mut ConnectionRow);

/// Every invalid argument is `InvalidRecord` with a reason that quotes no value, and nothing is
/// written: no connection put or replaced, no approval, flow or registration stored or removed.
pub async fn invalid_connection_inputs_are_refused_and_nothing_is_written(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let store = store.as_ref();
    store.put_connection(&sample_connection(1, "github", 1_000, 0)).await.expect("put_connection");
    store.approve_client(connection_principal(1), "github", "cursor", 1_000).await.expect("approve_client");
    store.put_flow(flow_digest(1), "connect", "{}", 9_000).await.expect("put_flow");
    let before = connection_rows(store).await;
    let broken: Vec<(&str, BreakConnection)> = vec![
        ("control character in the label", |row| row.principal = "hunter2\u{1b}[2J".into()),
        ("too-long label", |row| row.principal = "p".repeat(crate::MAX_CONNECTION_TEXT_BYTES + 1)),
        ("empty upstream", |row| row.upstream.clear()),
        ("too-long upstream", |row| row.upstream = "u".repeat(crate::MAX_CONNECTION_UPSTREAM_BYTES + 1)),
        ("control character in the upstream", |row| row.upstream = "github\n".into()),
        ("empty issuer", |row| row.issuer.clear()),
        ("control character in the issuer", |row| row.issuer = "https://hunter2.example/\u{0}".into()),
        ("empty client id", |row| row.client_id.clear()),
        ("too-long client id", |row| row.client_id = "c".repeat(crate::MAX_CONNECTION_TEXT_BYTES + 1)),
        ("a quote in the scopes", |row| row.scopes = "read \"hunter2\"".into()),
        ("too-long scopes", |row| row.scopes = "s".repeat(crate::MAX_CONNECTION_SCOPES_BYTES + 1)),
        ("empty sealed tokens", |row| row.sealed.clear()),
        ("too-large sealed tokens", |row| row.sealed = vec![1; crate::MAX_CONNECTION_SEALED_BYTES + 1]),
        ("negative creation", |row| row.created_ms = -1),
        ("update before creation", |row| row.updated_ms = row.created_ms - 1),
        ("negative expiry", |row| row.expires_ms = Some(-5)),
    ];
    for (what, break_it) in broken {
        for upstream in ["github", "linear"] {
            let mut row = sample_connection(1, upstream, 1_000, 9);
            break_it(&mut row);
            let put = store.put_connection(&row).await;
            expect_quiet_invalid(put, what);
            let replaced = store.replace_connection(&row, 1).await;
            expect_quiet_invalid(replaced, what);
            assert_eq!(connection_rows(store).await, before, "{what}: something was written");
        }
    }
    let current = sample_connection(1, "github", 1_000, 9);
    expect_invalid(store.replace_connection(&current, 0).await, "expected version 0");
    expect_invalid(store.replace_connection(&current, -1).await, "expected version -1");

    let long_upstream = "u".repeat(crate::MAX_CONNECTION_UPSTREAM_BYTES + 1);
    let long_client = "c".repeat(crate::MAX_CONNECTION_TEXT_BYTES + 1);
    let key = connection_principal(1);
    for (upstream, client) in [
        ("", "cursor"),
        (long_upstream.as_str(), "cursor"),
        ("github", ""),
        ("github", &long_client),
        ("git\u{7f}hub", "cursor"),
        ("github", "hunter2\r"),
    ] {
        let what = "a bad upstream or client id";
        let approved = store.approve_client(key, upstream, client, 2_000).await;
        expect_quiet_invalid(approved, what);
        expect_invalid(store.client_approved(key, upstream, client).await, what);
        expect_invalid(store.revoke_client(key, upstream, client).await, what);
        if client == "cursor" {
            expect_invalid(store.connection(key, upstream).await, what);
            expect_invalid(store.delete_connection(key, upstream).await, what);
        }
    }
    expect_invalid(store.connection(key, "").await, "an empty upstream");
    expect_invalid(store.delete_connection(key, &long_upstream).await, "a too-long upstream");
    expect_invalid(store.approve_client(key, "github", "zed", -1).await, "a negative approval time");

    let too_large = format!("\"{}\"", "b".repeat(crate::MAX_OAUTH_BODY_BYTES));
    let long_kind = "k".repeat(crate::MAX_FLOW_KIND_BYTES + 1);
    for (kind, body, expires_ms, what) in [
        ("", "{}", 9_000, "an empty kind"),
        ("sign in", "{}", 9_000, "a kind with a space"),
        (long_kind.as_str(), "{}", 9_000, "a too-long kind"),
        ("connect", "", 9_000, "an empty body"),
        ("connect", "{hunter2", 9_000, "a body that is not JSON"),
        ("connect", too_large.as_str(), 9_000, "a too-large body"),
        ("connect", "{}", -1, "a negative expiry"),
    ] {
        let put = store.put_flow(flow_digest(2), kind, body, expires_ms).await;
        expect_quiet_invalid(put, what);
    }
    for kind in ["", "état", "hunter2 "] {
        expect_invalid(store.flow(flow_digest(1), kind, 1_000).await, "flow with a bad kind");
        expect_invalid(store.take_flow(flow_digest(1), kind, 1_000).await, "take_flow with a bad kind");
    }
    assert_eq!(store.flow(flow_digest(2), "connect", 1_000).await.expect("flow"), None, "no flow was stored");
    assert_eq!(store.flow(flow_digest(1), "connect", 1_000).await.expect("flow"), Some("{}".into()), "not taken");

    let issuer = "https://as.example";
    let callback = "https://gateway.example/cb";
    for (issuer, callback, body, now_ms, what) in [
        ("", callback, "{}", 1_000, "an empty issuer"),
        (issuer, "", "{}", 1_000, "an empty redirect URI"),
        ("https://hunter2.example\n", callback, "{}", 1_000, "a control character in the issuer"),
        (issuer, long_client.as_str(), "{}", 1_000, "a too-long redirect URI"),
        (issuer, callback, "{hunter2", 1_000, "a body that is not JSON"),
        (issuer, callback, too_large.as_str(), 1_000, "a too-large body"),
        (issuer, callback, "{}", -1, "a negative time"),
    ] {
        let put = store.put_oauth_client(issuer, callback, body, now_ms).await;
        expect_quiet_invalid(put, what);
    }
    expect_invalid(store.oauth_client("", callback).await, "oauth_client with an empty issuer");
    assert_eq!(store.oauth_client(issuer, callback).await.expect("oauth_client"), None, "nothing registered");
    assert_eq!(connection_rows(store).await, before, "a refused call wrote something");
    fixture.cleanup().await;
}

/// A store that is down refuses every connection operation with `Unavailable` (fail closed): no
/// connection, approval, flow or registration is answered, and the refused calls wrote or
/// consumed nothing.
pub async fn closed_store_refuses_connection_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let key = connection_principal(1);
    let row = sample_connection(1, "github", 1_000, 0);
    store.put_connection(&row).await.expect("put_connection");
    store.approve_client(key, "github", "cursor", 1_000).await.expect("approve_client");
    store.put_flow(flow_digest(1), "connect", "{}", 9_000).await.expect("put_flow");
    store.put_oauth_client("https://as.example", "https://gw.example/cb", "{}", 1_000).await.expect("register");
    let before = connection_rows(other.as_ref()).await;
    store.close().await;
    let newer = sample_connection(1, "github", 1_000, 5);
    expect_unavailable(store.put_connection(&newer).await, "put_connection");
    expect_unavailable(store.connection(key, "github").await, "connection");
    expect_unavailable(store.replace_connection(&newer, 1).await, "replace_connection");
    expect_unavailable(store.connections(None, 10).await, "connections");
    expect_unavailable(store.connections(Some(key), 10).await, "connections of a principal");
    expect_unavailable(store.delete_connection(key, "github").await, "delete_connection");
    expect_unavailable(store.delete_connections_of(key).await, "delete_connections_of");
    expect_unavailable(store.approve_client(key, "github", "zed", 2_000).await, "approve_client");
    expect_unavailable(store.client_approved(key, "github", "cursor").await, "client_approved");
    expect_unavailable(store.approved_clients(None, 10).await, "approved_clients");
    expect_unavailable(store.approved_clients(Some(key), 10).await, "approved_clients of a principal");
    expect_unavailable(store.revoke_client(key, "github", "cursor").await, "revoke_client");
    expect_unavailable(store.put_flow(flow_digest(2), "connect", "{}", 9_000).await, "put_flow");
    expect_unavailable(store.flow(flow_digest(1), "connect", 1_000).await, "flow");
    expect_unavailable(store.take_flow(flow_digest(1), "connect", 1_000).await, "take_flow");
    expect_unavailable(store.purge_flows(i64::MAX, 10).await, "purge_flows");
    expect_unavailable(
        store.put_oauth_client("https://as.example", "https://gw.example/cb", "[]", 2_000).await,
        "put_oauth_client",
    );
    expect_unavailable(store.oauth_client("https://as.example", "https://gw.example/cb").await, "oauth_client");
    assert_eq!(connection_rows(other.as_ref()).await, before, "a refused call wrote something");
    assert_eq!(expect_connection(other.as_ref(), 1, "github").await, row);
    assert_eq!(
        other.take_flow(flow_digest(1), "connect", 1_000).await.expect("take_flow"),
        Some("{}".into()),
        "not taken"
    );
    assert_eq!(other.flow(flow_digest(2), "connect", 1_000).await.expect("flow"), None, "no flow was stored");
    let registration = other.oauth_client("https://as.example", "https://gw.example/cb").await.expect("oauth_client");
    assert_eq!(registration.as_deref(), Some("{}"), "the registration was not replaced");
    other.close().await;
    fixture.cleanup().await;
}
