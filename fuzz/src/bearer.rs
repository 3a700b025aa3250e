//! The `bearer_token` property: the `Authorization` header and JWT parsing of `palisade-auth`'s
//! [`TokenVerifier`], on arbitrary header bytes and on real tokens mutated by the input.
//!
//! One fixture per process (a [`OnceLock`]): the development issuer's ES256 key (kept in
//! `fuzz/target/bearer-token-issuer/`, git-ignored, created on first use), a verifier that trusts
//! exactly that issuer through a static key set (no network), a current-thread tokio runtime, a
//! fixed [`ManualClock`] (so a minted token never expires mid-run and every run sees the same
//! "now"), and two minted tokens, alice's and bob's.
//!
//! Per input, two checks:
//!
//! 1. the input itself as the header value: `verify` never panics, and a refusal is a 401 whose
//!    challenge is one of the two fixed strings (it never echoes the token);
//! 2. the input as a *mutation program* applied to a real token (first byte = mode):
//!    byte edits, a splice, a replaced header/payload/signature segment, segments shuffled
//!    between alice's and bob's tokens — any token accepted must carry exactly the signing input
//!    (`header.payload`) of one minted token and yield that token's claims: a mutated token never
//!    verifies as a different principal. Two modes re-sign with the issuer's key so that the
//!    claim and header checks behind the signature are fuzzed too: an input payload (accepted
//!    only if its claims are read back faithfully: `iss`, `sub`, `aud`, `exp`, tenant, client,
//!    scopes) or an input JOSE header (accepted only if `alg` is ES256, `kid` is the issuer's,
//!    `typ` is `at+jwt` and no `crit`/`b64`/`enc`/`zip`).
//!
//! Segment inputs (modes 2, 3, 6, 7) are templates: `$ISS`, `$AUD`, `$KID`, `$NOW`, `$EXP` and
//! `$SUB` are replaced by the fixture's values, so the seed corpus can name the real issuer, key
//! and times without containing a key or a (time-limited) token.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_auth::dev_issuer::{DevIssuer, KEY_FILE_NAME};
use palisade_auth::{AuthError, InvalidTokenReason, JwksPolicy, ResourceServerConfig, TokenVerifier, VerifiedClaims};
use palisade_base::clock::ManualClock;
use serde_json::{Map, Value};

/// The development issuer's identifier (nothing listens there: the keys are static).
pub const ISSUER: &str = "http://127.0.0.1:1/dev-issuer";
/// The resource (token audience).
pub const RESOURCE: &str = "http://127.0.0.1:1/mcp";
const METADATA_URL: &str = "http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp";
/// The fixture's fixed "now": 2027-01-15T08:00:00Z.
pub const NOW_SECS: u64 = 1_800_000_000;
const TTL_SECS: u64 = 3600;
const LEEWAY_SECS: u64 = 30;
const SCOPE: &str = "shop:read";

/// Where the issuer key lives: under the fuzz workspace's git-ignored `target/`, reused across
/// runs (the key is created 0600 by `DevIssuer`; concurrent creators agree on one key).
fn key_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("bearer-token-issuer")
}

struct Minted {
    /// The compact JWS.
    token: String,
    /// Its claims as the verifier returned them for the unmodified token.
    claims: VerifiedClaims,
}

impl Minted {
    /// Segment `n`, base64url-decoded.
    fn decoded(&self, n: usize) -> Vec<u8> {
        URL_SAFE_NO_PAD.decode(segment(&self.token, n)).expect("a minted segment is base64url")
    }
}

struct Fixture {
    runtime: tokio::runtime::Runtime,
    verifier: TokenVerifier,
    signer: EcdsaKeyPair,
    rng: SystemRandom,
    kid: String,
    alice: Minted,
    bob: Minted,
    /// The two challenges a verifier refusal may carry: without and with `error="invalid_token"`.
    challenge_absent: String,
    challenge_invalid: String,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(build_fixture)
}

