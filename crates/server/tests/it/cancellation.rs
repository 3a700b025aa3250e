//! Closing an HTTP response stream cancels the request's work: the handler observes its

#![allow(clippy::unwrap_used)]
//! cancellation token and stops. The work runs in the connection's task; when the client leaves
//! early the rest of it still runs to its end (cooperative cancellation), and a panic in it is an
//! internal-error reply.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use palisade_server::auth::Authenticator;
use palisade_server::secret::ServerSecret;
use palisade_server::{App, CallToolResult, Outcome, Server, ServerConfig, ToolDef};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_handler() {
    let observed = Arc::new(AtomicBool::new(false));
    let seen = observed.clone();
    let app = App::builder("cancel-test", "0")
        .tool(ToolDef::new("wait_for_cancel").description("reports progress, then waits").handler(move |ctx, _| {
            let seen = seen.clone();
            async move {
                // Set when the handler's future is dropped: the pipeline stops the work by
                // dropping it once the request is cancelled.
                let _stopped = SetOnDrop(seen);
                ctx.progress(1.0, None, None).await;
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(Outcome::Complete(CallToolResult::text("finished")))
            }
        }))
        .build()
        .unwrap();
    let (port, _server) = serve(app).await;

    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": "wait_for_cancel", "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}, "progressToken": 1 } } });
    // A raw socket, so "the client closed the stream" is exactly that: the TCP connection ends.
    let body = body.to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: wait_for_cancel\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    while !String::from_utf8_lossy(&received).contains("notifications/progress") {
        let mut buffer = [0u8; 4096];
        let read = socket.read(&mut buffer).await.unwrap();
        assert!(read > 0, "stream ended early");
        received.extend_from_slice(&buffer[..read]);
    }
    assert!(String::from_utf8_lossy(&received).starts_with("HTTP/1.1 200"));
    assert!(!observed.load(Ordering::SeqCst));
    drop(socket);
    for _ in 0..100 {
        if observed.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the handler kept running after the client closed the stream");
}

#[tokio::test]
async fn an_unauthenticated_server_refuses_a_public_address() {
    let app = App::builder("t", "0").build().unwrap();
    let server =
        Server::builder(app, ServerConfig::default(), Authenticator::UnauthenticatedLoopback, ServerSecret::random())
            .without_audit()
            .build()
            .unwrap();
    let error = palisade_server::http::bind(&server, "0.0.0.0:0".parse().unwrap()).await.unwrap_err();
    assert!(error.to_string().contains("unauthenticated"), "{error}");
}

/// A server on loopback for `app`; returns its port and the server (for its metrics).
async fn serve(app: App) -> (u16, Arc<Server>) {
    let server = Arc::new(
        Server::builder(app, ServerConfig::default(), Authenticator::UnauthenticatedLoopback, ServerSecret::random())
            .without_audit()
            .build()
            .unwrap(),
    );
    let listener = palisade_server::http::bind(&server, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(palisade_server::http::serve(server.clone(), listener, std::future::pending()));
    (port, server)
}

/// A raw HTTP/1.1 `tools/call` of `tool` that accepts JSON only (no stream).
fn json_only_call(port: u16, tool: &str) -> String {
    let body = json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": { "name": tool, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {} } } })
    .to_string();
    format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_a_json_request_cancels_it_and_its_work_still_ends() {
    let started = Arc::new(AtomicBool::new(false));
    let stopped = Arc::new(AtomicBool::new(false));
    let (flag_started, flag_stopped) = (started.clone(), stopped.clone());
    let app = App::builder("cancel-test", "0")
        .tool(ToolDef::new("slow").description("waits").handler(move |_ctx, _| {
            let (started, stopped) = (flag_started.clone(), flag_stopped.clone());
            async move {
                let _stopped = SetOnDrop(stopped);
                started.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(Outcome::Complete(CallToolResult::text("finished")))
            }
        }))
        .build()
        .unwrap();
    let (port, server) = serve(app).await;
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    socket.write_all(json_only_call(port, "slow").as_bytes()).await.unwrap();
    while !started.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(socket);
    // The handler is stopped, and the request's work went on to its end after the client left:
    // the pipeline answered (to nobody) and counted the request as failed, the tool's call as
    // cancelled, and nothing as a refusal (a client leaving is not a deny).
    for _ in 0..250 {
        let metrics = server.metrics().render();
        if stopped.load(Ordering::SeqCst) && metrics.contains("palisade_requests_total{outcome=\"error\"} 1") {
            let cancelled = "palisade_tool_calls_total{tool=\"slow\",upstream=\"\",outcome=\"cancelled\"} 1";
            assert!(metrics.contains(cancelled), "{metrics}");
            assert!(metrics.contains("palisade_decisions_total{stage=\"dispatch\",decision=\"deny\"} 0"), "{metrics}");
            assert!(!metrics.contains("palisade_tool_refusals_total"), "{metrics}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "handler stopped: {}; metrics: {}",
        stopped.load(Ordering::SeqCst),
        server
            .metrics()
            .render()
            .lines()
            .filter(|line| line.starts_with("palisade_requests_total"))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

#[tokio::test]
async fn a_panicking_handler_is_an_internal_error_and_the_server_goes_on() {
    let app = App::builder("panic-test", "0")
        .tool(ToolDef::new("boom").description("panics").handler(|_ctx, _| async move {
            if std::hint::black_box(true) {
                panic!("the tool crashed");
            }
            Ok(Outcome::Complete(CallToolResult::text("unreachable")))
        }))
        .tool(
            ToolDef::new("fine")
                .description("answers")
                .handler(|_ctx, _| async move { Ok(Outcome::Complete(CallToolResult::text("fine"))) }),
        )
        .build()
        .unwrap();
    let (port, _server) = serve(app).await;
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    for (tool, expected) in [("boom", "HTTP/1.1 500"), ("fine", "HTTP/1.1 200")] {
        socket.write_all(json_only_call(port, tool).as_bytes()).await.unwrap();
        let mut received = Vec::new();
        while !String::from_utf8_lossy(&received).contains("\"jsonrpc\"") || !received.ends_with(b"}") {
            let mut buffer = [0u8; 4096];
            let read = socket.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the connection closed after {tool}");
            received.extend_from_slice(&buffer[..read]);
        }
        let text = String::from_utf8_lossy(&received);
        assert!(text.starts_with(expected), "{tool}: {text}");
        if tool == "boom" {
            assert!(text.contains("\"code\":-32603"), "{text}");
            assert!(!text.contains("crashed"), "the panic message reached the client: {text}");
        }
    }
}
