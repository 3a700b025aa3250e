//! Ad-hoc throughput probe (not committed): appends/s through AuditWriter with 16 appenders.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use palisade_store::conformance::sample_record;
use palisade_store::{AuditStore, AuditWriter, AuditWriterConfig, open_store};

async fn through_writer(store: Arc<dyn AuditStore>, appenders: usize, seconds: u64) -> f64 {
    let writer = Arc::new(AuditWriter::new(store, AuditWriterConfig::default()));
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..appenders {
        let writer = writer.clone();
        let count = count.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = task as u64 * 1_000_000_000;
            while Instant::now() < deadline {
                writer.append(sample_record(n)).await.expect("append");
                n += 1;
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    writer.shutdown().await;
    count.load(Ordering::Relaxed) as f64 / elapsed
}

async fn direct_single(store: Arc<dyn AuditStore>, appenders: usize, seconds: u64) -> f64 {
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..appenders {
        let store = store.clone();
        let count = count.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = task as u64 * 1_000_000_000;
            while Instant::now() < deadline {
                store.append_batch(vec![sample_record(n)]).await.expect("append");
                n += 1;
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = &args[1];
    let mode = args.get(2).map(String::as_str).unwrap_or("writer");
    let appenders: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(16);
    let seconds = 5;
    let store = open_store(url).await.expect("open");
    let rate = match mode {
        "direct" => direct_single(store.clone(), appenders, seconds).await,
        _ => through_writer(store.clone(), appenders, seconds).await,
    };
    let started = Instant::now();
    let report = store.verify_chain().await.expect("verify");
    eprintln!(
        "{mode} appenders={appenders}: {rate:.0} appends/s; verify {} records intact={} in {:?}",
        report.records,
        report.is_intact(),
        started.elapsed()
    );
}
