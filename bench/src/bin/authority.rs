//! Kill-switch cost without HTTP in front: the development authority in this process on a
//! loopback port (mutual TLS, Ed25519 heads, SQLite), queried through `KillSwitch` exactly as
//! the server's stage 4 and a fenced handler's second phase do. One JSON line per measurement:
//!
//! - `pre_dispatch` latency, one caller (p50/p99): one signed head per target, one round trip;
//! - `pre_dispatch` + `pre_side_effect` latency, one caller: a fenced covered call's two phases
//!   (the second also issues one commit token per target, a write transaction);
//! - `pre_dispatch` throughput with `--tasks` callers: queries/s and signed heads/s.
//!
//! ```text
//! authority [--tasks 16] [--seconds 3]
//! ```

// The allocator the palisade binary ships with, so the library is measured as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use palisade_killswitch::dev::DevAuthorityFiles;
use palisade_killswitch::{Clock as _, ExposedOperation, KillSwitch, SystemClock, TargetKind, TargetValues};
use serde_json::json;

const OPERATION: &str = "tools/call:bench";

#[derive(Parser)]
struct Args {
    /// Concurrent callers for the throughput run.
    #[arg(long, default_value_t = 16)]
    tasks: usize,
    /// Measured seconds per run (after a half-second warm-up).
    #[arg(long, default_value_t = 3)]
    seconds: u64,
}

fn targets() -> TargetValues {
    TargetValues::new()
        .with(TargetKind::ServerRelease, "bench")
        .with(TargetKind::Tenant, "bench")
        .with(TargetKind::Client, "bench")
        .with(TargetKind::Tool, "bench")
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn latencies(switch: &KillSwitch, seconds: u64, both_phases: bool) -> anyhow::Result<Vec<u64>> {
    let targets = targets();
    let warm_up = Instant::now() + Duration::from_millis(500);
    while Instant::now() < warm_up {
        switch.pre_dispatch(OPERATION, &targets).await?;
    }
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut samples = Vec::new();
    while Instant::now() < end {
        let started = Instant::now();
        let clearance = switch.pre_dispatch(OPERATION, &targets).await?;
        if both_phases {
            switch.pre_side_effect(OPERATION, &targets, &clearance).await?;
        }
        samples.push(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
    }
    samples.sort_unstable();
    Ok(samples)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("palisade-authority-bench-{}", std::process::id()));
    let files = DevAuthorityFiles::new(dir.clone());
    let exposed = vec![ExposedOperation {
        key: OPERATION.to_owned(),
        has_side_effect: true,
        target_kind: Some(TargetKind::Tool),
    }];
    files.prepare(&exposed, SystemClock.now_ms())?;
    let authority = files.start_authority().await?;
    let switch = Arc::new(files.kill_switch(&authority.url, vec![OPERATION.to_owned()]).await?);

    for (label, both) in [("pre_dispatch", false), ("pre_dispatch+pre_side_effect", true)] {
        let samples = latencies(&switch, args.seconds, both).await?;
        let line = json!({ "label": label, "callers": 1, "targets": 2, "calls": samples.len(),
            "p50_us": percentile(&samples, 50.0), "p99_us": percentile(&samples, 99.0) });
        #[allow(clippy::print_stdout)]
        {
            println!("{line}");
        }
    }

    let count = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..args.tasks {
        let (switch, count, measuring, stop) = (switch.clone(), count.clone(), measuring.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let targets = targets();
            while !stop.load(Ordering::Relaxed) {
                switch.pre_dispatch(OPERATION, &targets).await?;
                if measuring.load(Ordering::Relaxed) {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    measuring.store(true, Ordering::SeqCst);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    measuring.store(false, Ordering::SeqCst);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await??;
    }
    let queries = count.load(Ordering::SeqCst) as f64 / elapsed;
    let line = json!({ "label": "pre_dispatch throughput", "callers": args.tasks, "targets": 2,
        "queries_per_s": queries.round(), "signed_heads_per_s": (queries * 2.0).round() });
    #[allow(clippy::print_stdout)]
    {
        println!("{line}");
    }
    drop(authority);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
