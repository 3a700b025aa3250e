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

#[derive(Debug)]
struct Counting {
    inner: Arc<dyn AuditStore>,
    batches: AtomicU64,
    nanos: AtomicU64,
}

impl AuditStore for Counting {
    fn append_batch(&self, records: Vec<palisade_store::AuditRecord>) -> palisade_store::StoreFuture<'_, ()> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.append_batch(records).await;
            self.nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            r
        })
    }
    fn verify_chain(&self) -> palisade_store::StoreFuture<'_, palisade_store::ChainReport> {
        self.inner.verify_chain()
    }
    fn recent(&self, limit: u32) -> palisade_store::StoreFuture<'_, Vec<palisade_store::StoredAuditRecord>> {
        self.inner.recent(limit)
    }
    fn ping(&self) -> palisade_store::StoreFuture<'_, ()> {
        self.inner.ping()
    }
    fn close(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        self.inner.close()
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = &args[1];
    let mode = args.get(2).map(String::as_str).unwrap_or("writer");
    let appenders: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(16);
    let seconds = 5;
    let store = Arc::new(Counting { inner: open_store(url).await.expect("open"), batches: AtomicU64::new(0), nanos: AtomicU64::new(0) });
    let rate = match mode {
        "direct" => direct_single(store.clone(), appenders, seconds).await,
        _ => through_writer(store.clone(), appenders, seconds).await,
    };
    let started = Instant::now();
    let report = store.verify_chain().await.expect("verify");
    let batches = store.batches.load(Ordering::Relaxed);
    eprintln!(
        "{mode} appenders={appenders}: {rate:.0} appends/s; {batches} batches, mean {:.1} records, mean commit {:.0} us; verify {} records intact={} in {:?}",
        report.records as f64 / batches as f64,
        store.nanos.load(Ordering::Relaxed) as f64 / batches as f64 / 1000.0,
        report.records,
        report.is_intact(),
        started.elapsed()
    );
}
