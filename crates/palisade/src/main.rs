//! The `palisade` command: a thin shell over the libraries. It reads configuration, builds the
//! chosen application, store and authenticator, and runs a transport; every request decision
//! lives in `palisade_server`.

// mimalloc instead of the system allocator: the request path allocates and frees many small
// objects across threads (BENCHMARKS.md, "Checkpoints off the append path ...").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod answer_relay;
mod config;
mod events_bridge;
mod gateway_cli;
mod killswitch_cli;
mod telemetry;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use palisade_apps::AppName;
use palisade_auth::dev_issuer::DevIssuer;
use palisade_auth::{IssuerConfig, JwksSource, ResourceServerConfig, TokenVerifier};
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_server::auth::{Authenticator, EnvironmentPrincipal};
use palisade_server::secret::ServerSecret;
use palisade_server::{HandleService, Server, ServerConfig, SubjectKey, TaskConfig, TaskService};
use palisade_store::{AuditRecord, Decision, Revocation, RevokeSelector};

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
    /// Serve the gateway in front of the configuration's `[[upstreams]]` (`serve` with
    /// `app = "gateway"`), or report on its upstreams.
    Gateway(GatewayArgs),
    /// Review the gateway's pinned upstream definitions.
    Pins {
        #[command(subcommand)]
        command: gateway_cli::PinsCommand,
    },
    /// Review the launch of the gateway's local stdio upstreams (what runs, exactly).
    Upstreams {
        #[command(subcommand)]
        command: gateway_cli::UpstreamsCommand,
    },
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
    /// Explicit application handles: list a subject's (digests only) and revoke.
    Handles {
        #[command(subcommand)]
        command: HandlesCommand,
    },
    /// Delegation capabilities (the ledger): list them, revoke one and everything under it.
    Delegation {
        #[command(subcommand)]
        command: DelegationCommand,
    },
    /// The gateway's per-user upstream connections (`user_oauth`): list them (never a token),
    /// remove one person's.
    Connections {
        #[command(subcommand)]
        command: ConnectionsCommand,
    },
    /// Kill-switch keys.
    Keys {
        #[command(subcommand)]
        command: killswitch_cli::KeysCommand,
    },
    /// The kill switch's signed operation registry.
    Policy {
        #[command(subcommand)]
        command: killswitch_cli::PolicyCommand,
    },
    /// The reference disable authority: serve it, or switch targets off and on.
    Authority {
        #[command(subcommand)]
        command: killswitch_cli::AuthorityCommand,
    },
    /// Verify any MCP server adversarially with two or more identities (a client only).
    Verify(palisade_verify::VerifyArgs),
}

