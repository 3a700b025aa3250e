//! The one clock of the workspace: time behind a trait, so expiry, freshness and timeouts are
//! tested by moving a [`ManualClock`] instead of sleeping. [`SystemClock`] is the only reader of
//! the operating system's wall clock.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Now, in milliseconds since 1970-01-01T00:00:00Z.
    fn now_ms(&self) -> i64;

    /// Completes once [`Clock::now_ms`] has reached `deadline_ms`. The default sleeps on the
    /// runtime's timer and looks again; [`ManualClock`] completes when it is moved past it.
    fn sleep_until_ms(&self, deadline_ms: i64) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            loop {
                let left = deadline_ms.saturating_sub(self.now_ms());
                if left <= 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(u64::try_from(left).unwrap_or(0))).await;
            }
        })
    }

    /// Whether this is the operating system's wall clock (two wall clocks are the same time
    /// source; any other clock is the same only as the same instance).
    fn is_wall_clock(&self) -> bool {
        false
    }

    /// Now, in milliseconds since the epoch, as an unsigned number; a time before 1970 reads as 0.
    /// (Not meant to be overridden: it is [`Clock::now_ms`] converted.)
    fn now_unsigned_ms(&self) -> u64 {
        u64::try_from(self.now_ms()).unwrap_or(0)
    }

    /// Now, in whole seconds since the epoch (JWT `exp`/`nbf`/`iat` are seconds), rounded down; a
    /// time before 1970 reads as 0. (Not meant to be overridden: it is [`Clock::now_ms`] converted.)
    fn now_secs(&self) -> u64 {
        self.now_unsigned_ms() / 1000
    }
}

/// The operating system's wall clock: the one place the workspace reads it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn is_wall_clock(&self) -> bool {
        true
    }

    #[allow(clippy::disallowed_methods, reason = "the one reader of the wall clock; everything else injects a Clock")]
    fn now_ms(&self) -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(elapsed) => i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX),
            // A clock before 1970 reads as 0: every expiry looks past and every signed time looks
            // like the future, so refusals follow (fail closed).
            Err(_) => 0,
        }
    }
}

/// A clock tests (and simulations) set by hand; sleepers on it wake when it is moved.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicI64,
    moved: tokio::sync::Notify,
}

impl ManualClock {
    /// A clock showing `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        Self { now_ms: AtomicI64::new(now_ms), moved: tokio::sync::Notify::new() }
    }

    /// Sets the time (it may move backwards).
    pub fn set_ms(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    /// Moves the time forward (or back, with a negative step), saturating at the ends of `i64`.
    pub fn advance_ms(&self, step_ms: i64) {
        // fetch_update never fails here: the closure always returns Some.
        let _ = self.now_ms.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| Some(now.saturating_add(step_ms)));
        self.moved.notify_waiters();
    }

    /// Moves the time forward by `by` (saturating).
    pub fn advance(&self, by: Duration) {
        self.advance_ms(i64::try_from(by.as_millis()).unwrap_or(i64::MAX));
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn sleep_until_ms(&self, deadline_ms: i64) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            loop {
                // Register for the next move before looking, so a move in between is not missed.
                let moved = self.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if self.now_ms() >= deadline_ms {
                    return;
                }
                moved.await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance(Duration::from_secs(2));
        assert_eq!(clock.now_ms(), 3_000);
        clock.advance_ms(-500);
        assert_eq!(clock.now_ms(), 2_500);
        clock.set_ms(10);
        assert_eq!(clock.now_ms(), 10);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now_ms(), i64::MAX);
        clock.advance_ms(1);
        assert_eq!(clock.now_ms(), i64::MAX);
    }

    #[test]
    fn unsigned_and_seconds_views_round_down_and_fail_closed_before_1970() {
        let clock = ManualClock::new(1_800_000_000_999);
        assert_eq!(clock.now_unsigned_ms(), 1_800_000_000_999);
        assert_eq!(clock.now_secs(), 1_800_000_000);
        clock.set_ms(-1);
        assert_eq!(clock.now_unsigned_ms(), 0);
        assert_eq!(clock.now_secs(), 0);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
        assert!(SystemClock.now_secs() > 1_577_836_800);
        assert!(SystemClock.is_wall_clock());
        assert!(!ManualClock::new(0).is_wall_clock());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn manual_sleepers_wake_when_the_clock_passes_their_deadline() {
        let clock = Arc::new(ManualClock::new(0));
        let sleeper = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.sleep_until_ms(1_000).await })
        };
        tokio::task::yield_now().await;
        clock.advance_ms(999);
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished(), "woke before its deadline");
        clock.advance_ms(1);
        sleeper.await.unwrap();
        // A deadline already passed completes at once.
        clock.sleep_until_ms(5).await;
    }
}
