//! Server-to-client requests relayed to the caller who caused them. An upstream call runs in
//! the background for one caller ([`Running`]); what the upstream asks during it
//! (`elicitation/create`, `sampling/createMessage`, `roots/list`) is answered here:
//!
//! - `roots/list` by the gateway itself, with the roots the operator granted that upstream
//!   (`[upstreams.client_requests] roots`; none: refused), never the caller's own unless the
//!   operator relays them (`caller_roots = true`: then it is relayed like elicitation);
//! - elicitation and sampling, when the upstream's configuration allows the kind (sampling is
//!   off by default) and the caller declared the capability, become an `input_required` round
//!   for the caller ([`Driven::Asked`]): the upstream call stays open, parked here
//!   ([`ParkedCalls`]) under a random id carried in the sealed `requestState`; the caller's retry
//!   with its answer resumes it ([`resume`]). A 2025-era caller gets the same round as a real
//!   request on its session (the server's session wire turns the round into one).
//! - anything else, a refused kind, or a caller without the capability: the upstream gets
//!   -32601, as from a client that supports none of it.
//!
//! Bounds: [`MAX_ASKS_PER_CALL`] requests in one call (past it the call fails and the upstream
//! call is cancelled); [`MAX_PARKED_PER_CALLER`] parked calls per caller per upstream (past it
//! the question is refused to the upstream); a parked call lives until the upstream's request
//! deadline (`request_timeout_secs`, which bounds the whole upstream call, questions included)
//! and is then dropped: its upstream exchange is cancelled.
//!
//! **Architecture Invariant:** a parked call is resumed only by the retry of the caller it was
//! parked for (same partition: issuer, subject, tenant, client), of the same operation and
//! arguments (a digest, checked besides the state's seal), once: taking it removes it. Parked
//! calls live in this instance's memory: a retry that reaches another instance finds none and
//! is refused, never relayed to a fresh call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_server::{BearerToken, InputRequired, ProtocolError, RequestContext};
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::Upstream;
use crate::credentials::CallerContext;
use crate::upstream::asks::{ASKS_QUEUE, AskAnswer, ServerAsk};
use crate::upstream::{UpstreamError, UpstreamReply, UpstreamRequest};
use crate::user_oauth::UserCaller;

/// Most questions one upstream call may relay to its caller; past it the call fails.
pub const MAX_ASKS_PER_CALL: usize = 8;
/// Most calls of one caller parked at once on one upstream; past it a question is refused.
pub const MAX_PARKED_PER_CALLER: usize = 4;
/// The key of the upstream's question among the caller's `inputRequests`.
pub const ASK_INPUT: &str = "upstream_request";

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a parked call is bound to besides the seal: who called, and a digest of the upstream,
/// the method and the params (tool name and arguments) as the gateway built them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Binding {
    partition: String,
    digest: String,
}

impl Binding {
    pub(super) fn of(upstream: &str, ctx: &RequestContext, method: &str, params: &Map<String, Value>) -> Self {
        let mut input = Vec::new();
        for part in [upstream, method] {
            input.extend_from_slice(part.as_bytes());
            input.push(0);
        }
        input.extend_from_slice(&palisade_base::canonical::canonical_bytes(&Value::Object(params.clone())));
        let digest = URL_SAFE_NO_PAD.encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &input));
        Self { partition: ctx.principal().partition_key(), digest }
    }
}

/// One upstream call running in the background for one caller. Dropping it cancels the call.
pub(super) struct Running {
    reply: oneshot::Receiver<Result<UpstreamReply, UpstreamError>>,
    asks: mpsc::Receiver<ServerAsk>,
    notifications: mpsc::Receiver<Value>,
    asked: usize,
    started: Instant,
    deadline: Instant,
    _cancel: DropGuard,
}

