//! Ed25519 key files and secret key files.
//!
//! **Format.** Every key file holds one line: the canonical standard base64 (padded) of exactly
//! 32 bytes, optionally followed by a single `\n`.
//! - a public key file (`*.pub`) holds the Ed25519 public key;
//! - a signing key file (`*.key`, mode 0600) holds the Ed25519 secret seed (RFC 8032 §5.1.5);
//! - a target key file holds the 32-byte HMAC-SHA256 key for target digests.
//!
//! Public keys are checked with `is_weak()` (small-order keys refused) and signatures verified with
//! `verify_strict`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use zeroize::Zeroizing;

use crate::b64;

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The file could not be read or written.
    #[error("key file {path} could not be {action}")]
    Io {
        /// The file.
        path: PathBuf,
        /// `"read"` or `"written"`.
        action: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The contents are not one canonical base64 line of 32 bytes.
    #[error("key file is not one canonical base64 line of 32 bytes")]
    Format,
    /// The public key is a small-order point: any signature could verify under it.
    #[error("public key is weak (small order)")]
    Weak,
    /// The operating system's random generator failed.
    #[error("random generator failed")]
    Random,
}

/// An Ed25519 signing key. No `Debug` output of the secret; wiped on drop.
pub struct Ed25519SigningKey(SigningKey);

impl std::fmt::Debug for Ed25519SigningKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Ed25519SigningKey").field("public", &self.public_key_base64()).finish_non_exhaustive()
    }
}

impl Ed25519SigningKey {
    /// A fresh key from the operating system's random generator.
    pub fn generate() -> Result<Self, KeyError> {
        let mut seed = Zeroizing::new([0_u8; 32]);
        SystemRandom::new().fill(seed.as_mut()).map_err(|_| KeyError::Random)?;
        Ok(Self(SigningKey::from_bytes(&seed)))
    }

    /// A key from its 32-byte seed (test vectors; production keys come from [`Self::generate`]).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        Self(SigningKey::from_bytes(seed))
    }

    /// Reads a signing key file (see the module docs for the format).
    pub fn read(path: &Path) -> Result<Self, KeyError> {
        let bytes = Zeroizing::new(read_file(path)?);
        let seed = Zeroizing::new(decode_key_line(&bytes)?);
        Ok(Self(SigningKey::from_bytes(&seed)))
    }

    /// The matching public key.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.0.verifying_key()
    }

    /// The public key as it appears in a public key file (without the newline).
    pub fn public_key_base64(&self) -> String {
        b64::encode(self.0.verifying_key().as_bytes())
    }

    /// Signs `message` (pure Ed25519).
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.0.sign(message).to_bytes()
    }

    /// Writes the signing key (mode 0600, refusing to overwrite) and the public key file.
    pub fn write_files(&self, signing_key_path: &Path, public_key_path: &Path) -> Result<(), KeyError> {
        let seed = Zeroizing::new(format!("{}\n", b64::encode(self.0.as_bytes())));
        write_new_file(signing_key_path, seed.as_bytes(), true)?;
        write_new_file(public_key_path, format!("{}\n", self.public_key_base64()).as_bytes(), false)
    }
}

/// Generates an Ed25519 key pair into `<directory>/<name>.key` (secret, 0600) and
/// `<directory>/<name>.pub`; existing files are never overwritten. Returns both paths.
pub fn generate_keypair_files(directory: &Path, name: &str) -> Result<(PathBuf, PathBuf), KeyError> {
    let key = Ed25519SigningKey::generate()?;
    let signing_key_path = directory.join(format!("{name}.key"));
    let public_key_path = directory.join(format!("{name}.pub"));
    key.write_files(&signing_key_path, &public_key_path)?;
    Ok((signing_key_path, public_key_path))
}

/// Reads a public key file.
pub fn read_public_key(path: &Path) -> Result<VerifyingKey, KeyError> {
    parse_public_key(&read_file(path)?)
}

/// Parses the contents of a public key file.
pub fn parse_public_key(bytes: &[u8]) -> Result<VerifyingKey, KeyError> {
    let raw = decode_key_line(bytes)?;
    let key = VerifyingKey::from_bytes(&raw).map_err(|_| KeyError::Format)?;
    if key.is_weak() {
        return Err(KeyError::Weak);
    }
    Ok(key)
}

/// The domain of a detached signature over an operator policy file (`FILE.sig`): what the
/// root key signs is this prefix followed by the file's bytes, so a signature made for anything
/// else (a kill-switch policy envelope) never verifies as one.
pub const POLICY_FILE_SIGNATURE_DOMAIN: &[u8] = b"palisade.operator-policy-file.v1\0";

