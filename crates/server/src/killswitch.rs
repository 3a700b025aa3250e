//! Stage 4 of the pipeline, the kill switch (control C5), and its second phase for handlers.
//!
//! - [`exposed_operations`]: every operation key an application exposes (each advertised plain
//!   method, each tool, prompt, resource and resource template), the list the signed registry
//!   must cover; `palisade policy init` writes its skeleton from it.
//! - Stage 4 ([`clear`], `pre_dispatch`) runs for every classified request (and every task
//!   segment), before authorization. Its
//!   targets are built by the server: the configured server release, the principal's tenant and
//!   client, the *registered* tool, prompt or resource; never a client string beyond the registered name.
//! - [`crate::RequestContext::pre_side_effect`] is the second phase: after the handler's side-effect-free
//!   preparation and before its commit, with this request's clearance and targets. It returns the
//!   [`palisade_killswitch::CommitFence`] only that phase can make; a backend redeems its tokens in the commit
//!   transaction. A tool whose rule requires a fence and completes successfully without asking
//!   for one has its result refused ([`fence_was_skipped`]; `-32603`, audited as a deny at stage `killswitch`; a task
//!   fails with the same error).
//!
//! **Architecture Invariant:** with a kill switch configured, a request whose operation is not
//! in the signed registry, or whose authority answer is DISABLE or in any doubt, runs no handler.

use std::sync::Arc;

use palisade_killswitch::{ExposedOperation, KillSwitch, RegistryError, TargetKind, TargetValues};
use palisade_wire::ProtocolError;

use crate::audit::AuditTrail;
use crate::auth::VerifiedPrincipal;
use crate::clearance::{Cleared, refusal};
use crate::method::{Method, OperationKey, Origin, TargetFamily};
use crate::registry::{App, Effect};

/// The kind of target an operation's registered entry is, for the authority: a tool, a prompt
/// or a resource (a method alone has none; the release, tenant and client still cover it).
fn target_kind(family: TargetFamily) -> Option<TargetKind> {
    match family {
        TargetFamily::Tool => Some(TargetKind::Tool),
        TargetFamily::Prompt => Some(TargetKind::Prompt),
        TargetFamily::Resource => Some(TargetKind::Resource),
        TargetFamily::None => None,
    }
}

/// Every operation `app` exposes, keyed exactly as stage 3 classifies requests (both follow
/// [`Method::target_family`]; [`OperationKey`]'s display form). Tools declared side-effecting
/// are marked so.
pub fn exposed_operations(app: &App) -> Vec<ExposedOperation> {
    let mut exposed = Vec::new();
    for &method in Method::ALL {
        if !app.advertises(method) {
            continue;
        }
        let family = method.target_family();
        // A relayed definition's operations also name its upstream (`authority disable --target
        // upstream:<id>` stops them all).
        let entry = |target: &str, has_side_effect: bool, origin: Option<&Arc<Origin>>| ExposedOperation {
            key: format!("{}:{target}", method.as_str()),
            has_side_effect,
            target_kinds: target_kind(family).into_iter().chain(origin.map(|_| TargetKind::Upstream)).collect(),
        };
        match family {
            TargetFamily::Tool => exposed.extend(
                app.tools
                    .iter()
                    .map(|tool| entry(&tool.name, tool.effect == Effect::SideEffecting, tool.origin.as_ref())),
            ),
            TargetFamily::Prompt => {
                exposed.extend(app.prompts.iter().map(|prompt| entry(&prompt.name, false, prompt.origin.as_ref())))
            }
            TargetFamily::Resource => {
                exposed.extend(app.resources.iter().map(|r| entry(&r.uri, false, r.origin.as_ref())));
                exposed.extend(app.templates.iter().map(|t| entry(&t.template, false, t.origin.as_ref())));
            }
            TargetFamily::None => exposed.push(ExposedOperation {
                key: method.as_str().to_owned(),
                has_side_effect: false,
                target_kinds: Vec::new(),
            }),
        }
    }
    exposed
}

/// The kill switch as the server runs it: the library's [`KillSwitch`] and the release this
/// server reports as its `server_release` target.
#[derive(Debug, Clone)]
pub struct KillSwitchStage {
    switch: Arc<KillSwitch>,
    server_release: String,
}

impl KillSwitchStage {
    /// Checks that the signed registry lists every operation `app` exposes.
    pub(crate) fn new(switch: Arc<KillSwitch>, server_release: String, app: &App) -> Result<Self, RegistryError> {
        let stage = Self { switch, server_release };
        stage.check_covers(app)?;
        Ok(stage)
    }

    /// Refuses an application that exposes an operation the signed registry does not list (run
    /// at build time and for every snapshot published while serving).
    pub(crate) fn check_covers(&self, app: &App) -> Result<(), RegistryError> {
        let exposed = exposed_operations(app);
        self.switch.policy().check_complete(exposed.iter().map(|operation| operation.key.as_str()))
    }

    /// The policy generation, for audit records.
    pub(crate) fn policy_version(&self) -> String {
        format!("killswitch:{}", self.switch.policy().generation())
    }

