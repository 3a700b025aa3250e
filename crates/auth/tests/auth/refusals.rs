//! The refusal table: every bad header or token is refused with its specific reason, and the
//! well-formed variants next to them are accepted.

use aws_lc_rs::hmac;
use palisade_auth::{
    Algorithm, AuthError, ClaimKind, HeaderProblem, InvalidTokenReason as Reason, IssuerConfig, Segment, TokenVerifier,
};
use serde_json::json;
use std::sync::Arc;

use crate::common::*;

struct Fixture {
    verifier: TokenVerifier,
    clock: Arc<ManualClock>,
    ec: TestKey,
    ed: TestKey,
    rsa: TestKey,
    b_ec: TestKey,
    /// Same `kid` as `ec`, different key: an attacker's.
    attacker: TestKey,
}

fn fixture() -> Fixture {
    let ec = TestKey::ec("ec-1");
    let ed = TestKey::ed("ed-1");
    let rsa = TestKey::rsa("rsa-1");
    let b_ec = TestKey::ec("b-ec-1");
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let weak = TestKey {
        jwk: json!({"kty":"OKP","crv":"Ed25519","kid":"ed-weak","x":b64(&identity)}),
        ..TestKey::ed("ed-weak")
    };
    let mut cfg = config(vec![
        IssuerConfig {
            issuer: ISSUER_A.into(),
            jwks: static_jwks(&[&ec, &ed, &rsa, &weak]),
            algorithms: vec![Algorithm::ES256, Algorithm::EdDSA, Algorithm::RS256],
        },
        IssuerConfig { issuer: ISSUER_B.into(), jwks: static_jwks(&[&b_ec]), algorithms: vec![Algorithm::ES256] },
    ]);
    cfg.required_typ = Some("at+jwt".into());
    let clock = clock();
    let verifier = verifier(cfg, &clock);
    Fixture { verifier, clock, ec, ed, rsa, b_ec, attacker: TestKey::ec("ec-1") }
}

fn segments(token: &str) -> Vec<String> {
    token.split('.').map(str::to_owned).collect()
}

fn invalid(reason: Reason) -> AuthError {
    AuthError::InvalidToken(reason)
}

#[tokio::test]
async fn valid_tokens_of_every_algorithm_are_accepted() {
    let f = fixture();
    for key in [&f.ec, &f.ed, &f.rsa] {
        let claims = f.verifier.verify(Some(&bearer(&token(key)))).await.expect("accepted");
        assert_eq!(claims.principal(), "https://idp.example.com#alice");
        assert_eq!(claims.tenant(), Some("t1"));
        assert_eq!(claims.client_id(), Some("c1"));
        assert!(claims.has_scope("tools:read") && claims.has_scope("tools:call"));
        assert_eq!(claims.expires_at_ms(), (NOW + 3600) * 1000);
        assert_eq!(claims.token_digest().len(), 16);
    }
    let b = token_with(&f.b_ec, json!({}), json!({"iss": ISSUER_B}));
    assert_eq!(f.verifier.verify(Some(&bearer(&b))).await.expect("accepted").issuer(), ISSUER_B);
}

#[tokio::test]
async fn accepted_variants() {
    let f = fixture();
    let cases = [
        ("lowercase bearer", format!("bearer {}", token(&f.ec))),
        ("uppercase BEARER", format!("BEARER {}", token(&f.ec))),
        (
            "typ application/at+jwt",
            format!("Bearer {}", token_with(&f.ec, json!({"typ": "application/at+jwt"}), json!({}))),
        ),
        ("typ AT+JWT", format!("Bearer {}", token_with(&f.ec, json!({"typ": "AT+JWT"}), json!({})))),
        ("aud array with ours", format!("Bearer {}", token_with(&f.ec, json!({}), json!({"aud": ["x", RESOURCE]})))),
        ("scp array", format!("Bearer {}", token_with(&f.ec, json!({}), json!({"scope": null, "scp": ["a", "b"]})))),
        ("azp fallback", format!("Bearer {}", token_with(&f.ec, json!({}), json!({"client_id": null, "azp": "z"})))),
        ("no nbf, no iat", format!("Bearer {}", token_with(&f.ec, json!({}), json!({"nbf": null, "iat": null})))),
        (
            "exp just inside leeway",
            format!("Bearer {}", token_with(&f.ec, json!({}), json!({"exp": NOW - LEEWAY + 1}))),
        ),
        ("nbf just inside leeway", format!("Bearer {}", token_with(&f.ec, json!({}), json!({"nbf": NOW + LEEWAY})))),
        (
            "jku header ignored",
            format!("Bearer {}", token_with(&f.ec, json!({"jku": "https://evil.example/jwks"}), json!({}))),
        ),
    ];
    for (name, header) in cases {
        assert!(f.verifier.verify(Some(header.as_bytes())).await.is_ok(), "{name} should be accepted");
    }
}

