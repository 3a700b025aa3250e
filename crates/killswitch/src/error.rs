//! [`KillSwitchError`]: why the kill switch refused an operation, shared by the facade and its
//! request batcher.

use crate::client::AuthorityError;
use crate::generation::{GenerationStoreError, MonotonicOutcome};
use crate::policy::RegistryError;
use crate::target::TargetKind;

/// Why the kill switch refused. Every variant is a refusal; only [`KillSwitchError::Disabled`]
/// is the authority's deliberate decision, the rest are doubts (fail closed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KillSwitchError {
    /// The server exposes operations the signed registry does not list (at start).
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The policy's generation is lower than one accepted before, or the same generation with a
    /// different policy (at start).
    #[error("policy generation refused by the generation store ({outcome:?})")]
    PolicyGenerationRefused {
        /// STALE or CONFLICT.
        outcome: MonotonicOutcome,
    },
    /// The operation is not in the signed registry.
    #[error("operation {operation} is absent from the signed registry")]
    UnlistedOperation {
        /// The operation key.
        operation: String,
    },
    /// The policy's `not_after` has passed.
    #[error("kill-switch policy expired")]
    PolicyExpired,
    /// The request lacks a value for a target kind the rule requires.
    #[error("required target {kind} missing")]
    MissingTarget {
        /// The kind.
        kind: TargetKind,
    },
    /// The authority could not be asked, or its answer did not verify.
    #[error("disable authority answer unusable")]
    Authority(#[from] AuthorityError),
    /// The generation store could not be used.
    #[error("generation store unusable")]
    Store(#[from] GenerationStoreError),
    /// A head's generation is lower than one accepted before (rollback / replayed old head).
    #[error("authority head for {kind} is older than one accepted before")]
    StaleGeneration {
        /// The target's kind.
        kind: TargetKind,
    },
    /// A head claims an accepted generation with a different state.
    #[error("authority head for {kind} conflicts with the accepted head of its generation")]
    GenerationConflict {
        /// The target's kind.
        kind: TargetKind,
    },
    /// The authority says DISABLE for a target of this operation.
    #[error("operation disabled by the authority (target {kind}, generation {generation})")]
    Disabled {
        /// The disabled target's kind.
        kind: TargetKind,
        /// The head generation.
        generation: u64,
        /// The authority's reason code.
        reason_code: String,
    },
    /// The rule requires a commit fence and the authority issued no token for a target.
    #[error("commit fence required but no token issued for {kind}")]
    FenceMissing {
        /// The target's kind.
        kind: TargetKind,
    },
    /// The clearance passed to `pre_side_effect` belongs to another operation, policy or targets.
    #[error("dispatch clearance does not match this operation")]
    ClearanceMismatch,
}

impl KillSwitchError {
    /// Whether the refusal is the authority's DISABLE (as opposed to a doubt).
    pub fn is_disabled(&self) -> bool {
        matches!(self, KillSwitchError::Disabled { .. })
    }
}
