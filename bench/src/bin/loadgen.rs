//! `loadgen`: a closed-loop HTTP/1.1 load generator for MCP `tools/call` over Streamable HTTP.
//! C keep-alive connections each keep one request in flight; after a warm-up, every response is
//! checked (200, a `"result"` member, and not a tool error `"isError":true`) and its latency
//! recorded; prints one JSON line (stdout) and one human line (stderr). A run with any failed
//! request is reported as invalid.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt as _, Full};
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use palisade_bench::cpu_seconds;
use palisade_wire::header::encode_value;
use serde_json::{Value, json};
use tokio::net::TcpStream;

#[derive(Parser)]
#[command(name = "loadgen", about = "Closed-loop tools/call load generator (loopback only)")]
struct Args {
    /// MCP endpoint, e.g. http://127.0.0.1:8080/mcp (loopback only).
    #[arg(long)]
    url: String,
    /// Concurrent keep-alive connections, one request in flight on each.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Measured duration after the warm-up.
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    /// Warm-up duration in seconds (fractions allowed, e.g. 0.2): requests are sent and checked
    /// but not recorded.
    #[arg(long, default_value_t = 2.0)]
    warmup_secs: f64,
    /// Extra request header `Name: value` (repeatable; replaces a default of the same name).
    #[arg(long = "header", value_name = "K:V", value_parser = parse_header)]
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Request body (one JSON-RPC request); default: a tools/call of `test_simple_text`.
    /// `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` are derived from it.
    #[arg(long, conflicts_with_all = ["tool", "arguments"])]
    body_file: Option<PathBuf>,
    /// Call this tool instead of `test_simple_text` (same request shape and `_meta`).
    #[arg(long)]
    tool: Option<String>,
    /// The tool's arguments, a JSON object (default `{}`).
    #[arg(long, value_name = "JSON")]
    arguments: Option<String>,
    /// Label copied into the output.
    #[arg(long, default_value = "")]
    label: String,
    /// Load generator threads (1 = a single-threaded runtime, leaving the other cores to the
    /// server).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Also report this process's CPU use over the measured window (Linux /proc).
    #[arg(long, conflicts_with = "server_group")]
    server_pid: Option<u32>,
    /// Report the CPU use of every process in this process group instead (a server with worker
    /// processes started in a group of its own, e.g. with `setsid`).
    #[arg(long, value_name = "PGID")]
    server_group: Option<u32>,
}

/// Whose CPU time counts as the server's.
#[derive(Clone, Copy)]
enum Server {
    None,
    Process(u32),
    Group(u32),
}

impl Server {
    fn of(args: &Args) -> Self {
        match (args.server_pid, args.server_group) {
            (Some(pid), _) => Self::Process(pid),
            (None, Some(pgid)) => Self::Group(pgid),
            (None, None) => Self::None,
        }
    }
}

fn parse_header(raw: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = raw.split_once(':').ok_or("expected K:V")?;
    let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|e| e.to_string())?;
    let value = HeaderValue::from_str(value.trim()).map_err(|e| e.to_string())?;
    Ok((name, value))
}

/// What every connection sends, and where.
struct Target {
    addr: SocketAddr,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

/// Per-connection results, merged at the end.
#[derive(Default)]
struct Tally {
    latencies_ns: Vec<u64>,
    errors: u64,
    warmup_requests: u64,
    warmup_errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies_ns.extend(other.latencies_ns);
        self.errors += other.errors;
        self.warmup_requests += other.warmup_requests;
        self.warmup_errors += other.warmup_errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.connections > 0 && args.duration_secs > 0, "connections and duration must be positive");
    anyhow::ensure!(
        args.warmup_secs.is_finite() && (0.0..=3600.0).contains(&args.warmup_secs),
        "the warm-up is 0 to 3600 seconds"
    );
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads).enable_all().build()?
    };
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let target = Arc::new(target(&args).await?);
    // Fail fast, with the server's answer, when the request is not accepted at all.
    let mut probe = connect(&target).await?;
    if let Err(why) = send(&mut probe, &target).await {
        bail!("probe request to {} failed: {why}", args.url);
    }
    drop(probe);

    let started = Instant::now();
    let measure_start = started + Duration::from_secs_f64(args.warmup_secs);
    let end = measure_start + Duration::from_secs(args.duration_secs);
    let cpu = tokio::spawn(cpu_over(measure_start, end, Server::of(&args)));
    let workers: Vec<_> =
        (0..args.connections).map(|_| tokio::spawn(connection(target.clone(), measure_start, end))).collect();
    let mut tally = Tally::default();
    for worker in workers {
        tally.merge(worker.await.context("a connection task panicked")?);
    }
    let (loadgen_cpu, server_cpu) = cpu.await.context("the CPU sampler panicked")?;
    report(&args, tally, loadgen_cpu, server_cpu);
    Ok(())
}

