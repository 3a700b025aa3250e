//! Synchronous SQLite access for the two statements on the request path of a file database: the
//! audit append (run on the audit writer's own thread, see [`BlockingAppend`]) and the owner-bound
//! handle lookup (a primary-key probe, run inline on the calling task).
//!
//! Why not sqlx here: its SQLite driver runs each statement on a per-connection worker thread and
//! crosses to that thread and back for every statement (five crossings per audit batch: `BEGIN`,
//! head, insert, head update, `COMMIT`). On a two-core machine those wake-ups cost several times
//! more CPU than the statements themselves (BENCHMARKS.md, "Where the time goes"). The
//! connections here open the same file as the store's sqlx pools (WAL, the same busy timeout and
//! `synchronous=NORMAL`); every other statement still goes through sqlx. An in-memory database
//! has no file to share, so it keeps the sqlx path for everything.
//!
//! Checkpoints: SQLite's automatic checkpoint runs on the connection whose commit pushed the WAL
//! past 1000 frames, inside that commit: it copies every frame not yet in the database file and
//! syncs both files, milliseconds during which no audit batch can commit and every request
//! waits. Here a thread of its own (`palisade-checkpoint`) checkpoints instead, on a connection
//! of its own, at most every [`CHECKPOINT_INTERVAL`] while appends arrive: a `PASSIVE`
//! checkpoint, which copies frames while the appender goes on. Under steady appends some frames
//! always arrive during it, and SQLite restarts the WAL from its beginning only when every frame
//! is in the database file; so once the WAL holds [`RESTART_FRAMES`] frames, the appender itself
//! checkpoints right after its next commit, copying only the few frames added meanwhile, and the
//! append after that starts the WAL anew. The appender's own automatic checkpoint is raised to
//! [`WRITER_AUTOCHECKPOINT`] frames, a bound that holds should the thread fall behind. A checkpoint never weakens a commit's durability (`synchronous=NORMAL`: the WAL is
//! synced before frames are copied and the database file after).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::chain::{self, Head};
use crate::handles::sql as handle_sql;
use crate::writer::BlockingAppend;
use crate::{AuditRecord, HandleOwner, LiveHandle, StoreError};

/// Read connections kept open for lookups. Lookups run inline, so at most one per runtime worker
/// thread is busy at a time; a burst beyond this opens a connection and closes it afterwards.
const KEPT_READERS: usize = 8;

/// Shortest time between two background checkpoints.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);

/// WAL frames from which the appender finishes the checkpoint itself after its next commit, so
/// that the WAL restarts.
const RESTART_FRAMES: i64 = 512;

/// The appender connection's own automatic checkpoint (SQLite's default is 1000 frames).
const WRITER_AUTOCHECKPOINT: i64 = 8000;

const SELECT_HEAD: &str = "SELECT last_seq, last_hash FROM audit_chain_head WHERE id = 1";
const UPDATE_HEAD: &str = "UPDATE audit_chain_head SET last_seq = ?1, last_hash = ?2 WHERE id = 1";

/// The synchronous side of a file-backed [`SqliteStore`](crate::SqliteStore).
pub(crate) struct SyncSqlite {
    path: PathBuf,
    busy_timeout: Duration,
    /// The audit appender's connection: one writer, so appends in this process run one at a time
    /// (`BEGIN IMMEDIATE` still serializes them with other connections and processes).
    /// `None` once closed.
    writer: Mutex<Option<Connection>>,
    readers: Mutex<Vec<Connection>>,
    closed: AtomicBool,
    checkpoints: Arc<Checkpoints>,
    checkpointer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for SyncSqlite {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("SyncSqlite").finish_non_exhaustive()
    }
}

impl SyncSqlite {
    /// Opens the writer connection to an existing, migrated database file and starts the
    /// checkpoint thread.
    pub(crate) fn open(path: &Path, busy_timeout: Duration) -> Result<Self, StoreError> {
        Self::open_with_interval(path, busy_timeout, CHECKPOINT_INTERVAL)
    }

