//! Sealed `requestState` for MRTR round trips. The client holds the state but cannot read-modify
//! it usefully: it is HMAC-SHA256-protected and bound to the caller's partition, the method, a
//! digest of the params and an expiry, so tampered, expired, foreign or replayed-for-other-params
//! state is refused.

use aws_lc_rs::hmac;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_base::canonical::canonical_bytes;
use serde_json::{Map, Value, json};

use crate::secret::ServerSecret;

/// Params keys that differ between an MRTR round and its retry, and so are not bound.
const UNBOUND_PARAMS: &[&str] = &["_meta", "inputResponses", "requestState"];

/// Why a presented state was refused. All variants reach the client as one generic error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Not of our format, or the tag does not verify.
    #[error("request state is malformed or has been tampered with")]
    Tampered,
    /// Past its expiry.
    #[error("request state has expired")]
    Expired,
    /// Sealed for another caller, method or params.
    #[error("request state does not belong to this request")]
    Mismatch,
}

/// Seals and opens request state with a key derived from the server secret.
pub struct StateSealer {
    key: hmac::Key,
    ttl_ms: u64,
}

/// What a sealed state is bound to.
pub struct Binding<'a> {
    /// The caller's partition key.
    pub principal: &'a str,
    /// The method.
    pub method: &'a str,
    /// The request params (unbound keys are skipped).
    pub params: &'a Map<String, Value>,
}

impl Binding<'_> {
    fn digest(&self) -> String {
        let mut bound = self.params.clone();
        for key in UNBOUND_PARAMS {
            bound.remove(*key);
        }
        let mut input = Vec::new();
        input.extend_from_slice(self.principal.as_bytes());
        input.push(0);
        input.extend_from_slice(self.method.as_bytes());
        input.push(0);
        input.extend_from_slice(&canonical_bytes(&Value::Object(bound)));
        URL_SAFE_NO_PAD.encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &input))
    }
}

impl StateSealer {
    /// A sealer whose states live `ttl_ms`.
    pub fn new(secret: &ServerSecret, ttl_ms: u64) -> Self {
        Self { key: secret.derive("palisade/request-state/v1"), ttl_ms }
    }

    /// Seals application state for the client to echo on its retry.
    pub fn seal(&self, state: &Value, binding: &Binding<'_>, now_ms: u64) -> String {
        // Keys in sorted order: the text is then the same whether or not serde_json preserves
        // insertion order (a dependency may switch that on), so a state re-sealed after opening is
        // byte-identical to the one presented.
        let payload = json!({ "b": binding.digest(), "e": now_ms.saturating_add(self.ttl_ms), "s": state });
        let payload = URL_SAFE_NO_PAD.encode(payload.to_string());
        let tag = URL_SAFE_NO_PAD.encode(hmac::sign(&self.key, payload.as_bytes()));
        format!("v1.{payload}.{tag}")
    }

    /// Opens a state presented by a client, checking tag, binding and expiry.
    pub fn open(&self, sealed: &str, binding: &Binding<'_>, now_ms: u64) -> Result<Value, StateError> {
        let mut parts = sealed.split('.');
        let (Some("v1"), Some(payload), Some(tag), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(StateError::Tampered);
        };
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| StateError::Tampered)?;
        hmac::verify(&self.key, payload.as_bytes(), &tag).map_err(|_| StateError::Tampered)?;
        let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| StateError::Tampered)?;
        let mut payload: Map<String, Value> = serde_json::from_slice(&payload).map_err(|_| StateError::Tampered)?;
        let expiry = payload.get("e").and_then(Value::as_u64).ok_or(StateError::Tampered)?;
        if payload.get("b").and_then(Value::as_str) != Some(binding.digest().as_str()) {
            return Err(StateError::Mismatch);
        }
        if now_ms >= expiry {
            return Err(StateError::Expired);
        }
        Ok(payload.remove("s").unwrap_or(Value::Null))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn seal_open_and_every_refusal() {
        let sealer = StateSealer::new(&ServerSecret::from_bytes([7; 32]), 1_000);
        let p = params(json!({"name": "t", "arguments": {"a": 1}}));
        let binding = Binding { principal: "alice", method: "tools/call", params: &p };
        let sealed = sealer.seal(&json!({"round": 1}), &binding, 10_000);
        assert_eq!(sealer.open(&sealed, &binding, 10_500).unwrap(), json!({"round": 1}));

        // The retry adds inputResponses and requestState and a new _meta: still the same binding.
        let retry = params(
            json!({"name": "t", "arguments": {"a": 1}, "inputResponses": {}, "requestState": sealed, "_meta": {}}),
        );
        assert!(
            sealer.open(&sealed, &Binding { principal: "alice", method: "tools/call", params: &retry }, 10_500).is_ok()
        );

        assert_eq!(sealer.open(&sealed, &binding, 11_000), Err(StateError::Expired));
        let other = params(json!({"name": "t", "arguments": {"a": 2}}));
        assert_eq!(
            sealer.open(&sealed, &Binding { principal: "alice", method: "tools/call", params: &other }, 10_500),
            Err(StateError::Mismatch)
        );
        assert_eq!(
            sealer.open(&sealed, &Binding { principal: "bob", method: "tools/call", params: &p }, 10_500),
            Err(StateError::Mismatch)
        );
        assert_eq!(
            sealer.open(&sealed, &Binding { principal: "alice", method: "prompts/get", params: &p }, 10_500),
            Err(StateError::Mismatch)
        );

        let mut tampered = sealed.clone().into_bytes();
        let middle = tampered.len() / 2;
        tampered[middle] = if tampered[middle] == b'A' { b'B' } else { b'A' };
        assert_eq!(sealer.open(&String::from_utf8(tampered).unwrap(), &binding, 10_500), Err(StateError::Tampered));
        assert_eq!(sealer.open("garbage", &binding, 10_500), Err(StateError::Tampered));
        let other_key = StateSealer::new(&ServerSecret::from_bytes([8; 32]), 1_000);
        assert_eq!(other_key.open(&sealed, &binding, 10_500), Err(StateError::Tampered));
    }
}
