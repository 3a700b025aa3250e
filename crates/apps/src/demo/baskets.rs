//! The demo's basket store: the table `demo_baskets` in SQLite or PostgreSQL (through the demo's
//! own pool), keyed by tenant and basket id, with its schema, its statements and the encoding of
//! a basket's items. Every change is one statement or one transaction.

use std::collections::BTreeMap;
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use palisade_server::InlineSqlite;
use palisade_server::rusqlite::{OptionalExtension as _, params};

use sqlx::SqlitePool;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

/// One basket. `generation` is the version handles are bound to: it changes when the basket's
/// identity does (never on adding items), so a handle outlives edits but not a replaced basket.
pub(super) struct Basket {
    pub(super) owner: String,
    pub(super) client: String,
    pub(super) generation: i64,
    pub(super) items: BTreeMap<String, u32>,
}

/// How long a SQLite statement waits for another connection's (or instance's) write lock.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a call waits for a pooled connection before it is refused.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections per pool: the demo's statements are short.
const POOL_CONNECTIONS: u32 = 4;
/// The PostgreSQL advisory lock that serializes creating the table when instances start at once.
const SCHEMA_LOCK: i64 = 0x6465_6d6f_6261_736b;

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS demo_baskets (
    tenant TEXT NOT NULL,
    basket_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    client TEXT NOT NULL,
    generation BIGINT NOT NULL,
    items TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, basket_id)
)";
const CREATE_INDEX: &str = "CREATE INDEX IF NOT EXISTS demo_baskets_owner ON demo_baskets (tenant, owner, client)";
const SELECT_BASKET: &str =
    "SELECT owner, client, generation, items FROM demo_baskets WHERE tenant = $1 AND basket_id = $2";
/// [`SELECT_BASKET`] in SQLite's own parameter syntax, for the inline read.
const SELECT_BASKET_INLINE: &str =
    "SELECT owner, client, generation, items FROM demo_baskets WHERE tenant = ?1 AND basket_id = ?2";
const INSERT_BASKET: &str = "INSERT INTO demo_baskets (tenant, basket_id, owner, client, generation, items, created_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7)";
const UPDATE_ITEMS: &str = "UPDATE demo_baskets SET items = $3 WHERE tenant = $1 AND basket_id = $2";
const DELETE_BASKET: &str = "DELETE FROM demo_baskets WHERE tenant = $1 AND basket_id = $2";
const SELECT_MINE: &str = "SELECT items FROM demo_baskets WHERE tenant = $1 AND owner = $2 AND client = $3
    ORDER BY created_ms, basket_id";

#[derive(Clone)]
enum BasketDb {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to whichever pool the store uses (the SQL is the same on both).
macro_rules! on_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            BasketDb::Sqlite($pool) => $body,
            BasketDb::Postgres($pool) => $body,
        }
    };
}

/// In one transaction `$transaction` (already holding the row's write lock, or about to take it
/// with `$select`): reads the basket's items, adds `$quantity` of `$sku`, writes them back.
macro_rules! add_in_transaction {
    ($transaction:ident, $select:expr, $tenant:expr, $basket_id:expr, $sku:expr, $quantity:expr) => {{
        let items: Option<String> =
            sqlx::query_scalar($select).bind($tenant).bind($basket_id).fetch_optional(&mut *$transaction).await?;
        let Some(items) = items else { return Ok(None) };
        let mut items = parse_items(&items)?;
        let entry = items.entry($sku.to_owned()).or_insert(0);
        *entry = entry.saturating_add($quantity).min(999);
        sqlx::query(UPDATE_ITEMS)
            .bind($tenant)
            .bind($basket_id)
            .bind(items_text(&items)?)
            .execute(&mut *$transaction)
            .await?;
        $transaction.commit().await?;
        Ok(Some(items))
    }};
}

/// Where the demo keeps its baskets: the table `demo_baskets` (created if missing) in SQLite or
/// PostgreSQL, keyed by (tenant, basket id), so a basket id never crosses tenants. Clones share
/// the pool.
///
/// In a SQLite file, the read of one basket (every use of a basket handle resolves it) is a
/// primary-key probe run inline on the calling task ([`InlineSqlite`]), as the store's own handle
/// lookup is: sqlx's SQLite driver crosses to a worker thread and back for every statement, which
/// cost more CPU than the rest of the call (BENCHMARKS.md). Writes and the export's scan stay on
/// the async pool.
#[derive(Clone)]
pub struct BasketStore {
    db: BasketDb,
    inline: Option<Arc<InlineSqlite>>,
}

