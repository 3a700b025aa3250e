//! Secrets as the configuration names them ([`SecretSource`]: a file or an environment
//! variable) and as they are held once read ([`Secret`]: zeroed when dropped, never shown), and
//! the error of getting a credential ([`CredentialError`]), which names where a secret comes
//! from and never its value.

use std::io::Read;
use std::path::PathBuf;

use zeroize::Zeroizing;

/// The largest secret read from a file or the environment.
pub const MAX_SECRET_BYTES: usize = 16 * 1024;

/// Why no credential could be had (fail closed: the call is refused), or why a credential
/// configuration cannot be used. No variant carries a secret or a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// The authorization server could not be reached or refused (fixed text, no secret).
    #[error("upstream credential unavailable: {0}")]
    Unavailable(&'static str),
    /// A secret could not be read; `origin` names its source (a file path or an environment
    /// variable), never its value.
    #[error("upstream credential secret from {origin}: {reason}")]
    Secret {
        /// `file <path>` or `environment variable <NAME>`.
        origin: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The credential configuration cannot be used (fixed text).
    #[error("upstream credential configuration: {0}")]
    Config(&'static str),
    /// Token exchange needs the caller's verified token and the request has none.
    #[error("upstream credential unavailable: token exchange needs the caller's token")]
    NoCallerToken,
    /// A per-user upstream: the person has no usable connection (never made, expired, refused
    /// by the upstream, or narrower than `scopes` — the wider set a step-up asks for).
    #[error("this upstream needs the user's own authorization (connect it first)")]
    UserAuthorizationRequired {
        /// Scopes a step-up asks for, beyond the configured ones.
        scopes: Option<Vec<String>>,
    },
}

/// Where a secret comes from. It is read when the credential is built: a file's content is
/// trimmed of surrounding whitespace; an environment variable must be set and non-empty; either
/// is at most [`MAX_SECRET_BYTES`] of UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// The content of this file.
    File(PathBuf),
    /// The value of this environment variable.
    Env(String),
}

impl SecretSource {
    /// Where the secret comes from, as errors name it (never its value).
    pub(crate) fn origin(&self) -> String {
        match self {
            Self::File(path) => format!("file {}", path.display()),
            Self::Env(name) => format!("environment variable {name}"),
        }
    }

    /// Reads the secret now (see the type's rules); the error names the source, never a value.
    pub(crate) fn read(&self) -> Result<Secret, CredentialError> {
        let error = |reason| CredentialError::Secret { origin: self.origin(), reason };
        let value: Zeroizing<String> = match self {
            Self::File(path) => {
                let file = std::fs::File::open(path).map_err(|_| error("cannot be opened"))?;
                let mut bytes = Zeroizing::new(Vec::new());
                let limit = u64::try_from(MAX_SECRET_BYTES).unwrap_or(u64::MAX).saturating_add(1);
                file.take(limit).read_to_end(&mut bytes).map_err(|_| error("cannot be read"))?;
                if bytes.len() > MAX_SECRET_BYTES {
                    return Err(error("is larger than 16 KiB"));
                }
                let text = std::str::from_utf8(&bytes).map_err(|_| error("is not UTF-8"))?;
                Zeroizing::new(text.trim().to_owned())
            }
            Self::Env(name) => {
                let value = std::env::var_os(name).ok_or_else(|| error("is not set"))?;
                let value = Zeroizing::new(value.into_string().map_err(|_| error("is not UTF-8"))?);
                if value.len() > MAX_SECRET_BYTES {
                    return Err(error("is larger than 16 KiB"));
                }
                value
            }
        };
        if value.is_empty() {
            return Err(error("is empty"));
        }
        Ok(Secret(value))
    }
}

/// A secret in memory: zeroed when dropped, and `Debug` shows nothing of it.
pub(crate) struct Secret(pub(crate) Zeroizing<String>);

impl Secret {
    /// The secret's text: for the one place that sends or compares it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// A secret of `value` (tests).
    #[cfg(test)]
    pub(crate) fn of(value: &str) -> Self {
        Self(Zeroizing::new(value.to_owned()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}
