//! The authentication stage and its proof type. A [`VerifiedPrincipal`] can be made only here, so
//! no later stage (and no handler) can run on a caller that was not authenticated.
//!
//! Today the only mode is unauthenticated loopback: the server refuses to bind anything but a
//! loopback address in it (see `http::serve`). Bearer-token verification (control C1) plugs in
//! as another [`Authenticator`] variant.

use std::collections::BTreeSet;

/// Who is calling, as established by the authentication stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPrincipal {
    issuer: String,
    subject: String,
    tenant: Option<String>,
    client_id: Option<String>,
    scopes: Scopes,
}

/// The scopes a principal holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scopes {
    /// Unauthenticated loopback mode: there is no token and therefore no scope restriction.
    Unrestricted,
    /// The scopes granted by the verified token.
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

    /// Whether the principal holds `scope`.
    pub fn has_scope(&self, scope: &str) -> bool {
        match &self.scopes {
            Scopes::Unrestricted => true,
            Scopes::Granted(granted) => granted.contains(scope),
        }
    }

    /// A stable, non-secret key for the caller's partition (issuer, subject, tenant, client),
    /// used to bind request state and cursors to who asked.
    pub fn partition_key(&self) -> String {
        format!(
            "{}\u{1f}{}\u{1f}{}\u{1f}{}",
            self.issuer,
            self.subject,
            self.tenant.as_deref().unwrap_or(""),
            self.client_id.as_deref().unwrap_or("")
        )
    }
}

/// How callers are authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authenticator {
    /// No authentication: only ever on a loopback listener or stdio, announced loudly at start.
    UnauthenticatedLoopback,
}

impl Authenticator {
    /// Whether this mode is unauthenticated (and therefore restricted to loopback).
    pub fn is_unauthenticated(&self) -> bool {
        matches!(self, Self::UnauthenticatedLoopback)
    }

    /// The authentication stage.
    pub(crate) fn authenticate(&self) -> VerifiedPrincipal {
        match self {
            Self::UnauthenticatedLoopback => VerifiedPrincipal {
                issuer: "local".into(),
                subject: "anonymous".into(),
                tenant: None,
                client_id: None,
                scopes: Scopes::Unrestricted,
            },
        }
    }
}
