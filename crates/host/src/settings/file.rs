//! The file as written ([`RawConfig`], every section's raw type) and its parsing, whose errors
//! name the full path of the key and, for a misspelt one, the key it is close to.

use std::path::PathBuf;

use serde::Deserialize;

use super::audit::RawAudit;
use super::auth::RawAuth;
use super::delegation::RawDelegation;
use super::error::{ConfigError, bad};
use super::handles::RawHandles;
use super::killswitch::RawKillSwitch;
use super::legacy::RawLegacy;
use super::limits::{RawHttp, RawLimits};
use super::policies::RawPolicies;
use super::rate_limits::{RawRateLimit, RawRateRule};
use super::telemetry::RawTelemetry;

/// The file as written. Every key is optional; unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `demo` or `conformance`.
    pub app: Option<String>,
    /// HTTP listen address.
    pub listen: Option<String>,
    /// The private listener serving `/metrics`. Unset: none.
    pub metrics_listen: Option<String>,
    /// The canonical resource URI of this server (tokens' audience). Default
    /// `http://<listen>/mcp`.
    pub public_url: Option<String>,
    /// Directory for the embedded database, generated keys and the server secret.
    pub data_dir: Option<PathBuf>,
    /// Store URL: `sqlite:<path>` or `postgres://…`. Default `sqlite:<data_dir>/palisade.db`.
    pub store: Option<String>,
    /// File holding the 32-byte server secret (64 hex characters). Default
    /// `<data_dir>/server-secret`, generated on first run.
    pub secret_file: Option<PathBuf>,
    /// Redis or Valkey through which instances fan their server events out to each other.
    pub events_redis: Option<String>,
    /// Reload when the configuration file changes. Default true.
    pub watch_config: Option<bool>,
    /// Limits.
    #[serde(default)]
    pub limits: RawLimits,
    /// HTTP allow-lists.
    #[serde(default)]
    pub http: RawHttp,
    /// Authentication.
    #[serde(default)]
    pub auth: RawAuth,
    /// Explicit application handles.
    #[serde(default)]
    pub handles: RawHandles,
    /// The kill switch.
    #[serde(default)]
    pub killswitch: RawKillSwitch,
    /// The 2025-era session wire beside 2026-07-28.
    #[serde(default)]
    pub legacy: RawLegacy,
    /// OpenTelemetry trace export.
    #[serde(default)]
    pub telemetry: RawTelemetry,
    /// The audit log.
    #[serde(default)]
    pub audit: RawAudit,
    /// `[delegation]`
    #[serde(default)]
    pub delegation: RawDelegation,
    /// `[policies]`: operator policies (Cedar).
    #[serde(default)]
    pub policies: RawPolicies,
    /// `[rate_limit]`: where rate limits count.
    #[serde(default)]
    pub rate_limit: RawRateLimit,
    /// `[[rate_limits]]`: the rules.
    #[serde(default)]
    pub rate_limits: Vec<RawRateRule>,
    /// The gateway (`app = "gateway"`, `palisade gateway`): names.
    #[serde(default)]
    pub gateway: palisade_gateway::config::RawGateway,
    /// The gateway: pin re-checking and review.
    #[serde(default)]
    pub pins: palisade_gateway::config::RawPins,
    /// The gateway: the MCP servers it fronts.
    #[serde(default)]
    pub upstreams: Vec<palisade_gateway::config::RawUpstream>,
    /// The gateway: the HTTPS listener of its browser pages (the pin review page).
    pub web: Option<palisade_gateway::config::RawWeb>,
}

/// Parses TOML text.
pub fn parse(text: &str) -> Result<RawConfig, ConfigError> {
    let syntax = |e: toml::de::Error| {
        let key = e.span().and_then(|span| key_at(text, span.start));
        bad(&key.unwrap_or_else(|| "(file)".to_owned()), e.message().to_owned())
    };
    let deserializer = toml::Deserializer::parse(text).map_err(syntax)?;
    // The path of the key being read when an error happened (`pins.relist_sec`,
    // `upstreams[1].prefix`): serde's own errors name only the last part.
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().message().to_owned();
        let unknown = message.strip_prefix("unknown field `").and_then(|rest| rest.split('`').next());
        let key = match unknown {
            // The path ends at the table holding the unknown key (or at the key itself).
            Some(name) if path == "." || path.is_empty() => name.to_owned(),
            Some(name) if path.ends_with(name) => path,
            Some(name) => format!("{path}.{name}"),
            None if path == "." || path.is_empty() => {
                e.inner().span().and_then(|span| key_at(text, span.start)).unwrap_or_else(|| "(file)".to_owned())
            }
            None => path,
        };
        let reason = match unknown.and_then(|name| closest(name, &expected_names(&message))) {
            Some(near) => format!("unknown key; did you mean `{near}`? ({message})"),
            None if unknown.is_some() => format!("unknown key ({message})"),
            None => message,
        };
        bad(&key, reason)
    })
}

/// The names in serde's "expected one of `a`, `b`" (or "expected `a`") tail of an error.
fn expected_names(message: &str) -> Vec<&str> {
    let Some((_, tail)) = message.split_once("expected") else { return Vec::new() };
    tail.split('`').skip(1).step_by(2).collect()
}

/// The candidate nearest to `name`, when it is close enough to be a typo of it.
fn closest<'a>(name: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|candidate| (strsim::jaro_winkler(name, candidate), *candidate))
        .filter(|(similarity, _)| *similarity >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

/// The dotted key of the `name = value` line holding byte `at` of `text`: the table header above
/// it, if any (an array-of-tables element by its index, `upstreams[1]`, as the deserializer's
/// paths name it), and the name.
fn key_at(text: &str, at: usize) -> Option<String> {
    let line_start = text.get(..at)?.rfind('\n').map_or(0, |newline| newline + 1);
    let line = text.get(line_start..)?.lines().next()?;
    let (name, _) = line.split_once('=')?;
    let name = name.trim().trim_matches('"');
    if name.is_empty() || name.starts_with('[') {
        return None;
    }
    Some(match table_at(&text[..line_start]) {
        Some(table) => format!("{table}.{name}"),
        None => name.to_owned(),
    })
}

/// The path of the table the end of `before` is in: its last header, each array of tables on
/// the way named with the index of its current element (`[[upstreams]]` twice, then
/// `[upstreams.credential]`: `upstreams[1].credential`).
fn table_at(before: &str) -> Option<String> {
    let mut elements: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    let mut current = None;
    for line in before.lines().map(str::trim) {
        let (header, array) = match line.strip_prefix("[[") {
            Some(rest) => (rest.split("]]").next().unwrap_or_default(), true),
            None => match line.strip_prefix('[') {
                Some(rest) => (rest.split(']').next().unwrap_or_default(), false),
                None => continue,
            },
        };
        let segments: Vec<&str> = header.split('.').map(|segment| segment.trim().trim_matches('"')).collect();
        if array {
            *elements.entry(segments.join(".")).or_default() += 1;
        }
        let mut path = String::new();
        let mut plain = String::new();
        for segment in segments {
            if !plain.is_empty() {
                plain.push('.');
                path.push('.');
            }
            plain.push_str(segment);
            path.push_str(segment);
            if let Some(count) = elements.get(&plain) {
                path.push_str(&format!("[{}]", count.saturating_sub(1)));
            }
        }
        current = Some(path);
    }
    current
}
