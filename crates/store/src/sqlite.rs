//! `SqliteStore`: the embedded audit backend. One file in WAL mode; one writer connection per
//! store and `BEGIN IMMEDIATE`, so appenders in this process queue on the pool and appenders in
//! other processes wait on SQLite's write lock (busy_timeout) instead of forking the chain.

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use crate::chain::{self, AuditRow, Head, decode_row};
use crate::handles::{Bind, SummaryRow, decode_summary, revoke_statement, sql};
use crate::sessions::{LiveRow, check_level, check_uri, decode_live, sql as session_sql};
use crate::sqlite_sync::SyncSqlite;
use crate::store::{MAX_RECENT, StoreFuture};
use crate::tasks::{
    self, MAX_TASK_HISTORY, TaskRow, TaskStore, TaskTuple, bind_task_insert, bind_task_swap, decode_task,
};
use crate::{
    AuditRecord, AuditStore, BlockingAppend, ChainReport, HandleOwner, HandleStore, HandleSummary, LiveHandle,
    LiveSession, MAX_HANDLE_LIST, MAX_SESSION_SUBSCRIPTIONS, NewHandle, NewSession, Revocation, RevokeSelector,
    SessionOwner, SessionStore, StoreError, StoredAuditRecord,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// How long a writer waits for another process's write lock before giving up (`Unavailable`).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller waits for a pooled connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// Read connections for a file database: handle lookups, verify and recent run beside the writer.
const READERS: u32 = 4;

/// Most rows per INSERT statement (15 parameters each; SQLite allows 32766 per statement).
const INSERT_CHUNK: usize = 64;

const SELECT_HEAD: &str = "SELECT last_seq, last_hash FROM audit_chain_head WHERE id = 1";
const UPDATE_HEAD: &str = "UPDATE audit_chain_head SET last_seq = ?1, last_hash = ?2 WHERE id = 1";
const SELECT_PAGE: &str =
    concat!("SELECT ", audit_columns!(), " FROM audit_log WHERE seq > ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3");
const SELECT_RECENT: &str = concat!("SELECT ", audit_columns!(), " FROM audit_log ORDER BY seq DESC LIMIT ?1");
const SELECT_HEAD_AND_MAX: &str =
    "SELECT (SELECT last_seq FROM audit_chain_head WHERE id = 1), (SELECT max(seq) FROM audit_log)";

/// The SQLite audit store.
pub struct SqliteStore {
    /// Exactly one connection: appends in this process run one at a time.
    writer: SqlitePool,
    /// Reads; the same pool as `writer` for an in-memory database (a second pool would be a
    /// second, empty database).
    reader: SqlitePool,
    /// Audit appends and handle lookups without sqlx's worker thread; `None` for an in-memory
    /// database (see [`crate::sqlite_sync`]).
    sync: Option<Arc<SyncSqlite>>,
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
            if in_memory { None } else { Some(Arc::new(SyncSqlite::open(options.get_filename(), BUSY_TIMEOUT)?)) };
        let store = SqliteStore { writer, reader, sync };
        store.ping_inner().await?;
        Ok(store)
    }

    async fn ping_inner(&self) -> Result<(), StoreError> {
        read_head(&self.reader, "ping").await.map(|_| ())
    }

    async fn append_inner(&self, records: Vec<AuditRecord>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        if let Some(sync) = &self.sync {
            let sync = sync.clone();
            return tokio::task::spawn_blocking(move || sync.append(records))
                .await
                .unwrap_or_else(|_| Err(StoreError::unavailable("append")));
        }
        // Validate before taking the write lock.
        for record in &records {
            record.validate()?;
        }
        let during = "append";
        let sqlx_error = |error| StoreError::from_sqlx(during, error);
        // IMMEDIATE takes the write lock before reading the head, so no other process can link
        // onto the same head between our read and our commit.
        let mut transaction = self.writer.begin_with("BEGIN IMMEDIATE").await.map_err(sqlx_error)?;
        let (seq, hash): (i64, Vec<u8>) = sqlx::query_as(SELECT_HEAD)
            .fetch_optional(&mut *transaction)
            .await
            .map_err(sqlx_error)?
            .ok_or_else(|| StoreError::corrupt("the chain head row is missing"))?;
        let (rows, head) = chain::link(Head::from_columns(seq, &hash)?, records)?;
        // Multi-row INSERTs: one statement per chunk instead of one per record, since every
        // statement is a round trip to sqlx's SQLite worker thread.
        let mut rows = rows.into_iter().peekable();
        while rows.peek().is_some() {
            let chunk: Vec<_> = rows.by_ref().take(INSERT_CHUNK).collect();
            let mut query = sqlx::query(insert_statement(chunk.len()));
            for row in chunk {
                query = query
                    .bind(row.seq)
                    .bind(row.at_ms)
                    .bind(row.record.trace_id)
                    .bind(row.record.stage)
                    .bind(row.decision)
                    .bind(row.record.operation)
                    .bind(row.record.principal_digest)
                    .bind(row.record.tenant_digest)
                    .bind(row.record.client_digest)
                    .bind(row.scopes_json)
                    .bind(row.record.policy_version)
                    .bind(row.record.code)
                    .bind(row.record.detail)
                    .bind(row.prev_hash.to_vec())
                    .bind(row.hash.to_vec());
            }
            query.execute(&mut *transaction).await.map_err(sqlx_error)?;
        }
        sqlx::query(UPDATE_HEAD)
            .bind(head.seq)
            .bind(head.hash.to_vec())
            .execute(&mut *transaction)
            .await
            .map_err(sqlx_error)?;
        transaction.commit().await.map_err(sqlx_error)
    }

    async fn verify_inner(&self) -> Result<ChainReport, StoreError> {
        let during = "verify";
        let head = read_head(&self.reader, during).await?;
        let verifier = chain::walk(head, |after_seq, up_to_seq, limit| async move {
            sqlx::query_as(SELECT_PAGE)
                .bind(after_seq)
                .bind(up_to_seq)
                .bind(limit)
                .fetch_all(&self.reader)
                .await
                .map_err(|error| StoreError::from_sqlx(during, error))
        })
        .await?;
        let (head_seq_now, max_seq_now): (i64, Option<i64>) = sqlx::query_as(SELECT_HEAD_AND_MAX)
            .fetch_one(&self.reader)
            .await
            .map_err(|error| StoreError::from_sqlx(during, error))?;
        Ok(verifier.finish(head_seq_now, max_seq_now))
    }

    async fn recent_inner(&self, limit: u32) -> Result<Vec<StoredAuditRecord>, StoreError> {
        let rows: Vec<AuditRow> = sqlx::query_as(SELECT_RECENT)
            .bind(i64::from(limit.min(MAX_RECENT)))
            .fetch_all(&self.reader)
            .await
            .map_err(|error| StoreError::from_sqlx("recent", error))?;
        rows.into_iter().map(decode_row).collect()
    }
}

