//! Strict parsing of the `Authorization` request header into one bearer token (RFC 6750 §2.1,
//! RFC 7235 `token68`). Nothing here looks inside the token.

use crate::error::{AuthError, HeaderProblem};

/// Largest `Authorization` header value accepted, in bytes. Access tokens from real IdPs are
/// 1–3 KiB; anything past this is refused before any parsing or hashing work.
pub const MAX_AUTHORIZATION_BYTES: usize = 8 * 1024;

/// Extracts the token from `Bearer <token68>`.
///
/// The scheme is case-insensitive; exactly one space separates it from the token; the token is
/// one `token68` (`A-Z a-z 0-9 - . _ ~ + /` then optional trailing `=`); nothing else may follow.
pub(crate) fn bearer_token(authorization: Option<&[u8]>) -> Result<&str, AuthError> {
    let Some(value) = authorization else {
        return Err(AuthError::MissingCredentials);
    };
    if value.len() > MAX_AUTHORIZATION_BYTES {
        return Err(HeaderProblem::TooLarge.into());
    }
    // Space or visible ASCII (0x20..=0x7e). A fold with no early exit is branch-free, which
    // lets the compiler check many bytes per instruction (the header is hundreds of bytes).
    if !value.iter().fold(true, |ok, &b| ok & (b.wrapping_sub(b' ') < 0x5f)) {
        return Err(HeaderProblem::NotVisibleAscii.into());
    }
    // Every byte is ASCII, so this cannot fail; refuse rather than unwrap all the same.
    let value = std::str::from_utf8(value).map_err(|_| HeaderProblem::NotVisibleAscii)?;
    if value.is_empty() {
        return Err(AuthError::MissingCredentials);
    }
    if value.starts_with(' ') {
        return Err(HeaderProblem::ExtraWhitespace.into());
    }
    let (scheme, credentials) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(HeaderProblem::UnsupportedScheme.into());
    }
    if credentials.is_empty() {
        return Err(HeaderProblem::MissingToken.into());
    }
    if credentials.starts_with(' ') || credentials.ends_with(' ') {
        return Err(HeaderProblem::ExtraWhitespace.into());
    }
    if !is_token68(credentials) {
        return Err(HeaderProblem::NotToken68.into());
    }
    Ok(credentials)
}

/// RFC 7235 §2.1: `token68 = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
/// Every request's token (hundreds of bytes) passes through here: the bytes are judged by
/// comparisons folded without an early exit, branch-free, so the compiler vectorizes the loop.
fn is_token68(credentials: &str) -> bool {
    let body = credentials.trim_end_matches('=');
    !body.is_empty() && body.bytes().fold(true, |ok, b| ok & is_token68_body(b))
}

/// A byte allowed before the trailing `=`s of a token68.
#[inline(always)]
fn is_token68_body(b: u8) -> bool {
    let letter = (b | 0x20).wrapping_sub(b'a') < 26;
    let digit = b.wrapping_sub(b'0') < 10;
    let mark = (b == b'-') | (b == b'.') | (b == b'_') | (b == b'~') | (b == b'+') | (b == b'/');
    letter | digit | mark
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> Result<&str, AuthError> {
        bearer_token(Some(value.as_bytes()))
    }

    #[test]
    fn accepts_bearer_in_any_case() {
        assert_eq!(parse("Bearer abc.def.ghi"), Ok("abc.def.ghi"));
        assert_eq!(parse("bearer abc.def.ghi"), Ok("abc.def.ghi"));
        assert_eq!(parse("BEARER a-b_c~d+e/f=="), Ok("a-b_c~d+e/f=="));
    }

    #[test]
    fn every_byte_inside_a_token_is_judged_by_the_token68_alphabet() {
        for byte in 0..=255u8 {
            let value = [b"Bearer ab".as_slice(), &[byte], b"cd"].concat();
            let allowed = byte.is_ascii_alphanumeric() || b"-._~+/".contains(&byte);
            assert_eq!(bearer_token(Some(&value)).is_ok(), allowed, "byte {byte:#04x}");
        }
    }

    #[test]
    fn only_space_and_visible_ascii_pass_the_first_check() {
        for byte in 0..=255u8 {
            let value = [b"Bearer ab".as_slice(), &[byte], b"cd"].concat();
            let refused_as_invisible =
                matches!(bearer_token(Some(&value)), Err(AuthError::MalformedHeader(HeaderProblem::NotVisibleAscii)));
            assert_eq!(refused_as_invisible, !(0x20..=0x7e).contains(&byte), "byte {byte:#04x}");
        }
    }

    #[test]
    fn refusals() {
        let cases: &[(&str, AuthError)] = &[
            ("", AuthError::MissingCredentials),
            ("Basic dXNlcjpwYXNz", HeaderProblem::UnsupportedScheme.into()),
            ("Bearertoken", HeaderProblem::UnsupportedScheme.into()),
            ("DPoP abc", HeaderProblem::UnsupportedScheme.into()),
            ("Bearer", HeaderProblem::MissingToken.into()),
            ("Bearer ", HeaderProblem::MissingToken.into()),
            ("Basic abc ", HeaderProblem::UnsupportedScheme.into()),
            ("Bearer  abc", HeaderProblem::ExtraWhitespace.into()),
            (" Bearer abc", HeaderProblem::ExtraWhitespace.into()),
            ("Bearer abc ", HeaderProblem::ExtraWhitespace.into()),
            ("Bearer abc def", HeaderProblem::NotToken68.into()),
            ("Bearer abc,def", HeaderProblem::NotToken68.into()),
            ("Bearer ==", HeaderProblem::NotToken68.into()),
            ("Bearer a=b", HeaderProblem::NotToken68.into()),
            ("Bearer \"abc\"", HeaderProblem::NotToken68.into()),
            ("Bearer abc\tdef", HeaderProblem::NotVisibleAscii.into()),
            ("Bearer abc\r\nX: y", HeaderProblem::NotVisibleAscii.into()),
            ("Bearer ab\u{e9}", HeaderProblem::NotVisibleAscii.into()),
        ];
        for (value, expected) in cases {
            assert_eq!(parse(value).err().as_ref(), Some(expected), "{value:?}");
        }
        assert_eq!(bearer_token(None), Err(AuthError::MissingCredentials));
    }

    #[test]
    fn size_cap_boundary() {
        let at_cap = format!("Bearer {}", "a".repeat(MAX_AUTHORIZATION_BYTES - 7));
        assert_eq!(at_cap.len(), MAX_AUTHORIZATION_BYTES);
        assert!(parse(&at_cap).is_ok());
        let over = format!("{at_cap}a");
        assert_eq!(parse(&over), Err(HeaderProblem::TooLarge.into()));
    }
}
