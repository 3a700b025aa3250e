//! Configuration: a TOML file, then `PALISADE_*` environment overrides, then command-line flags,
//! parsed into raw types and validated once into [`Settings`], which cannot be invalid. A bad
//! value is reported with the name of its key. One file per section, each with its raw type and
//! its validator; [`Settings`] composes them, and [`options::OPTIONS`] is the one option table.

pub mod audit;
pub mod auth;
pub mod delegation;
pub mod error;
pub mod file;
pub mod gateway;
pub mod handles;
pub mod keys;
pub mod killswitch;
pub mod legacy;
pub mod limits;
pub mod options;
pub mod policies;
pub mod rate_limits;
pub mod server;
mod summary;
pub mod telemetry;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use palisade_server::LegacyConfig;

pub use self::audit::AuditSettings;
pub use self::auth::{AuthMode, AuthSettings, DevAuthorization, Issuer};
pub use self::error::ConfigError;
pub use self::file::{RawConfig, parse};
pub use self::handles::HandleSettings;
pub use self::killswitch::{ExternalAuthority, KillSwitchMode, KillSwitchSettings};
pub use self::limits::Limits;
pub use self::options::{ConfigFlags, OPTIONS, OptionSpec, apply_env, options_markdown};
pub use self::rate_limits::RateLimitSettings;
pub use self::server::AppChoice;
pub use self::telemetry::{CollectorHeaders, TelemetrySettings};

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The application.
    pub app: AppChoice,
    /// HTTP listen address.
    pub listen: SocketAddr,
    /// The private `/metrics` listener's address, when configured.
    pub metrics_listen: Option<SocketAddr>,
    /// Canonical resource URI.
    pub public_url: String,
    /// The Redis or Valkey URL of the event fan-out between instances, when configured.
    pub events_redis: Option<String>,
    /// Data directory.
    pub data_dir: PathBuf,
    /// Reload when the configuration file changes.
    pub watch_config: bool,
    /// Store URL.
    pub store: String,
    /// Server secret file.
    pub secret_file: PathBuf,
    /// `[limits]`.
    pub limits: Limits,
    /// Extra hosts.
    pub allowed_hosts: Vec<String>,
    /// Extra origins.
    pub allowed_origins: Vec<String>,
    /// `[audit]`.
    pub audit: AuditSettings,
    /// `[auth]`.
    pub auth: AuthSettings,
    /// `[handles]`.
    pub handles: HandleSettings,
    /// The kill switch.
    pub killswitch: KillSwitchSettings,
    /// The 2025-era session wire.
    pub legacy: LegacyConfig,
    /// `[rate_limit]` and `[[rate_limits]]`.
    pub rate_limits: RateLimitSettings,
    /// `[delegation]`: `Some` when enabled.
    pub delegation: Option<palisade_server::delegation::DelegationConfig>,
    /// `[policies]`: the operator's Cedar policies (none configured: the scope rules only).
    pub policies: policies::PolicySettings,
    /// Trace export, when a collector is configured.
    pub telemetry: Option<TelemetrySettings>,
    /// `telemetry.otlp_headers_file` (collector credentials), kept from stdio upstreams.
    pub telemetry_headers_file: Option<PathBuf>,
    /// The gateway's upstreams and pins (`app = "gateway"` only).
    pub gateway: Option<palisade_gateway::config::GatewaySettings>,
}

