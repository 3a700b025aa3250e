//! `[delegation]`: delegation capabilities and their tools, with their bounds.

use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, bad};
use super::keys;

/// `[delegation]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDelegation {
    /// Accept delegation capabilities and offer the delegation tools. Default false.
    pub enabled: Option<bool>,
    /// Deepest chain (a root is depth 0). Default 3.
    pub max_depth: Option<u64>,
    /// Largest call budget of a root capability. Default 1000.
    pub max_calls: Option<u64>,
    /// Longest lifetime of a capability, in seconds. Default 3600.
    pub max_lifetime_secs: Option<u64>,
}

/// Validates `[delegation]`: `Some` when enabled (the bounds are checked either way).
pub fn validate(raw: RawDelegation) -> Result<Option<palisade_server::delegation::DelegationConfig>, ConfigError> {
    let defaults = palisade_server::delegation::DelegationConfig::default();
    let depth = raw.max_depth.unwrap_or(u64::from(defaults.max_depth));
    if !(1..=u64::from(palisade_store::MAX_DELEGATION_DEPTH)).contains(&depth) {
        return Err(bad(keys::DELEGATION_MAX_DEPTH, "must be between 1 and 16"));
    }
    let calls = raw.max_calls.unwrap_or(defaults.max_calls.cast_unsigned());
    if !(1..=1_000_000).contains(&calls) {
        return Err(bad(keys::DELEGATION_MAX_CALLS, "must be between 1 and 1000000"));
    }
    let lifetime = raw.max_lifetime_secs.unwrap_or(defaults.max_lifetime.as_secs());
    if !(60..=30 * 86_400).contains(&lifetime) {
        return Err(bad(keys::DELEGATION_MAX_LIFETIME_SECS, "must be between 60 and 2592000"));
    }
    if !raw.enabled.unwrap_or(false) {
        return Ok(None);
    }
    Ok(Some(palisade_server::delegation::DelegationConfig {
        max_depth: u32::try_from(depth).unwrap_or(3),
        max_calls: i64::try_from(calls).unwrap_or(1000),
        max_lifetime: Duration::from_secs(lifetime),
        ..defaults
    }))
}
