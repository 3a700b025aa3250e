//! Application snapshots published while serving (`Server::publish`): a request sees exactly
//! one snapshot, however often they change under it; listen streams that asked for a list's
//! changes hear of each publication that changed that list, once, and of nothing else.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use palisade_server::auth::Authenticator;
use palisade_server::context::NotificationSink;
use palisade_server::secret::ServerSecret;
use palisade_server::{
    App, CallToolResult, Outcome, ResourceContents, ResourceDef, Server, ServerConfig, ServerEvent, ToolDef,
};
use palisade_wire::{Request, RequestId};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

/// `stable` plus `extra` (its text says which snapshot answered), and one resource.
fn snapshot(extra: Option<&'static str>) -> App {
    let mut app = App::builder("snapshots-test", "0")
        .tool(ToolDef::new("stable").handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("stable"))) }));
    if let Some(name) = extra {
        app = app.tool(
            ToolDef::new(name)
                .description(format!("the {name} snapshot"))
                .handler(move |_, _| async move { Ok(Outcome::Complete(CallToolResult::text(name))) }),
        );
    }
    app.resource(
        ResourceDef::new("test://r", "r").reader(|_, uri| async move {
            Ok(Outcome::Complete(vec![ResourceContents::text(uri, "text/plain", "r")]))
        }),
    )
    .build()
    .unwrap()
}

fn server(app: App) -> Arc<Server> {
    let config = ServerConfig { page_size: 100, ..ServerConfig::default() };
    Arc::new(
        Server::builder(app, config, Authenticator::UnauthenticatedLoopback, ServerSecret::random())
            .without_audit()
            .build()
            .unwrap(),
    )
}

fn request(id: i64, method: &str, params: Value) -> Request {
    let mut params: Map<String, Value> = params.as_object().cloned().unwrap();
    params.insert(
        "_meta".into(),
        json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {} }),
    );
    Request { id: RequestId::Number(id), method: method.into(), params }
}

async fn send(server: &Server, request: Request) -> Value {
    let (sink, _receiver) = NotificationSink::channel(16);
    server.handle_request(request, None, sink, CancellationToken::new()).await.frame
}

/// 16 callers list and call tools while `alpha` and `beta` swap places 1,000 times: every list
/// is one snapshot's list (never both tools, never neither), every call of a tool either runs
/// that tool or is "unknown tool", and nothing else goes wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_see_exactly_one_snapshot_while_tools_come_and_go() {
    let server = server(snapshot(Some("alpha")));
    let done = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::new();
    for caller in 0..16_i64 {
        let (server, done) = (server.clone(), done.clone());
        callers.push(tokio::spawn(async move {
            let mut seen = [0_u32; 2];
            let mut n = 0_i64;
            while !done.load(Ordering::SeqCst) || n < 20 {
                n += 1;
                let id = caller * 1_000_000 + n;
                let list = send(&server, request(id, "tools/list", json!({}))).await;
                let names: Vec<&str> = list["result"]["tools"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{list}"))
                    .iter()
                    .map(|t| t["name"].as_str().unwrap())
                    .collect();
                match names.as_slice() {
                    ["stable", "alpha"] => seen[0] += 1,
                    ["stable", "beta"] => seen[1] += 1,
                    other => panic!("a list of no single snapshot: {other:?}"),
                }
                let extra = if n % 2 == 0 { "alpha" } else { "beta" };
                let call = send(&server, request(id, "tools/call", json!({ "name": extra, "arguments": {} }))).await;
                if let Some(text) = call["result"]["content"][0]["text"].as_str() {
                    assert_eq!(text, extra, "{call}");
                } else {
                    assert_eq!(call["error"]["code"], -32602, "{call}");
                    assert_eq!(call["error"]["message"], "invalid params: unknown tool", "{call}");
                }
            }
            seen
        }));
    }
    for round in 0..1_000 {
        let extra = if round % 2 == 0 { "beta" } else { "alpha" };
        let published = server.publish(snapshot(Some(extra))).unwrap();
        assert!(published.tools_changed && !published.resources_changed);
        tokio::task::yield_now().await;
    }
    done.store(true, Ordering::SeqCst);
    let mut totals = [0_u32; 2];
    for caller in callers {
        let seen = caller.await.expect("no caller panicked");
        totals[0] += seen[0];
        totals[1] += seen[1];
    }
    assert!(totals[0] > 0 && totals[1] > 0, "both snapshots were served: {totals:?}");
}

/// Opens a listen stream with `filter`; its frames arrive on the returned receiver.
fn listen(server: &Arc<Server>, id: i64, filter: Value) -> tokio::sync::mpsc::Receiver<Value> {
    let (sink, receiver) = NotificationSink::channel(64);
    let server = server.clone();
    tokio::spawn(async move {
        let request = request(id, "subscriptions/listen", json!({ "notifications": filter }));
        let _ = server.handle_request(request, None, sink, CancellationToken::new()).await;
    });
    receiver
}

