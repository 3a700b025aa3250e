//! The properties of `palisade-server`'s three parsers of client-held strings: the sealed MRTR
//! `requestState` (`request_state`), pagination cursors (`cursor`) and the W3C `traceparent` a
//! request may carry in `_meta` (`traceparent`).
//!
//! The sealed state and the cursors are HMAC-tagged with keys derived from a server secret; the
//! fixtures use fixed secrets (`SECRET_A` signs, `SECRET_B` never signed anything), so the seed
//! corpus can hold a state sealed under `SECRET_A` and reach the accepting branches.

use std::sync::OnceLock;

use palisade_server::cursor::Cursors;
use palisade_server::mrtr::{Binding, StateError, StateSealer};
use palisade_server::secret::ServerSecret;
use palisade_server::telemetry::parse_traceparent;
use serde_json::{Map, Value, json};

/// The secret every sealed state and cursor of the fixture is made with.
pub const SECRET_A: [u8; 32] = [7; 32];
/// A second server's secret: nothing made under `SECRET_A` may open under it.
pub const SECRET_B: [u8; 32] = [8; 32];
/// When the fixture seals (ms since the epoch); states live [`STATE_TTL_MS`].
pub const SEAL_MS: u64 = 1_800_000_000_000;
/// Lifetime of a sealed state.
pub const STATE_TTL_MS: u64 = 60_000;

struct Sealers {
    a: StateSealer,
    b: StateSealer,
    params: Map<String, Value>,
    other_params: Map<String, Value>,
}

fn sealers() -> &'static Sealers {
    static SEALERS: OnceLock<Sealers> = OnceLock::new();
    SEALERS.get_or_init(|| Sealers {
        a: StateSealer::new(&ServerSecret::from_bytes(SECRET_A), STATE_TTL_MS),
        b: StateSealer::new(&ServerSecret::from_bytes(SECRET_B), STATE_TTL_MS),
        params: object(json!({ "name": "checkout", "arguments": { "basket": "b-1" } })),
        other_params: object(json!({ "name": "checkout", "arguments": { "basket": "b-2" } })),
    })
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The binding the fixture seals for: alice, `tools/call`, the fixture's params.
pub fn state_binding(params: &Map<String, Value>) -> Binding<'_> {
    Binding { principal: "alice", method: "tools/call", params }
}

/// A state sealed by the fixture's server (`SECRET_A`, [`SEAL_MS`], alice's `tools/call`): what
/// the committed seeds of `request_state` hold in their accepting half.
pub fn sealed_state(state: &Value) -> String {
    let fx = sealers();
    fx.a.seal(state, &state_binding(&fx.params), SEAL_MS)
}

/// `requestState` opening. Two halves, split at the first `\n` of the input (the whole input
/// when there is none):
///
/// 1. the first half as a presented state: opening never panics; it opens only if it is exactly
///    what this server sealed for the value it yields (no forgery), never under another server's
///    key, never for another caller, method or params, and never once expired;
/// 2. the second half as a value to seal (JSON if it parses, else a string), then as edits to
///    the sealed text: the state opens to the same value before its expiry, not at or after it,
///    not under another key or binding, and any edited text that differs never opens.
pub fn request_state(data: &[u8]) {
    let fx = sealers();
    let (presented, program) = match data.iter().position(|&b| b == b'\n') {
        Some(split) => (&data[..split], &data[split + 1..]),
        None => (data, data),
    };
    let binding = state_binding(&fx.params);
    let at = SEAL_MS + 1;

    if let Ok(text) = std::str::from_utf8(presented) {
        if let Ok(value) = fx.a.open(text, &binding, at) {
            assert_eq!(text, sealed_state(&value), "a state opened that this server did not seal");
        }
        assert_eq!(fx.b.open(text, &binding, at), Err(StateError::Tampered), "opened under another server's key");
    }

    let state = serde_json::from_slice::<Value>(program)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(program).into_owned()));
    let sealed = sealed_state(&state);
    assert_eq!(fx.a.open(&sealed, &binding, at).as_ref(), Ok(&state), "a sealed state does not round-trip");
    assert_eq!(fx.a.open(&sealed, &binding, SEAL_MS + STATE_TTL_MS), Err(StateError::Expired));
    assert_eq!(fx.b.open(&sealed, &binding, at), Err(StateError::Tampered));
    let other = Binding { principal: "bob", method: "tools/call", params: &fx.params };
    assert_eq!(fx.a.open(&sealed, &other, at), Err(StateError::Mismatch), "opened for another caller");
    let other = Binding { principal: "alice", method: "prompts/get", params: &fx.params };
    assert_eq!(fx.a.open(&sealed, &other, at), Err(StateError::Mismatch), "opened for another method");
    assert_eq!(
        fx.a.open(&sealed, &state_binding(&fx.other_params), at),
        Err(StateError::Mismatch),
        "opened for other params"
    );

    let tampered = edit(sealed.as_bytes(), program);
    if tampered != sealed.as_bytes() {
        if let Ok(text) = std::str::from_utf8(&tampered) {
            assert!(fx.a.open(text, &binding, at).is_err(), "a tampered state opened: {text:?}");
        }
    }
}

/// `text` with byte edits read from `program`, two bytes each: a position (modulo the length)
/// and a byte to put there; an odd last byte truncates at that position.
pub fn edit(text: &[u8], program: &[u8]) -> Vec<u8> {
    let mut out = text.to_vec();
    for pair in program.chunks(2) {
        if out.is_empty() {
            break;
        }
        let at = usize::from(pair[0]) % out.len();
        match pair.get(1) {
            Some(&byte) => out[at] = byte,
            None => out.truncate(at),
        }
    }
    out
}

