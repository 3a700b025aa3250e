//! `[policies]`: the operator's Cedar policy files, the token claims naming the caller's groups
//! or roles, and the bounds of the argument view policies see.

use std::path::PathBuf;

use palisade_server::policy::view::ViewLimits;
use serde::Deserialize;

use super::error::{ConfigError, bad};
use super::keys;

/// `[policies]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicies {
    /// Policy files: each a `.cedar` file, or `DIR/*.cedar` (every `.cedar` file of `DIR`).
    #[serde(default)]
    pub files: Vec<String>,
    /// Token claims holding groups or roles (a string, space-separated, or an array).
    #[serde(default)]
    pub group_claims: Vec<String>,
    /// Deepest nesting of records and sets in `context.arguments` (1–8). Default 3.
    pub max_argument_depth: Option<u64>,
    /// Longest string in `context.arguments`, in bytes (1–1048576). Default 4096.
    pub max_argument_bytes: Option<u64>,
    /// Most members of one set or record in `context.arguments` (1–10000). Default 64.
    pub max_argument_entries: Option<u64>,
    /// Every file needs `FILE.sig` by the kill switch's policy root key. Default false.
    pub require_signed: Option<bool>,
}

/// `[policies]`, validated. No files: no policies (the scope rules only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySettings {
    /// The policy files (or `DIR/*.cedar` patterns), as configured.
    pub files: Vec<PathBuf>,
    /// Token claims holding groups or roles.
    pub group_claims: Vec<String>,
    /// The argument view's bounds.
    pub limits: ViewLimits,
    /// The public key every file's `FILE.sig` must verify under (`require_signed`): the kill
    /// switch's policy root key.
    pub signed_by: Option<PathBuf>,
}

impl PolicySettings {
    /// Whether any policy file is configured.
    pub fn enabled(&self) -> bool {
        !self.files.is_empty()
    }
}

/// Validates `[policies]`; `root_public_key` is the kill switch's policy root key, when it runs.
pub fn validate(raw: RawPolicies, root_public_key: Option<PathBuf>) -> Result<PolicySettings, ConfigError> {
    let defaults = ViewLimits::default();
    let bounded = |key: &str, value: Option<u64>, default: usize, max: u64| -> Result<usize, ConfigError> {
        match value {
            None => Ok(default),
            Some(value) if (1..=max).contains(&value) => Ok(usize::try_from(value).unwrap_or(default)),
            Some(_) => Err(bad(key, format!("must be between 1 and {max}"))),
        }
    };
    let limits = ViewLimits {
        max_depth: bounded(keys::POLICIES_MAX_ARGUMENT_DEPTH, raw.max_argument_depth, defaults.max_depth, 8)?,
        max_string_bytes: bounded(
            keys::POLICIES_MAX_ARGUMENT_BYTES,
            raw.max_argument_bytes,
            defaults.max_string_bytes,
            1_048_576,
        )?,
        max_entries: bounded(
            keys::POLICIES_MAX_ARGUMENT_ENTRIES,
            raw.max_argument_entries,
            defaults.max_entries,
            10_000,
        )?,
    };
    if raw.group_claims.iter().any(|claim| claim.trim().is_empty()) {
        return Err(bad(keys::POLICIES_GROUP_CLAIMS, "a claim name must not be empty"));
    }
    for file in &raw.files {
        if file.trim().is_empty() {
            return Err(bad(keys::POLICIES_FILES, "a file name must not be empty"));
        }
        let name = file.rsplit('/').next().unwrap_or(file);
        if name.contains('*') && name != "*.cedar" {
            return Err(bad(keys::POLICIES_FILES, format!("{file:?}: the only pattern is DIR/*.cedar")));
        }
        if !name.contains('*') && !name.ends_with(".cedar") {
            return Err(bad(keys::POLICIES_FILES, format!("{file:?}: a policy file ends in .cedar")));
        }
    }
    let signed_by = match (raw.require_signed.unwrap_or(false), root_public_key) {
        (false, _) => None,
        (true, Some(key)) => Some(key),
        (true, None) => {
            return Err(bad(
                keys::POLICIES_REQUIRE_SIGNED,
                "needs the kill switch (killswitch.mode = \"dev\" or an authority): its policy root key signs the files",
            ));
        }
    };
    Ok(PolicySettings {
        files: raw.files.into_iter().map(PathBuf::from).collect(),
        group_claims: raw.group_claims,
        limits,
        signed_by,
    })
}
