//! Resource URIs and resource updates through `palisade gateway`: a tool result's
//! `resource_link` and embedded `resource` blocks name URIs in the gateway's namespace, readable
//! through it (server-everything over stdio and over HTTP); an upstream's resource updates reach
//! exactly the callers who listen for that resource (a 2026-07-28 `subscriptions/listen`, a
//! 2025-era `resources/subscribe` with its GET stream), from a 2026-07-28 and a 2025-era upstream,
//! never a caller without the upstream's scope; and a real client (the Python SDK) gets them on
//! both wires.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway_pins::{Gateway, PATIENCE, boot, palisade, post, upstream};
use crate::gateway_stdio_servers::{approve_and_serve, node_modules, stdio_entry, test_tools, text};
use crate::harness::{Exchange, Palisade, Stream, send, with_meta};

/// How long one read of a stream waits before the test looks again (not an assertion).
const POLL: Duration = Duration::from_millis(500);

const UPDATED: &str = "notifications/resources/updated";
const LIST_CHANGED: &str = "notifications/resources/list_changed";

/// A 2026-07-28 request of `method` with `params` (`Mcp-Name` for a read).
async fn request(server: &Palisade, token: &str, method: &str, params: Value) -> Exchange {
    let params = with_meta(params, json!({}));
    let mut builder = post(server, token, method);
    if let Some(uri) = params.get("uri").and_then(Value::as_str) {
        builder = builder.header("mcp-name", palisade_wire::header::encode_value(uri));
    }
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    send(builder.body(body.to_string())).await
}

/// A `subscriptions/listen` stream with `filter`, once acknowledged; returns the stream and the
/// honoured filter.
async fn listen(server: &Palisade, token: &str, filter: Value) -> (Stream, Value) {
    let params = with_meta(json!({ "notifications": filter }), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": "listen", "method": "subscriptions/listen", "params": params });
    let mut stream = Stream::open(post(server, token, "subscriptions/listen").body(body.to_string())).await;
    let ack = stream.next(PATIENCE).await.expect("the listen stream is acknowledged");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    (stream, ack["params"]["notifications"].clone())
}

/// A 2025-era caller: its session, and its POSTs and GET stream.
struct Legacy<'a> {
    server: &'a Palisade,
    token: String,
    session: String,
}

impl<'a> Legacy<'a> {
    async fn initialize(server: &'a Palisade, token: &str) -> Self {
        let body = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "it", "version": "0" } } });
        let response = Self::post_to(server, token, None, &body).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let session = response.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let legacy = Self { server, token: token.to_owned(), session };
        let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let answered = Self::post_to(server, token, Some(&legacy.session), &initialized).send().await.unwrap();
        assert_eq!(answered.status(), 202);
        legacy
    }

    fn post_to(server: &Palisade, token: &str, session: Option<&str>, body: &Value) -> reqwest::RequestBuilder {
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

    async fn call(&self, method: &str, params: Value) -> Exchange {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        send(Self::post_to(self.server, &self.token, Some(&self.session), &body)).await
    }

    async fn stream(&self) -> Stream {
        let get = reqwest::Client::new()
            .get(&self.server.url)
            .header("accept", "text/event-stream")
            .header("authorization", format!("Bearer {}", self.token))
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", "2025-11-25");
        Stream::open(get).await
    }
}

