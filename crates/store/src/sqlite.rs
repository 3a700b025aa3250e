//! `SqliteStore`: the embedded backend. One file in WAL mode; one writer connection per store and
//! `BEGIN IMMEDIATE`, so writers in this process queue on the pool and writers in other processes
//! wait on SQLite's write lock (busy_timeout).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use crate::audit_sql::OwnChain;
use crate::sqlite_sync::InlineSqlite;
use crate::{HandleOwner, LiveHandle, StoreError};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// How long a writer waits for another process's write lock before giving up (`Unavailable`).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller waits for a pooled connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// Read connections for a file database: handle lookups, verify and recent run beside the writer.
const READERS: u32 = 4;

/// The SQLite audit store.
pub struct SqliteStore {
    /// Exactly one connection: appends in this process run one at a time.
    writer: SqlitePool,
    /// Reads; the same pool as `writer` for an in-memory database (a second pool would be a
    /// second, empty database).
    reader: SqlitePool,
    /// Audit appends and handle lookups without sqlx's worker thread; `None` for an in-memory
    /// database (see [`crate::sqlite_sync`]).
    sync: Option<Arc<InlineSqlite>>,
    /// The chain of [`AuditStore::append_batch`].
    own: OwnChain,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if missing) and migrates a database. `path_or_url` is a file path, a
    /// `sqlite:` URL (`sqlite:audit.db`, `sqlite:///var/lib/palisade/audit.db`), or
    /// `sqlite::memory:` for a private in-memory database that lives as long as this store.
    ///
    /// File databases use WAL, `synchronous=NORMAL` (a commit is durable against a process crash;
    /// on power loss the last commits may be lost), a 5 s busy timeout and foreign keys.
    /// An unopenable path fails with [`StoreError::Unavailable`].
    pub async fn open(path_or_url: &str) -> Result<Self, StoreError> {
        let in_memory = is_in_memory(path_or_url);
        let options = if path_or_url == ":memory:" {
            SqliteConnectOptions::from_str("sqlite::memory:").map_err(|error| StoreError::from_sqlx("open", error))?
        } else if path_or_url.starts_with("sqlite:") {
            SqliteConnectOptions::from_str(path_or_url).map_err(|error| StoreError::from_sqlx("open", error))?
        } else {
            SqliteConnectOptions::new().filename(path_or_url)
        };
        let options = options
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT)
            .synchronous(SqliteSynchronous::Normal);
        // WAL does not apply to an in-memory database.
        let options = if in_memory { options } else { options.journal_mode(SqliteJournalMode::Wal) };

        // A local connection does not go stale: skip the per-acquire round trip. An in-memory
        // database disappears with its last connection: never let the pool close that one.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .min_connections(if in_memory { 1 } else { 0 })
            .idle_timeout(if in_memory { None } else { Some(Duration::from_secs(600)) })
            .max_lifetime(if in_memory { None } else { Some(Duration::from_secs(1800)) })
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.clone())
            .await
            .map_err(|error| StoreError::from_sqlx("open", error))?;
        MIGRATOR.run(&writer).await.map_err(StoreError::from_migrate)?;
        let reader = if in_memory {
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(READERS)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_lazy_with(options.clone())
        };
        let sync =
            if in_memory { None } else { Some(Arc::new(InlineSqlite::open(options.get_filename(), BUSY_TIMEOUT)?)) };
        let store = SqliteStore { writer, reader, sync, own: OwnChain::default() };
        store.ping_inner().await?;
        Ok(store)
    }

    /// Opens an existing file database for reading only (`mode=ro`): nothing is created,
    /// migrated or written, and the database refuses any write. Fails with
    /// [`StoreError::Unavailable`] when the file does not exist or does not open, and with
    /// [`StoreError::Config`] when its schema is not this version's
    /// ([`crate::backend::check_schema`]).
    pub async fn open_read_only(path_or_url: &str) -> Result<Self, StoreError> {
        if is_in_memory(path_or_url) {
            return Err(StoreError::Config { reason: "an in-memory database has nothing to read".into() });
        }
        let options = if path_or_url.starts_with("sqlite:") {
            SqliteConnectOptions::from_str(path_or_url).map_err(|error| StoreError::from_sqlx("open", error))?
        } else {
            SqliteConnectOptions::new().filename(path_or_url)
        };
        let options = options.create_if_missing(false).read_only(true).busy_timeout(BUSY_TIMEOUT);
        let reader = SqlitePoolOptions::new()
            .max_connections(2)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|error| StoreError::from_sqlx("open", error))?;
        crate::backend::check_schema::<Self>(&reader, &MIGRATOR).await?;
        let store = SqliteStore { writer: reader.clone(), reader, sync: None, own: OwnChain::default() };
        store.ping_inner().await?;
        Ok(store)
    }

    async fn ping_inner(&self) -> Result<(), StoreError> {
        sqlx::query_scalar::<_, String>(crate::audit_sql::sql::PING.question())
            .fetch_one(&self.reader)
            .await
            .map(|_| ())
            .map_err(|error| StoreError::from_sqlx("ping", error))
    }

    async fn close_inner(&self) {
        if let Some(sync) = &self.sync {
            sync.close();
        }
        self.writer.close().await;
        self.reader.close().await;
    }
}

