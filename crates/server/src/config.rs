//! Transport and pipeline limits, validated once: a `ServerConfig` that exists is a usable one.

use std::time::Duration;

/// The longest any single request may run, whatever the configuration says.
pub const REQUEST_TIMEOUT_HARD_CAP: Duration = Duration::from_secs(600);

/// Limits and policies of one server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest accepted request body (HTTP) or line (stdio), in bytes. Default 1 MiB.
    pub max_body_bytes: usize,
    /// Most request headers accepted. Default 64.
    pub max_header_count: usize,
    /// Largest total size of request headers, in bytes. Default 16 KiB.
    pub max_header_bytes: usize,
    /// How long a request may run before it is cancelled and answered `-32603`. Clamped to
    /// [`REQUEST_TIMEOUT_HARD_CAP`]. Listen streams are not subject to it.
    pub request_timeout: Duration,
    /// Interval of SSE keep-alive comments on open streams.
    pub keep_alive: Duration,
    /// How long an HTTP client has to send a request's whole header section, counted from the
    /// connection's accept (first request) or from the end of the previous response (hyper
    /// starts its header timer when an HTTP/1.1 connection goes idle, so this also bounds an
    /// idle keep-alive connection). Past it the connection is closed. Default 10 s.
    pub header_read_timeout: Duration,
    /// How long the whole request body may take to arrive once the headers are in; past it the
    /// request is answered `408` and the connection closed. Default 30 s.
    pub body_read_timeout: Duration,
    /// An HTTP connection with no request in flight for this long is closed (bytes that do not
    /// complete a request do not count as activity). Default 60 s.
    pub idle_timeout: Duration,
    /// Most HTTP connections open at once; at the cap the server stops accepting until one
    /// closes. Default 1024.
    pub max_connections: usize,
    /// How often the aggregated transport refusals (see the HTTP transport, `http`) are written to the
    /// audit log. Default 10 s.
    pub transport_refusal_interval: Duration,
    /// Extra `Host` values accepted besides the listener's own loopback names.
    pub allowed_hosts: Vec<String>,
    /// Extra `Origin` values accepted besides the listener's own loopback origins.
    pub allowed_origins: Vec<String>,
    /// Queue bound of one listen stream; a client that falls this far behind is disconnected
    /// with the graceful `complete` result (backpressure).
    pub listen_queue: usize,
    /// Most open streams (`subscriptions/listen`, and the 2025-era GET stream) one principal
    /// (issuer, subject, tenant, client) may hold on this instance; one more is refused. Default 8.
    pub max_streams_per_principal: usize,
    /// Most entries of one listen filter list (`taskIds`, `resourceSubscriptions`); a longer
    /// list is refused. Default 100.
    pub max_listen_filter_entries: usize,
    /// Items per page of every list method.
    pub page_size: usize,
    /// Lifetime of a sealed MRTR `requestState`.
    pub request_state_ttl: Duration,
    /// The 2025-era session wire beside 2026-07-28.
    pub legacy: LegacyConfig,
    /// With trace export on: whether a request's `params._meta.traceparent` is continued (its
    /// trace id becomes the request's audit trace id). `false`: every request starts a trace of
    /// its own, so callers cannot choose audit trace ids. Default `true`.
    pub continue_traces: bool,
    /// The development authorization server, served on the HTTP listener beside `/mcp` (its
    /// metadata, authorization, token, registration and JWKS paths). `None` (the default): no
    /// authorization server is served.
    pub authorization_server: Option<std::sync::Arc<palisade_auth::authorization_server::DevAuthorizationServer>>,
}

/// The 2025-era (initialize + `Mcp-Session-Id`) wire, served on the same endpoint beside the
/// stateless 2026-07-28 one. Sessions are never identity: see the session service, `sessions`.
#[derive(Debug, Clone)]
pub struct LegacyConfig {
    /// Whether the session wire is served at all. Off: such requests get the 2026-07-28 answers
    /// (404 + `-32601` for `initialize`, `-32022` for an old version header).
    pub enabled: bool,
    /// The revisions accepted at `initialize`, a non-empty subset of
    /// [`palisade_wire::LEGACY_VERSIONS`], newest first.
    pub versions: Vec<String>,
    /// A session dies after this long without a request.
    pub idle_timeout: Duration,
    /// A session dies this long after `initialize`, however active.
    pub absolute_timeout: Duration,
    /// How long a server-to-client request (sampling, elicitation, roots) waits for its answer.
    pub client_request_timeout: Duration,
    /// Most server-to-client rounds one request may take.
    pub max_rounds: usize,
}

impl Default for LegacyConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            versions: palisade_wire::LEGACY_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
            idle_timeout: Duration::from_secs(30 * 60),
            absolute_timeout: Duration::from_secs(12 * 60 * 60),
            client_request_timeout: Duration::from_secs(120),
            max_rounds: 8,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 1024 * 1024,
            max_header_count: 64,
            max_header_bytes: 16 * 1024,
            request_timeout: Duration::from_secs(60),
            keep_alive: Duration::from_secs(15),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            transport_refusal_interval: Duration::from_secs(10),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            listen_queue: 256,
            max_streams_per_principal: 8,
            max_listen_filter_entries: 100,
            page_size: 100,
            request_state_ttl: Duration::from_secs(600),
            legacy: LegacyConfig::default(),
            continue_traces: true,
            authorization_server: None,
        }
    }
}

impl ServerConfig {
    /// The effective request timeout (never above the hard cap).
    pub fn effective_timeout(&self) -> Duration {
        self.request_timeout.min(REQUEST_TIMEOUT_HARD_CAP)
    }
}
