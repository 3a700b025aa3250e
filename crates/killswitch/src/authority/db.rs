//! `AuthorityDb`: the authority's state in SQLite, and the redeem function a backend sharing the
//! database runs inside its commit transaction.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use serde::Serialize;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::AuthorityServiceError;
use crate::envelope::sha256_hex;
use crate::head::{RedeemRequest, TargetState};
use crate::policy::MAX_SAFE_INTEGER;
use crate::target::{TargetDigest, TargetKind, hex};

const SCHEMA: [&str; 5] = [
    "CREATE TABLE IF NOT EXISTS killswitch_authority_targets (
        kind TEXT NOT NULL,
        digest TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('ENABLE', 'DISABLE')),
        generation INTEGER NOT NULL CHECK (generation > 0),
        reason_code TEXT NOT NULL,
        updated_at_ms INTEGER NOT NULL,
        PRIMARY KEY (kind, digest)
    ) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS killswitch_authority_tokens (
        token_sha256 TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        digest TEXT NOT NULL,
        generation INTEGER NOT NULL,
        issued_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        redeemed_at_ms INTEGER
    ) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS killswitch_authority_tokens_expiry ON killswitch_authority_tokens (expires_at_ms)",
    // Bumped in the transaction of every state change, by any process: an authority answering
    // from memory reloads when it moved.
    "CREATE TABLE IF NOT EXISTS killswitch_authority_meta (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        state_version INTEGER NOT NULL
    )",
    "INSERT OR IGNORE INTO killswitch_authority_meta (id, state_version) VALUES (1, 0)",
];

const SELECT_VERSION: &str = "SELECT state_version FROM killswitch_authority_meta WHERE id = 1";
const BUMP_VERSION: &str = "UPDATE killswitch_authority_meta SET state_version = state_version + 1 WHERE id = 1";
const SELECT_ALL: &str =
    "SELECT kind, digest, state, generation, reason_code, updated_at_ms FROM killswitch_authority_targets";

/// A target nobody has touched is ENABLE at generation 1 with this reason.
pub const DEFAULT_REASON: &str = "default_enable";

const SELECT_TARGET: &str = "SELECT state, generation, reason_code, updated_at_ms FROM killswitch_authority_targets WHERE kind = ?1 AND digest = ?2";
const SET_STATE: &str =
    "INSERT INTO killswitch_authority_targets (kind, digest, state, generation, reason_code, updated_at_ms)
    VALUES (?1, ?2, ?3, 2, ?4, ?5)
    ON CONFLICT (kind, digest) DO UPDATE SET state = excluded.state, generation = generation + 1,
        reason_code = excluded.reason_code, updated_at_ms = excluded.updated_at_ms
    RETURNING generation";
/// One statement: atomic against a concurrent DISABLE (SQLite serializes writers).
const REDEEM: &str = "UPDATE killswitch_authority_tokens SET redeemed_at_ms = ?1
    WHERE token_sha256 = ?2 AND kind = ?3 AND digest = ?4 AND generation = ?5
      AND redeemed_at_ms IS NULL AND expires_at_ms > ?1
      AND EXISTS (SELECT 1 FROM killswitch_authority_targets t
                  WHERE t.kind = ?3 AND t.digest = ?4 AND t.generation = ?5 AND t.state = 'ENABLE')";
const SELECT_TOKEN: &str = "SELECT kind, digest, generation, expires_at_ms, redeemed_at_ms
    FROM killswitch_authority_tokens WHERE token_sha256 = ?1";

/// A target's authoritative state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TargetStatus {
    /// The target.
    pub target: TargetDigest,
    /// ENABLE or DISABLE.
    pub state: TargetState,
    /// The head generation (1 for a target never touched).
    pub generation: u64,
    /// Why.
    pub reason_code: String,
    /// When it last changed (epoch ms; 0 for a target never touched).
    pub updated_at_ms: i64,
}

