//! OAuth 2.1 resource-server checks for Palisade (control C1): bearer JWT verification against
//! issuer JWKS, RFC 6750/9728 challenges, Protected Resource Metadata, and a development issuer.
//!
//! # Bird's-eye view
//!
//! [`TokenVerifier::verify`] takes the raw `Authorization` header and returns [`VerifiedClaims`]
//! (the principal `iss#sub`, tenant, client, scopes, expiry and a short token digest) or an
//! [`AuthError`] that knows its HTTP status and its exact `WWW-Authenticate` challenge.
//! [`check_scopes`] turns a missing scope into a 403 naming every needed scope.
//! [`protected_resource_metadata`] and [`metadata_paths`] publish RFC 9728 metadata.
//! [`dev_issuer::DevIssuer`] mints ES256 tokens for the demo, and
//! [`authorization_server::DevAuthorizationServer`] makes it a small OAuth 2.1 authorization
//! server for the demo (development only). [`egress::EgressGuard`] is the one way a URL chosen by
//! someone else is fetched (SSRF controls).
//!
//! **API Boundary:** this crate knows HTTP only as header bytes, status numbers and the plain
//! request/response values of the authorization server; it knows
//! neither axum nor JSON-RPC. The server crate calls `verify` once per request and hands the
//! `VerifiedClaims` on by value; nothing outside this crate can construct one.
//!
//! # Invariants
//!
//! - **The algorithm comes from configuration.** Each issuer has an allow-list within
//!   {ES256, EdDSA, RS256}; HMAC and `none` cannot be configured and are refused in headers
//!   before any key is looked up. Each loaded key is bound to exactly one algorithm (P-256 →
//!   ES256, RSA → RS256, Ed25519 → EdDSA; symmetric keys are never loaded), and the header's
//!   `alg` must equal it: no key confusion.
//! - **Keys come only from the issuer's configured JWKS**, selected by the unverified `iss`
//!   matched *exactly* against the configured issuers; header `jku`/`jwk`/`x5u`/`x5c` are ignored.
//!   An unknown issuer is refused without any network traffic.
//! - **Audience is this resource.** `aud` (string or array) must contain the configured
//!   canonical resource URI byte for byte; tokens for any other audience are refused, and tokens
//!   are never forwarded anywhere.
//! - **Fail closed.** No usable key set (IdP down past the staleness bound, or down while an
//!   unknown `kid` arrives) ⇒ [`AuthError::IssuerUnavailable`], a 401. Stale-if-error is bounded
//!   by [`JwksPolicy::max_key_age`].
//! - **Tokens are never logged or echoed.** Refusal reasons are fixed enums; the cache is keyed by
//!   SHA-256; the only loggable form is [`VerifiedClaims::token_digest`].
//! - **Time is injected** ([`palisade_base::clock::Clock`]; token times in whole seconds come from
//!   its `now_secs`, nowhere else): tests move a `ManualClock` instead of sleeping.
//!
//! # Design notes
//!
//! *Why not `jsonwebtoken::decode`.* Its time checks read the system clock (we need the injected
//! clock, for tests and for one consistent notion of "now"), it accepts `iss` as an array and
//! rounds fractional dates to nearest, and it re-parses the public key on every verification.
//! We parse the compact JWS ourselves (strict base64url, duplicate JSON members refused, `crit`
//! refused), verify with keys pre-parsed at JWKS load (aws-lc-rs `ParsedPublicKey` for
//! ES256/RS256, ed25519-dalek `verify_strict` plus `is_weak` for EdDSA, because aws-lc-rs accepts
//! small-order Ed25519 keys), and check claims with the bounded leeway. `jsonwebtoken` supplies
//! the `JwkSet` type and signs development tokens.
//!
//! *Crypto provider.* jsonwebtoken 12 resolves its provider from crate features when exactly one
//! of `aws_lc_rs`/`rust_crypto` is enabled, and panics on first use otherwise (e.g. if some other
//! crate in the build enables `rust_crypto` too). [`install_crypto_provider`] installs the aws-lc
//! provider explicitly and idempotently; [`TokenVerifier`] and [`dev_issuer::DevIssuer`] call it,
//! so the crate works in tests without the binary. (reqwest's `rustls` feature falls back to its
//! own aws-lc-rs provider when no rustls process default is installed.)
//!
//! *JWKS caching.* See [`JwksPolicy`]: refresh every 5 min, refuse keys older than 15 min,
//! at most one fetch attempt per issuer per 30 s (this one limit covers unknown-`kid` refetches,
//! refreshes and retries after failures), single flight, 5 s timeout, 64 KiB cap counted on the
//! stream, redirects off, every fetch through [`egress::EgressGuard`] (public addresses only
//! unless [`ResourceServerConfig::jwks_allow_loopback`] or
//! [`ResourceServerConfig::jwks_allowed_networks`] say otherwise; a proxy only when
//! [`ResourceServerConfig::jwks_proxy`] names one). Rotation: a new `kid` is picked up by the unknown-`kid`
//! refetch; a removed key stops working at the next refresh, including for cached tokens.
//!
//! *Verified-token cache.* Keyed by SHA-256 of the token, entries live until the token's `exp`,
//! capacity-bounded (soonest-expiring evicted first). A hit skips parsing and the signature
//! check but still requires the issuer to publish the same key (by fingerprint) under the same
//! `kid`, so key removal revokes cached tokens at the next refresh.
//!
//! *Challenges.* A request without bearer credentials (or with another scheme) gets
//! `Bearer resource_metadata="…", scope="…"` with no error code (RFC 6750 §3.1); any presented
//! but refused bearer credential gets `error="invalid_token"` and 401 — malformed headers
//! included, so MCP clients always see the resource-metadata challenge rather than a bare 400.
//!
//! Layers, low to high: `egress`, `error`, `stats` → `header`, `jws`, `keys` → `config`, `jwks` →
//! `challenge`, `claims`, `metadata` → `cache`, `verifier` → `dev_issuer` → `authorization_server`.

