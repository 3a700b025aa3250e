//! The gateway's upstream MCP client against real local upstreams written here: a 2026-07-28
//! server with hostile tools (garbage, oversized, wrong id, endless, slow, scope-refusing), and a
//! 2025-era server with sessions.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashSet};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use axum::routing::any;
use futures::StreamExt as _;
use palisade_base::clock::SystemClock;
use palisade_gateway::credentials::{CallerContext, ClientAuth, CredentialConfig, SecretSource, UpstreamCredential};
use palisade_gateway::upstream::{
    Change, Era, ListCache, ListKind, ProtocolChoice, UpstreamClient, UpstreamError, UpstreamLimits, UpstreamReply,
    UpstreamRequest,
};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

const FIFTY_MIB: usize = 50 * 1024 * 1024;

/// One request the test upstream received.
#[derive(Debug, Clone)]
struct Seen {
    http_method: Method,
    headers: HeaderMap,
    body: Value,
}

impl Seen {
    fn rpc_method(&self) -> &str {
        self.body.get("method").and_then(Value::as_str).unwrap_or("")
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Default)]
struct Upstream {
    seen: Mutex<Vec<Seen>>,
    /// Bytes of the 50 MiB body handed to the connection so far, and whether all were.
    huge_sent: AtomicUsize,
    huge_finished: AtomicBool,
    /// 2025-era: the session ids alive, and how many were minted.
    live_sessions: Mutex<HashSet<String>>,
    minted: AtomicUsize,
    /// 2025-era: the version `initialize` answers with.
    legacy_version: Mutex<String>,
    not_found: AtomicUsize,
    /// 2025-era: whether GET opens a server stream (405 otherwise).
    get_stream: AtomicBool,
}

impl Upstream {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    fn seen_method(&self, method: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.rpc_method() == method).collect()
    }
}

async fn serve(router: axum::Router) -> url::Url {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    url::Url::parse(&format!("http://{address}/mcp")).unwrap()
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(value).unwrap()))
        .unwrap()
}

fn result(id: &Value, result: Value) -> Response {
    json_response(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn sse_event(value: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {}\n\n", serde_json::to_string(value).unwrap()))
}

fn sse_response(events: impl futures::Stream<Item = Bytes> + Send + 'static) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(events.map(Ok::<_, Infallible>)))
        .unwrap()
}

fn record(state: &Upstream, http_method: Method, headers: &HeaderMap, body: &Bytes) -> Value {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    state.seen.lock().unwrap().push(Seen { http_method, headers: headers.clone(), body: value.clone() });
    value
}

fn tool(name: &str) -> Value {
    json!({"name": name, "description": format!("tool {name}"), "inputSchema": {"type": "object"}})
}

/// The 2026-07-28 upstream: discover, three pages of tools, listen, and one behaviour per tool.
async fn modern(State(state): State<Arc<Upstream>>, method: Method, headers: HeaderMap, body: Bytes) -> Response {
    let rpc = record(&state, method.clone(), &headers, &body);
    if method != Method::POST {
        return Response::builder().status(StatusCode::METHOD_NOT_ALLOWED).body(Body::empty()).unwrap();
    }
    let id = rpc["id"].clone();
    let params = &rpc["params"];
    match rpc["method"].as_str() {
        None => Response::builder().status(StatusCode::ACCEPTED).body(Body::empty()).unwrap(), // an answer
        Some("server/discover") => result(
            &id,
            json!({
                "resultType": "complete", "supportedVersions": ["2026-07-28"], "ttlMs": 0, "cacheScope": "public",
                "capabilities": {"tools": {"listChanged": true}, "resources": {"subscribe": true}},
                "instructions": "be nice",
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "hostile", "version": "1"}},
            }),
        ),
        Some("tools/list") => {
            let echo = json!({"name": "echo", "inputSchema": {"type": "object", "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"}, "text": {"type": "string"}}}});
            // Each page says something else of its caching: the list is what the most
            // restrictive page says.
            let (tools, next, ttl, scope) = match params["cursor"].as_str() {
                None => (vec![echo, tool("b")], Some("c1"), 60_000, "public"),
                Some("c1") => (vec![tool("c"), tool("d")], Some("c2"), 5_000, "public"),
                Some("c2") => (vec![tool("e")], None, 30_000, "private"),
                Some(_) => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        &json!({"jsonrpc":"2.0","id":id,"error":{"code":-32602,"message":"bad cursor"}}),
                    );
                }
            };
            let mut page = json!({"resultType": "complete", "tools": tools, "ttlMs": ttl, "cacheScope": scope});
            if let Some(next) = next {
                page["nextCursor"] = json!(next);
            }
            result(&id, page)
        }
        Some("subscriptions/listen") => {
            let meta = json!({"io.modelcontextprotocol/subscriptionId": id});
            let mut events = vec![
                sse_event(&json!({"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged",
                    "params":{"notifications":{"toolsListChanged":true},"_meta":meta}})),
                sse_event(&json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed",
                    "params":{"_meta":{"io.modelcontextprotocol/subscriptionId": "someone else"}}})),
                sse_event(
                    &json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":meta}}),
                ),
            ];
            // One update of each resource subscribed to, and one of another subscription's.
            for uri in params["notifications"]["resourceSubscriptions"].as_array().into_iter().flatten() {
                events.push(sse_event(&json!({"jsonrpc":"2.0","method":"notifications/resources/updated",
                    "params":{"uri": uri, "_meta":meta}})));
                events.push(sse_event(&json!({"jsonrpc":"2.0","method":"notifications/resources/updated",
                    "params":{"uri": "demo://theirs", "_meta":{"io.modelcontextprotocol/subscriptionId": "someone else"}}})));
            }
            events.push(sse_event(&json!({"jsonrpc":"2.0","id":id,"result":{"resultType":"complete","_meta":meta}})));
            sse_response(futures::stream::iter(events))
        }
        Some("tools/call") => tool_call(state, id, params, &headers).await,
        Some(_) => json_response(
            StatusCode::NOT_FOUND,
            &json!({"jsonrpc":"2.0","id":id,"error":{"code":-32601,"message":"method not found"}}),
        ),
    }
}