/// Why a commit token did not redeem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedeemRejection {
    /// No such token.
    Unknown,
    /// Already redeemed once.
    AlreadyUsed,
    /// Past its expiry.
    Expired,
    /// Issued for another target or generation.
    Mismatch,
    /// The target's generation moved on (a DISABLE, or a later re-enable) since issue.
    Superseded,
}

impl RedeemRejection {
    /// The reason's spelling (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::AlreadyUsed => "already_used",
            Self::Expired => "expired",
            Self::Mismatch => "mismatch",
            Self::Superseded => "superseded",
        }
    }
}

impl std::fmt::Display for RedeemRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why redemption failed. Either way the backend must not commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedeemError {
    /// The token is not (or no longer) valid.
    #[error("commit token rejected: {0}")]
    Rejected(RedeemRejection),
    /// The database could not be used.
    #[error("commit token could not be redeemed: storage unavailable")]
    Storage(#[source] sqlx::Error),
}

fn storage(during: &'static str) -> impl FnOnce(sqlx::Error) -> AuthorityServiceError {
    move |source| AuthorityServiceError::Storage { during, source: Some(source) }
}

fn to_i64(value: u64) -> Result<i64, AuthorityServiceError> {
    i64::try_from(value).map_err(|_| AuthorityServiceError::InvalidInput { what: "generation out of range" })
}

/// The state as last loaded, and the version it was loaded at.
struct Memory {
    /// `state_version` of the loaded map; `None` before the first load.
    version: std::sync::RwLock<(Option<i64>, HashMap<TargetDigest, TargetStatus>)>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// A file database's change probe (`None`: in memory).
    probe: Option<std::sync::Mutex<rusqlite::Connection>>,
    /// The probe's `data_version` at the start of the last check that found the memory current
    /// (`i64::MIN`: none yet).
    current_at: std::sync::atomic::AtomicI64,
}

impl Memory {
    fn new(probe: Option<rusqlite::Connection>) -> Self {
        Self {
            version: std::sync::RwLock::default(),
            reloading: tokio::sync::Mutex::default(),
            probe: probe.map(std::sync::Mutex::new),
            current_at: std::sync::atomic::AtomicI64::new(i64::MIN),
        }
    }

    /// SQLite's `PRAGMA data_version` on the probe connection: it changes whenever any other
    /// connection (this process's pool, or another process) commits to the file, and the probe
    /// itself never writes. Runs inline: one pragma on a kept connection, no statement to plan,
    /// no table read, no worker thread. `None` without a probe.
    fn data_version(&self) -> Result<Option<i64>, AuthorityServiceError> {
        let Some(probe) = &self.probe else { return Ok(None) };
        let connection = probe.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        connection
            .query_row("PRAGMA data_version", [], |row| row.get(0))
            .map(Some)
            .map_err(|_| AuthorityServiceError::Corrupt { what: "data version probe" })
    }
}

/// A connection on `path` for [`Memory::data_version`] (it only ever runs that pragma; opened
/// read-write, like the pool's, so a WAL file's shared-memory index is always usable).
fn open_probe(path: &std::path::Path) -> Result<rusqlite::Connection, AuthorityServiceError> {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection = rusqlite::Connection::open_with_flags(path, flags)
        .map_err(|_| AuthorityServiceError::Corrupt { what: "data version probe" })?;
    connection
        .busy_timeout(Duration::from_secs(5))
        .map_err(|_| AuthorityServiceError::Corrupt { what: "data version probe" })?;
    Ok(connection)
}

/// The authority's database, with the current state of every target kept in memory: reads
/// (the heads it answers) come from memory after a change check per request or batch — on a
/// file, SQLite's `data_version` on a kept connection (a pragma, inline), and only when that
/// moved the single-row read of the state version; changes are written to the database (bumping
/// the version in the same transaction) and picked up by every `AuthorityDb` on the file — in
/// this process or another — at its next check.
#[derive(Clone)]
pub struct AuthorityDb {
    pool: SqlitePool,
    random: std::sync::Arc<SystemRandom>,
    memory: std::sync::Arc<Memory>,
}

impl std::fmt::Debug for AuthorityDb {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("AuthorityDb").finish_non_exhaustive()
    }
}

