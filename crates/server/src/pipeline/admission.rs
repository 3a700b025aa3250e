//! The 2025-era transport's requests that are not JSON-RPC requests (the GET stream, DELETE,
//! notifications, answers to server requests): stage 2 (authenticate), stage 2b (the caller's
//! own session) and stage 4 (the kill switch's first phase) for a `Session*` operation, audited
//! like every other decision; and the refusal of a malformed session id (authentication first).
//!
//! Borrows the stages it runs; holds nothing of its own.

use std::sync::Arc;

use palisade_wire::ProtocolError;

use super::stages::Stages;
use crate::audit::{AuditStage, AuditTrail};
use crate::auth::VerifiedPrincipal;
use crate::clearance::Cleared;
use crate::method::{Method, OperationKey};
use crate::reply::Reply;
use crate::sessions::{Admitted, SessionId};

impl Stages {
    /// For the 2025-era transport's requests that are not JSON-RPC requests (the GET stream,
    /// DELETE, notifications, answers to server requests): authenticate, admit the session for
    /// that principal, then the kill switch for `method` (one of the `Session*` operations, in
    /// the signed registry like every other). Audited like every other decision. The clearance
    /// is what a GET stream watches to end on a DISABLE.
    pub(crate) async fn admit_session(
        &self,
        authorization: Option<&[u8]>,
        session: Option<&SessionId>,
        method: Method,
    ) -> Result<(Arc<VerifiedPrincipal>, Admitted, Option<Arc<Cleared>>), Reply> {
        let mut audit = AuditTrail::new(self.audit.recorder(), method.as_str());
        let principal = match self.authenticate.authenticate(authorization).await {
            Ok(principal) => Arc::new(principal),
            Err(refusal) => {
                let error = ProtocolError::Unauthenticated;
                return Err(audit.refuse_any(None, AuditStage::Authenticate, &error, refusal.challenge).await);
            }
        };
        audit.principal(&principal);
        let Some(session) = session else {
            let error = ProtocolError::InvalidRequest("an Mcp-Session-Id header is required");
            return Err(audit.refuse_any(None, AuditStage::Session, &error, None).await);
        };
        let Some(service) = self.session.sessions() else {
            return Err(audit.refuse_any(None, AuditStage::Session, &ProtocolError::Unavailable, None).await);
        };
        let admitted = match service.admit(&principal, session, self.session.clock.as_ref()).await {
            Ok(admitted) => admitted,
            Err(error) => return Err(audit.refuse_any(None, AuditStage::Session, &error, None).await),
        };
        let operation = OperationKey::new(method, None);
        audit.operation(&operation);
        let cleared = match self.kill_switch.clear(&operation, &principal, &mut audit).await {
            Ok(cleared) => cleared,
            Err(error) => return Err(audit.refuse_any(None, AuditStage::KillSwitch, &error, None).await),
        };
        if let Err(error) = audit.allow(AuditStage::Session).await {
            return Err(audit.refuse_any(None, AuditStage::Audit, &error, None).await);
        }
        Ok((principal, admitted, cleared))
    }

    /// A 2025-era request whose `Mcp-Session-Id` is malformed or repeated: it can name no
    /// session, but authentication still comes first (401 with its challenge, whatever the
    /// session id), then the same 404 as an unknown session. Audited like every refusal.
    pub(crate) async fn refuse_malformed_session(&self, authorization: Option<&[u8]>, what: &str) -> Reply {
        let mut audit = AuditTrail::new(self.audit.recorder(), what);
        match self.authenticate.authenticate(authorization).await {
            Ok(principal) => {
                audit.principal(&Arc::new(principal));
                audit.refuse_any(None, AuditStage::Session, &ProtocolError::SessionNotFound, None).await
            }
            Err(refusal) => {
                audit
                    .refuse_any(None, AuditStage::Authenticate, &ProtocolError::Unauthenticated, refusal.challenge)
                    .await
            }
        }
    }
}
