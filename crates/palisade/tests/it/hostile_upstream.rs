//! A hostile MCP upstream for the gateway's boundary tests: an HTTP server on `127.0.0.1:0`,
//! on its own thread and runtime, that speaks 2026-07-28 statelessly (or, in legacy mode, only
//! the 2025-11-25 session wire), records every request it receives (headers, method, session
//! id, body), and misbehaves per tool: `garbage`, `huge`, `bad_output`, `endless_sse`, `slow`,
//! `wrong_id`, `flood` (2,000 `sampling/createMessage` requests on the answer's event stream
//! before the answer), `disabled` (refuses as a kill switch does, -32030, with the HTTP status its
//! `status` argument names), `ask` (one `elicitation/create` on its answer's event stream, then
//! the answer it got as its result's text), `ask_many` ([`ASK_MANY`] of them, one after the
//! other); `echo` and `late` answer normally. It counts the connections it accepts, holds every
//! answer to a request of its own open, unanswered (so each one in flight keeps its connection),
//! except an answer to one of its questions, and counts the question streams the gateway closed
//! before they were answered and the errors its questions were answered with. Stopping it drops every connection at once.
//! Also [`Closer`], a listener that accepts connections and closes them unanswered, counting
//! them.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

/// Which wire the upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// 2026-07-28: `server/discover`, no sessions.
    Modern,
    /// 2025-11-25 only: `initialize`, `Mcp-Session-Id`, 404 for an unknown session.
    Legacy,
}

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The JSON-RPC method (empty for a GET or DELETE, or a body that is not JSON-RPC).
    pub method: String,
    /// Every header, names lower-case, in the order received.
    pub headers: Vec<(String, String)>,
    /// The `Mcp-Session-Id` it carried.
    pub session: Option<String>,
    /// The JSON body (`Null` when there was none).
    pub body: Value,
}

impl Recorded {
    /// The tool a `tools/call` named.
    pub fn tool(&self) -> Option<&str> {
        self.body.pointer("/params/name").and_then(Value::as_str)
    }

    /// The header names, sorted and deduplicated.
    pub fn header_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.headers.iter().map(|(name, _)| name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// Every value of header `name`.
    pub fn header(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_str()).collect()
    }
}

struct State {
    wire: Wire,
    records: Mutex<Vec<Recorded>>,
    sessions: Mutex<HashSet<String>>,
    next_session: AtomicU64,
    /// Whether the 404 for an unknown session names the request's id (else `null`).
    not_found_names_id: std::sync::atomic::AtomicBool,
    /// The peer address of every connection accepted.
    peers: Mutex<HashSet<SocketAddr>>,
    /// Answers received to requests of this upstream's own (each held open).
    answers: AtomicU64,
    /// The questions (`ask`, `ask_many`) waiting for their answer, by request id.
    questions: Mutex<std::collections::HashMap<String, tokio::sync::oneshot::Sender<Value>>>,
    next_question: AtomicU64,
    /// Question streams closed by the gateway while a question waited.
    abandoned: AtomicU64,
    /// The JSON-RPC errors its questions were answered with.
    question_errors: Mutex<Vec<Value>>,
}

/// Questions the `ask_many` tool asks, one after the other.
pub const ASK_MANY: usize = 20;

/// Server-to-client requests the `flood` tool sends.
pub const FLOOD: usize = 2000;