impl AuthorityDb {
    /// Opens (creating if missing) the database: a file path or a `sqlite:` URL. WAL, 5 s busy
    /// timeout.
    pub async fn open(path_or_url: &str) -> Result<Self, AuthorityServiceError> {
        let options = if path_or_url.starts_with("sqlite:") {
            SqliteConnectOptions::from_str(path_or_url).map_err(storage("open"))?
        } else {
            SqliteConnectOptions::new().filename(path_or_url)
        };
        let in_memory = path_or_url.contains(":memory:") || path_or_url.contains("mode=memory");
        let options =
            options.create_if_missing(true).busy_timeout(Duration::from_secs(5)).synchronous(SqliteSynchronous::Normal);
        let options = if in_memory { options } else { options.journal_mode(SqliteJournalMode::Wal) };
        let pool = SqlitePoolOptions::new()
            .max_connections(if in_memory { 1 } else { 4 })
            .min_connections(u32::from(in_memory))
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(Duration::from_secs(3))
            .connect_with(options)
            .await
            .map_err(storage("open"))?;
        Self::from_pool(pool).await
    }

    /// Uses an existing pool — e.g. a backend's own database, so it can redeem tokens inside its
    /// commit transactions; creates the tables if missing.
    pub async fn from_pool(pool: SqlitePool) -> Result<Self, AuthorityServiceError> {
        for statement in SCHEMA {
            sqlx::query(statement).execute(&pool).await.map_err(storage("schema"))?;
        }
        // A file database has a file by now (the pool created it); an in-memory one (whose
        // name is sqlx's own, e.g. `file:sqlx-in-memory-1`) has none and no other connection.
        let filename = pool.connect_options().get_filename().to_owned();
        let probe = if filename.is_file() { Some(open_probe(&filename)?) } else { None };
        Ok(Self {
            pool,
            random: std::sync::Arc::new(SystemRandom::new()),
            memory: std::sync::Arc::new(Memory::new(probe)),
        })
    }

    /// The pool (for a backend sharing the database).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// `palisade authority disable`: sets DISABLE with a new (higher) generation.
    pub async fn disable(
        &self,
        target: &TargetDigest,
        reason_code: &str,
        now_ms: i64,
    ) -> Result<TargetStatus, AuthorityServiceError> {
        self.set_state(target, TargetState::Disable, reason_code, now_ms).await
    }

    /// `palisade authority enable`: sets ENABLE with a new (higher) generation.
    pub async fn enable(
        &self,
        target: &TargetDigest,
        reason_code: &str,
        now_ms: i64,
    ) -> Result<TargetStatus, AuthorityServiceError> {
        self.set_state(target, TargetState::Enable, reason_code, now_ms).await
    }

    async fn set_state(
        &self,
        target: &TargetDigest,
        state: TargetState,
        reason_code: &str,
        now_ms: i64,
    ) -> Result<TargetStatus, AuthorityServiceError> {
        if !target.is_well_formed() {
            return Err(AuthorityServiceError::InvalidInput { what: "target digest" });
        }
        if !is_reason_code(reason_code) {
            return Err(AuthorityServiceError::InvalidInput {
                what: "reason code (1-256 bytes, no control characters)",
            });
        }
        let mut transaction = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(storage("set state"))?;
        let generation: i64 = sqlx::query_scalar(SET_STATE)
            .bind(target.kind.as_str())
            .bind(&target.digest)
            .bind(state.as_str())
            .bind(reason_code)
            .bind(now_ms)
            .fetch_one(&mut *transaction)
            .await
            .map_err(storage("set state"))?;
        sqlx::query(BUMP_VERSION).execute(&mut *transaction).await.map_err(storage("set state"))?;
        transaction.commit().await.map_err(storage("set state"))?;
        let generation =
            u64::try_from(generation).map_err(|_| AuthorityServiceError::Corrupt { what: "generation" })?;
        if generation > MAX_SAFE_INTEGER {
            return Err(AuthorityServiceError::Corrupt { what: "generation beyond 2^53" });
        }
        tracing::info!(target_kind = %target.kind, generation, state = state.as_str(), "authority state changed");
        Ok(TargetStatus {
            target: target.clone(),
            state,
            generation,
            reason_code: reason_code.to_owned(),
            updated_at_ms: now_ms,
        })
    }

