//! The authentication stage and its proof type. A [`VerifiedPrincipal`] can be made only here, so
//! no later stage (and no handler) can run on a caller that was not authenticated.
//!
//! Modes: bearer JWTs checked by `palisade_auth::TokenVerifier` (control C1; every HTTP request,
//! the token itself never leaves this module), a fixed principal established from the process
//! environment (stdio, per seed 004), or unauthenticated loopback (the server refuses to bind
//! anything but a loopback address in it, see `http::bind`).

use std::collections::BTreeSet;
use std::sync::Arc;

use palisade_auth::{AuthError, TokenVerifier};

use crate::delegated::Delegated;

/// Who is calling, as established by the authentication stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPrincipal {
    issuer: String,
    subject: String,
    tenant: Option<String>,
    client_id: Option<String>,
    scopes: Scopes,
    /// Groups and roles from the configured token claims (`auth.group_claims`).
    groups: Vec<String>,
    expires_at_ms: Option<u64>,
    token_digest: Option<String>,
    bearer: Option<BearerToken>,
    /// The delegation capability the request runs under (only the delegation stage sets it).
    delegation: Option<Arc<Delegated>>,
}

/// The caller's verified bearer token, kept for exactly one use: an RFC 8693 token exchange at
/// an authorization server the operator configured (the gateway's `token_exchange` upstream
/// credential). It is never logged (`Debug` shows nothing of it), never stored (a task's
/// stored principal has none), zeroized when dropped, and never sent to an upstream.
#[derive(Clone)]
pub struct BearerToken(Arc<zeroize::Zeroizing<String>>);

impl BearerToken {
    /// The token text, for the token-exchange request body only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

impl PartialEq for BearerToken {
    fn eq(&self, other: &Self) -> bool {
        use subtle::ConstantTimeEq as _;
        self.0.as_bytes().ct_eq(other.0.as_bytes()).into()
    }
}

impl Eq for BearerToken {}

/// The token of a verified `Authorization: Bearer …` header.
fn bearer_of(authorization: Option<&[u8]>) -> Option<BearerToken> {
    let header = std::str::from_utf8(authorization?).ok()?;
    let (scheme, token) = header.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| BearerToken(Arc::new(zeroize::Zeroizing::new(token.trim().to_owned()))))
}

/// The scopes a principal holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scopes {
    /// Unauthenticated loopback mode: there is no token and therefore no scope restriction.
    Unrestricted,
    /// The scopes granted by the verified token (or the environment, on stdio).
    Granted(BTreeSet<String>),
}

impl VerifiedPrincipal {
    /// The issuer that vouched for the caller (`local` in unauthenticated mode).
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The caller's subject at that issuer.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The tenant, when the issuer names one.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The OAuth client the caller used, when known.
    pub fn client_id(&self) -> Option<&str> {
        self.client_id.as_deref()
    }

    /// The groups and roles the token's configured claims name (`auth.group_claims`), sorted.
    pub fn groups(&self) -> &[String] {
        &self.groups
    }

    /// When the credential expires (Unix ms); `None` for credentials that do not.
    pub fn expires_at_ms(&self) -> Option<u64> {
        self.expires_at_ms
    }

    /// Short SHA-256 prefix of the bearer token, the only form it may be logged in.
    pub fn token_digest(&self) -> Option<&str> {
        self.token_digest.as_deref()
    }

    /// The verified bearer token (HTTP with bearer authentication only): see [`BearerToken`].
    /// `None` under a delegation capability: the agent's token is not the principal's.
    pub fn bearer_token(&self) -> Option<&BearerToken> {
        self.bearer.as_ref()
    }

    /// The delegation capability this request runs under, as the delegation stage verified it
    /// from the ledger (`None`: the principal acts itself). The identity above is then the
    /// capability's principal, and the scopes those both the capability and the agent's token
    /// hold; [`Delegated::holder`] is the agent that called.
    pub fn delegation(&self) -> Option<&Delegated> {
        self.delegation.as_deref()
    }