    fn open_with_interval(path: &Path, busy_timeout: Duration, interval: Duration) -> Result<Self, StoreError> {
        let writer = connect(path, busy_timeout)?;
        writer
            .pragma_update(None, "wal_autocheckpoint", WRITER_AUTOCHECKPOINT)
            .map_err(|error| StoreError::from_rusqlite("open", error))?;
        let checkpoints = Arc::new(Checkpoints::default());
        let checkpointer =
            Checkpointer { connection: connect(path, busy_timeout)?, checkpoints: checkpoints.clone(), interval };
        let checkpointer = std::thread::Builder::new()
            .name("palisade-checkpoint".into())
            .spawn(move || checkpointer.run())
            .map_err(|_| StoreError::unavailable("open (checkpoint thread)"))?;
        Ok(SyncSqlite {
            path: path.to_owned(),
            busy_timeout,
            writer: Mutex::new(Some(writer)),
            readers: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            checkpoints,
            checkpointer: Mutex::new(Some(checkpointer)),
        })
    }

    /// Closes every connection and stops the checkpoint thread (waiting for a checkpoint in
    /// progress); later calls fail with [`StoreError::Unavailable`].
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.checkpoints.stop();
        if let Some(thread) = lock(&self.checkpointer).take()
            && thread.join().is_err()
        {
            tracing::error!("the checkpoint thread ended abnormally");
        }
        lock(&self.writer).take();
        lock(&self.readers).clear();
    }

    /// Background checkpoints completed so far (each copied the WAL's frames as of its start).
    #[cfg(test)]
    fn checkpoints_done(&self) -> u64 {
        self.checkpoints.done.load(Ordering::SeqCst)
    }

    /// Appends `records` as one `BEGIN IMMEDIATE` transaction linked onto the stored head: the
    /// same chain rule as every other appender (see [`crate::AuditStore`]).
    pub(crate) fn append(&self, records: Vec<AuditRecord>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut writer = lock(&self.writer);
        let connection = writer.as_mut().ok_or_else(|| StoreError::unavailable("append"))?;
        // IMMEDIATE takes the write lock before the head is read: nobody links onto it meanwhile.
        let transaction = Immediate::begin(connection).map_err(|error| StoreError::from_rusqlite("append", error))?;
        link_and_commit(transaction, records)?;
        if self.checkpoints.restart_wanted.swap(false, Ordering::SeqCst) {
            // The commit stands whatever happens here; SQLite's own bound still holds.
            if let Err(error) = passive_checkpoint(connection) {
                tracing::warn!(%error, "WAL checkpoint after an append failed");
            }
        }
        self.checkpoints.appended();
        Ok(())
    }

    /// [`BlockingAppend::try_append_now`]: the append above, but only when the appender's
    /// connection is free in this process and SQLite's write lock is free (no busy wait), and not
    /// when the WAL awaits the appender's checkpoint (that stays on the writer thread).
    // The declined record is handed back by value (it came in by value); boxing it would cost an
    // allocation per append to shrink a return value.
    #[allow(clippy::result_large_err)]
    fn try_append(&self, record: AuditRecord) -> Result<Result<(), StoreError>, AuditRecord> {
        if self.checkpoints.restart_wanted.load(Ordering::SeqCst) {
            return Err(record);
        }
        let mut writer = match self.writer.try_lock() {
            Ok(writer) => writer,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(record),
        };
        let Some(connection) = writer.as_mut() else { return Ok(Err(StoreError::unavailable("append"))) };
        if connection.busy_timeout(Duration::ZERO).is_err() {
            return Err(record);
        }
        let result = match Immediate::begin(connection) {
            Ok(transaction) => Ok(link_and_commit(transaction, vec![record])),
            Err(error) if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => Err(record),
            Err(error) => Ok(Err(StoreError::from_rusqlite("append", error))),
        };
        if let Err(error) = connection.busy_timeout(self.busy_timeout) {
            // Without its busy timeout the connection would fail appends under contention.
            tracing::error!(%error, "could not restore the audit appender's busy timeout");
            writer.take();
        }
        if matches!(result, Ok(Ok(()))) {
            self.checkpoints.appended();
        }
        result
    }

    /// The owner-bound lookup of [`HandleStore::lookup_handle`](crate::HandleStore::lookup_handle),
    /// the same statement as the sqlx path.
    pub(crate) fn lookup_handle(
        &self,
        digest: [u8; 32],
        owner: &HandleOwner,
        now_ms: i64,
    ) -> Result<Option<LiveHandle>, StoreError> {
        let connection = self.reader()?;
        let found = connection
            .prepare_cached(lookup_statement())
            .and_then(|mut statement| {
                statement
                    .query_row(
                        params![&digest[..], &owner.subject_key[..], owner.tenant, owner.client, now_ms],
                        |row| {
                            let scopes: String = row.get(3)?;
                            Ok(LiveHandle {
                                object_type: row.get(0)?,
                                object_ref: row.get(1)?,
                                object_version: row.get(2)?,
                                scopes: scopes.split(' ').map(str::to_owned).collect(),
                                policy_version: row.get(4)?,
                                expires_ms: row.get(5)?,
                            })
                        },
                    )
                    .optional()
            })
            .map_err(|error| StoreError::from_rusqlite("lookup_handle", error));
        self.give_back(connection);
        found
    }

    fn reader(&self) -> Result<Connection, StoreError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("lookup_handle"));
        }
        if let Some(connection) = lock(&self.readers).pop() {
            return Ok(connection);
        }
        connect(&self.path, self.busy_timeout)
    }

    fn give_back(&self, connection: Connection) {
        let mut readers = lock(&self.readers);
        if readers.len() < KEPT_READERS && !self.closed.load(Ordering::SeqCst) {
            readers.push(connection);
        }
    }
}

