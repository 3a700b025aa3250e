//! Refusals: `AuthError`, the internal reasons behind it and its HTTP status (the
//! `WWW-Authenticate` challenge each refusal produces is in `challenge.rs`).
//!
//! **Invariant:** no variant carries token content. Reasons are fixed enums so a log line can say
//! *why* a token was refused without echoing any part of it; the only form a token may be logged in
//! is its short SHA-256 digest.

use std::fmt;

/// Why a request was not authenticated or not authorized.
///
/// Every variant maps to 401 except [`AuthError::InsufficientScope`] (403); see
/// [`AuthError::http_status`] and [`AuthError::www_authenticate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header was sent.
    #[error("missing bearer credentials")]
    MissingCredentials,
    /// The `Authorization` header is not a well-formed `Bearer <token68>` value (or uses another
    /// scheme).
    #[error("malformed Authorization header: {0}")]
    MalformedHeader(HeaderProblem),
    /// A bearer token was presented but refused; the reason is for logs only.
    #[error("invalid access token: {0}")]
    InvalidToken(InvalidTokenReason),
    /// The token is valid but lacks scopes; `required` lists every scope the operation needs.
    #[error("insufficient scope; required: {}", required.join(" "))]
    InsufficientScope {
        /// All scopes the operation needs (not only the missing ones), in the order given.
        required: Vec<String>,
    },
    /// The token names a configured issuer whose keys could not be obtained (JWKS endpoint down,
    /// failing, or last fetched longer ago than the staleness bound) and no usable cached key
    /// matched. Fail closed: still a 401 to the client.
    #[error("issuer {issuer} is unavailable: its signing keys could not be fetched")]
    IssuerUnavailable {
        /// The configured issuer identifier (never a value taken from an unverified token unless
        /// it matched the configuration exactly).
        issuer: String,
    },
}

/// What is wrong with an `Authorization` header value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderProblem {
    /// The value exceeds the size cap ([`crate::MAX_AUTHORIZATION_BYTES`]).
    #[error("header too large")]
    TooLarge,
    /// The value contains bytes outside visible ASCII and space.
    #[error("header contains non-printable or non-ASCII bytes")]
    NotVisibleAscii,
    /// The scheme is not `Bearer` (e.g. `Basic`); treated as "no bearer credentials".
    #[error("authorization scheme is not Bearer")]
    UnsupportedScheme,
    /// `Bearer` with no token after it.
    #[error("bearer token is empty")]
    MissingToken,
    /// Leading, trailing or repeated whitespace around the scheme or token.
    #[error("unexpected whitespace")]
    ExtraWhitespace,
    /// The credentials are not one RFC 7235 `token68` (bad characters or trailing garbage).
    #[error("credentials are not a single token68")]
    NotToken68,
}

/// Which part of a compact JWS a structural problem was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// The JOSE header (first segment).
    Header,
    /// The claims set (second segment).
    Payload,
    /// The signature (third segment).
    Signature,
}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Segment::Header => "header",
            Segment::Payload => "payload",
            Segment::Signature => "signature",
        })
    }
}

/// A JWT claim (or claim role) named in a refusal reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    /// `iss`.
    Issuer,
    /// `sub`.
    Subject,
    /// `aud`.
    Audience,
    /// `exp`.
    ExpiresAt,
    /// `nbf`.
    NotBefore,
    /// `iat`.
    IssuedAt,
    /// `scope` or `scp`.
    Scope,
    /// The configured tenant claim.
    Tenant,
    /// The configured client claim (or its `azp` fallback).
    ClientId,
    /// A configured group claim.
    Groups,
}

impl fmt::Display for ClaimKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClaimKind::Issuer => "iss",
            ClaimKind::Subject => "sub",
            ClaimKind::Audience => "aud",
            ClaimKind::ExpiresAt => "exp",
            ClaimKind::NotBefore => "nbf",
            ClaimKind::IssuedAt => "iat",
            ClaimKind::Scope => "scope",
            ClaimKind::Tenant => "tenant claim",
            ClaimKind::ClientId => "client claim",
            ClaimKind::Groups => "group claim",
        })
    }
}

