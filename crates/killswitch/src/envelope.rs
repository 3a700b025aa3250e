//! The signed envelope both the policy and every authority head travel in:
//! `{"payload_b64": …, "signature_b64": …}`, exactly those two keys, canonical base64, Ed25519
//! (`verify_strict`) over the payload bytes. The payload's digest (SHA-256, lowercase hex) names
//! what was verified.

use aws_lc_rs::digest;
use ed25519_dalek::{Signature, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::b64::{self, Base64Error};
use crate::keys::Ed25519SigningKey;
use crate::target::hex;

/// Largest envelope accepted (a policy with a few thousand operations fits).
pub const MAX_ENVELOPE_BYTES: usize = 4 * 1024 * 1024;

/// The envelope's wire shape. Unknown and duplicate keys are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedEnvelope {
    /// Canonical base64 of the payload bytes.
    pub payload_b64: String,
    /// Canonical base64 of the 64-byte Ed25519 signature over the payload bytes.
    pub signature_b64: String,
}

/// Why an envelope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// Empty or larger than [`MAX_ENVELOPE_BYTES`].
    #[error("signed envelope is empty or too large")]
    Size,
    /// Not a JSON object with exactly `payload_b64` and `signature_b64` as strings.
    #[error("signed envelope schema differs")]
    Schema,
    /// A field is not canonical base64.
    #[error("signed envelope field {field} is {error}")]
    Base64 {
        /// The field.
        field: &'static str,
        /// What is wrong.
        error: Base64Error,
    },
    /// The signature does not verify under the expected key (or is not 64 bytes).
    #[error("signed envelope signature invalid")]
    Signature,
}

/// A payload whose signature verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPayload {
    /// The payload bytes exactly as signed.
    pub bytes: Vec<u8>,
    /// SHA-256 of `bytes`, lowercase hex.
    pub digest: String,
}

/// Parses and verifies an envelope document.
pub fn verify_envelope(raw: &[u8], key: &VerifyingKey) -> Result<VerifiedPayload, EnvelopeError> {
    if raw.is_empty() || raw.len() > MAX_ENVELOPE_BYTES {
        return Err(EnvelopeError::Size);
    }
    let envelope: SignedEnvelope = serde_json::from_slice(raw).map_err(|_| EnvelopeError::Schema)?;
    verify_envelope_fields(&envelope, key)
}

/// Verifies an already-parsed envelope.
pub fn verify_envelope_fields(envelope: &SignedEnvelope, key: &VerifyingKey) -> Result<VerifiedPayload, EnvelopeError> {
    let bytes = b64::decode_canonical(&envelope.payload_b64)
        .map_err(|error| EnvelopeError::Base64 { field: "payload_b64", error })?;
    let signature = b64::decode_canonical(&envelope.signature_b64)
        .map_err(|error| EnvelopeError::Base64 { field: "signature_b64", error })?;
    let signature = Signature::from_slice(&signature).map_err(|_| EnvelopeError::Signature)?;
    key.verify_strict(&bytes, &signature).map_err(|_| EnvelopeError::Signature)?;
    let digest = sha256_hex(&bytes);
    Ok(VerifiedPayload { bytes, digest })
}

/// Signs `payload` into an envelope.
pub fn sign_envelope(payload: &[u8], key: &Ed25519SigningKey) -> SignedEnvelope {
    SignedEnvelope { payload_b64: b64::encode(payload), signature_b64: b64::encode(&key.sign(payload)) }
}

/// The envelope as canonical JSON bytes.
pub fn envelope_bytes(envelope: &SignedEnvelope) -> Vec<u8> {
    match serde_json::to_value(envelope) {
        Ok(value) => palisade_base::canonical::canonical_bytes(&value),
        // Two strings always serialize.
        Err(_) => Vec::new(),
    }
}

/// SHA-256, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, bytes).as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_keys_canonical_base64_and_signature() {
        let key = Ed25519SigningKey::generate().expect("key");
        let other = Ed25519SigningKey::generate().expect("key");
        let envelope = sign_envelope(b"{\"a\":1}", &key);
        let raw = envelope_bytes(&envelope);
        let verified = verify_envelope(&raw, &key.verifying_key()).expect("verifies");
        assert_eq!(verified.bytes, b"{\"a\":1}");
        assert_eq!(verified.digest, sha256_hex(b"{\"a\":1}"));

        assert_eq!(verify_envelope(&raw, &other.verifying_key()), Err(EnvelopeError::Signature));
        let extra = format!(
            "{{\"payload_b64\":\"{}\",\"signature_b64\":\"{}\",\"x\":1}}",
            envelope.payload_b64, envelope.signature_b64
        );
        assert_eq!(verify_envelope(extra.as_bytes(), &key.verifying_key()), Err(EnvelopeError::Schema));
        let duplicate = format!(
            "{{\"payload_b64\":\"{0}\",\"payload_b64\":\"{0}\",\"signature_b64\":\"{1}\"}}",
            envelope.payload_b64, envelope.signature_b64
        );
        assert_eq!(verify_envelope(duplicate.as_bytes(), &key.verifying_key()), Err(EnvelopeError::Schema));
        let unpadded = SignedEnvelope {
            payload_b64: envelope.payload_b64.trim_end_matches('=').to_owned(),
            signature_b64: envelope.signature_b64.clone(),
        };
        assert!(envelope.payload_b64.ends_with('='), "the sample needs padding");
        assert!(matches!(
            verify_envelope(&envelope_bytes(&unpadded), &key.verifying_key()),
            Err(EnvelopeError::Base64 { field: "payload_b64", .. })
        ));
        let mut flipped = envelope.clone();
        flipped.payload_b64 = b64::encode(b"{\"a\":2}");
        assert_eq!(verify_envelope(&envelope_bytes(&flipped), &key.verifying_key()), Err(EnvelopeError::Signature));
    }
}
