//! The cleared handler: the one call every tool execution passes, for a request and for a task
//! worker alike — only with the allow decision durable ([`Allowed`]), then the handler, then the
//! commit-fence check on its result (the kill switch's first phase ran before, in
//! `killswitch.rs`).
//!
//! Knows the audit proof and the handler's signature; not the transports,
//! the envelope or how a request was authenticated (its caller hands it a verified principal).

use palisade_wire::ProtocolError;
use serde_json::{Map, Value};

use crate::audit::Allowed;
use crate::content::CallToolResult;
use crate::context::{Outcome, RequestContext};
use crate::registry::ToolHandler;

/// Runs a tool's handler: only with the proof that the allow decision is on the record. A tool
/// whose kill-switch rule requires a commit fence and that completes successfully without having
/// asked for one has its result refused (see [`crate::clearance::Cleared::check_fence_obtained`]).
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
