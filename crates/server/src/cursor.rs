//! Opaque pagination cursors: an offset into a deterministic list, tagged with HMAC-SHA256 and
//! bound to the list kind, so a forged, edited or cross-list cursor is `-32602`.

use aws_lc_rs::hmac;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::secret::ServerSecret;

/// Mints and reads cursors.
pub struct Cursors {
    key: hmac::Key,
}

impl Cursors {
    /// Cursors keyed from the server secret.
    pub fn new(secret: &ServerSecret) -> Self {
        Self { key: secret.derive("palisade/cursor/v1") }
    }

    /// A cursor pointing at `offset` of the list `kind`.
    pub fn mint(&self, kind: &str, offset: usize) -> String {
        let body = format!("{kind}:{offset}");
        let tag = hmac::sign(&self.key, body.as_bytes());
        format!("{}.{}", URL_SAFE_NO_PAD.encode(offset.to_string()), URL_SAFE_NO_PAD.encode(&tag.as_ref()[..16]))
    }

    /// The offset a cursor points at: `Some(0)` for the empty cursor, `None` when invalid.
    pub fn read(&self, kind: &str, cursor: &str) -> Option<usize> {
        if cursor.is_empty() {
            return Some(0);
        }
        let (offset, tag) = cursor.split_once('.')?;
        let offset: usize = String::from_utf8(URL_SAFE_NO_PAD.decode(offset).ok()?).ok()?.parse().ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        let expected = hmac::sign(&self.key, format!("{kind}:{offset}").as_bytes());
        let equal = tag.len() == 16 && subtle::ConstantTimeEq::ct_eq(&expected.as_ref()[..16], tag.as_slice()).into();
        equal.then_some(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_bound_and_tamper_evident() {
        let cursors = Cursors::new(&ServerSecret::from_bytes([1; 32]));
        let c = cursors.mint("tools", 5);
        assert_eq!(cursors.read("tools", &c), Some(5));
        assert_eq!(cursors.read("tools", ""), Some(0));
        assert_eq!(cursors.read("prompts", &c), None);
        let forged = format!("{}.{}", URL_SAFE_NO_PAD.encode("6"), c.split_once('.').unwrap().1);
        assert_eq!(cursors.read("tools", &forged), None);
        assert_eq!(cursors.read("tools", "nonsense"), None);
        assert_eq!(cursors.read("tools", "."), None);
    }
}
