//! The client's JSON-RPC messages, built and read: `Mcp-Param-*` header declarations and values,
//! the client info, each era's params, and the checks of a discovery or initialize result.

use palisade_wire::{PROTOCOL_VERSION, meta_keys};
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use super::{Era, HeaderParam, UpstreamError, UpstreamInfo};

/// 2^53 − 1: the largest integer an `Mcp-Param-*` header may mirror.
pub(super) const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;
/// Deepest `properties` nesting searched for `x-mcp-header`.
pub(super) const MAX_HEADER_DEPTH: usize = 8;

/// Collects the `x-mcp-header` declarations reachable by `properties` keys; `Err` when one is
/// invalid (not a token, not on a string/integer/boolean property, repeated).
pub(super) fn header_declarations(
    schema: &Value,
    path: &mut Vec<String>,
    depth: usize,
    out: &mut Vec<HeaderParam>,
) -> Result<(), ()> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Ok(()) };
    for (key, property) in properties {
        path.push(key.clone());
        if let Some(header) = property.get("x-mcp-header") {
            let header = header.as_str().ok_or(())?;
            let token = !header.is_empty()
                && header.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            let mirrored =
                matches!(property.get("type").and_then(Value::as_str), Some("string" | "integer" | "boolean"));
            if !token || !mirrored {
                return Err(());
            }
            let name = HeaderName::from_bytes(format!("mcp-param-{header}").as_bytes()).map_err(|_| ())?;
            if out.iter().any(|declared| declared.header == name) {
                return Err(());
            }
            out.push(HeaderParam { header: name, path: path.clone() });
        }
        if depth < MAX_HEADER_DEPTH {
            header_declarations(property, path, depth + 1, out)?;
        }
        path.pop();
    }
    Ok(())
}

/// `Mcp-Method`, and `Mcp-Name` from the param the method names its target by.
pub(super) fn method_headers(method: &str, params: &Map<String, Value>) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = Vec::new();
    if let Ok(value) = HeaderValue::from_str(method) {
        headers.push((HeaderName::from_static("mcp-method"), value));
    }
    let name_param = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    };
    if let Some(name) = name_param.and_then(|param| params.get(param)).and_then(Value::as_str)
        && let Ok(value) = HeaderValue::from_str(&palisade_wire::header::encode_value(name))
    {
        headers.push((HeaderName::from_static("mcp-name"), value));
    }
    headers
}

/// The client's implementation info.
pub(super) fn client_info() -> Value {
    json!({"name": "palisade-gateway", "version": env!("CARGO_PKG_VERSION")})
}

/// The request `_meta` of the 2026-07-28 wire added to `params`, other `_meta` keys kept.
pub(super) fn modern_params(
    mut params: Map<String, Value>,
    capabilities: Option<&Value>,
) -> Result<Map<String, Value>, UpstreamError> {
    let meta = params.entry("_meta").or_insert_with(|| json!({}));
    let Value::Object(meta) = meta else {
        return Err(UpstreamError::Protocol("the request's _meta is not an object".into()));
    };
    let capabilities = capabilities.filter(|c| c.is_object()).cloned().unwrap_or_else(|| json!({}));
    meta.insert(meta_keys::PROTOCOL_VERSION.into(), json!(PROTOCOL_VERSION));
    meta.insert(meta_keys::CLIENT_CAPABILITIES.into(), capabilities);
    meta.insert(meta_keys::CLIENT_INFO.into(), client_info());
    Ok(params)
}

/// `params` for the 2025-era wire: the 2026-07-28 protocol keys removed from `_meta` (the
/// session carries version and capabilities), other keys kept.
pub(super) fn legacy_params(mut params: Map<String, Value>) -> Result<Map<String, Value>, UpstreamError> {
    if let Some(meta) = params.get_mut("_meta") {
        let Value::Object(meta) = meta else {
            return Err(UpstreamError::Protocol("the request's _meta is not an object".into()));
        };
        for key in
            [meta_keys::PROTOCOL_VERSION, meta_keys::CLIENT_CAPABILITIES, meta_keys::CLIENT_INFO, meta_keys::LOG_LEVEL]
        {
            meta.remove(key);
        }
        if meta.is_empty() {
            params.remove("_meta");
        }
    }
    Ok(params)
}

/// The log level a request's `_meta` asks for (the 2026-07-28 key), when it names one.
pub(super) fn log_level(params: &Map<String, Value>) -> Option<String> {
    let level = params.get("_meta")?.get(meta_keys::LOG_LEVEL)?.as_str()?;
    palisade_wire::LogLevel::parse(level).map(|level| level.as_str().to_owned())
}

/// A `server/discover` result as connect info: it must list 2026-07-28 and capabilities.
pub(super) fn discovered(result: &Map<String, Value>) -> Result<UpstreamInfo, UpstreamError> {
    check_complete(result)?;
    let speaks_ours = result
        .get("supportedVersions")
        .and_then(Value::as_array)
        .is_some_and(|versions| versions.iter().any(|v| v.as_str() == Some(PROTOCOL_VERSION)));
    if !speaks_ours {
        return Err(UpstreamError::Protocol("does not list 2026-07-28 among its supported versions".into()));
    }
    let Some(capabilities) = result.get("capabilities").filter(|c| c.is_object()).cloned() else {
        return Err(UpstreamError::Protocol("answered server/discover without capabilities".into()));
    };
    let server_info = result
        .get("_meta")
        .and_then(|meta| meta.get(meta_keys::SERVER_INFO))
        .or_else(|| result.get("serverInfo"))
        .cloned()
        .unwrap_or(Value::Null);
    let instructions = instructions(result)?;
    Ok(UpstreamInfo { era: Era::Modern, capabilities, server_info, instructions })
}

/// A result's `resultType` is `complete` (or absent, which means the same).
pub(super) fn check_complete(result: &Map<String, Value>) -> Result<(), UpstreamError> {
    match result.get("resultType") {
        None => Ok(()),
        Some(Value::String(kind)) if kind == "complete" => Ok(()),
        Some(_) => Err(UpstreamError::Protocol("answered with a resultType other than complete".into())),
    }
}

pub(super) fn instructions(result: &Map<String, Value>) -> Result<Option<String>, UpstreamError> {
    match result.get("instructions") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(UpstreamError::Protocol("sent instructions that are not a string".into())),
    }
}
