//! The request path. Every request, from HTTP or stdio, passes these stages in this order; the
//! order is written down once, in [`Server::handle_request`]:
//!
//! 1. **envelope**     method known and advertised (`-32601`), transport headers agree with the
//!    body (`-32020`), required `_meta` present and version supported (`-32602`, `-32022`)
//! 2. **authenticate** a [`VerifiedPrincipal`] or a refusal (control C1)
//! 3. **classify**     the server-derived [`OperationKey`]: method + registered name, never a
//!    string the client chose beyond picking a registered entry
//! 4. **kill switch**  `pre_dispatch` (when configured, see [`crate::killswitch`]): the operation
//!    must be in the signed registry and the authority's signed answer ENABLE for every target;
//!    DISABLE is "operation disabled", any doubt `503`. Handlers run the second phase,
//!    [`RequestContext::pre_side_effect`], before committing
//! 5. **authorize**    the operation's required scopes
//! 6. **handles**      every declared handle argument resolved with its per-use checks (owner,
//!    expiry, revocation, policy version, scope, object version, the application's authorization);
//!    any failure is one generic `-32602` and nothing runs. Then the allow decision is made
//!    durable (with the handles' digest prefixes), else `503`
//! 7. **dispatch**     argument validation, handle arguments removed, then the handler (prepare,
//!    `pre_side_effect` for the commit fence, commit)
//! 8. **respond + audit** `resultType` and serverInfo added, the decision logged without secrets

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use palisade_wire::header::{decode_value, matches_json};
use palisade_wire::jsonrpc::{error_frame, notification_frame, result_frame};
use palisade_wire::{LogLevel, ProtocolError, Request, RequestId, RequestMeta, meta_keys};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use palisade_store::{AuditRecord, AuditStore, AuditWriter, AuditWriterConfig, Decision};

use crate::metrics::Metrics;

use crate::auth::{Authenticator, VerifiedPrincipal};
use crate::clock::{Clock, SystemClock};
use crate::config::ServerConfig;
use crate::context::{InputRequired, NotificationSink, Outcome, RequestContext};
use crate::cursor::Cursors;
use crate::events::{EventBus, ServerEvent};
use crate::handles::{HandleError, HandleService, PrincipalEvent, ResolvedHandle};
use crate::killswitch::KillSwitchStage;
use crate::mrtr::{Binding, StateSealer};
use crate::registry::{App, CompletionRef};
use crate::secret::ServerSecret;
use crate::sessions::{Admitted, SessionId, SessionService, store_refusal};
use crate::tasks::{TASKS_EXTENSION, TaskCall, TaskService, TaskSupport};
use palisade_store::{OnceStore, SessionStore};

/// The methods of 2026-07-28 this server implements; anything else is `-32601`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `server/discover`
    Discover,
    /// `tools/list`
    ToolsList,
    /// `tools/call`
    ToolsCall,
    /// `resources/list`
    ResourcesList,
    /// `resources/templates/list`
    ResourceTemplatesList,
    /// `resources/read`
    ResourcesRead,
    /// `prompts/list`
    PromptsList,
    /// `prompts/get`
    PromptsGet,
    /// `completion/complete`
    Complete,
    /// `subscriptions/listen`
    Listen,
    /// `tasks/get` (tasks extension)
    TasksGet,
    /// `tasks/update` (tasks extension)
    TasksUpdate,
    /// `tasks/cancel` (tasks extension)
    TasksCancel,
    /// `initialize` (2025-era wire only)
    Initialize,
    /// `ping` (2025-era wire only)
    Ping,
    /// `logging/setLevel` (2025-era wire only)
    SetLogLevel,
    /// `resources/subscribe` (2025-era wire only)
    Subscribe,
    /// `resources/unsubscribe` (2025-era wire only)
    Unsubscribe,
    /// Opening the session's `GET /mcp` stream (2025-era wire only; not a JSON-RPC method).
    SessionStream,
    /// A client notification POSTed to a session (2025-era wire only).
    SessionNotification,
    /// A client's answer to a server request of its session (2025-era wire only).
    SessionAnswer,
    /// `DELETE /mcp` of a session (2025-era wire only).
    SessionDelete,
}

/// What an operation key names besides its method: the kind of registered entry it acts on.
/// The one definition both classification (stage 3) and the kill switch's list of exposed
/// operations use, so that the two can never key an operation differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TargetFamily {
    /// The method alone (`tools/list`).
    None,
    /// A registered tool, by name (`tools/call:product_get`).
    Tool,
    /// A registered prompt, by name.
    Prompt,
    /// A registered resource URI or template (`resources/read:shop://policies/{topic}`).
    Resource,
}

impl Method {
    /// Looks a method name up; removed and unknown methods are `None`.
    pub fn parse(method: &str) -> Option<Self> {
        Some(match method {
            "server/discover" => Self::Discover,
            "tools/list" => Self::ToolsList,
            "tools/call" => Self::ToolsCall,
            "resources/list" => Self::ResourcesList,
            "resources/templates/list" => Self::ResourceTemplatesList,
            "resources/read" => Self::ResourcesRead,
            "prompts/list" => Self::PromptsList,
            "prompts/get" => Self::PromptsGet,
            "completion/complete" => Self::Complete,
            "subscriptions/listen" => Self::Listen,
            "tasks/get" => Self::TasksGet,
            "tasks/update" => Self::TasksUpdate,
            "tasks/cancel" => Self::TasksCancel,
            _ => return None,
        })
    }

    /// Looks a method of the 2025-era session wire up: the session methods, and every
    /// 2026-07-28 method except `server/discover` and `subscriptions/listen`.
    pub fn parse_legacy(method: &str) -> Option<Self> {
        Some(match method {
            "initialize" => Self::Initialize,
            "ping" => Self::Ping,
            "logging/setLevel" => Self::SetLogLevel,
            "resources/subscribe" => Self::Subscribe,
            "resources/unsubscribe" => Self::Unsubscribe,
            // Durable tasks are the 2026-07-28 extension: not on this wire (SECURITY.md).
            "server/discover" | "subscriptions/listen" | "tasks/get" | "tasks/update" | "tasks/cancel" => {
                return None;
            }
            other => return Self::parse(other),
        })
    }

    /// Whether the method exists only on the 2025-era session wire.
    pub fn is_session_method(self) -> bool {
        matches!(
            self,
            Self::Initialize
                | Self::Ping
                | Self::SetLogLevel
                | Self::Subscribe
                | Self::Unsubscribe
                | Self::SessionStream
                | Self::SessionNotification
                | Self::SessionAnswer
                | Self::SessionDelete
        )
    }

    /// What the method's operation key names besides the method.
    pub(crate) fn target_family(self) -> TargetFamily {
        match self {
            Self::ToolsCall => TargetFamily::Tool,
            Self::PromptsGet => TargetFamily::Prompt,
            Self::ResourcesRead | Self::Subscribe | Self::Unsubscribe => TargetFamily::Resource,
            _ => TargetFamily::None,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Discover => "server/discover",
            Self::ToolsList => "tools/list",
            Self::ToolsCall => "tools/call",
            Self::ResourcesList => "resources/list",
            Self::ResourceTemplatesList => "resources/templates/list",
            Self::ResourcesRead => "resources/read",
            Self::PromptsList => "prompts/list",
            Self::PromptsGet => "prompts/get",
            Self::Complete => "completion/complete",
            Self::Listen => "subscriptions/listen",
            Self::TasksGet => "tasks/get",
            Self::TasksUpdate => "tasks/update",
            Self::TasksCancel => "tasks/cancel",
            Self::Initialize => "initialize",
            Self::Ping => "ping",
            Self::SetLogLevel => "logging/setLevel",
            Self::Subscribe => "resources/subscribe",
            Self::Unsubscribe => "resources/unsubscribe",
            Self::SessionStream => "session/stream",
            Self::SessionNotification => "session/notification",
            Self::SessionAnswer => "session/answer",
            Self::SessionDelete => "session/delete",
        }
    }
}

/// The operation a request performs, derived by the server: the method plus the *registered*
/// name it targets. It is what policy (scopes, later the kill switch registry) is keyed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationKey {
    method: Method,
    target: Option<String>,
}

impl OperationKey {
    /// The key of a `tools/call` of a registered tool (task workers re-check their tool with it).
    pub(crate) fn tool_call(tool: &str) -> Self {
        Self { method: Method::ToolsCall, target: Some(tool.to_owned()) }
    }

    /// Any key, for tests of later stages (the pipeline only ever classifies).
    #[cfg(test)]
    pub(crate) fn for_test(method: Method, target: Option<&str>) -> Self {
        Self { method, target: target.map(str::to_owned) }
    }

    /// The method.
    pub fn method(&self) -> Method {
        self.method
    }

    /// The registered tool/prompt name or resource URI/template, if the method targets one.
    pub fn target(&self) -> Option<&str> {
        self.target.as_deref()
    }
}

impl std::fmt::Display for OperationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.target {
            Some(target) => write!(f, "{}:{}", self.method.as_str(), target),
            None => f.write_str(self.method.as_str()),
        }
    }
}

/// The `Mcp-*` transport headers of one HTTP request, raw. stdio requests have none.
#[derive(Debug, Clone, Default)]
pub struct TransportHeaders {
    /// `MCP-Protocol-Version`
    pub protocol_version: Option<Vec<u8>>,
    /// `Mcp-Method`
    pub method: Option<Vec<u8>>,
    /// `Mcp-Name`
    pub name: Option<Vec<u8>>,
    /// `Mcp-Param-{X}` with `X` lowercased.
    pub params: Vec<(String, Vec<u8>)>,
    /// The name of a routing header that was sent more than once, if any.
    pub duplicate: Option<String>,
    /// The raw `Authorization` header, handed only to the authentication stage.
    pub authorization: Option<Vec<u8>>,
}

/// What the 2025-era transport adds to a request: its `Mcp-Session-Id`, if any.
pub(crate) struct LegacyWire<'a> {
    session: Option<&'a SessionId>,
}

/// The answer to one request: the final frame and the HTTP status it travels with.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The JSON-RPC response frame.
    pub frame: Value,
    /// HTTP status when the reply is the whole response (ignored inside an SSE stream).
    pub status: u16,
    /// `WWW-Authenticate` challenge for 401/403 refusals.
    pub challenge: Option<String>,
    /// A new session id for the `Mcp-Session-Id` header (a 2025-era `initialize` only).
    pub session: Option<SessionId>,
}

impl Reply {
    fn ok(id: &RequestId, result: Value) -> Self {
        Self { frame: result_frame(id, result), status: 200, challenge: None, session: None }
    }

    /// An error reply.
    pub fn error(id: Option<&RequestId>, error: &ProtocolError) -> Self {
        Self { frame: error_frame(id, error), status: error.http_status(), challenge: None, session: None }
    }
}

/// What the audit record of one request says, written at each decision point.
struct AuditTrail<'a> {
    server: &'a Server,
    trace_id: String,
    operation: String,
    principal: Option<Arc<VerifiedPrincipal>>,
    /// Digest prefixes of the handles involved, and their policy versions.
    detail: Option<String>,
    policy_version: Option<String>,
    /// The request's trace span (disabled unless trace export is on; see [`crate::telemetry`]).
    span: tracing::Span,
}

