//! The `KillSwitch` facade the request pipeline calls twice per covered operation:
//! [`KillSwitch::pre_dispatch`] (before the handler) and [`KillSwitch::pre_side_effect`] (after
//! the side-effect-free preparation, before the commit). Each asks the authority once for every
//! target of the operation, verifies the signed heads, accepts their generations monotonically
//! and refuses on any DISABLE or doubt. The second phase yields the [`CommitFence`] that only it
//! can make.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use palisade_base::clock::Clock;
use tokio::sync::broadcast;

use crate::batcher::{Batcher, DriverContext, outcome_refusal};
use crate::client::{AuthorityClient, CommitToken, HeadEnvelope, VerifiedHead};
use crate::error::KillSwitchError;
use crate::generation::{
    DEFAULT_REPLAY_WINDOW_MS, GenerationRecord, GenerationStore, GenerationStoreError, GenerationSubject,
    RememberedGenerations,
};
use crate::head::{Phase, RedeemRequest, TargetState};
use crate::policy::{Coverage, Policy};
use crate::target::{TargetDigest, TargetKey, TargetKind, TargetValues};

/// The default of `[killswitch] stream_recheck_secs`: 5 s.
pub const DEFAULT_STREAM_RECHECK_MS: u64 = 5_000;

/// A target observed DISABLE, broadcast to [`KillSwitch::subscribe_disables`] subscribers (e.g.
/// to close listen streams on that target).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisableEvent {
    /// The target.
    pub target: TargetDigest,
    /// The DISABLE head's generation.
    pub generation: u64,
    /// The authority's reason code.
    pub reason_code: String,
}

/// Proof that `pre_dispatch` passed for one operation and its targets. Only the kill switch makes
/// one; `pre_side_effect` requires it.
///
/// # Only [`KillSwitch::pre_dispatch`] makes one
///
/// Every field is private and there is no constructor, `Default` or `Deserialize`: code outside
/// this crate gets a clearance from the first phase and nowhere else.
///
/// ```
/// use palisade_killswitch::{DispatchClearance, KillSwitch, KillSwitchError, TargetValues};
///
/// async fn clear(switch: &KillSwitch, targets: &TargetValues) -> Result<DispatchClearance, KillSwitchError> {
///     let clearance = switch.pre_dispatch("tools/call:basket_checkout", targets).await?;
///     assert_eq!(clearance.operation(), "tools/call:basket_checkout");
///     Ok(clearance)
/// }
/// ```
///
/// A struct literal does not compile (private fields):
///
/// ```compile_fail,E0451
/// use palisade_killswitch::DispatchClearance;
///
/// let forged = DispatchClearance {
///     operation: "tools/call:basket_checkout".to_owned(),
///     policy_digest: String::new(),
///     targets: Vec::new(),
///     generations: Vec::new(),
///     not_applicable_reason: Some("forged".to_owned()),
/// };
/// ```
///
/// Nor does rewriting a real one for another operation (functional update of private fields):
///
/// ```compile_fail,E0451
/// use palisade_killswitch::{DispatchClearance, KillSwitch, TargetValues};
///
/// async fn widen(switch: &KillSwitch, targets: &TargetValues) -> DispatchClearance {
///     let real = switch.pre_dispatch("tools/list", targets).await.unwrap();
///     DispatchClearance { operation: "tools/call:basket_checkout".to_owned(), ..real }
/// }
/// ```
///
/// Nor `Default`:
///
/// ```compile_fail,E0277
/// use palisade_killswitch::DispatchClearance;
///
/// let forged: DispatchClearance = Default::default();
/// ```
///
/// Nor deserializing one:
///
/// ```compile_fail,E0277
/// use palisade_killswitch::DispatchClearance;
///
/// let forged: DispatchClearance = serde_json::from_str("{}").unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct DispatchClearance {
    operation: String,
    policy_digest: String,
    targets: Vec<TargetDigest>,
    generations: Vec<u64>,
    not_applicable_reason: Option<String>,
}

impl DispatchClearance {
    /// The operation key.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The targets checked (empty for NOT_APPLICABLE).
    pub fn targets(&self) -> &[TargetDigest] {
        &self.targets
    }

    /// The head generation accepted per target (same order as `targets`).
    pub fn generations(&self) -> &[u64] {
        &self.generations
    }

    /// The registry's technical reason when the operation is NOT_APPLICABLE.
    pub fn not_applicable_reason(&self) -> Option<&str> {
        self.not_applicable_reason.as_deref()
    }
}

/// One target's commit token, bound by the authority to the target and its head generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceToken {
    /// The target.
    pub target: TargetDigest,
    /// The ENABLE head generation the token is bound to.
    pub generation: u64,
    /// The one-use token.
    pub token: CommitToken,
}

