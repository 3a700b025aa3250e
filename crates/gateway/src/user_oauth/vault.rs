//! Sealing of what Palisade keeps for a user at rest: upstream tokens and its own client
//! registrations. AES-256-GCM under a key derived from the server secret; the associated data
//! binds each ciphertext to its purpose, the person and the upstream (or authorization server),
//! so a row copied to another person or upstream does not open. A fresh random 96-bit nonce per
//! seal (the key seals at most a few values per user and upstream between rotations, far below
//! the 2^32 random-nonce bound).

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::hmac;
use palisade_server::secret::{ServerSecret, fill_random};
use zeroize::Zeroizing;

/// Version prefix of every sealed value (one byte), so a later key or layout can coexist.
const VERSION: u8 = 1;

/// The vault key.
pub(crate) struct Vault {
    key: LessSafeKey,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Vault(..)")
    }
}

/// Why a sealed value did not open (never more detail: it is either ours for this binding or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a sealed value does not open under this binding")]
pub(crate) struct Unsealable;

impl Vault {
    /// The vault of a deployment: AES-256-GCM with the key HMAC(HMAC(secret,
    /// "palisade/user-oauth-vault/v1"), "aes-256-gcm").
    pub(crate) fn new(secret: &ServerSecret) -> Self {
        let derived = hmac::sign(&secret.derive("palisade/user-oauth-vault/v1"), b"aes-256-gcm");
        let bytes = Zeroizing::new(derived.as_ref().to_vec());
        // A 32-byte key is always a valid AES-256 key.
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &bytes).unwrap_or_else(|_| unreachable!()));
        Self { key }
    }

    /// `version ‖ nonce ‖ ciphertext ‖ tag` of `plaintext`, bound to `binding` (associated data).
    pub(crate) fn seal(&self, binding: &[&[u8]], plaintext: &[u8]) -> Result<Vec<u8>, Unsealable> {
        let mut nonce = [0u8; NONCE_LEN];
        fill_random(&mut nonce).map_err(|_| Unsealable)?;
        let mut sealed = Zeroizing::new(plaintext.to_vec());
        let aad = associated_data(binding);
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&aad[..]), &mut *sealed)
            .map_err(|_| Unsealable)?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The plaintext of `sealed`, if it was sealed by this key under exactly `binding`.
    pub(crate) fn open(&self, binding: &[&[u8]], sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, Unsealable> {
        let (&version, rest) = sealed.split_first().ok_or(Unsealable)?;
        if version != VERSION || rest.len() < NONCE_LEN {
            return Err(Unsealable);
        }
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Unsealable)?;
        let mut buffer = Zeroizing::new(ciphertext.to_vec());
        let aad = associated_data(binding);
        let plain = self.key.open_in_place(nonce, Aad::from(&aad[..]), &mut buffer).map_err(|_| Unsealable)?;
        Ok(Zeroizing::new(plain.to_vec()))
    }
}

/// Each part length-prefixed (u32 big-endian), so no two different bindings share bytes.
fn associated_data(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for part in parts {
        out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_opens_only_under_its_own_binding_and_key() {
        let vault = Vault::new(&ServerSecret::from_bytes([7; 32]));
        let sealed = vault.seal(&[b"token", b"alice", b"files"], b"secret-token").unwrap();
        assert!(!sealed.windows(12).any(|w| w == b"secret-token"), "no clear text in the sealed value");
        assert_eq!(&**vault.open(&[b"token", b"alice", b"files"], &sealed).unwrap(), b"secret-token");
        for other in [
            &[&b"token"[..], b"mallory", b"files"][..],
            &[b"token", b"alice", b"mail"],
            &[b"registration", b"alice", b"files"],
            &[b"token", b"alicefiles"],
            &[b"token", b"ali", b"cefiles"],
        ] {
            assert_eq!(vault.open(other, &sealed), Err(Unsealable));
        }
        let other_key = Vault::new(&ServerSecret::from_bytes([8; 32]));
        assert_eq!(other_key.open(&[b"token", b"alice", b"files"], &sealed), Err(Unsealable));
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(vault.open(&[b"token", b"alice", b"files"], &flipped), Err(Unsealable));
        assert_eq!(vault.open(&[b"token"], &[]), Err(Unsealable));
        assert_eq!(vault.open(&[b"token"], &[2; 40]), Err(Unsealable));
    }

    #[test]
    fn two_seals_of_one_value_differ() {
        let vault = Vault::new(&ServerSecret::from_bytes([7; 32]));
        assert_ne!(vault.seal(&[b"a"], b"x").unwrap(), vault.seal(&[b"a"], b"x").unwrap());
    }
}
