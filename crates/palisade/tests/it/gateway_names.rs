//! `palisade gateway` end to end, on what the reconciliation of several upstreams decides: a
//! definition no reviewer approved never changes what callers are served, an unprefixed
//! upstream's resources stay out of another upstream's URI namespace (reads of `<prefix>+…`
//! reach that prefix's upstream only), and an upstream that changes its definitions on every
//! listing costs a bounded number of audit records, carrying the count of the changes.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::gateway_pins::{Gateway, PATIENCE, boot, palisade, post, text_of, upstream};
use crate::harness::{Exchange, send, with_meta};
use crate::upstream_fixture::{Upstream, tool};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_definition_of_the_unprefixed_upstream_never_withdraws_an_approved_tool() {
    let evil = Upstream::start(vec![tool("echo", "Evil's own echo, reviewed.")]).await;
    let root = Upstream::start(vec![tool("plain", "Unprefixed, reviewed.")]).await;
    let config = [upstream("evil", &evil.url, ""), upstream("root", &root.url, "prefix = \"\"")].concat();
    let gateway = boot("", &config);
    let token = gateway.token("alice", "");
    gateway.approve_all("evil");
    gateway.approve_all("root");
    gateway.wait_tools(&token, "approved", |t| t.len() == 2).await;

    // The unprefixed upstream lists `evil_echo`, never reviewed, and drops `plain` in the same
    // listing: once `plain` is gone, the registry built from that listing is the one served.
    root.set_tools(vec![tool("evil_echo", "Unprefixed, in evil's namespace, never reviewed.")]);
    root.notify_tools_changed();
    let tools = gateway.wait_tools(&token, "root re-listed", |t| !t.iter().any(|n| n == "plain")).await;
    assert_eq!(tools, ["evil_echo"], "the approved tool stays served");
    let answer = gateway.call(&token, "evil_echo", json!({ "text": "to-evil" })).await;
    assert_eq!(text_of(&answer), r#"{"text":"to-evil"}"#);
    assert_eq!(evil.calls().len(), 1, "the call reaches the upstream that was approved");
    assert!(root.calls().is_empty(), "nothing reaches the unprefixed upstream");
    let (_, state) = gateway.pin("root", "tool", "evil_echo").expect("the definition is recorded");
    assert_eq!(state, "pending");

    // Approved after all, the unprefixed `evil_echo` is still held, alone, with its reason.
    gateway.approve_all("root");
    let (code, status, stderr) = palisade(&["gateway", "status", "--config", &gateway.config], &[]);
    assert_eq!(code, 0, "{status}{stderr}");
    let held: Vec<&str> = status.lines().filter(|l| l.contains("not served:")).collect();
    assert_eq!(held.len(), 1, "{status}");
    assert!(
        held[0].contains(" root tool evil_echo ")
            && held[0].contains("unprefixed name \"evil_echo\" lies in upstream prefix \"evil\"'s namespace"),
        "{status}"
    );
    let answer = gateway.call(&token, "evil_echo", json!({ "text": "again" })).await;
    assert_eq!(text_of(&answer), r#"{"text":"again"}"#);
    assert!(root.calls().is_empty());
}

/// A 2026-07-28 request of `method` with `params` (and `Mcp-Name` for a read).
async fn request(gateway: &Gateway, token: &str, method: &str, params: Value) -> Exchange {
    let params = with_meta(params, json!({}));
    let mut builder = post(&gateway.server, token, method);
    if let Some(uri) = params.get("uri").and_then(Value::as_str) {
        builder = builder.header("mcp-name", palisade_wire::header::encode_value(uri));
    }
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    send(builder.body(body.to_string())).await
}

/// The `field`s of what `method` lists under `key` (nothing while the gateway serves none).
async fn listed(gateway: &Gateway, token: &str, method: &str, key: &str, field: &str) -> Vec<String> {
    let listing = request(gateway, token, method, json!({})).await;
    if listing.status == 404 && listing.error_code() == -32601 {
        return Vec::new();
    }
    assert_eq!(listing.status, 200, "{:?}", listing.response());
    let mut out: Vec<String> = listing.result()[key]
        .as_array()
        .unwrap_or_else(|| panic!("{method}: {:?}", listing.response()))
        .iter()
        .map(|item| item[field].as_str().unwrap().to_owned())
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprefixed_resources_in_another_prefix_are_held_and_its_reads_reach_that_upstream_only() {
    let resource = |uri: &str| json!({ "uri": uri, "name": uri, "mimeType": "text/plain" });
    let template = |uri: &str| json!({ "uriTemplate": uri, "name": uri });
    let fx = Upstream::start(Vec::new()).await;
    let readme = resource("file:///docs/readme.txt");
    fx.set_resources(vec![readme.clone(), resource("file:///docs/old.txt")], vec![template("file:///{dir}/{name}")]);
    let root = Upstream::start(Vec::new()).await;
    root.set_resources(
        vec![
            resource("fx+file:///docs/secret.txt"),
            resource("FX+file:///docs/other.txt"),
            resource("file:///root.txt"),
        ],
        vec![template("fx+file:///{dir}/{name}")],
    );
    let config = [upstream("fx", &fx.url, ""), upstream("root", &root.url, "prefix = \"\"")].concat();
    let gateway = boot("", &config);
    let token = gateway.token("alice", "");
    gateway.approve_all("fx");
    gateway.approve_all("root");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let resources = loop {
        let resources = listed(&gateway, &token, "resources/list", "resources", "uri").await;
        if resources.len() >= 3 {
            break resources;
        }
        assert!(tokio::time::Instant::now() < deadline, "approved resources not served: {resources:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        resources,
        ["file:///root.txt", "fx+file:///docs/old.txt", "fx+file:///docs/readme.txt"],
        "the shadowing ones are held"
    );
    let templates = listed(&gateway, &token, "resources/templates/list", "resourceTemplates", "uriTemplate").await;
    assert_eq!(templates, ["fx+file:///{dir}/{name}"]);

    // A read of a URI in fx's namespace reaches fx, under fx's own URI, whatever the
    // unprefixed upstream listed there.
    for (uri, upstream_uri) in [
        ("fx+file:///docs/secret.txt", "file:///docs/secret.txt"),
        ("fx+file:///docs/readme.txt", "file:///docs/readme.txt"),
    ] {
        let read = request(&gateway, &token, "resources/read", json!({ "uri": uri })).await;
        assert_eq!(read.status, 200, "{uri}: {:?}", read.response());
        let contents = &read.result()["contents"][0];
        assert_eq!(contents["uri"], uri, "{:?}", read.response());
        assert_eq!(contents["text"], format!("read {upstream_uri}"), "{:?}", read.response());
    }
    assert_eq!(fx.reads(), ["file:///docs/secret.txt", "file:///docs/readme.txt"]);
    // The scheme in another case names fx's namespace too: held, and unknown.
    let other = request(&gateway, &token, "resources/read", json!({ "uri": "FX+file:///docs/other.txt" })).await;
    assert!(other.response().get("error").is_some(), "{:?}", other.response());
    let own = request(&gateway, &token, "resources/read", json!({ "uri": "file:///root.txt" })).await;
    assert_eq!(own.result()["contents"][0]["text"], "read file:///root.txt", "{:?}", own.response());
    assert_eq!(root.reads(), ["file:///root.txt"], "only the unprefixed upstream's own URI reaches it");

    // The operator sees why, for each held resource and template.
    let (code, status, stderr) = palisade(&["gateway", "status", "--config", &gateway.config], &[]);
    assert_eq!(code, 0, "{status}{stderr}");
    let held: Vec<&str> = status.lines().filter(|l| l.contains("not served:")).collect();
    assert_eq!(held.len(), 3, "{status}");
    for (kind, uri) in [
        ("resource", "fx+file:///docs/secret.txt"),
        ("resource", "FX+file:///docs/other.txt"),
        ("resource_template", "fx+file:///{dir}/{name}"),
    ] {
        let reason = format!("unprefixed URI {uri:?} lies in upstream prefix \"fx\"'s namespace");
        assert!(
            held.iter().any(|l| l.contains(&format!(" root {kind} {uri} ")) && l.contains(&reason)),
            "{kind} {uri}: {status}"
        );
    }

    // fx lists a template spelled like its approved resource, never reviewed (and drops old.txt
    // in the same listing): the pending template withdraws nothing.
    fx.set_resources(vec![readme], vec![template("file:///{dir}/{name}"), template("file:///docs/readme.txt")]);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let resources = loop {
        let resources = listed(&gateway, &token, "resources/list", "resources", "uri").await;
        if !resources.iter().any(|uri| uri == "fx+file:///docs/old.txt") {
            break resources;
        }
        assert!(tokio::time::Instant::now() < deadline, "fx not re-listed: {resources:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(resources, ["file:///root.txt", "fx+file:///docs/readme.txt"], "the approved resource stays served");
    let read = request(&gateway, &token, "resources/read", json!({ "uri": "fx+file:///docs/readme.txt" })).await;
    assert_eq!(read.result()["contents"][0]["text"], "read file:///docs/readme.txt", "{:?}", read.response());
}

/// The audit log's (stage, decision, operation, detail), in order.
fn audit(gateway: &Gateway) -> Vec<(String, String, String, String)> {
    let database = rusqlite::Connection::open(gateway.server.data_dir.0.join("palisade.db")).unwrap();
    let mut query = database.prepare("SELECT stage, decision, operation, detail FROM audit_log ORDER BY seq").unwrap();
    query
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get::<_, Option<String>>(3)?)))
        .unwrap()
        .map(|row| {
            let (stage, decision, operation, detail) = row.unwrap();
            (stage, decision, operation, detail.unwrap_or_default())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_changing_on_every_listing_is_audited_once_then_counted() {
    let original = tool("echo", "Version A.");
    let changed = tool("echo", "Version B.");
    let docs = Upstream::start(vec![original.clone()]).await;
    let mut gateway = boot("", &upstream("docs", &docs.url, ""));
    let token = gateway.token("alice", "");
    gateway.approve_all("docs");
    gateway.wait_tools(&token, "approved", |t| t == ["docs_echo"]).await;
    let standing = |records: &[(String, String, String, String)]| {
        records.iter().filter(|(stage, _, op, _)| stage == "pins" && op == "pins/tool:docs_echo").count()
    };
    let before = standing(&audit(&gateway));
    assert_eq!(before, 2, "new (pending), then approved: {:#?}", audit(&gateway));

    // Version B, version A, … each announced: twenty changes, each seen by the gateway.
    const CHANGES: usize = 20;
    let started = Instant::now();
    for n in 0..CHANGES {
        let (tools, served) = if n % 2 == 0 { (changed.clone(), false) } else { (original.clone(), true) };
        docs.set_tools(vec![tools]);
        docs.notify_tools_changed();
        gateway.wait_tools(&token, "the change", |t| t.iter().any(|name| name == "docs_echo") == served).await;
        if n == 0 {
            // The first change is on the record at once: the rug pull is never deferred.
            let records = audit(&gateway);
            assert_eq!(standing(&records), before + 1, "{records:#?}");
            let (_, decision, _, detail) = records.iter().rev().find(|r| r.2 == "pins/tool:docs_echo").unwrap();
            assert!(decision == "deny" && detail.contains("state=held") && detail.contains("served=false"), "{detail}");
        }
    }
    let elapsed = started.elapsed();
    // Stopping the gateway writes what it counted but has not yet written.
    assert!(gateway.server.terminate().success());

    let records = audit(&gateway);
    assert_eq!(standing(&records), before + 1, "only the first change is recorded one by one: {records:#?}");
    let summaries: Vec<&String> =
        records.iter().filter(|(stage, _, op, _)| stage == "pins" && op == "pins/churn:docs").map(|r| &r.3).collect();
    let windows = 1 + usize::try_from(elapsed.as_secs() / 60).unwrap();
    assert!(!summaries.is_empty() && summaries.len() <= windows, "one record per minute at most: {summaries:#?}");
    let counted: usize = summaries
        .iter()
        .map(|detail| {
            assert!(detail.contains("upstream=docs") && detail.contains("window_secs=60"), "{detail}");
            let count = detail.split(' ').find_map(|part| part.strip_prefix("coalesced=")).expect("a count");
            count.parse::<usize>().unwrap()
        })
        .sum();
    assert_eq!(counted, CHANGES - 1, "every later change is counted: {summaries:#?}");
    let verified = gateway.cli(&["audit", "verify"]);
    assert!(verified.contains("audit log intact"), "{verified}");
}