/// A running upstream; stopped (every connection dropped) on [`HostileUpstream::stop`] or drop.
pub struct HostileUpstream {
    /// `http://127.0.0.1:<port>/mcp`.
    pub url: String,
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The tools every instance lists.
pub fn tool_definitions() -> Vec<Value> {
    let plain = |name: &str, description: &str| {
        json!({
            "name": name,
            "description": description,
            "inputSchema": {"type": "object", "properties": {"who": {"type": "string"}, "text": {"type": "string"}}},
        })
    };
    vec![
        plain("echo", "Echoes its arguments."),
        plain("late", "Echoes its arguments too; reviewed later than the others."),
        plain("garbage", "Answers a body that is not JSON."),
        plain("huge", "Answers a 50 MiB body."),
        json!({
            "name": "bad_output",
            "description": "Answers structured content that violates its output schema.",
            "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
        }),
        plain("endless_sse", "Opens an event stream that never carries the response."),
        plain("slow", "Answers after a minute."),
        plain("wrong_id", "Answers with an id it never received."),
        plain("flood", "Sends 2,000 sampling requests on its answer's event stream, then the answer."),
        plain("ask", "Asks its caller one elicitation question, then answers with the answer it got."),
        plain("ask_many", "Asks its caller 20 elicitation questions, one after the other."),
        json!({
            "name": "disabled",
            "description": "Refuses with -32030 operation disabled, in a response of the status it is given.",
            "inputSchema": {"type": "object", "properties": {"status": {"type": "integer"}}},
        }),
    ]
}

impl HostileUpstream {
    /// Starts an upstream speaking `wire` on a fresh port.
    pub fn start(wire: Wire) -> Self {
        let state = Arc::new(State {
            wire,
            records: Mutex::new(Vec::new()),
            sessions: Mutex::new(HashSet::new()),
            next_session: AtomicU64::new(1),
            not_found_names_id: std::sync::atomic::AtomicBool::new(false),
            peers: Mutex::new(HashSet::new()),
            answers: AtomicU64::new(0),
            questions: Mutex::new(std::collections::HashMap::new()),
            next_question: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            question_errors: Mutex::new(Vec::new()),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, bound) = std::sync::mpsc::channel::<SocketAddr>();
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                ready.send(listener.local_addr().expect("address")).expect("report address");
                let app = axum::Router::new().route("/mcp", axum::routing::any(handle)).with_state(shared);
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await;
                });
                let _ = stopped.await;
            });
            // Every task (connections, endless streams, sleeping handlers) is dropped here.
            runtime.shutdown_timeout(Duration::from_secs(1));
        });
        let addr = bound.recv().expect("the upstream reports its address");
        Self { url: format!("http://{addr}/mcp"), addr, state, stop: Some(stop), thread: Some(thread) }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.peers.lock().unwrap().len()
    }

    /// Answers to requests of its own received so far.
    pub fn answers(&self) -> u64 {
        self.state.answers.load(Ordering::SeqCst)
    }

    /// Question streams the gateway closed while a question waited for its answer.
    pub fn abandoned(&self) -> u64 {
        self.state.abandoned.load(Ordering::SeqCst)
    }

    /// The JSON-RPC errors its questions were answered with so far.
    pub fn question_errors(&self) -> Vec<Value> {
        self.state.question_errors.lock().unwrap().clone()
    }

    /// Every request received so far.
    pub fn records(&self) -> Vec<Recorded> {
        self.state.records.lock().unwrap().clone()
    }

    /// The `tools/call` requests received so far.
    pub fn calls(&self) -> Vec<Recorded> {
        self.records().into_iter().filter(|r| r.method == "tools/call").collect()
    }

    /// Forgets every open session (a 2025-era upstream that restarted): their next request is a
    /// 404 whose JSON-RPC error names the request's id when `names_id` (as the Palisade server
    /// does), else `null` (as the TypeScript SDK does).
    pub fn forget_sessions(&self, names_id: bool) {
        self.state.not_found_names_id.store(names_id, Ordering::SeqCst);
        self.state.sessions.lock().unwrap().clear();
    }

    /// Stops listening and drops every open connection.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for HostileUpstream {
    fn drop(&mut self) {
        self.stop();
    }
}

fn json_response(status: StatusCode, value: &Value, session: Option<&str>) -> Response {
    let mut builder = Response::builder().status(status).header("content-type", "application/json");
    if let Some(session) = session {
        builder = builder.header("mcp-session-id", session);
    }
    builder.body(Body::from(value.to_string())).expect("response")
}

fn status_only(status: StatusCode) -> Response {
    Response::builder().status(status).body(Body::empty()).expect("response")
}

fn rpc_error(status: StatusCode, id: &Value, code: i64, message: &str) -> Response {
    json_response(status, &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}), None)
}

