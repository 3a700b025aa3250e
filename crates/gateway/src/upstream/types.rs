//! What the upstream client takes and gives: the era an upstream speaks, what it declared,
//! the lists and relayed methods, one relayed request and its reply, and the client's errors.

use palisade_wire::{PROTOCOL_VERSION, ProtocolError};
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::credentials::{CallerContext, CredentialError};

/// The era an upstream was found to speak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Era {
    /// 2026-07-28: no sessions, `_meta` on every request.
    Modern,
    /// The session wire, with the version `initialize` negotiated.
    Legacy(String),
}

impl std::fmt::Display for Era {
    /// The protocol version spoken: `2026-07-28`, or the negotiated 2025-era version.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Modern => f.write_str(PROTOCOL_VERSION),
            Self::Legacy(version) => f.write_str(version),
        }
    }
}

/// What connecting learned.
#[derive(Debug, Clone)]
pub struct UpstreamInfo {
    /// The era spoken.
    pub era: Era,
    /// The upstream's server capabilities, as sent.
    pub capabilities: Value,
    /// The upstream's implementation info, as sent (`Null` when it sent none).
    pub server_info: Value,
    /// The upstream's instructions, as sent.
    pub instructions: Option<String>,
}

/// A list an upstream serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// `tools/list` → `tools`.
    Tools,
    /// `prompts/list` → `prompts`.
    Prompts,
    /// `resources/list` → `resources`.
    Resources,
    /// `resources/templates/list` → `resourceTemplates`.
    ResourceTemplates,
}

impl ListKind {
    /// The list method.
    pub fn method(self) -> &'static str {
        match self {
            Self::Tools => "tools/list",
            Self::Prompts => "prompts/list",
            Self::Resources => "resources/list",
            Self::ResourceTemplates => "resources/templates/list",
        }
    }

    /// The result member holding the items.
    pub fn field(self) -> &'static str {
        match self {
            Self::Tools => "tools",
            Self::Prompts => "prompts",
            Self::Resources => "resources",
            Self::ResourceTemplates => "resourceTemplates",
        }
    }
}

/// What an upstream said of how long a list stays fresh and for whom (2026-07-28 `ttlMs` and
/// `cacheScope`; the most restrictive of its pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ListCache {
    /// How long it stays fresh, in ms; `None`: the upstream gives no bound (a 2025-era one,
    /// whose lists carry no caching fields and which announces changes).
    pub ttl_ms: Option<u64>,
    /// It may vary by authorization (`cacheScope: private`).
    pub private: bool,
}

impl ListCache {
    /// A page's: a 2026-07-28 answer without a `ttlMs`, or with a negative one, is fresh for
    /// 0 ms and one whose `cacheScope` is not `public` is private (the spec's reading of an
    /// absent TTL, and the restrictive reading of a scope). A 2025-era answer gives no bound.
    pub fn of_page(era: &Era, result: &Map<String, Value>) -> Self {
        if *era != Era::Modern {
            return Self::default();
        }
        let ttl_ms = result.get("ttlMs").and_then(Value::as_f64).filter(|ttl| *ttl > 0.0).map_or(0, |ttl| ttl as u64);
        let private = result.get("cacheScope").and_then(Value::as_str) != Some("public");
        Self { ttl_ms: Some(ttl_ms), private }
    }

    /// The most restrictive of both: the shorter bound, private when either is.
    pub fn and(self, other: Self) -> Self {
        let ttl_ms = match (self.ttl_ms, other.ttl_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (one, None) | (None, one) => one,
        };
        Self { ttl_ms, private: self.private || other.private }
    }
}

/// The methods [`UpstreamClient::request`] relays.
pub const RELAYED_METHODS: &[&str] = &[
    "tools/call",
    "resources/read",
    "prompts/get",
    "completion/complete",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
];

/// The notifications that mean "list again".
pub const LIST_CHANGED: &[&str] =
    &["notifications/tools/list_changed", "notifications/prompts/list_changed", "notifications/resources/list_changed"];

/// What an upstream's change stream carries to the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// One of [`LIST_CHANGED`]: list again.
    ListChanged(String),
    /// `notifications/resources/updated`: the resource at this (upstream) URI changed.
    ResourceUpdated(String),
}

impl Change {
    /// The change a notification announces, if it is one (`frame`: the whole notification).
    pub fn of(method: &str, frame: &Value) -> Option<Self> {
        if LIST_CHANGED.contains(&method) {
            return Some(Self::ListChanged(method.to_owned()));
        }
        if method != "notifications/resources/updated" {
            return None;
        }
        let uri = frame.pointer("/params/uri").and_then(Value::as_str)?;
        Some(Self::ResourceUpdated(uri.to_owned()))
    }
}

/// One request made for a caller.
pub struct UpstreamRequest<'a> {
    /// One of [`RELAYED_METHODS`].
    pub method: &'a str,
    /// The params to send, names already mapped to the upstream's own. The client adds the
    /// protocol `_meta` the era needs, keeping the other `_meta` keys (such as `progressToken`).
    pub params: Map<String, Value>,
    /// Who the request is made for; `partition` keys the 2025-era session.
    pub caller: CallerContext<'a>,
    /// The caller's declared capabilities: 2026-07-28 sends them in `_meta`; the 2025 era
    /// declares them in the `initialize` that opens the caller's session.
    pub client_capabilities: Option<Value>,
    /// Where to relay progress and log notifications the upstream sends on the answer's event
    /// stream, as raw JSON-RPC notification objects.
    pub notifications: Option<mpsc::Sender<Value>>,
    /// Where the upstream's server-to-client requests during this call go (sampling,
    /// elicitation, roots); `None`: refused to the upstream with -32601.
    pub asks: Option<super::asks::Asks>,
    /// Cancelling it abandons the exchange ([`UpstreamError::Cancelled`]).
    pub cancel: CancellationToken,
}

