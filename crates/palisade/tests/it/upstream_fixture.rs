//! An MCP upstream for gateway tests: 2026-07-28 over Streamable HTTP on `127.0.0.1:0`,
//! stateless (`server/discover`, `tools/list`, `tools/call` echoing its arguments, `prompts/list`,
//! `prompts/get`, `subscriptions/listen`, and, once [`Upstream::set_resources`] was called before
//! the gateway connects, `resources/list`, `resources/templates/list` and `resources/read`
//! answering the URI it was asked, or the contents a test set for it), whose tool list and lists'
//! `ttlMs` / `cacheScope` a test can change while it serves, whose tool calls a test can hold
//! unanswered until it releases them, and which records every request it receives (headers and
//! body).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use axum::routing::any;
use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// The instructions the upstream's `server/discover` answers with.
pub const INSTRUCTIONS: &str = "A test upstream: its tools echo their arguments.";

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// Every header, as sent.
    pub headers: HeaderMap,
    /// The body, parsed (`Null` when it was not JSON).
    pub body: Value,
}

impl RecordedRequest {
    /// The JSON-RPC method (`""` for a body without one).
    pub fn method(&self) -> &str {
        self.body.get("method").and_then(Value::as_str).unwrap_or("")
    }

    /// A header's value, when it is present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

struct Shared {
    tools: Mutex<Vec<Value>>,
    prompts: Mutex<Vec<Value>>,
    /// (resources, resource templates), when it offers resources.
    resources: Mutex<Option<(Vec<Value>, Vec<Value>)>>,
    requests: Mutex<Vec<RecordedRequest>>,
    /// What its lists say of their caching: (`ttlMs`, `cacheScope`).
    list_cache: Mutex<(i64, String)>,
    /// Contents items `resources/read` answers, by URI (else "read <uri>" as text/plain).
    contents: Mutex<HashMap<String, Value>>,
    /// List-changed notification methods for the open listen streams.
    changes: broadcast::Sender<String>,
    /// While `true`, tool calls are received (and recorded) but not answered.
    held: tokio::sync::watch::Sender<bool>,
}

/// A running upstream; it stops when dropped.
pub struct Upstream {
    /// Its endpoint, `http://127.0.0.1:<port>/mcp`.
    pub url: String,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Upstream {
    /// Starts serving `tools` (and no prompts). The server runs on a thread and runtime of its
    /// own, so it answers even while the test blocks (booting the gateway, running the CLI).
    pub async fn start(tools: Vec<Value>) -> Upstream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let url = format!("http://{}/mcp", listener.local_addr().expect("local address"));
        let shared = Arc::new(Shared {
            tools: Mutex::new(tools),
            prompts: Mutex::new(Vec::new()),
            resources: Mutex::new(None),
            requests: Mutex::new(Vec::new()),
            list_cache: Mutex::new((0, "public".to_owned())),
            contents: Mutex::new(HashMap::new()),
            changes: broadcast::channel(16).0,
            held: tokio::sync::watch::channel(false).0,
        });
        let router = axum::Router::new().route("/mcp", any(handle)).with_state(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                tokio::select! {
                    _ = axum::serve(listener, router) => {}
                    _ = stopped => {}
                }
            });
        });
        Upstream { url, shared, stop: Some(stop) }
    }

    /// Replaces the tool list (what the next `tools/list` answers). No notification is sent:
    /// call [`Self::notify_tools_changed`] for an upstream that announces its change.
    pub fn set_tools(&self, tools: Vec<Value>) {
        *self.shared.tools.lock().unwrap() = tools;
    }

    /// Replaces the prompt list.
    pub fn set_prompts(&self, prompts: Vec<Value>) {
        *self.shared.prompts.lock().unwrap() = prompts;
    }

    /// Offers `resources` and resource `templates` (and the `resources` capability, to a client
    /// that discovers it after this call).
    pub fn set_resources(&self, resources: Vec<Value>, templates: Vec<Value>) {
        *self.shared.resources.lock().unwrap() = Some((resources, templates));
    }

    /// What its lists say from now on: `ttlMs` and `cacheScope` (by default 0 and `public`).
    pub fn set_list_cache(&self, ttl_ms: i64, scope: &str) {
        *self.shared.list_cache.lock().unwrap() = (ttl_ms, scope.to_owned());
    }

    /// What a read of `uri` answers from now on: the content item `item` (its `uri` set).
    pub fn set_contents(&self, uri: &str, mut item: Value) {
        item["uri"] = json!(uri);
        self.shared.contents.lock().unwrap().insert(uri.to_owned(), item);
    }

    /// How many `method` requests (a list's, say) it received so far.
    pub fn count(&self, method: &str) -> usize {
        self.requests().iter().filter(|r| r.method() == method).count()
    }

    /// The URIs of the `resources/read` requests received so far.
    pub fn reads(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|r| r.method() == "resources/read")
            .map(|r| r.body["params"]["uri"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    /// Sends `notifications/tools/list_changed` on every open listen stream.
    pub fn notify_tools_changed(&self) {
        let _ = self.shared.changes.send("notifications/tools/list_changed".into());
    }

    /// Holds every tool call from now on (received and recorded, not answered) until
    /// [`Self::release_calls`].
    pub fn hold_calls(&self) {
        self.shared.held.send_replace(true);
    }

    /// Answers the held tool calls, and the next ones at once.
    pub fn release_calls(&self) {
        self.shared.held.send_replace(false);
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// The `tools/call` requests received so far.
    pub fn calls(&self) -> Vec<RecordedRequest> {
        self.requests().into_iter().filter(|r| r.method() == "tools/call").collect()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A tool definition: `name`, `description`, an open object input schema.
pub fn tool(name: &str, description: &str) -> Value {
    json!({
        "name": name,
        "description": description,
        "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } } }
    })
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(value.to_string()))
        .expect("response")
}

fn server_meta() -> Value {
    json!({ "io.modelcontextprotocol/serverInfo": { "name": "upstream-fixture", "version": "1.0.0" } })
}

fn complete(id: &Value, mut result: Value) -> Response {
    result["resultType"] = json!("complete");
    result["_meta"] = server_meta();
    json_response(StatusCode::OK, &json!({ "jsonrpc": "2.0", "id": id, "result": result }))
}

fn error(status: StatusCode, id: &Value, code: i64, message: &str) -> Response {
    json_response(status, &json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } }))
}

