//! Audit-log cost: what one decision's record costs to link onto the hash chain, and how many
//! records a server's group-committing writer makes durable per second on the embedded store.
//! The figures behind the "audit" rows of BENCHMARKS.md. Run directly:
//!
//! ```text
//! audit-append [--tasks 16] [--seconds 5] [--hash-rounds 200000] [--rate N] [--backend sqlite|postgres]
//! ```
//!
//! 1. **Chain hash** of a typical allow record (three principal digests, two scopes): the
//!    store's `chain_hash` (canonical JSON written field by field) against the generic route it
//!    replaced (the record through `serde_json::Value`, then `palisade_base`'s RFC 8785 form),
//!    alternating in blocks in one run; both must produce the same hash or the run fails.
//! 2. **The writer, in each mode**: `--tasks` tasks append through an `AuditWriter` into a fresh
//!    SQLite file (WAL, the server's settings) for `--seconds`, each awaiting its append as a
//!    request does: `group_commit` (the direct mode: a transaction per batch before the answer),
//!    `segment` (what `palisade serve` runs: the record written to the local segment file, the
//!    shipper committing batches into the same SQLite file in the background) and
//!    `segment_power` (also `fdatasync`ed, group-committed). Then the writer is shut down (the
//!    segment shipped) and the store verified: every acknowledged record must be in it.
//!    Appends/s, latency, and this process's CPU per append (the shipper's commits included).
//! 3. **When the store falls behind.** Appending as fast as the tasks can outruns any store; the
//!    segment then grows until its backlog cap, after which appends are *refused* (the server
//!    answers 503 and counts `palisade_audit_append_failures_total`) — never acknowledged and
//!    lost. Such refusals are counted and reported (`refused`, and when the first came), not an
//!    abort; with `--rate N` the tasks together append N records a second (a server's request
//!    rate), and the report says whether the shipper kept up: the backlog and the shipping lag
//!    at the end of the window. `--backend postgres` ships into the PostgreSQL database
//!    `DATABASE_URL` names (a schema of its own, dropped at the end) instead of a SQLite file;
//!    `--max-backlog-bytes` lowers the segment's cap (default: the server's).
//!
//! One JSON line per part on stdout.

// The allocator the palisade binary ships with, so the library is measured as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use palisade_store::segment::{Durability, SegmentConfig};
use palisade_store::{AuditRecord, AuditStore, AuditWriter, AuditWriterConfig, Decision, GENESIS_HASH, SqliteStore};

#[derive(Parser)]
struct Args {
    /// Concurrent appending tasks (requests in flight).
    #[arg(long, default_value_t = 16)]
    tasks: usize,
    /// Measured seconds of appends (after a one-second warm-up).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Records hashed per variant in the chain-hash part.
    #[arg(long, default_value_t = 200_000)]
    hash_rounds: u32,
    /// Appends per second across all tasks (0: as fast as they can).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// The store the segment ships into: `sqlite` (a fresh file) or `postgres` (`DATABASE_URL`).
    #[arg(long, default_value = "sqlite")]
    backend: String,
    /// The segment's backlog cap in bytes (default: the server's).
    #[arg(long)]
    max_backlog_bytes: Option<u64>,
}

/// The working directory of one part (the segment, and the SQLite file).
fn part_dir(mode: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("palisade-audit-bench-{}-{mode}", std::process::id()))
}

/// The store of one part, and how to clean it up.
enum Target {
    Sqlite,
    Postgres { admin: String, schema: String },
}

