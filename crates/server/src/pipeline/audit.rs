//! Stage 7, audit: the allow decision made durable before any handler runs. The record and
//! its writer are the audit module's ([`AuditTrail::allow`]); this stage says which stage's
//! allow it is and hands on the [`Allowed`] proof every handler needs.
//!
//! Holds the recorder every stage's decisions go to (each request's trail is opened on it) and
//! whether a caller's trace context is continued.

use std::sync::Arc;

use palisade_wire::ProtocolError;

use crate::audit::{Allowed, AuditStage, AuditTrail, Recorder};

/// Stage 7: the recorder the request's trail writes to, and whether a caller's trace context is
/// continued (the trace id is the audit trace id).
pub(crate) struct Audit {
    recorder: Arc<Recorder>,
    continue_traces: bool,
}

impl Audit {
    /// The stage for `recorder`.
    pub(crate) fn new(recorder: Arc<Recorder>, continue_traces: bool) -> Self {
        Self { recorder, continue_traces }
    }

    /// The recorder (a request's trail is opened on it before stage 1).
    pub(super) fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// Whether a caller's `traceparent` is continued.
    pub(super) fn continue_traces(&self) -> bool {
        self.continue_traces
    }

    /// Records the allow (at the handles stage when handles were resolved, else at authorize);
    /// an error means it is not durable and the request must stop (fail closed).
    pub(super) async fn allow(&self, trail: &AuditTrail<'_>, resolved_handles: bool) -> Result<Allowed, ProtocolError> {
        let stage = if resolved_handles { AuditStage::Handles } else { AuditStage::Authorize };
        trail.allow(stage).await
    }
}
