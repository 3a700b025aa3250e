//! `Mcp-*` header values: the `=?base64?…?=` form for values that are not plain visible ASCII,
//! and comparison of a header value with the JSON value it mirrors.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

const PREFIX: &str = "=?base64?";
const SUFFIX: &str = "?=";

/// A header value that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderValueError {
    /// The value is not valid UTF-8 / visible ASCII.
    #[error("header value is not visible ASCII")]
    NotAscii,
    /// The `=?base64?…?=` payload is not valid base64 or not UTF-8.
    #[error("header value has an invalid base64 encoding")]
    BadBase64,
}

/// Decodes a header value: plain visible ASCII as-is, `=?base64?…?=` as UTF-8 of the payload.
pub fn decode_value(raw: &[u8]) -> Result<String, HeaderValueError> {
    if !raw.iter().all(|b| (0x20..=0x7e).contains(b) || *b == b'\t') {
        return Err(HeaderValueError::NotAscii);
    }
    let text = std::str::from_utf8(raw).map_err(|_| HeaderValueError::NotAscii)?;
    let text = text.trim_matches(|c| c == ' ' || c == '\t');
    match text.strip_prefix(PREFIX).and_then(|rest| rest.strip_suffix(SUFFIX)) {
        Some(payload) => {
            let bytes = STANDARD.decode(payload).map_err(|_| HeaderValueError::BadBase64)?;
            String::from_utf8(bytes).map_err(|_| HeaderValueError::BadBase64)
        }
        None => Ok(text.to_owned()),
    }
}

/// Decodes a header value that has no encoded form (`Mcp-Method`, `MCP-Protocol-Version`): plain
/// visible ASCII, surrounding blanks trimmed. The `=?base64?…?=` form is defined for `Mcp-Name`
/// and `Mcp-Param-*` only; here it is taken literally (and so matches nothing).
pub fn decode_plain_value(raw: &[u8]) -> Result<String, HeaderValueError> {
    if !raw.iter().all(|b| (0x20..=0x7e).contains(b) || *b == b'\t') {
        return Err(HeaderValueError::NotAscii);
    }
    let text = std::str::from_utf8(raw).map_err(|_| HeaderValueError::NotAscii)?;
    Ok(text.trim_matches(|c| c == ' ' || c == '\t').to_owned())
}

/// Encodes a value for a header, choosing the base64 form when the plain form would be unsafe.
pub fn encode_value(value: &str) -> String {
    let visible = |b: u8| (0x21..=0x7e).contains(&b) || b == b' ';
    let is_sentinel = value.starts_with(PREFIX) && value.ends_with(SUFFIX);
    let edges_safe = !(value.starts_with(' ') || value.ends_with(' '));
    let plain_safe = !value.is_empty() && value.bytes().all(visible) && edges_safe && !is_sentinel;
    if plain_safe { value.to_owned() } else { format!("{PREFIX}{}{SUFFIX}", STANDARD.encode(value)) }
}

/// Whether a decoded header value stands for `value`: strings exactly, integers numerically,
/// booleans as `true`/`false`. Other JSON types never match.
pub fn matches_json(decoded: &str, value: &Value) -> bool {
    match value {
        Value::String(s) => decoded == s,
        Value::Bool(b) => decoded == if *b { "true" } else { "false" },
        // Only integer properties may be mirrored; compare them as numbers ("042" == 42).
        Value::Number(n) => match (n.as_i64(), decoded.parse::<i64>()) {
            (Some(expected), Ok(got)) => expected == got,
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips() {
        for value in ["plain", "with space inside", " leading", "trailing ", "héllo", "line\nbreak", "", "=?base64?x?="]
        {
            let encoded = encode_value(value);
            assert_eq!(decode_value(encoded.as_bytes()).unwrap(), value, "{encoded}");
        }
        assert_eq!(encode_value("plain"), "plain");
        assert!(encode_value("héllo").starts_with("=?base64?"));
    }

    #[test]
    fn plain_values_have_no_encoded_form() {
        assert_eq!(decode_plain_value(b" tools/call ").unwrap(), "tools/call");
        let encoded = encode_value("tools/call ");
        assert!(encoded.starts_with(PREFIX));
        assert_eq!(decode_plain_value(encoded.as_bytes()).unwrap(), encoded, "taken literally");
        assert_eq!(decode_plain_value(&[0xc3, 0xa9]), Err(HeaderValueError::NotAscii));
    }

    #[test]
    fn bad_values() {
        assert_eq!(decode_value(b"=?base64?!!!?="), Err(HeaderValueError::BadBase64));
        assert_eq!(decode_value(&[0xff, 0x41]), Err(HeaderValueError::NotAscii));
        assert_eq!(decode_value(b"a\x01b"), Err(HeaderValueError::NotAscii));
    }

    #[test]
    fn json_comparison() {
        assert!(matches_json("42", &json!(42)));
        assert!(matches_json("042", &json!(42)));
        assert!(!matches_json("42", &json!("43")));
        assert!(matches_json("true", &json!(true)));
        assert!(!matches_json("True", &json!(true)));
        assert!(!matches_json("x", &json!(null)));
        assert!(!matches_json("1", &json!([1])));
        assert!(!matches_json("1.5", &json!(1.5)), "non-integer numbers are never mirrored");
    }
}
