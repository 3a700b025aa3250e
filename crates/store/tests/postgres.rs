//! The storage conformance suite against `PostgresStore` (a fresh schema per test, so tests run
//! in parallel and re-run), plus the PostgreSQL-only cases. Needs `DATABASE_URL`; without it
//! every test fails naming the missing service.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use palisade_store::conformance::{
    Fixture, HANDLE_LOOKUP_STATEMENT, Harness, HarnessFuture, sample_handle, sample_record,
};
use palisade_store::{
    AuditQuery, AuditWriter, AuditWriterConfig, HandleOwner, HandleStore, PostgresOptions, PostgresStore, Store,
    StoreError, open_store, open_store_read_only,
};
use sqlx::postgres::{PgPool, PgPoolOptions};

fn database_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "DATABASE_URL is not set: these tests need a running PostgreSQL server \
             (e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5433/palisade_test; start one as INTEROP.md §8.7 shows)"
        ),
    }
}

/// `url` with `search_path` set to `schema` on every connection.
fn url_with_schema(url: &str, schema: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options[search_path]={schema}")
}

/// Small pools: many tests run at once against one server.
fn test_options() -> PostgresOptions {
    PostgresOptions { max_connections: 4, ..PostgresOptions::default() }
}

struct PostgresHarness {
    url: String,
}

impl PostgresHarness {
    fn new() -> Self {
        PostgresHarness { url: database_url() }
    }
}

struct PostgresFixture {
    admin: PgPool,
    schema: String,
    store_url: String,
    store: Arc<dyn Store>,
}

async fn admin_pool(url: &str) -> PgPool {
    PgPoolOptions::new().max_connections(1).connect(url).await.expect("connect to DATABASE_URL")
}

fn unique_schema() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut random = [0u8; 8];
    aws_lc_rs::rand::fill(&mut random).expect("the system's random source");
    format!(
        "audit_test_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        palisade_base::hex::hex(&random)
    )
}

impl Harness for PostgresHarness {
    fn fresh(&self) -> HarnessFuture<'_, Box<dyn Fixture>> {
        Box::pin(async {
            let admin = admin_pool(&self.url).await;
            let schema = unique_schema();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                .execute(&admin)
                .await
                .expect("create test schema");
            let store_url = url_with_schema(&self.url, &schema);
            let store = PostgresStore::connect_with(&store_url, test_options()).await.expect("connect postgres store");
            Box::new(PostgresFixture { admin, schema, store_url, store: Arc::new(store) }) as Box<dyn Fixture>
        })
    }

    fn open_unreachable(&self) -> HarnessFuture<'_, Result<Arc<dyn Store>, StoreError>> {
        Box::pin(async {
            let url = format!("postgres://postgres@127.0.0.1:{}/palisade_test", closed_port());
            let options = PostgresOptions { acquire_timeout: Duration::from_secs(1), ..test_options() };
            PostgresStore::connect_with(&url, options).await.map(|store| Arc::new(store) as Arc<dyn Store>)
        })
    }
}

/// A loopback port with nothing listening on it.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("local addr").port()
}

impl Fixture for PostgresFixture {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn another_instance(&self) -> HarnessFuture<'_, Arc<dyn Store>> {
        Box::pin(async {
            let store = PostgresStore::connect_with(&self.store_url, test_options()).await.expect("second instance");
            Arc::new(store) as Arc<dyn Store>
        })
    }

    fn tamper(&self, sql: &'static str) -> HarnessFuture<'_, ()> {
        Box::pin(async move {
            let pool = admin_pool(&self.store_url).await;
            sqlx::query(sql).execute(&pool).await.expect("tamper statement");
            pool.close().await;
        })
    }

    fn cleanup(self: Box<Self>) -> HarnessFuture<'static, ()> {
        Box::pin(async move {
            self.store.close().await;
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", self.schema)))
                .execute(&self.admin)
                .await
                .expect("drop test schema");
            self.admin.close().await;
        })
    }
}

palisade_store::audit_store_conformance!(PostgresHarness::new());