    /// The capability's principal (`self`, as stored in the ledger) acting through `agent`,
    /// the verified caller presenting `delegated`: scopes both hold, the earlier expiry, the
    /// agent's token digest for logs, no bearer token.
    pub(crate) fn delegated(self, agent: &VerifiedPrincipal, delegated: Arc<Delegated>) -> Self {
        let scopes = match (&self.scopes, &agent.scopes) {
            (Scopes::Granted(own), Scopes::Granted(token)) => {
                Scopes::Granted(own.intersection(token).cloned().collect())
            }
            (Scopes::Granted(own), Scopes::Unrestricted) => Scopes::Granted(own.clone()),
            (Scopes::Unrestricted, token) => token.clone(),
        };
        let expiry = Some(delegated.expires_ms().max(0).cast_unsigned());
        let expires_at_ms = match (agent.expires_at_ms, expiry) {
            (Some(token), Some(capability)) => Some(token.min(capability)),
            (token, capability) => token.or(capability),
        };
        Self {
            scopes,
            expires_at_ms,
            token_digest: agent.token_digest.clone(),
            bearer: None,
            delegation: Some(delegated),
            ..self
        }
    }

    /// A task's stored principal with the capability its worker re-read from the ledger.
    pub(crate) fn with_delegation(self, delegated: Arc<Delegated>) -> Self {
        Self { delegation: Some(delegated), bearer: None, ..self }
    }

    /// Whether the principal holds `scope`.
    pub fn has_scope(&self, scope: &str) -> bool {
        match &self.scopes {
            Scopes::Unrestricted => true,
            Scopes::Granted(granted) => granted.contains(scope),
        }
    }

    /// The granted scopes (empty when unrestricted).
    pub fn scopes(&self) -> Vec<String> {
        match &self.scopes {
            Scopes::Unrestricted => Vec::new(),
            Scopes::Granted(granted) => granted.iter().cloned().collect(),
        }
    }

    /// The principal as a task stores it for its worker: identity and grant, never the token.
    pub(crate) fn to_stored(&self) -> serde_json::Value {
        let scopes = match &self.scopes {
            Scopes::Unrestricted => serde_json::Value::Null,
            Scopes::Granted(granted) => serde_json::json!(granted),
        };
        let mut stored = serde_json::json!({
            "issuer": self.issuer, "subject": self.subject, "tenant": self.tenant,
            "client": self.client_id, "scopes": scopes, "expiresAtMs": self.expires_at_ms,
            "groups": self.groups,
        });
        if let (Some(delegated), Some(object)) = (&self.delegation, stored.as_object_mut()) {
            object.insert("delegation".into(), crate::delegated::stored_form(delegated));
        }
        stored
    }

    /// The principal a task's worker runs as: the one the task was created under, established
    /// by the authentication stage then and stored by the pipeline (crate-private on purpose).
    /// A stored delegation is not restored here: the worker re-reads it from the ledger
    /// (`DelegationService::recheck`) before anything runs.
    pub(crate) fn from_stored(stored: &serde_json::Value) -> Option<Self> {
        let text = |key: &str| stored.get(key).and_then(serde_json::Value::as_str).map(str::to_owned);
        let scopes = match stored.get("scopes")? {
            serde_json::Value::Null => Scopes::Unrestricted,
            serde_json::Value::Array(items) => {
                Scopes::Granted(items.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
            }
            _ => return None,
        };
        Some(Self {
            issuer: text("issuer")?,
            subject: text("subject")?,
            tenant: text("tenant"),
            client_id: text("client"),
            scopes,
            groups: match stored.get("groups") {
                None => Vec::new(),
                Some(groups) => {
                    groups.as_array()?.iter().map(|g| g.as_str().map(str::to_owned)).collect::<Option<_>>()?
                }
            },
            expires_at_ms: stored.get("expiresAtMs").and_then(serde_json::Value::as_u64),
            token_digest: None,
            bearer: None,
            delegation: None,
        })
    }

    /// A stable, non-secret key for the caller's partition (issuer, subject, tenant, client,
    /// and the delegation capability it acts through), used to bind request state, cursors and
    /// stream caps to who asked: an agent's state never serves its principal, nor the reverse.
    pub fn partition_key(&self) -> String {
        let mut key = format!(
            "{}\u{1f}{}\u{1f}{}\u{1f}{}",
            self.issuer,
            self.subject,
            self.tenant.as_deref().unwrap_or(""),
            self.client_id.as_deref().unwrap_or("")
        );
        if let Some(delegated) = &self.delegation {
            key.push_str("\u{1f}delegation:");
            key.push_str(&delegated.id());
        }
        key
    }
}

/// The principal a stdio server runs as, read from its environment by the binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentPrincipal {
    /// Subject.
    pub subject: String,
    /// Tenant.
    pub tenant: Option<String>,
    /// Client id.
    pub client_id: Option<String>,
    /// Granted scopes.
    pub scopes: BTreeSet<String>,
}

