//! Canonical standard base64 (RFC 4648 §4, padded): one spelling per byte string, so a signed
//! envelope cannot be re-encoded into a different-looking but equal document.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// Why a base64 field was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Base64Error {
    /// Characters outside the standard alphabet, misplaced padding, or an undecodable length.
    #[error("not standard base64")]
    Invalid,
    /// Decodes, but is not the one canonical spelling (missing padding, non-zero trailing bits), or
    /// decodes to nothing.
    #[error("not canonical base64")]
    NonCanonical,
}

/// Encodes bytes as canonical standard base64.
pub fn encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Decodes `text` only if it is the canonical standard base64 of a non-empty byte string.
pub fn decode_canonical(text: &str) -> Result<Vec<u8>, Base64Error> {
    let body = text.trim_end_matches('=');
    let padding = text.len() - body.len();
    if body.is_empty()
        || padding > 2
        || !body.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'+' || byte == b'/')
    {
        return Err(Base64Error::Invalid);
    }
    let decoded = STANDARD
        .decode(text)
        .map_err(|_| if !text.len().is_multiple_of(4) { Base64Error::NonCanonical } else { Base64Error::Invalid })?;
    if decoded.is_empty() || STANDARD.encode(&decoded) != text {
        return Err(Base64Error::NonCanonical);
    }
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_only() {
        assert_eq!(decode_canonical("aGk="), Ok(b"hi".to_vec()));
        assert_eq!(decode_canonical("aGk"), Err(Base64Error::NonCanonical));
        assert!(decode_canonical("aGl=").is_err(), "non-zero trailing bits");
        assert!(decode_canonical("aGk==").is_err());
        assert!(decode_canonical("aG k=").is_err());
        assert!(decode_canonical("aGk=\n").is_err());
        assert!(decode_canonical("aGk-").is_err(), "url-safe alphabet");
        assert!(decode_canonical("").is_err());
        assert!(decode_canonical("====").is_err());
    }
}
