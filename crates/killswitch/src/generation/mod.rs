//! The monotonic generation store: for each key (the policy of an authority, or one target's
//! head), the highest generation accepted, with the digest of what was accepted at it.
//!
//! Semantics (per record, as the source document defines them):
//! - incoming generation below the stored one → [`MonotonicOutcome::Stale`];
//! - equal generation, different digest → [`MonotonicOutcome::Conflict`];
//! - equal generation, same digest → [`MonotonicOutcome::Replay`] (accepted, nothing written);
//! - higher generation → [`MonotonicOutcome::Accepted`] (generation, digest and state stored).
//!
//! A batch ([`GenerationStore::accept_all`]) is all-or-nothing: if any record is STALE or
//! CONFLICT nothing of the batch is written. Backends: [`SqliteGenerationStore`] (one
//! `BEGIN IMMEDIATE` transaction) and [`RedisGenerationStore`] (one Lua script run with EVALSHA,
//! keys of one authority sharing one `{authority}` hash slot). Any backend error is an error: the
//! caller fails closed. The kill switch puts [`RememberedGenerations`] in front of the shared
//! store: a batch that only repeats what this instance accepted within the replay window does not
//! reach it.

use std::future::Future;
use std::pin::Pin;

mod redis_store;
mod remembered;
mod sqlite;

#[doc(hidden)]
pub mod conformance;

pub use redis_store::{RedisGenerationStore, RedisOptions};
pub use remembered::{DEFAULT_REPLAY_WINDOW_MS, RememberedGenerations};
pub use sqlite::SqliteGenerationStore;

use crate::policy::{MAX_SAFE_INTEGER, is_authority_id};
use crate::target::TargetDigest;

/// A boxed future, so the trait stays dyn-compatible.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, GenerationStoreError>> + Send + 'a>>;

/// The outcome for one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MonotonicOutcome {
    /// Higher than anything before: stored.
    Accepted,
    /// The same generation and digest as stored: nothing new.
    Replay,
    /// Lower than the stored generation: a rollback.
    Stale,
    /// The stored generation with a different digest: two different states claim one generation.
    Conflict,
}

impl MonotonicOutcome {
    /// Accepted or Replay.
    pub fn is_acceptable(self) -> bool {
        matches!(self, MonotonicOutcome::Accepted | MonotonicOutcome::Replay)
    }
}

/// What a generation is kept for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GenerationSubject {
    /// The policy the server runs under.
    Policy,
    /// The authority's head for one target.
    Target(TargetDigest),
}

impl GenerationSubject {
    /// The subject as stored: `policy` or `head:<kind>:<digest>` (digests only; never raw values).
    pub fn storage_name(&self) -> String {
        match self {
            GenerationSubject::Policy => "policy".to_owned(),
            GenerationSubject::Target(target) => format!("head:{}:{}", target.kind, target.digest),
        }
    }
}

/// One record offered to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationRecord {
    /// The authority id (the key's namespace and, on Redis, its hash slot).
    pub authority: String,
    /// Policy or target.
    pub subject: GenerationSubject,
    /// Positive, at most 2^53 − 1.
    pub generation: u64,
    /// Digest of what is accepted at this generation (64 lowercase hex digits).
    pub digest: String,
    /// `POLICY`, `ENABLE` or `DISABLE`.
    pub state: String,
}

/// Why the store could not answer. Every variant means "refuse".
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GenerationStoreError {
    /// The backend is unreachable, timed out, or failed.
    #[error("generation store unavailable during {during}")]
    Unavailable {
        /// The operation.
        during: &'static str,
        /// The driver's error, for operators' logs.
        #[source]
        source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// The backend answered something impossible.
    #[error("generation store answered an impossible value: {what}")]
    Corrupt {
        /// What.
        what: &'static str,
    },
    /// The batch itself is unusable (empty, zero or oversized generation, mixed authorities,
    /// duplicate keys, bad digest).
    #[error("generation store request invalid: {what}")]
    InvalidRequest {
        /// What.
        what: &'static str,
    },
}

impl GenerationStoreError {
    pub(crate) fn unavailable(during: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        GenerationStoreError::Unavailable { during, source: Some(std::sync::Arc::new(source)) }
    }
}

/// A monotonic generation store shared by every server instance.
pub trait GenerationStore: Send + Sync + 'static {
    /// Offers a batch of records (one authority, distinct subjects) and returns one outcome per
    /// record, in order. All-or-nothing: nothing is written unless every outcome is acceptable.
    fn accept_all<'a>(&'a self, records: &'a [GenerationRecord]) -> StoreFuture<'a, Vec<MonotonicOutcome>>;
}

/// Checks a batch before any backend sees it.
pub(crate) fn validate_batch(records: &[GenerationRecord]) -> Result<(), GenerationStoreError> {
    let invalid = |what| Err(GenerationStoreError::InvalidRequest { what });
    let Some(first) = records.first() else { return invalid("empty batch") };
    if records.len() > 64 {
        return invalid("batch larger than 64 records");
    }
    if !is_authority_id(&first.authority) {
        return invalid("authority id");
    }
    let mut names = std::collections::HashSet::new();
    for record in records {
        if record.authority != first.authority {
            return invalid("records of several authorities");
        }
        if record.generation == 0 || record.generation > MAX_SAFE_INTEGER {
            return invalid("generation out of range");
        }
        if !crate::target::is_lower_hex(&record.digest, 64) {
            return invalid("digest");
        }
        if !matches!(record.state.as_str(), "POLICY" | "ENABLE" | "DISABLE") {
            return invalid("state");
        }
        if let GenerationSubject::Target(target) = &record.subject
            && !target.is_well_formed()
        {
            return invalid("target digest");
        }
        if !names.insert(record.subject.storage_name()) {
            return invalid("duplicate subject");
        }
    }
    Ok(())
}

/// Decides a batch from the stored `(generation, digest)` of each record (shared by backends that
/// evaluate in Rust; the Redis script implements the same rule in Lua).
pub(crate) fn decide(stored: Option<(u64, &str)>, record: &GenerationRecord) -> MonotonicOutcome {
    let (current, current_digest) = stored.unwrap_or((0, ""));
    if record.generation < current {
        MonotonicOutcome::Stale
    } else if record.generation == current {
        if current_digest == record.digest { MonotonicOutcome::Replay } else { MonotonicOutcome::Conflict }
    } else {
        MonotonicOutcome::Accepted
    }
}
