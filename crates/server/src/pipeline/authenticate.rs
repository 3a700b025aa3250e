//! Stage 2, authenticate: the caller's credentials (the `Authorization` header, or the
//! process's environment on stdio) become a [`VerifiedPrincipal`], or the request is refused
//! with the mode's challenge. The check itself is the auth module's ([`Authenticator`]).
//!
//! Holds the authenticator only; knows nothing of the operation.

use crate::auth::{AuthRefusal, Authenticator, VerifiedPrincipal};

/// Stage 2: the server's authentication mode.
pub(crate) struct Authenticate {
    authenticator: Authenticator,
}

impl Authenticate {
    /// The stage for `authenticator`.
    pub(crate) fn new(authenticator: Authenticator) -> Self {
        Self { authenticator }
    }

    /// The authentication mode (the transports ask whether there is one).
    pub(crate) fn authenticator(&self) -> &Authenticator {
        &self.authenticator
    }

    /// Stage 2: the principal `authorization` proves, or the refusal.
    pub(crate) async fn authenticate(&self, authorization: Option<&[u8]>) -> Result<VerifiedPrincipal, AuthRefusal> {
        self.authenticator.authenticate(authorization).await
    }
}
