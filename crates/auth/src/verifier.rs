//! `TokenVerifier`: the resource-server check for bearer JWTs (control C1), from raw
//! `Authorization` header bytes to `VerifiedClaims` or a refusal.
//!
//! Order of checks, cheapest and least trusting first; nothing touches the network until the
//! token is well-formed, names a configured issuer and uses an algorithm that issuer may use:
//!
//! 1. header: `Bearer <token68>`, size-capped ([`crate::header`]);
//! 2. verified-token cache by SHA-256 of the token (warm path: no signature check, but the
//!    issuer must still publish the same key under the same `kid`);
//! 3. compact JWS structure, JOSE header (`alg` ∈ {ES256, EdDSA, RS256}, no `crit`), `typ`;
//! 4. unverified `iss` → exactly one configured issuer (else refused, no fetch);
//! 5. `alg` ∈ that issuer's allow-list — the algorithm comes from configuration, the header
//!    only selects among what is allowed;
//! 6. key by `kid` from that issuer's JWKS (refresh when due, one rate-limited refetch for an
//!    unknown `kid`), and the key's own algorithm must equal `alg`;
//! 7. signature;
//! 8. claims: `exp` (required), `nbf`, `iat`, `sub` (required), `aud` ∋ resource, scopes,
//!    tenant, client;
//! 9. cache until `exp`.

use std::sync::Arc;

use aws_lc_rs::digest::{SHA256, digest};
use palisade_base::clock::{Clock, SystemClock};

use crate::cache::{CachedToken, TokenHash, VerifiedTokenCache};
use crate::claims::{VerifiedClaims, unverified_issuer, validate_claims};
use crate::config::{ConfigError, ResourceServerConfig, ValidatedConfig, ValidatedJwksSource, normalize_typ};
use crate::egress::{EgressError, EgressGuard};
use crate::error::{AuthError, InvalidTokenReason};
use crate::header::bearer_token;
use crate::jwks::{FetchContext, IssuerKeys, JwksPolicy, KeyLookupError, egress_policy};
use crate::jws::CompactJws;
use crate::keys::KeySet;
use crate::stats::{Counters, VerifierStats};

/// Verifies bearer JWTs for one resource server. Cheap to share (`Arc`); all methods take `&self`.
pub struct TokenVerifier {
    config: ValidatedConfig,
    issuer_keys: Vec<IssuerKeys>,
    clock: Arc<dyn Clock>,
    policy: JwksPolicy,
    guard: Option<EgressGuard>,
    cache: VerifiedTokenCache,
    counters: Counters,
}

impl TokenVerifier {
    /// A verifier on the system clock with the default [`JwksPolicy`].
    pub fn new(config: ResourceServerConfig) -> Result<Self, ConfigError> {
        Self::with_clock_and_policy(config, Arc::new(SystemClock), JwksPolicy::default())
    }

    /// The clock token times are checked by.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A verifier with an explicit clock and JWKS policy (tests, simulations, tuned deployments).
    pub fn with_clock_and_policy(
        config: ResourceServerConfig,
        clock: Arc<dyn Clock>,
        policy: JwksPolicy,
    ) -> Result<Self, ConfigError> {
        crate::install_crypto_provider();
        let policy = policy.normalized();
        let mut config = ValidatedConfig::new(config)?;
        let egress = egress_policy(
            &policy,
            config.raw.jwks_allow_loopback,
            config.jwks_allowed_networks.clone(),
            config.jwks_proxy.clone(),
        );
        // Only an issuer with a JWKS URL needs the guard's HTTP client.
        let remote = config.issuers.iter().any(|issuer| matches!(issuer.jwks, ValidatedJwksSource::Url(_)));
        let guard = match remote {
            true => Some(EgressGuard::new(egress).map_err(|e| ConfigError::HttpClient(e.to_string()))?),
            false => None,
        };
        let mut issuer_keys = Vec::with_capacity(config.issuers.len());
        for issuer in &mut config.issuers {
            match std::mem::replace(&mut issuer.jwks, ValidatedJwksSource::Static(KeySet::default())) {
                ValidatedJwksSource::Static(keys) => issuer_keys.push(IssuerKeys::Static(keys)),
                ValidatedJwksSource::Url(url) => {
                    // What the guard refuses before sending is refused here, at start.
                    if let Some(guard) = &guard {
                        guard.check_url(&url).map_err(|source| ConfigError::JwksNotAllowed {
                            url: url.to_string(),
                            hint: jwks_hint(&source),
                            source,
                        })?;
                    }
                    issuer_keys.push(IssuerKeys::remote(&issuer.issuer, url, issuer.algorithms.clone()));
                }
            }
        }
        let cache = VerifiedTokenCache::new(config.raw.cache_capacity);
        Ok(Self { config, issuer_keys, clock, policy, guard, cache, counters: Counters::default() })
    }

    /// The configuration this verifier was built from (already validated).
    pub fn config(&self) -> &ResourceServerConfig {
        &self.config.raw
    }

    /// Counters since construction.
    pub fn stats(&self) -> VerifierStats {
        self.counters.snapshot()
    }

