//! The `palisade` command: it parses its arguments and dispatches to a subcommand; the running
//! system (settings, services, jobs, shutdown) is `palisade_host`'s, and every request decision
//! lives in `palisade_server`.
//!
//! Layers, low to high: `cli`.

// mimalloc instead of the system allocator: the request path allocates and frees many small
// objects across threads (BENCHMARKS.md, "Checkpoints off the append path ...").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cli::serve::{GatewayArgs, GatewayCommand};
use palisade_host::telemetry;

#[derive(Parser)]
#[command(
    name = "palisade",
    version,
    about = "MCP server runtime and gateway with isolation controls on every request"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve an application over Streamable HTTP (default) or stdio.
    Serve(cli::serve::ServeArgs),
    /// Serve the gateway in front of the configuration's `[[upstreams]]` (`serve` with
    /// `app = "gateway"`), or report on its upstreams.
    Gateway(cli::serve::GatewayArgs),
    /// Ask the running `palisade gateway` (or `serve`) of a configuration file to reload it now
    /// (exit 1, with the reason, when the new configuration was refused; nothing changed then).
    Reload(cli::reload::ReloadArgs),
    /// Review the gateway's pinned upstream definitions.
    Pins {
        #[command(subcommand)]
        command: cli::gateway_cli::PinsCommand,
    },
    /// Review the launch of the gateway's local stdio upstreams (what runs, exactly).
    Upstreams {
        #[command(subcommand)]
        command: cli::gateway_cli::UpstreamsCommand,
    },
    /// Check a configuration file and exit (0 when valid, 2 otherwise).
    Config {
        #[command(subcommand)]
        command: cli::config_cli::ConfigCommand,
    },
    /// Development helpers.
    Dev {
        #[command(subcommand)]
        command: cli::dev::DevCommand,
    },
    /// The audit log.
    Audit {
        #[command(subcommand)]
        command: cli::audit::AuditCommand,
    },
    /// Explicit application handles: list a subject's (digests only) and revoke.
    Handles {
        #[command(subcommand)]
        command: cli::handles::HandlesCommand,
    },
    /// Delegation capabilities (the ledger): list them, revoke one and everything under it.
    Delegation {
        #[command(subcommand)]
        command: cli::delegation::DelegationCommand,
    },
    /// The gateway's per-user upstream connections (`user_oauth`): list them (never a token),
    /// remove one person's.
    Connections {
        #[command(subcommand)]
        command: cli::connections::ConnectionsCommand,
    },
    /// Kill-switch keys.
    Keys {
        #[command(subcommand)]
        command: cli::killswitch_cli::KeysCommand,
    },
    /// Policies: the kill switch's signed operation registry (`init`, `sign`) and the
    /// operator's Cedar policies (`check`, `test`, `schema`).
    Policy {
        #[command(subcommand)]
        command: cli::policy_cli::PolicyCommand,
    },
    /// The reference disable authority: serve it, or switch targets off and on.
    Authority {
        #[command(subcommand)]
        command: cli::killswitch_cli::AuthorityCommand,
    },
    /// Verify any MCP server adversarially with two or more identities (a client only).
    Verify(palisade_verify::VerifyArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    palisade_auth::install_crypto_provider();
    // `serve` reads its settings before logging starts: trace export, when configured, is a
    // layer of the subscriber. Its exporter is built outside the runtime (it runs on a thread
    // of its own).
    let serve_settings = match &cli.command {
        Command::Serve(args) => match cli::resolve_serving(args.config.as_deref(), &args.flags, args.stdio, None) {
            Ok(resolved) => Some(resolved),
            Err(error) => return exit_code(&error),
        },
        Command::Gateway(GatewayArgs { command: None, serve: args }) => {
            match cli::resolve_serving(args.config.as_deref(), &args.flags, args.stdio, Some("gateway")) {
                Ok(resolved) => Some(resolved),
                Err(error) => return exit_code(&error),
            }
        }
        _ => None,
    };
    let log_format = match telemetry::LogFormat::from_env() {
        Ok(format) => format,
        Err(error) => return exit_code(&error),
    };
    let telemetry = match serve_settings.as_ref().and_then(|(settings, _)| settings.telemetry.as_ref()) {
        Some(settings) => match telemetry::Telemetry::start(settings) {
            Ok(telemetry) => Some(telemetry),
            Err(error) => return exit_code(&error),
        },
        None => None,
    };
    // Logs go to stderr, always: on stdio, stdout carries MCP messages only.
    telemetry::init(telemetry.as_ref(), log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) | Command::Gateway(GatewayArgs { command: None, serve: args }) => match serve_settings
            {
                Some((settings, source)) => cli::serve::serve(args, settings, source).await,
                None => Err(anyhow::anyhow!("serve without settings")),
            },
            Command::Gateway(GatewayArgs { command: Some(GatewayCommand::Status { config, flags }), .. }) => {
                cli::gateway_cli::status(&config, &flags).await
            }
            Command::Reload(args) => cli::reload::run(args).await,
            Command::Pins { command } => cli::gateway_cli::pins(command).await,
            Command::Upstreams { command } => cli::gateway_cli::upstreams(command).await,
            Command::Config { command } => cli::config_cli::run(command),
            Command::Dev { command } => cli::dev::run(command),
            Command::Audit { command } => cli::audit::run(command).await,
            Command::Handles { command } => cli::handles::run(command).await,
            Command::Delegation { command } => cli::delegation::run(command).await,
            Command::Connections { command } => cli::connections::run(command).await,
            Command::Keys { command } => cli::killswitch_cli::keys(command),
            Command::Policy { command } => cli::policy_cli::run(command).await,
            Command::Authority { command } => cli::killswitch_cli::authority(command).await,
            Command::Verify(args) => palisade_verify::run(args).await,
        }
    });
    // Every serve exit, graceful or not, flushes the spans still queued.
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    match result {
        Ok(code) => code,
        Err(error) => exit_code(&error),
    }
}

/// Reports an error: exit 2 for a configuration error (it names the key), 1 otherwise.
fn exit_code(error: &anyhow::Error) -> ExitCode {
    match error.downcast_ref::<palisade_host::ConfigError>() {
        Some(config_error) => {
            eprintln!("error: {config_error}");
            ExitCode::from(2)
        }
        None => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
