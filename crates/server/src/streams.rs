//! Open streams per principal: a listen stream or a 2025-era GET stream holds a
//! [`StreamPermit`] for as long as it is open, and a principal past its cap gets no new one.
//! Counted per instance (a stream is held by the instance that opened it).
//!
//! Also what the open streams listen for: each holds an [`InterestGuard`] naming the resource
//! URIs it delivers updates of (a listen stream's `resourceSubscriptions`, a GET stream's
//! session subscriptions), and [`ResourceInterest::watch`] is the set of URIs at least one open
//! stream of this instance wants: an application that must ask for updates somewhere (the
//! gateway, at its upstreams) follows it, and stops asking when nobody listens any more.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

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

/// The resource URIs the open streams of this instance want updates of, counted.
#[derive(Debug)]
pub(crate) struct ResourceInterest {
    counts: Mutex<HashMap<String, usize>>,
    wanted: watch::Sender<BTreeSet<String>>,
}

impl Default for ResourceInterest {
    fn default() -> Self {
        Self { counts: Mutex::default(), wanted: watch::Sender::new(BTreeSet::new()) }
    }
}

impl ResourceInterest {
    /// The set of URIs at least one open stream wants, as it changes.
    pub(crate) fn watch(&self) -> watch::Receiver<BTreeSet<String>> {
        self.wanted.subscribe()
    }

    /// A stream's interest in `uris`, held until the guard drops.
    pub(crate) fn hold(self: &Arc<Self>, uris: impl IntoIterator<Item = String>) -> InterestGuard {
        let mut guard = InterestGuard { interest: self.clone(), uris: BTreeSet::new() };
        guard.set(uris.into_iter().collect());
        guard
    }

    fn apply(&self, added: &BTreeSet<String>, removed: &BTreeSet<String>) {
        if added.is_empty() && removed.is_empty() {
            return;
        }
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let mut changed = false;
        for uri in added {
            let count = counts.entry(uri.clone()).or_insert(0);
            changed |= *count == 0;
            *count += 1;
        }
        for uri in removed {
            if let Some(count) = counts.get_mut(uri) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    counts.remove(uri);
                    changed = true;
                }
            }
        }
        if changed {
            // Sent under the lock, so the watchers see the sets in the order they were made.
            self.wanted.send_replace(counts.keys().cloned().collect());
        }
    }
}

/// One stream's interest; dropping it (the stream ended, however) withdraws it.
#[derive(Debug)]
pub(crate) struct InterestGuard {
    interest: Arc<ResourceInterest>,
    uris: BTreeSet<String>,
}

impl InterestGuard {
    /// The stream now wants exactly `uris` (a GET stream's session subscribed or unsubscribed).
    pub(crate) fn set(&mut self, uris: BTreeSet<String>) {
        let added: BTreeSet<String> = uris.difference(&self.uris).cloned().collect();
        let removed: BTreeSet<String> = self.uris.difference(&uris).cloned().collect();
        self.interest.apply(&added, &removed);
        self.uris = uris;
    }
}

impl Drop for InterestGuard {
    fn drop(&mut self) {
        self.interest.apply(&BTreeSet::new(), &self.uris);
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

    #[test]
    fn interest_is_the_union_of_the_open_streams_and_ends_with_the_last() {
        let interest = Arc::new(ResourceInterest::default());
        let watch = interest.watch();
        let set = |uris: &[&str]| uris.iter().map(|uri| (*uri).to_owned()).collect::<BTreeSet<String>>();
        let listen = interest.hold(["a://1".to_owned(), "a://2".to_owned()]);
        let mut get = interest.hold(Vec::new());
        assert_eq!(*watch.borrow(), set(&["a://1", "a://2"]));
        get.set(set(&["a://2", "b://3"]));
        assert_eq!(*watch.borrow(), set(&["a://1", "a://2", "b://3"]));
        drop(listen);
        assert_eq!(*watch.borrow(), set(&["a://2", "b://3"]), "a://2 is still wanted by the GET stream");
        get.set(set(&["b://3"]));
        assert_eq!(*watch.borrow(), set(&["b://3"]));
        drop(get);
        assert!(watch.borrow().is_empty());
        assert!(interest.counts.lock().unwrap().is_empty(), "nothing is left behind");
    }
}
