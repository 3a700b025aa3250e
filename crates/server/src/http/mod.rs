//! Streamable HTTP transport (2026-07-28): `POST /mcp`, one JSON-RPC message per POST, the
//! answer as JSON or as an SSE stream scoped to that request. When the 2025-era wire is on, the
//! same endpoint hands session-era traffic (initialize, `Mcp-Session-Id`, the GET stream, session
//! DELETE) to `legacy.rs`, which feeds the same pipeline.
//!
//! Checked here, before any byte reaches the pipeline: `Host` (once; an absolute-form target's
//! authority too) and `Origin` (once) against the allow-lists (DNS rebinding, 403), header count
//! and size (431), method (405), `Accept` (406), `Content-Type` (415), body size (413) and body
//! arrival time (408). Each such refusal is counted for the audit log (`refusals.rs`) and
//! answered with its entry of the error catalogue (`palisade_wire::ProtocolError`: status, code
//! and fixed message from one place; the 405 alone has no JSON-RPC body, only `Allow: POST`).
//! Closing the response stream cancels the request's work.
//!
//! `/healthz` and `/readyz` are answered on every listener without those checks; `/metrics` only
//! where [`ServeOptions`] puts it (by default nowhere: on a separate listener the operator keeps
//! private, or on the public one when asked for explicitly), always behind them. The operator's
//! private listener also answers `/readyz/detail` (readiness as JSON with the application's
//! detail: the gateway's upstreams), behind the same checks.
//!
//! [`serve`] runs its own accept loop (hyper's HTTP/1.1 and HTTP/2 through `hyper_util`'s auto
//! builder) so that no connection is held by a slow or idle client: a header read timeout, a
//! body read timeout, an idle timeout and a cap on open connections
//! ([`ServerConfig`](crate::ServerConfig)).

mod endpoint;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::response::Response;
use axum::routing::{any, get};
use futures::future::BoxFuture;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::Server;
use crate::http_response::HttpState;
use crate::refusals::Reason;

use endpoint::{authorization_endpoint, mcp_endpoint, metrics, readyz, readyz_detail};

