//! The `TaskStore` trait: durable, partitioned Tasks (seed 002). Rows are keyed by the SHA-256
//! of the task id (the id itself is never stored) and bound to the owner (keyed subject digest,
//! tenant, client) and to the originating request (request id, method, tool, arguments digest)
//! and the scopes it was authorized under.
//!
//! **Concurrency:** every change is a compare-and-swap on the row's `version` that also requires
//! a non-terminal status, in one statement, with the status history appended in the same
//! transaction. So terminal states are immutable *in the store* (no later writer can change a
//! completed, failed or cancelled row, whatever the application does), and two instances racing
//! on one task serialize: one wins, the other re-reads.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::StoreError;
use crate::backend::Backend;
use crate::handles::HandleOwner;
use crate::store::StoreFuture;

/// A task's status (its string form is the stored and the wire form).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// Its handler is running (or about to).
    Working,
    /// Waiting for the client's answers (`tasks/update`).
    InputRequired,
    /// Done, with a result.
    Completed,
    /// Done, with an error.
    Failed,
    /// Stopped by the client or a revocation.
    Cancelled,
}

impl TaskStatus {
    /// Every status.
    pub const ALL: [TaskStatus; 5] =
        [Self::Working, Self::InputRequired, Self::Completed, Self::Failed, Self::Cancelled];

    /// The stored and wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The status a stored string names; anything else is `None`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == text)
    }

    /// Whether a task can no longer leave this status.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Most history rows [`TaskStore::task_history`] returns.
pub const MAX_TASK_HISTORY: u32 = 1_000;

/// One task row. JSON columns are text; the server gives them meaning.
#[derive(Clone, PartialEq, Eq)]
pub struct TaskRow {
    /// SHA-256 of the task id.
    pub digest: [u8; 32],
    /// Who may see and steer it.
    pub owner: HandleOwner,
    /// The JSON-RPC id of the `tools/call` that created it, as JSON text.
    pub request_id: String,
    /// `tools/call`.
    pub method: String,
    /// The tool.
    pub tool: String,
    /// SHA-256 of the canonical arguments.
    pub arguments_digest: [u8; 32],
    /// The scopes the call was authorized under (space-separated).
    pub scopes: String,
    /// What the worker needs to run the tool again: principal, arguments, client capabilities
    /// (JSON). Never a token or a raw handle.
    pub execution: String,
    /// `working`, `input_required`, `completed`, `failed` or `cancelled`.
    pub status: TaskStatus,
    /// Human-readable status text.
    pub status_message: Option<String>,
    /// Outstanding input requests (JSON object) while `input_required`.
    pub input_requests: Option<String>,
    /// Every answer accepted so far (JSON object).
    pub input_responses: String,
    /// Every input key ever answered (JSON array): keys are unique over the task's life.
    pub answered_keys: String,
    /// The tool result (JSON) once `completed`.
    pub result: Option<String>,
    /// The JSON-RPC error (JSON) once `failed`.
    pub error: Option<String>,
    /// Whether cancellation was asked for.
    pub cancel_requested: bool,
    /// Unix milliseconds.
    pub created_ms: i64,
    /// Unix milliseconds.
    pub updated_ms: i64,
    /// Retention after creation; `None` is unlimited.
    pub ttl_ms: Option<i64>,
    /// Suggested polling interval.
    pub poll_interval_ms: Option<i64>,
    /// The instance running it, while `working`.
    pub lease_owner: Option<String>,
    /// Until when that instance holds it.
    pub lease_until_ms: Option<i64>,
    /// How many times a worker started it.
    pub attempts: i64,
    /// Optimistic-concurrency version, bumped by every change.
    pub version: i64,
}

impl std::fmt::Debug for TaskRow {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TaskRow")
            .field("digest", &crate::hex_prefix(&self.digest))
            .field("tool", &self.tool)
            .field("status", &self.status)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl TaskRow {
    /// Whether the status is terminal.
    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }

    /// When the row may be purged, if ever.
    pub fn expires_ms(&self) -> Option<i64> {
        self.ttl_ms.map(|ttl| self.created_ms.saturating_add(ttl))
    }

    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        if self.owner.tenant.is_empty() || self.owner.client.is_empty() || self.tool.is_empty() {
            return Err(StoreError::InvalidRecord { reason: "a task needs a tenant, a client and a tool" });
        }
        if self.ttl_ms.is_some_and(|ttl| ttl < 0) || self.poll_interval_ms.is_some_and(|poll| poll <= 0) {
            return Err(StoreError::InvalidRecord { reason: "task ttl must be >= 0 and poll interval > 0" });
        }
        Ok(())
    }
}

/// Durable task rows. Implemented by every store backend.
pub trait TaskStore: Send + Sync + std::fmt::Debug + 'static {
    /// Inserts a new task and its first history row in one transaction. Returns only once both
    /// are committed: a `tasks/get` on any instance then finds it.
    fn insert_task(&self, task: TaskRow) -> StoreFuture<'_, ()>;

    /// The task with `digest` if `owner` owns it and it has not expired at `now_ms`.
    fn load_owned_task(&self, digest: [u8; 32], owner: &HandleOwner, now_ms: i64) -> StoreFuture<'_, Option<TaskRow>>;

    /// The task with `digest`, whoever owns it (workers only).
    fn load_task(&self, digest: [u8; 32]) -> StoreFuture<'_, Option<TaskRow>>;

    /// Replaces the mutable columns with `next`'s if the stored row is still at `expected_version`
    /// and not terminal; bumps the version and appends a history row when the status changed.
    /// `false` when another writer got there first (or the row is terminal): re-read and decide.
    fn swap_task(&self, next: TaskRow, expected_version: i64) -> StoreFuture<'_, bool>;

    /// Up to `limit` non-terminal tasks of a subject (in one tenant, or in all), oldest first:
    /// what a principal-level revocation must stop.
    fn active_tasks_of(&self, subject_key: [u8; 32], tenant: Option<&str>, limit: u32)
    -> StoreFuture<'_, Vec<TaskRow>>;

    /// Up to `limit` tasks in `working` whose lease ended before `now_ms` (their instance died).
    fn orphaned_tasks(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, Vec<TaskRow>>;

    /// The status history of a task, oldest first: `(at_ms, status)`.
    fn task_history(&self, digest: [u8; 32]) -> StoreFuture<'_, Vec<(i64, String)>>;

    /// Deletes at most `limit` tasks whose retention ended before `now_ms` (history included).
    fn purge_tasks(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64>;

    /// Digests of tasks whose row changed on *any* instance, for fan-out to listen streams, when
    /// the backend can push them (PostgreSQL `LISTEN/NOTIFY`); `None` for a single-process
    /// backend, where the server's own bus sees every change.
    fn task_changes(&self) -> Option<tokio::sync::mpsc::Receiver<[u8; 32]>> {
        None
    }
}

/// The task columns, in `SELECT` order, shared by both backends.
macro_rules! task_columns {
    () => {
        "task_digest, subject_key, tenant_id, client_id, request_id, method, tool, arguments_digest, scopes, \
         execution, status, status_message, input_requests, input_responses, answered_keys, result, error, \
         cancel_requested, created_ms, updated_ms, ttl_ms, poll_interval_ms, lease_owner, lease_until_ms, attempts, \
         version"
    };
}

/// The task statements both backends run, with `$n` placeholders (SQLite rewrites them).
pub(crate) mod sql {
    use crate::backend::Statement;

    pub static INSERT: Statement = Statement::new(concat!(
        "INSERT INTO tasks (",
        task_columns!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, \
         $21, $22, $23, $24, $25, $26)"
    ));
    pub static LOAD_OWNED: Statement = Statement::new(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE task_digest = $1 AND subject_key = $2 AND tenant_id = $3 AND client_id = $4 \
         AND (ttl_ms IS NULL OR created_ms + ttl_ms > $5)"
    ));
    pub static LOAD: Statement =
        Statement::new(concat!("SELECT ", task_columns!(), " FROM tasks WHERE task_digest = $1"));
    pub static SWAP: Statement = Statement::new(
        "UPDATE tasks SET status = $2, status_message = $3, input_requests = $4, \
         input_responses = $5, answered_keys = $6, result = $7, error = $8, cancel_requested = $9, updated_ms = $10, \
         lease_owner = $11, lease_until_ms = $12, attempts = $13, version = version + 1 \
         WHERE task_digest = $1 AND version = $14 AND status NOT IN ('completed', 'failed', 'cancelled')",
    );
    pub static STATUS: Statement = Statement::new("SELECT status FROM tasks WHERE task_digest = $1");
    /// The current status, locked until commit (the swap's history row needs it).
    pub static STATUS_FOR_UPDATE: Statement =
        Statement::new("SELECT status FROM tasks WHERE task_digest = $1 FOR UPDATE");
    pub static ACTIVE_OF: Statement = Statement::new(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE subject_key = $1 AND ($2 IS NULL OR tenant_id = $2) \
         AND status NOT IN ('completed', 'failed', 'cancelled') ORDER BY created_ms LIMIT $3"
    ));
    pub static HISTORY_INSERT: Statement =
        Statement::new("INSERT INTO task_history (task_digest, at_ms, status) VALUES ($1, $2, $3)");
    pub static HISTORY: Statement =
        Statement::new("SELECT at_ms, status FROM task_history WHERE task_digest = $1 ORDER BY at_ms, id LIMIT $2");
    pub static ORPHANS: Statement = Statement::new(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE status = 'working' AND (lease_until_ms IS NULL OR lease_until_ms < $1) \
         ORDER BY created_ms LIMIT $2"
    ));
    pub static PURGE_HISTORY: Statement = Statement::new(
        "DELETE FROM task_history WHERE task_digest IN (SELECT task_digest FROM tasks \
         WHERE ttl_ms IS NOT NULL AND created_ms + ttl_ms < $1 ORDER BY created_ms LIMIT $2)",
    );
    pub static PURGE: Statement = Statement::new(
        "DELETE FROM tasks WHERE task_digest IN (SELECT task_digest FROM tasks \
         WHERE ttl_ms IS NOT NULL AND created_ms + ttl_ms < $1 ORDER BY created_ms LIMIT $2)",
    );
}