async fn target(args: &Args) -> anyhow::Result<Target> {
    let uri: Uri = args.url.parse().with_context(|| format!("parsing --url {}", args.url))?;
    anyhow::ensure!(uri.scheme_str() == Some("http"), "--url must be http:// (loopback, no TLS)");
    let authority = uri.authority().context("--url has no host")?.clone();
    let port = authority.port_u16().unwrap_or(80);
    let host = authority.host().trim_matches(['[', ']']);
    // No name lookups: an IP literal or `localhost`, then every resolved address must be loopback.
    anyhow::ensure!(
        host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok(),
        "refusing {host}: use a loopback IP address or localhost"
    );
    let addrs: Vec<SocketAddr> =
        tokio::net::lookup_host((host, port)).await.with_context(|| format!("resolving {authority}"))?.collect();
    palisade_bench::require_loopback(&addrs)?;
    let addr = *addrs.first().context("no address")?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();

    let body = match (&args.body_file, &args.tool, &args.arguments) {
        (Some(file), _, _) => Bytes::from(std::fs::read(file).with_context(|| format!("reading {}", file.display()))?),
        (None, None, None) => Bytes::from_static(palisade_bench::DEFAULT_TOOLS_CALL.as_bytes()),
        (None, tool, arguments) => {
            let arguments: Value = match arguments {
                Some(raw) => serde_json::from_str(raw).context("--arguments is not JSON")?,
                None => json!({}),
            };
            anyhow::ensure!(arguments.is_object(), "--arguments must be a JSON object");
            let name = tool.as_deref().unwrap_or(palisade_bench::DEFAULT_TOOL);
            Bytes::from(palisade_bench::tools_call(name, arguments))
        }
    };
    let frame: Value = serde_json::from_slice(&body).context("the body is not JSON")?;
    let method = frame["method"].as_str().context("the body has no method")?;
    let version = frame["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"]
        .as_str()
        .unwrap_or(palisade_wire::PROTOCOL_VERSION);

    let mut headers = HeaderMap::new();
    headers.insert(HOST, HeaderValue::from_str(authority.as_str())?);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
    headers.insert("mcp-protocol-version", HeaderValue::from_str(&encode_value(version))?);
    headers.insert("mcp-method", HeaderValue::from_str(&encode_value(method))?);
    if let Some(name) = frame["params"]["name"].as_str() {
        headers.insert("mcp-name", HeaderValue::from_str(&encode_value(name))?);
    }
    for (name, value) in &args.headers {
        headers.insert(name.clone(), value.clone());
    }
    Ok(Target { addr, path, headers, body })
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(target: &Target) -> anyhow::Result<Sender> {
    let stream = TcpStream::connect(target.addr).await.with_context(|| format!("connecting to {}", target.addr))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One request; `Err` says why it does not count as a success. `Err` with a broken connection
/// leaves `sender` closed, and the caller reconnects.
async fn send(sender: &mut Sender, target: &Target) -> Result<(), String> {
    let mut request = Request::new(Full::new(target.body.clone()));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = target.path.parse().map_err(|e: hyper::http::uri::InvalidUri| e.to_string())?;
    *request.headers_mut() = target.headers.clone();
    sender.ready().await.map_err(|e| format!("connection: {e}"))?;
    let response = sender.send_request(request).await.map_err(|e| format!("request: {e}"))?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|e| format!("response body: {e}"))?.to_bytes();
    if status != StatusCode::OK {
        return Err(format!("status {status}: {}", String::from_utf8_lossy(&body[..body.len().min(300)])));
    }
    if !body.windows(8).any(|window| window == b"\"result\"") {
        return Err(format!("no result: {}", String::from_utf8_lossy(&body[..body.len().min(300)])));
    }
    // A tool error is a JSON-RPC result too, but not the path being measured.
    if body.windows(14).any(|window| window == b"\"isError\":true") {
        return Err(format!("tool error: {}", String::from_utf8_lossy(&body[..body.len().min(300)])));
    }
    Ok(())
}

/// One closed-loop connection: send, wait for the whole answer, repeat until `end`.
async fn connection(target: Arc<Target>, measure_start: Instant, end: Instant) -> Tally {
    let mut tally = Tally::default();
    let mut sender: Option<Sender> = None;
    loop {
        let sent_at = Instant::now();
        if sent_at >= end {
            break;
        }
        let measured = sent_at >= measure_start;
        let result = match sender.as_mut() {
            Some(open) => send(open, &target).await,
            None => match connect(&target).await {
                Ok(open) => {
                    sender = Some(open);
                    continue;
                }
                Err(error) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Err(format!("{error:#}"))
                }
            },
        };
        let latency = sent_at.elapsed();
        if !measured {
            tally.warmup_requests += 1;
        }
        match result {
            Ok(()) if measured => tally.latencies_ns.push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX)),
            Ok(()) => {}
            Err(why) => {
                if measured {
                    tally.errors += 1;
                } else {
                    tally.warmup_errors += 1;
                }
                tally.first_error.get_or_insert(why);
                if sender.as_ref().is_some_and(Sender::is_closed) {
                    sender = None;
                }
            }
        }
    }
    tally
}

