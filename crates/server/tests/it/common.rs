//! Shared pieces of the server's integration tests: fresh SQLite / PostgreSQL stores, temporary
//! directories, unique names and a JSON-RPC caller over real HTTP.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use palisade_store::{PostgresOptions, PostgresStore, SqliteStore, Store};
use serde_json::{Value, json};

// ---- Backends ----------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Serves `server` over HTTP on a loopback port until the test ends; its `/mcp` URL.
pub async fn serve_on_loopback(server: &Arc<palisade_server::Server>) -> String {
    let listener = palisade_server::http::bind(server, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(palisade_server::http::serve(server.clone(), listener, std::future::pending()));
    url
}

pub fn unique(name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // Unique across runs too (schemas and directories may outlive a killed run): random bytes.
    let mut random = [0u8; 8];
    palisade_server::secret::fill_random(&mut random).unwrap();
    let random = palisade_base::hex::hex(&random);
    format!("{name}_{}_{}_{random}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").ok().filter(|url| !url.is_empty()).unwrap_or_else(|| {
        panic!("DATABASE_URL is not set: the PostgreSQL handle tests need a running PostgreSQL server")
    })
}

/// A fresh store: a new SQLite file, or a new PostgreSQL schema. `via` replaces the PostgreSQL
/// host:port (the outage test routes through a proxy it can cut).
pub async fn fresh_store(backend: Backend, via: Option<String>) -> (Arc<dyn Store>, TempDir) {
    let dir = temp_dir(&unique("handles"));
    match backend {
        Backend::Sqlite => {
            let path = dir.0.join("store.db");
            (Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap()), dir)
        }
        Backend::Postgres => {
            let url = database_url();
            let schema = unique("handles_test");
            let admin = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&admin).await.unwrap();
            admin.close().await;
            let mut url = format!("{url}{}options[search_path]={schema}", if url.contains('?') { '&' } else { '?' });
            if let Some(via) = via {
                let parsed = url::Url::parse(&url).unwrap();
                let host_port = format!("{}:{}", parsed.host_str().unwrap(), parsed.port().unwrap_or(5432));
                url = url.replacen(&host_port, &via, 1);
            }
            let options = PostgresOptions { max_connections: 6, acquire_timeout: Duration::from_secs(2) };
            (Arc::new(PostgresStore::connect_with(&url, options).await.unwrap()), dir)
        }
    }
}

pub fn pg_address() -> String {
    let parsed = url::Url::parse(&database_url()).unwrap();
    format!("{}:{}", parsed.host_str().unwrap(), parsed.port().unwrap_or(5432))
}

pub struct TempDir(pub std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn temp_dir(name: &str) -> TempDir {
    let path = std::env::temp_dir().join(format!("palisade-{name}"));
    std::fs::create_dir_all(&path).unwrap();
    TempDir(path)
}

/// Waits until `ready()` holds, looking again every few milliseconds: a wait for the event the
/// test needs, never a fixed pause. Panics naming `what` if it has not happened after 30 s
/// (real time), so a lost event fails the test instead of hanging it.
pub async fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Sends one 2026-07-28 request over HTTP with the routing headers it needs and returns the HTTP
/// status and the JSON body.
pub async fn rpc(url: &str, token: Option<&str>, method: &str, mut params: Value, capabilities: Value) -> (u16, Value) {
    // Keys the caller put in `_meta` (a delegation capability, …) stay; the protocol's are set.
    let mut meta = params.get("_meta").cloned().filter(Value::is_object).unwrap_or_else(|| json!({}));
    meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    meta["io.modelcontextprotocol/clientCapabilities"] = capabilities;
    params["_meta"] = meta;
    let name = match method {
        "tools/call" | "prompts/get" => params["name"].as_str().map(str::to_owned),
        "tasks/get" | "tasks/update" | "tasks/cancel" => params["taskId"].as_str().map(str::to_owned),
        _ => None,
    };
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .body(body.to_string());
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Instantiates each `case(Backend)` in the calling test file as a test on SQLite (module
/// `sqlite`) and on PostgreSQL (module `postgres`).
#[macro_export]
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Backend::Postgres).await;
                }
            )*
        }
    };
}