impl Running {
    /// Starts `method` toward the upstream for the caller of `ctx`.
    pub(super) fn start(upstream: &Upstream, ctx: &RequestContext, method: &str, params: Map<String, Value>) -> Self {
        let partition = ctx.principal().partition_key();
        let subject_token = ctx.principal().bearer_token().map(|token| BearerToken::expose(token).to_owned());
        let user = upstream.oauth.as_ref().map(|_| UserCaller::of(ctx.principal()));
        let capabilities = Value::Object(upstream_capabilities(upstream, &ctx.meta().client_capabilities));
        let (notifications, notes) = mpsc::channel::<Value>(64);
        let (asks, asked) = mpsc::channel::<ServerAsk>(ASKS_QUEUE);
        let (done, reply) = oneshot::channel();
        let cancel = CancellationToken::new();
        let client = upstream.client.clone();
        let method_owned = method.to_owned();
        let token = cancel.clone();
        tokio::spawn(async move {
            let caller =
                CallerContext { partition: &partition, subject_token: subject_token.as_deref(), user: user.as_ref() };
            let request = UpstreamRequest {
                method: &method_owned,
                params,
                caller,
                client_capabilities: Some(capabilities),
                notifications: Some(notifications),
                asks: Some(asks),
                cancel: token,
            };
            let _ = done.send(client.request(request).await);
        });
        let started = Instant::now();
        Self {
            reply,
            asks: asked,
            notifications: notes,
            asked: 0,
            started,
            deadline: started + upstream.settings.limits.request_timeout,
            _cancel: cancel.drop_guard(),
        }
    }
}

/// Where a driven call got to.
pub(super) enum Driven {
    /// The upstream answered (or failed).
    Done(Result<UpstreamReply, UpstreamError>),
    /// The upstream asked the caller something: the call is parked; this is the caller's round.
    Asked(InputRequired),
}

/// What happened next in a running call.
enum Event {
    Reply(Result<UpstreamReply, UpstreamError>),
    Notification(Value),
    Ask(ServerAsk),
    Cancelled,
}

/// Runs the call until the upstream answers or asks the caller something; its progress and log
/// notifications are relayed to the caller as they come.
pub(super) async fn drive(
    upstream: &Upstream,
    ctx: &RequestContext,
    method: &str,
    binding: &(dyn Fn() -> Binding + Sync),
    mut running: Running,
) -> Result<Driven, ProtocolError> {
    loop {
        let event = tokio::select! {
            () = ctx.cancellation().cancelled() => Event::Cancelled,
            reply = &mut running.reply => Event::Reply(reply.unwrap_or_else(|_| {
                Err(UpstreamError::Unavailable("the upstream call ended without an answer".into()))
            })),
            Some(notification) = running.notifications.recv() => Event::Notification(notification),
            Some(ask) = running.asks.recv() => Event::Ask(ask),
        };
        match event {
            Event::Cancelled => return Ok(Driven::Done(Err(UpstreamError::Cancelled))),
            Event::Notification(notification) => ctx.relay_notification(&notification).await,
            Event::Reply(reply) => {
                while let Ok(notification) = running.notifications.try_recv() {
                    ctx.relay_notification(&notification).await;
                }
                upstream.series.observe(Some(method), running.started.elapsed(), &reply);
                if let Ok(UpstreamReply::Error { .. }) = &reply {
                    upstream.series.count_error("jsonrpc_error");
                }
                return Ok(Driven::Done(reply));
            }
            Event::Ask(ask) => {
                let Some((question, request)) = answer_or_relay(upstream, ctx, ask) else { continue };
                running.asked += 1;
                if running.asked > MAX_ASKS_PER_CALL {
                    let _ = question.send(AskAnswer::Error {
                        code: palisade_wire::error::codes::INVALID_REQUEST,
                        message: "too many requests in one call".into(),
                    });
                    tracing::warn!(upstream = %upstream.settings.id, cap = MAX_ASKS_PER_CALL, "upstream asked its caller more often in one call than allowed: the call fails");
                    upstream.series.count_error("too_many_requests");
                    return Err(ProtocolError::Unavailable);
                }
                match upstream.parked.park(binding(), question, running) {
                    Ok(pending) => {
                        let state = json!({ "upstream": upstream.settings.id, "pending": pending });
                        return Ok(Driven::Asked(InputRequired::new().relay(ASK_INPUT, request).with_state(state)));
                    }
                    Err((question, back)) => {
                        tracing::warn!(upstream = %upstream.settings.id, cap = MAX_PARKED_PER_CALLER, "caller has too many calls waiting on its answers: the upstream's request is refused");
                        let _ = question.send(AskAnswer::not_relayed());
                        running = back;
                    }
                }
            }
        }
    }
}

/// What the gateway does with one request of an upstream's.
enum Decision {
    /// The gateway answers it itself (the granted roots).
    Answer(Map<String, Value>),
    /// It goes to the caller.
    Relay,
    /// Not relayed: the configuration refuses the kind, or (`missing`: what it would need) the
    /// caller did not declare the capability.
    Refuse { missing: Option<Value> },
}

