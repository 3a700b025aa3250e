//! MCP 2026-07-28 wire layer: JSON-RPC framing, request `_meta`, the error catalogue with its
//! HTTP statuses, and the `Mcp-*` header value encoding.
//!
//! **Architecture Invariant:** this crate does no I/O and knows no transport library; it turns
//! bytes into typed frames and typed errors into wire objects, nothing else.
//!
//! Layers, low to high: `error`, `header`, `strict` → `jsonrpc` → `meta`.

pub mod error;
pub mod header;
pub mod jsonrpc;
pub mod meta;
pub mod strict;

pub use error::ProtocolError;
pub use jsonrpc::{Message, Notification, Request, RequestId};
pub use meta::{LogLevel, ProgressToken, RequestMeta};
pub use strict::StrictJsonError;

/// The protocol revision this crate speaks.
pub const PROTOCOL_VERSION: &str = "2026-07-28";

/// Every revision the server accepts on the modern (stateless) wire.
pub const SUPPORTED_VERSIONS: &[&str] = &[PROTOCOL_VERSION];

/// Earlier revisions a dual-era server may also speak, on the session (initialize) wire, newest
/// first.
pub const LEGACY_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18"];

/// Reserved `_meta` keys of the 2026-07-28 revision.
pub mod meta_keys {
    /// Protocol version the request is written against (required).
    pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
    /// Capabilities the client declares for this request (required, `{}` = none).
    pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
    /// The client's implementation info (recommended).
    pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
    /// Per-request log level opt-in (deprecated upstream, still honoured).
    pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
    /// Server implementation info carried in result `_meta`.
    pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
    /// Subscription id carried by every listen-stream message.
    pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
    /// Progress token of a request.
    pub const PROGRESS_TOKEN: &str = "progressToken";
}