/// CPU seconds (user + system) used by this process and by the server between `from` and `to`.
async fn cpu_over(from: Instant, to: Instant, server: Server) -> (Option<f64>, Option<f64>) {
    tokio::time::sleep_until(from.into()).await;
    let before = (cpu_seconds("self"), server_sample(server));
    tokio::time::sleep_until(to.into()).await;
    let after = (cpu_seconds("self"), server_sample(server));
    let loadgen = after.0.zip(before.0).map(|(now, then)| now - then);
    let server = match (before.1, after.1) {
        (Some(ServerSample::Seconds(a)), Some(ServerSample::Seconds(b))) => Some(b - a),
        (Some(ServerSample::Group(a)), Some(ServerSample::Group(b))) => {
            Some(palisade_bench::group_cpu_seconds_between(&a, &b))
        }
        _ => None,
    };
    (loadgen, server)
}

/// One reading of the server's CPU time.
enum ServerSample {
    Seconds(f64),
    Group(std::collections::BTreeMap<u32, u64>),
}

fn server_sample(server: Server) -> Option<ServerSample> {
    match server {
        Server::None => None,
        Server::Process(pid) => cpu_seconds(&pid.to_string()).map(ServerSample::Seconds),
        Server::Group(pgid) => palisade_bench::group_cpu_ticks(pgid).map(ServerSample::Group),
    }
}

/// Nearest-rank percentile of a sorted, non-empty slice.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(args: &Args, mut tally: Tally, loadgen_cpu: Option<f64>, server_cpu: Option<f64>) {
    tally.latencies_ns.sort_unstable();
    let latencies = &tally.latencies_ns;
    let requests = latencies.len() as u64;
    let valid = requests > 0 && tally.errors == 0 && tally.warmup_errors == 0;
    let seconds = args.duration_secs as f64;
    let rps = requests as f64 / seconds;
    let us = |ns: u64| ns as f64 / 1000.0;
    let (p50, p90, p99, max, mean) = if latencies.is_empty() {
        (0.0, 0.0, 0.0, 0.0, 0.0)
    } else {
        let mean = latencies.iter().map(|&ns| ns as f64).sum::<f64>() / latencies.len() as f64 / 1000.0;
        let max = latencies.last().copied().unwrap_or(0);
        (
            us(percentile(latencies, 0.50)),
            us(percentile(latencies, 0.90)),
            us(percentile(latencies, 0.99)),
            us(max),
            mean,
        )
    };
    let percent = |cpu: Option<f64>| cpu.map(|s| (s / seconds * 1000.0).round() / 10.0);
    let server_us_per_request =
        server_cpu.filter(|_| requests > 0).map(|s| (s * 1e6 / requests as f64 * 10.0).round() / 10.0);
    let line = json!({
        "label": args.label,
        "url": args.url,
        "connections": args.connections,
        "duration_secs": args.duration_secs,
        "warmup_secs": args.warmup_secs,
        "requests": requests,
        "errors": tally.errors,
        "warmup_requests": tally.warmup_requests,
        "warmup_errors": tally.warmup_errors,
        "valid": valid,
        "rps": (rps * 10.0).round() / 10.0,
        "p50_us": (p50 * 10.0).round() / 10.0,
        "p90_us": (p90 * 10.0).round() / 10.0,
        "p99_us": (p99 * 10.0).round() / 10.0,
        "max_us": (max * 10.0).round() / 10.0,
        "mean_us": (mean * 10.0).round() / 10.0,
        "loadgen_cpu_pct": percent(loadgen_cpu),
        "server_cpu_pct": percent(server_cpu),
        "server_cpu_us_per_request": server_us_per_request,
        "server_cpu_scope": match Server::of(args) {
            Server::None => Value::Null,
            Server::Process(_) => json!("process"),
            Server::Group(_) => json!("process group"),
        },
        "first_error": tally.first_error,
    });
    #[allow(clippy::print_stdout)]
    {
        println!("{line}");
    }
    let label = if args.label.is_empty() { String::new() } else { format!("[{}] ", args.label) };
    eprintln!(
        "loadgen {label}{rps:.0} req/s  p50 {p50:.0} µs  p99 {p99:.0} µs  ({requests} requests, {} errors, {} connections, {} s){}",
        tally.errors + tally.warmup_errors,
        args.connections,
        args.duration_secs,
        if valid { "" } else { "  INVALID RUN" }
    );
    if let Some(why) = &tally.first_error {
        eprintln!("loadgen {label}first error: {why}");
    }
}