/// Why the HTTP transport could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Unauthenticated mode on a non-loopback address.
    #[error("refusing to listen on {0}: the server is unauthenticated, which is allowed on loopback addresses only")]
    UnauthenticatedNonLoopback(SocketAddr),
    /// A transport limit of the configuration is zero.
    #[error("invalid transport configuration: {0} must not be zero")]
    ZeroLimit(&'static str),
    /// Binding or serving failed.
    #[error("listener error: {0}")]
    Io(#[from] std::io::Error),
}

/// Binds `addr`, refusing a non-loopback address while the server is unauthenticated.
pub async fn bind(server: &Server, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    if server.authenticator().is_unauthenticated() && !addr.ip().is_loopback() {
        return Err(ServeError::UnauthenticatedNonLoopback(addr));
    }
    Ok(TcpListener::bind(addr).await?)
}

/// How long [`serve`] waits, once shutdown began, for open connections to finish their
/// requests; connections still open then are closed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// HTTP/2: a PING when the connection has been quiet this long, and the connection closed when
/// its acknowledgement takes longer than that (a peer that vanished under an open stream).
const H2_KEEP_ALIVE: Duration = Duration::from_secs(20);

/// The per-connection limits of [`serve`], checked once.
#[derive(Clone, Copy)]
struct ConnectionLimits {
    header_read_timeout: Duration,
    idle_timeout: Duration,
    max_connections: usize,
}

impl ConnectionLimits {
    fn of(config: &crate::ServerConfig) -> Result<Self, ServeError> {
        let nonzero =
            |duration: Duration, name| if duration.is_zero() { Err(ServeError::ZeroLimit(name)) } else { Ok(()) };
        nonzero(config.header_read_timeout, "header_read_timeout")?;
        nonzero(config.body_read_timeout, "body_read_timeout")?;
        nonzero(config.idle_timeout, "idle_timeout")?;
        nonzero(config.transport_refusal_interval, "transport_refusal_interval")?;
        if config.max_connections == 0 {
            return Err(ServeError::ZeroLimit("max_connections"));
        }
        Ok(Self {
            header_read_timeout: config.header_read_timeout,
            idle_timeout: config.idle_timeout,
            // A semaphore holds at most `Semaphore::MAX_PERMITS`.
            max_connections: config.max_connections.min(Semaphore::MAX_PERMITS),
        })
    }
}

/// Where `/metrics` is answered ([`ServeOptions::metrics`]).
#[derive(Debug, Default)]
pub enum MetricsExposure {
    /// Nowhere: the public listener answers `/metrics` with 404. The default, so that a server
    /// whose operator configured nothing publishes no operational detail.
    #[default]
    Off,
    /// On the public listener, behind the same `Host`/`Origin` checks as `/mcp`: the operator
    /// asked for it explicitly.
    Public,
    /// On this separate listener (with `/healthz` and `/readyz`), which the operator keeps
    /// private (a loopback or internal address, a firewall); the public listener answers
    /// `/metrics` with 404.
    Listener(TcpListener),
}

/// What [`serve_with`] serves besides `/mcp` on the public listener.
#[derive(Debug, Default)]
pub struct ServeOptions {
    /// Where `/metrics` is answered. Default: nowhere.
    pub metrics: MetricsExposure,
}

impl ServeOptions {
    /// Options with `/metrics` (and the health endpoints) on a listener bound at `metrics_listen`
    /// when it is `Some`, and `/metrics` nowhere when it is `None`; the public listener never
    /// answers `/metrics` either way. This is what `palisade serve` calls with its
    /// `metrics_listen` setting (`PALISADE_METRICS_LISTEN`, `--metrics-listen`):
    ///
    /// ```no_run
    /// # async fn run(server: std::sync::Arc<palisade_server::Server>, listen: std::net::SocketAddr,
    /// #     metrics_listen: Option<std::net::SocketAddr>) -> Result<(), palisade_server::http::ServeError> {
    /// use palisade_server::http::{self, ServeOptions};
    /// let listener = http::bind(&server, listen).await?;
    /// let options = ServeOptions::bind_metrics(metrics_listen).await?;
    /// http::serve_with(server, listener, options, std::future::pending()).await
    /// # }
    /// ```
    ///
    /// The metrics listener carries no authentication at all (Prometheus scrapes it as is), so
    /// it may be bound on any address, unauthenticated mode or not: keeping it private is the
    /// operator's part. Binding fails with [`ServeError::Io`].
    pub async fn bind_metrics(metrics_listen: Option<SocketAddr>) -> Result<Self, ServeError> {
        let metrics = match metrics_listen {
            Some(address) => MetricsExposure::Listener(TcpListener::bind(address).await?),
            None => MetricsExposure::Off,
        };
        Ok(Self { metrics })
    }
}

/// [`serve_with`] with the default [`ServeOptions`]: `/mcp` and the health endpoints, no
/// `/metrics`.
pub async fn serve(
    server: Arc<Server>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_with(server, listener, ServeOptions::default(), shutdown).await
}

/// Serves until `shutdown` resolves; then it stops accepting, open listen streams end with
/// their `complete` result and in-flight requests finish (for at most 30 s), and the pending
/// transport refusals are written to the audit log.
///
/// Each accepted connection is served by hyper (HTTP/1.1, or HTTP/2 with prior knowledge) with
/// `TCP_NODELAY`, and closed when it sends no complete request head within
/// [`header_read_timeout`](crate::ServerConfig::header_read_timeout) or has no request in flight
/// for [`idle_timeout`](crate::ServerConfig::idle_timeout). At
/// [`max_connections`](crate::ServerConfig::max_connections) open connections the loop accepts
/// nothing until one closes.
///
/// `options` says where `/metrics` is answered ([`MetricsExposure`]). A metrics listener is
/// served with the same limits (its own connection cap of `max_connections`) and answers only
/// `/metrics`, `/healthz`, `/readyz` and `/readyz/detail` (anything else 404).
pub async fn serve_with(
    server: Arc<Server>,
    listener: TcpListener,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let local = listener.local_addr()?;
    if server.authenticator().is_unauthenticated() && !local.ip().is_loopback() {
        return Err(ServeError::UnauthenticatedNonLoopback(local));
    }
    let limits = ConnectionLimits::of(server.config())?;
    let token = server.shutdown_token().clone();
    let (metrics_listener, routes) = match options.metrics {
        MetricsExposure::Off => (None, Routes::Public { metrics: false }),
        MetricsExposure::Public => (None, Routes::Public { metrics: true }),
        MetricsExposure::Listener(listener) => (Some(listener), Routes::Public { metrics: false }),
    };
    let metrics_served = match metrics_listener {
        Some(listener) => {
            let local = listener.local_addr()?;
            let (router, state) = router_with_state(server.clone(), local, Routes::Operator);
            let endpoint = Endpoint { state, router, mcp: false };
            let stop = token.clone();
            Some(tokio::spawn(async move {
                let graceful = GracefulShutdown::new();
                let force_close = CancellationToken::new();
                accept_until(listener, "metrics", endpoint, limits, &graceful, &force_close, stop.cancelled_owned())
                    .await;
                if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await.is_err() {
                    force_close.cancel();
                }
            }))
        }
        None => None,
    };
    let (router, state) = router_with_state(server.clone(), local, routes);
    let endpoint = Endpoint { state, router, mcp: true };
    let graceful = GracefulShutdown::new();
    // Cancelled when the shutdown grace has passed: connections still open are closed.
    let force_close = CancellationToken::new();
    accept_until(listener, "public", endpoint, limits, &graceful, &force_close, shutdown).await;
    // No new connections; listen streams end with `complete`; open connections finish the
    // requests they are serving (HTTP/1.1 closes after the current response, HTTP/2 sends
    // GOAWAY), for at most the grace period. The metrics listener stops on the same token.
    token.cancel();
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open {} s after shutdown began: closing them", SHUTDOWN_GRACE.as_secs());
        force_close.cancel();
    }
    if let Some(metrics_served) = metrics_served
        && let Err(error) = metrics_served.await
    {
        tracing::error!(%error, "the metrics listener's task failed");
    }
    server.transport_refusals().flush(server.clock().now_unsigned_ms()).await;
    Ok(())
}

