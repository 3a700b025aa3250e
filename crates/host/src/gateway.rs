//! The gateway of a running server: built from its settings with its first registry (every
//! upstream listed once), and the `PATH` it records for its operator's commands.

use std::sync::Arc;

use anyhow::Context as _;
use palisade_base::clock::SystemClock;
use palisade_server::secret::ServerSecret;

use crate::settings::Settings;

/// The file in the data directory where a starting gateway records the `PATH` it looks stdio
/// commands up on, so that the operator's commands (`gateway status`, `upstreams show|approve`)
/// resolve, hash and pin exactly what it runs, whatever their own shell's `PATH` is.
const SEARCH_PATH_FILE: &str = "gateway-search-path";

/// Records this process's `PATH` as the gateway's (at `palisade gateway` start). An unset `PATH`
/// is recorded as empty: bare commands resolve to nothing, for the gateway and its operator.
pub fn record_search_path(settings: &Settings) -> anyhow::Result<()> {
    let path = settings.data_dir.join(SEARCH_PATH_FILE);
    let staged = settings.data_dir.join(format!("{SEARCH_PATH_FILE}.new"));
    let text = std::env::var("PATH").unwrap_or_default();
    let mut private = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(private.recursive(true), 0o700);
    private.create(&settings.data_dir).with_context(|| format!("creating {}", settings.data_dir.display()))?;
    std::fs::write(&staged, text).with_context(|| format!("writing {}", staged.display()))?;
    std::fs::rename(&staged, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The `PATH` the gateway with these settings recorded at its last start: `None` when none has
/// started with this data directory, `Some(None)` when it ran without one. A file that cannot
/// be read is an error (resolving on another `PATH` could show and pin another program).
pub fn recorded_search_path(settings: &Settings) -> anyhow::Result<Option<Option<String>>> {
    let path = settings.data_dir.join(SEARCH_PATH_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(Some(text).filter(|text| !text.is_empty()))),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => {
            Err(anyhow::Error::new(error).context(format!("reading the gateway's PATH from {}", path.display())))
        }
    }
}

/// Builds the gateway and its first registry: every upstream listed once (one that fails is
/// reported and retried by the gateway's loops; it never stops the others or the start).
pub async fn start(
    settings: &palisade_gateway::config::GatewaySettings,
    store: &Arc<dyn palisade_store::Store>,
    secret: &ServerSecret,
    coverage: Option<palisade_gateway::gateway::CoverageCheck>,
) -> anyhow::Result<(palisade_gateway::Gateway, palisade_server::App)> {
    for upstream in &settings.upstreams {
        if upstream.stdio.as_ref().is_some_and(|stdio| stdio.confinement == palisade_gateway::config::Confinement::None)
        {
            eprintln!(
                "WARNING: upstream {} runs UNCONFINED (confinement = \"none\"): its processes have the gateway's access",
                upstream.id
            );
        }
    }
    // The per-user OAuth client of the `user_oauth` upstreams: its keys come from the server
    // secret, so every instance opens the tokens another stored.
    let oauth =
        palisade_gateway::user_oauth::UserOAuth::for_gateway(settings, store.clone(), secret, Arc::new(SystemClock))
            .context("starting the gateway's per-user OAuth client")?;
    let gateway =
        palisade_gateway::Gateway::with_user_oauth(settings.clone(), store.clone(), Arc::new(SystemClock), oauth)
            .context("starting the gateway")?;
    gateway.refresh_all().await;
    let app = gateway.build_app(coverage.as_ref()).await.context("building the gateway's registry")?;
    for status in gateway.status() {
        let error = status.listing_error.as_deref().or(status.health.last_error.as_deref());
        eprintln!(
            "upstream {}: {} of {} definitions served ({})",
            status.id,
            status.served,
            status.listed,
            match (&status.launch, &status.listing_error) {
                (Some(launch), Some(_)) if !launch.served =>
                    "its launch is not approved: `palisade upstreams show`".to_owned(),
                _ if status.health.healthy && status.listing_error.is_none() => "healthy".to_owned(),
                _ => match error {
                    Some(error) => format!("unreachable, retrying: {}", palisade_base::reveal::reveal_line(error)),
                    None => "unreachable; retrying".to_owned(),
                },
            }
        );
        for rule in &status.unmatched_rules {
            eprintln!("WARNING: upstream {}: {rule}", status.id);
        }
    }
    Ok((gateway, app))
}
