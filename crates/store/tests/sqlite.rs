//! The storage conformance suite against `SqliteStore` (a fresh file per test), plus the
//! SQLite-only cases: in-memory databases and `open_store` with `sqlite:` URLs.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use palisade_store::conformance::{Fixture, Harness, HarnessFuture, sample_record};
use palisade_store::{
    AuditQuery, AuditWriter, AuditWriterConfig, SqliteStore, Store, StoreError, open_store, open_store_read_only,
};

struct SqliteHarness;

struct SqliteFixture {
    directory: PathBuf,
    path: PathBuf,
    store: Arc<dyn Store>,
}

/// A path no other test (or earlier run) uses; nothing is created.
fn unique_path() -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut random = [0u8; 8];
    aws_lc_rs::rand::fill(&mut random).expect("the system's random source");
    std::env::temp_dir().join(format!(
        "palisade-store-test-{}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        palisade_base::hex::hex(&random)
    ))
}

/// A fresh directory no other test uses.
fn unique_directory() -> PathBuf {
    let directory = unique_path();
    std::fs::create_dir_all(&directory).expect("create test directory");
    directory
}

impl Harness for SqliteHarness {
    fn fresh(&self) -> HarnessFuture<'_, Box<dyn Fixture>> {
        Box::pin(async {
            let directory = unique_directory();
            let path = directory.join("audit.db");
            let store = SqliteStore::open(path.to_str().expect("utf-8 path")).await.expect("open sqlite store");
            Box::new(SqliteFixture { directory, path, store: Arc::new(store) }) as Box<dyn Fixture>
        })
    }

    fn open_unreachable(&self) -> HarnessFuture<'_, Result<Arc<dyn Store>, StoreError>> {
        // SQLite does not create directories: even root cannot open this.
        Box::pin(async {
            let path = unique_path().join("audit.db");
            SqliteStore::open(path.to_str().expect("utf-8 path")).await.map(|store| Arc::new(store) as Arc<dyn Store>)
        })
    }
}

impl Fixture for SqliteFixture {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn another_instance(&self) -> HarnessFuture<'_, Arc<dyn Store>> {
        Box::pin(async {
            let store = SqliteStore::open(self.path.to_str().expect("utf-8 path")).await.expect("open second store");
            Arc::new(store) as Arc<dyn Store>
        })
    }

    fn tamper(&self, sql: &'static str) -> HarnessFuture<'_, ()> {
        Box::pin(async move {
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&self.path)
                .busy_timeout(std::time::Duration::from_secs(5));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await
                .expect("open tamper connection");
            sqlx::query(sql).execute(&pool).await.expect("tamper statement");
            pool.close().await;
        })
    }

    fn cleanup(self: Box<Self>) -> HarnessFuture<'static, ()> {
        Box::pin(async move {
            self.store.close().await;
            let _ = std::fs::remove_dir_all(&self.directory);
        })
    }
}

palisade_store::audit_store_conformance!(SqliteHarness);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_store_through_open_store_and_writer() {
    let store = open_store("sqlite::memory:").await.expect("open in-memory store");
    let writer = Arc::new(AuditWriter::new(store.clone(), AuditWriterConfig::default()));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..100 {
        let writer = writer.clone();
        tasks.spawn(async move { writer.append(sample_record(n)).await });
    }
    // verify and recent share the single connection with the writer: they must not deadlock.
    let during = store.verify_chain().await.expect("verify while appending");
    assert!(during.is_intact(), "{during:?}");
    while let Some(joined) = tasks.join_next().await {
        joined.expect("append task").expect("append");
    }
    writer.shutdown().await;
    let report = store.verify_chain().await.expect("verify");
    assert!(report.is_intact() && report.records == 100, "{report:?}");
    assert_eq!(store.recent(1000).await.expect("recent").len(), 100);
}

#[tokio::test]
async fn two_in_memory_stores_are_separate_databases() {
    let first = open_store("sqlite::memory:").await.expect("first");
    let second = open_store("sqlite::memory:").await.expect("second");
    first.append_batch(vec![sample_record(1)]).await.expect("append");
    assert_eq!(second.verify_chain().await.expect("verify").records, 0);
    assert_eq!(first.verify_chain().await.expect("verify").records, 1);
}

