//! Stage 1, the envelope: everything that must hold before a request means anything — its
//! `_meta` shape, the routing headers (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`,
//! `Mcp-Param-*`) equal to the body and each sent once, the version supported, the method known
//! and advertised. On the 2025-era wire: a method of that wire, a session id after `initialize`,
//! an accepted version, no task augmentation.
//!
//! Holds whether the server serves tasks and the 2025-era versions it accepts; knows the method
//! table and the application's definitions (for `Mcp-Param-*`); knows nothing of the caller: it
//! runs before authentication.

use palisade_wire::header::{decode_value, matches_json};
use palisade_wire::{ProtocolError, Request, RequestMeta, meta_keys};
use serde_json::Value;

use super::wire::{LegacyWire, TransportHeaders, plain_header};
use crate::method::Method;
use crate::registry::App;

/// Stage 1: whether the server has a task service (the tasks methods need one) and the
/// versions the 2025-era wire accepts.
pub(crate) struct Envelope {
    serves_tasks: bool,
    legacy_versions: Vec<String>,
}

impl Envelope {
    /// The stage for a server with (or without) a task service, accepting `legacy_versions` on
    /// the 2025-era wire.
    pub(crate) fn new(serves_tasks: bool, legacy_versions: Vec<String>) -> Self {
        Self { serves_tasks, legacy_versions }
    }

    /// Stage 1 on either wire: the method, and the request's `_meta` (2026-07-28; on the
    /// 2025-era wire it comes from the session, stage 2b).
    pub(super) fn envelope(
        &self,
        app: &App,
        request: &Request,
        headers: Option<&TransportHeaders>,
        legacy: Option<&LegacyWire<'_>>,
    ) -> Result<(Method, Option<RequestMeta>), ProtocolError> {
        match legacy {
            None => self.stateless_envelope(app, request, headers).map(|(method, meta)| (method, Some(meta))),
            Some(wire) => self.legacy_envelope(app, request, headers, wire).map(|method| (method, None)),
        }
    }

    /// Stage 1 on the 2026-07-28 wire.
    fn stateless_envelope(
        &self,
        app: &App,
        request: &Request,
        headers: Option<&TransportHeaders>,
    ) -> Result<(Method, RequestMeta), ProtocolError> {
        let body_version = request.params.get("_meta").and_then(|meta| meta.get(meta_keys::PROTOCOL_VERSION));
        if let Some(headers) = headers
            && body_version.is_none()
            && is_legacy_version_header(headers.protocol_version.as_deref())
        {
            // An earlier revision's request (initialize handshake, session era). Only the
            // 2026-07-28 wire is served: say which versions are.
            return Err(if palisade_wire::error::is_removed_method(&request.method) {
                ProtocolError::MethodNotFound { method: request.method.clone() }
            } else {
                let requested = headers
                    .protocol_version
                    .as_deref()
                    .and_then(|v| palisade_wire::header::decode_plain_value(v).ok())
                    .unwrap_or_default();
                ProtocolError::UnsupportedVersion { requested }
            });
        }
        let meta = RequestMeta::from_params(&request.params)?;
        if let Some(headers) = headers {
            check_routing_headers(request, headers)?;
        }
        meta.check_supported()?;
        let method = self.known_method(app, &request.method)?;
        if let Some(headers) = headers {
            check_param_headers(app, method, request, headers)?;
        }
        Ok((method, meta))
    }

    /// A method of the 2026-07-28 wire that the application advertises (the tasks methods also
    /// need the server's task service).
    fn known_method(&self, app: &App, name: &str) -> Result<Method, ProtocolError> {
        let not_found = || ProtocolError::MethodNotFound { method: name.to_owned() };
        let method = Method::parse(name).ok_or_else(not_found)?;
        if app.advertises(method) && (!method.is_tasks_method() || self.serves_tasks) {
            Ok(method)
        } else {
            Err(not_found())
        }
    }

    /// Stage 1 on the 2025-era wire: a method of that wire, a session id on everything but
    /// `initialize` (and none on it), an accepted version header, no task augmentation.
    fn legacy_envelope(
        &self,
        app: &App,
        request: &Request,
        headers: Option<&TransportHeaders>,
        wire: &LegacyWire<'_>,
    ) -> Result<Method, ProtocolError> {
        let not_found = || ProtocolError::MethodNotFound { method: request.method.clone() };
        let method = Method::parse_legacy(&request.method).ok_or_else(not_found)?;
        if !app.advertises(method) {
            return Err(not_found());
        }
        if let Some(headers) = headers {
            if let Some(name) = &headers.duplicate {
                return Err(ProtocolError::HeaderMismatch(format!("{name} sent more than once")));
            }
            if let Some(version) = plain_header(&headers.protocol_version, "MCP-Protocol-Version")?
                && !self.legacy_versions.contains(&version)
            {
                return Err(ProtocolError::UnsupportedVersion { requested: version });
            }
            check_method_and_name(request, headers, false)?;
        }
        match (method, wire.session) {
            (Method::Initialize, Some(_)) => {
                return Err(ProtocolError::InvalidRequest("initialize must not carry an Mcp-Session-Id"));
            }
            (Method::Initialize, None) | (_, Some(_)) => {}
            (_, None) => {
                return Err(ProtocolError::InvalidRequest("an Mcp-Session-Id header is required after initialize"));
            }
        }
        // The 2025-11-25 in-core tasks are not served (the tasks extension is 2026-07-28 only).
        if request.params.contains_key("task") {
            return Err(ProtocolError::invalid_params("task-augmented requests are not supported by this server"));
        }
        Ok(method)
    }
}

