//! `echo-server`: the benchmark's baseline, a bare hyper 1.x HTTP/1.1 server that does the least
//! honest work of an MCP server: parse the JSON-RPC body, answer the `tools/call` result with the
//! request's id. No routing framework, no validation beyond JSON, no per-request task.

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// Same cap as palisade's default `--max-body-bytes`.
const MAX_BODY_BYTES: usize = 1024 * 1024;

#[derive(Parser)]
#[command(name = "echo-server", about = "Bare hyper JSON-RPC echo server: the baseline of scripts/bench")]
struct Args {
    /// Loopback address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Runtime worker threads (default: one per core, as palisade).
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    palisade_bench::require_loopback(&[args.listen])?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.threads {
        runtime.worker_threads(threads);
    }
    runtime.enable_all().build().context("starting the runtime")?.block_on(serve(args.listen))
}

async fn serve(listen: SocketAddr) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let local = listener.local_addr()?;
    #[allow(clippy::print_stdout)]
    {
        println!("listening on http://{local}/mcp");
    }
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                eprintln!("echo-server: accept: {error}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(handle);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

async fn handle(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.uri().path() != "/mcp" {
        return Ok(reply(StatusCode::NOT_FOUND, Bytes::new()));
    }
    if request.method() != Method::POST {
        return Ok(reply(StatusCode::METHOD_NOT_ALLOWED, Bytes::new()));
    }
    let body = match Limited::new(request.into_body(), MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(reply(StatusCode::PAYLOAD_TOO_LARGE, Bytes::new())),
    };
    let frame = match serde_json::from_slice::<Value>(&body) {
        Ok(frame) => json!({
            "jsonrpc": "2.0",
            "id": frame.get("id").cloned().unwrap_or(Value::Null),
            "result": {
                "content": [{ "type": "text", "text": "This is a simple text response for testing." }],
                "resultType": "complete"
            }
        }),
        Err(_) => json!({ "jsonrpc": "2.0", "error": { "code": -32700, "message": "parse error" } }),
    };
    let status = if frame.get("error").is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    Ok(reply(status, Bytes::from(frame.to_string())))
}

fn reply(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
