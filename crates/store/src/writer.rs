//! `AuditWriter`: group commit in front of any `AuditStore`. Concurrent appends queue up while a
//! batch commits and go out together as the next batch: one transaction (one fsync) per batch,
//! not per call, and each caller is answered only once its batch is durable.
//!
//! The batches are committed by a Tokio task through the store's async `append_batch`, or, when
//! the store offers a [`BlockingAppend`] (file-backed SQLite), by a dedicated thread that runs the
//! whole transaction itself: one wake-up per batch instead of one per statement. With a blocking
//! appender, an append on a quiet writer (no other append in flight, none begun within
//! [`QUIET_GAP`]) first asks it to commit the record at once on the caller's thread, which it
//! does only when that means no waiting (no other commit running, the database's write lock
//! free): this spares a quiet server two thread wake-ups per request. Under load everything goes
//! through the thread, so that runtime threads go on serving requests while a batch commits
//! (inline commits under load measured slower, BENCHMARKS.md).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::{AuditRecord, AuditStore, StoreError};

/// An append commits inline only if no other append began within this long before it (and none
/// is in flight): about four single-record commits on a file database.
const QUIET_GAP: Duration = Duration::from_micros(250);

/// Tuning for an [`AuditWriter`].
#[derive(Debug, Clone)]
pub struct AuditWriterConfig {
    /// Records that may wait in the queue; further appends wait for room (backpressure).
    pub queue_capacity: usize,
    /// Most records in one batch (one `append_batch` call).
    pub max_batch: usize,
    /// How long a caller waits for its record's batch to commit before it gets
    /// [`StoreError::Unavailable`]. The batch may still commit after that (the answer was
    /// already "failed", so the request was refused: fail closed, at worst an extra record).
    pub commit_timeout: Duration,
}

impl Default for AuditWriterConfig {
    fn default() -> Self {
        AuditWriterConfig { queue_capacity: 8192, max_batch: 512, commit_timeout: Duration::from_secs(5) }
    }
}

/// A backend that appends a batch synchronously, on the calling thread, with the same contract as
/// [`AuditStore::append_batch`]: all records linked and committed, or none. The
/// [`AuditWriter`] calls it from a thread of its own.
pub trait BlockingAppend: Send + Sync + 'static {
    /// Appends `records` in order as one transaction.
    fn append_blocking(&self, records: Vec<AuditRecord>) -> Result<(), StoreError>;

    /// Appends `record` as a transaction of its own right now, on the calling thread (an async
    /// task's), but only if nothing has to be waited for: no other append of this appender is
    /// running and the store's write lock is free. Otherwise hands the record back untouched
    /// (`Err`), and the writer queues it. The default never commits inline.
    // The declined record is handed back by value (it came in by value); boxing it would cost an
    // allocation per append to shrink a return value.
    #[allow(clippy::result_large_err)]
    fn try_append_now(&self, record: AuditRecord) -> Result<Result<(), StoreError>, AuditRecord> {
        Err(record)
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

enum Background {
    Task(JoinHandle<()>),
    Thread(oneshot::Receiver<()>),
}

/// Group commit in front of an [`AuditStore`]. Cheap to share behind an `Arc`.
///
/// **Invariant:** [`append`](AuditWriter::append) returns `Ok` only after the batch holding its
/// record committed; if that batch fails, every caller in it gets the error.
pub struct AuditWriter {
    queue: mpsc::Sender<Job>,
    /// The blocking appender, for inline commits; `None` in the task mode.
    inline: Option<Arc<dyn BlockingAppend>>,
    /// Set by [`shutdown`](AuditWriter::shutdown): no inline commit after it began.
    closing: AtomicBool,
    /// Appends between their start and their answer.
    in_flight: AtomicUsize,
    /// When the latest append began, in nanoseconds since `epoch`.
    last_start: AtomicU64,
    epoch: std::time::Instant,
    commit_timeout: Duration,
    background: Mutex<Option<Background>>,
}

impl std::fmt::Debug for AuditWriter {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AuditWriter")
            .field("queued", &(self.queue.max_capacity() - self.queue.capacity()))
            .finish()
    }
}