impl std::fmt::Debug for BasketStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match self.db {
            BasketDb::Sqlite(_) => "sqlite",
            BasketDb::Postgres(_) => "postgres",
        };
        formatter.debug_struct("BasketStore").field("backend", &backend).finish_non_exhaustive()
    }
}

impl BasketStore {
    /// Opens the store at `url` (the server's `store`: `sqlite:<path>`, `sqlite::memory:`, or
    /// `postgres://…`) with a pool of its own, creating the table if missing. File databases use
    /// WAL and a 5 s busy timeout, so instances sharing the file wait for each other's writes.
    pub async fn open(url: &str) -> Result<Self, sqlx::Error> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = PgPoolOptions::new()
                .max_connections(POOL_CONNECTIONS)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect(url)
                .await?;
            return Self::from_postgres(pool).await;
        }
        if !url.starts_with("sqlite:") {
            return Err(sqlx::Error::Configuration("the basket store needs a sqlite: or postgres:// URL".into()));
        }
        if is_in_memory(url) {
            let store = Self::memory();
            store.create_schema().await?;
            return Ok(store);
        }
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .busy_timeout(SQLITE_BUSY_TIMEOUT)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
        let pool = SqlitePoolOptions::new()
            .max_connections(POOL_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.clone())
            .await?;
        let mut store = Self::from_sqlite(pool).await?;
        let inline = InlineSqlite::open(options.get_filename(), SQLITE_BUSY_TIMEOUT).map_err(inline_error)?;
        store.inline = Some(Arc::new(inline));
        Ok(store)
    }

    /// Uses `pool` (a SQLite database), creating the table if missing.
    pub async fn from_sqlite(pool: SqlitePool) -> Result<Self, sqlx::Error> {
        let store = Self { db: BasketDb::Sqlite(pool), inline: None };
        store.create_schema().await?;
        Ok(store)
    }

    /// Uses `pool` (a PostgreSQL database, its `search_path` choosing the schema), creating the
    /// table if missing.
    pub async fn from_postgres(pool: PgPool) -> Result<Self, sqlx::Error> {
        let store = Self { db: BasketDb::Postgres(pool), inline: None };
        store.create_schema().await?;
        Ok(store)
    }

    /// A private in-memory SQLite database that lives as long as this store (and its clones): one
    /// connection, opened on first use (which creates the table), never closed by the pool.
    pub fn memory() -> Self {
        let options = SqliteConnectOptions::new().in_memory(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_connect(|connection, _| {
                Box::pin(async move {
                    sqlx::query(CREATE_TABLE).execute(&mut *connection).await?;
                    sqlx::query(CREATE_INDEX).execute(&mut *connection).await?;
                    Ok(())
                })
            })
            .connect_lazy_with(options);
        Self { db: BasketDb::Sqlite(pool), inline: None }
    }

    async fn create_schema(&self) -> Result<(), sqlx::Error> {
        match &self.db {
            BasketDb::Sqlite(pool) => {
                let mut transaction = pool.begin_with("BEGIN IMMEDIATE").await?;
                sqlx::query(CREATE_TABLE).execute(&mut *transaction).await?;
                sqlx::query(CREATE_INDEX).execute(&mut *transaction).await?;
                transaction.commit().await
            }
            BasketDb::Postgres(pool) => {
                // Concurrent `CREATE TABLE IF NOT EXISTS` can collide in PostgreSQL's catalogue:
                // instances starting together take turns.
                let mut transaction = pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(SCHEMA_LOCK).execute(&mut *transaction).await?;
                sqlx::query(CREATE_TABLE).execute(&mut *transaction).await?;
                sqlx::query(CREATE_INDEX).execute(&mut *transaction).await?;
                transaction.commit().await
            }
        }
    }

    /// The basket `basket_id` of `tenant`, if there is one.
    pub(super) async fn get(&self, tenant: &str, basket_id: &str) -> Result<Option<Basket>, sqlx::Error> {
        let row: Option<(String, String, i64, String)> = match &self.inline {
            Some(inline) => inline
                .read("basket read", |connection| {
                    connection
                        .prepare_cached(SELECT_BASKET_INLINE)?
                        .query_row(params![tenant, basket_id], |row| {
                            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                        })
                        .optional()
                })
                .map_err(inline_error)?,
            None => {
                on_pool!(&self.db, pool => sqlx::query_as(SELECT_BASKET).bind(tenant).bind(basket_id).fetch_optional(pool).await)?
            }
        };
        row.map(|(owner, client, generation, items)| {
            Ok(Basket { owner, client, generation, items: parse_items(&items)? })
        })
        .transpose()
    }

    /// Records a new, empty basket (one statement).
    pub(super) async fn insert(&self, tenant: &str, basket_id: &str, basket: &Basket) -> Result<(), sqlx::Error> {
        let now_ms = palisade_base::clock::Clock::now_ms(&palisade_base::clock::SystemClock);
        let items = items_text(&basket.items)?;
        on_pool!(&self.db, pool => sqlx::query(INSERT_BASKET)
            .bind(tenant)
            .bind(basket_id)
            .bind(&basket.owner)
            .bind(&basket.client)
            .bind(basket.generation)
            .bind(&items)
            .bind(now_ms)
            .execute(pool)
            .await
            .map(|_| ()))
    }

    /// Adds `quantity` of `sku` to the basket (at most 999 of a product), in one transaction
    /// holding the row's write lock: concurrent adds on any instance are never lost. `None`: no
    /// such basket.
    pub(super) async fn add_item(
        &self,
        tenant: &str,
        basket_id: &str,
        sku: &str,
        quantity: u32,
    ) -> Result<Option<BTreeMap<String, u32>>, sqlx::Error> {
        match &self.db {
            BasketDb::Sqlite(pool) => {
                // IMMEDIATE: the write lock before the read, so no other writer slips in between.
                let mut transaction = pool.begin_with("BEGIN IMMEDIATE").await?;
                add_in_transaction!(
                    transaction,
                    "SELECT items FROM demo_baskets WHERE tenant = $1 AND basket_id = $2",
                    tenant,
                    basket_id,
                    sku,
                    quantity
                )
            }
            BasketDb::Postgres(pool) => {
                let mut transaction = pool.begin().await?;
                add_in_transaction!(
                    transaction,
                    "SELECT items FROM demo_baskets WHERE tenant = $1 AND basket_id = $2 FOR UPDATE",
                    tenant,
                    basket_id,
                    sku,
                    quantity
                )
            }
        }
    }

    /// Removes the basket (one statement).
    pub(super) async fn remove(&self, tenant: &str, basket_id: &str) -> Result<(), sqlx::Error> {
        on_pool!(&self.db, pool => sqlx::query(DELETE_BASKET).bind(tenant).bind(basket_id).execute(pool).await.map(|_| ()))
    }

    /// The items of every basket of `owner` through `client` in `tenant`, oldest first.
    pub(super) async fn items_of(
        &self,
        tenant: &str,
        owner: &str,
        client: &str,
    ) -> Result<Vec<BTreeMap<String, u32>>, sqlx::Error> {
        let rows: Vec<String> = on_pool!(&self.db, pool => sqlx::query_scalar(SELECT_MINE)
            .bind(tenant)
            .bind(owner)
            .bind(client)
            .fetch_all(pool)
            .await)?;
        rows.iter().map(|items| parse_items(items)).collect()
    }
}

/// An inline read's failure in the type of the pool's (the store's fixed text, never SQL).
fn inline_error(error: palisade_server::StoreError) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(error.to_string()))
}

fn is_in_memory(url: &str) -> bool {
    url == "sqlite::memory:" || url.contains("mode=memory")
}

/// A basket's items as stored: a JSON object of SKU to quantity.
fn parse_items(text: &str) -> Result<BTreeMap<String, u32>, sqlx::Error> {
    serde_json::from_str(text).map_err(|error| sqlx::Error::Decode(Box::new(error)))
}

fn items_text(items: &BTreeMap<String, u32>) -> Result<String, sqlx::Error> {
    serde_json::to_string(items).map_err(|error| sqlx::Error::Encode(Box::new(error)))
}

#[cfg(test)]
mod tests;