impl FenceToken {
    /// What the backend redeems in its commit transaction.
    pub fn redeem_request(&self) -> RedeemRequest {
        RedeemRequest {
            token: self.token.expose().to_owned(),
            target: self.target.clone(),
            generation: self.generation,
        }
    }
}

/// The commit fence: the authority's one-use tokens for every target of a covered operation,
/// for the backend to redeem atomically with its effect. Only [`KillSwitch::pre_side_effect`]
/// makes one; a backend commit path should take it by value.
///
/// # Only [`KillSwitch::pre_side_effect`] makes one
///
/// Every field is private and there is no constructor, `Default` or `Deserialize`: code outside
/// this crate gets a fence from the second phase, which needs a [`DispatchClearance`], and
/// nowhere else.
///
/// ```
/// use palisade_killswitch::{CommitFence, KillSwitch, KillSwitchError, RedeemRequest, TargetValues};
///
/// async fn fence(switch: &KillSwitch, targets: &TargetValues) -> Result<CommitFence, KillSwitchError> {
///     let clearance = switch.pre_dispatch("tools/call:basket_checkout", targets).await?;
///     switch.pre_side_effect("tools/call:basket_checkout", targets, &clearance).await
/// }
///
/// fn commit(fence: CommitFence) -> Vec<RedeemRequest> {
///     fence.redeem_requests()
/// }
/// ```
///
/// A struct literal does not compile (private fields), not even an empty, not-required one:
///
/// ```compile_fail,E0451
/// use palisade_killswitch::CommitFence;
///
/// let forged = CommitFence {
///     operation: "tools/call:basket_checkout".to_owned(),
///     policy_generation: 1,
///     required: false,
///     tokens: Vec::new(),
///     not_applicable_reason: None,
/// };
/// ```
///
/// Nor turning a real fence into one that is not required (functional update of private fields):
///
/// ```compile_fail,E0451
/// use palisade_killswitch::CommitFence;
///
/// fn relax(real: CommitFence) -> CommitFence {
///     CommitFence { required: false, tokens: Vec::new(), ..real }
/// }
/// ```
///
/// Nor `Default`:
///
/// ```compile_fail,E0277
/// use palisade_killswitch::CommitFence;
///
/// let forged: CommitFence = Default::default();
/// ```
///
/// Nor deserializing one:
///
/// ```compile_fail,E0277
/// use palisade_killswitch::CommitFence;
///
/// let forged: CommitFence = serde_json::from_str("{}").unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct CommitFence {
    operation: String,
    policy_generation: u64,
    required: bool,
    tokens: Vec<FenceToken>,
    not_applicable_reason: Option<String>,
}

impl CommitFence {
    /// The operation key.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The policy generation it was issued under.
    pub fn policy_generation(&self) -> u64 {
        self.policy_generation
    }

    /// Whether the registry requires the backend to redeem every token in its commit.
    pub fn is_required(&self) -> bool {
        self.required
    }

    /// The tokens, one per target (empty for NOT_APPLICABLE; may be partial only when not required).
    pub fn tokens(&self) -> &[FenceToken] {
        &self.tokens
    }

    /// The registry's technical reason when the operation is NOT_APPLICABLE (empty fence set by design).
    pub fn not_applicable_reason(&self) -> Option<&str> {
        self.not_applicable_reason.as_deref()
    }

    /// The redeem requests, one per token.
    pub fn redeem_requests(&self) -> Vec<RedeemRequest> {
        self.tokens.iter().map(FenceToken::redeem_request).collect()
    }
}

/// What [`KillSwitch::start`] needs.
pub struct KillSwitchConfig {
    /// The verified policy ([`Policy::load`]).
    pub policy: Policy,
    /// Every operation key the server exposes; the registry must list each.
    pub exposed_operations: Vec<String>,
    /// The authority client.
    pub authority: AuthorityClient,
    /// The generation store shared by every instance.
    pub store: Arc<dyn GenerationStore>,
    /// The target digest key (shared by every instance and the authority's operators).
    pub target_key: TargetKey,
    /// The clock ([`palisade_base::clock::SystemClock`] in production).
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for KillSwitchConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("KillSwitchConfig").field("policy", &self.policy).finish_non_exhaustive()
    }
}

struct Inner {
    policy: Arc<Policy>,
    authority: AuthorityClient,
    /// The batched envelope's driver (`None`: the single-query v2 envelope).
    batcher: Option<Batcher>,
    /// How often open streams re-check their targets, in milliseconds.
    stream_recheck_ms: AtomicU64,
    /// The shared generation store behind what this instance remembers accepting.
    store: Arc<RememberedGenerations>,
    target_key: TargetKey,
    clock: Arc<dyn Clock>,
    disables: broadcast::Sender<DisableEvent>,
}

