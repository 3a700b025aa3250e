//! The upstream client's message building, error mapping and lists' caching fields.

use palisade_wire::ProtocolError;

use super::messages::*;
use super::*;

#[test]
fn modern_meta_is_added_and_other_keys_kept() {
    let params = json!({"name": "t", "_meta": {"progressToken": "p", meta_keys::PROTOCOL_VERSION: "1999"}});
    let Value::Object(params) = params else { unreachable!() };
    let params = modern_params(params, Some(&json!({"elicitation": {}}))).unwrap();
    let meta = &params["_meta"];
    assert_eq!(meta["progressToken"], "p");
    assert_eq!(meta[meta_keys::PROTOCOL_VERSION], PROTOCOL_VERSION);
    assert_eq!(meta[meta_keys::CLIENT_CAPABILITIES], json!({"elicitation": {}}));
    assert_eq!(meta[meta_keys::CLIENT_INFO]["name"], "palisade-gateway");
    let Value::Object(bad) = json!({"_meta": 1}) else { unreachable!() };
    assert!(modern_params(bad, None).is_err());
}

#[test]
fn legacy_params_lose_the_modern_keys() {
    let Value::Object(params) = json!({"_meta": {meta_keys::PROTOCOL_VERSION: "x", "progressToken": 1}}) else {
        unreachable!()
    };
    assert_eq!(Value::Object(legacy_params(params).unwrap()), json!({"_meta": {"progressToken": 1}}));
    let Value::Object(params) = json!({"_meta": {meta_keys::CLIENT_INFO: {}}}) else { unreachable!() };
    assert_eq!(Value::Object(legacy_params(params).unwrap()), json!({}));
}

#[test]
fn header_declarations_follow_properties_only() {
    let schema = json!({"type": "object", "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "nested": {"type": "object", "properties": {"n": {"type": "integer", "x-mcp-header": "N"}}},
    }});
    let mut out = Vec::new();
    header_declarations(&schema, &mut Vec::new(), 0, &mut out).unwrap();
    let names: Vec<_> = out.iter().map(|d| (d.header.as_str().to_owned(), d.path.join("."))).collect();
    assert!(names.contains(&("mcp-param-region".into(), "region".into())));
    assert!(names.contains(&("mcp-param-n".into(), "nested.n".into())));
    for bad in [
        json!({"properties": {"x": {"type": "number", "x-mcp-header": "X"}}}),
        json!({"properties": {"x": {"type": "string", "x-mcp-header": "a b"}}}),
        json!({"properties": {"x": {"type": "string", "x-mcp-header": "X"}, "y": {"type": "string", "x-mcp-header": "x"}}}),
    ] {
        assert!(header_declarations(&bad, &mut Vec::new(), 0, &mut Vec::new()).is_err(), "{bad}");
    }
}

#[test]
fn errors_map_to_fixed_protocol_errors() {
    assert_eq!(UpstreamError::Timeout.to_protocol_error("u"), ProtocolError::Timeout);
    assert_eq!(UpstreamError::Unhealthy.to_protocol_error("u"), ProtocolError::Unavailable);
    assert_eq!(UpstreamError::Status(502).to_protocol_error("u"), ProtocolError::Unavailable);
    assert_eq!(UpstreamError::Protocol("x".into()).to_protocol_error("u"), ProtocolError::Internal);
    assert_eq!(UpstreamError::TooLarge.to_protocol_error("u"), ProtocolError::Internal);
    assert!(UpstreamError::Status(503).is_upstream_failure());
    assert!(!UpstreamError::Status(404).is_upstream_failure());
    assert!(!UpstreamError::Cancelled.is_upstream_failure());
}

#[test]
fn a_list_page_s_caching_is_read_restrictively() {
    let page = |value: Value| match value {
        Value::Object(map) => map,
        _ => unreachable!(),
    };
    let modern = |value: Value| ListCache::of_page(&Era::Modern, &page(value));
    assert_eq!(
        modern(json!({"ttlMs": 30_000, "cacheScope": "public"})),
        ListCache { ttl_ms: Some(30_000), private: false }
    );
    assert_eq!(
        modern(json!({"ttlMs": 30_000, "cacheScope": "private"})),
        ListCache { ttl_ms: Some(30_000), private: true }
    );
    // An absent or negative ttlMs is 0; a scope other than "public" (or none) is private.
    assert_eq!(modern(json!({})), ListCache { ttl_ms: Some(0), private: true });
    assert_eq!(modern(json!({"ttlMs": -5, "cacheScope": "PUBLIC"})), ListCache { ttl_ms: Some(0), private: true });
    assert_eq!(
        modern(json!({"ttlMs": "60000", "cacheScope": "public"})),
        ListCache { ttl_ms: Some(0), private: false }
    );
    // A 2025-era list carries no caching fields: no bound, whatever it sends.
    let legacy =
        ListCache::of_page(&Era::Legacy("2025-11-25".into()), &page(json!({"ttlMs": 1, "cacheScope": "private"})));
    assert_eq!(legacy, ListCache::default());
    // Combined: the shorter bound, private when either is; no bound is no constraint.
    let a = ListCache { ttl_ms: Some(5_000), private: false };
    let b = ListCache { ttl_ms: Some(60_000), private: true };
    assert_eq!(a.and(b), ListCache { ttl_ms: Some(5_000), private: true });
    assert_eq!(ListCache::default().and(b), b);
    assert_eq!(a.and(ListCache::default()), a);
}