fn build_fixture() -> Fixture {
    let dir = key_dir();
    let clock = Arc::new(ManualClock::new(i64::try_from(NOW_SECS * 1000).expect("a fixed time")));
    let issuer = DevIssuer::load_or_create(&dir, ISSUER).expect("development issuer").with_clock(clock.clone());
    let pkcs8 = std::fs::read(dir.join(KEY_FILE_NAME)).expect("the issuer key file");
    let signer = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pkcs8).expect("a P-256 PKCS#8 key");

    let mut config = ResourceServerConfig::new(RESOURCE, METADATA_URL, vec![issuer.issuer_config()]);
    config.scopes_supported = vec![SCOPE.to_owned()];
    config.required_typ = Some("at+jwt".to_owned());
    config.leeway_secs = LEEWAY_SECS;
    let verifier = TokenVerifier::with_clock_and_policy(config, clock, JwksPolicy::default()).expect("verifier");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");

    let mint = |subject: &str, tenant: &str, scopes: &[&str]| {
        let token = issuer.mint(subject, tenant, "fuzz", scopes, RESOURCE, TTL_SECS).expect("mint");
        let header = format!("Bearer {token}");
        let claims = runtime.block_on(verifier.verify(Some(header.as_bytes()))).expect("a minted token verifies");
        assert_eq!(claims.subject(), subject);
        Minted { token, claims }
    };
    let alice = mint("alice", "acme", &[SCOPE]);
    let bob = mint("bob", "globex", &[SCOPE, "shop:write"]);
    assert_eq!(segment(&alice.token, 0), segment(&bob.token, 0), "one issuer, one JOSE header");

    let challenge_absent = verifier.www_authenticate(&AuthError::MissingCredentials);
    let challenge_invalid = verifier.www_authenticate(&AuthError::InvalidToken(InvalidTokenReason::BadSignature));
    Fixture {
        runtime,
        verifier,
        signer,
        rng: SystemRandom::new(),
        kid: issuer.kid().to_owned(),
        alice,
        bob,
        challenge_absent,
        challenge_invalid,
    }
}

/// Segment `n` (0 header, 1 payload, 2 signature) of a minted token.
fn segment(token: &str, n: usize) -> &str {
    token.split('.').nth(n).expect("a minted token has three segments")
}

/// `header.payload`: what the signature covers. `None` without two dots.
fn signing_input(token: &[u8]) -> Option<&[u8]> {
    let first = token.iter().position(|&b| b == b'.')?;
    let second = first + 1 + token[first + 1..].iter().position(|&b| b == b'.')?;
    Some(&token[..second])
}

/// The property; see the module documentation.
pub fn bearer_token(data: &[u8]) {
    let fx = fixture();
    let raw = fx.verify(data);
    if let Ok(claims) = &raw {
        // Arbitrary bytes can only be accepted if they are one of the minted tokens.
        let token = data.splitn(2, |&b| b == b' ').nth(1).unwrap_or_default();
        fx.assert_minted(token, claims);
    }

    let Some((value, oracle)) = fx.mutated(data) else {
        return;
    };
    let token = &value[value.iter().position(|&b| b == b' ').map_or(0, |space| space + 1)..];
    match fx.verify(&value) {
        Err(error) => {
            if token.len() >= 24 {
                let text = format!("{error} {error:?}");
                assert!(!text.contains(&*String::from_utf8_lossy(token)), "a refusal echoes the token: {text}");
            }
        }
        Ok(claims) => match oracle {
            Oracle::Minted => fx.assert_minted(token, &claims),
            Oracle::SignedPayload(payload) => assert_faithful(&payload, &claims),
            Oracle::SignedHeader(header) => {
                fx.assert_header_acceptable(&header);
                assert_same_principal(&claims, &fx.alice.claims);
            }
        },
    }
}

/// What an accepted token must satisfy, by how it was made.
enum Oracle {
    /// Not re-signed: it must be one of the minted tokens' signing inputs, with its claims.
    Minted,
    /// Signed by the issuer with this (templated) payload: claims read back faithfully.
    SignedPayload(Vec<u8>),
    /// Signed by the issuer with this (templated) JOSE header and alice's payload.
    SignedHeader(Vec<u8>),
}

