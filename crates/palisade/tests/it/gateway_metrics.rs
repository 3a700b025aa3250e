//! What an operator runs a gateway on, through the real binary: `/readyz` while upstreams go
//! away (ready while one serves), `/readyz/detail` on the private listener only, the
//! per-upstream and per-tool series of `/metrics` after real calls, the Grafana dashboard's
//! queries against that scrape, and the log format (`PALISADE_LOG_FORMAT`).

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway_pins::{PATIENCE, boot_with, upstream};
use crate::harness::TempDir;
use crate::upstream_fixture::{Upstream, tool};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// `/readyz/detail`'s entry for `id`.
fn upstream_detail<'a>(detail: &'a Value, id: &str) -> &'a Value {
    detail["upstreams"].as_array().unwrap().iter().find(|u| u["id"] == id).unwrap_or_else(|| panic!("{id}: {detail}"))
}

/// Polls `/readyz/detail` (bounded) until `id` is in `state`; the detail then.
async fn wait_state(private: &str, id: &str, state: &str) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (_, text) = get(&format!("{private}/readyz/detail")).await;
        let detail: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
        if upstream_detail(&detail, id)["state"] == state {
            return detail;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} never {state}: {detail}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The value of the series `series` (name and labels exactly as rendered) in a scrape.
fn sample(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} not in the scrape:\n{scrape}"))
}

/// The series names a scrape exports: counters and gauges by name, histograms as their
/// `_bucket`, `_sum` and `_count` series.
fn exported(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let (name, kind) = rest.split_once(' ').unwrap();
        if kind == "histogram" {
            names.extend(["_bucket", "_sum", "_count"].map(|suffix| format!("{name}{suffix}")));
        } else {
            names.insert(name.to_owned());
        }
    }
    names
}

