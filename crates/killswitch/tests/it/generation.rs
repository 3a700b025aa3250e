//! The generation store: one conformance suite for SQLite and Valkey/Redis, restart, partition.

use std::time::Duration;

use palisade_killswitch::generation::conformance;
use palisade_killswitch::{
    GenerationRecord, GenerationStore, GenerationStoreError, GenerationSubject, MonotonicOutcome, RedisGenerationStore,
    RedisOptions, SqliteGenerationStore, TargetDigest, TargetKind,
};

/// A run-unique authority id, so runs against one Redis never see each other's keys.
fn unique_authority(label: &str) -> String {
    let mut bytes = [0_u8; 8];
    aws_lc_rs::rand::fill(&mut bytes).unwrap();
    let suffix: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("test-{label}-{suffix}")
}

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| {
        panic!(
            "REDIS_URL is not set: the Valkey/Redis generation-store tests need a server, e.g. \
             `redis-server --port 6390 --save '' --daemonize yes` and REDIS_URL=redis://127.0.0.1:6390/"
        )
    })
}

#[tokio::test]
async fn sqlite_conformance() {
    let store = SqliteGenerationStore::open("sqlite::memory:").await.unwrap();
    conformance::run_all(&store, &unique_authority("sqlite")).await;
    let dir = tempfile::tempdir().unwrap();
    let file = SqliteGenerationStore::open(dir.path().join("g.db").to_str().unwrap()).await.unwrap();
    conformance::run_all(&file, &unique_authority("sqlite-file")).await;
}

#[tokio::test]
async fn redis_conformance() {
    let store = RedisGenerationStore::connect(&redis_url(), RedisOptions::default()).await.unwrap();
    conformance::run_all(&store, &unique_authority("redis")).await;
}

#[tokio::test]
async fn redis_script_survives_a_script_flush() {
    // EVALSHA answers NOSCRIPT after SCRIPT FLUSH; the store must load the script again.
    let url = redis_url();
    let store = RedisGenerationStore::connect(&url, RedisOptions::default()).await.unwrap();
    let authority = unique_authority("flush");
    conformance::monotonic_rules(&store, &authority).await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut connection).await.unwrap();
    conformance::batches_are_all_or_nothing(&store, &authority).await;
}

fn record(authority: &str, generation: u64) -> GenerationRecord {
    GenerationRecord {
        authority: authority.to_owned(),
        subject: GenerationSubject::Target(TargetDigest { kind: TargetKind::Tenant, digest: "ab".repeat(32) }),
        generation,
        digest: "cd".repeat(32),
        state: "ENABLE".to_owned(),
    }
}

#[tokio::test]
async fn sqlite_store_keeps_generations_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("generations.db");
    let authority = unique_authority("restart");
    {
        let store = SqliteGenerationStore::open(path.to_str().unwrap()).await.unwrap();
        assert_eq!(store.accept_all(&[record(&authority, 7)]).await.unwrap(), vec![MonotonicOutcome::Accepted]);
        store.close().await;
    }
    let reopened = SqliteGenerationStore::open(path.to_str().unwrap()).await.unwrap();
    assert_eq!(reopened.accept_all(&[record(&authority, 6)]).await.unwrap(), vec![MonotonicOutcome::Stale]);
    assert_eq!(reopened.accept_all(&[record(&authority, 7)]).await.unwrap(), vec![MonotonicOutcome::Replay]);
}

#[tokio::test]
async fn redis_down_fails_closed() {
    // A port nothing listens on: bind, take the port, close.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let options = RedisOptions {
        connect_timeout: Duration::from_millis(300),
        response_timeout: Duration::from_millis(300),
        retries: 1,
    };
    let started = std::time::Instant::now();
    let result = RedisGenerationStore::connect(&format!("redis://127.0.0.1:{port}/"), options).await;
    assert!(matches!(result, Err(GenerationStoreError::Unavailable { .. })), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "gives up promptly");
}
