//! `AuditWriter`: what the request path appends audit records through, in one of two modes.
//!
//! - **Segment** ([`AuditWriter::with_segment`], what `palisade serve` runs): the record goes to
//!   the instance's own chain in its local [segment](crate::segment) file — one `write(2)`, or
//!   also a group-committed `fdatasync` under [`Durability::Power`](crate::segment::Durability) —
//!   and the caller is answered; a shipper task moves what was written into the store in large
//!   batches (one transaction each, keyed by chain and seq, so shipping again is harmless). The
//!   request path shares nothing with other writers: no database round trip, row or lock.
//! - **Direct** ([`AuditWriter::new`], for a store without a local directory, e.g. in memory):
//!   group commit. Concurrent appends queue while a batch commits and go out together as the next
//!   batch, one transaction on the store handle's own chain, each caller answered once its batch
//!   is durable.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::segment::{self, ChainShipper, SegmentConfig, SegmentLog};
use crate::{AuditRecord, AuditStore, StoreError};

/// Tuning for an [`AuditWriter`].
#[derive(Debug, Clone)]
pub struct AuditWriterConfig {
    /// Records that may wait in the queue (direct mode); further appends wait for room.
    pub queue_capacity: usize,
    /// Most records in one batch (one `append_batch` call, direct mode).
    pub max_batch: usize,
    /// How long a caller waits for its record's batch to commit (direct mode) before it gets
    /// [`StoreError::Unavailable`]. The batch may still commit after that (the answer was
    /// already "failed", so the request was refused: fail closed, at worst an extra record).
    pub commit_timeout: Duration,
    /// How long the shipper waits after the first of a burst of appends before it ships
    /// (segment mode): longer means larger batches and fewer store transactions.
    pub ship_delay: Duration,
}

impl Default for AuditWriterConfig {
    fn default() -> Self {
        AuditWriterConfig {
            queue_capacity: 8192,
            max_batch: 512,
            commit_timeout: Duration::from_secs(5),
            ship_delay: Duration::from_millis(20),
        }
    }
}

struct Pending {
    record: AuditRecord,
    done: oneshot::Sender<Result<(), StoreError>>,
}

// Boxing the record would cost an allocation per append to shrink a message sent once.
#[allow(clippy::large_enum_variant)]
enum Job {
    Append(Pending),
    /// Sent by [`AuditWriter::shutdown`]: close the queue, commit what is in it, end.
    Stop,
}

enum Mode {
    Direct {
        queue: mpsc::Sender<Job>,
        commit_timeout: Duration,
        task: Mutex<Option<JoinHandle<()>>>,
    },
    Segment {
        log: Arc<SegmentLog>,
        closed: std::sync::atomic::AtomicBool,
        stop: watch::Sender<bool>,
        task: Mutex<Option<JoinHandle<()>>>,
    },
}

/// Where shipping the local segment into the store stands ([`AuditWriter::shipping`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shipping {
    /// Record bytes in the segment and not yet in the store.
    pub backlog_bytes: u64,
    /// How long the oldest of them has waited, at most (since the backlog was last empty).
    pub lag: Duration,
}

/// The request path's audit writer. Cheap to share behind an `Arc`.
///
/// **Invariant:** [`append`](AuditWriter::append) returns `Ok` only once its record is durable
/// (in the segment file, or committed in the store in direct mode); on any error the record may
/// be missing and the caller refuses the request.
pub struct AuditWriter {
    mode: Mode,
}

impl std::fmt::Debug for AuditWriter {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.mode {
            Mode::Direct { queue, .. } => formatter
                .debug_struct("AuditWriter")
                .field("queued", &(queue.max_capacity() - queue.capacity()))
                .finish(),
            Mode::Segment { log, .. } => formatter
                .debug_struct("AuditWriter")
                .field("chain", &log.chain())
                .field("backlog", &log.backlog_bytes())
                .finish(),
        }
    }
}

