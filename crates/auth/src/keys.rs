//! Turning JWKs into verification keys, one algorithm per key, so key confusion cannot be
//! expressed: an RSA key only ever verifies RS256, a P-256 key only ES256, an Ed25519 key only
//! EdDSA, and symmetric (`oct`) keys are never loaded.
//!
//! Keys are parsed and validated once, when a key set is loaded: P-256 points must be on the
//! curve, RSA moduli 2048–8192 bits, Ed25519 keys not of small order (`is_weak`). A key that fails
//! is skipped with a warning; the rest of the set stays usable.
//!
//! Verification uses aws-lc-rs for ES256/RS256 (pre-parsed `ParsedPublicKey`) and ed25519-dalek
//! `verify_strict` for EdDSA (aws-lc-rs accepts small-order Ed25519 keys; see CRATES.md).

use std::collections::HashMap;
use std::sync::Arc;

use aws_lc_rs::digest::{Context, SHA256};
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED, ParsedPublicKey, RSA_PKCS1_2048_8192_SHA256, RsaPublicKeyComponents,
};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::JwkSet;
use serde_json::{Map, Value};

use crate::jws::JwsAlgorithm;

const MIN_RSA_BITS: usize = 2048;
const MAX_RSA_BITS: usize = 8192;

/// Why a key set as a whole was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySetError {
    /// The document is not a JSON object with a `keys` array.
    #[error("not a JWK Set (expected an object with a \"keys\" array)")]
    NotAKeySet,
    /// A static key set where no key is usable with the issuer's algorithms.
    #[error("no usable key ({rejected} rejected)")]
    NoUsableKeys {
        /// How many keys were present but refused.
        rejected: usize,
    },
}

/// Why one JWK was skipped (logged, never returned to a client).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum KeyRejection {
    #[error("not a JSON object")]
    NotAnObject,
    #[error("missing or empty kid")]
    MissingKid,
    #[error("kid appears more than once in the set")]
    DuplicateKid,
    #[error("not a signature key (use/key_ops)")]
    NotForSignatures,
    #[error("unsupported kty or crv")]
    UnsupportedKeyType,
    #[error("alg member does not match the key type")]
    AlgorithmMismatch,
    #[error("algorithm not allowed for this issuer")]
    AlgorithmNotAllowed,
    #[error("key parameters are not valid base64url of the right length")]
    BadEncoding,
    #[error("invalid public key")]
    InvalidKey,
    #[error("RSA modulus outside 2048..=8192 bits")]
    RsaKeySize,
    #[error("weak (small-order) Ed25519 key")]
    WeakKey,
}

enum KeyMaterial {
    Ecdsa(ParsedPublicKey),
    Rsa { key: ParsedPublicKey, modulus_len: usize },
    Ed25519(ed25519_dalek::VerifyingKey),
}

/// One usable public key, bound to exactly one algorithm.
pub(crate) struct VerificationKey {
    alg: JwsAlgorithm,
    material: KeyMaterial,
    /// SHA-256 over the algorithm and public key bytes: identifies the key material so a cached
    /// verification is only reused while the same key is still published under its `kid`.
    fingerprint: [u8; 32],
}

impl VerificationKey {
    pub(crate) fn alg(&self) -> JwsAlgorithm {
        self.alg
    }

    pub(crate) fn fingerprint(&self) -> &[u8; 32] {
        &self.fingerprint
    }

    /// Whether `signature` is valid for `signing_input` under this key and its one algorithm.
    pub(crate) fn verify(&self, signing_input: &[u8], signature: &[u8]) -> bool {
        match &self.material {
            KeyMaterial::Ecdsa(key) => signature.len() == 64 && key.verify_sig(signing_input, signature).is_ok(),
            KeyMaterial::Rsa { key, modulus_len } => {
                signature.len() == *modulus_len && key.verify_sig(signing_input, signature).is_ok()
            }
            KeyMaterial::Ed25519(key) => {
                let Ok(bytes) = <[u8; 64]>::try_from(signature) else {
                    return false;
                };
                key.verify_strict(signing_input, &ed25519_dalek::Signature::from_bytes(&bytes)).is_ok()
            }
        }
    }
}

/// The usable keys of one issuer, by `kid`.
#[derive(Default)]
pub(crate) struct KeySet {
    keys: HashMap<String, Arc<VerificationKey>>,
}

