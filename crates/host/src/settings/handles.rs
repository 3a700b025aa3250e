//! `[handles]`: the subject key file, the retention of dead rows and per-type policies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_server::HandlePolicy;
use serde::Deserialize;

use super::error::{ConfigError, bad};
use super::keys;

/// `[handles]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHandles {
    /// File holding the 32-byte subject key (64 hex characters). Default
    /// `<data_dir>/handle-subject-key`, generated on first run. `PALISADE_HANDLES_SUBJECT_KEY`
    /// (64 hex characters) overrides the file.
    pub subject_key_file: Option<PathBuf>,
    /// How long expired or revoked handle rows are kept before the retention job deletes them.
    pub retention_secs: Option<u64>,
    /// Per object type policy, overriding the application's defaults.
    #[serde(default)]
    pub policies: BTreeMap<String, RawHandlePolicy>,
}

/// `[handles.policies.<object type>]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHandlePolicy {
    /// Handle lifetime.
    pub ttl_secs: u64,
    /// Scopes a handle of this type may grant.
    pub allowed_scopes: Vec<String>,
    /// Most scopes per handle.
    pub max_scopes: usize,
    /// Raising it invalidates older handles.
    pub policy_version: i64,
}

/// Validated `[handles]`.
#[derive(Debug, Clone)]
pub struct HandleSettings {
    /// The handle subject key file.
    pub subject_key_file: PathBuf,
    /// Retention of dead handle rows.
    pub retention: Duration,
    /// Handle policies by object type.
    pub policies: BTreeMap<String, HandlePolicy>,
}

/// `handles.retention_secs`, checked (also on its own, before the kill switch's section, as
/// validation always has).
pub fn retention(raw: &RawHandles) -> Result<Duration, ConfigError> {
    let retention_secs = raw.retention_secs.unwrap_or(86_400);
    if !(60..=365 * 86_400).contains(&retention_secs) {
        return Err(bad(keys::HANDLES_RETENTION_SECS, "must be between 60 and 31536000"));
    }
    Ok(Duration::from_secs(retention_secs))
}

/// Validates `[handles]`; the key file lives in `data_dir` unless configured.
pub fn validate(raw: RawHandles, data_dir: &Path) -> Result<HandleSettings, ConfigError> {
    let retention = retention(&raw)?;
    let subject_key_file = raw.subject_key_file.unwrap_or_else(|| data_dir.join("handle-subject-key"));
    let mut policies = BTreeMap::new();
    for (object_type, policy) in raw.policies {
        let key = format!("handles.policies.{object_type}");
        let policy = HandlePolicy {
            ttl: Duration::from_secs(policy.ttl_secs),
            allowed_scopes: policy.allowed_scopes,
            max_scopes: policy.max_scopes,
            version: policy.policy_version,
        };
        policy.validate().map_err(|why| bad(&key, why))?;
        policies.insert(object_type, policy);
    }
    Ok(HandleSettings { subject_key_file, retention, policies })
}
