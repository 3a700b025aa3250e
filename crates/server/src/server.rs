//! The server: one application snapshot at a time plus every service the pipeline needs,
//! assembled by [`ServerBuilder`] — the one place the parts are wired together, which refuses
//! an inconsistent setup at build time instead of failing open (or 503-ing) at run time.
//!
//! Also where an embedder (and the gateway) publishes a new application snapshot while serving
//! ([`Server::publish`]): every definition in it has passed [`crate::AppBuilder::build`]'s
//! checks and this builder's, and the kill switch's registry covers it, before any request sees it.
//!
//! Knows every service; knows no stage logic (that is the pipeline, `pipeline/`).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use palisade_store::{AuditStore, AuditWriter, AuditWriterConfig, OnceStore, SessionStore};
use tokio_util::sync::CancellationToken;

use crate::audit::{PrincipalDigester, Recorder, keyed_digest};
use crate::auth::Authenticator;
use crate::clock::{Clock, SystemClock};
use crate::config::ServerConfig;
use crate::context::NotificationSink;
use crate::cursor::Cursors;
use crate::delegation::DelegationService;
use crate::events::{EventBus, ServerEvent};
use crate::handles::{HandleError, HandleService, PrincipalEvent};
use crate::killswitch::{KillSwitchCheck, KillSwitchStage};
use crate::metrics::Metrics;
use crate::mrtr::StateSealer;
use crate::pipeline::{
    Audit, Authenticate, Authorize, Classify, Current, DelegationStage, Dispatch, Envelope, Handles, LegacyWire,
    Limits, PolicyStage, Session, Stages, TransportHeaders,
};
use crate::rate_limits::RateLimits;
use crate::refusals::TransportRefusals;
use crate::registry::{App, TaskSupport};
use crate::reply::Reply;
use crate::secret::ServerSecret;
use crate::sessions::SessionService;
use crate::tasks::TaskService;

mod publish;

pub use self::publish::Published;

/// A running server: the current application snapshot plus everything the pipeline needs.
/// Shared by transports. Built by [`Server::builder`].
pub struct Server {
    /// The registry and the operator's policies requests are served from: one snapshot, so a
    /// request never sees a registry with the policies of another.
    current: Arc<ArcSwap<Current>>,
    config: ServerConfig,
    /// The request path's stages, each holding only its own services.
    stages: Stages,
    events: EventBus,
    pub(crate) clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
    recorder: Arc<Recorder>,
    audit_store: Option<Arc<dyn AuditStore>>,
    handles: Option<Arc<HandleService>>,
    tasks: Option<Arc<TaskService>>,
    once: Option<Arc<dyn OnceStore>>,
    delegation: Option<Arc<DelegationService>>,
    /// The application's readiness (the gateway's upstreams), when it has one.
    readiness: Option<Arc<dyn crate::health::Readiness>>,
    /// Refusals of the HTTP transport, aggregated for the audit log (see [`crate::refusals`]).
    transport_refusals: TransportRefusals,
    /// The development authorization server's grants and refusals (see [`crate::surface_audit`]).
    surface_audit: Arc<crate::surface_audit::SurfaceAudit>,
    /// Serializes [`Server::publish`] (readers never wait: they load the current snapshot).
    publishing: std::sync::Mutex<()>,
}

