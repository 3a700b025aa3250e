//! Server-to-client requests through the real gateway binary, against the hostile upstream
//! fixture (2025-era wire: its questions arrive on the call's event stream): a question reaches
//! only the caller whose call caused it, as an `input_required` round; another caller cannot
//! answer it; it is answered once; a caller that did not declare elicitation is not asked (the
//! upstream gets -32601); an upstream cannot ask one call more than the per-call bound; and a
//! call waiting on an answer that never comes is cancelled at the upstream's request deadline.
//! Then server-everything (npm) behind the gateway over stdio and over HTTP: its elicitation,
//! sampling and (stdio) roots tools answered end to end by the TypeScript and Python SDK
//! clients on both eras (tests/interop/ts_asks_client.mjs, py_asks_client.py), roots with the
//! operator's grant and never the client's own. And a 2026-07-28 upstream's own rounds under the
//! same rules (roots answered by the gateway, sampling refused by default, elicitation relayed).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::gateway_boundary::GatewayUnderTest;
use crate::gateway_stdio_servers::{approve_and_serve, node_modules, stdio_entry, test_tools, text};
use crate::harness::{Exchange, send, tool_call, with_meta};
use crate::hostile_upstream::{ASK_MANY, HostileUpstream, Wire};

/// Most questions one call may put to its caller (the gateway's documented bound).
const ASKS_PER_CALL: usize = 8;
/// Longest the test waits for something the gateway does in the background.
const HANG_GUARD: Duration = Duration::from_secs(20);

/// A gateway in front of one legacy hostile upstream `a`, its tools approved and served.
async fn gateway_with_hostile(extra: &str) -> (HostileUpstream, GatewayUnderTest, String) {
    let hostile = HostileUpstream::start(Wire::Legacy);
    let body = format!("[[upstreams]]\nid = \"a\"\nurl = \"{}\"\n{extra}\n", hostile.url);
    let mut gateway = GatewayUnderTest::new(&body);
    gateway.start();
    gateway.approve_all("a");
    let token = gateway.token("alice");
    gateway.wait_for_tools(&token, &["a_ask", "a_ask_many", "a_echo"]).await;
    (hostile, gateway, token)
}

/// `tools/call` of `tool` declaring `capabilities`, with `extra` params (`requestState`,
/// `inputResponses`).
async fn call(gateway: &GatewayUnderTest, token: &str, tool: &str, capabilities: Value, extra: Value) -> Exchange {
    let mut params = with_meta(json!({ "name": tool, "arguments": {} }), capabilities);
    params.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
    let request = tool_call(gateway.server(), token, tool, json!({})).body(body.to_string());
    tokio::time::timeout(HANG_GUARD, send(request)).await.expect("the gateway answered within the hang guard")
}

/// The question of an `input_required` answer, and its sealed state.
fn question(answer: &Exchange) -> (Value, Value) {
    let result = answer.result();
    assert_eq!(result["resultType"], "input_required", "{result}");
    let requests = result["inputRequests"].as_object().unwrap();
    assert_eq!(requests.keys().collect::<Vec<_>>(), ["upstream_request"], "{result}");
    (requests["upstream_request"].clone(), result["requestState"].clone())
}