impl Fixture {
    /// The header value (`<scheme> <token>`) the mutation program `data` makes from the minted
    /// tokens, and how to judge its acceptance; `None` for an empty input.
    fn mutated(&self, data: &[u8]) -> Option<(Vec<u8>, Oracle)> {
        let (&mode, program) = data.split_first()?;
        let scheme: &[u8] = match (mode >> 3) % 3 {
            0 => b"Bearer ",
            1 => b"bearer ",
            _ => b"BEARER ",
        };
        let alice = self.alice.token.as_bytes();
        let (token, oracle) = match mode % 8 {
            0 => (edits(alice, program), Oracle::Minted),
            1 => (splice(alice, program), Oracle::Minted),
            2 => (replace_segment(alice, 0, &self.template(program)), Oracle::Minted),
            3 => (replace_segment(alice, 1, &self.template(program)), Oracle::Minted),
            4 => (replace_segment(alice, 2, program), Oracle::Minted),
            5 => (self.shuffle(program), Oracle::Minted),
            6 => {
                let payload = self.template(program);
                (self.sign(&self.alice.decoded(0), &payload), Oracle::SignedPayload(payload))
            }
            _ => {
                let header = self.template(program);
                (self.sign(&header, &self.alice.decoded(1)), Oracle::SignedHeader(header))
            }
        };
        let mut value = scheme.to_vec();
        value.extend_from_slice(&token);
        Some((value, oracle))
    }

    fn verify(&self, header_value: &[u8]) -> Result<VerifiedClaims, AuthError> {
        let result = self.runtime.block_on(self.verifier.verify(Some(header_value)));
        if let Err(error) = &result {
            assert_eq!(error.http_status(), 401, "verify refused with {error:?}");
            let challenge = self.verifier.www_authenticate(error);
            let expected = if error.credentials_presented() { &self.challenge_invalid } else { &self.challenge_absent };
            assert_eq!(&challenge, expected, "challenge for {error:?}");
        }
        result
    }

    /// An accepted token that was not re-signed by the fixture is one of the minted ones: same
    /// signing input (the signature covers it byte for byte), same claims.
    fn assert_minted(&self, token: &[u8], claims: &VerifiedClaims) {
        let input = signing_input(token).unwrap_or_else(|| panic!("accepted a token without two dots: {token:?}"));
        let minted = [&self.alice, &self.bob]
            .into_iter()
            .find(|minted| signing_input(minted.token.as_bytes()) == Some(input))
            .unwrap_or_else(|| {
                panic!("accepted a token with a signing input no one signed: {}", String::from_utf8_lossy(token))
            });
        assert_same_principal(claims, &minted.claims);
    }

    /// A JOSE header the verifier may accept: a JSON object, `alg` ES256, the issuer's `kid`,
    /// `typ` at+jwt (any case, optional `application/`), no extension or encryption members.
    fn assert_header_acceptable(&self, header: &[u8]) {
        let object: Map<String, Value> = serde_json::from_slice(header).expect("accepted header is a JSON object");
        assert_eq!(object.get("alg").and_then(Value::as_str), Some("ES256"), "accepted alg: {object:?}");
        assert_eq!(object.get("kid").and_then(Value::as_str), Some(self.kid.as_str()), "accepted kid: {object:?}");
        let typ = object.get("typ").and_then(Value::as_str).map(str::to_ascii_lowercase);
        assert!(matches!(typ.as_deref(), Some("at+jwt" | "application/at+jwt")), "accepted typ: {object:?}");
        for member in ["crit", "b64", "enc", "zip"] {
            assert!(!object.contains_key(member), "accepted a header with {member}: {object:?}");
        }
    }

    /// `$ISS`, `$AUD`, `$KID`, `$NOW`, `$EXP`, `$SUB` in `input`, replaced by the fixture's values.
    fn template(&self, input: &[u8]) -> Vec<u8> {
        let now = NOW_SECS.to_string();
        let exp = (NOW_SECS + TTL_SECS).to_string();
        let values: [(&[u8], &[u8]); 6] = [
            (b"$ISS", ISSUER.as_bytes()),
            (b"$AUD", RESOURCE.as_bytes()),
            (b"$KID", self.kid.as_bytes()),
            (b"$NOW", now.as_bytes()),
            (b"$EXP", exp.as_bytes()),
            (b"$SUB", b"alice"),
        ];
        let mut out = Vec::with_capacity(input.len() + 64);
        let mut rest = input;
        'outer: while let Some((&first, tail)) = rest.split_first() {
            if first == b'$' {
                for (name, value) in values {
                    if let Some(after) = rest.strip_prefix(name) {
                        out.extend_from_slice(value);
                        rest = after;
                        continue 'outer;
                    }
                }
            }
            out.push(first);
            rest = tail;
        }
        out
    }

    /// A compact JWS over base64url(`header`).base64url(`payload`), signed with the issuer's key.
    fn sign(&self, header: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut input = URL_SAFE_NO_PAD.encode(header);
        input.push('.');
        input.push_str(&URL_SAFE_NO_PAD.encode(payload));
        let signature = self.signer.sign(&self.rng, input.as_bytes()).expect("ES256 signing");
        input.push('.');
        input.push_str(&URL_SAFE_NO_PAD.encode(signature.as_ref()));
        input.into_bytes()
    }

    /// Each input byte picks one of alice's or bob's six segments, or a `.`; runs of segments are
    /// joined with `.`.
    fn shuffle(&self, program: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut need_dot = false;
        for &byte in program {
            let pick = byte % 7;
            if pick == 6 {
                out.push(b'.');
                need_dot = false;
                continue;
            }
            if need_dot {
                out.push(b'.');
            }
            let token = if pick < 3 { &self.alice.token } else { &self.bob.token };
            out.extend_from_slice(segment(token, usize::from(pick % 3)).as_bytes());
            need_dot = true;
        }
        out
    }
}