/// Why a server (or a published snapshot) was refused. Each names what to change.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A tool declares handle arguments, and nothing could resolve them.
    #[error("tool `{tool}` declares handle arguments but the server has no handle service (ServerBuilder::handles)")]
    HandlesWithoutService {
        /// The tool.
        tool: String,
    },
    /// A tool declares a handle type the handle service does not know.
    #[error("tool `{tool}` declares a handle of type `{object_type}` that the handle service does not know")]
    UnknownHandleType {
        /// The tool.
        tool: String,
        /// The handle type.
        object_type: String,
    },
    /// A needs-confirmation tool, and nowhere to spend an accepted confirmation once.
    #[error("tool `{tool}` needs confirmation but the server has no single-use store (ServerBuilder::once_store)")]
    ConfirmationWithoutOnceStore {
        /// The tool.
        tool: String,
    },
    /// A tool that runs only as a task, and no task service.
    #[error("tool `{tool}` runs only as a task but the server has no task service (ServerBuilder::tasks)")]
    TaskToolWithoutService {
        /// The tool.
        tool: String,
    },
    /// The task service already runs another server's workers (its kill switch and audit log
    /// are that server's).
    #[error("the task service already belongs to another server: give each server its own")]
    TaskServiceShared,
    /// A part keeps time by another clock than the server's.
    #[error("the {part} uses another clock than the server: give every part the server's clock")]
    ClockMismatch {
        /// Which part.
        part: &'static str,
    },
    /// Neither an audit store nor an explicit decision to run without one.
    #[error(
        "the server has no audit log: give it a store (ServerBuilder::audit) or turn it off explicitly (ServerBuilder::without_audit)"
    )]
    NoAuditLog,
    /// An audit writer without the audit store it ships into (readiness is the store's).
    #[error("an audit writer was given without its audit store (ServerBuilder::audit)")]
    AuditWriterWithoutStore,
    /// A published snapshot's handle types do not fit the operator's handle policies.
    #[error("handle types: {0}")]
    HandlePolicy(String),
    /// The signed kill-switch registry does not list an operation the application exposes.
    #[error(transparent)]
    KillSwitchRegistry(#[from] palisade_killswitch::RegistryError),
}

/// The parts of a server, in any order; [`ServerBuilder::build`] wires them together.
pub struct ServerBuilder {
    app: App,
    config: ServerConfig,
    authenticator: Authenticator,
    secret: ServerSecret,
    clock: Option<Arc<dyn Clock>>,
    audit: Option<Arc<dyn AuditStore>>,
    audit_writer: Option<Arc<AuditWriter>>,
    once: Option<Arc<dyn OnceStore>>,
    handles: Option<Arc<HandleService>>,
    tasks: Option<Arc<TaskService>>,
    sessions: Option<Arc<dyn SessionStore>>,
    kill_switch: Option<(Arc<palisade_killswitch::KillSwitch>, String)>,
    delegation: Option<Arc<DelegationService>>,
    policies: Option<Arc<crate::policy::Policies>>,
    metrics: Option<Arc<Metrics>>,
    readiness: Option<Arc<dyn crate::health::Readiness>>,
    rate_limits: Option<Arc<RateLimits>>,
    /// [`ServerBuilder::without_audit`] was called: no audit store is not a mistake.
    audit_off: bool,
}

impl Server {
    /// Starts a server for `app` with a library user's defaults: the default configuration,
    /// unauthenticated (loopback listeners and stdio only, announced at start; see
    /// [`ServerBuilder::authenticator`]), a fresh random secret, the system clock. The audit log
    /// is on: [`ServerBuilder::build`] needs its store ([`ServerBuilder::audit`]) unless it is
    /// turned off with [`ServerBuilder::without_audit`].
    ///
    /// ```
    /// use palisade_server::prelude::*;
    ///
    /// let app = App::builder("demo", "1.0.0").build().unwrap();
    /// let refused = Server::new(app).build();
    /// assert!(matches!(refused, Err(palisade_server::BuildError::NoAuditLog)));
    /// ```
    #[allow(clippy::new_ret_no_self)]
    pub fn new(app: App) -> ServerBuilder {
        Self::builder(app, ServerConfig::default(), Authenticator::UnauthenticatedLoopback, ServerSecret::random())
    }

    /// Starts a server for `app`; add its parts, then [`ServerBuilder::build`].
    pub fn builder(
        app: App,
        config: ServerConfig,
        authenticator: Authenticator,
        secret: ServerSecret,
    ) -> ServerBuilder {
        ServerBuilder {
            app,
            config,
            authenticator,
            secret,
            clock: None,
            audit: None,
            audit_writer: None,
            once: None,
            handles: None,
            tasks: None,
            sessions: None,
            kill_switch: None,
            delegation: None,
            policies: None,
            metrics: None,
            readiness: None,
            rate_limits: None,
            audit_off: false,
        }
    }
}

