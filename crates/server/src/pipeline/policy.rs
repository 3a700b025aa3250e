//! Stage 3c, policy: the operator's Cedar policies ([`crate::policy::Policies`]) decide the
//! operation for the principal it runs as (after delegation, so a capability's principal and its
//! agent chain are what a policy sees), before the kill switch and every later check. With no
//! policies configured the stage allows everything and the scope rules of stage 5 are the
//! built-in policy. A refusal is `PolicyDenied` with a fixed reason; the audit record names the
//! policy set's digest and the ids of the policies that decided, for allows and refusals alike.
//!
//! Holds the clock; is given the policy set of the request's snapshot (the registry and the
//! policies are published together, `Server::publish_with_policies`); knows the principal, the
//! operation and the call's arguments; nothing about handles or the kill switch.

use std::sync::Arc;

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

/// Stage 3c: the clock (the policy set comes with the request's snapshot).
pub(crate) struct PolicyStage {
    clock: Arc<dyn Clock>,
}

impl PolicyStage {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self { clock }
    }

    /// Stage 3c: whether `policies` (none: the built-in scope rules only) allow `operation` for
    /// `principal` on `app`. `wire`: whether the request came on the 2025-era session wire, and
    /// the caller's address when the transport knows it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide(
        &self,
        policies: Option<&Policies>,
        app: &App,
        operation: &OperationKey,
        principal: &VerifiedPrincipal,
        params: &Map<String, Value>,
        (legacy, source): (bool, Option<std::net::IpAddr>),
        audit: &mut AuditTrail<'_>,
    ) -> Result<(), ProtocolError> {
        let Some(policies) = policies else { return Ok(()) };
        if !Policies::decides(operation.method()) {
            return Ok(());
        }
        let request = PolicyRequest {
            principal: principal_view(principal),
            method: operation.method(),
            target: operation.target(),
            arguments: params.get("arguments").and_then(Value::as_object),
            era: era(legacy),
            source,
            now_ms: self.clock.now_unsigned_ms(),
        };
        let verdict = policies.decide(app, &request);
        audit.policy(audit_detail(policies, &verdict));
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