impl<'a> AuditTrail<'a> {
    fn new(server: &'a Server, method: &str) -> Self {
        Self::traced(server, method, tracing::Span::none(), None)
    }

    /// A trail whose trace id is the span's when trace export is on, else a fresh random one.
    fn traced(server: &'a Server, method: &str, span: tracing::Span, trace_id: Option<String>) -> Self {
        let trace_id = trace_id.unwrap_or_else(fresh_trace_id);
        // Until classification, the operation is the method name as sent, cut to a sane length.
        let operation = method.chars().take(64).collect();
        Self { server, trace_id, operation, principal: None, detail: None, policy_version: None, span }
    }

    fn principal(&mut self, principal: &Arc<VerifiedPrincipal>) {
        self.principal = Some(principal.clone());
    }

    fn operation(&mut self, operation: &OperationKey) {
        self.operation = operation.to_string();
        crate::telemetry::operation(&self.span, &self.operation);
    }

    fn record(&self, stage: &str, decision: Decision, code: Option<i64>) -> AuditRecord {
        let principal = self.principal.as_deref();
        let digests = self.server.digester.digests(principal);
        AuditRecord {
            at_ms: self.server.clock.now_ms(),
            trace_id: self.trace_id.clone(),
            stage: stage.to_owned(),
            decision,
            operation: self.operation.clone(),
            principal_digest: digests.principal,
            tenant_digest: digests.tenant,
            client_digest: digests.client,
            scopes: principal.map(VerifiedPrincipal::scopes).unwrap_or_default(),
            policy_version: self.policy_version.clone(),
            code,
            detail: self.detail.clone(),
        }
    }

    /// Records the allow decision; an error means it is not durable and the request must stop.
    async fn allow(&self, stage: &str) -> Result<(), ProtocolError> {
        self.server.metrics.observe_decision(stage, "allow");
        crate::telemetry::decision(&self.span, stage, "allow", None);
        // Allows are the common case and are in the audit log: debug level keeps the log cheap.
        tracing::debug!(trace_id = %self.trace_id, stage, decision = "allow", operation = %self.operation, "decision");
        let Some(writer) = &self.server.audit else { return Ok(()) };
        writer.append(self.record(stage, Decision::Allow, None)).await.map_err(|error| {
            tracing::error!(trace_id = %self.trace_id, %error, "audit log unavailable: refusing the request");
            ProtocolError::Unavailable
        })
    }

    /// Records a refusal that is answered with a result rather than an error (arguments that
    /// fail the tool's schema, a declined confirmation). It stands even if it cannot be recorded.
    async fn deny(&self, stage: &str, code: Option<i64>) {
        self.server.metrics.observe_decision(stage, "deny");
        crate::telemetry::decision(&self.span, stage, "deny", code);
        tracing::info!(trace_id = %self.trace_id, stage, decision = "deny", code, operation = %self.operation, "decision");
        if let Some(writer) = &self.server.audit
            && let Err(audit_error) = writer.append(self.record(stage, Decision::Deny, code)).await
        {
            tracing::error!(trace_id = %self.trace_id, %audit_error, "audit log unavailable while refusing");
        }
    }

    /// Records a refusal and builds its reply. A refusal stands even if it cannot be recorded.
    async fn refuse(&self, id: &RequestId, stage: &str, error: &ProtocolError, challenge: Option<String>) -> Reply {
        self.refuse_any(Some(id), stage, error, challenge).await
    }

    /// [`refuse`](Self::refuse) for a message that has no JSON-RPC id.
    async fn refuse_any(
        &self,
        id: Option<&RequestId>,
        stage: &str,
        error: &ProtocolError,
        challenge: Option<String>,
    ) -> Reply {
        self.deny(stage, Some(error.code())).await;
        Reply { challenge, ..Reply::error(id, error) }
    }
}

/// The audit record's principal partition: keyed digests (HMAC-SHA-256 under the server's
/// audit-digest key, first 16 bytes in hex) of `issuer#subject`, the tenant and the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PrincipalDigests {
    pub principal: Option<String>,
    pub tenant: Option<String>,
    pub client: Option<String>,
}

impl PrincipalDigests {
    fn of(key: &aws_lc_rs::hmac::Key, principal: &VerifiedPrincipal) -> Self {
        let digest = |value: &str| keyed_digest(key, value);
        PrincipalDigests {
            principal: Some(digest(&format!("{}#{}", principal.issuer(), principal.subject()))),
            tenant: principal.tenant().map(digest),
            client: principal.client_id().map(digest),
        }
    }
}

/// Principals whose digests a [`PrincipalDigester`] remembers; past this many it starts afresh.
const RECENT_PRINCIPALS: usize = 4096;

/// Computes the audit digests of principals and remembers those of recent ones: a server sees
/// the same principals over and over, and three HMACs per decision were about 2 µs of the read
/// path. A remembered entry is keyed by the principal's whole identity (issuer, subject, tenant,
/// client, length-prefixed), so it can only ever answer for that identity.
pub(crate) struct PrincipalDigester {
    key: aws_lc_rs::hmac::Key,
    recent: std::sync::Mutex<HashMap<String, PrincipalDigests>>,
}

impl PrincipalDigester {
    pub(crate) fn new(key: aws_lc_rs::hmac::Key) -> Self {
        Self { key, recent: std::sync::Mutex::new(HashMap::new()) }
    }

    /// The audit-digest key.
    pub(crate) fn key(&self) -> &aws_lc_rs::hmac::Key {
        &self.key
    }

