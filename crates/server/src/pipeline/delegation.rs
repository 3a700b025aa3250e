//! Stage 3b, delegation (control C10): a request carrying a capability reference in `_meta`
//! (`dev.palisade/capability`) beside the agent's own token is looked up in the ledger (the chain
//! in one statement: every ancestor live, the caller its holder) and from here on runs as the
//! capability's principal with the scopes both the capability and the token hold. The method must
//! be one a capability can use and the registered tool, resource or prompt must be inside its
//! grant. The call budget is spent later, just before the allow ([`DelegationStage::spend`]),
//! so a request refused by the kill switch, the scopes or the handles costs nothing.
//!
//! Holds the delegation service (when the server accepts capabilities); knows the operation key;
//! nothing about transports or handlers.

use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value};

use crate::audit::AuditTrail;
use crate::auth::VerifiedPrincipal;
use crate::delegation::{CAPABILITY_META_KEY, DELEGATE_TOOL, DelegationService, Grant, REVOKE_TOOL, refusal};
use crate::method::{Method, OperationKey};

/// Whether a capability's holder may use `operation` at all, and the target is inside `grant`.
/// Lists, discovery and the capability's own tasks carry no target; `subscriptions/listen`,
/// completions and the 2025-era session methods are not available under a capability.
fn inside(operation: &OperationKey, grant: &Grant) -> Result<(), &'static str> {
    let target = operation.target().unwrap_or_default();
    match operation.method() {
        Method::ToolsCall if target == DELEGATE_TOOL || target == REVOKE_TOOL => Ok(()),
        Method::ToolsCall if grant.allows_tool(target) => Ok(()),
        Method::ResourcesRead if grant.allows_resource(target) => Ok(()),
        Method::PromptsGet if grant.allows_prompt(target) => Ok(()),
        Method::ToolsCall | Method::ResourcesRead | Method::PromptsGet => Err(refusal::TARGET),
        Method::Discover
        | Method::ToolsList
        | Method::ResourcesList
        | Method::ResourceTemplatesList
        | Method::PromptsList
        | Method::TasksGet
        | Method::TasksUpdate
        | Method::TasksCancel
        | Method::Ping => Ok(()),
        _ => Err(refusal::METHOD),
    }
}

/// Whether a request spends a call of the budget: an operation on the application's tools,
/// resources or prompts. Minting and revoking (the delegation tools) spend nothing: a child's
/// budget is reserved from the parent's when it is minted.
fn spends(operation: &OperationKey) -> bool {
    match operation.method() {
        Method::ToolsCall => !matches!(operation.target(), Some(DELEGATE_TOOL | REVOKE_TOOL)),
        Method::ResourcesRead | Method::PromptsGet => true,
        _ => false,
    }
}

/// Stage 3b (and the budget spent in 6b): the delegation service, when the server has one.
pub(crate) struct DelegationStage {
    delegation: Option<Arc<DelegationService>>,
}

impl DelegationStage {
    /// The stage for `delegation` (without one a presented capability is refused).
    pub(crate) fn new(delegation: Option<Arc<DelegationService>>) -> Self {
        Self { delegation }
    }

    /// Stage 3b: the principal the rest of the path runs as — `principal` itself when no
    /// capability is presented, else the capability's principal narrowed to it.
    pub(super) async fn resolve(
        &self,
        operation: &OperationKey,
        principal: Arc<VerifiedPrincipal>,
        params: &Map<String, Value>,
        audit: &mut AuditTrail<'_>,
    ) -> Result<Arc<VerifiedPrincipal>, ProtocolError> {
        let Some(presented) = params.get("_meta").and_then(|meta| meta.get(CAPABILITY_META_KEY)) else {
            return Ok(principal);
        };
        let reference = presented.as_str().unwrap_or_default();
        audit.presented_capability(&crate::handles::sha256(reference.as_bytes()));
        // A capability sent to a server that would ignore it must not run with the agent's own,
        // wider authority: refused.
        let Some(service) = &self.delegation else {
            return Err(ProtocolError::DelegationRefused { reason: refusal::NOT_ACCEPTED });
        };
        let delegated = service.resolve(reference, &principal).await.map_err(|(error, why)| {
            tracing::info!(stage = "delegation", decision = "deny", why, "capability refused");
            error
        })?;
        let capability = delegated.delegation().ok_or(ProtocolError::Internal)?;
        audit.delegation(capability, &service.agent_digest(&capability.holder().subject));
        if let Err(reason) = inside(operation, capability.grant()) {
            return Err(ProtocolError::DelegationRefused { reason });
        }
        let delegated = Arc::new(delegated);
        // From here on the record is about the principal the agent acts for.
        audit.principal(&delegated);
        Ok(delegated)
    }

    /// Spends one call of the capability's budget, after every other check and before the allow
    /// (one store statement: exactly the budget succeeds under any concurrency, on any instance).
    pub(super) async fn spend(
        &self,
        operation: &OperationKey,
        principal: &VerifiedPrincipal,
    ) -> Result<(), ProtocolError> {
        match (principal.delegation(), &self.delegation) {
            (Some(capability), Some(service)) if spends(operation) => {
                let tool = (operation.method() == Method::ToolsCall).then(|| operation.target()).flatten();
                service.spend(capability, tool).await
            }
            _ => Ok(()),
        }
    }
}
