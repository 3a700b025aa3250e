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

/// 32 bytes from exactly 64 lower-case hex digits (what [`hex`] writes); anything else is `None`.
pub fn decode32(text: &str) -> Option<[u8; 32]> {
    let digit = |byte: u8| match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    };
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (index, byte) in out.iter_mut().enumerate() {
        *byte = (digit(bytes[2 * index])? << 4) | digit(bytes[2 * index + 1])?;
    }
    Some(out)
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
    fn decode32_reads_exactly_what_hex_writes() {
        let bytes: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(37));
        assert_eq!(decode32(&hex(&bytes)), Some(bytes));
        let text = hex(&bytes);
        assert_eq!(decode32(&text.to_uppercase()), None, "upper case");
        assert_eq!(decode32(&text[1..]), None, "63 digits");
        assert_eq!(decode32(&format!("{text}0")), None, "65 digits");
        assert_eq!(decode32(&format!("+{}", &text[1..])), None, "a sign");
        assert_eq!(decode32(&format!("{}é", &text[..62])), None, "not ASCII");
    }

    #[test]
    fn prefix_is_the_first_eight_bytes_or_fewer() {
        let digest: Vec<u8> = (0xf0..=0xff).collect();
        assert_eq!(hex_prefix(&digest), "f0f1f2f3f4f5f6f7");
        assert_eq!(hex_prefix(&[0xab, 0x01]), "ab01");
        assert_eq!(hex_prefix(&[]), "");
    }
}