    /// Number of tokens currently in the verified-token cache.
    pub fn cached_tokens(&self) -> usize {
        self.cache.len()
    }

    /// The `WWW-Authenticate` value for `error` under this verifier's configuration.
    pub fn www_authenticate(&self, error: &AuthError) -> String {
        error.www_authenticate(&self.config.raw)
    }

    /// Checks the raw value of the request's `Authorization` header (`None` when absent).
    ///
    /// The caller must refuse a request carrying more than one `Authorization` header rather than
    /// pick one. Refusals are logged at debug level with the token's short digest and the reason,
    /// never the token.
    pub async fn verify(&self, authorization: Option<&[u8]>) -> Result<VerifiedClaims, AuthError> {
        let token = bearer_token(authorization)?;
        let hash: TokenHash = {
            let mut out = [0u8; 32];
            out.copy_from_slice(digest(&SHA256, token.as_bytes()).as_ref());
            out
        };
        let result = self.verify_token(token, &hash).await;
        if let Err(error) = &result {
            tracing::debug!(token = %short_hex(&hash), %error, "bearer token refused");
        }
        result
    }

    fn fetch_context(&self) -> FetchContext<'_> {
        FetchContext {
            clock: self.clock.as_ref(),
            guard: self.guard.as_ref(),
            policy: &self.policy,
            counters: &self.counters,
        }
    }

    async fn verify_token(&self, token: &str, hash: &TokenHash) -> Result<VerifiedClaims, AuthError> {
        let ctx = self.fetch_context();
        if let Some(hit) = self.cache.get(hash, self.clock.now_unsigned_ms()) {
            let keys = &self.issuer_keys[hit.issuer_index];
            match keys.still_publishes(&ctx, &hit.kid, &hit.key_fingerprint).await {
                Ok(true) => {
                    self.counters.cache_hit();
                    return Ok(hit.claims);
                }
                Ok(false) => self.cache.remove(hash),
                Err(_) => return Err(self.unavailable(hit.issuer_index)),
            }
        }

        let jws = CompactJws::parse(token)?;
        if let Some(required) = &self.config.required_typ {
            let typ_matches = jws.header.typ.as_deref().is_some_and(|typ| normalize_typ(typ) == *required);
            if !typ_matches {
                return Err(InvalidTokenReason::WrongType.into());
            }
        }
        let iss = unverified_issuer(&jws.payload)?;
        let issuer_index = self.config.issuer_index(iss).ok_or(InvalidTokenReason::UnknownIssuer)?;
        let issuer = &self.config.issuers[issuer_index];
        if !issuer.algorithms.contains(&jws.header.alg) {
            return Err(InvalidTokenReason::AlgorithmNotAllowedForIssuer.into());
        }
        let kid = jws.header.kid.as_deref().ok_or(InvalidTokenReason::MissingKeyId)?;
        let key = match self.issuer_keys[issuer_index].key(&ctx, kid).await {
            Ok(key) => key,
            Err(KeyLookupError::UnknownKid) => return Err(InvalidTokenReason::UnknownKeyId.into()),
            Err(KeyLookupError::IssuerUnavailable) => return Err(self.unavailable(issuer_index)),
        };
        if key.alg() != jws.header.alg {
            return Err(InvalidTokenReason::KeyAlgorithmMismatch.into());
        }
        self.counters.signature_verification();
        if !key.verify(jws.signing_input, &jws.signature) {
            return Err(InvalidTokenReason::BadSignature.into());
        }
        // Read the clock after any fetch, which may have taken seconds.
        let now = self.clock.now_unsigned_ms();
        let claims = validate_claims(&jws.payload, &self.config, &issuer.issuer, now, short_hex(hash))?;
        self.cache.insert(
            *hash,
            CachedToken {
                claims: claims.clone(),
                issuer_index,
                kid: kid.to_owned(),
                key_fingerprint: *key.fingerprint(),
            },
            now,
        );
        Ok(claims)
    }

    fn unavailable(&self, issuer_index: usize) -> AuthError {
        AuthError::IssuerUnavailable { issuer: self.config.issuers[issuer_index].issuer.clone() }
    }
}

/// The first 8 bytes of a SHA-256, as 16 lower-case hex digits.
pub(crate) fn short_hex(hash: &TokenHash) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(16);
    for byte in &hash[..8] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

/// What would let a refused JWKS URL through, when it should be possible at all.
fn jwks_hint(refusal: &EgressError) -> &'static str {
    match refusal {
        EgressError::UrlNotAllowed("plain http") => {
            " (plain http only to a loopback host with jwks_allow_loopback, for development)"
        }
        EgressError::AddressNotAllowed(refusal) if refusal.reason == "loopback" => {
            " (loopback issuers need jwks_allow_loopback, for development)"
        }
        EgressError::AddressNotAllowed(_) => {
            " (a deliberately internal issuer's network belongs in jwks_allowed_networks)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_hex_is_16_lowercase_digits() {
        let mut hash = [0u8; 32];
        hash[0] = 0xab;
        hash[7] = 0x0f;
        hash[8] = 0xff;
        assert_eq!(short_hex(&hash), "ab0000000000000f");
    }

    #[test]
    fn verifier_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TokenVerifier>();
    }
}
