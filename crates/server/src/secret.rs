//! The server's 32-byte secret and the keys derived from it (request-state sealing, cursors).
//! Secrets have no `Debug`, are compared in constant time by `aws_lc_rs::hmac::verify`, and are
//! never logged.

use aws_lc_rs::hmac;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};

/// The root secret of one deployment. Every instance behind one load balancer must share it,
/// or a cursor or request state minted by one is refused by another.
pub struct ServerSecret([u8; 32]);

impl ServerSecret {
    /// Wraps 32 bytes of key material.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// A fresh random secret from the OS CSPRNG (single-instance deployments and tests).
    pub fn random() -> Self {
        let mut bytes = [0u8; 32];
        // The OS CSPRNG failing is not recoverable; refuse to run with a weak key.
        fill_random(&mut bytes).expect("the OS random number generator failed");
        Self(bytes)
    }

    /// An HMAC-SHA256 key for one purpose, derived as HMAC(secret, label).
    pub fn derive(&self, label: &str) -> hmac::Key {
        let root = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let derived = hmac::sign(&root, label.as_bytes());
        hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref())
    }
}

impl Drop for ServerSecret {
    fn drop(&mut self) {
        self.0 = [0u8; 32];
    }
}

/// Fills `bytes` from the OS CSPRNG.
pub fn fill_random(bytes: &mut [u8]) -> Result<(), aws_lc_rs::error::Unspecified> {
    SystemRandom::new().fill(bytes)
}
