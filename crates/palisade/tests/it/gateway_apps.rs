//! `palisade gateway` end to end with MCP Apps and with upstreams' list caching: a tool's
//! `ui://` resource and its links namespaced per upstream, the UI pinned with its tool (a
//! changed page or CSP is a held tool, and the changed UI is never relayed), the declared CSP
//! relayed as declared and a CSP that would widen the policy refused — with a fixture upstream
//! (named as such) and with `@modelcontextprotocol/server-basic-vanillajs`, the MCP Apps SDK's
//! own example server; and an upstream's `ttlMs` / `cacheScope` respected (a fixture upstream
//! counting its list calls).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway_pins::{Gateway, PATIENCE, boot, post, text_of, upstream};
use crate::gateway_stdio_servers::{node_modules, test_tools};
use crate::harness::{Exchange, send, with_meta};
use crate::upstream_fixture::{Upstream, tool};

/// The MIME type of an MCP Apps UI.
const UI_MIME: &str = "text/html;profile=mcp-app";

/// A 2026-07-28 request of `method` with `params` (and `Mcp-Name` for a read).
async fn request(gateway: &Gateway, token: &str, method: &str, params: Value) -> Exchange {
    let params = with_meta(params, json!({}));
    let mut builder = post(&gateway.server, token, method);
    if let Some(uri) = params.get("uri").and_then(Value::as_str) {
        builder = builder.header("mcp-name", palisade_wire::header::encode_value(uri));
    }
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let exchange = send(builder.body(body.to_string())).await;
    if exchange.status == 200 && exchange.response().get("result").is_some() {
        crate::schema::check_response(method, exchange.response());
    }
    exchange
}

/// The tool `name` as `tools/list` shows it.
async fn listed_tool(gateway: &Gateway, token: &str, name: &str) -> Value {
    let listing = request(gateway, token, "tools/list", json!({})).await;
    let tools = listing.result()["tools"].as_array().cloned().unwrap_or_default();
    tools.into_iter().find(|tool| tool["name"] == name).unwrap_or_else(|| panic!("{name} not listed: {listing:?}"))
}

/// A tool linking to the UI at `uri` in both of the extension's forms.
fn app_tool(name: &str, uri: &str) -> Value {
    let mut tool = tool(name, "Shows the time in an interactive view.");
    tool["_meta"] = json!({ "ui": { "resourceUri": uri, "visibility": ["model", "app"] }, "ui/resourceUri": uri });
    tool
}

/// The fixture upstream's UI page, version `n`.
fn page(n: u32) -> String {
    format!("<!DOCTYPE html><html><body><h1>Clock v{n}</h1><script type=\"module\">/* app */</script></body></html>")
}