impl Drop for SyncSqlite {
    fn drop(&mut self) {
        // Not joined: a store dropped without `close` should not wait for a checkpoint.
        self.checkpoints.stop();
    }
}

/// What the appender and the checkpoint thread share.
#[derive(Default)]
struct Checkpoints {
    state: Mutex<CheckpointState>,
    wake: Condvar,
    done: AtomicU64,
    /// Set by the checkpoint thread: the WAL is long and the appender should copy the rest.
    restart_wanted: AtomicBool,
}

#[derive(Default)]
struct CheckpointState {
    /// Appends committed since the last checkpoint began.
    pending: bool,
    /// The thread waits for `pending` (only then does an append wake it).
    idle: bool,
    stopped: bool,
}

impl Checkpoints {
    /// Called after each committed append: one uncontended lock, a wake-up only when the thread
    /// is idle.
    fn appended(&self) {
        let mut state = lock(&self.state);
        state.pending = true;
        if state.idle {
            state.idle = false;
            self.wake.notify_one();
        }
    }

    fn stop(&self) {
        lock(&self.state).stopped = true;
        self.wake.notify_all();
    }
}

/// The checkpoint thread's side.
struct Checkpointer {
    connection: Connection,
    checkpoints: Arc<Checkpoints>,
    interval: Duration,
}

impl Checkpointer {
    /// Waits for appends, checkpoints, rests `interval` (unless stopped), and again. A failed
    /// checkpoint is logged and retried after the next append; the appender's automatic
    /// checkpoint still bounds the WAL meanwhile.
    fn run(&self) {
        let checkpoints = &self.checkpoints;
        loop {
            {
                let mut state = lock(&checkpoints.state);
                while !state.pending && !state.stopped {
                    state.idle = true;
                    state = checkpoints.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
                }
                if state.stopped {
                    return;
                }
                state.pending = false;
            }
            match passive_checkpoint(&self.connection) {
                // The frames appended during the checkpoint are not copied (nor counted): a long
                // WAL is handed to the appender to finish.
                Ok(Checkpointed { busy: false, frames }) => {
                    checkpoints.done.fetch_add(1, Ordering::SeqCst);
                    if frames >= RESTART_FRAMES {
                        checkpoints.restart_wanted.store(true, Ordering::SeqCst);
                    }
                }
                // Another connection was checkpointing: try again after the rest.
                Ok(Checkpointed { busy: true, .. }) => lock(&checkpoints.state).pending = true,
                Err(error) => tracing::warn!(%error, "background WAL checkpoint failed"),
            }
            let state = lock(&checkpoints.state);
            let (state, _) = checkpoints
                .wake
                .wait_timeout_while(state, self.interval, |state| !state.stopped)
                .unwrap_or_else(PoisonError::into_inner);
            if state.stopped {
                return;
            }
        }
    }
}

