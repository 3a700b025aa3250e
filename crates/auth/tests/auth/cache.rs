//! The verified-token cache: warm hits skip the signature check (observed through the
//! verifier's counters), entries end at `exp`, the capacity bound holds.

use std::sync::Arc;

use palisade_auth::{Algorithm, AuthError, InvalidTokenReason as Reason, IssuerConfig, TokenVerifier};
use serde_json::json;

use crate::common::*;

fn static_verifier(key: &TestKey, capacity: usize) -> (TokenVerifier, Arc<ManualClock>) {
    let mut cfg = config(vec![IssuerConfig {
        issuer: ISSUER_A.into(),
        jwks: static_jwks(&[key]),
        algorithms: vec![Algorithm::ES256],
    }]);
    cfg.cache_capacity = capacity;
    let clock = clock();
    (verifier(cfg, &clock), clock)
}

#[tokio::test]
async fn warm_hit_skips_signature_verification() {
    let key = TestKey::ec("k");
    let (verifier, _clock) = static_verifier(&key, 100);
    let header = bearer(&token(&key));
    let first = verifier.verify(Some(&header)).await.expect("cold");
    for _ in 0..3 {
        assert_eq!(verifier.verify(Some(&header)).await.expect("warm"), first);
    }
    let stats = verifier.stats();
    assert_eq!(stats.signature_verifications, 1);
    assert_eq!(stats.cache_hits, 3);
    assert_eq!(verifier.cached_tokens(), 1);
}

#[tokio::test]
async fn a_hit_needs_the_exact_same_token() {
    let key = TestKey::ec("k");
    let (verifier, _clock) = static_verifier(&key, 100);
    let good = token(&key);
    verifier.verify(Some(&bearer(&good))).await.expect("cold");
    // Same header and payload, signature bit flipped: a different cache key, so a full check.
    let (input, signature) = good.rsplit_once('.').expect("three parts");
    let mut bytes = base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, signature).expect("b64");
    bytes[0] ^= 0x80;
    let forged = format!("{input}.{}", b64(&bytes));
    assert_eq!(verifier.verify(Some(&bearer(&forged))).await, Err(AuthError::InvalidToken(Reason::BadSignature)));
    assert_eq!(verifier.stats().signature_verifications, 2);
    assert_eq!(verifier.stats().cache_hits, 0);
}

#[tokio::test]
async fn entries_end_at_exp_and_leeway_is_rechecked_cold() {
    let key = TestKey::ec("k");
    let (verifier, clock) = static_verifier(&key, 100);
    let header = bearer(&token_with(&key, json!({}), json!({"exp": NOW + 60})));
    verifier.verify(Some(&header)).await.expect("cold");
    clock.set_ms(ms((NOW + 60) * 1000 - 1));
    verifier.verify(Some(&header)).await.expect("warm, just before exp");
    assert_eq!(verifier.stats().cache_hits, 1);
    // At exp the entry is gone; the cold path still accepts within the leeway.
    clock.set_ms(ms((NOW + 60) * 1000));
    verifier.verify(Some(&header)).await.expect("cold, inside leeway");
    assert_eq!(verifier.stats().signature_verifications, 2);
    assert_eq!(verifier.cached_tokens(), 0, "a token past its exp is not cached again");
    clock.set_ms(ms((NOW + 60 + LEEWAY) * 1000));
    assert_eq!(verifier.verify(Some(&header)).await, Err(AuthError::InvalidToken(Reason::Expired)));
}

#[tokio::test]
async fn capacity_is_bounded_and_soonest_expiring_entries_go_first() {
    let key = TestKey::ec("k");
    let (verifier, _clock) = static_verifier(&key, 3);
    let headers: Vec<Vec<u8>> =
        (0..5).map(|i| bearer(&token_with(&key, json!({}), json!({"exp": NOW + 1000 + i})))).collect();
    for header in &headers {
        verifier.verify(Some(header)).await.expect("accepted");
    }
    assert_eq!(verifier.cached_tokens(), 3);
    assert_eq!(verifier.stats().signature_verifications, 5);
    // The two soonest-expiring were evicted; the latest is still warm.
    verifier.verify(Some(&headers[4])).await.expect("warm");
    assert_eq!(verifier.stats().cache_hits, 1);
    verifier.verify(Some(&headers[0])).await.expect("cold again");
    assert_eq!(verifier.stats().signature_verifications, 6);
    assert_eq!(verifier.cached_tokens(), 3);
}

#[tokio::test]
async fn zero_capacity_disables_the_cache() {
    let key = TestKey::ec("k");
    let (verifier, _clock) = static_verifier(&key, 0);
    let header = bearer(&token(&key));
    for _ in 0..3 {
        verifier.verify(Some(&header)).await.expect("accepted");
    }
    assert_eq!(verifier.stats().signature_verifications, 3);
    assert_eq!(verifier.cached_tokens(), 0);
}