/// Why a presented bearer token was refused. For logs and tests; never sent to the client
/// (the client sees only `error="invalid_token"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTokenReason {
    /// Not three dot-separated segments (e.g. 2 or 4 parts).
    #[error("not a compact JWS ({segments} segments)")]
    NotCompactJws {
        /// How many dot-separated segments the token had.
        segments: usize,
    },
    /// Five segments, or a header with `enc`/`zip`: an encrypted JWE, which we do not accept.
    #[error("encrypted tokens (JWE) are not accepted")]
    Encrypted,
    /// A segment is empty (e.g. an unsigned token with no signature).
    #[error("empty {0} segment")]
    EmptySegment(Segment),
    /// A segment is not strict unpadded base64url.
    #[error("{0} segment is not base64url")]
    BadBase64(Segment),
    /// The header or payload is not a JSON object of the expected shape (not JSON, not an
    /// object, duplicate members, wrongly typed header parameter).
    #[error("{0} segment is not a well-formed JSON object")]
    MalformedJson(Segment),
    /// The header `alg` is missing or not one we ever accept (ES256, EdDSA, RS256); covers
    /// `none` and every HMAC algorithm.
    #[error("unsupported or missing alg")]
    UnsupportedAlgorithm,
    /// The `alg` is supported in general but not in this issuer's allow-list.
    #[error("alg not allowed for this issuer")]
    AlgorithmNotAllowedForIssuer,
    /// The header carries `crit` or `b64`: extensions we do not understand must be refused.
    #[error("critical header extensions are not supported")]
    CriticalHeader,
    /// The header `typ` does not match the configured required type.
    #[error("wrong typ")]
    WrongType,
    /// No `kid` in the header.
    #[error("missing kid")]
    MissingKeyId,
    /// No key with this `kid` in the issuer's key set, even after a (rate-limited) refetch.
    #[error("unknown kid")]
    UnknownKeyId,
    /// The key named by `kid` is for a different algorithm than the header's `alg`.
    #[error("key type does not match alg")]
    KeyAlgorithmMismatch,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// A required claim is absent.
    #[error("missing {0}")]
    MissingClaim(ClaimKind),
    /// A claim has the wrong type or an invalid value.
    #[error("invalid {0}")]
    InvalidClaim(ClaimKind),
    /// `iss` is not one of the configured issuers (exact comparison).
    #[error("issuer not allowed")]
    UnknownIssuer,
    /// `aud` does not contain this resource's canonical URI.
    #[error("audience does not include this resource")]
    WrongAudience,
    /// `exp` is in the past, beyond the leeway.
    #[error("expired")]
    Expired,
    /// `nbf` is in the future, beyond the leeway.
    #[error("not yet valid")]
    NotYetValid,
    /// `iat` is in the future, beyond the leeway.
    #[error("issued in the future")]
    IssuedInFuture,
}

impl From<InvalidTokenReason> for AuthError {
    fn from(reason: InvalidTokenReason) -> Self {
        AuthError::InvalidToken(reason)
    }
}

impl From<HeaderProblem> for AuthError {
    fn from(problem: HeaderProblem) -> Self {
        AuthError::MalformedHeader(problem)
    }
}

impl AuthError {
    /// The HTTP status for this refusal: 403 for insufficient scope, 401 for everything else
    /// (including an unavailable issuer: the client should see an authentication failure, not a
    /// server error it might retry blindly).
    pub fn http_status(&self) -> u16 {
        match self {
            AuthError::InsufficientScope { .. } => 403,
            AuthError::MissingCredentials
            | AuthError::MalformedHeader(_)
            | AuthError::InvalidToken(_)
            | AuthError::IssuerUnavailable { .. } => 401,
        }
    }

    /// Whether the client presented bearer credentials (RFC 6750 §3.1: a request without any
    /// bearer credentials, or using another scheme, gets a challenge *without* an error code).
    pub fn credentials_presented(&self) -> bool {
        match self {
            AuthError::MissingCredentials | AuthError::MalformedHeader(HeaderProblem::UnsupportedScheme) => false,
            AuthError::MalformedHeader(_)
            | AuthError::InvalidToken(_)
            | AuthError::InsufficientScope { .. }
            | AuthError::IssuerUnavailable { .. } => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_never_render_token_content() {
        // Display strings are fixed: spot-check a few.
        assert_eq!(InvalidTokenReason::NotCompactJws { segments: 4 }.to_string(), "not a compact JWS (4 segments)");
        assert_eq!(InvalidTokenReason::MissingClaim(ClaimKind::Subject).to_string(), "missing sub");
        assert_eq!(
            AuthError::InvalidToken(InvalidTokenReason::BadBase64(Segment::Payload)).to_string(),
            "invalid access token: payload segment is not base64url"
        );
    }
}
