//! The answer to one request: its final JSON-RPC frame and the HTTP status it travels with.
//! Made by the pipeline's last stage (or a refusal); read by the transports and the trace span.

use palisade_wire::jsonrpc::{error_frame, result_frame};
use palisade_wire::{ProtocolError, RequestId};
use serde_json::Value;

use crate::sessions::SessionId;

/// The answer to one request: the final frame and the HTTP status it travels with.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The JSON-RPC response frame.
    pub frame: Value,
    /// HTTP status when the reply is the whole response (ignored inside an SSE stream).
    pub status: u16,
    /// `WWW-Authenticate` challenge for 401/403 refusals.
    pub challenge: Option<String>,
    /// A new session id for the `Mcp-Session-Id` header (a 2025-era `initialize` only).
    pub session: Option<SessionId>,
    /// Seconds for the `Retry-After` header of a rate-limit refusal (429).
    pub retry_after: Option<u64>,
}

impl Reply {
    /// A result reply.
    pub(crate) fn ok(id: &RequestId, result: Value) -> Self {
        Self { frame: result_frame(id, result), status: 200, challenge: None, session: None, retry_after: None }
    }

    /// An error reply. With an `id` it answers a request, so an application refusal is a
    /// JSON-RPC error in a 200; without one the refused message was not a request (a
    /// notification, a client's answer, the 2025-era GET stream or DELETE) and takes its HTTP
    /// status ([`ProtocolError::http_status_for`]).
    pub fn error(id: Option<&RequestId>, error: &ProtocolError) -> Self {
        let status = error.http_status_for(id.is_some());
        let retry_after = error.retry_after_secs();
        Self { frame: error_frame(id, error), status, challenge: None, session: None, retry_after }
    }
}
