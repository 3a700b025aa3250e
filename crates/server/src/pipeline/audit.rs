//! Stage 7, audit: the allow decision made durable before any handler runs. The record and
//! its writer are the audit module's ([`AuditTrail::allow`]); this stage says which stage's
//! allow it is and hands on the [`Allowed`] proof every handler needs.
//!
//! Holds nothing: the request's trail carries the recorder.

use palisade_wire::ProtocolError;

use crate::audit::{Allowed, AuditStage, AuditTrail};

/// Stage 7: the allow, recorded.
pub(crate) struct Audit;

impl Audit {
    /// Records the allow (at the handles stage when handles were resolved, else at authorize);
    /// an error means it is not durable and the request must stop (fail closed).
    pub(super) async fn allow(&self, trail: &AuditTrail<'_>, resolved_handles: bool) -> Result<Allowed, ProtocolError> {
        let stage = if resolved_handles { AuditStage::Handles } else { AuditStage::Authorize };
        trail.allow(stage).await
    }
}
