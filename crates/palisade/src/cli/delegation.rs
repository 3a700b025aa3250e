//! `palisade delegation list|revoke`: the delegation ledger, and a capability revoked with
//! everything under it, recorded in the audit log.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_host::secrets;
use palisade_host::settings::ConfigError;

use super::operator;

#[derive(Subcommand)]
pub enum DelegationCommand {
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

/// Runs a `palisade delegation` command.
pub async fn run(command: DelegationCommand) -> anyhow::Result<ExitCode> {
    match command {
        DelegationCommand::List { agent, limit, config } => {
            delegation_list(config.as_deref(), agent.as_deref(), limit).await
        }
        DelegationCommand::Revoke { id, reason, config } => delegation_revoke(config.as_deref(), &id, &reason).await,
    }
}

async fn delegation_list(config: Option<&Path>, agent: Option<&str>, limit: u32) -> anyhow::Result<ExitCode> {
    let settings = super::settings(config)?;
    secrets::prepare_sqlite_dir(&settings)?;
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
    let settings = super::settings(config)?;
    secrets::prepare_sqlite_dir(&settings)?;
    let digest = secrets::parse_key_hex(id).ok_or_else(|| ConfigError {
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
    operator::record_operator_action(store.as_ref(), now, "delegation/revoke", detail).await?;
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
