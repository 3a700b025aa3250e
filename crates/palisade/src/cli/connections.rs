//! `palisade connections list|revoke`: the gateway's per-user upstream connections (never a
//! token), and one person's removed, recorded in the audit log.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_host::secrets;

use super::operator;

#[derive(Subcommand)]
pub enum ConnectionsCommand {
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

/// Runs a `palisade connections` command.
pub async fn run(command: ConnectionsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ConnectionsCommand::List { subject, config } => connections_list(config.as_deref(), subject.as_deref()).await,
        ConnectionsCommand::Revoke { subject, issuer, upstream, reason, config } => {
            connections_revoke(config.as_deref(), &subject, issuer.as_deref(), upstream.as_deref(), &reason).await
        }
    }
}

/// The person a stored connection's label names (`{"issuer","subject","tenant"}`).
fn connection_person(row: &palisade_store::ConnectionRow) -> Option<palisade_gateway::user_oauth::Person> {
    serde_json::from_str(&row.principal).ok()
}

async fn connections_list(config: Option<&Path>, subject: Option<&str>) -> anyhow::Result<ExitCode> {
    let settings = super::settings(config)?;
    secrets::prepare_sqlite_dir(&settings)?;
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
            "subject={} issuer={} tenant={} upstream={} authorization_server={} client_id={} scopes=\"{}\" created={} updated={}",
            person.subject,
            person.issuer,
            person.tenant.as_deref().unwrap_or("-"),
            row.upstream,
            row.issuer,
            row.client_id,
            row.scopes,
            palisade_base::time::format_rfc3339_ms(row.created_ms),
            palisade_base::time::format_rfc3339_ms(row.updated_ms)
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
    let settings = super::settings(config)?;
    secrets::prepare_sqlite_dir(&settings)?;
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
    operator::record_operator_action(store.as_ref(), now, "connections/revoke", detail).await?;
    #[allow(clippy::print_stdout)]
    {
        println!("removed {removed} connection(s)");
    }
    Ok(if removed > 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
