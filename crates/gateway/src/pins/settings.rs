//! `[pins]`: as written ([`RawPins`], [`RawReviewer`]) and validated ([`PinSettings`]).

use std::time::Duration;

use serde::Deserialize;

use super::ReviewerKeys;
use crate::config_error::{GatewayConfigError, bad};

/// `[pins]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPins {
    /// Every upstream is re-listed (and its pins re-checked) this often. Default 60.
    pub relist_secs: Option<u64>,
    /// How often reviewers' decisions are read from the store. Default 2.
    pub decision_poll_secs: Option<u64>,
    /// An approval counts only with a valid reviewer signature. Default false.
    pub require_signed: Option<bool>,
    /// Reviewer public keys: `{ name = "…", key = "<base64 Ed25519 public key>" }`.
    #[serde(default)]
    pub reviewers: Vec<RawReviewer>,
}

/// One reviewer's public key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReviewer {
    /// The reviewer's name, as given to `pins approve --reviewer`.
    pub name: String,
    /// The base64 32-byte Ed25519 public key.
    pub key: String,
}

/// Validated `[pins]`.
#[derive(Debug, Clone)]
pub struct PinSettings {
    /// Re-listing interval.
    pub relist: Duration,
    /// Decision polling interval.
    pub decision_poll: Duration,
    /// Whether approvals need a reviewer signature.
    pub require_signed: bool,
    /// The reviewers' public keys.
    pub reviewers: ReviewerKeys,
}

pub(crate) fn validate_pins(raw: RawPins) -> Result<PinSettings, GatewayConfigError> {
    let secs = |key: &str, value: Option<u64>, default: u64, max: u64| match value.unwrap_or(default) {
        0 => Err(bad(key, "must be at least 1")),
        n if n > max => Err(bad(key, format!("must be at most {max}"))),
        n => Ok(Duration::from_secs(n)),
    };
    let relist = secs("pins.relist_secs", raw.relist_secs, 60, 86_400)?;
    let decision_poll = secs("pins.decision_poll_secs", raw.decision_poll_secs, 2, 3_600)?;
    let pairs: Vec<(String, String)> = raw.reviewers.into_iter().map(|r| (r.name, r.key)).collect();
    let reviewers = ReviewerKeys::from_pairs(&pairs).map_err(|error| bad("pins.reviewers", error.to_string()))?;
    let require_signed = raw.require_signed.unwrap_or(false);
    if require_signed && reviewers.is_empty() {
        return Err(bad("pins.require_signed", "needs at least one entry in pins.reviewers"));
    }
    Ok(PinSettings { relist, decision_poll, require_signed, reviewers })
}