/// Accepts connections on `listener` and serves each with `endpoint` until `shutdown`
/// resolves; then the listener is closed (its connections are `graceful`'s to wait for).
async fn accept_until(
    listener: TcpListener,
    name: &'static str,
    endpoint: Endpoint,
    limits: ConnectionLimits,
    graceful: &GracefulShutdown,
    force_close: &CancellationToken,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let builder = Arc::new(connection_builder(&limits));
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    // When the connection cap was reached, while it holds.
    let mut saturated: Option<std::time::Instant> = None;
    loop {
        let permit = match open.clone().try_acquire_owned() {
            Ok(permit) => {
                if let Some(since) = saturated.take() {
                    tracing::info!(
                        listener = name,
                        waited_ms = since.elapsed().as_millis(),
                        "below the connection limit again: accepting"
                    );
                }
                permit
            }
            Err(_) => {
                if saturated.is_none() {
                    saturated = Some(std::time::Instant::now());
                    tracing::warn!(
                        listener = name,
                        "connection limit reached ({}): not accepting until one closes",
                        limits.max_connections
                    );
                }
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    permit = open.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                }
            }
        };
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    drop(permit);
                    // A connection that failed before it was accepted is the client's problem;
                    // anything else (out of file descriptors) is retried after a pause.
                    if !is_connection_error(&error) {
                        tracing::error!(listener = name, %error, "accepting a connection failed; retrying in 1 s");
                        tokio::select! {
                            () = &mut shutdown => break,
                            () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                    continue;
                }
            },
        };
        // Nagle's algorithm off: each JSON reply and SSE event is one write that should leave at
        // once; with it on, an event written while the previous one is unacknowledged waits for
        // the client's (possibly delayed) ACK.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY on an accepted connection");
        }
        let connection = Connection {
            stream,
            peer,
            permit,
            endpoint: endpoint.clone(),
            builder: builder.clone(),
            limits,
            force_close: force_close.clone(),
        };
        tokio::spawn(connection.run(graceful.watcher()));
    }
    drop(listener);
}

/// hyper's HTTP/1.1 and HTTP/2 connection settings, shared by every connection.
fn connection_builder(limits: &ConnectionLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper starts this timer for every request head, including when an HTTP/1.1 connection
    // goes idle after a response (so it also closes idle keep-alive connections; tested).
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(H2_KEEP_ALIVE).keep_alive_timeout(H2_KEEP_ALIVE);
    builder
}

/// Failures of one incoming connection that say nothing about the listener.
fn is_connection_error(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// One accepted connection, until it is served.
struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    /// Held while the connection is open: the connection cap.
    permit: OwnedSemaphorePermit,
    endpoint: Endpoint,
    builder: Arc<auto::Builder<TokioExecutor>>,
    limits: ConnectionLimits,
    force_close: CancellationToken,
}

