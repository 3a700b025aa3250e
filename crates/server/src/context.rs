//! What a handler sees of its request ([`RequestContext`]) and what it may answer besides a
//! result ([`Outcome::InputRequired`], the MRTR round trip).

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_killswitch::CommitFence;
use palisade_wire::jsonrpc::notification_frame;
use palisade_wire::{LogLevel, ProtocolError, RequestId, RequestMeta};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::auth::VerifiedPrincipal;
use crate::clearance::Cleared;
use crate::events::EventBus;
use crate::handles::{HandleError, HandleService, ResolvedHandle};

/// A handler's answer: the result, or a request for more input from the client (MRTR).
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<T> {
    /// The request is complete.
    Complete(T),
    /// The client must retry the same request with `inputResponses` (and the sealed state).
    InputRequired(InputRequired),
}

/// An `input_required` answer under construction.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InputRequired {
    pub(crate) requests: Map<String, Value>,
    pub(crate) state: Option<Value>,
}

impl InputRequired {
    /// An empty answer; add requests and/or state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the user for structured input (`elicitation/create`, form mode).
    pub fn elicit(mut self, key: impl Into<String>, message: impl Into<String>, requested_schema: Value) -> Self {
        self.requests.insert(
            key.into(),
            json!({ "method": "elicitation/create", "params": {
                "mode": "form", "message": message.into(), "requestedSchema": requested_schema } }),
        );
        self
    }

    /// Asks the client's model for a completion (`sampling/createMessage`).
    pub fn sample(mut self, key: impl Into<String>, params: Value) -> Self {
        self.requests.insert(key.into(), json!({ "method": "sampling/createMessage", "params": params }));
        self
    }

    /// Asks the client for its roots (`roots/list`).
    pub fn list_roots(mut self, key: impl Into<String>) -> Self {
        self.requests.insert(key.into(), json!({ "method": "roots/list", "params": {} }));
        self
    }

    /// Adds an input request exactly as another server sent it (the gateway relays an
    /// upstream's `inputRequests`: method + params objects, keyed).
    pub fn relay(mut self, key: impl Into<String>, request: Value) -> Self {
        self.requests.insert(key.into(), request);
        self
    }

    /// Application state to get back on the retry. The pipeline seals it (HMAC, bound to the
    /// caller, the method, the params and an expiry); the client sees only an opaque string.
    pub fn with_state(mut self, state: Value) -> Self {
        self.state = Some(state);
        self
    }

    /// The input requests by key (method + params objects).
    pub fn requests(&self) -> &Map<String, Value> {
        &self.requests
    }
}

/// Where a request's notifications go: its SSE stream (HTTP) or the shared stdout (stdio).
#[derive(Clone)]
pub struct NotificationSink(pub(crate) mpsc::Sender<Value>);

impl NotificationSink {
    /// A sink and the receiver the transport drains.
    pub fn channel(capacity: usize) -> (Self, mpsc::Receiver<Value>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Self(tx), rx)
    }

    /// Sends one notification frame; a closed receiver means the client went away.
    pub(crate) async fn send(&self, frame: Value) -> bool {
        self.0.send(frame).await.is_ok()
    }

    /// Sends without waiting; `false` when the queue is full or closed (listen backpressure).
    pub(crate) fn try_send(&self, frame: Value) -> bool {
        self.0.try_send(frame).is_ok()
    }
}

impl<T> Outcome<T> {
    /// The outcome with its complete value mapped (an `input_required` passes unchanged).
    pub(crate) fn map_complete<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Complete(value) => Outcome::Complete(f(value)),
            Outcome::InputRequired(input) => Outcome::InputRequired(input),
        }
    }
}

/// A running task's status line, as its handler sets it (implemented by the task service; the
/// context knows only this much of tasks).
pub(crate) trait TaskStatus: Send + Sync {
    /// Sets the task's `statusMessage` (best effort).
    fn set_status_message<'a>(
        &'a self,
        events: &'a EventBus,
        message: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;
}

/// Everything a handler may know about its request. The raw bearer token and any raw handle are
/// deliberately absent.
#[derive(Clone)]
pub struct RequestContext {
    pub(crate) id: RequestId,
    pub(crate) meta: RequestMeta,
    pub(crate) principal: Arc<VerifiedPrincipal>,
    pub(crate) input_responses: Map<String, Value>,
    pub(crate) request_state: Option<Value>,
    pub(crate) sink: NotificationSink,
    pub(crate) cancel: CancellationToken,
    pub(crate) events: EventBus,
    pub(crate) handles: Option<Arc<HandleService>>,
    pub(crate) resolved: Arc<BTreeMap<String, ResolvedHandle>>,
    pub(crate) task: Option<Arc<dyn TaskStatus>>,
    /// This request's passed kill-switch `pre_dispatch`, when the server runs one (the second
    /// phase, `pre_side_effect`, is in [`crate::clearance`]).
    pub(crate) kill_switch: Option<Arc<Cleared>>,
    /// The principal's approval of this very call under a delegation capability, taken from the
    /// ledger by the pipeline (a needs-confirmation tool under a capability runs only with one).
    pub(crate) approval: Option<crate::delegated::VerifiedApproval>,
    /// The caller's network address, when the transport knows it (the policies'
    /// `context.source`).
    pub(crate) source: Option<std::net::IpAddr>,
}

impl RequestContext {
    /// The JSON-RPC id of this request.
    pub fn request_id(&self) -> &RequestId {
        &self.id
    }