/// What `PRAGMA wal_checkpoint(PASSIVE)` reports.
struct Checkpointed {
    /// Another checkpoint was running.
    busy: bool,
    /// Frames in the WAL when the checkpoint began.
    frames: i64,
}

/// A `PASSIVE` checkpoint: copies what it can without waiting for, or blocking, anyone.
fn passive_checkpoint(connection: &Connection) -> rusqlite::Result<Checkpointed> {
    connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok(Checkpointed { busy: row.get::<_, i64>(0)? != 0, frames: row.get(1)? })
    })
}

/// Reads the chain head inside `transaction` (which holds the write lock), links `records` onto
/// it, inserts them, moves the head and commits. Dropping the transaction on an error path rolls
/// it back.
fn link_and_commit(transaction: Immediate<'_>, records: Vec<AuditRecord>) -> Result<(), StoreError> {
    let error = |error| StoreError::from_rusqlite("append", error);
    let (seq, hash): (i64, Vec<u8>) = transaction
        .connection
        .prepare_cached(SELECT_HEAD)
        .and_then(|mut statement| statement.query_row([], |row| Ok((row.get(0)?, row.get(1)?))).optional())
        .map_err(error)?
        .ok_or_else(|| StoreError::corrupt("the chain head row is missing"))?;
    // `link` validates every record; an invalid one rolls the transaction back.
    let (rows, head) = chain::link(Head::from_columns(seq, &hash)?, records)?;
    {
        let mut insert = transaction.connection.prepare_cached(insert_one()).map_err(error)?;
        for row in rows {
            insert
                .execute(params![
                    row.seq,
                    row.at_ms,
                    row.record.trace_id,
                    row.record.stage,
                    row.decision,
                    row.record.operation,
                    row.record.principal_digest,
                    row.record.tenant_digest,
                    row.record.client_digest,
                    row.scopes_json,
                    row.record.policy_version,
                    row.record.code,
                    row.record.detail,
                    &row.prev_hash[..],
                    &row.hash[..],
                ])
                .map_err(error)?;
        }
    }
    transaction
        .connection
        .prepare_cached(UPDATE_HEAD)
        .and_then(|mut statement| statement.execute(params![head.seq, &head.hash[..]]))
        .map_err(error)?;
    transaction.commit().map_err(error)
}

/// A `BEGIN IMMEDIATE` transaction on the appender's connection, rolled back when dropped
/// uncommitted. Unlike `rusqlite::Transaction` it runs `BEGIN IMMEDIATE` and `COMMIT` as cached
/// prepared statements: no SQL parsed per append.
struct Immediate<'c> {
    connection: &'c Connection,
    open: bool,
}

impl<'c> Immediate<'c> {
    fn begin(connection: &'c Connection) -> rusqlite::Result<Self> {
        connection.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Immediate { connection, open: true })
    }

    fn commit(mut self) -> rusqlite::Result<()> {
        self.connection.prepare_cached("COMMIT")?.execute([])?;
        self.open = false;
        Ok(())
    }
}

impl Drop for Immediate<'_> {
    fn drop(&mut self) {
        // Also after a failed COMMIT (e.g. busy), which leaves the transaction open.
        if self.open
            && !self.connection.is_autocommit()
            && let Err(error) = self.connection.execute_batch("ROLLBACK")
        {
            tracing::error!(%error, "could not roll back an audit append");
        }
    }
}

