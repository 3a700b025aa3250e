//! A development token issuer for the demo and tests: one ES256 key kept on disk, tokens minted
//! in the RFC 9068 access-token shape, trusted by the demo with `JwksSource::Static`. The
//! endpoints that make it an authorization server are in [`crate::authorization_server`].
//!
//! Files in the data directory:
//! - `dev-issuer-key.p8`: the PKCS#8 private key, created with mode 0600 and refused on load if
//!   group/others can access it or it is not a regular file;
//! - `dev-issuer-jwks.json`: the public JWK Set, rewritten when it does not match the key.
//!
//! The `kid` is the RFC 7638 thumbprint of the public key, so it is stable across restarts.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aws_lc_rs::digest::{SHA256, digest};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use palisade_base::clock::{Clock, SystemClock};
use serde_json::json;

use crate::config::{IssuerConfig, JwksSource, UrlProblem, check_url};

/// File name of the private key inside the data directory.
pub const KEY_FILE_NAME: &str = "dev-issuer-key.p8";
/// File name of the public JWK Set inside the data directory.
pub const JWKS_FILE_NAME: &str = "dev-issuer-jwks.json";

/// Why the development issuer could not load, create or sign.
#[derive(Debug, thiserror::Error)]
pub enum DevIssuerError {
    /// A file or directory operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The key file grants access to group or others.
    #[error("{}: mode {mode:o} is too open; the key file must be 0600", path.display())]
    InsecureKeyFile {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The key path is not a regular file (a symlink, a directory, ...).
    #[error("{}: not a regular file", path.display())]
    NotARegularFile {
        /// The key path.
        path: PathBuf,
    },
    /// The key file does not hold a P-256 PKCS#8 private key.
    #[error("{}: not a P-256 PKCS#8 private key", path.display())]
    InvalidKey {
        /// The key file.
        path: PathBuf,
    },
    /// The issuer identifier is not an acceptable issuer URL.
    #[error("issuer: {0}")]
    InvalidIssuer(UrlProblem),
    /// Key generation, randomness or JWK construction failed.
    #[error("cryptographic operation failed")]
    Crypto,
    /// Signing a token failed.
    #[error("signing failed: {0}")]
    Signing(String),
}

/// The development issuer. Holds a private key, so it deliberately has no `Debug`.
pub struct DevIssuer {
    issuer: String,
    kid: String,
    encoding_key: EncodingKey,
    public_jwk: Jwk,
    clock: Arc<dyn Clock>,
    rng: SystemRandom,
}

impl DevIssuer {
    /// Loads the key from `data_dir`, or creates it (and the directory) on first run.
    pub fn load_or_create(data_dir: &Path, issuer: &str) -> Result<Self, DevIssuerError> {
        crate::install_crypto_provider();
        check_url(issuer, true).map_err(DevIssuerError::InvalidIssuer)?;
        create_private_dir(data_dir)?;
        let key_path = data_dir.join(KEY_FILE_NAME);
        // The private key's bytes are wiped once the key objects are made (`EncodingKey` and
        // aws-lc-rs's key pair wipe their own copies).
        let pkcs8 = zeroize::Zeroizing::new(match read_key_file(&key_path)? {
            Some(bytes) => bytes,
            None => create_key_file(&key_path)?,
        });
        let issuer = Self::from_pkcs8(&key_path, &pkcs8, issuer)?;
        issuer.write_jwks_file(&data_dir.join(JWKS_FILE_NAME))?;
        Ok(issuer)
    }

    /// Loads the key a server already created in `data_dir`; `None` when there is no key file.
    /// Never creates a key, a directory or a file: a token signed by a key no server holds is
    /// refused by every server (what a minting tool must not hand out).
    pub fn load_existing(data_dir: &Path, issuer: &str) -> Result<Option<Self>, DevIssuerError> {
        crate::install_crypto_provider();
        check_url(issuer, true).map_err(DevIssuerError::InvalidIssuer)?;
        let key_path = data_dir.join(KEY_FILE_NAME);
        let Some(bytes) = read_key_file(&key_path)? else {
            return Ok(None);
        };
        let pkcs8 = zeroize::Zeroizing::new(bytes);
        Self::from_pkcs8(&key_path, &pkcs8, issuer).map(Some)
    }

    /// The issuer of a PKCS#8 P-256 key read from (or just written to) `key_path`.
    fn from_pkcs8(key_path: &Path, pkcs8: &[u8], issuer: &str) -> Result<Self, DevIssuerError> {
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8)
            .map_err(|_| DevIssuerError::InvalidKey { path: key_path.to_owned() })?;
        let public = pair.public_key().as_ref();
        if public.len() != 65 || public[0] != 0x04 {
            return Err(DevIssuerError::InvalidKey { path: key_path.to_owned() });
        }
        let x = URL_SAFE_NO_PAD.encode(&public[1..33]);
        let y = URL_SAFE_NO_PAD.encode(&public[33..65]);
        // RFC 7638: required members only, lexicographic order, no whitespace.
        let thumbprint_input = format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#);
        let kid = URL_SAFE_NO_PAD.encode(digest(&SHA256, thumbprint_input.as_bytes()));
        let public_jwk: Jwk = serde_json::from_value(json!({
            "kty": "EC", "crv": "P-256", "x": x, "y": y, "kid": kid, "use": "sig", "alg": "ES256",
        }))
        .map_err(|_| DevIssuerError::Crypto)?;
        Ok(Self {
            issuer: issuer.to_owned(),
            kid,
            encoding_key: EncodingKey::from_ec_der(pkcs8),
            public_jwk,
            clock: Arc::new(SystemClock),
            rng: SystemRandom::new(),
        })
    }