async fn tool_call(state: Arc<Upstream>, id: Value, params: &Value, headers: &HeaderMap) -> Response {
    match params["name"].as_str().unwrap_or("") {
        "scoped" => {
            let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
            if authorization.starts_with("Bearer tok.") && authorization.contains("files-write") {
                result(&id, json!({"content": [{"type": "text", "text": "written"}]}))
            } else {
                Response::builder()
                    .status(StatusCode::FORBIDDEN)
                    .header(
                        header::WWW_AUTHENTICATE,
                        r#"Bearer error="insufficient_scope", scope="files:read files:write""#,
                    )
                    .body(Body::empty())
                    .unwrap()
            }
        }
        "echo" => result(&id, json!({"resultType":"complete","content":[{"type":"text","text":"ok"}],"echo":params})),
        "garbage" => Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("<html>definitely not json"))
            .unwrap(),
        "not_jsonrpc" => json_response(StatusCode::OK, &json!({"id": id, "result": {}})),
        "wrong_id" => result(&json!(id.as_i64().unwrap_or(0) + 1000), json!({"content": []})),
        "huge" => {
            let chunk = Bytes::from(vec![b' '; 64 * 1024]);
            let stream = futures::stream::unfold(0usize, move |sent| {
                let state = state.clone();
                let chunk = chunk.clone();
                async move {
                    if sent >= FIFTY_MIB {
                        state.huge_finished.store(true, Ordering::SeqCst);
                        return None;
                    }
                    state.huge_sent.store(sent + chunk.len(), Ordering::SeqCst);
                    Some((Ok::<_, Infallible>(chunk), sent + 64 * 1024))
                }
            });
            Response::builder()
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(stream))
                .unwrap()
        }
        "endless" => {
            let first = futures::stream::iter(vec![Bytes::from(": keep-alive\n\n")]);
            let ticks = futures::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some((Bytes::from(": still here\n\n"), ()))
            });
            sse_response(first.chain(ticks))
        }
        "slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            result(&id, json!({"content": []}))
        }
        "progress" => {
            let token = params["_meta"]["progressToken"].clone();
            let events = vec![
                sse_event(
                    &json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":token,"progress":1,"total":2}}),
                ),
                sse_event(
                    &json!({"jsonrpc":"2.0","id":"srv-1","method":"sampling/createMessage","params":{"messages":[]}}),
                ),
                sse_event(&json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"})),
                sse_event(
                    &json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":token,"progress":2,"total":2}}),
                ),
                sse_event(
                    &json!({"jsonrpc":"2.0","id":id,"result":{"resultType":"complete","content":[{"type":"text","text":"done"}]}}),
                ),
            ];
            sse_response(futures::stream::iter(events))
        }
        "input" => result(
            &id,
            json!({"resultType":"input_required",
                "inputRequests":{"confirm":{"method":"elicitation/create","params":{"message":"sure?","requestedSchema":{"type":"object"}}}},
                "requestState":"opaque-state-1"}),
        ),
        "failing" => json_response(
            StatusCode::OK,
            &json!({"jsonrpc":"2.0","id":id,"error":{"code":-32000,"message":format!("boom{}", "x".repeat(500)),"data":{"secret":"s"}}}),
        ),
        "scope" => Response::builder()
            .status(StatusCode::FORBIDDEN)
            .header(
                header::WWW_AUTHENTICATE,
                r#"Bearer error="insufficient_scope", scope="files:write", resource_metadata="http://x/""#,
            )
            .body(Body::empty())
            .unwrap(),
        "redirect" => Response::builder()
            .status(StatusCode::TEMPORARY_REDIRECT)
            .header(header::LOCATION, "http://127.0.0.1:1/elsewhere")
            .body(Body::empty())
            .unwrap(),
        _ => result(&id, json!({"content": [], "isError": true})),
    }
}

