//! Stage 3c, policy: the operator's Cedar policies ([`crate::policy::Policies`]) decide the
//! operation for the principal it runs as (after delegation, so a capability's principal and its
//! agent chain are what a policy sees), before the kill switch and every later check. With no
//! policies configured the stage allows everything and the scope rules of stage 5 are the
//! built-in policy. A refusal is `PolicyDenied` with a fixed reason; the audit record names the
//! policy set's digest and the ids of the policies that decided, for allows and refusals alike.
//!
//! Holds the current policy set (swapped whole by `Server::publish_policies`) and the clock;
//! knows the principal, the operation and the call's arguments; nothing about handles or the
//! kill switch.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use palisade_wire::ProtocolError;
use serde_json::{Map, Value};

use crate::audit::AuditTrail;
use crate::auth::VerifiedPrincipal;
use crate::clock::Clock;
use crate::method::OperationKey;
use crate::policy::{Policies, PolicyRequest, PrincipalView, Verdict};
use crate::registry::App;

/// At most this many deciding policy ids go in one audit record (the rest are counted).
const MAX_AUDITED_IDS: usize = 16;

/// Stage 3c: the policy set in force (none: the built-in scope rules only) and the clock.
pub(crate) struct PolicyStage {
    policies: Arc<ArcSwapOption<Policies>>,
    clock: Arc<dyn Clock>,
}

impl PolicyStage {
    /// The stage with `policies` in force (the list filter of dispatch reads the same cell).
    pub(crate) fn new(policies: Arc<ArcSwapOption<Policies>>, clock: Arc<dyn Clock>) -> Self {
        Self { policies, clock }
    }

    /// Puts `policies` in force for every request that starts from now on.
    pub(crate) fn publish(&self, policies: Option<Arc<Policies>>) {
        self.policies.store(policies);
    }

    /// The policy set in force.
    pub(crate) fn current(&self) -> Option<Arc<Policies>> {
        self.policies.load_full()
    }

    /// Stage 3c: whether the policies allow `operation` for `principal`. `legacy`: the request
    /// came on the 2025-era session wire.
    pub(super) fn decide(
        &self,
        app: &App,
        operation: &OperationKey,
        principal: &VerifiedPrincipal,
        params: &Map<String, Value>,
        legacy: bool,
        audit: &mut AuditTrail<'_>,
    ) -> Result<(), ProtocolError> {
        let Some(policies) = self.policies.load_full() else { return Ok(()) };
        if !Policies::decides(operation.method()) {
            return Ok(());
        }
        let request = PolicyRequest {
            principal: principal_view(principal),
            method: operation.method(),
            target: operation.target(),
            arguments: params.get("arguments").and_then(Value::as_object),
            era: era(legacy),
            now_ms: self.clock.now_unsigned_ms(),
        };
        let verdict = policies.decide(app, &request);
        audit.policy(audit_detail(&policies, &verdict));
        if verdict.allowed { Ok(()) } else { Err(ProtocolError::PolicyDenied { reason: verdict.reason }) }
    }
}

/// `context.era`: `2025` on the session wire, else `2026-07-28`.
pub(crate) fn era(legacy: bool) -> &'static str {
    if legacy { "2025" } else { "2026-07-28" }
}

/// The principal as a policy sees it: identity, scopes, groups, and the delegation chain.
pub(crate) fn principal_view(principal: &VerifiedPrincipal) -> PrincipalView {
    let delegation = principal.delegation();
    PrincipalView {
        issuer: principal.issuer().to_owned(),
        subject: principal.subject().to_owned(),
        tenant: principal.tenant().unwrap_or_default().to_owned(),
        client: principal.client_id().unwrap_or_default().to_owned(),
        scopes: principal.scopes(),
        groups: principal.groups().to_vec(),
        agent: delegation.map(|d| d.holder().subject.clone()).unwrap_or_default(),
        agents: delegation.map(|d| d.agents().to_vec()).unwrap_or_default(),
    }
}

/// `policy=<set digest> by=<ids>` (or `by=none`, a default deny), at most [`MAX_AUDITED_IDS`].
fn audit_detail(policies: &Policies, verdict: &Verdict) -> String {
    let mut ids: Vec<&str> = verdict.policies.iter().take(MAX_AUDITED_IDS).map(String::as_str).collect();
    let more = verdict.policies.len().saturating_sub(MAX_AUDITED_IDS);
    let more = if more > 0 { format!(",+{more}") } else { String::new() };
    if ids.is_empty() {
        ids.push("none");
    }
    format!("policy={} by={}{more}", policies.digest(), ids.join(","))
}
