//! Kill-switch cost without HTTP in front: the development authority on a loopback port (mutual
//! TLS, Ed25519, SQLite written through, state answered from memory) — in a child process of
//! this binary, so its CPU is measured apart — queried through `KillSwitch` exactly as the
//! server's stage 4 and a fenced handler's second phase do; four targets per query
//! (server_release, tenant, client, tool), as every generated rule asks. One JSON line per
//! measurement:
//!
//! - `pre_dispatch` latency, one caller (p50/p99);
//! - `pre_dispatch` + `pre_side_effect` latency, one caller: a fenced covered call's two phases
//!   (the second also issues one commit token per target, a write transaction);
//! - throughput with `--tasks` callers, `pre_dispatch` alone and both phases: covered calls/s,
//!   authority requests (= signatures) per second, queries per request, and CPU per covered
//!   call of the client side (this process) and of the authority (the child).
//!
//! ```text
//! authority [--tasks 16] [--seconds 3] [--single]
//! ```

// The allocator the palisade binary ships with, so the library is measured as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_killswitch::dev::DevAuthorityFiles;
use palisade_killswitch::{
    AuthorityClient, ExposedOperation, HeadEnvelope, KillSwitch, KillSwitchConfig, TargetKey, TargetKind, TargetValues,
};
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
    /// Use the single-query v2 envelope instead of the batched one.
    #[arg(long)]
    single: bool,
    /// Internal: run the development authority in `DIR` and print its URL.
    #[arg(long, hide = true)]
    child_authority: Option<std::path::PathBuf>,
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

/// CPU time (user + system) of a process so far, from /proc (Linux), in microseconds.
fn cpu_us(pid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0 };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else { return 0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    // USER_HZ is 100 on Linux.
    ticks * 10_000
}

async fn child_authority(dir: std::path::PathBuf) -> anyhow::Result<()> {
    let files = DevAuthorityFiles::new(dir);
    let authority = files.start_authority().await?;
    #[allow(clippy::print_stdout)]
    {
        println!("{}", authority.url);
    }
    // Serve until the parent closes our stdin.
    let mut sink = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
    drop(authority);
    Ok(())
}

fn emit(line: serde_json::Value) {
    #[allow(clippy::print_stdout)]
    {
        println!("{line}");
    }
}

async fn throughput(
    switch: &Arc<KillSwitch>,
    tasks: usize,
    seconds: u64,
    both_phases: bool,
    child_pid: &str,
) -> anyhow::Result<serde_json::Value> {
    let count = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (switch, count, measuring, stop) = (switch.clone(), count.clone(), measuring.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            let targets = targets();
            while !stop.load(Ordering::Relaxed) {
                let clearance = switch.pre_dispatch(OPERATION, &targets).await?;
                if both_phases {
                    switch.pre_side_effect(OPERATION, &targets, &clearance).await?;
                }
                if measuring.load(Ordering::Relaxed) {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (batches_before, queries_before) = switch.batch_stats().unwrap_or_default();
    let (own_before, child_before) = (cpu_us("self"), cpu_us(child_pid));
    measuring.store(true, Ordering::SeqCst);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    measuring.store(false, Ordering::SeqCst);
    let elapsed = started.elapsed().as_secs_f64();
    let (own_after, child_after) = (cpu_us("self"), cpu_us(child_pid));
    let (batches_after, queries_after) = switch.batch_stats().unwrap_or_default();
    stop.store(true, Ordering::SeqCst);
    for handle in handles {
        handle.await??;
    }
    let calls = count.load(Ordering::SeqCst) as f64;
    let phases = if both_phases { 2.0 } else { 1.0 };
    let batches = (batches_after - batches_before) as f64;
    let queries = (queries_after - queries_before) as f64;
    let signatures_per_s =
        if switch.batch_stats().is_some() { batches / elapsed } else { calls * phases * 4.0 / elapsed };
    Ok(json!({
        "label": if both_phases { "pre_dispatch+pre_side_effect throughput" } else { "pre_dispatch throughput" },
        "callers": tasks, "targets": 4,
        "covered_calls_per_s": (calls / elapsed).round(),
        "queries_per_s": (calls * phases / elapsed).round(),
        "authority_signatures_per_s": signatures_per_s.round(),
        "queries_per_batch": if batches > 0.0 { (queries / batches * 10.0).round() / 10.0 } else { 1.0 },
        "client_cpu_us_per_call": ((own_after - own_before) as f64 / calls).round(),
        "authority_cpu_us_per_call": ((child_after - child_before) as f64 / calls).round(),
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(dir) = args.child_authority {
        return child_authority(dir).await;
    }
    let dir = std::env::temp_dir().join(format!("palisade-authority-bench-{}", std::process::id()));
    let files = DevAuthorityFiles::new(dir.clone());
    let exposed = vec![ExposedOperation {
        key: OPERATION.to_owned(),
        has_side_effect: true,
        target_kinds: vec![TargetKind::Tool],
    }];
    files.prepare(&exposed, SystemClock.now_ms())?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("--child-authority")
        .arg(&dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let child_pid = child.id().to_string();
    let mut lines = std::io::BufReader::new(child.stdout.take().ok_or_else(|| anyhow::anyhow!("child stdout"))?);
    let mut url = String::new();
    std::io::BufRead::read_line(&mut lines, &mut url)?;
    let url = url.trim().to_owned();
    let mut config = files.client_config(&url)?;
    if args.single {
        config.envelope = HeadEnvelope::Single;
    }
    let policy = palisade_killswitch::Policy::load(&files.policy_files(), SystemClock.now_ms())?;
    let store =
        palisade_killswitch::SqliteGenerationStore::open(files.generation_db().to_str().unwrap_or_default()).await?;
    let switch = Arc::new(
        KillSwitch::start(KillSwitchConfig {
            policy,
            exposed_operations: vec![OPERATION.to_owned()],
            authority: AuthorityClient::new(config)?,
            store: Arc::new(store),
            target_key: TargetKey::read(&files.target_key())?,
            clock: Arc::new(SystemClock),
        })
        .await?,
    );
    let envelope = if args.single { "single" } else { "batch" };

    for (label, both) in [("pre_dispatch", false), ("pre_dispatch+pre_side_effect", true)] {
        let samples = latencies(&switch, args.seconds, both).await?;
        emit(json!({ "label": label, "envelope": envelope, "callers": 1, "targets": 4, "calls": samples.len(),
            "p50_us": percentile(&samples, 50.0), "p99_us": percentile(&samples, 99.0) }));
    }
    for both in [false, true] {
        let mut line = throughput(&switch, args.tasks, args.seconds, both, &child_pid).await?;
        line["envelope"] = json!(envelope);
        emit(line);
    }
    drop(child.stdin.take());
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