async fn handle(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    state.peers.lock().unwrap().insert(peer);
    let session = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let rpc_method = parsed.get("method").and_then(Value::as_str).unwrap_or_default().to_owned();
    state.records.lock().unwrap().push(Recorded {
        method: rpc_method.clone(),
        headers: headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned()))
            .collect(),
        session: session.clone(),
        body: parsed.clone(),
    });
    let known_session = |id: &Option<String>| id.as_ref().is_some_and(|id| state.sessions.lock().unwrap().contains(id));
    match (state.wire, &method) {
        (Wire::Modern, &Method::POST) => {}
        (Wire::Modern, _) => return status_only(StatusCode::METHOD_NOT_ALLOWED),
        (Wire::Legacy, &Method::DELETE) => {
            if let Some(id) = &session {
                state.sessions.lock().unwrap().remove(id);
            }
            return status_only(StatusCode::OK);
        }
        (Wire::Legacy, &Method::GET) => {
            if !known_session(&session) {
                return status_only(StatusCode::NOT_FOUND);
            }
            // No server stream: the upstream never says a list changed.
            return status_only(StatusCode::METHOD_NOT_ALLOWED);
        }
        (Wire::Legacy, &Method::POST) => {}
        (Wire::Legacy, _) => return status_only(StatusCode::METHOD_NOT_ALLOWED),
    }
    if parsed.get("jsonrpc") != Some(&json!("2.0")) {
        return rpc_error(StatusCode::BAD_REQUEST, &Value::Null, -32700, "parse error");
    }
    if parsed.get("method").is_none()
        && let Some(waiter) =
            parsed.get("id").and_then(Value::as_str).and_then(|id| state.questions.lock().unwrap().remove(id))
    {
        // The answer to a question: the asking stream goes on with it.
        if let Some(error) = parsed.get("error") {
            state.question_errors.lock().unwrap().push(error.clone());
        }
        let answer = parsed.get("result").or_else(|| parsed.get("error")).cloned().unwrap_or(Value::Null);
        let _ = waiter.send(answer);
        return status_only(StatusCode::ACCEPTED);
    }
    if parsed.get("method").is_none() && parsed.get("id").is_some() {
        // An answer to a request of this upstream's own: held open, never answered.
        state.answers.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
    }
    let Some(id) = parsed.get("id").cloned() else {
        // A notification (`notifications/initialized`).
        return status_only(StatusCode::ACCEPTED);
    };
    if state.wire == Wire::Legacy {
        if rpc_method == "initialize" {
            let n = state.next_session.fetch_add(1, Ordering::SeqCst);
            let new_session = format!("session-{n}-{}", std::process::id());
            state.sessions.lock().unwrap().insert(new_session.clone());
            let result = json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile-legacy", "version": "0"},
            });
            return json_response(
                StatusCode::OK,
                &json!({"jsonrpc": "2.0", "id": id, "result": result}),
                Some(&new_session),
            );
        }
        if session.is_none() {
            return rpc_error(StatusCode::BAD_REQUEST, &id, -32600, "missing session");
        }
        if !known_session(&session) {
            let named = if state.not_found_names_id.load(Ordering::SeqCst) { id } else { Value::Null };
            return rpc_error(StatusCode::NOT_FOUND, &named, -32001, "session not found");
        }
    }
    let complete = |mut result: Value| {
        if state.wire == Wire::Modern {
            result["resultType"] = json!("complete");
        }
        json_response(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "result": result}), None)
    };
    match rpc_method.as_str() {
        "server/discover" if state.wire == Wire::Modern => complete(json!({
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}},
            "ttlMs": 0,
            "cacheScope": "public",
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "hostile", "version": "0"}},
        })),
        "tools/list" => complete(json!({"tools": tool_definitions(), "ttlMs": 0, "cacheScope": "public"})),
        "tools/call" if matches!(parsed.pointer("/params/name").and_then(Value::as_str), Some("ask" | "ask_many")) => {
            let many = parsed.pointer("/params/name") == Some(&json!("ask_many"));
            ask(state.clone(), id, if many { ASK_MANY } else { 1 })
        }
        "tools/call" => call(&parsed, &id, state.wire).await,
        _ => rpc_error(StatusCode::NOT_FOUND, &id, -32601, "method not found"),
    }
}

