//! The 2025-era wire adapter (2025-11-25 and 2025-06-18) on the same `/mcp` endpoint: it frames
//! the session transport and nothing else. Every JSON-RPC request goes through
//! [`Server::handle_legacy_request`], i.e. the one pipeline; the session id is checked there,
//! after authentication, against the principal. What lives here:
//!
//! - telling a session-era POST apart ([`is_legacy_post`]);
//! - server-to-client requests: an `input_required` answer of the pipeline (MRTR) becomes real
//!   JSON-RPC requests (`sampling/createMessage`, `elicitation/create`, `roots/list`) on the POST's
//!   SSE stream; the client's answers arrive as separate POSTs (answered 202), and the request is
//!   run through the pipeline again with them as `inputResponses` (and the sealed
//!   `requestState`), like a 2026-07-28 client's retry;
//! - the GET stream (list changes, updates of subscribed resources) and session DELETE, both
//!   admitted by [`Server::admit_session`] (authenticate, then bind).
//!
//! Live SSE streams and unanswered server requests are held by the instance that opened them;
//! session state itself is in the store, so any instance serves any other request. An answer
//! admitted on an instance that holds no request for it goes to the session service's
//! [`crate::sessions::AnswerRelay`] when there is one (answered 202 once handed over).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use palisade_wire::header::decode_plain_value;
use palisade_wire::jsonrpc::{Message, notification_frame, parse_message};
use palisade_wire::{ProtocolError, Request};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::context::NotificationSink;
use crate::events::ServerEvent;
use crate::http_response::{
    HttpState, MCP_SESSION_ID, accepted_kinds, json_response, refusal_response, respond, sse_response, stream_of,
    transport_headers,
};
use crate::method::Method;
use crate::pipeline::{ListKind, TransportHeaders};
use crate::reply::Reply;
use crate::server::Server;
use crate::sessions::{Delivery, SessionId};

/// Keys of 2026-07-28 results that the 2025-era wire does not know.
const MODERN_ONLY_RESULT_KEYS: &[&str] = &["resultType", "ttlMs", "cacheScope"];

/// Whether a POST belongs to the session wire: it carries `Mcp-Session-Id`; or it is not a
/// 2026-07-28 request (no `_meta` protocol version) and carries an earlier revision's
/// `MCP-Protocol-Version`, or no version header at all (the `initialize` of a client that has not
/// negotiated yet). A 2026-07-28 body with a wrong version header stays on the 2026 wire, which
/// answers `-32020`.
pub(crate) fn is_legacy_post(headers: &HeaderMap, body: &[u8], parsed: Option<&Message>) -> bool {
    if headers.contains_key(&MCP_SESSION_ID) {
        return true;
    }
    // The frame the 2026 wire already parsed answers without a second parse; anything it could
    // not parse (a client's response to a server request, a malformed frame) is looked at here.
    let (params, has_id) = match parsed {
        Some(Message::Request(request)) => (Some(&request.params), true),
        Some(Message::Notification(notification)) => (Some(&notification.params), false),
        None => match palisade_wire::strict::from_slice(body) {
            Ok(Value::Object(message)) => {
                let params = message.get("params").and_then(Value::as_object).cloned();
                return legacy_by_version(headers, params.as_ref(), message.contains_key("id"));
            }
            _ => return false,
        },
    };
    legacy_by_version(headers, params, has_id)
}

fn legacy_by_version(headers: &HeaderMap, params: Option<&Map<String, Value>>, has_id: bool) -> bool {
    let modern_body =
        params.and_then(|p| p.get("_meta")).and_then(|m| m.get(palisade_wire::meta_keys::PROTOCOL_VERSION)).is_some();
    if modern_body {
        return false;
    }
    if let Some(raw) = headers.get("mcp-protocol-version") {
        return decode_plain_value(raw.as_bytes()).is_ok_and(|v| v.starts_with("2024-") || v.starts_with("2025-"));
    }
    // A notification without a session is nobody's business on either wire.
    has_id
}

/// The `Mcp-Session-Id` of a request: `Ok(None)` when absent; a malformed or repeated value is
/// answered like an unknown session (404), after authentication (401 comes first).
async fn session_id(server: &Server, headers: &HeaderMap, what: &str) -> Result<Option<SessionId>, Response> {
    let mut values = headers.get_all(&MCP_SESSION_ID).iter();
    let Some(first) = values.next() else { return Ok(None) };
    match (SessionId::parse(first.as_bytes()), values.next()) {
        (Some(id), None) => Ok(Some(id)),
        _ => Err(json_response(server.refuse_malformed_session(authorization(headers).as_deref(), what).await)),
    }
}