/// How callers are authenticated.
#[derive(Clone)]
pub enum Authenticator {
    /// No authentication: only ever on a loopback listener or stdio, announced loudly at start.
    UnauthenticatedLoopback,
    /// Bearer JWTs on every HTTP request.
    Bearer(Arc<TokenVerifier>),
    /// stdio: one principal for the process, from its environment.
    Environment(EnvironmentPrincipal),
}

/// A refusal of the authentication or authorization stage, with its HTTP challenge.
#[derive(Debug, Clone)]
pub struct AuthRefusal {
    /// What was wrong (never token content).
    pub error: AuthError,
    /// The `WWW-Authenticate` value, when the mode has one.
    pub challenge: Option<String>,
}

impl Authenticator {
    /// Whether this mode is unauthenticated (and therefore restricted to loopback).
    pub fn is_unauthenticated(&self) -> bool {
        matches!(self, Self::UnauthenticatedLoopback)
    }

    /// The bearer verifier, in bearer mode.
    pub fn verifier(&self) -> Option<&TokenVerifier> {
        match self {
            Self::Bearer(verifier) => Some(verifier),
            _ => None,
        }
    }

    /// The authentication stage. `authorization` is the raw HTTP `Authorization` header (`None`
    /// on stdio or when absent).
    pub(crate) async fn authenticate(&self, authorization: Option<&[u8]>) -> Result<VerifiedPrincipal, AuthRefusal> {
        match self {
            Self::UnauthenticatedLoopback => Ok(VerifiedPrincipal {
                issuer: "local".into(),
                subject: "anonymous".into(),
                tenant: None,
                client_id: None,
                scopes: Scopes::Unrestricted,
                groups: Vec::new(),
                expires_at_ms: None,
                token_digest: None,
                bearer: None,
                delegation: None,
            }),
            Self::Environment(principal) => Ok(VerifiedPrincipal {
                issuer: "environment".into(),
                subject: principal.subject.clone(),
                tenant: principal.tenant.clone(),
                client_id: principal.client_id.clone(),
                scopes: Scopes::Granted(principal.scopes.clone()),
                groups: Vec::new(),
                expires_at_ms: None,
                token_digest: None,
                bearer: None,
                delegation: None,
            }),
            Self::Bearer(verifier) => match verifier.verify(authorization).await {
                Ok(claims) => Ok(VerifiedPrincipal {
                    issuer: claims.issuer().to_owned(),
                    subject: claims.subject().to_owned(),
                    tenant: claims.tenant().map(str::to_owned),
                    client_id: claims.client_id().map(str::to_owned),
                    scopes: Scopes::Granted(claims.scopes().clone()),
                    groups: claims.groups().iter().cloned().collect(),
                    expires_at_ms: Some(claims.expires_at_ms()),
                    token_digest: Some(claims.token_digest().to_owned()),
                    bearer: bearer_of(authorization),
                    delegation: None,
                }),
                Err(error) => Err(self.refusal(error)),
            },
        }
    }

    /// The authorization stage's scope check: every scope in `required`, or a 403 naming all of
    /// them so the client can step up once.
    pub(crate) fn require_scopes(&self, principal: &VerifiedPrincipal, required: &[String]) -> Result<(), AuthRefusal> {
        if required.iter().all(|scope| principal.has_scope(scope)) {
            return Ok(());
        }
        Err(self.refusal(AuthError::InsufficientScope { required: required.to_vec() }))
    }

    fn refusal(&self, error: AuthError) -> AuthRefusal {
        let challenge = self.verifier().map(|verifier| verifier.www_authenticate(&error));
        AuthRefusal { error, challenge }
    }
}
