//! `[audit]`: the request path's segment, its durability, the checkpoint signer's interval and
//! the transport refusal records' interval.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::{ConfigError, bad};
use super::keys;

/// `[audit]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAudit {
    /// How often the HTTP transport's aggregated refusals are written to the audit log, in
    /// seconds. Default 10.
    pub transport_refusal_interval_secs: Option<u64>,
    /// The instance's local audit segment directory. Default `<data_dir>/audit-segment`.
    pub segment_dir: Option<PathBuf>,
    /// `process` (default) or `power`.
    pub durability: Option<String>,
    /// How often a checkpoint is signed (when anything changed), in seconds. Default 1.
    pub checkpoint_interval_secs: Option<u64>,
}

/// Validated `[audit]`.
#[derive(Debug, Clone)]
pub struct AuditSettings {
    /// Interval of the aggregated transport refusal records.
    pub transport_refusal_interval_secs: u64,
    /// The local audit segment directory.
    pub segment_dir: PathBuf,
    /// Whether an audit append waits for `fdatasync`.
    pub durability: palisade_store::segment::Durability,
    /// Interval of the checkpoint signer.
    pub checkpoint_interval_secs: u64,
}

/// `value` (default `default`) when it is between 1 and `max`; the error names `key`.
pub(crate) fn seconds(value: Option<u64>, default: u64, key: &str, max: u64) -> Result<u64, ConfigError> {
    let value = value.unwrap_or(default);
    if (1..=max).contains(&value) { Ok(value) } else { Err(bad(key, format!("must be between 1 and {max}"))) }
}

/// Validates `[audit]`; the segment lives in `data_dir` unless configured.
pub fn validate(raw: RawAudit, data_dir: &Path) -> Result<AuditSettings, ConfigError> {
    let transport_refusal_interval_secs =
        seconds(raw.transport_refusal_interval_secs, 10, keys::AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS, 3600)?;
    let checkpoint_interval_secs =
        seconds(raw.checkpoint_interval_secs, 1, keys::AUDIT_CHECKPOINT_INTERVAL_SECS, 3600)?;
    let durability = match raw.durability.as_deref().unwrap_or("process") {
        "process" => palisade_store::segment::Durability::Process,
        "power" => palisade_store::segment::Durability::Power,
        other => {
            return Err(bad(
                keys::AUDIT_DURABILITY,
                format!("unknown durability `{other}`; expected process or power"),
            ));
        }
    };
    let segment_dir = raw.segment_dir.unwrap_or_else(|| data_dir.join("audit-segment"));
    Ok(AuditSettings { transport_refusal_interval_secs, segment_dir, durability, checkpoint_interval_secs })
}