fn reply(state: &Value, name: &str) -> Value {
    json!({
        "requestState": state,
        "inputResponses": { "upstream_request": { "action": "accept", "content": { "name": name } } },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_reaches_only_its_caller_and_is_answered_once() {
    let (hostile, gateway, alice) = gateway_with_hostile("").await;
    let bob = gateway.token("bob");
    let elicitation = json!({ "elicitation": {} });

    let asked = call(&gateway, &alice, "a_ask", elicitation.clone(), json!({})).await;
    let (request, state) = question(&asked);
    assert_eq!(request["method"], "elicitation/create");
    assert!(request["params"]["message"].as_str().unwrap().starts_with("question "), "{request}");
    assert_eq!(request["params"]["mode"], "form", "a 2025-era elicitation is a form");

    // Bob's call meanwhile is his own, and he cannot answer Alice's question with her state.
    let echoed = call(&gateway, &bob, "a_echo", elicitation.clone(), json!({})).await;
    assert_eq!(echoed.result()["content"][0]["text"], "{}", "{:?}", echoed.response());
    let stolen = call(&gateway, &bob, "a_ask", elicitation.clone(), reply(&state, "bob")).await;
    assert_eq!(stolen.error_code(), -32602, "{:?}", stolen.response());

    // Alice answers: the upstream gets her answer, and her call completes with it.
    let answered = call(&gateway, &alice, "a_ask", elicitation.clone(), reply(&state, "alice")).await;
    let text = answered.result()["content"][0]["text"].as_str().unwrap().to_owned();
    let answers: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answers, json!([{ "action": "accept", "content": { "name": "alice" } }]), "{text}");

    // The same answer again: the question is no longer waiting.
    let replayed = call(&gateway, &alice, "a_ask", elicitation.clone(), reply(&state, "alice")).await;
    assert_eq!(replayed.error_code(), -32602, "{:?}", replayed.response());
    assert!(
        replayed.response()["error"]["message"].as_str().unwrap().contains("no longer waiting"),
        "{:?}",
        replayed.response()
    );

    // A caller that did not declare elicitation is not asked: the upstream hears -32601.
    let undeclared = call(&gateway, &alice, "a_ask", json!({}), json!({})).await;
    let text = undeclared.result()["content"][0]["text"].as_str().unwrap().to_owned();
    let answers: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answers[0]["code"], -32601, "{text}");
    assert_eq!(hostile.abandoned(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_cannot_ask_one_call_more_than_the_bound() {
    let (_hostile, gateway, alice) = gateway_with_hostile("").await;
    let elicitation = json!({ "elicitation": {} });
    let mut answer = call(&gateway, &alice, "a_ask_many", elicitation.clone(), json!({})).await;
    let mut rounds = 0;
    while answer.response().get("error").is_none() {
        let (_, state) = question(&answer);
        rounds += 1;
        assert!(rounds <= ASK_MANY, "never stopped");
        answer = call(&gateway, &alice, "a_ask_many", elicitation.clone(), reply(&state, "alice")).await;
    }
    assert_eq!(rounds, ASKS_PER_CALL, "the caller was asked exactly the bound, then the call failed");
    assert_eq!(answer.error_code(), -32603, "{:?}", answer.response());
    // The gateway still serves.
    let echoed = call(&gateway, &alice, "a_echo", elicitation, json!({})).await;
    assert_eq!(echoed.result()["content"][0]["text"], "{}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_an_answer_ends_at_the_request_deadline() {
    let (hostile, gateway, alice) = gateway_with_hostile("request_timeout_secs = 2").await;
    let elicitation = json!({ "elicitation": {} });
    let asked = call(&gateway, &alice, "a_ask", elicitation.clone(), json!({})).await;
    let (_, state) = question(&asked);
    // Nobody answers: at the upstream's deadline the gateway ends the call — the upstream's
    // question is answered with an error, or its stream is closed, whichever it sees first.
    let ended =
        || hostile.abandoned() > 0 || hostile.question_errors().iter().any(|error| error["code"] == json!(-32603));
    let deadline = Instant::now() + HANG_GUARD;
    while !ended() {
        assert!(Instant::now() < deadline, "the waiting call was never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let late = call(&gateway, &alice, "a_ask", elicitation, reply(&state, "alice")).await;
    assert_eq!(late.error_code(), -32602, "{:?}", late.response());
}

/// The root the operator grants server-everything in these tests.
const GRANTED_ROOT: &str = "file:///srv/granted-root";

/// The driver script `name` of tests/interop.
fn driver(name: &str) -> String {
    format!("{}/../../tests/interop/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs the TypeScript and the Python SDK clients, on both eras, against the gateway: each
/// answers server-everything's elicitation and sampling through its own handlers and, unless
/// `root` is `-`, checks get-roots-list shows the granted root and not its own.
fn real_clients_answer(gateway: &GatewayUnderTest, token: &str, prefix: &str, root: &str) {
    let tools = test_tools();
    let url = gateway.server().url.as_str();
    for mode in ["2026-07-28", "legacy"] {
        let mut ts = Command::new(tools.join("bin/node"));
        ts.arg(driver("ts_asks_client.mjs")).args([url, mode, prefix, root]);
        ts.env("INTEROP_NODE_MODULES", tools.join("npm/node_modules"));
        let mut py = Command::new(tools.join("py/bin/python"));
        py.arg(driver("py_asks_client.py")).args([url, mode, prefix, root]);
        for mut client in [ts, py] {
            let output = client.env("INTEROP_TOKEN", token).output().expect("run the client driver");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
            assert!(stdout.lines().filter(|line| line.starts_with("ok - ")).count() >= 3, "{stdout}");
        }
    }
}

/// What the operator allows server-everything to ask: sampling on, one granted root.
fn everything_requests(roots: bool) -> String {
    let roots = if roots { format!("roots = [\"{GRANTED_ROOT}\"]") } else { String::new() };
    format!("[upstreams.client_requests]\nsampling = true\n{roots}\n")
}

/// The tools server-everything offers a client that declares elicitation, sampling and roots.
const ASKING_TOOLS: [&str; 3] = ["trigger-elicitation-request", "trigger-sampling-request", "get-roots-list"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_stdio_asks_real_clients_through_the_gateway() {
    let modules = node_modules();
    let node = test_tools().join("bin/node");
    let server = modules.join("@modelcontextprotocol/server-everything/dist/index.js");
    let entry = stdio_entry("ev", text(&node), &[text(&server), "stdio"], &[&modules], &everything_requests(true));
    let mut gateway = GatewayUnderTest::new(&entry);
    gateway.start();
    let token = approve_and_serve(&gateway, "ev", &ASKING_TOOLS).await;
    real_clients_answer(&gateway, &token, "ev_", GRANTED_ROOT);
    gateway.stop();
}

/// server-everything over Streamable HTTP on a free loopback port; killed on drop.
struct EverythingHttp {
    child: std::process::Child,
    url: String,
}

impl EverythingHttp {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let server = node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
        let child = Command::new(test_tools().join("bin/node"))
            .arg("-r")
            .arg(driver("loopback_only.cjs"))
            .arg(server)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start server-everything");
        let deadline = Instant::now() + HANG_GUARD;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "server-everything never listened on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Self { child, url: format!("http://127.0.0.1:{port}/mcp") }
    }
}

impl Drop for EverythingHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_http_asks_real_clients_through_the_gateway() {
    let everything = EverythingHttp::start();
    // Its roots request goes to the session's own stream, outside the call: not relayed (the
    // tool would wait for an answer that never comes), so only elicitation and sampling here.
    let body = format!("[[upstreams]]\nid = \"ev\"\nurl = \"{}\"\n{}", everything.url, everything_requests(false));
    let mut gateway = GatewayUnderTest::new(&body);
    gateway.start();
    gateway.approve_all("ev");
    let token = gateway.token("alice");
    gateway.wait_for_tools(&token, &["ev_trigger-elicitation-request", "ev_trigger-sampling-request"]).await;
    real_clients_answer(&gateway, &token, "ev_", "-");
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_upstream_s_own_rounds_follow_the_same_rules() {
    // Palisade's conformance fixture speaks 2026-07-28: it asks in input_required rounds.
    let fixture = crate::harness::Palisade::start_app("conformance", &[]);
    let body = format!(
        "[[upstreams]]\nid = \"fx\"\nurl = \"{}\"\n[upstreams.client_requests]\nroots = [\"{GRANTED_ROOT}\"]\n",
        fixture.url
    );
    let mut gateway = GatewayUnderTest::new(&body);
    gateway.start();
    gateway.approve_all("fx");
    let alice = gateway.token("alice");
    let roots = "fx_test_input_required_result_list_roots";
    let sampling = "fx_test_input_required_result_sampling";
    let elicitation = "fx_test_input_required_result_elicitation";
    gateway.wait_for_tools(&alice, &[roots, sampling, elicitation]).await;
    let everything = json!({ "sampling": {}, "elicitation": {}, "roots": {} });

    // roots/list is the gateway's to answer, with the grant: the caller is never asked.
    let answered = call(&gateway, &alice, roots, everything.clone(), json!({})).await;
    assert_eq!(answered.result()["content"][0]["text"], "Found 1 root(s)", "{:?}", answered.response());
    // Sampling is off for this upstream: it is not told the caller samples, so it never asks (it
    // answers -32021 itself), and nothing reaches the caller but that error.
    let refused = call(&gateway, &alice, sampling, everything.clone(), json!({})).await;
    assert_eq!(refused.error_code(), -32021, "{:?}", refused.response());
    // Elicitation is relayed to a caller that declared it; one that did not is told what to declare.
    let asked = call(&gateway, &alice, elicitation, everything, json!({})).await;
    assert_eq!(asked.result()["resultType"], "input_required", "{:?}", asked.response());
    let undeclared = call(&gateway, &alice, elicitation, json!({}), json!({})).await;
    assert_eq!(undeclared.error_code(), -32021, "{:?}", undeclared.response());
    gateway.stop();
}