impl AuditWriter {
    /// Direct mode: group commit into `store` from a Tokio task. Call inside a Tokio runtime.
    pub fn new(store: Arc<dyn AuditStore>, config: AuditWriterConfig) -> Self {
        let max_batch = config.max_batch.max(1);
        let (queue, receiver) = mpsc::channel(config.queue_capacity.max(1));
        let task = tokio::spawn(run(store, receiver, max_batch, config.commit_timeout));
        AuditWriter {
            mode: Mode::Direct { queue, commit_timeout: config.commit_timeout, task: Mutex::new(Some(task)) },
        }
    }

    /// Segment mode: opens (recovering) the segment directory and starts the shipper, which first
    /// ships whatever an earlier run left unshipped. Fails if the directory cannot be used or a
    /// segment file is damaged (the server does not start: fail closed). Call inside a Tokio runtime.
    pub async fn with_segment(
        store: Arc<dyn AuditStore>,
        segment: SegmentConfig,
        config: AuditWriterConfig,
    ) -> Result<Self, StoreError> {
        let logs = segment::open(&segment, store.as_ref()).await?;
        let live = logs.iter().find(|log| log.is_live()).cloned().ok_or(StoreError::Closed)?;
        tracing::info!(chain = %live.chain(), recovered = logs.len() - 1, "audit segment open");
        let (stop, stopped) = watch::channel(false);
        let shippers = logs.into_iter().map(ChainShipper::new).collect();
        let task = tokio::spawn(ship_loop(store, shippers, live.clone(), stopped, config.ship_delay));
        Ok(AuditWriter {
            mode: Mode::Segment {
                log: live,
                closed: std::sync::atomic::AtomicBool::new(false),
                stop,
                task: Mutex::new(Some(task)),
            },
        })
    }

    /// The chain this writer appends to, in segment mode.
    pub fn chain(&self) -> Option<&str> {
        match &self.mode {
            Mode::Segment { log, .. } => Some(log.chain()),
            Mode::Direct { .. } => None,
        }
    }

    /// Where shipping the segment into the store stands (direct mode: nothing ever waits).
    pub fn shipping(&self) -> Shipping {
        match &self.mode {
            Mode::Segment { log, .. } => Shipping { backlog_bytes: log.backlog_bytes(), lag: log.shipping_lag() },
            Mode::Direct { .. } => Shipping::default(),
        }
    }

    /// Appends `record`: `Ok` once it is durable (see the type's invariant). A record that breaks
    /// [`AuditRecord::validate`] fails alone.
    pub async fn append(&self, record: AuditRecord) -> Result<(), StoreError> {
        record.validate()?;
        match &self.mode {
            Mode::Segment { log, closed, .. } => {
                if closed.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(StoreError::Closed);
                }
                log.append(&record).await
            }
            Mode::Direct { queue, commit_timeout, .. } => {
                let (done, answer) = oneshot::channel();
                queue.send(Job::Append(Pending { record, done })).await.map_err(|_| StoreError::Closed)?;
                match tokio::time::timeout(*commit_timeout, answer).await {
                    Ok(answer) => answer.unwrap_or(Err(StoreError::Closed)),
                    Err(_) => Err(StoreError::unavailable("append (commit timed out)")),
                }
            }
        }
    }

    /// Refuses further appends, commits (direct) or ships (segment: for up to 5 s; what is left
    /// stays in the segment for the next start) what was written, and ends the background task.
    pub async fn shutdown(&self) {
        let task = match &self.mode {
            Mode::Direct { queue, task, .. } => {
                let _ = queue.send(Job::Stop).await;
                take(task)
            }
            Mode::Segment { closed, stop, task, .. } => {
                closed.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = stop.send(true);
                take(task)
            }
        };
        if let Some(task) = task
            && let Err(error) = task.await
        {
            tracing::error!(%error, "audit writer task ended abnormally");
        }
    }
}

