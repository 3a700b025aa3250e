//! Boots the real binary and speaks MCP 2026-07-28 to it over HTTP like a client would.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::schema;

/// A running `palisade serve` process, killed on drop, with its own data directory.
pub struct Palisade {
    child: Child,
    pub url: String,
    pub port: u16,
    pub data_dir: TempDir,
}

/// A directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("palisade-it-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).expect("temp dir");
        Self(path)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Palisade {
    /// Starts `palisade serve --app conformance --listen 127.0.0.1:0` plus `extra` flags.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_app("conformance", extra)
    }

    /// Starts `palisade serve --app APP` on `127.0.0.1:0` with a fresh data directory.
    pub fn start_app(app: &str, extra: &[&str]) -> Self {
        Self::start_app_env(app, extra, &[])
    }

    /// [`start_app`](Self::start_app) with extra environment variables.
    pub fn start_app_env(app: &str, extra: &[&str], envs: &[(&str, &str)]) -> Self {
        let data_dir = TempDir::new();
        let dir = data_dir.path().to_owned();
        let mut args = vec!["serve", "--app", app, "--listen", "127.0.0.1:0", "--data-dir", &dir];
        args.extend(extra);
        Self::spawn(&args, envs, data_dir)
    }

    /// Runs `palisade ARGS` (a `serve` command line) and waits for its listening line;
    /// `data_dir` is the one its configuration names, removed with it.
    pub fn spawn(args: &[&str], envs: &[(&str, &str)], data_dir: TempDir) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(args)
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start palisade");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read the listening line");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        let port = url.trim_start_matches("http://127.0.0.1:").trim_end_matches("/mcp").parse().expect("port");
        Self { child, url, port, data_dir }
    }

    /// Sends the signal `name` (`HUP`, …) to the process.
    pub fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args([format!("-{name}").as_str(), &pid]).status().expect("kill");
        assert!(status.success(), "kill -{name} {pid}");
    }

    /// Whether the process is still running (it has not exited or crashed).
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    /// Kills the process with SIGKILL (no shutdown of any kind) and hands back its data
    /// directory, kept for a restart.
    pub fn kill_keeping_data(mut self) -> TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::replace(&mut self.data_dir, TempDir(std::path::PathBuf::new()))
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
        for _ in 0..100 {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("server did not exit after SIGTERM");
    }
}

impl Drop for Palisade {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `_meta` every 2026-07-28 request carries.
pub fn meta(capabilities: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": { "name": "palisade-it", "version": "0" }
    })
}

/// One HTTP exchange: status, content type and every JSON-RPC frame of the body.
#[derive(Debug)]
pub struct Exchange {
    pub status: u16,
    pub content_type: String,
    pub frames: Vec<Value>,
}

impl Exchange {
    /// The final frame (the response).
    pub fn response(&self) -> &Value {
        self.frames.last().expect("at least one frame")
    }

    pub fn result(&self) -> &Value {
        let response = self.response();
        assert!(response.get("error").is_none(), "unexpected error: {response}");
        &response["result"]
    }

    pub fn error_code(&self) -> i64 {
        self.response()["error"]["code"].as_i64().unwrap_or_else(|| panic!("not an error: {}", self.response()))
    }

    pub fn notifications(&self) -> Vec<&Value> {
        self.frames.iter().filter(|f| f.get("method").is_some()).collect()
    }
}

/// An HTTP client for one server.
pub struct Client {
    pub http: reqwest::Client,
    pub url: String,
    pub port: u16,
}

impl Client {
    pub fn new(server: &Palisade) -> Self {
        Self { http: reqwest::Client::new(), url: server.url.clone(), port: server.port }
    }

    /// A POST with the standard 2026-07-28 headers for `method` (and `Mcp-Name` from `params`).
    pub fn post(&self, method: &str, params: &Value) -> reqwest::RequestBuilder {
        let mut builder = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method);
        let name = match method {
            "tools/call" | "prompts/get" => params.get("name"),
            "resources/read" => params.get("uri"),
            "tasks/get" | "tasks/update" | "tasks/cancel" => params.get("taskId"),
            _ => None,
        };
        if let Some(name) = name.and_then(Value::as_str) {
            builder = builder.header("mcp-name", palisade_wire::header::encode_value(name));
        }
        builder
    }

    /// A well-formed request; `_meta` is added unless `params` has one. Every frame of the
    /// answer is schema-validated.
    pub async fn call(&self, id: Value, method: &str, params: Value) -> Exchange {
        let params = with_meta(params, json!({}));
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let exchange = send(self.post(method, &params).body(body.to_string())).await;
        for frame in &exchange.frames {
            if frame.get("method").is_some() {
                schema::check_notification(frame);
            } else {
                schema::check_response(method, frame);
                assert_eq!(frame["id"], id, "the id must be echoed with its type");
            }
        }
        exchange
    }

    pub async fn request(&self, method: &str, params: Value) -> Exchange {
        self.call(json!(1), method, params).await
    }
}

