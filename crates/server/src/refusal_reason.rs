//! Why the HTTP transport refused a request: the fixed names its refusals are counted under
//! (a metric label, the audit record's `operation`) and their HTTP status, from the error
//! catalogue. A leaf: the metrics and the refusal counter both name reasons by it.

use palisade_wire::ProtocolError;

/// Why the transport refused a request (or a connection's request head).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Reason {
    /// `Host` (or the request target's authority) not allowed, absent, or repeated: 403.
    Host,
    /// `Origin` not allowed or repeated: 403.
    Origin,
    /// A method `/mcp` does not serve: 405.
    Method,
    /// `Accept` allows neither JSON nor SSE: 406.
    Accept,
    /// `Content-Type` missing or not `application/json`: 415.
    ContentType,
    /// The body did not arrive within the body read timeout: 408.
    BodyTimeout,
    /// The body is over the limit: 413.
    BodyTooLarge,
    /// Too many or too large headers: 431.
    HeadersTooLarge,
    /// The body is not JSON: 400 (`-32700`).
    Parse,
    /// The body is JSON but not one JSON-RPC request or notification: 400 (`-32600`).
    Frame,
    /// A JSON-RPC batch: 400 (`-32600`).
    Batch,
    /// `access_token` in the URL query: 400.
    TokenInUrl,
    /// A request head that did not complete within the header read timeout: the connection is
    /// closed (nothing is sent; recorded as 408).
    HeaderTimeout,
    /// A request head HTTP could not parse (hyper answers 400 or 431 and closes).
    MalformedHttp,
}

impl Reason {
    /// Every reason, in the order of the metrics' exposition.
    pub(crate) const ALL: [Reason; 14] = [
        Reason::Host,
        Reason::Origin,
        Reason::Method,
        Reason::Accept,
        Reason::ContentType,
        Reason::BodyTimeout,
        Reason::BodyTooLarge,
        Reason::HeadersTooLarge,
        Reason::Parse,
        Reason::Frame,
        Reason::Batch,
        Reason::TokenInUrl,
        Reason::HeaderTimeout,
        Reason::MalformedHttp,
    ];

    /// The fixed name: the audit record's `operation` and the metric's `reason` label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Host => "host",
            Reason::Origin => "origin",
            Reason::Method => "method",
            Reason::Accept => "accept",
            Reason::ContentType => "content_type",
            Reason::BodyTimeout => "body_timeout",
            Reason::BodyTooLarge => "body_too_large",
            Reason::HeadersTooLarge => "headers_too_large",
            Reason::Parse => "parse",
            Reason::Frame => "frame",
            Reason::Batch => "batch",
            Reason::TokenInUrl => "token_in_url",
            Reason::HeaderTimeout => "header_timeout",
            Reason::MalformedHttp => "malformed_http",
        }
    }

    /// The HTTP status of the refusal: the audit record's `code`. Taken from the error catalogue
    /// entry the transport answers with (for a head that never completed, the body timeout's;
    /// for one hyper could not parse, a plain invalid request's), except the 405, which has no
    /// JSON-RPC error.
    pub(crate) fn status(self) -> u16 {
        let error = match self {
            Reason::Method => return 405,
            Reason::Host => ProtocolError::HostNotAllowed,
            Reason::Origin => ProtocolError::OriginNotAllowed,
            Reason::Accept => ProtocolError::NotAcceptable,
            Reason::ContentType => ProtocolError::UnsupportedMediaType,
            Reason::BodyTimeout | Reason::HeaderTimeout => ProtocolError::BodyTimeout,
            Reason::BodyTooLarge => ProtocolError::PayloadTooLarge,
            Reason::HeadersTooLarge => ProtocolError::HeadersTooLarge,
            Reason::Parse => ProtocolError::Parse,
            Reason::TokenInUrl => ProtocolError::TokenInUrl,
            Reason::Frame | Reason::Batch | Reason::MalformedHttp => ProtocolError::InvalidRequest("frame"),
        };
        error.http_status()
    }

    /// The position in [`Reason::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}