#[tokio::test]
async fn refusal_table() {
    let f = fixture();
    let good = token(&f.ec);
    let parts = segments(&good);
    let (h, p, s) = (&parts[0], &parts[1], &parts[2]);

    let tampered_payload =
        format!("{h}.{}.{s}", b64(merged(default_claims(ISSUER_A), json!({"sub": "admin"})).to_string().as_bytes()));
    let tampered_signature = {
        let mut sig = base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, s).expect("b64");
        sig[10] ^= 0x01;
        format!("{h}.{p}.{}", b64(&sig))
    };
    let hs256_with_public_key = {
        let header = json!({"alg":"HS256","kid":"ec-1","typ":"at+jwt"}).to_string();
        let input = format!("{}.{}", b64(header.as_bytes()), p);
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &f.ec.public_bytes()), input.as_bytes());
        format!("{input}.{}", b64(tag.as_ref()))
    };
    let alg_none_unsigned = format!("{}.{p}.", b64(br#"{"alg":"none","typ":"at+jwt"}"#));
    let alg_none_signed = format!("{}.{p}.{s}", b64(br#"{"alg":"none","kid":"ec-1","typ":"at+jwt"}"#));
    let embedded_jwk = token_with(&f.attacker, json!({"jwk": f.attacker.jwk}), json!({}));
    let attacker_jku = token_with(&f.attacker, json!({"jku": "https://evil.example/jwks"}), json!({}));
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    let garbage =
        |payload: &str| sign_raw(&f.ec, br#"{"alg":"ES256","kid":"ec-1","typ":"at+jwt"}"#, payload.as_bytes());
    let with_header = |header: serde_json::Value| token_with(&f.ec, header, json!({}));
    let with_claims = |claims: serde_json::Value| token_with(&f.ec, json!({}), claims);

    let cases: Vec<(&str, Option<Vec<u8>>, AuthError)> = vec![
        // The Authorization header itself.
        ("missing header", None, AuthError::MissingCredentials),
        ("empty header", Some(b"".to_vec()), AuthError::MissingCredentials),
        ("Basic scheme", Some(b"Basic YWxpY2U6c2VjcmV0".to_vec()), HeaderProblem::UnsupportedScheme.into()),
        ("DPoP scheme", Some(format!("DPoP {good}").into_bytes()), HeaderProblem::UnsupportedScheme.into()),
        ("Bearer without token", Some(b"Bearer".to_vec()), HeaderProblem::MissingToken.into()),
        ("empty token", Some(b"Bearer ".to_vec()), HeaderProblem::MissingToken.into()),
        ("two spaces", Some(format!("Bearer  {good}").into_bytes()), HeaderProblem::ExtraWhitespace.into()),
        ("trailing garbage", Some(format!("Bearer {good} extra").into_bytes()), HeaderProblem::NotToken68.into()),
        ("comma list", Some(format!("Bearer {good}, Basic x").into_bytes()), HeaderProblem::NotToken68.into()),
        ("quoted token", Some(format!("Bearer \"{good}\"").into_bytes()), HeaderProblem::NotToken68.into()),
        ("tab separator", Some(format!("Bearer\t{good}").into_bytes()), HeaderProblem::NotVisibleAscii.into()),
        ("non-ASCII", Some(format!("Bearer {good}\u{fffd}").into_bytes()), HeaderProblem::NotVisibleAscii.into()),
        ("oversized header", Some(format!("Bearer {}", "a".repeat(9000)).into_bytes()), HeaderProblem::TooLarge.into()),
        // Structure.
        ("2-part token", Some(bearer(&format!("{h}.{p}"))), invalid(Reason::NotCompactJws { segments: 2 })),
        ("4-part token", Some(bearer(&format!("{good}.{s}"))), invalid(Reason::NotCompactJws { segments: 4 })),
        ("JWE-looking 5-part token", Some(bearer(&format!("{h}.{p}.{s}.{s}.{s}"))), invalid(Reason::Encrypted)),
        ("truncated mid-token", Some(bearer(&good[..h.len() + 5])), invalid(Reason::NotCompactJws { segments: 2 })),
        ("truncated signature", Some(bearer(&good[..good.len() - 10])), invalid(Reason::BadSignature)),
        ("empty segments", Some(bearer("..")), invalid(Reason::EmptySegment(Segment::Header))),
        (
            "non-base64url payload",
            Some(bearer(&format!("{h}.{}~.{s}", &p[..p.len() - 1]))),
            invalid(Reason::BadBase64(Segment::Payload)),
        ),
        ("padded signature", Some(bearer(&format!("{h}.{p}.{s}="))), invalid(Reason::BadBase64(Segment::Signature))),
        (
            "standard-alphabet header",
            Some(bearer(&format!("+{}.{p}.{s}", &h[1..]))),
            invalid(Reason::BadBase64(Segment::Header)),
        ),
        ("payload not JSON", Some(bearer(&garbage("not json"))), invalid(Reason::MalformedJson(Segment::Payload))),
        (
            "payload is an array",
            Some(bearer(&garbage(r#"["iss","sub"]"#))),
            invalid(Reason::MalformedJson(Segment::Payload)),
        ),
        ("nested JSON garbage", Some(bearer(&garbage(&deep))), invalid(Reason::MalformedJson(Segment::Payload))),
        (
            "unterminated JSON",
            Some(bearer(&garbage(r#"{"iss":{"a":[1,"#))),
            invalid(Reason::MalformedJson(Segment::Payload)),
        ),
        (
            "duplicate claim",
            Some(bearer(&garbage(r#"{"iss":"https://idp.example.com","sub":"a","sub":"b"}"#))),
            invalid(Reason::MalformedJson(Segment::Payload)),
        ),
        // Header parameters and algorithms.
        ("alg none, unsigned", Some(bearer(&alg_none_unsigned)), invalid(Reason::UnsupportedAlgorithm)),
        ("alg none, with signature", Some(bearer(&alg_none_signed)), invalid(Reason::UnsupportedAlgorithm)),
        (
            "HS256 signed with the public key",
            Some(bearer(&hs256_with_public_key)),
            invalid(Reason::UnsupportedAlgorithm),
        ),
        ("lowercase alg", Some(bearer(&with_header(json!({"alg": "es256"})))), invalid(Reason::UnsupportedAlgorithm)),
        ("missing alg", Some(bearer(&with_header(json!({"alg": null})))), invalid(Reason::UnsupportedAlgorithm)),
        (
            "crit header",
            Some(bearer(&with_header(json!({"crit": ["exp"], "exp": 1})))),
            invalid(Reason::CriticalHeader),
        ),
        (
            "b64 false",
            Some(bearer(&with_header(json!({"b64": false, "crit": ["b64"]})))),
            invalid(Reason::CriticalHeader),
        ),
        ("enc header", Some(bearer(&with_header(json!({"enc": "A256GCM"})))), invalid(Reason::Encrypted)),
        (
            "kid not a string",
            Some(bearer(&with_header(json!({"kid": 1})))),
            invalid(Reason::MalformedJson(Segment::Header)),
        ),
        ("wrong typ", Some(bearer(&with_header(json!({"typ": "JWT"})))), invalid(Reason::WrongType)),
        ("missing typ", Some(bearer(&with_header(json!({"typ": null})))), invalid(Reason::WrongType)),
        (
            "RS256 where only ES256 allowed",
            Some(bearer(&token_with(&f.rsa, json!({}), json!({"iss": ISSUER_B})))),
            invalid(Reason::AlgorithmNotAllowedForIssuer),
        ),
        (
            "ES256 header, RSA key kid",
            Some(bearer(&token_with(&f.ec, json!({"kid": "rsa-1"}), json!({})))),
            invalid(Reason::KeyAlgorithmMismatch),
        ),
        (
            "EdDSA header, EC key kid",
            Some(bearer(&token_with(&f.ed, json!({"kid": "ec-1"}), json!({})))),
            invalid(Reason::KeyAlgorithmMismatch),
        ),
        ("missing kid", Some(bearer(&with_header(json!({"kid": null})))), invalid(Reason::MissingKeyId)),
        ("unknown kid", Some(bearer(&with_header(json!({"kid": "nope"})))), invalid(Reason::UnknownKeyId)),
        (
            "weak Ed25519 key kid",
            Some(bearer(&token_with(&f.ed, json!({"kid": "ed-weak"}), json!({})))),
            invalid(Reason::UnknownKeyId),
        ),
        ("other issuer's key", Some(bearer(&token_with(&f.b_ec, json!({}), json!({})))), invalid(Reason::UnknownKeyId)),
        // Signatures.
        ("tampered payload", Some(bearer(&tampered_payload)), invalid(Reason::BadSignature)),
        ("tampered signature", Some(bearer(&tampered_signature)), invalid(Reason::BadSignature)),
        ("attacker key under our kid", Some(bearer(&token(&f.attacker))), invalid(Reason::BadSignature)),
        ("embedded jwk header", Some(bearer(&embedded_jwk)), invalid(Reason::BadSignature)),
        ("attacker jku header", Some(bearer(&attacker_jku)), invalid(Reason::BadSignature)),
        // Issuer.
        (
            "issuer not in allow-list",
            Some(bearer(&with_claims(json!({"iss": "https://evil.example.com"})))),
            invalid(Reason::UnknownIssuer),
        ),
        (
            "issuer with trailing slash",
            Some(bearer(&with_claims(json!({"iss": "https://idp.example.com/"})))),
            invalid(Reason::UnknownIssuer),
        ),
        (
            "missing iss",
            Some(bearer(&with_claims(json!({"iss": null})))),
            invalid(Reason::MissingClaim(ClaimKind::Issuer)),
        ),
        (
            "iss array",
            Some(bearer(&with_claims(json!({"iss": [ISSUER_A]})))),
            invalid(Reason::InvalidClaim(ClaimKind::Issuer)),
        ),
        // Audience.
        (
            "wrong aud",
            Some(bearer(&with_claims(json!({"aud": "https://other.example.com/mcp"})))),
            invalid(Reason::WrongAudience),
        ),
        (
            "missing aud",
            Some(bearer(&with_claims(json!({"aud": null})))),
            invalid(Reason::MissingClaim(ClaimKind::Audience)),
        ),
        (
            "aud array without ours",
            Some(bearer(&with_claims(json!({"aud": ["https://a.example", "https://b.example"]})))),
            invalid(Reason::WrongAudience),
        ),
        (
            "aud prefix of ours",
            Some(bearer(&with_claims(json!({"aud": "https://mcp.example.com"})))),
            invalid(Reason::WrongAudience),
        ),
        (
            "aud number",
            Some(bearer(&with_claims(json!({"aud": 1})))),
            invalid(Reason::InvalidClaim(ClaimKind::Audience)),
        ),
        // Time.
        ("expired", Some(bearer(&with_claims(json!({"exp": NOW - 3600})))), invalid(Reason::Expired)),
        (
            "exp exactly at the leeway edge",
            Some(bearer(&with_claims(json!({"exp": NOW - LEEWAY})))),
            invalid(Reason::Expired),
        ),
        ("not yet valid", Some(bearer(&with_claims(json!({"nbf": NOW + 3600})))), invalid(Reason::NotYetValid)),
        (
            "nbf just past the leeway",
            Some(bearer(&with_claims(json!({"nbf": NOW + LEEWAY + 1})))),
            invalid(Reason::NotYetValid),
        ),
        (
            "issued in the future",
            Some(bearer(&with_claims(json!({"iat": NOW + 3600})))),
            invalid(Reason::IssuedInFuture),
        ),
        (
            "missing exp",
            Some(bearer(&with_claims(json!({"exp": null})))),
            invalid(Reason::MissingClaim(ClaimKind::ExpiresAt)),
        ),
        (
            "string exp",
            Some(bearer(&with_claims(json!({"exp": (NOW + 3600).to_string()})))),
            invalid(Reason::InvalidClaim(ClaimKind::ExpiresAt)),
        ),
        (
            "negative exp",
            Some(bearer(&with_claims(json!({"exp": -1})))),
            invalid(Reason::InvalidClaim(ClaimKind::ExpiresAt)),
        ),
        (
            "string nbf",
            Some(bearer(&with_claims(json!({"nbf": "now"})))),
            invalid(Reason::InvalidClaim(ClaimKind::NotBefore)),
        ),
        // Subject and the rest.
        (
            "missing sub",
            Some(bearer(&with_claims(json!({"sub": null})))),
            invalid(Reason::MissingClaim(ClaimKind::Subject)),
        ),
        (
            "empty sub",
            Some(bearer(&with_claims(json!({"sub": ""})))),
            invalid(Reason::InvalidClaim(ClaimKind::Subject)),
        ),
        (
            "numeric sub",
            Some(bearer(&with_claims(json!({"sub": 7})))),
            invalid(Reason::InvalidClaim(ClaimKind::Subject)),
        ),
        (
            "scope as array",
            Some(bearer(&with_claims(json!({"scope": ["a"]})))),
            invalid(Reason::InvalidClaim(ClaimKind::Scope)),
        ),
        (
            "scope with quote",
            Some(bearer(&with_claims(json!({"scope": "a\"b"})))),
            invalid(Reason::InvalidClaim(ClaimKind::Scope)),
        ),
        (
            "tenant not a string",
            Some(bearer(&with_claims(json!({"tenant": {"id": 1}})))),
            invalid(Reason::InvalidClaim(ClaimKind::Tenant)),
        ),
        (
            "client_id not a string",
            Some(bearer(&with_claims(json!({"client_id": 9})))),
            invalid(Reason::InvalidClaim(ClaimKind::ClientId)),
        ),
    ];

    let mut names = std::collections::HashSet::new();
    for (name, header, expected) in &cases {
        assert!(names.insert(*name), "duplicate case name {name}");
        let got = f.verifier.verify(header.as_deref()).await;
        assert_eq!(got.as_ref().err(), Some(expected), "case {name:?}: got {got:?}");
    }
    assert!(cases.len() >= 40, "only {} refusal cases", cases.len());
    // Nothing refused was cached.
    assert_eq!(f.verifier.cached_tokens(), 0);
}

#[tokio::test]
async fn expiry_boundary_to_the_millisecond() {
    let f = fixture();
    let exp = NOW + 10;
    let t = bearer(&token_with(&f.ec, json!({}), json!({"exp": exp})));
    let edge_ms = (exp + LEEWAY) * 1000;
    f.clock.set_ms(ms(edge_ms - 1));
    assert!(f.verifier.verify(Some(&t)).await.is_ok(), "accepted 1 ms before exp + leeway");
    f.clock.set_ms(ms(edge_ms));
    assert_eq!(f.verifier.verify(Some(&t)).await.err(), Some(invalid(Reason::Expired)), "refused at exp + leeway");
}

#[tokio::test]
async fn not_before_boundary_to_the_millisecond() {
    let f = fixture();
    let nbf = NOW + 100;
    let t = bearer(&token_with(&f.ec, json!({}), json!({"nbf": nbf, "iat": null})));
    let start_ms = (nbf - LEEWAY) * 1000;
    f.clock.set_ms(ms(start_ms - 1));
    assert_eq!(f.verifier.verify(Some(&t)).await.err(), Some(invalid(Reason::NotYetValid)));
    f.clock.set_ms(ms(start_ms));
    assert!(f.verifier.verify(Some(&t)).await.is_ok());
}

#[tokio::test]
async fn verify_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let f = fixture();
    let header = bearer(&token(&f.ec));
    let future = f.verifier.verify(Some(&header));
    assert_send(&future);
    assert!(future.await.is_ok());
}