/// What the fixture's clock UI declares: a CSP and a permission.
fn declared(connect: &[&str]) -> Value {
    json!({ "ui": {
        "csp": { "connectDomains": connect, "resourceDomains": ["https://cdn.clock.example"] },
        "permissions": { "clipboardWrite": {} },
        "prefersBorder": true
    } })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixture_mcp_app_is_namespaced_pinned_with_its_ui_and_relayed_with_its_declared_csp() {
    let clock_uri = "ui://clock/app.html";
    let widen_uri = "ui://widen/app.html";
    // The fixture upstream (not a real MCP Apps server): one app whose UI declares a CSP, one
    // whose CSP would add a directive of its own.
    let apps = Upstream::start(vec![app_tool("clock", clock_uri), app_tool("widen", widen_uri)]).await;
    let entry = |uri: &str| json!({ "uri": uri, "name": uri, "mimeType": UI_MIME });
    apps.set_resources(vec![entry(clock_uri), entry(widen_uri)], Vec::new());
    apps.set_contents(
        clock_uri,
        json!({ "mimeType": UI_MIME, "text": page(1), "_meta": declared(&["https://api.clock.example"]) }),
    );
    let injected = declared(&["https://api.clock.example; script-src *"]);
    apps.set_contents(widen_uri, json!({ "mimeType": UI_MIME, "text": page(1), "_meta": injected }));
    let gateway = boot("", &upstream("apps", &apps.url, ""));
    let token = gateway.token("alice", "");
    gateway.approve_all("apps");
    gateway.wait_tools(&token, "the clock app served", |tools| tools.iter().any(|t| t == "apps_clock")).await;

    // The tool's links name the UI in the gateway's namespace, the `ui` scheme kept.
    let clock = listed_tool(&gateway, &token, "apps_clock").await;
    assert_eq!(clock["_meta"]["ui"]["resourceUri"], "ui://apps+clock/app.html", "{clock}");
    assert_eq!(clock["_meta"]["ui/resourceUri"], "ui://apps+clock/app.html", "{clock}");
    assert_eq!(clock["_meta"]["ui"]["visibility"], json!(["model", "app"]), "the rest of _meta as sent");
    assert!(clock.get("palisade/uiResource").is_none(), "what is pinned is not what is served: {clock}");
    let listing = request(&gateway, &token, "resources/list", json!({})).await;
    let uris: Vec<&str> =
        listing.result()["resources"].as_array().unwrap().iter().filter_map(|r| r["uri"].as_str()).collect();
    assert!(uris.contains(&"ui://apps+clock/app.html"), "{uris:?}");

    // The UI is relayed with the CSP and permissions it declares, exactly.
    let read = request(&gateway, &token, "resources/read", json!({ "uri": "ui://apps+clock/app.html" })).await;
    assert_eq!(read.status, 200, "{read:?}");
    let contents = &read.result()["contents"][0];
    assert_eq!(contents["uri"], "ui://apps+clock/app.html");
    assert_eq!(contents["mimeType"], UI_MIME);
    assert_eq!(contents["text"], page(1));
    assert_eq!(contents["_meta"], declared(&["https://api.clock.example"]), "the declared CSP, never widened");
    assert_eq!(apps.reads().last().map(String::as_str), Some(clock_uri), "the upstream is asked its own URI");

    // The pin shows the reviewer the UI: its digest, its CSP and permissions.
    let (pin, state) = gateway.pin("apps", "tool", "clock").unwrap();
    assert_eq!(state, "approved");
    let show = gateway.cli(&["pins", "show", &pin]);
    assert!(show.contains("palisade/uiResource") && show.contains("contentsSha256"), "{show}");
    assert!(show.contains("https://api.clock.example") && show.contains("clipboardWrite"), "{show}");

    // A CSP entry that is not a plain origin holds its tool, with the reason, and its UI is
    // never relayed (no served tool approved it).
    let status = gateway.cli(&["gateway", "status"]);
    let held = status.lines().find(|line| line.contains(" apps tool widen ")).unwrap_or_else(|| panic!("{status}"));
    assert!(held.contains("its MCP Apps UI resource ui://widen/app.html cannot be pinned"), "{held}");
    assert!(held.contains("which is not a plain origin"), "{held}");
    let refused = request(&gateway, &token, "resources/read", json!({ "uri": "ui://apps+widen/app.html" })).await;
    assert!(refused.response().get("error").is_some(), "{refused:?}");

    // The page changes under the approved tool: the new page is never relayed, the tool is held
    // at the next listing, and served again (with the new page) once approved.
    apps.set_contents(
        clock_uri,
        json!({ "mimeType": UI_MIME, "text": page(2), "_meta": declared(&["https://api.clock.example"]) }),
    );
    let read = request(&gateway, &token, "resources/read", json!({ "uri": "ui://apps+clock/app.html" })).await;
    assert!(read.response().get("error").is_some(), "a changed UI is not relayed: {read:?}");
    gateway.wait_tools(&token, "the changed UI holds its tool", |tools| !tools.iter().any(|t| t == "apps_clock")).await;
    gateway.wait_pin("apps", "clock", "held").await;
    gateway.approve_all("apps");
    gateway.wait_tools(&token, "approved again", |tools| tools.iter().any(|t| t == "apps_clock")).await;
    let read = request(&gateway, &token, "resources/read", json!({ "uri": "ui://apps+clock/app.html" })).await;
    assert_eq!(read.result()["contents"][0]["text"], page(2), "{read:?}");

    // So does a CSP that allows one more origin: the same page, a wider policy.
    let wider = declared(&["https://api.clock.example", "https://collect.example"]);
    apps.set_contents(clock_uri, json!({ "mimeType": UI_MIME, "text": page(2), "_meta": wider }));
    let read = request(&gateway, &token, "resources/read", json!({ "uri": "ui://apps+clock/app.html" })).await;
    assert!(read.response().get("error").is_some(), "a widened CSP is not relayed: {read:?}");
    gateway.wait_pin("apps", "clock", "held").await;
}

/// `@modelcontextprotocol/server-basic-vanillajs` over Streamable HTTP on a free port; killed
/// when dropped.
struct BasicApp {
    child: Child,
    url: String,
}

impl BasicApp {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let script = node_modules().join("@modelcontextprotocol/server-basic-vanillajs/dist/index.js");
        assert!(
            script.exists(),
            "{} is missing: scripts/test installs it (tests/interop/package.json)",
            script.display()
        );
        let child = Command::new(test_tools().join("bin/node"))
            .arg(script)
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the MCP Apps example server");
        let deadline = std::time::Instant::now() + PATIENCE;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "the MCP Apps example server did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        Self { child, url: format!("http://127.0.0.1:{port}/mcp") }
    }
}

