//! Durable, partitioned Tasks: the `io.modelcontextprotocol/tasks` extension (seed 002,
//! protocol.md §13).
//!
//! A task-capable tool ([`crate::TaskSupport`]) called by a client that declares the extension on that
//! request gets a flat `CreateTaskResult`, sent only after the task row is committed. The task id
//! is 256 bits from the OS CSPRNG; the store keeps only its SHA-256, bound to the caller (keyed
//! subject digest, tenant, client), the originating request (id, method, tool, arguments digest)
//! and the scopes it was authorized under. Every `tasks/get|update|cancel` and every listen
//! event re-checks that binding; anything unknown, expired or foreign is the same `-32602`.
//!
//! **Worker.** The tool's handler runs in a spawned segment on the instance that holds the task's
//! lease: `working` → (`input_required` → `working`)* → `completed` | `failed` | `cancelled`.
//! Every write is a compare-and-swap in the store that refuses terminal rows. Cancellation is
//! cooperative: the intent is recorded, the running segment observes it (polling the store, so
//! it works across instances) and cancels the handler's token. A task left `working` by a dead
//! instance (its lease ran out) is resumed by another if the tool is declared idempotent, and
//! failed with an explanation otherwise — never silently lost or run twice undeclared.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_base::canonical::canonical_bytes;
use palisade_base::time::format_rfc3339_ms;
use palisade_store::{HandleOwner, StoreError, TaskRow, TaskStatus, TaskStore};
use palisade_wire::{ProtocolError, RequestId, RequestMeta};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditStage, AuditTrail, Recorder};
use crate::auth::VerifiedPrincipal;
use crate::clock::Clock;
use crate::context::{NotificationSink, Outcome, RequestContext};
use crate::events::EventBus;
use crate::handles::{SubjectKey, sha256};
use crate::killswitch::KillSwitchStage;
use crate::method::OperationKey;
use crate::registry::{App, RestartPolicy};
use crate::secret::fill_random;

/// The extension's identifier.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// `-32021` naming the tasks extension: a tasks request (or a task-only tool) without it.
pub(crate) fn missing_tasks_capability() -> ProtocolError {
    ProtocolError::MissingCapability { required: json!({ "extensions": { TASKS_EXTENSION: {} } }) }
}

/// Task lifetimes and worker timing.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// Retention after creation (`ttlMs`); `None` keeps tasks until deleted.
    pub ttl: Option<Duration>,
    /// Suggested `pollIntervalMs`.
    pub poll_interval: Duration,
    /// How long a worker's claim lasts without renewal; after it, another instance may take over.
    pub lease: Duration,
    /// How often a running segment checks the store for a cancellation request.
    pub cancel_poll: Duration,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            ttl: Some(Duration::from_secs(3600)),
            poll_interval: Duration::from_millis(500),
            lease: Duration::from_secs(30),
            cancel_poll: Duration::from_millis(200),
        }
    }
}

/// What a worker needs to run the tool again, stored with the task (never a token, never a
/// raw handle: tools with handle arguments cannot be task-capable).
#[derive(serde::Serialize, serde::Deserialize)]
struct Execution {
    principal: Value,
    arguments: Map<String, Value>,
    meta: Value,
    request_id: Value,
    #[serde(default)]
    state: Option<Value>,
}

/// The `tools/call` a task is created for.
pub(crate) struct TaskCall {
    /// The registered tool.
    pub tool: String,
    /// Its validated arguments.
    pub arguments: Map<String, Value>,
    /// The request's `_meta` (client capabilities for the worker's context).
    pub meta: Value,
    /// The scopes the call was authorized under.
    pub scopes: Vec<String>,
}

