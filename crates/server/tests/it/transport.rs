//! The HTTP transport against slow, idle and malformed clients, over real sockets on 127.0.0.1
//! (`palisade_server::http::serve`, no binary): a request head that stalls is cut off after the
//! header read timeout, a body that does not arrive in time is answered 408 and the connection
//! closed, an idle keep-alive connection is closed after the idle timeout (and by hyper's header
//! timer, verified here), the connection cap holds further connections until one closes; `Host`
//! and `Origin` are taken once and an absolute-form target must name an allowed host; only
//! `application/json` bodies are accepted; HTTP/2 with prior knowledge is served and checked
//! alike; every such refusal reaches the audit log, aggregated per reason and source digest, and
//! is answered with its error catalogue entry (status, code, message); `/metrics` is served on
//! the operator's own listener, on the public one only when asked for, and behind the Host/Origin
//! checks on both. Every test bounds its waits and stops its server.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_server::auth::Authenticator;
use palisade_server::secret::ServerSecret;
use palisade_server::{App, CallToolResult, Outcome, Server, ServerConfig, ToolDef};
use palisade_store::{AuditStore, Decision, SqliteStore};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ---- A server on loopback -----------------------------------------------------------------------

/// `echo` answers at once; `slow` takes 2.5 s.
fn app() -> App {
    App::builder("transport-test", "0")
        .tool(ToolDef::new("echo").handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("echo"))) }))
        .tool(ToolDef::new("slow").handler(|_, _| async {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            Ok(Outcome::Complete(CallToolResult::text("slow")))
        }))
        .build()
        .unwrap()
}

struct Running {
    port: u16,
    server: Arc<Server>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<Result<(), palisade_server::http::ServeError>>>,
}

impl Running {
    /// Shuts the server down and waits (bounded) for `serve` to return.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = self.served.take().unwrap();
        tokio::time::timeout(Duration::from_secs(40), served).await.unwrap().unwrap().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(served) = &self.served {
            served.abort();
        }
    }
}

async fn start(config: ServerConfig, audit: Option<Arc<SqliteStore>>) -> Running {
    start_with(config, audit, palisade_server::http::ServeOptions::default()).await
}

/// [`start`], served with `options` (`serve_with`).
async fn start_with(
    config: ServerConfig,
    audit: Option<Arc<SqliteStore>>,
    options: palisade_server::http::ServeOptions,
) -> Running {
    let mut builder =
        Server::builder(app(), config, Authenticator::UnauthenticatedLoopback, ServerSecret::random()).without_audit();
    if let Some(store) = audit {
        builder = builder.audit(store);
    }
    let server = Arc::new(builder.build().unwrap());
    let listener = palisade_server::http::bind(&server, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(palisade_server::http::serve_with(server.clone(), listener, options, async move {
        let _ = stopped.await;
    }));
    Running { port, server, stop: Some(stop), served: Some(served) }
}

fn config() -> ServerConfig {
    ServerConfig {
        header_read_timeout: Duration::from_secs(30),
        body_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        ..ServerConfig::default()
    }
}

// ---- Raw HTTP/1.1 -------------------------------------------------------------------------------

fn call_body(tool: &str) -> String {
    json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": { "name": tool, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {} } } })
    .to_string()
}

/// A complete `tools/call` of `tool`, with `target` as the request target, `host` as the Host
/// header and `extra` header lines.
fn call_with(target: &str, host: &str, tool: &str, extra: &str) -> String {
    let body = call_body(tool);
    format!(
        "POST {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Type: application/json\r\nAccept: application/json\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn call(port: u16, tool: &str) -> String {
    call_with("/mcp", &format!("127.0.0.1:{port}"), tool, "")
}

async fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).await.unwrap()
}

