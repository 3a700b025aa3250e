//! `PostgresStore`: the shared backend for N stateless instances. Each instance ships its own
//! audit chain (rows keyed by chain and seq, a head row per chain), so no two instances write the
//! same audit row or wait on each other's locks.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};

use crate::audit_sql::OwnChain;
use crate::{HandleOwner, LiveHandle, StoreError};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Pool settings for a [`PostgresStore`].
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Most connections this instance opens. Keep `max_connections × instances` below the
    /// server's `max_connections`. Half of them, at most [`MAX_LOOKUP_CONNECTIONS`], are kept for
    /// the owner-bound handle lookup (the read path's statement); the pool has the rest.
    pub max_connections: u32,
    /// How long a caller waits for a connection (including connecting) before
    /// [`StoreError::Unavailable`].
    pub acquire_timeout: Duration,
}

/// Most connections a [`PostgresStore`] keeps for handle lookups outside its pool.
pub const MAX_LOOKUP_CONNECTIONS: u32 = 4;

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions { max_connections: 8, acquire_timeout: Duration::from_secs(3) }
    }
}

/// The PostgreSQL audit store.
pub struct PostgresStore {
    pool: PgPool,
    /// The handle lookup's own connections; `None` when `max_connections` leaves no room.
    lookups: Option<LookupConnections>,
    /// The chain of [`AuditStore::append_batch`](crate::AuditStore::append_batch).
    own: OwnChain,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects with [`PostgresOptions::default`], migrates, and checks readiness. `url` is a
    /// `postgres://` or `postgresql://` URL; a schema can be chosen with
    /// `?options[search_path]=name` (the schema must exist).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// [`connect`](Self::connect) with explicit pool settings. Fails with
    /// [`StoreError::Unavailable`] if the server cannot be reached within `acquire_timeout`.
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        let store = Self::connect_lazy_with(url, options)?;
        MIGRATOR.run(&store.pool).await.map_err(StoreError::from_migrate)?;
        store.ping_inner().await?;
        Ok(store)
    }

    /// Connects for reading only: every transaction is read-only
    /// (`default_transaction_read_only`), nothing is migrated, and a schema that is not this
    /// version's is [`StoreError::Config`] ([`crate::backend::check_schema`]). Fails with
    /// [`StoreError::Unavailable`] if the server cannot be reached within `acquire_timeout`.
    pub async fn connect_read_only(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        let connect = PgConnectOptions::from_str(url)
            .map_err(|error| StoreError::from_sqlx("open", error))?
            .options([("default_transaction_read_only", "on")]);
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect);
        let store = PostgresStore { pool, lookups: None, own: OwnChain::default() };
        crate::backend::check_schema::<Self>(&store.pool, &MIGRATOR).await?;
        store.ping_inner().await?;
        Ok(store)
    }

    /// Builds the pool without connecting or migrating: nothing is checked until first use (use
    /// [`AuditStore::ping`] as the readiness probe). For a process that must start while the
    /// database is still coming up, with the schema migrated by another instance or a job.
    pub fn connect_lazy_with(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        let connect = PgConnectOptions::from_str(url).map_err(|error| StoreError::from_sqlx("open", error))?;
        let total = options.max_connections.max(1);
        let lookups = (total / 2).min(MAX_LOOKUP_CONNECTIONS);
        let pool = PgPoolOptions::new()
            .max_connections(total - lookups)
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect.clone());
        let lookups = (lookups > 0).then(|| LookupConnections::new(connect, lookups as usize, options.acquire_timeout));
        Ok(PostgresStore { pool, lookups, own: OwnChain::default() })
    }

    async fn ping_inner(&self) -> Result<(), StoreError> {
        sqlx::query_scalar::<_, String>(crate::audit_sql::sql::PING.dollar())
            .fetch_one(&self.pool)
            .await
            .map(|_| ())
            .map_err(|error| StoreError::from_sqlx("ping", error))
    }

    async fn close_inner(&self) {
        if let Some(lookups) = &self.lookups {
            lookups.close().await;
        }
        self.pool.close().await;
    }
}

impl crate::handles::HandleLookup for PostgresStore {
    /// On the lookup connections when there are any, else through the pool.
    async fn lookup_handle_routed(
        &self,
        digest: [u8; 32],
        owner: &HandleOwner,
        now_ms: i64,
    ) -> Result<Option<LiveHandle>, StoreError> {
        match &self.lookups {
            Some(lookups) => lookups.lookup(digest, owner, now_ms).await,
            None => crate::handles::lookup_handle_on::<Self, _>(&self.pool, digest, owner, now_ms).await,
        }
    }
}

/// Connections kept for the owner-bound handle lookup alone, outside the pool: the read path's
/// one statement per request. Going through sqlx's pool (acquire, then a spawned task to return
/// the connection on every release) cost about three times the round trip itself here
/// (BENCHMARKS.md). A lookup takes the first free connection, starting from a rotating one, or
/// waits for one (at most the acquire timeout); a connection that fails a lookup is dropped and
/// a new one opened by the next lookup that picks its place. A lookup abandoned mid-statement
/// leaves a connection the driver drains before its next statement.
struct LookupConnections {
    connect: PgConnectOptions,
    connections: Vec<tokio::sync::Mutex<Option<PgConnection>>>,
    next: AtomicUsize,
    acquire_timeout: Duration,
    closed: AtomicBool,
}

impl LookupConnections {
    /// The operation named in errors.
    const DURING: &str = "lookup_handle";

    fn new(connect: PgConnectOptions, count: usize, acquire_timeout: Duration) -> Self {
        LookupConnections {
            connect,
            connections: (0..count).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            acquire_timeout,
            closed: AtomicBool::new(false),
        }
    }

