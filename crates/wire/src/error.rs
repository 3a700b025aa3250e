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
    /// A delegation capability does not allow this request (HTTP 403): it is not valid for this
    /// caller (unknown, revoked, expired, held by another agent — one answer for all), the method,
    /// tool, resource or prompt is outside it, or its call budget is spent. `reason` is one fixed
    /// sentence.
    #[error("outside the delegated capability")]
    DelegationRefused {
        /// Why, as a fixed sentence (never a value from the request).
        reason: &'static str,
    },
    /// A consequential tool called under a delegation capability needs an approval of exactly
    /// this call from the principal's own client (HTTP 403); the data names what to approve.
    #[error("the principal's approval is required")]
    ApprovalRequired {
        /// The capability's public id (SHA-256 of the reference, hex).
        capability: String,
        /// The tool.
        tool: String,
        /// SHA-256 (hex) of the call's RFC 8785 canonical arguments.
        arguments_sha256: String,
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
            Self::Timeout | Self::Internal | Self::Unavailable => codes::INTERNAL_ERROR,
        }
    }

    /// The HTTP status of a response that carries only this error (protocol.md §5).
    pub fn http_status(&self) -> u16 {
        match self {
            Self::Parse | Self::InvalidRequest(_) | Self::TokenInUrl | Self::BodyUnreadable => 400,
            Self::PayloadTooLarge => 413,
            Self::RepeatedHost | Self::HostNotAllowed | Self::RepeatedOrigin | Self::OriginNotAllowed => 403,
            Self::NotAcceptable | Self::EventStreamRequired => 406,
            Self::BodyTimeout => 408,
            Self::UnsupportedMediaType => 415,
            Self::TooManyStreams => 429,
            Self::HeadersTooLarge => 431,
            Self::Unauthenticated => 401,
            Self::InsufficientScope { .. }
            | Self::OperationDisabled
            | Self::DelegationRefused { .. }
            | Self::ApprovalRequired { .. } => 403,
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
            Self::DelegationRefused { reason } => Some(json!({ "reason": reason })),
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