    /// The validated `_meta` (version, client capabilities, log level, progress token).
    pub fn meta(&self) -> &RequestMeta {
        &self.meta
    }

    /// The authenticated caller (under a delegation capability: the principal it acts for,
    /// narrowed to it; [`VerifiedPrincipal::delegation`] says which agent called).
    pub fn principal(&self) -> &VerifiedPrincipal {
        &self.principal
    }

    /// The principal's own approval of this call, when it runs under a delegation capability
    /// (the only authority for a consequential delegated call; never text an agent sent).
    pub fn approval(&self) -> Option<&crate::delegated::VerifiedApproval> {
        self.approval.as_ref()
    }

    /// One answer from the client's `inputResponses`, by the key the handler asked under.
    pub fn input_response(&self, key: &str) -> Option<&Value> {
        self.input_responses.get(key)
    }

    /// All answers from the client's `inputResponses`.
    pub fn input_responses(&self) -> &Map<String, Value> {
        &self.input_responses
    }

    /// The application state from an earlier `input_required` answer, already verified.
    pub fn request_state(&self) -> Option<&Value> {
        self.request_state.as_ref()
    }

    /// The server's event bus, to announce list changes and resource updates.
    pub fn events(&self) -> &EventBus {
        &self.events
    }

    /// Cancelled when the client closes the stream or sends `notifications/cancelled`.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The object behind the handle argument `argument`, resolved and authorized by the pipeline
    /// for this call (see `ToolBuilder::handle_argument`).
    pub fn handle(&self, argument: &str) -> Option<&ResolvedHandle> {
        self.resolved.get(argument)
    }

    /// Mints a handle to an object for the caller (bound to its subject, tenant and client),
    /// granting `scopes`; return it to the client as an ordinary result value. See
    /// [`HandleService::mint`] for what is checked.
    pub async fn mint_handle(
        &self,
        object_type: &str,
        object_ref: &str,
        object_version: &str,
        scopes: &[&str],
    ) -> Result<String, HandleError> {
        let service = self.handles.as_ref().ok_or(HandleError::Unavailable)?;
        service.mint(&self.principal, object_type, object_ref, object_version, scopes).await
    }

    /// Revokes the handle passed in `argument` of this call (e.g. a basket consumed by checkout).
    /// `Ok(false)` when it was already revoked.
    pub async fn revoke_handle(&self, argument: &str, reason: &str) -> Result<bool, HandleError> {
        let service = self.handles.as_ref().ok_or(HandleError::Unavailable)?;
        let resolved = self.resolved.get(argument).ok_or(HandleError::Denied)?;
        service.revoke_resolved(&self.principal, resolved, reason).await
    }

    /// The handle service (to revoke on object deletion, for instance), when the server has one.
    pub fn handle_service(&self) -> Option<&HandleService> {
        self.handles.as_deref()
    }

    /// Whether this handler runs as a task.
    pub fn is_task(&self) -> bool {
        self.task.is_some()
    }

    /// In a task: sets its `statusMessage` (progress a client sees in `tasks/get` and on listen
    /// streams). Outside a task: nothing.
    pub async fn set_task_status(&self, message: &str) {
        if let Some(task) = &self.task {
            task.set_status_message(&self.events, message).await;
        }
    }

    /// Reports progress if the client asked for it (it sent a `progressToken`).
    pub async fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        let Some(token) = &self.meta.progress_token else { return };
        let mut params = json!({ "progressToken": token.to_value(), "progress": progress });
        if let Some(total) = total {
            params["total"] = json!(total);
        }
        if let Some(message) = message {
            params["message"] = json!(message);
        }
        self.sink.send(notification_frame("notifications/progress", params)).await;
    }

    /// Logs to the client if it opted in with `logLevel` at or below `level`.
    pub async fn log(&self, level: LogLevel, logger: Option<&str>, data: Value) {
        let Some(threshold) = self.meta.log_level else { return };
        if level < threshold {
            return;
        }
        let mut params = json!({ "level": level.as_str(), "data": data });
        if let Some(logger) = logger {
            params["logger"] = json!(logger);
        }
        self.sink.send(notification_frame("notifications/message", params)).await;
    }
}

impl RequestContext {
    /// Relays a notification another server sent while answering this request (the gateway):
    /// `notifications/progress` (re-keyed to this request's own progress token, only when the
    /// client asked for progress) and `notifications/message` (only at or above the client's
    /// `logLevel`). Anything else is dropped: an upstream cannot send this client other
    /// notifications through the gateway.
    pub async fn relay_notification(&self, notification: &Value) {
        let params = notification.get("params").and_then(Value::as_object);
        match notification.get("method").and_then(Value::as_str) {
            Some("notifications/progress") => {
                let Some(params) = params else { return };
                let Some(progress) = params.get("progress").and_then(Value::as_f64) else { return };
                let total = params.get("total").and_then(Value::as_f64);
                let message = params.get("message").and_then(Value::as_str);
                self.progress(progress, total, message).await;
            }
            Some("notifications/message") => {
                let Some(params) = params else { return };
                let Some(level) = params.get("level").and_then(Value::as_str).and_then(LogLevel::parse) else {
                    return;
                };
                let data = params.get("data").cloned().unwrap_or(Value::Null);
                self.log(level, params.get("logger").and_then(Value::as_str), data).await;
            }
            _ => {}
        }
    }

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