fn authorization(headers: &HeaderMap) -> Option<Vec<u8>> {
    transport_headers(headers).authorization
}

/// A POST on the session wire: a request, a notification, or a client's answer to a server
/// request.
pub(crate) async fn post(
    state: &Arc<HttpState>,
    headers: &HeaderMap,
    body: &[u8],
    streaming: bool,
    peer: Option<std::net::IpAddr>,
) -> Response {
    let session = match session_id(&state.server, headers, "session/post").await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let server = state.server.clone();
    // An answer to one of our requests: no method, an id, and a result or an error.
    if let Ok(Value::Object(message)) = palisade_wire::strict::from_slice(body)
        && !message.contains_key("method")
        && message.contains_key("id")
        && (message.contains_key("result") || message.contains_key("error"))
    {
        return client_answer(&server, headers, session.as_ref(), message).await;
    }
    let request = match parse_message(body) {
        Ok(Message::Request(request)) => request,
        Ok(Message::Notification(_)) => {
            // initialized, cancelled, roots/list_changed: accepted once the session is admitted.
            if session.is_none() {
                return StatusCode::ACCEPTED.into_response();
            }
            let auth = authorization(headers);
            return match server.admit_session(auth.as_deref(), session.as_ref(), Method::SessionNotification).await {
                Ok(_) => StatusCode::ACCEPTED.into_response(),
                Err(reply) => json_response(reply),
            };
        }
        Err(frame_error) => {
            return refusal_response(frame_error.id.as_ref(), &frame_error.error);
        }
    };
    let transport = TransportHeaders { source: peer, ..transport_headers(headers) };
    let (sink, notifications) = NotificationSink::channel(server.config().listen_queue);
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    let work = crate::http_response::Work::new(async move {
        let started = std::time::Instant::now();
        let reply = rounds(&server, request, &transport, session, sink, cancel, streaming).await;
        server.metrics().observe_request(reply.frame.get("error").is_none(), started.elapsed());
        reply
    });
    respond(state, streaming, work, notifications, guard).await
}

/// Runs a request through the pipeline, turning each `input_required` answer into server
/// requests on the stream and running it again with the client's answers.
async fn rounds(
    server: &Server,
    mut request: Request,
    headers: &TransportHeaders,
    session: Option<SessionId>,
    sink: NotificationSink,
    cancel: CancellationToken,
    streaming: bool,
) -> Reply {
    let id = request.id.clone();
    let max_rounds = server.config().legacy.max_rounds;
    let mut round = 0;
    loop {
        let reply = server
            .handle_legacy_request(request.clone(), Some(headers), session.as_ref(), sink.clone(), cancel.clone())
            .await;
        let Some(result) = reply.frame.get("result") else { return reply };
        if result.get("resultType").and_then(Value::as_str) != Some("input_required") {
            return legacy_shape(reply);
        }
        round += 1;
        if !streaming {
            let error =
                ProtocolError::InvalidRequest("this request needs the client's input: accept text/event-stream");
            return Reply::error(Some(&id), &error);
        }
        let Some(session) = session.as_ref() else {
            return Reply::error(Some(&id), &ProtocolError::Internal);
        };
        if round > max_rounds {
            tracing::info!(stage = "dispatch", "request needed more client rounds than allowed");
            return Reply::error(Some(&id), &ProtocolError::Internal);
        }
        let asks = result.get("inputRequests").and_then(Value::as_object).cloned().unwrap_or_default();
        let state = result.get("requestState").cloned();
        let answers = match ask_client(server, session.digest(), asks, &sink, &cancel).await {
            Ok(answers) => answers,
            Err(error) => return Reply::error(Some(&id), &error),
        };
        request.params.insert("inputResponses".into(), Value::Object(answers));
        match state {
            Some(state) => request.params.insert("requestState".into(), state),
            None => request.params.remove("requestState"),
        };
    }
}