impl Connection {
    /// Serves the connection until it ends, is idle too long, or shutdown's grace has passed.
    async fn run(self, watcher: hyper_util::server::graceful::Watcher) {
        let Connection { stream, peer, permit: _permit, endpoint, builder, limits, force_close } = self;
        let activity = Arc::new(Activity::new());
        let state = endpoint.state.clone();
        let service = ConnectionService { endpoint, peer, activity: activity.clone() };
        let io = TokioIo::new(ActivityStream { stream, activity: activity.clone() });
        let connection = watcher.watch(builder.serve_connection(io, service));
        tokio::select! {
            served = connection => {
                let Err(error) = served else { return };
                let Some(error) = error.downcast_ref::<hyper::Error>() else { return };
                // An HTTP/1.1 request head hyper refused or gave up waiting for. hyper also
                // times out an idle keep-alive connection this way: only a head begun counts.
                let reason = if error.is_timeout() {
                    activity.received_while_idle().then_some(Reason::HeaderTimeout)
                } else if error.is_parse_too_large() {
                    Some(Reason::HeadersTooLarge)
                } else if error.is_parse() {
                    Some(Reason::MalformedHttp)
                } else {
                    None
                };
                tracing::debug!(%error, "connection ended with an error");
                if let Some(reason) = reason {
                    state.refused(reason, Some(peer.ip()));
                }
            }
            first_head = activity.idle(limits.header_read_timeout, limits.idle_timeout) => {
                // A first request head begun and not finished in time (HTTP/2, or the bytes
                // before hyper knows the version) is a refusal; a quiet connection is not.
                if first_head && activity.received_while_idle() {
                    state.refused(Reason::HeaderTimeout, Some(peer.ip()));
                }
                tracing::debug!(first_head, "closing an idle connection");
            }
            () = force_close.cancelled() => {}
        }
    }
}

/// What one connection is doing, shared by its service, its stream and its idle watch.
struct Activity {
    opened: tokio::time::Instant,
    /// Requests whose response has not ended.
    in_flight: AtomicUsize,
    /// Requests received so far.
    started: AtomicU64,
    /// When the last request ended, in milliseconds after `opened`.
    idle_since_ms: AtomicU64,
    /// Bytes arrived while no request was in flight: the head of a next request has begun.
    received_while_idle: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: tokio::time::Instant::now(),
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(0),
            received_while_idle: AtomicBool::new(false),
        }
    }

    /// A request arrived; it is in flight until the guard is dropped (with its response body).
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        self.received_while_idle.store(false, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// Bytes arrived.
    fn received(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            self.received_while_idle.store(true, Ordering::Relaxed);
        }
    }

    fn received_while_idle(&self) -> bool {
        self.received_while_idle.load(Ordering::SeqCst)
    }

    /// Resolves when the connection should be closed: no request received within `first_head`
    /// (or `idle`, if shorter) of the accept (then `true`), or no request in flight for `idle`
    /// (then `false`). A deadline only ever moves later as requests come and go, so sleeping
    /// until it and recomputing it from the current state on every wake-up never closes early
    /// or late.
    async fn idle(&self, first_head: Duration, idle: Duration) -> bool {
        loop {
            let now = tokio::time::Instant::now();
            let busy = self.in_flight.load(Ordering::SeqCst) > 0;
            let first = self.started.load(Ordering::SeqCst) == 0;
            let deadline = if busy {
                now + idle
            } else if first {
                self.opened + first_head.min(idle)
            } else {
                self.opened + Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst)) + idle
            };
            if !busy && deadline <= now && self.in_flight.load(Ordering::SeqCst) == 0 {
                return first;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A request in flight on its connection.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        if activity.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            let since = u64::try_from(activity.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
            activity.idle_since_ms.store(since, Ordering::SeqCst);
            activity.received_while_idle.store(false, Ordering::SeqCst);
        }
    }
}

/// The accepted TCP stream, noting when bytes arrive.
struct ActivityStream {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl tokio::io::AsyncRead for ActivityStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.received();
        }
        polled
    }
}

impl tokio::io::AsyncWrite for ActivityStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The hyper service of one connection: the [`Endpoint`], with the peer's address as the
/// request's `ConnectInfo` and each request counted in flight until its response body ends.
#[derive(Clone)]
struct ConnectionService {
    endpoint: Endpoint,
    peer: SocketAddr,
    activity: Arc<Activity>,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for ConnectionService {
    type Response = Response;
    type Error = Infallible;
    type Future = Served;

    fn call(&self, request: hyper::Request<hyper::body::Incoming>) -> Served {
        let in_flight = self.activity.begin();
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(ConnectInfo(self.peer));
        Served { response: self.endpoint.serve(request), in_flight: Some(in_flight) }
    }
}

/// A response being made; the request stays in flight until its body has been sent (or
/// dropped).
struct Served {
    response: BoxFuture<'static, Response>,
    in_flight: Option<InFlight>,
}

impl std::future::Future for Served {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let response = std::task::ready!(self.response.as_mut().poll(cx));
        let Some(in_flight) = self.in_flight.take() else { return std::task::Poll::Ready(Ok(response)) };
        std::task::Poll::Ready(Ok(response.map(|body| Body::new(HeldBody { body, _in_flight: in_flight }))))
    }
}

