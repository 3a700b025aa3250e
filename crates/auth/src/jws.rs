//! Structural parsing of a compact JWS (RFC 7515 §7.1) before any key is touched: exactly three
//! non-empty strict-base64url segments, a JOSE header that is a JSON object without duplicate
//! members, an `alg` from our fixed list, and no `crit`/`b64`/`enc`/`zip`.
//!
//! The header's `jku`, `jwk`, `x5u` and `x5c` are never read: keys come only from the issuer's
//! configured JWKS.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::{InvalidTokenReason, Segment};

/// The only signature algorithms this crate ever verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum JwsAlgorithm {
    /// ECDSA P-256 with SHA-256, fixed-size `r || s` signature.
    Es256,
    /// Ed25519.
    EdDsa,
    /// RSASSA-PKCS1-v1_5 with SHA-256, 2048–8192-bit keys.
    Rs256,
}

impl JwsAlgorithm {
    /// The JOSE `alg` name (RFC 7518), compared case-sensitively.
    pub(crate) fn name(self) -> &'static str {
        match self {
            JwsAlgorithm::Es256 => "ES256",
            JwsAlgorithm::EdDsa => "EdDSA",
            JwsAlgorithm::Rs256 => "RS256",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        [JwsAlgorithm::Es256, JwsAlgorithm::EdDsa, JwsAlgorithm::Rs256].into_iter().find(|alg| alg.name() == name)
    }

    pub(crate) fn from_jsonwebtoken(alg: jsonwebtoken::Algorithm) -> Option<Self> {
        match alg {
            jsonwebtoken::Algorithm::ES256 => Some(JwsAlgorithm::Es256),
            jsonwebtoken::Algorithm::EdDSA => Some(JwsAlgorithm::EdDsa),
            jsonwebtoken::Algorithm::RS256 => Some(JwsAlgorithm::Rs256),
            _ => None,
        }
    }
}

/// A compact JWS split into its parts; nothing verified yet.
pub(crate) struct CompactJws<'t> {
    /// `BASE64URL(header) || '.' || BASE64URL(payload)`: the bytes the signature covers.
    pub(crate) signing_input: &'t [u8],
    pub(crate) header: JoseHeader,
    /// The decoded payload JSON object (unverified).
    pub(crate) payload: Map<String, Value>,
    pub(crate) signature: Vec<u8>,
}

/// The JOSE header members we act on.
pub(crate) struct JoseHeader {
    pub(crate) alg: JwsAlgorithm,
    pub(crate) kid: Option<String>,
    pub(crate) typ: Option<String>,
}

impl<'t> CompactJws<'t> {
    pub(crate) fn parse(token: &'t str) -> Result<Self, InvalidTokenReason> {
        let segments = token.split('.').count();
        if segments == 5 {
            return Err(InvalidTokenReason::Encrypted);
        }
        if segments != 3 {
            return Err(InvalidTokenReason::NotCompactJws { segments });
        }
        let mut parts = token.split('.');
        let (Some(header_b64), Some(payload_b64), Some(signature_b64)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(InvalidTokenReason::NotCompactJws { segments });
        };
        // Header first, so an unsigned `alg: none` token is reported as such.
        let header_json = decode_segment(header_b64, Segment::Header)?;
        let header = JoseHeader::parse(&header_json)?;
        let payload_json = decode_segment(payload_b64, Segment::Payload)?;
        let payload = parse_object(&payload_json, Segment::Payload)?;
        let signature = decode_segment(signature_b64, Segment::Signature)?;
        let signing_input = &token.as_bytes()[..header_b64.len() + 1 + payload_b64.len()];
        Ok(Self { signing_input, header, payload, signature })
    }
}