    /// `palisade authority status`: every target that has a stored state, by kind and digest.
    pub async fn status(&self) -> Result<Vec<TargetStatus>, AuthorityServiceError> {
        let rows = sqlx::query(
            "SELECT kind, digest, state, generation, reason_code, updated_at_ms FROM killswitch_authority_targets ORDER BY kind, digest",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(storage("status"))?;
        rows.iter()
            .map(|row| {
                let kind: String = row.try_get(0).map_err(storage("status"))?;
                let kind =
                    TargetKind::from_name(&kind).ok_or(AuthorityServiceError::Corrupt { what: "target kind" })?;
                let digest: String = row.try_get(1).map_err(storage("status"))?;
                status_from_columns(
                    TargetDigest { kind, digest },
                    row.try_get(2).map_err(storage("status"))?,
                    row.try_get(3).map_err(storage("status"))?,
                    row.try_get(4).map_err(storage("status"))?,
                    row.try_get(5).map_err(storage("status"))?,
                )
            })
            .collect()
    }

    /// One target's state (ENABLE at generation 1 if never touched).
    pub async fn target_status(&self, target: &TargetDigest) -> Result<TargetStatus, AuthorityServiceError> {
        let mut connection = self.pool.acquire().await.map_err(storage("status"))?;
        read_target(&mut connection, target).await
    }

    /// Brings the in-memory state up to date. On a file: nothing more when SQLite's
    /// `data_version` has not moved since the memory was last found current (no connection
    /// committed anything since). Otherwise one single-row read of the state version, and only
    /// when that moved, the whole state again (one read transaction).
    async fn refresh(&self) -> Result<(), AuthorityServiceError> {
        use std::sync::atomic::Ordering;
        // Read before the check below, so a change committed after it moves it again.
        let data_version = self.memory.data_version()?;
        if let Some(version) = data_version
            && self.memory.current_at.load(Ordering::SeqCst) == version
            && self.loaded_version().is_some()
        {
            return Ok(());
        }
        self.reload_if_moved().await?;
        if let Some(version) = data_version {
            // The memory is current as of `version` (or later): never record an older one.
            self.memory.current_at.fetch_max(version, Ordering::SeqCst);
        }
        Ok(())
    }

    /// One single-row read of the version; only when it moved, the whole state again.
    async fn reload_if_moved(&self) -> Result<(), AuthorityServiceError> {
        let current: i64 =
            sqlx::query_scalar(SELECT_VERSION).fetch_one(&self.pool).await.map_err(storage("version"))?;
        if self.loaded_version() == Some(current) {
            return Ok(());
        }
        let _one = self.memory.reloading.lock().await;
        if self.loaded_version() == Some(current) {
            return Ok(());
        }
        let mut transaction = self.pool.begin().await.map_err(storage("reload"))?;
        let version: i64 =
            sqlx::query_scalar(SELECT_VERSION).fetch_one(&mut *transaction).await.map_err(storage("reload"))?;
        let rows = sqlx::query(SELECT_ALL).fetch_all(&mut *transaction).await.map_err(storage("reload"))?;
        transaction.commit().await.map_err(storage("reload"))?;
        let mut map = HashMap::with_capacity(rows.len());
        for row in &rows {
            let kind: String = row.try_get(0).map_err(storage("reload"))?;
            let kind = TargetKind::from_name(&kind).ok_or(AuthorityServiceError::Corrupt { what: "target kind" })?;
            let target = TargetDigest { kind, digest: row.try_get(1).map_err(storage("reload"))? };
            let status = status_from_columns(
                target.clone(),
                row.try_get(2).map_err(storage("reload"))?,
                row.try_get(3).map_err(storage("reload"))?,
                row.try_get(4).map_err(storage("reload"))?,
                row.try_get(5).map_err(storage("reload"))?,
            )?;
            map.insert(target, status);
        }
        let mut memory =
            self.memory.version.write().map_err(|_| AuthorityServiceError::Corrupt { what: "state lock" })?;
        *memory = (Some(version), map);
        Ok(())
    }

    fn loaded_version(&self) -> Option<i64> {
        self.memory.version.read().ok().and_then(|memory| memory.0)
    }

    /// Answers many queries at once: every target's state from memory (after [`Self::refresh`])
    /// and, for each query asking with `issue = true`, a one-use commit token per ENABLE target
    /// (stored as its SHA-256 only), all tokens of the call in one database transaction.
    pub(crate) async fn answer(
        &self,
        queries: &[(&[TargetDigest], bool)],
        now_ms: i64,
        token_ttl_ms: i64,
    ) -> Result<Vec<Vec<(TargetStatus, Option<String>)>>, AuthorityServiceError> {
        self.refresh().await?;
        let mut answers = Vec::with_capacity(queries.len());
        let mut issued: Vec<(TargetDigest, u64, bool, String)> = Vec::new();
        {
            let memory =
                self.memory.version.read().map_err(|_| AuthorityServiceError::Corrupt { what: "state lock" })?;
            for (targets, issue) in queries {
                let mut heads = Vec::with_capacity(targets.len());
                for target in *targets {
                    let (status, stored) = match memory.1.get(target) {
                        Some(status) => (status.clone(), true),
                        None => (default_status(target), false),
                    };
                    let token = if *issue && status.state == TargetState::Enable {
                        let mut bytes = [0_u8; 32];
                        self.random
                            .fill(&mut bytes)
                            .map_err(|_| AuthorityServiceError::Corrupt { what: "random generator" })?;
                        let token = hex(&bytes);
                        issued.push((target.clone(), status.generation, stored, sha256_hex(token.as_bytes())));
                        Some(token)
                    } else {
                        None
                    };
                    heads.push((status, token));
                }
                answers.push(heads);
            }
        }
        if !issued.is_empty() {
            // Two statements for the whole call, however many tokens (each row: 6 or 4 values,
            // far below SQLite's variable limit for the largest batch).
            let mut transaction = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(storage("issue token"))?;
            let unstored: Vec<&(TargetDigest, u64, bool, String)> = issued.iter().filter(|issue| !issue.2).collect();
            if !unstored.is_empty() {
                // The redeem statement needs the row; a concurrent change wins (DO NOTHING).
                let mut builder = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                    "INSERT INTO killswitch_authority_targets (kind, digest, state, generation, reason_code, updated_at_ms) ",
                );
                builder.push_values(unstored, |mut row, (target, _, _, _)| {
                    row.push_bind(target.kind.as_str())
                        .push_bind(target.digest.as_str())
                        .push_bind("ENABLE")
                        .push_bind(1_i64)
                        .push_bind(DEFAULT_REASON)
                        .push_bind(now_ms);
                });
                builder.push(" ON CONFLICT (kind, digest) DO NOTHING");
                builder.build().execute(&mut *transaction).await.map_err(storage("issue token"))?;
            }
            let mut rows = Vec::with_capacity(issued.len());
            for (target, generation, _, token_digest) in &issued {
                rows.push((target, to_i64(*generation)?, token_digest));
            }
            let mut builder = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                "INSERT INTO killswitch_authority_tokens (token_sha256, kind, digest, generation, issued_at_ms, expires_at_ms) ",
            );
            builder.push_values(rows, |mut row, (target, generation, token_digest)| {
                row.push_bind(token_digest.as_str())
                    .push_bind(target.kind.as_str())
                    .push_bind(target.digest.as_str())
                    .push_bind(generation)
                    .push_bind(now_ms)
                    .push_bind(now_ms.saturating_add(token_ttl_ms));
            });
            builder.build().execute(&mut *transaction).await.map_err(storage("issue token"))?;
            transaction.commit().await.map_err(storage("issue token"))?;
        }
        Ok(answers)
    }

    /// Redeems a token in its own transaction (the HTTP redeem endpoint).
    pub async fn redeem(&self, request: &RedeemRequest, now_ms: i64) -> Result<(), RedeemError> {
        let mut transaction = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(RedeemError::Storage)?;
        redeem_commit_token(&mut transaction, request, now_ms).await?;
        transaction.commit().await.map_err(RedeemError::Storage)
    }

    /// Deletes tokens that expired before `before_ms`; returns how many.
    pub async fn purge_expired_tokens(&self, before_ms: i64) -> Result<u64, AuthorityServiceError> {
        let result = sqlx::query("DELETE FROM killswitch_authority_tokens WHERE expires_at_ms < ?1")
            .bind(before_ms)
            .execute(&self.pool)
            .await
            .map_err(storage("purge"))?;
        Ok(result.rows_affected())
    }
}