fn take(task: &Mutex<Option<JoinHandle<()>>>) -> Option<JoinHandle<()>> {
    match task.lock() {
        Ok(mut guard) => guard.take(),
        Err(poisoned) => poisoned.into_inner().take(),
    }
}

/// Ships every chain's segment until stopped: after each burst of appends (waiting `delay` to
/// gather more), at least every second, and backing off while the store fails. A final pass
/// runs on stop.
async fn ship_loop(
    store: Arc<dyn AuditStore>,
    mut shippers: Vec<ChainShipper>,
    live: Arc<SegmentLog>,
    mut stopped: watch::Receiver<bool>,
    delay: Duration,
) {
    let mut backoff = Duration::from_millis(50);
    let mut failing = false;
    loop {
        let stopping = *stopped.borrow();
        let mut failed = false;
        let mut index = 0;
        while index < shippers.len() {
            let pass = shippers[index].ship_available(store.as_ref());
            let result = if stopping {
                tokio::time::timeout(Duration::from_secs(5), pass)
                    .await
                    .unwrap_or_else(|_| Err(StoreError::unavailable("ship (shutting down)")))
            } else {
                pass.await
            };
            match result {
                Ok(true) => {
                    tracing::info!(chain = %shippers[index].log().chain(), "recovered audit chain shipped and removed");
                    shippers.remove(index);
                    continue;
                }
                Ok(false) => {}
                Err(error) => {
                    failed = true;
                    if !failing {
                        tracing::error!(%error, chain = %shippers[index].log().chain(), "shipping the audit segment failed; records stay in the segment and are shipped once the store takes them");
                    }
                }
            }
            index += 1;
        }
        if stopping {
            if failed {
                tracing::warn!(
                    backlog = live.backlog_bytes(),
                    "audit records left unshipped at shutdown; they are shipped at the next start"
                );
            }
            return;
        }
        if failed != failing {
            if !failed {
                tracing::info!("shipping the audit segment works again");
            }
            failing = failed;
        }
        let wait = if failed {
            backoff = (backoff * 2).min(Duration::from_secs(2));
            backoff
        } else {
            backoff = Duration::from_millis(50);
            Duration::from_secs(1)
        };
        tokio::select! {
            _ = live.appended(wait) => {
                if !failed {
                    tokio::time::sleep(delay).await;
                }
            }
            _ = stopped.changed() => {}
        }
    }
}

async fn run(
    store: Arc<dyn AuditStore>,
    mut receiver: mpsc::Receiver<Job>,
    max_batch: usize,
    commit_timeout: Duration,
) {
    let mut jobs = Vec::with_capacity(max_batch);
    while receiver.recv_many(&mut jobs, max_batch).await > 0 {
        let (records, waiters) = take_batch(&mut jobs, &mut receiver);
        if records.is_empty() {
            continue;
        }
        let count = records.len();
        let result = match tokio::time::timeout(commit_timeout, store.append_batch(records)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::unavailable("append (commit timed out)")),
        };
        answer(waiters, count, result);
    }
}

type Waiter = oneshot::Sender<Result<(), StoreError>>;

fn take_batch(jobs: &mut Vec<Job>, receiver: &mut mpsc::Receiver<Job>) -> (Vec<AuditRecord>, Vec<Waiter>) {
    let mut records = Vec::with_capacity(jobs.len());
    let mut waiters = Vec::with_capacity(jobs.len());
    for job in jobs.drain(..) {
        match job {
            Job::Append(pending) => {
                records.push(pending.record);
                waiters.push(pending.done);
            }
            Job::Stop => receiver.close(),
        }
    }
    (records, waiters)
}