/// A response body holding its request in flight.
struct HeldBody {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for HeldBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The router of the public listener: `/mcp` for MCP, `/healthz` and `/readyz`, the OAuth
/// metadata and development authorization server paths when configured, everything else 404 —
/// `/metrics` included (serve [`metrics_router`] on a private listener for it).
///
/// Transport refusals are counted for the audit log per peer address when the request carries
/// `ConnectInfo<SocketAddr>` (e.g. served with
/// `into_make_service_with_connect_info::<SocketAddr>()`), else under source `unknown`; they are
/// flushed periodically when this is called inside a Tokio runtime.
pub fn router(server: Arc<Server>, local: SocketAddr) -> Router {
    router_with_state(server, local, Routes::Public { metrics: false }).0
}

/// The router of an operator's private listener bound at `local`: `/metrics`, `/healthz`,
/// `/readyz` and `/readyz/detail`, everything else 404 (what [`serve_with`] serves on a metrics listener). `/metrics`
/// is held to `Host`/`Origin` checks that a scraper passes and a DNS-rebinding page does not:
/// `Host` must be sent once and be this listener's loopback names with its port, an IP literal
/// (a rebinding page's requests carry its own DNS name), or an allow-listed host
/// ([`ServerConfig::allowed_hosts`](crate::ServerConfig::allowed_hosts)); a present `Origin`
/// must be allowed as on the public listener.
pub fn metrics_router(server: Arc<Server>, local: SocketAddr) -> Router {
    router_with_state(server, local, Routes::Operator).0
}

/// Which routes a listener answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Routes {
    /// The public listener: `/mcp`, health, OAuth paths, and `/metrics` only when `metrics`.
    Public { metrics: bool },
    /// An operator's listener: `/metrics` and health only.
    Operator,
}

/// What [`serve`] answers with: requests for `/mcp` (nearly all of them) go straight to the
/// endpoint, everything else through the router. Same behaviour as the router's own `/mcp`
/// route, minus its per-request costs: the route lookup and a boxed handler service.
#[derive(Clone)]
struct Endpoint {
    state: Arc<HttpState>,
    router: Router,
    /// Whether `/mcp` is served (the public listener).
    mcp: bool,
}

impl Endpoint {
    fn serve(&self, request: axum::extract::Request) -> BoxFuture<'static, Response> {
        if self.mcp && request.uri().path() == "/mcp" {
            return Box::pin(mcp_endpoint(State(self.state.clone()), request));
        }
        let router = self.router.clone();
        Box::pin(async move {
            match tower::ServiceExt::oneshot(router, request).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        })
    }
}

fn router_with_state(server: Arc<Server>, local: SocketAddr, routes: Routes) -> (Router, Arc<HttpState>) {
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
    crate::server::spawn_refusal_flusher(&server);
    let ip_literal_hosts = routes == Routes::Operator;
    let state = Arc::new(HttpState { server, allowed_hosts, allowed_origins, ip_literal_hosts });
    // The health endpoints answer without the Host/Origin checks: their answers are fixed words
    // a rebinding page learns nothing from, and load balancers and orchestrators probe them with
    // whatever Host they address the instance by (often its bare IP).
    let health = Router::new().route("/healthz", get(|| async { "ok" })).route("/readyz", get(readyz));
    if routes == Routes::Operator {
        let operator = health.route("/metrics", get(metrics)).route("/readyz/detail", get(readyz_detail));
        return (operator.with_state(state.clone()), state);
    }
    let mut router = health.route("/mcp", any(mcp_endpoint));
    if routes == (Routes::Public { metrics: true }) {
        router = router.route("/metrics", get(metrics));
    }
    // RFC 9728 Protected Resource Metadata, at the plain and the path-suffixed well-known URIs.
    if let Some((document, paths)) = metadata {
        let document = Arc::new(document);
        for path in paths {
            let document = document.clone();
            router = router.route(&path, get(move || async move { axum::Json((*document).clone()) }));
        }
    }
    // The development authorization server's paths (metadata, authorize, token, register, JWKS).
    if let Some(authorization_server) = state.server.config().authorization_server.clone() {
        for path in authorization_server.paths() {
            let authorization_server = authorization_server.clone();
            router = router.route(
                &path,
                any(move |State(state): State<Arc<HttpState>>, request: axum::extract::Request| {
                    authorization_endpoint(state, authorization_server.clone(), request)
                }),
            );
        }
    }
    (router.with_state(state.clone()), state)
}

#[cfg(test)]
mod tests;
