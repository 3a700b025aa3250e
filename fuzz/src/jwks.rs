//! The `jwks` property: JWK Set documents as `palisade-auth` loads them for an issuer (through
//! `JwksSource::Static`, the same key parsing a fetched set gets), judged by what the loaded set
//! then verifies.
//!
//! One fixture per process: two development issuers under the same issuer name, each with its
//! own ES256 key (kept in `fuzz/target/jwks-issuer-{a,b}/`, git-ignored, created on first use),
//! a fixed [`ManualClock`], and one token minted by each.
//!
//! Per input (first byte = mode): the rest is the JWKS document, either as is (even modes) or as a
//! template (odd modes) where `$JWK_A` / `$JWK_B` stand for each issuer's public JWK, `$KID_A` /
//! `$KID_B` for their key ids and `$XA` `$YA` `$XB` `$YB` for their curve points, so the seeds can
//! build near-miss sets (a key under another's kid, swapped coordinates, duplicate kids) without
//! holding a key. Loading never panics, and a token verifies only if the set has, under the
//! token's `kid`, a key with exactly the public point of the key that signed it.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use palisade_auth::dev_issuer::DevIssuer;
use palisade_auth::{Algorithm, IssuerConfig, JwkSet, JwksPolicy, JwksSource, ResourceServerConfig, TokenVerifier};
use palisade_base::clock::ManualClock;
use serde_json::Value;

const ISSUER: &str = "http://127.0.0.1:1/dev-issuer";
const RESOURCE: &str = "http://127.0.0.1:1/mcp";
const METADATA_URL: &str = "http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp";
/// The fixture's fixed "now" (seconds).
const NOW_SECS: u64 = 1_800_000_000;

struct Signer {
    /// Its public JWK as JSON text.
    jwk: String,
    kid: String,
    x: String,
    y: String,
    /// A token it signed (subject = the signer's name).
    token: String,
    subject: &'static str,
}

struct Fixture {
    runtime: tokio::runtime::Runtime,
    clock: Arc<ManualClock>,
    signers: [Signer; 2],
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let clock = Arc::new(ManualClock::new(i64::try_from(NOW_SECS * 1000).expect("a fixed time")));
        let signer = |name: &'static str, dir: &str| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join(dir);
            let issuer = DevIssuer::load_or_create(&dir, ISSUER).expect("development issuer").with_clock(clock.clone());
            let jwk = serde_json::to_value(&issuer.jwks().keys[0]).expect("a JWK serialises");
            let text = |key: &str| jwk[key].as_str().expect("an EC JWK has x and y").to_owned();
            let token = issuer.mint(name, "acme", "fuzz", &["shop:read"], RESOURCE, 3600).expect("mint");
            Signer {
                jwk: jwk.to_string(),
                kid: issuer.kid().to_owned(),
                x: text("x"),
                y: text("y"),
                token,
                subject: name,
            }
        };
        let signers = [signer("alice", "jwks-issuer-a"), signer("bob", "jwks-issuer-b")];
        assert_ne!(signers[0].x, signers[1].x, "two distinct keys");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
        Fixture { runtime, clock, signers }
    })
}

impl Fixture {
    fn expand(&self, template: &[u8]) -> Vec<u8> {
        let [a, b] = &self.signers;
        let mut text = String::from_utf8_lossy(template).into_owned();
        for (name, value) in [
            ("$JWK_A", &a.jwk),
            ("$JWK_B", &b.jwk),
            ("$KID_A", &a.kid),
            ("$KID_B", &b.kid),
            ("$XA", &a.x),
            ("$YA", &a.y),
            ("$XB", &b.x),
            ("$YB", &b.y),
        ] {
            text = text.replace(name, value);
        }
        text.into_bytes()
    }
}

/// The property; see the module documentation.
pub fn jwks(data: &[u8]) {
    let fx = fixture();
    let Some((&mode, rest)) = data.split_first() else { return };
    let document = if mode % 2 == 1 { fx.expand(rest) } else { rest.to_vec() };
    let Ok(set) = serde_json::from_slice::<JwkSet>(&document) else { return };
    let published = serde_json::to_value(&set).expect("a JwkSet serialises");
    let issuer = IssuerConfig {
        issuer: ISSUER.to_owned(),
        jwks: JwksSource::Static(set),
        algorithms: vec![Algorithm::ES256, Algorithm::EdDSA, Algorithm::RS256],
    };
    let config = ResourceServerConfig::new(RESOURCE, METADATA_URL, vec![issuer]);
    let Ok(verifier) = TokenVerifier::with_clock_and_policy(config, fx.clock.clone(), JwksPolicy::default()) else {
        return;
    };
    for signer in &fx.signers {
        let header = format!("Bearer {}", signer.token);
        let Ok(claims) = fx.runtime.block_on(verifier.verify(Some(header.as_bytes()))) else { continue };
        assert_eq!(claims.subject(), signer.subject, "a token verified as someone else");
        assert!(
            publishes(&published, signer),
            "{}'s token verified without its key under its kid: {published}",
            signer.subject
        );
    }
}

/// Whether the set publishes, under the signer's kid, an EC P-256 key with the signer's point.
fn publishes(set: &Value, signer: &Signer) -> bool {
    set["keys"].as_array().is_some_and(|keys| {
        keys.iter().any(|key| {
            key["kid"] == signer.kid.as_str()
                && key["kty"] == "EC"
                && key["crv"] == "P-256"
                && key["x"] == signer.x.as_str()
                && key["y"] == signer.y.as_str()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed publishing alice's issuer key verifies alice's token (the accepting branch).
    #[test]
    fn the_seed_with_the_real_key_verifies() {
        let fx = fixture();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/jwks/template_key_a");
        let seed = std::fs::read(&path).expect("the seed");
        let document = fx.expand(&seed[1..]);
        let set: JwkSet = serde_json::from_slice(&document).expect("the seed expands to a JWK Set");
        let issuer = IssuerConfig {
            issuer: ISSUER.to_owned(),
            jwks: JwksSource::Static(set),
            algorithms: vec![Algorithm::ES256],
        };
        let config = ResourceServerConfig::new(RESOURCE, METADATA_URL, vec![issuer]);
        let verifier =
            TokenVerifier::with_clock_and_policy(config, fx.clock.clone(), JwksPolicy::default()).expect("a verifier");
        let header = format!("Bearer {}", fx.signers[0].token);
        assert!(fx.runtime.block_on(verifier.verify(Some(header.as_bytes()))).is_ok());
        jwks(&seed);
    }
}