async fn call(request: &Value, id: &Value, wire: Wire) -> Response {
    let name = request.pointer("/params/name").and_then(Value::as_str).unwrap_or_default();
    let arguments = request.pointer("/params/arguments").cloned().unwrap_or_else(|| json!({}));
    let answer = |result: Value| {
        let mut result = result;
        if wire == Wire::Modern {
            result["resultType"] = json!("complete");
        }
        json!({"jsonrpc": "2.0", "id": id, "result": result})
    };
    let echoed = answer(json!({"content": [{"type": "text", "text": arguments.to_string()}]}));
    match name {
        "echo" | "late" => json_response(StatusCode::OK, &echoed, None),
        "garbage" => Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Body::from("<html>this is not JSON</html>"))
            .expect("response"),
        "huge" => {
            const CHUNK: usize = 1024 * 1024;
            let head = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":""#);
            let chunks = (0..50).map(move |n| {
                let mut chunk = if n == 0 { head.clone().into_bytes() } else { Vec::new() };
                chunk.resize(CHUNK, b'a');
                Ok::<_, std::io::Error>(Bytes::from(chunk))
            });
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(Body::from_stream(futures::stream::iter(chunks)))
                .expect("response")
        }
        "bad_output" => json_response(
            StatusCode::OK,
            &answer(json!({"content": [{"type": "text", "text": "many"}], "structuredContent": {"count": "many"}})),
            None,
        ),
        "endless_sse" => {
            let ticks = futures::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Some((Ok::<_, std::io::Error>(Bytes::from_static(b": still working\n\n")), ()))
            });
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(ticks))
                .expect("response")
        }
        "slow" => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            json_response(StatusCode::OK, &echoed, None)
        }
        "flood" => {
            let event =
                |value: &Value| Ok::<_, std::io::Error>(Bytes::from(format!("event: message\ndata: {value}\n\n")));
            let requests = (0..FLOOD).map(move |n| {
                event(&json!({"jsonrpc": "2.0", "id": format!("srv-{n}"), "method": "sampling/createMessage",
                    "params": {"messages": [], "maxTokens": 1}}))
            });
            let events: Vec<_> = requests.chain([event(&echoed)]).collect();
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(futures::stream::iter(events)))
                .expect("response")
        }
        "disabled" => {
            let status = arguments.get("status").and_then(Value::as_u64).and_then(|s| u16::try_from(s).ok());
            let status = status.and_then(|s| StatusCode::from_u16(s).ok()).unwrap_or(StatusCode::OK);
            rpc_error(status, id, -32030, "operation disabled")
        }
        "wrong_id" => {
            let other = id.as_i64().map_or_else(|| json!("someone-else"), |n| json!(n + 1000));
            let mut wrong = echoed.clone();
            wrong["id"] = other;
            json_response(StatusCode::OK, &wrong, None)
        }
        _ => rpc_error(StatusCode::OK, id, -32602, "unknown tool"),
    }
}

/// An event stream that asks `count` elicitation questions one after the other (each waiting for
/// its answer), then answers the call with the answers (results or errors) as a JSON array in its
/// text. A stream the gateway closes while a question waits is counted as abandoned.
fn ask(state: Arc<State>, id: Value, count: usize) -> Response {
    let (mut events, body) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let event = |value: &Value| Ok::<_, std::io::Error>(Bytes::from(format!("event: message\ndata: {value}\n\n")));
    tokio::spawn(async move {
        use futures::SinkExt as _;
        let mut answers = Vec::new();
        for _ in 0..count {
            let n = state.next_question.fetch_add(1, Ordering::SeqCst);
            let question = format!("q-{n}");
            let (answered, mut answer) = tokio::sync::oneshot::channel();
            state.questions.lock().unwrap().insert(question.clone(), answered);
            let request = json!({"jsonrpc": "2.0", "id": question, "method": "elicitation/create", "params": {
                "message": format!("question {n}"),
                "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
            }});
            if events.send(event(&request)).await.is_err() {
                state.abandoned.fetch_add(1, Ordering::SeqCst);
                return;
            }
            let got = loop {
                tokio::select! {
                    got = &mut answer => break got.ok(),
                    // A comment now and then: writing is how a closed connection shows.
                    () = tokio::time::sleep(Duration::from_millis(100)) => {
                        let comment = Ok(Bytes::from_static(b": waiting\n\n"));
                        if events.send(comment).await.is_err() {
                            break None;
                        }
                    }
                }
            };
            let Some(got) = got else {
                state.abandoned.fetch_add(1, Ordering::SeqCst);
                return;
            };
            answers.push(got);
        }
        let mut result = json!({"content": [{"type": "text", "text": Value::Array(answers).to_string()}]});
        if state.wire == Wire::Modern {
            result["resultType"] = json!("complete");
        }
        let _ = events.send(event(&json!({"jsonrpc": "2.0", "id": id, "result": result}))).await;
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(body))
        .expect("response")
}

/// A listener that accepts every connection and closes it without an answer, counting them:
/// what an upstream's address looks like after the upstream died behind a load balancer.
pub struct Closer {
    accepted: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Closer {
    /// Listens on `addr` (an address just freed).
    pub fn bind(addr: SocketAddr) -> Self {
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, bound) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(addr).await.expect("bind the freed address");
                ready.send(()).expect("report readiness");
                loop {
                    tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => {
                            if let Ok((socket, _)) = accepted {
                                counter.fetch_add(1, Ordering::SeqCst);
                                drop(socket);
                            }
                        }
                    }
                }
            });
        });
        bound.recv().expect("the closer reports readiness");
        Self { accepted, stop: Some(stop), thread: Some(thread) }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
