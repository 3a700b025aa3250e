//! The cleared handler: the one sequence every tool execution passes, for a request and for a
//! task worker alike — the kill switch's first phase for the operation, the allow decision made
//! durable ([`Allowed`]), the handler, and the commit-fence check on its result.
//!
//! Knows the kill-switch stage, the audit trail and the handler's signature; not the transports,
//! the envelope or how a request was authenticated (its caller hands it a verified principal).

use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value};

use crate::audit::{Allowed, AuditTrail};
use crate::auth::VerifiedPrincipal;
use crate::clearance::Cleared;
use crate::content::CallToolResult;
use crate::context::{Outcome, RequestContext};
use crate::killswitch::KillSwitchStage;
use crate::method::OperationKey;
use crate::registry::ToolHandler;

/// The kill switch's first phase for `operation`, when the server runs one (`None` without):
/// the trail then names the policy generation the decision is made under.
pub(crate) async fn clear(
    stage: Option<&KillSwitchStage>,
    operation: &OperationKey,
    principal: &VerifiedPrincipal,
    trail: &mut AuditTrail<'_>,
) -> Result<Option<Arc<Cleared>>, ProtocolError> {
    let Some(stage) = stage else { return Ok(None) };
    trail.policy_version = Some(stage.policy_version());
    stage.pre_dispatch(operation, principal).await.map(Some)
}

/// Runs a tool's handler: only with the proof that the allow decision is on the record. A tool
/// whose kill-switch rule requires a commit fence and that completes successfully without having
/// asked for one has its result refused (see [`Cleared::check_fence_obtained`]).
pub(crate) async fn run_tool(
    handler: &ToolHandler,
    ctx: RequestContext,
    arguments: Map<String, Value>,
    allowed: Allowed,
) -> Result<Outcome<CallToolResult>, ProtocolError> {
    let _on_record = allowed;
    let cleared = ctx.kill_switch.clone();
    let outcome = handler(ctx, arguments).await?;
    if let (Some(cleared), Outcome::Complete(result)) = (&cleared, &outcome)
        && !result.is_error
    {
        cleared.check_fence_obtained()?;
    }
    Ok(outcome)
}

/// Whether a refusal after the handler is the kill switch's (a fenced tool completed without
/// its fence), for the stage its audit record names.
pub(crate) fn fence_was_skipped(cleared: Option<&Arc<Cleared>>) -> bool {
    cleared.is_some_and(|cleared| cleared.fence_skipped())
}
