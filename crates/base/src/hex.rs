//! Lower-case hex of bytes (digests, ids, trace ids), and the short prefix used to correlate a
//! digest in logs and `Debug` output.

/// Lower-case hex of `bytes`: one allocation, no formatter.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

/// The first 8 bytes of a digest, in hex: enough to correlate, useless to forge.
pub fn hex_prefix(digest: &[u8]) -> String {
    hex(&digest[..digest.len().min(8)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_matches_the_formatter() {
        let bytes: Vec<u8> = (0..=255).collect();
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&bytes), expected);
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn prefix_is_the_first_eight_bytes_or_fewer() {
        let digest: Vec<u8> = (0xf0..=0xff).collect();
        assert_eq!(hex_prefix(&digest), "f0f1f2f3f4f5f6f7");
        assert_eq!(hex_prefix(&[0xab, 0x01]), "ab01");
        assert_eq!(hex_prefix(&[]), "");
    }
}