impl crate::handles::HandleLookup for SqliteStore {
    /// A file database answers inline through [`InlineSqlite`] (a primary-key probe: microseconds);
    /// an in-memory one through sqlx.
    async fn lookup_handle_routed(
        &self,
        digest: [u8; 32],
        owner: &HandleOwner,
        now_ms: i64,
    ) -> Result<Option<LiveHandle>, StoreError> {
        match &self.sync {
            Some(sync) => sync.lookup_handle(digest, owner, now_ms),
            None => crate::handles::lookup_handle_on::<Self, _>(&self.reader, digest, owner, now_ms).await,
        }
    }
}

impl SqliteStore {
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
        self.writer.begin_with("BEGIN IMMEDIATE").await
    }
}

/// True for `:memory:`, `sqlite::memory:`, `sqlite://:memory:` and URLs with `mode=memory`.
fn is_in_memory(path_or_url: &str) -> bool {
    if path_or_url == ":memory:" {
        return true;
    }
    let Some(rest) = path_or_url.strip_prefix("sqlite:") else { return false };
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    database == ":memory:" || params.split('&').any(|param| param == "mode=memory")
}

impl crate::backend::Backend for SqliteStore {
    type Db = sqlx::Sqlite;

    fn writer(&self) -> &sqlx::Pool<sqlx::Sqlite> {
        &self.writer
    }

    fn reader(&self) -> &sqlx::Pool<Self::Db> {
        &self.reader
    }

    async fn begin(&self) -> Result<sqlx::Transaction<'static, Self::Db>, sqlx::Error> {
        SqliteStore::begin_write(self).await
    }

    fn sql(statement: &'static crate::backend::Statement) -> &'static str {
        statement.question()
    }

    fn built_sql(statement: String) -> String {
        statement.replace('$', "?")
    }

    fn locking_read(plain: &'static crate::backend::Statement, _: &'static crate::backend::Statement) -> &'static str {
        plain.question()
    }

    /// One process: the server's own bus sees every task change.
    async fn notify_task(&self, _: &mut sqlx::Transaction<'static, sqlx::Sqlite>, _: &[u8]) -> Result<(), sqlx::Error> {
        Ok(())
    }

    fn rows_affected(done: &<sqlx::Sqlite as sqlx::Database>::QueryResult) -> u64 {
        done.rows_affected()
    }
}

impl crate::audit_sql::AuditBackend for SqliteStore {
    const MARKER: char = '?';

    async fn ping_backend(&self) -> Result<(), StoreError> {
        SqliteStore::ping_inner(self).await
    }

    async fn close_backend(&self) {
        SqliteStore::close_inner(self).await
    }

    fn own_chain(&self) -> &OwnChain {
        &self.own
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_urls_are_recognised() {
        assert!(is_in_memory("sqlite::memory:"));
        assert!(is_in_memory("sqlite://:memory:"));
        assert!(is_in_memory("sqlite:file:x?mode=memory&cache=shared"));
        assert!(!is_in_memory("sqlite:audit.db"));
        assert!(is_in_memory(":memory:"));
        assert!(!is_in_memory("memory.db"));
    }

    use crate::AuditStore as _;

    #[tokio::test]
    async fn in_memory_store_survives_idle_and_round_trips() {
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        store.ping().await.unwrap();
        assert!(store.verify_chain().await.unwrap().is_intact());
    }
}