impl AuditWriter {
    /// Starts what drains the queue into `store`: a thread when the store offers a
    /// [`BlockingAppend`], else a Tokio task. Call inside a Tokio runtime.
    pub fn new(store: Arc<dyn AuditStore>, config: AuditWriterConfig) -> Self {
        let max_batch = config.max_batch.max(1);
        let (queue, receiver) = mpsc::channel(config.queue_capacity.max(1));
        let mut inline = store.blocking_append();
        let background = match inline.clone() {
            Some(appender) => {
                let (ended, thread_ended) = oneshot::channel();
                let spawned = std::thread::Builder::new().name("palisade-audit".into()).spawn(move || {
                    run_blocking(appender.as_ref(), receiver, max_batch);
                    let _ = ended.send(());
                });
                if let Err(error) = spawned {
                    // No thread: the receiver is gone with the closure, so every append fails
                    // with `Closed` (fail closed, inline commits included) and the error is in
                    // the log.
                    tracing::error!(%error, "could not start the audit writer thread");
                    inline = None;
                }
                Background::Thread(thread_ended)
            }
            None => Background::Task(tokio::spawn(run(store, receiver, max_batch, config.commit_timeout))),
        };
        AuditWriter {
            queue,
            inline,
            closing: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            last_start: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            commit_timeout: config.commit_timeout,
            background: Mutex::new(Some(background)),
        }
    }

    /// Appends `record` and resolves once the batch containing it committed. Fails with
    /// [`StoreError::InvalidRecord`] (nothing queued) for a record the store would refuse, with the
    /// batch's error if the store failed, with [`StoreError::Unavailable`] when the commit takes
    /// longer than the configured timeout, and with [`StoreError::Closed`] after shutdown.
    /// An inline commit (quiet writer, see the module docs) runs synchronously and is not timed:
    /// it waits for no lock (zero busy timeout), only for its own few writes.
    ///
    /// Dropping the future after the record was queued does not withdraw it.
    pub async fn append(&self, record: AuditRecord) -> Result<(), StoreError> {
        record.validate()?;
        // Counted only where inline commits exist (the task mode needs no shared counter).
        let in_flight = self.inline.is_some().then(|| InFlight::enter(&self.in_flight));
        // Inline only on a quiet writer, with nothing queued (a queued record should not wait
        // behind later ones), when the appender can commit without waiting; any order of
        // records is a valid chain.
        let record = match &self.inline {
            Some(appender)
                if in_flight.as_ref().is_some_and(|counted| self.quiet(counted.alone))
                    && !self.closing.load(Ordering::SeqCst)
                    && self.queue.capacity() == self.queue.max_capacity() =>
            {
                match appender.try_append_now(record) {
                    Ok(result) => return result,
                    Err(record) => record,
                }
            }
            _ => record,
        };
        let (done, answer) = oneshot::channel();
        self.queue.send(Job::Append(Pending { record, done })).await.map_err(|_| StoreError::Closed)?;
        match tokio::time::timeout(self.commit_timeout, answer).await {
            Ok(answer) => answer.unwrap_or(Err(StoreError::Closed)),
            Err(_) => Err(StoreError::unavailable("append (commit timed out)")),
        }
    }

    /// Notes an append's start; true when it is alone and the previous one began at least
    /// [`QUIET_GAP`] ago (or this is the first).
    fn quiet(&self, alone: bool) -> bool {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
        let previous = self.last_start.swap(now, Ordering::SeqCst);
        let gap = u64::try_from(QUIET_GAP.as_nanos()).unwrap_or(u64::MAX);
        alone && (previous == 0 || now.saturating_sub(previous) >= gap)
    }

    /// Stops accepting appends, commits everything already queued (answering its callers), and
    /// waits for the background task or thread to end. Later appends fail with
    /// [`StoreError::Closed`]. Calling it again returns at once.
    pub async fn shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let background = match self.background.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        let Some(background) = background else { return };
        // Fails only when the queue is already closed (the background ended).
        let _ = self.queue.send(Job::Stop).await;
        match background {
            Background::Task(task) => {
                if let Err(error) = task.await {
                    tracing::error!(%error, "audit writer task ended abnormally");
                }
            }
            Background::Thread(ended) => {
                if ended.await.is_err() {
                    tracing::error!("audit writer thread ended abnormally");
                }
            }
        }
    }
}