impl BlockingAppend for SyncSqlite {
    fn append_blocking(&self, records: Vec<AuditRecord>) -> Result<(), StoreError> {
        self.append(records)
    }

    fn try_append_now(&self, record: AuditRecord) -> Result<Result<(), StoreError>, AuditRecord> {
        self.try_append(record)
    }
}

/// A connection with the store's settings. The file exists and is migrated (the sqlx side opened
/// it first); WAL is a property of the file, the rest is per connection.
fn connect(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let error = |error| StoreError::from_rusqlite("open", error);
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection = Connection::open_with_flags(path, flags).map_err(error)?;
    connection.busy_timeout(busy_timeout).map_err(error)?;
    connection.pragma_update(None, "foreign_keys", "ON").map_err(error)?;
    connection.pragma_update(None, "synchronous", "NORMAL").map_err(error)?;
    Ok(connection)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves a connection whose open transaction was rolled back
    // by the transaction's drop: still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One-row audit INSERT (rows are cheap here: no thread crossing per statement).
fn insert_one() -> &'static str {
    static STATEMENT: OnceLock<String> = OnceLock::new();
    STATEMENT.get_or_init(|| {
        let placeholders: Vec<String> = (1..=15).map(|n| format!("?{n}")).collect();
        format!("INSERT INTO audit_log ({}) VALUES ({})", audit_columns!(), placeholders.join(", "))
    })
}

