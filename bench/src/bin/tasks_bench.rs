//! Tasks and listen streams at scale, in process (no HTTP: what is measured is the pipeline, the
//! task store and the event fan-out). Two figures for BENCHMARKS.md:
//!
//! 1. task create → complete throughput: `--clients` loops each call a task-capable tool that
//!    finishes at once and poll `tasks/get` until the task is completed; SQLite (a temporary file)
//!    and, with `DATABASE_URL`, PostgreSQL (a fresh schema).
//! 2. `--streams` concurrent `subscriptions/listen` streams on one server: resident memory before
//!    and after opening them, and the event-to-delivery latency (p50/p99) of `--events`
//!    list-changed events published while all are open.
//!
//! ```text
//! tasks-bench [--clients 16] [--seconds 5] [--streams 10000] [--events 20]
//! ```
//! One JSON line per figure on stdout.

// The allocator the palisade binary ships with, so the library is measured as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use palisade_server::auth::Authenticator;
use palisade_server::context::NotificationSink;
use palisade_server::secret::ServerSecret;
use palisade_server::{
    App, CallToolResult, Outcome, Server, ServerConfig, SubjectKey, TaskConfig, TaskService, TaskSupport, ToolDef,
};
use palisade_store::{PostgresOptions, PostgresStore, SqliteStore, Store};
use palisade_wire::{Request, RequestId};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    /// Concurrent create → complete loops.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Measured seconds per backend.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Concurrent listen streams.
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// Events published while the streams are open.
    #[arg(long, default_value_t = 20)]
    events: usize,
}

fn app() -> App {
    App::builder("tasks-bench", "0")
        .tool(
            ToolDef::new("quick")
                .task_support(TaskSupport::Optional)
                .handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("done"))) }),
        )
        .build()
        .expect("valid app")
}

fn server(store: Arc<dyn Store>, listen_queue: usize) -> Arc<Server> {
    let key = SubjectKey::from_bytes(&[3u8; 32]).expect("key");
    let config = TaskConfig { cancel_poll: Duration::from_millis(200), ..TaskConfig::default() };
    let tasks = Arc::new(TaskService::new(store.clone(), key, config, Arc::new(palisade_server::clock::SystemClock)));
    let config = ServerConfig { listen_queue, ..ServerConfig::default() };
    let server = Server::builder(app(), config, Authenticator::UnauthenticatedLoopback, ServerSecret::random())
        .audit(store)
        .tasks(tasks)
        .build()
        .expect("a consistent server");
    Arc::new(server)
}

fn request(id: i64, method: &str, mut params: Map<String, Value>) -> Request {
    params.insert(
        "_meta".into(),
        json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } } }),
    );
    Request { id: RequestId::Number(id), method: method.into(), params }
}

async fn call(server: &Server, id: i64, method: &str, params: Value) -> Value {
    let params = params.as_object().cloned().unwrap_or_default();
    let (sink, _rx) = NotificationSink::channel(8);
    server.handle_request(request(id, method, params), None, sink, CancellationToken::new()).await.frame
}

async fn create_complete(label: &str, store: Arc<dyn Store>, args: &Args) -> anyhow::Result<()> {
    let server = server(store, 256);
    let end = Instant::now() + Duration::from_secs(args.seconds);
    let mut loops = tokio::task::JoinSet::new();
    for client in 0..args.clients {
        let server = server.clone();
        loops.spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0i64;
            while Instant::now() < end {
                let started = Instant::now();
                n += 1;
                let created = call(&server, n, "tools/call", json!({ "name": "quick", "arguments": {} })).await;
                let id = created["result"]["taskId"].as_str().map(str::to_owned);
                let Some(id) = id else { anyhow::bail!("client {client}: no task created: {created}") };
                loop {
                    let got = call(&server, n, "tasks/get", json!({ "taskId": id })).await;
                    match got["result"]["status"].as_str() {
                        Some("completed") => break,
                        Some("working") => tokio::time::sleep(Duration::from_millis(1)).await,
                        _ => anyhow::bail!("unexpected task state: {got}"),
                    }
                }
                latencies.push(started.elapsed());
            }
            Ok(latencies)
        });
    }
    let mut latencies = Vec::new();
    while let Some(joined) = loops.join_next().await {
        latencies.extend(joined??);
    }
    server.flush_audit().await;
    latencies.sort();
    let at = |q: f64| palisade_bench::percentile_us(&latencies, q);
    #[allow(clippy::print_stdout)]
    {
        println!(
            "{{\"figure\":\"task_create_complete\",\"backend\":\"{label}\",\"clients\":{},\"tasks_per_sec\":{:.0},\"p50_us\":{},\"p99_us\":{}}}",
            args.clients,
            latencies.len() as f64 / args.seconds as f64,
            at(0.5),
            at(0.99)
        );
    }
    Ok(())
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:").and_then(|v| v.split_whitespace().next()?.parse().ok()))
        })
        .unwrap_or(0)
}