/// The one rule for an upstream's request, whichever way it came (during a call or as a
/// 2026-07-28 upstream's own round): roots answered with the granted ones; elicitation and
/// sampling relayed when the configuration allows the kind and the caller declared it (URL-mode
/// elicitation needs `elicitation.url`); anything else refused. Logged either way.
fn decide(upstream: &Upstream, ctx: &RequestContext, method: &str, params: Option<&Value>) -> Decision {
    let id = &upstream.settings.id;
    let allowed = &upstream.settings.client_requests;
    let declared = &ctx.meta().client_capabilities;
    let (permitted, needs) = match method {
        "roots/list" if !allowed.roots.is_empty() => {
            tracing::info!(upstream = %id, request = method, "answered with the granted roots");
            return Decision::Answer(roots_result(&allowed.roots));
        }
        "elicitation/create" => {
            let url_mode = params.and_then(|p| p.get("mode")).and_then(Value::as_str) == Some("url");
            let needs = if url_mode { json!({ "elicitation": { "url": {} } }) } else { json!({ "elicitation": {} }) };
            (allowed.elicitation, needs)
        }
        "sampling/createMessage" => (allowed.sampling, json!({ "sampling": {} })),
        "roots/list" => (allowed.caller_roots, json!({ "roots": {} })),
        _ => (false, Value::Null),
    };
    let declares = needs.as_object().is_some_and(|needs| {
        needs.iter().all(|(capability, inner)| {
            let have = declared.get(capability);
            have.is_some()
                && inner.as_object().is_none_or(|inner| inner.keys().all(|k| have.and_then(|h| h.get(k)).is_some()))
        })
    });
    if permitted && declares {
        tracing::info!(upstream = %id, request = method, "upstream request relayed to its caller");
        return Decision::Relay;
    }
    tracing::info!(upstream = %id, request = method, permitted, "upstream request refused: not relayed for this upstream or caller");
    Decision::Refuse { missing: (permitted && !declares).then_some(needs) }
}

/// Answers what the gateway answers itself (roots, refusals) and returns the caller's question
/// for what is relayed.
fn answer_or_relay(
    upstream: &Upstream,
    ctx: &RequestContext,
    ask: ServerAsk,
) -> Option<(oneshot::Sender<AskAnswer>, Value)> {
    let params = Value::Object(ask.params);
    match decide(upstream, ctx, &ask.method, Some(&params)) {
        Decision::Answer(result) => {
            let _ = ask.answer.send(AskAnswer::Result(result));
            None
        }
        Decision::Refuse { .. } => {
            let _ = ask.answer.send(AskAnswer::not_relayed());
            None
        }
        Decision::Relay => Some((ask.answer, caller_request(&ask.method, params))),
    }
}

/// An upstream's request as the caller gets it: its `_meta` dropped; an elicitation without a
/// mode is a form (the 2025-06-18 shape).
fn caller_request(method: &str, params: Value) -> Value {
    let mut params = match params {
        Value::Object(params) => params,
        _ => Map::new(),
    };
    params.remove("_meta");
    if method == "elicitation/create" {
        params.entry("mode").or_insert_with(|| json!("form"));
    }
    json!({ "method": method, "params": params })
}

/// One input request of a 2026-07-28 upstream's own round: `Some(answer)` when the gateway
/// answers it itself (roots), `None` when it goes to the caller; refused as a whole when the
/// kind is not relayed (-32021 naming what the caller must declare, when that is all it lacks).
pub(super) fn screen_input_request(
    upstream: &Upstream,
    ctx: &RequestContext,
    request: &Value,
) -> Result<Option<Map<String, Value>>, ProtocolError> {
    let method = request.get("method").and_then(Value::as_str).unwrap_or("");
    match decide(upstream, ctx, method, request.get("params")) {
        Decision::Answer(result) => Ok(Some(result)),
        Decision::Relay => Ok(None),
        Decision::Refuse { missing: Some(required) } => Err(ProtocolError::MissingCapability { required }),
        Decision::Refuse { missing: None } => Err(ProtocolError::Unavailable),
    }
}

/// The `roots/list` result of the granted roots.
pub(super) fn roots_result(roots: &[url::Url]) -> Map<String, Value> {
    let roots: Vec<Value> = roots.iter().map(|uri| json!({ "uri": uri.as_str() })).collect();
    let mut result = Map::new();
    result.insert("roots".into(), Value::Array(roots));
    result
}

