//! The configuration error: the offending key, by its full path, and what is wrong with it.

/// A configuration error, naming the offending key.
#[derive(Debug, thiserror::Error)]
#[error("config: {key}: {reason}")]
pub struct ConfigError {
    /// The key, dotted (`auth.leeway_secs`) or as an environment variable.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

pub(crate) fn bad(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError { key: key.to_owned(), reason: reason.into() }
}
