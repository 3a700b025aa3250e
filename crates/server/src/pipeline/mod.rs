//! The request path, as the list of its stages. Every request, from HTTP or stdio and on either
//! wire, passes them in this order; each stage lives in its own module below, and each either
//! refuses the request (audited as a `deny` at its stage) or hands the next a stronger value.
//! Each stage is a value holding only the services it uses ([`Stages`], built once by
//! [`crate::ServerBuilder::build`]); [`Stages::run`] runs them, borrowing each.
//!
//! | # | stage          | file                         | hands on                                |
//! |---|----------------|------------------------------|-----------------------------------------|
//! | 1 | envelope       | `pipeline/envelope.rs`       | the `Method` and its `_meta`            |
//! | 2 | authenticate   | `pipeline/authenticate.rs`   | a `VerifiedPrincipal`                   |
//! | 2b| session        | `pipeline/session.rs`        | the session's `_meta` (2025-era wire)   |
//! | 3 | classify       | `pipeline/classify.rs`       | the `OperationKey`                      |
//! | 3b| delegation     | `pipeline/delegation.rs`     | the principal acted for (C10)           |
//! | 3c| policy         | `pipeline/policy.rs`         | (the operator's policies decided)       |
//! | 3d| rate limits    | `pipeline/limits.rs`         | (the request counted, or 429)           |
//! | 4 | kill switch    | `killswitch.rs` (`clear`)    | the clearance (`Cleared`)               |
//! | 5 | authorize      | `pipeline/authorize.rs`      | (the scopes checked)                    |
//! | 6 | handles        | `pipeline/handles.rs`        | the resolved handles                    |
//! | 7 | audit          | `pipeline/audit.rs`          | `Allowed`: the allow decision is durable|
//! | 8 | dispatch       | `pipeline/dispatch/`         | the result (a handler needs `Allowed`)  |
//! | 9 | respond        | here                         | the [`Reply`]                           |
//!
//! The transports' own checks (connection cap, timeouts, Host/Origin, sizes, media types, the
//! strict JSON-RPC frame) run before stage 1, in `http` and `stdio`.
//!
//! **Architecture Invariant:** the order below is the order in ARCHITECTURE.md (a tidy test
//! compares the two), and no handler runs without an `Allowed`, which only stage 7 makes.

mod admission;
mod audit;
mod authenticate;
mod authorize;
mod classify;
mod confirm;
mod delegation;
mod dispatch;
mod envelope;
mod handles;
mod limits;
mod listen;
mod params;
mod policy;
mod rounds;
mod session;
mod stages;
mod wire;

use std::sync::Arc;

use palisade_wire::{ProtocolError, Request};
use serde_json::Map;
use tokio_util::sync::CancellationToken;

use crate::audit::{Allowed, AuditStage, AuditTrail};
use crate::context::{NotificationSink, RequestContext};
use crate::method::Method;
use crate::policy::Policies;
use crate::registry::App;
use crate::reply::Reply;

pub(crate) use audit::Audit;
pub(crate) use authenticate::Authenticate;
pub(crate) use authorize::Authorize;
pub(crate) use classify::Classify;
pub(crate) use delegation::DelegationStage;
pub(crate) use dispatch::Dispatch;
pub(crate) use dispatch::lists::{ListKind, Viewer};

/// What a request is served from, published whole by the server: the registry and the
/// operator's policies validated against it (`None`: the scope rules only).
pub(crate) struct Current {
    pub(crate) app: Arc<App>,
    pub(crate) policies: Option<Arc<Policies>>,
}
pub(crate) use envelope::Envelope;
pub(crate) use handles::Handles;
pub(crate) use limits::Limits;
pub(crate) use policy::PolicyStage;
pub(crate) use session::Session;
pub(crate) use stages::Stages;
pub(crate) use wire::LegacyWire;
pub use wire::TransportHeaders;

/// The stage names in path order, as ARCHITECTURE.md lists them (checked by the tidy test).
pub const STAGES: [&str; 13] = [
    "envelope",
    "authenticate",
    "session",
    "classify",
    "delegation",
    "policy",
    "rate limits",
    "kill switch",
    "authorize",
    "handles",
    "audit",
    "dispatch",
    "respond",
];

