//! The development issuer: key created once with mode 0600, reloaded with a stable `kid`, tokens
//! it mints verify against its static JWKS, unsafe key files refused.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_auth::dev_issuer::{DevIssuer, DevIssuerError, JWKS_FILE_NAME, KEY_FILE_NAME};
use palisade_auth::{InvalidTokenReason, JwkSet, ResourceServerConfig, TokenVerifier};
use serde_json::Value;

const ISSUER: &str = "http://127.0.0.1:8080";
const AUDIENCE: &str = "http://127.0.0.1:8080/mcp";

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "palisade-auth-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn verifier_for(issuer: &DevIssuer) -> TokenVerifier {
    let mut cfg = ResourceServerConfig::new(
        AUDIENCE,
        "http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp",
        vec![issuer.issuer_config()],
    );
    cfg.required_typ = Some("at+jwt".into());
    TokenVerifier::new(cfg).expect("valid config")
}

fn segment_json(token: &str, index: usize) -> Value {
    let part = token.split('.').nth(index).expect("segment");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).expect("b64")).expect("json")
}

#[tokio::test]
async fn mint_and_verify_round_trip() {
    let dir = TempDir::new("roundtrip");
    let issuer = DevIssuer::load_or_create(dir.path(), ISSUER).expect("created");
    let token =
        issuer.mint("alice", "acme", "demo-client", &["tools:read", "tools:call"], AUDIENCE, 600).expect("minted");

    let header = segment_json(&token, 0);
    assert_eq!(header["alg"], "ES256");
    assert_eq!(header["typ"], "at+jwt");
    assert_eq!(header["kid"], issuer.kid());
    let claims = segment_json(&token, 1);
    for name in ["iss", "sub", "aud", "exp", "iat", "nbf", "jti", "scope", "tenant", "client_id"] {
        assert!(claims.get(name).is_some(), "missing {name}");
    }
    assert_eq!(claims["exp"].as_u64().expect("exp") - claims["iat"].as_u64().expect("iat"), 600);

    let verifier = verifier_for(&issuer);
    let verified = verifier.verify(Some(format!("Bearer {token}").as_bytes())).await.expect("verifies");
    assert_eq!(verified.principal(), "http://127.0.0.1:8080#alice");
    assert_eq!(verified.tenant(), Some("acme"));
    assert_eq!(verified.client_id(), Some("demo-client"));
    assert!(verified.has_scope("tools:read") && verified.has_scope("tools:call"));

    // Minted for another audience: refused.
    let other = issuer.mint("alice", "acme", "demo-client", &[], "http://127.0.0.1:9999/mcp", 600).expect("minted");
    assert_eq!(
        verifier.verify(Some(format!("Bearer {other}").as_bytes())).await.err(),
        Some(palisade_auth::AuthError::InvalidToken(InvalidTokenReason::WrongAudience))
    );
}

#[tokio::test]
async fn key_is_private_and_reloaded_with_a_stable_kid() {
    let dir = TempDir::new("reload");
    let first = DevIssuer::load_or_create(dir.path(), ISSUER).expect("created");
    let key_path = dir.path().join(KEY_FILE_NAME);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_path).expect("key file").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "key file mode {mode:o}");
    }
    let jwks: JwkSet =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(JWKS_FILE_NAME)).expect("jwks file"))
            .expect("jwks json");
    assert_eq!(jwks.keys.len(), 1);
    assert_eq!(jwks.keys[0].common.key_id.as_deref(), Some(first.kid()));

    let key_bytes = std::fs::read(&key_path).expect("key");
    let second = DevIssuer::load_or_create(dir.path(), ISSUER).expect("reloaded");
    assert_eq!(second.kid(), first.kid());
    assert_eq!(std::fs::read(&key_path).expect("key"), key_bytes, "key not regenerated");

    // A token from before the restart verifies after it.
    let token = first.mint("bob", "t", "c", &["x"], AUDIENCE, 60).expect("minted");
    verifier_for(&second).verify(Some(format!("Bearer {token}").as_bytes())).await.expect("verifies");
}

#[cfg(unix)]
#[test]
fn unsafe_key_files_are_refused() {
    use std::os::unix::fs::PermissionsExt;

    let dir = TempDir::new("unsafe");
    DevIssuer::load_or_create(dir.path(), ISSUER).expect("created");
    let key_path = dir.path().join(KEY_FILE_NAME);
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    assert!(matches!(
        DevIssuer::load_or_create(dir.path(), ISSUER),
        Err(DevIssuerError::InsecureKeyFile { mode: 0o644, .. })
    ));

    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::write(&key_path, b"not a key").expect("overwrite");
    assert!(matches!(DevIssuer::load_or_create(dir.path(), ISSUER), Err(DevIssuerError::InvalidKey { .. })));

    let other = TempDir::new("symlink");
    std::fs::create_dir_all(other.path()).expect("dir");
    std::os::unix::fs::symlink(&key_path, other.path().join(KEY_FILE_NAME)).expect("symlink");
    assert!(matches!(DevIssuer::load_or_create(other.path(), ISSUER), Err(DevIssuerError::NotARegularFile { .. })));
}

#[test]
fn issuer_must_be_an_acceptable_url() {
    let dir = TempDir::new("issuer");
    assert!(matches!(
        DevIssuer::load_or_create(dir.path(), "http://example.com"),
        Err(DevIssuerError::InvalidIssuer(palisade_auth::UrlProblem::PlainHttpNotLoopback))
    ));
    assert!(!dir.path().exists(), "nothing written for a refused issuer");
}
