//! The `palisade` command: a thin shell over the server library. It parses flags, builds the
//! chosen application and runs a transport; every decision lives in the libraries.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use palisade_apps::AppName;
use palisade_server::auth::Authenticator;
use palisade_server::secret::ServerSecret;
use palisade_server::{Server, ServerConfig};

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
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Which application to serve.
    #[arg(long, value_enum, default_value_t = AppArg::Demo)]
    app: AppArg,
    /// Address to listen on (HTTP). Without authentication only loopback addresses are allowed.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Serve newline-delimited JSON on stdin/stdout instead of HTTP.
    #[arg(long)]
    stdio: bool,
    /// Largest request body (HTTP) or line (stdio) in bytes.
    #[arg(long, default_value_t = 1024 * 1024)]
    max_body_bytes: usize,
    /// Per-request timeout in seconds (capped at 600).
    #[arg(long, default_value_t = 60)]
    request_timeout_secs: u64,
    /// Items per page of every list method.
    #[arg(long, default_value_t = 100)]
    page_size: usize,
    /// Extra Host header value to accept (repeatable), e.g. `mcp.example.com`.
    #[arg(long = "allow-host")]
    allow_hosts: Vec<String>,
    /// Extra Origin to accept (repeatable), e.g. `https://app.example.com`.
    #[arg(long = "allow-origin")]
    allow_origins: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum AppArg {
    Demo,
    Conformance,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Logs go to stderr, always: on stdio, stdout carries MCP messages only.
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PALISADE_LOG").unwrap_or_else(|_| "info".into()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve(args)),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let app = match args.app {
        AppArg::Demo => AppName::Demo,
        AppArg::Conformance => AppName::Conformance,
    }
    .build();
    let config = ServerConfig {
        max_body_bytes: args.max_body_bytes,
        request_timeout: std::time::Duration::from_secs(args.request_timeout_secs),
        page_size: args.page_size,
        allowed_hosts: args.allow_hosts,
        allowed_origins: args.allow_origins,
        ..ServerConfig::default()
    };
    let authenticator = Authenticator::UnauthenticatedLoopback;
    eprintln!(
        "WARNING: palisade is running WITHOUT AUTHENTICATION; every caller is trusted. This mode is restricted to loopback and stdio."
    );
    let server = Arc::new(Server::new(app, config, authenticator, ServerSecret::random()));
    if args.stdio {
        palisade_server::stdio::serve(server, tokio::io::stdin(), tokio::io::stdout())
            .await
            .context("stdio transport")?;
        return Ok(());
    }
    let listener = palisade_server::http::bind(&server, args.listen).await?;
    let local = listener.local_addr()?;
    #[allow(clippy::print_stdout)]
    {
        println!("listening on http://{local}/mcp");
    }
    palisade_server::http::serve(server, listener, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