#[tokio::test]
async fn open_store_accepts_sqlite_urls_and_reopens_a_file() {
    let directory = unique_directory();
    let url = format!("sqlite://{}", directory.join("audit.db").display());
    let store = open_store(&url).await.expect("open by URL");
    store.append_batch(vec![sample_record(1), sample_record(2)]).await.expect("append");
    store.close().await;
    // Reopening migrates nothing new and continues the same chain.
    let store = open_store(&url).await.expect("reopen");
    store.append_batch(vec![sample_record(3)]).await.expect("append after reopen");
    let report = store.verify_chain().await.expect("verify");
    assert!(report.is_intact() && report.records == 3, "{report:?}");
    store.close().await;
    let _ = std::fs::remove_dir_all(&directory);
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_refused() {
    let directory = unique_directory();
    let path = directory.join("audit.db");
    std::fs::write(&path, vec![b'x'; 8192]).expect("write junk");
    let result = SqliteStore::open(path.to_str().expect("utf-8 path")).await;
    assert!(matches!(result, Err(StoreError::Corrupt { .. } | StoreError::Migration { .. })), "{result:?}");
    let _ = std::fs::remove_dir_all(&directory);
}

/// A log written by the single global chain (schema before migration 0009, the records of
/// `audit-log-before-rfc8785.sql`, hashes computed outside this code base) becomes the chain
/// `00…0` when the store opens, verifies unchanged, and new appends go to a chain of their own.
#[tokio::test]
async fn the_single_chain_log_migrates_into_a_chain_of_its_own() {
    const OLD_LOG: &str = include_str!("../../palisade/tests/it/fixtures/audit-log-before-rfc8785.sql");
    let directory = unique_directory();
    // Migrations 1–8 exactly as shipped, applied the way the store applies them.
    let old = directory.join("migrations");
    std::fs::create_dir_all(&old).expect("create");
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite")).expect("migrations") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default().to_owned();
        if name.as_str() < "0009" {
            std::fs::copy(&path, old.join(&name)).expect("copy");
        }
    }
    let path = directory.join("audit.db");
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&path).create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.expect("connect");
    sqlx::migrate::Migrator::new(old.as_path()).await.expect("migrator").run(&pool).await.expect("old migrations");
    sqlx::raw_sql(sqlx::AssertSqlSafe(OLD_LOG)).execute(&pool).await.expect("the old log");
    pool.close().await;

    let store = SqliteStore::open(path.to_str().expect("utf-8 path")).await.expect("open and migrate");
    let report = palisade_store::AuditStore::verify_chain(&store).await.expect("verify");
    assert!(report.is_intact(), "{report:?}");
    assert_eq!((report.records, report.chains), (3, 1));
    let heads = palisade_store::AuditStore::chain_heads(&store).await.expect("heads");
    assert_eq!((heads[0].chain.as_str(), heads[0].seq), (palisade_store::LEGACY_CHAIN, 3));
    palisade_store::AuditStore::append_batch(&store, vec![sample_record(1)]).await.expect("append");
    let report = palisade_store::AuditStore::verify_chain(&store).await.expect("verify");
    assert_eq!((report.records, report.chains, report.first_break), (4, 2, None));
    palisade_store::AuditStore::close(&store).await;
    let _ = std::fs::remove_dir_all(&directory);
}

/// A reader's store: a missing file is `Unavailable` and is not created; an existing one is read
/// and refuses every write (the database is opened read-only); an in-memory URL is refused.
#[tokio::test]
async fn a_read_only_store_reads_and_never_writes() {
    let directory = unique_directory();
    let path = directory.join("audit.db");
    let url = format!("sqlite:{}", path.display());
    let missing = open_store_read_only(&url).await.expect_err("a missing file does not open");
    assert!(matches!(missing, StoreError::Unavailable { .. }), "{missing:?}");
    assert!(!path.exists(), "opening for reading created the file");
    let writer = open_store(&url).await.expect("open");
    writer.append_batch(vec![sample_record(1), sample_record(2)]).await.expect("append");
    let reader = open_store_read_only(&url).await.expect("open read-only");
    let found = reader.search(AuditQuery { limit: 10, ..AuditQuery::default() }).await.expect("search");
    assert_eq!(found.len(), 2);
    assert!(reader.append_batch(vec![sample_record(3)]).await.is_err(), "a read-only store wrote");
    assert_eq!(writer.recent(10).await.expect("recent").len(), 2);
    assert!(matches!(open_store_read_only("sqlite::memory:").await, Err(StoreError::Config { .. })));
    reader.close().await;
    writer.close().await;
    let _ = std::fs::remove_dir_all(&directory);
}
