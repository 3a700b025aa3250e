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
pub mod policy_cli;
pub mod reload;
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

/// The settings `serve` and `gateway` run with ([`resolve`]) and, when they come from a file,
/// how a reload resolves a new text of it: the same environment and flags.
pub fn resolve_serving(
    config: Option<&Path>,
    flags: &ConfigFlags,
    stdio: bool,
    app: Option<&str>,
) -> anyhow::Result<(Settings, Option<palisade_host::reload::ReloadSource>)> {
    let Some(path) = config else { return Ok((resolve(None, flags, stdio, app)?, None)) };
    let text = palisade_host::settings::read_config(path)?;
    let settings = palisade_host::settings::resolve_text(Some((path, text.as_str())), flags, stdio, app, &env)?;
    let (file, flags, app) = (path.to_path_buf(), flags.clone(), app.map(str::to_owned));
    let resolve = Box::new(move |text: &str| {
        palisade_host::settings::resolve_text(Some((file.as_path(), text)), &flags, stdio, app.as_deref(), &env)
    });
    let source = palisade_host::reload::ReloadSource { config: path.to_path_buf(), text, resolve };
    Ok((settings, Some(source)))
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

/// The registry `settings` serve: the built-in application, or the gateway's (what its
/// upstreams list now, as its reviewers approved it). `policy init` writes the kill switch's
/// registry from it; `policy check` and `policy test` validate the operator's policies against it.
pub async fn registry(settings: &Settings) -> anyhow::Result<palisade_server::App> {
    use anyhow::Context as _;
    Ok(match (palisade_host::authn::app_name(settings.app), &settings.gateway) {
        (Some(app), _) => app.build(),
        (None, Some(gateway)) => {
            let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
            let secret = palisade_host::secrets::server_secret(settings)?;
            palisade_host::gateway::start(gateway, &store, &secret, None).await?.1
        }
        (None, None) => anyhow::bail!("no application: name one with --app or in the configuration"),
    })
}

/// The settings `palisade gateway --config FILE FLAGS` runs with (`gateway status`).
pub fn gateway_settings(config: &Path, flags: &ConfigFlags) -> anyhow::Result<Settings> {
    resolve(Some(config), flags, false, Some("gateway"))
}
