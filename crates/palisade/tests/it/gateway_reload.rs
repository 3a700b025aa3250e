//! `palisade gateway` reloading its configuration without a restart: upstreams added (by `SIGHUP`,
//! by `palisade reload`, by an edit of the file alone) go through pinning like at start; removed
//! ones are gone the moment the reload returns; an invalid edit or a restart-only key changes
//! nothing and `palisade reload` exits 1 with the reason (also in the audit log); and reloads under
//! a steady stream of concurrent calls lose no request and never serve a half-applied registry.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway_pins::{Gateway, PATIENCE, assert_unknown, boot, boot_with, palisade, post, text_of, upstream};
use crate::harness::{Palisade, Stream, with_meta};
use crate::upstream_fixture::{Upstream, tool};

/// The environment of a gateway that reloads only on `SIGHUP` and `palisade reload`.
const NO_WATCH: &[(&str, &str)] = &[("PALISADE_WATCH_CONFIG", "false")];

/// The configuration file's text before the `[[upstreams]]` tables (as `boot` writes it).
fn head(gateway: &Gateway) -> String {
    let text = std::fs::read_to_string(&gateway.config).unwrap();
    text[..text.find("[[upstreams]]").expect("an upstream")].to_owned()
}

/// Rewrites the configuration: `head`, then `upstreams`.
fn write_upstreams(gateway: &Gateway, head: &str, upstreams: &str) {
    std::fs::write(&gateway.config, format!("{head}{upstreams}")).unwrap();
}

/// `palisade reload --config <file>`: (exit code, stdout, stderr).
fn reload(gateway: &Gateway) -> (i32, String, String) {
    palisade(&["reload", "--config", &gateway.config], &[])
}

/// `palisade reload`, which must succeed; its stdout.
fn reload_ok(gateway: &Gateway) -> String {
    let (code, stdout, stderr) = reload(gateway);
    assert_eq!(code, 0, "palisade reload: {stdout}{stderr}");
    stdout
}

/// The sorted names `tools/list` shows `token` (an unknown-method answer: none).
async fn tool_set(gateway: &Gateway, token: &str) -> BTreeSet<String> {
    gateway.wait_tools(token, "a listing", |_| true).await.into_iter().collect()
}