/// The tasks service of one server instance.
pub struct TaskService {
    store: Arc<dyn TaskStore>,
    subject_key: SubjectKey,
    config: TaskConfig,
    clock: Arc<dyn Clock>,
    instance: String,
    running: Mutex<HashMap<[u8; 32], CancellationToken>>,
    /// What the server that runs this service's workers gave it at build time: its kill switch
    /// (checked again at execution time) and where its decisions are recorded.
    server: std::sync::OnceLock<Attached>,
}

/// A task service's part of its server, set once by `ServerBuilder::build`.
struct Attached {
    kill_switch: Option<KillSwitchStage>,
    recorder: Arc<Recorder>,
    /// Re-checks the capability a task was created under each time it runs.
    delegation: Option<Arc<crate::delegation::DelegationService>>,
}

/// A task reference a request named, already checked against its caller.
struct Owned {
    id: String,
    row: TaskRow,
}

impl TaskService {
    /// A service over `store`. `subject_key` keys the owner digest (share it across instances).
    pub fn new(store: Arc<dyn TaskStore>, subject_key: SubjectKey, config: TaskConfig, clock: Arc<dyn Clock>) -> Self {
        let mut id = [0u8; 8];
        // The instance id only names leases; a weak one costs nothing but clarity.
        let _ = fill_random(&mut id);
        let instance = palisade_base::hex::hex(&id);
        Self {
            store,
            subject_key,
            config,
            clock,
            instance,
            running: Mutex::new(HashMap::new()),
            server: std::sync::OnceLock::new(),
        }
    }

    /// The clock the service keeps time by (its server's).
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Gives the workers their server's kill switch (every execution segment passes phase one
    /// again, for the task's tool and stored principal, before its handler runs) and audit
    /// recorder. Once only: `Err` when the service already belongs to a server.
    pub(crate) fn attach(
        &self,
        kill_switch: Option<KillSwitchStage>,
        recorder: Arc<Recorder>,
        delegation: Option<Arc<crate::delegation::DelegationService>>,
    ) -> Result<(), ()> {
        self.server.set(Attached { kill_switch, recorder, delegation }).map_err(|_| ())
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn lease_until(&self) -> i64 {
        self.now_ms().saturating_add(i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX))
    }

    /// The partition a principal's tasks live in. Callers without a tenant or client (loopback,
    /// stdio) share the `(none)` value for it. A principal acting through a delegation
    /// capability has the capability's own partition: an agent sees only the tasks created under
    /// the capability it presents, never the principal's others.
    pub(crate) fn owner(&self, principal: &VerifiedPrincipal) -> HandleOwner {
        let part = |value: Option<&str>| value.filter(|v| !v.is_empty()).unwrap_or("(none)").to_owned();
        let mut client = part(principal.client_id());
        if let Some(delegated) = principal.delegation() {
            client = format!("{client}#delegation:{}", delegated.id());
        }
        HandleOwner {
            subject_key: self.subject_key.subject_digest(principal.issuer(), principal.subject()),
            tenant: part(principal.tenant()),
            client,
        }
    }

