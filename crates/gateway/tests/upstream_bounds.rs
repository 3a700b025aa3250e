//! The per-upstream bounds against a hostile local upstream that floods: server-to-client
//! requests in one answer's event stream, the same on the change stream, and a change stream
//! that never stops sending bytes. The upstream counts the connections it accepts and holds
//! every refusal it receives open, so the refusals in flight are the connections they opened.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use futures::StreamExt as _;
use palisade_gateway::credentials::{CallerContext, UpstreamCredential};
use palisade_gateway::upstream::{
    CHANGE_STREAM_MAX_BYTES, MAX_CONCURRENT_REFUSALS, ProtocolChoice, UpstreamClient, UpstreamLimits, UpstreamReply,
    UpstreamRequest,
};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

/// Server-to-client requests in one flood.
const FLOOD: usize = 2000;

/// What the change stream sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listen {
    /// `roots/list` requests, [`FLOOD`] of them, then nothing (the stream stays open).
    Requests,
    /// SSE comments without end.
    Bytes,
}

struct Upstream {
    listen: Listen,
    /// Every connection accepted (its peer address).
    peers: Mutex<HashSet<SocketAddr>>,
    /// Refusals received (each held open, never answered).
    refusals: AtomicUsize,
    /// Bytes of the endless change stream sent.
    stream_bytes: AtomicUsize,
}

fn sse_event(value: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {}\n\n", serde_json::to_string(value).unwrap()))
}

fn sse(events: impl futures::Stream<Item = Bytes> + Send + 'static) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(events.map(Ok::<_, Infallible>)))
        .unwrap()
}

fn result(id: &Value, result: Value) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "result": result})).unwrap()))
        .unwrap()
}

fn requests(method: &'static str) -> impl futures::Stream<Item = Bytes> {
    futures::stream::iter(
        (0..FLOOD).map(move |n| sse_event(&json!({"jsonrpc": "2.0", "id": format!("srv-{n}"), "method": method}))),
    )
}

async fn handle(
    State(state): State<Arc<Upstream>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Bytes,
) -> Response {
    state.peers.lock().unwrap().insert(peer);
    let rpc: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = rpc["id"].clone();
    match rpc["method"].as_str() {
        None => {
            // A refusal: held open, so it keeps its connection for as long as the gateway waits.
            state.refusals.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
            unreachable!()
        }
        Some("server/discover") => result(
            &id,
            json!({
                "resultType": "complete", "supportedVersions": ["2026-07-28"], "ttlMs": 0, "cacheScope": "public",
                "capabilities": {"tools": {"listChanged": true}},
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "flood", "version": "1"}},
            }),
        ),
        Some("subscriptions/listen") => match state.listen {
            Listen::Requests => sse(requests("roots/list").chain(futures::stream::pending())),
            Listen::Bytes => {
                let chunk = Bytes::from(format!(": {}\n", "x".repeat(64 * 1024 - 3)));
                let state = state.clone();
                sse(futures::stream::repeat(chunk).inspect(move |chunk| {
                    state.stream_bytes.fetch_add(chunk.len(), Ordering::SeqCst);
                }))
            }
        },
        Some("tools/call") if rpc["params"]["name"] == "flood" => {
            let answer = sse_event(&json!({"jsonrpc": "2.0", "id": id, "result": {
                "resultType": "complete", "content": [{"type": "text", "text": "answered"}]}}));
            sse(requests("sampling/createMessage").chain(futures::stream::iter([answer])))
        }
        Some("tools/call") => {
            result(&id, json!({"resultType": "complete", "content": [{"type": "text", "text": "echo"}]}))
        }
        Some(_) => Response::builder().status(StatusCode::NOT_FOUND).body(Body::empty()).unwrap(),
    }
}

async fn upstream(listen: Listen) -> (UpstreamClient, Arc<Upstream>) {
    let state = Arc::new(Upstream {
        listen,
        peers: Mutex::new(HashSet::new()),
        refusals: AtomicUsize::new(0),
        stream_bytes: AtomicUsize::new(0),
    });
    let router = axum::Router::new().route("/mcp", post(handle)).with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
    });
    let url = url::Url::parse(&format!("http://{address}/mcp")).unwrap();
    let limits = UpstreamLimits { request_timeout: Duration::from_secs(20), ..UpstreamLimits::default() };
    let client =
        UpstreamClient::new("flood", url, ProtocolChoice::Modern, limits, Arc::new(UpstreamCredential::none()))
            .unwrap();
    client.connect().await.unwrap();
    (client, state)
}

