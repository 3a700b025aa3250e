//! `palisade audit verify|salvage|show|search|tail`: the audit log's hash chains and checkpoints
//! checked, a damaged segment salvaged, and the reading commands (`audit_read`) dispatched.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_host::secrets;

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Show the newest records (all, or those the filters match), oldest first, each checked
    /// against its hash. Reads only; exit 1 if a record shown does not match its hash, 2 if the
    /// log could not be read or a filter is bad.
    Show(#[command(flatten)] super::audit_read::ReadArgs),
    /// Show the records the filters match (at least one filter), like `show`. `--subject NAME`
    /// needs the server secret: records hold only keyed digests of `issuer#subject`.
    Search(#[command(flatten)] super::audit_read::ReadArgs),
    /// Show the newest records the filters match, then each new one as it is written, until
    /// interrupted (Ctrl-C), like `tail -f`.
    Tail {
        #[command(flatten)]
        read: super::audit_read::ReadArgs,
        /// Seconds between looks at the store (1–60).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=60))]
        interval: u64,
    },
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

/// Runs a `palisade audit` command.
pub async fn run(command: AuditCommand) -> anyhow::Result<ExitCode> {
    use super::audit_read::{self, Reading};
    match command {
        AuditCommand::Show(read) => audit_read::run(read, Reading::Show).await,
        AuditCommand::Search(read) => audit_read::run(read, Reading::Search).await,
        AuditCommand::Tail { read, interval } => audit_read::run(read, Reading::Tail { interval }).await,
        AuditCommand::Verify { config } => audit_verify(config.as_deref()).await,
        AuditCommand::Salvage { config, apply } => audit_salvage(config.as_deref(), apply).await,
    }
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
    let settings = super::settings(config)?;
    secrets::prepare_sqlite_dir(&settings)?;
    // The checkpoint key is derived from the deployment's server secret; verifying never creates
    // one (a new secret would only make every checkpoint look forged).
    let secret = secrets::existing_server_secret(&settings)
        .context("checkpoints are verified with the key derived from the server secret")?;
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
    let settings = super::settings(config)?;
    secrets::prepare_sqlite_dir(&settings)?;
    let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
    let segment = palisade_store::segment::SegmentConfig::new(&settings.audit.segment_dir);
    let report = palisade_store::segment::salvage(&segment, store.as_ref(), apply, SystemClock.now_unsigned_ms())
        .await
        .with_context(|| format!("salvaging the audit segment {}", settings.audit.segment_dir.display()))?;
    let mut damaged = false;
    #[allow(clippy::print_stdout)]
    {
        if report.is_empty() {
            println!("audit segment {}: no chain", settings.audit.segment_dir.display());
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