impl ServerBuilder {
    /// The server's configuration (default: [`ServerConfig::default`]).
    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// How requests are authenticated (default: unauthenticated, loopback and stdio only).
    pub fn authenticator(mut self, authenticator: Authenticator) -> Self {
        self.authenticator = authenticator;
        self
    }

    /// The secret every key of the server derives from (default: a random one, so sealed state,
    /// cursors and audit digests do not survive a restart nor match another instance).
    pub fn secret(mut self, secret: ServerSecret) -> Self {
        self.secret = secret;
        self
    }

    /// Runs without an audit log: no decision is recorded. Said with a warning at build.
    pub fn without_audit(mut self) -> Self {
        self.audit_off = true;
        self
    }

    /// Records every decision in `store`'s hash-chained audit log (group commit on a chain of
    /// this server's, unless [`audit_writer`](Self::audit_writer) gives the writer); the store's
    /// health is also what `/readyz` reports. Task workers record theirs there too.
    pub fn audit(mut self, store: Arc<dyn AuditStore>) -> Self {
        self.audit = Some(store);
        self
    }

    /// The writer every decision goes through, e.g. one on this instance's local segment
    /// ([`AuditWriter::with_segment`]) shipping into the [`audit`](Self::audit) store. Needs
    /// `audit` too.
    pub fn audit_writer(mut self, writer: Arc<AuditWriter>) -> Self {
        self.audit_writer = Some(writer);
        self
    }

    /// Keeps single-use records (an accepted confirmation is spent there) in `store`, shared by
    /// every instance. Required when a tool needs confirmation.
    pub fn once_store(mut self, store: Arc<dyn OnceStore>) -> Self {
        self.once = Some(store);
        self
    }

    /// Resolves declared handle arguments with `service` (see [`crate::handles`]). Required when
    /// a tool declares handle arguments.
    pub fn handles(mut self, service: Arc<HandleService>) -> Self {
        self.handles = Some(service);
        self
    }

    /// Runs task-capable tools as durable tasks with `service` and serves `tasks/*` (see
    /// [`crate::tasks`]). Its workers get this server's kill switch and audit log at build time.
    pub fn tasks(mut self, service: Arc<TaskService>) -> Self {
        self.tasks = Some(service);
        self
    }

    /// Keeps 2025-era session state in `store` (without one, with `config.legacy.enabled`,
    /// `initialize` is refused with 503).
    pub fn sessions(mut self, store: Arc<dyn SessionStore>) -> Self {
        self.sessions = Some(store);
        self
    }

    /// Runs every request (and every task segment) through the kill switch, reporting
    /// `server_release` as this server's release target. The build is refused when the signed
    /// registry misses any operation the application exposes.
    pub fn kill_switch(
        mut self,
        kill_switch: Arc<palisade_killswitch::KillSwitch>,
        server_release: impl Into<String>,
    ) -> Self {
        self.kill_switch = Some((kill_switch, server_release.into()));
        self
    }

    /// Accepts delegation capabilities (control C10, [`crate::delegation`]): a request carrying
    /// one in `_meta` runs as the capability's principal, narrowed to it, with its budget spent
    /// and its agents checked by the kill switch. Without it a request presenting a capability is
    /// refused. Give the application the same service's tools ([`DelegationService::tools`]).
    pub fn delegation(mut self, service: Arc<DelegationService>) -> Self {
        self.delegation = Some(service);
        self
    }

    /// The operator's policies ([`crate::policy::Policies::load`]): from now on every decided
    /// operation needs a policy that permits it and none that forbids it (default: none, the
    /// scope rules only). Swapped later with [`Server::publish_policies`].
    pub fn policies(mut self, policies: crate::policy::Policies) -> Self {
        self.policies = Some(Arc::new(policies));
        self
    }