/// The notification methods a stream received up to (not including) the sentinel update.
async fn until_sentinel(receiver: &mut tokio::sync::mpsc::Receiver<Value>) -> Vec<String> {
    let mut methods = Vec::new();
    loop {
        let frame = receiver.recv().await.expect("the stream stays open");
        let method = frame["method"].as_str().unwrap_or_default().to_owned();
        if method == "notifications/resources/updated" {
            return methods;
        }
        if method != "notifications/subscriptions/acknowledged" {
            methods.push(method);
        }
    }
}

/// A stream that asked for tool-list changes hears exactly one per publication that changed
/// the tool list, none for one that did not; a stream that did not ask hears none.
#[tokio::test]
async fn list_changed_goes_once_per_changing_publication_to_streams_that_asked() {
    let server = server(snapshot(None));
    let mut asked = listen(&server, 1, json!({ "toolsListChanged": true, "resourceSubscriptions": ["test://r"] }));
    let mut other = listen(&server, 2, json!({ "resourceSubscriptions": ["test://r"] }));
    // Both streams are open once each has its acknowledgement.
    for receiver in [&mut asked, &mut other] {
        let ack = receiver.recv().await.unwrap();
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    }
    let changes = [
        server.publish(snapshot(None)).unwrap().tools_changed,
        server.publish(snapshot(Some("alpha"))).unwrap().tools_changed,
        server.publish(snapshot(Some("alpha"))).unwrap().tools_changed,
        server.publish(snapshot(Some("beta"))).unwrap().tools_changed,
        server.publish(snapshot(None)).unwrap().tools_changed,
    ];
    assert_eq!(changes, [false, true, false, true, true]);
    // Events are delivered in order: everything before the sentinel came from the publications.
    server.events().publish(ServerEvent::ResourceUpdated { uri: "test://r".into() });
    assert_eq!(until_sentinel(&mut asked).await, vec!["notifications/tools/list_changed"; 3]);
    assert_eq!(until_sentinel(&mut other).await, Vec::<String>::new());
}

/// A snapshot whose tools need a service the server lacks is refused; the old one stays.
#[tokio::test]
async fn a_snapshot_that_needs_a_missing_service_is_refused() {
    let server = server(snapshot(None));
    let needs_once = App::builder("snapshots-test", "0")
        .tool(
            ToolDef::new("confirmed")
                .needs_confirmation()
                .handler(|_, _| async { Ok(Outcome::Complete(CallToolResult::text("ran"))) }),
        )
        .build()
        .unwrap();
    let refused = server.publish(needs_once).expect_err("no single-use store");
    assert!(refused.to_string().contains("needs confirmation"), "{refused}");
    let list = send(&server, request(1, "tools/list", json!({}))).await;
    assert_eq!(list["result"]["tools"][0]["name"], "stable");
}

/// What an application's lists say of their caching follows its [`ListFreshness`], moved while it
/// serves (the gateway's upstreams' `ttlMs` and `cacheScope`): the time left of the bound, at
/// most the application's own `ttlMs`, and `private` when a part is, even from a server whose
/// own scope is `public`.
#[tokio::test]
async fn lists_say_what_is_left_of_their_freshness_and_private_when_a_part_is() {
    let clock = Arc::new(palisade_base::clock::ManualClock::new(1_000_000));
    let freshness = Arc::new(palisade_server::ListFreshness::default());
    let app = snapshot(None).into_builder().list_freshness(freshness.clone()).build().unwrap();
    let config = ServerConfig { page_size: 100, ..ServerConfig::default() };
    let server = Server::builder(app, config, Authenticator::UnauthenticatedLoopback, ServerSecret::random())
        .without_audit()
        .clock(clock.clone())
        .build()
        .unwrap();
    let cache = |frame: &Value| (frame["result"]["ttlMs"].as_u64().unwrap(), frame["result"]["cacheScope"].clone());
    for method in ["tools/list", "resources/list", "server/discover"] {
        let frame = send(&server, request(1, method, json!({}))).await;
        assert_eq!(cache(&frame), (60_000, json!("public")), "no bound: the application's own; {method}");
    }
    freshness.set(Some(1_005_000), false);
    assert_eq!(cache(&send(&server, request(2, "tools/list", json!({}))).await), (5_000, json!("public")));
    clock.advance_ms(4_000);
    assert_eq!(cache(&send(&server, request(3, "tools/list", json!({}))).await), (1_000, json!("public")));
    clock.advance_ms(2_000);
    assert_eq!(cache(&send(&server, request(4, "tools/list", json!({}))).await), (0, json!("public")), "past it: 0");
    freshness.set(Some(i64::MAX), true);
    for method in ["tools/list", "resources/list", "server/discover"] {
        let frame = send(&server, request(5, method, json!({}))).await;
        assert_eq!(cache(&frame), (60_000, json!("private")), "a private part: {method}");
    }
}
