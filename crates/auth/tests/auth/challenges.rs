//! Exact `WWW-Authenticate` strings and statuses for each kind of refusal, and the Protected
//! Resource Metadata document.

use palisade_auth::{Algorithm, AuthError, IssuerConfig, check_scopes, metadata_paths, protected_resource_metadata};
use serde_json::json;

use crate::common::*;

const CHALLENGE_401: &str = "Bearer resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\", \
                             scope=\"tools:read tools:call\"";
const CHALLENGE_401_TOKEN: &str = "Bearer error=\"invalid_token\", \
                                   resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\", \
                                   scope=\"tools:read tools:call\"";

fn setup(key: &TestKey) -> palisade_auth::TokenVerifier {
    let cfg = config(vec![IssuerConfig {
        issuer: ISSUER_A.into(),
        jwks: static_jwks(&[key]),
        algorithms: vec![Algorithm::ES256],
    }]);
    verifier(cfg, &clock())
}

#[tokio::test]
async fn challenges_are_exact() {
    let key = TestKey::ec("k");
    let verifier = setup(&key);

    for header in [None, Some(&b"Basic YWxpY2U6cHc="[..])] {
        let err = verifier.verify(header).await.expect_err("refused");
        assert_eq!(err.http_status(), 401);
        assert_eq!(verifier.www_authenticate(&err), CHALLENGE_401);
    }
    for header in [&b"Bearer not.a.jwt"[..], &b"Bearer  x"[..], &b"Bearer a b"[..]] {
        let err = verifier.verify(Some(header)).await.expect_err("refused");
        assert_eq!(err.http_status(), 401);
        assert_eq!(verifier.www_authenticate(&err), CHALLENGE_401_TOKEN);
    }
    let expired = bearer(&token_with(&key, json!({}), json!({"exp": NOW - 3600})));
    let err = verifier.verify(Some(&expired)).await.expect_err("refused");
    assert_eq!(err.www_authenticate(verifier.config()), CHALLENGE_401_TOKEN);

    let claims = verifier.verify(Some(&bearer(&token(&key)))).await.expect("accepted");
    assert!(check_scopes(&claims, &["tools:read"]).is_ok());
    let err = check_scopes(&claims, &["tools:read", "admin:write"]).expect_err("insufficient");
    assert_eq!(err.http_status(), 403);
    assert_eq!(
        verifier.www_authenticate(&err),
        "Bearer error=\"insufficient_scope\", scope=\"tools:read admin:write\", \
         resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\""
    );

    let unavailable = AuthError::IssuerUnavailable { issuer: ISSUER_A.into() };
    assert_eq!(unavailable.http_status(), 401);
    assert_eq!(verifier.www_authenticate(&unavailable), CHALLENGE_401_TOKEN);
}

#[tokio::test]
async fn errors_never_echo_the_token() {
    let key = TestKey::ec("k");
    let verifier = setup(&key);
    let secret_looking = token_with(&key, json!({}), json!({"sub": "SECRET-SUBJECT", "aud": "SECRET-AUD"}));
    let err = verifier.verify(Some(&bearer(&secret_looking))).await.expect_err("wrong audience");
    for rendered in [err.to_string(), format!("{err:?}"), verifier.www_authenticate(&err)] {
        assert!(!rendered.contains("SECRET"), "{rendered}");
        assert!(!rendered.contains(&secret_looking[..20]), "{rendered}");
    }
}

#[test]
fn protected_resource_metadata_shape() {
    let key = TestKey::ec("k");
    let mut cfg = config(vec![
        IssuerConfig { issuer: ISSUER_A.into(), jwks: static_jwks(&[&key]), algorithms: vec![Algorithm::ES256] },
        IssuerConfig { issuer: ISSUER_B.into(), jwks: static_jwks(&[&key]), algorithms: vec![Algorithm::ES256] },
    ]);
    cfg.resource_name = Some("Palisade demo".into());
    assert_eq!(
        protected_resource_metadata(&cfg),
        json!({
            "resource": RESOURCE,
            "authorization_servers": [ISSUER_A, ISSUER_B],
            "scopes_supported": ["tools:read", "tools:call"],
            "bearer_methods_supported": ["header"],
            "resource_name": "Palisade demo",
        })
    );
    assert_eq!(
        metadata_paths(RESOURCE),
        ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"]
    );
}