    /// The digests of `principal` (all absent without one).
    pub(crate) fn digests(&self, principal: Option<&VerifiedPrincipal>) -> PrincipalDigests {
        let Some(principal) = principal else { return PrincipalDigests::default() };
        let identity = identity_key(principal);
        if let Some(known) = self.recent().get(&identity) {
            return known.clone();
        }
        let digests = PrincipalDigests::of(&self.key, principal);
        let mut recent = self.recent();
        if recent.len() >= RECENT_PRINCIPALS {
            recent.clear();
        }
        recent.insert(identity, digests.clone());
        digests
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, HashMap<String, PrincipalDigests>> {
        // The map holds only derived values: a panic elsewhere cannot leave a wrong entry.
        self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An unambiguous key for a principal's identity: each part as `length:text`, an absent part
/// as `-`.
fn identity_key(principal: &VerifiedPrincipal) -> String {
    use std::fmt::Write as _;
    let mut key = String::with_capacity(64);
    for part in [Some(principal.issuer()), Some(principal.subject()), principal.tenant(), principal.client_id()] {
        match part {
            Some(text) => {
                let _ = write!(key, "{}:{text}", text.len());
            }
            None => key.push('-'),
        }
    }
    key
}

/// A random 128-bit trace id in hex. Not a secret: an RNG failure only costs uniqueness.
///
/// The bytes come from a per-thread block of system CSPRNG output, refilled every
/// [`TRACE_ID_BLOCK`] ÷ 16 ids: one `fill` per request cost about 2 µs, a tenth of the
/// pipeline's own work per request.
pub(crate) fn fresh_trace_id() -> String {
    thread_local! {
        static BLOCK: std::cell::RefCell<TraceIdBlock> = const {
            std::cell::RefCell::new(TraceIdBlock { bytes: [0; TRACE_ID_BLOCK], used: TRACE_ID_BLOCK })
        };
    }
    BLOCK.with_borrow_mut(|block| {
        if block.used == TRACE_ID_BLOCK {
            let _ = aws_lc_rs::rand::fill(&mut block.bytes);
            block.used = 0;
        }
        let id = &mut block.bytes[block.used..block.used + 16];
        let hex = palisade_wire::hex(id);
        // Handed out once: wiped so that the block never holds an id already given.
        id.fill(0);
        block.used += 16;
        hex
    })
}

/// Bytes of randomness fetched at once for trace ids (256 ids).
const TRACE_ID_BLOCK: usize = 4096;

struct TraceIdBlock {
    bytes: [u8; TRACE_ID_BLOCK],
    used: usize,
}

fn keyed_digest(key: &aws_lc_rs::hmac::Key, value: &str) -> String {
    let tag = aws_lc_rs::hmac::sign(key, value.as_bytes());
    palisade_wire::hex(&tag.as_ref()[..16])
}

/// A running server: the application plus everything the pipeline needs. Shared by transports.
pub struct Server {
    app: Arc<App>,
    config: ServerConfig,
    authenticator: Authenticator,
    sealer: StateSealer,
    cursors: Cursors,
    events: EventBus,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
    audit: Option<Arc<AuditWriter>>,
    store: Option<Arc<dyn AuditStore>>,
    handles: Option<Arc<HandleService>>,
    tasks: Option<Arc<TaskService>>,
    digester: Arc<PrincipalDigester>,
    session_key: aws_lc_rs::hmac::Key,
    sessions: Option<Arc<SessionService>>,
    metrics: Metrics,
    kill_switch: Option<KillSwitchStage>,
    once: Option<Arc<dyn OnceStore>>,
    streams: Arc<crate::streams::StreamLimiter>,
    /// Refusals of the HTTP transport, aggregated for the audit log (see [`crate::refusals`]).
    transport_refusals: crate::refusals::TransportRefusals,
}

impl Server {
    /// A server for `app`.
    pub fn new(app: App, config: ServerConfig, authenticator: Authenticator, secret: ServerSecret) -> Self {
        let ttl_ms = u64::try_from(config.request_state_ttl.as_millis()).unwrap_or(u64::MAX);
        Self {
            sealer: StateSealer::new(&secret, ttl_ms),
            digester: Arc::new(PrincipalDigester::new(secret.derive("palisade/audit-digest/v1"))),
            session_key: secret.derive("palisade/session-owner/v1"),
            sessions: None,
            audit: None,
            store: None,
            handles: None,
            tasks: None,
            kill_switch: None,
            once: None,
            streams: Arc::default(),
            transport_refusals: crate::refusals::TransportRefusals::new(secret.derive("palisade/audit-digest/v1")),
            metrics: Metrics::default(),
            cursors: Cursors::new(&secret),
            events: EventBus::new(config.listen_queue),
            clock: Arc::new(SystemClock),
            shutdown: CancellationToken::new(),
            app: Arc::new(app),
            config,
            authenticator,
        }
    }

    /// Records every decision in `store`'s hash-chained audit log (group commit); the store's
    /// health is also what `/readyz` reports.
    pub fn with_audit(mut self, store: Arc<dyn AuditStore>) -> Self {
        let writer = Arc::new(AuditWriter::new(store.clone(), AuditWriterConfig::default()));
        self.transport_refusals.attach(writer.clone());
        if let Some(tasks) = &self.tasks {
            tasks.set_audit(writer.clone(), self.digester.clone());
        }
        self.audit = Some(writer);
        self.store = Some(store);
        self
    }

    /// Keeps single-use records (an accepted confirmation is spent there) in `store`, shared by
    /// every instance. Without one, a confirmed call of a needs-confirmation tool is refused.
    pub fn with_once_store(mut self, store: Arc<dyn OnceStore>) -> Self {
        self.once = Some(store);
        self
    }

    /// Resolves declared handle arguments with `service` (see [`crate::handles`]).
    pub fn with_handles(mut self, service: Arc<HandleService>) -> Self {
        self.handles = Some(service);
        self
    }

    /// Runs task-capable tools as durable tasks with `service` and serves `tasks/*` (see
    /// [`crate::tasks`]). Also starts forwarding task changes from other instances (when the
    /// store pushes them) to this instance's listen streams.
    pub fn with_tasks(mut self, service: Arc<TaskService>) -> Self {
        service.spawn_fan_in(self.events.clone());
        // Task workers audit the decisions they make at execution time (the kill switch).
        if let Some(writer) = &self.audit {
            service.set_audit(writer.clone(), self.digester.clone());
        }
        self.tasks = Some(service);
        self
    }

    /// A principal-level revocation (from an identity system): ends the principal's handles
    /// (when the server has a handle service), cancels its unfinished tasks and closes its open
    /// listen streams. Returns how many handles were revoked.
    pub async fn principal_event(&self, event: PrincipalEvent) -> Result<u64, HandleError> {
        let revoked = match &self.handles {
            Some(handles) => handles.on_principal_event(event.clone()).await?,
            None => 0,
        };
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

    /// The application, shared (task workers hold it beyond a request).
    pub fn shared_app(&self) -> Arc<App> {
        self.app.clone()
    }

    /// Runs every request through the kill switch (stage 4, and the handlers' second phase),
    /// reporting `server_release` as this server's release target. Refused when the signed
    /// registry misses any operation this server exposes.
    pub fn with_kill_switch(
        mut self,
        kill_switch: Arc<palisade_killswitch::KillSwitch>,
        server_release: impl Into<String>,
    ) -> Result<Self, palisade_killswitch::RegistryError> {
        let stage = KillSwitchStage::new(kill_switch, server_release.into(), &self.app)?;
        // Task workers ask again at execution time (a task may run long after its request).
        if let Some(tasks) = &self.tasks {
            tasks.set_kill_switch(stage.clone());
        }
        self.kill_switch = Some(stage);
        Ok(self)
    }

    /// Keeps 2025-era session state in `store` (needed when `config.legacy.enabled`; without it
    /// `initialize` is refused with 503).
    pub fn with_sessions(mut self, store: Arc<dyn SessionStore>) -> Self {
        let service = SessionService::new(store, self.session_key.clone(), self.config.legacy.clone());
        self.sessions = Some(Arc::new(service));
        self
    }

    /// The session service, when the server has one.
    pub fn sessions(&self) -> Option<&Arc<SessionService>> {
        self.sessions.as_ref()
    }

    /// Whether the 2025-era session wire is served.
    pub fn legacy_enabled(&self) -> bool {
        self.config.legacy.enabled
    }

    /// The handle service, when the server has one.
    pub fn handles(&self) -> Option<&Arc<HandleService>> {
        self.handles.as_ref()
    }

    /// Whether every dependency answers (the store, when there is one).
    pub async fn ready(&self) -> bool {
        match &self.store {
            Some(store) => store.ping().await.is_ok(),
            None => true,
        }
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The HTTP transport's refusals, counted until they are flushed to the audit log.
    pub(crate) fn transport_refusals(&self) -> &crate::refusals::TransportRefusals {
        &self.transport_refusals
    }

    /// Flushes the audit log (call at shutdown).
    pub async fn flush_audit(&self) {
        if let Some(writer) = &self.audit {
            writer.shutdown().await;
        }
    }

    /// A keyed digest (HMAC-SHA256, 16 hex bytes) of an identifier, for the audit log: stable
    /// for one deployment, meaningless without its secret.
    pub fn digest(&self, value: &str) -> String {
        keyed_digest(self.digester.key(), value)
    }

    /// Replaces the clock (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The authentication mode.
    pub fn authenticator(&self) -> &Authenticator {
        &self.authenticator
    }

    /// The event bus listen streams are fed from.
    pub fn events(&self) -> &EventBus {
        &self.events
    }

    /// The application.
    pub fn app(&self) -> &App {
        &self.app
    }

    /// Cancelled when the server shuts down; open listen streams then end with `complete`.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Runs one request through every stage. Notifications for the request (progress, logs,
    /// listen events) go to `sink`; the returned [`Reply`] is the final frame. When `cancel`
    /// fires the work stops and the reply is meaningless (the transport sends nothing).
    pub async fn handle_request(
        &self,
        request: Request,
        headers: Option<&TransportHeaders>,
        sink: NotificationSink,
        cancel: CancellationToken,
    ) -> Reply {
        self.run(request, headers, None, sink, cancel).await
    }

    /// Runs one request of the 2025-era session wire through the same stages. The adapter is
    /// stage 1 (the legacy envelope) plus stage 2b: after authentication, `session` must name a
    /// live session of *this* principal, whose negotiated version, client capabilities and log
    /// level become the request's `_meta`; `initialize` creates the session instead
    /// ([`Reply::session`]). Everything from classify on is the 2026-07-28 path.
    pub async fn handle_legacy_request(
        &self,
        request: Request,
        headers: Option<&TransportHeaders>,
        session: Option<&SessionId>,
        sink: NotificationSink,
        cancel: CancellationToken,
    ) -> Reply {
        self.run(request, headers, Some(LegacyWire { session }), sink, cancel).await
    }

    /// Runs the stages inside the request's trace span (when trace export is on), whose trace
    /// id is the audit trace id.
    async fn run(
        &self,
        request: Request,
        headers: Option<&TransportHeaders>,
        legacy: Option<LegacyWire<'_>>,
        sink: NotificationSink,
        cancel: CancellationToken,
    ) -> Reply {
        let (span, trace_id) =
            crate::telemetry::request_span(&request.method, &request.params, self.config.continue_traces);
        let mut audit = AuditTrail::traced(self, &request.method, span.clone(), trace_id);
        let stages = self.stages(request, headers, legacy, sink, cancel, &mut audit);
        if span.is_disabled() {
            return stages.await;
        }
        let reply = tracing::Instrument::instrument(stages, span.clone()).await;
        crate::telemetry::finish(&span, &reply);
        reply
    }

    async fn stages(
        &self,
        request: Request,
        headers: Option<&TransportHeaders>,
        legacy: Option<LegacyWire<'_>>,
        sink: NotificationSink,
        cancel: CancellationToken,
        audit: &mut AuditTrail<'_>,
    ) -> Reply {
        let id = request.id.clone();
        // 1. envelope. The order is the one the spec's probes pin down: `_meta` shape, then
        //    transport headers against the body, then version support, then the method.
        //    2025-era requests carry no `_meta`: theirs comes from the session (stage 2b).
        let checked = match &legacy {
            None => self.envelope(&request, headers).map(|(method, meta)| (method, Some(meta))),
            Some(wire) => self.legacy_envelope(&request, headers, wire).map(|method| (method, None)),
        };
        let (method, meta) = match checked {
            Ok(checked) => checked,
            Err(error) => return audit.refuse(&id, "envelope", &error, None).await,
        };
        // 2. authenticate: nothing below runs without a VerifiedPrincipal.
        let authorization = headers.and_then(|h| h.authorization.as_deref());
        let principal = match self.authenticator.authenticate(authorization).await {
            Ok(principal) => Arc::new(principal),
            Err(refusal) => {
                tracing::info!(stage = "authenticate", reason = %refusal.error, "credentials refused");
                return audit.refuse(&id, "authenticate", &ProtocolError::Unauthenticated, refusal.challenge).await;
            }
        };
        audit.principal(&principal);
        // 2b. session (2025-era wire only): bound to the principal just authenticated, never
        //     proof of it. Unknown, foreign, expired and deleted sessions look alike: 404.
        let (meta, admitted) = match (meta, &legacy) {
            (Some(meta), _) => (meta, None),
            (None, Some(wire)) => {
                match self.legacy_session(method, &request, headers, wire.session, &principal).await {
                    Ok(checked) => checked,
                    Err(error) => return audit.refuse(&id, "session", &error, None).await,
                }
            }
            (None, None) => return audit.refuse(&id, "envelope", &ProtocolError::Internal, None).await,
        };
        // 3. classify: the operation key comes from the registry, not from client strings.
        let operation = match self.classify(method, &request.params) {
            Ok(operation) => operation,
            Err(error) => return audit.refuse(&id, "classify", &error, None).await,
        };
        audit.operation(&operation);
        // 4. kill switch (pre_dispatch): before any other decision about the operation.
        let cleared = match self.pre_dispatch(&operation, &principal, audit).await {
            Ok(cleared) => cleared,
            Err(error) => return audit.refuse(&id, "killswitch", &error, None).await,
        };
        // 5. authorize: the operation's required scopes; a 403 names all of them.
        let required = self.required_scopes(&operation, &request.params);
        if let Err(refusal) = self.authenticator.require_scopes(&principal, &required) {
            let error = ProtocolError::InsufficientScope { required };
            return audit.refuse(&id, "authorize", &error, refusal.challenge).await;
        }
        // 6. handles: every declared handle argument, resolved with its per-use checks.
        let resolved = match self.resolve_handles(&operation, &principal, &request.params, audit).await {
            Ok(resolved) => resolved,
            Err(error) => return audit.refuse(&id, "handles", &error, None).await,
        };
        // The allow decision is durable before any handler runs: if it cannot be recorded, the
        // request is refused (fail closed).
        let stage = if resolved.is_empty() { "authorize" } else { "handles" };
        if let Err(error) = audit.allow(stage).await {
            return audit.refuse(&id, "audit", &error, None).await;
        }
        // 7. dispatch.
        let fence_rule = cleared.clone();
        let ctx = RequestContext {
            id: id.clone(),
            meta,
            principal: principal.clone(),
            input_responses: Map::new(),
            request_state: None,
            sink,
            cancel: cancel.clone(),
            events: self.events.clone(),
            handles: self.handles.clone(),
            resolved: Arc::new(resolved),
            task: None,
            kill_switch: cleared,
        };
        let mut new_session = None;
        let result = match method {
            Method::Listen => self.listen(ctx, &request.params).await,
            Method::Initialize => self.initialize(&ctx).await.map(|(result, session)| {
                new_session = Some(session);
                result
            }),
            Method::Ping | Method::SetLogLevel | Method::Subscribe | Method::Unsubscribe => {
                self.session_method(method, &request.params, admitted.as_ref()).await
            }
            _ => {
                let work = self.dispatch(&operation, ctx, &request.params, audit);
                tokio::select! {
                    result = tokio::time::timeout(self.config.effective_timeout(), work) => {
                        result.unwrap_or_else(|_| { cancel.cancel(); Err(ProtocolError::Timeout) })
                    }
                    () = cancel.cancelled() => Err(ProtocolError::Internal),
                }
            }
        };
        // 8. respond.
        match result {
            Ok(result) if method.is_session_method() => Reply { session: new_session, ..Reply::ok(&id, result) },
            Ok(result) => Reply::ok(&id, self.decorate(result)),
            // A fenced tool completed without asking for its fence: a kill-switch refusal.
            Err(error) if fence_rule.as_ref().is_some_and(|cleared| cleared.fence_skipped()) => {
                audit.refuse(&id, "killswitch", &error, None).await
            }
            // Every refusal after the allow (a forged requestState, a bad cursor, a missing
            // capability, a handler's error, a timeout) is on the record with its code.
            Err(error) => audit.refuse(&id, "dispatch", &error, None).await,
        }
    }

    /// Stage 4, the kill switch's first phase, when the server runs one (`None` without): the
    /// audit trail then names the policy generation the decision was made under.
    async fn pre_dispatch(
        &self,
        operation: &OperationKey,
        principal: &VerifiedPrincipal,
        audit: &mut AuditTrail<'_>,
    ) -> Result<Option<Arc<crate::killswitch::Cleared>>, ProtocolError> {
        let Some(stage) = &self.kill_switch else { return Ok(None) };
        audit.policy_version = Some(stage.policy_version());
        stage.pre_dispatch(operation, principal).await.map(Some)
    }

    /// Stage 6: resolves the handle arguments the called tool declares. Any failure is one generic
    /// error (the audit record says which argument, by digest prefix only); a store outage is
    /// `503`. Tools without handle arguments pass through.
    async fn resolve_handles(
        &self,
        operation: &OperationKey,
        principal: &Arc<VerifiedPrincipal>,
        params: &Map<String, Value>,
        audit: &mut AuditTrail<'_>,
    ) -> Result<BTreeMap<String, ResolvedHandle>, ProtocolError> {
        let mut resolved = BTreeMap::new();
        let declared = match (operation.method, operation.target()) {
            (Method::ToolsCall, Some(name)) => self.app.tool(name).map(|t| t.handle_args.as_slice()).unwrap_or(&[]),
            _ => &[],
        };
        if declared.is_empty() {
            return Ok(resolved);
        }
        let Some(service) = &self.handles else {
            tracing::error!(operation = %operation, "a tool declares handle arguments but the server has no handle service");
            return Err(ProtocolError::Unavailable);
        };
        let mut details = Vec::new();
        let mut versions = Vec::new();
        for argument in declared {
            let raw = params.get("arguments").and_then(|a| a.get(&argument.name)).and_then(Value::as_str);
            let outcome = match raw {
                Some(raw) => {
                    let prefix = crate::handles::handle_digest(raw);
                    details.push(format!("{}={}", argument.name, palisade_store::hex_prefix(&prefix)));
                    service.resolve(principal, raw, &argument.object_type, &argument.required_scope).await
                }
                None => {
                    details.push(format!("{}=missing", argument.name));
                    Err(HandleError::Denied)
                }
            };
            audit.detail = Some(details.join(" "));
            let handle = outcome?;
            versions.push(format!("{}:{}", handle.object_type, handle.policy_version));
            audit.policy_version = Some(versions.join(" "));
            resolved.insert(argument.name.clone(), handle);
        }
        Ok(resolved)
    }

    /// Stage 5's scopes: what the operation's registered entry requires; for a listen stream,
    /// what reading every resource it names requires; for a completion, what its reference
    /// (the prompt, the resource) requires. What a request only *names* is never looser than
    /// what acting on it is.
    fn required_scopes(&self, operation: &OperationKey, params: &Map<String, Value>) -> Vec<String> {
        let app = &self.app;
        let mut scopes: Vec<String> = match (operation.method, operation.target()) {
            (Method::ToolsCall, Some(name)) => app.tool(name).map(|t| t.required_scopes.clone()).unwrap_or_default(),
            (Method::PromptsGet, Some(name)) => app.prompt(name).map(|p| p.required_scopes.clone()).unwrap_or_default(),
            // Subscribing to a resource needs what reading it needs, on either wire.
            (Method::ResourcesRead | Method::Subscribe | Method::Unsubscribe, Some(target)) => {
                app.resource_scopes(target).to_vec()
            }
            (Method::Listen, _) => {
                let uris = params
                    .get("notifications")
                    .and_then(|filter| filter.get("resourceSubscriptions"))
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                uris.iter()
                    .filter_map(Value::as_str)
                    .filter_map(|uri| app.registered_resource(uri))
                    .flat_map(|target| app.resource_scopes(target).iter().cloned())
                    .collect()
            }
            (Method::Complete, _) => {
                let reference = params.get("ref");
                let field = |key: &str| reference.and_then(|r| r.get(key)).and_then(Value::as_str);
                match reference.and_then(|r| r.get("type")).and_then(Value::as_str) {
                    Some("ref/prompt") => field("name")
                        .and_then(|name| app.prompt(name))
                        .map(|p| p.required_scopes.clone())
                        .unwrap_or_default(),
                    Some("ref/resource") => field("uri")
                        .and_then(|uri| app.registered_resource(uri).or(Some(uri)))
                        .map(|target| app.resource_scopes(target).to_vec())
                        .unwrap_or_default(),
                    _ => Vec::new(),
                }
            }
            _ => Vec::new(),
        };
        scopes.sort();
        scopes.dedup();
        scopes
    }

    /// Stage 1: everything that must hold before the request means anything.
    fn envelope(
        &self,
        request: &Request,
        headers: Option<&TransportHeaders>,
    ) -> Result<(Method, RequestMeta), ProtocolError> {
        let body_version = request.params.get("_meta").and_then(|meta| meta.get(meta_keys::PROTOCOL_VERSION));
        if let Some(headers) = headers
            && body_version.is_none()
            && is_legacy_version_header(headers.protocol_version.as_deref())
        {
            // An earlier revision's request (initialize handshake, session era). Only the
            // 2026-07-28 wire is served: say which versions are.
            return Err(if palisade_wire::error::is_removed_method(&request.method) {
                ProtocolError::MethodNotFound { method: request.method.clone() }
            } else {
                let requested = headers
                    .protocol_version
                    .as_deref()
                    .and_then(|v| palisade_wire::header::decode_plain_value(v).ok())
                    .unwrap_or_default();
                ProtocolError::UnsupportedVersion { requested }
            });
        }
        let meta = RequestMeta::from_params(&request.params)?;
        if let Some(headers) = headers {
            check_routing_headers(request, headers)?;
        }
        meta.check_supported()?;
        let method = self.known_method(&request.method)?;
        if let Some(headers) = headers {
            self.check_param_headers(method, request, headers)?;
        }
        Ok((method, meta))
    }

    fn known_method(&self, name: &str) -> Result<Method, ProtocolError> {
        let not_found = || ProtocolError::MethodNotFound { method: name.to_owned() };
        let method = Method::parse(name).ok_or_else(not_found)?;
        let tasks_method = matches!(method, Method::TasksGet | Method::TasksUpdate | Method::TasksCancel);
        if self.advertised(method) && (!tasks_method || self.tasks.is_some()) { Ok(method) } else { Err(not_found()) }
    }

    /// Whether the application offers what `method` needs (else the method is `-32601`).
    fn advertised(&self, method: Method) -> bool {
        advertised(&self.app, method)
    }

    /// Stage 1 on the 2025-era wire: a method of that wire, a session id on everything but
    /// `initialize` (and none on it), an accepted version header, no task augmentation.
    fn legacy_envelope(
        &self,
        request: &Request,
        headers: Option<&TransportHeaders>,
        wire: &LegacyWire<'_>,
    ) -> Result<Method, ProtocolError> {
        let not_found = || ProtocolError::MethodNotFound { method: request.method.clone() };
        let method = Method::parse_legacy(&request.method).ok_or_else(not_found)?;
        if !self.advertised(method) {
            return Err(not_found());
        }
        if let Some(headers) = headers {
            if let Some(name) = &headers.duplicate {
                return Err(ProtocolError::HeaderMismatch(format!("{name} sent more than once")));
            }
            if let Some(version) = plain_header(&headers.protocol_version, "MCP-Protocol-Version")?
                && !self.config.legacy.versions.contains(&version)
            {
                return Err(ProtocolError::UnsupportedVersion { requested: version });
            }
            check_method_and_name(request, headers, false)?;
        }
        match (method, wire.session) {
            (Method::Initialize, Some(_)) => {
                return Err(ProtocolError::InvalidRequest("initialize must not carry an Mcp-Session-Id"));
            }
            (Method::Initialize, None) | (_, Some(_)) => {}
            (_, None) => {
                return Err(ProtocolError::InvalidRequest("an Mcp-Session-Id header is required after initialize"));
            }
        }
        // The 2025-11-25 in-core tasks are not served (the tasks extension is 2026-07-28 only).
        if request.params.contains_key("task") {
            return Err(ProtocolError::invalid_params("task-augmented requests are not supported by this server"));
        }
        Ok(method)
    }

    /// Stage 2b on the 2025-era wire: the request's `_meta`, from the `initialize` params or
    /// from the caller's live session.
    async fn legacy_session(
        &self,
        method: Method,
        request: &Request,
        headers: Option<&TransportHeaders>,
        session: Option<&SessionId>,
        principal: &VerifiedPrincipal,
    ) -> Result<(RequestMeta, Option<Admitted>), ProtocolError> {
        let params = &request.params;
        let progress_token = match params.get("_meta").and_then(|meta| meta.get(meta_keys::PROGRESS_TOKEN)) {
            None => None,
            Some(raw) => Some(
                palisade_wire::ProgressToken::from_value(raw)
                    .ok_or_else(|| ProtocolError::invalid_params("progressToken must be a string or an integer"))?,
            ),
        };
        if method == Method::Initialize {
            let requested = string_param(params, "protocolVersion")?;
            let client_capabilities = match params.get("capabilities") {
                Some(Value::Object(capabilities)) => capabilities.clone(),
                _ => return Err(ProtocolError::invalid_params("capabilities must be an object")),
            };
            let client_info = match params.get("clientInfo") {
                None | Some(Value::Null) => None,
                Some(info @ Value::Object(_)) => Some(info.clone()),
                Some(_) => return Err(ProtocolError::invalid_params("clientInfo must be an object")),
            };
            let versions = &self.config.legacy.versions;
            // The client's version if we speak it, else our newest (the client decides).
            let protocol_version = match versions.iter().find(|v| v.as_str() == requested) {
                Some(version) => version.clone(),
                None => versions.first().cloned().ok_or(ProtocolError::Internal)?,
            };
            let meta =
                RequestMeta { protocol_version, client_capabilities, client_info, log_level: None, progress_token };
            return Ok((meta, None));
        }
        let service = self.sessions.as_ref().ok_or_else(|| {
            tracing::error!("the 2025-era wire is on but the server has no session store");
            ProtocolError::Unavailable
        })?;
        let session = session.ok_or(ProtocolError::SessionNotFound)?;
        let admitted = service.admit(principal, session, self.clock.as_ref()).await?;
        if let Some(headers) = headers
            && let Some(version) = plain_header(&headers.protocol_version, "MCP-Protocol-Version")?
            && version != admitted.state.protocol_version
        {
            return Err(ProtocolError::HeaderMismatch(
                "MCP-Protocol-Version differs from the session's negotiated version".into(),
            ));
        }
        let client_capabilities = serde_json::from_str::<Value>(&admitted.state.client_capabilities)
            .ok()
            .and_then(|value| value.as_object().cloned())
            .ok_or_else(|| {
                tracing::error!("a stored session has unreadable client capabilities");
                ProtocolError::Internal
            })?;
        let meta = RequestMeta {
            protocol_version: admitted.state.protocol_version.clone(),
            client_capabilities,
            client_info: admitted.state.client_info.as_deref().and_then(|info| serde_json::from_str(info).ok()),
            log_level: admitted.state.log_level.as_deref().and_then(LogLevel::parse),
            progress_token,
        };
        Ok((meta, Some(admitted)))
    }

    /// `initialize`: a session bound to the caller, and the capabilities negotiated once.
    async fn initialize(&self, ctx: &RequestContext) -> Result<(Value, SessionId), ProtocolError> {
        let service = self.sessions.as_ref().ok_or_else(|| {
            tracing::error!("the 2025-era wire is on but the server has no session store");
            ProtocolError::Unavailable
        })?;
        let capabilities = Value::Object(ctx.meta.client_capabilities.clone());
        let session = service
            .create(
                &ctx.principal,
                &ctx.meta.protocol_version,
                &capabilities,
                ctx.meta.client_info.as_ref(),
                self.clock.as_ref(),
            )
            .await?;
        let mut result = json!({
            "protocolVersion": ctx.meta.protocol_version,
            "capabilities": self.app.capabilities(),
            "serverInfo": { "name": self.app.name, "version": self.app.version },
        });
        if let Some(instructions) = &self.app.instructions {
            result["instructions"] = json!(instructions);
        }
        Ok((result, session))
    }

    /// `ping`, `logging/setLevel`, `resources/subscribe` and `resources/unsubscribe`: state of
    /// the caller's own session, in the store.
    async fn session_method(
        &self,
        method: Method,
        params: &Map<String, Value>,
        admitted: Option<&Admitted>,
    ) -> Result<Value, ProtocolError> {
        let (Some(admitted), Some(service)) = (admitted, self.sessions.as_ref()) else {
            return Err(ProtocolError::Internal);
        };
        let store = service.store();
        let now = i64::try_from(self.clock.now_ms()).unwrap_or(i64::MAX);
        let (digest, owner) = (admitted.digest, &admitted.owner);
        let live = match method {
            Method::Ping => true,
            Method::SetLogLevel => {
                let level = string_param(params, "level")?;
                if LogLevel::parse(level).is_none() {
                    return Err(ProtocolError::invalid_params("level is not a known log level"));
                }
                store
                    .set_session_log_level(digest, owner, level, now)
                    .await
                    .map_err(|error| store_refusal("set_session_log_level", &error))?
            }
            Method::Subscribe => store
                .subscribe_session(digest, owner, string_param(params, "uri")?, now)
                .await
                .map_err(|error| store_refusal("subscribe_session", &error))?,
            Method::Unsubscribe => store
                .unsubscribe_session(digest, owner, string_param(params, "uri")?, now)
                .await
                .map_err(|error| store_refusal("unsubscribe_session", &error))?,
            _ => return Err(ProtocolError::Internal),
        };
        if live { Ok(json!({})) } else { Err(ProtocolError::SessionNotFound) }
    }

    /// For the 2025-era transport's requests that are not JSON-RPC requests (the GET stream,
    /// DELETE, notifications, answers to server requests): authenticate, admit the session for
    /// that principal, then the kill switch for `method` (one of the `Session*` operations, in
    /// the signed registry like every other). Audited like every other decision. The clearance
    /// is what a GET stream watches to end on a DISABLE.
    pub(crate) async fn admit_session(
        &self,
        authorization: Option<&[u8]>,
        session: Option<&SessionId>,
        method: Method,
    ) -> Result<(Arc<VerifiedPrincipal>, Admitted, Option<Arc<crate::killswitch::Cleared>>), Reply> {
        let mut audit = AuditTrail::new(self, method.as_str());
        let principal = match self.authenticator.authenticate(authorization).await {
            Ok(principal) => Arc::new(principal),
            Err(refusal) => {
                let error = ProtocolError::Unauthenticated;
                return Err(audit.refuse_any(None, "authenticate", &error, refusal.challenge).await);
            }
        };
        audit.principal(&principal);
        let Some(session) = session else {
            let error = ProtocolError::InvalidRequest("an Mcp-Session-Id header is required");
            return Err(audit.refuse_any(None, "session", &error, None).await);
        };
        let Some(service) = self.sessions.as_ref() else {
            return Err(audit.refuse_any(None, "session", &ProtocolError::Unavailable, None).await);
        };
        let admitted = match service.admit(&principal, session, self.clock.as_ref()).await {
            Ok(admitted) => admitted,
            Err(error) => return Err(audit.refuse_any(None, "session", &error, None).await),
        };
        let operation = OperationKey { method, target: None };
        audit.operation(&operation);
        let cleared = match self.pre_dispatch(&operation, &principal, &mut audit).await {
            Ok(cleared) => cleared,
            Err(error) => return Err(audit.refuse_any(None, "killswitch", &error, None).await),
        };
        if let Err(error) = audit.allow("session").await {
            return Err(audit.refuse_any(None, "audit", &error, None).await);
        }
        Ok((principal, admitted, cleared))
    }

    /// A 2025-era request whose `Mcp-Session-Id` is malformed or repeated: it can name no
    /// session, but authentication still comes first (401 with its challenge, whatever the
    /// session id), then the same 404 as an unknown session. Audited like every refusal.
    pub(crate) async fn refuse_malformed_session(&self, authorization: Option<&[u8]>, what: &str) -> Reply {
        let mut audit = AuditTrail::new(self, what);
        match self.authenticator.authenticate(authorization).await {
            Ok(principal) => {
                audit.principal(&Arc::new(principal));
                audit.refuse_any(None, "session", &ProtocolError::SessionNotFound, None).await
            }
            Err(refusal) => {
                audit.refuse_any(None, "authenticate", &ProtocolError::Unauthenticated, refusal.challenge).await
            }
        }
    }

    /// A place for one more open stream of `principal` (listen, GET), or the refusal.
    pub(crate) fn stream_permit(
        &self,
        principal: &VerifiedPrincipal,
    ) -> Result<crate::streams::StreamPermit, ProtocolError> {
        self.streams.acquire(principal.partition_key(), self.config.max_streams_per_principal).ok_or_else(|| {
            tracing::info!(stage = "listen", "stream refused: the principal holds the most streams allowed");
            ProtocolError::InvalidRequest("too many open streams for this caller")
        })
    }

    /// The clock.
    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// HTTP only: every `Mcp-Param-*` header a tool declares is present exactly when its
    /// argument is, and equal to it.
    fn check_param_headers(
        &self,
        method: Method,
        request: &Request,
        headers: &TransportHeaders,
    ) -> Result<(), ProtocolError> {
        if method != Method::ToolsCall {
            return Ok(());
        }
        let Some(tool) = request.params.get("name").and_then(Value::as_str).and_then(|n| self.app.tool(n)) else {
            return Ok(());
        };
        let mismatch = |what: String| ProtocolError::HeaderMismatch(what);
        let arguments = request.params.get("arguments").and_then(Value::as_object);
        for (header, property) in &tool.header_params {
            let value = arguments.and_then(|a| a.get(property)).filter(|v| !v.is_null());
            let sent = headers.params.iter().find(|(name, _)| name.eq_ignore_ascii_case(header));
            match (value, sent) {
                (None, None) => {}
                (Some(_), None) => return Err(mismatch(format!("Mcp-Param-{header} header is required"))),
                (None, Some(_)) => return Err(mismatch(format!("Mcp-Param-{header} has no matching argument"))),
                (Some(value), Some((_, raw))) => {
                    let decoded =
                        decode_value(raw).map_err(|_| mismatch(format!("Mcp-Param-{header} is malformed")))?;
                    if !matches_json(&decoded, value) {
                        return Err(mismatch(format!("Mcp-Param-{header} does not match the argument")));
                    }
                }
            }
        }
        Ok(())
    }

    fn classify(&self, method: Method, params: &Map<String, Value>) -> Result<OperationKey, ProtocolError> {
        let target = match method.target_family() {
            TargetFamily::Tool => {
                let name = string_param(params, "name")?;
                Some(self.app.tool(name).ok_or_else(|| ProtocolError::invalid_params("unknown tool"))?.name.clone())
            }
            TargetFamily::Prompt => {
                let name = string_param(params, "name")?;
                Some(self.app.prompt(name).ok_or_else(|| ProtocolError::invalid_params("unknown prompt"))?.name.clone())
            }
            TargetFamily::Resource => {
                let uri = string_param(params, "uri")?;
                let registered = self.app.registered_resource(uri);
                Some(registered.ok_or_else(|| ProtocolError::ResourceNotFound { uri: uri.to_owned() })?.to_owned())
            }
            TargetFamily::None => None,
        };
        // Any tasks/* request without the extension is -32021, before the id is looked at.
        if matches!(method, Method::TasksGet | Method::TasksUpdate | Method::TasksCancel) {
            let declared = RequestMeta::from_params(params).map(|meta| meta.has_extension(TASKS_EXTENSION));
            if !declared.unwrap_or(false) {
                return Err(missing_tasks_capability());
            }
        }
        Ok(OperationKey { method, target })
    }

    async fn dispatch(
        &self,
        operation: &OperationKey,
        mut ctx: RequestContext,
        params: &Map<String, Value>,
        audit: &AuditTrail<'_>,
    ) -> Result<Value, ProtocolError> {
        let app = &self.app;
        match operation.method {
            Method::Discover => Ok(self.discover()),
            Method::ToolsList => self.page("tools", params, &app.tools, |t| t.definition.clone()),
            Method::PromptsList => self.page("prompts", params, &app.prompts, |p| p.definition.clone()),
            Method::ResourcesList => self.page("resources", params, &app.resources, |r| r.definition.clone()),
            Method::ResourceTemplatesList => {
                self.page("resourceTemplates", params, &app.templates, |t| t.definition.clone())
            }
            Method::ToolsCall => {
                let tool = operation.target().and_then(|name| app.tool(name)).ok_or(ProtocolError::Internal)?;
                let mut arguments = match params.get("arguments") {
                    None | Some(Value::Null) => Map::new(),
                    Some(Value::Object(arguments)) => arguments.clone(),
                    Some(_) => return Err(ProtocolError::invalid_params("arguments must be an object")),
                };
                self.prepare_round(&mut ctx, Method::ToolsCall, params)?;
                if let Some(validator) = &tool.validator {
                    let instance = Value::Object(arguments.clone());
                    // Named by where in the tool's schema each check failed (the server's own
                    // text): a validator's message would quote the client's values back.
                    let problems: Vec<String> =
                        validator.iter_errors(&instance).take(5).map(|e| e.schema_path().to_string()).collect();
                    if !problems.is_empty() {
                        // A tool error the model can read, and a refusal on the record.
                        audit.deny("arguments", Some(ProtocolError::invalid_params("").code())).await;
                        let result =
                            crate::CallToolResult::error(format!("invalid arguments: {}", problems.join("; ")));
                        return Ok(result.into_value());
                    }
                }
                // Task-capable tools: a task when the request declares the extension; a tool that
                // only runs as a task refuses a request that does not (before any handler runs).
                // Never on the 2025-era wire, whatever its session's capabilities say: durable
                // tasks are the 2026-07-28 extension.
                let modern = palisade_wire::SUPPORTED_VERSIONS.contains(&ctx.meta.protocol_version.as_str());
                let as_task = tool.task_support != TaskSupport::Forbidden
                    && self.tasks.is_some()
                    && modern
                    && ctx.meta.has_extension(TASKS_EXTENSION);
                if tool.task_support == TaskSupport::Required && !as_task {
                    if !modern {
                        return Err(ProtocolError::invalid_params(
                            "this tool runs only as a durable task, which needs the 2026-07-28 wire",
                        ));
                    }
                    return Err(missing_tasks_capability());
                }
                // Handles were resolved in stage 6: the handler (and a confirmation question) gets
                // the objects, never the raw handles.
                for argument in &tool.handle_args {
                    arguments.remove(&argument.name);
                }
                if tool.needs_confirmation
                    && let Some(answer) = self.confirmation(&mut ctx, tool, params, &arguments, audit).await?
                {
                    return Ok(answer);
                }
                if as_task {
                    return self.create_task(operation, tool, ctx, params, arguments).await;
                }
                let outcome = (tool.handler)(ctx.clone(), arguments).await?;
                if let (Some(cleared), Outcome::Complete(result)) = (&ctx.kill_switch, &outcome)
                    && !result.is_error
                {
                    cleared.check_fence_obtained()?;
                }
                let outcome = match outcome {
                    // Later rounds of a confirmed call carry the confirmation forward.
                    Outcome::InputRequired(mut input) if tool.needs_confirmation => {
                        let app_state = input.state.take().unwrap_or(Value::Null);
                        input.state = Some(json!({ "confirmed": true, "app": app_state, "n": fresh_trace_id() }));
                        Outcome::InputRequired(input)
                    }
                    outcome => outcome,
                };
                self.finish_round(&ctx, Method::ToolsCall, params, outcome.map_complete(|r| r.into_value()))
            }
            Method::PromptsGet => {
                let prompt = operation.target().and_then(|name| app.prompt(name)).ok_or(ProtocolError::Internal)?;
                let arguments = string_map(params.get("arguments"))?;
                let missing = prompt.missing_required(&arguments);
                if !missing.is_empty() {
                    return Err(ProtocolError::invalid_params(format!(
                        "missing required arguments: {}",
                        missing.join(", ")
                    )));
                }
                self.prepare_round(&mut ctx, Method::PromptsGet, params)?;
                let outcome = (prompt.handler)(ctx.clone(), arguments).await?;
                self.finish_round(&ctx, Method::PromptsGet, params, outcome.map_complete(|r| r.to_value()))
            }
            Method::ResourcesRead => {
                let uri = string_param(params, "uri")?.to_owned();
                self.prepare_round(&mut ctx, Method::ResourcesRead, params)?;
                let (reader, vars, ttl_ms) = if let Some(resource) = app.resources.iter().find(|r| r.uri == uri) {
                    (resource.reader.clone(), BTreeMap::new(), resource.ttl_ms)
                } else {
                    let (template, vars) = app
                        .templates
                        .iter()
                        .find_map(|t| t.match_uri(&uri).map(|vars| (t, vars)))
                        .ok_or_else(|| ProtocolError::ResourceNotFound { uri: uri.clone() })?;
                    (template.reader.clone(), vars, template.ttl_ms)
                };
                let outcome = reader(ctx.clone(), uri.clone(), vars).await?;
                let outcome = outcome.map_complete(|contents| {
                    json!({
                        "contents": contents.iter().map(crate::ResourceContents::to_value).collect::<Vec<_>>(),
                        "ttlMs": ttl_ms,
                        "cacheScope": self.cache_scope(),
                    })
                });
                if let Outcome::Complete(result) = &outcome
                    && result["contents"].as_array().is_none_or(Vec::is_empty)
                {
                    return Err(ProtocolError::ResourceNotFound { uri });
                }
                self.finish_round(&ctx, Method::ResourcesRead, params, outcome)
            }
            Method::Complete => self.complete(params),
            Method::Listen
            | Method::Initialize
            | Method::Ping
            | Method::SetLogLevel
            | Method::Subscribe
            | Method::Unsubscribe
            | Method::SessionStream
            | Method::SessionNotification
            | Method::SessionAnswer
            | Method::SessionDelete => Err(ProtocolError::Internal),
            Method::TasksGet => self.task_service()?.get(&ctx.principal, params).await,
            Method::TasksUpdate => self.task_service()?.update(&self.app, &self.events, &ctx.principal, params).await,
            Method::TasksCancel => self.task_service()?.cancel(&self.events, &ctx.principal, params).await,
        }
    }

    fn task_service(&self) -> Result<&Arc<TaskService>, ProtocolError> {
        self.tasks.as_ref().ok_or(ProtocolError::Internal)
    }

    /// Runs the tool's prelude (an MRTR round may come first), then creates the durable task and
    /// answers the flat `CreateTaskResult` only once it is committed.
    async fn create_task(
        &self,
        operation: &OperationKey,
        tool: &crate::registry::ToolDef,
        ctx: RequestContext,
        params: &Map<String, Value>,
        arguments: Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        if let Some(prelude) = &tool.task_prelude
            && let Some(input) = prelude(ctx.clone(), arguments.clone()).await?
        {
            return self.finish_round(&ctx, Method::ToolsCall, params, Outcome::InputRequired(input));
        }
        let service = self.task_service()?;
        let meta = params.get("_meta").cloned().unwrap_or_else(|| json!({}));
        let call =
            TaskCall { tool: tool.name.clone(), arguments, meta, scopes: self.required_scopes(operation, params) };
        service.create(&self.app, &self.events, &ctx, call).await
    }

    /// The confirmation step of a needs-confirmation tool. `None`: confirmed, run the handler
    /// (with the application's own state unwrapped into the context). `Some(result)`: answer
    /// with it (the question, or the refusal after a decline).
    ///
    /// A confirmation authorizes one execution: the sealed state that carries it (the question's,
    /// answered with accept, or a later round's) is spent in the store's single-use records
    /// before the handler runs, so replaying it (on this instance or another) is refused.
    async fn confirmation(
        &self,
        ctx: &mut RequestContext,
        tool: &crate::registry::ToolDef,
        params: &Map<String, Value>,
        arguments: &Map<String, Value>,
        audit: &AuditTrail<'_>,
    ) -> Result<Option<Value>, ProtocolError> {
        const KEY: &str = "palisade.confirm";
        let envelope = ctx.request_state.take();
        let confirmed = envelope.as_ref().and_then(|s| s.get("confirmed")).and_then(Value::as_bool);
        let shown = envelope.as_ref().and_then(|s| s.get("s")).and_then(Value::as_str).map(str::to_owned);
        ctx.request_state = envelope.and_then(|mut s| s.get_mut("app").map(Value::take)).filter(|v| !v.is_null());
        match confirmed {
            Some(true) => {}
            // We asked (the sealed state says so, for exactly these params): read the answer.
            Some(false) => match ctx.input_responses.remove(KEY) {
                Some(answer) if answer["action"] == "accept" && answer["content"]["confirm"] == true => {
                    // What the user accepted must still be what would run.
                    if shown != Some(summary_digest(&self.confirmation_text(ctx, tool, arguments)?)) {
                        audit.deny("confirmation", None).await;
                        let changed = "what this call would do changed since it was confirmed: call it again";
                        return Ok(Some(crate::CallToolResult::error(changed).into_value()));
                    }
                }
                Some(_) => {
                    audit.deny("confirmation", None).await;
                    return Ok(Some(crate::CallToolResult::error("the user did not confirm this call").into_value()));
                }
                None => return self.ask_confirmation(ctx, tool, params, arguments).map(Some),
            },
            None => return self.ask_confirmation(ctx, tool, params, arguments).map(Some),
        }
        self.spend_confirmation(params).await?;
        Ok(None)
    }

    /// Marks the sealed state a confirmed round presents as used (until it would expire anyway).
    /// Used before: refused. No single-use store, or the store in doubt: refused (fail closed).
    async fn spend_confirmation(&self, params: &Map<String, Value>) -> Result<(), ProtocolError> {
        let sealed = params.get("requestState").and_then(Value::as_str).ok_or(ProtocolError::Internal)?;
        let Some(once) = &self.once else {
            tracing::error!("a tool needs confirmation but the server has no single-use store: refused");
            return Err(ProtocolError::Unavailable);
        };
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, sealed.as_bytes());
        let digest: [u8; 32] = digest.as_ref().try_into().map_err(|_| ProtocolError::Internal)?;
        let ttl_ms = u64::try_from(self.config.request_state_ttl.as_millis()).unwrap_or(u64::MAX);
        let expires_ms = i64::try_from(self.clock.now_ms().saturating_add(ttl_ms)).unwrap_or(i64::MAX);
        match once.consume_once(digest, expires_ms).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::info!(stage = "dispatch", decision = "deny", "a confirmation was presented again: refused");
                Err(ProtocolError::invalid_params("this confirmation was already used"))
            }
            Err(error) => {
                tracing::error!(%error, "single-use store unavailable: refusing the confirmed call");
                Err(ProtocolError::Unavailable)
            }
        }
    }

    /// What the user is asked to confirm for this call: the tool's own summary when it has one,
    /// else its arguments (handles removed), cut to 500 bytes.
    fn confirmation_text(
        &self,
        ctx: &RequestContext,
        tool: &crate::registry::ToolDef,
        arguments: &Map<String, Value>,
    ) -> Result<String, ProtocolError> {
        if let Some(summary) = &tool.confirmation_summary {
            return Ok(format!("Allow the tool {}? {}", tool.name, summary(ctx, arguments)?));
        }
        let mut shown = Value::Object(arguments.clone()).to_string();
        if shown.len() > 500 {
            let cut = (0..=500).rev().find(|i| shown.is_char_boundary(*i)).unwrap_or(0);
            shown.truncate(cut);
            shown.push('…');
        }
        Ok(format!("Allow the tool {} to run with these arguments? {shown}", tool.name))
    }

    fn ask_confirmation(
        &self,
        ctx: &RequestContext,
        tool: &crate::registry::ToolDef,
        params: &Map<String, Value>,
        arguments: &Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        let text = self.confirmation_text(ctx, tool, arguments)?;
        let schema =
            json!({ "type": "object", "properties": { "confirm": { "type": "boolean" } }, "required": ["confirm"] });
        // The nonce makes each question's sealed state distinct (it is spent by digest); the
        // summary's digest binds the answer to what was shown.
        let state = json!({ "confirmed": false, "n": fresh_trace_id(), "s": summary_digest(&text) });
        let question = InputRequired::new().elicit("palisade.confirm", text, schema).with_state(state);
        self.finish_round(ctx, Method::ToolsCall, params, Outcome::InputRequired(question))
    }

    /// Reads `requestState` and `inputResponses` of an MRTR retry into the context.
    fn prepare_round(
        &self,
        ctx: &mut RequestContext,
        method: Method,
        params: &Map<String, Value>,
    ) -> Result<(), ProtocolError> {
        ctx.input_responses = match params.get("inputResponses") {
            None => Map::new(),
            Some(Value::Object(responses)) if responses.values().all(Value::is_object) => responses.clone(),
            Some(_) => return Err(ProtocolError::invalid_params("inputResponses must be an object of result objects")),
        };
        ctx.request_state = match params.get("requestState") {
            None | Some(Value::Null) => None,
            Some(Value::String(sealed)) => {
                let partition = ctx.principal.partition_key();
                let binding = Binding { principal: &partition, method: method.as_str(), params };
                match self.sealer.open(sealed, &binding, self.clock.now_ms()) {
                    Ok(state) => Some(state),
                    Err(why) => {
                        tracing::info!(stage = "dispatch", decision = "deny", reason = %why, "request state refused");
                        return Err(ProtocolError::invalid_params("invalid requestState"));
                    }
                }
            }
            Some(_) => return Err(ProtocolError::invalid_params("requestState must be a string")),
        };
        Ok(())
    }

    /// Turns a handler outcome into a result, sealing state for an `input_required` answer.
    fn finish_round(
        &self,
        ctx: &RequestContext,
        method: Method,
        params: &Map<String, Value>,
        outcome: Outcome<Value>,
    ) -> Result<Value, ProtocolError> {
        match outcome {
            Outcome::Complete(result) => Ok(result),
            Outcome::InputRequired(InputRequired { requests, state }) => {
                let mut missing = Map::new();
                for request in requests.values() {
                    let capability = match request.get("method").and_then(Value::as_str) {
                        Some("elicitation/create") => "elicitation",
                        Some("sampling/createMessage") => "sampling",
                        Some("roots/list") => "roots",
                        _ => return Err(ProtocolError::Internal),
                    };
                    if !ctx.meta.has_capability(capability) {
                        missing.insert(capability.into(), json!({}));
                    }
                }
                if !missing.is_empty() {
                    return Err(ProtocolError::MissingCapability { required: Value::Object(missing) });
                }
                if requests.is_empty() && state.is_none() {
                    return Err(ProtocolError::Internal);
                }
                let mut result = Map::new();
                result.insert("resultType".into(), json!("input_required"));
                if !requests.is_empty() {
                    result.insert("inputRequests".into(), Value::Object(requests));
                }
                if let Some(state) = state {
                    let partition = ctx.principal.partition_key();
                    let binding = Binding { principal: &partition, method: method.as_str(), params };
                    result
                        .insert("requestState".into(), json!(self.sealer.seal(&state, &binding, self.clock.now_ms())));
                }
                Ok(Value::Object(result))
            }
        }
    }

    fn discover(&self) -> Value {
        let mut result = json!({
            "supportedVersions": self.supported_versions(),
            "capabilities": self.app.capabilities(),
            "ttlMs": self.app.list_ttl_ms,
            "cacheScope": self.cache_scope(),
        });
        if let Some(instructions) = &self.app.instructions {
            result["instructions"] = json!(instructions);
        }
        if self.tasks.is_some() {
            result["capabilities"]["extensions"] = json!({ TASKS_EXTENSION: {} });
        }
        result
    }

    /// Every version this server speaks: 2026-07-28, then the enabled 2025-era ones (an
    /// auto-negotiating client picks the newest it knows).
    pub fn supported_versions(&self) -> Vec<String> {
        let mut versions: Vec<String> = palisade_wire::SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect();
        if self.config.legacy.enabled {
            versions.extend(self.config.legacy.versions.iter().cloned());
        }
        versions
    }

    fn cache_scope(&self) -> &'static str {
        if self.authenticator.is_unauthenticated() { "public" } else { "private" }
    }

    fn page<T>(
        &self,
        kind: &str,
        params: &Map<String, Value>,
        items: &[T],
        render: impl Fn(&T) -> Value,
    ) -> Result<Value, ProtocolError> {
        let offset = match params.get("cursor") {
            None | Some(Value::Null) => 0,
            Some(Value::String(cursor)) => {
                self.cursors.read(kind, cursor).ok_or_else(|| ProtocolError::invalid_params("invalid cursor"))?
            }
            Some(_) => return Err(ProtocolError::invalid_params("invalid cursor")),
        };
        if offset > items.len() {
            return Err(ProtocolError::invalid_params("invalid cursor"));
        }
        let end = offset.saturating_add(self.config.page_size.max(1)).min(items.len());
        let mut result = json!({
            kind: items[offset..end].iter().map(render).collect::<Vec<_>>(),
            "ttlMs": self.app.list_ttl_ms,
            "cacheScope": self.cache_scope(),
        });
        if end < items.len() {
            result["nextCursor"] = json!(self.cursors.mint(kind, end));
        }
        Ok(result)
    }

    fn complete(&self, params: &Map<String, Value>) -> Result<Value, ProtocolError> {
        let handler = self.app.completion.as_ref().ok_or(ProtocolError::Internal)?;
        let reference = params
            .get("ref")
            .and_then(Value::as_object)
            .ok_or_else(|| ProtocolError::invalid_params("ref is required"))?;
        let reference = match reference.get("type").and_then(Value::as_str) {
            Some("ref/prompt") => {
                let name = string_param(reference, "name")?;
                self.app.prompt(name).ok_or_else(|| ProtocolError::invalid_params("unknown prompt"))?;
                CompletionRef::Prompt(name.to_owned())
            }
            Some("ref/resource") => {
                let uri = string_param(reference, "uri")?;
                let known = self.app.templates.iter().any(|t| t.template == uri) || self.app.knows_resource(uri);
                if !known {
                    return Err(ProtocolError::invalid_params("unknown resource"));
                }
                CompletionRef::Resource(uri.to_owned())
            }
            _ => return Err(ProtocolError::invalid_params("ref.type must be ref/prompt or ref/resource")),
        };
        let argument = params
            .get("argument")
            .and_then(Value::as_object)
            .ok_or_else(|| ProtocolError::invalid_params("argument is required"))?;
        let name = string_param(argument, "name")?;
        let value = string_param(argument, "value")?;
        let context = string_map(params.get("context").and_then(|c| c.get("arguments")))?;
        let mut completion = handler(&reference, name, value, &context);
        if completion.values.len() > 100 {
            completion.values.truncate(100);
            completion.has_more = true;
        }
        let mut body = json!({ "values": completion.values, "hasMore": completion.has_more });
        if let Some(total) = completion.total {
            body["total"] = json!(total);
        }
        Ok(json!({ "completion": body }))
    }

    /// `subscriptions/listen`: acknowledge the honoured filter, then deliver matching events
    /// until the client leaves, the server shuts down or the client falls behind.
    async fn listen(&self, ctx: RequestContext, params: &Map<String, Value>) -> Result<Value, ProtocolError> {
        let filter = match params.get("notifications") {
            Some(Value::Object(filter)) => filter,
            _ => return Err(ProtocolError::invalid_params("notifications filter is required")),
        };
        let flag = |key: &str| -> Result<bool, ProtocolError> {
            match filter.get(key) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(ProtocolError::invalid_params(format!("{key} must be a boolean"))),
            }
        };
        let caps = self.app.capabilities();
        let tools = flag("toolsListChanged")? && caps.get("tools").is_some();
        let prompts = flag("promptsListChanged")? && caps.get("prompts").is_some();
        let resources = flag("resourcesListChanged")? && caps.get("resources").is_some();
        let uris: Vec<String> = match filter.get("resourceSubscriptions") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(uris)) => uris
                .iter()
                .map(|u| {
                    u.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| ProtocolError::invalid_params("resourceSubscriptions must be strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(ProtocolError::invalid_params("resourceSubscriptions must be an array")),
        };
        let requested_tasks: Option<Vec<String>> = match filter.get("taskIds") {
            None | Some(Value::Null) => None,
            Some(Value::Array(ids)) => Some(
                ids.iter()
                    .map(|id| {
                        id.as_str()
                            .filter(|id| !id.is_empty())
                            .map(str::to_owned)
                            .ok_or_else(|| ProtocolError::invalid_params("taskIds must be non-empty strings"))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(_) => return Err(ProtocolError::invalid_params("taskIds must be an array")),
        };
        if requested_tasks.is_some() && !ctx.meta.has_extension(TASKS_EXTENSION) {
            return Err(missing_tasks_capability());
        }
        // Bounded work per stream: each named task is a store lookup now and at every change.
        let most = self.config.max_listen_filter_entries;
        if requested_tasks.as_ref().is_some_and(|ids| ids.len() > most) || uris.len() > most {
            return Err(ProtocolError::invalid_params("a listen filter names more entries than allowed"));
        }
        let _permit = self.stream_permit(&ctx.principal)?;
        // Only the caller's own tasks: others are dropped from the acknowledged set, silently
        // (the same answer for unknown and foreign ids).
        let mut tasks: BTreeMap<[u8; 32], (String, i64)> = BTreeMap::new();
        if let (Some(requested), Some(service)) = (&requested_tasks, &self.tasks) {
            for id in requested {
                if service.owns(&ctx.principal, id).await? {
                    tasks.insert(crate::tasks::task_digest(id), (id.clone(), -1));
                }
            }
        }
        // Only resources that exist (stage 5 required the read scopes of every one named).
        let uris: Vec<String> = uris.into_iter().filter(|uri| self.app.knows_resource(uri)).collect();

        let subscription_id = ctx.id.to_value();
        let stream_meta = json!({ meta_keys::SUBSCRIPTION_ID: subscription_id });
        let mut honoured = Map::new();
        for (key, on) in
            [("toolsListChanged", tools), ("promptsListChanged", prompts), ("resourcesListChanged", resources)]
        {
            if on {
                honoured.insert(key.into(), json!(true));
            }
        }
        if !uris.is_empty() {
            honoured.insert("resourceSubscriptions".into(), json!(uris));
        }
        if requested_tasks.is_some() {
            let ids: Vec<&String> = tasks.values().map(|(id, _)| id).collect();
            honoured.insert("taskIds".into(), json!(ids));
        }
        // Subscribe before acknowledging, so no event between the two is lost.
        let mut events = self.events.subscribe();
        // A DISABLE the kill switch observes for one of this stream's targets ends the stream.
        let mut disables = crate::killswitch::DisableWatch::new(ctx.kill_switch.as_ref());
        let ack = notification_frame(
            "notifications/subscriptions/acknowledged",
            json!({ "notifications": honoured, "_meta": stream_meta }),
        );
        if !ctx.sink.send(ack).await {
            return Err(ProtocolError::Internal);
        }
        let complete = json!({ "resultType": "complete", "_meta": stream_meta });
        // The stream ends (gracefully) when the credential it was opened with expires (wall
        // time, the token verifier's time base).
        let expiry = ctx.principal.expires_at_ms().map(|at| {
            let left = at.saturating_sub(SystemClock.now_ms());
            tokio::time::Instant::now() + std::time::Duration::from_millis(left)
        });
        let credential_expired = async {
            match expiry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(credential_expired);
        loop {
            let event = tokio::select! {
                () = self.shutdown.cancelled() => return Ok(complete),
                () = ctx.cancel.cancelled() => return Err(ProtocolError::Internal),
                () = &mut credential_expired => {
                    tracing::info!(stage = "listen", "listen stream closed: the credential expired");
                    return Ok(complete);
                }
                () = disables.disabled() => {
                    tracing::info!(stage = "listen", "listen stream closed: a target was disabled");
                    return Ok(complete);
                }
                event = events.recv() => event,
            };
            let frame = match event {
                Ok(ServerEvent::ToolsListChanged) if tools => {
                    notification_frame("notifications/tools/list_changed", json!({ "_meta": stream_meta }))
                }
                Ok(ServerEvent::PromptsListChanged) if prompts => {
                    notification_frame("notifications/prompts/list_changed", json!({ "_meta": stream_meta }))
                }
                Ok(ServerEvent::ResourcesListChanged) if resources => {
                    notification_frame("notifications/resources/list_changed", json!({ "_meta": stream_meta }))
                }
                Ok(ServerEvent::ResourceUpdated { uri }) if uris.contains(&uri) => {
                    notification_frame("notifications/resources/updated", json!({ "uri": uri, "_meta": stream_meta }))
                }
                Ok(ServerEvent::PrincipalRevoked { issuer, subject, tenant })
                    if issuer == ctx.principal.issuer()
                        && subject == ctx.principal.subject()
                        && tenant.as_deref().is_none_or(|t| Some(t) == ctx.principal.tenant()) =>
                {
                    tracing::info!(stage = "listen", "listen stream closed: the principal was revoked");
                    return Ok(complete);
                }
                Ok(ServerEvent::ClientRevoked { client }) if Some(client.as_str()) == ctx.principal.client_id() => {
                    tracing::info!(stage = "listen", "listen stream closed: the client was revoked");
                    return Ok(complete);
                }
                Ok(ServerEvent::TaskChanged { digest }) if tasks.contains_key(&digest) => {
                    let (Some(service), Some((id, last_version))) = (&self.tasks, tasks.get_mut(&digest)) else {
                        continue;
                    };
                    // Re-authorized at delivery: the task is re-read for this listener's caller.
                    let Some((version, mut detailed)) = service.detailed_for(&ctx.principal, id).await? else {
                        continue;
                    };
                    if version <= *last_version {
                        continue; // already delivered (local and store fan-out both announce)
                    }
                    *last_version = version;
                    detailed["_meta"] = stream_meta.clone();
                    notification_frame("notifications/tasks", detailed)
                }
                Ok(_) => continue,
                // The client fell behind the bus or its own queue: end the stream gracefully.
                Err(RecvError::Lagged(_)) => return Ok(complete),
                Err(RecvError::Closed) => return Ok(complete),
            };
            if !ctx.sink.try_send(frame) {
                tracing::info!(stage = "listen", "listen stream closed: client fell behind");
                return Ok(complete);
            }
        }
    }

    /// Adds `resultType` (when the handler did not set one) and serverInfo to a result.
    fn decorate(&self, mut result: Value) -> Value {
        if let Value::Object(map) = &mut result {
            map.entry("resultType").or_insert_with(|| json!("complete"));
            let meta = map.entry("_meta").or_insert_with(|| json!({}));
            if let Value::Object(meta) = meta {
                meta.insert(
                    meta_keys::SERVER_INFO.into(),
                    json!({ "name": self.app.name, "version": self.app.version }),
                );
            }
        }
        result
    }
}

impl<T> Outcome<T> {
    fn map_complete<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Complete(value) => Outcome::Complete(f(value)),
            Outcome::InputRequired(input) => Outcome::InputRequired(input),
        }
    }
}

/// The digest of a confirmation question's text, kept in its sealed state.
fn summary_digest(text: &str) -> String {
    palisade_wire::hex(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes()).as_ref())
}

/// A version header of an earlier revision (or none at all) marks a request of the session era.
fn is_legacy_version_header(raw: Option<&[u8]>) -> bool {
    match raw.map(palisade_wire::header::decode_plain_value) {
        None => true,
        Some(Ok(version)) => version.starts_with("2024-") || version.starts_with("2025-"),
        Some(Err(_)) => false,
    }
}

/// HTTP only: `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` present where required and
/// equal to the body. Runs after the `_meta` shape check and before version support.
fn missing_tasks_capability() -> ProtocolError {
    ProtocolError::MissingCapability { required: json!({ "extensions": { TASKS_EXTENSION: {} } }) }
}

fn check_routing_headers(request: &Request, headers: &TransportHeaders) -> Result<(), ProtocolError> {
    let mismatch = |what: &str| ProtocolError::HeaderMismatch(what.to_owned());
    if let Some(name) = &headers.duplicate {
        return Err(mismatch(&format!("{name} sent more than once")));
    }
    let version = plain_header(&headers.protocol_version, "MCP-Protocol-Version")?
        .ok_or_else(|| mismatch("MCP-Protocol-Version header is required"))?;
    let body_version =
        request.params.get("_meta").and_then(|meta| meta.get(meta_keys::PROTOCOL_VERSION)).and_then(Value::as_str);
    if body_version != Some(version.as_str()) {
        return Err(mismatch("MCP-Protocol-Version does not match _meta protocolVersion"));
    }
    check_method_and_name(request, headers, true)
}

/// `Mcp-Method` and `Mcp-Name` equal to the body. `required`: they must be present (the
/// 2026-07-28 wire); otherwise (the 2025-era wire, whose clients may not send them) they are
/// compared where sent, so that what a header-routing proxy saw is what runs.
fn check_method_and_name(request: &Request, headers: &TransportHeaders, required: bool) -> Result<(), ProtocolError> {
    let mismatch = |what: &str| ProtocolError::HeaderMismatch(what.to_owned());
    match plain_header(&headers.method, "Mcp-Method")? {
        Some(method) if method != request.method => {
            return Err(mismatch("Mcp-Method does not match the request method"));
        }
        Some(_) => {}
        None if required => return Err(mismatch("Mcp-Method header is required")),
        None => {}
    }
    let name_param = match request.method.as_str() {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    };
    let header_name = headers
        .name
        .as_ref()
        .map(|raw| decode_value(raw).map_err(|_| mismatch("Mcp-Name is malformed")))
        .transpose()?;
    match (name_param, header_name) {
        (Some(_), None) if required => Err(mismatch("Mcp-Name header is required")),
        // A body without the param is an invalid-params error for the method itself.
        (Some(param), Some(header_name)) => match request.params.get(param).and_then(Value::as_str) {
            Some(body_name) if header_name != body_name => Err(mismatch("Mcp-Name does not match the request")),
            _ => Ok(()),
        },
        // A name header on a method that names nothing would route on a value nothing checks.
        (None, Some(_)) if !required => Err(mismatch("Mcp-Name is not defined for this method")),
        _ => Ok(()),
    }
}

/// A routing header without an encoded form (`MCP-Protocol-Version`, `Mcp-Method`), decoded.
fn plain_header(raw: &Option<Vec<u8>>, name: &str) -> Result<Option<String>, ProtocolError> {
    raw.as_ref()
        .map(|raw| {
            palisade_wire::header::decode_plain_value(raw)
                .map_err(|_| ProtocolError::HeaderMismatch(format!("{name} is malformed")))
        })
        .transpose()
}

fn string_param<'a>(params: &'a Map<String, Value>, key: &str) -> Result<&'a str, ProtocolError> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ProtocolError::invalid_params(format!("{key} must be a string")))
}

