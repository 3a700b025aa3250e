//! `[limits]` and `[http]`: the transport's bounds and its extra accepted hosts and origins.

use serde::Deserialize;

use super::audit::seconds;
use super::error::{ConfigError, bad};
use super::keys;

/// `[limits]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Largest request body / stdio line.
    pub max_body_bytes: Option<usize>,
    /// Per-request timeout.
    pub request_timeout_secs: Option<u64>,
    /// Items per list page.
    pub page_size: Option<usize>,
    /// Seconds a client has to send a request's whole header section. Default 10.
    pub header_read_timeout_secs: Option<u64>,
    /// Seconds a request's whole body has to arrive in (else 408). Default 30.
    pub body_read_timeout_secs: Option<u64>,
    /// Seconds an HTTP connection may stay open with no request in flight. Default 60.
    pub idle_timeout_secs: Option<u64>,
    /// Most HTTP connections open at once. Default 1024.
    pub max_connections: Option<usize>,
    /// Most open listen and GET streams per principal on one instance. Default 8.
    pub max_streams_per_principal: Option<usize>,
    /// Most entries of one listen filter list (`taskIds`, `resourceSubscriptions`). Default 100.
    pub max_listen_filter_entries: Option<usize>,
}

/// `[http]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    /// Extra accepted `Host` values.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Extra accepted `Origin` values.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
}

/// The largest accepted `limits.max_connections`.
const MAX_CONNECTIONS: usize = 100_000;

/// Validated `[limits]`.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest body.
    pub max_body_bytes: usize,
    /// Request timeout.
    pub request_timeout_secs: u64,
    /// Page size.
    pub page_size: usize,
    /// Header read timeout.
    pub header_read_timeout_secs: u64,
    /// Body read timeout.
    pub body_read_timeout_secs: u64,
    /// Idle connection timeout.
    pub idle_timeout_secs: u64,
    /// Connection cap.
    pub max_connections: usize,
    /// Open streams per principal.
    pub max_streams_per_principal: usize,
    /// Entries per listen filter list.
    pub max_listen_filter_entries: usize,
}

/// Validates `[limits]`.
pub fn validate(raw: RawLimits) -> Result<Limits, ConfigError> {
    let max_body_bytes = raw.max_body_bytes.unwrap_or(1024 * 1024);
    if !(1024..=64 * 1024 * 1024).contains(&max_body_bytes) {
        return Err(bad(keys::LIMITS_MAX_BODY_BYTES, "must be between 1024 and 67108864"));
    }
    let request_timeout_secs = raw.request_timeout_secs.unwrap_or(60);
    if !(1..=600).contains(&request_timeout_secs) {
        return Err(bad(keys::LIMITS_REQUEST_TIMEOUT_SECS, "must be between 1 and 600"));
    }
    let page_size = raw.page_size.unwrap_or(100);
    if !(1..=1000).contains(&page_size) {
        return Err(bad(keys::LIMITS_PAGE_SIZE, "must be between 1 and 1000"));
    }
    let header_read_timeout_secs =
        seconds(raw.header_read_timeout_secs, 10, keys::LIMITS_HEADER_READ_TIMEOUT_SECS, 300)?;
    let body_read_timeout_secs = seconds(raw.body_read_timeout_secs, 30, keys::LIMITS_BODY_READ_TIMEOUT_SECS, 600)?;
    let idle_timeout_secs = seconds(raw.idle_timeout_secs, 60, keys::LIMITS_IDLE_TIMEOUT_SECS, 3600)?;
    let max_connections = raw.max_connections.unwrap_or(1024);
    if !(1..=MAX_CONNECTIONS).contains(&max_connections) {
        return Err(bad(keys::LIMITS_MAX_CONNECTIONS, format!("must be between 1 and {MAX_CONNECTIONS}")));
    }
    let bounded = |value: Option<usize>, default: usize, key: &str, max: usize| {
        let value = value.unwrap_or(default);
        if (1..=max).contains(&value) { Ok(value) } else { Err(bad(key, format!("must be between 1 and {max}"))) }
    };
    let max_streams_per_principal =
        bounded(raw.max_streams_per_principal, 8, keys::LIMITS_MAX_STREAMS_PER_PRINCIPAL, 1_000)?;
    let max_listen_filter_entries =
        bounded(raw.max_listen_filter_entries, 100, keys::LIMITS_MAX_LISTEN_FILTER_ENTRIES, 10_000)?;
    Ok(Limits {
        max_body_bytes,
        request_timeout_secs,
        page_size,
        header_read_timeout_secs,
        body_read_timeout_secs,
        idle_timeout_secs,
        max_connections,
        max_streams_per_principal,
        max_listen_filter_entries,
    })
}