/// The reload audit records, as `palisade audit search` shows them (JSON).
fn reload_records(gateway: &Gateway) -> Vec<Value> {
    let out = gateway.cli(&["audit", "search", "--stage", "reload", "--format", "json"]);
    out.lines().map(|line| serde_json::from_str(line).expect("one JSON record per line")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_are_added_by_sighup_and_by_palisade_reload_and_removed_at_once() {
    let docs = Upstream::start(vec![tool("first", "Reviewed first.")]).await;
    let search = Upstream::start(vec![tool("find", "Finds things.")]).await;
    let wiki = Upstream::start(vec![tool("page", "Reads a page.")]).await;
    let docs_table = upstream("docs", &docs.url, "");
    // Without the file watch: each change here is applied by the trigger the test names.
    let mut gateway = boot_with("", &docs_table, NO_WATCH);
    gateway.approve_all("docs");
    let token = gateway.token("alice", "");
    gateway.wait_tools(&token, "docs approved", |t| t == ["docs_first"]).await;
    let start = head(&gateway);

    // Added by an edit and SIGHUP: pinned like at start (pending), served once approved.
    write_upstreams(&gateway, &start, &format!("{docs_table}\n{}", upstream("search", &search.url, "")));
    gateway.server.signal("HUP");
    gateway.wait_pin("search", "find", "pending").await;
    assert_eq!(tool_set(&gateway, &token).await, BTreeSet::from(["docs_first".to_owned()]));
    assert_unknown(&gateway, &token, "search_find").await;
    gateway.approve_all("search");
    gateway.wait_tools(&token, "search approved", |t| t.len() == 2).await;
    let answer = gateway.call(&token, "search_find", json!({ "text": "needle" })).await;
    assert_eq!(text_of(&answer), r#"{"text":"needle"}"#);
    assert!(gateway.server.is_running(), "SIGHUP reloads; it does not end the process");

    // Added by `palisade reload`: the command returns once the reload is applied.
    let three = format!("{docs_table}\n{}\n{}", upstream("search", &search.url, ""), upstream("wiki", &wiki.url, ""));
    write_upstreams(&gateway, &start, &three);
    let out = reload_ok(&gateway);
    assert!(out.contains("added: wiki"), "{out}");
    assert_eq!(gateway.pin("wiki", "tool", "page").expect("listed and pinned by the reload").1, "pending");

    // Removed: gone from the registry when `palisade reload` returns, and a listen stream hears it.
    let params = with_meta(json!({ "notifications": { "toolsListChanged": true } }), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen", "params": params });
    let mut stream = Stream::open(post(&gateway.server, &token, "subscriptions/listen").body(body.to_string())).await;
    let ack = stream.next(Duration::from_secs(10)).await.expect("acknowledged");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    write_upstreams(&gateway, &start, &format!("{docs_table}\n{}", upstream("wiki", &wiki.url, "")));
    let out = reload_ok(&gateway);
    assert!(out.contains("removed: search"), "{out}");
    assert!(!out.contains("added"), "wiki and docs are unchanged: {out}");
    assert_eq!(tool_set(&gateway, &token).await, BTreeSet::from(["docs_first".to_owned()]));
    assert_unknown(&gateway, &token, "search_find").await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let frame = stream.next(deadline - tokio::time::Instant::now()).await.expect("list_changed after the removal");
        if frame["method"] == "notifications/tools/list_changed" {
            break;
        }
    }
    // The kept upstream's connection serves on.
    let answer = gateway.call(&token, "docs_first", json!({ "text": "still" })).await;
    assert_eq!(text_of(&answer), r#"{"text":"still"}"#);

    let records = reload_records(&gateway);
    let triggers: Vec<&str> = records.iter().filter_map(|r| r["detail"].as_str()).collect();
    assert!(triggers.iter().any(|d| d.starts_with("trigger=sighup reloaded: added: search")), "{triggers:?}");
    assert!(triggers.iter().any(|d| d.starts_with("trigger=command reloaded: removed: search")), "{triggers:?}");
    assert!(records.iter().all(|r| r["decision"] == "allow" && r["operation"] == "config/reload"), "{records:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_edit_or_a_restart_only_key_changes_nothing_and_palisade_reload_says_why() {
    let docs = Upstream::start(vec![tool("first", "Reviewed first."), tool("second", "Reviewed second.")]).await;
    let extra = Upstream::start(vec![tool("more", "More.")]).await;
    let docs_table = upstream("docs", &docs.url, "");
    let gateway = boot("", &docs_table);
    gateway.approve_all("docs");
    let token = gateway.token("alice", "");
    gateway.wait_tools(&token, "docs approved", |t| t.len() == 2).await;
    let served = tool_set(&gateway, &token).await;
    let start = head(&gateway);

    // An invalid upstream table (a duplicate id) alongside a valid change (a new rule).
    let invalid = format!(
        "{}\ndeny = [\"second\"]\n\n{}",
        docs_table.trim_end(),
        upstream("docs", &extra.url, "prefix = \"other\"")
    );
    write_upstreams(&gateway, &start, &invalid);
    let (code, stdout, stderr) = reload(&gateway);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("not reloaded, nothing changed"), "{stderr}");
    assert!(stderr.contains("upstreams[1].id: duplicate upstream id"), "{stderr}");

    // Not TOML at all.
    write_upstreams(&gateway, &start, "[[upstreams]\nid = ");
    let (code, _, stderr) = reload(&gateway);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("not reloaded, nothing changed"), "{stderr}");

    // A key that needs a restart, with a valid upstream change: refused whole, the key named.
    let moved = start.replace("relist_secs = 1", "relist_secs = 2");
    assert_ne!(moved, start);
    write_upstreams(&gateway, &moved, &format!("{docs_table}\ndeny = [\"second\"]\n"));
    let (code, _, stderr) = reload(&gateway);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("pins.relist_secs changed"), "{stderr}");
    assert!(stderr.contains("at a restart"), "{stderr}");

    // Nothing of any of them was applied (the file watch tried them too).
    assert_eq!(tool_set(&gateway, &token).await, served);
    let answer = gateway.call(&token, "docs_second", json!({ "text": "kept" })).await;
    assert_eq!(text_of(&answer), r#"{"text":"kept"}"#);
    let refused: Vec<Value> = reload_records(&gateway).into_iter().filter(|r| r["decision"] == "deny").collect();
    assert!(refused.iter().any(|r| r["detail"].as_str().unwrap().contains("duplicate upstream id")), "{refused:?}");
    assert!(refused.iter().any(|r| r["detail"].as_str().unwrap().contains("pins.relist_secs")), "{refused:?}");

    // A valid edit of the file alone (no signal, no command) is applied by the watch: the rule
    // takes effect on the running connection.
    write_upstreams(&gateway, &start, &format!("{docs_table}\ndeny = [\"second\"]\n"));
    gateway.wait_tools(&token, "the deny rule applied by the file watch", |t| t == ["docs_first"]).await;
    assert_unknown(&gateway, &token, "docs_second").await;
    let records = reload_records(&gateway);
    assert!(
        records.iter().any(|r| r["detail"].as_str().unwrap().starts_with("trigger=file reloaded: rules changed: docs")),
        "{records:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_concurrent_calls_lose_no_request_and_never_serve_a_half_applied_registry() {
    let docs = Upstream::start(vec![tool("first", "Reviewed first."), tool("second", "Reviewed second.")]).await;
    let search = Upstream::start(vec![tool("find", "Finds things.")]).await;
    let docs_table = upstream("docs", &docs.url, "");
    let both = format!("{docs_table}\n{}", upstream("search", &search.url, ""));
    // The other snapshot: search removed *and* a docs tool denied, in one reload.
    let narrowed = format!("{docs_table}\ndeny = [\"second\"]\n");
    let gateway = Arc::new(boot_with("", &both, NO_WATCH));
    let start = head(&gateway);
    gateway.approve_all("docs");
    gateway.approve_all("search");
    let token = gateway.token("alice", "");
    gateway.wait_tools(&token, "all approved", |t| t.len() == 3).await;
    let wide: BTreeSet<String> = ["docs_first", "docs_second", "search_find"].map(str::to_owned).into();
    let narrow: BTreeSet<String> = ["docs_first"].map(str::to_owned).into();

    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (gateway, token, stop) = (gateway.clone(), token.clone(), stop.clone());
        let (wide, narrow) = (wide.clone(), narrow.clone());
        workers.push(tokio::spawn(async move {
            let (mut calls, mut lists) = (0, 0);
            while !stop.load(Ordering::SeqCst) {
                let text = format!("w{worker}-{calls}");
                let answer = gateway.call(&token, "docs_first", json!({ "text": text })).await;
                assert_eq!(text_of(&answer), json!({ "text": text }).to_string(), "a call was lost");
                calls += 1;
                let seen = tool_set(&gateway, &token).await;
                assert!(seen == wide || seen == narrow, "a half-applied registry answered: {seen:?}");
                lists += 1;
            }
            (calls, lists)
        }));
    }
    for round in 0..6 {
        let (config, expected) = if round % 2 == 0 { (&narrowed, &narrow) } else { (&both, &wide) };
        write_upstreams(&gateway, &start, config);
        reload_ok(&gateway);
        // Published when the command returns: the approved pins of a re-added upstream serve at once.
        assert_eq!(&tool_set(&gateway, &token).await, expected, "after reload {round}");
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for worker in workers {
        let (calls, lists) = worker.await.expect("no worker saw a lost request or a half-applied registry");
        assert!(calls > 0 && lists > 0);
        total += calls;
    }
    let forwarded = docs.calls().into_iter().filter(|r| r.body["params"]["name"] == "first").count();
    assert_eq!(forwarded, total, "every call answered was forwarded once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_to_a_removed_upstream_finishes_on_the_registry_it_started_with() {
    let fx = Palisade::start(&[]);
    let docs = Upstream::start(vec![tool("first", "Reviewed first.")]).await;
    let docs_table = upstream("docs", &docs.url, "");
    let gateway = Arc::new(boot_with("", &format!("{docs_table}\n{}", upstream("fx", &fx.url, "")), NO_WATCH));
    let start = head(&gateway);
    gateway.approve_all("docs");
    gateway.approve_all("fx");
    let token = gateway.token("alice", "");
    gateway.wait_tools(&token, "fx approved", |t| t.iter().any(|n| n == "fx_test_slow")).await;

    let (slow_gateway, slow_token) = (gateway.clone(), token.clone());
    let slow = tokio::spawn(async move { slow_gateway.call(&slow_token, "fx_test_slow", json!({ "ms": 6000 })).await });
    // Let the call reach the upstream before the reload (the assertion below does not depend on it).
    tokio::time::sleep(Duration::from_secs(1)).await;
    write_upstreams(&gateway, &start, &docs_table);
    let out = reload_ok(&gateway);
    assert!(out.contains("removed: fx"), "{out}");
    assert_unknown(&gateway, &token, "fx_test_slow").await;
    let answer = slow.await.expect("the call in flight");
    assert_eq!(text_of(&answer), "slept 6000 ms", "the call in flight was cut by the reload");
}