fn event(value: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {value}\n\n"))
}

async fn handle(State(shared): State<Arc<Shared>>, method: Method, headers: HeaderMap, body: Bytes) -> Response {
    let rpc: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    shared.requests.lock().unwrap().push(RecordedRequest { headers, body: rpc.clone() });
    if method != Method::POST {
        return Response::builder().status(StatusCode::METHOD_NOT_ALLOWED).body(Body::empty()).expect("response");
    }
    let Some(id) = rpc.get("id").cloned() else {
        // A notification (or an answer): accepted, nothing to say.
        return Response::builder().status(StatusCode::ACCEPTED).body(Body::empty()).expect("response");
    };
    let params = &rpc["params"];
    let resources = shared.resources.lock().unwrap().clone();
    let (ttl, scope) = shared.list_cache.lock().unwrap().clone();
    let list = |key: &str, items: Vec<Value>| json!({ key: items, "ttlMs": ttl, "cacheScope": scope });
    match rpc["method"].as_str().unwrap_or("") {
        "server/discover" => {
            let mut capabilities = json!({ "tools": { "listChanged": true }, "prompts": { "listChanged": true } });
            if resources.is_some() {
                capabilities["resources"] = json!({});
            }
            complete(
                &id,
                json!({
                    "supportedVersions": ["2026-07-28"],
                    "capabilities": capabilities,
                    "instructions": INSTRUCTIONS,
                    "ttlMs": 0,
                    "cacheScope": "public",
                }),
            )
        }
        "resources/list" if resources.is_some() => {
            let listed = resources.map(|(listed, _)| listed).unwrap_or_default();
            complete(&id, list("resources", listed))
        }
        "resources/templates/list" if resources.is_some() => {
            let listed = resources.map(|(_, templates)| templates).unwrap_or_default();
            complete(&id, list("resourceTemplates", listed))
        }
        "resources/read" if resources.is_some() => {
            let uri = params["uri"].as_str().unwrap_or("");
            let set = shared.contents.lock().unwrap().get(uri).cloned();
            let item =
                set.unwrap_or_else(|| json!({ "uri": uri, "mimeType": "text/plain", "text": format!("read {uri}") }));
            complete(&id, json!({ "contents": [item], "ttlMs": 0, "cacheScope": "public" }))
        }
        "tools/list" => {
            let tools = shared.tools.lock().unwrap().clone();
            complete(&id, list("tools", tools))
        }
        "prompts/list" => {
            let prompts = shared.prompts.lock().unwrap().clone();
            complete(&id, list("prompts", prompts))
        }
        "tools/call" => {
            let name = params["name"].as_str().unwrap_or("");
            let known = shared.tools.lock().unwrap().iter().any(|t| t["name"] == name);
            if !known {
                return error(StatusCode::OK, &id, -32602, "Unknown tool");
            }
            let mut gate = shared.held.subscribe();
            while *gate.borrow_and_update() {
                if gate.changed().await.is_err() {
                    break;
                }
            }
            let arguments = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
            complete(&id, json!({ "content": [{ "type": "text", "text": arguments.to_string() }] }))
        }
        "prompts/get" => {
            let name = params["name"].as_str().unwrap_or("");
            let known = shared.prompts.lock().unwrap().iter().any(|p| p["name"] == name);
            if !known {
                return error(StatusCode::OK, &id, -32602, "Unknown prompt");
            }
            let arguments = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
            complete(
                &id,
                json!({ "messages": [{ "role": "user", "content": { "type": "text", "text": arguments.to_string() } }] }),
            )
        }
        "subscriptions/listen" => {
            let tagged = |method: &str, params: Value| {
                let mut params = params;
                params["_meta"] = json!({ "io.modelcontextprotocol/subscriptionId": id.clone() });
                json!({ "jsonrpc": "2.0", "method": method, "params": params })
            };
            let wanted = params["notifications"].clone();
            let ack = event(&tagged("notifications/subscriptions/acknowledged", json!({ "notifications": wanted })));
            let changes = tokio_stream(shared.changes.subscribe());
            let id = id.clone();
            let later = changes.map(move |method| {
                let params = json!({ "_meta": { "io.modelcontextprotocol/subscriptionId": id.clone() } });
                event(&json!({ "jsonrpc": "2.0", "method": method, "params": params }))
            });
            let events = futures::stream::once(async move { ack }).chain(later);
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "text/event-stream")
                .body(Body::from_stream(events.map(Ok::<_, Infallible>)))
                .expect("response")
        }
        _ => error(StatusCode::NOT_FOUND, &id, -32601, "Method not found"),
    }
}

/// The messages of a broadcast receiver as a stream (lagged messages skipped).
fn tokio_stream(receiver: broadcast::Receiver<String>) -> impl futures::Stream<Item = String> + Send {
    futures::stream::unfold(receiver, |mut receiver| async move {
        loop {
            match receiver.recv().await {
                Ok(method) => return Some((method, receiver)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}