/// Reads `stream` until a frame of `method` arrives (bounded by [`PATIENCE`], `poke` run between
/// reads to make the upstream change); returns every frame read, that one last.
async fn frames_until<F: Future<Output = ()>>(stream: &mut Stream, method: &str, poke: impl Fn() -> F) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut frames = Vec::new();
    loop {
        poke().await;
        while let Some(frame) = stream.next(POLL).await {
            let done = frame["method"] == method;
            frames.push(frame);
            if done {
                return frames;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no {method} arrived; read {frames:?}");
    }
}

/// Every frame `stream` carries until it has been quiet for [`POLL`].
async fn drain(stream: &mut Stream) -> Vec<Value> {
    let mut frames = Vec::new();
    while let Some(frame) = stream.next(POLL).await {
        frames.push(frame);
    }
    frames
}

fn methods(frames: &[Value]) -> Vec<&str> {
    frames.iter().filter_map(|frame| frame["method"].as_str()).collect()
}

/// The resources `token` is served (nothing while none is).
async fn resource_uris(server: &Palisade, token: &str) -> Vec<String> {
    let listing = request(server, token, "resources/list", json!({})).await;
    let Some(resources) = listing.response()["result"]["resources"].as_array() else { return Vec::new() };
    resources.iter().filter_map(|r| r["uri"].as_str().map(str::to_owned)).collect()
}

async fn wait_for_resource(server: &Palisade, token: &str, uri: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let listed = resource_uris(server, token).await;
        if listed.iter().any(|listed| listed == uri) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{uri} is never served; served {listed:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Palisade's own conformance app as both a 2026-07-28 upstream (`fx`) and a 2025-era one (`fl`),
/// each needing the scope `fx:read`; its `test_trigger_resource_update` updates
/// `test://watched-resource` and then announces a resource list change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_updates_from_both_upstream_eras_reach_exactly_the_callers_who_listen() {
    let upstream_server = Palisade::start_app("conformance", &[]);
    let scoped = "scopes = [\"fx:read\"]";
    let config = [
        upstream("fx", &upstream_server.url, scoped),
        upstream("fl", &upstream_server.url, &format!("protocol = \"2025\"\n{scoped}")),
    ]
    .concat();
    let gateway = boot("", &config);
    gateway.approve_all("fx");
    gateway.approve_all("fl");
    let token = |subject: &str, scope: &str| gateway.token(subject, scope);
    let (alice, bob, carol, mallory) =
        (token("alice", "fx:read"), token("bob", "fx:read"), token("carol", "fx:read"), token("mallory", ""));
    for prefix in ["fx", "fl"] {
        let uri = format!("{prefix}+test://watched-resource");
        let trigger = format!("{prefix}_test_trigger_resource_update");
        wait_for_resource(&gateway.server, &alice, &uri).await;
        gateway.wait_tools(&alice, "the trigger is served", |tools| tools.contains(&trigger)).await;
        let (on, caller, tool) = (&gateway, &alice, &trigger);
        let poke = move || async move { assert_eq!(on.call(caller, tool, json!({})).await.status, 200) };

        // alice listens for the resource (2026-07-28); carol only for list changes; bob
        // subscribes on a 2025-era session; mallory, without the scope, can do neither.
        let (mut alice_stream, honoured) =
            listen(&gateway.server, &alice, json!({ "resourceSubscriptions": [uri] })).await;
        assert_eq!(honoured["resourceSubscriptions"], json!([uri]), "{prefix}");
        let (mut carol_stream, _) = listen(&gateway.server, &carol, json!({ "resourcesListChanged": true })).await;
        let bob_session = Legacy::initialize(&gateway.server, &bob).await;
        let mut bob_stream = bob_session.stream().await;
        let subscribed = bob_session.call("resources/subscribe", json!({ "uri": uri })).await;
        assert_eq!(subscribed.result(), &json!({}), "{prefix}: {:?}", subscribed.response());
        let params = with_meta(json!({ "notifications": { "resourceSubscriptions": [uri] } }), json!({}));
        let body = json!({ "jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen", "params": params });
        let refused = send(post(&gateway.server, &mallory, "subscriptions/listen").body(body.to_string())).await;
        assert!(refused.response().get("error").is_some(), "{prefix}: {:?}", refused.response());
        let mallory_session = Legacy::initialize(&gateway.server, &mallory).await;
        let mut mallory_stream = mallory_session.stream().await;
        let refused = mallory_session.call("resources/subscribe", json!({ "uri": uri })).await;
        assert!(refused.response().get("error").is_some(), "{prefix}: {:?}", refused.response());

        // The gateway subscribes at the upstream for them: the update reaches alice and bob
        // under the gateway's URI.
        let frames = frames_until(&mut alice_stream, UPDATED, poke).await;
        let update = frames.last().unwrap();
        assert_eq!(update["params"]["uri"], uri.as_str(), "{prefix}: {update}");
        assert_eq!(update["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen");
        let frames = frames_until(&mut bob_stream, UPDATED, poke).await;
        assert_eq!(frames.last().unwrap()["params"]["uri"], uri.as_str(), "{prefix}");

        // Now that updates flow, carol (not subscribed) and mallory (no scope) get the list
        // change the upstream sends after each update, and never the update.
        for (who, stream) in [("carol", &mut carol_stream), ("mallory", &mut mallory_stream)] {
            let mut frames = drain(stream).await;
            frames.extend(frames_until(stream, LIST_CHANGED, poke).await);
            assert!(!methods(&frames).contains(&UPDATED), "{prefix}: {who} got {frames:?}");
        }

        // bob unsubscribes: the next updates reach alice, not him.
        let unsubscribed = bob_session.call("resources/unsubscribe", json!({ "uri": uri })).await;
        assert_eq!(unsubscribed.result(), &json!({}));
        drain(&mut bob_stream).await;
        drain(&mut alice_stream).await;
        frames_until(&mut alice_stream, UPDATED, poke).await;
        let frames = frames_until(&mut bob_stream, LIST_CHANGED, || async {}).await;
        assert!(!methods(&frames).contains(&UPDATED), "{prefix}: bob unsubscribed, got {frames:?}");
    }

    // Every stream is closed: nobody listens any more, and the gateway unsubscribed at the
    // 2025-era upstream (whose audit log records the gateway's requests).
    let envs = [("PALISADE_DATA_DIR", upstream_server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (code, shown, stderr) = palisade(&["audit", "show", "--format", "json", "--limit", "10000"], &envs);
        assert_eq!(code, 0, "{stderr}");
        let operations: Vec<String> = shown
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter_map(|record| record["operation"].as_str().map(str::to_owned))
            .filter(|operation| operation.ends_with(":test://watched-resource") && operation.starts_with("resources/"))
            .collect();
        let subscribed = operations.iter().any(|op| op == "resources/subscribe:test://watched-resource");
        if subscribed && operations.last().is_some_and(|op| op == "resources/unsubscribe:test://watched-resource") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the gateway never unsubscribed: {operations:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The Python SDK client (tests/interop/py_resource_updates_client.py) listens (2026-07-28)
/// and subscribes (2025-era session) to a resource of a 2026-07-28 upstream behind the gateway,
/// and gets its update under the gateway's URI on both wires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_client_gets_resource_updates_through_the_gateway_on_both_wires() {
    let upstream_server = Palisade::start_app("conformance", &[]);
    let gateway = boot("", &upstream("fx", &upstream_server.url, ""));
    gateway.approve_all("fx");
    let token = gateway.token("alice", "");
    let uri = "fx+test://watched-resource";
    wait_for_resource(&gateway.server, &token, uri).await;
    let trigger = "fx_test_trigger_resource_update";
    gateway.wait_tools(&token, "the trigger is served", |tools| tools.iter().any(|t| t == trigger)).await;
    let driver = format!("{}/../../tests/interop/py_resource_updates_client.py", env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(test_tools().join("py/bin/python"))
        .args([driver.as_str(), gateway.server.url.as_str(), uri, trigger])
        .env("INTEROP_TOKEN", &token)
        .output()
        .expect("run the Python client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<Value> = stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0], json!({ "wire": "2026-07-28", "honored": [uri], "updated": uri }));
    assert_eq!(lines[1], json!({ "wire": "legacy", "negotiated": "2025-11-25", "updated": uri }));
}

/// What server-everything's resource tools return through the gateway: every resource URI in a
/// result is the gateway's (`every+demo://…`) and reads through it; the text that mentions the
/// upstream's URI is relayed as sent.
async fn resource_results_are_readable(gateway: &Gateway, token: &str) {
    let links = gateway.call(token, "every_get-resource-links", json!({ "count": 2 })).await;
    assert_eq!(links.status, 200, "{:?}", links.response());
    let content = links.result()["content"].as_array().unwrap().clone();
    let uris: Vec<&str> =
        content.iter().filter(|b| b["type"] == "resource_link").filter_map(|b| b["uri"].as_str()).collect();
    assert_eq!(uris, ["every+demo://resource/dynamic/blob/1", "every+demo://resource/dynamic/text/2"], "{content:?}");
    for uri in uris {
        let read = request(&gateway.server, token, "resources/read", json!({ "uri": uri })).await;
        assert_eq!(read.status, 200, "{uri}: {:?}", read.response());
        assert_eq!(read.result()["contents"][0]["uri"], uri, "{:?}", read.response());
    }
    let reference =
        gateway.call(token, "every_get-resource-reference", json!({ "resourceType": "Text", "resourceId": 3 })).await;
    let content = reference.result()["content"].as_array().unwrap().clone();
    let embedded = content.iter().find(|b| b["type"] == "resource").unwrap_or_else(|| panic!("{content:?}"));
    assert_eq!(embedded["resource"]["uri"], "every+demo://resource/dynamic/text/3");
    let mentions =
        content.iter().filter_map(|b| b["text"].as_str()).any(|t| t.contains(" demo://resource/dynamic/text/3"));
    assert!(mentions, "text that mentions the upstream's URI is not rewritten: {content:?}");
    let read = request(&gateway.server, token, "resources/read", json!({ "uri": embedded["resource"]["uri"] })).await;
    // The upstream stamps each text with the time it made it: the resource is the same one.
    let text = read.result()["contents"][0]["text"].as_str().unwrap_or_else(|| panic!("{:?}", read.response()));
    assert!(text.starts_with("Resource 3: This is a plaintext resource created at "), "{text}");
}

/// server-everything over stdio (one process for every caller: its simulated updates are per
/// process): resource results are in the gateway's namespace, and its updates of a resource
/// reach the caller listening for it, not another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_stdio_links_resources_in_the_gateway_namespace_and_sends_updates() {
    let modules = node_modules();
    let node = test_tools().join("bin/node");
    let server = modules.join("@modelcontextprotocol/server-everything/dist/index.js");
    let entry = stdio_entry("every", text(&node), &[text(&server), "stdio"], &[&modules], "shared = true");
    let mut under_test = crate::gateway_boundary::GatewayUnderTest::new(&entry);
    under_test.start();
    let token = approve_and_serve(&under_test, "every", &["get-resource-links", "toggle-subscriber-updates"]).await;
    let gateway = Gateway { server: under_test.server.take().unwrap(), config: under_test.config.clone() };
    resource_results_are_readable(&gateway, &token).await;

    let uri = "every+demo://resource/dynamic/text/1";
    let (mut listening, honoured) = listen(&gateway.server, &token, json!({ "resourceSubscriptions": [uri] })).await;
    assert_eq!(honoured["resourceSubscriptions"], json!([uri]));
    let other = under_test.token("bob");
    let (mut not_listening, _) = listen(&gateway.server, &other, json!({ "toolsListChanged": true })).await;
    let toggled = gateway.call(&token, "every_toggle-subscriber-updates", json!({})).await;
    assert_eq!(toggled.status, 200, "{:?}", toggled.response());
    let frames = frames_until(&mut listening, UPDATED, || async {}).await;
    assert_eq!(frames.last().unwrap()["params"]["uri"], uri);
    // Updates keep coming to the listener; the other caller's stream carries none of them.
    frames_until(&mut listening, UPDATED, || async {}).await;
    let frames = drain(&mut not_listening).await;
    assert!(!methods(&frames).contains(&UPDATED), "{frames:?}");
}

/// server-everything over Streamable HTTP (started on a free loopback port): the same resource
/// results, in the gateway's namespace and readable through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_http_links_resources_in_the_gateway_namespace() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let everything = node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
    let loopback = format!("{}/../../tests/interop/loopback_only.cjs", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new(test_tools().join("bin/node"))
        .args(["-r", loopback.as_str(), text(&everything), "streamableHttp"])
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start server-everything");
    let deadline = std::time::Instant::now() + PATIENCE;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "server-everything never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    let gateway = boot("", &upstream("every", &format!("http://127.0.0.1:{port}/mcp"), ""));
    gateway.approve_all("every");
    let token = gateway.token("alice", "");
    gateway.wait_tools(&token, "served", |tools| tools.iter().any(|t| t == "every_get-resource-reference")).await;
    resource_results_are_readable(&gateway, &token).await;
    let _ = child.kill();
    let _ = child.wait();
}
