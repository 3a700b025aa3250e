//! The subcommands' bodies, one file per command family, and the one resolution of settings
//! every command shares with `serve`.

pub mod audit;
pub mod audit_read;
pub mod config_cli;
pub mod connections;
pub mod delegation;
pub mod dev;
pub mod gateway_cli;
pub mod handles;
pub mod killswitch_cli;
pub mod operator;
pub mod serve;

use std::path::Path;

use palisade_host::Settings;
use palisade_host::settings::ConfigFlags;

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// The one resolution of settings, for `serve` and every command that must agree with it
/// (`dev token`): the file, then `PALISADE_*` variables, then the configuration flags, then
/// (for `serve --stdio` without a configured principal or mode) unauthenticated local mode.
pub fn resolve(config: Option<&Path>, flags: &ConfigFlags, stdio: bool, app: Option<&str>) -> anyhow::Result<Settings> {
    Ok(palisade_host::settings::resolve(config, flags, stdio, app, &env)?)
}

/// The settings of a command: file, then environment.
pub fn settings(config: Option<&Path>) -> anyhow::Result<Settings> {
    resolve(config, &ConfigFlags::default(), false, None)
}

/// The settings of a command about one application (`policy init --app`, `pins`, `gateway`),
/// whatever the file's `app` says.
pub fn settings_for_app(config: Option<&Path>, app: Option<&str>) -> anyhow::Result<Settings> {
    resolve(config, &ConfigFlags::default(), false, app)
}

/// The settings `palisade gateway --config FILE FLAGS` runs with (`gateway status`).
pub fn gateway_settings(config: &Path, flags: &ConfigFlags) -> anyhow::Result<Settings> {
    resolve(Some(config), flags, false, Some("gateway"))
}