/// The caller's declared capabilities as the upstream sees them: without the tasks extension
/// (a task through the gateway is the gateway's own, run by its worker as a plain call), and
/// only what this upstream may ask: elicitation and sampling when its configuration relays them
/// and the caller declared them, roots when the operator granted some (answered by the gateway,
/// whatever the caller declared) or relays the caller's (as declared).
pub(super) fn upstream_capabilities(upstream: &Upstream, declared: &Map<String, Value>) -> Map<String, Value> {
    let mut capabilities = declared.clone();
    if let Some(Value::Object(extensions)) = capabilities.get_mut("extensions") {
        extensions.remove(palisade_server::tasks::TASKS_EXTENSION);
        if extensions.is_empty() {
            capabilities.remove("extensions");
        }
    }
    let allowed = &upstream.settings.client_requests;
    if !allowed.elicitation {
        capabilities.remove("elicitation");
    }
    if !allowed.sampling {
        capabilities.remove("sampling");
    }
    if !allowed.roots.is_empty() {
        capabilities.insert("roots".into(), json!({}));
    } else if !allowed.caller_roots {
        capabilities.remove("roots");
    }
    capabilities
}

/// The parked call a retry answers, its question answered with the caller's answer: `None`
/// when the retry carries no parked call's state (a first call, or an upstream's own MRTR
/// round). Refused when the state names another upstream, the answer is missing, or no call is
/// parked under it for this caller and these arguments here (answered already, expired, or
/// parked on another instance).
pub(super) fn resume(
    upstream: &Upstream,
    ctx: &RequestContext,
    binding: impl FnOnce() -> Binding,
) -> Result<Option<Running>, ProtocolError> {
    let Some(state) = ctx.request_state() else { return Ok(None) };
    let Some(pending) = state.get("pending") else { return Ok(None) };
    let (Some(pending), Some(true)) =
        (pending.as_str(), state.get("upstream").and_then(Value::as_str).map(|id| id == upstream.settings.id))
    else {
        return Err(ProtocolError::invalid_params("requestState does not belong to this operation"));
    };
    let Some(Value::Object(answer)) = ctx.input_responses().get(ASK_INPUT) else {
        return Err(ProtocolError::invalid_params(format!("inputResponses has no object answer under {ASK_INPUT:?}")));
    };
    let parked = upstream.parked.take(pending, &binding()).ok_or_else(|| {
        ProtocolError::invalid_params(
            "the upstream's request is no longer waiting on this gateway (answered already, expired, or asked on \
             another gateway instance): call again",
        )
    })?;
    // An upstream call that ended meanwhile just does not take it; driving shows how it ended.
    let _ = parked.question.send(AskAnswer::Result(answer.clone()));
    Ok(Some(parked.running))
}

/// A call waiting for its caller's answer.
struct Parked {
    binding: Binding,
    question: oneshot::Sender<AskAnswer>,
    running: Running,
}

/// The calls of one upstream waiting for their callers' answers, by random id. Each is dropped
/// (its upstream exchange cancelled) at its deadline.
#[derive(Default, Clone)]
pub(super) struct ParkedCalls {
    calls: Arc<Mutex<HashMap<String, Parked>>>,
}

impl ParkedCalls {
    /// Parks `running` under a fresh id, until its deadline; given back when the caller already
    /// has [`MAX_PARKED_PER_CALLER`] calls parked.
    #[allow(clippy::result_large_err)]
    fn park(
        &self,
        binding: Binding,
        question: oneshot::Sender<AskAnswer>,
        running: Running,
    ) -> Result<String, (oneshot::Sender<AskAnswer>, Running)> {
        let mut calls = lock(&self.calls);
        let parked = calls.values().filter(|call| call.binding.partition == binding.partition).count();
        if parked >= MAX_PARKED_PER_CALLER {
            return Err((question, running));
        }
        let mut bytes = [0u8; 18];
        if aws_lc_rs::rand::fill(&mut bytes).is_err() {
            return Err((question, running));
        }
        let id = URL_SAFE_NO_PAD.encode(bytes);
        let deadline = tokio::time::Instant::from_std(running.deadline);
        calls.insert(id.clone(), Parked { binding, question, running });
        let registry = Arc::downgrade(&self.calls);
        let key = id.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let expired = registry.upgrade().and_then(|calls| lock(&calls).remove(&key));
            if expired.is_some() {
                tracing::info!("a call waiting for its caller's answer passed its deadline: cancelled");
            }
        });
        Ok(id)
    }

    /// Takes the call parked under `id` for `binding` (removing it: it is answered once).
    fn take(&self, id: &str, binding: &Binding) -> Option<Parked> {
        let mut calls = lock(&self.calls);
        if calls.get(id).is_none_or(|call| &call.binding != binding || call.running.deadline <= Instant::now()) {
            return None;
        }
        calls.remove(id)
    }
}
