//! The protocol error catalogue: every error a client can receive, its JSON-RPC code and its HTTP
//! status, mapped in exactly one place (`code`, `http_status`, `to_wire`).

use serde_json::{Map, Value, json};

/// JSON-RPC and MCP error codes used on the wire.
pub mod codes {
    /// Invalid JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// Not a valid JSON-RPC request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// Unknown, removed or un-advertised method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid params: missing `_meta`, unknown tool/prompt, bad cursor, missing resource.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal error; never carries internal detail.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// A `Mcp-*` / `MCP-Protocol-Version` header is missing, malformed or differs from the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// The request needs a client capability it did not declare.
    pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
    /// The requested protocol version is not supported.
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
    /// The operation is switched off by the operator's disable authority (kill switch).
    pub const OPERATION_DISABLED: i64 = -32030;
    /// A delegation capability does not allow the request (Palisade's delegation, control C10).
    pub const DELEGATION_REFUSED: i64 = -32031;
    /// A consequential call under a delegation capability needs the principal's own approval.
    pub const APPROVAL_REQUIRED: i64 = -32032;
    /// The operator's policies do not allow this request.
    pub const POLICY_DENIED: i64 = -32033;
    /// An operator's rate limit, quota or concurrency cap refuses the request for now; the
    /// error's data says when to retry.
    pub const RATE_LIMITED: i64 = -32034;
}

