//! `many-tools-upstream`: the gateway benchmark's upstream with many tools, a bare hyper 1.x
//! server speaking just enough of the 2026-07-28 wire over HTTP: `server/discover`, a paginated
//! `tools/list` and a `tools/call` that answers one text block. It serves `--upstreams N`
//! independent endpoints on one port (`/u0/mcp` … `/u<N-1>/mcp`), each with `--tools M` tools
//! whose definitions differ per endpoint (name, description, one schema property), so a
//! gateway in front of all of them pins and serves N × M distinct definitions.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;

/// Largest request body read.
const MAX_BODY_BYTES: usize = 1024 * 1024;

#[derive(Parser)]
#[command(
    name = "many-tools-upstream",
    about = "N MCP endpoints (2026-07-28, HTTP) with M tools each: the gateway benchmark's upstream"
)]
struct Args {
    /// Loopback address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Endpoints served, `/u0/mcp` … (1–100).
    #[arg(long, default_value_t = 10)]
    upstreams: usize,
    /// Tools per endpoint (1–10,000).
    #[arg(long, default_value_t = 100)]
    tools: usize,
    /// Tools per `tools/list` page (1–1,000).
    #[arg(long, default_value_t = 50)]
    page_size: usize,
    /// Runtime worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

/// What every endpoint serves: its `tools/list` pages, built once.
struct Catalog {
    /// `pages[upstream][page]`: the `result` object of that `tools/list` page.
    pages: Vec<Vec<Value>>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    palisade_bench::require_loopback(&[args.listen])?;
    anyhow::ensure!((1..=100).contains(&args.upstreams), "--upstreams must be 1–100");
    anyhow::ensure!((1..=10_000).contains(&args.tools), "--tools must be 1–10,000");
    anyhow::ensure!((1..=1_000).contains(&args.page_size), "--page-size must be 1–1,000");
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.threads {
        runtime.worker_threads(threads);
    }
    let catalog = Arc::new(catalog(args.upstreams, args.tools, args.page_size));
    runtime.enable_all().build().context("starting the runtime")?.block_on(serve(args.listen, catalog))
}

/// Tool `index` of endpoint `upstream`: a realistic definition (a sentence of description, a
/// schema with two properties, annotations).
fn tool(upstream: usize, index: usize) -> Value {
    json!({
        "name": format!("tool_{index:04}"),
        "title": format!("Tool {index} of upstream {upstream}"),
        "description": format!(
            "Looks up record {index} of upstream {upstream} and returns it as text. Read-only; \
             the answer is the same for the same arguments."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "id": { "type": "string", "description": "The record id.", "maxLength": 64 },
                format!("field_{upstream}"): { "type": "integer", "minimum": 0, "maximum": 1000 }
            },
            "additionalProperties": false
        },
        "annotations": { "readOnlyHint": true, "idempotentHint": true }
    })
}

fn catalog(upstreams: usize, tools: usize, page_size: usize) -> Catalog {
    let pages = (0..upstreams)
        .map(|upstream| {
            let all: Vec<Value> = (0..tools).map(|index| tool(upstream, index)).collect();
            let count = all.chunks(page_size).len();
            all.chunks(page_size)
                .enumerate()
                .map(|(page, chunk)| {
                    let mut result = Map::new();
                    result.insert("resultType".into(), json!("complete"));
                    result.insert("tools".into(), Value::Array(chunk.to_vec()));
                    result.insert("ttlMs".into(), json!(0));
                    result.insert("cacheScope".into(), json!("public"));
                    if page + 1 < count {
                        result.insert("nextCursor".into(), json!(format!("p{}", page + 1)));
                    }
                    Value::Object(result)
                })
                .collect()
        })
        .collect();
    Catalog { pages }
}

async fn serve(listen: SocketAddr, catalog: Arc<Catalog>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let local = listener.local_addr()?;
    #[allow(clippy::print_stdout)]
    {
        println!(
            "listening on http://{local}/u0/mcp ({} endpoints /u0/mcp … /u{}/mcp)",
            catalog.pages.len(),
            catalog.pages.len() - 1
        );
    }
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                eprintln!("many-tools-upstream: accept: {error}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let catalog = catalog.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| handle(catalog.clone(), request));
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// The endpoint index of `/u<i>/mcp`.
fn endpoint(path: &str, count: usize) -> Option<usize> {
    let index: usize = path.strip_prefix("/u")?.strip_suffix("/mcp")?.parse().ok()?;
    (index < count).then_some(index)
}

async fn handle(catalog: Arc<Catalog>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let Some(upstream) = endpoint(request.uri().path(), catalog.pages.len()) else {
        return Ok(reply(StatusCode::NOT_FOUND, Bytes::new()));
    };
    if request.method() != Method::POST {
        return Ok(reply(StatusCode::METHOD_NOT_ALLOWED, Bytes::new()));
    }
    let body = match Limited::new(request.into_body(), MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(reply(StatusCode::PAYLOAD_TOO_LARGE, Bytes::new())),
    };
    let Ok(frame) = serde_json::from_slice::<Value>(&body) else {
        return Ok(error(StatusCode::BAD_REQUEST, Value::Null, -32700, "parse error"));
    };
    let id = frame.get("id").cloned().unwrap_or(Value::Null);
    if frame["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"].as_str() != Some("2026-07-28") {
        return Ok(error(StatusCode::BAD_REQUEST, id, -32602, "this server speaks 2026-07-28 only"));
    }
    let result = match frame.get("method").and_then(Value::as_str) {
        Some("server/discover") => json!({
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": { "tools": {} },
            "ttlMs": 0,
            "cacheScope": "public",
            "_meta": { "io.modelcontextprotocol/serverInfo": { "name": format!("many-tools-{upstream}"), "version": "1.0.0" } }
        }),
        Some("tools/list") => {
            let pages = &catalog.pages[upstream];
            let page = match frame["params"].get("cursor") {
                None | Some(Value::Null) => Some(0),
                Some(Value::String(cursor)) => cursor.strip_prefix('p').and_then(|n| n.parse::<usize>().ok()),
                Some(_) => None,
            };
            let Some(page) = page.and_then(|page| pages.get(page)) else {
                return Ok(error(StatusCode::BAD_REQUEST, id, -32602, "invalid cursor"));
            };
            page.clone()
        }
        Some("tools/call") => json!({
            "resultType": "complete",
            "content": [{ "type": "text", "text": "This is a simple text response for testing." }]
        }),
        _ => return Ok(error(StatusCode::NOT_FOUND, id, -32601, "method not found")),
    };
    let frame = json!({ "jsonrpc": "2.0", "id": id, "result": result });
    Ok(reply(StatusCode::OK, Bytes::from(frame.to_string())))
}

fn error(status: StatusCode, id: Value, code: i64, message: &str) -> Response<Full<Bytes>> {
    let frame = json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } });
    reply(status, Bytes::from(frame.to_string()))
}

fn reply(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
