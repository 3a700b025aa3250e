//! OpenTelemetry for the request path: one span per MCP request, whose trace id is the
//! request's audit `trace_id`, so a trace and the request's audit records join.
//!
//! The span and its decision events use the target [`TARGET`]. They exist only when the process
//! installs a layer that accepts that target (the `palisade` binary does when `[telemetry]` names
//! a collector); otherwise the span is disabled at its call site, nothing here runs and the
//! request gets a fresh random trace id as always.
//!
//! A request may continue a caller's trace with a W3C `traceparent` in `params._meta` (the
//! carrier MCP reserves; the same on HTTP and stdio). A valid one gives the span its parent and
//! the request its trace id; an invalid one is ignored (a fresh trace), never an error.
//! `tracestate` and `baggage` are not read. With
//! [`ServerConfig::continue_traces`](crate::ServerConfig::continue_traces) off, every request
//! starts a trace of its own whatever it carries.
//!
//! What a span carries: the method name as sent (at most 64 characters, as in the audit
//! record), the server-derived operation key, the decision, its stage, and the JSON-RPC error
//! code. Never tokens, handles, argument values or principal, tenant or client identifiers.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
use serde_json::{Map, Value};
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::reply::Reply;

/// The target of request spans and their events: a trace layer selects it, the log layer
/// leaves it out.
pub const TARGET: &str = "palisade_otel";

/// The `_meta` key of the W3C trace context.
const TRACEPARENT: &str = "traceparent";

/// The span of one request, and its trace id as 32 lowercase hex digits when tracing is on.
pub(crate) fn request_span(
    method: &str,
    params: &Map<String, Value>,
    continue_traces: bool,
) -> (tracing::Span, Option<String>) {
    let span = tracing::info_span!(
        target: TARGET,
        "mcp.request",
        otel.kind = "server",
        mcp.method.name = bounded(method, 64),
        palisade.operation = Empty,
        palisade.decision = Empty,
        palisade.stage = Empty,
        rpc.jsonrpc.error_code = Empty,
        otel.status_code = Empty,
    );
    if span.is_disabled() {
        return (span, None);
    }
    if let Some(parent) = incoming_parent(params).filter(|_| continue_traces) {
        // The span is not started yet, so setting its parent cannot fail with a layer present.
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent));
    }
    let context = span.context();
    let span_context = context.span().span_context().clone();
    let trace_id = span_context.is_valid().then(|| span_context.trace_id().to_string());
    (span, trace_id)
}

/// Records the operation key once the request is classified.
pub(crate) fn operation(span: &tracing::Span, operation: &str) {
    if !span.is_disabled() {
        span.record("palisade.operation", operation);
    }
}

/// Records a decision on the span, and as an event in the trace.
pub(crate) fn decision(span: &tracing::Span, stage: &str, decision: &'static str, code: Option<i64>) {
    if span.is_disabled() {
        return;
    }
    span.record("palisade.decision", decision);
    span.record("palisade.stage", stage);
    tracing::info!(target: TARGET, parent: span, stage, decision, code, "decision");
}

/// Records the reply's outcome: the JSON-RPC error code, and an error status for a server-side
/// failure (HTTP 5xx).
pub(crate) fn finish(span: &tracing::Span, reply: &Reply) {
    if span.is_disabled() {
        return;
    }
    if let Some(code) = reply.frame.get("error").and_then(|error| error.get("code")).and_then(Value::as_i64) {
        span.record("rpc.jsonrpc.error_code", code);
    }
    if reply.status >= 500 {
        span.record("otel.status_code", "error");
    }
}

/// The caller's span from `params._meta.traceparent`, when present and valid.
fn incoming_parent(params: &Map<String, Value>) -> Option<SpanContext> {
    let value = params.get("_meta")?.get(TRACEPARENT)?.as_str()?;
    let (trace_id, span_id, flags) = parse_traceparent(value)?;
    Some(SpanContext::new(trace_id, span_id, flags, true, TraceState::default()))
}

/// Parses a W3C `traceparent` (version `00`, or a later version's first four fields): lowercase
/// hex only, neither id all zeros, version `ff` invalid. Only the sampled flag is kept.
/// Public only for the fuzz target (`fuzz/`, `traceparent`); not part of the library API.
#[doc(hidden)]
pub fn parse_traceparent(value: &str) -> Option<(TraceId, SpanId, TraceFlags)> {
    // 2 + 1 + 32 + 1 + 16 + 1 + 2: a version-00 header is exactly this long.
    const LEN: usize = 55;
    let bytes = value.as_bytes();
    let lower_hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if bytes.len() < LEN || !value.is_ascii() {
        return None;
    }
    let (version, trace_id, span_id, flags) = (&value[0..2], &value[3..35], &value[36..52], &value[53..55]);
    if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return None;
    }
    if !(lower_hex(version) && lower_hex(trace_id) && lower_hex(span_id) && lower_hex(flags)) || version == "ff" {
        return None;
    }
    // Version 00 has exactly four fields; a later version may append more after a dash.
    if bytes.len() > LEN && (version == "00" || bytes[LEN] != b'-') {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok().filter(|id| *id != TraceId::INVALID)?;
    let span_id = SpanId::from_hex(span_id).ok().filter(|id| *id != SpanId::INVALID)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((trace_id, span_id, TraceFlags::new(flags & TraceFlags::SAMPLED.to_u8())))
}

/// At most `max` characters of `text`, without allocating.
fn bounded(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_parsed() {
        let (trace_id, span_id, flags) = parse_traceparent(VALID).unwrap();
        assert_eq!(trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span_id.to_string(), "00f067aa0ba902b7");
        assert!(flags.is_sampled());
        let (_, _, flags) = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!flags.is_sampled());
        // A later version may carry more fields; its first four are read.
        assert!(parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-extra").is_some());
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
            "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_parent_comes_from_meta_only_as_a_string() {
        let params = |meta: Value| serde_json::json!({ "_meta": meta }).as_object().cloned().unwrap();
        assert!(incoming_parent(&params(serde_json::json!({ "traceparent": VALID }))).is_some_and(|c| c.is_remote()));
        assert!(incoming_parent(&params(serde_json::json!({ "traceparent": 5 }))).is_none());
        assert!(incoming_parent(&params(serde_json::json!({}))).is_none());
        assert!(incoming_parent(&Map::new()).is_none());
    }

    #[test]
    fn without_a_trace_layer_the_span_is_off() {
        let params = serde_json::json!({ "_meta": { "traceparent": VALID } }).as_object().cloned().unwrap();
        let (span, trace_id) = request_span("tools/call", &params, true);
        assert!(span.is_disabled());
        assert_eq!(trace_id, None);
    }

    #[test]
    fn bounded_cuts_at_a_character_boundary() {
        assert_eq!(bounded("tools/call", 64), "tools/call");
        assert_eq!(bounded("ééé", 2), "éé");
    }
}
