//! The server's 32-byte secret and the keys derived from it (request-state sealing, cursors).
//! The secret's bytes are wiped when it is dropped (`zeroize`), its `Debug` prints no byte of it,
//! derived keys are aws-lc-rs HMAC keys (which wipe their own state on drop), comparisons are in
//! constant time through `aws_lc_rs::hmac::verify`, and nothing here is ever logged.

use aws_lc_rs::hmac;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// The root secret of one deployment. Every instance behind one load balancer must share it,
/// or a cursor or request state minted by one is refused by another.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct ServerSecret([u8; 32]);

impl std::fmt::Debug for ServerSecret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("ServerSecret(..)")
    }
}

impl ServerSecret {
    /// Wraps 32 bytes of key material. The array is moved in; a caller holding another copy
    /// (read from a file, say) should keep it in a `Zeroizing` buffer so that copy is wiped too.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// A fresh random secret from the OS CSPRNG (single-instance deployments and tests).
    pub fn random() -> Self {
        let mut secret = Self([0u8; 32]);
        // The OS CSPRNG failing is not recoverable; refuse to run with a weak key.
        fill_random(&mut secret.0).expect("the OS random number generator failed");
        secret
    }

    /// The deployment's audit checkpoint key: an Ed25519 key whose seed is
    /// HMAC(HMAC(secret, "palisade/audit-checkpoint/v1"), "ed25519 seed"). Every instance of the
    /// deployment derives the same key (they share the secret), so whichever holds the signer
    /// lease signs, and `palisade audit verify` checks with the same derivation.
    pub fn audit_checkpoint_key(&self) -> palisade_store::CheckpointKey {
        let seed = hmac::sign(&self.derive("palisade/audit-checkpoint/v1"), b"ed25519 seed");
        let mut bytes = Zeroizing::new([0u8; 32]);
        bytes.copy_from_slice(seed.as_ref());
        palisade_store::CheckpointKey::from_seed(*bytes)
    }

    /// The audit-digest key: the HMAC key of the keyed digests audit records carry instead of
    /// identities (principal `issuer#subject`, tenant, client), HMAC(secret, "palisade/audit-digest/v1").
    /// Whoever holds the server secret can compute a known identity's digest (`palisade audit
    /// search --subject`); the log alone names nobody.
    pub fn audit_digest_key(&self) -> hmac::Key {
        self.derive("palisade/audit-digest/v1")
    }

    /// An HMAC-SHA256 key for one purpose, derived as HMAC(secret, label).
    pub fn derive(&self, label: &str) -> hmac::Key {
        let root = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let derived = hmac::sign(&root, label.as_bytes());
        let bytes = Zeroizing::new(derived.as_ref().to_vec());
        hmac::Key::new(hmac::HMAC_SHA256, &bytes)
    }
}

/// Fills `bytes` from the OS CSPRNG.
pub fn fill_random(bytes: &mut [u8]) -> Result<(), aws_lc_rs::error::Unspecified> {
    SystemRandom::new().fill(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_prints_no_byte_of_the_secret() {
        let secret = ServerSecret::from_bytes([0xab; 32]);
        let printed = format!("{secret:?} {secret:#?}");
        assert_eq!(printed, "ServerSecret(..) ServerSecret(..)");
        assert!(!printed.to_ascii_lowercase().contains("ab"), "{printed}");
    }

    #[test]
    fn zeroize_wipes_the_bytes_and_derivation_is_stable() {
        let label = "cursor";
        let tag = |secret: &ServerSecret| hmac::sign(&secret.derive(label), b"x").as_ref().to_vec();
        let one = ServerSecret::from_bytes([7; 32]);
        assert_eq!(tag(&one), tag(&ServerSecret::from_bytes([7; 32])), "same secret, same key");
        assert_ne!(tag(&one), tag(&ServerSecret::from_bytes([8; 32])));
        assert_ne!(tag(&ServerSecret::random()), tag(&ServerSecret::random()));
        // What drop runs (ZeroizeOnDrop calls this): every byte is zero afterwards.
        let mut wiped = ServerSecret::from_bytes([7; 32]);
        wiped.zeroize();
        assert_eq!(wiped.0, [0; 32]);
    }
}
