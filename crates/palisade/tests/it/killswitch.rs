//! The kill switch through the real binary: the demo runs the development authority by default,
//! `palisade authority disable|enable` flips a tool, and a prompt, off and on live, `policy init` covers the
//! server's registry, and a signed policy missing an exposed operation refuses to start.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{
    Palisade, TempDir, confirmed_tool_call, dev_token, initialize, legacy_get, legacy_post, send, tool_call, with_meta,
};

fn palisade(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).envs(envs.iter().copied()).output().expect("run palisade")
}

fn succeed(args: &[&str], envs: &[(&str, &str)]) -> String {
    let output = palisade(args, envs);
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn the_demo_tool_flips_off_and_on_live() {
    let metrics_listen =
        format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let server = Palisade::start_app("demo", &["--metrics-listen", &metrics_listen]);
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let token = dev_token(&server, "alice", "acme", "it", "shop:read shop:basket");
    let token = token.as_str();
    let basket = |created: &crate::harness::Exchange| {
        created.result()["structuredContent"]["basket"].as_str().unwrap().to_owned()
    };
    let first = basket(&send(tool_call(&server, token, "basket_create", json!({}))).await);
    let added =
        send(tool_call(&server, token, "basket_add_item", json!({ "basket": first, "sku": "MUG-001", "quantity": 1 })));
    assert_eq!(added.await.status, 200);

    let disabled = succeed(&["authority", "disable", "--target", "tool:basket_checkout", "--reason", "test"], &env);
    assert!(disabled.contains("tool:basket_checkout is now DISABLE"), "{disabled}");
    // Refused before anything else runs: not even the confirmation question is asked.
    let refused = send(tool_call(&server, token, "basket_checkout", json!({ "basket": first }))).await;
    assert_eq!((refused.status, refused.error_code()), (200, -32030), "{:?}", refused.response());
    // Other tools keep working; the basket is intact.
    let viewed = send(tool_call(&server, token, "basket_view", json!({ "basket": first }))).await;
    assert_eq!(viewed.result()["structuredContent"]["totalCents"], 1450);
    // The metrics: the refusal under the tool and its stage, the check's and the authority's latency.
    let scrape = reqwest::get(format!("http://{metrics_listen}/metrics")).await.unwrap().text().await.unwrap();
    let count = |series: &str| -> f64 {
        let line = scrape.lines().find(|line| line.starts_with(series)).unwrap_or_else(|| panic!("{series}: {scrape}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(count(r#"palisade_tool_refusals_total{tool="basket_checkout",upstream="",stage="killswitch"}"#), 1.0);
    assert_eq!(count(r#"palisade_tool_calls_total{tool="basket_checkout",upstream="",outcome="refused"}"#), 1.0);
    assert!(count("palisade_killswitch_check_duration_seconds_count") >= 4.0, "{scrape}");
    assert!(count("palisade_killswitch_authority_duration_seconds_count") >= 1.0, "{scrape}");
    let status = succeed(&["authority", "status", "--target", "tool:basket_checkout"], &env);
    assert!(status.starts_with("tool:basket_checkout DISABLE ") && status.contains("reason=\"test\""), "{status}");
    assert!(status.contains(" digest=tool:"), "{status}");
    // Without --target, every stored target is named where this deployment can name it (the
    // authority keeps keyed digests only): the signed registry's tools by name, a tenant (which
    // nothing here enumerates) as `tenant:?` with its digest.
    succeed(&["authority", "disable", "--target", "tenant:globex", "--reason", "test", "--force"], &env);
    let all = succeed(&["authority", "status"], &env);
    assert!(all.lines().any(|line| line.starts_with("tool:basket_checkout DISABLE ")), "{all}");
    let tenant = all.lines().find(|line| line.contains(" DISABLE ") && line.contains(" digest=tenant:"));
    assert!(tenant.expect("the tenant's row").starts_with("tenant:? DISABLE ") && !all.contains("globex"), "{all}");
    succeed(&["authority", "enable", "--target", "tenant:globex", "--reason", "done", "--force"], &env);

    let enabled = succeed(&["authority", "enable", "--target", "tool:basket_checkout", "--reason", "fixed"], &env);
    assert!(enabled.contains("is now ENABLE"), "{enabled}");
    let (question, placed) = confirmed_tool_call(&server, token, "basket_checkout", json!({ "basket": first })).await;
    assert!(question.contains("1 x MUG-001") && question.contains("EUR 14.50"), "{question}");
    assert_eq!(placed.result()["structuredContent"]["totalCents"], 1450);

    let bad = palisade(&["authority", "disable", "--target", "gizmo:x", "--reason", "r"], &env);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--target"));
}

/// A 2026-07-28 `prompts/get` of the demo's prompt as `token`.
fn prompt_get(server: &Palisade, token: &str) -> reqwest::RequestBuilder {
    let params = with_meta(json!({ "name": "shop_assistant", "arguments": { "goal": "a gift" } }), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "prompts/get", "params": params });
    crate::harness::Client::new(server)
        .post("prompts/get", &params)
        .header("authorization", format!("Bearer {token}"))
        .body(body.to_string())
}

#[tokio::test]
async fn a_prompt_is_a_kill_switch_target_of_its_own() {
    let server = Palisade::start_app("demo", &[]);
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let token = dev_token(&server, "alice", "acme", "it", "shop:read");
    let served = send(prompt_get(&server, &token)).await;
    assert!(served.result()["messages"].is_array(), "{:?}", served.response());

    let disabled =
        succeed(&["authority", "disable", "--target", "prompt:shop_assistant", "--reason", "poisoned"], &env);
    assert!(disabled.contains("prompt:shop_assistant is now DISABLE"), "{disabled}");
    let refused = send(prompt_get(&server, &token)).await;
    assert_eq!(refused.error_code(), -32030, "{:?}", refused.response());
    // Only that prompt: the tools are still served.
    let search = send(tool_call(&server, &token, "catalog_search", json!({ "query": "tea" }))).await;
    assert!(search.result().is_object(), "{:?}", search.response());
    // `authority status` names it (the signed registry lists the prompt).
    let all = succeed(&["authority", "status"], &env);
    assert!(all.lines().any(|line| line.starts_with("prompt:shop_assistant DISABLE ")), "{all}");

    succeed(&["authority", "enable", "--target", "prompt:shop_assistant", "--reason", "reviewed"], &env);
    let again = send(prompt_get(&server, &token)).await;
    assert!(again.result()["messages"].is_array(), "{:?}", again.response());
}

#[test]
fn policy_init_covers_the_registry_and_an_incomplete_policy_refuses_to_start() {
    // First run of the demo generates the development authority's keys and certificates.
    let server = Palisade::start_app("demo", &[]);
    let dev = std::path::Path::new(server.data_dir.path()).join("killswitch-dev");
    let work = TempDir::new();
    let path = |name: &str| format!("{}/{name}", work.path());
    let trust = dev.join("trust");
    succeed(
        &[
            "policy",
            "init",
            "--app",
            "demo",
            "--authority",
            "palisade-dev-authority",
            "--trust-root",
            trust.to_str().unwrap(),
            "--generation",
            "7",
            "--out",
            &path("payload.json"),
        ],
        &[],
    );
    let mut payload: Value = serde_json::from_slice(&std::fs::read(path("payload.json")).unwrap()).unwrap();
    let operations = payload["operations"].as_object().unwrap();
    for key in [
        "server/discover",
        "tools/list",
        "tools/call:basket_checkout",
        "tools/call:product_get",
        "resources/read:shop://policies/returns",
        "prompts/get:shop_assistant",
        "subscriptions/listen",
    ] {
        assert_eq!(operations[key]["coverage"], "COVERED", "{key}");
    }
    // A prompt is asked for as a `prompt` target of its own, a tool as a `tool`.
    assert!(
        operations["prompts/get:shop_assistant"]["required_target_kinds"]
            .as_array()
            .unwrap()
            .contains(&json!("prompt"))
    );
    assert!(operations["tools/call:product_get"]["required_target_kinds"].as_array().unwrap().contains(&json!("tool")));
    assert_eq!(operations["tools/call:basket_checkout"]["require_commit_fence"], true);
    assert_eq!(operations["tools/call:product_get"]["require_commit_fence"], false);

    // Drop one exposed operation, sign, and point a server at it: start is refused.
    payload["operations"].as_object_mut().unwrap().remove("tools/call:basket_checkout");
    std::fs::write(path("short.json"), serde_json::to_vec(&payload).unwrap()).unwrap();
    let root_key = dev.join("policy-root.key");
    succeed(
        &[
            "policy",
            "sign",
            "--payload",
            &path("short.json"),
            "--root-key",
            root_key.to_str().unwrap(),
            "--out",
            &path("policy.json"),
        ],
        &[],
    );
    let file = |name: &str| dev.join(name).to_str().unwrap().to_owned();
    let config = format!(
        "[killswitch]\nmode = \"authority\"\nroot_public_key = \"{}\"\npolicy = \"{}\"\nkey_trust_root = \"{}\"\n\
         authority_url = \"https://127.0.0.1:9\"\nauthority_ca = \"{}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"\n\
         target_key_file = \"{}\"\n",
        file("policy-root.pub"),
        path("policy.json"),
        trust.to_str().unwrap(),
        file("ca.pem"),
        file("authority-client.pem"),
        file("authority-client.key"),
        file("target.key"),
    );
    std::fs::write(path("palisade.toml"), config).unwrap();
    let refused = palisade(
        &["serve", "--config", &path("palisade.toml"), "--listen", "127.0.0.1:0", "--data-dir", &path("data")],
        &[],
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("tools/call:basket_checkout"), "{stderr}");
}

/// A child process killed on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn an_external_authority_process_switches_the_server_and_its_absence_fails_closed() {
    use std::io::BufRead as _;
    // The development material (keys, CA, certificates) from a first demo run.
    let first = Palisade::start_app("demo", &[]);
    let dev = std::path::Path::new(first.data_dir.path()).join("killswitch-dev");
    let file = |name: &str| dev.join(name).to_str().unwrap().to_owned();
    let work = TempDir::new();
    let path = |name: &str| format!("{}/{name}", work.path());
    // A fresh authority id, so a shared Redis holds no generations of it yet.
    let mut random = [0u8; 8];
    aws_lc_rs::rand::fill(&mut random).unwrap();
    let authority_id = format!("it-authority-{}-{}", std::process::id(), palisade_base::hex::hex(&random));
    succeed(
        &[
            "policy",
            "init",
            "--app",
            "demo",
            "--authority",
            &authority_id,
            "--trust-root",
            &file("trust"),
            "--out",
            &path("payload.json"),
        ],
        &[],
    );
    succeed(
        &[
            "policy",
            "sign",
            "--payload",
            &path("payload.json"),
            "--root-key",
            &file("policy-root.key"),
            "--out",
            &path("policy.json"),
        ],
        &[],
    );
    let mut authority = Child(
        Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args([
                "authority",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--authority-id",
                &authority_id,
                "--signing-key",
                &file("authority-signing.key"),
                "--cert",
                &file("authority-server.pem"),
                "--key",
                &file("authority-server.key"),
                "--client-ca",
                &file("ca.pem"),
                "--db",
                &path("authority.db"),
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufReader::new(authority.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().strip_prefix("authority listening on ").unwrap().to_owned();
    let generation_store = std::env::var("REDIS_URL").unwrap_or_else(|_| format!("sqlite:{}", path("generations.db")));
    let config = format!(
        "[killswitch]\nmode = \"authority\"\nroot_public_key = \"{}\"\npolicy = \"{}\"\nkey_trust_root = \"{}\"\n\
         authority_url = \"{url}\"\nauthority_ca = \"{}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"\n\
         target_key_file = \"{}\"\nauthority_db = \"{}\"\ngeneration_store = \"{generation_store}\"\n",
        file("policy-root.pub"),
        path("policy.json"),
        file("trust"),
        file("ca.pem"),
        file("authority-client.pem"),
        file("authority-client.key"),
        file("target.key"),
        path("authority.db"),
    );
    std::fs::write(path("palisade.toml"), config).unwrap();
    let server = Palisade::start_app("demo", &["--config", &path("palisade.toml"), "--auth", "none"]);
    let product = || {
        let params = with_meta(json!({ "name": "product_get", "arguments": { "sku": "TEA-001" } }), json!({}));
        reqwest::Client::new()
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "product_get")
            .body(json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params }).to_string())
    };
    assert_eq!(send(product()).await.status, 200);
    let config_flag = ["--config", &path("palisade.toml")];
    let off =
        ["authority", "disable", "--target", "tool:product_get", "--reason", "test", config_flag[0], config_flag[1]];
    succeed(&off, &[]);
    assert_eq!(send(product()).await.error_code(), -32030);
    let on = ["authority", "enable", "--target", "tool:product_get", "--reason", "ok", config_flag[0], config_flag[1]];
    succeed(&on, &[]);
    assert_eq!(send(product()).await.status, 200);
    // The authority goes away: covered calls fail closed.
    drop(authority);
    let refused = send(product()).await;
    assert_eq!((refused.status, refused.error_code()), (503, -32603), "{:?}", refused.response());
}

/// `tenant:` and `client:` targets switch off every operation of that tenant or client, on both
/// wires, including the 2025-era GET stream (new ones refused, an open one ended), session
/// notifications and resource subscriptions; other tenants and clients are untouched; and
/// `authority disable` refuses a target kind the signed policy never asks for.
#[tokio::test]
async fn tenant_and_client_targets_switch_every_operation_on_both_wires() {
    let server = Palisade::start_app("demo", &[]);
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let token = |tenant: &str, client: &str| dev_token(&server, "alice", tenant, client, "shop:read");
    let (alice, other_tenant, other_client) = (token("acme", "cli"), token("globex", "cli"), token("acme", "web"));
    let product = |token: &str| send(tool_call(&server, token, "product_get", json!({ "sku": "TEA-001" })));
    assert_eq!(product(&alice).await.status, 200);
    let session = initialize(&server, &alice).await;
    // Subscriptions are in the signed registry under the key classification gives them.
    let subscribe = json!({ "jsonrpc": "2.0", "id": 1, "method": "resources/subscribe",
        "params": { "uri": "shop://policies/returns" } });
    let subscribed = send(legacy_post(&server, &alice, Some(&session), subscribe.clone())).await;
    assert_eq!((subscribed.status, subscribed.result()), (200, &json!({})), "{:?}", subscribed.response());
    let mut open_stream = crate::harness::Stream::open(legacy_get(&server, &alice, &session)).await;

    for (target, refused, untouched) in [("tenant:acme", &alice, &other_tenant), ("client:cli", &alice, &other_client)]
    {
        let disabled = succeed(&["authority", "disable", "--target", target, "--reason", "test"], &env);
        assert!(disabled.contains("is now DISABLE"), "{disabled}");
        let answer = product(refused).await;
        assert_eq!((answer.status, answer.error_code()), (200, -32030), "{target}: {:?}", answer.response());
        assert_eq!(product(untouched).await.status, 200, "{target}: another tenant or client is untouched");
        let call = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": { "name": "product_get", "arguments": { "sku": "TEA-001" } } });
        let legacy = send(legacy_post(&server, refused, Some(&session), call)).await;
        assert_eq!((legacy.status, legacy.error_code()), (200, -32030), "{target}: {:?}", legacy.response());
        // No JSON-RPC response can carry a refusal of a GET stream or a notification: 403.
        let stream = legacy_get(&server, refused, &session).send().await.unwrap();
        assert_eq!(stream.status(), 403, "{target}: no new GET stream");
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/roots/list_changed" });
        let note = legacy_post(&server, refused, Some(&session), note).send().await.unwrap();
        assert_eq!(note.status(), 403, "{target}: no session notification");
        let resubscribe = send(legacy_post(&server, refused, Some(&session), subscribe.clone())).await;
        assert_eq!(resubscribe.error_code(), -32030, "{target}");
        if target == "tenant:acme" {
            // The stream opened before the DISABLE ended once a check observed it.
            let started = std::time::Instant::now();
            assert!(open_stream.next(Duration::from_secs(10)).await.is_none());
            assert!(started.elapsed() < Duration::from_secs(8), "the open GET stream was ended, not timed out");
        }
        succeed(&["authority", "enable", "--target", target, "--reason", "done"], &env);
        assert_eq!(product(refused).await.status, 200, "{target}: ENABLE restores");
    }

    // A kind no signed rule asks for: refused, unless forced (and then loudly).
    let pointless = palisade(&["authority", "disable", "--target", "task:x", "--reason", "r"], &env);
    assert!(!pointless.status.success());
    let stderr = String::from_utf8_lossy(&pointless.stderr);
    assert!(stderr.contains("has no rule that asks for task targets"), "{stderr}");
    let forced = palisade(&["authority", "disable", "--target", "task:x", "--reason", "r", "--force"], &env);
    assert!(forced.status.success(), "{}", String::from_utf8_lossy(&forced.stderr));
    assert!(String::from_utf8_lossy(&forced.stderr).contains("WARNING"));
}

/// An open 2025-era GET stream re-checks its targets every `[killswitch] stream_recheck_secs`
/// (1 s here) through the batched path: a DISABLE that no request observes (set with
/// `authority disable`, nothing else sent) still ends it.
#[tokio::test]
async fn an_open_get_stream_ends_on_a_disable_no_request_observed() {
    let server = Palisade::start_app_env("demo", &[], &[("PALISADE_KILLSWITCH_STREAM_RECHECK_SECS", "1")]);
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let alice = dev_token(&server, "alice", "acme", "cli", "shop:read");
    let session = initialize(&server, &alice).await;
    let mut open_stream = crate::harness::Stream::open(legacy_get(&server, &alice, &session)).await;
    let disabled = succeed(&["authority", "disable", "--target", "tenant:acme", "--reason", "test"], &env);
    assert!(disabled.contains("is now DISABLE"), "{disabled}");
    let started = std::time::Instant::now();
    assert!(open_stream.next(Duration::from_secs(10)).await.is_none());
    assert!(started.elapsed() < Duration::from_secs(8), "the open GET stream was ended by its re-check");
}

/// The demo's checkout on the 2025-era wire: the confirmation is a real `elicitation/create`
/// request on the POST's stream showing the items and total; the client's answer (admitted like
/// any request of the session) lets the same call run through every stage again, once.
#[tokio::test]
async fn checkout_confirms_through_a_relayed_elicitation_on_the_session_wire() {
    let server = Palisade::start_app("demo", &[]);
    let token = dev_token(&server, "alice", "acme", "cli", "shop:read shop:basket");
    let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": { "elicitation": {} }, "clientInfo": { "name": "it", "version": "0" } } });
    let response = legacy_post(&server, &token, None, init).send().await.unwrap();
    let session = response.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let call = |id: i64, tool: &str, arguments: Value| json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": tool, "arguments": arguments } });
    let created = send(legacy_post(&server, &token, Some(&session), call(1, "basket_create", json!({})))).await;
    let basket = created.result()["structuredContent"]["basket"].as_str().unwrap().to_owned();
    let item = json!({ "basket": basket, "sku": "TEA-001", "quantity": 2 });
    assert_eq!(send(legacy_post(&server, &token, Some(&session), call(2, "basket_add_item", item))).await.status, 200);

    let checkout = call(3, "basket_checkout", json!({ "basket": basket }));
    let mut stream = crate::harness::Stream::open(legacy_post(&server, &token, Some(&session), checkout)).await;
    let ask = stream.next(Duration::from_secs(10)).await.expect("the server's question");
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    let message = ask["params"]["message"].as_str().unwrap();
    assert!(message.contains("2 x TEA-001") && message.contains("total EUR 13.00"), "{message}");
    let answer =
        json!({ "jsonrpc": "2.0", "id": ask["id"], "result": { "action": "accept", "content": { "confirm": true } } });
    let answered = legacy_post(&server, &token, Some(&session), answer.clone()).send().await.unwrap();
    assert_eq!(answered.status(), 202);
    let placed = stream.next(Duration::from_secs(10)).await.expect("the call's answer");
    assert_eq!(placed["id"], 3);
    assert_eq!(placed["result"]["structuredContent"]["totalCents"], 1300, "{placed}");
    // The same answer again finds nothing waiting for it.
    let again = legacy_post(&server, &token, Some(&session), answer).send().await.unwrap();
    assert_eq!(again.status(), 400);
}
