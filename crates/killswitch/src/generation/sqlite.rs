//! `SqliteGenerationStore`: the embedded backend. One `BEGIN IMMEDIATE` transaction per batch
//! (reads and writes under SQLite's write lock, so instances sharing the file serialize).

use std::str::FromStr;
use std::time::Duration;

use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use super::{
    GenerationRecord, GenerationStore, GenerationStoreError, MonotonicOutcome, StoreFuture, decide, validate_batch,
};

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS killswitch_generations (
    authority TEXT NOT NULL,
    subject TEXT NOT NULL,
    generation INTEGER NOT NULL CHECK (generation > 0),
    digest TEXT NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (authority, subject)
) WITHOUT ROWID";

const SELECT: &str = "SELECT generation, digest FROM killswitch_generations WHERE authority = ?1 AND subject = ?2";
const UPSERT: &str = "INSERT INTO killswitch_generations (authority, subject, generation, digest, state)
    VALUES (?1, ?2, ?3, ?4, ?5)
    ON CONFLICT (authority, subject) DO UPDATE SET generation = excluded.generation,
        digest = excluded.digest, state = excluded.state";

/// The SQLite generation store.
#[derive(Clone)]
pub struct SqliteGenerationStore {
    pool: SqlitePool,
}

impl std::fmt::Debug for SqliteGenerationStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("SqliteGenerationStore").finish_non_exhaustive()
    }
}

impl SqliteGenerationStore {
    /// Opens (creating if missing) a database: a file path, a `sqlite:` URL, or `sqlite::memory:`
    /// (private to this store). WAL, 5 s busy timeout, one connection.
    pub async fn open(path_or_url: &str) -> Result<Self, GenerationStoreError> {
        let options = if path_or_url.starts_with("sqlite:") {
            SqliteConnectOptions::from_str(path_or_url)
                .map_err(|error| GenerationStoreError::unavailable("open", error))?
        } else {
            SqliteConnectOptions::new().filename(path_or_url)
        };
        let in_memory = path_or_url.contains(":memory:") || path_or_url.contains("mode=memory");
        let options =
            options.create_if_missing(true).busy_timeout(Duration::from_secs(5)).synchronous(SqliteSynchronous::Normal);
        let options = if in_memory { options } else { options.journal_mode(SqliteJournalMode::Wal) };
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(u32::from(in_memory))
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(Duration::from_secs(3))
            .connect_with(options)
            .await
            .map_err(|error| GenerationStoreError::unavailable("open", error))?;
        Self::from_pool(pool).await
    }

    /// Uses an existing pool (e.g. the server's SQLite database); creates the table if missing.
    pub async fn from_pool(pool: SqlitePool) -> Result<Self, GenerationStoreError> {
        sqlx::query(SCHEMA).execute(&pool).await.map_err(|error| GenerationStoreError::unavailable("schema", error))?;
        Ok(Self { pool })
    }

    /// Closes the pool (tests use it to simulate a restart).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn accept_batch(&self, records: &[GenerationRecord]) -> Result<Vec<MonotonicOutcome>, GenerationStoreError> {
        validate_batch(records)?;
        let unavailable = |error| GenerationStoreError::unavailable("accept", error);
        let mut transaction = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(unavailable)?;
        let mut outcomes = Vec::with_capacity(records.len());
        for record in records {
            let row = sqlx::query(SELECT)
                .bind(&record.authority)
                .bind(record.subject.storage_name())
                .fetch_optional(&mut *transaction)
                .await
                .map_err(unavailable)?;
            let stored = match &row {
                Some(row) => {
                    let generation: i64 = row.try_get(0).map_err(unavailable)?;
                    let digest: &str = row.try_get(1).map_err(unavailable)?;
                    let generation = u64::try_from(generation)
                        .map_err(|_| GenerationStoreError::Corrupt { what: "negative generation" })?;
                    Some((generation, digest))
                }
                None => None,
            };
            outcomes.push(decide(stored, record));
        }
        if outcomes.iter().all(|outcome| outcome.is_acceptable()) {
            for (record, outcome) in records.iter().zip(&outcomes) {
                if *outcome != MonotonicOutcome::Accepted {
                    continue;
                }
                let generation = i64::try_from(record.generation)
                    .map_err(|_| GenerationStoreError::InvalidRequest { what: "generation out of range" })?;
                sqlx::query(UPSERT)
                    .bind(&record.authority)
                    .bind(record.subject.storage_name())
                    .bind(generation)
                    .bind(&record.digest)
                    .bind(&record.state)
                    .execute(&mut *transaction)
                    .await
                    .map_err(unavailable)?;
            }
            transaction.commit().await.map_err(unavailable)?;
        } else {
            transaction.rollback().await.map_err(unavailable)?;
        }
        Ok(outcomes)
    }
}

impl GenerationStore for SqliteGenerationStore {
    fn accept_all<'a>(&'a self, records: &'a [GenerationRecord]) -> StoreFuture<'a, Vec<MonotonicOutcome>> {
        Box::pin(self.accept_batch(records))
    }
}