/// An upstream's answer to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamReply {
    /// A complete result object (exactly as sent, minus nothing).
    Result(Map<String, Value>),
    /// `resultType` `input_required`: the `inputRequests` and the upstream's `requestState`,
    /// raw.
    InputRequired {
        /// The input requests, by key (empty when the upstream sent only a state).
        input_requests: Map<String, Value>,
        /// The upstream's opaque state, to be echoed on the retry.
        request_state: Option<Value>,
    },
    /// A JSON-RPC error the upstream answered: its code and message (control characters
    /// replaced, at most 200 characters); `data` is dropped, being upstream-controlled content
    /// that must not reach clients unreviewed.
    Error {
        /// The upstream's error code.
        code: i64,
        /// The upstream's message, sanitized.
        message: String,
        /// For -32021 only: the capabilities the upstream requires (its data's
        /// `requiredCapabilities` object, at most 4 KiB).
        required_capabilities: Option<Value>,
    },
}

/// Why a call to an upstream failed. Texts are fixed: no upstream body, no secret.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The upstream is in backoff after consecutive failures.
    #[error("upstream is in backoff after repeated failures")]
    Unhealthy,
    /// No complete answer within the request timeout.
    #[error("upstream did not answer in time")]
    Timeout,
    /// The answer (or a listing) exceeded its limit.
    #[error("upstream answer exceeds the configured limit")]
    TooLarge,
    /// The upstream could not be reached, or the exchange broke off.
    #[error("upstream unavailable: {0}")]
    Unavailable(String),
    /// The upstream answered something that is not the protocol.
    #[error("upstream protocol error: {0}")]
    Protocol(String),
    /// The upstream answered an HTTP status that is not an answer.
    #[error("upstream answered HTTP status {0}")]
    Status(u16),
    /// The gateway's credential for the upstream could not be had.
    #[error(transparent)]
    Credential(CredentialError),
    /// The upstream needs scopes the gateway's credential does not have (and could not get).
    #[error("upstream requires scopes the gateway's credential lacks")]
    InsufficientScope(Vec<String>),
    /// The caller cancelled the request.
    #[error("the request was cancelled")]
    Cancelled,
    /// The gateway's own policy refused the call before it reached the upstream (a stdio
    /// upstream's process cap, an unapproved or changed launch): not the upstream's failure.
    #[error("refused by the gateway: {0}")]
    Refused(String),
    /// The upstream's cap on requests in flight (`max_in_flight`) is reached: refused at once,
    /// as rate limited (the caller retries shortly).
    #[error("the upstream's requests in flight are at their cap")]
    Busy,
}

/// The wait a call refused by an upstream's cap on requests in flight is told to keep: the
/// calls in flight hold no date, so a short fixed one.
pub const BUSY_RETRY_AFTER_MS: u64 = 1000;

impl UpstreamError {
    /// The error's kind, a metric label (`palisade_upstream_errors_total{kind}`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unhealthy => "unhealthy",
            Self::Timeout => "timeout",
            Self::TooLarge => "too_large",
            Self::Unavailable(_) => "unavailable",
            Self::Protocol(_) => "protocol",
            Self::Status(_) => "status",
            Self::Credential(_) => "credential",
            Self::InsufficientScope(_) => "insufficient_scope",
            Self::Cancelled => "cancelled",
            Self::Refused(_) => "refused",
            Self::Busy => "busy",
        }
    }

    /// The JSON-RPC error a caller sees. The catalogue's internal-style errors carry fixed
    /// messages only, so the cause is logged here with the upstream id, and the caller gets:
    /// a timeout as [`ProtocolError::Timeout`]; an upstream that is unreachable, in backoff,
    /// refusing the gateway's credential or answering an error status as
    /// [`ProtocolError::Unavailable`]; an answer that broke the protocol or its size limit, or
    /// a cancelled request, as [`ProtocolError::Internal`]; a call past the upstream's cap on
    /// requests in flight as [`ProtocolError::RateLimited`].
    pub fn to_protocol_error(&self, upstream_id: &str) -> ProtocolError {
        if matches!(self, Self::Unhealthy) {
            // Refused at once during a backoff whose cause was logged when it happened.
            tracing::debug!(upstream = upstream_id, "upstream call refused during backoff");
        } else if matches!(self, Self::Busy) {
            tracing::info!(upstream = upstream_id, "upstream call refused: requests in flight at their cap");
        } else {
            tracing::warn!(upstream = upstream_id, error = %self, "upstream call failed");
        }
        match self {
            Self::Timeout => ProtocolError::Timeout,
            Self::Unhealthy
            | Self::Unavailable(_)
            | Self::Status(_)
            | Self::Credential(_)
            | Self::InsufficientScope(_)
            | Self::Refused(_) => ProtocolError::Unavailable,
            Self::TooLarge | Self::Protocol(_) | Self::Cancelled => ProtocolError::Internal,
            Self::Busy => ProtocolError::RateLimited { retry_after_ms: BUSY_RETRY_AFTER_MS },
        }
    }

    /// Whether this counts as a failure of the upstream for its health.
    pub(super) fn is_upstream_failure(&self) -> bool {
        match self {
            Self::Unavailable(_) | Self::Timeout | Self::Protocol(_) => true,
            Self::Status(status) => *status >= 500,
            Self::Unhealthy
            | Self::TooLarge
            | Self::Credential(_)
            | Self::InsufficientScope(_)
            | Self::Cancelled
            | Self::Refused(_)
            | Self::Busy => false,
        }
    }
}