/// The 2025-era upstream: no server/discover, `initialize` mints a session, every other request
/// needs a live session (404 otherwise); `tools/call` answers with the session it ran in.
async fn legacy(State(state): State<Arc<Upstream>>, method: Method, headers: HeaderMap, body: Bytes) -> Response {
    let rpc = record(&state, method.clone(), &headers, &body);
    let session = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    if method == Method::GET {
        let live = session.as_ref().is_some_and(|s| state.live_sessions.lock().unwrap().contains(s));
        if !state.get_stream.load(Ordering::SeqCst) {
            return Response::builder().status(StatusCode::METHOD_NOT_ALLOWED).body(Body::empty()).unwrap();
        }
        if !live {
            return Response::builder().status(StatusCode::NOT_FOUND).body(Body::empty()).unwrap();
        }
        let events = vec![
            sse_event(&json!({"jsonrpc":"2.0","id":"ping-1","method":"ping"})),
            sse_event(&json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}})),
            sse_event(&json!({"jsonrpc":"2.0","method":"notifications/prompts/list_changed"})),
        ];
        return sse_response(futures::stream::iter(events));
    }
    let id = rpc["id"].clone();
    if rpc["method"] == "initialize" {
        let n = state.minted.fetch_add(1, Ordering::SeqCst);
        let sid = format!("session-{n}");
        state.live_sessions.lock().unwrap().insert(sid.clone());
        let version = state.legacy_version.lock().unwrap().clone();
        let mut response = result(
            &id,
            json!({"protocolVersion": version, "capabilities": {"tools": {"listChanged": true}},
                   "serverInfo": {"name": "old", "version": "0.9"}, "instructions": "legacy"}),
        );
        response.headers_mut().insert("mcp-session-id", sid.parse().unwrap());
        return response;
    }
    let Some(session) = session else {
        return Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(Body::from("Bad Request: No valid session ID"))
            .unwrap();
    };
    if !state.live_sessions.lock().unwrap().contains(&session) {
        state.not_found.fetch_add(1, Ordering::SeqCst);
        return json_response(
            StatusCode::NOT_FOUND,
            &json!({"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}),
        );
    }
    match rpc["method"].as_str() {
        Some("notifications/initialized") => {
            Response::builder().status(StatusCode::ACCEPTED).body(Body::empty()).unwrap()
        }
        Some("tools/list") => result(&id, json!({"tools": [tool("old_tool")]})),
        Some("tools/call") => result(&id, json!({"content": [{"type": "text", "text": session}]})),
        _ => json_response(
            StatusCode::OK,
            &json!({"jsonrpc":"2.0","id":id,"error":{"code":-32601,"message":"Method not found"}}),
        ),
    }
}

/// A token endpoint: the access token names the scopes asked for.
async fn token(body: Bytes) -> Response {
    let scope = url::form_urlencoded::parse(&body).find(|(k, _)| k == "scope").map(|(_, v)| v.into_owned());
    let token = format!("tok.{}", scope.unwrap_or_default().replace(':', "-").replace(' ', "."));
    json_response(StatusCode::OK, &json!({"access_token": token, "token_type": "Bearer", "expires_in": 3600}))
}

async fn modern_upstream() -> (url::Url, Arc<Upstream>) {
    let state = Arc::new(Upstream::default());
    let router = axum::Router::new()
        .route("/mcp", any(modern))
        .route("/token", axum::routing::post(token))
        .with_state(state.clone());
    (serve(router).await, state)
}

async fn legacy_upstream(version: &str) -> (url::Url, Arc<Upstream>) {
    let state = Arc::new(Upstream::default());
    *state.legacy_version.lock().unwrap() = version.to_owned();
    let router = axum::Router::new().route("/mcp", any(legacy)).with_state(state.clone());
    (serve(router).await, state)
}

fn limits() -> UpstreamLimits {
    UpstreamLimits { request_timeout: Duration::from_secs(10), ..UpstreamLimits::default() }
}

fn client(url: &url::Url, protocol: ProtocolChoice, limits: UpstreamLimits) -> UpstreamClient {
    UpstreamClient::new("up-1", url.clone(), protocol, limits, Arc::new(UpstreamCredential::none())).unwrap()
}

fn call<'a>(partition: &'a str, name: &str, arguments: Value) -> UpstreamRequest<'a> {
    let mut params = Map::new();
    params.insert("name".into(), json!(name));
    params.insert("arguments".into(), arguments);
    UpstreamRequest {
        method: "tools/call",
        params,
        caller: CallerContext { partition, subject_token: Some("caller-secret-token"), user: None },
        client_capabilities: None,
        notifications: None,
        asks: None,
        cancel: CancellationToken::new(),
    }
}