#![forbid(unsafe_code)]

pub mod authorization_server;
mod cache;
mod challenge;
mod claims;
mod config;
pub mod dev_issuer;
pub mod egress;
mod error;
mod header;
mod jwks;
mod jws;
mod keys;
mod metadata;
mod stats;
mod verifier;

pub use claims::{VerifiedClaims, check_scopes};
pub use config::{
    ConfigError, IssuerConfig, JwksSource, MAX_CACHE_CAPACITY, MAX_LEEWAY_SECS, ResourceServerConfig, UrlProblem,
};
pub use error::{AuthError, ClaimKind, HeaderProblem, InvalidTokenReason, Segment};
pub use header::MAX_AUTHORIZATION_BYTES;
pub use jsonwebtoken::Algorithm;
pub use jsonwebtoken::jwk::JwkSet;
pub use jwks::JwksPolicy;
pub use keys::KeySetError;
pub use metadata::{PROTECTED_RESOURCE_WELL_KNOWN, metadata_paths, protected_resource_metadata};
pub use stats::VerifierStats;
pub use verifier::TokenVerifier;

/// Installs jsonwebtoken's aws-lc-rs crypto provider as its process default, if no provider is
/// installed yet. Idempotent and cheap; safe to call from any thread, any number of times.
///
/// The binary should still call it (with rustls's `install_default`) first thing in `main`.
pub fn install_crypto_provider() {
    if jsonwebtoken::crypto::CryptoProvider::try_get_default().is_none() {
        // Losing a race to another installer is fine: some provider is then installed.
        let _ = jsonwebtoken::crypto::aws_lc::DEFAULT_PROVIDER.install_default();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn crypto_provider_install_is_idempotent() {
        super::install_crypto_provider();
        super::install_crypto_provider();
        assert!(jsonwebtoken::crypto::CryptoProvider::try_get_default().is_some());
    }
}