async fn read_head(pool: &SqlitePool, during: &'static str) -> Result<Head, StoreError> {
    let (seq, hash): (i64, Vec<u8>) = sqlx::query_as(SELECT_HEAD)
        .fetch_optional(pool)
        .await
        .map_err(|error| StoreError::from_sqlx(during, error))?
        .ok_or_else(|| StoreError::corrupt("the chain head row is missing"))?;
    Head::from_columns(seq, &hash)
}

/// `INSERT INTO audit_log (…) VALUES (?, …), …` for `rows` rows (1..=INSERT_CHUNK), built once
/// per size; sqlx then caches each as a prepared statement.
fn insert_statement(rows: usize) -> sqlx::AssertSqlSafe<&'static str> {
    static STATEMENTS: OnceLock<Vec<String>> = OnceLock::new();
    let statements = STATEMENTS.get_or_init(|| {
        let row = format!("({})", vec!["?"; 15].join(", "));
        (1..=INSERT_CHUNK)
            .map(|count| {
                format!("INSERT INTO audit_log ({}) VALUES {}", audit_columns!(), vec![row.as_str(); count].join(", "))
            })
            .collect()
    });
    let index = rows.clamp(1, INSERT_CHUNK) - 1;
    // Only ever built above from constants: safe to send as SQL.
    sqlx::AssertSqlSafe(statements[index].as_str())
}