/// A store that started while the database was unreachable (lazy pool): the writer hands
/// `Unavailable` to every waiter of the batch, and readiness says so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_store_on_a_closed_port_fails_every_waiter() {
    let _ = database_url();
    let url = format!("postgres://postgres@127.0.0.1:{}/palisade_test", closed_port());
    let options = PostgresOptions { acquire_timeout: Duration::from_millis(500), ..test_options() };
    let store: Arc<dyn Store> = Arc::new(PostgresStore::connect_lazy_with(&url, options).expect("lazy pool"));
    assert!(matches!(store.ping().await, Err(StoreError::Unavailable { .. })));
    let writer = Arc::new(AuditWriter::new(store, AuditWriterConfig::default()));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..16 {
        let writer = writer.clone();
        tasks.spawn(async move { writer.append(sample_record(n)).await });
    }
    while let Some(joined) = tasks.join_next().await {
        let result = joined.expect("append task");
        assert!(matches!(result, Err(StoreError::Unavailable { .. })), "{result:?}");
    }
    writer.shutdown().await;
}

/// `open_store` picks PostgreSQL for both URL spellings, and migrating twice is harmless.
#[tokio::test]
async fn open_store_accepts_both_schemes() {
    let url = database_url();
    let admin = admin_pool(&url).await;
    let schema = unique_schema();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&admin).await.expect("create schema");
    let store_url = url_with_schema(&url, &schema);
    let first = open_store(&store_url).await.expect("postgres://");
    first.append_batch(vec![sample_record(1)]).await.expect("append");
    let alternate = store_url.replacen("postgres://", "postgresql://", 1);
    let second = open_store(&alternate).await.expect("postgresql://");
    second.append_batch(vec![sample_record(2)]).await.expect("append");
    let report = first.verify_chain().await.expect("verify");
    assert!(report.is_intact() && report.records == 2, "{report:?}");
    first.close().await;
    second.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(&admin).await.expect("drop");
}

/// A wrong password is `Unavailable` and its text holds neither the password nor the URL.
#[tokio::test]
async fn connection_errors_do_not_leak_the_url() {
    let _ = database_url();
    let url = format!("postgres://postgres:hunter2@127.0.0.1:{}/palisade_test", closed_port());
    let options = PostgresOptions { acquire_timeout: Duration::from_millis(300), ..test_options() };
    let error = PostgresStore::connect_with(&url, options).await.expect_err("must fail");
    let text = format!("{error}");
    assert!(matches!(error, StoreError::Unavailable { .. }), "{error:?}");
    assert!(!text.contains("hunter2") && !text.contains("127.0.0.1"), "{text}");
}

fn lookup_owner() -> HandleOwner {
    HandleOwner { subject_key: [7; 32], tenant: "acme".into(), client: "cli".into() }
}

/// The handle lookup runs on connections of its own (outside the pool). When their server-side
/// sessions die (a restart, an idle timeout, an operator's `pg_terminate_backend`), the next
/// lookups still answer, each on a new connection; after `close` they fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_lookups_outlive_terminated_connections_and_stop_at_close() {
    let url = database_url();
    let admin = admin_pool(&url).await;
    let schema = unique_schema();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&admin).await.expect("create schema");
    let store_url = url_with_schema(&url, &schema);
    let options = PostgresOptions { max_connections: 8, ..test_options() };
    let store = PostgresStore::connect_with(&store_url, options).await.expect("store");
    for n in 1..=4 {
        store.insert_handle(sample_handle(n, &lookup_owner())).await.expect("insert");
    }
    // Concurrent lookups open several of the lookup connections.
    let lookups = (1..=4u8).map(|n| store.lookup_handle([n; 32], &lookup_owner(), 1_500));
    for found in futures::future::join_all(lookups).await {
        assert_eq!(found.expect("lookup").expect("live").object_type, "basket");
    }
    // End every session whose last statement was the lookup: those connections are dead now.
    let terminated: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE pid <> pg_backend_pid() AND query LIKE 'SELECT object_type, object_ref%'",
    )
    .fetch_all(&admin)
    .await
    .expect("terminate");
    assert!(!terminated.is_empty(), "no lookup connection was found to terminate");
    for n in 1..=4u8 {
        let found = store.lookup_handle([n; 32], &lookup_owner(), 1_500).await;
        assert_eq!(found.expect("a lookup after the termination").expect("live").object_ref, format!("basket-{n}"));
    }
    // Someone else's handle, or an unknown one, is still no handle.
    let stranger = HandleOwner { tenant: "other".into(), ..lookup_owner() };
    assert!(store.lookup_handle([1; 32], &stranger, 1_500).await.expect("lookup").is_none());
    palisade_store::AuditStore::close(&store).await;
    assert!(matches!(store.lookup_handle([1; 32], &lookup_owner(), 1_500).await, Err(StoreError::Unavailable { .. })));
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(&admin).await.expect("drop");
}

