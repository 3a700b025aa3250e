//! The kill switch on the command line: `palisade keys gen`, `palisade policy init|sign`,
//! `palisade authority serve|disable|enable|status`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_base::time::format_rfc3339_ms;
use palisade_killswitch::authority::{self, AuthorityDb, AuthorityServerConfig};
use palisade_killswitch::dev::DevAuthorityFiles;
use palisade_killswitch::{
    Ed25519SigningKey, PolicyHeader, PolicyPayload, TargetKey, TargetState, file_sha256_hex, parse_target_spec,
    sign_policy,
};

use palisade_host::killswitch::active_policy;
use palisade_host::settings::{ConfigError, KillSwitchMode, Settings};

/// `palisade keys …`
#[derive(Subcommand)]
pub enum KeysCommand {
    /// Generate an Ed25519 key pair (`--dir`, `--name`: NAME.key 0600 and NAME.pub) or a 32-byte
    /// secret key such as the target key (`--secret FILE`, 0600). Never overwrites.
    Gen(KeysGenArgs),
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("kind").required(true).multiple(false).args(["name", "secret"])))]
pub struct KeysGenArgs {
    /// Directory for the key pair.
    #[arg(long, requires = "name", default_value = ".")]
    dir: PathBuf,
    /// Base name of the key pair files.
    #[arg(long)]
    name: Option<String>,
    /// File for a 32-byte secret key.
    #[arg(long)]
    secret: Option<PathBuf>,
}

#[derive(Args)]
pub struct PolicyInitArgs {
    /// Output file (the unsigned payload, JSON).
    #[arg(long)]
    out: PathBuf,
    /// The application: demo, conformance or gateway. Default: from the configuration.
    #[arg(long)]
    app: Option<String>,
    /// The authority id (must match the authority's).
    #[arg(long)]
    authority: String,
    /// The key trust root directory.
    #[arg(long)]
    trust_root: PathBuf,
    /// The authority public key file, relative to the trust root.
    #[arg(long, default_value = "authority.pub")]
    authority_key_path: String,
    /// The policy generation (higher than any signed before).
    #[arg(long, default_value_t = 1)]
    generation: u64,
    /// A human label.
    #[arg(long, default_value = "v1")]
    policy_version: String,
    /// Days until the policy expires.
    #[arg(long, default_value_t = 30)]
    days: u32,
    /// Freshness bound for authority answers, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    max_age_ms: u64,
    /// Configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args)]
pub struct PolicySignArgs {
    /// The payload (JSON).
    #[arg(long)]
    payload: PathBuf,
    /// The policy root signing key.
    #[arg(long)]
    root_key: PathBuf,
    /// Output file (the signed envelope).
    #[arg(long)]
    out: PathBuf,
}

/// `palisade authority …`
#[derive(Subcommand)]
pub enum AuthorityCommand {
    /// Serve the reference disable authority (mTLS HTTPS).
    Serve(AuthorityServeArgs),
    /// Set a target to DISABLE (new generation): covered operations with it are refused.
    Disable(TargetArgs),
    /// Set a target to ENABLE (new generation).
    Enable(TargetArgs),
    /// Show the stored state of every target (by digest), or of one target.
    Status(StatusArgs),
}

#[derive(Args)]
pub struct AuthorityServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8443")]
    listen: String,
    /// The authority id (= the policy's `authority`).
    #[arg(long)]
    authority_id: String,
    /// The head signing key (its public key is the one the policy pins).
    #[arg(long)]
    signing_key: PathBuf,
    /// Server certificate chain (PEM).
    #[arg(long)]
    cert: PathBuf,
    /// Server key (PEM).
    #[arg(long)]
    key: PathBuf,
    /// CA bundle client certificates must chain to (PEM).
    #[arg(long)]
    client_ca: PathBuf,
    /// The SQLite database (created if missing).
    #[arg(long)]
    db: PathBuf,
    /// Head validity, seconds.
    #[arg(long, default_value_t = 30)]
    head_ttl_secs: u64,
    /// Commit token validity, seconds.
    #[arg(long, default_value_t = 60)]
    token_ttl_secs: u64,
}

