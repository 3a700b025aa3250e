//! Version negotiation across upstreams through the real binary: what `server/discover` and the
//! 2025 `initialize` offer follows what the upstreams declare (`resources.subscribe`,
//! `completions`), and each era's caller is served by an upstream of the other era: a 2026-07-28
//! caller by Palisade's conformance fixture spoken to as a 2025-only upstream (`protocol =
//! "2025"`: its log level becomes the session's, its capabilities the session's declaration, its
//! result gets `resultType`), and a 2025-11-25 caller by the same fixture on 2026-07-28.

use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway_boundary::GatewayUnderTest;
use crate::harness::{Exchange, Palisade, Stream, meta, send};
use crate::upstream_fixture::{Upstream, tool};

/// The fixture's tools these tests call.
const FIXTURE_TOOLS: &[&str] = &["test_logging_tool", "test_missing_capability", "test_simple_text"];

/// Palisade's conformance fixture behind a gateway as its unprefixed upstream `fx`, spoken to
/// at `protocol` (`"2025"` or `"2026-07-28"`); every definition approved; and a caller's token.
async fn fixture_behind_gateway(protocol: &str) -> (Palisade, GatewayUnderTest, String) {
    let fixture = Palisade::start(&[]);
    let entry =
        // Sampling is relayed for this upstream (it is off by default): the capability tests
        // below need the caller's `sampling` to reach the upstream session.
        format!(
            "[[upstreams]]\nid = \"fx\"\nurl = \"{}\"\nprefix = \"\"\nprotocol = \"{protocol}\"\n\
             [upstreams.client_requests]\nsampling = true\n",
            fixture.url
        );
    let mut gateway = GatewayUnderTest::new(&entry);
    gateway.start();
    gateway.approve_all("fx");
    let token = gateway.token("alice");
    gateway.wait_for_tools(&token, FIXTURE_TOOLS).await;
    (fixture, gateway, token)
}