/// A task row as both backends read it (columns by name).
#[derive(sqlx::FromRow)]
pub(crate) struct TaskTuple {
    task_digest: Vec<u8>,
    subject_key: Vec<u8>,
    tenant_id: String,
    client_id: String,
    request_id: String,
    method: String,
    tool: String,
    arguments_digest: Vec<u8>,
    scopes: String,
    execution: String,
    status: String,
    status_message: Option<String>,
    input_requests: Option<String>,
    input_responses: String,
    answered_keys: String,
    result: Option<String>,
    error: Option<String>,
    cancel_requested: bool,
    created_ms: i64,
    updated_ms: i64,
    ttl_ms: Option<i64>,
    poll_interval_ms: Option<i64>,
    lease_owner: Option<String>,
    lease_until_ms: Option<i64>,
    attempts: i64,
    version: i64,
}

pub(crate) fn decode_task(row: TaskTuple) -> Result<TaskRow, StoreError> {
    Ok(TaskRow {
        digest: crate::handles::digest_array(&row.task_digest)?,
        owner: HandleOwner {
            subject_key: crate::handles::digest_array(&row.subject_key)?,
            tenant: row.tenant_id,
            client: row.client_id,
        },
        request_id: row.request_id,
        method: row.method,
        tool: row.tool,
        arguments_digest: crate::handles::digest_array(&row.arguments_digest)?,
        scopes: row.scopes,
        execution: row.execution,
        status: TaskStatus::parse(&row.status).ok_or(StoreError::InvalidRecord { reason: "unknown task status" })?,
        status_message: row.status_message,
        input_requests: row.input_requests,
        input_responses: row.input_responses,
        answered_keys: row.answered_keys,
        result: row.result,
        error: row.error,
        cancel_requested: row.cancel_requested,
        created_ms: row.created_ms,
        updated_ms: row.updated_ms,
        ttl_ms: row.ttl_ms,
        poll_interval_ms: row.poll_interval_ms,
        lease_owner: row.lease_owner,
        lease_until_ms: row.lease_until_ms,
        attempts: row.attempts,
        version: row.version,
    })
}