/// Redeems a commit token inside the caller's transaction on a database shared with the
/// authority. Call it in the same transaction as the protected effect, before committing; on
/// `Err` roll back. Start that transaction with `BEGIN IMMEDIATE`
/// (`pool.begin_with("BEGIN IMMEDIATE")`) so it holds SQLite's write lock from the start.
///
/// Succeeds only if the token exists, was issued for this target and generation, is unused and
/// unexpired, and the target is still ENABLE at that generation — one SQL statement, so a
/// DISABLE committed before it always wins.
pub async fn redeem_commit_token(
    connection: &mut SqliteConnection,
    request: &RedeemRequest,
    now_ms: i64,
) -> Result<(), RedeemError> {
    let Ok(generation) = i64::try_from(request.generation) else {
        return Err(RedeemError::Rejected(RedeemRejection::Mismatch));
    };
    let token_digest = sha256_hex(request.token.as_bytes());
    let result = sqlx::query(REDEEM)
        .bind(now_ms)
        .bind(&token_digest)
        .bind(request.target.kind.as_str())
        .bind(&request.target.digest)
        .bind(generation)
        .execute(&mut *connection)
        .await
        .map_err(RedeemError::Storage)?;
    if result.rows_affected() == 1 {
        return Ok(());
    }
    // Find out why, for the operator's log; the answer is a refusal either way.
    let row = sqlx::query(SELECT_TOKEN)
        .bind(&token_digest)
        .fetch_optional(&mut *connection)
        .await
        .map_err(RedeemError::Storage)?;
    let rejection = match row {
        None => RedeemRejection::Unknown,
        Some(row) => {
            let kind: String = row.try_get(0).map_err(RedeemError::Storage)?;
            let digest: String = row.try_get(1).map_err(RedeemError::Storage)?;
            let issued_generation: i64 = row.try_get(2).map_err(RedeemError::Storage)?;
            let expires_at_ms: i64 = row.try_get(3).map_err(RedeemError::Storage)?;
            let redeemed_at_ms: Option<i64> = row.try_get(4).map_err(RedeemError::Storage)?;
            if redeemed_at_ms.is_some() {
                RedeemRejection::AlreadyUsed
            } else if kind != request.target.kind.as_str()
                || digest != request.target.digest
                || issued_generation != generation
            {
                RedeemRejection::Mismatch
            } else if expires_at_ms <= now_ms {
                RedeemRejection::Expired
            } else {
                RedeemRejection::Superseded
            }
        }
    };
    Err(RedeemError::Rejected(rejection))
}