/// Where the authority database and target key are: flags, else the configuration.
#[derive(Args)]
pub struct AuthorityLocation {
    /// The authority database. Default: `killswitch.authority_db`, or the development
    /// authority's in the data directory.
    #[arg(long)]
    db: Option<PathBuf>,
    /// The target key file. Default: `killswitch.target_key_file`, or the development one.
    #[arg(long)]
    target_key: Option<PathBuf>,
    /// Configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Data directory (for the development authority).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct TargetArgs {
    /// The target, KIND:VALUE (kinds: server_release, tenant, client, tool, prompt, resource,
    /// task, subscription, upstream, object, agent), e.g. `tool:basket_checkout`.
    #[arg(long)]
    target: String,
    /// Why (recorded and signed into the heads; not shown to clients).
    #[arg(long)]
    reason: String,
    /// Change the state even though the active signed policy has no rule that asks for targets
    /// of this kind (so the change has no effect until a policy that does is signed).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    location: AuthorityLocation,
}

#[derive(Args)]
pub struct StatusArgs {
    /// One target, KIND:VALUE.
    #[arg(long)]
    target: Option<String>,
    #[command(flatten)]
    location: AuthorityLocation,
}

fn now_ms() -> i64 {
    SystemClock.now_ms()
}

#[allow(clippy::print_stdout)]
pub fn keys(command: KeysCommand) -> anyhow::Result<ExitCode> {
    let KeysCommand::Gen(args) = command;
    if let Some(path) = args.secret {
        palisade_killswitch::keys::generate_secret_key_file(&path).context("writing the secret key")?;
        println!("secret key written to {}", path.display());
    } else if let Some(name) = args.name {
        let (secret, public) =
            palisade_killswitch::keys::generate_keypair_files(&args.dir, &name).context("writing the key pair")?;
        println!("signing key {} (keep private), public key {}", secret.display(), public.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `palisade policy init`: the kill switch's registry skeleton of the server's registry.
#[allow(clippy::print_stdout)]
pub async fn policy_init(args: PolicyInitArgs) -> anyhow::Result<ExitCode> {
    let settings = super::settings_for_app(args.config.as_deref(), args.app.as_deref())?;
    // The gateway's registry is what its upstreams list now and its reviewers approved.
    let app = super::registry(&settings).await?;
    let key_file = args.trust_root.join(&args.authority_key_path);
    let header = PolicyHeader {
        policy_version: args.policy_version,
        policy_generation: args.generation,
        authority: args.authority,
        authority_key_path: args.authority_key_path,
        authority_key_sha256: file_sha256_hex(&key_file)
            .with_context(|| format!("hashing the authority public key {}", key_file.display()))?,
        max_authority_response_age_ms: args.max_age_ms,
        not_after: format_rfc3339_ms(now_ms().saturating_add(i64::from(args.days) * 86_400_000)),
    };
    let exposed = palisade_server::killswitch::exposed_operations(&app);
    let count = exposed.len();
    let payload = PolicyPayload::skeleton(header, exposed);
    let json = serde_json::to_vec_pretty(&payload)?;
    std::fs::write(&args.out, json).with_context(|| format!("writing {}", args.out.display()))?;
    println!("{count} operations written to {} (all COVERED; review, then `palisade policy sign`)", args.out.display());
    Ok(ExitCode::SUCCESS)
}

/// `palisade policy sign`: a kill-switch policy payload validated and signed.
#[allow(clippy::print_stdout)]
pub fn policy_sign(args: PolicySignArgs) -> anyhow::Result<ExitCode> {
    let payload = std::fs::read(&args.payload).with_context(|| format!("reading {}", args.payload.display()))?;
    let key = Ed25519SigningKey::read(&args.root_key).context("reading the root key")?;
    let envelope = sign_policy(&payload, &key, now_ms()).context("the payload is not a valid policy")?;
    std::fs::write(&args.out, envelope).with_context(|| format!("writing {}", args.out.display()))?;
    println!("signed policy written to {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

/// The authority database and target key the admin commands use.
fn locate(location: &AuthorityLocation) -> anyhow::Result<(PathBuf, PathBuf)> {
    let settings = location_settings(location)?;
    let (db, key) = match &settings.killswitch.mode {
        KillSwitchMode::Dev { dir } => {
            let files = DevAuthorityFiles::new(dir.clone());
            (Some(files.authority_db()), Some(files.target_key()))
        }
        KillSwitchMode::Authority(external) => (external.authority_db.clone(), Some(external.target_key_file.clone())),
        KillSwitchMode::Off => (None, None),
    };
    let db = location.db.clone().or(db).ok_or_else(|| ConfigError {
        key: "killswitch.authority_db".into(),
        reason: "name the authority database (--db)".into(),
    })?;
    let key = location.target_key.clone().or(key).ok_or_else(|| ConfigError {
        key: "killswitch.target_key_file".into(),
        reason: "name the target key file (--target-key)".into(),
    })?;
    if !db.exists() {
        anyhow::bail!("no authority database at {} (has the authority run yet?)", db.display());
    }
    Ok((db, key))
}

fn location_settings(location: &AuthorityLocation) -> anyhow::Result<Settings> {
    let mut settings = super::settings(location.config.as_deref())?;
    if let Some(data_dir) = &location.data_dir {
        settings.killswitch.mode = KillSwitchMode::Dev { dir: data_dir.join("killswitch-dev") };
    }
    Ok(settings)
}

/// Whether the signed policy the server runs asks for targets of `kind` in any covered rule:
/// a target of a kind no rule asks for is never checked, so switching it changes nothing.
/// `Err` says why that could not be established.
fn policy_asks_for(location: &AuthorityLocation, kind: palisade_killswitch::TargetKind) -> anyhow::Result<(bool, u64)> {
    let settings = location_settings(location)?;
    let policy = active_policy(&settings)?
        .ok_or_else(|| anyhow::anyhow!("the configuration runs no kill switch ([killswitch] mode = \"off\")"))?;
    let asks = policy.payload().operations.values().any(|rule| {
        rule.coverage == palisade_killswitch::Coverage::Covered && rule.required_target_kinds.contains(&kind)
    });
    Ok((asks, policy.generation()))
}

fn parse_target(spec: &str) -> anyhow::Result<(palisade_killswitch::TargetKind, String)> {
    Ok(parse_target_spec(spec).ok_or_else(|| ConfigError {
        key: "--target".into(),
        reason: "must be KIND:VALUE with a known kind, e.g. tool:basket_checkout".into(),
    })?)
}

fn path_text(path: &Path) -> anyhow::Result<&str> {
    path.to_str().ok_or_else(|| anyhow::anyhow!("{} is not a UTF-8 path", path.display()))
}

#[allow(clippy::print_stdout)]
pub async fn authority(command: AuthorityCommand) -> anyhow::Result<ExitCode> {
    match command {
        AuthorityCommand::Serve(args) => authority_serve(args).await,
        AuthorityCommand::Disable(args) => set_state(args, TargetState::Disable).await,
        AuthorityCommand::Enable(args) => set_state(args, TargetState::Enable).await,
        AuthorityCommand::Status(args) => {
            let (db_path, key_path) = locate(&args.location)?;
            let db = AuthorityDb::open(path_text(&db_path)?).await.context("opening the authority database")?;
            // The authority keeps keyed digests only; names are recovered here, with the target
            // key, from the names this deployment knows.
            let (statuses, names) = match &args.target {
                Some(spec) => {
                    let (kind, value) = parse_target(spec)?;
                    let key = TargetKey::read(&key_path).context("reading the target key")?;
                    let digest = key.digest(kind, &value);
                    let names = std::collections::BTreeMap::from([(digest.clone(), format!("{kind}:{value}"))]);
                    (vec![db.target_status(&digest).await.context("reading the target")?], names)
                }
                None => {
                    let names = match TargetKey::read(&key_path) {
                        Ok(key) => known_target_names(&args.location, &key),
                        Err(error) => {
                            eprintln!("WARNING: reading the target key ({error}): targets are shown by digest only");
                            std::collections::BTreeMap::new()
                        }
                    };
                    (db.status().await.context("reading the authority state")?, names)
                }
            };
            for status in statuses {
                let name = names.get(&status.target).cloned().unwrap_or_else(|| format!("{}:?", status.target.kind));
                println!(
                    "{name} {} generation={} reason={:?} updated_at={} digest={}:{}",
                    status.state.as_str(),
                    status.generation,
                    status.reason_code,
                    format_rfc3339_ms(status.updated_at_ms),
                    status.target.kind,
                    status.target.digest,
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The names of targets this deployment can name, by keyed digest: every operation target of the
/// active signed policy's registry (tools, prompts, resources and templates as served), the
/// gateway's upstreams and this server's release. Tenants, clients, agents, tasks and objects
/// are not enumerable here; `authority status` shows those as `KIND:?` with their digest (an
/// operator names one with `--target`). What cannot be read is left out, with a warning.
#[allow(clippy::print_stderr)]
fn known_target_names(
    location: &AuthorityLocation,
    key: &TargetKey,
) -> std::collections::BTreeMap<palisade_killswitch::TargetDigest, String> {
    use palisade_killswitch::TargetKind;
    let mut candidates: Vec<(TargetKind, String)> = Vec::new();
    match location_settings(location) {
        Ok(settings) => {
            candidates.push((TargetKind::ServerRelease, settings.killswitch.server_release.clone()));
            if let Some(gateway) = &settings.gateway {
                candidates.extend(gateway.upstreams.iter().map(|upstream| (TargetKind::Upstream, upstream.id.clone())));
            }
            match active_policy(&settings) {
                Ok(Some(policy)) => {
                    // `METHOD:TARGET`: a tool's or prompt's name, a resource's URI or template.
                    for operation in policy.payload().operations.keys() {
                        let Some((_, value)) = operation.split_once(':') else { continue };
                        candidates.push((TargetKind::Tool, value.to_owned()));
                        candidates.push((TargetKind::Prompt, value.to_owned()));
                        candidates.push((TargetKind::Resource, value.to_owned()));
                    }
                }
                Ok(None) => {}
                Err(error) => eprintln!("WARNING: {error:#}: operation targets are shown by digest only"),
            }
        }
        Err(error) => eprintln!("WARNING: {error:#}: targets are shown by digest only"),
    }
    candidates.into_iter().map(|(kind, value)| (key.digest(kind, &value), format!("{kind}:{value}"))).collect()
}

/// `palisade authority disable|enable`.
#[allow(clippy::print_stdout)]
async fn set_state(args: TargetArgs, state: TargetState) -> anyhow::Result<ExitCode> {
    let (db_path, key_path) = locate(&args.location)?;
    let (kind, value) = parse_target(&args.target)?;
    // An operator must not believe a switch works when no signed rule ever asks for its kind.
    let problem = match policy_asks_for(&args.location, kind) {
        Ok((true, _)) => None,
        Ok((false, generation)) => Some(format!(
            "the active signed policy (generation {generation}) has no rule that asks for {kind} targets: \
             setting {kind}:{value} would change nothing"
        )),
        Err(error) => Some(format!("cannot tell whether the active signed policy asks for {kind} targets: {error:#}")),
    };
    if let Some(problem) = problem {
        if !args.force {
            anyhow::bail!(
                "{problem}; add the kind to the policy's rules (palisade policy init, then sign) or pass --force \
                 to set the state anyway"
            );
        }
        #[allow(clippy::print_stderr)]
        {
            eprintln!("WARNING: {problem}; setting it anyway (--force)");
        }
    }
    let key = TargetKey::read(&key_path).context("reading the target key")?;
    let target = key.digest(kind, &value);
    let db = AuthorityDb::open(path_text(&db_path)?).await.context("opening the authority database")?;
    let status = if state == TargetState::Disable {
        db.disable(&target, &args.reason, now_ms()).await
    } else {
        db.enable(&target, &args.reason, now_ms()).await
    }
    .context("changing the target's state")?;
    println!("{kind}:{value} is now {} at generation {}", status.state.as_str(), status.generation);
    Ok(ExitCode::SUCCESS)
}

async fn authority_serve(args: AuthorityServeArgs) -> anyhow::Result<ExitCode> {
    let read = |path: &Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let tls = authority::server_tls_config(&read(&args.cert)?, &read(&args.key)?, &read(&args.client_ca)?)?;
    let db = AuthorityDb::open(path_text(&args.db)?).await.context("opening the authority database")?;
    let config = AuthorityServerConfig {
        authority_id: args.authority_id,
        signing_key: Arc::new(Ed25519SigningKey::read(&args.signing_key).context("reading the signing key")?),
        tls,
        head_ttl: Duration::from_secs(args.head_ttl_secs.clamp(1, 3600)),
        commit_token_ttl: Duration::from_secs(args.token_ttl_secs.clamp(1, 3600)),
        clock: Arc::new(SystemClock),
    };
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    #[allow(clippy::print_stdout)]
    {
        println!("authority listening on https://{}", listener.local_addr()?);
    }
    authority::serve(listener, config, db, palisade_host::signal::shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}