/// Validates raw configuration into settings, section by section.
pub fn validate(raw: RawConfig) -> Result<Settings, ConfigError> {
    let app = server::app(raw.app.as_deref(), !raw.upstreams.is_empty())?;
    let gateway = gateway::validate(app, raw.gateway, raw.pins, raw.upstreams, raw.web)?;
    let server = server::validate(server::RawServer {
        listen: raw.listen,
        metrics_listen: raw.metrics_listen,
        public_url: raw.public_url,
        events_redis: raw.events_redis,
        data_dir: raw.data_dir,
        store: raw.store,
        secret_file: raw.secret_file,
    })?;
    let limits = limits::validate(raw.limits)?;
    let audit = audit::validate(raw.audit, &server.data_dir)?;
    let auth = auth::validate(raw.auth, app, server.listen, &server.public_url)?;
    // The same order of checks as ever: the retention, the kill switch, then the policies.
    handles::retention(&raw.handles)?;
    let killswitch = killswitch::validate(raw.killswitch, app, &server.data_dir)?;
    let handles = handles::validate(raw.handles, &server.data_dir)?;
    let legacy = legacy::validate(raw.legacy)?;
    let telemetry_headers_file = raw.telemetry.otlp_headers_file.clone();
    let telemetry = telemetry::validate(raw.telemetry)?;
    let delegation = delegation::validate(raw.delegation)?;
    let root_public_key = match &killswitch.mode {
        killswitch::KillSwitchMode::Off => None,
        killswitch::KillSwitchMode::Dev { dir } => {
            Some(palisade_killswitch::dev::DevAuthorityFiles::new(dir.clone()).root_public_key())
        }
        killswitch::KillSwitchMode::Authority(authority) => Some(authority.root_public_key.clone()),
    };
    let policies = policies::validate(raw.policies, root_public_key)?;
    let rate_limits = rate_limits::validate(raw.rate_limit, raw.rate_limits, server.events_redis.as_deref())?;
    let server::ServerSettings { listen, metrics_listen, public_url, events_redis, data_dir, store, secret_file } =
        server;
    Ok(Settings {
        app,
        listen,
        metrics_listen,
        public_url,
        events_redis,
        data_dir,
        watch_config: raw.watch_config.unwrap_or(true),
        store,
        secret_file,
        limits,
        allowed_hosts: raw.http.allowed_hosts,
        allowed_origins: raw.http.allowed_origins,
        audit,
        auth,
        handles,
        killswitch,
        legacy,
        rate_limits,
        delegation,
        policies,
        telemetry,
        telemetry_headers_file,
        gateway,
    })
}

/// The one resolution of settings, for `serve` and every command that must agree with it
/// (`dev token`): the file, then `PALISADE_*` variables (read through `env`), then the
/// configuration flags, then `app` when given, then (for `serve --stdio` without a configured
/// principal or mode) unauthenticated local mode.
pub fn resolve(
    config: Option<&Path>,
    flags: &ConfigFlags,
    stdio: bool,
    app: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, ConfigError> {
    let text = match config {
        Some(path) => Some(read_config(path)?),
        None => None,
    };
    resolve_text(config.zip(text.as_deref()), flags, stdio, app, env)
}

/// The text of the configuration file at `path`.
pub fn read_config(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path)
        .map_err(|e| ConfigError { key: "--config".into(), reason: format!("cannot read {}: {e}", path.display()) })
}

/// [`resolve`] of a configuration file already read (`(path, text)`): a reload validates exactly
/// the text it compares with the running configuration.
pub fn resolve_text(
    config: Option<(&Path, &str)>,
    flags: &ConfigFlags,
    stdio: bool,
    app: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, ConfigError> {
    let mut raw = match config {
        Some((_, text)) => parse(text)?,
        None => RawConfig::default(),
    };
    apply_env(&mut raw, env)?;
    flags.apply(&mut raw)?;
    let overrides = options::overrides(flags, env);
    if let Some(app) = app {
        raw.app = Some(app.to_owned());
    }
    if stdio && raw.auth.mode.is_none() && env("PALISADE_PRINCIPAL_SUBJECT").is_none() {
        // stdio without a configured principal: the local, unauthenticated mode.
        raw.auth.mode = Some("none".into());
    }
    let mut settings = validate(raw).map_err(|error| error.with_source(&overrides))?;
    settings.protect_from_stdio_upstreams(config.map(|(path, _)| path));
    Ok(settings)
}
