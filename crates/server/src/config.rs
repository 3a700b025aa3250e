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
        }
    }
}

impl ServerConfig {
    /// The effective request timeout (never above the hard cap).
    pub fn effective_timeout(&self) -> Duration {
        self.request_timeout.min(REQUEST_TIMEOUT_HARD_CAP)
    }
}