fn answer(waiters: Vec<Waiter>, count: usize, result: Result<(), StoreError>) {
    match &result {
        Ok(()) => tracing::trace!(records = count, "audit batch committed"),
        Err(error) => tracing::warn!(%error, records = count, "audit batch failed; its callers fail closed"),
    }
    for waiter in waiters {
        let _ = waiter.send(result.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::SegmentConfig;
    use crate::store::StoreFuture;
    use crate::{ChainHead, ChainReport, CheckpointedHeads, Decision, StoredAuditRecord, StoredCheckpoint};
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::Semaphore;

    /// Records every batch; optionally fails; optionally holds the first batch until released.
    #[derive(Debug, Default)]
    struct FakeStore {
        /// Batch sizes as they enter `append_batch` (before the gate).
        entered: Mutex<Vec<usize>>,
        batches: Mutex<Vec<Vec<AuditRecord>>>,
        fail: AtomicBool,
        gate: Option<Arc<Semaphore>>,
    }

    impl AuditStore for FakeStore {
        fn ship(&self, _chain: &str, _records: Vec<StoredAuditRecord>) -> StoreFuture<'_, ()> {
            Box::pin(async { Err(StoreError::unavailable("ship")) })
        }
        fn append_batch(&self, records: Vec<AuditRecord>) -> StoreFuture<'_, ()> {
            self.entered.lock().unwrap().push(records.len());
            Box::pin(async move {
                if let Some(gate) = &self.gate {
                    let _permit = gate.acquire().await.map_err(|_| StoreError::Closed)?;
                }
                if self.fail.load(Ordering::SeqCst) {
                    return Err(StoreError::unavailable("append"));
                }
                self.batches.lock().unwrap().push(records);
                Ok(())
            })
        }
        fn chain_heads(&self) -> StoreFuture<'_, Vec<ChainHead>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn chain_head(&self, _chain: &str) -> StoreFuture<'_, Option<ChainHead>> {
            Box::pin(async { Ok(None) })
        }
        fn verify_chain_against(&self, _: CheckpointedHeads) -> StoreFuture<'_, ChainReport> {
            Box::pin(async { Err(StoreError::unavailable("verify")) })
        }
        fn recent(&self, _limit: u32) -> StoreFuture<'_, Vec<StoredAuditRecord>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn search(&self, _query: crate::AuditQuery) -> StoreFuture<'_, Vec<StoredAuditRecord>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn claim_checkpointer(&self, _: &str, _: i64, _: i64) -> StoreFuture<'_, bool> {
            Box::pin(async { Ok(false) })
        }
        fn add_checkpoint(&self, _: StoredCheckpoint, _: Vec<ChainHead>) -> StoreFuture<'_, bool> {
            Box::pin(async { Ok(false) })
        }
        fn checkpoints(&self, _: u64, _: u32) -> StoreFuture<'_, Vec<StoredCheckpoint>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn latest_checkpoint(&self) -> StoreFuture<'_, Option<StoredCheckpoint>> {
            Box::pin(async { Ok(None) })
        }
        fn ping(&self) -> StoreFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
        fn close(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
            Box::pin(async {})
        }
    }

    fn record(n: usize) -> AuditRecord {
        AuditRecord {
            at_ms: n as u64,
            trace_id: format!("t{n}"),
            stage: "authorize".into(),
            decision: Decision::Allow,
            operation: "tools/call:x".into(),
            principal_digest: None,
            tenant_digest: None,
            client_digest: None,
            scopes: Vec::new(),
            policy_version: None,
            code: None,
            detail: None,
        }
    }

    fn queued(writer: &AuditWriter) -> usize {
        match &writer.mode {
            Mode::Direct { queue, .. } => queue.max_capacity() - queue.capacity(),
            Mode::Segment { .. } => 0,
        }
    }

    /// Waits until the first batch entered the store (`entered` records batch sizes as they
    /// arrive) and everything else of `total` is queued; returns the first batch's size.
    async fn wait_until_first_batch_blocks(entered: &Mutex<Vec<usize>>, writer: &AuditWriter, total: usize) -> usize {
        loop {
            let first = entered.lock().unwrap().first().copied();
            if let Some(first) = first
                && first + queued(writer) == total
            {
                return first;
            }
            // The thread-mode fake blocks a real thread: give it time, not just a yield.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn spawn_appends(
        writer: &Arc<AuditWriter>,
        numbers: std::ops::RangeInclusive<usize>,
    ) -> Vec<JoinHandle<Result<(), StoreError>>> {
        numbers
            .map(|n| {
                let writer = writer.clone();
                tokio::spawn(async move { writer.append(record(n)).await })
            })
            .collect()
    }

    #[tokio::test]
    async fn appends_queued_during_a_commit_go_out_as_one_batch() {
        let gate = Arc::new(Semaphore::new(0));
        let store = Arc::new(FakeStore { gate: Some(gate.clone()), ..FakeStore::default() });
        let writer = Arc::new(AuditWriter::new(store.clone(), AuditWriterConfig::default()));

        // The first append starts a batch that blocks on the gate.
        let first = spawn_appends(&writer, 0..=0);
        assert_eq!(wait_until_first_batch_blocks(&store.entered, &writer, 1).await, 1);
        // While it is blocked, 50 more queue up.
        let rest = spawn_appends(&writer, 1..=50);
        wait_until_first_batch_blocks(&store.entered, &writer, 51).await;
        gate.add_permits(2);
        for task in first {
            task.await.unwrap().unwrap();
        }
        for task in rest {
            task.await.unwrap().unwrap();
        }
        let batches = store.batches.lock().unwrap();
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 50]);
    }

    #[tokio::test]
    async fn batches_respect_max_batch() {
        let gate = Arc::new(Semaphore::new(0));
        let store = Arc::new(FakeStore { gate: Some(gate.clone()), ..FakeStore::default() });
        let config = AuditWriterConfig { max_batch: 8, ..AuditWriterConfig::default() };
        let writer = Arc::new(AuditWriter::new(store.clone(), config));
        let tasks = spawn_appends(&writer, 0..=19);
        wait_until_first_batch_blocks(&store.entered, &writer, 20).await;
        gate.add_permits(100);
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let sizes: Vec<usize> = store.batches.lock().unwrap().iter().map(Vec::len).collect();
        assert!(sizes.iter().all(|&size| size <= 8), "{sizes:?}");
        assert!(sizes.contains(&8), "queued records were not grouped: {sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), 20);
    }

    #[tokio::test]
    async fn a_failed_batch_fails_every_caller_in_it() {
        let store = Arc::new(FakeStore::default());
        store.fail.store(true, Ordering::SeqCst);
        let writer = Arc::new(AuditWriter::new(store.clone(), AuditWriterConfig::default()));
        let tasks = spawn_appends(&writer, 0..=29);
        for task in tasks {
            assert!(matches!(task.await.unwrap(), Err(StoreError::Unavailable { .. })));
        }
        assert!(store.batches.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_invalid_record_fails_alone_and_is_never_queued() {
        let store = Arc::new(FakeStore::default());
        let writer = AuditWriter::new(store.clone(), AuditWriterConfig::default());
        let mut bad = record(1);
        bad.detail = Some("nul\0".into());
        assert!(matches!(writer.append(bad).await, Err(StoreError::InvalidRecord { .. })));
        writer.append(record(2)).await.unwrap();
        assert_eq!(store.batches.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn shutdown_flushes_what_was_queued_then_refuses() {
        let gate = Arc::new(Semaphore::new(0));
        let store = Arc::new(FakeStore { gate: Some(gate.clone()), ..FakeStore::default() });
        let writer = Arc::new(AuditWriter::new(store.clone(), AuditWriterConfig::default()));
        let tasks = spawn_appends(&writer, 0..=9);
        wait_until_first_batch_blocks(&store.entered, &writer, 10).await;
        let shutdown = tokio::spawn({
            let writer = writer.clone();
            async move { writer.shutdown().await }
        });
        tokio::task::yield_now().await;
        gate.add_permits(100);
        shutdown.await.unwrap();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        assert_eq!(store.batches.lock().unwrap().iter().map(Vec::len).sum::<usize>(), 10);
        assert!(matches!(writer.append(record(11)).await, Err(StoreError::Closed)));
        writer.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_that_hangs_times_out_as_unavailable() {
        let gate = Arc::new(Semaphore::new(0));
        let store = Arc::new(FakeStore { gate: Some(gate), ..FakeStore::default() });
        let config = AuditWriterConfig { commit_timeout: Duration::from_millis(200), ..AuditWriterConfig::default() };
        let writer = AuditWriter::new(store, config);
        assert!(matches!(writer.append(record(0)).await, Err(StoreError::Unavailable { .. })));
    }

    #[tokio::test]
    async fn the_segment_mode_answers_once_written_and_ships_in_the_background() {
        let dir = std::env::temp_dir().join(format!("palisade-writer-segment-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Arc::new(crate::SqliteStore::open("sqlite::memory:").await.unwrap());
        let writer = AuditWriter::with_segment(store.clone(), SegmentConfig::new(&dir), AuditWriterConfig::default())
            .await
            .unwrap();
        let chain = writer.chain().unwrap().to_owned();
        for n in 0..25 {
            writer.append(record(n)).await.unwrap();
        }
        let mut bad = record(99);
        bad.detail = Some("nul\0".into());
        assert!(matches!(writer.append(bad).await, Err(StoreError::InvalidRecord { .. })));
        // Shipped within moments, without any further append.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.chain_head(&chain).await.unwrap().map(|head| head.seq) != Some(25) {
            assert!(std::time::Instant::now() < deadline, "not shipped");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Caught up: nothing waits, and the lag is zero.
        while writer.shipping().backlog_bytes != 0 {
            assert!(std::time::Instant::now() < deadline, "the backlog never emptied");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(writer.shipping(), Shipping::default());
        writer.shutdown().await;
        assert!(matches!(writer.append(record(26)).await, Err(StoreError::Closed)));
        let report = store.verify_chain().await.unwrap();
        assert!(report.is_intact() && report.records == 25, "{report:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_segment_mode_refuses_appends_once_the_backlog_is_full() {
        let dir = std::env::temp_dir().join(format!("palisade-writer-backlog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Arc::new(crate::SqliteStore::open("sqlite::memory:").await.unwrap());
        let mut segment = SegmentConfig::new(&dir);
        segment.max_backlog_bytes = 2000;
        let writer = AuditWriter::with_segment(store.clone(), segment, AuditWriterConfig::default()).await.unwrap();
        // The store goes away: nothing ships, the backlog grows until appends are refused.
        store.close().await;
        let mut refused = None;
        for n in 0..100 {
            if let Err(error) = writer.append(record(n)).await {
                refused = Some((n, error));
                break;
            }
        }
        let (n, error) = refused.expect("appends never refused");
        assert!(n > 2, "refused too early: {n}");
        assert!(error.to_string().contains("unavailable"), "{error}");
        // What waits, and for how long: the lag grows while the store takes nothing.
        let waiting = writer.shipping();
        assert!(waiting.backlog_bytes > 2000, "{waiting:?}");
        tokio::time::sleep(Duration::from_millis(30)).await;
        let later = writer.shipping();
        assert!(later.lag >= Duration::from_millis(30) && later.lag > waiting.lag, "{waiting:?} {later:?}");
        writer.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn an_unwritable_segment_directory_refuses_the_start() {
        let file = std::env::temp_dir().join(format!("palisade-writer-not-a-dir-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        let store = Arc::new(crate::SqliteStore::open("sqlite::memory:").await.unwrap());
        let result =
            AuditWriter::with_segment(store, SegmentConfig::new(file.join("segment")), AuditWriterConfig::default())
                .await;
        assert!(matches!(result, Err(StoreError::Unavailable { .. })), "{result:?}");
        let _ = std::fs::remove_file(&file);
    }
}
