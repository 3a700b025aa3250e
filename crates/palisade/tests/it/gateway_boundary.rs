//! The gateway's upstream boundary through the real binary: no caller credential ever reaches
//! an upstream (C7), hostile upstreams get a clear error per call while the others keep
//! serving, a failing upstream is backed off and reported, 2025-era upstream sessions are never
//! shared between principals, and the kill switch stops proxied calls before they leave.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Exchange, Palisade, TempDir, send, tool_call, with_meta};
use crate::hostile_upstream::{Closer, FLOOD, HostileUpstream, Recorded, Wire};

/// Longest any single call may take before the test calls it a hang.
const HANG_GUARD: Duration = Duration::from_secs(15);

/// A gateway configuration in its own directory (config file, data, secrets) that survives
/// restarts of the gateway process.
pub(crate) struct GatewayUnderTest {
    dir: TempDir,
    pub(crate) config: String,
    pub(crate) server: Option<Palisade>,
}

impl GatewayUnderTest {
    /// Writes `palisade.toml`: loopback on a free port, the data directory inside `dir`,
    /// decisions read every second, and `body` (the `[[upstreams]]` and anything else).
    pub(crate) fn new(body: &str) -> Self {
        let dir = TempDir::new();
        let config = format!("{}/palisade.toml", dir.path());
        let text = format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}/data\"\n\n[auth]\ndev_issuer = true\n\n[pins]\ndecision_poll_secs = 1\n\n{body}",
            dir.path()
        );
        std::fs::write(&config, text).unwrap();
        Self { dir, config, server: None }
    }

    /// A file in the configuration's directory.
    fn file(&self, name: &str, contents: &str) -> String {
        let path = format!("{}/{name}", self.dir.path());
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// Starts `palisade gateway --config F` and waits for its listening line.
    pub(crate) fn start(&mut self) {
        assert!(self.server.is_none(), "already running");
        // The process's own data directory is the configuration's; this one only keeps the
        // harness's bookkeeping.
        let scratch = TempDir::new();
        self.server = Some(Palisade::spawn(&["gateway", "--config", &self.config], &[], scratch));
    }

    /// Stops the gateway process (SIGTERM).
    pub(crate) fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.terminate();
        }
    }

    pub(crate) fn server(&self) -> &Palisade {
        self.server.as_ref().expect("the gateway is running")
    }

    pub(crate) fn is_running(&mut self) -> bool {
        self.server.as_mut().expect("the gateway is running").is_running()
    }

    /// `palisade ARGS --config F`.
    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(args)
            .args(["--config", &self.config])
            .output()
            .expect("run palisade")
    }

    pub(crate) fn cli_ok(&self, args: &[&str]) -> String {
        let output = self.cli(args);
        assert!(
            output.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// A token of the gateway's development issuer for `subject`.
    pub(crate) fn token(&self, subject: &str) -> String {
        let args = ["dev", "token", "--subject", subject, "--tenant", "acme", "--client", "it"];
        self.cli_ok(&args).trim().to_owned()
    }

    /// Approves every pending definition of `upstream`.
    pub(crate) fn approve_all(&self, upstream: &str) {
        self.cli_ok(&["pins", "approve", "--upstream", upstream, "--all", "--reviewer", "it"]);
    }

    /// `(pin id, name)` of every pin of `upstream`.
    fn pins(&self, upstream: &str) -> Vec<(String, String)> {
        let listing = self.cli_ok(&["pins", "list", "--upstream", upstream]);
        listing
            .lines()
            .skip(1)
            .filter_map(|line| {
                let columns: Vec<&str> = line.split_whitespace().collect();
                (columns.len() >= 6).then(|| (columns[0].to_owned(), columns[5].to_owned()))
            })
            .collect()
    }

    /// `tools/call` of an exposed tool, answered within the hang guard.
    pub(crate) async fn call(&self, token: &str, tool: &str, arguments: Value) -> Exchange {
        self.call_with(tool_call(self.server(), token, tool, arguments)).await
    }

    async fn call_with(&self, request: reqwest::RequestBuilder) -> Exchange {
        tokio::time::timeout(HANG_GUARD, send(request)).await.expect("the gateway answered within the hang guard")
    }

    /// The exposed tool names the gateway lists for `token`.
    pub(crate) async fn tool_names(&self, token: &str) -> BTreeSet<String> {
        let params = with_meta(json!({}), json!({}));
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params});
        let request = reqwest::Client::new()
            .post(&self.server().url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/list")
            .header("authorization", format!("Bearer {token}"))
            .body(body.to_string());
        let listed = self.call_with(request).await;
        // A gateway serving no tool yet does not advertise the tools capability.
        if listed.response().get("error").is_some() && listed.error_code() == -32601 {
            return BTreeSet::new();
        }
        listed.result()["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|tool| tool["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Waits (polling, up to the hang guard) until every one of `names` is listed.
    pub(crate) async fn wait_for_tools(&self, token: &str, names: &[&str]) {
        let deadline = Instant::now() + HANG_GUARD;
        loop {
            let listed = self.tool_names(token).await;
            if names.iter().all(|name| listed.contains(*name)) {
                return;
            }
            assert!(Instant::now() < deadline, "never listed {names:?}; listed {listed:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for GatewayUnderTest {
    fn drop(&mut self) {
        // The process goes before its directory.
        self.server = None;
    }
}

/// One `[[upstreams]]` entry.
fn upstream_entry(id: &str, url: &str, extra: &str) -> String {
    format!("[[upstreams]]\nid = \"{id}\"\nurl = \"{url}\"\n{extra}\n")
}

/// The answer is a JSON-RPC error (not a result), with this HTTP status, code and message.
fn assert_error(answer: &Exchange, status: u16, code: i64, message: &str, what: &str) {
    let response = answer.response();
    assert!(response.get("result").is_none(), "{what}: a result instead of an error: {response}");
    assert_eq!(
        (answer.status, answer.error_code(), response["error"]["message"].as_str()),
        (status, code, Some(message)),
        "{what}: {response}"
    );
}

/// The text an echo answered.
fn echoed(answer: &Exchange) -> Value {
    let text = answer.result()["content"][0]["text"].as_str().unwrap().to_owned();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_caller_credential_reaches_an_upstream_in_any_credential_mode() {
    let plain = HostileUpstream::start(Wire::Modern);
    let keyed = HostileUpstream::start(Wire::Modern);
    let custom = HostileUpstream::start(Wire::Modern);
    let mut gateway = GatewayUnderTest::new("");
    let keyed_secret = "upstream-secret-for-keyed-7f3a";
    let custom_secret = "upstream-secret-for-custom-91c2";
    let keyed_file = gateway.file("keyed.secret", &format!("{keyed_secret}\n"));
    let custom_file = gateway.file("custom.secret", custom_secret);
    let body = [
        upstream_entry("plain", &plain.url, ""),
        upstream_entry(
            "keyed",
            &keyed.url,
            &format!("[upstreams.credential]\nkind = \"static\"\nsecret_file = \"{keyed_file}\""),
        ),
        upstream_entry(
            "custom",
            &custom.url,
            &format!(
                "[upstreams.credential]\nkind = \"static\"\nheader = \"X-Api-Key\"\nsecret_file = \"{custom_file}\""
            ),
        ),
    ]
    .concat();
    let config = std::fs::read_to_string(&gateway.config).unwrap() + &body;
    std::fs::write(&gateway.config, config).unwrap();
    gateway.start();
    for id in ["plain", "keyed", "custom"] {
        gateway.approve_all(id);
    }
    let token = gateway.token("alice");
    gateway.wait_for_tools(&token, &["plain_echo", "keyed_echo", "custom_echo"]).await;

    let cookie = "session=caller-cookie-5b1e";
    let api_key = "caller-api-key-0d44";
    let proxy = "Basic Y2FsbGVyOnByb3h5LXNlY3JldA==";
    for tool in ["plain_echo", "keyed_echo", "custom_echo"] {
        let request = tool_call(gateway.server(), &token, tool, json!({"text": "hi"}))
            .header("cookie", cookie)
            .header("x-api-key", api_key)
            .header("proxy-authorization", proxy);
        let answer = gateway.call_with(request).await;
        assert_eq!(echoed(&answer), json!({"text": "hi"}), "{tool}");
    }

    let caller_secrets = [token.as_str(), cookie, "caller-cookie-5b1e", api_key, proxy, "Y2FsbGVyOnByb3h5LXNlY3JldA=="];
    let base: BTreeSet<&str> =
        ["accept", "content-length", "content-type", "host", "mcp-method", "mcp-name", "mcp-protocol-version"].into();
    let cases = [
        ("plain", &plain, None::<(&str, String)>),
        ("keyed", &keyed, Some(("authorization", format!("Bearer {keyed_secret}")))),
        ("custom", &custom, Some(("x-api-key", custom_secret.to_owned()))),
    ];
    for (id, upstream, credential) in cases {
        let records = upstream.records();
        assert!(!records.is_empty(), "{id}: the upstream was never contacted");
        for record in &records {
            // Nothing of the caller's credentials anywhere: no header value, no body.
            let everything = format!("{:?} {}", record.headers, record.body);
            for secret in caller_secrets {
                assert!(!everything.contains(secret), "{id}: a caller credential reached the upstream: {record:?}");
            }
            assert!(
                record.header("cookie").is_empty() && record.header("proxy-authorization").is_empty(),
                "{record:?}"
            );
        }
        let call = upstream.calls().pop().unwrap_or_else(|| panic!("{id}: no tools/call arrived"));
        let mut expected: BTreeSet<String> = base.iter().map(|name| (*name).to_owned()).collect();
        if let Some((header, value)) = &credential {
            expected.insert((*header).to_owned());
            assert_eq!(call.header(header), vec![value.as_str()], "{id}: exactly the configured credential");
        } else {
            assert!(call.header("authorization").is_empty(), "{id}: {call:?}");
        }
        let received: BTreeSet<String> = call.header_names().into_iter().collect();
        assert_eq!(received, expected, "{id}: the complete header set of a proxied call: {:?}", call.headers);
        // Every request of the upstream, listings included, carries the same credential only.
        for record in &records {
            let names: BTreeSet<String> = record.header_names().into_iter().collect();
            assert!(names.is_subset(&expected), "{id}: unexpected headers {:?}", record.headers);
            if let Some((header, value)) = &credential {
                assert_eq!(record.header(header), vec![value.as_str()], "{id} {}", record.method);
            }
        }
        assert_eq!(call.header("mcp-name"), vec!["echo"], "{id}: the upstream's own name");
    }
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hostile_answer_is_a_clear_error_and_the_others_keep_serving() {
    let hostile = HostileUpstream::start(Wire::Modern);
    let healthy = HostileUpstream::start(Wire::Modern);
    let body = upstream_entry("a", &hostile.url, "request_timeout_secs = 2")
        + &upstream_entry("b", &healthy.url, "request_timeout_secs = 2");
    let mut gateway = GatewayUnderTest::new(&body);
    gateway.start();
    gateway.approve_all("a");
    gateway.approve_all("b");
    let token = gateway.token("alice");
    let tools = ["garbage", "huge", "bad_output", "endless_sse", "slow", "wrong_id"];
    let mut exposed: Vec<String> = tools.iter().map(|tool| format!("a_{tool}")).collect();
    exposed.extend(["a_echo".to_owned(), "b_echo".to_owned()]);
    gateway.wait_for_tools(&token, &exposed.iter().map(String::as_str).collect::<Vec<_>>()).await;

    // What each misbehaviour must come back as: a timeout, or the upstream's answer refused.
    let expected: BTreeMap<&str, (u16, &str)> = [
        ("garbage", (500, "internal error")),
        ("huge", (500, "internal error")),
        ("bad_output", (500, "internal error")),
        ("endless_sse", (504, "request timed out")),
        ("slow", (504, "request timed out")),
        ("wrong_id", (500, "internal error")),
    ]
    .into();
    for tool in tools {
        let before = hostile.calls().iter().filter(|call| call.tool() == Some(tool)).count();
        let answer = gateway.call(&token, &format!("a_{tool}"), json!({})).await;
        let (status, message) = expected[tool];
        assert_error(&answer, status, -32603, message, tool);
        let reached = hostile.calls().iter().filter(|call| call.tool() == Some(tool)).count();
        assert_eq!(reached, before + 1, "{tool}: the call reached the upstream once");
        assert!(gateway.is_running(), "the gateway survived {tool}");
        // The other upstream, and the hostile one's well-behaved tool, keep serving.
        let other = gateway.call(&token, "b_echo", json!({"text": tool})).await;
        assert_eq!(echoed(&other), json!({"text": tool}), "b_echo after {tool}");
        let same = gateway.call(&token, "a_echo", json!({"text": tool})).await;
        assert_eq!(echoed(&same), json!({"text": tool}), "a_echo after {tool}");
    }
    assert!(gateway.is_running());
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_upstream_is_backed_off_and_reported_unhealthy() {
    let mut failing = HostileUpstream::start(Wire::Modern);
    let healthy = HostileUpstream::start(Wire::Modern);
    let body = upstream_entry("a", &failing.url, "request_timeout_secs = 10")
        + &upstream_entry("b", &healthy.url, "request_timeout_secs = 10");
    let mut gateway = GatewayUnderTest::new(&body);
    gateway.start();
    gateway.approve_all("a");
    gateway.approve_all("b");
    let token = gateway.token("alice");
    gateway.wait_for_tools(&token, &["a_echo", "b_echo"]).await;
    assert_eq!(echoed(&gateway.call(&token, "a_echo", json!({"text": "up"})).await), json!({"text": "up"}));

    // The upstream dies; its address now takes connections and drops them unanswered.
    let address = failing.addr;
    failing.stop();
    let closer = Closer::bind(address);
    for n in 1..=5 {
        let started = Instant::now();
        let answer = gateway.call(&token, "a_echo", json!({"text": "down"})).await;
        let took = started.elapsed();
        assert_error(&answer, 503, -32603, "temporarily unavailable", &format!("call {n}"));
        if n >= 2 {
            assert!(took < Duration::from_secs(1), "call {n} waited {took:?} (request_timeout_secs is 10)");
        }
    }
    // From the second consecutive failure on, calls are refused without contacting the
    // upstream: at most the first two reached the address.
    assert!(closer.accepted() <= 2, "{} connections reached the failing upstream's address", closer.accepted());
    assert_eq!(echoed(&gateway.call(&token, "b_echo", json!({"text": "still"})).await), json!({"text": "still"}));
    assert!(gateway.is_running());

    let status = gateway.cli(&["gateway", "status"]);
    let stdout = String::from_utf8_lossy(&status.stdout);
    let line = |id: &str| {
        stdout
            .lines()
            .find(|line| line.starts_with(&format!("{id}  ")))
            .unwrap_or_else(|| panic!("{stdout}"))
            .to_owned()
    };
    assert!(line("a").contains("healthy=false"), "the failing upstream is named unhealthy: {stdout}");
    assert!(line("b").contains("healthy=true"), "{stdout}");
    assert_eq!(status.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&status.stderr));
    gateway.stop();
}

/// The session ids of `who`'s `tools/call` requests, in order.
fn sessions_of(calls: &[Recorded], who: &str) -> Vec<Option<String>> {
    calls
        .iter()
        .filter(|call| call.body.pointer("/params/arguments/who").and_then(Value::as_str) == Some(who))
        .map(|call| call.session.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2025_era_upstream_sees_one_session_per_principal() {
    let legacy = HostileUpstream::start(Wire::Legacy);
    let mut gateway = GatewayUnderTest::new(&upstream_entry("old", &legacy.url, ""));
    gateway.start();
    gateway.approve_all("old");
    let alice = gateway.token("alice");
    let bob = gateway.token("bob");
    gateway.wait_for_tools(&alice, &["old_echo"]).await;

    for round in 0..3 {
        for (who, token) in [("alice", &alice), ("bob", &bob)] {
            let answer = gateway.call(token, "old_echo", json!({"who": who, "text": round.to_string()})).await;
            assert_eq!(echoed(&answer)["who"], who);
        }
    }
    let calls = legacy.calls();
    let listing_sessions: BTreeSet<Option<String>> =
        legacy.records().into_iter().filter(|r| r.method == "tools/list").map(|r| r.session).collect();
    let alices: BTreeSet<_> = sessions_of(&calls, "alice").into_iter().collect();
    let bobs: BTreeSet<_> = sessions_of(&calls, "bob").into_iter().collect();
    assert_eq!(alices.len(), 1, "alice's calls always carry one session: {alices:?}");
    assert_eq!(bobs.len(), 1, "bob's calls always carry one session: {bobs:?}");
    let (alice_session, bob_session) = (alices.first().unwrap().clone(), bobs.first().unwrap().clone());
    assert!(alice_session.is_some() && bob_session.is_some());
    assert_ne!(alice_session, bob_session, "two principals never share an upstream session");
    assert!(!listing_sessions.contains(&alice_session) && !listing_sessions.contains(&bob_session));
    for call in &calls {
        assert_eq!(call.header("mcp-protocol-version"), vec!["2025-11-25"]);
    }

    // The upstream loses its sessions (twice: its 404 names no id, then the request's id):
    // each principal's next call re-opens its own session, never another's.
    let mut known: BTreeSet<Option<String>> = [alice_session, bob_session].into();
    let mut seen = 3;
    for names_id in [false, true] {
        legacy.forget_sessions(names_id);
        for (who, token) in [("alice", &alice), ("bob", &bob), ("alice", &alice), ("bob", &bob)] {
            let answer = gateway.call(token, "old_echo", json!({"who": who, "text": "again"})).await;
            let what = format!("{who} after a lost session (its 404 naming the request's id: {names_id})");
            assert!(answer.response().get("result").is_some(), "{what}: {}", answer.response());
            assert_eq!(echoed(&answer)["who"], who, "{what}");
        }
        let calls = legacy.calls();
        let mut fresh = Vec::new();
        for who in ["alice", "bob"] {
            let after: Vec<_> = sessions_of(&calls, who).into_iter().skip(seen).collect();
            // The stale id (answered 404), then the re-opened one, twice.
            assert_eq!(after.len(), 3, "{who}: {after:?}");
            assert!(known.contains(&after[0]), "{who}: {after:?}");
            assert_eq!(after[1], after[2], "{who}: {after:?}");
            fresh.push(after[1].clone());
        }
        seen += 3;
        assert!(fresh.iter().all(|session| session.is_some() && !known.contains(session)), "{fresh:?} {known:?}");
        assert_ne!(fresh[0], fresh[1], "re-opened sessions are still one per principal");
        known.extend(fresh);
    }
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_stops_one_upstream_before_anything_is_forwarded() {
    let a = HostileUpstream::start(Wire::Modern);
    let b = HostileUpstream::start(Wire::Modern);
    let body = format!(
        "[killswitch]\nmode = \"dev\"\n\n{}{}",
        upstream_entry("a", &a.url, ""),
        upstream_entry("b", &b.url, "")
    );
    let mut gateway = GatewayUnderTest::new(&body);
    // First run: the gateway lists (and pins) what its upstreams offer.
    gateway.start();
    let a_pins = gateway.pins("a");
    let late_pin = a_pins.iter().find(|(_, name)| name == "late").expect("the late tool is pinned").0.clone();
    let reviewed: Vec<&str> = a_pins.iter().filter(|(_, name)| name != "late").map(|(id, _)| id.as_str()).collect();
    let mut approve = vec!["pins", "approve"];
    approve.extend(&reviewed);
    approve.extend(["--reviewer", "it"]);
    gateway.cli_ok(&approve);
    gateway.approve_all("b");
    // Restarted, the development policy is signed over the approved tools.
    gateway.stop();
    gateway.start();
    let token = gateway.token("alice");
    gateway.wait_for_tools(&token, &["a_echo", "b_echo", "b_disabled"]).await;
    assert_eq!(echoed(&gateway.call(&token, "a_echo", json!({"text": "on"})).await), json!({"text": "on"}));

    gateway.cli_ok(&["authority", "disable", "--target", "upstream:a", "--reason", "incident"]);
    let forwarded = a.calls().len();
    let refused = gateway.call(&token, "a_echo", json!({"text": "off"})).await;
    // An application refusal: a JSON-RPC error in a 200, which clients show as an error.
    assert_error(&refused, 200, -32030, "operation disabled", "a disabled upstream");
    assert_eq!(a.calls().len(), forwarded, "nothing was forwarded to the disabled upstream");
    assert_eq!(echoed(&gateway.call(&token, "b_echo", json!({"text": "b"})).await), json!({"text": "b"}));
    // `authority status` names the gateway's upstream (the authority keeps only its digest).
    let listed = gateway.cli_ok(&["authority", "status"]);
    assert!(listed.lines().any(|line| line.starts_with("upstream:a DISABLE ")), "{listed}");
    assert!(!listed.contains("upstream:?"), "{listed}");
    // An upstream's own kill switch is relayed as what it is, whether the upstream answered it
    // in a 200 or (as servers did) in a 403 without an insufficient_scope challenge.
    for status in [200, 403] {
        let relayed = gateway.call(&token, "b_disabled", json!({"status": status})).await;
        assert_error(&relayed, 200, -32030, "operation disabled", &format!("the upstream's own, in a {status}"));
    }
    assert_eq!(b.calls().iter().filter(|call| call.tool() == Some("disabled")).count(), 2);

    gateway.cli_ok(&["authority", "enable", "--target", "upstream:a", "--reason", "resolved"]);
    assert_eq!(echoed(&gateway.call(&token, "a_echo", json!({"text": "back"})).await), json!({"text": "back"}));
    assert_eq!(a.calls().len(), forwarded + 1);

    // Approved while serving, but absent from the signed registry: never served.
    gateway.cli_ok(&["pins", "approve", &late_pin, "--reviewer", "it"]);
    for _ in 0..4 {
        // Decisions are read every second; over several polls the tool stays unlisted.
        tokio::time::sleep(Duration::from_millis(750)).await;
        assert!(!gateway.tool_names(&token).await.contains("a_late"));
    }
    let unknown = gateway.call(&token, "a_late", json!({})).await;
    assert_eq!(unknown.error_code(), -32602, "{:?}", unknown.response());
    assert!(a.calls().iter().all(|call| call.tool() != Some("late")));
    let status = gateway.cli(&["gateway", "status"]);
    let stdout = String::from_utf8_lossy(&status.stdout);
    let late =
        stdout.lines().find(|line| line.contains("not served: a tool late")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(late.contains("the signed kill-switch registry does not list tools/call:a_late"), "{stdout}");
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_server_requests_opens_at_most_the_refusal_cap_of_connections() {
    // The documented cap of refusals in flight per upstream (SECURITY.md, gateway → upstream).
    const REFUSALS_IN_FLIGHT: u64 = 8;
    let hostile = HostileUpstream::start(Wire::Modern);
    let mut gateway = GatewayUnderTest::new(&upstream_entry("a", &hostile.url, "request_timeout_secs = 10"));
    gateway.start();
    gateway.approve_all("a");
    let token = gateway.token("alice");
    gateway.wait_for_tools(&token, &["a_flood", "a_echo"]).await;
    let before = hostile.connections();

    // 2,000 sampling requests, then the answer, on one event stream: the caller gets the answer.
    let answer = gateway.call(&token, "a_flood", json!({"text": "flooded"})).await;
    assert_eq!(echoed(&answer), json!({"text": "flooded"}), "{:?}", answer.response());
    // The upstream holds every refusal open, so each one in flight keeps its connection.
    let deadline = Instant::now() + HANG_GUARD;
    while hostile.answers() < REFUSALS_IN_FLIGHT {
        assert!(Instant::now() < deadline, "only {} refusals arrived", hostile.answers());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another round trip through the gateway, while the held refusals fill the cap.
    assert_eq!(echoed(&gateway.call(&token, "a_echo", json!({"text": "after"})).await), json!({"text": "after"}));
    assert_eq!(hostile.answers(), REFUSALS_IN_FLIGHT, "the rest of the {FLOOD} requests were dropped");
    let opened = hostile.connections() - before;
    assert!(
        opened <= usize::try_from(REFUSALS_IN_FLIGHT).unwrap() + 2,
        "{opened} connections for {FLOOD} server requests"
    );
    assert!(gateway.is_running());
    gateway.stop();
}
