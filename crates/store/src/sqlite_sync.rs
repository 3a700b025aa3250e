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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

use crate::chain::{self, Head};
use crate::handles::sql as handle_sql;
use crate::writer::BlockingAppend;
use crate::{AuditRecord, HandleOwner, LiveHandle, StoreError};

/// Read connections kept open for lookups. Lookups run inline, so at most one per runtime worker
/// thread is busy at a time; a burst beyond this opens a connection and closes it afterwards.
const KEPT_READERS: usize = 8;

const SELECT_HEAD: &str = "SELECT last_seq, last_hash FROM audit_chain_head WHERE id = 1";
const UPDATE_HEAD: &str = "UPDATE audit_chain_head SET last_seq = ?1, last_hash = ?2 WHERE id = 1";

/// The synchronous side of a file-backed [`SqliteStore`](crate::SqliteStore).
pub(crate) struct SyncSqlite {
    path: PathBuf,
    busy_timeout: std::time::Duration,
    /// The audit appender's connection: one writer, so appends in this process run one at a time
    /// (`BEGIN IMMEDIATE` still serializes them with other connections and processes).
    /// `None` once closed.
    writer: Mutex<Option<Connection>>,
    readers: Mutex<Vec<Connection>>,
    closed: AtomicBool,
}

impl std::fmt::Debug for SyncSqlite {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("SyncSqlite").finish_non_exhaustive()
    }
}

impl SyncSqlite {
    /// Opens the writer connection to an existing, migrated database file.
    pub(crate) fn open(path: &Path, busy_timeout: std::time::Duration) -> Result<Self, StoreError> {
        let writer = connect(path, busy_timeout)?;
        Ok(SyncSqlite {
            path: path.to_owned(),
            busy_timeout,
            writer: Mutex::new(Some(writer)),
            readers: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        })
    }

    /// Closes every connection; later calls fail with [`StoreError::Unavailable`].
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        lock(&self.writer).take();
        lock(&self.readers).clear();
    }

    /// Appends `records` as one `BEGIN IMMEDIATE` transaction linked onto the stored head: the
    /// same chain rule as every other appender (see [`crate::AuditStore`]).
    pub(crate) fn append(&self, records: Vec<AuditRecord>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let error = |error| StoreError::from_rusqlite("append", error);
        let mut writer = lock(&self.writer);
        let connection = writer.as_mut().ok_or_else(|| StoreError::unavailable("append"))?;
        // IMMEDIATE takes the write lock before the head is read: nobody links onto it meanwhile.
        // Dropping the transaction on an error path rolls it back.
        let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(error)?;
        let (seq, hash): (i64, Vec<u8>) = transaction
            .prepare_cached(SELECT_HEAD)
            .and_then(|mut statement| statement.query_row([], |row| Ok((row.get(0)?, row.get(1)?))).optional())
            .map_err(error)?
            .ok_or_else(|| StoreError::corrupt("the chain head row is missing"))?;
        // `link` validates every record; an invalid one rolls the transaction back.
        let (rows, head) = chain::link(Head::from_columns(seq, &hash)?, records)?;
        {
            let mut insert = transaction.prepare_cached(insert_one()).map_err(error)?;
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
            .prepare_cached(UPDATE_HEAD)
            .and_then(|mut statement| statement.execute(params![head.seq, &head.hash[..]]))
            .map_err(error)?;
        transaction.commit().map_err(error)
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

impl BlockingAppend for SyncSqlite {
    fn append_blocking(&self, records: Vec<AuditRecord>) -> Result<(), StoreError> {
        self.append(records)
    }
}

/// A connection with the store's settings. The file exists and is migrated (the sqlx side opened
/// it first); WAL is a property of the file, the rest is per connection.
fn connect(path: &Path, busy_timeout: std::time::Duration) -> Result<Connection, StoreError> {
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
