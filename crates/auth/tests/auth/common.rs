//! Shared fixtures: signing keys of every supported type, a token forger, standard
//! configurations and a fixed clock.

use std::sync::{Arc, OnceLock};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RSA_PKCS1_SHA256, RsaKeyPair,
    RsaPublicKeyComponents,
};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_auth::{IssuerConfig, JwkSet, JwksPolicy, JwksSource, ResourceServerConfig, TokenVerifier};
pub use palisade_base::clock::ManualClock;
use serde_json::{Value, json};

pub const RESOURCE: &str = "https://mcp.example.com/mcp";
pub const METADATA_URL: &str = "https://mcp.example.com/.well-known/oauth-protected-resource/mcp";
pub const ISSUER_A: &str = "https://idp.example.com";
pub const ISSUER_B: &str = "https://idp-b.example.com";
/// The fixed "now" of every test, in seconds.
pub const NOW: u64 = 1_800_000_000;
pub const LEEWAY: u64 = 30;

pub fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

pub enum Signer {
    Ec(EcdsaKeyPair),
    Ed(Ed25519KeyPair),
    Rsa(Arc<RsaKeyPair>),
}

/// A signing key with its `kid` and public JWK.
pub struct TestKey {
    pub kid: String,
    pub alg: &'static str,
    pub signer: Signer,
    pub jwk: Value,
}

impl TestKey {
    pub fn ec(kid: &str) -> Self {
        let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).expect("keygen");
        let public = pair.public_key().as_ref();
        let jwk = json!({"kty":"EC","crv":"P-256","kid":kid,"use":"sig","alg":"ES256",
                         "x":b64(&public[1..33]),"y":b64(&public[33..65])});
        Self { kid: kid.into(), alg: "ES256", signer: Signer::Ec(pair), jwk }
    }

    pub fn ed(kid: &str) -> Self {
        let pair = Ed25519KeyPair::generate().expect("keygen");
        let jwk = json!({"kty":"OKP","crv":"Ed25519","kid":kid,"x":b64(pair.public_key().as_ref())});
        Self { kid: kid.into(), alg: "EdDSA", signer: Signer::Ed(pair), jwk }
    }

    /// RSA keygen is slow in debug builds: one 2048-bit key per test process, any `kid`.
    pub fn rsa(kid: &str) -> Self {
        static PAIR: OnceLock<Arc<RsaKeyPair>> = OnceLock::new();
        let pair = Arc::clone(
            PAIR.get_or_init(|| Arc::new(RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).expect("keygen"))),
        );
        let components = RsaPublicKeyComponents::<Vec<u8>>::from(pair.public_key());
        let jwk = json!({"kty":"RSA","kid":kid,"n":b64(&components.n),"e":b64(&components.e)});
        Self { kid: kid.into(), alg: "RS256", signer: Signer::Rsa(pair), jwk }
    }

    /// The raw public key bytes (what an attacker would use as an HMAC secret).
    pub fn public_bytes(&self) -> Vec<u8> {
        match &self.signer {
            Signer::Ec(pair) => pair.public_key().as_ref().to_vec(),
            Signer::Ed(pair) => pair.public_key().as_ref().to_vec(),
            Signer::Rsa(pair) => pair.public_key().as_ref().to_vec(),
        }
    }

    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        match &self.signer {
            Signer::Ec(pair) => pair.sign(&SystemRandom::new(), message).expect("sign").as_ref().to_vec(),
            Signer::Ed(pair) => pair.sign(message).as_ref().to_vec(),
            Signer::Rsa(pair) => {
                let mut out = vec![0u8; pair.public_modulus_len()];
                pair.sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), message, &mut out).expect("sign");
                out
            }
        }
    }
}

/// `base` with `overrides` applied; a `null` override removes the member.
pub fn merged(mut base: Value, overrides: Value) -> Value {
    if let (Some(target), Some(changes)) = (base.as_object_mut(), overrides.as_object()) {
        for (name, value) in changes {
            if value.is_null() {
                target.remove(name);
            } else {
                target.insert(name.clone(), value.clone());
            }
        }
    }
    base
}

pub fn default_claims(issuer: &str) -> Value {
    json!({
        "iss": issuer, "sub": "alice", "aud": RESOURCE, "exp": NOW + 3600, "iat": NOW, "nbf": NOW,
        "jti": "j1", "scope": "tools:read tools:call", "tenant": "t1", "client_id": "c1",
    })
}

