//! Streamable HTTP transport (2026-07-28): `POST /mcp`, one JSON-RPC message per POST, the
//! answer as JSON or as an SSE stream scoped to that request. When the 2025-era wire is on, the
//! same endpoint hands session-era traffic (initialize, `Mcp-Session-Id`, the GET stream, session
//! DELETE) to [`crate::legacy`], which feeds the same pipeline.
//!
//! Checked here, before any byte reaches the pipeline: `Host`/`Origin` (DNS rebinding, 403),
//! header count and size (431), body size (413), `Accept` (406). Closing the response stream
//! cancels the request's work.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method as HttpMethod, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::serve::ListenerExt as _;
use futures::Stream;
use http_body_util::{BodyExt, Limited};
use palisade_wire::ProtocolError;
use palisade_wire::jsonrpc::{Message, error_frame, parse_message};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::context::NotificationSink;
use crate::pipeline::{Reply, Server, TransportHeaders};

/// Why the HTTP transport could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Unauthenticated mode on a non-loopback address.
    #[error("refusing to listen on {0}: the server is unauthenticated, which is allowed on loopback addresses only")]
    UnauthenticatedNonLoopback(SocketAddr),
    /// Binding or serving failed.
    #[error("listener error: {0}")]
    Io(#[from] std::io::Error),
}

pub(crate) struct HttpState {
    pub(crate) server: Arc<Server>,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
}

/// Binds `addr`, refusing a non-loopback address while the server is unauthenticated.
pub async fn bind(server: &Server, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    if server.authenticator().is_unauthenticated() && !addr.ip().is_loopback() {
        return Err(ServeError::UnauthenticatedNonLoopback(addr));
    }
    Ok(TcpListener::bind(addr).await?)
}

/// Serves until `shutdown` resolves; then open listen streams end with their `complete` result
/// and in-flight requests finish.
pub async fn serve(
    server: Arc<Server>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let local = listener.local_addr()?;
    if server.authenticator().is_unauthenticated() && !local.ip().is_loopback() {
        return Err(ServeError::UnauthenticatedNonLoopback(local));
    }
    let token = server.shutdown_token().clone();
    let (router, state) = router_with_state(server, local);
    let app = axum::ServiceExt::<axum::extract::Request>::into_make_service(Endpoint { state, router });
    // Nagle's algorithm off: each JSON reply and SSE event is one write that should leave at
    // once; with it on, an event written while the previous one is unacknowledged waits for
    // the client's (possibly delayed) ACK.
    let listener = listener.tap_io(|stream| {
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY on an accepted connection");
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            token.cancel();
        })
        .await?;
    Ok(())
}

/// The router: `/mcp` for MCP, everything else 404.
pub fn router(server: Arc<Server>, local: SocketAddr) -> Router {
    router_with_state(server, local).0
}

/// What [`serve`] answers with: requests for `/mcp` (nearly all of them) go straight to the
/// endpoint, everything else through the router. Same behaviour as the router's own `/mcp`
/// route, minus its per-request costs: the route lookup, a boxed handler service, and the
/// extractors' copies of the request's headers and URI.
#[derive(Clone)]
struct Endpoint {
    state: Arc<HttpState>,
    router: Router,
}

type RouterFuture = <Router as tower::Service<axum::extract::Request>>::Future;

impl tower::Service<axum::extract::Request> for Endpoint {
    type Response = Response;
    type Error = Infallible;
    type Future =
        futures::future::Either<futures::future::BoxFuture<'static, Result<Response, Infallible>>, RouterFuture>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        tower::Service::<axum::extract::Request>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, request: axum::extract::Request) -> Self::Future {
        if request.uri().path() != "/mcp" {
            return futures::future::Either::Right(tower::Service::call(&mut self.router, request));
        }
        let state = self.state.clone();
        let (parts, body) = request.into_parts();
        futures::future::Either::Left(Box::pin(async move {
            Ok(mcp_endpoint(State(state), parts.method, parts.uri, parts.headers, body).await)
        }))
    }
}