#[tokio::test]
async fn discover_then_a_listing_over_three_pages() {
    let (url, upstream) = modern_upstream().await;
    let client = client(&url, ProtocolChoice::Auto, limits());
    let info = client.connect().await.unwrap();
    assert_eq!(info.era, Era::Modern);
    assert_eq!(info.capabilities, json!({"tools": {"listChanged": true}, "resources": {"subscribe": true}}));
    assert_eq!(info.server_info, json!({"name": "hostile", "version": "1"}));
    assert_eq!(info.instructions.as_deref(), Some("be nice"));
    assert_eq!(client.info().unwrap().era, Era::Modern);

    let (tools, cache) = client.list(ListKind::Tools).await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["echo", "b", "c", "d", "e"]);
    assert_eq!(cache, ListCache { ttl_ms: Some(5_000), private: true }, "the shortest ttlMs, private from one page");
    assert_eq!(tools[1], tool("b"), "items exactly as sent");
    let pages = upstream.seen_method("tools/list");
    assert_eq!(pages.len(), 3);
    for page in &pages {
        let meta = &page.body["params"]["_meta"];
        assert_eq!(meta["io.modelcontextprotocol/protocolVersion"], "2026-07-28");
        assert_eq!(meta["io.modelcontextprotocol/clientInfo"]["name"], "palisade-gateway");
        assert_eq!(meta["io.modelcontextprotocol/clientCapabilities"], json!({}));
        assert_eq!(page.header("mcp-protocol-version"), Some("2026-07-28"));
        assert_eq!(page.header("mcp-method"), Some("tools/list"));
        assert_eq!(page.header("accept"), Some("application/json, text/event-stream"));
    }
    assert_eq!(pages[1].body["params"]["cursor"], "c1");
    assert_eq!(pages[2].body["params"]["cursor"], "c2");
    let ids: HashSet<i64> = upstream.seen().iter().filter_map(|s| s.body["id"].as_i64()).collect();
    assert_eq!(ids.len(), 4, "every request has its own id");

    let small = UpstreamLimits { max_list_items: 4, ..limits() };
    let bounded = self::client(&url, ProtocolChoice::Modern, small);
    assert!(matches!(bounded.list(ListKind::Tools).await, Err(UpstreamError::TooLarge)), "never a truncation");
    let few_pages = UpstreamLimits { max_list_pages: 2, ..limits() };
    let bounded = self::client(&url, ProtocolChoice::Modern, few_pages);
    assert!(matches!(bounded.list(ListKind::Tools).await, Err(UpstreamError::TooLarge)));
}