#[derive(Subcommand)]
enum DelegationCommand {
    /// List capabilities, newest first: ids (SHA-256 of the reference), parent, depth, agent,
    /// budget and state — never a reference.
    List {
        /// Only capabilities held by this agent (its token's subject).
        #[arg(long)]
        agent: Option<String>,
        /// Most rows to read.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Configuration file (store URL).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Revoke one capability by id; everything minted under it is refused from its next request
    /// on. Recorded in the audit log with the reason.
    Revoke {
        /// The capability id `delegation list` shows (64 hex characters).
        #[arg(long)]
        id: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// Configuration file (store URL).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum ConnectionsCommand {
    /// List connections, newest first: person, upstream, authorization server, Palisade's client
    /// id there, scopes and times — never a token.
    List {
        /// Only this person's (their token's subject).
        #[arg(long)]
        subject: Option<String>,
        /// Configuration file (store URL).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Remove a person's connection to one upstream (or to every upstream): their stored tokens
    /// are deleted and their next call asks them to connect again. Recorded in the audit log.
    Revoke {
        /// The person's subject.
        #[arg(long)]
        subject: String,
        /// The person's issuer (required when more than one issuer's people are connected).
        #[arg(long)]
        issuer: Option<String>,
        /// Only this upstream's connection.
        #[arg(long)]
        upstream: Option<String>,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// Configuration file (store URL).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum HandlesCommand {
    /// List a subject's handles, newest first: digests and bindings, never the handles.
    List {
        /// The subject (`sub`).
        #[arg(long)]
        subject: String,
        /// The issuer (`iss`). Default: the dev issuer.
        #[arg(long)]
        issuer: Option<String>,
        /// Most rows to show.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Configuration file (store URL, subject key).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Revoke handles: one by digest, or in bulk. A revocation that would end more than one
    /// handle is refused (it says how many) unless `--all` is given. Recorded in the audit log
    /// with the receipt.
    Revoke(RevokeArgs),
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("selector").required(true).multiple(false)
    .args(["digest", "subject", "tenant", "client", "object", "policy_below"])))]
struct RevokeArgs {
    /// One handle, by the full SHA-256 hex digest `handles list` shows.
    #[arg(long)]
    digest: Option<String>,
    /// Every handle of a subject (with --issuer; default the dev issuer).
    #[arg(long)]
    subject: Option<String>,
    /// The subject's issuer.
    #[arg(long, requires = "subject")]
    issuer: Option<String>,
    /// Every handle in a tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// Every handle of an OAuth client.
    #[arg(long)]
    client: Option<String>,
    /// Every handle on one object (deleted): TENANT TYPE REF.
    #[arg(long, num_args = 3, value_names = ["TENANT", "TYPE", "REF"])]
    object: Option<Vec<String>>,
    /// Every handle of an object type minted under a policy version below N: TYPE N.
    #[arg(long, num_args = 2, value_names = ["TYPE", "N"])]
    policy_below: Option<Vec<String>>,
    /// Why (recorded with each handle).
    #[arg(long)]
    reason: String,
    /// The operator's receipt id for this revocation (recorded with each handle).
    #[arg(long)]
    receipt: String,
    /// Revoke every handle the selector covers, however many. Without it, a selector covering
    /// more than one live handle revokes nothing and says how many it covers.
    #[arg(long)]
    all: bool,
    /// Configuration file (store URL, subject key).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate FILE (with the environment applied) and print the effective settings.
    Check { file: PathBuf },
    /// List every option: file key, environment variable, flag, default (Markdown).
    Options,
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
    /// Read this instance's audit segment and show where a chain is damaged (exit 1 if one is);
    /// with `--apply`, keep the records after the damage in a new chain that begins with a
    /// record of the break, and move the damaged file aside, so the server starts again.
    Salvage {
        /// Configuration file (for the segment directory and the store URL).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Do it (without: only report).
        #[arg(long)]
        apply: bool,
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
    /// Configuration file, as given to `serve`: the token is minted for the server that file,
    /// the environment and the flags below configure (its `public_url`, or `http://<listen>/mcp`,
    /// is the audience; the issuer key is in its data directory).
    #[arg(long)]
    config: Option<PathBuf>,
    /// `serve`'s configuration flags, resolved exactly as `serve` resolves them.
    #[command(flatten)]
    flags: config::ConfigFlags,
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct GatewayArgs {
    #[command(subcommand)]
    command: Option<GatewayCommand>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum GatewayCommand {
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
        flags: config::ConfigFlags,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Configuration file (TOML). `PALISADE_*` environment variables override it; flags
    /// override both.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Serve newline-delimited JSON on stdin/stdout instead of HTTP.
    #[arg(long)]
    stdio: bool,
    /// The configuration flags (`palisade config options` lists every option).
    #[command(flatten)]
    flags: config::ConfigFlags,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    palisade_auth::install_crypto_provider();
    // `serve` reads its settings before logging starts: trace export, when configured, is a
    // layer of the subscriber. Its exporter is built outside the runtime (it runs on a thread
    // of its own).
    let serve_settings = match &cli.command {
        Command::Serve(args) => match settings(args.config.as_deref(), Some(args)) {
            Ok(settings) => Some(settings),
            Err(error) => return exit_code(&error),
        },
        Command::Gateway(GatewayArgs { command: None, serve: args }) => {
            match resolve(args.config.as_deref(), &args.flags, args.stdio, Some("gateway")) {
                Ok(settings) => Some(settings),
                Err(error) => return exit_code(&error),
            }
        }
        _ => None,
    };
    let telemetry = match serve_settings.as_ref().and_then(|settings| settings.telemetry.as_ref()) {
        Some(settings) => match telemetry::Telemetry::start(settings) {
            Ok(telemetry) => Some(telemetry),
            Err(error) => return exit_code(&error),
        },
        None => None,
    };
    // Logs go to stderr, always: on stdio, stdout carries MCP messages only.
    telemetry::init(telemetry.as_ref());
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
                Some(settings) => serve(args, settings).await,
                None => Err(anyhow::anyhow!("serve without settings")),
            },
            Command::Gateway(GatewayArgs { command: Some(GatewayCommand::Status { config, flags }), .. }) => {
                gateway_cli::status(&config, &flags).await
            }
            Command::Pins { command } => gateway_cli::pins(command).await,
            Command::Upstreams { command } => gateway_cli::upstreams(command).await,
            Command::Config { command: ConfigCommand::Check { file } } => config_check(&file),
            Command::Config { command: ConfigCommand::Options } => config_options(),
            Command::Dev { command: DevCommand::Token(args) } => dev_token(args),
            Command::Audit { command: AuditCommand::Verify { config } } => audit_verify(config.as_deref()).await,
            Command::Audit { command: AuditCommand::Salvage { config, apply } } => {
                audit_salvage(config.as_deref(), apply).await
            }
            Command::Handles { command: HandlesCommand::List { subject, issuer, limit, config } } => {
                handles_list(config.as_deref(), issuer, &subject, limit).await
            }
            Command::Handles { command: HandlesCommand::Revoke(args) } => handles_revoke(args).await,
            Command::Delegation { command: DelegationCommand::List { agent, limit, config } } => {
                delegation_list(config.as_deref(), agent.as_deref(), limit).await
            }
            Command::Delegation { command: DelegationCommand::Revoke { id, reason, config } } => {
                delegation_revoke(config.as_deref(), &id, &reason).await
            }
            Command::Connections { command: ConnectionsCommand::List { subject, config } } => {
                connections_list(config.as_deref(), subject.as_deref()).await
            }
            Command::Connections {
                command: ConnectionsCommand::Revoke { subject, issuer, upstream, reason, config },
            } => connections_revoke(config.as_deref(), &subject, issuer.as_deref(), upstream.as_deref(), &reason).await,
            Command::Keys { command } => killswitch_cli::keys(command),
            Command::Policy { command } => killswitch_cli::policy(command).await,
            Command::Authority { command } => killswitch_cli::authority(command).await,
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
    match error.downcast_ref::<config::ConfigError>() {
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

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// The settings of a command: file, then environment, then `serve`'s flags when given.
fn settings(config: Option<&Path>, args: Option<&ServeArgs>) -> anyhow::Result<Settings> {
    match args {
        Some(args) => resolve(config, &args.flags, args.stdio, None),
        None => resolve(config, &config::ConfigFlags::default(), false, None),
    }
}

/// The settings of a command about one application (`policy init --app`, `pins`, `gateway`),
/// whatever the file's `app` says.
fn settings_for_app(config: Option<&Path>, app: Option<&str>) -> anyhow::Result<Settings> {
    resolve(config, &config::ConfigFlags::default(), false, app)
}

/// The settings `palisade gateway --config FILE FLAGS` runs with (`gateway status`).
fn gateway_settings(config: &Path, flags: &config::ConfigFlags) -> anyhow::Result<Settings> {
    resolve(Some(config), flags, false, Some("gateway"))
}

/// The one resolution of settings, for `serve` and every command that must agree with it
/// (`dev token`): the file, then `PALISADE_*` variables, then the configuration flags, then
/// (for `serve --stdio` without a configured principal or mode) unauthenticated local mode.
fn resolve(
    config: Option<&Path>,
    flags: &config::ConfigFlags,
    stdio: bool,
    app: Option<&str>,
) -> anyhow::Result<Settings> {
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
    flags.apply(&mut raw)?;
    if let Some(app) = app {
        raw.app = Some(app.to_owned());
    }
    if stdio && raw.auth.mode.is_none() && env("PALISADE_PRINCIPAL_SUBJECT").is_none() {
        // stdio without a configured principal: the local, unauthenticated mode.
        raw.auth.mode = Some("none".into());
    }
    let mut settings = config::validate(raw)?;
    settings.protect_from_stdio_upstreams(config);
    Ok(settings)
}

fn config_options() -> anyhow::Result<ExitCode> {
    #[allow(clippy::print_stdout)]
    {
        print!("{}", config::options_markdown());
    }
    Ok(ExitCode::SUCCESS)
}

fn config_check(file: &Path) -> anyhow::Result<ExitCode> {
    let settings = settings(Some(file), None)?;
    #[allow(clippy::print_stdout)]
    {
        print!("{}", settings.summary());
        println!("ok");
    }
    Ok(ExitCode::SUCCESS)
}

/// The built-in application a choice names (`None`: the gateway, whose registry comes from
/// its upstreams).
fn app_name(choice: AppChoice) -> Option<AppName> {
    match choice {
        AppChoice::Demo => Some(AppName::Demo),
        AppChoice::Conformance => Some(AppName::Conformance),
        AppChoice::Gateway => None,
    }
}

/// The scopes the server names in its metadata: the application's, or every scope the gateway's
/// upstreams are configured to require.
fn scopes_supported(settings: &Settings) -> Vec<String> {
    match (app_name(settings.app), &settings.gateway) {
        (Some(app), _) => app.scopes_supported().iter().map(|s| (*s).to_owned()).collect(),
        (None, Some(gateway)) => {
            let scopes: BTreeSet<&String> = gateway
                .upstreams
                .iter()
                .flat_map(|upstream| upstream.scopes.iter().chain(upstream.tool_scopes.values().flatten()))
                .collect();
            scopes.into_iter().cloned().collect()
        }
        (None, None) => Vec::new(),
    }
}

/// The development issuer's identifier: the server's own origin plus a fixed path.
fn dev_issuer_id(settings: &Settings) -> String {
    let origin = settings.public_url.split("/mcp").next().unwrap_or(&settings.public_url).trim_end_matches('/');
    format!("{origin}/dev-issuer")
}

fn dev_token(args: TokenArgs) -> anyhow::Result<ExitCode> {
    // The settings `serve` resolves from the same file, environment and flags, so that the
    // token's issuer and audience are that server's.
    let settings = resolve(args.config.as_deref(), &args.flags, false, None)?;
    if !settings.dev_issuer {
        anyhow::bail!("the development issuer is disabled in this configuration (auth.dev_issuer = false)");
    }
    // Only the key the server created: a new key here would sign tokens no server accepts.
    let issuer = DevIssuer::load_existing(&settings.data_dir, &dev_issuer_id(&settings))
        .context("loading the dev issuer key")?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no development issuer key in the data directory {}: `palisade serve` creates it on its first \
                 start; start the server first, and pass the --config (or --data-dir) the server runs with",
                std::path::absolute(&settings.data_dir).unwrap_or_else(|_| settings.data_dir.clone()).display()
            )
        })?;
    let scopes: Vec<&str> = args.scope.split_whitespace().collect();
    let token = issuer.mint(&args.subject, &args.tenant, &args.client, &scopes, &settings.public_url, args.ttl)?;
    #[allow(clippy::print_stdout)]
    {
        println!("{token}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `palisade audit verify`: exit 0 when the log is intact, 1 when it was read and is not intact,
/// 2 when it could not be read at all (no server secret, a store that does not open or answer):
/// a script must not take "could not look" for "tampered with", nor the other way round.
async fn audit_verify(config: Option<&Path>) -> anyhow::Result<ExitCode> {
    match audit_verify_report(config).await {
        Ok(code) => Ok(code),
        Err(error) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: the audit log could not be read, so it was not verified: {error:#}");
            }
            Ok(ExitCode::from(2))
        }
    }
}

async fn audit_verify_report(config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let settings = settings(config, None)?;
    prepare_sqlite_dir(&settings)?;
    // The checkpoint key is derived from the deployment's server secret; verifying never creates
    // one (a new secret would only make every checkpoint look forged).
    let text = std::fs::read_to_string(&settings.secret_file).with_context(|| {
        format!(
            "reading the server secret {} (checkpoints are verified with the key derived from it)",
            settings.secret_file.display()
        )
    })?;
    let secret = ServerSecret::from_bytes(parse_key_hex(&text).ok_or_else(|| {
        anyhow::anyhow!("{}: the server secret must be 64 hex characters (32 bytes)", settings.secret_file.display())
    })?);
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let key = secret.audit_checkpoint_key().verifying();
    let report = match palisade_store::verify_log(store.as_ref(), &key).await {
        Ok(report) => report,
        // A record that was read but does not decode is damage, not a failure to read.
        Err(error @ palisade_store::StoreError::Corrupt { .. }) => {
            #[allow(clippy::print_stdout)]
            {
                println!("audit log BROKEN: {error}");
            }
            return Ok(ExitCode::FAILURE);
        }
        Err(error) => return Err(anyhow::Error::new(error).context("reading the audit log")),
    };
    let chains = &report.chains;
    let checkpoints = match &report.last {
        Some(last) => format!(
            "{} checkpoints, the last #{} signed {} covering {} records (body SHA-256 {})",
            report.checkpoints,
            last.seq,
            palisade_base::time::format_rfc3339_ms(i64::try_from(last.at_ms).unwrap_or(i64::MAX)),
            last.records,
            last.hash
        ),
        None => "no checkpoint yet".to_owned(),
    };
    #[allow(clippy::print_stdout)]
    {
        if let Some(broken) = &report.checkpoint_break {
            println!("audit checkpoints BROKEN at checkpoint #{}: {}", broken.seq, broken.reason);
        }
        match &chains.first_break {
            Some(broken) => println!("audit log BROKEN: {broken} ({} records read)", chains.records),
            None if report.is_intact() => {
                println!("audit log intact: {} records in {} chains; {checkpoints}", chains.records, chains.chains)
            }
            None => println!(
                "audit chains walk clean: {} records in {} chains; {checkpoints}",
                chains.records, chains.chains
            ),
        }
    }
    Ok(if report.is_intact() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn audit_salvage(config: Option<&Path>, apply: bool) -> anyhow::Result<ExitCode> {
    let settings = settings(config, None)?;
    prepare_sqlite_dir(&settings)?;
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let segment = palisade_store::segment::SegmentConfig::new(&settings.audit_segment_dir);
    let report = palisade_store::segment::salvage(&segment, store.as_ref(), apply, SystemClock.now_unsigned_ms())
        .await
        .with_context(|| format!("salvaging the audit segment {}", settings.audit_segment_dir.display()))?;
    let mut damaged = false;
    #[allow(clippy::print_stdout)]
    {
        if report.is_empty() {
            println!("audit segment {}: no chain", settings.audit_segment_dir.display());
        }
        for chain in &report {
            if chain.held {
                println!("chain {}: held by a running process; left alone", chain.chain);
                continue;
            }
            let Some(damage) = &chain.damage else {
                let tail = if chain.torn_tail_bytes > 0 {
                    format!(
                        "; a torn tail of {} bytes (nothing valid after it) is cut at the next start",
                        chain.torn_tail_bytes
                    )
                } else {
                    String::new()
                };
                println!("chain {}: intact, {} records{tail}", chain.chain, chain.records);
                continue;
            };
            damaged = true;
            let following = match damage.following_seqs {
                Some((first, last)) => {
                    format!("{} valid records follow it (seq {first} to {last} as written)", damage.following)
                }
                None => "no valid record follows it".to_owned(),
            };
            println!(
                "chain {}: DAMAGED: file {} at offset {} ({}); {} records before it are intact; {following}; {} unreadable bytes; {} newer files",
                chain.chain,
                damage.path.display(),
                damage.offset,
                damage.reason,
                damage.records_before,
                damage.unreadable_bytes,
                damage.later_files.len()
            );
            match &chain.applied {
                Some(salvaged) => {
                    println!(
                        "  salvaged: {} records re-chained into the new chain {} after a record of this salvage (audit.salvage); {} held by the store already",
                        salvaged.rechained, salvaged.chain, salvaged.in_store
                    );
                    for path in &salvaged.aside {
                        println!("  kept aside: {}", path.display());
                    }
                }
                None => println!("  run `palisade audit salvage --apply` to keep these records and start again"),
            }
        }
        if apply && damaged {
            println!("salvaged; the server starts again");
        }
    }
    Ok(if damaged && !apply { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// The handle subject key: `PALISADE_HANDLES_SUBJECT_KEY` (64 hex characters) or the key file
/// (created on first run). Either must hold exactly 32 bytes, or the process does not start.
fn handle_subject_key(settings: &Settings) -> anyhow::Result<SubjectKey> {
    SubjectKey::from_bytes(&subject_key_bytes(settings)?).map_err(anyhow::Error::msg)
}

fn subject_key_bytes(settings: &Settings) -> anyhow::Result<[u8; 32]> {
    let variable = config::HANDLES_SUBJECT_KEY.env.unwrap_or("PALISADE_HANDLES_SUBJECT_KEY");
    let bytes = match env(variable) {
        Some(text) => {
            parse_key_hex(&text).ok_or_else(|| anyhow::anyhow!("{variable} must be 64 hex characters (32 bytes)"))?
        }
        None => load_or_create_key(&settings.handle_subject_key_file, "the handle subject key")?,
    };
    Ok(bytes)
}

async fn handles_list(
    config: Option<&Path>,
    issuer: Option<String>,
    subject: &str,
    limit: u32,
) -> anyhow::Result<ExitCode> {
    let settings = settings(config, None)?;
    prepare_sqlite_dir(&settings)?;
    let key = handle_subject_key(&settings)?;
    let issuer = issuer.unwrap_or_else(|| dev_issuer_id(&settings));
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let rows = store.list_handles(key.subject_digest(&issuer, subject), limit).await.context("listing handles")?;
    #[allow(clippy::print_stdout)]
    for row in rows {
        let digest: String = palisade_base::hex::hex(&row.digest);
        let time = palisade_base::time::format_rfc3339_ms;
        let state = match (&row.revoked_ms, &row.revocation_reason) {
            (Some(at), reason) => format!("revoked at {} ({})", time(*at), reason.as_deref().unwrap_or("")),
            (None, _) => format!("expires at {}", time(row.expires_ms)),
        };
        println!(
            "{digest} tenant={} client={} {}:{} policy={} created={} {state}",
            row.tenant,
            row.client,
            row.object_type,
            row.object_ref,
            row.policy_version,
            time(row.created_ms)
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn handles_revoke(args: RevokeArgs) -> anyhow::Result<ExitCode> {
    let settings = settings(args.config.as_deref(), None)?;
    prepare_sqlite_dir(&settings)?;
    let key = handle_subject_key(&settings)?;
    let selector = if let Some(digest) = &args.digest {
        let bytes = parse_key_hex(digest).ok_or_else(|| config::ConfigError {
            key: "--digest".into(),
            reason: "must be the 64-hex-character SHA-256 digest `handles list` shows".into(),
        })?;
        RevokeSelector::Digest(bytes)
    } else if let Some(subject) = &args.subject {
        let issuer = args.issuer.clone().unwrap_or_else(|| dev_issuer_id(&settings));
        RevokeSelector::Subject(key.subject_digest(&issuer, subject))
    } else if let Some(tenant) = &args.tenant {
        RevokeSelector::Tenant(tenant.clone())
    } else if let Some(client) = &args.client {
        RevokeSelector::Client(client.clone())
    } else if let Some([tenant, object_type, object_ref]) = args.object.as_deref() {
        RevokeSelector::Object {
            tenant: tenant.clone(),
            object_type: object_type.clone(),
            object_ref: object_ref.clone(),
        }
    } else if let Some([object_type, below]) = args.policy_below.as_deref() {
        let below = below.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| config::ConfigError {
            key: "--policy-below".into(),
            reason: "the version must be a positive integer".into(),
        })?;
        RevokeSelector::PolicyBelow { object_type: object_type.clone(), below }
    } else {
        anyhow::bail!("name which handles to revoke");
    };
    let what = selector_kind(&selector);
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let covered = store.count_handles(selector.clone()).await.context("counting the handles to revoke")?;
    if covered > 1 && !args.all {
        let pick = match &args.subject {
            Some(subject) => format!("`palisade handles list --subject {subject}` shows their digests"),
            None => "`palisade handles list --subject SUBJECT` shows a subject's digests".to_owned(),
        };
        anyhow::bail!(
            "{covered} live handles match this {what} selector; nothing was revoked: pass --all to \
             revoke all {covered}, or revoke one with --digest ({pick})"
        );
    }
    let now = SystemClock.now_ms();
    let revocation = Revocation { reason: args.reason.clone(), receipt: Some(args.receipt.clone()), at_ms: now };
    let count = store.revoke_handles(selector, revocation).await.context("revoking handles")?;
    let detail = format!("selector={what} revoked={count} receipt={}", args.receipt);
    record_operator_action(store.as_ref(), now, "handles/revoke", detail).await?;
    #[allow(clippy::print_stdout)]
    {
        println!("revoked {count} handle(s) (receipt {})", args.receipt);
    }
    Ok(ExitCode::SUCCESS)
}

async fn delegation_list(config: Option<&Path>, agent: Option<&str>, limit: u32) -> anyhow::Result<ExitCode> {
    let settings = settings(config, None)?;
    prepare_sqlite_dir(&settings)?;
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let rows = store.delegations(None, limit).await.context("listing capabilities")?;
    let hex = |digest: &[u8; 32]| palisade_base::hex::hex(digest);
    #[allow(clippy::print_stdout)]
    for row in rows.iter().filter(|row| agent.is_none_or(|agent| row.agent == agent)) {
        let parent = row.parent.as_ref().map_or_else(|| "-".to_owned(), hex);
        let state = match row.revoked_ms {
            Some(at) => format!("revoked at {at}"),
            None => format!("expires at {}", row.expires_ms),
        };
        println!(
            "{} parent={parent} depth={} agent={} calls={}/{} created={} {state}",
            hex(&row.digest),
            row.depth,
            row.agent,
            row.remaining,
            row.calls,
            row.created_ms
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn delegation_revoke(config: Option<&Path>, id: &str, reason: &str) -> anyhow::Result<ExitCode> {
    let settings = settings(config, None)?;
    prepare_sqlite_dir(&settings)?;
    let digest = parse_key_hex(id).ok_or_else(|| config::ConfigError {
        key: "--id".into(),
        reason: "must be the 64-hex-character capability id `delegation list` shows".into(),
    })?;
    if reason.is_empty() || reason.len() > 200 || reason.chars().any(char::is_control) {
        anyhow::bail!("--reason must be 1..=200 characters without control characters");
    }
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let now = SystemClock.now_ms();
    let revoked = store.revoke_delegation(digest, now).await.context("revoking the capability")?;
    let detail = format!("delegation={} revoked={revoked} reason={reason}", palisade_store::hex_prefix(&digest));
    record_operator_action(store.as_ref(), now, "delegation/revoke", detail).await?;
    #[allow(clippy::print_stdout)]
    {
        if revoked {
            println!("revoked {id} and everything delegated under it");
        } else {
            println!("nothing revoked: {id} is unknown or was revoked already");
        }
    }
    Ok(if revoked { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The person a stored connection's label names (`{"issuer","subject","tenant"}`).
fn connection_person(row: &palisade_store::ConnectionRow) -> Option<palisade_gateway::user_oauth::Person> {
    serde_json::from_str(&row.principal).ok()
}

async fn connections_list(config: Option<&Path>, subject: Option<&str>) -> anyhow::Result<ExitCode> {
    let settings = settings(config, None)?;
    prepare_sqlite_dir(&settings)?;
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let rows = store
        .connections(None, palisade_gateway::user_oauth::MAX_CONNECTIONS_LISTED)
        .await
        .context("listing connections")?;
    #[allow(clippy::print_stdout)]
    for row in &rows {
        let Some(person) = connection_person(row) else { continue };
        if subject.is_some_and(|subject| person.subject != subject) {
            continue;
        }
        println!(
            "subject={} issuer={} tenant={} upstream={} authorization_server={} client_id={} scopes={:?} created={} updated={}",
            person.subject,
            person.issuer,
            person.tenant.as_deref().unwrap_or("-"),
            row.upstream,
            row.issuer,
            row.client_id,
            row.scopes,
            row.created_ms,
            row.updated_ms
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn connections_revoke(
    config: Option<&Path>,
    subject: &str,
    issuer: Option<&str>,
    upstream: Option<&str>,
    reason: &str,
) -> anyhow::Result<ExitCode> {
    let settings = settings(config, None)?;
    prepare_sqlite_dir(&settings)?;
    if reason.is_empty() || reason.len() > 200 || reason.chars().any(char::is_control) {
        anyhow::bail!("--reason must be 1..=200 characters without control characters");
    }
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let rows = store
        .connections(None, palisade_gateway::user_oauth::MAX_CONNECTIONS_LISTED)
        .await
        .context("listing connections")?;
    let chosen: Vec<_> = rows
        .iter()
        .filter(|row| {
            connection_person(row)
                .is_some_and(|person| person.subject == subject && issuer.is_none_or(|issuer| person.issuer == issuer))
                && upstream.is_none_or(|upstream| row.upstream == upstream)
        })
        .collect();
    let issuers: std::collections::BTreeSet<String> =
        chosen.iter().filter_map(|row| connection_person(row)).map(|person| person.issuer).collect();
    if issuers.len() > 1 {
        anyhow::bail!("people of {} issuers have the subject {subject:?}: name one with --issuer", issuers.len());
    }
    let now = SystemClock.now_ms();
    let mut removed = 0u64;
    for row in chosen {
        if store.delete_connection(row.principal_key, &row.upstream).await.context("removing a connection")? {
            removed += 1;
        }
    }
    let detail = format!("subject={subject} upstream={} removed={removed} reason={reason}", upstream.unwrap_or("*"));
    record_operator_action(store.as_ref(), now, "connections/revoke", detail).await?;
    #[allow(clippy::print_stdout)]
    {
        println!("removed {removed} connection(s)");
    }
    Ok(if removed > 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Records an operator command in the audit log (stage `operator`, allow), on the store
/// handle's own chain.
async fn record_operator_action(
    store: &dyn palisade_store::Store,
    now: i64,
    operation: &str,
    detail: String,
) -> anyhow::Result<()> {
    let record = AuditRecord {
        at_ms: SystemClock.now_unsigned_ms(),
        trace_id: format!("operator-{now}"),
        stage: "operator".into(),
        decision: Decision::Allow,
        operation: operation.into(),
        principal_digest: None,
        tenant_digest: None,
        client_digest: None,
        scopes: Vec::new(),
        policy_version: None,
        code: None,
        detail: Some(detail),
    };
    store.append_batch(vec![record]).await.context("recording the operator's command in the audit log")
}

/// The kind of a revocation selector, for the audit record (no identifiers).
fn selector_kind(selector: &RevokeSelector) -> &'static str {
    match selector {
        RevokeSelector::Digest(_) | RevokeSelector::Owned { .. } => "digest",
        RevokeSelector::Subject(_) | RevokeSelector::SubjectInTenant { .. } => "subject",
        RevokeSelector::Tenant(_) => "tenant",
        RevokeSelector::Client(_) => "client",
        RevokeSelector::Object { .. } => "object",
        RevokeSelector::PolicyBelow { .. } => "policy",
    }
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

/// 64 hex characters (either case, surrounding white space ignored) as 32 bytes.
fn parse_key_hex(text: &str) -> Option<[u8; 32]> {
    palisade_base::hex::decode32(&text.trim().to_ascii_lowercase())
}

/// Loads a 32-byte key (64 hex characters) or creates it, readable by the owner only.
fn load_or_create_key(path: &Path, what: &str) -> anyhow::Result<[u8; 32]> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_key_hex(&text)
            .ok_or_else(|| anyhow::anyhow!("{}: {what} must be 64 hex characters (32 bytes)", path.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 32];
            palisade_server::secret::fill_random(&mut bytes)
                .map_err(|_| anyhow::anyhow!("the OS random number generator failed"))?;
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            let hex: String = palisade_base::hex::hex(&bytes);
            write_private(path, &hex)?;
            Ok(bytes)
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

fn bearer_authenticator(settings: &Settings) -> anyhow::Result<Authenticator> {
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
    config.jwks_allow_loopback = settings.jwks_allow_loopback;
    config.jwks_allowed_networks = settings.jwks_allowed_networks.clone();
    config.jwks_proxy = settings.jwks_proxy.clone();
    config.scopes_supported = scopes_supported(settings);
    config.resource_name = Some("Palisade".into());
    let verifier =
        TokenVerifier::new(config).map_err(|e| config::ConfigError { key: "auth".into(), reason: e.to_string() })?;
    Ok(Authenticator::Bearer(Arc::new(verifier)))
}

/// The development issuer's authorization server, when the dev issuer is on and `serve` runs
/// over HTTP with bearer authentication. Announced on stderr: it is for development only.
fn dev_authorization_server(
    settings: &Settings,
    authenticator: &Authenticator,
    stdio: bool,
) -> anyhow::Result<Option<Arc<palisade_auth::authorization_server::DevAuthorizationServer>>> {
    use palisade_auth::authorization_server::{DevAuthorizationServer, DevAuthorizationSettings};
    if !settings.dev_issuer || stdio || authenticator.verifier().is_none() {
        return Ok(None);
    }
    let issuer = DevIssuer::load_or_create(&settings.data_dir, &dev_issuer_id(settings))
        .context("loading the dev issuer key")?;
    let scopes = scopes_supported(settings);
    let mut as_settings = DevAuthorizationSettings::new(settings.public_url.clone(), scopes);
    let dev = &settings.dev_authorization;
    as_settings.auto_approve = dev.auto_approve;
    as_settings.default_subject = dev.default_subject.clone();
    as_settings.default_tenant = dev.default_tenant.clone();
    as_settings.access_token_ttl_secs = dev.access_token_ttl_secs;
    as_settings.client_metadata_egress.allow_loopback = dev.client_metadata_allow_loopback;
    if let Some(path) = &dev.client_metadata_ca_file {
        let pem = std::fs::read(path).map_err(|e| config::ConfigError {
            key: "auth.dev_issuer.client_metadata_ca_file".into(),
            reason: format!("{}: {e}", path.display()),
        })?;
        as_settings.client_metadata_egress.extra_roots_pem = Some(pem);
    }
    let server = DevAuthorizationServer::new(issuer, as_settings)
        .map_err(|e| config::ConfigError { key: "auth.dev_issuer".into(), reason: e.to_string() })?;
    eprintln!(
        "WARNING: the DEVELOPMENT authorization server is on at {} (auth.dev_issuer): whoever reaches its \
         page can authorize as any subject. For local development only{}.",
        server.issuer(),
        if dev.auto_approve { "; auto_approve: every request is approved without a page" } else { "" }
    );
    Ok(Some(Arc::new(server)))
}

/// The deployment's server secret (`secret_file`, created on first use).
fn server_secret(settings: &Settings) -> anyhow::Result<ServerSecret> {
    Ok(ServerSecret::from_bytes(load_or_create_key(&settings.secret_file, "the server secret")?))
}

/// Builds the gateway and its first registry: every upstream listed once (one that fails is
/// reported and retried by the gateway's loops; it never stops the others or the start).
async fn start_gateway(
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
    let gateway = palisade_gateway::Gateway::with_user_oauth(
        settings.clone(),
        store.clone(),
        Arc::new(SystemClock),
        coverage,
        oauth,
    )
    .context("starting the gateway")?;
    gateway.refresh_all().await;
    let app = gateway.build_app().await.context("building the gateway's registry")?;
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

async fn serve(args: ServeArgs, settings: Settings) -> anyhow::Result<ExitCode> {
    if args.stdio && settings.metrics_listen.is_some() {
        let reason = "is a second HTTP listener; it cannot be used with --stdio".into();
        return Err(config::ConfigError { key: config::METRICS_LISTEN.key.into(), reason }.into());
    }
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
        (AuthMode::Bearer, false) => bearer_authenticator(&settings)?,
    };
    let config = ServerConfig {
        max_body_bytes: settings.max_body_bytes,
        request_timeout: std::time::Duration::from_secs(settings.request_timeout_secs),
        header_read_timeout: std::time::Duration::from_secs(settings.header_read_timeout_secs),
        body_read_timeout: std::time::Duration::from_secs(settings.body_read_timeout_secs),
        idle_timeout: std::time::Duration::from_secs(settings.idle_timeout_secs),
        max_connections: settings.max_connections,
        max_streams_per_principal: settings.max_streams_per_principal,
        max_listen_filter_entries: settings.max_listen_filter_entries,
        transport_refusal_interval: std::time::Duration::from_secs(settings.transport_refusal_interval_secs),
        page_size: settings.page_size,
        allowed_hosts: settings.allowed_hosts.clone(),
        allowed_origins: settings.allowed_origins.clone(),
        legacy: settings.legacy.clone(),
        continue_traces: settings.telemetry.as_ref().is_none_or(|telemetry| telemetry.continue_incoming_traces),
        authorization_server: dev_authorization_server(&settings, &authenticator, args.stdio)?,
        ..ServerConfig::default()
    };
    prepare_sqlite_dir(&settings)?;
    let secret = server_secret(&settings)?;
    if settings.gateway.is_some() {
        // Its operator's commands look stdio commands up where this process does.
        gateway_cli::record_search_path(&settings)?;
    }
    let subject_key = subject_key_bytes(&settings)?;
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let (audit_writer, checkpointer) = start_audit(&settings, &store, &secret).await?;
    if settings.delegation.is_some() && settings.gateway.is_some() {
        anyhow::bail!("delegation.enabled is not offered by the gateway yet: it serves the upstreams' tools only");
    }
    let delegation = settings.delegation.clone().map(|config| {
        Arc::new(palisade_server::delegation::DelegationService::new(
            store.clone(),
            &secret,
            config,
            Arc::new(SystemClock),
        ))
    });
    // The gateway lists its upstreams (and pins what they list) before the kill switch starts:
    // the registry the switch must cover is what the gateway serves.
    let gateway = match &settings.gateway {
        Some(gateway_settings) => Some(start_gateway(gateway_settings, &store, &secret, None).await?),
        None => None,
    };
    let initial = match (&gateway, app_name) {
        (Some((_, app)), _) => palisade_server::killswitch::exposed_operations(app),
        (None, Some(app_name)) => palisade_server::killswitch::exposed_operations(&with_delegation_tools(
            app_name.build(),
            delegation.as_ref(),
        )?),
        (None, None) => Vec::new(),
    };
    let kill_switch = killswitch_cli::start(&settings, &initial).await?;
    let orders = match kill_switch.as_ref().and_then(|runtime| runtime.shared_db.as_ref()) {
        Some(db) if app_name == Some(AppName::Demo) => {
            Some(palisade_apps::demo::Orders::open(db.pool().clone()).await.context("opening the order table")?)
        }
        _ => None,
    };
    let (app, gateway) = match (gateway, app_name) {
        (Some((gateway, _)), _) => {
            if let Some(runtime) = &kill_switch {
                let switch = runtime.switch.clone();
                gateway.set_coverage(Arc::new(move |key: &str| switch.policy().lookup(key).is_some()));
            }
            (gateway.build_app().await.context("building the gateway's registry")?, Some(gateway))
        }
        // The demo's baskets live in the configured store, so every instance sharing it sees them.
        (None, Some(AppName::Demo)) => {
            let baskets = palisade_apps::demo::BasketStore::open(&settings.store)
                .await
                .context("opening the demo's basket table in the store")?;
            (palisade_apps::demo::app_with_store(baskets, orders), None)
        }
        (None, Some(app_name)) => (app_name.build_with_orders(orders), None),
        (None, None) => anyhow::bail!("no application to serve"),
    };
    let app = if gateway.is_some() { app } else { with_delegation_tools(app, delegation.as_ref())? };
    let handles = HandleService::new(
        store.clone(),
        SubjectKey::from_bytes(&subject_key).map_err(anyhow::Error::msg)?,
        app.handle_types(),
        &settings.handle_policies,
        Arc::new(SystemClock),
    )
    .map_err(|reason| config::ConfigError { key: "handles.policies".into(), reason })?;
    let handles = Arc::new(handles);
    let tasks = Arc::new(TaskService::new(
        store.clone(),
        SubjectKey::from_bytes(&subject_key).map_err(anyhow::Error::msg)?,
        TaskConfig::default(),
        Arc::new(SystemClock),
    ));
    let sessions_store: Arc<dyn palisade_store::SessionStore> = store.clone();
    let ledger: Arc<dyn palisade_store::DelegationStore> = store.clone();
    let once_store: Arc<dyn palisade_store::OnceStore> = store.clone();
    // Authenticates answers relayed between instances (events_redis); derived before the
    // secret moves into the server.
    let relay_key = secret.derive(answer_relay::ANSWER_RELAY_KEY_LABEL);
    // The gateway's browser pages (connect flow, review page): their keys derive from the secret.
    let web = match (&gateway, settings.gateway.as_ref().and_then(|g| g.web.as_ref())) {
        (Some(gateway), Some(web)) => {
            Some((web, gateway.web_routes(&secret).context("building the gateway's web pages ([web])")?))
        }
        _ => None,
    };
    let mut builder = Server::builder(app, config, authenticator, secret)
        .sessions(sessions_store.clone())
        .once_store(once_store.clone())
        .audit(store)
        .audit_writer(audit_writer)
        .handles(handles.clone())
        .tasks(tasks.clone());
    if let Some(runtime) = &kill_switch {
        builder = builder.kill_switch(runtime.switch.clone(), runtime.server_release.clone());
    }
    if let Some(delegation) = &delegation {
        builder = builder.delegation(delegation.clone());
    }
    let server = Arc::new(builder.build().context("assembling the server")?);
    if let Some(gateway) = &gateway {
        gateway.spawn(server.clone(), server.shutdown_token().clone());
    }
    // The gateway's browser pages on their own TLS listener. Their grants and refusals go to the
    // server's surface sink (the request path's chain and digest key), whose refusal counts the
    // server's flusher writes every interval and `flush_audit` a last time.
    if let Some((web, routes)) = web {
        palisade_server::server::spawn_refusal_flusher(&server);
        let local =
            palisade_gateway::web::start(web, routes, server.surface_audit().clone(), server.shutdown_token().clone())
                .await
                .context("starting the gateway's web pages ([web])")?;
        eprintln!("web pages on https://{local}/ (public URL {})", web.public_url);
    }
    if let Some(url) = &settings.events_redis {
        events_bridge::start(server.clone(), relay_key, url, &settings.public_url, server.shutdown_token().clone())
            .await
            .context("starting the event fan-out (events_redis)")?;
    }
    let session_purge = spawn_session_purge(sessions_store, once_store, ledger, &server);
    // Tasks left `working` by an instance that died are resumed or failed; expired ones purged.
    let maintenance = tasks.spawn_maintenance(
        server.app(),
        server.events().clone(),
        std::time::Duration::from_secs(10),
        server.shutdown_token().clone(),
    );
    let retention = handles.spawn_retention(
        std::time::Duration::from_secs(300),
        settings.handle_retention,
        server.shutdown_token().clone(),
    );
    if args.stdio {
        palisade_server::stdio::serve(server.clone(), tokio::io::stdin(), tokio::io::stdout())
            .await
            .context("stdio transport")?;
        if let Some(gateway) = &gateway {
            gateway.flush_churn().await;
        }
        server.flush_audit().await;
        checkpointer.shutdown().await;
        return Ok(ExitCode::SUCCESS);
    }
    let listener = palisade_server::http::bind(&server, settings.listen).await?;
    let local = listener.local_addr()?;
    // `metrics_listen`: `/metrics` (with the health endpoints) on a private listener; unset,
    // `/metrics` is served nowhere.
    let options =
        palisade_server::http::ServeOptions::bind_metrics(settings.metrics_listen).await.with_context(|| {
            format!(
                "binding {} ({})",
                config::METRICS_LISTEN.key,
                settings.metrics_listen.map_or_else(String::new, |a| a.to_string())
            )
        })?;
    if let palisade_server::http::MetricsExposure::Listener(metrics) = &options.metrics {
        eprintln!("metrics on http://{}/metrics (no authentication: keep it private)", metrics.local_addr()?);
    }
    #[allow(clippy::print_stdout)]
    {
        println!("listening on http://{local}/mcp");
    }
    palisade_server::http::serve_with(server.clone(), listener, options, shutdown_signal()).await?;
    retention.abort();
    maintenance.abort();
    session_purge.abort();
    // Definition churn counted but not yet on the record is written before the exit.
    if let Some(gateway) = &gateway {
        gateway.flush_churn().await;
    }
    server.flush_audit().await;
    checkpointer.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// `app` with the delegation tools (`palisade_delegate`, `…_revoke`, `…_approve`) when
/// `[delegation]` is enabled.
fn with_delegation_tools(
    app: palisade_server::App,
    delegation: Option<&Arc<palisade_server::delegation::DelegationService>>,
) -> anyhow::Result<palisade_server::App> {
    let Some(service) = delegation else { return Ok(app) };
    let mut builder = app.into_builder();
    for tool in service.tools() {
        builder = builder.tool(tool);
    }
    builder.build().context("adding the delegation tools to the application")
}

/// The request path's audit writer on this instance's segment (recovering and shipping what an
/// earlier run left), and the checkpoint signer, which takes its turn under the writer's chain id.
async fn start_audit(
    settings: &Settings,
    store: &Arc<dyn palisade_store::Store>,
    secret: &ServerSecret,
) -> anyhow::Result<(Arc<palisade_store::AuditWriter>, palisade_store::Checkpointer)> {
    let mut segment = palisade_store::segment::SegmentConfig::new(&settings.audit_segment_dir);
    segment.durability = settings.audit_durability;
    let writer = palisade_store::AuditWriter::with_segment(store.clone(), segment, Default::default())
        .await
        .with_context(|| format!("opening the audit segment {}", settings.audit_segment_dir.display()))?;
    let holder = writer.chain().unwrap_or_default().to_owned();
    let checkpointer = palisade_store::Checkpointer::spawn(
        store.clone(),
        secret.audit_checkpoint_key(),
        holder,
        std::time::Duration::from_secs(settings.audit_checkpoint_interval_secs),
    );
    Ok((Arc::new(writer), checkpointer))
}

/// Deletes dead 2025-era sessions and expired single-use records every five minutes, in bounded
/// batches, until `server` shuts down. (A single-use record expires no earlier than the sealed
/// state it spends, so a purged one can no longer be presented.)
fn spawn_session_purge(
    store: Arc<dyn palisade_store::SessionStore>,
    once: Arc<dyn palisade_store::OnceStore>,
    ledger: Arc<dyn palisade_store::DelegationStore>,
    server: &Server,
) -> tokio::task::JoinHandle<()> {
    let (period, shutdown) = (std::time::Duration::from_secs(300), server.shutdown_token().clone());
    palisade_server::periodic::spawn_periodic("session purge", period, shutdown, move || {
        let (store, once, ledger) = (store.clone(), once.clone(), ledger.clone());
        async move {
            let now = SystemClock.now_ms();
            // Up to ten batches of each per tick; the next tick picks up the rest.
            purge_in_batches("session", |limit| store.purge_sessions(now, limit)).await;
            purge_in_batches("single-use record", |limit| once.purge_once(now, limit)).await;
            // Expired capabilities and approvals (a child never outlives its parent).
            purge_in_batches("delegation", |limit| ledger.purge_delegations(now, limit)).await;
        }
    })
}

/// Runs `purge` (which deletes at most its argument's worth of rows and says how many it did)
/// until a batch comes back short, at most ten times; a failure waits for the next tick.
async fn purge_in_batches<'a>(what: &str, purge: impl Fn(u32) -> palisade_store::StoreFuture<'a, u64>) {
    const BATCH: u32 = 1_000;
    for _ in 0..10 {
        match purge(BATCH).await {
            Ok(done) if done == u64::from(BATCH) => continue,
            Ok(_) => break,
            Err(error) => {
                tracing::warn!(%error, "{what} purge failed; retrying at the next tick");
                break;
            }
        }
    }
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
