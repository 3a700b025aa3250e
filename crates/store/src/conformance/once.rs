//! The single-use record store's checks: exactly one first use, expiry, bounded purge.

use super::*;

/// A digest numbered `n`, with a last byte that differs from every other test digest's.
fn once_digest(n: u8) -> [u8; 32] {
    let mut digest = [n; 32];
    digest[31] = n.wrapping_mul(31).wrapping_add(7);
    digest
}

/// The first use is `true`, every later one `false`, from this instance or another; another
/// digest (even one bit away) is its own first use.
pub async fn once_record_is_used_exactly_once(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    assert!(store.consume_once(once_digest(1), 10_000).await.expect("consume"), "first use");
    assert!(!store.consume_once(once_digest(1), 10_000).await.expect("consume"), "second use");
    assert!(!other.consume_once(once_digest(1), 10_000).await.expect("consume"), "second use, another instance");
    assert!(!store.consume_once(once_digest(1), 20_000).await.expect("consume"), "a later expiry is no new use");
    assert!(other.consume_once(once_digest(2), 10_000).await.expect("consume"), "another digest");
    assert!(!store.consume_once(once_digest(2), 10_000).await.expect("consume"), "seen from the first instance");
    let mut near = once_digest(1);
    near[0] ^= 1;
    assert!(store.consume_once(near, 10_000).await.expect("consume"), "a near-miss digest is another record");
    other.close().await;
    fixture.cleanup().await;
}

/// Expiry never re-allows: a record past its expiry but not purged yet still answers `false`;
/// only once purged can the digest be used again.
pub async fn expired_once_record_stays_used_until_purged(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    assert!(store.consume_once(once_digest(1), 1_000).await.expect("consume"));
    // `expires_ms` is in the past for any caller's clock; the store has no clock of its own.
    assert!(!store.consume_once(once_digest(1), 1_000).await.expect("consume"), "expired, not purged");
    assert!(!store.consume_once(once_digest(1), i64::MAX).await.expect("consume"), "expired, not purged");
    // The second call did not extend the record: it goes with the first expiry.
    assert_eq!(store.purge_once(999, 10).await.expect("purge"), 0);
    assert!(!store.consume_once(once_digest(1), 1_000).await.expect("consume"));
    assert_eq!(store.purge_once(1_000, 10).await.expect("purge"), 1);
    assert!(store.consume_once(once_digest(1), 5_000).await.expect("consume"), "purged: usable again");
    fixture.cleanup().await;
}

/// A purge deletes only records whose expiry is at or before `now_ms` (the exact instant
/// included), at most `limit` per call; the rest stay used.
pub async fn once_purge_takes_only_expired_records_and_is_bounded(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let expiries = [(1, 1_000), (2, 1_999), (3, 2_000), (4, 2_001), (5, 3_000), (6, 3_000), (7, 3_000)];
    for (n, expires_ms) in expiries {
        assert!(store.consume_once(once_digest(n), expires_ms).await.expect("consume"), "{n}");
    }
    assert_eq!(store.purge_once(999, 10).await.expect("purge"), 0, "nothing expired yet");
    assert_eq!(store.purge_once(2_000, 0).await.expect("purge"), 0, "limit 0");
    assert_eq!(store.purge_once(2_000, 10).await.expect("purge"), 3, "1, 2 and 3 (at the instant)");
    assert_eq!(store.purge_once(2_000, 10).await.expect("purge"), 0);
    for n in 4..=7 {
        assert!(!store.consume_once(once_digest(n), 9_000).await.expect("consume"), "{n} must survive the purge");
    }
    assert_eq!(store.purge_once(3_000, 2).await.expect("purge"), 2, "bounded by the limit");
    assert_eq!(store.purge_once(3_000, 2).await.expect("purge"), 2);
    assert_eq!(store.purge_once(3_000, 2).await.expect("purge"), 0);
    for n in 1..=7 {
        assert!(store.consume_once(once_digest(n), 9_000).await.expect("consume"), "{n} was purged");
    }
    fixture.cleanup().await;
}

/// 16 concurrent claims of one digest, spread over two instances: exactly one is the first use.
/// Repeated over several digests so that a lucky interleaving does not hide a race.
pub async fn racing_consumers_of_one_digest_get_exactly_one_first_use(harness: &dyn Harness) {
    const RACERS: usize = 16;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    for round in 1..=5u8 {
        let digest = once_digest(round);
        let mut tasks = tokio::task::JoinSet::new();
        for racer in 0..RACERS {
            let instance = instances[racer % instances.len()].clone();
            tasks.spawn(async move { instance.consume_once(digest, 60_000).await });
        }
        let mut firsts = 0;
        while let Some(joined) = tasks.join_next().await {
            if joined.expect("consumer task").expect("consume_once") {
                firsts += 1;
            }
        }
        assert_eq!(firsts, 1, "round {round}: {firsts} of {RACERS} racing claims were the first use");
        for instance in &instances {
            assert!(!instance.consume_once(digest, 60_000).await.expect("consume"), "round {round}: used");
        }
    }
    instances[1].close().await;
    fixture.cleanup().await;
}

/// A store that is down answers every single-use operation with `Unavailable`, never `true`
/// (fail closed), and a digest refused that way is still usable once the store is back.
pub async fn closed_store_refuses_once_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    assert!(store.consume_once(once_digest(1), 10_000).await.expect("consume"));
    store.close().await;
    expect_unavailable(store.consume_once(once_digest(1), 10_000).await, "consume_once (used digest)");
    expect_unavailable(store.consume_once(once_digest(2), 10_000).await, "consume_once (new digest)");
    expect_unavailable(store.purge_once(20_000, 10).await, "purge_once");
    // The refused calls wrote nothing: the storage still holds the first use only.
    assert!(!other.consume_once(once_digest(1), 10_000).await.expect("consume"));
    assert!(other.consume_once(once_digest(2), 10_000).await.expect("consume"));
    other.close().await;
    fixture.cleanup().await;
}