async fn read_target(
    connection: &mut SqliteConnection,
    target: &TargetDigest,
) -> Result<TargetStatus, AuthorityServiceError> {
    let row = sqlx::query(SELECT_TARGET)
        .bind(target.kind.as_str())
        .bind(&target.digest)
        .fetch_optional(&mut *connection)
        .await
        .map_err(storage("read target"))?;
    match row {
        None => Ok(default_status(target)),
        Some(row) => status_from_columns(
            target.clone(),
            row.try_get(0).map_err(storage("read target"))?,
            row.try_get(1).map_err(storage("read target"))?,
            row.try_get(2).map_err(storage("read target"))?,
            row.try_get(3).map_err(storage("read target"))?,
        ),
    }
}

fn default_status(target: &TargetDigest) -> TargetStatus {
    TargetStatus {
        target: target.clone(),
        state: TargetState::Enable,
        generation: 1,
        reason_code: DEFAULT_REASON.to_owned(),
        updated_at_ms: 0,
    }
}

fn status_from_columns(
    target: TargetDigest,
    state: String,
    generation: i64,
    reason_code: String,
    updated_at_ms: i64,
) -> Result<TargetStatus, AuthorityServiceError> {
    let state = match state.as_str() {
        "ENABLE" => TargetState::Enable,
        "DISABLE" => TargetState::Disable,
        _ => return Err(AuthorityServiceError::Corrupt { what: "state" }),
    };
    let generation = u64::try_from(generation).map_err(|_| AuthorityServiceError::Corrupt { what: "generation" })?;
    Ok(TargetStatus { target, state, generation, reason_code, updated_at_ms })
}