/// The detached signature of an operator policy file's `bytes` under `key`: one line, the
/// canonical standard base64 of the 64-byte Ed25519 signature.
pub fn sign_policy_file(key: &Ed25519SigningKey, bytes: &[u8]) -> String {
    let mut message = POLICY_FILE_SIGNATURE_DOMAIN.to_vec();
    message.extend_from_slice(bytes);
    format!("{}\n", b64::encode(&key.sign(&message)))
}

/// Whether `signature` (a `FILE.sig`'s contents) is `key`'s signature of the policy file's
/// `bytes` (strict verification).
pub fn verify_policy_file(key: &VerifyingKey, bytes: &[u8], signature: &[u8]) -> bool {
    let line = signature.strip_suffix(b"\n").unwrap_or(signature);
    let Ok(text) = std::str::from_utf8(line) else { return false };
    let Ok(raw) = b64::decode_canonical(text) else { return false };
    let Ok(raw) = <[u8; 64]>::try_from(raw.as_slice()) else { return false };
    let mut message = POLICY_FILE_SIGNATURE_DOMAIN.to_vec();
    message.extend_from_slice(bytes);
    key.verify_strict(&message, &ed25519_dalek::Signature::from_bytes(&raw)).is_ok()
}

/// Writes 32 fresh random bytes as a secret key file (0600, never overwriting): the target key.
pub fn generate_secret_key_file(path: &Path) -> Result<(), KeyError> {
    let mut secret = Zeroizing::new([0_u8; 32]);
    SystemRandom::new().fill(secret.as_mut()).map_err(|_| KeyError::Random)?;
    let line = Zeroizing::new(format!("{}\n", b64::encode(secret.as_ref())));
    write_new_file(path, line.as_bytes(), true)
}

/// Reads a 32-byte secret key file.
pub(crate) fn read_secret_key_file(path: &Path) -> Result<Zeroizing<[u8; 32]>, KeyError> {
    let bytes = Zeroizing::new(read_file(path)?);
    decode_key_line(&bytes)
}

fn decode_key_line(bytes: &[u8]) -> Result<Zeroizing<[u8; 32]>, KeyError> {
    let line = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let text = std::str::from_utf8(line).map_err(|_| KeyError::Format)?;
    let decoded = Zeroizing::new(b64::decode_canonical(text).map_err(|_| KeyError::Format)?);
    let mut out = Zeroizing::new([0_u8; 32]);
    if decoded.len() != out.len() {
        return Err(KeyError::Format);
    }
    out.copy_from_slice(&decoded);
    Ok(out)
}

pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|source| KeyError::Io { path: path.to_path_buf(), action: "read", source })
}

pub(crate) fn write_new_file(path: &Path, contents: &[u8], secret: bool) -> Result<(), KeyError> {
    let io_error = |source| KeyError::Io { path: path.to_path_buf(), action: "written", source };
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(io_error)?;
    file.write_all(contents).map_err(io_error)?;
    file.sync_all().map_err(io_error)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_policy_file_signature_verifies_only_for_its_bytes_and_key() {
        let key = Ed25519SigningKey::from_seed(&[7; 32]);
        let other = Ed25519SigningKey::from_seed(&[8; 32]);
        let signature = sign_policy_file(&key, b"permit(principal, action, resource);");
        assert!(verify_policy_file(
            &key.verifying_key(),
            b"permit(principal, action, resource);",
            signature.as_bytes()
        ));
        assert!(!verify_policy_file(
            &key.verifying_key(),
            b"permit(principal, action, resource );",
            signature.as_bytes()
        ));
        assert!(!verify_policy_file(
            &other.verifying_key(),
            b"permit(principal, action, resource);",
            signature.as_bytes()
        ));
        assert!(!verify_policy_file(&key.verifying_key(), b"x", b"not base64"));
        // A signature of the bare bytes (no domain) is not a policy file's signature.
        let bare = format!("{}\n", b64::encode(&key.sign(b"x")));
        assert!(!verify_policy_file(&key.verifying_key(), b"x", bare.as_bytes()));
    }

    use super::*;

    #[test]
    fn key_files_round_trip_and_refuse_bad_contents() {
        let directory = tempfile::tempdir().expect("tempdir");
        let (secret, public) = generate_keypair_files(directory.path(), "root").expect("generate");
        let signing = Ed25519SigningKey::read(&secret).expect("read secret");
        let verifying = read_public_key(&public).expect("read public");
        assert_eq!(signing.verifying_key(), verifying);
        assert!(generate_keypair_files(directory.path(), "root").is_err(), "never overwrites");
        assert!(!format!("{signing:?}").contains(&b64::encode(signing.0.as_bytes())));
        assert!(matches!(parse_public_key(b"AAAA\n"), Err(KeyError::Format)));
        // The identity point is of small order.
        let mut identity = [0_u8; 32];
        identity[0] = 1;
        assert!(matches!(parse_public_key(b64::encode(&identity).as_bytes()), Err(KeyError::Weak)));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&secret).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