    async fn lookup(
        &self,
        digest: [u8; 32],
        owner: &HandleOwner,
        now_ms: i64,
    ) -> Result<Option<LiveHandle>, StoreError> {
        let deadline = tokio::time::Instant::now() + self.acquire_timeout;
        let count = self.connections.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let free = (0..count).find_map(|offset| self.connections[(start + offset) % count].try_lock().ok());
        let mut slot = match free {
            Some(slot) => slot,
            None => tokio::time::timeout_at(deadline, self.connections[start % count].lock())
                .await
                .map_err(|_| StoreError::unavailable(Self::DURING))?,
        };
        // Checked under the slot's lock: `close` takes every slot after setting the flag.
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::from_sqlx(Self::DURING, sqlx::Error::PoolClosed));
        }
        // A kept connection may have died since its last use (server restart, idle timeout): a
        // lookup that fails on one with a connection-kind error is tried once more on a new
        // connection (a read: safe to repeat). One that fails on a new connection fails.
        let reused = slot.is_some();
        match self.lookup_on_slot(&mut slot, deadline, digest, owner, now_ms).await {
            Err(StoreError::Unavailable { .. }) if reused => {
                self.lookup_on_slot(&mut slot, deadline, digest, owner, now_ms).await
            }
            answered => answered,
        }
    }

    /// The lookup on the slot's connection, opened first if the slot is empty; after any error
    /// the slot is emptied, so the next statement there starts on a fresh connection.
    async fn lookup_on_slot(
        &self,
        slot: &mut Option<PgConnection>,
        deadline: tokio::time::Instant,
        digest: [u8; 32],
        owner: &HandleOwner,
        now_ms: i64,
    ) -> Result<Option<LiveHandle>, StoreError> {
        let connection = match &mut *slot {
            Some(connection) => connection,
            empty => {
                let opened = tokio::time::timeout_at(deadline, PgConnection::connect_with(&self.connect))
                    .await
                    .map_err(|_| StoreError::unavailable(Self::DURING))?
                    .map_err(|error| StoreError::from_sqlx(Self::DURING, error))?;
                empty.insert(opened)
            }
        };
        let found = crate::handles::lookup_handle_on::<PostgresStore, _>(&mut *connection, digest, owner, now_ms).await;
        if found.is_err() {
            slot.take();
        }
        found
    }

    /// Refuses later lookups and closes every connection (after the lookup using it).
    async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        for slot in &self.connections {
            if let Some(connection) = slot.lock().await.take() {
                let _ = connection.close().await;
            }
        }
    }
}

impl PostgresStore {
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        self.pool.begin().await
    }
}

/// The channel task changes are announced on.
const TASK_CHANNEL: &str = "palisade_tasks";
const NOTIFY_TASK: &str = "SELECT pg_notify('palisade_tasks', $1)";

/// Listens on the task channel (reconnecting after errors) and forwards changed digests.
fn spawn_task_listener(pool: PgPool) -> tokio::sync::mpsc::Receiver<[u8; 32]> {
    let (sender, receiver) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move {
        loop {
            let listener = async {
                let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
                listener.listen(TASK_CHANNEL).await?;
                Ok::<_, sqlx::Error>(listener)
            };
            match listener.await {
                Ok(mut listener) => loop {
                    match listener.recv().await {
                        Ok(notification) => {
                            let Some(digest) = palisade_base::hex::decode32(notification.payload()) else { continue };
                            if sender.send(digest).await.is_err() {
                                return;
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, "task change listener lost its connection");
                            break;
                        }
                    }
                },
                Err(error) => tracing::warn!(%error, "task change listener cannot connect"),
            }
            if sender.is_closed() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    receiver
}

impl crate::backend::Backend for PostgresStore {
    type Db = sqlx::Postgres;

    fn writer(&self) -> &sqlx::Pool<sqlx::Postgres> {
        &self.pool
    }

    fn reader(&self) -> &sqlx::Pool<Self::Db> {
        &self.pool
    }

    async fn begin(&self) -> Result<sqlx::Transaction<'static, Self::Db>, sqlx::Error> {
        PostgresStore::begin_write(self).await
    }

    fn sql(statement: &'static crate::backend::Statement) -> &'static str {
        statement.dollar()
    }

    fn built_sql(statement: String) -> String {
        statement
    }

    fn locking_read(
        _: &'static crate::backend::Statement,
        for_update: &'static crate::backend::Statement,
    ) -> &'static str {
        for_update.dollar()
    }

    /// Announces a task change to every instance's listener (delivered at commit).
    async fn notify_task(
        &self,
        transaction: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        digest: &[u8],
    ) -> Result<(), sqlx::Error> {
        sqlx::query(NOTIFY_TASK).bind(palisade_base::hex::hex(digest)).execute(&mut **transaction).await.map(|_| ())
    }

    fn watch_tasks(&self) -> Option<tokio::sync::mpsc::Receiver<[u8; 32]>> {
        Some(spawn_task_listener(self.pool.clone()))
    }

    fn rows_affected(done: &<sqlx::Postgres as sqlx::Database>::QueryResult) -> u64 {
        done.rows_affected()
    }
}

impl crate::audit_sql::AuditBackend for PostgresStore {
    const MARKER: char = '$';

    async fn ping_backend(&self) -> Result<(), StoreError> {
        PostgresStore::ping_inner(self).await
    }

    async fn close_backend(&self) {
        PostgresStore::close_inner(self).await
    }

    fn own_chain(&self) -> &OwnChain {
        &self.own
    }
}