    /// Creates the task for a `tools/call` and commits it; only then starts the worker and
    /// returns the flat `CreateTaskResult`.
    pub(crate) async fn create(
        self: &Arc<Self>,
        app: &Arc<App>,
        events: &EventBus,
        ctx: &RequestContext,
        call: TaskCall,
    ) -> Result<Value, ProtocolError> {
        let TaskCall { tool, arguments, meta: raw_meta, scopes } = call;
        let mut raw = [0u8; 32];
        fill_random(&mut raw).map_err(|_| ProtocolError::Unavailable)?;
        let id = URL_SAFE_NO_PAD.encode(raw);
        let now = self.now_ms();
        let execution = Execution {
            principal: ctx.principal.to_stored(),
            arguments: arguments.clone(),
            meta: raw_meta,
            request_id: ctx.id.to_value(),
            state: None,
        };
        let responses = Value::Object(ctx.input_responses.clone());
        let answered: Vec<&String> = ctx.input_responses.keys().collect();
        let row = TaskRow {
            digest: task_digest(&id),
            owner: self.owner(&ctx.principal),
            request_id: ctx.id.to_value().to_string(),
            method: "tools/call".into(),
            tool,
            arguments_digest: sha256(&canonical_bytes(&Value::Object(arguments))),
            scopes: scopes.join(" "),
            execution: serde_json::to_string(&execution).map_err(|_| ProtocolError::Internal)?,
            status: TaskStatus::Working,
            status_message: None,
            input_requests: None,
            input_responses: responses.to_string(),
            answered_keys: json!(answered).to_string(),
            result: None,
            error: None,
            cancel_requested: false,
            created_ms: now,
            updated_ms: now,
            ttl_ms: self.config.ttl.map(|ttl| i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)),
            poll_interval_ms: Some(i64::try_from(self.config.poll_interval.as_millis()).unwrap_or(500).max(1)),
            lease_owner: Some(self.instance.clone()),
            lease_until_ms: Some(self.lease_until()),
            attempts: 1,
            version: 1,
        };
        let created = task_json(&id, &row, false);
        self.store.insert_task(row).await.map_err(store_error)?;
        self.spawn_segment(app.clone(), events.clone(), task_digest(&id));
        let mut result = created;
        result["resultType"] = json!("task");
        Ok(result)
    }

    /// Loads the task a `tasks/*` request names, for its caller only.
    async fn owned(&self, principal: &VerifiedPrincipal, params: &Map<String, Value>) -> Result<Owned, ProtocolError> {
        let invalid = || ProtocolError::invalid_params("unknown or expired taskId");
        let id = params.get("taskId").and_then(Value::as_str).ok_or_else(invalid)?;
        if id.is_empty() || id.len() > 128 {
            return Err(invalid());
        }
        let row = self
            .store
            .load_owned_task(task_digest(id), &self.owner(principal), self.now_ms())
            .await
            .map_err(store_error)?
            .ok_or_else(invalid)?;
        Ok(Owned { id: id.to_owned(), row })
    }

    /// `tasks/get`: the DetailedTask.
    pub(crate) async fn get(
        &self,
        principal: &VerifiedPrincipal,
        params: &Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        let owned = self.owned(principal, params).await?;
        Ok(task_json(&owned.id, &owned.row, true))
    }

    /// `tasks/update`: accepts the answered subset of the outstanding input requests (unknown and
    /// already-answered keys ignored); when nothing is outstanding any more, the task resumes.
    pub(crate) async fn update(
        self: &Arc<Self>,
        app: &Arc<App>,
        events: &EventBus,
        principal: &VerifiedPrincipal,
        params: &Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        let responses = match params.get("inputResponses") {
            Some(Value::Object(responses)) => responses.clone(),
            _ => return Err(ProtocolError::invalid_params("inputResponses must be an object")),
        };
        let Owned { mut row, .. } = self.owned(principal, params).await?;
        loop {
            if row.is_terminal() || row.status != TaskStatus::InputRequired {
                return Ok(json!({}));
            }
            let mut outstanding = parse_object(row.input_requests.as_deref());
            let mut accepted = parse_object(Some(&row.input_responses));
            let mut answered: Vec<String> = serde_json::from_str(&row.answered_keys).unwrap_or_default();
            let mut changed = false;
            for (key, response) in &responses {
                if outstanding.contains_key(key) && !answered.contains(key) {
                    outstanding.remove(key);
                    accepted.insert(key.clone(), response.clone());
                    answered.push(key.clone());
                    changed = true;
                }
            }
            if !changed {
                return Ok(json!({}));
            }
            let expected = row.version;
            let mut next = row.clone();
            next.input_responses = Value::Object(accepted).to_string();
            next.answered_keys = json!(answered).to_string();
            next.updated_ms = self.now_ms();
            let resume = outstanding.is_empty();
            if resume {
                next.status = TaskStatus::Working;
                next.input_requests = None;
                next.lease_owner = Some(self.instance.clone());
                next.lease_until_ms = Some(self.lease_until());
                next.attempts += 1;
            } else {
                next.input_requests = Some(Value::Object(outstanding).to_string());
            }
            if self.store.swap_task(next, expected).await.map_err(store_error)? {
                events.task_changed(row.digest);
                if resume {
                    self.spawn_segment(app.clone(), events.clone(), row.digest);
                }
                return Ok(json!({}));
            }
            row = self.store.load_task(row.digest).await.map_err(store_error)?.ok_or(ProtocolError::Internal)?;
        }
    }

    /// `tasks/cancel`: records the intent (a task waiting for input is cancelled at once; a
    /// running one when its worker observes it). Terminal tasks: the same empty ack.
    pub(crate) async fn cancel(
        &self,
        events: &EventBus,
        principal: &VerifiedPrincipal,
        params: &Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        let Owned { row, .. } = self.owned(principal, params).await?;
        self.request_cancel(events, row, "cancelled by the client").await.map_err(store_error)?;
        Ok(json!({}))
    }

    /// The principal lost its standing (tokens revoked, role changed, left `tenant`): every task
    /// of it that has not finished is cancelled — at once when waiting for input, by its worker
    /// (observing the recorded intent, on whichever instance runs it) when running. Returns how
    /// many tasks were stopped.
    pub async fn revoke_principal(
        &self,
        events: &EventBus,
        issuer: &str,
        subject: &str,
        tenant: Option<&str>,
    ) -> Result<usize, StoreError> {
        let subject_key = self.subject_key.subject_digest(issuer, subject);
        let mut stopped = 0;
        for row in self.store.active_tasks_of(subject_key, tenant, 10_000).await? {
            if self.request_cancel(events, row, "cancelled: the caller's access was revoked").await? {
                stopped += 1;
            }
        }
        Ok(stopped)
    }

    /// Records a cancellation request (a task waiting for input is cancelled at once; a running
    /// one when its worker observes the intent) and cancels a local worker. Retries lost races;
    /// `false` when the task was already finished or cancelling.
    async fn request_cancel(&self, events: &EventBus, mut row: TaskRow, message: &str) -> Result<bool, StoreError> {
        loop {
            if row.is_terminal() || row.cancel_requested {
                return Ok(false);
            }
            let expected = row.version;
            let mut next = row.clone();
            next.cancel_requested = true;
            next.updated_ms = self.now_ms();
            next.status_message = Some(message.to_owned());
            if row.status == TaskStatus::InputRequired {
                next.status = TaskStatus::Cancelled;
                next.input_requests = None;
            }
            if self.store.swap_task(next, expected).await? {
                events.task_changed(row.digest);
                if let Some(token) = self.lock_running().get(&row.digest) {
                    token.cancel();
                }
                return Ok(true);
            }
            match self.store.load_task(row.digest).await? {
                Some(current) => row = current,
                None => return Ok(false),
            }
        }
    }

    /// Whether `id` names a task `principal` owns (listen's `taskIds` filter).
    pub(crate) async fn owns(&self, principal: &VerifiedPrincipal, id: &str) -> Result<bool, ProtocolError> {
        if id.is_empty() || id.len() > 128 {
            return Ok(false);
        }
        let found = self
            .store
            .load_owned_task(task_digest(id), &self.owner(principal), self.now_ms())
            .await
            .map_err(store_error)?;
        Ok(found.is_some())
    }

    /// The current DetailedTask for a listen event, re-authorized against the listener.
    pub(crate) async fn detailed_for(
        &self,
        principal: &VerifiedPrincipal,
        id: &str,
    ) -> Result<Option<(i64, Value)>, ProtocolError> {
        let found = self
            .store
            .load_owned_task(task_digest(id), &self.owner(principal), self.now_ms())
            .await
            .map_err(store_error)?;
        Ok(found.map(|row| (row.version, task_json(id, &row, true))))
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], CancellationToken>> {
        self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts one execution segment of a task this instance holds.
    fn spawn_segment(self: &Arc<Self>, app: Arc<App>, events: EventBus, digest: [u8; 32]) {
        let service = self.clone();
        tokio::spawn(async move {
            if let Err(error) = service.run_segment(&app, &events, digest).await {
                tracing::error!(%error, "task worker could not record its outcome");
            }
        });
    }

    /// Runs the tool once for the task and records what came of it.
    async fn run_segment(
        self: &Arc<Self>,
        app: &Arc<App>,
        events: &EventBus,
        digest: [u8; 32],
    ) -> Result<(), StoreError> {
        let Some(row) = self.store.load_task(digest).await? else { return Ok(()) };
        if row.is_terminal() || row.status != TaskStatus::Working {
            return Ok(());
        }
        let cancel = CancellationToken::new();
        self.lock_running().insert(digest, cancel.clone());
        let outcome = self.execute(app, events, &row, cancel.clone()).await;
        self.lock_running().remove(&digest);
        let mut row = row;
        loop {
            let expected = row.version;
            let mut next = row.clone();
            next.updated_ms = self.now_ms();
            next.lease_owner = None;
            next.lease_until_ms = None;
            if cancel.is_cancelled() || row.cancel_requested {
                next.status = TaskStatus::Cancelled;
                next.status_message = Some("cancelled by the client".into());
            } else {
                match &outcome {
                    Segment::Completed(result) => {
                        next.status = TaskStatus::Completed;
                        next.result = Some(result.to_string());
                    }
                    Segment::Failed(error) => {
                        next.status = TaskStatus::Failed;
                        next.error = Some(error.to_string());
                    }
                    Segment::NeedsInput { requests, state } => {
                        let answered: Vec<String> = serde_json::from_str(&row.answered_keys).unwrap_or_default();
                        if requests.keys().any(|key| answered.contains(key)) || requests.is_empty() {
                            next.status = TaskStatus::Failed;
                            next.error = Some(
                                ProtocolError::invalid_params("the tool asked again for an input key already answered")
                                    .to_wire()
                                    .to_string(),
                            );
                        } else {
                            next.status = TaskStatus::InputRequired;
                            next.input_requests = Some(Value::Object(requests.clone()).to_string());
                            let mut execution: Execution =
                                serde_json::from_str(&row.execution).map_err(|_| StoreError::Closed)?;
                            execution.state = state.clone();
                            next.execution = serde_json::to_string(&execution).map_err(|_| StoreError::Closed)?;
                        }
                    }
                }
            }
            if self.store.swap_task(next, expected).await? {
                events.task_changed(digest);
                return Ok(());
            }
            match self.store.load_task(digest).await? {
                Some(current) if !current.is_terminal() => row = current,
                _ => return Ok(()),
            }
        }
    }

    /// Runs the handler with the task's stored principal, arguments and answers; watches for
    /// cancellation in the store meanwhile and renews the lease.
    async fn execute(
        self: &Arc<Self>,
        app: &Arc<App>,
        events: &EventBus,
        row: &TaskRow,
        cancel: CancellationToken,
    ) -> Segment {
        let failed = |error: ProtocolError| Segment::Failed(error.to_wire());
        let Ok(execution) = serde_json::from_str::<Execution>(&row.execution) else {
            return failed(ProtocolError::Internal);
        };
        let Some(principal) = VerifiedPrincipal::from_stored(&execution.principal) else {
            return failed(ProtocolError::Internal);
        };
        let mut params = Map::new();
        params.insert("_meta".into(), execution.meta.clone());
        let Ok(meta) = RequestMeta::from_params(&params) else { return failed(ProtocolError::Internal) };
        let Some(tool) = app.tool(&row.tool) else { return failed(ProtocolError::Internal) };
        // A segment without its server (never built into one) runs nothing.
        let Some(attached) = self.server.get() else { return failed(ProtocolError::Unavailable) };
        // Execution-time kill switch: a task runs long after its request was cleared. The
        // segment passes the same cleared-handler sequence as a request (crate::execute): phase
        // one, the allow made durable, the handler, the fence check.
        let operation = OperationKey::tool_call(&row.tool).with_origin(tool.origin.clone());
        // A task created under a delegation capability runs only while that capability (and
        // every ancestor) is still live: read from the ledger again, never from the row alone.
        let principal = match crate::delegation::stored_delegation(&execution.principal) {
            None => principal,
            Some((digest, holder)) => {
                let Some(service) = &attached.delegation else { return failed(ProtocolError::Unavailable) };
                match service.recheck(principal, digest, &holder).await {
                    Ok(principal) => principal,
                    Err(error) => return failed(error),
                }
            }
        };
        let principal = Arc::new(principal);
        let mut trail = AuditTrail::new(&attached.recorder, &row.tool);
        trail.principal(&principal);
        trail.operation(&operation);
        if let (Some(delegated), Some(service)) = (principal.delegation(), &attached.delegation) {
            trail.delegation(delegated, &service.agent_digest(&delegated.holder().subject));
        }
        let task = format!("task={}", palisade_store::hex_prefix(&row.digest));
        trail.detail = Some(match operation.origin() {
            Some(origin) => format!("{} {task}", origin.audit_detail),
            None => task,
        });
        let cleared =
            match crate::killswitch::clear(attached.kill_switch.as_ref(), &operation, &principal, &mut trail).await {
                Ok(cleared) => cleared,
                Err(error) => {
                    trail.deny(AuditStage::KillSwitch, Some(error.code())).await;
                    return failed(error);
                }
            };
        // With a kill switch the segment made a decision of its own, durable before the handler;
        // without one, the allow its request recorded is the one it runs under.
        let allowed = if attached.kill_switch.is_some() {
            match trail.allow(AuditStage::KillSwitch).await {
                Ok(allowed) => allowed,
                Err(error) => return failed(error),
            }
        } else {
            trail.allowed_by_request()
        };
        let (sink, _dropped) = NotificationSink::channel(1);
        let ctx = RequestContext {
            id: RequestId::from_value(&execution.request_id).unwrap_or(RequestId::Number(0)),
            meta,
            principal: principal.clone(),
            input_responses: parse_object(Some(&row.input_responses)),
            request_state: execution.state.clone(),
            sink,
            cancel: cancel.clone(),
            events: events.clone(),
            handles: None,
            resolved: Arc::new(BTreeMap::new()),
            task: Some(Arc::new(TaskProgress { service: self.clone(), digest: row.digest })),
            kill_switch: cleared.clone(),
            approval: None,
            source: None,
        };
        let handler = tool.handler.clone();
        let work =
            tokio::spawn(async move { crate::execute::run_tool(&handler, ctx, execution.arguments, allowed).await });
        let watcher = self.clone().watch(row.digest, cancel.clone());
        let outcome = work.await;
        watcher.abort();
        match outcome {
            Ok(Ok(Outcome::Complete(result))) => Segment::Completed(result.into_value()),
            Ok(Ok(Outcome::InputRequired(input))) => {
                Segment::NeedsInput { requests: input.requests, state: input.state }
            }
            // As for a request: a fenced tool's success without its fence is the kill switch's
            // refusal, on the record at its stage.
            Ok(Err(error)) if crate::killswitch::fence_was_skipped(cleared.as_ref()) => {
                trail.deny(AuditStage::KillSwitch, Some(error.code())).await;
                failed(error)
            }
            Ok(Err(error)) => failed(error),
            // A panicking tool is a protocol-level failure of the task, not a crash of the server.
            Err(_) => failed(ProtocolError::Internal),
        }
    }

    /// While a segment runs: cancel its token when the store says cancellation was asked for
    /// (from any instance), and keep renewing the lease.
    fn watch(self: Arc<Self>, digest: [u8; 32], cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut renew_at = tokio::time::Instant::now() + self.config.lease / 3;
            loop {
                tokio::time::sleep(self.config.cancel_poll).await;
                let Ok(Some(row)) = self.store.load_task(digest).await else { continue };
                if row.cancel_requested || row.is_terminal() {
                    cancel.cancel();
                    return;
                }
                if tokio::time::Instant::now() >= renew_at {
                    let mut next = row.clone();
                    next.lease_owner = Some(self.instance.clone());
                    next.lease_until_ms = Some(self.lease_until());
                    let _ = self.store.swap_task(next, row.version).await;
                    renew_at = tokio::time::Instant::now() + self.config.lease / 3;
                }
            }
        })
    }

    /// Takes over tasks whose instance died (lease expired): resumes idempotent tools, fails the
    /// others with a reason. Returns how many were handled.
    pub async fn recover(self: &Arc<Self>, app: &Arc<App>, events: &EventBus, limit: u32) -> Result<usize, StoreError> {
        let orphans = self.store.orphaned_tasks(self.now_ms(), limit).await?;
        let mut handled = 0;
        for row in orphans {
            let restart = app.tool(&row.tool).map(|tool| tool.restart).unwrap_or_default();
            let expected = row.version;
            let mut next = row.clone();
            next.updated_ms = self.now_ms();
            match restart {
                RestartPolicy::Resume => {
                    next.lease_owner = Some(self.instance.clone());
                    next.lease_until_ms = Some(self.lease_until());
                    next.attempts += 1;
                }
                RestartPolicy::Fail => {
                    next.status = TaskStatus::Failed;
                    next.lease_owner = None;
                    next.lease_until_ms = None;
                    next.error = Some(
                        json!({ "code": -32603, "message": "the task was interrupted by a server restart and its tool is not declared idempotent" })
                            .to_string(),
                    );
                }
            }
            if self.store.swap_task(next, expected).await? {
                handled += 1;
                events.task_changed(row.digest);
                if restart == RestartPolicy::Resume {
                    let service = self.clone();
                    let (app, events) = (app.clone(), events.clone());
                    tokio::spawn(async move {
                        if let Err(error) = service.run_segment(&app, &events, row.digest).await {
                            tracing::error!(%error, "resumed task could not record its outcome");
                        }
                    });
                }
            }
        }
        Ok(handled)
    }

    /// Recovery every `period` and purging of expired tasks, until `shutdown`.
    pub fn spawn_maintenance(
        self: &Arc<Self>,
        app: Arc<App>,
        events: EventBus,
        period: Duration,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let service = self.clone();
        crate::periodic::spawn_periodic("task maintenance", period, shutdown, move || {
            let (service, app, events) = (service.clone(), app.clone(), events.clone());
            async move {
                if let Err(error) = service.recover(&app, &events, 100).await {
                    tracing::warn!(%error, "task recovery pass failed");
                }
                match service.store.purge_tasks(service.now_ms(), 1_000).await {
                    Ok(0) => {}
                    Ok(purged) => tracing::info!(purged, "expired tasks purged"),
                    Err(error) => tracing::warn!(%error, "task purge failed"),
                }
            }
        })
    }

    /// Forwards task changes made on other instances (when the store can push them) to this
    /// instance's listen streams.
    pub fn spawn_fan_in(&self, events: EventBus) -> Option<tokio::task::JoinHandle<()>> {
        let mut changes = self.store.task_changes()?;
        Some(tokio::spawn(async move {
            while let Some(digest) = changes.recv().await {
                events.task_changed(digest);
            }
        }))
    }

    /// The status history of a task its owner asks about (audit and tests).
    pub async fn history(&self, principal: &VerifiedPrincipal, id: &str) -> Result<Vec<(i64, String)>, ProtocolError> {
        if !self.owns(principal, id).await? {
            return Err(ProtocolError::invalid_params("unknown or expired taskId"));
        }
        self.store.task_history(task_digest(id)).await.map_err(store_error)
    }
}

