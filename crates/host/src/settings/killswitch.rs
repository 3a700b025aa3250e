//! `[killswitch]`: off, the development authority, or an external authority and its files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, bad};
use super::keys;
use super::server::AppChoice;

/// `[killswitch]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKillSwitch {
    /// `off`, `dev` (generated keys and an in-process development authority in the data
    /// directory) or `authority` (an external authority; the files below). Default: `dev` for
    /// the demo, `off` for the conformance fixture.
    pub mode: Option<String>,
    /// The release this server reports as its `server_release` target. Default: the binary's
    /// version.
    pub server_release: Option<String>,
    /// The policy root public key file.
    pub root_public_key: Option<PathBuf>,
    /// The signed policy envelope file.
    pub policy: Option<PathBuf>,
    /// The key trust root directory (holds the authority public key the policy pins).
    pub key_trust_root: Option<PathBuf>,
    /// The authority's `https://host:port` URL.
    pub authority_url: Option<String>,
    /// CA bundle (PEM): the only trust anchors for the authority's certificate.
    pub authority_ca: Option<PathBuf>,
    /// This server's client certificate chain (PEM).
    pub client_cert: Option<PathBuf>,
    /// This server's client key (PEM).
    pub client_key: Option<PathBuf>,
    /// Generation store: `sqlite:<path>` or `redis://…`. Default `sqlite:<data_dir>/killswitch-generations.db`.
    pub generation_store: Option<String>,
    /// The 32-byte target key file (shared with the authority's operators).
    pub target_key_file: Option<PathBuf>,
    /// The authority's SQLite database, when this server shares it (the demo's orders then
    /// redeem commit tokens in their own transaction); also the default of
    /// `palisade authority disable|enable|status --db`.
    pub authority_db: Option<PathBuf>,
    /// How often open listen streams and GET streams re-check their targets, in seconds
    /// (1–3600, default 5); a refusal (DISABLE or any doubt) ends the stream.
    pub stream_recheck_secs: Option<u64>,
    /// How long a head this instance accepted is answered from memory when it comes again,
    /// without the generation store, in milliseconds (0–60000, default 1000; 0: every answer
    /// goes to the store). Another instance's higher generation is seen at most this late.
    pub replay_window_ms: Option<u64>,
    /// `batch` (default: many callers' queries under one signature) or `single` (the v2
    /// envelope, one signed head per target, for authorities without the batch endpoint).
    pub authority_envelope: Option<String>,
}

/// How the kill switch runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillSwitchMode {
    /// No kill switch.
    Off,
    /// Generated keys, certificates and policy in `dir`, and an in-process authority on loopback.
    Dev {
        /// `<data_dir>/killswitch-dev`.
        dir: PathBuf,
    },
    /// An external authority.
    Authority(Box<ExternalAuthority>),
}

/// The files and endpoints of an external authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalAuthority {
    /// Policy root public key.
    pub root_public_key: PathBuf,
    /// Signed policy.
    pub policy: PathBuf,
    /// Key trust root.
    pub key_trust_root: PathBuf,
    /// `https://…`
    pub authority_url: String,
    /// CA bundle.
    pub authority_ca: PathBuf,
    /// Client certificate.
    pub client_cert: PathBuf,
    /// Client key.
    pub client_key: PathBuf,
    /// Generation store URL.
    pub generation_store: String,
    /// Target key file.
    pub target_key_file: PathBuf,
    /// The authority database, when shared.
    pub authority_db: Option<PathBuf>,
}

/// Validated kill-switch settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillSwitchSettings {
    /// The mode.
    pub mode: KillSwitchMode,
    /// The `server_release` target value.
    pub server_release: String,
    /// `killswitch.stream_recheck_secs`.
    pub stream_recheck: Duration,
    /// `killswitch.replay_window_ms`.
    pub replay_window: Duration,
    /// `killswitch.authority_envelope = "single"`.
    pub single_envelope: bool,
}

