//! Rate limits through the real binary (`[[rate_limits]]`, `[rate_limit]`): a refusal is HTTP 429
//! with `Retry-After` and the JSON-RPC error -32034 carrying the wait, counted per limit in
//! `/metrics` and audited as a deny at stage `rate_limit`; on stdio the same error carries the
//! wait; exact under concurrency (N allowed of 3N concurrent requests) on one instance and across
//! three instances on one Redis; the Redis store down, both ways; and the gateway's per-upstream
//! cap on requests in flight.

use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::{Value, json};

use crate::gateway_pins::{PATIENCE, boot, post, text_of, upstream};
use crate::harness::{Palisade, TempDir, with_meta};
use crate::upstream_fixture::{Upstream, tool};

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| {
        panic!("REDIS_URL is not set: the shared rate-limit tests need a Redis (scripts/test starts one)")
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A marker no other run shares (a deployment's `public_url`, so its Redis keys are its own).
fn marker() -> String {
    let mut bytes = [0u8; 8];
    aws_lc_rs::rand::fill(&mut bytes).unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A rule counting `tools/call` only: `burst` at once, then one an hour (so no refill happens
/// during a test).
fn calls_rule(burst: u32) -> String {
    format!(
        "[[rate_limits]]\nname = \"calls\"\nmethods = [\"tools/call\"]\nrate = 1\nper_secs = 3600\nburst = {burst}\n"
    )
}

/// `palisade serve` of the conformance app with `extra` configuration (and a private metrics
/// listener when `metrics` is given).
fn serve(extra: &str, metrics: Option<u16>) -> Palisade {
    let dir = TempDir::new();
    let config = dir.0.join("palisade.toml");
    let metrics_line = metrics.map(|port| format!("metrics_listen = \"127.0.0.1:{port}\"\n")).unwrap_or_default();
    let text = format!(
        "app = \"conformance\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n{metrics_line}\n{extra}\n",
        dir.path()
    );
    std::fs::write(&config, text).unwrap();
    let config = config.to_str().unwrap().to_owned();
    Palisade::spawn(&["serve", "--config", &config], &[], dir)
}

/// One `tools/call` of the conformance app's `test_simple_text`: (status, Retry-After, body).
async fn call(http: &reqwest::Client, server: &Palisade) -> (u16, Option<String>, Value) {
    let params = with_meta(json!({ "name": "test_simple_text" }), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params });
    let response = http
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "test_simple_text")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let text = response.text().await.unwrap();
    let frame: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not one JSON frame: {text}"));
    crate::schema::check_response("tools/call", &frame);
    (status, retry_after, frame)
}

/// Asserts `answer` is a rate-limit refusal: 429, `Retry-After` in whole seconds, -32034 with
/// the wait in its data (and nothing about the rule).
fn assert_rate_limited(answer: &(u16, Option<String>, Value), most_secs: u64) {
    let (status, retry_after, frame) = answer;
    assert_eq!(*status, 429, "{frame}");
    let seconds: u64 = retry_after.as_deref().expect("Retry-After").parse().expect("Retry-After in seconds");
    assert!((1..=most_secs).contains(&seconds), "Retry-After {seconds}");
    assert_eq!(frame["error"]["code"], -32034, "{frame}");
    assert_eq!(frame["error"]["message"], "rate limited");
    let data = &frame["error"]["data"];
    let ms = data["retryAfterMs"].as_u64().expect("retryAfterMs");
    assert!(ms > 0 && ms.div_ceil(1000) == seconds, "{data} against Retry-After {seconds}");
    assert_eq!(data["retryAfterSeconds"], json!(seconds));
    assert!(!frame.to_string().contains("calls"), "the rule's name is not sent: {frame}");
}

/// Sends `3 * n` calls at once, spread over `servers`; how many were answered, how many refused
/// with 429 (nothing else may come back).
async fn burst_of_calls(servers: &[&Palisade], total: usize) -> (usize, usize) {
    let http = reqwest::Client::new();
    let answers = join_all((0..total).map(|i| call(&http, servers[i % servers.len()]))).await;
    let ok = answers.iter().filter(|(status, _, frame)| *status == 200 && frame.get("result").is_some()).count();
    let limited = answers.iter().filter(|(status, _, _)| *status == 429).count();
    assert_eq!(ok + limited, total, "only answers and 429s: {answers:?}");
    for answer in answers.iter().filter(|(status, _, _)| *status == 429) {
        assert_rate_limited(answer, 3600);
    }
    (ok, limited)
}

/// The value of one series (name and labels exactly as rendered) in a scrape, 0 when absent.
fn sample(scrape: &str, series: &str) -> f64 {
    scrape.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

/// `palisade ARGS` (which must succeed): its stdout.
fn palisade(args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{args:?}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

#[tokio::test]
async fn over_its_limit_a_call_is_429_with_retry_after_counted_and_audited() {
    let metrics = free_port();
    let server = serve(&calls_rule(2), Some(metrics));
    let http = reqwest::Client::new();
    for _ in 0..2 {
        let (status, retry_after, frame) = call(&http, &server).await;
        assert_eq!((status, retry_after), (200, None), "{frame}");
    }
    let refused = call(&http, &server).await;
    assert_rate_limited(&refused, 3600);
    // A method the rule does not count still passes.
    let list = crate::harness::Client::new(&server).request("tools/list", json!({})).await;
    assert_eq!(list.status, 200);
    // Counted per limit.
    let scrape = reqwest::get(format!("http://127.0.0.1:{metrics}/metrics")).await.unwrap().text().await.unwrap();
    assert_eq!(sample(&scrape, r#"palisade_rate_limit_decisions_total{limit="calls",decision="allowed"}"#), 2.0);
    assert_eq!(sample(&scrape, r#"palisade_rate_limit_decisions_total{limit="calls",decision="refused"}"#), 1.0);
    assert_eq!(sample(&scrape, r#"palisade_decisions_total{stage="rate_limit",decision="deny"}"#), 1.0, "{scrape}");
    // Audited as a deny at its stage, with its code.
    let config = server.data_dir.0.join("palisade.toml");
    let config = config.to_str().unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let shown = palisade(&["audit", "show", "--format", "json", "--stage", "rate_limit", "--config", config]);
        let records: Vec<Value> = shown.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        if let Some(record) = records.first() {
            assert_eq!(records.len(), 1, "{records:?}");
            assert_eq!(record["decision"], "deny", "{record}");
            assert_eq!(record["code"], -32034, "{record}");
            break;
        }
        assert!(Instant::now() < deadline, "the rate-limit refusal was never audited");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn n_of_3n_concurrent_calls_pass_on_one_instance() {
    let server = serve(&calls_rule(10), None);
    assert_eq!(burst_of_calls(&[&server], 30).await, (10, 20));
}

#[tokio::test]
async fn n_of_3n_concurrent_calls_pass_across_three_instances_on_one_redis() {
    let public_url = format!("http://limits-{}.test/mcp", marker());
    let shared = format!(
        "public_url = \"{public_url}\"\n[rate_limit]\nstore = \"redis\"\nredis_url = \"{}\"\ntimeout_ms = 2000\n\n{}",
        redis_url(),
        calls_rule(10)
    );
    let (a, b, c) = (serve(&shared, None), serve(&shared, None), serve(&shared, None));
    assert_eq!(burst_of_calls(&[&a, &b, &c], 30).await, (10, 20));
    // The count is the deployment's: a fresh instance of it is refused at once too.
    let d = serve(&shared, None);
    assert_rate_limited(&call(&reqwest::Client::new(), &d).await, 3600);
}

#[tokio::test]
async fn with_redis_down_a_call_is_refused_by_default_and_counted_locally_when_configured() {
    // Nothing listens on port 1: every check fails.
    let down = "[rate_limit]\nstore = \"redis\"\nredis_url = \"redis://127.0.0.1:1/\"\n";
    let metrics = free_port();
    let refusing = serve(&format!("{down}\n{}", calls_rule(5)), Some(metrics));
    let http = reqwest::Client::new();
    for _ in 0..3 {
        let (status, retry_after, frame) = call(&http, &refusing).await;
        assert_eq!((status, retry_after), (503, None), "{frame}");
        assert_eq!(frame["error"]["code"], -32603, "fail closed as Unavailable: {frame}");
    }
    let scrape = reqwest::get(format!("http://127.0.0.1:{metrics}/metrics")).await.unwrap().text().await.unwrap();
    assert_eq!(sample(&scrape, r#"palisade_rate_limit_store_failures_total{fallback="refused"}"#), 3.0, "{scrape}");
    // The documented local allowance: the same rule, counted by this instance alone.
    let local = serve(&format!("{down}on_store_failure = \"local\"\n\n{}", calls_rule(2)), None);
    assert_eq!(burst_of_calls(&[&local], 6).await, (2, 4));
}

#[test]
fn on_stdio_the_refusal_carries_the_wait_in_its_data() {
    let dir = TempDir::new();
    let config = dir.0.join("limits.toml");
    std::fs::write(&config, calls_rule(1)).unwrap();
    let mut server = crate::stdio::StdioServer::start(&["--config", config.to_str().unwrap()]);
    for id in 1..=2 {
        server.request(json!(id), "tools/call", json!({ "name": "test_simple_text" }));
    }
    let first = server.next(PATIENCE).expect("first answer");
    let second = server.next(PATIENCE).expect("second answer");
    let (ok, refused) = if first.get("result").is_some() { (first, second) } else { (second, first) };
    assert!(ok.get("result").is_some(), "{ok}");
    crate::schema::check_response("tools/call", &refused);
    assert_eq!(refused["error"]["code"], -32034, "{refused}");
    let ms = refused["error"]["data"]["retryAfterMs"].as_u64().expect("retryAfterMs");
    assert!((1..=3_600_000).contains(&ms), "{refused}");
}

#[test]
fn config_check_names_a_bad_rule_and_summarises_good_ones() {
    let dir = TempDir::new();
    let good = dir.0.join("good.toml");
    let text =
        format!("[rate_limit]\nstore = \"redis\"\nredis_url = \"redis://:secret@127.0.0.1:1/\"\n\n{}", calls_rule(3));
    std::fs::write(&good, text).unwrap();
    let stdout = palisade(&["config", "check", good.to_str().unwrap()]);
    let line = stdout.lines().find(|line| line.starts_with("rate limits:")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("1 rule(s), shared through Redis") && line.contains("refusing"), "{line}");
    assert!(!stdout.contains("secret"), "no Redis password: {stdout}");
    let config = dir.0.join("bad.toml");
    std::fs::write(&config, "[[rate_limits]]\nname = \"x\"\nkey = [\"ip\"]\nrate = 5\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["config", "check", config.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("rate_limits[0].key") && stderr.contains("`ip`"), "{stderr}");
}

/// A gateway whose upstream has `max_in_flight = 2`: with two calls held at the upstream, a
/// third is refused at once (429, -32034) without reaching it; once they are answered, calls
/// pass again.
#[tokio::test]
async fn the_gateway_caps_calls_in_flight_per_upstream() {
    let fixture = Upstream::start(vec![tool("echo", "Echoes.")]).await;
    let gateway = boot("", &upstream("slow", &fixture.url, "max_in_flight = 2"));
    gateway.approve_all("slow");
    let token = gateway.token("alice", "");
    gateway.wait_tools(&token, "the tool is served", |tools| tools.iter().any(|t| t == "slow_echo")).await;
    fixture.hold_calls();
    let send = |text: &str| {
        let params = with_meta(json!({ "name": "slow_echo", "arguments": { "text": text } }), json!({}));
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
        post(&gateway.server, &token, "tools/call").header("mcp-name", "slow_echo").body(body.to_string()).send()
    };
    let held = [tokio::spawn(send("one")), tokio::spawn(send("two"))];
    let deadline = Instant::now() + PATIENCE;
    while fixture.calls().len() < 2 {
        assert!(Instant::now() < deadline, "the two calls never reached the upstream");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = send("three").await.unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let frame: Value = refused.json().await.unwrap();
    assert_eq!(frame["error"]["code"], -32034, "{frame}");
    assert_eq!(fixture.calls().len(), 2, "the refused call never reached the upstream");
    fixture.release_calls();
    for answer in held {
        let response = answer.await.unwrap().unwrap();
        assert_eq!(response.status().as_u16(), 200);
    }
    let after = gateway.call(&token, "slow_echo", json!({ "text": "four" })).await;
    assert!(text_of(&after).contains("four"));
}
