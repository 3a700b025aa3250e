//! Stage 4 of the pipeline, the kill switch (control C5), and its second phase for handlers.
//!
//! - [`exposed_operations`]: every operation key an application exposes (each advertised plain
//!   method, each tool, prompt, resource and resource template), the list the signed registry
//!   must cover; `palisade policy init` writes its skeleton from it.
//! - Stage 4 (`pre_dispatch`) runs for every classified request, before authorization. Its
//!   targets are built by the server: the configured server release, the principal's tenant and
//!   client, the *registered* tool or resource; never a client string beyond the registered name.
//! - [`RequestContext::pre_side_effect`] is the second phase: after the handler's side-effect-free
//!   preparation and before its commit, with this request's clearance and targets. It returns the
//!   [`CommitFence`] only that phase can make; a backend redeems its tokens in the commit
//!   transaction. A tool whose rule requires a fence and completes successfully without asking
//!   for one has its result refused (`-32603`, audited as a deny at stage `killswitch`; a task
//!   fails with the same error).
//!
//! **Architecture Invariant:** with a kill switch configured, a request whose operation is not
//! in the signed registry, or whose authority answer is DISABLE or in any doubt, runs no handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use palisade_killswitch::{
    CommitFence, DisableEvent, DispatchClearance, ExposedOperation, KillSwitch, KillSwitchError, RegistryError,
    TargetKind, TargetValues,
};
use palisade_wire::ProtocolError;
use tokio::sync::broadcast::{self, error::RecvError};

use crate::auth::VerifiedPrincipal;
use crate::context::RequestContext;
use crate::pipeline::{Method, OperationKey, TargetFamily, advertised};
use crate::registry::{App, Effect};

/// Every method the pipeline implements, for [`exposed_operations`].
const METHODS: [Method; 22] = [
    Method::Discover,
    Method::ToolsList,
    Method::ToolsCall,
    Method::ResourcesList,
    Method::ResourceTemplatesList,
    Method::ResourcesRead,
    Method::PromptsList,
    Method::PromptsGet,
    Method::Complete,
    Method::Listen,
    Method::TasksGet,
    Method::TasksUpdate,
    Method::TasksCancel,
    Method::Initialize,
    Method::Ping,
    Method::SetLogLevel,
    Method::Subscribe,
    Method::Unsubscribe,
    Method::SessionStream,
    Method::SessionNotification,
    Method::SessionAnswer,
    Method::SessionDelete,
];

/// Exhaustive on purpose: a new [`Method`] does not compile until it is added to [`METHODS`]
/// (and so to the registry the kill switch requires).
const fn in_methods(method: Method) -> bool {
    match method {
        Method::Discover
        | Method::ToolsList
        | Method::ToolsCall
        | Method::ResourcesList
        | Method::ResourceTemplatesList
        | Method::ResourcesRead
        | Method::PromptsList
        | Method::PromptsGet
        | Method::Complete
        | Method::Listen
        | Method::TasksGet
        | Method::TasksUpdate
        | Method::TasksCancel
        | Method::Initialize
        | Method::Ping
        | Method::SetLogLevel
        | Method::Subscribe
        | Method::Unsubscribe
        | Method::SessionStream
        | Method::SessionNotification
        | Method::SessionAnswer
        | Method::SessionDelete => true,
    }
}

/// The kind of target an operation's registered entry is, for the authority: a tool or a
/// resource (prompts have no kind of their own; the release, tenant and client still cover them).
fn target_kind(family: TargetFamily) -> Option<TargetKind> {
    match family {
        TargetFamily::Tool => Some(TargetKind::Tool),
        TargetFamily::Resource => Some(TargetKind::Resource),
        TargetFamily::Prompt | TargetFamily::None => None,
    }
}

