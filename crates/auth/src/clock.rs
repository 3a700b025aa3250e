//! The wall clock behind a trait, so expiry, JWKS refresh and refetch limits are tested by moving
//! time instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Source of the current time, in milliseconds since the Unix epoch.
///
/// Everything time-dependent in this crate (token `exp`/`nbf`/`iat`, verified-token cache expiry,
/// JWKS refresh and the unknown-`kid` refetch limit) reads this one clock.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since 1970-01-01T00:00:00Z.
    fn now_unix_ms(&self) -> u64;
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix_ms(&self) -> u64 {
        // A clock before 1970 reads as 0, which makes every token look expired: fail closed.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to; for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    /// A clock reading `now_unix_ms`.
    pub fn new(now_unix_ms: u64) -> Self {
        Self { now_ms: AtomicU64::new(now_unix_ms) }
    }

    /// Sets the clock to `now_unix_ms` (it may move backwards).
    pub fn set(&self, now_unix_ms: u64) {
        self.now_ms.store(now_unix_ms, Ordering::SeqCst);
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        // fetch_update never fails here: the closure always returns Some.
        let _ = self.now_ms.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| Some(now.saturating_add(by_ms)));
    }
}

impl Clock for ManualClock {
    fn now_unix_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        assert_eq!(clock.now_unix_ms(), 1_000);
        clock.advance(Duration::from_secs(2));
        assert_eq!(clock.now_unix_ms(), 3_000);
        clock.set(10);
        assert_eq!(clock.now_unix_ms(), 10);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now_unix_ms(), u64::MAX);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_unix_ms() > 1_577_836_800_000);
    }
}