fn router_with_state(server: Arc<Server>, local: SocketAddr) -> (Router, Arc<HttpState>) {
    let port = local.port();
    let mut allowed_hosts = vec![format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}")];
    if !local.ip().is_loopback() && !local.ip().is_unspecified() {
        allowed_hosts.push(local.to_string());
    }
    allowed_hosts.extend(server.config().allowed_hosts.iter().cloned());
    let mut allowed_origins: Vec<String> = allowed_hosts.iter().map(|h| format!("http://{h}")).collect();
    allowed_origins.extend(server.config().allowed_origins.iter().cloned());
    let metadata = server.authenticator().verifier().map(|verifier| {
        let config = verifier.config();
        (palisade_auth::protected_resource_metadata(config), palisade_auth::metadata_paths(&config.resource))
    });
    let state = Arc::new(HttpState { server, allowed_hosts, allowed_origins });
    let mut router = Router::new()
        .route("/mcp", any(mcp_endpoint))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics));
    // RFC 9728 Protected Resource Metadata, at the plain and the path-suffixed well-known URIs.
    if let Some((document, paths)) = metadata {
        let document = Arc::new(document);
        for path in paths {
            let document = document.clone();
            router = router.route(&path, get(move || async move { axum::Json((*document).clone()) }));
        }
    }
    (router.with_state(state.clone()), state)
}

async fn readyz(State(state): State<Arc<HttpState>>) -> Response {
    if state.server.ready().await {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "store unavailable").into_response()
    }
}

async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.server.metrics().render()).into_response()
}

async fn mcp_endpoint(
    State(state): State<Arc<HttpState>>,
    method: HttpMethod,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(response) = check_transport(&state, &headers) {
        return response;
    }
    // Bearer tokens travel in the Authorization header only, never in the URL (the RFC 6750
    // query form is not supported): such a request is refused before anything else.
    if uri.query().is_some_and(|q| q.split('&').any(|pair| pair.split('=').next() == Some("access_token"))) {
        let error = ProtocolError::InvalidRequest("access tokens are not accepted in the URL");
        return error_response(None, &error, StatusCode::BAD_REQUEST);
    }
    let legacy = state.server.legacy_enabled();
    // The GET stream and session DELETE exist only for a 2025-era session: they carry its id.
    let with_session = legacy && headers.contains_key(&MCP_SESSION_ID);
    if with_session && method == HttpMethod::GET {
        return crate::legacy::get_stream(&state, &headers).await;
    }
    if with_session && method == HttpMethod::DELETE {
        return crate::legacy::delete_session(&state, &headers).await;
    }
    if method != HttpMethod::POST {
        // No GET stream and no session DELETE in 2026-07-28.
        return (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "POST")]).into_response();
    }
    let streaming = match accepted_kinds(&headers) {
        Some(accepts) => accepts.event_stream,
        None => {
            return error_response(
                None,
                &ProtocolError::InvalidRequest("Accept must allow application/json or text/event-stream"),
                StatusCode::NOT_ACCEPTABLE,
            );
        }
    };
    if let Some(content_type) = headers.get(header::CONTENT_TYPE)
        && !content_type.to_str().is_ok_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/json"))
    {
        return error_response(
            None,
            &ProtocolError::InvalidRequest("Content-Type must be application/json"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        );
    }
    let limit = state.server.config().max_body_bytes;
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return error_response(None, &ProtocolError::PayloadTooLarge, StatusCode::PAYLOAD_TOO_LARGE),
    };
    let parsed = parse_message(&bytes);
    if legacy && crate::legacy::is_legacy_post(&headers, &bytes, parsed.as_ref().ok()) {
        return crate::legacy::post(&state, &headers, &bytes, streaming).await;
    }
    let request = match parsed {
        Ok(Message::Request(request)) => request,
        // No client notification is defined over HTTP in this revision: accept and ignore.
        Ok(Message::Notification(_)) => return StatusCode::ACCEPTED.into_response(),
        Err(frame_error) => {
            let status = status_of(&frame_error.error);
            return error_response(frame_error.id.as_ref(), &frame_error.error, status);
        }
    };
    let transport_headers = transport_headers(&headers);
    let server = state.server.clone();
    let queue = server.config().listen_queue;
    let (sink, notifications) = NotificationSink::channel(queue);
    let cancel = CancellationToken::new();
    // Dropped when the client goes away (response future or SSE body dropped): cancels the work.
    let guard = cancel.clone().drop_guard();
    let work = Work::new(async move {
        let started = std::time::Instant::now();
        let reply = server.handle_request(request, Some(&transport_headers), sink, cancel).await;
        server.metrics().observe_request(reply.frame.get("error").is_none(), started.elapsed());
        reply
    });
    respond(&state, streaming, work, notifications, guard).await
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
    response
}

