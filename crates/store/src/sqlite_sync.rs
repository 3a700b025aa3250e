//! Synchronous SQLite access for the reads on the request path of a file database, run inline on
//! the calling task: the owner-bound handle lookup (a primary-key probe), and [`InlineSqlite`] for
//! an application with tables of its own in the same file (the demo's basket read).
//!
//! Why not sqlx here: its SQLite driver runs each statement on a per-connection worker thread and
//! crosses to that thread and back for every statement. On a two-core machine those wake-ups
//! cost several times more CPU than the probe itself (BENCHMARKS.md, "Where the time goes"). The
//! connections here open the same file as the store's sqlx pools (WAL, the same busy timeout and
//! `synchronous=NORMAL`); every other statement goes through sqlx (the audit log's writes come in
//! large batches from a shipper, off the request path). An in-memory database has no file to
//! share, so it keeps the sqlx path for everything.
//!
//! An application that uses [`InlineSqlite`] writes its own SQL against its own tables: the
//! store's tables stay behind the store's traits.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::handles::sql as handle_sql;
use crate::{HandleOwner, LiveHandle, StoreError};

/// Read connections kept open for lookups. Lookups run inline, so at most one per runtime worker
/// thread is busy at a time; a burst beyond this opens a connection and closes it afterwards.
const KEPT_READERS: usize = 8;

/// Read connections to one SQLite file, used inline (no worker thread, no await): each read takes
/// a kept connection (or opens one when all are busy), runs one closure on it and gives it back.
/// Only for short reads (a primary-key probe); a write or a scan belongs on an async pool. The
/// synchronous side of a file-backed [`SqliteStore`](crate::SqliteStore), and public for an
/// application's own tables in the same file.
pub struct InlineSqlite {
    path: PathBuf,
    busy_timeout: Duration,
    readers: Mutex<Vec<Connection>>,
    closed: AtomicBool,
}

impl std::fmt::Debug for InlineSqlite {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("InlineSqlite").finish_non_exhaustive()
    }
}

impl InlineSqlite {
    /// Reads on an existing database file (WAL, `busy_timeout` for another connection's write
    /// lock). Opens one connection now, so that a bad path fails at start-up rather than on the
    /// first request.
    pub fn open(path: &Path, busy_timeout: Duration) -> Result<Self, StoreError> {
        let first = connect(path, busy_timeout)?;
        Ok(InlineSqlite {
            path: path.to_owned(),
            busy_timeout,
            readers: Mutex::new(vec![first]),
            closed: AtomicBool::new(false),
        })
    }

    /// Closes every connection; later reads fail with [`StoreError::Unavailable`].
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        lock(&self.readers).clear();
    }

    /// Runs `read` on a connection; its error is sorted like the store's own (`during` names the
    /// read in the error's text). The connection goes back to the kept set afterwards.
    pub fn read<T>(
        &self,
        during: &'static str,
        read: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let connection = self.reader(during)?;
        let result = read(&connection).map_err(|error| StoreError::from_rusqlite(during, error));
        self.give_back(connection);
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
        self.read("lookup_handle", |connection| {
            connection
                .prepare_cached(lookup_statement())?
                .query_row(params![&digest[..], &owner.subject_key[..], owner.tenant, owner.client, now_ms], |row| {
                    let scopes: String = row.get(3)?;
                    Ok(LiveHandle {
                        object_type: row.get(0)?,
                        object_ref: row.get(1)?,
                        object_version: row.get(2)?,
                        scopes: scopes.split(' ').map(str::to_owned).collect(),
                        policy_version: row.get(4)?,
                        expires_ms: row.get(5)?,
                    })
                })
                .optional()
        })
    }

    fn reader(&self, during: &'static str) -> Result<Connection, StoreError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable(during));
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

/// A connection with the store's settings. The file exists (the sqlx side opened it first); WAL
/// is a property of the file, the rest is per connection.
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
    // A panic while holding the lock leaves an idle connection: still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The shared `$n` lookup rewritten to SQLite's `?n`.
fn lookup_statement() -> &'static str {
    handle_sql::LOOKUP.question()
}
