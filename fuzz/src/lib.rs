//! The properties the fuzz targets check, as plain functions: the libFuzzer binaries in
//! `fuzz_targets/` and the corpus replayer in `src/bin/replay.rs` run the same code.
//!
//! A property that fails panics; libFuzzer reports that as a crash, the replayer as a failed file.

mod bearer;
mod jwks;
mod killswitch;
mod policy;
mod server;

pub use bearer::bearer_token;
pub use jwks::jwks;
pub use killswitch::killswitch;
pub use policy::argument_view;
pub use server::{cursor, request_state, sealed_state, traceparent};

use palisade_wire::header::{decode_value, encode_value, matches_json};
use palisade_wire::jsonrpc::{self, Message, RequestId, parse_message};
use palisade_wire::{ProtocolError, RequestMeta, StrictJsonError, strict};
use serde_json::{Value, json};

/// A fuzz target: its name (the binary and `corpus/<name>/`) and its property.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Name of the libFuzzer binary and of its corpus directory.
    pub name: &'static str,
    /// Runs the property on one input; panics when it does not hold.
    pub check: fn(&[u8]),
}

/// Every fuzz target, for the replayer.
pub const TARGETS: &[Target] = &[
    Target { name: "jsonrpc_frame", check: jsonrpc_frame },
    Target { name: "header_value", check: header_value },
    Target { name: "bearer_token", check: bearer_token },
    Target { name: "request_state", check: request_state },
    Target { name: "cursor", check: cursor },
    Target { name: "traceparent", check: traceparent },
    Target { name: "jwks", check: jwks },
    Target { name: "killswitch", check: killswitch },
    Target { name: "argument_view", check: argument_view },
];

/// One inbound JSON-RPC frame: the strict JSON parser agrees with `serde_json` (see
/// [`strict_json_differential`]) and a duplicate member name refuses the frame as an invalid
/// request without an id; parsing never panics; an accepted frame re-serialises to a frame
/// that parses to the same id and method, its id is echoed with its JSON type, and its `_meta` is
/// validated without panicking; a refused frame still yields a wire error object.
pub fn jsonrpc_frame(data: &[u8]) {
    let duplicate = strict_json_differential(data);
    let message = match parse_message(data) {
        Ok(message) => {
            assert!(!duplicate, "a frame with a duplicate member name was accepted");
            message
        }
        Err(refusal) => {
            if duplicate {
                let expected = ProtocolError::InvalidRequest("duplicate member name");
                assert_eq!(refusal.error, expected, "a duplicate member name refused as something else");
                assert!(refusal.id.is_none(), "a duplicate member name refused with an id");
            }
            let frame = jsonrpc::error_frame(refusal.id.as_ref(), &refusal.error);
            assert!(frame["error"]["code"].is_i64(), "error frame without an integer code: {frame}");
            return;
        }
    };
    let (id, method, params) = match &message {
        Message::Request(request) => (Some(&request.id), &request.method, &request.params),
        Message::Notification(notification) => (None, &notification.method, &notification.params),
    };
    if let Some(id) = id {
        let echoed = jsonrpc::result_frame(id, Value::Null);
        assert_eq!(RequestId::from_value(&echoed["id"]).as_ref(), Some(id), "id not echoed with its type");
    }
    let mut rebuilt = json!({ "jsonrpc": "2.0", "method": method, "params": params });
    if let Some(id) = id {
        rebuilt["id"] = id.to_value();
    }
    let bytes = serde_json::to_vec(&rebuilt).expect("a Value always serialises");
    match parse_message(&bytes).expect("a re-serialised accepted frame must parse") {
        Message::Request(again) => {
            assert_eq!(Some(&again.id), id, "id changed across a round trip");
            assert_eq!(&again.method, method, "method changed across a round trip");
        }
        Message::Notification(again) => {
            assert!(id.is_none(), "a request came back as a notification");
            assert_eq!(&again.method, method, "method changed across a round trip");
        }
    }
    if let Ok(meta) = RequestMeta::from_params(params) {
        let _ = meta.check_supported();
        let _ = meta.has_capability("sampling");
        let _ = meta.has_extension("io.modelcontextprotocol/tasks");
    }
}

/// `strict::from_slice` against `serde_json::from_slice::<Value>` on the same bytes: it refuses
/// or gives the identical value (compared as values and as written-out bytes, so `1.0` and `1`,
/// `-0.0` and `0` differ); when serde_json accepts and strict refuses, the refusal is a duplicate
/// member name, never a syntax error; and strict never accepts what serde_json refuses. Returns
/// whether strict refused a duplicate member name.
///
/// Exact equality assumes this workspace's serde_json (no `raw_value`, no `arbitrary_precision`):
/// with `raw_value`, serde_json reads a `$serde_json::private::RawValue` member specially and
/// strict, on purpose, does not.
pub fn strict_json_differential(data: &[u8]) -> bool {
    match (serde_json::from_slice::<Value>(data), strict::from_slice(data)) {
        (Ok(plain), Ok(checked)) => {
            assert_eq!(plain, checked, "strict parse differs from serde_json");
            let bytes = |value: &Value| serde_json::to_vec(value).expect("a Value always serialises");
            assert_eq!(bytes(&plain), bytes(&checked), "strict parse writes out differently from serde_json");
            false
        }
        (_, Err(StrictJsonError::Duplicate)) => true,
        (Err(_), Err(StrictJsonError::Syntax(_))) => false,
        (Ok(_), Err(error @ StrictJsonError::Syntax(_))) => {
            panic!("serde_json accepts the input, strict refuses it as a syntax error: {error:?}")
        }
        (Err(error), Ok(_)) => panic!("serde_json refuses the input ({error}), strict accepts it"),
    }
}

/// One `Mcp-*` header value: decoding never panics; whatever decodes re-encodes to a legal header
/// value that decodes back to the same string; any UTF-8 input, taken as a value to send,
/// survives `encode_value` → `decode_value`; and a decoded string matches itself as JSON.
pub fn header_value(data: &[u8]) {
    if let Ok(decoded) = decode_value(data) {
        assert_round_trip(&decoded);
        assert!(matches_json(&decoded, &Value::String(decoded.clone())), "a string must match itself");
        if let Ok(parsed) = serde_json::from_str::<Value>(&decoded) {
            let _ = matches_json(&decoded, &parsed);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        assert_round_trip(text);
    }
}

fn assert_round_trip(value: &str) {
    let encoded = encode_value(value);
    assert!(
        encoded.bytes().all(|b| (0x20..=0x7e).contains(&b)),
        "encode_value produced a byte that is not legal in a header: {encoded:?}"
    );
    match decode_value(encoded.as_bytes()) {
        Ok(again) => assert_eq!(again, value, "round trip changed the value (encoded as {encoded:?})"),
        Err(error) => panic!("encode_value({value:?}) = {encoded:?} does not decode: {error}"),
    }
}
