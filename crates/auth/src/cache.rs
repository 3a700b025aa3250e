//! The verified-token cache: remembers tokens that passed the full check, keyed by the SHA-256 of
//! the token (never the token itself), until the token's `exp`.
//!
//! **Invariant:** an entry is only served while (a) the clock is before the token's `exp` and
//! (b) the issuer still publishes the very same key (by fingerprint) under the entry's `kid`; the
//! caller checks (b), so a key removed or replaced at the issuer stops cached tokens at the next
//! JWKS refresh. Capacity is bounded; when full, the entry expiring soonest is evicted (expired
//! entries first, by construction).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use crate::claims::VerifiedClaims;

/// SHA-256 of a raw token.
pub(crate) type TokenHash = [u8; 32];

/// What the cache remembers about one verified token.
#[derive(Clone)]
pub(crate) struct CachedToken {
    pub(crate) claims: VerifiedClaims,
    pub(crate) issuer_index: usize,
    pub(crate) kid: String,
    pub(crate) key_fingerprint: [u8; 32],
}

struct Entry {
    token: CachedToken,
    expires_at_ms: u64,
    seq: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<TokenHash, Entry>,
    /// (expires_at_ms, insertion sequence) → hash, to evict the soonest-expiring entry.
    by_expiry: BTreeMap<(u64, u64), TokenHash>,
    next_seq: u64,
}

pub(crate) struct VerifiedTokenCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl VerifiedTokenCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { capacity, inner: Mutex::new(Inner::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every mutation keeps `entries` and `by_expiry` consistent before it can panic (only
        // allocation can), so a poisoned cache is still coherent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The entry for `hash` if it has not expired at `now_ms`; expired entries are dropped.
    pub(crate) fn get(&self, hash: &TokenHash, now_ms: u64) -> Option<CachedToken> {
        let mut inner = self.lock();
        let entry = inner.entries.get(hash)?;
        if now_ms < entry.expires_at_ms {
            return Some(entry.token.clone());
        }
        inner.remove(hash);
        None
    }

    pub(crate) fn remove(&self, hash: &TokenHash) {
        self.lock().remove(hash);
    }

    /// Remembers a verified token until `token.claims.expires_at_ms`.
    pub(crate) fn insert(&self, hash: TokenHash, token: CachedToken, now_ms: u64) {
        let expires_at_ms = token.claims.expires_at_ms();
        if self.capacity == 0 || expires_at_ms <= now_ms {
            return;
        }
        let mut inner = self.lock();
        inner.remove(&hash);
        while inner.entries.len() >= self.capacity {
            let Some((_, oldest)) = inner.by_expiry.pop_first() else {
                break;
            };
            inner.entries.remove(&oldest);
        }
        let seq = inner.next_seq;
        inner.next_seq += 1;
        inner.by_expiry.insert((expires_at_ms, seq), hash);
        inner.entries.insert(hash, Entry { token, expires_at_ms, seq });
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

impl Inner {
    fn remove(&mut self, hash: &TokenHash) {
        if let Some(entry) = self.entries.remove(hash) {
            self.by_expiry.remove(&(entry.expires_at_ms, entry.seq));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(expires_at_ms: u64) -> CachedToken {
        CachedToken {
            claims: VerifiedClaims::for_tests(expires_at_ms),
            issuer_index: 0,
            kid: "k".into(),
            key_fingerprint: [0; 32],
        }
    }

    #[test]
    fn entries_expire_at_exp() {
        let cache = VerifiedTokenCache::new(4);
        cache.insert([1; 32], token(10_000), 0);
        assert!(cache.get(&[1; 32], 9_999).is_some());
        assert!(cache.get(&[1; 32], 10_000).is_none());
        assert_eq!(cache.len(), 0, "expired entry dropped on lookup");
        cache.insert([2; 32], token(5), 5);
        assert_eq!(cache.len(), 0, "already expired tokens are not cached");
    }

    #[test]
    fn capacity_is_bounded_and_soonest_expiry_is_evicted() {
        let cache = VerifiedTokenCache::new(3);
        cache.insert([1; 32], token(30_000), 0);
        cache.insert([2; 32], token(10_000), 0);
        cache.insert([3; 32], token(20_000), 0);
        cache.insert([4; 32], token(40_000), 0);
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&[2; 32], 0).is_none(), "soonest-expiring entry evicted");
        for kept in [[1; 32], [3; 32], [4; 32]] {
            assert!(cache.get(&kept, 0).is_some());
        }
        // Re-inserting an existing hash does not grow the cache.
        cache.insert([4; 32], token(50_000), 0);
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn zero_capacity_disables_caching() {
        let cache = VerifiedTokenCache::new(0);
        cache.insert([1; 32], token(10_000), 0);
        assert_eq!(cache.len(), 0);
    }
}