impl Drop for BasicApp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_apps_sdk_example_server_works_through_the_gateway() {
    let server = BasicApp::start();
    let gateway = boot("", &upstream("basic", &server.url, ""));
    let token = gateway.token("alice", "");
    gateway.approve_all("basic");
    gateway.wait_tools(&token, "get-time served", |tools| tools.iter().any(|t| t == "basic_get-time")).await;

    let tool = listed_tool(&gateway, &token, "basic_get-time").await;
    assert_eq!(tool["_meta"]["ui"]["resourceUri"], "ui://basic+get-time/mcp-app.html", "{tool}");
    assert_eq!(tool["_meta"]["ui/resourceUri"], "ui://basic+get-time/mcp-app.html", "{tool}");
    let (pin, _) = gateway.pin("basic", "tool", "get-time").unwrap();
    let show = gateway.cli(&["pins", "show", &pin]);
    assert!(show.contains("contentsSha256") && show.contains("ui://get-time/mcp-app.html"), "{show}");

    let read = request(&gateway, &token, "resources/read", json!({ "uri": "ui://basic+get-time/mcp-app.html" })).await;
    assert_eq!(read.status, 200, "{read:?}");
    let contents = &read.result()["contents"][0];
    assert_eq!(contents["uri"], "ui://basic+get-time/mcp-app.html");
    assert_eq!(contents["mimeType"], UI_MIME);
    let html = contents["text"].as_str().unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("Get Time App"), "{}", &html[..html.len().min(200)]);
    // The upstream's own URI does not name a resource of the gateway.
    let own = request(&gateway, &token, "resources/read", json!({ "uri": "ui://get-time/mcp-app.html" })).await;
    assert!(own.response().get("error").is_some(), "{own:?}");

    let call = gateway.call(&token, "basic_get-time", json!({})).await;
    text_of(&call);
    assert!(call.result()["structuredContent"]["time"].is_string(), "{:?}", call.response());
}

/// The `ttlMs` and `cacheScope` of the gateway's `tools/list`.
async fn list_cache(gateway: &Gateway, token: &str) -> (u64, String) {
    let listing = request(gateway, token, "tools/list", json!({})).await;
    let result = listing.result();
    (result["ttlMs"].as_u64().unwrap(), result["cacheScope"].as_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_lists_are_kept_for_their_ttl_and_the_merged_list_says_the_least() {
    // Relisting every hour: only an upstream's own ttlMs makes it sooner.
    let steady = Upstream::start(vec![tool("steady", "Fresh for an hour.")]).await;
    steady.set_list_cache(3_600_000, "public");
    let brief = Upstream::start(vec![tool("brief", "Fresh for a second and a half.")]).await;
    brief.set_list_cache(1_500, "private");
    let config = [upstream("steady", &steady.url, ""), upstream("brief", &brief.url, "")].concat();
    let gateway = boot("relist_secs = 3600", &config);
    let (alice, bob) = (gateway.token("alice", ""), gateway.token("bob", ""));
    gateway.approve_all("steady");
    gateway.approve_all("brief");
    gateway.wait_tools(&alice, "both served", |tools| tools.len() == 2).await;

    // The merged list is fresh no longer than its shortest part, and private as one part is.
    let (ttl, scope) = list_cache(&gateway, &alice).await;
    assert!(ttl <= 1_500, "ttlMs {ttl}");
    assert_eq!(scope, "private");

    // Callers' lists are answered from the gateway's listing: two callers listing ten times
    // cost the upstreams nothing.
    let (steady_lists, brief_lists) = (steady.count("tools/list"), brief.count("tools/list"));
    for _ in 0..5 {
        for token in [&alice, &bob] {
            assert_eq!(gateway.tools(token).await.len(), 2);
        }
    }
    assert_eq!(steady.count("tools/list"), steady_lists, "no caller's list reaches an upstream");

    // The brief list is listed again as its ttlMs runs out, the steady one is not.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while brief.count("tools/list") < brief_lists + 2 {
        assert!(tokio::time::Instant::now() < deadline, "the brief list was not listed again when its ttlMs ran out");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(steady.count("tools/list"), steady_lists, "a list fresh for an hour is not listed again");

    // Once the brief upstream says its lists stay fresh for an hour, so does the gateway's
    // (up to its own ttlMs).
    brief.set_list_cache(3_600_000, "public");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (ttl, _) = list_cache(&gateway, &alice).await;
        if ttl > 1_500 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "ttlMs still {ttl}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
