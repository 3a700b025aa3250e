//! What a transport hands the pipeline besides the request: the HTTP request's raw `Mcp-*`
//! headers ([`TransportHeaders`]), the 2025-era wire's session id ([`LegacyWire`]), and the one
//! decoder of a plain routing header. Values only: the stages that read them are the envelope
//! (stage 1) and the session (stage 2b).

use palisade_wire::ProtocolError;

use crate::sessions::SessionId;

/// The `Mcp-*` transport headers of one HTTP request, raw. stdio requests have none.
#[derive(Debug, Clone, Default)]
pub struct TransportHeaders {
    /// `MCP-Protocol-Version`
    pub protocol_version: Option<Vec<u8>>,
    /// `Mcp-Method`
    pub method: Option<Vec<u8>>,
    /// `Mcp-Name`
    pub name: Option<Vec<u8>>,
    /// `Mcp-Param-{X}` with `X` lowercased.
    pub params: Vec<(String, Vec<u8>)>,
    /// The name of a routing header that was sent more than once, if any.
    pub duplicate: Option<String>,
    /// The raw `Authorization` header, handed only to the authentication stage.
    pub authorization: Option<Vec<u8>>,
    /// The peer's address (the operator's policies see it as `context.source`).
    pub source: Option<std::net::IpAddr>,
}

/// What the 2025-era transport adds to a request: its `Mcp-Session-Id`, if any.
pub(crate) struct LegacyWire<'a> {
    pub(crate) session: Option<&'a SessionId>,
}

/// A routing header without an encoded form (`MCP-Protocol-Version`, `Mcp-Method`), decoded.
pub(super) fn plain_header(raw: &Option<Vec<u8>>, name: &str) -> Result<Option<String>, ProtocolError> {
    raw.as_ref()
        .map(|raw| {
            palisade_wire::header::decode_plain_value(raw)
                .map_err(|_| ProtocolError::HeaderMismatch(format!("{name} is malformed")))
        })
        .transpose()
}