fn is_reason_code(reason: &str) -> bool {
    !reason.trim().is_empty() && reason.len() <= 256 && !reason.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory database has no file to probe: it answers through the state version read,
    /// sees its own changes at the next answer, and leaves no file behind.
    #[tokio::test]
    async fn an_in_memory_database_answers_changes_without_a_probe() {
        let db = AuthorityDb::open("sqlite::memory:").await.unwrap();
        assert!(db.memory.probe.is_none());
        let target = TargetDigest { kind: TargetKind::Tool, digest: "ab".repeat(32) };
        let state = |answers: Vec<Vec<(TargetStatus, Option<String>)>>| {
            let (status, _) = &answers[0][0];
            (status.state, status.generation)
        };
        let queries = [(std::slice::from_ref(&target), false)];
        assert_eq!(state(db.answer(&queries, 1_000, 60_000).await.unwrap()), (TargetState::Enable, 1));
        db.disable(&target, "halt", 2_000).await.unwrap();
        assert_eq!(state(db.answer(&queries, 3_000, 60_000).await.unwrap()), (TargetState::Disable, 2));
        let stray = std::fs::read_dir(".")
            .unwrap()
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().starts_with("file:sqlx-in-memory"));
        assert!(!stray, "no file was created for an in-memory database");
    }

    /// A file database gets a probe, and a change by another connection moves it.
    #[tokio::test]
    async fn a_file_database_is_probed_and_sees_other_connections_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authority.db");
        let db = AuthorityDb::open(path.to_str().unwrap()).await.unwrap();
        let other = AuthorityDb::open(path.to_str().unwrap()).await.unwrap();
        assert!(db.memory.probe.is_some());
        let target = TargetDigest { kind: TargetKind::Tool, digest: "cd".repeat(32) };
        let queries = [(std::slice::from_ref(&target), false)];
        let before = db.memory.data_version().unwrap();
        db.answer(&queries, 1_000, 60_000).await.unwrap();
        assert_eq!(db.memory.data_version().unwrap(), before, "reading moves nothing");
        other.disable(&target, "halt", 2_000).await.unwrap();
        assert_ne!(db.memory.data_version().unwrap(), before, "another connection's commit moves it");
        let answers = db.answer(&queries, 3_000, 60_000).await.unwrap();
        assert_eq!((answers[0][0].0.state, answers[0][0].0.generation), (TargetState::Disable, 2));
    }
}