/// Adds `_meta` with `capabilities` unless present.
pub fn with_meta(params: Value, capabilities: Value) -> Value {
    let mut params: Map<String, Value> = params.as_object().cloned().unwrap_or_default();
    params.entry("_meta").or_insert_with(|| meta(capabilities));
    Value::Object(params)
}

/// Sends a request and reads the whole body (JSON or SSE).
pub async fn send(builder: reqwest::RequestBuilder) -> Exchange {
    let response = builder.send().await.expect("request sent");
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let text = response.text().await.expect("body");
    Exchange { status, frames: parse_body(&content_type, &text), content_type }
}

pub fn parse_body(content_type: &str, text: &str) -> Vec<Value> {
    if content_type.starts_with("text/event-stream") {
        text.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|data| serde_json::from_str(data.trim()).expect("SSE data is one JSON message"))
            .collect()
    } else if text.is_empty() {
        Vec::new()
    } else {
        vec![serde_json::from_str(text).unwrap_or_else(|_| panic!("JSON body expected, got {text:?}"))]
    }
}

/// An open SSE response read frame by frame (listen streams).
pub struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    pub async fn open(builder: reqwest::RequestBuilder) -> Self {
        let response = builder.send().await.expect("request sent");
        assert_eq!(response.status(), 200);
        assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        Self { response, buffer: String::new() }
    }

    /// The next frame, or `None` at the end of the stream or after `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) {
                    return Some(serde_json::from_str(data.trim()).expect("one JSON message per event"));
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk()).await.ok()?.ok()??;
            self.buffer.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    }
}

/// A 2026-07-28 `tools/call` of `tool` on `server` with a bearer token and the routing headers.
pub fn tool_call(server: &Palisade, token: &str, tool: &str, arguments: Value) -> reqwest::RequestBuilder {
    let params = with_meta(json!({ "name": tool, "arguments": arguments }), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
    reqwest::Client::new()
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .header("authorization", format!("Bearer {token}"))
        .body(body.to_string())
}

/// `tools/call` of a needs-confirmation tool as a client that confirms: the call declares
/// elicitation, gets the confirmation question, and is sent again with the sealed state and an
/// accept. Returns the question's text and the final answer.
pub async fn confirmed_tool_call(server: &Palisade, token: &str, tool: &str, arguments: Value) -> (String, Exchange) {
    let call = |extra: Value| {
        let mut params = with_meta(json!({ "name": tool, "arguments": arguments }), json!({ "elicitation": {} }));
        params.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap());
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
        tool_call(server, token, tool, json!({})).body(body.to_string())
    };
    let asked = send(call(json!({}))).await;
    assert_eq!(asked.result()["resultType"], "input_required", "{:?}", asked.response());
    let question =
        asked.result()["inputRequests"]["palisade.confirm"]["params"]["message"].as_str().unwrap().to_owned();
    let state = asked.result()["requestState"].clone();
    let accept = json!({ "palisade.confirm": { "action": "accept", "content": { "confirm": true } } });
    (question, send(call(json!({ "requestState": state, "inputResponses": accept }))).await)
}

/// A token from the demo's dev issuer for `server` (its data directory, listening on
/// `127.0.0.1:0`, as every test server does).
pub fn dev_token(server: &Palisade, subject: &str, tenant: &str, client: &str, scope: &str) -> String {
    dev_token_with_groups(server, subject, tenant, client, scope, &[])
}

/// [`dev_token`] with a `groups` claim naming `groups`.
pub fn dev_token_with_groups(
    server: &Palisade,
    subject: &str,
    tenant: &str,
    client: &str,
    scope: &str,
    groups: &[&str],
) -> String {
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let mut args = vec!["dev", "token", "--subject", subject, "--tenant", tenant, "--client", client, "--scope", scope];
    for group in groups {
        args.extend(["--group", group]);
    }
    let output = Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).envs(env).output().expect("run palisade");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// A 2025-era POST of `body` for `session` (none for `initialize`).
pub fn legacy_post(server: &Palisade, token: &str, session: Option<&str>, body: Value) -> reqwest::RequestBuilder {
    let mut request = reqwest::Client::new()
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {token}"))
        .body(body.to_string());
    if let Some(session) = session {
        request = request.header("mcp-session-id", session).header("mcp-protocol-version", "2025-11-25");
    }
    request
}

/// A 2025-era GET stream of `session`.
pub fn legacy_get(server: &Palisade, token: &str, session: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .get(&server.url)
        .header("accept", "text/event-stream")
        .header("authorization", format!("Bearer {token}"))
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
}

/// A 2025-era `initialize` (2025-11-25): the new session's id.
pub async fn initialize(server: &Palisade, token: &str) -> String {
    let body = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "it", "version": "0" } } });
    let response = legacy_post(server, token, None, body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.headers()["mcp-session-id"].to_str().unwrap().to_owned()
}
