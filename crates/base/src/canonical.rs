//! Canonical JSON: the JSON Canonicalization Scheme of RFC 8785 (JCS), for bytes that are hashed
//! or signed and must not depend on how a writer ordered keys or spelled numbers. Object members
//! are sorted by the UTF-16 code units of their names, numbers are printed as ECMAScript prints
//! an IEEE 754 double, strings use the minimal escapes, no white space. An external verifier with
//! any RFC 8785 implementation recomputes the same bytes.

use std::io::Write as _;

use serde_json::Value;

/// The largest integer an IEEE 754 double holds exactly (2^53 − 1). RFC 8785 prints every number
/// as a double, so an integer above this (or below its negation) is rounded in canonical form:
/// bytes meant to be hashed or signed keep their integers within this bound.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The RFC 8785 canonical bytes of `value`.
///
/// Serializing a `serde_json::Value` cannot fail (its keys are strings, its numbers finite); were
/// it to, the result would be empty, which is no JSON text, so nothing hashed or signed over it
/// matches real content.
pub fn canonical_bytes(value: &Value) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(value).unwrap_or_default()
}

/// [`canonical_bytes`] as a string (the canonical form is UTF-8).
pub fn canonical_string(value: &Value) -> String {
    String::from_utf8(canonical_bytes(value)).unwrap_or_default()
}