struct CursorKeys {
    a: Cursors,
    b: Cursors,
}

fn cursor_keys() -> &'static CursorKeys {
    static KEYS: OnceLock<CursorKeys> = OnceLock::new();
    KEYS.get_or_init(|| CursorKeys {
        a: Cursors::new(&ServerSecret::from_bytes(SECRET_A)),
        b: Cursors::new(&ServerSecret::from_bytes(SECRET_B)),
    })
}

/// The list kinds cursors are bound to.
const KINDS: &[&str] = &["tools", "prompts", "resources", "resources/templates"];

/// Pagination cursors. The first byte picks the list kind; the rest is
///
/// 1. a presented cursor: reading never panics; the empty cursor is the start (0); any other
///    cursor reads only to an offset whose minted cursor carries the same tag (no forgery), and
///    never under another server's key;
/// 2. an offset (its first eight bytes) and edits: a minted cursor reads back to its offset, for
///    its own kind only, and an edited cursor that still reads points at that same offset.
pub fn cursor(data: &[u8]) {
    let fx = cursor_keys();
    let Some((&selector, rest)) = data.split_first() else { return };
    let kind = KINDS[usize::from(selector) % KINDS.len()];
    let other_kind = KINDS[(usize::from(selector) + 1) % KINDS.len()];

    if let Ok(presented) = std::str::from_utf8(rest) {
        match fx.a.read(kind, presented) {
            Some(0) if presented.is_empty() => {}
            Some(offset) => {
                let minted = fx.a.mint(kind, offset);
                assert_eq!(tag(&minted), tag(presented), "cursor {presented:?} read without its offset's tag");
                assert_eq!(fx.b.read(kind, presented), None, "a cursor read under another server's key");
            }
            None => {}
        }
    }

    let mut offset_bytes = [0u8; 8];
    for (slot, byte) in offset_bytes.iter_mut().zip(rest) {
        *slot = *byte;
    }
    let offset = usize::try_from(u64::from_le_bytes(offset_bytes) >> 16).unwrap_or(usize::MAX);
    let minted = fx.a.mint(kind, offset);
    assert_eq!(fx.a.read(kind, &minted), Some(offset), "a minted cursor does not read back");
    assert_eq!(fx.a.read(other_kind, &minted), None, "a cursor read for another list");
    assert_eq!(fx.b.read(kind, &minted), None, "a cursor read under another server's key");
    let edited = edit(minted.as_bytes(), rest.get(8..).unwrap_or_default());
    if let Ok(edited) = std::str::from_utf8(&edited) {
        if let Some(read) = fx.a.read(kind, edited) {
            assert!(read == offset || edited.is_empty(), "edited cursor {edited:?} points at {read}, not {offset}");
        }
    }
}

/// The tag half of a cursor (after the first dot).
fn tag(cursor: &str) -> Option<&str> {
    cursor.split_once('.').map(|(_, tag)| tag)
}

/// W3C `traceparent`: parsing never panics; an accepted value is at least 55 ASCII bytes with
/// dashes at 2, 35 and 52, its ids are exactly the lowercase hex it carries and not all zeros,
/// its version is not `ff`, only the sampled flag survives, and the parsed context written as a
/// version-00 header parses to the same context.
pub fn traceparent(data: &[u8]) {
    let Ok(value) = std::str::from_utf8(data) else { return };
    let Some((trace_id, span_id, flags)) = parse_traceparent(value) else { return };
    assert!(value.len() >= 55 && value.is_ascii(), "accepted {value:?}");
    let bytes = value.as_bytes();
    assert!(bytes[2] == b'-' && bytes[35] == b'-' && bytes[52] == b'-', "accepted {value:?}");
    assert_ne!(&value[0..2], "ff", "version ff accepted");
    let (trace_hex, span_hex) = (trace_id.to_string(), span_id.to_string());
    assert_eq!(trace_hex, value[3..35], "trace id differs from the header's");
    assert_eq!(span_hex, value[36..52], "span id differs from the header's");
    assert_ne!(trace_hex, "0".repeat(32), "all-zero trace id accepted");
    assert_ne!(span_hex, "0".repeat(16), "all-zero span id accepted");
    let sent = u8::from_str_radix(&value[53..55], 16).expect("accepted flags are hex");
    assert_eq!(flags.to_u8(), sent & 1, "flags other than sampled kept");
    let again = format!("00-{trace_hex}-{span_hex}-{:02x}", flags.to_u8());
    let reparsed = parse_traceparent(&again).expect("a written-out context parses");
    assert_eq!(reparsed, (trace_id, span_id, flags), "round trip changed the context");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed seed `sealed_by_fixture` is a state this fixture sealed, so the first half of
    /// `request_state` reaches its accepting branch.
    #[test]
    fn the_sealed_seed_opens() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/request_state/sealed_by_fixture");
        let seed = std::fs::read_to_string(&path).expect("the seed");
        let presented = seed.split('\n').next().unwrap_or_default();
        let fx = sealers();
        let opened = fx.a.open(presented, &state_binding(&fx.params), SEAL_MS + 1);
        let expected = sealed_state(&json!({ "round": 1 }));
        assert_eq!(opened, Ok(json!({ "round": 1 })), "the seed should hold {expected:?}");
        request_state(seed.as_bytes());
    }
}