/// The kill switch. Cheap to clone.
#[derive(Clone)]
pub struct KillSwitch {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KillSwitch {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("KillSwitch").field("policy", &self.inner.policy).finish_non_exhaustive()
    }
}

enum Checked {
    NotApplicable(String),
    Covered { require_fence: bool, targets: Vec<TargetDigest>, heads: Vec<VerifiedHead> },
}

impl KillSwitch {
    /// Starts the kill switch: refuses a registry missing any exposed operation, an expired
    /// policy, and a policy generation lower than (or conflicting with) one accepted before;
    /// records the policy generation in the generation store.
    pub async fn start(config: KillSwitchConfig) -> Result<Self, KillSwitchError> {
        let KillSwitchConfig { policy, exposed_operations, authority, store, target_key, clock } = config;
        policy.check_complete(exposed_operations.iter().map(String::as_str))?;
        if policy.is_expired(clock.now_ms()) {
            return Err(KillSwitchError::PolicyExpired);
        }
        let record = GenerationRecord {
            authority: policy.authority().to_owned(),
            subject: GenerationSubject::Policy,
            generation: policy.generation(),
            digest: policy.digest().to_owned(),
            state: "POLICY".to_owned(),
        };
        let outcomes = store.accept_all(std::slice::from_ref(&record)).await?;
        match outcomes.as_slice() {
            [outcome] if outcome.is_acceptable() => {}
            [outcome] => return Err(KillSwitchError::PolicyGenerationRefused { outcome: *outcome }),
            _ => return Err(GenerationStoreError::Corrupt { what: "outcome count" }.into()),
        }
        let (disables, _) = broadcast::channel(256);
        let policy = Arc::new(policy);
        let store = Arc::new(RememberedGenerations::new(store, clock.clone(), DEFAULT_REPLAY_WINDOW_MS));
        let batcher = (authority.envelope() == HeadEnvelope::Batched).then(|| {
            Batcher::start(DriverContext {
                policy: policy.clone(),
                client: authority.clone(),
                store: store.clone(),
                clock: clock.clone(),
            })
        });
        let stream_recheck_ms = AtomicU64::new(DEFAULT_STREAM_RECHECK_MS);
        Ok(Self {
            inner: Arc::new(Inner {
                policy,
                authority,
                batcher,
                stream_recheck_ms,
                store,
                target_key,
                clock,
                disables,
            }),
        })
    }

    /// Records the latency of every round trip to the authority in `histogram` (a server's
    /// `palisade_killswitch_authority_duration_seconds`); the first histogram given stays.
    pub fn observe_authority(&self, histogram: metrics::Histogram) {
        self.inner.authority.observe_latency(histogram);
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// With the batched envelope: (authority requests sent, queries they carried) so far — each
    /// request is one signature at the authority. `None` with the single-query envelope.
    pub fn batch_stats(&self) -> Option<(u64, u64)> {
        self.inner.batcher.as_ref().map(Batcher::stats)
    }

    /// How often an open stream re-checks its targets (default 5 s).
    pub fn stream_recheck(&self) -> Duration {
        Duration::from_millis(self.inner.stream_recheck_ms.load(Ordering::Relaxed))
    }

    /// Sets the stream re-check interval (`[killswitch] stream_recheck_secs`; at least 1 ms).
    pub fn set_stream_recheck(&self, interval: Duration) {
        let millis = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX).max(1);
        self.inner.stream_recheck_ms.store(millis, Ordering::Relaxed);
    }

    /// How long a head this instance accepted is answered from memory, without the generation
    /// store, when it comes again (`[killswitch] replay_window_ms`; default 1 s; zero: never).
    /// See [`RememberedGenerations`].
    pub fn set_replay_window(&self, window: Duration) {
        self.inner.store.set_window_ms(u64::try_from(window.as_millis()).unwrap_or(u64::MAX));
    }

    /// The clock the kill switch reads (streams schedule their re-checks on it).
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// Subscribes to DISABLE observations (from either phase's authority answers).
    pub fn subscribe_disables(&self) -> broadcast::Receiver<DisableEvent> {
        self.inner.disables.subscribe()
    }

    /// The digest of a target value, as the authority and [`DisableEvent`]s name it.
    pub fn target_digest(&self, kind: TargetKind, value: &str) -> TargetDigest {
        self.inner.target_key.digest(kind, value)
    }

