//! Unit tests of the handles module's helpers: near misses, guesses, tool names, example
//! arguments, scopes and expiry, refusals.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::common::*;
use super::forged::*;
use super::lifecycle::*;
use crate::callable::words as name_words;
use crate::check::{Check, Judgement, Verdict};
use crate::target::Exchange;

use super::*;

const HANDLE: &str = "SgHyNgItGjNOOSHNGjOmqFs2XBn3tSP5Nqw45ti-g1g";

#[test]
fn near_misses_differ_from_the_handle_by_one_change_in_its_alphabet() {
    let last = near_miss(HANDLE, NearMiss::LastChar).unwrap();
    assert_eq!(&last[..42], &HANDLE[..42]);
    assert_ne!(last, HANDLE);
    let first = near_miss(HANDLE, NearMiss::FirstChar).unwrap();
    assert_eq!(&first[1..], &HANDLE[1..]);
    assert_ne!(first, HANDLE);
    assert_eq!(near_miss(HANDLE, NearMiss::Truncated).unwrap(), &HANDLE[..42]);
    let appended = near_miss(HANDLE, NearMiss::Appended).unwrap();
    assert_eq!(appended.len(), 44);
    assert!(appended.starts_with(HANDLE));
    let flipped = near_miss(HANDLE, NearMiss::CaseFlipped).unwrap();
    assert!(flipped.eq_ignore_ascii_case(HANDLE) && flipped != HANDLE);
    assert!(flipped.starts_with("sGhYnG"));
    // A hex handle stays hex; a digits-only one has no case to flip.
    let hex = near_miss("00ff", NearMiss::LastChar).unwrap();
    assert_eq!(hex, "00f0");
    assert_eq!(near_miss("1234", NearMiss::CaseFlipped), None);
    assert_eq!(near_miss("", NearMiss::LastChar), None);
    assert_eq!(near_miss("a", NearMiss::Truncated), None);
}

#[test]
fn a_random_guess_has_the_length_and_alphabet_of_the_handle() {
    let (a, b) = (random_like(HANDLE).unwrap(), random_like(HANDLE).unwrap());
    assert_eq!(a.len(), HANDLE.len());
    assert_ne!(a, b);
    let alphabet = Alphabet::of(&[HANDLE]);
    assert!(a.chars().all(|c| alphabet.chars.contains(&c)), "{a}");
    let hex = random_like("0123456789abcdef0123456789abcdef").unwrap();
    assert!(hex.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{hex}");
}

#[test]
fn tool_names_split_into_words() {
    assert_eq!(name_words("basket_create"), ["basket", "create"]);
    assert_eq!(name_words("createBasket"), ["create", "basket"]);
    assert_eq!(name_words("cart.new-v2"), ["cart", "new", "v2"]);
    let tool =
        |name: &str| Tool { name: name.into(), input: Value::Null, output: Value::Null, annotations: Value::Null };
    assert!(tool("basket_checkout").named(CONSUMING_WORDS));
    assert!(!tool("basket_add_item").named(CONSUMING_WORDS));
    assert!(!tool("append_note").named(CONSUMING_WORDS), "a word, not a substring");
    assert!(tool("basket_view").named(READ_WORDS));
}

#[test]
fn required_arguments_are_filled_from_their_schemas() {
    let tool = Tool {
        name: "basket_add_item".into(),
        input: json!({ "type": "object", "required": ["sku", "quantity", "basket"], "properties": {
            "basket": { "type": "string", "minLength": 43 },
            "sku": { "type": "string", "description": "Stock-keeping unit, e.g. `TEA-001`." },
            "quantity": { "type": "integer", "minimum": 1, "maximum": 99 },
            "note": { "type": "string" } } }),
        output: Value::Null,
        annotations: Value::Null,
    };
    assert_eq!(arguments(&tool, "basket", "h"), json!({ "basket": "h", "sku": "TEA-001", "quantity": 1 }));
    assert_eq!(example(&json!({ "enum": ["a", "b"] })), json!("a"));
    assert_eq!(example(&json!({ "type": "boolean" })), json!(false));
    assert_eq!(example(&json!({ "type": "string", "minLength": 3 })), json!("xxx"));
    assert_eq!(described_example("no example here"), None);
}

#[test]
fn scopes_are_read_from_a_jwt_payload_and_expiry_from_a_result() {
    let payload = URL_SAFE_NO_PAD.encode(r#"{"sub":"alice","scope":"shop:read shop:basket"}"#);
    let scopes = token_scopes(&format!("eyJhbGciOiJub25lIn0.{payload}.sig")).unwrap();
    assert_eq!(scopes.into_iter().collect::<Vec<_>>(), ["shop:basket", "shop:read"]);
    let scp = URL_SAFE_NO_PAD.encode(r#"{"scp":["a"]}"#);
    assert_eq!(token_scopes(&format!("h.{scp}.s")).unwrap().len(), 1);
    assert_eq!(token_scopes("opaque-token"), None);
    assert_eq!(announced_expiry_ms(&json!({ "expiresIn": 2 })), Some(2000));
    assert_eq!(announced_expiry_ms(&json!({ "ttlMs": 1500 })), Some(1500));
    assert_eq!(announced_expiry_ms(&json!({ "basket": "x" })), None);
}

#[test]
fn refusals_include_tool_errors() {
    let exchange = |frame: Value, status: u16| Exchange::answered(json!(1), status, vec![frame]);
    let ok = exchange(json!({ "id": 1, "result": { "structuredContent": { "items": [] } } }), 200);
    let tool_error = exchange(json!({ "id": 1, "result": { "isError": true, "content": [] } }), 200);
    let rpc_error = exchange(json!({ "id": 1, "error": { "code": -32602, "message": "m" } }), 400);
    assert!(served(&ok) && !served(&tool_error) && !served(&rpc_error));
    assert_eq!(judge(&tool_error).0, Judgement::Refused);
    assert_eq!(judge(&rpc_error).0, Judgement::Refused);
    assert!(matches!(judge(&ok).0, Judgement::Accepted(_)));
    assert_ne!(signature(&tool_error), signature(&rpc_error));
    const CHECK: Check =
        Check { id: "handles.test", title: "t", requirement: "r", severity: crate::check::Severity::High };
    assert_eq!(pair(&CHECK, &[], &tool_error, &rpc_error).verdict, Verdict::Inconclusive);
    assert_eq!(pair(&CHECK, &[], &ok, &rpc_error).verdict, Verdict::Pass);
    assert_eq!(pair(&CHECK, &[], &ok, &ok).verdict, Verdict::Fail);
}