/// Binds a full row in `INSERT` column order, for any sqlx query type.
macro_rules! bind_task_insert {
    ($query:expr, $task:expr) => {{
        let task = $task;
        $query
            .bind(task.digest.to_vec())
            .bind(task.owner.subject_key.to_vec())
            .bind(task.owner.tenant)
            .bind(task.owner.client)
            .bind(task.request_id)
            .bind(task.method)
            .bind(task.tool)
            .bind(task.arguments_digest.to_vec())
            .bind(task.scopes)
            .bind(task.execution)
            .bind(task.status.as_str())
            .bind(task.status_message)
            .bind(task.input_requests)
            .bind(task.input_responses)
            .bind(task.answered_keys)
            .bind(task.result)
            .bind(task.error)
            .bind(task.cancel_requested)
            .bind(task.created_ms)
            .bind(task.updated_ms)
            .bind(task.ttl_ms)
            .bind(task.poll_interval_ms)
            .bind(task.lease_owner)
            .bind(task.lease_until_ms)
            .bind(task.attempts)
            .bind(task.version)
    }};
}

/// Binds the mutable columns in `SWAP` order.
macro_rules! bind_task_swap {
    ($query:expr, $task:expr, $expected:expr) => {{
        let task = $task;
        $query
            .bind(task.digest.to_vec())
            .bind(task.status.as_str())
            .bind(task.status_message)
            .bind(task.input_requests)
            .bind(task.input_responses)
            .bind(task.answered_keys)
            .bind(task.result)
            .bind(task.error)
            .bind(task.cancel_requested)
            .bind(task.updated_ms)
            .bind(task.lease_owner)
            .bind(task.lease_until_ms)
            .bind(task.attempts)
            .bind($expected)
    }};
}

