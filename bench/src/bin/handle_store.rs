//! Handle-store capacity: owner-bound lookups per second (and their latency) on SQLite and, when
//! `DATABASE_URL` is set, PostgreSQL; the figure behind "resolves/s" in BENCHMARKS.md. Run through
//! `scripts/bench --store-only` or directly:
//!
//! ```text
//! handle-store [--tasks 16] [--seconds 5] [--handles 10000]
//! ```
//!
//! Each backend gets a fresh database (a temporary SQLite file; a new PostgreSQL schema, dropped
//! afterwards) holding `--handles` live handles of 50 owners; `--tasks` tasks then look up random
//! handles as their owners for `--seconds`. One JSON line per backend on stdout.

// The allocator the palisade binary ships with, so the library is measured as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use palisade_store::{HandleOwner, HandleStore, NewHandle, PostgresOptions, PostgresStore, SqliteStore, Store};

#[derive(Parser)]
struct Args {
    /// Concurrent lookup tasks.
    #[arg(long, default_value_t = 16)]
    tasks: usize,
    /// Measured seconds per backend (after a one-second warm-up).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Live handles in the table.
    #[arg(long, default_value_t = 10_000)]
    handles: u32,
}

fn owner(n: u32) -> HandleOwner {
    HandleOwner { subject_key: [(n % 50) as u8; 32], tenant: format!("tenant-{}", n % 5), client: "bench".into() }
}

fn digest(n: u32) -> [u8; 32] {
    let mut digest = [0u8; 32];
    digest[..4].copy_from_slice(&n.to_be_bytes());
    digest[31] = 0xa5;
    digest
}

async fn fill(store: &dyn HandleStore, count: u32) -> anyhow::Result<()> {
    for n in 0..count {
        store
            .insert_handle(NewHandle {
                digest: digest(n),
                owner: owner(n),
                object_type: "basket".into(),
                object_ref: format!("basket-{n}"),
                object_version: "1".into(),
                scopes: vec!["shop:basket".into()],
                policy_version: 1,
                created_ms: 1,
                expires_ms: i64::MAX,
            })
            .await?;
    }
    Ok(())
}

async fn measure(label: &str, store: Arc<dyn Store>, args: &Args) -> anyhow::Result<()> {
    fill(store.as_ref(), args.handles).await?;
    let warmup_end = Instant::now() + Duration::from_secs(1);
    let end = warmup_end + Duration::from_secs(args.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..args.tasks {
        let (store, handles) = (store.clone(), args.handles);
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut n = (task as u32).wrapping_mul(2_654_435_761);
            loop {
                n = n.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let pick = n % handles;
                let started = Instant::now();
                if started >= end {
                    break;
                }
                let found = store.lookup_handle(digest(pick), &owner(pick), 2).await?;
                anyhow::ensure!(found.is_some(), "handle {pick} did not resolve");
                if started >= warmup_end {
                    latencies.push(started.elapsed());
                }
            }
            Ok::<_, anyhow::Error>(latencies)
        });
    }
    let mut latencies = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        latencies.extend(joined??);
    }
    latencies.sort();
    let at = |q: f64| palisade_bench::percentile_us(&latencies, q);
    #[allow(clippy::print_stdout)]
    {
        println!(
            "{{\"backend\":\"{label}\",\"tasks\":{},\"handles\":{},\"resolves_per_sec\":{:.0},\"p50_us\":{},\"p99_us\":{}}}",
            args.tasks,
            args.handles,
            latencies.len() as f64 / args.seconds as f64,
            at(0.5),
            at(0.99)
        );
    }
    store.close().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("palisade-handle-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let sqlite = SqliteStore::open(&dir.join("bench.db").to_string_lossy()).await?;
    let result = measure("sqlite", Arc::new(sqlite), &args).await;
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    if let Some(url) = std::env::var("DATABASE_URL").ok().filter(|url| !url.is_empty()) {
        let schema = palisade_bench::PgSchema::create(&url, "handle_bench").await?;
        let options = PostgresOptions { max_connections: 8, ..PostgresOptions::default() };
        let store = PostgresStore::connect_with(&schema.url, options).await?;
        let result = measure("postgres", Arc::new(store), &args).await;
        schema.drop().await?;
        result?;
    }
    Ok(())
}
