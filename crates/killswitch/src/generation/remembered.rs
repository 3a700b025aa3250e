//! [`RememberedGenerations`]: the generation store as one instance sees it, with what this
//! instance itself accepted kept in memory, so a batch that only repeats heads it accepted a
//! moment ago is answered without a store round trip (the common case: the same targets, the
//! same generations, call after call).
//!
//! What is skipped, and why that is sound within the window (SECURITY.md, "Kill switch: the
//! generation store's replay window"):
//! - a record equal (generation and state digest) to one this instance offered and the store
//!   accepted (or found already there) less than `window` ago is a `Replay` without asking the
//!   store: the store cannot have gone below it (it is monotonic), and within one instance the
//!   same head accepted again changes nothing;
//! - what it can miss is another instance having accepted a *higher* generation of that subject
//!   inside the window, and so a rollback (an authority answering the older state after a newer
//!   one was seen elsewhere) goes unnoticed here for at most `window`. An honest authority never
//!   answers a generation below its own current one, so this needs an authority that lost state;
//!   the next store round trip (at most `window` later) refuses it, as before.
//! - a lower generation than one remembered is `Stale` at once, and the same generation with
//!   another digest `Conflict`, without the store (the store would answer the same, or worse).
//!
//! Anything else (a new subject, a higher generation, an entry older than the window) goes to
//! the store, and only an all-acceptable answer refreshes what is remembered. A zero window turns
//! the memory off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use palisade_base::clock::Clock;

use super::{GenerationRecord, GenerationStore, GenerationSubject, MonotonicOutcome, StoreFuture, validate_batch};

/// How long an accepted record is trusted without the store, by default: one second.
pub const DEFAULT_REPLAY_WINDOW_MS: u64 = 1_000;

/// Most subjects remembered; beyond it the memory is cleared and starts again (every subject is
/// then one store round trip away from being remembered again).
const MAX_REMEMBERED: usize = 65_536;

#[derive(Clone)]
struct Remembered {
    generation: u64,
    digest: String,
    confirmed_ms: i64,
}

/// A [`GenerationStore`] in front of the shared one, remembering what this instance accepted.
pub struct RememberedGenerations {
    store: Arc<dyn GenerationStore>,
    clock: Arc<dyn Clock>,
    window_ms: std::sync::atomic::AtomicU64,
    /// Per authority, per subject.
    accepted: Mutex<HashMap<String, HashMap<GenerationSubject, Remembered>>>,
}

impl std::fmt::Debug for RememberedGenerations {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("RememberedGenerations").finish_non_exhaustive()
    }
}

enum Local {
    /// Every record repeats a remembered one inside the window.
    AllReplays,
    /// One record is below (or conflicts with) what is remembered: the outcome of each.
    Refused(Vec<MonotonicOutcome>),
    /// The store must answer.
    AskStore,
}

impl RememberedGenerations {
    /// Remembers for `window_ms` (see [`DEFAULT_REPLAY_WINDOW_MS`]; 0: never).
    pub fn new(store: Arc<dyn GenerationStore>, clock: Arc<dyn Clock>, window_ms: u64) -> Self {
        Self { store, clock, window_ms: window_ms.into(), accepted: Mutex::default() }
    }

    /// Changes the window (0 turns the memory off; what is remembered is kept).
    pub fn set_window_ms(&self, window_ms: u64) {
        self.window_ms.store(window_ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn window_ms(&self) -> i64 {
        i64::try_from(self.window_ms.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(i64::MAX)
    }

    fn local(&self, records: &[GenerationRecord], now_ms: i64) -> Local {
        let window_ms = self.window_ms();
        if window_ms == 0 {
            return Local::AskStore;
        }
        let accepted = self.accepted.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all_replays = true;
        let mut refused = false;
        let outcomes: Vec<MonotonicOutcome> = records
            .iter()
            .map(|record| {
                match accepted.get(record.authority.as_str()).and_then(|subjects| subjects.get(&record.subject)) {
                    Some(known) => {
                        let outcome = super::decide(Some((known.generation, &known.digest)), record);
                        let fresh = now_ms.saturating_sub(known.confirmed_ms) < window_ms;
                        all_replays &= outcome == MonotonicOutcome::Replay && fresh;
                        refused |= !outcome.is_acceptable();
                        outcome
                    }
                    None => {
                        all_replays = false;
                        MonotonicOutcome::Accepted
                    }
                }
            })
            .collect();
        if refused {
            Local::Refused(outcomes)
        } else if all_replays {
            Local::AllReplays
        } else {
            Local::AskStore
        }
    }

    fn remember(&self, records: &[GenerationRecord], now_ms: i64) {
        let mut accepted = self.accepted.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(authority) = records.first().map(|record| record.authority.as_str()) else { return };
        // A batch is of one authority (validated).
        let subjects = accepted.entry(authority.to_owned()).or_default();
        if subjects.len() + records.len() > MAX_REMEMBERED {
            subjects.clear();
        }
        for record in records {
            let entry =
                Remembered { generation: record.generation, digest: record.digest.clone(), confirmed_ms: now_ms };
            match subjects.get_mut(&record.subject) {
                // Another batch may have confirmed a higher one meanwhile: never go back.
                Some(known) if known.generation > record.generation => {}
                Some(known) => *known = entry,
                None => {
                    subjects.insert(record.subject.clone(), entry);
                }
            }
        }
    }

    async fn accept(&self, records: &[GenerationRecord]) -> Result<Vec<MonotonicOutcome>, super::GenerationStoreError> {
        validate_batch(records)?;
        let asked_ms = self.clock.now_ms();
        match self.local(records, asked_ms) {
            Local::AllReplays => return Ok(vec![MonotonicOutcome::Replay; records.len()]),
            Local::Refused(outcomes) => return Ok(outcomes),
            Local::AskStore => {}
        }
        let outcomes = self.store.accept_all(records).await?;
        if self.window_ms() > 0
            && outcomes.len() == records.len()
            && outcomes.iter().all(|outcome| outcome.is_acceptable())
        {
            // Confirmed as of when the store was asked, not when it answered.
            self.remember(records, asked_ms);
        }
        Ok(outcomes)
    }
}

impl GenerationStore for RememberedGenerations {
    fn accept_all<'a>(&'a self, records: &'a [GenerationRecord]) -> StoreFuture<'a, Vec<MonotonicOutcome>> {
        Box::pin(self.accept(records))
    }
}

#[cfg(test)]
mod tests;