/// Every error the protocol layer reports to a client.
///
/// Messages are fixed, client-safe strings; internal causes are logged by the caller and never
/// placed here.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    /// The frame is not valid JSON.
    #[error("parse error")]
    Parse,
    /// The frame is JSON but not an acceptable JSON-RPC request or notification.
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    /// The request body exceeds the configured limit (HTTP 413).
    #[error("request body too large")]
    PayloadTooLarge,
    /// HTTP: more than one `Host` header (HTTP 403, DNS rebinding defence).
    #[error("invalid request: more than one Host header")]
    RepeatedHost,
    /// HTTP: the `Host` (or the request target's authority) is absent or not allowed (HTTP 403).
    #[error("invalid request: Host is not allowed")]
    HostNotAllowed,
    /// HTTP: more than one `Origin` header (HTTP 403).
    #[error("invalid request: more than one Origin header")]
    RepeatedOrigin,
    /// HTTP: the `Origin` is not allowed (HTTP 403).
    #[error("invalid request: Origin is not allowed")]
    OriginNotAllowed,
    /// HTTP: too many request headers, or too many bytes of them (HTTP 431).
    #[error("invalid request: request headers too large")]
    HeadersTooLarge,
    /// HTTP: an `access_token` in the URL query; tokens travel in `Authorization` only (HTTP 400).
    #[error("invalid request: access tokens are not accepted in the URL")]
    TokenInUrl,
    /// HTTP: `Accept` allows neither `application/json` nor `text/event-stream` (HTTP 406).
    #[error("invalid request: Accept must allow application/json or text/event-stream")]
    NotAcceptable,
    /// HTTP: a request that can only be answered as an event stream (the 2025-era GET stream, a
    /// request needing the client's input) from a client whose `Accept` does not allow
    /// `text/event-stream` (HTTP 406).
    #[error("invalid request: Accept must allow text/event-stream")]
    EventStreamRequired,
    /// HTTP: `Content-Type` is absent, repeated or not `application/json` (HTTP 415).
    #[error("invalid request: Content-Type must be application/json")]
    UnsupportedMediaType,
    /// HTTP: the request body broke off or was malformed on the wire (HTTP 400).
    #[error("invalid request: the request body could not be read")]
    BodyUnreadable,
    /// HTTP: the request body did not arrive within the body read timeout (HTTP 408).
    #[error("invalid request: the request body did not arrive in time")]
    BodyTimeout,
    /// The caller already holds as many open streams as it may (HTTP 429).
    #[error("invalid request: too many open streams for this caller")]
    TooManyStreams,
    /// Unknown, removed or un-advertised method.
    #[error("method not found")]
    MethodNotFound {
        /// The method as the client sent it (never echoed to the client: it only decides whether
        /// the answer names the supported versions, for a method an earlier revision had).
        method: String,
    },
    /// A required `_meta` key is missing or malformed.
    #[error("invalid _meta: {0}")]
    InvalidMeta(String),
    /// Params are invalid for the method (unknown tool, bad cursor, bad arguments …).
    #[error("invalid params: {message}")]
    InvalidParams {
        /// Client-safe description.
        message: String,
        /// Optional structured detail.
        data: Option<Value>,
    },
    /// The resource does not exist (or is not visible to the caller).
    #[error("resource not found")]
    ResourceNotFound {
        /// The URI the client asked for.
        uri: String,
    },
    /// A transport header disagrees with the body, is missing or is malformed.
    #[error("header mismatch: {0}")]
    HeaderMismatch(String),
    /// The request needs a client capability it did not declare.
    #[error("missing required client capability")]
    MissingCapability {
        /// A ClientCapabilities object naming what is required.
        required: Value,
    },
    /// The protocol version is not one the server speaks.
    #[error("unsupported protocol version")]
    UnsupportedVersion {
        /// The version the client asked for.
        requested: String,
    },
    /// No valid credentials (HTTP 401; the transport adds the `WWW-Authenticate` challenge).
    #[error("authentication required")]
    Unauthenticated,
    /// Valid credentials without every scope the operation needs (HTTP 403).
    #[error("insufficient scope")]
    InsufficientScope {
        /// Every scope the operation needs.
        required: Vec<String>,
    },
    /// The `Mcp-Session-Id` (2025-era wire) names no live session of the caller: unknown, expired,
    /// deleted, or created by another principal (HTTP 404; the client starts a new session).
    #[error("session not found")]
    SessionNotFound,
    /// A dependency (store, issuer, authority) could not confirm the request: refused.
    #[error("temporarily unavailable")]
    Unavailable,
    /// The operator's disable authority has switched this operation off (kill switch). Carries
    /// no operator detail (target, reason) on purpose.
    #[error("operation disabled")]
    OperationDisabled,
    /// A delegation capability does not allow this request (a JSON-RPC error in HTTP 200): it is
    /// not valid for this caller (unknown, revoked, expired, held by another agent — one answer
    /// for all), the method, tool, resource or prompt is outside it, or its call budget is spent.
    /// `reason` is one fixed sentence.
    #[error("outside the delegated capability")]
    DelegationRefused {
        /// Why, as a fixed sentence (never a value from the request).
        reason: &'static str,
    },
    /// A consequential tool called under a delegation capability needs an approval of exactly
    /// this call from the principal's own client (in HTTP 200); the data names what to approve.
    #[error("the principal's approval is required")]
    ApprovalRequired {
        /// The capability's public id (SHA-256 of the reference, hex).
        capability: String,
        /// The tool.
        tool: String,
        /// SHA-256 (hex) of the call's RFC 8785 canonical arguments.
        arguments_sha256: String,
    },
    /// The operator's policies (Cedar, `[policies]`) do not allow this request (a JSON-RPC error
    /// in HTTP 200). `reason` is one fixed sentence; the policy text and ids are never sent
    /// (the audit record names the deciding policy ids).
    #[error("refused by operator policy")]
    PolicyDenied {
        /// Why, as a fixed sentence (never a value from the request or a policy).
        reason: &'static str,
    },
    /// An operator's rate limit, quota or upstream concurrency cap refuses the request for now
    /// (HTTP 429 with `Retry-After`; where the status is already sent, as on stdio or inside an
    /// event stream, the JSON-RPC error alone). Its data carries the wait, never the rule.
    #[error("rate limited")]
    RateLimited {
        /// Milliseconds until a retry can succeed (at least 1).
        retry_after_ms: u64,
    },
    /// The request did not finish within its time limit.
    #[error("request timed out")]
    Timeout,
    /// Anything else. The cause is logged server-side only.
    #[error("internal error")]
    Internal,
}