/// A version header of an earlier revision (or none at all) marks a request of the session era.
fn is_legacy_version_header(raw: Option<&[u8]>) -> bool {
    match raw.map(palisade_wire::header::decode_plain_value) {
        None => true,
        Some(Ok(version)) => version.starts_with("2024-") || version.starts_with("2025-"),
        Some(Err(_)) => false,
    }
}

/// HTTP only: `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` present where required and
/// equal to the body. Runs after the `_meta` shape check and before version support.
fn check_routing_headers(request: &Request, headers: &TransportHeaders) -> Result<(), ProtocolError> {
    let mismatch = |what: &str| ProtocolError::HeaderMismatch(what.to_owned());
    if let Some(name) = &headers.duplicate {
        return Err(mismatch(&format!("{name} sent more than once")));
    }
    let version = plain_header(&headers.protocol_version, "MCP-Protocol-Version")?
        .ok_or_else(|| mismatch("MCP-Protocol-Version header is required"))?;
    let body_version =
        request.params.get("_meta").and_then(|meta| meta.get(meta_keys::PROTOCOL_VERSION)).and_then(Value::as_str);
    if body_version != Some(version.as_str()) {
        return Err(mismatch("MCP-Protocol-Version does not match _meta protocolVersion"));
    }
    check_method_and_name(request, headers, true)
}

/// `Mcp-Method` and `Mcp-Name` equal to the body. `required`: they must be present (the
/// 2026-07-28 wire); otherwise (the 2025-era wire, whose clients may not send them) they are
/// compared where sent, so that what a header-routing proxy saw is what runs.
fn check_method_and_name(request: &Request, headers: &TransportHeaders, required: bool) -> Result<(), ProtocolError> {
    let mismatch = |what: &str| ProtocolError::HeaderMismatch(what.to_owned());
    match plain_header(&headers.method, "Mcp-Method")? {
        Some(method) if method != request.method => {
            return Err(mismatch("Mcp-Method does not match the request method"));
        }
        Some(_) => {}
        None if required => return Err(mismatch("Mcp-Method header is required")),
        None => {}
    }
    let name_param =
        Method::parse(&request.method).or_else(|| Method::parse_legacy(&request.method)).and_then(Method::name_param);
    let header_name = headers
        .name
        .as_ref()
        .map(|raw| decode_value(raw).map_err(|_| mismatch("Mcp-Name is malformed")))
        .transpose()?;
    match (name_param, header_name) {
        (Some(_), None) if required => Err(mismatch("Mcp-Name header is required")),
        // A body without the param is an invalid-params error for the method itself.
        (Some(param), Some(header_name)) => match request.params.get(param).and_then(Value::as_str) {
            Some(body_name) if header_name != body_name => Err(mismatch("Mcp-Name does not match the request")),
            _ => Ok(()),
        },
        // A name header on a method that names nothing would route on a value nothing checks.
        (None, Some(_)) if !required => Err(mismatch("Mcp-Name is not defined for this method")),
        _ => Ok(()),
    }
}

/// HTTP only: every `Mcp-Param-*` header a tool declares is present exactly when its
/// argument is, and equal to it.
fn check_param_headers(
    app: &App,
    method: Method,
    request: &Request,
    headers: &TransportHeaders,
) -> Result<(), ProtocolError> {
    if method != Method::ToolsCall {
        return Ok(());
    }
    let Some(tool) = request.params.get("name").and_then(Value::as_str).and_then(|n| app.tool(n)) else {
        return Ok(());
    };
    let mismatch = |what: String| ProtocolError::HeaderMismatch(what);
    let arguments = request.params.get("arguments").and_then(Value::as_object);
    for (header, property) in &tool.header_params {
        let value = arguments.and_then(|a| a.get(property)).filter(|v| !v.is_null());
        let sent = headers.params.iter().find(|(name, _)| name.eq_ignore_ascii_case(header));
        match (value, sent) {
            (None, None) => {}
            (Some(_), None) => return Err(mismatch(format!("Mcp-Param-{header} header is required"))),
            (None, Some(_)) => return Err(mismatch(format!("Mcp-Param-{header} has no matching argument"))),
            (Some(value), Some((_, raw))) => {
                let decoded = decode_value(raw).map_err(|_| mismatch(format!("Mcp-Param-{header} is malformed")))?;
                if !matches_json(&decoded, value) {
                    return Err(mismatch(format!("Mcp-Param-{header} does not match the argument")));
                }
            }
        }
    }
    Ok(())
}