/// What a handler running as a task can report: its status message, visible in `tasks/get`
/// and on listen streams.
#[derive(Clone)]
pub(crate) struct TaskProgress {
    service: Arc<TaskService>,
    digest: [u8; 32],
}

impl crate::context::TaskStatus for TaskProgress {
    fn set_status_message<'a>(
        &'a self,
        events: &'a EventBus,
        message: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(self.write_status_message(events, message))
    }
}

impl TaskProgress {
    /// Sets the task's `statusMessage` (best effort: a lost race with a terminal write is fine).
    async fn write_status_message(&self, events: &EventBus, message: &str) {
        let message: String = message.chars().take(500).collect();
        for _ in 0..3 {
            let Ok(Some(row)) = self.service.store.load_task(self.digest).await else { return };
            if row.is_terminal() {
                return;
            }
            let mut next = row.clone();
            next.status_message = Some(message.clone());
            next.updated_ms = self.service.now_ms();
            match self.service.store.swap_task(next, row.version).await {
                Ok(true) => {
                    events.task_changed(self.digest);
                    return;
                }
                Ok(false) => continue,
                Err(error) => {
                    tracing::warn!(%error, "task status message not recorded");
                    return;
                }
            }
        }
    }
}

/// What one execution segment came to.
enum Segment {
    Completed(Value),
    Failed(Value),
    NeedsInput { requests: Map<String, Value>, state: Option<Value> },
}