    /// The metrics recorder to count into (default: a fresh one), e.g. one an application
    /// registered series of its own in before the server was built (the gateway's upstreams).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// What `/readyz` asks of the application beyond the server's store (the gateway: at least
    /// one upstream serves), and the detail `/readyz/detail` shows the operator.
    pub fn readiness(mut self, readiness: Arc<dyn crate::health::Readiness>) -> Self {
        self.readiness = Some(readiness);
        self
    }

    /// The operator's rate limits and quotas (stage 3d; default: none), built by
    /// [`RateLimits::build`]; replaced while serving with [`Server::set_rate_limits`].
    pub fn rate_limits(mut self, limits: Arc<RateLimits>) -> Self {
        self.rate_limits = Some(limits);
        self
    }

    /// The clock every time-dependent decision reads (default: the system clock). The handle
    /// and task services must keep time by the same clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Wires the parts together, or says which setup is inconsistent.
    pub fn build(self) -> Result<Server, BuildError> {
        let ServerBuilder {
            app,
            config,
            authenticator,
            secret,
            clock,
            audit,
            audit_writer,
            once,
            handles,
            tasks,
            sessions,
            kill_switch,
            delegation,
            policies,
            metrics,
            readiness,
            rate_limits,
            audit_off,
        } = self;
        match (&audit, audit_off) {
            // A writer without its store is refused below, naming the store.
            (None, false) if audit_writer.is_none() => return Err(BuildError::NoAuditLog),
            (None, true) if audit_writer.is_none() => {
                tracing::warn!("the audit log is off (ServerBuilder::without_audit): no decision is recorded")
            }
            _ => {}
        }
        let clock = clock.unwrap_or_else(|| Arc::new(SystemClock));
        if config.legacy.enabled && sessions.is_none() {
            // Not a refusal: the default configuration serves the 2025-era wire, and a library
            // user without a session store gets a 503 for `initialize`, never a session.
            tracing::warn!(
                "the 2025-era session wire is enabled but the server has no session store: initialize is refused (503)"
            );
        }
        if let Authenticator::Bearer(verifier) = &authenticator
            && !crate::clock::same_clock(verifier.clock(), &clock)
        {
            return Err(BuildError::ClockMismatch { part: "token verifier" });
        }
        if let Some((switch, _)) = &kill_switch
            && !crate::clock::same_clock(switch.clock(), &clock)
        {
            return Err(BuildError::ClockMismatch { part: "kill switch" });
        }
        if let Some(handles) = &handles
            && !crate::clock::same_clock(handles.clock(), &clock)
        {
            return Err(BuildError::ClockMismatch { part: "handle service" });
        }
        if let Some(tasks) = &tasks
            && !crate::clock::same_clock(tasks.clock(), &clock)
        {
            return Err(BuildError::ClockMismatch { part: "task service" });
        }
        if let Some(delegation) = &delegation
            && !crate::clock::same_clock(delegation.clock(), &clock)
        {
            return Err(BuildError::ClockMismatch { part: "delegation service" });
        }
        let parts = Parts { handles: handles.as_deref(), tasks: tasks.is_some(), once: once.is_some() };
        parts.check(&app)?;
        let metrics = metrics.unwrap_or_default();
        if let Some((switch, _)) = &kill_switch {
            switch.observe_authority(metrics.killswitch_authority());
        }
        let kill_switch = match kill_switch {
            Some((switch, release)) => Some(KillSwitchStage::new(switch, release, &app)?),
            None => None,
        };
        if audit_writer.is_some() && audit.is_none() {
            return Err(BuildError::AuditWriterWithoutStore);
        }
        let writer = audit_writer.or_else(|| {
            audit.as_ref().map(|store| Arc::new(AuditWriter::new(store.clone(), AuditWriterConfig::default())))
        });
        let recorder = Arc::new(Recorder {
            writer: writer.clone(),
            digester: PrincipalDigester::new(secret.audit_digest_key()),
            clock: clock.clone(),
            metrics,
        });
        if let Some(writer) = &writer {
            // The segment's shipping backlog and lag, read at each scrape (no writer is kept
            // alive by its metrics).
            let (weak, metrics) = (Arc::downgrade(writer), Arc::downgrade(&recorder.metrics));
            recorder.metrics.on_scrape(move || {
                if let (Some(writer), Some(metrics)) = (weak.upgrade(), metrics.upgrade()) {
                    let shipping = writer.shipping();
                    metrics.set_audit_shipping(shipping.backlog_bytes, shipping.lag);
                }
            });
        }

        let events = EventBus::new(config.listen_queue);
        if let Some(tasks) = &tasks {
            // The workers check the kill switch and record their decisions at execution time,
            // whatever order the parts were given in.
            tasks
                .attach(kill_switch.clone(), recorder.clone(), delegation.clone())
                .map_err(|()| BuildError::TaskServiceShared)?;
            tasks.spawn_fan_in(events.clone());
        }
        if let Some(delegation) = &delegation {
            // Every edge, revocation and approval goes into this server's audit log.
            delegation.attach(recorder.clone());
        }
        let transport_refusals = TransportRefusals::new(secret.audit_digest_key(), writer.clone());
        let surface_audit = Arc::new(crate::surface_audit::SurfaceAudit::new(writer.clone(), &secret, clock.clone()));
        let session_key = secret.derive("palisade/session-owner/v1");
        let sessions = sessions.map(|store| Arc::new(SessionService::new(store, session_key, config.legacy.clone())));
        let ttl_ms = u64::try_from(config.request_state_ttl.as_millis()).unwrap_or(u64::MAX);
        let shutdown = CancellationToken::new();
        let cache_scope = if authenticator.is_unauthenticated() { "public" } else { "private" };
        let current = Arc::new(ArcSwap::from_pointee(Current { app: Arc::new(app), policies }));
        let stages = Stages {
            envelope: Envelope::new(tasks.is_some(), config.legacy.versions.clone()),
            authenticate: Authenticate::new(authenticator.clone()),
            session: Session::new(sessions, config.legacy.versions.clone(), clock.clone()),
            classify: Classify,
            delegation: DelegationStage::new(delegation.clone()),
            policy: PolicyStage::new(clock.clone()),
            limits: Limits::new(rate_limits.unwrap_or_default(), recorder.metrics.clone(), clock.clone()),
            kill_switch: KillSwitchCheck::new(kill_switch),
            authorize: Authorize::new(authenticator),
            handles: Handles::new(handles.clone()),
            audit: Audit::new(recorder.clone(), config.continue_traces),
            dispatch: Dispatch {
                config: config.clone(),
                cursors: Cursors::new(&secret),
                sealer: StateSealer::new(&secret, ttl_ms),
                clock: clock.clone(),
                events: events.clone(),
                shutdown: shutdown.clone(),
                streams: Arc::default(),
                interest: Arc::default(),
                tasks: tasks.clone(),
                handles: handles.clone(),
                once: once.clone(),
                delegation: delegation.clone(),
                cache_scope,
                current: current.clone(),
            },
        };
        Ok(Server {
            current,
            stages,
            events,
            clock,
            shutdown,
            recorder,
            audit_store: audit,
            handles,
            tasks,
            once,
            delegation,
            readiness,
            transport_refusals,
            surface_audit,
            config,
            publishing: std::sync::Mutex::new(()),
        })
    }
}