impl KeySet {
    /// A configured (static) key set: refused when no key is usable.
    pub(crate) fn from_jwk_set(set: &JwkSet, allowed: &[JwsAlgorithm]) -> Result<Self, KeySetError> {
        let value = serde_json::to_value(set).map_err(|_| KeySetError::NotAKeySet)?;
        let (keys, rejected) = Self::parse(&value, allowed, "static")?;
        if keys.keys.is_empty() {
            return Err(KeySetError::NoUsableKeys { rejected });
        }
        Ok(keys)
    }

    /// A fetched key set. An empty result is allowed (the issuer publishes no key we can use;
    /// every token is then refused with an unknown `kid`).
    pub(crate) fn from_json(value: &Value, allowed: &[JwsAlgorithm], issuer: &str) -> Result<Self, KeySetError> {
        Self::parse(value, allowed, issuer).map(|(keys, _)| keys)
    }

    pub(crate) fn get(&self, kid: &str) -> Option<&Arc<VerificationKey>> {
        self.keys.get(kid)
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    fn parse(value: &Value, allowed: &[JwsAlgorithm], issuer: &str) -> Result<(Self, usize), KeySetError> {
        let Some(Value::Array(jwks)) = value.as_object().and_then(|o| o.get("keys")) else {
            return Err(KeySetError::NotAKeySet);
        };
        let mut keys: HashMap<String, Arc<VerificationKey>> = HashMap::new();
        let mut duplicates: Vec<String> = Vec::new();
        let mut rejected = 0;
        for jwk in jwks {
            match parse_jwk(jwk, allowed) {
                Ok((kid, key)) => {
                    if keys.insert(kid.clone(), Arc::new(key)).is_some() {
                        duplicates.push(kid);
                    }
                }
                Err(reason) => {
                    rejected += 1;
                    let kid = jwk.get("kid").and_then(Value::as_str).unwrap_or("");
                    tracing::warn!(issuer, kid, %reason, "skipping JWK");
                }
            }
        }
        // Two keys under one kid: we cannot know which one the issuer means, so trust neither.
        for kid in duplicates {
            if keys.remove(&kid).is_some() {
                rejected += 2;
            }
            tracing::warn!(issuer, kid = kid.as_str(), reason = %KeyRejection::DuplicateKid, "skipping JWK");
        }
        Ok((Self { keys }, rejected))
    }
}

fn parse_jwk(jwk: &Value, allowed: &[JwsAlgorithm]) -> Result<(String, VerificationKey), KeyRejection> {
    let object = jwk.as_object().ok_or(KeyRejection::NotAnObject)?;
    let kid = match object.get("kid") {
        Some(Value::String(kid)) if !kid.is_empty() => kid.clone(),
        _ => return Err(KeyRejection::MissingKid),
    };
    match object.get("use") {
        None => {}
        Some(Value::String(usage)) if usage == "sig" => {}
        Some(_) => return Err(KeyRejection::NotForSignatures),
    }
    match object.get("key_ops") {
        None => {}
        Some(Value::Array(ops)) if ops.iter().any(|op| op.as_str() == Some("verify")) => {}
        Some(_) => return Err(KeyRejection::NotForSignatures),
    }
    let kty = object.get("kty").and_then(Value::as_str).unwrap_or("");
    let crv = object.get("crv").and_then(Value::as_str);
    let alg = match (kty, crv) {
        ("EC", Some("P-256")) => JwsAlgorithm::Es256,
        ("RSA", _) => JwsAlgorithm::Rs256,
        ("OKP", Some("Ed25519")) => JwsAlgorithm::EdDsa,
        _ => return Err(KeyRejection::UnsupportedKeyType),
    };
    match object.get("alg") {
        None => {}
        Some(Value::String(name)) if name == alg.name() => {}
        Some(_) => return Err(KeyRejection::AlgorithmMismatch),
    }
    if !allowed.contains(&alg) {
        return Err(KeyRejection::AlgorithmNotAllowed);
    }
    let key = match alg {
        JwsAlgorithm::Es256 => ec_p256_key(object)?,
        JwsAlgorithm::Rs256 => rsa_key(object)?,
        JwsAlgorithm::EdDsa => ed25519_key(object)?,
    };
    Ok((kid, key))
}

fn member(object: &Map<String, Value>, name: &str) -> Result<Vec<u8>, KeyRejection> {
    let encoded = object.get(name).and_then(Value::as_str).ok_or(KeyRejection::BadEncoding)?;
    URL_SAFE_NO_PAD.decode(encoded).map_err(|_| KeyRejection::BadEncoding)
}

fn fingerprint(alg: JwsAlgorithm, parts: &[&[u8]]) -> [u8; 32] {
    let mut context = Context::new(&SHA256);
    context.update(alg.name().as_bytes());
    for part in parts {
        context.update(&(part.len() as u64).to_be_bytes());
        context.update(part);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(context.finish().as_ref());
    out
}

fn ec_p256_key(object: &Map<String, Value>) -> Result<VerificationKey, KeyRejection> {
    let x = member(object, "x")?;
    let y = member(object, "y")?;
    if x.len() != 32 || y.len() != 32 {
        return Err(KeyRejection::BadEncoding);
    }
    let mut point = Vec::with_capacity(65);
    point.push(0x04);
    point.extend_from_slice(&x);
    point.extend_from_slice(&y);
    // Parsing checks the point is on the curve and not the point at infinity.
    let key = ParsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &point).map_err(|_| KeyRejection::InvalidKey)?;
    Ok(VerificationKey {
        alg: JwsAlgorithm::Es256,
        fingerprint: fingerprint(JwsAlgorithm::Es256, &[&point]),
        material: KeyMaterial::Ecdsa(key),
    })
}

fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}