async fn listen_streams(args: &Args) -> anyhow::Result<()> {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open("sqlite::memory:").await?);
    let server = server(store, 64);
    let before = rss_kib();
    let (times_tx, mut times_rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    let mut acks = tokio::sync::mpsc::channel::<()>(args.streams.max(1));
    for stream in 0..args.streams {
        let server = server.clone();
        let times = times_tx.clone();
        let ack = acks.0.clone();
        tokio::spawn(async move {
            let (sink, mut rx) = NotificationSink::channel(64);
            let params = json!({ "notifications": { "toolsListChanged": true } });
            let request =
                request(stream as i64, "subscriptions/listen", params.as_object().cloned().unwrap_or_default());
            let handle = tokio::spawn(async move {
                server.handle_request(request, None, sink, CancellationToken::new()).await;
            });
            let mut seen = 0usize;
            while let Some(frame) = rx.recv().await {
                if frame["method"] == "notifications/subscriptions/acknowledged" {
                    let _ = ack.send(()).await;
                } else {
                    let _ = times.send((seen, Instant::now()));
                    seen += 1;
                }
            }
            handle.abort();
        });
    }
    drop(times_tx);
    for _ in 0..args.streams {
        acks.1.recv().await;
    }
    let open = rss_kib();
    let mut published = Vec::new();
    for _ in 0..args.events {
        published.push(Instant::now());
        server.events().tools_list_changed();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut latencies = Vec::new();
    let expected = args.streams * args.events;
    while latencies.len() < expected {
        match tokio::time::timeout(Duration::from_secs(10), times_rx.recv()).await {
            Ok(Some((index, at))) => latencies.push(at.duration_since(published[index])),
            _ => break,
        }
    }
    latencies.sort();
    let at = |q: f64| palisade_bench::percentile_us(&latencies, q);
    #[allow(clippy::print_stdout)]
    {
        println!(
            "{{\"figure\":\"listen_streams\",\"streams\":{},\"rss_before_kib\":{before},\"rss_open_kib\":{open},\"kib_per_stream\":{:.1},\"events\":{},\"delivered\":{},\"p50_us\":{},\"p99_us\":{}}}",
            args.streams,
            (open.saturating_sub(before)) as f64 / args.streams.max(1) as f64,
            args.events,
            latencies.len(),
            at(0.5),
            at(0.99)
        );
    }
    server.shutdown_token().cancel();
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("palisade-tasks-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let sqlite = SqliteStore::open(&dir.join("bench.db").to_string_lossy()).await?;
    let result = create_complete("sqlite", Arc::new(sqlite), &args).await;
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    if let Some(url) = std::env::var("DATABASE_URL").ok().filter(|url| !url.is_empty()) {
        let schema = palisade_bench::PgSchema::create(&url, "tasks_bench").await?;
        let options = PostgresOptions { max_connections: 8, ..PostgresOptions::default() };
        let store = PostgresStore::connect_with(&schema.url, options).await?;
        let result = create_complete("postgres", Arc::new(store), &args).await;
        schema.drop().await?;
        result?;
    }
    listen_streams(&args).await
}