#[tokio::test]
async fn auto_falls_back_to_a_2025_upstream_with_one_session_per_partition() {
    let (url, upstream) = legacy_upstream("2025-11-25").await;
    let client = client(&url, ProtocolChoice::Auto, limits());
    let info = client.connect().await.unwrap();
    assert_eq!(info.era, Era::Legacy("2025-11-25".into()));
    assert_eq!(info.server_info["name"], "old");
    assert_eq!(info.instructions.as_deref(), Some("legacy"));
    let initialize = upstream.seen_method("initialize");
    assert_eq!(initialize.len(), 1);
    assert_eq!(initialize[0].body["params"]["protocolVersion"], "2025-11-25");
    assert_eq!(initialize[0].body["params"]["clientInfo"]["name"], "palisade-gateway");
    let initialized = upstream.seen_method("notifications/initialized");
    assert_eq!(initialized.len(), 1);
    assert_eq!(initialized[0].header("mcp-session-id"), Some("session-0"));

    let (tools, cache) = client.list(ListKind::Tools).await.unwrap();
    assert_eq!(tools, vec![tool("old_tool")]);
    assert_eq!(cache, ListCache::default(), "a 2025 list carries no caching fields: no bound");
    let listing = &upstream.seen_method("tools/list")[0];
    assert_eq!(listing.header("mcp-session-id"), Some("session-0"), "the gateway's own session");
    assert_eq!(listing.header("mcp-protocol-version"), Some("2025-11-25"));
    assert!(listing.body["params"].get("_meta").is_none(), "no 2026 _meta on the 2025 wire");

    let session_of = |reply: UpstreamReply| match reply {
        UpstreamReply::Result(result) => result["content"][0]["text"].as_str().unwrap().to_owned(),
        other => panic!("unexpected {other:?}"),
    };
    let alice = session_of(client.request(call("alice", "echo", json!({}))).await.unwrap());
    let bob = session_of(client.request(call("bob", "echo", json!({}))).await.unwrap());
    let alice_again = session_of(client.request(call("alice", "echo", json!({}))).await.unwrap());
    assert_ne!(alice, bob, "partitions never share a session");
    assert_ne!(alice, "session-0");
    assert_ne!(bob, "session-0");
    assert_eq!(alice, alice_again, "a partition keeps its session");
    assert_eq!(upstream.seen_method("initialize").len(), 3);

    // The upstream forgets alice's session: one 404, a new session, the call retried.
    upstream.live_sessions.lock().unwrap().remove(&alice);
    let reopened = session_of(client.request(call("alice", "echo", json!({}))).await.unwrap());
    assert_eq!(upstream.not_found.load(Ordering::SeqCst), 1);
    assert_ne!(reopened, alice);
    assert_ne!(reopened, bob);
    assert_eq!(session_of(client.request(call("bob", "echo", json!({}))).await.unwrap()), bob, "bob untouched");

    // The GET stream is refused (405): a change stream that never yields, not an error.
    let mut changes = Box::pin(client.changes(&Default::default()).await.unwrap());
    assert!(tokio::time::timeout(Duration::from_millis(200), changes.next()).await.is_err());
}

