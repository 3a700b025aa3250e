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

impl ConfigError {
    /// Says where the offending value came from when the environment or a flag set its key
    /// (`overrides` as [`super::options::overrides`] lists them; the last one applied wins).
    pub(crate) fn with_source(mut self, overrides: &[(&str, String)]) -> Self {
        if let Some((_, source)) = overrides.iter().rev().find(|(key, _)| *key == self.key) {
            self.reason = format!("{} (the value of {source})", self.reason);
        }
        self
    }
}