    /// Uses `clock` for `iat`/`nbf`/`exp` of minted tokens.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The issuer identifier put in `iss`.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The key id (RFC 7638 thumbprint) put in the JOSE header.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key set, for [`JwksSource::Static`].
    pub fn jwks(&self) -> JwkSet {
        JwkSet { keys: vec![self.public_jwk.clone()] }
    }

    /// An [`IssuerConfig`] trusting exactly this issuer (static keys, ES256 only).
    pub fn issuer_config(&self) -> IssuerConfig {
        IssuerConfig {
            issuer: self.issuer.clone(),
            jwks: JwksSource::Static(self.jwks()),
            algorithms: vec![Algorithm::ES256],
        }
    }

    /// Mints an access token: header `{alg: ES256, typ: at+jwt, kid}`; claims `iss`, `sub`,
    /// `aud`, `exp = now + ttl_secs`, `iat = nbf = now`, a random `jti`, `scope` (space-joined),
    /// `tenant` and `client_id`.
    pub fn mint(
        &self,
        subject: &str,
        tenant: &str,
        client_id: &str,
        scopes: &[&str],
        audience: &str,
        ttl_secs: u64,
    ) -> Result<String, DevIssuerError> {
        self.mint_with_groups(subject, tenant, client_id, scopes, &[], audience, ttl_secs)
    }

    /// [`DevIssuer::mint`] with a `groups` claim (an array) when `groups` is not empty: the
    /// groups a server configured with `policies.group_claims = ["groups"]` gives its policies.
    #[allow(clippy::too_many_arguments)]
    pub fn mint_with_groups(
        &self,
        subject: &str,
        tenant: &str,
        client_id: &str,
        scopes: &[&str],
        groups: &[&str],
        audience: &str,
        ttl_secs: u64,
    ) -> Result<String, DevIssuerError> {
        let now = self.clock.now_secs();
        let mut jti = [0u8; 16];
        self.rng.fill(&mut jti).map_err(|_| DevIssuerError::Crypto)?;
        let mut claims = json!({
            "iss": self.issuer,
            "sub": subject,
            "aud": audience,
            "exp": now.saturating_add(ttl_secs),
            "iat": now,
            "nbf": now,
            "jti": URL_SAFE_NO_PAD.encode(jti),
            "scope": scopes.join(" "),
            "tenant": tenant,
            "client_id": client_id,
        });
        if !groups.is_empty() {
            claims["groups"] = json!(groups);
        }
        let mut header = Header::new(Algorithm::ES256);
        header.typ = Some("at+jwt".to_owned());
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &claims, &self.encoding_key).map_err(|e| DevIssuerError::Signing(e.to_string()))
    }

    fn write_jwks_file(&self, path: &Path) -> Result<(), DevIssuerError> {
        let mut text =
            serde_json::to_string_pretty(&json!({ "keys": [self.public_jwk] })).map_err(|_| DevIssuerError::Crypto)?;
        text.push('\n');
        match fs::read_to_string(path) {
            Ok(existing) if existing == text => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(DevIssuerError::Io { path: path.to_owned(), source }),
        }
        fs::write(path, text).map_err(|source| DevIssuerError::Io { path: path.to_owned(), source })
    }
}

fn create_private_dir(dir: &Path) -> Result<(), DevIssuerError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|source| DevIssuerError::Io { path: dir.to_owned(), source })
}

/// The key bytes, `None` if the file does not exist; refuses symlinks and open permissions.
fn read_key_file(path: &Path) -> Result<Option<Vec<u8>>, DevIssuerError> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(DevIssuerError::Io { path: path.to_owned(), source }),
    };
    if !metadata.file_type().is_file() {
        return Err(DevIssuerError::NotARegularFile { path: path.to_owned() });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(DevIssuerError::InsecureKeyFile { path: path.to_owned(), mode });
        }
    }
    fs::read(path).map(Some).map_err(|source| DevIssuerError::Io { path: path.to_owned(), source })
}

/// Generates a P-256 key and writes it with mode 0600, never overwriting an existing file (if
/// another process won the race, its key is used).
fn create_key_file(path: &Path) -> Result<Vec<u8>, DevIssuerError> {
    let document = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
        .map_err(|_| DevIssuerError::Crypto)?;
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = match options.open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return read_key_file(path)?.ok_or(DevIssuerError::InvalidKey { path: path.to_owned() });
        }
        Err(source) => return Err(DevIssuerError::Io { path: path.to_owned(), source }),
    };
    let io_error = |source| DevIssuerError::Io { path: path.to_owned(), source };
    file.write_all(document.as_ref()).map_err(io_error)?;
    file.sync_all().map_err(io_error)?;
    tracing::info!(path = %path.display(), "created development issuer key");
    Ok(document.as_ref().to_vec())
}