/// The services an application's definitions may need, for the checks a snapshot must pass.
struct Parts<'a> {
    handles: Option<&'a HandleService>,
    tasks: bool,
    once: bool,
}

impl Parts<'_> {
    /// Every tool's needs met: its handle arguments resolvable, its confirmation spendable once,
    /// its task-only execution possible.
    fn check(&self, app: &App) -> Result<(), BuildError> {
        self.check_with(app, None)
    }

    /// [`Parts::check`] against the handle types a publication is about to put in force (else
    /// those in force now).
    fn check_with(&self, app: &App, prepared: Option<&crate::handles::PreparedTypes>) -> Result<(), BuildError> {
        for tool in app.tools() {
            let name = || tool.name.clone();
            for argument in &tool.handle_args {
                let Some(handles) = self.handles else {
                    return Err(BuildError::HandlesWithoutService { tool: name() });
                };
                let known = match prepared {
                    Some(prepared) => prepared.knows(&argument.object_type),
                    None => handles.knows_type(&argument.object_type),
                };
                if !known {
                    return Err(BuildError::UnknownHandleType {
                        tool: name(),
                        object_type: argument.object_type.clone(),
                    });
                }
            }
            if tool.needs_confirmation && !self.once {
                return Err(BuildError::ConfirmationWithoutOnceStore { tool: name() });
            }
            if tool.task_support == TaskSupport::Required && !self.tasks {
                return Err(BuildError::TaskToolWithoutService { tool: name() });
            }
        }
        Ok(())
    }
}