/// Signs raw header and payload bytes: `b64(header).b64(payload).b64(sig)`.
pub fn sign_raw(key: &TestKey, header: &[u8], payload: &[u8]) -> String {
    let signing_input = format!("{}.{}", b64(header), b64(payload));
    let signature = key.sign(signing_input.as_bytes());
    format!("{signing_input}.{}", b64(&signature))
}

/// A token from issuer A signed by `key`, with header and claim overrides.
pub fn token_with(key: &TestKey, header: Value, claims: Value) -> String {
    let header = merged(json!({"alg": key.alg, "kid": key.kid, "typ": "at+jwt"}), header);
    let claims = merged(default_claims(ISSUER_A), claims);
    sign_raw(key, header.to_string().as_bytes(), claims.to_string().as_bytes())
}

/// A valid token from issuer A signed by `key`.
pub fn token(key: &TestKey) -> String {
    token_with(key, json!({}), json!({}))
}

pub fn bearer(token: &str) -> Vec<u8> {
    format!("Bearer {token}").into_bytes()
}

pub fn jwk_set(keys: &[&TestKey]) -> Value {
    json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() })
}

pub fn static_jwks(keys: &[&TestKey]) -> JwksSource {
    JwksSource::Static(serde_json::from_value::<JwkSet>(jwk_set(keys)).expect("jwk set"))
}

pub fn config(issuers: Vec<IssuerConfig>) -> ResourceServerConfig {
    let mut cfg = ResourceServerConfig::new(RESOURCE, METADATA_URL, issuers);
    cfg.leeway_secs = LEEWAY;
    cfg.scopes_supported = vec!["tools:read".into(), "tools:call".into()];
    cfg
}

/// `ms` as the clock's signed milliseconds (test times are far below `i64::MAX`).
pub fn ms(ms: u64) -> i64 {
    i64::try_from(ms).expect("a test time fits i64")
}

pub fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(ms(NOW * 1000)))
}

pub fn verifier(cfg: ResourceServerConfig, clock: &Arc<ManualClock>) -> TokenVerifier {
    TokenVerifier::with_clock_and_policy(cfg, clock.clone(), JwksPolicy::default()).expect("valid config")
}

/// A plain TCP listener on a loopback address that counts the connections it accepts and answers
/// each with `reply` (if any), then closes. Stands for an address that must never be reached.
pub struct Listener {
    pub port: u16,
    connections: Arc<std::sync::atomic::AtomicUsize>,
}

impl Listener {
    pub async fn start(ip: &str, port: u16, reply: Option<&'static str>) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind((ip, port)).await.expect("bind the fixture listener");
        let port = listener.local_addr().expect("local address").port();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    let _ = stream.read(&mut buffer).await;
                    if let Some(reply) = reply {
                        let _ = stream.write_all(reply.as_bytes()).await;
                    }
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { port, connections }
    }

    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A tiny HTTP CONNECT proxy on 127.0.0.1: records each request line (`CONNECT host:port …`),
/// answers `200` and closes the tunnel (so a TLS handshake through it fails).
pub struct ConnectProxy {
    pub port: u16,
    requests: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ConnectProxy {
    pub async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.expect("bind the proxy");
        let port = listener.local_addr().expect("local address").port();
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buffer = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&buffer[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&head);
                    let line = text.lines().next().unwrap_or("").to_owned();
                    seen.lock().expect("lock").push(line);
                    let _ = stream.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { port, requests }
    }

    /// The request lines received so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }
}

/// A test resolver answering from a table (and nothing for other names), counting lookups.
pub fn table_resolver(
    table: &[(&str, &[&str])],
) -> (palisade_auth::egress::Resolver, Arc<std::sync::Mutex<Vec<String>>>) {
    let table: Vec<(String, Vec<std::net::IpAddr>)> = table
        .iter()
        .map(|(name, ips)| ((*name).to_owned(), ips.iter().map(|ip| ip.parse().expect("an IP address")).collect()))
        .collect();
    let lookups = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = lookups.clone();
    let resolver = palisade_auth::egress::Resolver::new(move |host| {
        seen.lock().expect("lock").push(host.to_owned());
        table.iter().find(|(name, _)| name.eq_ignore_ascii_case(host)).map(|(_, ips)| ips.clone()).unwrap_or_default()
    });
    (resolver, lookups)
}
