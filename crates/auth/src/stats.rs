//! Counters a verifier keeps about its own work (signature checks, cache hits, JWKS fetches), for
//! metrics and for tests that must observe that the warm path skipped verification.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a [`crate::TokenVerifier`]'s counters since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifierStats {
    /// Signature verifications performed (the cold path).
    pub signature_verifications: u64,
    /// Tokens accepted from the verified-token cache without a signature check.
    pub cache_hits: u64,
    /// JWKS fetch attempts, successful or not.
    pub jwks_fetch_attempts: u64,
    /// JWKS fetch attempts that failed (network, status, size, or not a key set).
    pub jwks_fetch_failures: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    signature_verifications: AtomicU64,
    cache_hits: AtomicU64,
    jwks_fetch_attempts: AtomicU64,
    jwks_fetch_failures: AtomicU64,
}

impl Counters {
    pub(crate) fn signature_verification(&self) {
        self.signature_verifications.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn cache_hit(&self) {
        self.cache_hits.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn jwks_fetch_attempt(&self) {
        self.jwks_fetch_attempts.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn jwks_fetch_failure(&self) {
        self.jwks_fetch_failures.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn snapshot(&self) -> VerifierStats {
        VerifierStats {
            signature_verifications: self.signature_verifications.load(Ordering::Relaxed),
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            jwks_fetch_attempts: self.jwks_fetch_attempts.load(Ordering::Relaxed),
            jwks_fetch_failures: self.jwks_fetch_failures.load(Ordering::Relaxed),
        }
    }
}