    /// Stage 4: phase one for this request. The error is the client's refusal.
    pub(crate) async fn pre_dispatch(
        &self,
        operation: &OperationKey,
        principal: &VerifiedPrincipal,
    ) -> Result<Arc<Cleared>, ProtocolError> {
        let key = operation.to_string();
        let mut targets = TargetValues::new().with(TargetKind::ServerRelease, self.server_release.clone());
        if let Some(tenant) = principal.tenant() {
            targets.insert(TargetKind::Tenant, tenant);
        }
        if let Some(client) = principal.client_id() {
            targets.insert(TargetKind::Client, client);
        }
        if let (Some(kind), Some(target)) = (target_kind(operation.method().target_family()), operation.target()) {
            targets.insert(kind, target);
        }
        if let Some(origin) = operation.origin() {
            targets.insert(TargetKind::Upstream, origin.upstream.clone());
        }
        // Every agent of a delegation chain: disabling one stops it and all delegated under it.
        // The calling agent's own client is a `client` target too, beside the principal's.
        if let Some(delegated) = principal.delegation() {
            for agent in delegated.agents() {
                targets.push(TargetKind::Agent, agent.as_str());
            }
            targets.push(TargetKind::Client, delegated.holder().client.as_str());
        }
        let clearance = self.switch.pre_dispatch(&key, &targets).await.map_err(|error| refusal(&key, &error))?;
        let fence_required = self.switch.policy().lookup(&key).is_some_and(|rule| rule.require_commit_fence);
        Ok(Arc::new(Cleared::new(self.switch.clone(), key, targets, clearance, fence_required)))
    }
}

/// Stage 4 as the pipeline holds it: the server's kill switch, when it has one.
pub(crate) struct KillSwitchCheck {
    stage: Option<KillSwitchStage>,
}

impl KillSwitchCheck {
    /// The stage for `stage` (without one every operation is cleared with no clearance).
    pub(crate) fn new(stage: Option<KillSwitchStage>) -> Self {
        Self { stage }
    }

    /// The kill switch, when the server has one (publication checks its registry covers a
    /// snapshot; task workers and session admissions run it too).
    pub(crate) fn stage(&self) -> Option<&KillSwitchStage> {
        self.stage.as_ref()
    }

    /// Stage 4: [`clear`] with this server's kill switch.
    pub(crate) async fn clear(
        &self,
        operation: &OperationKey,
        principal: &VerifiedPrincipal,
        trail: &mut AuditTrail<'_>,
    ) -> Result<Option<Arc<Cleared>>, ProtocolError> {
        clear(self.stage.as_ref(), operation, principal, trail).await
    }
}

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
    let started = std::time::Instant::now();
    let cleared = stage.pre_dispatch(operation, principal).await;
    trail.observe_killswitch_check(started.elapsed());
    cleared.map(Some)
}

/// Whether a refusal after the handler is the kill switch's (a fenced tool completed without
/// its fence), for the stage its audit record names.
pub(crate) fn fence_was_skipped(cleared: Option<&Arc<Cleared>>) -> bool {
    cleared.is_some_and(|cleared| cleared.fence_skipped())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use palisade_base::clock::{Clock as _, SystemClock};
    use palisade_killswitch::dev::DevAuthorityFiles;

    use super::*;
    use crate::auth::{Authenticator, EnvironmentPrincipal};
    use crate::registry::ToolDef;
    use crate::{CallToolResult, Outcome};

    /// Defence in depth: should a request ever classify to an operation the signed registry does
    /// not list, stage 4 refuses it (the start-up check makes this unreachable through the
    /// pipeline, so the stage is called directly). No authority is needed to refuse.
    #[tokio::test]
    async fn an_unlisted_operation_is_refused_at_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let files = DevAuthorityFiles::new(dir.path().join("ks"));
        let app = App::builder("unlisted", "0")
            .tool(ToolDef::new("listed").handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("ok"))) }))
            .build()
            .unwrap();
        let exposed = exposed_operations(&app);
        files.prepare(&exposed, SystemClock.now_ms()).unwrap();
        let keys = exposed.iter().map(|operation| operation.key.clone()).collect();
        let switch = Arc::new(files.kill_switch("https://127.0.0.1:9", keys).await.unwrap());
        let stage = KillSwitchStage::new(switch, "1".into(), &app).unwrap();
        let principal = Authenticator::Environment(EnvironmentPrincipal {
            subject: "alice".into(),
            tenant: None,
            client_id: None,
            scopes: Default::default(),
        })
        .authenticate(None)
        .await
        .unwrap();
        let ghost = OperationKey::for_test(Method::ToolsCall, Some("ghost"));
        assert_eq!(stage.pre_dispatch(&ghost, &principal).await.err(), Some(ProtocolError::Unavailable));
        let unknown_method = OperationKey::for_test(Method::PromptsList, None);
        assert_eq!(stage.pre_dispatch(&unknown_method, &principal).await.err(), Some(ProtocolError::Unavailable));
    }
}