impl ProtocolError {
    /// Convenience constructor for [`ProtocolError::InvalidParams`] without data.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::InvalidParams { message: message.into(), data: None }
    }

    /// The JSON-RPC error code.
    pub fn code(&self) -> i64 {
        match self {
            Self::Parse => codes::PARSE_ERROR,
            Self::InvalidRequest(_)
            | Self::SessionNotFound
            | Self::PayloadTooLarge
            | Self::RepeatedHost
            | Self::HostNotAllowed
            | Self::RepeatedOrigin
            | Self::OriginNotAllowed
            | Self::HeadersTooLarge
            | Self::TokenInUrl
            | Self::NotAcceptable
            | Self::EventStreamRequired
            | Self::UnsupportedMediaType
            | Self::BodyUnreadable
            | Self::BodyTimeout
            | Self::TooManyStreams
            | Self::Unauthenticated
            | Self::InsufficientScope { .. } => codes::INVALID_REQUEST,
            Self::MethodNotFound { .. } => codes::METHOD_NOT_FOUND,
            Self::InvalidMeta(_) | Self::InvalidParams { .. } | Self::ResourceNotFound { .. } => codes::INVALID_PARAMS,
            Self::HeaderMismatch(_) => codes::HEADER_MISMATCH,
            Self::MissingCapability { .. } => codes::MISSING_REQUIRED_CLIENT_CAPABILITY,
            Self::UnsupportedVersion { .. } => codes::UNSUPPORTED_PROTOCOL_VERSION,
            Self::OperationDisabled => codes::OPERATION_DISABLED,
            Self::DelegationRefused { .. } => codes::DELEGATION_REFUSED,
            Self::ApprovalRequired { .. } => codes::APPROVAL_REQUIRED,
            Self::PolicyDenied { .. } => codes::POLICY_DENIED,
            Self::RateLimited { .. } => codes::RATE_LIMITED,
            Self::Timeout | Self::Internal | Self::Unavailable => codes::INTERNAL_ERROR,
        }
    }

    /// The HTTP status of a response that answers a JSON-RPC request with only this error.
    ///
    /// 401 and 403 mean what the MCP authorization spec says: no valid token (401, with the
    /// transport's `WWW-Authenticate` challenge) and `insufficient_scope` (403, with its
    /// challenge); 403 is also the transport's refusal of a foreign `Host` or `Origin`, refused
    /// before the body is read. A refusal of a well-formed, authenticated request (the kill
    /// switch, a delegation capability, the principal's approval) is the application's answer:
    /// a JSON-RPC error in a 200, so a client shows its code and message rather than an HTTP
    /// failure (a client reading 403 starts its authorization flow). See
    /// [`ProtocolError::http_status_without_response`] for messages no response can answer.
    ///
    /// A rate limit is the exception on purpose: 429 with `Retry-After` (the transport adds it
    /// from [`ProtocolError::retry_after_secs`]) is flow control every HTTP client, proxy and
    /// retry layer already understands, and the refusal is not about the operation but about
    /// *now*; the body is still the JSON-RPC error, whose data carries the wait in
    /// milliseconds for a client reading only the frame.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::Parse | Self::InvalidRequest(_) | Self::TokenInUrl | Self::BodyUnreadable => 400,
            Self::PayloadTooLarge => 413,
            Self::RepeatedHost | Self::HostNotAllowed | Self::RepeatedOrigin | Self::OriginNotAllowed => 403,
            Self::NotAcceptable | Self::EventStreamRequired => 406,
            Self::BodyTimeout => 408,
            Self::UnsupportedMediaType => 415,
            Self::TooManyStreams | Self::RateLimited { .. } => 429,
            Self::HeadersTooLarge => 431,
            Self::Unauthenticated => 401,
            Self::InsufficientScope { .. } => 403,
            Self::OperationDisabled
            | Self::DelegationRefused { .. }
            | Self::ApprovalRequired { .. }
            | Self::PolicyDenied { .. } => 200,
            Self::Unavailable => 503,
            Self::MethodNotFound { .. } | Self::SessionNotFound => 404,
            Self::InvalidMeta(_)
            | Self::InvalidParams { .. }
            | Self::ResourceNotFound { .. }
            | Self::HeaderMismatch(_)
            | Self::MissingCapability { .. }
            | Self::UnsupportedVersion { .. } => 400,
            Self::Timeout => 504,
            Self::Internal => 500,
        }
    }

    /// The HTTP status of a refusal of a message that is not a request, so that no JSON-RPC
    /// response can carry the error: a notification, a client's answer to a server request,
    /// the 2025-era GET stream and DELETE. An application refusal is then 403 (a 200 would
    /// tell the client its notification was taken, or its stream opened); every other error
    /// has the status of [`ProtocolError::http_status`].
    pub fn http_status_without_response(&self) -> u16 {
        match self {
            Self::OperationDisabled
            | Self::DelegationRefused { .. }
            | Self::ApprovalRequired { .. }
            | Self::PolicyDenied { .. } => 403,
            _ => self.http_status(),
        }
    }

    /// Whole seconds to wait before a retry (rounded up, at least 1), for `Retry-After`: only
    /// a rate-limit refusal has one.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::RateLimited { retry_after_ms } => Some(retry_after_ms.div_ceil(1000).max(1)),
            _ => None,
        }
    }

    /// The status of the response carrying this error: to a request (`answers_request`), or to
    /// a message no JSON-RPC response can answer.
    pub fn http_status_for(&self, answers_request: bool) -> u16 {
        if answers_request { self.http_status() } else { self.http_status_without_response() }
    }

    /// The JSON-RPC `error` object.
    pub fn to_wire(&self) -> Value {
        let mut error = Map::new();
        error.insert("code".into(), json!(self.code()));
        error.insert("message".into(), json!(self.to_string()));
        let data = match self {
            Self::InvalidParams { data, .. } => data.clone(),
            Self::ResourceNotFound { uri } => Some(json!({ "uri": uri })),
            Self::MissingCapability { required } => Some(json!({ "requiredCapabilities": required })),
            Self::InsufficientScope { required } => Some(json!({ "requiredScopes": required })),
            Self::DelegationRefused { reason } | Self::PolicyDenied { reason } => Some(json!({ "reason": reason })),
            Self::RateLimited { retry_after_ms } => Some(json!({
                "retryAfterMs": retry_after_ms,
                "retryAfterSeconds": retry_after_ms.div_ceil(1000).max(1),
            })),
            Self::ApprovalRequired { capability, tool, arguments_sha256 } => {
                Some(json!({ "capability": capability, "tool": tool, "argumentsSha256": arguments_sha256 }))
            }
            Self::UnsupportedVersion { requested } => {
                Some(json!({ "supported": crate::SUPPORTED_VERSIONS, "requested": requested }))
            }
            Self::MethodNotFound { method } if is_removed_method(method) => {
                Some(json!({ "supported": crate::SUPPORTED_VERSIONS }))
            }
            _ => None,
        };
        if let Some(data) = data {
            error.insert("data".into(), data);
        }
        Value::Object(error)
    }
}