/// A 2026-07-28 request to the gateway with exactly this `_meta`.
async fn modern(gateway: &GatewayUnderTest, token: &str, method: &str, mut params: Value, meta: Value) -> Exchange {
    params["_meta"] = meta;
    let body = json!({ "jsonrpc": "2.0", "id": 7, "method": method, "params": params });
    let mut request = reqwest::Client::new()
        .post(&gateway.server().url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("authorization", format!("Bearer {token}"));
    if let Some(name) = params.get("name").and_then(Value::as_str) {
        request = request.header("mcp-name", name);
    }
    send(request.body(body.to_string())).await
}

/// The `_meta` of a 2026-07-28 request declaring `capabilities`, with `logLevel` when given.
fn meta_with(capabilities: Value, log_level: Option<&str>) -> Value {
    let mut meta = meta(capabilities);
    if let Some(level) = log_level {
        meta["io.modelcontextprotocol/logLevel"] = json!(level);
    }
    meta
}

/// The data of every `notifications/message` among an answer's frames.
fn logged(answer: &Exchange) -> Vec<Value> {
    answer
        .notifications()
        .into_iter()
        .filter(|frame| frame["method"] == "notifications/message")
        .map(|frame| frame["params"]["data"].clone())
        .collect()
}

/// One 2025-11-25 session with the gateway.
struct Session {
    url: String,
    token: String,
    id: String,
}

impl Session {
    /// `initialize` (declaring `capabilities`) and `notifications/initialized`; returns the
    /// session and the initialize result.
    async fn open(gateway: &GatewayUnderTest, token: &str, capabilities: Value) -> (Self, Value) {
        let mut session = Self { url: gateway.server().url.clone(), token: token.to_owned(), id: String::new() };
        let params = json!({
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities,
            "clientInfo": { "name": "eras-test", "version": "1" }
        });
        let body = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params });
        let response = session.post(body).send().await.unwrap();
        assert_eq!(response.status(), 200);
        session.id = response.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
        let frames = crate::harness::parse_body(&content_type, &response.text().await.unwrap());
        let result = frames.last().expect("an initialize answer")["result"].clone();
        let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        assert_eq!(session.post(initialized).send().await.unwrap().status(), 202);
        (session, result)
    }

    fn post(&self, body: Value) -> reqwest::RequestBuilder {
        let mut request = reqwest::Client::new()
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("authorization", format!("Bearer {}", self.token))
            .body(body.to_string());
        if !self.id.is_empty() {
            request = request.header("mcp-session-id", &self.id);
        }
        request
    }

    async fn request(&self, method: &str, params: Value) -> Exchange {
        send(self.post(json!({ "jsonrpc": "2.0", "id": 3, "method": method, "params": params }))).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_caller_gets_a_2025_upstream_s_logs_at_the_level_its_meta_asks() {
    let (_fixture, mut gateway, token) = fixture_behind_gateway("2025").await;
    let call = json!({ "name": "test_logging_tool", "arguments": {} });

    // The per-request level becomes the upstream session's own (logging/setLevel).
    let answer = modern(&gateway, &token, "tools/call", call.clone(), meta_with(json!({}), Some("info"))).await;
    assert_eq!(answer.result()["content"][0]["text"], "Logging evaluated", "{:?}", answer.frames);
    assert_eq!(logged(&answer), vec![json!("Logging evaluated")], "the info log reached the caller");
    // A 2025 result has no resultType: the caller on 2026-07-28 gets one.
    assert_eq!(answer.result()["resultType"], "complete");

    // A higher level: the session's level changes, nothing at info is relayed.
    let answer = modern(&gateway, &token, "tools/call", call.clone(), meta_with(json!({}), Some("error"))).await;
    assert!(logged(&answer).is_empty(), "nothing below error: {:?}", answer.frames);
    // Back to debug: logs again (the level is set again, not stuck at error).
    let answer = modern(&gateway, &token, "tools/call", call.clone(), meta_with(json!({}), Some("debug"))).await;
    assert_eq!(logged(&answer), vec![json!("Logging evaluated")]);
    // No opt-in, no logs (the 2026-07-28 rule), whatever the upstream session's level.
    let answer = modern(&gateway, &token, "tools/call", call, meta_with(json!({}), None)).await;
    assert!(logged(&answer).is_empty(), "{:?}", answer.frames);
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_caller_s_capabilities_are_what_its_2025_upstream_session_declared() {
    let (_fixture, mut gateway, token) = fixture_behind_gateway("2025").await;
    let call = json!({ "name": "test_missing_capability", "arguments": {} });
    // Same caller, three requests: each is made in a session that declared exactly its own
    // capabilities (one opened first without sampling must not answer for one with it, nor
    // the other way round).
    for (capabilities, succeeds) in [(json!({}), false), (json!({ "sampling": {} }), true), (json!({}), false)] {
        let answer = modern(&gateway, &token, "tools/call", call.clone(), meta_with(capabilities.clone(), None)).await;
        if succeeds {
            assert_eq!(answer.result()["content"][0]["text"], "Success", "{capabilities}: {:?}", answer.frames);
        } else {
            assert_eq!(answer.error_code(), -32021, "{capabilities}: {:?}", answer.frames);
        }
    }
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2025_caller_gets_a_2026_upstream_s_logs_at_its_session_level() {
    let (_fixture, mut gateway, token) = fixture_behind_gateway("2026-07-28").await;
    let (session, initialized) = Session::open(&gateway, &token, json!({})).await;
    assert_eq!(initialized["protocolVersion"], "2025-11-25");
    let call = json!({ "name": "test_logging_tool", "arguments": {} });
    let set = session.request("logging/setLevel", json!({ "level": "info" })).await;
    assert!(set.response().get("result").is_some(), "{:?}", set.frames);
    let answer = session.request("tools/call", call.clone()).await;
    assert_eq!(answer.result()["content"][0]["text"], "Logging evaluated", "{:?}", answer.frames);
    assert_eq!(logged(&answer), vec![json!("Logging evaluated")], "the session's level went as _meta logLevel");
    assert!(answer.result().get("resultType").is_none_or(|kind| kind == "complete"));
    let set = session.request("logging/setLevel", json!({ "level": "critical" })).await;
    assert!(set.response().get("result").is_some(), "{:?}", set.frames);
    let answer = session.request("tools/call", call).await;
    assert!(logged(&answer).is_empty(), "{:?}", answer.frames);
    gateway.stop();
}

/// `server/discover`'s and the 2025 `initialize`'s capabilities, for `token`.
async fn offered(gateway: &GatewayUnderTest, token: &str) -> (Value, Value) {
    let discovered = modern(gateway, token, "server/discover", json!({}), meta(json!({}))).await;
    let (_, initialized) = Session::open(gateway, token, json!({})).await;
    (discovered.result()["capabilities"].clone(), initialized["capabilities"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_and_initialize_offer_subscriptions_and_completions_only_where_an_upstream_does() {
    // The conformance fixture declares resources.subscribe and completions: both are offered,
    // in both eras.
    let (_fixture, mut gateway, token) = fixture_behind_gateway("auto").await;
    for capabilities in <[Value; 2]>::from(offered(&gateway, &token).await) {
        assert_eq!(capabilities["resources"]["subscribe"], true, "{capabilities}");
        assert!(capabilities["completions"].is_object(), "{capabilities}");
        assert_eq!(capabilities["tools"]["listChanged"], true, "{capabilities}");
        assert!(capabilities["logging"].is_object(), "{capabilities}");
    }
    gateway.stop();

    // An upstream with resources and prompts but neither subscriptions nor completions.
    let upstream = Upstream::start(vec![tool("echo", "Echoes its arguments.")]).await;
    upstream.set_prompts(vec![json!({ "name": "greet", "arguments": [{ "name": "who" }] })]);
    upstream.set_resources(
        vec![json!({ "uri": "memo://one", "name": "one" })],
        vec![json!({ "uriTemplate": "memo://{id}", "name": "memos" })],
    );
    let mut gateway = GatewayUnderTest::new(&format!("[[upstreams]]\nid = \"plain\"\nurl = \"{}\"\n", upstream.url));
    gateway.start();
    gateway.approve_all("plain");
    let token = gateway.token("alice");
    gateway.wait_for_tools(&token, &["plain_echo"]).await;
    for capabilities in <[Value; 2]>::from(offered(&gateway, &token).await) {
        assert_eq!(capabilities["resources"]["subscribe"], false, "{capabilities}");
        assert_eq!(capabilities["resources"]["listChanged"], true, "the gateway's own: {capabilities}");
        assert!(capabilities.get("completions").is_none(), "{capabilities}");
        assert_eq!(capabilities["prompts"]["listChanged"], true, "{capabilities}");
    }
    // What is not offered is not served: the 2025 subscribe is -32601, completion is -32601,
    // and a listen filter's resource subscriptions are not honoured.
    let (session, _) = Session::open(&gateway, &token, json!({})).await;
    let refused = session.request("resources/subscribe", json!({ "uri": "plain+memo://one" })).await;
    assert_eq!(refused.error_code(), -32601, "{:?}", refused.frames);
    let complete =
        json!({ "ref": { "type": "ref/prompt", "name": "plain_greet" }, "argument": { "name": "who", "value": "a" } });
    let refused = modern(&gateway, &token, "completion/complete", complete, meta(json!({}))).await;
    assert_eq!(refused.error_code(), -32601, "{:?}", refused.frames);
    let listen = json!({
        "jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen",
        "params": {
            "notifications": { "toolsListChanged": true, "resourceSubscriptions": ["plain+memo://one"] },
            "_meta": meta(json!({})),
        }
    });
    let request = reqwest::Client::new()
        .post(&gateway.server().url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .header("authorization", format!("Bearer {token}"))
        .body(listen.to_string());
    let mut stream = Stream::open(request).await;
    let ack = stream.next(Duration::from_secs(10)).await.expect("the listen acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    assert_eq!(ack["params"]["notifications"]["toolsListChanged"], true, "{ack}");
    assert!(ack["params"]["notifications"].get("resourceSubscriptions").is_none(), "not honoured: {ack}");
    drop(stream);
    gateway.stop();
}
