//! `gateway-relist`: how long the gateway takes to re-list every upstream and recompute its
//! registry, measured in process on the gateway's own code (`palisade_gateway::Gateway`) against
//! N loopback upstreams (`many-tools-upstream`), with every definition approved, on a SQLite
//! store in a fresh directory. Per round, three timings:
//!
//! - `list`: [`Gateway::refresh_all`], every upstream listed concurrently (all pages);
//! - `build`: one [`Gateway::build_app`]: pins observed, states read back from the store, the
//!   registry of every served definition assembled (what a rebuild does before publishing);
//! - `cycle`: a re-listing as the running gateway's loops do it when every upstream's timer
//!   fires together: N tasks, each [`Gateway::relist_unpublished`] (re-list its upstream; rebuild the
//!   registry only when the listing changed, concurrent rebuild requests merged into one).
//!
//! Prints one JSON line (stdout) with the median, minimum and maximum of each, and this
//! process's VmRSS after the rounds; a human summary on stderr.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_gateway::config::{RawGateway, RawPins, RawUpstream, validate};
use palisade_gateway::{Gateway, Refreshed};
use palisade_store::{PinDecision, PinVerdict, SqliteStore, Store};
use serde_json::json;

// The allocator the palisade binary uses, so the resident set is comparable.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "gateway-relist", about = "Times the gateway's re-listing of N upstreams (in process, loopback only)")]
struct Args {
    /// Base URL of `many-tools-upstream`, e.g. http://127.0.0.1:9000 (endpoints `/u<i>/mcp`).
    #[arg(long)]
    upstream_base: String,
    /// Upstreams to put behind the gateway (`/u0/mcp` … `/u<N-1>/mcp`).
    #[arg(long, default_value_t = 10)]
    upstreams: usize,
    /// Tools every upstream is expected to serve (checked after approval).
    #[arg(long, default_value_t = 100)]
    tools: usize,
    /// Measured rounds.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// A directory for the SQLite store (created; must not hold a store already).
    #[arg(long)]
    data_dir: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.upstreams > 0 && args.rounds > 0, "--upstreams and --rounds must be positive");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let base: hyper::Uri = args.upstream_base.parse().context("--upstream-base is not a URL")?;
    anyhow::ensure!(base.scheme_str() == Some("http"), "--upstream-base must be http://");
    let host = base.host().context("--upstream-base has no host")?.trim_matches(['[', ']']);
    let ip: std::net::IpAddr = host.parse().context("--upstream-base must name a loopback IP address")?;
    palisade_bench::require_loopback(&[std::net::SocketAddr::new(ip, base.port_u16().unwrap_or(80))])?;
    let raws = (0..args.upstreams)
        .map(|index| {
            let base = args.upstream_base.trim_end_matches('/');
            serde_json::from_value::<RawUpstream>(
                json!({ "id": format!("up{index}"), "url": format!("{base}/u{index}/mcp") }),
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .context("building the upstream entries")?;
    let settings =
        validate(RawGateway::default(), RawPins::default(), raws, None).context("validating the upstreams")?;

    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("creating {}", args.data_dir.display()))?;
    let db = args.data_dir.join("gateway.db");
    anyhow::ensure!(!db.exists(), "{} exists: give a fresh --data-dir", db.display());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db.to_string_lossy()).await.context("opening the store")?);
    let gateway = Gateway::new(settings, store.clone(), Arc::new(SystemClock)).context("starting the gateway")?;

    // The first listing records every definition as pending; then a reviewer approves them all.
    let started = Instant::now();
    gateway.refresh_all().await;
    gateway.build_app(None).await.context("the first build")?;
    let first = started.elapsed();
    let rows = store.pins(None).await.context("reading pins")?;
    for row in &rows {
        let decision = PinDecision {
            pin_id: row.observation.pin_id.clone(),
            digest: row.observation.digest.clone(),
            verdict: PinVerdict::Approved,
            reviewer: "bench".into(),
            note: None,
            signature: None,
            decided_at_ms: SystemClock.now_ms(),
        };
        anyhow::ensure!(store.decide_pin(decision).await.context("approving")?, "a definition changed while approving");
    }
    gateway.build_app(None).await.context("the build after approval")?;
    let served: usize = gateway.status().iter().map(|status| status.served).sum();
    let expected = args.upstreams * args.tools;
    anyhow::ensure!(
        served == expected,
        "{served} definitions served after approval, expected {expected} (are all upstreams up?)"
    );

    let (mut list, mut build, mut cycle) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        let at = Instant::now();
        gateway.refresh_all().await;
        list.push(at.elapsed());
        let at = Instant::now();
        gateway.build_app(None).await.context("a rebuild")?;
        build.push(at.elapsed());
        cycle.push(relist_cycle(&gateway, args.upstreams).await?);
        let served: usize = gateway.status().iter().map(|status| status.served).sum();
        anyhow::ensure!(served == expected, "{served} definitions served during the rounds, expected {expected}");
    }
    let rss_kib = vm_rss_kib();
    let ms = |d: Duration| (d.as_secs_f64() * 10_000.0).round() / 10.0;
    let stats = |samples: &mut Vec<Duration>| {
        samples.sort_unstable();
        let median = samples[samples.len() / 2];
        json!({ "median_ms": ms(median), "min_ms": ms(samples[0]), "max_ms": ms(samples[samples.len() - 1]) })
    };
    let line = json!({
        "upstreams": args.upstreams,
        "definitions": expected,
        "rounds": args.rounds,
        "first_listing_ms": ms(first),
        "list": stats(&mut list),
        "build": stats(&mut build),
        "cycle": stats(&mut cycle),
        "rss_kib": rss_kib,
    });
    #[allow(clippy::print_stdout)]
    {
        println!("{line}");
    }
    eprintln!(
        "gateway-relist: {} upstreams, {expected} definitions served; first listing {:.1} ms; median of {} rounds: \
         list {:.1} ms, build {:.1} ms, cycle {:.1} ms; VmRSS {} KiB",
        args.upstreams,
        ms(first),
        args.rounds,
        line["list"]["median_ms"].as_f64().unwrap_or(0.0),
        line["build"]["median_ms"].as_f64().unwrap_or(0.0),
        line["cycle"]["median_ms"].as_f64().unwrap_or(0.0),
        rss_kib.map_or_else(|| "?".to_owned(), |kib| kib.to_string()),
    );
    Ok(())
}

/// Every upstream re-listed by its own task, each followed by a rebuild, rebuilds serialized:
/// the running gateway's loops when all their timers fire together.
async fn relist_cycle(gateway: &Gateway, upstreams: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let tasks: Vec<_> = (0..upstreams)
        .map(|index| {
            let gateway = gateway.clone();
            tokio::spawn(async move {
                let outcome = gateway.relist_unpublished(index).await;
                anyhow::ensure!(outcome != Refreshed::Failed, "upstream {index} could not be listed");
                Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await.context("a re-listing task panicked")??;
    }
    Ok(started.elapsed())
}

/// This process's resident set (`VmRSS` of /proc/self/status), KiB.
fn vm_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