/// [`TaskStore`] for every backend, from the shared statements: one text for both, so the two
/// backends cannot drift. The backend opens the write transaction ([`Backend::begin`]), picks the
/// status read the swap locks ([`Backend::locking_read`]) and announces a change inside the
/// transaction ([`Backend::notify_task`]: PostgreSQL `pg_notify`; nothing on SQLite).
impl<B> TaskStore for B
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> bool: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<i64>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<String>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> TaskTuple: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, String): FromRow<'r, <B::Db as Database>::Row>,
{
    fn insert_task(&self, task: TaskRow) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            task.validate()?;
            let during = "insert_task";
            let sqlx_error = |error| StoreError::from_sqlx(during, error);
            let (digest, at, status) = (task.digest.to_vec(), task.created_ms, task.status.as_str().to_owned());
            let mut transaction = self.begin().await.map_err(sqlx_error)?;
            bind_task_insert!(sqlx::query(B::sql(&sql::INSERT)), task)
                .execute(&mut *transaction)
                .await
                .map_err(sqlx_error)?;
            sqlx::query(B::sql(&sql::HISTORY_INSERT))
                .bind(digest.clone())
                .bind(at)
                .bind(status)
                .execute(&mut *transaction)
                .await
                .map_err(sqlx_error)?;
            self.notify_task(&mut transaction, &digest).await.map_err(sqlx_error)?;
            transaction.commit().await.map_err(sqlx_error)
        })
    }

    fn load_owned_task(&self, digest: [u8; 32], owner: &HandleOwner, now_ms: i64) -> StoreFuture<'_, Option<TaskRow>> {
        let owner = owner.clone();
        Box::pin(async move {
            let row: Option<TaskTuple> = sqlx::query_as(B::sql(&sql::LOAD_OWNED))
                .bind(digest.to_vec())
                .bind(owner.subject_key.to_vec())
                .bind(owner.tenant.as_str())
                .bind(owner.client.as_str())
                .bind(now_ms)
                .fetch_optional(self.reader())
                .await
                .map_err(|error| StoreError::from_sqlx("load_task", error))?;
            row.map(decode_task).transpose()
        })
    }

    fn load_task(&self, digest: [u8; 32]) -> StoreFuture<'_, Option<TaskRow>> {
        Box::pin(async move {
            let row: Option<TaskTuple> = sqlx::query_as(B::sql(&sql::LOAD))
                .bind(digest.to_vec())
                .fetch_optional(self.reader())
                .await
                .map_err(|error| StoreError::from_sqlx("load_task", error))?;
            row.map(decode_task).transpose()
        })
    }

    fn swap_task(&self, next: TaskRow, expected_version: i64) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            next.validate()?;
            let during = "swap_task";
            let sqlx_error = |error| StoreError::from_sqlx(during, error);
            let (digest, at, status) = (next.digest.to_vec(), next.updated_ms, next.status.as_str().to_owned());
            let mut transaction = self.begin().await.map_err(sqlx_error)?;
            let previous: Option<(String,)> = sqlx::query_as(B::locking_read(&sql::STATUS, &sql::STATUS_FOR_UPDATE))
                .bind(digest.clone())
                .fetch_optional(&mut *transaction)
                .await
                .map_err(sqlx_error)?;
            let done = bind_task_swap!(sqlx::query(B::sql(&sql::SWAP)), next, expected_version)
                .execute(&mut *transaction)
                .await
                .map_err(sqlx_error)?;
            if B::rows_affected(&done) != 1 {
                return Ok(false);
            }
            if previous.is_some_and(|(previous,)| previous != status) {
                sqlx::query(B::sql(&sql::HISTORY_INSERT))
                    .bind(digest.clone())
                    .bind(at)
                    .bind(status)
                    .execute(&mut *transaction)
                    .await
                    .map_err(sqlx_error)?;
            }
            self.notify_task(&mut transaction, &digest).await.map_err(sqlx_error)?;
            transaction.commit().await.map_err(sqlx_error)?;
            Ok(true)
        })
    }

    fn active_tasks_of(
        &self,
        subject_key: [u8; 32],
        tenant: Option<&str>,
        limit: u32,
    ) -> StoreFuture<'_, Vec<TaskRow>> {
        let tenant = tenant.map(str::to_owned);
        Box::pin(async move {
            let rows: Vec<TaskTuple> = sqlx::query_as(B::sql(&sql::ACTIVE_OF))
                .bind(subject_key.to_vec())
                .bind(tenant)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await
                .map_err(|error| StoreError::from_sqlx("active_tasks_of", error))?;
            rows.into_iter().map(decode_task).collect()
        })
    }

    fn orphaned_tasks(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, Vec<TaskRow>> {
        Box::pin(async move {
            let rows: Vec<TaskTuple> = sqlx::query_as(B::sql(&sql::ORPHANS))
                .bind(now_ms)
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await
                .map_err(|error| StoreError::from_sqlx("orphaned_tasks", error))?;
            rows.into_iter().map(decode_task).collect()
        })
    }

    fn task_history(&self, digest: [u8; 32]) -> StoreFuture<'_, Vec<(i64, String)>> {
        Box::pin(async move {
            sqlx::query_as(B::sql(&sql::HISTORY))
                .bind(digest.to_vec())
                .bind(i64::from(MAX_TASK_HISTORY))
                .fetch_all(self.reader())
                .await
                .map_err(|error| StoreError::from_sqlx("task_history", error))
        })
    }

    fn purge_tasks(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let during = "purge_tasks";
            let sqlx_error = |error| StoreError::from_sqlx(during, error);
            let mut transaction = self.begin().await.map_err(sqlx_error)?;
            sqlx::query(B::sql(&sql::PURGE_HISTORY))
                .bind(now_ms)
                .bind(i64::from(limit))
                .execute(&mut *transaction)
                .await
                .map_err(sqlx_error)?;
            let done = sqlx::query(B::sql(&sql::PURGE))
                .bind(now_ms)
                .bind(i64::from(limit))
                .execute(&mut *transaction)
                .await
                .map_err(sqlx_error)?;
            transaction.commit().await.map_err(sqlx_error)?;
            Ok(B::rows_affected(&done))
        })
    }

    fn task_changes(&self) -> Option<tokio::sync::mpsc::Receiver<[u8; 32]>> {
        self.watch_tasks()
    }
}