/// A shared `$n` statement rewritten to SQLite's `?n`, once per call site.
macro_rules! sqlite_sql {
    ($statement:expr) => {{
        static STATEMENT: OnceLock<String> = OnceLock::new();
        // Built only from the shared constant statements: safe to send as SQL.
        sqlx::AssertSqlSafe(STATEMENT.get_or_init(|| $statement.replace('$', "?")).as_str())
    }};
}

crate::handles::impl_handle_store!(
    store: SqliteStore,
    database: sqlx::Sqlite,
    writer: writer,
    reader: reader,
    sql: sqlite_sql,
    dynamic: |statement: String| statement.replace('$', "?"),
    lookup: lookup_handle_routed
);

impl SqliteStore {
    /// A file database answers inline through [`SyncSqlite`] (a primary-key probe: microseconds);
    /// an in-memory one through sqlx.
    async fn lookup_handle_routed(
        &self,
        digest: [u8; 32],
        owner: &HandleOwner,
        now_ms: i64,
    ) -> Result<Option<LiveHandle>, StoreError> {
        match &self.sync {
            Some(sync) => sync.lookup_handle(digest, owner, now_ms),
            None => self.lookup_handle_inner(digest, owner, now_ms).await,
        }
    }
}

impl SqliteStore {
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
        self.writer.begin_with("BEGIN IMMEDIATE").await
    }

    /// One process: the server's own bus sees every task change.
    async fn notify_task(&self, _: &mut sqlx::Transaction<'static, sqlx::Sqlite>, _: &[u8]) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

tasks::impl_task_store!(
    store: SqliteStore,
    begin: begin_write,
    reader: reader,
    sql: sqlite_sql,
    status_sql: sqlite_sql!(tasks::sql::STATUS),
    notify: notify_task,
    extra: {}
);

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

impl AuditStore for SqliteStore {
    fn append_batch(&self, records: Vec<AuditRecord>) -> StoreFuture<'_, ()> {
        Box::pin(self.append_inner(records))
    }

    fn blocking_append(&self) -> Option<Arc<dyn BlockingAppend>> {
        self.sync.clone().map(|sync| sync as Arc<dyn BlockingAppend>)
    }

    fn verify_chain(&self) -> StoreFuture<'_, ChainReport> {
        Box::pin(self.verify_inner())
    }

    fn recent(&self, limit: u32) -> StoreFuture<'_, Vec<StoredAuditRecord>> {
        Box::pin(self.recent_inner(limit))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(self.ping_inner())
    }

    fn close(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Some(sync) = &self.sync {
                sync.close();
            }
            self.writer.close().await;
            self.reader.close().await;
        })
    }
}

crate::sessions::impl_session_store!(
    store: SqliteStore,
    writer: writer,
    reader: reader,
    sql: sqlite_sql,
    stmt: sqlx::AssertSqlSafe<&'static str>
);

crate::once::impl_once_store!(
    store: SqliteStore,
    writer: writer,
    sql: sqlite_sql
);

crate::pins::impl_pin_store!(
    store: SqliteStore,
    begin: begin_write,
    writer: writer,
    reader: reader,
    sql: sqlite_sql
);

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

    #[tokio::test]
    async fn in_memory_store_survives_idle_and_round_trips() {
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        store.ping().await.unwrap();
        assert!(store.verify_chain().await.unwrap().is_intact());
    }
}