pub(crate) fn error_response(
    id: Option<&palisade_wire::RequestId>,
    error: &ProtocolError,
    status: StatusCode,
) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], frame_bytes(&error_frame(id, error))).into_response()
}

/// A frame as JSON bytes, serialized straight into the buffer (no `Display` detour).
fn frame_bytes(frame: &Value) -> Vec<u8> {
    // A `Value` always serializes (its keys are strings); the fallback is unreachable in practice.
    serde_json::to_vec(frame).unwrap_or_else(|_| {
        br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error"}}"#.to_vec()
    })
}

fn status_of(error: &ProtocolError) -> StatusCode {
    StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::BAD_REQUEST)
}

/// Host and Origin against the allow-lists (DNS rebinding), then header count and size.
#[allow(clippy::result_large_err)]
fn check_transport(state: &HttpState, headers: &HeaderMap) -> Result<(), Response> {
    let forbidden =
        |why: &'static str| error_response(None, &ProtocolError::InvalidRequest(why), StatusCode::FORBIDDEN);
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).map(|h| h.to_ascii_lowercase());
    match host {
        Some(host) if state.allowed_hosts.iter().any(|allowed| allowed.eq_ignore_ascii_case(&host)) => {}
        _ => return Err(forbidden("Host is not allowed")),
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let allowed = origin.to_str().is_ok_and(|o| state.allowed_origins.iter().any(|a| a.eq_ignore_ascii_case(o)));
        if !allowed {
            return Err(forbidden("Origin is not allowed"));
        }
    }
    let config = state.server.config();
    let total: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    if headers.len() > config.max_header_count || total > config.max_header_bytes {
        return Err(error_response(
            None,
            &ProtocolError::InvalidRequest("request headers too large"),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        ));
    }
    Ok(())
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
            params.push((param.to_owned(), value.as_bytes().to_vec()));
        }
    }
    let duplicate = ROUTING.iter().zip(repeated).find_map(|((_, display), twice)| twice.then(|| (*display).to_owned()));
    let [protocol_version, method, name] = routing;
    TransportHeaders {
        protocol_version,
        method,
        name,
        params,
        duplicate,
        // More than one Authorization header is malformed: authenticate an empty value (refused).
        authorization: if authorizations > 1 { Some(Vec::new()) } else { authorization },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `serve`'s [`Endpoint`] and the router it wraps give the same answer to every kind of
    /// request (the router's own `/mcp` route is what embedders of [`router`] use).
    #[tokio::test]
    async fn the_endpoint_answers_as_the_router_does() {
        use tower::ServiceExt as _;
        let app = crate::App::builder("t", "0").build().unwrap();
        let server = Arc::new(Server::new(
            app,
            crate::ServerConfig::default(),
            crate::auth::Authenticator::UnauthenticatedLoopback,
            crate::secret::ServerSecret::random(),
        ));
        let local: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let (router, state) = router_with_state(server, local);
        let endpoint = Endpoint { state, router: router.clone() };
        let request = |method: &str, uri: &str, host: &str| {
            axum::extract::Request::builder()
                .method(method)
                .uri(uri)
                .header(header::HOST, host)
                .header(header::ACCEPT, "application/json, text/event-stream")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#))
                .unwrap()
        };
        let cases = [
            (("GET", "/mcp", "127.0.0.1:4000"), StatusCode::METHOD_NOT_ALLOWED),
            (("POST", "/mcp", "evil.example:4000"), StatusCode::FORBIDDEN),
            (("POST", "/mcp?access_token=x", "127.0.0.1:4000"), StatusCode::BAD_REQUEST),
            // Reaches the pipeline: an app with no tools has no tools/list (-32601, 404).
            (("POST", "/mcp", "127.0.0.1:4000"), StatusCode::NOT_FOUND),
            (("GET", "/healthz", "127.0.0.1:4000"), StatusCode::OK),
            (("POST", "/other", "127.0.0.1:4000"), StatusCode::NOT_FOUND),
        ];
        for ((method, uri, host), expected) in cases {
            let mut answers = Vec::new();
            for response in [
                router.clone().oneshot(request(method, uri, host)).await.unwrap(),
                endpoint.clone().oneshot(request(method, uri, host)).await.unwrap(),
            ] {
                let status = response.status();
                let allow = response.headers().get(header::ALLOW).cloned();
                let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
                answers.push((status, allow, body));
            }
            assert_eq!(answers[0].0, expected, "{method} {uri} (host {host})");
            if expected == StatusCode::NOT_FOUND && uri == "/mcp" {
                assert!(String::from_utf8_lossy(&answers[0].2).contains("-32601"), "the pipeline's answer");
            }
            assert_eq!(answers[0], answers[1], "{method} {uri} (host {host})");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn transport_headers_are_read_in_one_pass() {
        let found = transport_headers(&headers(&[
            ("host", "127.0.0.1:1"),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("Mcp-Name", "product_get"),
            ("mcp-param-sku", "TEA-001"),
            ("Mcp-Param-Region", "eu"),
            ("mcp-session-id", "not a routing header"),
            ("authorization", "Bearer abc"),
        ]));
        assert_eq!(found.protocol_version.as_deref(), Some(&b"2026-07-28"[..]));
        assert_eq!(found.method.as_deref(), Some(&b"tools/call"[..]));
        assert_eq!(found.name.as_deref(), Some(&b"product_get"[..]));
        assert_eq!(found.authorization.as_deref(), Some(&b"Bearer abc"[..]));
        let mut params = found.params.clone();
        params.sort();
        assert_eq!(params, vec![("region".to_owned(), b"eu".to_vec()), ("sku".to_owned(), b"TEA-001".to_vec())]);
        assert_eq!(found.duplicate, None);

        let none = transport_headers(&headers(&[("host", "127.0.0.1:1"), ("x-mcp-method", "tools/call")]));
        assert!(none.protocol_version.is_none() && none.method.is_none() && none.name.is_none());
        assert!(none.authorization.is_none() && none.params.is_empty() && none.duplicate.is_none());
    }

    #[test]
    fn a_repeated_routing_or_authorization_header_is_flagged() {
        for (name, display) in
            [("mcp-protocol-version", "MCP-Protocol-Version"), ("mcp-method", "Mcp-Method"), ("mcp-name", "Mcp-Name")]
        {
            let found = transport_headers(&headers(&[(name, "first"), ("mcp-param-x", "1"), (name, "second")]));
            assert_eq!(found.duplicate.as_deref(), Some(display), "{name}");
            let kept = [&found.protocol_version, &found.method, &found.name];
            assert_eq!(
                kept.iter().filter(|v| v.as_deref() == Some(&b"first"[..])).count(),
                1,
                "{name}: first value kept"
            );
            assert!(kept.iter().all(|v| v.as_deref() != Some(&b"second"[..])), "{name}");
        }
        // The first repeated header in the check's order is the one named.
        let both = transport_headers(&headers(&[
            ("mcp-name", "a"),
            ("mcp-name", "b"),
            ("mcp-method", "c"),
            ("mcp-method", "d"),
        ]));
        assert_eq!(both.duplicate.as_deref(), Some("Mcp-Method"));
        // Two Authorization headers: an empty credential, which authentication refuses.
        let twice = transport_headers(&headers(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]));
        assert_eq!(twice.authorization.as_deref(), Some(&b""[..]));
    }
}
