//! The configuration error: every section's validator reports a bad value with the dotted key
//! that holds it (`upstreams[1].credential.token_url`).

/// A configuration error, naming the offending key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config: {key}: {reason}")]
pub struct GatewayConfigError {
    /// The dotted key.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

pub(crate) fn bad(key: impl Into<String>, reason: impl Into<String>) -> GatewayConfigError {
    GatewayConfigError { key: key.into(), reason: reason.into() }
}
