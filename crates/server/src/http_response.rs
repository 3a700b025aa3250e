//! How a reply leaves over HTTP, for both wires' adapters (`http.rs` and `legacy.rs`): the
//! shared router state (`HttpState`), a request's work polled by its connection (`Work`), JSON
//! and SSE responses (the catalogue's status for every refusal), and the parsing of the request
//! headers the pipeline reads (`Accept`, the routing headers).
//!
//! Knows the server and the pipeline's entry points; nothing of connections or routing.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use palisade_wire::ProtocolError;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::pipeline::TransportHeaders;
use crate::refusals::Reason;
use crate::{Reply, Server};

/// The router's state: the server, and what this listener allows as `Host` and `Origin`.
pub(crate) struct HttpState {
    pub(crate) server: Arc<Server>,
    pub(crate) allowed_hosts: Vec<String>,
    pub(crate) allowed_origins: Vec<String>,
    /// Also allow a `Host` that is an IP literal (an operator's metrics listener).
    pub(crate) ip_literal_hosts: bool,
}

impl HttpState {
    /// Counts a refusal of the transport (metrics now, the audit log at the next flush).
    pub(crate) fn refused(&self, reason: Reason, peer: Option<IpAddr>) {
        self.server.transport_refusals().record(reason, peer);
        self.server.metrics().observe_transport_refusal(reason);
        tracing::debug!(reason = reason.as_str(), "transport refusal");
    }
}

/// A request's work, polled by the connection's own task rather than spawned per request (a
/// spawn costs a task, a wake-up and often a hop to the other runtime thread). Two behaviours
/// of a spawned task are kept:
///
/// - cancellation stays cooperative: if the response is dropped before the work finished (the
///   client left), the rest of the work is spawned and runs until it observes its cancellation
///   token (which the response's drop guard cancels), never cut off at an arbitrary `await`;
/// - a panic in the work becomes the generic internal error reply, not a dropped connection.
pub(crate) struct Work {
    future: Option<std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>>,
}

impl Work {
    pub(crate) fn new(future: impl std::future::Future<Output = Reply> + Send + 'static) -> Self {
        Work { future: Some(Box::pin(future)) }
    }
}

impl std::future::Future for Work {
    type Output = Reply;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Reply> {
        let Some(future) = self.future.as_mut() else {
            // Polled after it finished: a caller bug, answered as an internal error.
            return std::task::Poll::Ready(Reply::error(None, &ProtocolError::Internal));
        };
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx)));
        let reply = match polled {
            Ok(std::task::Poll::Pending) => return std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(reply)) => reply,
            Err(_) => {
                tracing::error!("a request's work panicked: answered with an internal error");
                Reply::error(None, &ProtocolError::Internal)
            }
        };
        self.future = None;
        std::task::Poll::Ready(reply)
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if let Some(future) = self.future.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(future);
        }
    }
}

/// Answers one request whose work runs in `work`: as JSON when nothing else was sent before the
/// reply (or the client takes no stream), else as an SSE stream carrying the request's
/// notifications (and, on the 2025-era wire, server-to-client requests) and then the reply.
/// Dropping `guard` (the client left) cancels the work.
pub(crate) async fn respond(
    state: &HttpState,
    streaming: bool,
    mut work: Work,
    mut notifications: mpsc::Receiver<Value>,
    guard: tokio_util::sync::DropGuard,
) -> Response {
    let queue = state.server.config().listen_queue;

    let first = tokio::select! {
        biased;
        reply = &mut work => {
            let queued: Vec<Value> = std::iter::from_fn(|| notifications.try_recv().ok()).collect();
            if queued.is_empty() || !streaming {
                drop(guard);
                return json_response(reply);
            }
            return sse_response(state, stream_of(queued, None, Some(reply.frame)));
        }
        Some(first) = notifications.recv() => first,
    };
    if !streaming {
        // The client cannot take a stream: notifications are dropped, the result is sent.
        let reply = loop {
            tokio::select! {
                reply = &mut work => break reply,
                _ = notifications.recv() => {}
            }
        };
        drop(guard);
        return json_response(reply);
    }
    let (events_tx, events_rx) = mpsc::channel::<Value>(queue.max(1));
    tokio::spawn(async move {
        let _guard = guard;
        if events_tx.send(first).await.is_err() {
            return;
        }
        let reply = loop {
            tokio::select! {
                biased;
                // The client closed the stream: stop forwarding; dropping the guard cancels.
                () = events_tx.closed() => return,
                Some(notification) = notifications.recv() => {
                    if events_tx.send(notification).await.is_err() {
                        return;
                    }
                }
                reply = &mut work => break reply,
            }
        };
        while let Ok(notification) = notifications.try_recv() {
            if events_tx.send(notification).await.is_err() {
                return;
            }
        }
        let _ = events_tx.send(reply.frame).await;
    });
    sse_response(state, stream_of(Vec::new(), Some(events_rx), None))
}

