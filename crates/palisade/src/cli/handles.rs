//! `palisade handles list|revoke`: a subject's explicit handles (digests only), and their
//! revocation, one or in bulk, recorded in the audit log.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_host::settings::ConfigError;
use palisade_host::{authn, secrets};
use palisade_store::{Revocation, RevokeSelector};

use super::operator;

#[derive(Subcommand)]
pub enum HandlesCommand {
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
pub struct RevokeArgs {
    /// One handle, by the full SHA-256 hex digest `handles list` shows.
    #[arg(long)]
    pub digest: Option<String>,
    /// Every handle of a subject (with --issuer; default the dev issuer).
    #[arg(long)]
    pub subject: Option<String>,
    /// The subject's issuer.
    #[arg(long, requires = "subject")]
    pub issuer: Option<String>,
    /// Every handle in a tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Every handle of an OAuth client.
    #[arg(long)]
    pub client: Option<String>,
    /// Every handle on one object (deleted): TENANT TYPE REF.
    #[arg(long, num_args = 3, value_names = ["TENANT", "TYPE", "REF"])]
    pub object: Option<Vec<String>>,
    /// Every handle of an object type minted under a policy version below N: TYPE N.
    #[arg(long, num_args = 2, value_names = ["TYPE", "N"])]
    pub policy_below: Option<Vec<String>>,
    /// Why (recorded with each handle).
    #[arg(long)]
    pub reason: String,
    /// The operator's receipt id for this revocation (recorded with each handle).
    #[arg(long)]
    pub receipt: String,
    /// Revoke every handle the selector covers, however many. Without it, a selector covering
    /// more than one live handle revokes nothing and says how many it covers.
    #[arg(long)]
    pub all: bool,
    /// Configuration file (store URL, subject key).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// Runs a `palisade handles` command.
pub async fn run(command: HandlesCommand) -> anyhow::Result<ExitCode> {
    match command {
        HandlesCommand::List { subject, issuer, limit, config } => {
            handles_list(config.as_deref(), issuer, &subject, limit).await
        }
        HandlesCommand::Revoke(args) => handles_revoke(args).await,
    }
}

async fn handles_list(
    config: Option<&Path>,
    issuer: Option<String>,
    subject: &str,
    limit: u32,
) -> anyhow::Result<ExitCode> {
    let settings = super::settings(config)?;
    secrets::prepare_sqlite_dir(&settings)?;
    let key = secrets::handle_subject_key(&settings)?;
    let issuer = issuer.unwrap_or_else(|| authn::dev_issuer_id(&settings));
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
    let settings = super::settings(args.config.as_deref())?;
    secrets::prepare_sqlite_dir(&settings)?;
    let key = secrets::handle_subject_key(&settings)?;
    let selector = if let Some(digest) = &args.digest {
        let bytes = secrets::parse_key_hex(digest).ok_or_else(|| ConfigError {
            key: "--digest".into(),
            reason: "must be the 64-hex-character SHA-256 digest `handles list` shows".into(),
        })?;
        RevokeSelector::Digest(bytes)
    } else if let Some(subject) = &args.subject {
        let issuer = args.issuer.clone().unwrap_or_else(|| authn::dev_issuer_id(&settings));
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
        let below = below.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| ConfigError {
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
    operator::record_operator_action(store.as_ref(), now, "handles/revoke", detail).await?;
    #[allow(clippy::print_stdout)]
    {
        println!("revoked {count} handle(s) (receipt {})", args.receipt);
    }
    Ok(ExitCode::SUCCESS)
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