/// Every operation `app` exposes, keyed exactly as stage 3 classifies requests (both follow
/// [`Method::target_family`]; [`OperationKey`]'s display form). Tools declared side-effecting
/// are marked so.
pub fn exposed_operations(app: &App) -> Vec<ExposedOperation> {
    let mut exposed = Vec::new();
    for method in METHODS {
        if !in_methods(method) || !advertised(app, method) {
            continue;
        }
        let family = method.target_family();
        let entry = |target: &str, has_side_effect: bool| ExposedOperation {
            key: format!("{}:{target}", method.as_str()),
            has_side_effect,
            target_kind: target_kind(family),
        };
        match family {
            TargetFamily::Tool => {
                exposed.extend(app.tools.iter().map(|tool| entry(&tool.name, tool.effect == Effect::SideEffecting)))
            }
            TargetFamily::Prompt => exposed.extend(app.prompts.iter().map(|prompt| entry(&prompt.name, false))),
            TargetFamily::Resource => {
                exposed.extend(app.resources.iter().map(|r| entry(&r.uri, false)));
                exposed.extend(app.templates.iter().map(|t| entry(&t.template, false)));
            }
            TargetFamily::None => exposed.push(ExposedOperation {
                key: method.as_str().to_owned(),
                has_side_effect: false,
                target_kind: None,
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
        let exposed = exposed_operations(app);
        switch.policy().check_complete(exposed.iter().map(|operation| operation.key.as_str()))?;
        Ok(Self { switch, server_release })
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
        let clearance = self.switch.pre_dispatch(&key, &targets).await.map_err(|error| refusal(&key, &error))?;
        let fence_required = self.switch.policy().lookup(&key).is_some_and(|rule| rule.require_commit_fence);
        Ok(Arc::new(Cleared {
            switch: self.switch.clone(),
            operation: key,
            targets,
            clearance,
            fence_required,
            fence_obtained: AtomicBool::new(false),
            fence_skipped: AtomicBool::new(false),
        }))
    }
}

/// Maps a kill-switch refusal onto the client's error, logging the cause for the operator.
fn refusal(operation: &str, error: &KillSwitchError) -> ProtocolError {
    if error.is_disabled() {
        tracing::info!(stage = "killswitch", operation, %error, "operation disabled by the authority");
        return ProtocolError::OperationDisabled;
    }
    match error {
        KillSwitchError::UnlistedOperation { .. } => {
            tracing::error!(stage = "killswitch", operation, "operation absent from the signed registry: refused");
        }
        _ => {
            tracing::warn!(stage = "killswitch", operation, error = %error, source = ?std::error::Error::source(error), "kill switch in doubt: refused (fail closed)")
        }
    }
    ProtocolError::Unavailable
}

/// One request's passed `pre_dispatch`: what its second phase needs.
pub(crate) struct Cleared {
    switch: Arc<KillSwitch>,
    operation: String,
    targets: TargetValues,
    clearance: DispatchClearance,
    fence_required: bool,
    fence_obtained: AtomicBool,
    /// Set when [`Cleared::check_fence_obtained`] refused a result (for the audit record).
    fence_skipped: AtomicBool,
}

/// What a listen stream watches: DISABLE observations for one of its request's targets.
/// What ends an open stream: a DISABLE of one of its targets observed by any check, or its own
/// re-check of its targets (every `[killswitch] stream_recheck_secs`, through the same batched
/// path) refusing — on DISABLE or on any doubt.
pub(crate) struct DisableWatch(Option<Watch>);

struct Watch {
    receiver: broadcast::Receiver<DisableEvent>,
    cleared: Arc<Cleared>,
    next_recheck_ms: i64,
}

fn recheck_interval_ms(switch: &KillSwitch) -> i64 {
    i64::try_from(switch.stream_recheck().as_millis()).unwrap_or(i64::MAX)
}

impl DisableWatch {
    pub(crate) fn new(cleared: Option<&Arc<Cleared>>) -> Self {
        Self(cleared.map(|cleared| Watch {
            receiver: cleared.switch.subscribe_disables(),
            next_recheck_ms: cleared.switch.clock().now_ms().saturating_add(recheck_interval_ms(&cleared.switch)),
            cleared: cleared.clone(),
        }))
    }

    /// Completes when the stream must end. Cancel-safe: a re-check interrupted by the caller's
    /// `select!` runs again on the next call.
    pub(crate) async fn disabled(&mut self) {
        let Some(watch) = &mut self.0 else { return std::future::pending().await };
        let clock = watch.cleared.switch.clock().clone();
        loop {
            tokio::select! {
                received = watch.receiver.recv() => match received {
                    Ok(event) if watch.cleared.clearance.targets().contains(&event.target) => return,
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => return,
                    Err(RecvError::Closed) => return std::future::pending().await,
                },
                () = clock.sleep_until_ms(watch.next_recheck_ms) => {
                    let cleared = &watch.cleared;
                    if let Err(error) = cleared.switch.pre_dispatch(&cleared.operation, &cleared.targets).await {
                        let _ = refusal(&cleared.operation, &error);
                        return;
                    }
                    watch.next_recheck_ms = clock.now_ms().saturating_add(recheck_interval_ms(&cleared.switch));
                }
            }
        }
    }
}

impl Cleared {
    /// Phase two.
    pub(crate) async fn pre_side_effect(&self) -> Result<CommitFence, ProtocolError> {
        let fence = self
            .switch
            .pre_side_effect(&self.operation, &self.targets, &self.clearance)
            .await
            .map_err(|error| refusal(&self.operation, &error))?;
        self.fence_obtained.store(true, Ordering::SeqCst);
        Ok(fence)
    }

    /// After a handler completed successfully: a tool whose rule requires a commit fence must
    /// have asked for one. A handler that did not skipped the second check before whatever it
    /// committed (a defect in the handler): its result is refused with
    /// [`ProtocolError::Internal`] (no detail reaches the client), the cause is logged for the
    /// operator, and a request's refusal is audited as a deny at stage `killswitch`
    /// ([`Cleared::fence_skipped`]). What the handler did is not undone: only the fence can stop
    /// an effect before it happens.
    pub(crate) fn check_fence_obtained(&self) -> Result<(), ProtocolError> {
        if !self.fence_required || self.fence_obtained.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.fence_skipped.store(true, Ordering::SeqCst);
        tracing::error!(
            stage = "killswitch",
            operation = %self.operation,
            "a tool whose registry rule requires a commit fence completed without calling pre_side_effect: result refused"
        );
        Err(ProtocolError::Internal)
    }

    /// Whether [`Cleared::check_fence_obtained`] refused this request's result.
    pub(crate) fn fence_skipped(&self) -> bool {
        self.fence_skipped.load(Ordering::SeqCst)
    }
}

impl RequestContext {
    /// Phase two of the kill switch, for a handler about to commit a side effect: asks the
    /// authority again for this request's targets (the state may have changed since dispatch)
    /// and returns the [`CommitFence`], whose tokens the backend redeems in the same transaction
    /// as the effect (`palisade_killswitch::authority::redeem_commit_token`, or
    /// `AuthorityClient::redeem` before committing). Call it after the side-effect-free
    /// preparation, immediately before the commit.
    ///
    /// A tool whose signed rule says `require_commit_fence` **must** call it before committing:
    /// if it completes successfully without having called it, its result is refused
    /// ([`ProtocolError::Internal`], audited as a deny at stage `killswitch`). DISABLE is
    /// [`ProtocolError::OperationDisabled`]; any doubt, and a server running without a kill
    /// switch, is [`ProtocolError::Unavailable`] (a handler that needs a fence fails closed).
    /// Handlers that only want the check when a kill switch is configured test
    /// [`RequestContext::has_kill_switch`] first.
    pub async fn pre_side_effect(&self) -> Result<CommitFence, ProtocolError> {
        match &self.kill_switch {
            Some(cleared) => cleared.pre_side_effect().await,
            None => Err(ProtocolError::Unavailable),
        }
    }

    /// Whether this request passed a kill switch (the server runs with one).
    pub fn has_kill_switch(&self) -> bool {
        self.kill_switch.is_some()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use palisade_killswitch::dev::DevAuthorityFiles;
    use palisade_killswitch::{Clock as _, SystemClock};

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
