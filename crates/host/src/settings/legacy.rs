//! `[legacy]`: the 2025-era session wire beside 2026-07-28.

use std::time::Duration;

use palisade_server::LegacyConfig;
use serde::Deserialize;

use super::error::{ConfigError, bad};
use super::keys;

/// `[legacy]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLegacy {
    /// Serve `initialize` and `Mcp-Session-Id` sessions (2025-11-25, 2025-06-18). Default on.
    pub enabled: Option<bool>,
    /// The revisions accepted, newest first. Default `["2025-11-25", "2025-06-18"]`.
    pub versions: Option<Vec<String>>,
    /// A session dies after this many seconds without a request. Default 1800.
    pub idle_timeout_secs: Option<u64>,
    /// A session dies this many seconds after `initialize`. Default 43200.
    pub absolute_timeout_secs: Option<u64>,
}

/// Validates `[legacy]`.
pub fn validate(raw: RawLegacy) -> Result<LegacyConfig, ConfigError> {
    let defaults = LegacyConfig::default();
    let versions = match raw.versions {
        None => defaults.versions.clone(),
        Some(versions) => {
            if versions.is_empty() {
                return Err(bad(
                    keys::LEGACY_VERSIONS,
                    "must name at least one revision (or set legacy.enabled = false)",
                ));
            }
            if let Some(unknown) = versions.iter().find(|v| !palisade_wire::LEGACY_VERSIONS.contains(&v.as_str())) {
                return Err(bad(
                    keys::LEGACY_VERSIONS,
                    format!("`{unknown}` is not a supported earlier revision; use 2025-11-25 or 2025-06-18"),
                ));
            }
            versions
        }
    };
    let idle = raw.idle_timeout_secs.unwrap_or(defaults.idle_timeout.as_secs());
    if !(10..=86_400).contains(&idle) {
        return Err(bad(keys::LEGACY_IDLE_TIMEOUT_SECS, "must be between 10 and 86400"));
    }
    let absolute = raw.absolute_timeout_secs.unwrap_or(defaults.absolute_timeout.as_secs());
    if !(idle..=7 * 86_400).contains(&absolute) {
        return Err(bad(keys::LEGACY_ABSOLUTE_TIMEOUT_SECS, "must be at least the idle timeout and at most 604800"));
    }
    Ok(LegacyConfig {
        enabled: raw.enabled.unwrap_or(defaults.enabled),
        versions,
        idle_timeout: Duration::from_secs(idle),
        absolute_timeout: Duration::from_secs(absolute),
        ..defaults
    })
}