/// Counts an append in flight until dropped (also when the caller drops the future).
struct InFlight<'a> {
    counter: &'a AtomicUsize,
    /// No other append was in flight when this one began.
    alone: bool,
}

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicUsize) -> Self {
        InFlight { counter, alone: counter.fetch_add(1, Ordering::SeqCst) == 0 }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn run(
    store: Arc<dyn AuditStore>,
    mut receiver: mpsc::Receiver<Job>,
    max_batch: usize,
    commit_timeout: Duration,
) {
    let mut jobs = Vec::with_capacity(max_batch);
    // 0 only once the queue is closed and drained; a dropped writer closes it as well.
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

fn run_blocking(appender: &dyn BlockingAppend, mut receiver: mpsc::Receiver<Job>, max_batch: usize) {
    let mut jobs = Vec::with_capacity(max_batch);
    while receiver.blocking_recv_many(&mut jobs, max_batch) > 0 {
        let (records, waiters) = take_batch(&mut jobs, &mut receiver);
        if records.is_empty() {
            continue;
        }
        let count = records.len();
        answer(waiters, count, appender.append_blocking(records));
    }
}

type Waiter = oneshot::Sender<Result<(), StoreError>>;

/// Splits received jobs into one batch and its callers; a stop closes the queue (what is already
/// in it still arrives and is committed).
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

/// Answers each caller of a batch with the batch's result.
fn answer(waiters: Vec<Waiter>, count: usize, result: Result<(), StoreError>) {
    match &result {
        Ok(()) => tracing::trace!(records = count, "audit batch committed"),
        Err(error) => tracing::warn!(%error, records = count, "audit batch failed; its callers fail closed"),
    }
    for waiter in waiters {
        // A caller that stopped waiting is fine: its record's fate is the batch's.
        let _ = waiter.send(result.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreFuture;
    use crate::{ChainReport, Decision, StoredAuditRecord};
    use std::future::Future;
    use std::pin::Pin;
    use tokio::sync::Semaphore;

    /// Records every batch; optionally fails; optionally holds the first batch until released.
    #[derive(Debug, Default)]
    struct FakeStore {
        /// Batch sizes as they enter `append_batch` (before the gate).
        entered: Mutex<Vec<usize>>,
        batches: Mutex<Vec<Vec<AuditRecord>>>,
        fail: AtomicBool,
        gate: Option<Arc<Semaphore>>,
        /// Offered as the store's blocking append (thread mode); then the async path must not run.
        blocking: Option<Arc<BlockingFake>>,
    }

    impl FakeStore {
        fn blocking(fake: Arc<BlockingFake>) -> Arc<Self> {
            Arc::new(FakeStore { blocking: Some(fake), ..FakeStore::default() })
        }
    }

    impl AuditStore for FakeStore {
        fn append_batch(&self, records: Vec<AuditRecord>) -> StoreFuture<'_, ()> {
            assert!(self.blocking.is_none(), "the writer used the async path of a store that offers a blocking one");
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
        fn blocking_append(&self) -> Option<Arc<dyn BlockingAppend>> {
            self.blocking.clone().map(|fake| fake as Arc<dyn BlockingAppend>)
        }
        fn verify_chain(&self) -> StoreFuture<'_, ChainReport> {
            Box::pin(async { Err(StoreError::unavailable("verify")) })
        }
        fn recent(&self, _limit: u32) -> StoreFuture<'_, Vec<StoredAuditRecord>> {
            Box::pin(async { Ok(Vec::new()) })
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
        writer.queue.max_capacity() - writer.queue.capacity()
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

    /// The thread mode: a backend whose appends are synchronous, optionally held at a gate.
    #[derive(Debug, Default)]
    struct BlockingFake {
        entered: Mutex<Vec<usize>>,
        batches: Mutex<Vec<Vec<AuditRecord>>>,
        fail: AtomicBool,
        /// While `true`, appends wait (a closed gate).
        gate: (Mutex<bool>, std::sync::Condvar),
        threads: Mutex<Vec<String>>,
        /// Whether `try_append_now` commits (else it hands the record back, as when busy).
        inline_free: AtomicBool,
    }

    impl BlockingAppend for BlockingFake {
        fn append_blocking(&self, records: Vec<AuditRecord>) -> Result<(), StoreError> {
            self.entered.lock().unwrap().push(records.len());
            self.threads.lock().unwrap().push(std::thread::current().name().unwrap_or("").to_owned());
            let (closed, opened) = &self.gate;
            let mut closed = closed.lock().unwrap();
            while *closed {
                closed = opened.wait(closed).unwrap();
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::unavailable("append"));
            }
            self.batches.lock().unwrap().push(records);
            Ok(())
        }

        fn try_append_now(&self, record: AuditRecord) -> Result<Result<(), StoreError>, AuditRecord> {
            if !self.inline_free.load(Ordering::SeqCst) {
                return Err(record);
            }
            self.threads.lock().unwrap().push(std::thread::current().name().unwrap_or("").to_owned());
            self.batches.lock().unwrap().push(vec![record]);
            Ok(Ok(()))
        }
    }

    impl BlockingFake {
        fn open_gate(&self) {
            *self.gate.0.lock().unwrap() = false;
            self.gate.1.notify_all();
        }
    }

    fn thread_mode(gate_closed: bool) -> (Arc<BlockingFake>, Arc<AuditWriter>) {
        let fake = Arc::new(BlockingFake::default());
        *fake.gate.0.lock().unwrap() = gate_closed;
        let writer = Arc::new(AuditWriter::new(FakeStore::blocking(fake.clone()), AuditWriterConfig::default()));
        (fake, writer)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn thread_mode_groups_appends_queued_during_a_commit_on_its_own_thread() {
        let (fake, writer) = thread_mode(true);
        let first = spawn_appends(&writer, 0..=0);
        assert_eq!(wait_until_first_batch_blocks(&fake.entered, &writer, 1).await, 1);
        let rest = spawn_appends(&writer, 1..=40);
        wait_until_first_batch_blocks(&fake.entered, &writer, 41).await;
        fake.open_gate();
        for task in first {
            task.await.unwrap().unwrap();
        }
        for task in rest {
            task.await.unwrap().unwrap();
        }
        let sizes: Vec<usize> = fake.batches.lock().unwrap().iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1, 40]);
        assert!(fake.threads.lock().unwrap().iter().all(|name| name == "palisade-audit"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn thread_mode_fails_every_caller_of_a_failed_batch() {
        let (fake, writer) = thread_mode(false);
        fake.fail.store(true, Ordering::SeqCst);
        let tasks = spawn_appends(&writer, 0..=29);
        for task in tasks {
            assert!(matches!(task.await.unwrap(), Err(StoreError::Unavailable { .. })));
        }
        assert!(fake.batches.lock().unwrap().is_empty());
        fake.fail.store(false, Ordering::SeqCst);
        writer.append(record(99)).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn thread_mode_shutdown_flushes_what_was_queued_then_refuses() {
        let (fake, writer) = thread_mode(true);
        let tasks = spawn_appends(&writer, 0..=9);
        wait_until_first_batch_blocks(&fake.entered, &writer, 10).await;
        let shutdown = tokio::spawn({
            let writer = writer.clone();
            async move { writer.shutdown().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!shutdown.is_finished(), "shutdown returned while a batch was still committing");
        fake.open_gate();
        shutdown.await.unwrap();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        assert_eq!(fake.batches.lock().unwrap().iter().map(Vec::len).sum::<usize>(), 10);
        assert!(matches!(writer.append(record(11)).await, Err(StoreError::Closed)));
        writer.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn thread_mode_caller_gives_up_after_the_commit_timeout() {
        let fake = Arc::new(BlockingFake::default());
        *fake.gate.0.lock().unwrap() = true;
        let config = AuditWriterConfig { commit_timeout: Duration::from_millis(100), ..AuditWriterConfig::default() };
        let writer = AuditWriter::new(FakeStore::blocking(fake.clone()), config);
        assert!(matches!(writer.append(record(0)).await, Err(StoreError::Unavailable { .. })));
        fake.open_gate();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn thread_mode_commits_inline_when_nothing_waits_and_never_after_shutdown() {
        let (fake, writer) = thread_mode(false);
        fake.inline_free.store(true, Ordering::SeqCst);
        writer.append(record(1)).await.unwrap();
        assert_eq!(fake.batches.lock().unwrap().len(), 1);
        assert!(fake.entered.lock().unwrap().is_empty(), "the writer thread committed it");
        assert!(fake.threads.lock().unwrap().iter().all(|name| name != "palisade-audit"));
        // The appender declines (busy): the record goes through the queue and the thread.
        fake.inline_free.store(false, Ordering::SeqCst);
        writer.append(record(2)).await.unwrap();
        assert_eq!(*fake.entered.lock().unwrap(), vec![1]);
        fake.inline_free.store(true, Ordering::SeqCst);
        writer.shutdown().await;
        assert!(matches!(writer.append(record(3)).await, Err(StoreError::Closed)));
        assert_eq!(fake.batches.lock().unwrap().len(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn thread_mode_does_not_commit_inline_past_queued_records() {
        let (fake, writer) = thread_mode(true);
        let first = spawn_appends(&writer, 0..=0);
        wait_until_first_batch_blocks(&fake.entered, &writer, 1).await;
        let queued_before = spawn_appends(&writer, 1..=5);
        wait_until_first_batch_blocks(&fake.entered, &writer, 6).await;
        // Free to commit inline, but five records wait in the queue: this one queues behind them.
        fake.inline_free.store(true, Ordering::SeqCst);
        let late = spawn_appends(&writer, 6..=6);
        tokio::time::timeout(Duration::from_secs(10), wait_until_first_batch_blocks(&fake.entered, &writer, 7))
            .await
            .expect("the late record was not queued");
        fake.open_gate();
        for task in first.into_iter().chain(queued_before).chain(late) {
            task.await.unwrap().unwrap();
        }
        let sizes: Vec<usize> = fake.batches.lock().unwrap().iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1, 6]);
    }
}