impl Target {
    async fn open(args: &Args, mode: &str) -> anyhow::Result<(Self, Arc<dyn AuditStore>)> {
        let dir = part_dir(mode);
        std::fs::create_dir_all(&dir)?;
        if args.backend == "postgres" {
            let admin =
                std::env::var("DATABASE_URL").map_err(|_| anyhow::anyhow!("--backend postgres needs DATABASE_URL"))?;
            let schema = format!("audit_bench_{}_{mode}", std::process::id());
            let pool = sqlx::PgPool::connect(&admin).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&pool).await?;
            pool.close().await;
            let separator = if admin.contains('?') { '&' } else { '?' };
            let url = format!("{admin}{separator}options=-c%20search_path%3D{schema}");
            let store: Arc<dyn AuditStore> = Arc::new(palisade_store::PostgresStore::connect(&url).await?);
            return Ok((Target::Postgres { admin, schema }, store));
        }
        anyhow::ensure!(args.backend == "sqlite", "--backend is sqlite or postgres");
        let store: Arc<dyn AuditStore> = Arc::new(SqliteStore::open(&dir.join("audit.db").to_string_lossy()).await?);
        Ok((Target::Sqlite, store))
    }

    async fn remove(self, mode: &str) -> anyhow::Result<()> {
        let _ = std::fs::remove_dir_all(part_dir(mode));
        if let Target::Postgres { admin, schema } = self {
            let pool = sqlx::PgPool::connect(&admin).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(&pool).await?;
            pool.close().await;
        }
        Ok(())
    }
}

/// A record shaped like the allow decision of an authenticated `tools/call`.
fn record(n: u64) -> AuditRecord {
    AuditRecord {
        at_ms: 1_764_000_000_000 + n,
        trace_id: format!("{n:032x}"),
        stage: "audit".into(),
        decision: Decision::Allow,
        operation: "tools/call:product_get".into(),
        principal_digest: Some("3f1c0b9a7e5d42618f0e2d4c6b8a9071".into()),
        tenant_digest: Some("a7e5d42618f0e2d43f1c0b9a6b8a9071".into()),
        client_digest: Some("0e2d4c6b8a90713f1c0b9a7e5d42618f".into()),
        scopes: vec!["shop:basket".into(), "shop:read".into()],
        policy_version: None,
        code: None,
        detail: None,
    }
}

/// The generic route: `Serialize` into a `Value`, then the canonical form of that.
fn generic_hash(prev_hash: &[u8; 32], record: &AuditRecord) -> [u8; 32] {
    let value = serde_json::to_value(record).expect("a record serializes");
    let mut input = prev_hash.to_vec();
    input.extend(palisade_base::canonical::canonical_bytes(&value));
    let mut hash = [0u8; 32];
    hash.copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &input).as_ref());
    hash
}

fn hash_part(rounds: u32) -> anyhow::Result<()> {
    let records: Vec<AuditRecord> = (0..64).map(record).collect();
    for record in &records {
        anyhow::ensure!(
            palisade_store::chain_hash(&GENESIS_HASH, record) == generic_hash(&GENESIS_HASH, record),
            "the two routes disagree on a record's hash"
        );
    }
    let (mut direct, mut generic) = (Duration::ZERO, Duration::ZERO);
    let block = 1000u32;
    let mut prev = GENESIS_HASH;
    for round in 0..rounds.div_ceil(block) {
        let started = Instant::now();
        for n in 0..block {
            prev = palisade_store::chain_hash(&prev, black_box(&records[((round + n) % 64) as usize]));
        }
        direct += started.elapsed();
        let started = Instant::now();
        for n in 0..block {
            prev = generic_hash(&prev, black_box(&records[((round + n) % 64) as usize]));
        }
        generic += started.elapsed();
    }
    black_box(prev);
    let hashed = f64::from(rounds.div_ceil(block) * block);
    let per = |total: Duration| total.as_nanos() as f64 / hashed;
    #[allow(clippy::print_stdout)]
    {
        println!(
            "{{\"part\":\"chain_hash\",\"records\":{hashed},\"direct_ns\":{:.0},\"generic_ns\":{:.0},\"speedup\":{:.2}}}",
            per(direct),
            per(generic),
            per(generic) / per(direct)
        );
    }
    Ok(())
}