/// The shared `$n` lookup rewritten to SQLite's `?n`.
fn lookup_statement() -> &'static str {
    static STATEMENT: OnceLock<String> = OnceLock::new();
    STATEMENT.get_or_init(|| handle_sql::LOOKUP.replace('$', "?"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::sample_record;

    /// A migrated database file in a fresh directory, and its (idle) store: the store's own
    /// appender appends nothing here, so its checkpoint thread stays idle too.
    async fn fresh_database(name: &str) -> (PathBuf, PathBuf, crate::SqliteStore) {
        let mut random = [0u8; 8];
        aws_lc_rs::rand::fill(&mut random).unwrap();
        let unique = palisade_base::hex::hex(&random);
        let directory = std::env::temp_dir().join(format!("palisade-sync-test-{name}-{}-{unique}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("audit.db");
        let store = crate::SqliteStore::open(path.to_str().unwrap()).await.unwrap();
        (directory, path, store)
    }

    /// Rows in `audit_log` of the database file alone (what a checkpoint copied), read from a
    /// copy without its WAL; 0 when not even the schema reached the file.
    fn rows_in_database_file(path: &Path) -> i64 {
        let copy = path.with_extension("copy");
        std::fs::copy(path, &copy).unwrap();
        let count = Connection::open(&copy)
            .and_then(|connection| connection.query_row("SELECT count(*) FROM audit_log", [], |row| row.get(0)))
            .unwrap_or(0);
        let _ = std::fs::remove_file(&copy);
        let _ = std::fs::remove_file(copy.with_extension("copy-wal"));
        count
    }

    #[tokio::test]
    async fn appends_reach_the_database_file_through_the_background_checkpoint() {
        let (directory, path, store) = fresh_database("checkpoint").await;
        // Far fewer frames than SQLite's automatic checkpoint needs (1000): only the background
        // checkpoint copies them into the database file. An hour between checkpoints: `close`
        // below must end the thread's rest, not wait it out.
        let sync = SyncSqlite::open_with_interval(&path, Duration::from_secs(5), Duration::from_secs(3600)).unwrap();
        sync.append((1..=5).map(sample_record).collect()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sync.checkpoints_done() == 0 {
            assert!(std::time::Instant::now() < deadline, "no background checkpoint after an append");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(rows_in_database_file(&path), 5, "the checkpoint copied every committed record");
        // More appends while the thread rests: they stay in the WAL until the next checkpoint.
        sync.append((6..=7).map(sample_record).collect()).unwrap();
        assert_eq!(sync.checkpoints_done(), 1);
        sync.close();
        assert!(lock(&sync.checkpointer).is_none());
        assert!(matches!(sync.append(vec![sample_record(8)]), Err(StoreError::Unavailable { .. })));
        crate::AuditStore::close(&store).await;
        let _ = std::fs::remove_dir_all(&directory);
    }

    #[tokio::test]
    async fn the_wal_restarts_under_continuous_appends() {
        let (directory, path, store) = fresh_database("restart").await;
        let sync = SyncSqlite::open_with_interval(&path, Duration::from_secs(5), Duration::from_millis(5)).unwrap();
        // Back-to-back appends: a passive checkpoint alone always finds frames added during it,
        // so the WAL would only grow (to the appender's own bound); the second pass restarts it.
        let mut largest = 0;
        for n in 0..3000 {
            sync.append(vec![sample_record(n + 1)]).unwrap();
            largest = largest.max(std::fs::metadata(path.with_extension("db-wal")).map(|m| m.len()).unwrap_or(0));
        }
        // Frame = 24-byte header + 4096-byte page. About 7500 frames are appended in all.
        let frames = largest / 4120;
        assert!(sync.checkpoints_done() > 0);
        assert!(frames < 4 * RESTART_FRAMES as u64, "the WAL grew to {frames} frames");
        sync.close();
        crate::AuditStore::close(&store).await;
        let _ = std::fs::remove_dir_all(&directory);
    }

    #[tokio::test]
    async fn a_failed_append_rolls_back_and_the_next_one_commits() {
        let (directory, path, store) = fresh_database("rollback").await;
        let sync = SyncSqlite::open(&path, Duration::from_secs(5)).unwrap();
        let mut bad = sample_record(2);
        bad.trace_id = "a\0b".into();
        // Fails inside the transaction (the head was read): nothing of the batch stays, and the
        // connection is out of the transaction (else the next BEGIN would fail).
        assert!(matches!(sync.append(vec![sample_record(1), bad]), Err(StoreError::InvalidRecord { .. })));
        sync.append(vec![sample_record(3)]).unwrap();
        assert!(matches!(sync.try_append(sample_record(4)), Ok(Ok(()))));
        sync.close();
        let report = crate::AuditStore::verify_chain(&store).await.unwrap();
        assert!(report.is_intact());
        assert_eq!(report.records, 2);
        crate::AuditStore::close(&store).await;
        let _ = std::fs::remove_dir_all(&directory);
    }

    #[tokio::test]
    async fn an_inline_append_commits_only_when_nothing_has_to_wait() {
        let (directory, path, store) = fresh_database("inline").await;
        let sync = SyncSqlite::open(&path, Duration::from_secs(5)).unwrap();
        assert!(matches!(sync.try_append(sample_record(1)), Ok(Ok(()))));
        // Another connection holds the write lock: the record comes back at once, unwritten.
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let record = sync.try_append(sample_record(2)).expect_err("committed past a held write lock");
        assert_eq!(record, sample_record(2));
        other.execute_batch("ROLLBACK").unwrap();
        // The appender's connection is busy in this process: the same.
        {
            let _held = lock(&sync.writer);
            assert!(sync.try_append(sample_record(2)).is_err());
        }
        // The busy timeout is back after an inline attempt: a queued append waits for the lock.
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                other.execute_batch("ROLLBACK").unwrap();
            });
            sync.append(vec![sample_record(2)]).unwrap();
        });
        // A WAL awaiting the appender's checkpoint stays with the writer thread.
        sync.checkpoints.restart_wanted.store(true, Ordering::SeqCst);
        assert!(sync.try_append(sample_record(3)).is_err());
        sync.checkpoints.restart_wanted.store(false, Ordering::SeqCst);
        sync.close();
        assert!(matches!(sync.try_append(sample_record(3)), Ok(Err(StoreError::Unavailable { .. }))));
        let report = crate::AuditStore::verify_chain(&store).await.unwrap();
        assert!(report.is_intact());
        assert_eq!(report.records, 2);
        crate::AuditStore::close(&store).await;
        let _ = std::fs::remove_dir_all(&directory);
    }
}