impl ProtocolError {
    /// One error of every kind, in the order the catalogue table lists them (the table of
    /// [`catalogue_markdown`], which SECURITY.md carries).
    pub fn catalogue() -> Vec<ProtocolError> {
        vec![
            Self::Parse,
            Self::InvalidRequest("frame"),
            Self::PayloadTooLarge,
            Self::RepeatedHost,
            Self::HostNotAllowed,
            Self::RepeatedOrigin,
            Self::OriginNotAllowed,
            Self::HeadersTooLarge,
            Self::TokenInUrl,
            Self::NotAcceptable,
            Self::EventStreamRequired,
            Self::UnsupportedMediaType,
            Self::BodyUnreadable,
            Self::BodyTimeout,
            Self::TooManyStreams,
            Self::MethodNotFound { method: String::new() },
            Self::InvalidMeta(String::new()),
            Self::InvalidParams { message: String::new(), data: None },
            Self::ResourceNotFound { uri: String::new() },
            Self::HeaderMismatch(String::new()),
            Self::MissingCapability { required: Value::Null },
            Self::UnsupportedVersion { requested: String::new() },
            Self::Unauthenticated,
            Self::InsufficientScope { required: Vec::new() },
            Self::SessionNotFound,
            Self::Unavailable,
            Self::OperationDisabled,
            Self::DelegationRefused { reason: "" },
            Self::ApprovalRequired { capability: String::new(), tool: String::new(), arguments_sha256: String::new() },
            Self::PolicyDenied { reason: "" },
            Self::RateLimited { retry_after_ms: 1 },
            Self::Timeout,
            Self::Internal,
        ]
    }