/// A store built while the database is unreachable: a handle lookup fails with `Unavailable`
/// within the acquire timeout (fail closed), like every other statement.
#[tokio::test]
async fn handle_lookup_on_an_unreachable_database_is_unavailable() {
    let _ = database_url();
    let url = format!("postgres://postgres@127.0.0.1:{}/palisade_test", closed_port());
    let options = PostgresOptions { acquire_timeout: Duration::from_millis(500), ..test_options() };
    let store = PostgresStore::connect_lazy_with(&url, options).expect("lazy store");
    let started = std::time::Instant::now();
    let found = store.lookup_handle([1; 32], &lookup_owner(), 2).await;
    assert!(matches!(found, Err(StoreError::Unavailable { .. })), "{found:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The owner-bound lookup is a primary-key probe even before the planner has statistics (a new
/// or freshly grown table, before autovacuum's analyze): no index matches the owner columns
/// alone, so the plan cannot read all of an owner's handles and filter them.
#[tokio::test]
async fn the_handle_lookup_probes_the_primary_key_without_statistics() {
    let url = database_url();
    let admin = admin_pool(&url).await;
    let schema = unique_schema();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&admin).await.expect("create schema");
    let store = PostgresStore::connect_with(&url_with_schema(&url, &schema), test_options()).await.expect("store");
    // 2,000 handles of 5 owners, loaded in one statement; no ANALYZE.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {schema}.handles (handle_digest, subject_key, tenant_id, client_id, object_type, object_ref, \
         object_version, scopes, policy_version, created_ms, expires_ms) \
         SELECT sha256(int4send(n)), sha256(int4send(n % 5)), 'acme', 'cli', 'basket', 'basket-' || n, '1', \
         'shop:basket', 1, 1, 9223372036854775807 FROM generate_series(1, 2000) AS n"
    )))
    .execute(&admin)
    .await
    .expect("load handles");
    let mut connection = admin.acquire().await.expect("connection");
    sqlx::query(sqlx::AssertSqlSafe(format!("SET search_path = {schema}")))
        .execute(&mut *connection)
        .await
        .expect("path");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "PREPARE lookup(bytea, bytea, text, text, bigint) AS {HANDLE_LOOKUP_STATEMENT}"
    )))
    .execute(&mut *connection)
    .await
    .expect("prepare");
    let plan: Vec<(String,)> =
        sqlx::query_as("EXPLAIN EXECUTE lookup(sha256(int4send(7)), sha256(int4send(2)), 'acme', 'cli', 2)")
            .fetch_all(&mut *connection)
            .await
            .expect("explain");
    let plan: Vec<String> = plan.into_iter().map(|(line,)| line).collect();
    sqlx::query("DEALLOCATE lookup").execute(&mut *connection).await.expect("deallocate");
    sqlx::query("RESET search_path").execute(&mut *connection).await.expect("reset");
    drop(connection);
    assert!(plan[0].contains("Index Scan using handles_pkey"), "{plan:#?}");
    palisade_store::AuditStore::close(&store).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(&admin).await.expect("drop");
}

/// A reader's store: a schema never migrated is `Config` and stays empty (nothing migrated); a
/// migrated one is read, and every write is refused (read-only transactions).
#[tokio::test]
async fn a_read_only_store_reads_and_never_writes() {
    let url = database_url();
    let admin = admin_pool(&url).await;
    let schema = unique_schema();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&admin).await.expect("create schema");
    let store_url = url_with_schema(&url, &schema);
    let empty = open_store_read_only(&store_url).await.expect_err("no schema to read");
    assert!(matches!(empty, StoreError::Config { .. }), "{empty:?}");
    assert!(empty.to_string().contains("holds no palisade schema"), "{empty}");
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM information_schema.tables WHERE table_schema = $1")
        .bind(&schema)
        .fetch_one(&admin)
        .await
        .expect("count tables");
    assert_eq!(tables, 0, "opening for reading migrated");
    let writer = open_store(&store_url).await.expect("open");
    writer.append_batch(vec![sample_record(1), sample_record(2)]).await.expect("append");
    let reader = open_store_read_only(&store_url).await.expect("open read-only");
    let found = reader.search(AuditQuery { limit: 10, ..AuditQuery::default() }).await.expect("search");
    assert_eq!(found.len(), 2);
    assert!(reader.append_batch(vec![sample_record(3)]).await.is_err(), "a read-only store wrote");
    assert_eq!(writer.recent(10).await.expect("recent").len(), 2);
    reader.close().await;
    writer.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(&admin).await.expect("drop");
}