fn store_error(error: StoreError) -> ProtocolError {
    crate::store_errors::store_refusal("task", &error)
}

/// SHA-256 of a task id (what the store keys on).
pub fn task_digest(id: &str) -> [u8; 32] {
    sha256(id.as_bytes())
}

fn parse_object(text: Option<&str>) -> Map<String, Value> {
    text.and_then(|text| serde_json::from_str::<Value>(text).ok())
        .and_then(|value| match value {
            Value::Object(map) => Some(map),
            _ => None,
        })
        .unwrap_or_default()
}

/// The wire form of a task: the flat Task fields, and with `detailed` the status-specific
/// `inputRequests` / `result` / `error`. Never `requestState`.
fn task_json(id: &str, row: &TaskRow, detailed: bool) -> Value {
    let mut task = json!({
        "taskId": id,
        "status": row.status.as_str(),
        "createdAt": format_rfc3339_ms(row.created_ms),
        "lastUpdatedAt": format_rfc3339_ms(row.updated_ms),
        "ttlMs": row.ttl_ms,
    });
    if let Some(poll) = row.poll_interval_ms {
        task["pollIntervalMs"] = json!(poll);
    }
    if let Some(message) = &row.status_message {
        task["statusMessage"] = json!(message);
    }
    if detailed {
        match row.status {
            TaskStatus::InputRequired => {
                task["inputRequests"] = Value::Object(parse_object(row.input_requests.as_deref()))
            }
            TaskStatus::Completed => {
                // The original request's result, as a 2026-07-28 result: `resultType` included, as
                // the synchronous answer would have it (requesters validate it as a CallToolResult).
                let mut result = row.result.as_deref().and_then(|r| serde_json::from_str(r).ok()).unwrap_or(json!({}));
                if let Value::Object(map) = &mut result {
                    map.entry("resultType").or_insert_with(|| json!("complete"));
                }
                task["result"] = result;
            }
            TaskStatus::Failed => {
                task["error"] = row
                    .error
                    .as_deref()
                    .and_then(|e| serde_json::from_str(e).ok())
                    .unwrap_or(json!({ "code": -32603, "message": "internal error" }))
            }
            TaskStatus::Working | TaskStatus::Cancelled => {}
        }
    }
    task
}