    /// The variant's name and why it travels with its HTTP status (a row of the catalogue).
    pub fn status_reason(&self) -> (&'static str, &'static str) {
        match self {
            Self::Parse => ("Parse", "the body is not JSON"),
            Self::InvalidRequest(_) => ("InvalidRequest", "not an acceptable JSON-RPC request"),
            Self::PayloadTooLarge => ("PayloadTooLarge", "the body is over the limit; refused before it is read"),
            Self::RepeatedHost | Self::HostNotAllowed => {
                ("RepeatedHost, HostNotAllowed", "DNS rebinding defence, before authentication")
            }
            Self::RepeatedOrigin | Self::OriginNotAllowed => {
                ("RepeatedOrigin, OriginNotAllowed", "the transport spec: an invalid Origin MUST be 403")
            }
            Self::HeadersTooLarge => ("HeadersTooLarge", "too many or too large headers"),
            Self::TokenInUrl => ("TokenInUrl", "tokens travel in Authorization only (OAuth 2.1)"),
            Self::NotAcceptable => ("NotAcceptable", "Accept allows neither JSON nor an event stream"),
            Self::EventStreamRequired => ("EventStreamRequired", "this answer can only be an event stream"),
            Self::UnsupportedMediaType => ("UnsupportedMediaType", "the body is not application/json"),
            Self::BodyUnreadable => ("BodyUnreadable", "the body broke off"),
            Self::BodyTimeout => ("BodyTimeout", "the body did not arrive in time"),
            Self::TooManyStreams => ("TooManyStreams", "the caller holds as many open streams as it may"),
            Self::MethodNotFound { .. } => ("MethodNotFound", "the spec: unknown method MUST be 404"),
            Self::InvalidMeta(_) => ("InvalidMeta", "the spec: missing `_meta` is 400"),
            Self::InvalidParams { .. } => ("InvalidParams", "a bad request of the client's"),
            Self::ResourceNotFound { .. } => ("ResourceNotFound", "a bad request of the client's"),
            Self::HeaderMismatch(_) => ("HeaderMismatch", "the spec: a header mismatch is 400"),
            Self::MissingCapability { .. } => ("MissingCapability", "the spec: 400"),
            Self::UnsupportedVersion { .. } => ("UnsupportedVersion", "the spec: 400"),
            Self::Unauthenticated => {
                ("Unauthenticated", "the authorization spec: no valid token is 401 with a WWW-Authenticate challenge")
            }
            Self::InsufficientScope { .. } => (
                "InsufficientScope",
                "the authorization spec: 403 with error=\"insufficient_scope\" naming every scope (clients step up)",
            ),
            Self::SessionNotFound => {
                ("SessionNotFound", "the 2025 transport: 404 makes the client start a new session")
            }
            Self::Unavailable => ("Unavailable", "a dependency could not confirm the request: refused, retry later"),
            Self::OperationDisabled => (
                "OperationDisabled",
                "kill switch: an application refusal of an authenticated request, shown by the client as an error",
            ),
            Self::DelegationRefused { .. } => (
                "DelegationRefused",
                "delegation (scope, budget, validity): an application refusal, shown by the client as an error",
            ),
            Self::ApprovalRequired { .. } => (
                "ApprovalRequired",
                "the principal must approve this call: an application refusal whose data names what to approve",
            ),
            Self::PolicyDenied { .. } => (
                "PolicyDenied",
                "operator policy (Cedar): an application refusal with a fixed reason, never the policy text",
            ),
            Self::RateLimited { .. } => (
                "RateLimited",
                "a rate limit, quota or concurrency cap: flow control with Retry-After, the data carrying the wait",
            ),
            Self::Timeout => ("Timeout", "the request did not finish in time"),
            Self::Internal => ("Internal", "anything else; the cause is logged, never sent"),
        }
    }
}

/// The error catalogue as a Markdown table: every error's JSON-RPC code, its HTTP status
/// answering a request, its status where no response can carry it, and why. SECURITY.md
/// carries it; a test holds the copy to this.
pub fn catalogue_markdown() -> String {
    let mut out = String::from(
        "| Error | JSON-RPC code | HTTP answering a request | HTTP, no response possible | Why |\n|---|---|---|---|---|\n",
    );
    let mut seen: Vec<&str> = Vec::new();
    for error in ProtocolError::catalogue() {
        let (name, why) = error.status_reason();
        if seen.contains(&name) {
            continue;
        }
        seen.push(name);
        let names: Vec<String> = name.split(", ").map(|name| format!("`{name}`")).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {why} |\n",
            names.join(", "),
            error.code(),
            error.http_status(),
            error.http_status_without_response()
        ));
    }
    out
}

