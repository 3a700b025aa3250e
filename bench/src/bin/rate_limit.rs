//! Rate-limit check cost: what one in-process check (a GCRA rate and a quota on one key, read and
//! advanced under the shard's lock) costs, on one hot key and spread over many keys, from one
//! thread and from several at once; and, with `--redis URL`, what one shared check costs (one
//! script, one round trip). The figures behind the "rate limit" rows of BENCHMARKS.md (target:
//! ≤ 2 µs in process). Run directly:
//!
//! ```text
//! rate-limit [--rounds 2000000] [--threads 4] [--keys 10000] [--redis redis://127.0.0.1:6379/ --redis-rounds 20000]
//! ```
//!
//! The limits are generous (nothing is refused) so every check takes the allowing path, which
//! writes. One JSON line per part on stdout.

// The allocator the palisade binary ships with, so the library is measured as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use palisade_server::rate_limits::local::{Cell, Table, check};
use palisade_server::rate_limits::{Limit, Quota, Rate, SharedCell, SharedStore as _, Verdict};

#[derive(Parser)]
struct Args {
    /// Checks per in-process part (per thread in the concurrent one).
    #[arg(long, default_value_t = 2_000_000)]
    rounds: u64,
    /// Threads of the concurrent part.
    #[arg(long, default_value_t = 4)]
    threads: u64,
    /// Keys the spread parts cycle through.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// A Redis or Valkey URL: also measure the shared check.
    #[arg(long)]
    redis: Option<String>,
    /// Shared checks to time.
    #[arg(long, default_value_t = 20_000)]
    redis_rounds: u64,
}

/// A rate and a quota nothing in a run reaches.
fn limits() -> [Limit; 2] {
    [
        Limit::Rate(Rate::new(1_000_000, 1, 1_000_000).expect("a valid rate")),
        Limit::Quota(Quota { limit: u64::from(u32::MAX), window_secs: 86_400 }),
    ]
}

/// Nanoseconds per check of `rounds` checks on `keys` keys of `table`, from this thread; each
/// check is one microsecond after the last one of any thread (`clock`, shared), so threads on one
/// key stay at the rate the limits allow.
fn run(table: &Table, keys: &[String], rounds: u64, clock: &AtomicU64) -> f64 {
    let [rate, quota] = limits();
    let started = Instant::now();
    for round in 0..rounds {
        let key = &keys[usize::try_from(round).unwrap_or(0) % keys.len()];
        let cells = [Cell { table, key, limit: rate }, Cell { table, key, limit: quota }];
        let verdict = check(black_box(&cells), clock.fetch_add(1, Ordering::Relaxed));
        assert_eq!(verdict, Verdict::Allowed, "the bench's limits must never refuse");
    }
    nanos_per(started.elapsed(), rounds)
}

fn nanos_per(elapsed: Duration, count: u64) -> f64 {
    elapsed.as_secs_f64() * 1e9 / count.max(1) as f64
}

/// One result line on stdout (the bench's output).
#[allow(clippy::print_stdout)]
fn emit(line: &serde_json::Value) {
    println!("{line}");
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let start_us = 1_700_000_000_000_000;
    let hot = vec!["6:tenant5:alice".to_owned()];
    let spread: Vec<String> =
        (0..args.keys).map(|i| format!("6:tenant{}:subject-{i}", i.to_string().len() + 7)).collect();

    let table = Table::new(1_000_000);
    let ns = run(&table, &hot, args.rounds, &AtomicU64::new(start_us));
    emit(&serde_json::json!({ "part": "local_one_key", "threads": 1, "ns_per_check": ns }));
    let table = Table::new(1_000_000);
    let ns = run(&table, &spread, args.rounds, &AtomicU64::new(start_us));
    emit(&serde_json::json!({ "part": "local_spread", "keys": args.keys, "threads": 1, "ns_per_check": ns }));

    for (part, keys) in [("local_one_key_concurrent", &hot), ("local_spread_concurrent", &spread)] {
        let table = Table::new(1_000_000);
        let clock = AtomicU64::new(start_us);
        let started = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..args.threads {
                scope.spawn(|| run(&table, keys, args.rounds, &clock));
            }
        });
        let ns = nanos_per(started.elapsed(), args.rounds * args.threads);
        emit(
            &serde_json::json!({ "part": part, "threads": args.threads, "ns_per_check_wall": ns, "keys": keys.len() }),
        );
    }

    if let Some(url) = &args.redis {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let store = palisade_host::rate_limits::RedisLimitStore::new(url, Duration::from_secs(2))?;
            let [rate, quota] = limits();
            let cells = [
                SharedCell { key: "palisade:rl:{bench}:r:0".into(), limit: rate },
                SharedCell { key: "palisade:rl:{bench}:q:0".into(), limit: quota },
            ];
            // The first check loads the script (SCRIPT LOAD on NOSCRIPT).
            store.check(&cells).await?;
            let mut samples = Vec::with_capacity(usize::try_from(args.redis_rounds).unwrap_or(0));
            for _ in 0..args.redis_rounds {
                let started = Instant::now();
                let verdict = store.check(&cells).await?;
                samples.push(started.elapsed());
                assert_eq!(verdict, Verdict::Allowed);
            }
            samples.sort();
            let at = |q: f64| {
                let index = ((samples.len() as f64 - 1.0) * q) as usize;
                samples.get(index).map_or(0.0, |d| d.as_secs_f64() * 1e6)
            };
            emit(
                &serde_json::json!({ "part": "redis", "checks": samples.len(), "p50_us": at(0.5), "p99_us": at(0.99) }),
            );
            anyhow::Ok(())
        })?;
    }
    Ok(())
}