fn rsa_key(object: &Map<String, Value>) -> Result<VerificationKey, KeyRejection> {
    let n = member(object, "n")?;
    let e = member(object, "e")?;
    let n = strip_leading_zeros(&n);
    let e = strip_leading_zeros(&e);
    let Some(&top) = n.first() else {
        return Err(KeyRejection::InvalidKey);
    };
    let bits = n.len() * 8 - top.leading_zeros() as usize;
    if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
        return Err(KeyRejection::RsaKeySize);
    }
    // Public exponent: odd, at least 3, at most 64 bits.
    let odd = e.last().is_some_and(|last| last & 1 == 1);
    if !odd || e.len() > 8 || (e.len() == 1 && e[0] < 3) {
        return Err(KeyRejection::InvalidKey);
    }
    let key = RsaPublicKeyComponents { n, e }
        .to_parsed_public_key(&RSA_PKCS1_2048_8192_SHA256)
        .map_err(|_| KeyRejection::InvalidKey)?;
    Ok(VerificationKey {
        alg: JwsAlgorithm::Rs256,
        fingerprint: fingerprint(JwsAlgorithm::Rs256, &[n, e]),
        material: KeyMaterial::Rsa { key, modulus_len: n.len() },
    })
}

fn ed25519_key(object: &Map<String, Value>) -> Result<VerificationKey, KeyRejection> {
    let x = member(object, "x")?;
    let bytes = <[u8; 32]>::try_from(x.as_slice()).map_err(|_| KeyRejection::BadEncoding)?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|_| KeyRejection::InvalidKey)?;
    if key.is_weak() {
        return Err(KeyRejection::WeakKey);
    }
    Ok(VerificationKey {
        alg: JwsAlgorithm::EdDsa,
        fingerprint: fingerprint(JwsAlgorithm::EdDsa, &[&bytes]),
        material: KeyMaterial::Ed25519(key),
    })
}

#[cfg(test)]
mod tests {
    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
    use serde_json::json;

    use super::*;