impl Stages {
    /// Runs one request through every stage on `current` (the registry and the operator's
    /// policies), the snapshot the request keeps to the end: stage 1 is the session wire's envelope when `legacy` is given. Notifications for the
    /// request go to `sink`; the returned [`Reply`] is the final frame. When `cancel` fires the
    /// work stops and the reply is meaningless (the transport sends nothing). The stages run
    /// inside the request's trace span (when trace export is on), whose trace id is the audit
    /// trace id.
    pub(crate) async fn run(
        &self,
        current: Arc<Current>,
        request: Request,
        headers: Option<&TransportHeaders>,
        legacy: Option<LegacyWire<'_>>,
        sink: NotificationSink,
        cancel: CancellationToken,
    ) -> Reply {
        let (span, trace_id) =
            crate::telemetry::request_span(&request.method, &request.params, self.audit.continue_traces());
        let started = std::time::Instant::now();
        let mut audit = AuditTrail::traced(self.audit.recorder(), &request.method, span.clone(), trace_id);
        let stages = self.stages(current, request, headers, legacy, sink, cancel, &mut audit);
        let reply = if span.is_disabled() {
            stages.await
        } else {
            let reply = tracing::Instrument::instrument(stages, span.clone()).await;
            crate::telemetry::finish(&span, &reply);
            reply
        };
        audit.finish_tool_call(&reply, started.elapsed());
        reply
    }