    /// Phase 1, before the handler runs. NOT_APPLICABLE operations pass without a query.
    pub async fn pre_dispatch(
        &self,
        operation: &str,
        targets: &TargetValues,
    ) -> Result<DispatchClearance, KillSwitchError> {
        let clearance = match self.check(operation, targets, Phase::PreDispatch).await? {
            Checked::NotApplicable(reason) => DispatchClearance {
                operation: operation.to_owned(),
                policy_digest: self.inner.policy.digest().to_owned(),
                targets: Vec::new(),
                generations: Vec::new(),
                not_applicable_reason: Some(reason),
            },
            Checked::Covered { targets, heads, .. } => DispatchClearance {
                operation: operation.to_owned(),
                policy_digest: self.inner.policy.digest().to_owned(),
                targets,
                generations: heads.iter().map(|head| head.generation).collect(),
                not_applicable_reason: None,
            },
        };
        Ok(clearance)
    }

    /// Phase 2, after the side-effect-free preparation and before the commit: asks again (the
    /// state may have changed since dispatch) and returns the commit fence.
    pub async fn pre_side_effect(
        &self,
        operation: &str,
        targets: &TargetValues,
        clearance: &DispatchClearance,
    ) -> Result<CommitFence, KillSwitchError> {
        if clearance.operation != operation || clearance.policy_digest != self.inner.policy.digest() {
            return Err(KillSwitchError::ClearanceMismatch);
        }
        match self.check(operation, targets, Phase::PreSideEffect).await? {
            Checked::NotApplicable(reason) => Ok(CommitFence {
                operation: operation.to_owned(),
                policy_generation: self.inner.policy.generation(),
                required: false,
                tokens: Vec::new(),
                not_applicable_reason: Some(reason),
            }),
            Checked::Covered { require_fence, targets: digests, heads } => {
                if digests != clearance.targets {
                    return Err(KillSwitchError::ClearanceMismatch);
                }
                let mut tokens = Vec::with_capacity(heads.len());
                for head in heads {
                    match head.commit_token {
                        Some(token) => {
                            tokens.push(FenceToken { target: head.target, generation: head.generation, token })
                        }
                        None if require_fence => return Err(KillSwitchError::FenceMissing { kind: head.target.kind }),
                        None => {}
                    }
                }
                Ok(CommitFence {
                    operation: operation.to_owned(),
                    policy_generation: self.inner.policy.generation(),
                    required: require_fence,
                    tokens,
                    not_applicable_reason: None,
                })
            }
        }
    }

    async fn check(&self, operation: &str, values: &TargetValues, phase: Phase) -> Result<Checked, KillSwitchError> {
        let inner = &self.inner;
        if inner.policy.is_expired(inner.clock.now_ms()) {
            return Err(KillSwitchError::PolicyExpired);
        }
        let rule = inner
            .policy
            .lookup(operation)
            .ok_or_else(|| KillSwitchError::UnlistedOperation { operation: operation.to_owned() })?;
        if rule.coverage == Coverage::NotApplicable {
            return Ok(Checked::NotApplicable(rule.technical_reason.clone().unwrap_or_default()));
        }
        let mut targets = Vec::with_capacity(rule.required_target_kinds.len());
        for &kind in &rule.required_target_kinds {
            let before = targets.len();
            targets.extend(values.values(kind).map(|value| inner.target_key.digest(kind, value)));
            // A principal without a tenant (client, delegated agent) has no target of that kind.
            if targets.len() == before && !kind.is_principal_kind() {
                return Err(KillSwitchError::MissingTarget { kind });
            }
        }
        let heads = match &inner.batcher {
            // Verified and accepted by the generation store in the driver.
            Some(batcher) => batcher.current_heads(phase, targets.clone()).await?,
            None => {
                let heads = inner.authority.current_heads(&inner.policy, phase, &targets, inner.clock.as_ref()).await?;
                let records: Vec<GenerationRecord> = heads
                    .iter()
                    .map(|head| GenerationRecord {
                        authority: inner.policy.authority().to_owned(),
                        subject: GenerationSubject::Target(head.target.clone()),
                        generation: head.generation,
                        digest: head.state_digest.clone(),
                        state: head.state.as_str().to_owned(),
                    })
                    .collect();
                let outcomes = inner.store.accept_all(&records).await?;
                outcome_refusal(&heads, &outcomes)?;
                heads
            }
        };
        // Broadcast every DISABLE of the answer before refusing, so listeners learn all of them.
        let mut refusal = None;
        for head in &heads {
            if head.state == TargetState::Disable {
                let event = DisableEvent {
                    target: head.target.clone(),
                    generation: head.generation,
                    reason_code: head.reason_code.clone(),
                };
                // No subscriber is not an error.
                let _ = inner.disables.send(event);
                refusal.get_or_insert(KillSwitchError::Disabled {
                    kind: head.target.kind,
                    generation: head.generation,
                    reason_code: head.reason_code.clone(),
                });
            }
        }
        if let Some(refusal) = refusal {
            return Err(refusal);
        }
        Ok(Checked::Covered { require_fence: rule.require_commit_fence, targets, heads })
    }
}