/// Writes one JSON object's canonical form straight from a type's fields, without a `Value` tree
/// or the generic writer's buffering and sorting: for the records hashed or signed on a hot path
/// (an audit record, a kill-switch head). **The caller gives the members sorted** by RFC 8785's
/// order (for ASCII names, byte order) and writes each once; every type written this way keeps a
/// test comparing its bytes with [`canonical_bytes`] of its `serde_json` value.
pub struct CanonicalObject<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> CanonicalObject<'a> {
    /// Opens an object at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        CanonicalObject { out, first: true }
    }

    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        write_string(self.out, key);
        self.out.push(b':');
    }

    /// An unsigned integer member (above [`MAX_SAFE_INTEGER`], printed as RFC 8785 prints the
    /// double it becomes).
    pub fn unsigned(&mut self, key: &str, value: u64) {
        self.key(key);
        write_unsigned(self.out, value);
    }

    /// An unsigned integer member spelled exactly, whatever its size: the same as
    /// [`unsigned`](Self::unsigned) up to [`MAX_SAFE_INTEGER`], beyond it not RFC 8785 (which
    /// rounds). For a record that refuses such integers anyway and must keep its historic bytes
    /// (the audit record).
    pub fn unsigned_exact(&mut self, key: &str, value: u64) {
        self.key(key);
        // Writing into a Vec cannot fail.
        let _ = write!(self.out, "{value}");
    }

    /// [`unsigned_exact`](Self::unsigned_exact) for a signed integer.
    pub fn signed_exact(&mut self, key: &str, value: i64) {
        self.key(key);
        // Writing into a Vec cannot fail.
        let _ = write!(self.out, "{value}");
    }

    /// A string member.
    pub fn text(&mut self, key: &str, value: &str) {
        self.key(key);
        write_string(self.out, value);
    }

    /// A string member, left out when `None` (as `skip_serializing_if = "Option::is_none"`).
    pub fn optional_text(&mut self, key: &str, value: Option<&str>) {
        if let Some(value) = value {
            self.text(key, value);
        }
    }

    /// A string member, `null` when `None` (as a plain `Option<String>` field).
    pub fn text_or_null(&mut self, key: &str, value: Option<&str>) {
        self.key(key);
        match value {
            Some(value) => write_string(self.out, value),
            None => self.out.extend_from_slice(b"null"),
        }
    }

    /// An array-of-strings member.
    pub fn texts(&mut self, key: &str, values: &[String]) {
        self.key(key);
        self.out.push(b'[');
        for (index, value) in values.iter().enumerate() {
            if index > 0 {
                self.out.push(b',');
            }
            write_string(self.out, value);
        }
        self.out.push(b']');
    }

    /// An object member, written by `write` into the nested object it is given.
    pub fn object(&mut self, key: &str, write: impl FnOnce(&mut CanonicalObject<'_>)) {
        self.key(key);
        let mut nested = CanonicalObject::new(self.out);
        write(&mut nested);
        nested.end();
    }

    /// An array-of-objects member: each item written by `write` into an object of its own.
    pub fn objects<T>(&mut self, key: &str, items: &[T], mut write: impl FnMut(&mut CanonicalObject<'_>, &T)) {
        self.key(key);
        self.out.push(b'[');
        for (index, item) in items.iter().enumerate() {
            if index > 0 {
                self.out.push(b',');
            }
            let mut nested = CanonicalObject::new(self.out);
            write(&mut nested, item);
            nested.end();
        }
        self.out.push(b']');
    }

    /// Closes the object.
    pub fn end(self) {
        self.out.push(b'}');
    }
}

fn write_unsigned(out: &mut Vec<u8>, value: u64) {
    if value <= MAX_SAFE_INTEGER {
        // Writing into a Vec cannot fail.
        let _ = write!(out, "{value}");
    } else {
        out.extend(canonical_bytes(&Value::from(value)));
    }
}

/// A JSON string exactly as `serde_json` writes one: `\"`, `\\`, `\b \f \n \r \t`, other
/// control characters as `\u00xx` (lower-case hex), everything else as itself. That is RFC 8785's
/// escaping (§3.2.2.2) for every Rust string (which holds no lone surrogate).
fn write_string(out: &mut Vec<u8>, value: &str) {
    // The common case (digests, ids, times): nothing to escape, so the bytes as they are.
    if value.bytes().all(|byte| byte >= 0x20 && byte != b'"' && byte != b'\\') {
        out.reserve(value.len() + 2);
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
        return;
    }
    // Writing a string into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.extend_from_slice(b"\"\"");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canonical_of(text: &str) -> String {
        canonical_string(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn key_order_does_not_change_the_bytes() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,"x"],"x":null}}"#).unwrap();
        let b = json!({"a": {"x": null, "y": [1, "x"]}, "b": 1});
        assert_eq!(canonical_bytes(&a), canonical_bytes(&b));
        assert_eq!(canonical_bytes(&a), br#"{"a":{"x":null,"y":[1,"x"]},"b":1}"#.to_vec());
    }

    /// RFC 8785 §3.2.3: members sorted by UTF-16 code units. U+1F600 (a surrogate pair starting
    /// 0xD83D) sorts before U+FB33, although its UTF-8 bytes (F0 …) sort after (EF …): a
    /// byte-order writer gets this wrong.
    #[test]
    fn members_sort_by_utf16_code_units() {
        let input = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
            \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
            \"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(canonical_of(input), expected);
    }

    /// RFC 8785 §3.2.2: the worked example (numbers, escapes, literals).
    #[test]
    fn the_rfc_worked_example() {
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        let expected = "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\
            \"string\":\"\u{20ac}$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";
        assert_eq!(canonical_of(input), expected);
    }

    /// ECMAScript number printing (RFC 8785 §3.2.2.3 and Appendix B), where serde_json's own
    /// printing differs (`1e21`, `1e-6`, `-0.0`, exact integers above 2^53).
    #[test]
    fn numbers_print_as_ecmascript_doubles() {
        for (input, expected) in [
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("4.50", "4.5"),
            ("9007199254740991", "9007199254740991"),
            ("9007199254740993", "9007199254740992"),
            ("-9007199254740993", "-9007199254740992"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("5e-324", "5e-324"),
        ] {
            assert_eq!(canonical_of(input), expected, "{input}");
        }
        assert_eq!(canonical_string(&json!(MAX_SAFE_INTEGER)), "9007199254740991");
    }

    #[test]
    fn strings_use_the_minimal_escapes() {
        let value = json!("\u{0}\u{8}\t\n\u{c}\r\u{1f}\"\\/\u{7f}\u{2028}é🦀");
        assert_eq!(canonical_string(&value), "\"\\u0000\\b\\t\\n\\f\\r\\u001f\\\"\\\\/\u{7f}\u{2028}é🦀\"");
    }
}