    const ALL: &[JwsAlgorithm] = &[JwsAlgorithm::Es256, JwsAlgorithm::EdDsa, JwsAlgorithm::Rs256];

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn ec_jwk(kid: &str) -> (EcdsaKeyPair, Value) {
        let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).expect("keygen");
        let public = pair.public_key().as_ref().to_vec();
        let jwk = json!({"kty":"EC","crv":"P-256","kid":kid,"x":b64(&public[1..33]),"y":b64(&public[33..65])});
        (pair, jwk)
    }

    fn reject(jwk: Value, allowed: &[JwsAlgorithm]) -> KeyRejection {
        match parse_jwk(&jwk, allowed) {
            Ok(_) => panic!("{jwk} unexpectedly accepted"),
            Err(reason) => reason,
        }
    }

    #[test]
    fn ec_key_verifies_es256_only() {
        let (pair, jwk) = ec_jwk("k");
        let (kid, key) = parse_jwk(&jwk, ALL).expect("usable");
        assert_eq!(kid, "k");
        assert_eq!(key.alg(), JwsAlgorithm::Es256);
        let sig = pair.sign(&SystemRandom::new(), b"msg").expect("sign");
        assert!(key.verify(b"msg", sig.as_ref()));
        assert!(!key.verify(b"msh", sig.as_ref()));
        assert!(!key.verify(b"msg", &sig.as_ref()[..63]));
    }

    #[test]
    fn ed25519_weak_and_good_keys() {
        let pair = Ed25519KeyPair::generate().expect("keygen");
        let good = json!({"kty":"OKP","crv":"Ed25519","kid":"e","x":b64(pair.public_key().as_ref())});
        let (_, key) = parse_jwk(&good, ALL).expect("usable");
        let sig = pair.sign(b"hello");
        assert!(key.verify(b"hello", sig.as_ref()));
        assert!(!key.verify(b"hellp", sig.as_ref()));

        // The identity point (order 1) and an order-8 point are small-order: refused.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let weak = json!({"kty":"OKP","crv":"Ed25519","kid":"w","x":b64(&identity)});
        assert_eq!(reject(weak, ALL), KeyRejection::WeakKey);
        let zero = json!({"kty":"OKP","crv":"Ed25519","kid":"z","x":b64(&[0u8; 32])});
        assert_eq!(reject(zero, ALL), KeyRejection::WeakKey);
    }

    #[test]
    fn jwk_refusals() {
        let (_, ec) = ec_jwk("k");
        let with = |name: &str, value: Value| {
            let mut jwk = ec.clone();
            jwk[name] = value;
            jwk
        };
        assert_eq!(reject(json!("x"), ALL), KeyRejection::NotAnObject);
        assert_eq!(reject(with("kid", json!("")), ALL), KeyRejection::MissingKid);
        assert_eq!(reject(with("kid", json!(3)), ALL), KeyRejection::MissingKid);
        assert_eq!(reject(with("use", json!("enc")), ALL), KeyRejection::NotForSignatures);
        assert_eq!(reject(with("key_ops", json!(["sign"])), ALL), KeyRejection::NotForSignatures);
        assert_eq!(reject(with("alg", json!("RS256")), ALL), KeyRejection::AlgorithmMismatch);
        assert_eq!(reject(with("crv", json!("P-384")), ALL), KeyRejection::UnsupportedKeyType);
        assert_eq!(reject(ec.clone(), &[JwsAlgorithm::EdDsa]), KeyRejection::AlgorithmNotAllowed);
        assert_eq!(reject(with("x", json!("AAAA")), ALL), KeyRejection::BadEncoding);
        assert_eq!(reject(with("y", json!(b64(&[7u8; 32]))), ALL), KeyRejection::InvalidKey);
        assert_eq!(reject(json!({"kty":"oct","kid":"h","k":"c2VjcmV0"}), ALL), KeyRejection::UnsupportedKeyType);
        let small_rsa = json!({"kty":"RSA","kid":"r","n":b64(&[0xff; 128]),"e":"AQAB"});
        assert_eq!(reject(small_rsa, ALL), KeyRejection::RsaKeySize);
        let even_e = json!({"kty":"RSA","kid":"r","n":b64(&[0xff; 256]),"e":b64(&[2])});
        assert_eq!(reject(even_e, ALL), KeyRejection::InvalidKey);
        assert!(parse_jwk(&with("use", json!("sig")), ALL).is_ok());
        assert!(parse_jwk(&with("alg", json!("ES256")), ALL).is_ok());
    }

    #[test]
    fn duplicate_kids_are_dropped_and_static_sets_need_a_key() {
        let (_, a) = ec_jwk("same");
        let (_, b) = ec_jwk("same");
        let (_, c) = ec_jwk("other");
        let set = KeySet::from_json(&json!({"keys":[a, b, c]}), ALL, "test").expect("set");
        assert!(set.get("same").is_none());
        assert!(set.get("other").is_some());
        assert_eq!(set.len(), 1);
        assert_eq!(KeySet::from_json(&json!({"nokeys":[]}), ALL, "test").err(), Some(KeySetError::NotAKeySet));
        assert_eq!(KeySet::from_json(&json!([]), ALL, "test").err(), Some(KeySetError::NotAKeySet));
        let empty = JwkSet { keys: vec![] };
        assert_eq!(KeySet::from_jwk_set(&empty, ALL).err(), Some(KeySetError::NoUsableKeys { rejected: 0 }));
    }
}
