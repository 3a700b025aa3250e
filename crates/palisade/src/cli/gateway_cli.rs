//! `palisade gateway status`, `palisade pins …` and `palisade upstreams …`: the operator's view
//! of the gateway's upstreams, the review of their definitions (control C6) and of the launch of
//! its local stdio servers (C7). Decisions are written to the store the gateway reads (a running
//! gateway applies them within `[pins] decision_poll_secs`) and each one is an audit record.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_base::reveal::{count_hidden_json, notice, notice_for, reveal, reveal_line};
use palisade_gateway::config::GatewaySettings;
use palisade_gateway::decisions::{Reviewer, decided_diff, decision_label, record, state_of};
use palisade_gateway::findings::{ToolNames, for_row, render_text};
use palisade_gateway::launch::LaunchSpec;
use palisade_gateway::pins::{DefinitionKind, PinState};
use palisade_store::{PinRow, PinVerdict, Store};

use palisade_host::Settings;

#[derive(Subcommand)]
pub enum PinsCommand {
    /// List pins: id, state, kind, upstream, name, digest prefix.
    List {
        /// Only this upstream's.
        #[arg(long)]
        upstream: Option<String>,
        /// Only pins in this state: pending, approved, held, rejected.
        #[arg(long)]
        state: Option<String>,
        /// The gateway's configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Show one pin: its current definition, digest and decision, and the review findings.
    Show {
        /// The pin id (`pins list`).
        id: String,
        /// The gateway's configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// A readable diff of the definition last decided on and the current one, and the review
    /// findings.
    Diff {
        /// The pin id.
        id: String,
        /// The gateway's configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Approve the definitions shown: the digest approved is the one read now (or the one given
    /// with --digest); if the definition changed in between, nothing is approved.
    Approve(DecideArgs),
    /// Reject definitions (they stay unlisted and uncallable).
    Reject(DecideArgs),
    /// Make a reviewer's signing key pair (for `[pins] require_signed`).
    Keygen {
        /// The new secret key file.
        #[arg(long)]
        out: PathBuf,
        /// The reviewer's name.
        #[arg(long)]
        reviewer: String,
    },
}

#[derive(Subcommand)]
pub enum UpstreamsCommand {
    /// Show a stdio upstream's launch exactly: command, every argument, environment names,
    /// working directory, grants, network, limits, confinement, the SHA-256 of the executable
    /// and interpreter that will run, and the package trees it runs from; with its launch digest
    /// and approval state.
    Show {
        /// The upstream id.
        id: String,
        /// The gateway's configuration file.
        #[arg(long)]
        config: PathBuf,
        /// Start an approved launch once (confined, with this shell's environment for its `env`
        /// names), connect and list its tools, and stop it: prints what answered, or why it did
        /// not (a server that exits at start: the cause its stderr gives); exit status 1 then.
        #[arg(long)]
        start: bool,
    },
    /// Approve the launch as it resolves now (or only if its digest is the one given with
    /// --digest). Any change to it later, the executable's bytes included, needs a new approval.
    Approve(LaunchDecideArgs),
    /// Reject the launch: the upstream is never started.
    Reject(LaunchDecideArgs),
}

#[derive(clap::Args)]
pub struct LaunchDecideArgs {
    /// The upstream id.
    id: String,
    #[command(flatten)]
    decision: DecisionArgs,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(false).args(["ids", "all"])))]
pub struct DecideArgs {
    /// Pin ids.
    ids: Vec<String>,
    /// Every pending or held pin of --upstream (a first import).
    #[arg(long, requires = "upstream")]
    all: bool,
    /// The upstream, with --all.
    #[arg(long)]
    upstream: Option<String>,
    #[command(flatten)]
    decision: DecisionArgs,
}

/// Who decides what, as every decision command takes it.
#[derive(clap::Args)]
pub struct DecisionArgs {
    /// Who decides (recorded, and the name a signature is checked under).
    #[arg(long)]
    reviewer: String,
    /// Why (recorded).
    #[arg(long)]
    note: Option<String>,
    /// The digest (or a prefix of at least 12 hex digits) the reviewer was shown; one pin only.
    #[arg(long)]
    digest: Option<String>,
    /// The reviewer's Ed25519 secret key file (base64, 32 bytes): signs each approval.
    #[arg(long)]
    sign_key: Option<PathBuf>,
    /// The gateway's configuration file.
    #[arg(long)]
    config: PathBuf,
}

/// The review findings of `row` as printed, computed against every pin of the store (the other
/// tools a definition may name).
async fn findings_text(gateway: &GatewaySettings, store: &dyn Store, row: &PinRow) -> anyhow::Result<String> {
    let rows = store.pins(None).await.context("reading pins")?;
    Ok(render_text(&for_row(row, &ToolNames::new(gateway).others(&rows, row))))
}

/// The line above a definition that says how many hidden characters it has (empty for none).
fn hidden_line(definition: &str) -> String {
    notice(count_hidden_json(definition)).map(|line| format!("{line}\n")).unwrap_or_default()
}

/// The gateway settings of a configuration file, and its store.
async fn open(config: &Path) -> anyhow::Result<(Settings, GatewaySettings, std::sync::Arc<dyn Store>)> {
    open_with(config, &palisade_host::settings::ConfigFlags::default()).await
}

/// [`open`] with `palisade gateway`'s configuration flags.
async fn open_with(
    config: &Path,
    flags: &palisade_host::settings::ConfigFlags,
) -> anyhow::Result<(Settings, GatewaySettings, std::sync::Arc<dyn Store>)> {
    let settings = super::gateway_settings(config, flags)?;
    let mut gateway = settings.gateway.clone().context("the configuration has no gateway settings")?;
    if let Some(path) = palisade_host::gateway::recorded_search_path(&settings)? {
        gateway.set_search_path(path.as_deref());
    } else if gateway.upstreams.iter().any(|upstream| upstream.stdio.is_some()) {
        eprintln!(
            "WARNING: no gateway has started with the data directory {} yet: stdio commands are looked up on \
             this shell's PATH, which may not be the one the gateway runs with",
            settings.data_dir.display()
        );
    }
    palisade_host::secrets::prepare_sqlite_dir(&settings)?;
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    Ok((settings, gateway, store))
}

#[allow(clippy::print_stdout)]
pub async fn pins(command: PinsCommand) -> anyhow::Result<ExitCode> {
    match command {
        PinsCommand::List { upstream, state, config } => {
            let (_, gateway, store) = open(&config).await?;
            let wanted = match state.as_deref() {
                None => None,
                Some(name) => Some(PinState::from_name(name).ok_or_else(|| palisade_host::ConfigError {
                    key: "--state".into(),
                    reason: "must be pending, approved, held or rejected".into(),
                })?),
            };
            let rows = store.pins(upstream.as_deref()).await.context("reading pins")?;
            println!("{:<40} {:<9} {:<18} {:<16} {:<14} NAME", "PIN", "STATE", "KIND", "UPSTREAM", "DIGEST");
            for row in &rows {
                let state = state_of(row, &gateway.pins);
                if wanted.is_some_and(|wanted| wanted != state) {
                    continue;
                }
                let o = &row.observation;
                // Every column is shown with its hidden characters as markers: a name with
                // terminal escapes cannot rewrite the table.
                println!(
                    "{:<40} {:<9} {:<18} {:<16} {:<14} {}",
                    reveal_line(&o.pin_id),
                    state.as_str(),
                    reveal_line(&o.kind),
                    reveal_line(&o.upstream_id),
                    reveal_line(o.digest.get(..12).unwrap_or(&o.digest)),
                    reveal_line(&o.name)
                );
            }
        }
        PinsCommand::Show { id, config } => {
            let (_, gateway, store) = open(&config).await?;
            let row = store.pin(&id).await.context("reading the pin")?.with_context(|| format!("no pin {id}"))?;
            let o = &row.observation;
            println!("pin:       {}", reveal_line(&o.pin_id));
            println!("state:     {}", state_of(&row, &gateway.pins).as_str());
            println!("upstream:  {} ({})", reveal_line(&o.upstream_id), reveal_line(&o.upstream_url));
            println!("kind:      {}", reveal_line(&o.kind));
            println!("name:      {}", reveal_line(&o.name));
            println!("digest:    {}", reveal_line(&o.digest));
            if let Some(decision) = &row.decision {
                println!(
                    "decision:  {} by {} of {}{}{}",
                    decision.verdict.as_str(),
                    reveal_line(&decision.reviewer),
                    reveal_line(decision.digest.get(..12).unwrap_or(&decision.digest)),
                    if decision.signature.is_some() { " (signed)" } else { "" },
                    decision.note.as_deref().map(|note| format!(": {}", reveal_line(note))).unwrap_or_default()
                );
            }
            print!("{}", findings_text(&gateway, store.as_ref(), &row).await?);
            let pretty = serde_json::from_str::<serde_json::Value>(&o.definition)
                .ok()
                .and_then(|value| serde_json::to_string_pretty(&value).ok())
                .unwrap_or_else(|| o.definition.clone());
            print!("definition (as the upstream sent it):\n{}", hidden_line(&o.definition));
            println!("{}", reveal(&pretty));
        }
        PinsCommand::Diff { id, config } => {
            let (_, gateway, store) = open(&config).await?;
            let row = store.pin(&id).await.context("reading the pin")?.with_context(|| format!("no pin {id}"))?;
            let shown = reveal_line(&id);
            match decided_diff(&row, &gateway.pins) {
                None => println!("{shown} was never decided on: `palisade pins show {shown}` shows its definition"),
                Some(text) => {
                    if text.is_empty() {
                        let decided = decision_label(&row, &gateway.pins).unwrap_or_default();
                        let state = state_of(&row, &gateway.pins);
                        println!(
                            "{shown}: the current definition is the one decided on ({decided}); it is {}",
                            state.as_str()
                        );
                    } else {
                        if let Some(line) =
                            notice_for("the current definition", count_hidden_json(&row.observation.definition))
                        {
                            println!("{line}");
                        }
                        print!("{}", reveal(&text));
                    }
                }
            }
            print!("{}", findings_text(&gateway, store.as_ref(), &row).await?);
        }
        PinsCommand::Approve(args) => return decide(args, PinVerdict::Approved).await,
        PinsCommand::Reject(args) => return decide(args, PinVerdict::Rejected).await,
        PinsCommand::Keygen { out, reviewer } => return keygen(&out, &reviewer),
    }
    Ok(ExitCode::SUCCESS)
}

#[allow(clippy::print_stdout)]
async fn decide(args: DecideArgs, verdict: PinVerdict) -> anyhow::Result<ExitCode> {
    let (_, gateway, store) = open(&args.decision.config).await?;
    let sign_key = match &args.decision.sign_key {
        Some(path) => Some(read_sign_key(path)?),
        None => None,
    };
    if verdict == PinVerdict::Approved && gateway.pins.require_signed && sign_key.is_none() {
        eprintln!("note: [pins] require_signed is on: an approval without --sign-key does not count");
    }
    let rows: Vec<PinRow> = if args.all {
        let rows = store.pins(args.upstream.as_deref()).await.context("reading pins")?;
        rows.into_iter()
            .filter(|row| matches!(state_of(row, &gateway.pins), PinState::Pending | PinState::Held))
            .collect()
    } else {
        if args.decision.digest.is_some() && args.ids.len() != 1 {
            anyhow::bail!("--digest names the definition of exactly one pin");
        }
        let mut rows = Vec::new();
        for id in &args.ids {
            rows.push(store.pin(id).await.context("reading the pin")?.with_context(|| format!("no pin {id}"))?);
        }
        rows
    };
    let mut failed = false;
    for row in rows {
        let o = &row.observation;
        if let Some(seen) = &args.decision.digest
            && (seen.len() < 12 || !o.digest.starts_with(seen.as_str()))
        {
            println!(
                "{}: NOT {}: its current digest {} is not the one shown",
                o.pin_id,
                verdict.as_str(),
                &o.digest[..12]
            );
            failed = true;
            continue;
        }
        let reviewer = Reviewer {
            name: &args.decision.reviewer,
            note: args.decision.note.as_deref(),
            sign_key: sign_key.as_deref(),
            surface: "cli",
        };
        if record(store.as_ref(), &SystemClock, &row, verdict, reviewer).await.context("recording the decision")? {
            // Instructions and launches have no name of their own: the upstream's stands in.
            let name = reveal_line(if o.name.is_empty() { &o.upstream_id } else { &o.name });
            println!("{}: {} ({} {name})", o.pin_id, verdict.as_str(), o.kind);
        } else {
            println!(
                "{}: NOT {}: the definition changed since it was read; review it again",
                o.pin_id,
                verdict.as_str()
            );
            failed = true;
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Resolves upstream `id`'s launch now and records it as its `launch` pin (as a gateway does
/// before it starts anything), returning the spec, digest and stored row.
async fn observed_launch(
    gateway: &GatewaySettings,
    store: &std::sync::Arc<dyn Store>,
    id: &str,
) -> anyhow::Result<(LaunchSpec, String, PinRow)> {
    let upstream = gateway.upstreams.iter().find(|u| u.id == id).with_context(|| format!("no upstream {id}"))?;
    let path = upstream.stdio.as_ref().and_then(|stdio| stdio.search_path.clone());
    let spec = LaunchSpec::resolve(upstream, path.as_deref())
        .with_context(|| format!("upstream {id} is not a stdio upstream (it has a url)"))?
        .with_context(|| format!("upstream {id}: its launch cannot be resolved"))?;
    let digest = spec.digest()?;
    let pin_id = spec.subject().pin_id();
    let current = store.pin(&pin_id).await.context("reading the launch pin")?;
    if current.as_ref().map(|row| row.observation.digest.as_str()) != Some(digest.as_str()) {
        let observation = spec.observation(SystemClock.now_ms())?;
        store.observe_pins(vec![observation]).await.context("recording the launch")?;
    }
    let row = store.pin(&pin_id).await.context("reading the launch pin")?.context("the launch pin vanished")?;
    Ok((spec, digest, row))
}

/// Starts upstream `id`'s approved launch (`digest`) once, connects and lists its tools, and
/// stops it: `Ok` with what answered, `Err` with why it did not (a server that exits at start
/// carries its stderr's cause).
async fn start_check(gateway: &GatewaySettings, id: &str, digest: &str) -> Result<String, String> {
    use palisade_gateway::upstream::{ListKind, UpstreamClient, stdio::SandboxIdentities};
    let upstream = gateway.upstreams.iter().find(|u| u.id == id).ok_or_else(|| format!("no upstream {id}"))?;
    let identities = SandboxIdentities::new(gateway.sandbox);
    let client = UpstreamClient::stdio(upstream, identities, gateway.protected_paths.clone())
        .map_err(|error| format!("FAILED: {error}"))?;
    client.set_launch_approved(Some(digest.to_owned())).await;
    let outcome = async {
        let info = client.connect().await?;
        let (tools, _) = client.list(ListKind::Tools).await?;
        Ok::<_, palisade_gateway::upstream::UpstreamError>(format!(
            "started; it answers ({}) and lists {} tools",
            info.era,
            tools.len()
        ))
    }
    .await;
    client.shutdown().await;
    outcome.map_err(|error| format!("FAILED: {error}"))
}

#[allow(clippy::print_stdout)]
pub async fn upstreams(command: UpstreamsCommand) -> anyhow::Result<ExitCode> {
    let (args, verdict) = match command {
        UpstreamsCommand::Show { id, config, start } => {
            let (_, gateway, store) = open(&config).await?;
            let (spec, digest, row) = observed_launch(&gateway, &store, &id).await?;
            print!("{}", spec.render());
            println!("{:<18}{digest}", "launch digest");
            println!("{:<18}{}", "pin", row.observation.pin_id);
            let state = state_of(&row, &gateway.pins);
            println!("{:<18}{}", "state", state.as_str());
            // With --start an approved launch is started once, as the gateway would: a server that
            // cannot start says why here (its stderr's cause), not only in the gateway's log.
            let started = match (start, state == PinState::Approved) {
                (true, true) => {
                    let check = start_check(&gateway, &id, &digest).await;
                    println!("{:<18}{}", "start check", reveal_line(check.as_ref().unwrap_or_else(|error| error)));
                    check.is_ok()
                }
                (true, false) => {
                    println!("{:<18}not run (only an approved launch is started)", "start check");
                    false
                }
                (false, _) => true,
            };
            if spec.settings.confinement == palisade_gateway::config::Confinement::None {
                println!("\nWARNING: confinement = \"none\": this server runs UNCONFINED, with the gateway's access.");
            }
            println!("\nWARNING: {}", palisade_gateway::launch::EXECUTES_CODE_WARNING);
            return Ok(if started { ExitCode::SUCCESS } else { ExitCode::FAILURE });
        }
        UpstreamsCommand::Approve(args) => (args, PinVerdict::Approved),
        UpstreamsCommand::Reject(args) => (args, PinVerdict::Rejected),
    };
    let (pin_id, digest) = {
        let (_, gateway, store) = open(&args.decision.config).await?;
        let (_, digest, row) = observed_launch(&gateway, &store, &args.id).await?;
        (row.observation.pin_id, digest)
    };
    if let Some(seen) = &args.decision.digest
        && (seen.len() < 12 || !digest.starts_with(seen.as_str()))
    {
        println!(
            "{}: NOT {}: its launch digest is now {}, not the one shown; run `palisade upstreams show` again",
            args.id,
            verdict.as_str(),
            &digest[..12]
        );
        return Ok(ExitCode::FAILURE);
    }
    let decision = DecisionArgs { digest: Some(digest), ..args.decision };
    decide(DecideArgs { ids: vec![pin_id], all: false, upstream: None, decision }, verdict).await
}

/// A reviewer's secret key file (base64 or hex of the 32-byte Ed25519 seed, as `pins keygen` or
/// `palisade keys gen` write it).
fn read_sign_key(path: &Path) -> anyhow::Result<zeroize::Zeroizing<[u8; 32]>> {
    let bytes = zeroize::Zeroizing::new(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?);
    palisade_gateway::pins::parse_secret_key(&bytes).map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))
}

/// `palisade pins keygen`: a reviewer's Ed25519 key pair; the secret seed (base64) into a new
/// file readable by its owner only, the public key printed for `[pins] reviewers`.
#[allow(clippy::print_stdout)]
pub fn keygen(out: &Path, reviewer: &str) -> anyhow::Result<ExitCode> {
    use base64::Engine as _;
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut seed = zeroize::Zeroizing::new([0_u8; 32]);
    aws_lc_rs::rand::fill(seed.as_mut()).map_err(|_| anyhow::anyhow!("the system random source failed"))?;
    let encoded = zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(seed.as_ref()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("creating {} (it must not exist)", out.display()))?;
    file.write_all(format!("{}\n", encoded.as_str()).as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    let public = palisade_gateway::pins::public_key_base64(&seed);
    println!("secret key written to {} (keep it private)", out.display());
    println!("add to the gateway's configuration:\n[[pins.reviewers]]\nname = {reviewer:?}\nkey = {public:?}");
    Ok(ExitCode::SUCCESS)
}

/// `palisade gateway status`: connects to every upstream now, lists it, and prints its health
/// and how many of its definitions are in each pin state and served.
#[allow(clippy::print_stdout)]
pub async fn status(config: &Path, flags: &palisade_host::settings::ConfigFlags) -> anyhow::Result<ExitCode> {
    let (settings, gateway, store) = open_with(config, flags).await?;
    // What the running gateway serves also depends on the signed kill-switch registry.
    let coverage: Option<palisade_gateway::gateway::CoverageCheck> =
        palisade_host::killswitch::active_policy(&settings)?.map(|policy| {
            let policy = std::sync::Arc::new(policy);
            std::sync::Arc::new(move |key: &str| policy.lookup(key).is_some())
                as palisade_gateway::gateway::CoverageCheck
        });
    let secret = palisade_host::secrets::server_secret(&settings)?;
    let (gateway, _) = palisade_host::gateway::start(&gateway, &store, &secret, coverage).await?;
    let report = gateway.report();
    let summary = palisade_gateway::gateway::summarize(&report);
    let mut healthy = true;
    for status in gateway.status() {
        let reachable = status.health.healthy && status.listing_error.is_none();
        healthy &= reachable;
        let states = summary
            .get(&status.id)
            .map(|states| states.iter().map(|(state, n)| format!("{n} {state}")).collect::<Vec<_>>().join(", "))
            .unwrap_or_default();
        println!(
            "{}  {}  protocol={}  healthy={}  served={}/{}  [{}]{}",
            status.id,
            status.url,
            status.protocol.as_deref().unwrap_or("-"),
            reachable,
            status.served,
            status.listed,
            states,
            status
                .listing_error
                .as_deref()
                .or(status.health.last_error.as_deref())
                .map(|e| format!("  last error: {}", reveal_line(e)))
                .unwrap_or_default()
        );
    }
    for status in gateway.status() {
        if let Some(launch) = &status.launch {
            println!(
                "  launch: {} {} ({}): {}{}",
                status.id,
                launch.state,
                launch.pin_id,
                launch.reason.as_deref().unwrap_or("approved"),
                status.processes.map(|n| format!("; {n} processes")).unwrap_or_default()
            );
        }
    }
    for status in gateway.status() {
        for rule in &status.unmatched_rules {
            println!("  warning: {}: {rule}", status.id);
        }
    }
    for entry in report.iter().filter(|entry| !entry.served && entry.kind != DefinitionKind::Launch.as_str()) {
        // The name is the upstream's: shown with its hidden characters as markers.
        println!(
            "  not served: {} {} {} ({}): {}",
            entry.upstream,
            entry.kind,
            reveal_line(&entry.name),
            entry.pin_id,
            reveal_line(entry.reason.as_deref().unwrap_or(""))
        );
    }
    Ok(if healthy { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