/// Sends one server request per input request on the stream and waits for every answer.
async fn ask_client(
    server: &Server,
    session: [u8; 32],
    asks: Map<String, Value>,
    sink: &NotificationSink,
    cancel: &CancellationToken,
) -> Result<Map<String, Value>, ProtocolError> {
    let service = server.sessions().ok_or(ProtocolError::Internal)?;
    let pending = service.pending();
    let mut waiting: Vec<(String, String, oneshot::Receiver<Value>)> = Vec::new();
    let forget_all = |waiting: &[(String, String, oneshot::Receiver<Value>)]| {
        for (_, request_id, _) in waiting {
            pending.forget(session, request_id);
        }
    };
    for (key, ask) in asks {
        let (request_id, answer) = match pending.register(session) {
            Ok(registered) => registered,
            Err(error) => {
                forget_all(&waiting);
                return Err(error);
            }
        };
        let mut params = ask.get("params").cloned().unwrap_or_else(|| json!({}));
        // 2025-11-25 URL-mode elicitation carries an `elicitationId` (2026-07-28 dropped it):
        // the request's own id, unique within the session.
        if ask.get("method").and_then(Value::as_str) == Some("elicitation/create")
            && params.get("mode").and_then(Value::as_str) == Some("url")
            && let Some(params) = params.as_object_mut()
        {
            params.entry("elicitationId").or_insert_with(|| json!(request_id));
        }
        let frame = json!({
            "jsonrpc": "2.0",
            "id": request_id,
            "method": ask.get("method").cloned().unwrap_or(Value::Null),
            "params": params,
        });
        waiting.push((key, request_id, answer));
        if !sink.send(frame).await {
            forget_all(&waiting);
            return Err(ProtocolError::Internal);
        }
    }
    let timeout = service.config().client_request_timeout;
    let mut answers = Map::new();
    let mut remaining = waiting.into_iter();
    while let Some((key, request_id, answer)) = remaining.next() {
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(timeout, answer) => Some(outcome),
            () = cancel.cancelled() => None,
        };
        pending.forget(session, &request_id);
        let failure = match outcome {
            Some(Ok(Ok(answer))) => match answer.get("result") {
                Some(result @ Value::Object(_)) => {
                    answers.insert(key, result.clone());
                    continue;
                }
                _ => ProtocolError::invalid_params("the client declined the server's request"),
            },
            Some(Ok(Err(_))) | None => ProtocolError::Internal,
            Some(Err(_)) => ProtocolError::Timeout,
        };
        for (_, other, _) in remaining {
            pending.forget(session, &other);
        }
        return Err(failure);
    }
    Ok(answers)
}

/// A client's answer to one of our requests: admitted like any request of the session (same
/// principal), then handed to the request waiting for it.
async fn client_answer(
    server: &Server,
    headers: &HeaderMap,
    session: Option<&SessionId>,
    message: Map<String, Value>,
) -> Response {
    let auth = authorization(headers);
    let admitted = match server.admit_session(auth.as_deref(), session, Method::SessionAnswer).await {
        Ok((_, admitted, _)) => admitted,
        Err(reply) => return json_response(reply),
    };
    let id = message.get("id").and_then(Value::as_str).map(str::to_owned);
    // Not waited for here: another instance of the deployment may hold the request (its
    // client's POST landed on this one); with a relay, it carries the answer there.
    let delivery = match (id, server.sessions()) {
        (Some(id), Some(service)) => service.pending().deliver(admitted.digest, &id, message),
        _ => Delivery::Nowhere,
    };
    if delivery != Delivery::Nowhere {
        StatusCode::ACCEPTED.into_response()
    } else {
        let error = ProtocolError::InvalidRequest("no request of this session is waiting for that answer");
        refusal_response(None, &error)
    }
}

/// A 2026-07-28 result reshaped for the 2025-era wire.
fn legacy_shape(mut reply: Reply) -> Reply {
    if let Some(Value::Object(result)) = reply.frame.get_mut("result") {
        for key in MODERN_ONLY_RESULT_KEYS {
            result.remove(*key);
        }
    }
    reply
}

