//! The `palisade` command: a thin shell over the libraries. It reads configuration, builds the
//! chosen application, store and authenticator, and runs a transport; every request decision
//! lives in `palisade_server`.

mod config;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use palisade_apps::AppName;
use palisade_auth::dev_issuer::DevIssuer;
use palisade_auth::{IssuerConfig, JwksSource, ResourceServerConfig, TokenVerifier};
use palisade_server::auth::{Authenticator, EnvironmentPrincipal};
use palisade_server::secret::ServerSecret;
use palisade_server::{Server, ServerConfig};

use crate::config::{AppChoice, AuthMode, Settings};

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
    /// Check a configuration file and exit (0 when valid, 2 otherwise).
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Development helpers.
    Dev {
        #[command(subcommand)]
        command: DevCommand,
    },
    /// The audit log.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate FILE (with the environment applied) and print the effective settings.
    Check { file: PathBuf },
}

#[derive(Subcommand)]
enum DevCommand {
    /// Print a token from the development issuer that the demo accepts.
    Token(TokenArgs),
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Walk the hash chain of the audit log and report whether it is intact (exit 1 if not).
    Verify {
        /// Configuration file (for the store URL).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct TokenArgs {
    /// Subject (`sub`).
    #[arg(long)]
    subject: String,
    /// Tenant claim.
    #[arg(long)]
    tenant: String,
    /// OAuth client id.
    #[arg(long)]
    client: String,
    /// Space-separated scopes.
    #[arg(long, default_value = "")]
    scope: String,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    ttl: u64,
    /// Configuration file (data directory, public URL).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Configuration file (TOML). `PALISADE_*` environment variables override it; flags
    /// override both.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Which application to serve: demo or conformance.
    #[arg(long)]
    app: Option<String>,
    /// Address to listen on (HTTP). Without authentication only loopback addresses are allowed.
    #[arg(long)]
    listen: Option<String>,
    /// Serve newline-delimited JSON on stdin/stdout instead of HTTP.
    #[arg(long)]
    stdio: bool,
    /// Authentication: bearer or none.
    #[arg(long)]
    auth: Option<String>,
    /// Largest request body (HTTP) or line (stdio) in bytes.
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Per-request timeout in seconds (1–600).
    #[arg(long)]
    request_timeout_secs: Option<u64>,
    /// Items per page of every list method.
    #[arg(long)]
    page_size: Option<usize>,
    /// Extra Host header value to accept (repeatable), e.g. `mcp.example.com`.
    #[arg(long = "allow-host")]
    allow_hosts: Vec<String>,
    /// Extra Origin to accept (repeatable), e.g. `https://app.example.com`.
    #[arg(long = "allow-origin")]
    allow_origins: Vec<String>,
    /// Data directory (embedded database, generated keys, server secret).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Store URL: sqlite:<path> or postgres://….
    #[arg(long)]
    store: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs go to stderr, always: on stdio, stdout carries MCP messages only.
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PALISADE_LOG").unwrap_or_else(|_| "info".into()))
        .init();
    palisade_auth::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve(args).await,
            Command::Config { command: ConfigCommand::Check { file } } => config_check(&file),
            Command::Dev { command: DevCommand::Token(args) } => dev_token(args),
            Command::Audit { command: AuditCommand::Verify { config } } => audit_verify(config.as_deref()).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(error) => match error.downcast_ref::<config::ConfigError>() {
            Some(config_error) => {
                eprintln!("error: {config_error}");
                ExitCode::from(2)
            }
            None => {
                eprintln!("error: {error:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

fn settings(config: Option<&Path>, args: Option<&ServeArgs>) -> anyhow::Result<Settings> {
    let mut raw = match config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| config::ConfigError {
                key: "--config".into(),
                reason: format!("cannot read {}: {e}", path.display()),
            })?;
            config::parse(&text)?
        }
        None => config::RawConfig::default(),
    };
    config::apply_env(&mut raw, &env)?;
    if let Some(args) = args {
        raw.app = args.app.clone().or(raw.app);
        raw.listen = args.listen.clone().or(raw.listen);
        raw.auth.mode = args.auth.clone().or(raw.auth.mode);
        raw.limits.max_body_bytes = args.max_body_bytes.or(raw.limits.max_body_bytes);
        raw.limits.request_timeout_secs = args.request_timeout_secs.or(raw.limits.request_timeout_secs);
        raw.limits.page_size = args.page_size.or(raw.limits.page_size);
        raw.http.allowed_hosts.extend(args.allow_hosts.iter().cloned());
        raw.http.allowed_origins.extend(args.allow_origins.iter().cloned());
        raw.data_dir = args.data_dir.clone().or(raw.data_dir);
        raw.store = args.store.clone().or(raw.store);
        if args.stdio && raw.auth.mode.is_none() && env("PALISADE_PRINCIPAL_SUBJECT").is_none() {
            // stdio without a configured principal: the local, unauthenticated mode.
            raw.auth.mode = Some("none".into());
        }
    }
    Ok(config::validate(raw)?)
}

fn config_check(file: &Path) -> anyhow::Result<ExitCode> {
    let settings = settings(Some(file), None)?;
    #[allow(clippy::print_stdout)]
    {
        println!("ok: {settings:#?}");
    }
    Ok(ExitCode::SUCCESS)
}

fn app_name(choice: AppChoice) -> AppName {
    match choice {
        AppChoice::Demo => AppName::Demo,
        AppChoice::Conformance => AppName::Conformance,
    }
}

/// The development issuer's identifier: the server's own origin plus a fixed path.
fn dev_issuer_id(settings: &Settings) -> String {
    let origin = settings.public_url.split("/mcp").next().unwrap_or(&settings.public_url).trim_end_matches('/');
    format!("{origin}/dev-issuer")
}

fn dev_token(args: TokenArgs) -> anyhow::Result<ExitCode> {
    let settings = settings(args.config.as_deref(), None)?;
    if !settings.dev_issuer {
        anyhow::bail!("the development issuer is disabled in this configuration (auth.dev_issuer = false)");
    }
    let issuer = DevIssuer::load_or_create(&settings.data_dir, &dev_issuer_id(&settings))
        .context("loading the dev issuer key")?;
    let scopes: Vec<&str> = args.scope.split_whitespace().collect();
    let token = issuer.mint(&args.subject, &args.tenant, &args.client, &scopes, &settings.public_url, args.ttl)?;
    #[allow(clippy::print_stdout)]
    {
        println!("{token}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn audit_verify(config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let settings = settings(config, None)?;
    prepare_sqlite_dir(&settings)?;
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let report = store.verify_chain().await.context("reading the audit log")?;
    #[allow(clippy::print_stdout)]
    match &report.first_break {
        None => println!("audit log intact: {} records", report.records),
        Some(broken) => println!("audit log BROKEN: {broken:?} ({} records read)", report.records),
    }
    Ok(if report.is_intact() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn prepare_sqlite_dir(settings: &Settings) -> anyhow::Result<()> {
    if let Some(path) = settings.store.strip_prefix("sqlite:") {
        let path = path.trim_start_matches("//");
        if let Some(parent) = Path::new(path).parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
    }
    Ok(())
}

/// Loads the 32-byte server secret (64 hex characters) or creates it, readable by the owner only.
fn load_or_create_secret(path: &Path) -> anyhow::Result<ServerSecret> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let text = text.trim();
            let bytes: Option<Vec<u8>> = (text.len() == 64)
                .then(|| (0..32).map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()).collect())
                .flatten();
            let bytes: [u8; 32] = bytes.and_then(|b| b.try_into().ok()).ok_or_else(|| {
                anyhow::anyhow!("{}: the server secret must be 64 hex characters (32 bytes)", path.display())
            })?;
            Ok(ServerSecret::from_bytes(bytes))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 32];
            palisade_server::secret::fill_random(&mut bytes)
                .map_err(|_| anyhow::anyhow!("the OS random number generator failed"))?;
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            write_private(path, &hex)?;
            Ok(ServerSecret::from_bytes(bytes))
        }
        Err(error) => Err(anyhow::anyhow!("{}: {error}", path.display())),
    }
}

fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path).with_context(|| format!("creating {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

fn bearer_authenticator(settings: &Settings, app: AppName) -> anyhow::Result<Authenticator> {
    let mut issuers: Vec<IssuerConfig> = settings
        .issuers
        .iter()
        .map(|issuer| IssuerConfig {
            issuer: issuer.issuer.clone(),
            jwks: JwksSource::Url(issuer.jwks_url.clone()),
            algorithms: issuer.algorithms.clone(),
        })
        .collect();
    if settings.dev_issuer {
        let dev = DevIssuer::load_or_create(&settings.data_dir, &dev_issuer_id(settings))
            .context("loading the dev issuer key")?;
        issuers.push(dev.issuer_config());
    }
    let url = url::Url::parse(&settings.public_url)?;
    let origin = url.origin().ascii_serialization();
    let metadata_url =
        format!("{origin}{}{}", palisade_auth::PROTECTED_RESOURCE_WELL_KNOWN, url.path().trim_end_matches('/'));
    let mut config = ResourceServerConfig::new(settings.public_url.clone(), metadata_url, issuers);
    config.leeway_secs = settings.leeway_secs;
    config.required_typ = settings.required_typ.clone();
    config.tenant_claim = settings.tenant_claim.clone();
    config.client_claim = settings.client_claim.clone();
    config.cache_capacity = settings.token_cache_capacity;
    config.scopes_supported = app.scopes_supported().iter().map(|s| (*s).to_owned()).collect();
    config.resource_name = Some("Palisade".into());
    let verifier =
        TokenVerifier::new(config).map_err(|e| config::ConfigError { key: "auth".into(), reason: e.to_string() })?;
    Ok(Authenticator::Bearer(Arc::new(verifier)))
}

/// stdio with authentication on: the principal comes from the environment (seed 004).
fn environment_authenticator() -> anyhow::Result<Authenticator> {
    let subject = env("PALISADE_PRINCIPAL_SUBJECT").ok_or_else(|| config::ConfigError {
        key: "PALISADE_PRINCIPAL_SUBJECT".into(),
        reason: "stdio with authentication needs the principal from the environment".into(),
    })?;
    let scopes: BTreeSet<String> =
        env("PALISADE_PRINCIPAL_SCOPES").unwrap_or_default().split_whitespace().map(str::to_owned).collect();
    Ok(Authenticator::Environment(EnvironmentPrincipal {
        subject,
        tenant: env("PALISADE_PRINCIPAL_TENANT"),
        client_id: env("PALISADE_PRINCIPAL_CLIENT"),
        scopes,
    }))
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let settings = settings(args.config.as_deref(), Some(&args))?;
    let app_name = app_name(settings.app);
    let authenticator = match (&settings.auth_mode, args.stdio) {
        (AuthMode::None, _) => {
            eprintln!(
                "WARNING: palisade is running WITHOUT AUTHENTICATION; every caller is trusted. \
                 This mode is restricted to loopback and stdio."
            );
            Authenticator::UnauthenticatedLoopback
        }
        (AuthMode::Bearer, true) => environment_authenticator()?,
        (AuthMode::Bearer, false) => bearer_authenticator(&settings, app_name)?,
    };
    let config = ServerConfig {
        max_body_bytes: settings.max_body_bytes,
        request_timeout: std::time::Duration::from_secs(settings.request_timeout_secs),
        page_size: settings.page_size,
        allowed_hosts: settings.allowed_hosts.clone(),
        allowed_origins: settings.allowed_origins.clone(),
        ..ServerConfig::default()
    };
    prepare_sqlite_dir(&settings)?;
    let secret = load_or_create_secret(&settings.secret_file)?;
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let server = Arc::new(Server::new(app_name.build(), config, authenticator, secret).with_audit(store));
    if args.stdio {
        palisade_server::stdio::serve(server.clone(), tokio::io::stdin(), tokio::io::stdout())
            .await
            .context("stdio transport")?;
        server.flush_audit().await;
        return Ok(ExitCode::SUCCESS);
    }
    let listener = palisade_server::http::bind(&server, settings.listen).await?;
    let local = listener.local_addr()?;
    #[allow(clippy::print_stdout)]
    {
        println!("listening on http://{local}/mcp");
    }
    palisade_server::http::serve(server.clone(), listener, shutdown_signal()).await?;
    server.flush_audit().await;
    Ok(ExitCode::SUCCESS)
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