impl JoseHeader {
    fn parse(json: &[u8]) -> Result<Self, InvalidTokenReason> {
        let object = parse_object(json, Segment::Header)?;
        // Extensions we do not implement must make the token invalid (RFC 7515 §4.1.11); an
        // unencoded payload (RFC 7797 `b64`) is one such extension.
        if object.contains_key("crit") || object.contains_key("b64") {
            return Err(InvalidTokenReason::CriticalHeader);
        }
        if object.contains_key("enc") || object.contains_key("zip") {
            return Err(InvalidTokenReason::Encrypted);
        }
        let alg = match object.get("alg") {
            Some(Value::String(name)) => {
                JwsAlgorithm::from_name(name).ok_or(InvalidTokenReason::UnsupportedAlgorithm)?
            }
            Some(_) => return Err(InvalidTokenReason::MalformedJson(Segment::Header)),
            None => return Err(InvalidTokenReason::UnsupportedAlgorithm),
        };
        let kid = optional_string(&object, "kid")?;
        let typ = optional_string(&object, "typ")?;
        Ok(Self { alg, kid, typ })
    }
}

fn optional_string(object: &Map<String, Value>, name: &str) -> Result<Option<String>, InvalidTokenReason> {
    match object.get(name) {
        None => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.clone())),
        Some(_) => Err(InvalidTokenReason::MalformedJson(Segment::Header)),
    }
}

/// Strict unpadded base64url: no `=`, no non-alphabet bytes, no non-zero trailing bits.
fn decode_segment(part: &str, segment: Segment) -> Result<Vec<u8>, InvalidTokenReason> {
    if part.is_empty() {
        return Err(InvalidTokenReason::EmptySegment(segment));
    }
    URL_SAFE_NO_PAD.decode(part).map_err(|_| InvalidTokenReason::BadBase64(segment))
}

fn parse_object(json: &[u8], segment: Segment) -> Result<Map<String, Value>, InvalidTokenReason> {
    serde_json::from_slice::<StrictObject>(json)
        .map(|object| object.0)
        .map_err(|_| InvalidTokenReason::MalformedJson(segment))
}

/// A top-level JSON object that refuses duplicate member names, so two parties cannot read
/// different `alg`, `iss` or `aud` values out of the same bytes.
pub(crate) struct StrictObject(pub(crate) Map<String, Value>);