/// Every metric name the dashboard's PromQL (panel targets and template queries) refers to.
fn dashboard_metrics(dashboard: &Value) -> BTreeSet<String> {
    let mut queries = Vec::new();
    let mut visit = vec![dashboard];
    while let Some(value) = visit.pop() {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr" | "definition", Value::String(query)) => queries.push(query.clone()),
                        ("query", Value::String(query)) if query.contains('(') => queries.push(query.clone()),
                        _ => visit.push(value),
                    }
                }
            }
            Value::Array(items) => visit.extend(items),
            _ => {}
        }
    }
    assert!(queries.len() > 20, "the dashboard's queries were not found: {queries:?}");
    let mut names = BTreeSet::new();
    for query in &queries {
        // Metric names are identifiers starting `palisade_`; label names and values never do.
        let mut rest = query.as_str();
        while let Some(start) = rest.find("palisade_") {
            let tail = &rest[start..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

/// Two upstreams behind one gateway, one stopped then the other: `/readyz` stays ready while
/// one serves and says why not once none does; `/readyz/detail` (private listener only) shows
/// each upstream's state, last error and definitions; `/metrics` has the per-upstream and
/// per-tool series of the calls made; and every metric the Grafana dashboard queries is in
/// that scrape, and every family in it is charted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_detail_and_metrics_follow_the_upstreams() {
    let alpha = Upstream::start(vec![tool("echo", "Echoes its arguments.")]).await;
    let mut beta = Some(Upstream::start(vec![tool("stamp", "Stamps."), tool("spare", "Unreviewed.")]).await);
    let metrics_listen = format!("127.0.0.1:{}", free_port());
    // A rate limit nothing reaches, so its series are exported (and charted) too.
    let upstreams = format!(
        "{}\n{}\n[[rate_limits]]\nname = \"generous\"\nrate = 100000\n",
        upstream("alpha", &alpha.url, ""),
        upstream("beta", &beta.as_ref().unwrap().url, "")
    );
    let gateway = boot_with("", &upstreams, &[("PALISADE_METRICS_LISTEN", &metrics_listen)]);
    let private = format!("http://{metrics_listen}");
    let public = gateway.server.url.trim_end_matches("/mcp").to_owned();

    // Nothing approved yet: nothing is served, so not ready, and the detail says why.
    assert_eq!(get(&format!("{public}/readyz")).await, (503, "no upstream serves".to_owned()));
    gateway.approve_all("alpha");
    let (beta_stamp, _) = gateway.pin("beta", "tool", "stamp").expect("pinned");
    gateway.cli(&["pins", "approve", &beta_stamp, "--reviewer", "rita"]);
    let token = gateway.token("alice", "");
    gateway.wait_tools(&token, "both upstreams served", |t| t.contains(&"alpha_echo".into()) && t.len() == 2).await;
    assert_eq!(get(&format!("{public}/readyz")).await, (200, "ready".to_owned()));

    // Calls: two answered, one refused by the arguments' schema, one to each upstream.
    for text in ["one", "two"] {
        let answer = gateway.call(&token, "alpha_echo", json!({ "text": text })).await;
        assert_eq!(answer.status, 200, "{:?}", answer.response());
    }
    let refused = gateway.call(&token, "alpha_echo", json!({ "text": 5 })).await;
    assert!(
        refused.response().get("error").is_some() || refused.result()["isError"] == true,
        "{:?}",
        refused.response()
    );
    let stamped = gateway.call(&token, "beta_stamp", json!({})).await;
    assert_eq!(stamped.status, 200, "{:?}", stamped.response());

    // beta goes away: still ready (alpha serves); the detail shows beta down and why.
    drop(beta.take());
    let detail = wait_state(&private, "beta", "down").await;
    assert_eq!(detail["ready"], true, "{detail}");
    assert_eq!(detail["store"], "ok", "{detail}");
    let down = upstream_detail(&detail, "beta");
    assert_eq!(down["serving"], false, "{down}");
    assert!(down["last_error"].as_str().is_some_and(|error| error.contains("unavailable")), "{down}");
    // stamp approved; spare and the upstream's instructions (pinned too) not reviewed.
    assert_eq!(down["definitions"]["listed"], 3, "{down}");
    assert_eq!(down["definitions"]["pending"], 2, "{down}");
    assert_eq!(down["definitions"]["approved"], 1, "{down}");
    let up = upstream_detail(&detail, "alpha");
    assert_eq!((up["state"].as_str(), up["serving"].as_bool()), (Some("up"), Some(true)), "{up}");
    assert_eq!(up["definitions"]["approved"], 2, "echo and the instructions: {up}");
    let alpha_served = up["definitions"]["served"].as_f64().unwrap();
    assert!(alpha_served >= 1.0, "{up}");
    assert!(up["last_error"].is_null(), "{up}");
    assert_eq!(get(&format!("{public}/readyz")).await, (200, "ready".to_owned()));
    assert_eq!(get(&format!("{public}/readyz/detail")).await.0, 404, "the detail is not on the public listener");

    // The scrape: per upstream and per tool.
    let (status, scrape) = get(&format!("{private}/metrics")).await;
    assert_eq!(status, 200);
    assert_eq!(sample(&scrape, r#"palisade_upstream_up{upstream="alpha"}"#), 1.0);
    assert_eq!(sample(&scrape, r#"palisade_upstream_up{upstream="beta"}"#), 0.0);
    assert_eq!(sample(&scrape, r#"palisade_upstream_definitions{upstream="alpha",state="served"}"#), alpha_served);
    assert_eq!(sample(&scrape, r#"palisade_upstream_definitions{upstream="beta",state="pending"}"#), 2.0);
    assert!(sample(&scrape, r#"palisade_upstream_errors_total{upstream="beta",kind="unavailable"}"#) >= 1.0);
    assert_eq!(sample(&scrape, r#"palisade_upstream_errors_total{upstream="alpha",kind="unavailable"}"#), 0.0);
    let alpha_calls = r#"palisade_upstream_request_duration_seconds_count{upstream="alpha",method="tools/call"}"#;
    assert_eq!(sample(&scrape, alpha_calls), 2.0, "the refused call never reached the upstream");
    assert!(
        sample(&scrape, r#"palisade_upstream_request_duration_seconds_count{upstream="beta",method="list"}"#) >= 1.0
    );
    let echo = r#"tool="alpha_echo",upstream="alpha""#;
    assert_eq!(sample(&scrape, &format!(r#"palisade_tool_calls_total{{{echo},outcome="ok"}}"#)), 2.0);
    assert_eq!(sample(&scrape, &format!(r#"palisade_tool_calls_total{{{echo},outcome="refused"}}"#)), 1.0);
    assert_eq!(sample(&scrape, &format!(r#"palisade_tool_refusals_total{{{echo},stage="arguments"}}"#)), 1.0);
    assert_eq!(sample(&scrape, &format!(r#"palisade_tool_call_duration_seconds_count{{{echo}}}"#)), 3.0);
    let stamp = r#"tool="beta_stamp",upstream="beta""#;
    assert_eq!(sample(&scrape, &format!(r#"palisade_tool_calls_total{{{stamp},outcome="ok"}}"#)), 1.0);
    for stage in ["rate_limit", "policy"] {
        let series = format!(r#"palisade_decisions_total{{stage="{stage}",decision="deny"}}"#);
        assert_eq!(sample(&scrape, &series), 0.0, "ready for the stage's refusals");
    }
    assert!(scrape.contains("palisade_audit_shipping_lag_seconds "), "{scrape}");
    assert_eq!(sample(&scrape, r#"palisade_upstream_processes{upstream="alpha"}"#), 0.0, "an HTTP upstream runs none");
    assert!(!scrape.contains("alice"), "no subject in any label");

    // The dashboard queries exactly what the server exports.
    let dashboard: Value =
        serde_json::from_str(include_str!("../../../../deploy/grafana/palisade.json")).expect("the dashboard is JSON");
    let queried = dashboard_metrics(&dashboard);
    let exported = exported(&scrape);
    let missing: Vec<&String> = queried.difference(&exported).collect();
    assert!(missing.is_empty(), "the dashboard queries metrics the server does not export: {missing:?}");
    let families = |names: &BTreeSet<String>| -> BTreeSet<String> {
        names
            .iter()
            .map(|name| {
                ["_bucket", "_sum", "_count"].iter().fold(name.clone(), |n, s| n.trim_end_matches(s).to_owned())
            })
            .collect()
    };
    let uncharted: Vec<String> = families(&exported).difference(&families(&queried)).cloned().collect();
    assert!(uncharted.is_empty(), "exported but not on the dashboard: {uncharted:?}");

    // alpha goes away too: nothing serves, not ready.
    drop(alpha);
    let detail = wait_state(&private, "alpha", "down").await;
    assert_eq!((detail["ready"].as_bool(), detail["reason"].as_str()), (Some(false), Some("no upstream serves")));
    assert_eq!(get(&format!("{public}/readyz")).await, (503, "no upstream serves".to_owned()));
    assert_eq!(get(&format!("{private}/readyz/detail")).await.0, 503);
}

/// Reads the gateway's stderr until its start-up log line about the audit segment; the line.
fn first_log_line(envs: &[(&str, &str)]) -> String {
    let dir = TempDir::new();
    let config = dir.0.join("gateway.toml");
    let text = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n[auth]\ndev_issuer = true\n\n[[upstreams]]\nid = \"nowhere\"\nurl = \"http://127.0.0.1:{}/mcp\"\n",
        dir.path(),
        free_port()
    );
    std::fs::write(&config, text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["gateway", "--config", config.to_str().unwrap()])
        .env_remove("PALISADE_LOG")
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let line = stderr.lines().map_while(Result::ok).find(|line| line.contains("audit segment open"));
    let _ = child.kill();
    let _ = child.wait();
    line.expect("the audit segment's start-up line")
}

/// Logs are JSON lines when stderr is not a terminal, readable text with
/// `PALISADE_LOG_FORMAT=text`, JSON again with `=json`; any other value is refused by name.
#[test]
fn the_log_format_is_chosen_by_palisade_log_format() {
    for envs in [&[][..], &[("PALISADE_LOG_FORMAT", "json")][..]] {
        let line = first_log_line(envs);
        let record: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert_eq!(record["level"], "INFO", "{line}");
        assert_eq!(record["fields"]["message"], "audit segment open", "{line}");
    }
    let line = first_log_line(&[("PALISADE_LOG_FORMAT", "text")]);
    assert!(serde_json::from_str::<Value>(&line).is_err(), "{line}");
    assert!(line.contains(" INFO ") && line.contains("audit segment open chain="), "{line}");
    assert!(!line.contains('\u{1b}'), "no colours off a terminal: {line:?}");

    let output = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["config", "options"])
        .env("PALISADE_LOG_FORMAT", "yaml")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("PALISADE_LOG_FORMAT = yaml: expected `text` or `json`"), "{stderr}");
}