impl Server {
    /// A principal-level revocation (from an identity system): ends the principal's handles
    /// (when the server has a handle service), revokes the delegation capabilities acting for
    /// it or held by it (with a delegation service), cancels its unfinished tasks and closes its
    /// open listen streams. Returns how many handles were revoked.
    pub async fn principal_event(&self, event: PrincipalEvent) -> Result<u64, HandleError> {
        let revoked = match &self.handles {
            Some(handles) => handles.on_principal_event(event.clone()).await?,
            None => 0,
        };
        // Its delegation capabilities end too (and everything minted under them).
        if let Some(delegation) = &self.delegation {
            let ended = delegation.on_principal_event(&event).await.map_err(HandleError::from)?;
            if ended > 0 {
                tracing::info!(capabilities = ended, "principal event: delegation capabilities revoked");
            }
        }
        // The principal's unfinished tasks stop too (its standing is re-checked at execution).
        if let Some(tasks) = &self.tasks {
            let (who, tenant) = match &event {
                PrincipalEvent::TokensRevoked { issuer, subject } | PrincipalEvent::RoleChanged { issuer, subject } => {
                    (Some((issuer, subject)), None)
                }
                PrincipalEvent::TenantSwitched { issuer, subject, from_tenant } => {
                    (Some((issuer, subject)), Some(from_tenant.as_str()))
                }
                PrincipalEvent::ClientRevoked { .. } => (None, None),
            };
            if let Some((issuer, subject)) = who {
                tasks.revoke_principal(&self.events, issuer, subject, tenant).await.map_err(HandleError::from)?;
            }
        }
        self.events.publish(match event {
            PrincipalEvent::TokensRevoked { issuer, subject } | PrincipalEvent::RoleChanged { issuer, subject } => {
                ServerEvent::PrincipalRevoked { issuer, subject, tenant: None }
            }
            PrincipalEvent::TenantSwitched { issuer, subject, from_tenant } => {
                ServerEvent::PrincipalRevoked { issuer, subject, tenant: Some(from_tenant) }
            }
            PrincipalEvent::ClientRevoked { client } => ServerEvent::ClientRevoked { client },
        });
        Ok(revoked)
    }

    /// The task service, when the server has one.
    pub fn tasks(&self) -> Option<&Arc<TaskService>> {
        self.tasks.as_ref()
    }

    /// The session service, when the server has one.
    pub fn sessions(&self) -> Option<&Arc<SessionService>> {
        self.stages.session.sessions()
    }

    /// Whether the 2025-era session wire is served.
    pub fn legacy_enabled(&self) -> bool {
        self.config.legacy.enabled
    }

    /// The handle service, when the server has one.
    pub fn handles(&self) -> Option<&Arc<HandleService>> {
        self.handles.as_ref()
    }

    /// Whether every dependency answers (the store, when there is one) and the application can
    /// serve ([`ServerBuilder::readiness`]).
    pub async fn ready(&self) -> bool {
        self.readiness().await.is_ok()
    }

