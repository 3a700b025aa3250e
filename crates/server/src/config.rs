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
    /// Extra `Host` values accepted besides the listener's own loopback names.
    pub allowed_hosts: Vec<String>,
    /// Extra `Origin` values accepted besides the listener's own loopback origins.
    pub allowed_origins: Vec<String>,
    /// Queue bound of one listen stream; a client that falls this far behind is disconnected
    /// with the graceful `complete` result (backpressure).
    pub listen_queue: usize,
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
}

/// The 2025-era (initialize + `Mcp-Session-Id`) wire, served on the same endpoint beside the
/// stateless 2026-07-28 one. Sessions are never identity: see [`crate::sessions`].
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
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            listen_queue: 256,
            page_size: 100,
            request_state_ttl: Duration::from_secs(600),
            legacy: LegacyConfig::default(),
            continue_traces: true,
        }
    }
}

impl ServerConfig {
    /// The effective request timeout (never above the hard cap).
    pub fn effective_timeout(&self) -> Duration {
        self.request_timeout.min(REQUEST_TIMEOUT_HARD_CAP)
    }
}