#[tokio::test]
async fn a_2025_upstream_s_get_stream_is_the_change_stream_of_the_gateway_s_session() {
    let (url, upstream) = legacy_upstream("2025-11-25").await;
    upstream.get_stream.store(true, Ordering::SeqCst);
    let client = client(&url, ProtocolChoice::Legacy, limits());
    client.connect().await.unwrap();
    // The gateway's session expired: the stream request re-opens it once.
    upstream.live_sessions.lock().unwrap().clear();
    let changes: Vec<Change> = client.changes(&Default::default()).await.unwrap().collect().await;
    assert_eq!(changes, [Change::ListChanged("notifications/prompts/list_changed".into())]);
    let gets: Vec<Seen> = upstream.seen().into_iter().filter(|s| s.http_method == Method::GET).collect();
    assert_eq!(gets.len(), 2);
    assert_eq!(gets[0].header("mcp-session-id"), Some("session-0"));
    assert_eq!(gets[1].header("mcp-session-id"), Some("session-1"));
    assert_eq!(gets[1].header("accept"), Some("text/event-stream"));
    // The upstream's ping was answered, in the session, with an empty result (as the spec asks).
    let deadline = Instant::now() + Duration::from_secs(5);
    let answer = loop {
        if let Some(answer) = upstream.seen().into_iter().find(|s| s.body["id"] == "ping-1") {
            break answer;
        }
        assert!(Instant::now() < deadline, "the upstream's request was never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(answer.body["result"], json!({}), "{:?}", answer.body);
    assert_eq!(answer.header("mcp-session-id"), Some("session-1"));
}

#[tokio::test]
async fn a_2025_06_18_upstream_is_spoken_to_at_its_version() {
    let (url, upstream) = legacy_upstream("2025-06-18").await;
    let client = client(&url, ProtocolChoice::Legacy, limits());
    assert_eq!(client.connect().await.unwrap().era, Era::Legacy("2025-06-18".into()));
    assert!(upstream.seen_method("server/discover").is_empty(), "Legacy: the handshake only");
    client.request(call("alice", "echo", json!({}))).await.unwrap();
    let calls = upstream.seen_method("tools/call");
    assert_eq!(calls[0].header("mcp-protocol-version"), Some("2025-06-18"));

    let (url, _) = legacy_upstream("2024-11-05").await;
    let client = self::client(&url, ProtocolChoice::Legacy, limits());
    assert!(matches!(client.connect().await, Err(UpstreamError::Protocol(_))), "a version we do not speak");
    let modern_only = self::client(&url, ProtocolChoice::Modern, limits());
    assert!(matches!(modern_only.connect().await, Err(UpstreamError::Status(400))));
}

async fn connected() -> (UpstreamClient, Arc<Upstream>) {
    connected_with(limits()).await
}

async fn connected_with(limits: UpstreamLimits) -> (UpstreamClient, Arc<Upstream>) {
    let (url, upstream) = modern_upstream().await;
    let client = client(&url, ProtocolChoice::Modern, limits);
    client.connect().await.unwrap();
    (client, upstream)
}

#[tokio::test]
async fn garbage_and_non_json_rpc_answers_are_protocol_errors() {
    let (client, _) = connected().await;
    assert!(
        matches!(client.request(call("p", "redirect", json!({}))).await, Err(UpstreamError::Status(307))),
        "not followed"
    );
    assert!(client.health().healthy, "a 3xx is not an outage");
    assert!(matches!(client.request(call("p", "garbage", json!({}))).await, Err(UpstreamError::Protocol(_))));
    assert!(matches!(client.request(call("p", "not_jsonrpc", json!({}))).await, Err(UpstreamError::Protocol(_))));
    // Two protocol failures in a row: the upstream is in backoff.
    assert!(matches!(client.request(call("p", "echo", json!({}))).await, Err(UpstreamError::Unhealthy)));
}

#[tokio::test]
async fn an_answer_to_another_id_is_a_protocol_error() {
    let (client, _) = connected().await;
    match client.request(call("p", "wrong_id", json!({}))).await {
        Err(UpstreamError::Protocol(why)) => assert!(why.contains("id it never received"), "{why}"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn a_50_mib_answer_is_refused_without_reading_it_all() {
    let limits = UpstreamLimits { max_response_bytes: 1024 * 1024, ..limits() };
    let (client, upstream) = connected_with(limits).await;
    let outcome = client.request(call("p", "huge", json!({}))).await;
    assert!(matches!(outcome, Err(UpstreamError::TooLarge)), "{outcome:?}");
    assert!(!upstream.huge_finished.load(Ordering::SeqCst), "refused before the upstream finished sending");
    let sent = upstream.huge_sent.load(Ordering::SeqCst);
    assert!(sent < FIFTY_MIB / 2, "the upstream got rid of only {sent} bytes");
}

#[tokio::test]
async fn a_never_ending_event_stream_times_out() {
    let limits = UpstreamLimits { request_timeout: Duration::from_millis(500), ..limits() };
    let (client, _) = connected_with(limits).await;
    let started = Instant::now();
    let outcome = client.request(call("p", "endless", json!({}))).await;
    assert!(matches!(outcome, Err(UpstreamError::Timeout)), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "did not hang");
}

#[tokio::test]
async fn a_slow_upstream_times_out_and_then_is_refused_at_once() {
    let limits = UpstreamLimits { request_timeout: Duration::from_millis(300), ..limits() };
    let (client, _) = connected_with(limits).await;
    let started = Instant::now();
    assert!(matches!(client.request(call("p", "slow", json!({}))).await, Err(UpstreamError::Timeout)));
    assert!(started.elapsed() < Duration::from_secs(4), "did not wait for the upstream");
    assert!(client.check_health().is_ok(), "one failure is not yet a backoff");
    assert!(client.health().healthy);
    assert!(matches!(client.request(call("p", "slow", json!({}))).await, Err(UpstreamError::Timeout)));

    assert!(matches!(client.check_health(), Err(UpstreamError::Unhealthy)));
    let report = client.health();
    assert!(!report.healthy);
    assert_eq!(report.consecutive_failures, 2);
    assert_eq!(report.last_error.as_deref(), Some("upstream did not answer in time"));
    assert!(report.retry_at_ms.is_some());
    let serialized = serde_json::to_value(&report).unwrap();
    assert_eq!(serialized["consecutive_failures"], 2);
    let refused_at = Instant::now();
    assert!(matches!(client.request(call("p", "echo", json!({}))).await, Err(UpstreamError::Unhealthy)));
    assert!(matches!(client.list(ListKind::Tools).await, Err(UpstreamError::Unhealthy)));
    assert!(refused_at.elapsed() < Duration::from_secs(2), "refused without waiting for a timeout");
}

#[tokio::test]
async fn progress_on_the_event_stream_is_relayed_and_server_requests_refused() {
    let (client, upstream) = connected().await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let mut request = call("p", "progress", json!({}));
    request.params.insert("_meta".into(), json!({"progressToken": "tok-1"}));
    request.notifications = Some(tx);
    let reply = client.request(request).await.unwrap();
    let UpstreamReply::Result(result) = reply else { panic!("{reply:?}") };
    assert_eq!(result["content"][0]["text"], "done");

    let sent = &upstream.seen_method("tools/call")[0].body["params"]["_meta"];
    assert_eq!(sent["progressToken"], "tok-1", "the caller's _meta keys are kept");
    assert_eq!(sent["io.modelcontextprotocol/protocolVersion"], "2026-07-28");

    let mut relayed = Vec::new();
    while let Ok(notification) = rx.try_recv() {
        relayed.push(notification);
    }
    assert_eq!(relayed.len(), 2, "progress only (no list_changed): {relayed:?}");
    assert_eq!(relayed[0]["method"], "notifications/progress");
    assert_eq!(relayed[0]["params"]["progress"], 1);
    assert_eq!(relayed[1]["params"]["progress"], 2);
    assert_eq!(relayed[1]["params"]["progressToken"], "tok-1");

    // The sampling request was answered to the upstream with -32601.
    let deadline = Instant::now() + Duration::from_secs(5);
    let answer = loop {
        let answers: Vec<Seen> =
            upstream.seen().into_iter().filter(|s| s.body.get("method").is_none() && s.body["id"] == "srv-1").collect();
        if let Some(answer) = answers.into_iter().next() {
            break answer;
        }
        assert!(Instant::now() < deadline, "the upstream's request was never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(answer.body["error"]["code"], -32601);
    assert_eq!(answer.body["error"]["message"], "not supported through this gateway");
}

#[tokio::test]
async fn input_required_and_errors_pass_through() {
    let (client, _) = connected().await;
    match client.request(call("p", "input", json!({}))).await.unwrap() {
        UpstreamReply::InputRequired { input_requests, request_state } => {
            assert_eq!(input_requests["confirm"]["method"], "elicitation/create");
            assert_eq!(input_requests["confirm"]["params"]["message"], "sure?");
            assert_eq!(request_state, Some(json!("opaque-state-1")));
        }
        other => panic!("unexpected {other:?}"),
    }
    match client.request(call("p", "failing", json!({}))).await.unwrap() {
        UpstreamReply::Error { code, message, .. } => {
            assert_eq!(code, -32000);
            assert!(message.starts_with("boom"));
            assert_eq!(message.chars().count(), 200, "truncated");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn the_upstream_sees_only_the_protocol_headers() {
    let (client, upstream) = connected().await;
    client.list(ListKind::Tools).await.unwrap();
    let reply = client.request(call("alice", "echo", json!({"region": "eu-west", "text": "hi"}))).await.unwrap();
    assert!(matches!(reply, UpstreamReply::Result(_)));
    let seen = &upstream.seen_method("tools/call")[0];
    assert_eq!(seen.http_method, Method::POST);
    let names: BTreeSet<&str> = seen.headers.keys().map(|name| name.as_str()).collect();
    let expected: BTreeSet<&str> = [
        "host",
        "content-type",
        "content-length",
        "accept",
        "mcp-protocol-version",
        "mcp-method",
        "mcp-name",
        "mcp-param-region",
    ]
    .into_iter()
    .collect();
    assert_eq!(names, expected);
    assert_eq!(seen.header("mcp-method"), Some("tools/call"));
    assert_eq!(seen.header("mcp-name"), Some("echo"));
    assert_eq!(seen.header("mcp-param-region"), Some("eu-west"));
    assert_eq!(seen.header("content-type"), Some("application/json"));
    for seen in upstream.seen() {
        for (name, value) in &seen.headers {
            assert!(!value.as_bytes().windows(6).any(|w| w == b"caller"), "{name} carries the caller's token");
        }
        assert!(seen.headers.get("authorization").is_none());
        assert!(seen.headers.get("cookie").is_none());
    }

    // A name that is not plain visible ASCII goes base64-encoded.
    client.request(call("alice", "héllo wörld", json!({}))).await.unwrap();
    let seen = upstream.seen_method("tools/call").pop().unwrap();
    let name = seen.header("mcp-name").unwrap();
    assert!(name.starts_with("=?base64?"), "{name}");
    assert_eq!(palisade_wire::header::decode_value(name.as_bytes()).unwrap(), "héllo wörld");
}

#[tokio::test]
async fn an_insufficient_scope_refusal_without_step_up_is_insufficient_scope() {
    let (client, upstream) = connected().await;
    match client.request(call("p", "scope", json!({}))).await {
        Err(UpstreamError::InsufficientScope(scopes)) => assert_eq!(scopes, ["files:write"]),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(upstream.seen_method("tools/call").len(), 1, "no retry when the credential cannot step up");
    assert!(client.health().healthy, "a scope refusal is not an outage");
}

#[tokio::test]
async fn an_insufficient_scope_refusal_steps_up_once_and_retries() {
    let (url, upstream) = modern_upstream().await;
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), "client-secret\n").unwrap();
    let config = CredentialConfig::ClientCredentials {
        token_url: url.join("/token").unwrap(),
        client_id: "gateway".into(),
        client_secret: SecretSource::File(secret.path().to_owned()),
        scopes: vec!["files:read".into()],
        max_scopes: vec!["files:write".into()],
        auth: ClientAuth::Basic,
    };
    let credential = UpstreamCredential::from_config(&config, &url, Arc::new(SystemClock)).unwrap();
    let client = UpstreamClient::new("up-1", url, ProtocolChoice::Modern, limits(), Arc::new(credential)).unwrap();
    let reply = client.request(call("p", "scoped", json!({}))).await.unwrap();
    assert!(matches!(&reply, UpstreamReply::Result(r) if r["content"][0]["text"] == "written"), "{reply:?}");
    let calls = upstream.seen_method("tools/call");
    assert_eq!(calls.len(), 2, "refused once, retried once");
    assert_eq!(calls[0].header("authorization"), Some("Bearer tok.files-read"));
    let widened = calls[1].header("authorization").unwrap();
    assert!(widened.contains("files-read") && widened.contains("files-write"), "{widened}");
    assert_ne!(calls[0].body["id"], calls[1].body["id"], "the retry has a new id");

    // Once stepped up to the maximum, a further refusal is final.
    upstream.seen.lock().unwrap().clear();
    match client.request(call("p", "scope", json!({}))).await {
        Err(UpstreamError::InsufficientScope(scopes)) => assert_eq!(scopes, ["files:write"]),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(upstream.seen_method("tools/call").len(), 1);
}

#[tokio::test]
async fn the_change_stream_asks_for_the_resources_given_and_yields_their_updates() {
    let (client, upstream) = connected().await;
    assert_eq!(client.subscribing(), palisade_gateway::upstream::Subscribing::InListen);
    let wanted: std::collections::BTreeSet<String> = ["demo://a".to_owned(), "demo://b".to_owned()].into();
    let changes: Vec<Change> = client.changes(&wanted).await.unwrap().collect().await;
    assert_eq!(
        changes,
        [
            Change::ListChanged("notifications/tools/list_changed".into()),
            Change::ResourceUpdated("demo://a".into()),
            Change::ResourceUpdated("demo://b".into()),
        ],
        "the updates of our own subscription only"
    );
    let listen = &upstream.seen_method("subscriptions/listen")[0];
    assert_eq!(
        listen.body["params"]["notifications"],
        json!({"toolsListChanged": true, "resourceSubscriptions": ["demo://a", "demo://b"]})
    );
}

#[tokio::test]
async fn the_change_stream_yields_list_changed_of_its_own_subscription() {
    let (client, upstream) = connected().await;
    let changes: Vec<Change> = client.changes(&Default::default()).await.unwrap().collect().await;
    assert_eq!(
        changes,
        [Change::ListChanged("notifications/tools/list_changed".into())],
        "one, of our subscription; then the end"
    );
    let listen = &upstream.seen_method("subscriptions/listen")[0];
    assert_eq!(listen.body["params"]["notifications"], json!({"toolsListChanged": true}));
    assert_eq!(listen.body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"], "2026-07-28");
}

#[tokio::test]
async fn bad_construction_and_unrelayed_methods_are_refused() {
    let credential = Arc::new(UpstreamCredential::none());
    let url = url::Url::parse("http://127.0.0.1:1/mcp").unwrap();
    for bad in ["", "has space", &"x".repeat(64)] {
        assert!(UpstreamClient::new(bad, url.clone(), ProtocolChoice::Auto, limits(), credential.clone()).is_err());
    }
    for bad in ["ftp://h/x", "http://user:pw@h/x"] {
        let bad = url::Url::parse(bad).unwrap();
        assert!(UpstreamClient::new("u", bad, ProtocolChoice::Auto, limits(), credential.clone()).is_err());
    }
    let zero = UpstreamLimits { max_response_bytes: 0, ..limits() };
    assert!(UpstreamClient::new("u", url.clone(), ProtocolChoice::Auto, zero, credential.clone()).is_err());

    // Nothing listens on port 1: unavailable, never a panic.
    let client = client(&url, ProtocolChoice::Auto, limits());
    assert_eq!(client.id(), "up-1");
    assert_eq!(client.url(), &url);
    assert!(matches!(client.connect().await, Err(UpstreamError::Unavailable(_))));

    let (client, _) = connected().await;
    let mut request = call("p", "echo", json!({}));
    request.method = "initialize";
    assert!(matches!(client.request(request).await, Err(UpstreamError::Protocol(_))));
}

#[tokio::test]
async fn a_cancelled_request_ends_at_once() {
    let (client, _) = connected().await;
    let request = call("p", "slow", json!({}));
    let cancel = request.cancel.clone();
    let started = Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    assert!(matches!(client.request(request).await, Err(UpstreamError::Cancelled)));
    assert!(started.elapsed() < Duration::from_secs(4), "did not wait for the upstream");
    assert!(client.health().healthy, "a cancellation is not an outage");
}