/// Validates `[killswitch]`: the default mode is `dev` for the demo, `off` otherwise.
pub fn validate(raw: RawKillSwitch, app: AppChoice, data_dir: &Path) -> Result<KillSwitchSettings, ConfigError> {
    let default_mode = if app == AppChoice::Demo { "dev" } else { "off" };
    let server_release = raw.server_release.unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned());
    if server_release.trim().is_empty() || server_release.len() > 128 {
        return Err(bad(keys::KILLSWITCH_SERVER_RELEASE, "must be 1-128 characters"));
    }
    let mode = match raw.mode.as_deref().unwrap_or(default_mode) {
        "off" => KillSwitchMode::Off,
        "dev" => KillSwitchMode::Dev { dir: data_dir.join("killswitch-dev") },
        "authority" => {
            let required =
                |value: Option<PathBuf>, key: &str| value.ok_or_else(|| bad(key, "required in authority mode"));
            let authority_url =
                raw.authority_url.ok_or_else(|| bad(keys::KILLSWITCH_AUTHORITY_URL, "required in authority mode"))?;
            if !authority_url.starts_with("https://") || url::Url::parse(&authority_url).is_err() {
                return Err(bad(keys::KILLSWITCH_AUTHORITY_URL, "must be an https:// URL"));
            }
            let generation_store = raw
                .generation_store
                .unwrap_or_else(|| format!("sqlite:{}", data_dir.join("killswitch-generations.db").display()));
            if !(generation_store.starts_with("sqlite:")
                || generation_store.starts_with("redis://")
                || generation_store.starts_with("rediss://"))
            {
                return Err(bad(keys::KILLSWITCH_GENERATION_STORE, "must be sqlite:<path> or redis://…"));
            }
            KillSwitchMode::Authority(Box::new(ExternalAuthority {
                root_public_key: required(raw.root_public_key, keys::KILLSWITCH_ROOT_PUBLIC_KEY)?,
                policy: required(raw.policy, keys::KILLSWITCH_POLICY)?,
                key_trust_root: required(raw.key_trust_root, keys::KILLSWITCH_KEY_TRUST_ROOT)?,
                authority_url,
                authority_ca: required(raw.authority_ca, keys::KILLSWITCH_AUTHORITY_CA)?,
                client_cert: required(raw.client_cert, keys::KILLSWITCH_CLIENT_CERT)?,
                client_key: required(raw.client_key, keys::KILLSWITCH_CLIENT_KEY)?,
                generation_store,
                target_key_file: required(raw.target_key_file, keys::KILLSWITCH_TARGET_KEY_FILE)?,
                authority_db: raw.authority_db,
            }))
        }
        other => {
            return Err(bad(keys::KILLSWITCH_MODE, format!("unknown mode `{other}`; expected off, dev or authority")));
        }
    };
    let recheck = raw.stream_recheck_secs.unwrap_or(5);
    if !(1..=3600).contains(&recheck) {
        return Err(bad(keys::KILLSWITCH_STREAM_RECHECK_SECS, "must be between 1 and 3600"));
    }
    let replay_window_ms = raw.replay_window_ms.unwrap_or(palisade_killswitch::generation::DEFAULT_REPLAY_WINDOW_MS);
    if replay_window_ms > 60_000 {
        return Err(bad(keys::KILLSWITCH_REPLAY_WINDOW_MS, "must be between 0 and 60000"));
    }
    let single_envelope = match raw.authority_envelope.as_deref().unwrap_or("batch") {
        "batch" => false,
        "single" => true,
        _ => return Err(bad(keys::KILLSWITCH_AUTHORITY_ENVELOPE, "must be batch or single")),
    };
    Ok(KillSwitchSettings {
        mode,
        server_release,
        stream_recheck: Duration::from_secs(recheck),
        replay_window: Duration::from_millis(replay_window_ms),
        single_envelope,
    })
}