/// A stream of SSE events: `queued`, then whatever `rx` yields, then `last`.
pub(crate) fn stream_of(
    queued: Vec<Value>,
    rx: Option<mpsc::Receiver<Value>>,
    last: Option<Value>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let tail = last;
    let rx_stream = futures::stream::unfold(rx, |rx| async move {
        let mut rx = rx?;
        let item = rx.recv().await?;
        Some((item, Some(rx)))
    });
    use futures::StreamExt as _;
    futures::stream::iter(queued)
        .chain(rx_stream)
        .chain(futures::stream::iter(tail))
        .map(|frame| Ok(Event::default().data(frame.to_string())))
}

pub(crate) fn sse_response(
    state: &HttpState,
    stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Response {
    let keep_alive = KeepAlive::new().interval(state.server.config().keep_alive);
    let mut response = Sse::new(stream).keep_alive(keep_alive).into_response();
    response.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

pub(crate) fn json_response(reply: Reply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response =
        (status, [(header::CONTENT_TYPE, "application/json")], frame_bytes(&reply.frame)).into_response();
    if let Some(session) = reply.session.as_ref().and_then(|s| HeaderValue::from_str(s.expose()).ok()) {
        response.headers_mut().insert(MCP_SESSION_ID.clone(), session);
    }
    if let Some(challenge) = reply.challenge.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
    }
    if let Some(seconds) = reply.retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// The answer that carries only `error`: its HTTP status, code and message all from the error
/// catalogue ([`ProtocolError::http_status_for`], [`ProtocolError::to_wire`]), as [`Reply::error`]
/// makes them.
pub(crate) fn refusal_response(id: Option<&palisade_wire::RequestId>, error: &ProtocolError) -> Response {
    json_response(Reply::error(id, error))
}

/// A frame as JSON bytes, serialized straight into the buffer (no `Display` detour).
fn frame_bytes(frame: &Value) -> Vec<u8> {
    // A `Value` always serializes (its keys are strings); the fallback is unreachable in practice.
    serde_json::to_vec(frame).unwrap_or_else(|_| {
        br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error"}}"#.to_vec()
    })
}

pub(crate) struct Accepts {
    pub(crate) event_stream: bool,
}

/// What the client accepts; `None` when it accepts neither JSON nor SSE.
pub(crate) fn accepted_kinds(headers: &HeaderMap) -> Option<Accepts> {
    let values: Vec<&str> = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    if values.is_empty() {
        return Some(Accepts { event_stream: true });
    }
    let mut json = false;
    let mut event_stream = false;
    for item in values.iter().flat_map(|v| v.split(',')) {
        let media = item.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        match media.as_str() {
            "application/json" | "application/*" => json = true,
            "text/event-stream" | "text/*" => event_stream = true,
            "*/*" => {
                json = true;
                event_stream = true;
            }
            _ => {}
        }
    }
    (json || event_stream).then_some(Accepts { event_stream })
}

/// `Mcp-Session-Id` (2025-era sessions).
pub(crate) static MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");

/// The transport headers the pipeline reads, in one pass over the request's headers (a lookup by
/// name per header would parse and hash each name again).
pub(crate) fn transport_headers(headers: &HeaderMap) -> TransportHeaders {
    /// The routing headers (after `mcp-`), with the names used in a refusal, in check order.
    const ROUTING: [(&str, &str); 3] =
        [("protocol-version", "MCP-Protocol-Version"), ("method", "Mcp-Method"), ("name", "Mcp-Name")];
    let mut routing: [Option<Vec<u8>>; 3] = Default::default();
    let mut repeated = [false; 3];
    let mut params = Vec::new();
    let mut repeated_param = None;
    let mut authorization = None;
    let mut authorizations = 0usize;
    for (name, value) in headers {
        if *name == header::AUTHORIZATION {
            authorizations += 1;
            if authorizations == 1 {
                authorization = Some(value.as_bytes().to_vec());
            }
            continue;
        }
        let Some(rest) = name.as_str().strip_prefix("mcp-") else { continue };
        if let Some(index) = ROUTING.iter().position(|(suffix, _)| *suffix == rest) {
            // The first value is the one used, as `HeaderMap::get` would give it.
            match &routing[index] {
                Some(_) => repeated[index] = true,
                None => routing[index] = Some(value.as_bytes().to_vec()),
            }
        } else if let Some(param) = rest.strip_prefix("param-") {
            // Header names arrive lowercased: a repeated parameter header has an equal name.
            if params.iter().any(|(seen, _): &(String, Vec<u8>)| seen == param) {
                repeated_param.get_or_insert_with(|| format!("Mcp-Param-{param}"));
            }
            params.push((param.to_owned(), value.as_bytes().to_vec()));
        }
    }
    let duplicate = ROUTING
        .iter()
        .zip(repeated)
        .find_map(|((_, display), twice)| twice.then(|| (*display).to_owned()))
        .or(repeated_param);
    let [protocol_version, method, name] = routing;
    TransportHeaders {
        protocol_version,
        method,
        name,
        params,
        duplicate,
        // More than one Authorization header is malformed: authenticate an empty value (refused).
        authorization: if authorizations > 1 { Some(Vec::new()) } else { authorization },
        source: None,
    }
}