fn call(name: &str) -> UpstreamRequest<'static> {
    let mut params = Map::new();
    params.insert("name".into(), json!(name));
    params.insert("arguments".into(), json!({}));
    UpstreamRequest {
        method: "tools/call",
        params,
        caller: CallerContext { partition: "p", subject_token: None, user: None },
        client_capabilities: None,
        notifications: None,
        asks: None,
        cancel: CancellationToken::new(),
    }
}

fn text(reply: UpstreamReply) -> String {
    match reply {
        UpstreamReply::Result(result) => result["content"][0]["text"].as_str().unwrap().to_owned(),
        other => panic!("unexpected {other:?}"),
    }
}

/// Waits (up to 10 s) until `done` holds.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_flood_of_server_requests_in_one_answer_opens_at_most_the_cap_of_connections() {
    let (client, upstream) = upstream(Listen::Requests).await;
    assert_eq!(text(client.request(call("flood")).await.unwrap()), "answered", "the caller still gets its answer");
    eventually("the refusals in flight reach the cap", || {
        upstream.refusals.load(Ordering::SeqCst) >= MAX_CONCURRENT_REFUSALS
    })
    .await;
    // Every refusal is held open: the rest of the flood found the cap reached and was dropped.
    let dropped = client.health().dropped.refusals;
    assert_eq!(dropped, u64::try_from(FLOOD - MAX_CONCURRENT_REFUSALS).unwrap());
    assert_eq!(upstream.refusals.load(Ordering::SeqCst), MAX_CONCURRENT_REFUSALS);
    // The connection of discover and the call, and one per refusal in flight.
    let peers = upstream.peers.lock().unwrap().len();
    assert!(peers <= MAX_CONCURRENT_REFUSALS + 2, "{peers} connections accepted");
    // The cap is per upstream and its places are taken: another caller is still answered.
    assert_eq!(text(client.request(call("echo")).await.unwrap()), "echo");
    assert_eq!(client.health().dropped.change_streams_cut, 0);
}

#[tokio::test]
async fn a_flood_of_server_requests_on_the_change_stream_closes_it_within_the_caps() {
    let (client, upstream) = upstream(Listen::Requests).await;
    let mut changes = Box::pin(client.changes(&Default::default()).await.unwrap());
    let ended = tokio::time::timeout(Duration::from_secs(10), changes.next()).await;
    assert!(matches!(ended, Ok(None)), "the stream is closed past its message rate");
    let report = client.health().dropped;
    assert_eq!(report.change_streams_cut, 1);
    assert!(report.refusals > 0, "refusals past the cap were dropped");
    eventually("the refusals in flight reach the cap", || {
        upstream.refusals.load(Ordering::SeqCst) >= MAX_CONCURRENT_REFUSALS
    })
    .await;
    assert_eq!(upstream.refusals.load(Ordering::SeqCst), MAX_CONCURRENT_REFUSALS);
    let peers = upstream.peers.lock().unwrap().len();
    assert!(peers <= MAX_CONCURRENT_REFUSALS + 2, "{peers} connections accepted");
    assert_eq!(text(client.request(call("echo")).await.unwrap()), "echo", "callers are still answered");
}

#[tokio::test]
async fn a_change_stream_that_never_stops_sending_is_closed_at_its_byte_cap() {
    let (client, upstream) = upstream(Listen::Bytes).await;
    let mut changes = Box::pin(client.changes(&Default::default()).await.unwrap());
    let ended = tokio::time::timeout(Duration::from_secs(30), changes.next()).await;
    assert!(matches!(ended, Ok(None)), "the stream is closed at its byte cap");
    assert_eq!(client.health().dropped.change_streams_cut, 1);
    assert!(upstream.stream_bytes.load(Ordering::SeqCst) > CHANGE_STREAM_MAX_BYTES);
    assert_eq!(text(client.request(call("echo")).await.unwrap()), "echo");
}
