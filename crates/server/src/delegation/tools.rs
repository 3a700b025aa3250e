//! The Palisade-provided delegation tools ([`DELEGATE_TOOL`], [`REVOKE_TOOL`],
//! [`APPROVE_TOOL`]): their definitions, argument parsing and answers, each a thin call into the
//! service in `delegation/mod.rs` after the kill switch's second phase.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use palisade_wire::ProtocolError;
use serde_json::{Value, json};

use super::{
    APPROVE_TOOL, DELEGATE_TOOL, DelegationError, DelegationService, MAX_GRANT_ENTRIES, MintRequest, REVOKE_TOOL,
};
use crate::content::CallToolResult;
use crate::context::{Outcome, RequestContext};
use crate::delegated::Grant;
use crate::registry::ToolDef;

impl DelegationService {
    /// The Palisade-provided tools: [`DELEGATE_TOOL`], [`REVOKE_TOOL`] and [`APPROVE_TOOL`]
    /// (which needs the principal's confirmation on its own client). Add them to the
    /// application (`AppBuilder::tool`) and give the server the same service
    /// (`ServerBuilder::delegation`).
    pub fn tools(self: &Arc<Self>) -> Vec<ToolDef> {
        let string_list = json!({ "type": "array", "items": { "type": "string" }, "maxItems": MAX_GRANT_ENTRIES });
        let minting = self.clone();
        let delegate = ToolDef::new(DELEGATE_TOOL)
            .description(
                "Delegate part of your authority to another agent: a capability that can only narrow \
                 (tools, resources, prompts, scopes, handles, lifetime, call budget). Returns the capability \
                 reference to hand to that agent, which presents it in _meta under dev.palisade/capability.",
            )
            .input_schema(json!({
                "type": "object",
                "properties": {
                    "agent": { "type": "string", "description": "the agent's token subject" },
                    "agentClient": { "type": "string", "description": "the agent's OAuth client id" },
                    "tools": string_list, "resources": string_list, "prompts": string_list,
                    "scopes": string_list, "handles": string_list,
                    "toolCalls": { "type": "object", "additionalProperties": { "type": "integer", "minimum": 0 },
                                   "description": "per-tool call budgets within calls, by exact tool name" },
                    "expiresInSeconds": { "type": "integer", "minimum": 1 },
                    "calls": { "type": "integer", "minimum": 0 },
                    "parentTask": { "type": "string" }
                },
                "required": ["agent", "agentClient", "expiresInSeconds", "calls"],
                "additionalProperties": false
            }))
            .handler(move |ctx, args| {
                let service = minting.clone();
                async move {
                    let list = |key: &str| -> BTreeSet<String> {
                        args.get(key)
                            .and_then(Value::as_array)
                            .map(|items| items.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                            .unwrap_or_default()
                    };
                    let text = |key: &str| args.get(key).and_then(Value::as_str).map(str::to_owned);
                    let request = MintRequest {
                        agent: text("agent").unwrap_or_default(),
                        agent_client: text("agentClient").unwrap_or_default(),
                        grant: Grant {
                            tools: list("tools"),
                            resources: list("resources"),
                            prompts: list("prompts"),
                            scopes: list("scopes"),
                            handles: BTreeSet::new(),
                            tool_calls: args
                                .get("toolCalls")
                                .and_then(Value::as_object)
                                .map(|counts| {
                                    counts
                                        .iter()
                                        .map(|(tool, count)| (tool.clone(), count.as_i64().unwrap_or(-1)))
                                        .collect()
                                })
                                .unwrap_or_default(),
                        },
                        handles: list("handles").into_iter().collect(),
                        lifetime: Duration::from_secs(
                            args.get("expiresInSeconds").and_then(Value::as_u64).unwrap_or(0),
                        ),
                        calls: args.get("calls").and_then(Value::as_i64).unwrap_or(-1),
                        parent_task: text("parentTask"),
                    };
                    second_phase(&ctx).await?;
                    answer(service.mint(ctx.principal(), request).await.map(|minted| {
                        json!({ "capability": minted.capability, "id": minted.id, "depth": minted.depth,
                                "expiresAtMs": minted.expires_ms, "calls": minted.calls })
                    }))
                }
            });
        let revoking = self.clone();
        let revoke = ToolDef::new(REVOKE_TOOL)
            .description("Revoke a delegation capability by its id; everything minted under it stops at once.")
            .input_schema(json!({
                "type": "object", "properties": { "id": { "type": "string" } },
                "required": ["id"], "additionalProperties": false
            }))
            .handler(move |ctx, args| {
                let service = revoking.clone();
                async move {
                    let id = args.get("id").and_then(Value::as_str).unwrap_or_default();
                    second_phase(&ctx).await?;
                    answer(service.revoke(ctx.principal(), id).await.map(|revoked| json!({ "revoked": revoked })))
                }
            });
        let approving = self.clone();
        let approve = ToolDef::new(APPROVE_TOOL)
            .description(
                "Approve one concrete call an agent wants to make under your delegation: exactly this tool \
                 with exactly these arguments, once, for the next 10 minutes.",
            )
            .input_schema(json!({
                "type": "object",
                "properties": { "capability": { "type": "string" }, "tool": { "type": "string" },
                                "arguments": { "type": "object" } },
                "required": ["capability", "tool", "arguments"], "additionalProperties": false
            }))
            .confirm_with(|_ctx, args| {
                let tool = args.get("tool").and_then(Value::as_str).unwrap_or_default();
                let shown =
                    crate::content::shortened(args.get("arguments").cloned().unwrap_or(Value::Null).to_string(), 400);
                Ok(format!("Let the delegated agent call {tool} once with {shown}"))
            })
            .handler(move |ctx, args| {
                let service = approving.clone();
                async move {
                    let text = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
                    let arguments = args.get("arguments").and_then(Value::as_object).cloned().unwrap_or_default();
                    second_phase(&ctx).await?;
                    let (capability, tool) = (text("capability"), text("tool"));
                    let approved = service.approve(ctx.principal(), &capability, &tool, &arguments).await;
                    answer(approved.map(|key| json!({ "approval": key })))
                }
            });
        vec![delegate, revoke, approve]
    }
}

/// The kill switch's second phase before a delegation tool writes the ledger (DISABLE since
/// dispatch refuses the write). Its fence tokens are not redeemed in the ledger's transaction:
/// the ledger lives in the store, not beside the authority.
async fn second_phase(ctx: &RequestContext) -> Result<(), ProtocolError> {
    if ctx.has_kill_switch() {
        ctx.pre_side_effect().await?;
    }
    Ok(())
}

/// A delegation tool's answer: its result, a refusal as a tool error the caller can read, or a
/// ledger outage as 503 (nothing was done).
fn answer(result: Result<Value, DelegationError>) -> Result<Outcome<CallToolResult>, ProtocolError> {
    match result {
        Ok(value) => Ok(Outcome::Complete(CallToolResult::structured(value))),
        Err(DelegationError::Unavailable) => Err(ProtocolError::Unavailable),
        Err(refused) => Ok(Outcome::Complete(CallToolResult::error(refused.to_string()))),
    }
}