    /// [`Server::ready`], with why not in fixed words (`/readyz` answers them to anyone).
    pub async fn readiness(&self) -> Result<(), &'static str> {
        if let Some(store) = &self.audit_store
            && store.ping().await.is_err()
        {
            return Err("store unavailable");
        }
        self.readiness.as_ref().map_or(Ok(()), |readiness| readiness.ready())
    }

    /// The operator's detail of readiness (`/readyz/detail` on the private listener): `ready`,
    /// `reason` when not, `store` (`ok`, `unavailable`, `none`), and the application's fields.
    pub async fn readiness_detail(&self) -> serde_json::Value {
        let store = match &self.audit_store {
            Some(store) if store.ping().await.is_ok() => "ok",
            Some(_) => "unavailable",
            None => "none",
        };
        let application = self.readiness.as_ref().map(|readiness| (readiness.ready(), readiness.detail()));
        let reason = match (&application, store) {
            (_, "unavailable") => Some("store unavailable"),
            (Some((Err(reason), _)), _) => Some(*reason),
            _ => None,
        };
        let mut detail = serde_json::Map::new();
        detail.insert("ready".into(), reason.is_none().into());
        detail.insert("reason".into(), reason.into());
        detail.insert("store".into(), store.into());
        if let Some((_, serde_json::Value::Object(fields))) = application {
            detail.extend(fields);
        }
        serde_json::Value::Object(detail)
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.recorder.metrics
    }

    /// Replaces the rate limits (a reload): requests past stage 3d keep their decision; the
    /// state of every rule unchanged from the current set carries over when the new set was
    /// built with it as `previous` ([`RateLimits::build`]).
    pub fn set_rate_limits(&self, limits: Arc<RateLimits>) {
        self.stages.limits.set(limits);
    }

    /// The rate limits in force (the `previous` of the next [`RateLimits::build`]).
    pub fn rate_limits(&self) -> Arc<RateLimits> {
        self.stages.limits.current()
    }

    /// For the 2025-era transport's requests that are not JSON-RPC requests: authenticate, admit
    /// the session, clear the kill switch (see [`Stages::admit_session`]).
    pub(crate) async fn admit_session(
        &self,
        authorization: Option<&[u8]>,
        session: Option<&crate::sessions::SessionId>,
        method: crate::method::Method,
    ) -> Result<
        (Arc<crate::auth::VerifiedPrincipal>, crate::sessions::Admitted, Option<Arc<crate::clearance::Cleared>>),
        crate::reply::Reply,
    > {
        self.stages.admit_session(authorization, session, method).await
    }

    /// A 2025-era request whose `Mcp-Session-Id` is malformed or repeated (see
    /// [`Stages::refuse_malformed_session`]).
    pub(crate) async fn refuse_malformed_session(
        &self,
        authorization: Option<&[u8]>,
        what: &str,
    ) -> crate::reply::Reply {
        self.stages.refuse_malformed_session(authorization, what).await
    }

    /// The HTTP transport's refusals, counted until they are flushed to the audit log.
    pub(crate) fn transport_refusals(&self) -> &TransportRefusals {
        &self.transport_refusals
    }

    /// Flushes the audit log (call at shutdown).
    pub async fn flush_audit(&self) {
        // The counted refusals (transport, and the surfaces beside the MCP path) first: what the
        // periodic flusher has not written yet is written before the writer closes.
        self.transport_refusals().flush(self.clock().now_unsigned_ms()).await;
        self.surface_audit.flush().await;
        if let Some(writer) = &self.recorder.writer {
            writer.shutdown().await;
        }
    }

    /// A keyed digest (HMAC-SHA256, 16 hex bytes) of an identifier, for the audit log: stable
    /// for one deployment, meaningless without its secret.
    pub fn digest(&self, value: &str) -> String {
        keyed_digest(self.recorder.digester.key(), value)
    }

    /// The audit sink of the surfaces beside the MCP path (the development authorization server,
    /// the gateway's web pages): the request path's writer and digest key, its refusals flushed
    /// with the transport's.
    pub fn surface_audit(&self) -> &Arc<crate::surface_audit::SurfaceAudit> {
        &self.surface_audit
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The authentication mode.
    pub fn authenticator(&self) -> &Authenticator {
        self.stages.authenticate.authenticator()
    }

    /// The event bus listen streams are fed from.
    pub fn events(&self) -> &EventBus {
        &self.events
    }

    /// Cancelled when the server shuts down; open listen streams then end with `complete`.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// The clock.
    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// A place for one more open stream of `principal` (listen, GET), or the refusal.
    pub(crate) fn stream_permit(
        &self,
        principal: &crate::auth::VerifiedPrincipal,
    ) -> Result<crate::streams::StreamPermit, palisade_wire::ProtocolError> {
        self.stages.dispatch.stream_permit(principal)
    }

    /// The resource URIs the open listen and GET streams of this instance want updates of, as
    /// that set changes (an application that asks for updates elsewhere follows it).
    pub fn resource_interest(&self) -> tokio::sync::watch::Receiver<std::collections::BTreeSet<String>> {
        self.stages.dispatch.interest.watch()
    }

    /// A stream's interest in `uris`, held until the guard drops.
    pub(crate) fn hold_interest(&self, uris: Vec<String>) -> crate::streams::InterestGuard {
        self.stages.dispatch.interest.hold(uris)
    }

    /// Every version this server speaks: 2026-07-28, then the enabled 2025-era ones (an
    /// auto-negotiating client picks the newest it knows).
    pub fn supported_versions(&self) -> Vec<String> {
        self.stages.dispatch.supported_versions()
    }

    /// Runs one request through every stage (see [`crate::pipeline`]). Notifications for the
    /// request (progress, logs, listen events) go to `sink`; the returned [`Reply`] is the final
    /// frame. When `cancel` fires the work stops and the reply is meaningless (the transport
    /// sends nothing).
    pub async fn handle_request(
        &self,
        request: palisade_wire::Request,
        headers: Option<&TransportHeaders>,
        sink: NotificationSink,
        cancel: CancellationToken,
    ) -> Reply {
        // One application snapshot for the whole request: a publication while it runs is not
        // half-seen.
        self.stages.run(self.current.load_full(), request, headers, None, sink, cancel).await
    }

    /// Runs one request of the 2025-era session wire through the same stages: stage 1 is the
    /// session wire's envelope, and stage 2b admits the caller's own live session (whose
    /// negotiated version, client capabilities and log level become the request's `_meta`;
    /// `initialize` creates the session instead, [`Reply::session`]).
    pub async fn handle_legacy_request(
        &self,
        request: palisade_wire::Request,
        headers: Option<&TransportHeaders>,
        session: Option<&crate::sessions::SessionId>,
        sink: NotificationSink,
        cancel: CancellationToken,
    ) -> Reply {
        self.stages.run(self.current.load_full(), request, headers, Some(LegacyWire { session }), sink, cancel).await
    }
}

/// Starts, once per server, the task that flushes the server's transport refusals every
/// [`crate::ServerConfig::transport_refusal_interval`], and a last time when the server shuts
/// down. Needs a Tokio runtime (without one nothing is started). The task holds the server
/// weakly: it ends when the server is dropped.
pub fn spawn_refusal_flusher(server: &Arc<Server>) {
    let refusals = server.transport_refusals();
    if !refusals.claim_flusher() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        refusals.release_flusher();
        return;
    };
    let period = server.config().transport_refusal_interval.max(Duration::from_millis(1));
    let shutdown = server.shutdown_token().clone();
    let server = Arc::downgrade(server);
    runtime.spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let last = tokio::select! {
                biased;
                () = shutdown.cancelled() => true,
                _ = ticks.tick() => false,
            };
            let Some(server) = server.upgrade() else { return };
            server.transport_refusals().flush(server.clock().now_unsigned_ms()).await;
            server.surface_audit.flush().await;
            if last {
                return;
            }
        }
    });
}
