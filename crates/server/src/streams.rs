//! Open streams per principal: a listen stream or a 2025-era GET stream holds a
//! [`StreamPermit`] for as long as it is open, and a principal past its cap gets no new one.
//! Counted per instance (a stream is held by the instance that opened it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Counts open streams by principal partition key.
#[derive(Debug, Default)]
pub(crate) struct StreamLimiter {
    open: Mutex<HashMap<String, usize>>,
}

impl StreamLimiter {
    /// A permit for one more stream of `principal`, unless it already holds `max`.
    pub(crate) fn acquire(self: &Arc<Self>, principal: String, max: usize) -> Option<StreamPermit> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(principal.clone()).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(StreamPermit { limiter: self.clone(), principal })
    }

    #[cfg(test)]
    fn open_for(&self, principal: &str) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).get(principal).copied().unwrap_or(0)
    }
}

/// One open stream; dropping it (the stream ended, however) frees its place.
#[derive(Debug)]
pub(crate) struct StreamPermit {
    limiter: Arc<StreamLimiter>,
    principal: String,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.limiter.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.principal) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_holds_at_most_max_and_a_closed_stream_frees_its_place() {
        let limiter = Arc::new(StreamLimiter::default());
        let first = limiter.acquire("alice".into(), 2).expect("first");
        let _second = limiter.acquire("alice".into(), 2).expect("second");
        assert!(limiter.acquire("alice".into(), 2).is_none(), "third refused");
        let _bob = limiter.acquire("bob".into(), 2).expect("another principal is counted apart");
        drop(first);
        assert_eq!(limiter.open_for("alice"), 1);
        let _again = limiter.acquire("alice".into(), 2).expect("a place was freed");
        assert!(limiter.acquire("alice".into(), 2).is_none());
    }

    #[test]
    fn no_entry_is_left_behind() {
        let limiter = Arc::new(StreamLimiter::default());
        drop(limiter.acquire("carol".into(), 1));
        assert!(limiter.open.lock().unwrap().is_empty());
    }
}