    #[allow(clippy::too_many_arguments)]
    async fn stages(
        &self,
        current: Arc<Current>,
        request: Request,
        headers: Option<&TransportHeaders>,
        legacy: Option<LegacyWire<'_>>,
        sink: NotificationSink,
        cancel: CancellationToken,
        audit: &mut AuditTrail<'_>,
    ) -> Reply {
        let id = request.id.clone();
        let app = current.app.clone();
        let source = headers.and_then(|h| h.source);
        // 1. envelope: before anything else, because nothing in a malformed request means
        //    anything. Its order is the one the spec's probes pin down (`_meta` shape, headers
        //    against the body, version support, then the method). 2025-era requests carry no
        //    `_meta`: theirs comes from the session (2b).
        let (method, meta) = match self.envelope.envelope(&app, &request, headers, legacy.as_ref()) {
            Ok(checked) => checked,
            Err(error) => return audit.refuse(&id, AuditStage::Envelope, &error, None).await,
        };
        // 2. authenticate: before any decision about the operation, because every later one is
        //    about *this* caller; nothing below runs without a VerifiedPrincipal.
        let authorization = headers.and_then(|h| h.authorization.as_deref());
        let principal = match self.authenticate.authenticate(authorization).await {
            Ok(principal) => Arc::new(principal),
            Err(refusal) => {
                tracing::info!(stage = "authenticate", reason = %refusal.error, "credentials refused");
                let error = ProtocolError::Unauthenticated;
                return audit.refuse(&id, AuditStage::Authenticate, &error, refusal.challenge).await;
            }
        };
        audit.principal(&principal);
        // 2b. session (2025-era wire only): after authentication, because a session is bound to
        //     the principal, never proof of it. Unknown, foreign, expired, deleted: one 404.
        let (meta, admitted) =
            match self.session.session_meta(method, meta, &request, headers, legacy.as_ref(), &principal).await {
                Ok(checked) => checked,
                Err(error) => return audit.refuse(&id, AuditStage::Session, &error, None).await,
            };
        // 3. classify: the operation key comes from the registry, never from client strings
        //    beyond picking a registered entry; every policy below is keyed on it.
        let operation = match self.classify.classify(&app, method, &request.params) {
            Ok(operation) => operation,
            Err(error) => return audit.refuse(&id, AuditStage::Classify, &error, None).await,
        };
        audit.operation(&operation);
        // 3b. delegation: a presented capability is resolved once the operation is known (it must
        //     lie inside the capability) and before the kill switch, which checks every agent of
        //     its chain; from here on the principal is the one the capability acts for, narrowed.
        let principal = match self.delegation.resolve(&operation, principal, &request.params, audit).await {
            Ok(principal) => principal,
            Err(error) => return audit.refuse(&id, AuditStage::Delegation, &error, None).await,
        };
        // 3c. policy: the operator's policies, once the principal is the one acted for (a
        //     capability's principal, with its agent chain) and before the kill switch, so a
        //     request the operator never allowed learns nothing from the later checks and costs
        //     them nothing. Without policies it allows everything (stage 5's scopes decide).
        if let Err(error) = self.policy.decide(
            current.policies.as_deref(),
            &app,
            &operation,
            &principal,
            &request.params,
            (legacy.is_some(), source),
            audit,
        ) {
            return audit.refuse(&id, AuditStage::Policy, &error, None).await;
        }
        // 3d. rate limits: once the principal the request acts for is final (delegation, the
        //     operator's policy), so each limit counts the right party; before the kill switch
        //     and every later lookup, so a request over its limit costs nothing further.
        if let Err(error) = self.limits.check(&operation, &principal).await {
            return audit.refuse(&id, AuditStage::RateLimit, &error, None).await;
        }
        // 4. kill switch: first among the decisions about the operation, so a disabled
        //    operation costs nothing further and reveals nothing about scopes or handles.
        let cleared = match self.kill_switch.clear(&operation, &principal, audit).await {
            Ok(cleared) => cleared,
            Err(error) => return audit.refuse(&id, AuditStage::KillSwitch, &error, None).await,
        };
        // 5. authorize: the operation's required scopes (a 403 names all of them).
        if let Err((error, challenge)) = self.authorize.authorize(&app, &operation, &request.params, &principal) {
            return audit.refuse(&id, AuditStage::Authorize, &error, challenge).await;
        }
        // 6. handles: after authorization (a caller without the scope learns nothing about a
        //    handle), before the allow (the record carries the handles' digests).
        let resolved = match self.handles.resolve(&app, &operation, &principal, &request.params, audit).await {
            Ok(resolved) => resolved,
            Err(error) => return audit.refuse(&id, AuditStage::Handles, &error, None).await,
        };
        // 6b. the capability's call budget, spent last: a request any check above refused
        //     costs nothing.
        if let Err(error) = self.delegation.spend(&operation, &principal).await {
            return audit.refuse(&id, AuditStage::Delegation, &error, None).await;
        }
        // 7. audit: the allow decision is durable before any handler runs; if it cannot be
        //    recorded the request is refused (fail closed). `Allowed` is the proof.
        let allowed: Allowed = match self.audit.allow(audit, !resolved.is_empty()).await {
            Ok(allowed) => allowed,
            Err(error) => return audit.refuse(&id, AuditStage::Audit, &error, None).await,
        };
        // 8. dispatch: the handler (or the session method), under the request timeout and the
        //    cancellation token.
        let ctx = RequestContext {
            id: id.clone(),
            meta,
            principal: principal.clone(),
            input_responses: Map::new(),
            request_state: None,
            sink,
            cancel: cancel.clone(),
            events: self.dispatch.events.clone(),
            handles: self.dispatch.handles.clone(),
            resolved: Arc::new(resolved),
            task: None,
            kill_switch: cleared.clone(),
            approval: None,
            source,
        };
        let mut new_session = None;
        let result = match method {
            Method::Listen => self.dispatch.listen(&current, ctx, &request.params).await,
            Method::Initialize => self.session.initialize(&app, &ctx).await.map(|(result, session)| {
                new_session = Some(session);
                result
            }),
            Method::Ping | Method::SetLogLevel | Method::Subscribe | Method::Unsubscribe => {
                let result = self.session.session_method(method, &request.params, admitted.as_ref()).await;
                if let (Ok(_), Method::Subscribe | Method::Unsubscribe, Some(admitted)) = (&result, method, &admitted) {
                    // The session's GET stream, on whichever instance, re-reads what it listens for.
                    let event = crate::events::ServerEvent::SessionSubscriptionsChanged { session: admitted.digest };
                    self.dispatch.events.publish(event);
                }
                result
            }
            _ => {
                let work = self.dispatch.dispatch(&current, &operation, ctx, &request.params, audit, allowed);
                tokio::select! {
                    result = tokio::time::timeout(self.dispatch.config.effective_timeout(), work) => {
                        result.unwrap_or_else(|_| { cancel.cancel(); Err(ProtocolError::Timeout) })
                    }
                    () = cancel.cancelled() => {
                        // The caller cancelled or went away: not a refusal, and nobody to answer.
                        audit.cancelled();
                        return Reply::error(Some(&id), &ProtocolError::Internal);
                    }
                }
            }
        };
        // 9. respond: resultType and serverInfo added; every refusal after the allow (a forged
        //    requestState, a bad cursor, a missing capability, a handler's error, a timeout, a
        //    fenced tool's result without its fence) is on the record with its code.
        match result {
            Ok(result) if method.is_session_method() => Reply { session: new_session, ..Reply::ok(&id, result) },
            Ok(result) => Reply::ok(&id, dispatch::decorate(&app, result)),
            Err(error) if crate::killswitch::fence_was_skipped(cleared.as_ref()) => {
                audit.refuse(&id, AuditStage::KillSwitch, &error, None).await
            }
            Err(error) => audit.refuse(&id, AuditStage::Dispatch, &error, None).await,
        }
    }
}