/// Everything but the token digest (which names the exact bytes, and so differs for an
/// equivalent token, e.g. another ECDSA signature over the same input).
fn assert_same_principal(got: &VerifiedClaims, want: &VerifiedClaims) {
    assert_eq!(got.issuer(), want.issuer(), "issuer");
    assert_eq!(got.subject(), want.subject(), "subject");
    assert_eq!(got.tenant(), want.tenant(), "tenant");
    assert_eq!(got.client_id(), want.client_id(), "client");
    assert_eq!(got.scopes(), want.scopes(), "scopes");
    assert_eq!(got.expires_at_ms(), want.expires_at_ms(), "expiry");
}

/// A payload the issuer signed was accepted: the claims must say what it says.
fn assert_faithful(payload: &[u8], claims: &VerifiedClaims) {
    let object: Map<String, Value> = serde_json::from_slice(payload).expect("accepted payload is a JSON object");
    let text = |name: &str| object.get(name).and_then(Value::as_str);
    assert_eq!(claims.issuer(), ISSUER);
    assert_eq!(text("iss"), Some(ISSUER), "accepted iss: {object:?}");
    assert_eq!(text("sub"), Some(claims.subject()), "subject: {object:?}");
    let audience_ok = match object.get("aud") {
        Some(Value::String(aud)) => aud == RESOURCE,
        Some(Value::Array(items)) => items.iter().any(|item| item.as_str() == Some(RESOURCE)),
        _ => false,
    };
    assert!(audience_ok, "accepted aud: {object:?}");
    let exp = object.get("exp").and_then(Value::as_f64).expect("accepted without a numeric exp");
    // The verifier works in whole milliseconds (exp rounded down, nbf/iat up); a millisecond of
    // slack here keeps f64 rounding from raising false alarms.
    assert!(exp + LEEWAY_SECS as f64 + 1e-3 > NOW_SECS as f64, "accepted an expired token: {object:?}");
    if exp < 1e12 {
        // Beyond that, f64 cannot tell the rounding apart.
        assert!(claims.expires_at_ms() as f64 <= exp * 1000.0, "expiry rounded up: {object:?}");
    }
    assert!(claims.expires_at_ms().saturating_add(LEEWAY_SECS * 1000) > NOW_SECS * 1000, "expired claims returned");
    for name in ["nbf", "iat"] {
        if let Some(value) = object.get(name) {
            let secs = value.as_f64().expect("accepted a non-numeric date");
            assert!(secs <= (NOW_SECS + LEEWAY_SECS) as f64 + 1e-3, "accepted {name} in the future: {object:?}");
        }
    }
    assert_eq!(claims.tenant(), text("tenant"), "tenant: {object:?}");
    let client = if object.contains_key("client_id") { text("client_id") } else { text("azp") };
    assert_eq!(claims.client_id(), client, "client: {object:?}");
    let declared: BTreeSet<&str> = match object.get("scope").or_else(|| object.get("scp")) {
        Some(Value::String(list)) => list.split(' ').filter(|s| !s.is_empty()).collect(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        _ => BTreeSet::new(),
    };
    let got: BTreeSet<&str> = claims.scopes().iter().map(String::as_str).collect();
    assert_eq!(got, declared, "scopes: {object:?}");
}

/// Chunks of four bytes `op, pos_lo, pos_hi, value`: overwrite, insert, delete or flip one bit
/// at `pos` (modulo the current length).
fn edits(token: &[u8], program: &[u8]) -> Vec<u8> {
    let mut out = token.to_vec();
    for chunk in program.chunks_exact(4) {
        let pos = usize::from(u16::from_le_bytes([chunk[1], chunk[2]]));
        let value = chunk[3];
        match chunk[0] % 4 {
            0 if !out.is_empty() => {
                let at = pos % out.len();
                out[at] = value;
            }
            1 => {
                let at = pos % (out.len() + 1);
                out.insert(at, value);
            }
            2 if !out.is_empty() => {
                let at = pos % out.len();
                out.remove(at);
            }
            3 if !out.is_empty() => {
                let at = pos % out.len();
                out[at] ^= 1 << (value % 8);
            }
            _ => {}
        }
    }
    out
}

/// `pos_lo, pos_hi, delete, bytes...`: delete `delete` bytes at `pos` and insert `bytes` there.
fn splice(token: &[u8], program: &[u8]) -> Vec<u8> {
    let [lo, hi, delete, insert @ ..] = program else {
        return token.to_vec();
    };
    let at = usize::from(u16::from_le_bytes([*lo, *hi])) % (token.len() + 1);
    let end = (at + usize::from(*delete)).min(token.len());
    let mut out = Vec::with_capacity(token.len() + insert.len());
    out.extend_from_slice(&token[..at]);
    out.extend_from_slice(insert);
    out.extend_from_slice(&token[end..]);
    out
}

/// `token` with segment `n` replaced by base64url(`bytes`).
fn replace_segment(token: &[u8], n: usize, bytes: &[u8]) -> Vec<u8> {
    let encoded = URL_SAFE_NO_PAD.encode(bytes);
    let mut parts: Vec<&[u8]> = token.split(|&b| b == b'.').collect();
    if let Some(part) = parts.get_mut(n) {
        *part = encoded.as_bytes();
    }
    parts.join(&b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(name: &str) -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/bearer_token").join(name);
        std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    }

    fn accepted(name: &str) -> Option<VerifiedClaims> {
        let fx = fixture();
        let (value, _) = fx.mutated(&seed(name)).expect("a non-empty seed");
        fx.verify(&value).ok()
    }

    /// The seeds reach the accepting end of each mode, so the oracles are exercised at all.
    #[test]
    fn seeds_reach_acceptance() {
        for name in ["mut0_no_edit", "mut5_alice", "mut5_bob", "mut7_valid_header", "mut7_typ_application_upper"] {
            assert!(accepted(name).is_some(), "{name} should verify");
        }
        let carol = accepted("mut6_valid").expect("mut6_valid should verify");
        assert_eq!(carol.principal(), format!("{ISSUER}#carol"));
        assert_eq!(carol.tenant(), Some("acme"));
        let scopes: Vec<&str> = carol.scopes().iter().map(String::as_str).collect();
        assert_eq!(scopes, ["shop:read", "shop:write"]);
        assert!(accepted("mut6_aud_array_scp_azp").is_some());
        assert!(accepted("mut6_fractional_dates").is_some());
    }

    #[test]
    fn seeds_refused() {
        for name in [
            "mut0_flip_signature_bit",
            "mut2_header_reordered",
            "mut3_payload_other_subject",
            "mut4_signature_zero",
            "mut5_alice_header_bob_payload",
            "mut5_bob_payload_alice_signature",
            "mut6_expired",
            "mut6_not_yet_valid",
            "mut6_iat_just_in_future",
            "mut6_wrong_audience",
            "mut6_duplicate_sub",
            "mut6_other_issuer",
            "mut7_typ_jwt",
            "mut7_other_kid",
            "mut7_crit",
            "mut7_duplicate_kid",
        ] {
            assert!(accepted(name).is_none(), "{name} should be refused");
        }
    }

    #[test]
    fn every_seed_holds() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/bearer_token");
        for entry in std::fs::read_dir(dir).expect("the seed directory") {
            bearer_token(&std::fs::read(entry.expect("an entry").path()).expect("a seed"));
        }
    }

    #[test]
    fn program_helpers() {
        assert_eq!(splice(b"abcdef", &[2, 0, 2, b'X']), b"abXef");
        assert_eq!(splice(b"abc", &[0xff, 0xff, 9]), b"abc");
        assert_eq!(edits(b"abc", &[0, 1, 0, b'Z', 2, 0, 0, 0]), b"Zc");
        assert_eq!(replace_segment(b"a.b.c", 1, b"\xff"), b"a._w.c");
        assert_eq!(signing_input(b"a.b.c"), Some(&b"a.b"[..]));
        assert_eq!(signing_input(b"a.b"), None);
    }
}
