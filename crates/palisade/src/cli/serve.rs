//! `palisade serve` and `palisade gateway`: the arguments, and the host's runtime started,
//! served until a stop signal (or the end of stdin), and shut down in order.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use palisade_host::reload::ReloadSource;
use palisade_host::settings::ConfigFlags;
use palisade_host::signal::shutdown_signal;
use palisade_host::{Runtime, Settings, Transport};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct GatewayArgs {
    #[command(subcommand)]
    pub command: Option<GatewayCommand>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Subcommand)]
pub enum GatewayCommand {
    /// Connect to every upstream now and print its health, protocol and pin states (exit 1 if
    /// any upstream is unreachable). Resolved as `palisade gateway` resolves: the same file,
    /// environment and configuration flags, and stdio commands on the `PATH` the gateway recorded.
    Status {
        /// The gateway's configuration file.
        #[arg(long)]
        config: PathBuf,
        /// `palisade gateway`'s configuration flags (`--data-dir`, `--store`, …), resolved exactly
        /// as it resolves them.
        #[command(flatten)]
        flags: ConfigFlags,
    },
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Configuration file (TOML). `PALISADE_*` environment variables override it; flags
    /// override both.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Serve newline-delimited JSON on stdin/stdout instead of HTTP.
    #[arg(long)]
    pub stdio: bool,
    /// The configuration flags (`palisade config options` lists every option).
    #[command(flatten)]
    pub flags: ConfigFlags,
}

/// Serves until a stop signal (HTTP) or the end of stdin (`--stdio`), then shuts down in order.
/// With a configuration file, the configuration reloads on `SIGHUP`, on a change of the file
/// and at `palisade reload`.
pub async fn serve(args: ServeArgs, settings: Settings, source: Option<ReloadSource>) -> anyhow::Result<ExitCode> {
    let transport = if args.stdio { Transport::Stdio } else { Transport::Http };
    let mut runtime = Runtime::start_reloadable(settings, transport, source).await?;
    runtime.serve(shutdown_signal()).await?;
    runtime.shutdown().await;
    Ok(ExitCode::SUCCESS)
}
