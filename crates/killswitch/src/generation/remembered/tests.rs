//! Unit tests of the remembered generations: what reaches the shared store and what does not,
//! and the split view bounded by the window.

use std::sync::atomic::{AtomicUsize, Ordering};

use palisade_base::clock::ManualClock;

use super::*;
use crate::generation::SqliteGenerationStore;
use crate::target::{TargetDigest, TargetKind};

const AUTHORITY: &str = "auth-1";

/// The shared store, counting the batches that reach it.
struct Counted {
    store: SqliteGenerationStore,
    asked: AtomicUsize,
}

impl GenerationStore for Counted {
    fn accept_all<'a>(&'a self, records: &'a [GenerationRecord]) -> StoreFuture<'a, Vec<MonotonicOutcome>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.store.accept_all(records)
    }
}

fn subject(seed: u8) -> GenerationSubject {
    GenerationSubject::Target(TargetDigest { kind: TargetKind::Tool, digest: crate::envelope::sha256_hex(&[seed]) })
}

fn record(seed: u8, generation: u64, state: &str) -> GenerationRecord {
    GenerationRecord {
        authority: AUTHORITY.to_owned(),
        subject: subject(seed),
        generation,
        digest: crate::envelope::sha256_hex(format!("{seed}/{generation}/{state}").as_bytes()),
        state: state.to_owned(),
    }
}

async fn setup(window_ms: u64) -> (Arc<Counted>, Arc<ManualClock>, RememberedGenerations) {
    let shared = Arc::new(Counted {
        store: SqliteGenerationStore::open("sqlite::memory:").await.unwrap(),
        asked: AtomicUsize::new(0),
    });
    let clock = Arc::new(ManualClock::new(1_000_000));
    let remembered = RememberedGenerations::new(shared.clone(), clock.clone(), window_ms);
    (shared, clock, remembered)
}

async fn offer(store: &dyn GenerationStore, records: &[GenerationRecord]) -> Vec<MonotonicOutcome> {
    store.accept_all(records).await.unwrap()
}

#[tokio::test]
async fn it_is_a_conforming_generation_store() {
    let (_, _, remembered) = setup(DEFAULT_REPLAY_WINDOW_MS).await;
    crate::generation::conformance::run_all(&remembered, "conformance-remembered").await;
}

#[tokio::test]
async fn repeats_inside_the_window_do_not_reach_the_store() {
    let (shared, clock, remembered) = setup(1_000).await;
    let batch = [record(1, 3, "ENABLE"), record(2, 1, "ENABLE")];
    assert_eq!(offer(&remembered, &batch).await, [MonotonicOutcome::Accepted; 2]);
    assert_eq!(shared.asked.load(Ordering::SeqCst), 1);
    for _ in 0..5 {
        assert_eq!(offer(&remembered, &batch).await, [MonotonicOutcome::Replay; 2]);
        assert_eq!(offer(&remembered, &batch[1..]).await, [MonotonicOutcome::Replay]);
    }
    assert_eq!(shared.asked.load(Ordering::SeqCst), 1, "repeats answered from memory");
    // One new subject in the batch: the whole batch goes to the store (all-or-nothing there).
    assert_eq!(
        offer(&remembered, &[record(1, 3, "ENABLE"), record(3, 1, "ENABLE")]).await,
        [MonotonicOutcome::Replay, MonotonicOutcome::Accepted]
    );
    assert_eq!(shared.asked.load(Ordering::SeqCst), 2);
    // A higher generation (a DISABLE) always reaches the store, and is what is remembered next.
    assert_eq!(offer(&remembered, &[record(1, 4, "DISABLE")]).await, [MonotonicOutcome::Accepted]);
    assert_eq!(shared.asked.load(Ordering::SeqCst), 3);
    assert_eq!(offer(&remembered, &[record(1, 4, "DISABLE")]).await, [MonotonicOutcome::Replay]);
    assert_eq!(shared.asked.load(Ordering::SeqCst), 3);
    // Past the window, the store is asked again (and confirms).
    clock.set_ms(1_000_000 + 1_000);
    assert_eq!(offer(&remembered, &[record(1, 4, "DISABLE")]).await, [MonotonicOutcome::Replay]);
    assert_eq!(shared.asked.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn lower_and_conflicting_records_are_refused_from_memory_and_change_nothing() {
    let (shared, _, remembered) = setup(1_000).await;
    offer(&remembered, &[record(1, 5, "ENABLE")]).await;
    let asked = shared.asked.load(Ordering::SeqCst);
    assert_eq!(offer(&remembered, &[record(1, 4, "ENABLE")]).await, [MonotonicOutcome::Stale]);
    let mut conflicting = record(1, 5, "ENABLE");
    conflicting.digest = "ab".repeat(32);
    assert_eq!(
        offer(&remembered, &[record(2, 1, "ENABLE"), conflicting]).await,
        [MonotonicOutcome::Accepted, MonotonicOutcome::Conflict]
    );
    assert_eq!(shared.asked.load(Ordering::SeqCst), asked, "decided from memory");
    // Nothing of the refused batch was written: subject 2 is still new to the store.
    assert_eq!(offer(&shared.store, &[record(2, 1, "ENABLE")]).await, [MonotonicOutcome::Accepted]);
}

/// The split view SECURITY.md describes: another instance accepted a higher generation; this
/// one answers its own remembered record as a replay until the window ends, then the store
/// refuses it.
#[tokio::test]
async fn another_instances_higher_generation_is_seen_at_most_one_window_late() {
    let (shared, clock, remembered) = setup(1_000).await;
    offer(&remembered, &[record(1, 1, "ENABLE")]).await;
    // Another instance, on the same shared store.
    assert_eq!(offer(&shared.store, &[record(1, 5, "DISABLE")]).await, [MonotonicOutcome::Accepted]);
    clock.set_ms(1_000_000 + 999);
    assert_eq!(offer(&remembered, &[record(1, 1, "ENABLE")]).await, [MonotonicOutcome::Replay]);
    clock.set_ms(1_000_000 + 1_000);
    assert_eq!(offer(&remembered, &[record(1, 1, "ENABLE")]).await, [MonotonicOutcome::Stale]);
    // A refusal is not remembered: the next offer asks the store again.
    let asked = shared.asked.load(Ordering::SeqCst);
    assert_eq!(offer(&remembered, &[record(1, 1, "ENABLE")]).await, [MonotonicOutcome::Stale]);
    assert_eq!(shared.asked.load(Ordering::SeqCst), asked + 1);
}

#[tokio::test]
async fn a_zero_window_asks_the_store_every_time() {
    let (shared, _, remembered) = setup(0).await;
    for _ in 0..3 {
        offer(&remembered, &[record(1, 1, "ENABLE")]).await;
    }
    assert_eq!(shared.asked.load(Ordering::SeqCst), 3);
    remembered.set_window_ms(1_000);
    offer(&remembered, &[record(1, 1, "ENABLE")]).await;
    offer(&remembered, &[record(1, 1, "ENABLE")]).await;
    assert_eq!(shared.asked.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn an_invalid_batch_is_refused_before_memory_or_store() {
    let (shared, _, remembered) = setup(1_000).await;
    assert!(remembered.accept_all(&[]).await.is_err());
    let mut bad = record(1, 1, "ENABLE");
    bad.generation = 0;
    assert!(remembered.accept_all(&[bad]).await.is_err());
    assert_eq!(shared.asked.load(Ordering::SeqCst), 0);
}