impl<'de> Deserialize<'de> for StrictObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;

        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = StrictObject;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object without duplicate members")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<StrictObject, A::Error> {
                let mut map = Map::new();
                while let Some(key) = access.next_key::<String>()? {
                    if map.contains_key(&key) {
                        return Err(de::Error::custom("duplicate member"));
                    }
                    let value: Value = access.next_value()?;
                    map.insert(key, value);
                }
                Ok(StrictObject(map))
            }
        }

        deserializer.deserialize_map(ObjectVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn token(header: &str, payload: &str) -> String {
        format!("{}.{}.{}", b64(header.as_bytes()), b64(payload.as_bytes()), b64(b"sig"))
    }

    fn reason(token: &str) -> InvalidTokenReason {
        match CompactJws::parse(token) {
            Ok(_) => panic!("{token:?} unexpectedly parsed"),
            Err(reason) => reason,
        }
    }

    #[test]
    fn parses_a_well_formed_token() {
        let t = token(r#"{"alg":"ES256","kid":"k1","typ":"at+jwt"}"#, r#"{"sub":"alice"}"#);
        let jws = CompactJws::parse(&t).expect("parses");
        assert_eq!(jws.header.alg, JwsAlgorithm::Es256);
        assert_eq!(jws.header.kid.as_deref(), Some("k1"));
        assert_eq!(jws.header.typ.as_deref(), Some("at+jwt"));
        assert_eq!(jws.payload.get("sub"), Some(&Value::String("alice".into())));
        assert_eq!(jws.signature, b"sig");
        let dot = t.rfind('.').expect("has dots");
        assert_eq!(jws.signing_input, &t.as_bytes()[..dot]);
    }

    #[test]
    fn structural_refusals() {
        let good_header = b64(br#"{"alg":"ES256","kid":"k"}"#);
        let good_payload = b64(br#"{"sub":"a"}"#);
        assert_eq!(reason("a.b"), InvalidTokenReason::NotCompactJws { segments: 2 });
        assert_eq!(reason("abc"), InvalidTokenReason::NotCompactJws { segments: 1 });
        assert_eq!(reason("a.b.c.d"), InvalidTokenReason::NotCompactJws { segments: 4 });
        assert_eq!(reason("a.b.c.d.e"), InvalidTokenReason::Encrypted);
        assert_eq!(
            reason(&format!("{good_header}.{good_payload}.")),
            InvalidTokenReason::EmptySegment(Segment::Signature)
        );
        assert_eq!(reason(&format!("{good_header}..c2ln")), InvalidTokenReason::EmptySegment(Segment::Payload));
        assert_eq!(reason("..."), InvalidTokenReason::NotCompactJws { segments: 4 });
        let unsigned_none = format!("{}.{good_payload}.", b64(br#"{"alg":"none"}"#));
        assert_eq!(reason(&unsigned_none), InvalidTokenReason::UnsupportedAlgorithm);
        assert_eq!(reason(&format!(".{good_payload}.c2ln")), InvalidTokenReason::EmptySegment(Segment::Header));
        assert_eq!(
            reason(&format!("{good_header}.{good_payload}=.c2ln")),
            InvalidTokenReason::BadBase64(Segment::Payload)
        );
        assert_eq!(
            reason(&format!("{good_header}.{good_payload}.c2l+")),
            InvalidTokenReason::BadBase64(Segment::Signature)
        );
        // Non-zero trailing bits: "c2k" is canonical for "si", "c2x" is not.
        assert_eq!(
            reason(&format!("{good_header}.{good_payload}.c2x")),
            InvalidTokenReason::BadBase64(Segment::Signature)
        );
    }

    #[test]
    fn header_refusals() {
        let p = r#"{"sub":"a"}"#;
        let cases: &[(&str, InvalidTokenReason)] = &[
            (r#"{"alg":"none"}"#, InvalidTokenReason::UnsupportedAlgorithm),
            (r#"{"alg":"HS256"}"#, InvalidTokenReason::UnsupportedAlgorithm),
            (r#"{"alg":"es256"}"#, InvalidTokenReason::UnsupportedAlgorithm),
            (r#"{"kid":"k"}"#, InvalidTokenReason::UnsupportedAlgorithm),
            (r#"{"alg":7}"#, InvalidTokenReason::MalformedJson(Segment::Header)),
            (r#"{"alg":"ES256","kid":1}"#, InvalidTokenReason::MalformedJson(Segment::Header)),
            (r#"{"alg":"ES256","alg":"none"}"#, InvalidTokenReason::MalformedJson(Segment::Header)),
            (r#"{"alg":"ES256","crit":["exp"],"exp":1}"#, InvalidTokenReason::CriticalHeader),
            (r#"{"alg":"ES256","b64":false,"crit":["b64"]}"#, InvalidTokenReason::CriticalHeader),
            (r#"{"alg":"ES256","enc":"A256GCM"}"#, InvalidTokenReason::Encrypted),
            (r#"["alg","ES256"]"#, InvalidTokenReason::MalformedJson(Segment::Header)),
            (r#"{"alg":"ES256"} x"#, InvalidTokenReason::MalformedJson(Segment::Header)),
            ("not json", InvalidTokenReason::MalformedJson(Segment::Header)),
        ];
        for (header, expected) in cases {
            assert_eq!(reason(&token(header, p)), *expected, "{header}");
        }
    }

    #[test]
    fn payload_must_be_an_object_without_duplicates() {
        let h = r#"{"alg":"ES256"}"#;
        for payload in [r#"[1,2]"#, r#""str""#, "42", r#"{"sub":"a","sub":"b"}"#, "{", "[".repeat(200).as_str()] {
            assert_eq!(reason(&token(h, payload)), InvalidTokenReason::MalformedJson(Segment::Payload), "{payload}");
        }
        // Nested duplicates are only data, not claims: accepted structurally.
        assert!(CompactJws::parse(&token(h, r#"{"x":{"a":1,"a":2}}"#)).is_ok());
    }

    #[test]
    fn algorithm_names_are_exact() {
        assert_eq!(JwsAlgorithm::from_name("ES256"), Some(JwsAlgorithm::Es256));
        assert_eq!(JwsAlgorithm::from_name("EdDSA"), Some(JwsAlgorithm::EdDsa));
        assert_eq!(JwsAlgorithm::from_name("RS256"), Some(JwsAlgorithm::Rs256));
        assert_eq!(JwsAlgorithm::from_name("EDDSA"), None);
        assert_eq!(JwsAlgorithm::from_name("PS256"), None);
    }
}
