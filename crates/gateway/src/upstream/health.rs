//! Health of one upstream: consecutive failures, the last failure's fixed reason, and an
//! exponential backoff (1 s doubling to 60 s) during which calls are refused at once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_base::clock::{Clock, SystemClock};
use serde::Serialize;

use super::bounds::{DropReport, Drops};

/// Consecutive failures after which the upstream is in backoff: a single failed call (one
/// timeout, one broken connection) does not take an upstream out of service.
pub const FAILURES_BEFORE_BACKOFF: u32 = 2;
/// The first backoff.
pub const MIN_BACKOFF: Duration = Duration::from_secs(1);
/// The longest backoff.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What the operator sees of an upstream's health (`gateway status`, `/readyz` detail).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthReport {
    /// Whether calls are let through now (no backoff in force).
    pub healthy: bool,
    /// Failed calls since the last success.
    pub consecutive_failures: u32,
    /// The last failure's reason (fixed text: no upstream body, no secret).
    pub last_error: Option<String>,
    /// When the backoff ends (milliseconds since the epoch), while one is in force.
    pub retry_at_ms: Option<i64>,
    /// What the per-upstream bounds dropped (SECURITY.md, "Gateway → upstream").
    pub dropped: DropReport,
}

#[derive(Debug, Default)]
struct State {
    consecutive_failures: u32,
    last_error: Option<String>,
    backoff_until: Option<(Instant, i64)>,
}

/// The health tracker of one upstream.
#[derive(Debug, Default)]
pub(super) struct Health {
    state: Mutex<State>,
    /// The counters of what the upstream's bounds dropped.
    pub drops: Arc<Drops>,
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked mid-update of plain counters.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the upstream is in backoff now.
    pub fn in_backoff(&self) -> bool {
        self.lock().backoff_until.is_some_and(|(until, _)| Instant::now() < until)
    }

    /// A call succeeded: failures forgotten, backoff lifted.
    pub fn success(&self) {
        let mut state = self.lock();
        state.consecutive_failures = 0;
        state.backoff_until = None;
    }

    /// A call failed with `reason` (fixed text).
    pub fn failure(&self, reason: String) {
        let mut state = self.lock();
        state.consecutive_failures = state.consecutive_failures.saturating_add(1);
        state.last_error = Some(reason);
        if state.consecutive_failures >= FAILURES_BEFORE_BACKOFF {
            let doublings = (state.consecutive_failures - FAILURES_BEFORE_BACKOFF).min(16);
            let delay = MIN_BACKOFF.saturating_mul(1u32 << doublings).min(MAX_BACKOFF);
            let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
            state.backoff_until = Some((Instant::now() + delay, SystemClock.now_ms().saturating_add(delay_ms)));
        }
    }

    /// The current report.
    pub fn report(&self) -> HealthReport {
        let state = self.lock();
        let backoff = state.backoff_until.filter(|(until, _)| Instant::now() < *until);
        HealthReport {
            healthy: backoff.is_none(),
            consecutive_failures: state.consecutive_failures,
            last_error: state.last_error.clone(),
            retry_at_ms: backoff.map(|(_, at_ms)| at_ms),
            dropped: self.drops.report(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_after_consecutive_failures_and_success_resets() {
        let health = Health::default();
        health.failure("timeout".into());
        assert!(!health.in_backoff(), "one failure is not yet a backoff");
        health.failure("timeout".into());
        assert!(health.in_backoff());
        let report = health.report();
        assert!(!report.healthy);
        assert_eq!(report.consecutive_failures, 2);
        assert_eq!(report.last_error.as_deref(), Some("timeout"));
        assert!(report.retry_at_ms.is_some());
        for _ in 0..100 {
            health.failure("x".into());
        }
        assert_eq!(health.report().consecutive_failures, 102);
        health.success();
        assert!(!health.in_backoff());
        assert_eq!(health.report().consecutive_failures, 0);
        assert!(health.report().healthy);
    }
}