/// Methods of earlier revisions that 2026-07-28 removed; they answer -32601 with the versions
/// this server speaks, so a legacy client can tell what to retry with.
pub fn is_removed_method(method: &str) -> bool {
    matches!(
        method,
        "initialize"
            | "notifications/initialized"
            | "ping"
            | "logging/setLevel"
            | "resources/subscribe"
            | "resources/unsubscribe"
            | "tasks/list"
            | "tasks/result"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_spec_table() {
        assert_eq!(ProtocolError::MethodNotFound { method: "x".into() }.http_status(), 404);
        assert_eq!(ProtocolError::HeaderMismatch("x".into()).http_status(), 400);
        assert_eq!(ProtocolError::UnsupportedVersion { requested: "1".into() }.code(), -32022);
        assert_eq!(ProtocolError::MissingCapability { required: json!({}) }.code(), -32021);
        assert_eq!(ProtocolError::InvalidMeta("x".into()).http_status(), 400);
    }

    /// The transport's refusals: the status, code and message each one is sent with, all taken
    /// from here (the HTTP transport passes only the variant).
    #[test]
    fn transport_refusals_have_their_own_status_and_the_invalid_request_code() {
        let cases = [
            (ProtocolError::RepeatedHost, 403, "invalid request: more than one Host header"),
            (ProtocolError::HostNotAllowed, 403, "invalid request: Host is not allowed"),
            (ProtocolError::RepeatedOrigin, 403, "invalid request: more than one Origin header"),
            (ProtocolError::OriginNotAllowed, 403, "invalid request: Origin is not allowed"),
            (ProtocolError::HeadersTooLarge, 431, "invalid request: request headers too large"),
            (ProtocolError::TokenInUrl, 400, "invalid request: access tokens are not accepted in the URL"),
            (
                ProtocolError::NotAcceptable,
                406,
                "invalid request: Accept must allow application/json or text/event-stream",
            ),
            (ProtocolError::EventStreamRequired, 406, "invalid request: Accept must allow text/event-stream"),
            (ProtocolError::UnsupportedMediaType, 415, "invalid request: Content-Type must be application/json"),
            (ProtocolError::BodyUnreadable, 400, "invalid request: the request body could not be read"),
            (ProtocolError::BodyTimeout, 408, "invalid request: the request body did not arrive in time"),
            (ProtocolError::PayloadTooLarge, 413, "request body too large"),
            (ProtocolError::TooManyStreams, 429, "invalid request: too many open streams for this caller"),
        ];
        for (error, status, message) in cases {
            assert_eq!(error.http_status(), status, "{error:?}");
            assert_eq!(error.to_wire(), json!({"code": -32600, "message": message}), "{error:?}");
        }
    }

    /// Refusals of a well-formed, authenticated request are JSON-RPC errors in a 200 (where no
    /// response can carry them, 403); 401 and 403 stay what the authorization spec says.
    #[test]
    fn application_refusals_answer_200_and_authorization_keeps_401_and_403() {
        let refusals = [
            ProtocolError::OperationDisabled,
            ProtocolError::DelegationRefused { reason: "r" },
            ProtocolError::ApprovalRequired { capability: "c".into(), tool: "t".into(), arguments_sha256: "a".into() },
            ProtocolError::PolicyDenied { reason: "r" },
        ];
        for error in refusals {
            assert_eq!((error.http_status(), error.http_status_for(true)), (200, 200), "{error:?}");
            assert_eq!((error.http_status_without_response(), error.http_status_for(false)), (403, 403), "{error:?}");
        }
        for (error, status) in [
            (ProtocolError::Unauthenticated, 401),
            (ProtocolError::InsufficientScope { required: vec!["s".into()] }, 403),
            (ProtocolError::OriginNotAllowed, 403),
        ] {
            assert_eq!((error.http_status(), error.http_status_without_response()), (status, status), "{error:?}");
        }
        // Only the application refusals differ between the two.
        for error in ProtocolError::catalogue() {
            let differs = error.http_status() != error.http_status_without_response();
            let refusal = matches!(
                error,
                ProtocolError::OperationDisabled
                    | ProtocolError::DelegationRefused { .. }
                    | ProtocolError::ApprovalRequired { .. }
                    | ProtocolError::PolicyDenied { .. }
            );
            assert_eq!(differs, refusal, "{error:?}");
        }
    }

    /// Every variant of the enum is in the catalogue once, and variants sharing a row share
    /// their code and statuses.
    #[test]
    fn the_catalogue_lists_every_variant() {
        let source = include_str!("error.rs");
        let (_, body) = source.split_once("pub enum ProtocolError {").unwrap();
        let (body, _) = body.split_once("\n}\n").unwrap();
        let declared: std::collections::BTreeSet<String> = body
            .lines()
            .filter(|line| line.starts_with("    ") && line.chars().nth(4).is_some_and(|c| c.is_ascii_uppercase()))
            .map(|line| variant_name(line.trim()))
            .collect();
        let catalogue = ProtocolError::catalogue();
        let listed: Vec<String> = catalogue.iter().map(|error| variant_name(&format!("{error:?}"))).collect();
        assert_eq!(listed.iter().cloned().collect::<std::collections::BTreeSet<_>>(), declared);
        assert_eq!(listed.len(), declared.len(), "each variant once");
        for a in &catalogue {
            for b in &catalogue {
                if a.status_reason().0 == b.status_reason().0 {
                    assert_eq!(
                        (a.code(), a.http_status(), a.http_status_without_response()),
                        (b.code(), b.http_status(), b.http_status_without_response()),
                        "{a:?} and {b:?} share a row"
                    );
                }
            }
        }
    }

    /// The variant's name at the start of a declaration line or of a `Debug` form.
    fn variant_name(text: &str) -> String {
        text.split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap_or_default().to_owned()
    }

    /// The line before SECURITY.md's copy of the catalogue.
    const SECURITY_BEGIN: &str = "<!-- error catalogue: generated by `palisade_wire::error::catalogue_markdown`; a test holds this copy to it -->";
    /// The line after it.
    const SECURITY_END: &str = "<!-- error catalogue: end -->";

    /// SECURITY.md's table of codes and statuses is [`catalogue_markdown`], so it cannot drift
    /// from `http_status`.
    #[test]
    fn security_md_carries_the_catalogue() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../SECURITY.md")).unwrap();
        let (_, rest) = text.split_once(SECURITY_BEGIN).expect("SECURITY.md has the catalogue's begin marker");
        let (block, _) = rest.split_once(SECURITY_END).expect("SECURITY.md has the catalogue's end marker");
        let expected = catalogue_markdown();
        assert!(block.trim() == expected.trim(), "SECURITY.md's error catalogue is stale; it must read:\n{expected}");
    }

    /// A rate-limit refusal is 429 both ways, says when to retry in `Retry-After`'s whole
    /// seconds (rounded up) and in its data, and names no rule.
    #[test]
    fn rate_limited_is_429_with_the_wait() {
        let error = ProtocolError::RateLimited { retry_after_ms: 1_200 };
        assert_eq!((error.http_status(), error.http_status_without_response()), (429, 429));
        assert_eq!(error.retry_after_secs(), Some(2));
        assert_eq!(ProtocolError::RateLimited { retry_after_ms: 0 }.retry_after_secs(), Some(1));
        assert_eq!(ProtocolError::TooManyStreams.retry_after_secs(), None);
        assert_eq!(
            error.to_wire(),
            json!({"code": -32034, "message": "rate limited", "data": {"retryAfterMs": 1200, "retryAfterSeconds": 2}})
        );
    }

    #[test]
    fn capability_error_carries_an_object() {
        let wire = ProtocolError::MissingCapability { required: json!({"elicitation": {}}) }.to_wire();
        assert_eq!(wire["data"]["requiredCapabilities"], json!({"elicitation": {}}));
    }

    #[test]
    fn internal_error_says_nothing_more() {
        let wire = ProtocolError::Internal.to_wire();
        assert_eq!(wire, json!({"code": -32603, "message": "internal error"}));
    }
}