#[derive(Debug)]
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// Reads one response (a `Content-Length` body), or `None` if none arrives within `wait`.
async fn read_response(socket: &mut TcpStream, wait: Duration) -> Option<RawResponse> {
    tokio::time::timeout(wait, async {
        let mut received = Vec::new();
        let head_end = loop {
            if let Some(at) = received.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            let mut buffer = [0u8; 4096];
            let read = socket.read(&mut buffer).await.ok()?;
            if read == 0 {
                return None;
            }
            received.extend_from_slice(&buffer[..read]);
        };
        let head = String::from_utf8_lossy(&received[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
            .collect();
        let length: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map_or(0, |(_, v)| v.parse().unwrap());
        let mut body = received[head_end + 4..].to_vec();
        while body.len() < length {
            let mut buffer = [0u8; 4096];
            let read = socket.read(&mut buffer).await.ok()?;
            if read == 0 {
                return None;
            }
            body.extend_from_slice(&buffer[..read]);
        }
        Some(RawResponse { status, headers, body })
    })
    .await
    .ok()
    .flatten()
}

/// Sends `request` on a fresh connection and reads the response.
async fn exchange(port: u16, request: &str) -> RawResponse {
    let mut socket = connect(port).await;
    socket.write_all(request.as_bytes()).await.unwrap();
    read_response(&mut socket, Duration::from_secs(5)).await.expect("a response")
}

/// How long after `since` the server closed `socket` (reads return end-of-file or an error), or
/// `None` if it is still open after `wait`. Anything the server sends first is skipped.
async fn closed_after(socket: &mut TcpStream, since: Instant, wait: Duration) -> Option<Duration> {
    tokio::time::timeout(wait, async {
        let mut buffer = [0u8; 4096];
        loop {
            match socket.read(&mut buffer).await {
                Ok(0) | Err(_) => return since.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// Writes `pieces` on `socket` one every `every` (stopping when a write fails) while reading
/// it; returns how long until the server closed the connection (at most 8 s) and what it sent.
async fn trickled_reading<P: AsRef<[u8]> + Send + 'static>(
    socket: TcpStream,
    pieces: impl Iterator<Item = P> + Send + 'static,
    every: Duration,
) -> (Duration, Vec<u8>) {
    let (mut reader, mut writer) = socket.into_split();
    let since = Instant::now();
    let writing = tokio::spawn(async move {
        for piece in pieces {
            if writer.write_all(piece.as_ref()).await.is_err() {
                return;
            }
            tokio::time::sleep(every).await;
        }
        // Keep the write half open: the server must close on its own.
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(8), async {
        let mut buffer = [0u8; 4096];
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    writing.abort();
    read.expect("the server closed the connection within 8 s");
    (since.elapsed(), received)
}

/// [`trickled_reading`], when only the time matters.
async fn trickled<P: AsRef<[u8]> + Send + 'static>(
    socket: TcpStream,
    pieces: impl Iterator<Item = P> + Send + 'static,
    every: Duration,
) -> Duration {
    trickled_reading(socket, pieces, every).await.0
}

// ---- A. Slow and idle clients -------------------------------------------------------------------

#[tokio::test]
async fn a_stalled_request_head_is_cut_off_after_the_header_timeout() {
    let running = start(ServerConfig { header_read_timeout: Duration::from_secs(1), ..config() }, None).await;
    let port = running.port;
    // Half a header section; one byte (before hyper knows whether it is HTTP/1.1 or HTTP/2);
    // the HTTP/2 preface without a request; nothing at all.
    let partial = format!("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: app");
    let cases: [(&str, &[u8]); 4] = [
        ("partial header", partial.as_bytes()),
        ("one byte", b"P"),
        ("HTTP/2 preface only", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        ("nothing", b""),
    ];
    let checks = cases.into_iter().map(|(case, sent)| async move {
        let mut socket = connect(port).await;
        let since = Instant::now();
        socket.write_all(sent).await.unwrap();
        let closed = closed_after(&mut socket, since, Duration::from_secs(6)).await;
        let closed = closed.unwrap_or_else(|| panic!("{case}: still open 6 s later"));
        assert!(closed >= Duration::from_millis(900), "{case}: closed too early ({closed:?})");
    });
    futures::future::join_all(checks).await;
    // One header line every 400 ms, each within the timeout, does not reset it.
    let lines = ["POST /mcp HTTP/1.1\r\n", "Host: x\r\n"].into_iter().chain(std::iter::repeat_n("X-A: 1\r\n", 10));
    let closed = trickled(connect(port).await, lines.map(str::as_bytes), Duration::from_millis(400)).await;
    assert!(closed < Duration::from_millis(2500), "cut off after the header timeout, not per line ({closed:?})");
    // Each head begun and not finished is a refusal; the silent connection is not.
    let metrics = running.server.metrics().render();
    assert!(metrics.contains("palisade_transport_refusals_total{reason=\"header_timeout\"} 4"), "{metrics}");
    running.stop().await;
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_answered_408_and_the_connection_closed() {
    let running = start(ServerConfig { body_read_timeout: Duration::from_secs(1), ..config() }, None).await;
    let port = running.port;
    let head = |framing: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json\r\n{framing}\r\n"
        )
    };
    // A body announced at 200 bytes of which 20 arrive.
    let mut socket = connect(port).await;
    let since = Instant::now();
    socket.write_all(head("Content-Length: 200\r\n").as_bytes()).await.unwrap();
    socket.write_all(&[b' '; 20]).await.unwrap();
    let response = read_response(&mut socket, Duration::from_secs(5)).await.expect("a 408");
    let answered = since.elapsed();
    assert_eq!(response.status, 408);
    assert!(answered >= Duration::from_millis(900) && answered < Duration::from_secs(4), "{answered:?}");
    assert_eq!(response.header("connection"), Some("close"));
    let frame = response.json();
    assert_eq!(frame["error"]["code"], -32600);
    assert_eq!(frame["error"]["message"], "invalid request: the request body did not arrive in time");
    assert!(closed_after(&mut socket, since, Duration::from_secs(2)).await.is_some(), "closed after the 408");

    // A chunked body at one byte per 300 ms.
    let chunks = std::iter::once(head("Transfer-Encoding: chunked\r\n").into_bytes())
        .chain(std::iter::repeat_n(b"1\r\n \r\n".to_vec(), 20));
    let (closed, received) = trickled_reading(connect(port).await, chunks, Duration::from_millis(300)).await;
    let text = String::from_utf8_lossy(&received);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.to_ascii_lowercase().contains("connection: close"), "{text}");
    assert!(closed < Duration::from_secs(3), "answered and closed after the body timeout ({closed:?})");
    running.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let running = start(ServerConfig { idle_timeout: Duration::from_secs(1), ..config() }, None).await;
    let port = running.port;
    let mut socket = connect(port).await;
    socket.write_all(call(port, "echo").as_bytes()).await.unwrap();
    let response = read_response(&mut socket, Duration::from_secs(5)).await.expect("a response");
    assert_eq!(response.status, 200);
    let since = Instant::now();
    let closed = closed_after(&mut socket, since, Duration::from_secs(6)).await.expect("closed when idle");
    assert!(closed >= Duration::from_millis(900) && closed < Duration::from_secs(4), "{closed:?}");

    // A request in flight is not idle: a 2.5 s call on the same kind of connection is answered.
    let mut socket = connect(port).await;
    socket.write_all(call(port, "slow").as_bytes()).await.unwrap();
    let response = read_response(&mut socket, Duration::from_secs(6)).await.expect("the slow call's answer");
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["result"]["content"][0]["text"], "slow");
    running.stop().await;
}

/// hyper starts its header read timer when an HTTP/1.1 connection goes idle after a response,
/// so an idle keep-alive connection is closed after the header read timeout too.
#[tokio::test]
async fn hypers_header_timeout_also_closes_an_idle_keep_alive_connection() {
    let running = start(ServerConfig { header_read_timeout: Duration::from_secs(1), ..config() }, None).await;
    let port = running.port;
    let mut socket = connect(port).await;
    for _ in 0..2 {
        socket.write_all(call(port, "echo").as_bytes()).await.unwrap();
        let response = read_response(&mut socket, Duration::from_secs(5)).await.expect("a response");
        assert_eq!(response.status, 200, "keep-alive: the connection serves a second request");
    }
    let since = Instant::now();
    let closed = closed_after(&mut socket, since, Duration::from_secs(6)).await.expect("closed by the header timer");
    assert!(closed >= Duration::from_millis(900) && closed < Duration::from_secs(4), "{closed:?}");
    // An idle close is not a refusal.
    assert!(
        running.server.metrics().render().contains("palisade_transport_refusals_total{reason=\"header_timeout\"} 0")
    );
    running.stop().await;
}

/// Log lines captured for one test (the current-thread runtime runs every task on this thread).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn at_the_connection_cap_a_further_connection_waits_until_one_closes() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let running = start(ServerConfig { max_connections: 2, ..config() }, None).await;
    let port = running.port;
    let mut first = connect(port).await;
    let mut second = connect(port).await;
    for socket in [&mut first, &mut second] {
        socket.write_all(call(port, "echo").as_bytes()).await.unwrap();
        assert_eq!(read_response(socket, Duration::from_secs(5)).await.expect("served").status, 200);
    }
    // The third (and fourth) connection is accepted by the kernel but not served.
    let mut third = connect(port).await;
    third.write_all(call(port, "echo").as_bytes()).await.unwrap();
    let mut fourth = connect(port).await;
    fourth.write_all(call(port, "echo").as_bytes()).await.unwrap();
    assert!(read_response(&mut third, Duration::from_millis(800)).await.is_none(), "not served at the cap");
    // One of the first two closes: the third is served.
    drop(first);
    let response = read_response(&mut third, Duration::from_secs(5)).await.expect("served once one closed");
    assert_eq!(response.status, 200);
    assert!(read_response(&mut fourth, Duration::from_millis(500)).await.is_none(), "still at the cap");
    drop(second);
    assert_eq!(read_response(&mut fourth, Duration::from_secs(5)).await.expect("served").status, 200);
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert_eq!(
        text.matches("connection limit reached (2): not accepting until one closes").count(),
        1,
        "one warning per saturation episode: {text}"
    );
    running.stop().await;
}

// ---- B. Host and Origin -------------------------------------------------------------------------

#[tokio::test]
async fn a_repeated_host_or_origin_is_refused() {
    let running = start(config(), None).await;
    let port = running.port;
    let host = format!("127.0.0.1:{port}");
    let origin = format!("Origin: http://{host}\r\n");
    assert_eq!(exchange(port, &call_with("/mcp", &host, "echo", &origin)).await.status, 200, "one allowed Origin");
    let cases = [
        ("two Hosts", call_with("/mcp", &host, "echo", &format!("Host: {host}\r\n")), "more than one Host header"),
        (
            "two Origins",
            call_with("/mcp", &host, "echo", &format!("{origin}Origin: http://evil.example\r\n")),
            "more than one Origin header",
        ),
        (
            "two equal Origins",
            call_with("/mcp", &host, "echo", &format!("{origin}{origin}")),
            "more than one Origin header",
        ),
    ];
    for (case, request, message) in cases {
        let response = exchange(port, &request).await;
        assert_eq!(response.status, 403, "{case}");
        assert_eq!(response.json()["error"]["message"], format!("invalid request: {message}"), "{case}");
    }
    running.stop().await;
}

#[tokio::test]
async fn an_absolute_form_target_must_name_the_allowed_host() {
    let running = start(config(), None).await;
    let port = running.port;
    let host = format!("127.0.0.1:{port}");
    let ok = exchange(port, &call_with(&format!("http://{host}/mcp"), &host, "echo", "")).await;
    assert_eq!(ok.status, 200, "the target names the Host");
    let upper =
        exchange(port, &call_with(&format!("http://LOCALHOST:{port}/mcp"), &format!("localhost:{port}"), "echo", ""))
            .await;
    assert_eq!(upper.status, 200, "compared case-insensitively");
    for (case, target) in [
        ("a foreign authority", "http://evil.example/mcp".to_owned()),
        ("a foreign authority with our port", format!("http://evil.example:{port}/mcp")),
        ("another allowed name than Host", format!("http://localhost:{port}/mcp")),
        ("user information", format!("http://user@{host}/mcp")),
    ] {
        let response = exchange(port, &call_with(&target, &host, "echo", "")).await;
        assert_eq!(response.status, 403, "{case}: {target}");
        assert_eq!(response.json()["error"]["message"], "invalid request: Host is not allowed", "{case}");
    }
    running.stop().await;
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_served_and_its_authority_checked() {
    let running = start(config(), None).await;
    let port = running.port;
    let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = reqwest::Client::builder().http2_prior_knowledge().resolve("evil.example", address).build().unwrap();
    let post = |url: String| {
        client
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "echo")
            .body(call_body("echo"))
            .send()
    };
    let ok = post(format!("http://127.0.0.1:{port}/mcp")).await.unwrap();
    assert_eq!(ok.version(), reqwest::Version::HTTP_2);
    assert_eq!(ok.status(), 200);
    let evil = post(format!("http://evil.example:{port}/mcp")).await.unwrap();
    assert_eq!(evil.status(), 403, ":authority is checked like Host");
    running.stop().await;
}

// ---- C. Content-Type ----------------------------------------------------------------------------

#[tokio::test]
async fn only_an_application_json_body_is_accepted() {
    let running = start(config(), None).await;
    let port = running.port;
    let host = format!("127.0.0.1:{port}");
    let with_type = |content_type: Option<&str>| {
        let request = call_with("/mcp", &host, "echo", "");
        let request = request.replace("Content-Type: application/json\r\n", "");
        match content_type {
            Some(value) => request.replacen("\r\n", &format!("\r\nContent-Type: {value}\r\n"), 1),
            None => request,
        }
    };
    for (content_type, expected) in [
        (Some("application/json"), 200),
        (Some("APPLICATION/JSON; charset=UTF-8"), 200),
        (Some("application/json;charset=\"utf-8\""), 200),
        (None, 415),
        (Some("application/json-seq"), 415),
        (Some("application/jsonx"), 415),
        (Some("text/json"), 415),
        (Some("text/plain"), 415),
        (Some("application/json; charset=utf-16"), 415),
        (Some("application/json\r\nContent-Type: application/json"), 415),
    ] {
        let response = exchange(port, &with_type(content_type)).await;
        assert_eq!(response.status, expected, "{content_type:?}");
        if expected == 415 {
            assert_eq!(response.json()["error"]["message"], "invalid request: Content-Type must be application/json");
        }
    }
    running.stop().await;
}

// ---- D. Transport refusals on the audit record --------------------------------------------------

/// The transport records of `store`: (operation, code, detail), in the log's order.
async fn transport_records(store: &SqliteStore) -> Vec<(String, Option<i64>, String)> {
    let recent = store.recent(500).await.unwrap();
    let mut records: Vec<_> = recent
        .into_iter()
        .filter(|stored| stored.record.stage == "transport")
        .map(|stored| {
            assert_eq!(stored.record.decision, Decision::Deny);
            assert!(stored.record.principal_digest.is_none());
            (stored.record.operation, stored.record.code, stored.record.detail.unwrap_or_default())
        })
        .collect();
    records.sort();
    records
}

/// Sends one refused request of each kind below from 127.0.0.1 (some more than once).
async fn send_refused(port: u16) {
    let host = format!("127.0.0.1:{port}");
    let body = call_body("echo");
    let post = |extra: &str, target: &str, content_type: &str, body: &str| {
        format!(
            "POST {target} HTTP/1.1\r\nHost: {host}\r\n{extra}{content_type}Accept: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let json = "Content-Type: application/json\r\n";
    let requests = [
        (post("Host: evil.example\r\n", "/mcp", json, &body), 403),
        (post("", "http://evil.example/mcp", json, &body), 403),
        (post("", "http://evil.example/mcp", json, &body), 403),
        (post("Origin: http://evil.example\r\n", "/mcp", json, &body), 403),
        (format!("GET /mcp HTTP/1.1\r\nHost: {host}\r\n\r\n"), 405),
        (post("", "/mcp", "", &body), 415),
        (post("", "/mcp", "Content-Type: application/json-seq\r\n", &body), 415),
        (post("", "/mcp", json, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}]"), 400),
        (post("", "/mcp", json, "{\"jsonrpc\":"), 400),
        (post("", "/mcp?access_token=secret", json, &body), 400),
    ];
    for (request, status) in requests {
        assert_eq!(exchange(port, &request).await.status, status, "{request}");
    }
}

fn expected_records(source: &str) -> Vec<(String, Option<i64>, String)> {
    let mut expected: Vec<_> = [
        ("host", 403, 3),
        ("origin", 403, 1),
        ("method", 405, 1),
        ("content_type", 415, 2),
        ("batch", 400, 1),
        ("parse", 400, 1),
        ("token_in_url", 400, 1),
    ]
    .into_iter()
    .map(|(reason, code, count)| (reason.to_owned(), Some(code), format!("source={source} count={count}")))
    .collect();
    expected.sort();
    expected
}

#[tokio::test]
async fn transport_refusals_are_audited_once_per_interval_per_reason_and_source() {
    let store = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let config = ServerConfig { transport_refusal_interval: Duration::from_millis(1500), ..config() };
    let running = start(config, Some(store.clone())).await;
    send_refused(running.port).await;
    // Nothing before the interval has passed; then one record per reason.
    assert!(transport_records(&store).await.is_empty(), "aggregated, not written per request");
    let deadline = Instant::now() + Duration::from_secs(6);
    while transport_records(&store).await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let source = running.server.digest("127.0.0.1")[..16].to_owned();
    let records = transport_records(&store).await;
    assert_eq!(records, expected_records(&source));
    assert!(records.iter().all(|(_, _, detail)| !detail.contains("127.0.0.1")), "a digest, never the address");
    // The counts were emptied: the next interval writes nothing new.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert_eq!(transport_records(&store).await.len(), records.len());
    let metrics = running.server.metrics().render();
    assert!(metrics.contains("palisade_transport_refusals_total{reason=\"host\"} 3"), "{metrics}");
    running.stop().await;
    assert!(store.verify_chain().await.unwrap().is_intact());
}

#[tokio::test]
async fn pending_transport_refusals_are_written_at_shutdown() {
    let store = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let config = ServerConfig { transport_refusal_interval: Duration::from_secs(3600), ..config() };
    let running = start(config, Some(store.clone())).await;
    let source = running.server.digest("127.0.0.1")[..16].to_owned();
    send_refused(running.port).await;
    running.stop().await;
    assert_eq!(transport_records(&store).await, expected_records(&source));
    assert!(store.verify_chain().await.unwrap().is_intact());
}

/// An embedder serving `router()` without connect info: refusals count under `unknown`.
#[tokio::test]
async fn refusals_without_a_peer_address_count_as_unknown() {
    use tower::ServiceExt as _;
    let store = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
    let config = ServerConfig { transport_refusal_interval: Duration::from_millis(200), ..config() };
    let server = Arc::new(
        Server::builder(app(), config, Authenticator::UnauthenticatedLoopback, ServerSecret::random())
            .audit(store.clone())
            .build()
            .unwrap(),
    );
    let router = palisade_server::http::router(server.clone(), "127.0.0.1:4000".parse().unwrap());
    for _ in 0..2 {
        let request = axum::http::Request::builder()
            .method("POST")
            .uri("/mcp")
            .header("host", "evil.example")
            .body(axum::body::Body::from(call_body("echo")))
            .unwrap();
        assert_eq!(router.clone().oneshot(request).await.unwrap().status(), 403);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while transport_records(&store).await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(transport_records(&store).await, [("host".to_owned(), Some(403), "source=unknown count=2".to_owned())]);
    server.shutdown_token().cancel();
}

// ---- E. One error map: every refusal as the catalogue has it -------------------------------------

/// Every refusal the transport answers with a JSON-RPC error, over a real socket: its HTTP status,
/// code and message are exactly the catalogue's entry for it (`ProtocolError::{http_status,
/// to_wire}`), so no call site chooses a status of its own.
#[tokio::test]
async fn every_transport_refusal_is_answered_as_the_error_catalogue_says() {
    use palisade_server::ProtocolError;
    let config = ServerConfig { body_read_timeout: Duration::from_secs(1), max_body_bytes: 4096, ..config() };
    let running = start(config, None).await;
    let port = running.port;
    let host = format!("127.0.0.1:{port}");
    let body = call_body("echo");
    let post = |extra: &str, target: &str, content_type: &str, accept: &str, body: &str| {
        format!(
            "POST {target} HTTP/1.1\r\nHost: {host}\r\n{extra}{content_type}{accept}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let (json, accept) = ("Content-Type: application/json\r\n", "Accept: application/json\r\n");
    let many_headers: String = (0..80).map(|i| format!("X-Filler-{i}: 1\r\n")).collect();
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(5000)
    );
    let cases = [
        (post(&format!("Host: {host}\r\n"), "/mcp", json, accept, &body), ProtocolError::RepeatedHost),
        (post("", "http://evil.example/mcp", json, accept, &body), ProtocolError::HostNotAllowed),
        (
            post(&format!("Origin: http://{host}\r\nOrigin: http://{host}\r\n"), "/mcp", json, accept, &body),
            ProtocolError::RepeatedOrigin,
        ),
        (post("Origin: http://evil.example\r\n", "/mcp", json, accept, &body), ProtocolError::OriginNotAllowed),
        (post(&many_headers, "/mcp", json, accept, &body), ProtocolError::HeadersTooLarge),
        (post("", "/mcp?access_token=secret", json, accept, &body), ProtocolError::TokenInUrl),
        (post("", "/mcp", json, "Accept: text/html\r\n", &body), ProtocolError::NotAcceptable),
        (post("", "/mcp", "Content-Type: text/plain\r\n", accept, &body), ProtocolError::UnsupportedMediaType),
        (post("", "/mcp", json, accept, &big), ProtocolError::PayloadTooLarge),
        (post("", "/mcp", json, accept, "{\"jsonrpc\":"), ProtocolError::Parse),
        (post("", "/mcp", json, accept, "[]"), ProtocolError::InvalidRequest("batches are not supported")),
    ];
    for (request, error) in cases {
        let response = exchange(port, &request).await;
        assert_eq!(response.status, error.http_status(), "{error:?}");
        assert_eq!(response.json()["error"], error.to_wire(), "{error:?}");
        assert_eq!(response.header("content-type"), Some("application/json"), "{error:?}");
    }
    // A body that does not arrive in time (the announced length is never reached).
    let mut socket = connect(port).await;
    let head = post("", "/mcp", json, accept, "").replace("Content-Length: 0", "Content-Length: 100");
    socket.write_all(head.as_bytes()).await.unwrap();
    let response = read_response(&mut socket, Duration::from_secs(5)).await.expect("a 408");
    assert_eq!(response.status, ProtocolError::BodyTimeout.http_status());
    assert_eq!(response.json()["error"], ProtocolError::BodyTimeout.to_wire());
    // The statuses are the ones sent before the catalogue held them, and each message is fixed.
    let statuses: Vec<u16> = [
        ProtocolError::RepeatedHost,
        ProtocolError::HostNotAllowed,
        ProtocolError::RepeatedOrigin,
        ProtocolError::OriginNotAllowed,
        ProtocolError::HeadersTooLarge,
        ProtocolError::TokenInUrl,
        ProtocolError::NotAcceptable,
        ProtocolError::UnsupportedMediaType,
        ProtocolError::PayloadTooLarge,
        ProtocolError::BodyTimeout,
    ]
    .iter()
    .map(ProtocolError::http_status)
    .collect();
    assert_eq!(statuses, [403, 403, 403, 403, 431, 400, 406, 415, 413, 408]);
    running.stop().await;
}

// ---- F. /metrics where the operator puts it ------------------------------------------------------

/// A GET of `path` with `host` as its Host header and `extra` header lines.
fn get(path: &str, host: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n")
}

#[tokio::test]
async fn metrics_are_served_on_the_private_listener_and_not_on_the_public_one() {
    use palisade_server::http::{MetricsExposure, ServeOptions};
    let options = ServeOptions::bind_metrics(Some("127.0.0.1:0".parse().unwrap())).await.unwrap();
    let MetricsExposure::Listener(listener) = &options.metrics else { panic!("a metrics listener") };
    let private = listener.local_addr().unwrap().port();
    let running = start_with(config(), None, options).await;
    let public = running.port;
    assert_eq!(exchange(public, &call(public, "echo")).await.status, 200);

    let scraped = exchange(private, &get("/metrics", &format!("127.0.0.1:{private}"), "")).await;
    assert_eq!(scraped.status, 200);
    assert_eq!(scraped.header("content-type"), Some("text/plain; version=0.0.4"));
    let text = String::from_utf8(scraped.body).unwrap();
    assert!(text.contains("palisade_requests_total{outcome=\"ok\"} 1"), "{text}");
    // A scraper addressing the instance by its IP passes; a rebinding page's name does not.
    let by_ip = exchange(private, &get("/metrics", &format!("10.0.0.7:{private}"), "")).await;
    assert_eq!(by_ip.status, 200, "an IP-literal Host");
    let rebinding = exchange(private, &get("/metrics", &format!("evil.example:{private}"), "")).await;
    assert_eq!(rebinding.status, 403);
    assert_eq!(rebinding.json()["error"], palisade_server::ProtocolError::HostNotAllowed.to_wire());
    let cross_origin =
        exchange(private, &get("/metrics", &format!("127.0.0.1:{private}"), "Origin: http://evil.example\r\n")).await;
    assert_eq!(cross_origin.status, 403);
    // The private listener answers health, and nothing of MCP.
    assert_eq!(exchange(private, &get("/healthz", &format!("127.0.0.1:{private}"), "")).await.status, 200);
    assert_eq!(exchange(private, &get("/readyz", &format!("127.0.0.1:{private}"), "")).await.status, 200);
    assert_eq!(exchange(private, &call_with("/mcp", &format!("127.0.0.1:{private}"), "echo", "")).await.status, 404);

    // The public listener: health yes, /metrics no.
    assert_eq!(exchange(public, &get("/metrics", &format!("127.0.0.1:{public}"), "")).await.status, 404);
    assert_eq!(exchange(public, &get("/healthz", &format!("127.0.0.1:{public}"), "")).await.status, 200);
    // The refusals on the private listener were counted like any other.
    let metrics = running.server.metrics().render();
    assert!(metrics.contains("palisade_transport_refusals_total{reason=\"host\"} 1"), "{metrics}");
    assert!(metrics.contains("palisade_transport_refusals_total{reason=\"origin\"} 1"), "{metrics}");
    running.stop().await;
    assert!(TcpStream::connect(("127.0.0.1", private)).await.is_err(), "the metrics listener closed at shutdown");
}

#[tokio::test]
async fn metrics_are_on_the_public_listener_only_when_asked_for_and_behind_its_checks() {
    use palisade_server::http::{MetricsExposure, ServeOptions};
    let default = start(config(), None).await;
    let port = default.port;
    assert_eq!(exchange(port, &get("/metrics", &format!("127.0.0.1:{port}"), "")).await.status, 404, "off by default");
    default.stop().await;

    let options = ServeOptions { metrics: MetricsExposure::Public };
    let running = start_with(config(), None, options).await;
    let port = running.port;
    let scraped = exchange(port, &get("/metrics", &format!("127.0.0.1:{port}"), "")).await;
    assert_eq!(scraped.status, 200);
    assert!(String::from_utf8_lossy(&scraped.body).contains("# TYPE palisade_requests_total counter"));
    // The public listener's allow-list holds: no IP-literal exception there.
    let foreign = exchange(port, &get("/metrics", &format!("10.0.0.7:{port}"), "")).await;
    assert_eq!(foreign.status, 403);
    assert_eq!(foreign.json()["error"], palisade_server::ProtocolError::HostNotAllowed.to_wire());
    // Health answers whatever Host a probe sends.
    assert_eq!(exchange(port, &get("/healthz", &format!("10.0.0.7:{port}"), "")).await.status, 200);
    running.stop().await;
}