/// `GET /mcp`: the session's stream of list changes and subscribed resource updates. It ends
/// when the client leaves, the server shuts down, the token expires, the session dies or the
/// client falls behind.
pub(crate) async fn get_stream(
    state: &Arc<HttpState>,
    headers: &HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> Response {
    if !accepted_kinds(headers).is_some_and(|accepts| accepts.event_stream) {
        return refusal_response(None, &ProtocolError::EventStreamRequired);
    }
    let session = match session_id(&state.server, headers, Method::SessionStream.as_str()).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let server = state.server.clone();
    let auth = authorization(headers);
    let admission = server.admit_session(auth.as_deref(), session.as_ref(), Method::SessionStream).await;
    let (principal, admitted, cleared) = match admission {
        Ok(admitted) => admitted,
        Err(reply) => return json_response(reply),
    };
    let Some(service) = server.sessions().cloned() else {
        return refusal_response(None, &ProtocolError::Unavailable);
    };
    let permit = match server.stream_permit(&principal) {
        Ok(permit) => permit,
        Err(_) => return refusal_response(None, &ProtocolError::TooManyStreams),
    };
    let (tx, rx) = mpsc::channel::<Value>(server.config().listen_queue.max(1));
    let shutdown = server.shutdown_token().clone();
    let caps = server.app().capabilities();
    let server_for_task = server.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let server = server_for_task;
        let mut events = server.events().subscribe();
        // What the session subscribed to (and the application serves) is wanted while the stream
        // is open; re-read at every event, a subscription change among them.
        let mut interest = server.hold_interest(Vec::new());
        let served = |subscriptions: &[String]| -> BTreeSet<String> {
            let app = server.app();
            subscriptions.iter().filter(|uri| app.knows_resource(uri)).cloned().collect()
        };
        let now = server.clock().now_ms();
        if let Ok(Some(subscriptions)) =
            service.store().session_subscriptions(admitted.digest, &admitted.owner, now).await
        {
            interest.set(served(&subscriptions));
        }
        let clock = server.clock.clone();
        let expiry = async {
            match principal.expires_at_ms() {
                Some(at) => clock.sleep_until_ms(i64::try_from(at).unwrap_or(i64::MAX)).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expiry);
        // A DISABLE the kill switch observes for one of the stream's targets ends it, as it
        // ends a listen stream.
        let mut disables = crate::clearance::DisableWatch::new(cleared.as_ref());
        // What the caller sees of each list now: a change is announced only when its view of
        // that list changed (under the registry and the operator's policies in force).
        let lists = [
            (ListKind::Tools, caps.get("tools").is_some()),
            (ListKind::Prompts, caps.get("prompts").is_some()),
            (ListKind::Resources, caps.get("resources").is_some()),
        ];
        let mut seen = [None; 3];
        for (list, on) in lists {
            if on {
                server.list_changed_for(&principal, (true, peer), list, &mut seen);
            }
        }
        let mut changed = |list: ListKind| server.list_changed_for(&principal, (true, peer), list, &mut seen);
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => break,
                () = tx.closed() => break,
                () = &mut expiry => break,
                () = disables.disabled() => {
                    tracing::info!(stage = "session", "GET stream closed: a target was disabled");
                    break;
                }
                event = events.recv() => event,
            };
            let event = match event {
                Ok(ServerEvent::HandlePoliciesChanged) => break,
                Ok(event) => event,
                Err(RecvError::Lagged(_) | RecvError::Closed) => break,
            };
            // Every event re-checks the session (alive, same owner) before it is delivered.
            let now = server.clock().now_ms();
            let subscriptions = match service.store().session_subscriptions(admitted.digest, &admitted.owner, now).await
            {
                Ok(Some(subscriptions)) => subscriptions,
                _ => break,
            };
            interest.set(served(&subscriptions));
            let frame = match event {
                ServerEvent::ToolsListChanged if caps.get("tools").is_some() && changed(ListKind::Tools) => {
                    notification_frame("notifications/tools/list_changed", json!({}))
                }
                ServerEvent::PromptsListChanged if caps.get("prompts").is_some() && changed(ListKind::Prompts) => {
                    notification_frame("notifications/prompts/list_changed", json!({}))
                }
                ServerEvent::ResourcesListChanged
                    if caps.get("resources").is_some() && changed(ListKind::Resources) =>
                {
                    notification_frame("notifications/resources/list_changed", json!({}))
                }
                ServerEvent::ResourceUpdated { uri }
                    if subscriptions.contains(&uri) && server.may_read_now(&principal, (true, peer), &uri) =>
                {
                    notification_frame("notifications/resources/updated", json!({ "uri": uri }))
                }
                _ => continue,
            };
            if tx.try_send(frame).is_err() {
                break;
            }
        }
    });
    sse_response(state, stream_of(Vec::new(), Some(rx), None))
}

/// `DELETE /mcp`: ends the caller's own session. Anyone else's id is 404 and stays live.
pub(crate) async fn delete_session(state: &Arc<HttpState>, headers: &HeaderMap) -> Response {
    let session = match session_id(&state.server, headers, Method::SessionDelete.as_str()).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let server = &state.server;
    let auth = authorization(headers);
    let admitted = match server.admit_session(auth.as_deref(), session.as_ref(), Method::SessionDelete).await {
        Ok((_, admitted, _)) => admitted,
        Err(reply) => return json_response(reply),
    };
    let Some(service) = server.sessions() else {
        return refusal_response(None, &ProtocolError::Unavailable);
    };
    match service.store().delete_session(admitted.digest, &admitted.owner).await {
        Ok(true) => StatusCode::OK.into_response(),
        Ok(false) => refusal_response(None, &ProtocolError::SessionNotFound),
        Err(error) => {
            tracing::error!(%error, "session store unavailable: refusing the delete");
            refusal_response(None, &ProtocolError::Unavailable)
        }
    }
    .into_response()
}
