//! The generation-store conformance suite: one set of checks every backend must pass. Backends'
//! tests call [`run_all`] with a fresh store and an authority id no other run uses.

use super::{GenerationRecord, GenerationStore, GenerationStoreError, GenerationSubject, MonotonicOutcome};
use crate::target::{TargetDigest, TargetKind};

fn digest(seed: u8) -> String {
    crate::envelope::sha256_hex(&[seed])
}

fn target(seed: u8) -> GenerationSubject {
    GenerationSubject::Target(TargetDigest { kind: TargetKind::Tool, digest: digest(seed.wrapping_add(100)) })
}

fn record(
    authority: &str,
    subject: GenerationSubject,
    generation: u64,
    digest_seed: u8,
    state: &str,
) -> GenerationRecord {
    GenerationRecord {
        authority: authority.to_owned(),
        subject,
        generation,
        digest: digest(digest_seed),
        state: state.to_owned(),
    }
}

async fn one(store: &dyn GenerationStore, record: GenerationRecord) -> Result<MonotonicOutcome, GenerationStoreError> {
    let outcomes = store.accept_all(std::slice::from_ref(&record)).await?;
    match outcomes.as_slice() {
        [outcome] => Ok(*outcome),
        _ => Err(GenerationStoreError::Corrupt { what: "outcome count" }),
    }
}

/// Runs every check; panics (test failure) with the name of the first that fails.
pub async fn run_all(store: &dyn GenerationStore, authority: &str) {
    monotonic_rules(store, authority).await;
    batches_are_all_or_nothing(store, authority).await;
    invalid_batches_refused(store, authority).await;
    authorities_are_separate(store, authority).await;
}

/// STALE / CONFLICT / REPLAY / ACCEPTED, per record.
pub async fn monotonic_rules(store: &dyn GenerationStore, authority: &str) {
    let subject = target(1);
    let outcome = |generation, seed, state| one(store, record(authority, subject.clone(), generation, seed, state));
    assert_eq!(outcome(5, 1, "ENABLE").await.expect("first"), MonotonicOutcome::Accepted, "first accept");
    assert_eq!(outcome(5, 1, "ENABLE").await.expect("replay"), MonotonicOutcome::Replay, "same generation and digest");
    assert_eq!(
        outcome(5, 2, "DISABLE").await.expect("conflict"),
        MonotonicOutcome::Conflict,
        "same generation, other digest"
    );
    assert_eq!(outcome(4, 3, "ENABLE").await.expect("stale"), MonotonicOutcome::Stale, "lower generation");
    assert_eq!(outcome(6, 4, "DISABLE").await.expect("newer"), MonotonicOutcome::Accepted, "higher generation");
    assert_eq!(
        outcome(5, 1, "ENABLE").await.expect("old replay"),
        MonotonicOutcome::Stale,
        "the old head is now stale"
    );
    assert_eq!(outcome(7, 5, "ENABLE").await.expect("re-enable"), MonotonicOutcome::Accepted, "newer re-enable");
    let policy =
        |generation, seed| one(store, record(authority, GenerationSubject::Policy, generation, seed, "POLICY"));
    assert_eq!(policy(3, 9).await.expect("policy"), MonotonicOutcome::Accepted, "policy is its own subject");
    assert_eq!(policy(2, 8).await.expect("policy"), MonotonicOutcome::Stale, "lower policy generation");
}

/// A batch with one STALE record writes none of its records.
pub async fn batches_are_all_or_nothing(store: &dyn GenerationStore, authority: &str) {
    let first = target(20);
    let second = target(21);
    let outcomes = store
        .accept_all(&[
            record(authority, first.clone(), 2, 20, "ENABLE"),
            record(authority, second.clone(), 2, 21, "ENABLE"),
        ])
        .await
        .expect("batch");
    assert_eq!(outcomes, vec![MonotonicOutcome::Accepted, MonotonicOutcome::Accepted]);
    let outcomes = store
        .accept_all(&[
            record(authority, first.clone(), 3, 22, "ENABLE"),
            record(authority, second.clone(), 1, 23, "ENABLE"),
        ])
        .await
        .expect("batch");
    assert_eq!(outcomes, vec![MonotonicOutcome::Accepted, MonotonicOutcome::Stale]);
    // Generation 3 of `first` was not written: offering it again is ACCEPTED, not REPLAY.
    assert_eq!(
        one(store, record(authority, first, 3, 24, "ENABLE")).await.expect("after refused batch"),
        MonotonicOutcome::Accepted,
        "a refused batch writes nothing"
    );
}

/// Malformed batches never reach the backend.
pub async fn invalid_batches_refused(store: &dyn GenerationStore, authority: &str) {
    let invalid = |result: Result<Vec<MonotonicOutcome>, GenerationStoreError>| {
        matches!(result, Err(GenerationStoreError::InvalidRequest { .. }))
    };
    assert!(invalid(store.accept_all(&[]).await), "empty");
    assert!(invalid(store.accept_all(&[record(authority, target(30), 0, 1, "ENABLE")]).await), "zero generation");
    assert!(invalid(store.accept_all(&[record(authority, target(30), 1 << 53, 1, "ENABLE")]).await), "2^53");
    assert!(invalid(store.accept_all(&[record(authority, target(30), 1, 1, "MAYBE")]).await), "state");
    let other = format!("{authority}-other");
    assert!(
        invalid(
            store
                .accept_all(&[
                    record(authority, target(30), 1, 1, "ENABLE"),
                    record(&other, target(31), 1, 1, "ENABLE")
                ])
                .await
        ),
        "mixed authorities"
    );
    assert!(
        invalid(
            store
                .accept_all(&[
                    record(authority, target(30), 1, 1, "ENABLE"),
                    record(authority, target(30), 2, 1, "ENABLE")
                ])
                .await
        ),
        "duplicate subject"
    );
}

/// One authority's generations do not affect another's.
pub async fn authorities_are_separate(store: &dyn GenerationStore, authority: &str) {
    let other = format!("{authority}-separate");
    assert_eq!(one(store, record(authority, target(40), 9, 1, "ENABLE")).await.expect("a"), MonotonicOutcome::Accepted);
    assert_eq!(one(store, record(&other, target(40), 1, 2, "ENABLE")).await.expect("b"), MonotonicOutcome::Accepted);
}