async fn commit_part(args: &Args, mode: &str) -> anyhow::Result<()> {
    let (target, store) = Target::open(args, mode).await?;
    let mut segment = SegmentConfig::new(part_dir(mode).join("segment"));
    if let Some(cap) = args.max_backlog_bytes {
        segment.max_backlog_bytes = cap;
    }
    let writer = Arc::new(match mode {
        "group_commit" => AuditWriter::new(store.clone(), AuditWriterConfig::default()),
        _ => {
            if mode == "segment_power" {
                segment.durability = Durability::Power;
            }
            AuditWriter::with_segment(store.clone(), segment, AuditWriterConfig::default()).await?
        }
    });
    let begun = Instant::now();
    let warmup_end = begun + Duration::from_secs(1);
    let end = warmup_end + Duration::from_secs(args.seconds);
    // With --rate, each task appends at rate/tasks a second on a fixed schedule.
    let interval = (args.rate > 0).then(|| Duration::from_secs_f64(args.tasks as f64 / args.rate as f64));
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..args.tasks {
        let writer = writer.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut refused: Vec<Duration> = Vec::new();
            let mut n = task as u64 * 1_000_000_000;
            let mut ticks = interval.map(|every| {
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                ticks
            });
            loop {
                if let Some(ticks) = ticks.as_mut() {
                    ticks.tick().await;
                }
                let started = Instant::now();
                if started >= end {
                    break;
                }
                n += 1;
                match writer.append(record(n)).await {
                    Ok(()) => {
                        if started >= warmup_end {
                            latencies.push(started.elapsed());
                        }
                    }
                    // Refused (the backlog is full): the request would get 503; nothing was
                    // acknowledged. Counted, not fatal; any other error is.
                    Err(palisade_store::StoreError::Unavailable { .. }) => refused.push(started - begun),
                    Err(error) => return Err(error.into()),
                }
                // A request goes on to other work after its append: let the runtime's other
                // tasks (the shipper among them) run, as they would in a server.
                tokio::task::yield_now().await;
            }
            Ok::<_, anyhow::Error>((latencies, refused))
        });
    }
    // The backlog as the measured window ends.
    let probe = writer.clone();
    let at_end = tokio::spawn(async move {
        tokio::time::sleep_until(end.into()).await;
        probe.shipping()
    });
    // The process's CPU over the measured window, read by a thread of its own at its start and
    // end (a runtime task could be scheduled late while the appenders keep the workers busy).
    let window_cpu = std::thread::spawn(move || {
        std::thread::sleep(warmup_end.saturating_duration_since(Instant::now()));
        let before = palisade_bench::cpu_seconds("self");
        std::thread::sleep(end.saturating_duration_since(Instant::now()));
        palisade_bench::cpu_seconds("self").zip(before).map(|(after, before)| after - before)
    });
    let mut latencies = Vec::new();
    let mut refused = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (acknowledged, refusals) = joined??;
        latencies.extend(acknowledged);
        refused.extend(refusals);
    }
    let cpu = window_cpu.join().ok().flatten();
    let shipping = at_end.await?;
    writer.shutdown().await;
    let report = store.verify_chain().await?;
    store.close().await;
    target.remove(mode).await?;
    anyhow::ensure!(report.is_intact(), "the audit chain is broken: {:?}", report.first_break);
    anyhow::ensure!(report.records as usize >= latencies.len(), "acknowledged records are missing from the store");
    let first_refusal = refused.iter().min().map_or("null".to_owned(), |at| format!("{:.2}", at.as_secs_f64()));
    latencies.sort();
    let appends = latencies.len() as f64;
    let at = |q: f64| palisade_bench::percentile_us(&latencies, q);
    let cpu_us = cpu.map_or("null".to_owned(), |seconds| format!("{:.1}", seconds * 1e6 / appends));
    #[allow(clippy::print_stdout)]
    {
        println!(
            "{{\"part\":\"{mode}\",\"backend\":\"{}\",\"tasks\":{},\"rate\":{},\"appends_per_sec\":{:.0},\"p50_us\":{},\"p99_us\":{},\"cpu_us_per_append\":{cpu_us},\"refused\":{},\"first_refusal_s\":{first_refusal},\"backlog_bytes_at_end\":{},\"lag_ms_at_end\":{},\"chain_records\":{}}}",
            args.backend,
            args.tasks,
            args.rate,
            appends / args.seconds as f64,
            at(0.5),
            at(0.99),
            refused.len(),
            shipping.backlog_bytes,
            shipping.lag.as_millis(),
            report.records
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.tasks > 0 && args.seconds > 0 && args.hash_rounds > 0, "every figure must be positive");
    hash_part(args.hash_rounds)?;
    for mode in ["group_commit", "segment", "segment_power"] {
        commit_part(&args, mode).await?;
    }
    Ok(())
}
