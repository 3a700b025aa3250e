//! Stage 3d, rate limits: the operator's rate limits and quotas ([`crate::rate_limits`]) decide
//! whether the request may go on *now*. It runs once the principal the request acts for is
//! final (after delegation, and after the operator's policy decisions about who may do what),
//! so a limit keyed on the subject, the tenant or the agent counts the right party, and before
//! the kill switch, the handles and the allow, so a refused request costs no further lookups.
//!
//! Holds the current [`RateLimits`] (swapped whole by
//! [`crate::server::Server::set_rate_limits`]; a request keeps the set it started with) with
//! one allowed/refused counter pair per rule, and the clock; knows the operation key and the
//! principal, nothing about transports or handlers.

use std::sync::Arc;

use arc_swap::ArcSwap;
use metrics::Counter;
use palisade_wire::ProtocolError;

use crate::auth::VerifiedPrincipal;
use crate::clock::Clock;
use crate::method::OperationKey;
use crate::metrics::Metrics;
use crate::rate_limits::{Decision, RateLimits};

/// `palisade_rate_limit_decisions_total{limit, decision}`.
const DECISIONS: &str = "palisade_rate_limit_decisions_total";
/// `palisade_rate_limit_store_failures_total{fallback}`.
const STORE_FAILURES: &str = "palisade_rate_limit_store_failures_total";

/// A set of limits with the counters of its rules.
struct Installed {
    limits: Arc<RateLimits>,
    /// Per rule, in order: (allowed, refused).
    counters: Vec<(Counter, Counter)>,
    /// Requests refused because the shared store did not answer.
    store_refusals: Counter,
    /// Requests decided by the local allowance because the shared store did not answer.
    store_fallbacks: Counter,
}

/// Stage 3d: the current limits, the metrics their counters live in, the clock.
pub(crate) struct Limits {
    installed: ArcSwap<Installed>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
}

impl Limits {
    pub(crate) fn new(limits: Arc<RateLimits>, metrics: Arc<Metrics>, clock: Arc<dyn Clock>) -> Self {
        let installed = ArcSwap::from_pointee(install(&metrics, limits));
        Self { installed, metrics, clock }
    }

    /// Replaces the limits; requests already past this stage are not affected.
    pub(crate) fn set(&self, limits: Arc<RateLimits>) {
        self.installed.store(Arc::new(install(&self.metrics, limits)));
    }

    /// The limits in force.
    pub(crate) fn current(&self) -> Arc<RateLimits> {
        self.installed.load().limits.clone()
    }

    /// Allows the request (counting it under every rule that applies) or refuses it:
    /// `RateLimited` with the wait, or `Unavailable` when the shared store did not answer and
    /// the limits fail closed.
    pub(crate) async fn check(
        &self,
        operation: &OperationKey,
        principal: &VerifiedPrincipal,
    ) -> Result<(), ProtocolError> {
        let installed = self.installed.load_full();
        if installed.limits.is_empty() {
            return Ok(());
        }
        let checked = installed.limits.check(operation, principal, || now_us(self.clock.as_ref())).await;
        if checked.fell_back {
            installed.store_fallbacks.increment(1);
        }
        match checked.decision {
            Decision::Allowed(rules) => {
                for rule in rules {
                    installed.counters[rule].0.increment(1);
                }
                Ok(())
            }
            Decision::Refused { rule, retry_after_ms } => {
                installed.counters[rule].1.increment(1);
                let limit = installed.limits.names().nth(rule).unwrap_or_default();
                tracing::info!(stage = "rate_limit", decision = "deny", limit, retry_after_ms, "rate limit reached");
                Err(ProtocolError::RateLimited { retry_after_ms })
            }
            Decision::StoreUnavailable => {
                installed.store_refusals.increment(1);
                Err(ProtocolError::Unavailable)
            }
        }
    }
}

/// Registers (or finds again) the counters of every rule of `limits`.
fn install(metrics: &Metrics, limits: Arc<RateLimits>) -> Installed {
    let help = "Requests allowed and refused by each rate limit (`[[rate_limits]]` name).";
    let counters = limits
        .names()
        .map(|name| {
            (
                metrics.counter(DECISIONS, help, &[("limit", name), ("decision", "allowed")]),
                metrics.counter(DECISIONS, help, &[("limit", name), ("decision", "refused")]),
            )
        })
        .collect();
    let help = "Requests the shared rate-limit store did not answer for, by what was done instead (on_store_failure).";
    let store_refusals = metrics.counter(STORE_FAILURES, help, &[("fallback", "refused")]);
    let store_fallbacks = metrics.counter(STORE_FAILURES, help, &[("fallback", "local")]);
    Installed { limits, counters, store_refusals, store_fallbacks }
}

/// Now in µs, by the server's clock (to the millisecond).
fn now_us(clock: &dyn Clock) -> u64 {
    u64::try_from(clock.now_ms()).unwrap_or(0).saturating_mul(1000)
}