fn string_map(value: Option<&Value>) -> Result<BTreeMap<String, String>, ProtocolError> {
    match value {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|v| (k.clone(), v.to_owned()))
                    .ok_or_else(|| ProtocolError::invalid_params("arguments must map to strings"))
            })
            .collect(),
        Some(_) => Err(ProtocolError::invalid_params("arguments must be an object")),
    }
}

/// Whether `app` advertises `method` (a method without anything to act on is `-32601`).
pub(crate) fn advertised(app: &App, method: Method) -> bool {
    match method {
        Method::ToolsList | Method::ToolsCall => !app.tools.is_empty(),
        Method::ResourcesList
        | Method::ResourceTemplatesList
        | Method::ResourcesRead
        | Method::Subscribe
        | Method::Unsubscribe => !app.resources.is_empty() || !app.templates.is_empty(),
        Method::PromptsList | Method::PromptsGet => !app.prompts.is_empty(),
        Method::Complete => app.completion.is_some(),
        Method::Discover
        | Method::Listen
        | Method::Initialize
        | Method::Ping
        | Method::SetLogLevel
        | Method::SessionStream
        | Method::SessionNotification
        | Method::SessionAnswer
        | Method::SessionDelete => true,
        // The tasks extension's methods exist when some tool can run as a task (the server must
        // also have a task service to answer them).
        Method::TasksGet | Method::TasksUpdate | Method::TasksCancel => {
            app.tools.iter().any(|tool| tool.task_support != TaskSupport::Forbidden)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(issuer: &str, subject: &str, tenant: Option<&str>, client: Option<&str>) -> VerifiedPrincipal {
        let stored = serde_json::json!({
            "issuer": issuer, "subject": subject, "tenant": tenant, "client": client, "scopes": [],
        });
        VerifiedPrincipal::from_stored(&stored).unwrap()
    }

    #[test]
    fn remembered_principal_digests_answer_only_for_their_own_identity() {
        let key = || aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, b"test audit-digest key");
        let digester = PrincipalDigester::new(key());
        // Identities that a naive concatenation would confuse, and absent vs empty parts.
        let principals = [
            principal("https://a", "x#y", Some("t"), Some("c")),
            principal("https://a#x", "y", Some("t"), Some("c")),
            principal("https://a", "x#y", Some("tc"), None),
            principal("https://a", "x#y", None, Some("tc")),
            principal("https://a", "x#y", Some(""), Some("c")),
            principal("https://a", "x#y", None, Some("c")),
        ];
        let keys: std::collections::HashSet<String> = principals.iter().map(identity_key).collect();
        assert_eq!(keys.len(), principals.len(), "identity keys must be distinct");
        // Twice over: the second round answers from memory, and must equal a fresh computation.
        for _ in 0..2 {
            for principal in &principals {
                assert_eq!(digester.digests(Some(principal)), PrincipalDigests::of(&key(), principal));
            }
        }
        assert_eq!(digester.digests(None), PrincipalDigests::default());
        // Past capacity the memory starts afresh and answers stay right.
        for n in 0..RECENT_PRINCIPALS + 10 {
            let many = principal("https://a", &format!("user{n}"), Some("t"), None);
            assert_eq!(digester.digests(Some(&many)), PrincipalDigests::of(&key(), &many));
        }
        assert!(digester.recent().len() <= RECENT_PRINCIPALS);
        assert_eq!(digester.digests(Some(&principals[0])), PrincipalDigests::of(&key(), &principals[0]));
    }

    #[test]
    fn trace_ids_are_distinct_across_block_refills() {
        // Three blocks' worth, from two threads: every id 32 lowercase hex digits, none repeated,
        // none all zeros (a wiped, re-served slot would be).
        let ids: Vec<String> = (0..3 * TRACE_ID_BLOCK / 16).map(|_| fresh_trace_id()).collect();
        let other = std::thread::spawn(|| (0..300).map(|_| fresh_trace_id()).collect::<Vec<_>>()).join().unwrap();
        let mut seen = std::collections::HashSet::new();
        for id in ids.iter().chain(&other) {
            assert_eq!(id.len(), 32, "{id}");
            assert!(id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{id}");
            assert_ne!(id, &"0".repeat(32));
            assert!(seen.insert(id.clone()), "trace id {id} handed out twice");
        }
    }
}
