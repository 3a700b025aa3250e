//! The demo shop behind bearer-token auth, end to end through the real binary: challenges,
//! protected-resource metadata, scopes and step-up, the dev issuer, the stdio principal from the
//! environment, `config check` and `audit verify`.

use std::process::Command;

use serde_json::{Value, json};

use crate::harness::{Client, Palisade, TempDir, dev_token, send, tool_call, with_meta};
use crate::schema;

fn palisade(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).envs(envs.iter().copied()).output().expect("run palisade")
}

/// A token from the demo's dev issuer for the server in `data_dir` listening on `127.0.0.1:0`.
fn token(server: &Palisade, subject: &str, scope: &str) -> String {
    dev_token(server, subject, "acme", "it", scope)
}

/// A port free at the moment (for a configuration that must name its port).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn product_call(server: &Palisade, token: Option<&str>) -> reqwest::RequestBuilder {
    let params = with_meta(json!({ "name": "product_get", "arguments": { "sku": "TEA-001" } }), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
    let mut request = reqwest::Client::new()
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "product_get")
        .body(body.to_string());
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request
}

#[tokio::test]
async fn the_demo_requires_a_token_with_the_right_scope() {
    let metrics_port = free_port();
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let server = Palisade::start_app("demo", &["--metrics-listen", &metrics_listen]);
    let response = product_call(&server, None).send().await.unwrap();
    assert_eq!(response.status(), 401);
    let challenge = response.headers()["www-authenticate"].to_str().unwrap().to_owned();
    let metadata_url = format!("http://127.0.0.1:{}/.well-known/oauth-protected-resource/mcp", server.port);
    assert_eq!(
        challenge,
        format!(
            r#"Bearer resource_metadata="http://127.0.0.1:0/.well-known/oauth-protected-resource/mcp", scope="shop:read shop:basket""#
        )
    );
    for path in [metadata_url.clone(), format!("http://127.0.0.1:{}/.well-known/oauth-protected-resource", server.port)]
    {
        let metadata: Value = reqwest::get(&path).await.unwrap().json().await.unwrap();
        assert_eq!(metadata["resource"], "http://127.0.0.1:0/mcp");
        assert_eq!(metadata["scopes_supported"], json!(["shop:read", "shop:basket"]));
        assert_eq!(metadata["authorization_servers"], json!(["http://127.0.0.1:0/dev-issuer"]));
    }

    let reader = token(&server, "alice", "shop:read");
    let ok = send(product_call(&server, Some(&reader))).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.result()["structuredContent"]["sku"], "TEA-001");

    // Typed arguments: the generated schema refuses unknown members and wrong types before the
    // handler runs, as a tool error the model can read.
    for bad in [json!({ "sku": 5 }), json!({ "sku": "TEA-001", "extra": true }), json!({})] {
        let params = with_meta(json!({ "name": "product_get", "arguments": bad }), json!({}));
        let body = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params });
        let request = product_call(&server, Some(&reader)).body(body.to_string());
        let refused = send(request).await;
        assert_eq!(refused.result()["isError"], true, "{bad}");
    }
    let listed = send(
        reqwest::Client::new()
            .post(&server.url)
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/list")
            .header("authorization", format!("Bearer {reader}"))
            .body(
                json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": with_meta(json!({}), json!({})) })
                    .to_string(),
            ),
    )
    .await;
    let product_get =
        listed.result()["tools"].as_array().unwrap().iter().find(|t| t["name"] == "product_get").unwrap().clone();
    assert_eq!(product_get["inputSchema"]["properties"]["sku"]["type"], "string");
    assert_eq!(product_get["inputSchema"]["required"], json!(["sku"]));
    assert_eq!(product_get["annotations"]["readOnlyHint"], true);

    let outsider = token(&server, "bob", "shop:basket");
    let response = product_call(&server, Some(&outsider)).send().await.unwrap();
    assert_eq!(response.status(), 403);
    assert!(
        response.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .contains(r#"error="insufficient_scope", scope="shop:read""#)
    );
    let stepped_up = token(&server, "bob", "shop:basket shop:read");
    assert_eq!(send(product_call(&server, Some(&stepped_up))).await.status, 200);

    let mut tampered = reader.clone().into_bytes();
    let last = tampered.len() - 3;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    assert_eq!(product_call(&server, Some(&tampered)).send().await.unwrap().status(), 401);
    let twice = product_call(&server, Some(&reader)).header("authorization", format!("Bearer {reader}"));
    assert_eq!(twice.send().await.unwrap().status(), 401, "two Authorization headers are malformed");
    let basic = product_call(&server, None).header("authorization", "Basic YWxpY2U6cHc=");
    assert_eq!(basic.send().await.unwrap().status(), 401);
    let query = reqwest::Client::new().post(format!("{}?access_token={reader}", server.url)).body("{}");
    assert_eq!(query.send().await.unwrap().status(), 400, "tokens in the URL are refused");
    // Health and readiness need no token; metrics count the refusals, on the private
    // `--metrics-listen` listener only.
    let base = format!("http://127.0.0.1:{}", server.port);
    assert_eq!(reqwest::get(format!("{base}/healthz")).await.unwrap().status(), 200);
    assert_eq!(reqwest::get(format!("{base}/readyz")).await.unwrap().status(), 200);
    assert_eq!(reqwest::get(format!("{base}/metrics")).await.unwrap().status(), 404, "not on the public listener");
    let private = format!("http://{metrics_listen}");
    assert_eq!(reqwest::get(format!("{private}/healthz")).await.unwrap().status(), 200);
    let metrics = reqwest::get(format!("{private}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"palisade_decisions_total{stage="authenticate",decision="deny"}"#), "{metrics}");
    assert_eq!(
        reqwest::get(format!("{private}/mcp")).await.unwrap().status(),
        404,
        "the private listener serves no MCP"
    );

    let verify = palisade(&["audit", "verify"], &[("PALISADE_DATA_DIR", server.data_dir.path())]);
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stderr));
    assert!(String::from_utf8_lossy(&verify.stdout).starts_with("audit log intact:"));
}

#[tokio::test]
async fn demo_baskets_are_held_by_handles_only_their_owner_can_use() {
    let server = Palisade::start_app("demo", &[]);
    let alice = token(&server, "alice", "shop:read shop:basket");
    let created = send(tool_call(&server, &alice, "basket_create", json!({}))).await;
    let basket = created.result()["structuredContent"]["basket"].as_str().unwrap().to_owned();
    assert_eq!(basket.len(), 43, "32 random bytes, base64url");
    let added = send(tool_call(
        &server,
        &alice,
        "basket_add_item",
        json!({ "basket": basket, "sku": "TEA-001", "quantity": 2 }),
    ))
    .await;
    assert_eq!(added.result()["structuredContent"]["totalCents"], 1300, "{:?}", added.response());
    let viewed = send(tool_call(&server, &alice, "basket_view", json!({ "basket": basket }))).await;
    assert_eq!(viewed.result()["structuredContent"]["items"][0]["quantity"], 2);

    // Another user, tenant or client presenting the handle gets the one generic refusal.
    for other in [
        dev_token(&server, "bob", "acme", "it", "shop:read shop:basket"),
        dev_token(&server, "alice", "globex", "it", "shop:read shop:basket"),
        dev_token(&server, "alice", "acme", "other-client", "shop:read shop:basket"),
    ] {
        let refused = send(tool_call(&server, &other, "basket_view", json!({ "basket": basket }))).await;
        assert_eq!(refused.status, 400);
        assert_eq!(refused.error_code(), -32602);
    }
    // The basket was not touched by the refused calls.
    let viewed = send(tool_call(&server, &alice, "basket_view", json!({ "basket": basket }))).await;
    assert_eq!(viewed.result()["structuredContent"]["totalCents"], 1300);

    // Operators see digests, never handles, and revoke with a receipt.
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let listed = palisade(&["handles", "list", "--subject", "alice"], &env);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert!(listed.contains("tenant=acme client=it basket:") && !listed.contains(&basket), "{listed}");
    let revoke = ["handles", "revoke", "--subject", "alice", "--reason", "logout", "--receipt", "ticket-42"];
    let revoked = palisade(&revoke, &env);
    assert!(revoked.status.success(), "{}", String::from_utf8_lossy(&revoked.stderr));
    assert!(String::from_utf8_lossy(&revoked.stdout).contains("revoked 1 handle(s)"));
    let refused = send(tool_call(&server, &alice, "basket_view", json!({ "basket": basket }))).await;
    assert_eq!(refused.error_code(), -32602);
    let bad = palisade(&["handles", "revoke", "--digest", "xyz", "--reason", "r", "--receipt", "t"], &env);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--digest"));
    let verify = palisade(&["audit", "verify"], &env);
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
}

/// `handles revoke` ends more than one handle only with `--all`: without it, a selector covering
/// several live handles revokes nothing and says how many it covers (and how to pick one); a
/// selector covering one revokes it; with `--all` every covered handle is revoked and counted.
/// `handles list` prints its times in RFC 3339.
#[tokio::test]
async fn revoking_more_than_one_handle_needs_all_and_says_how_many() {
    let server = Palisade::start_app("demo", &[]);
    let alice = token(&server, "alice", "shop:read shop:basket");
    let mut baskets = Vec::new();
    for _ in 0..3 {
        let created = send(tool_call(&server, &alice, "basket_create", json!({}))).await;
        baskets.push(created.result()["structuredContent"]["basket"].as_str().unwrap().to_owned());
    }
    let live = |basket: String| {
        let (server, alice) = (&server, &alice);
        async move {
            let viewed = send(tool_call(server, alice, "basket_view", json!({ "basket": basket }))).await;
            viewed.response().get("result").is_some()
        }
    };
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let run = |args: &[&str]| {
        let output = palisade(args, &env);
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        (output.status.success(), text)
    };

    let (ok, listed) = run(&["handles", "list", "--subject", "alice"]);
    assert!(ok, "{listed}");
    assert_eq!(listed.lines().count(), 3, "{listed}");
    for line in listed.lines() {
        let created = line.split(" created=").nth(1).and_then(|rest| rest.split(' ').next()).unwrap();
        assert!(palisade_base::time::parse_rfc3339_ms(created).is_some(), "created is RFC 3339: {line}");
        let expires = line.split("expires at ").nth(1).unwrap();
        assert!(palisade_base::time::parse_rfc3339_ms(expires).is_some(), "expiry is RFC 3339: {line}");
    }

    let by_subject = ["handles", "revoke", "--subject", "alice", "--reason", "logout", "--receipt", "T-1"];
    let (ok, refused) = run(&by_subject);
    assert!(!ok, "{refused}");
    assert!(refused.contains("3 live handles match") && refused.contains("nothing was revoked"), "{refused}");
    assert!(refused.contains("--all") && refused.contains("--digest"), "{refused}");
    for basket in &baskets {
        assert!(live(basket.clone()).await, "a refused revocation revoked a handle");
    }
    // The other bulk selectors are held to the same rule.
    let (ok, refused) = run(&["handles", "revoke", "--tenant", "acme", "--reason", "r", "--receipt", "T-2"]);
    assert!(!ok && refused.contains("3 live handles match"), "{refused}");

    // One handle by the digest the listing shows.
    let digest = listed.lines().next().unwrap().split(' ').next().unwrap().to_owned();
    let (ok, one) = run(&["handles", "revoke", "--digest", &digest, "--reason", "logout", "--receipt", "T-3"]);
    assert!(ok && one.contains("revoked 1 handle(s)"), "{one}");
    let mut alive = 0;
    for basket in &baskets {
        alive += usize::from(live(basket.clone()).await);
    }
    assert_eq!(alive, 2);

    let mut all = by_subject.to_vec();
    all.push("--all");
    let (ok, revoked) = run(&all);
    assert!(ok && revoked.contains("revoked 2 handle(s)"), "{revoked}");
    for basket in &baskets {
        assert!(!live(basket.clone()).await, "--all left a handle live");
    }
    let (ok, listed) = run(&["handles", "list", "--subject", "alice"]);
    assert!(ok && listed.lines().all(|line| line.contains("revoked at 20")), "{listed}");
}

/// A demo request with a bearer token and the tasks extension declared; every frame is checked
/// against the core or the tasks extension schema.
async fn demo_task_rpc(server: &Palisade, token: &str, method: &str, params: Value) -> Value {
    let caps = json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } });
    let params = with_meta(params, caps);
    let body = json!({ "jsonrpc": "2.0", "id": 7, "method": method, "params": params });
    let request = Client::new(server).post(method, &params).header("authorization", format!("Bearer {token}"));
    let exchange = send(request.body(body.to_string())).await;
    let frame = exchange.response().clone();
    schema::check_response(method, &frame);
    frame
}

#[tokio::test]
async fn demo_orders_export_runs_as_a_task_with_confirmation_and_progress() {
    let server = Palisade::start_app("demo", &[]);
    let alice = token(&server, "alice", "shop:read shop:basket");
    let created = send(tool_call(&server, &alice, "basket_create", json!({}))).await;
    let basket = created.result()["structuredContent"]["basket"].as_str().unwrap().to_owned();
    send(tool_call(&server, &alice, "basket_add_item", json!({ "basket": basket, "sku": "MUG-001", "quantity": 1 })))
        .await;

    let done = export(&server, &alice, true).await;
    assert_eq!(done["result"]["structuredContent"]["count"], 1, "{done}");
    assert_eq!(done["statusMessage"], "exported 1 of 1 baskets");
    // The same user through another client exports none of them: the owner rule of the
    // basket handles (the same user, through the client that made the basket) applies.
    let elsewhere = dev_token(&server, "alice", "acme", "evil", "shop:read shop:basket");
    let done = export(&server, &elsewhere, false).await;
    assert_eq!(done["result"]["structuredContent"]["count"], 0, "{done}");
    // Without the extension the export is refused before anything runs.
    let params = with_meta(json!({ "name": "orders_export", "arguments": {} }), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": params });
    let request = Client::new(&server).post("tools/call", &params).header("authorization", format!("Bearer {alice}"));
    let refused = send(request.body(body.to_string())).await;
    assert_eq!(refused.error_code(), -32021);
}

/// Runs `orders_export` as `token` to its end (confirming it) and returns the finished task.
/// `probe_foreign`: also check that another user can neither see nor answer it.
async fn export(server: &Palisade, alice: &str, probe_foreign: bool) -> Value {
    let call = json!({ "name": "orders_export", "arguments": {} });
    let task = demo_task_rpc(server, alice, "tools/call", call).await;
    assert_eq!(task["result"]["resultType"], "task", "{task}");
    let id = task["result"]["taskId"].as_str().unwrap().to_owned();
    let poll = |expected: &'static str| {
        let id = id.clone();
        async move {
            for _ in 0..100 {
                let got = demo_task_rpc(server, alice, "tasks/get", json!({ "taskId": id })).await;
                if got["result"]["status"] == expected {
                    return got["result"].clone();
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            panic!("task never reached {expected}");
        }
    };
    let waiting = poll("input_required").await;
    assert_eq!(waiting["inputRequests"]["confirm"]["method"], "elicitation/create");
    if probe_foreign {
        // Another user cannot see or answer it.
        let bob = token(server, "bob", "shop:read shop:basket");
        let foreign = demo_task_rpc(server, &bob, "tasks/get", json!({ "taskId": id })).await;
        assert_eq!(foreign["error"]["code"], -32602);
    }
    let answer = json!({ "taskId": id, "inputResponses": { "confirm": { "action": "accept", "content": { "confirm": true } } } });
    let ack = demo_task_rpc(server, alice, "tasks/update", answer).await;
    assert_eq!(ack["result"]["resultType"], "complete");
    poll("completed").await
}

#[test]
fn stdio_takes_its_principal_from_the_environment() {
    let dir = TempDir::new();
    let run = |scopes: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["serve", "--app", "demo", "--stdio", "--data-dir", dir.path()])
            .env("PALISADE_PRINCIPAL_SUBJECT", "local-user")
            .env("PALISADE_PRINCIPAL_SCOPES", scopes)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let params = with_meta(json!({ "name": "catalog_search", "arguments": { "query": "tea" } }), json!({}));
        let line = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params }).to_string() + "\n";
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(line.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        serde_json::from_slice::<Value>(output.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap()
    };
    let allowed = run("shop:read");
    assert_eq!(
        allowed["result"]["structuredContent"]["products"].as_array().unwrap().len(),
        3,
        "green tea, black tea, teapot"
    );
    let refused = run("");
    assert_eq!(refused["error"]["data"]["requiredScopes"], json!(["shop:read"]));
}

#[test]
fn config_check_names_the_bad_key() {
    let dir = TempDir::new();
    let good = dir.0.join("good.toml");
    std::fs::write(&good, "app = \"demo\"\n[limits]\npage_size = 10\n").unwrap();
    let output = palisade(&["config", "check", good.to_str().unwrap()], &[]);
    assert!(output.status.success());
    let bad = dir.0.join("bad.toml");
    std::fs::write(&bad, "[auth]\nleeway_secs = 3600\n").unwrap();
    let output = palisade(&["config", "check", bad.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("auth.leeway_secs"));
    let unknown = dir.0.join("unknown.toml");
    std::fs::write(&unknown, "colour = \"blue\"\n").unwrap();
    let output = palisade(&["config", "check", unknown.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("colour"));
}

#[test]
fn config_check_names_a_misspelt_key_by_its_path_and_summarises_without_secrets() {
    let dir = TempDir::new();
    let upstream = "[[upstreams]]\nid = \"fx\"\nurl = \"http://127.0.0.1:9/mcp\"\n";
    for (text, key, near) in [
        (format!("[pins]\nrelist_sec = 5\n{upstream}"), "pins.relist_sec", "relist_secs"),
        (format!("{upstream}{upstream}prefx = \"b\"\n"), "upstreams[1].prefx", "prefix"),
        ("[auth.dev_issuer]\nauto_aprove = true\n".to_owned(), "auth.dev_issuer.auto_aprove", "auto_approve"),
    ] {
        let file = dir.0.join("typo.toml");
        std::fs::write(&file, &text).unwrap();
        let output = palisade(&["config", "check", file.to_str().unwrap()], &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{text}: {stderr}");
        assert!(stderr.contains(&format!("{key}: unknown key; did you mean `{near}`?")), "{text}: {stderr}");
        assert!(!stderr.contains("untagged"), "{stderr}");
    }
    let file = dir.0.join("good.toml");
    let text = format!(
        "store = \"postgres://palisade:pg-canary-password@db.internal/palisade\"\n[auth]\ndev_issuer = true\n{upstream}"
    );
    std::fs::write(&file, text).unwrap();
    let output = palisade(&["config", "check", file.to_str().unwrap()], &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("app:                gateway"), "{stdout}");
    assert!(stdout.contains("upstream:           fx: Streamable HTTP http://127.0.0.1:9/mcp"), "{stdout}");
    assert!(stdout.contains("postgres://palisade:redacted@db.internal/palisade"), "{stdout}");
    assert!(!stdout.contains("pg-canary-password") && !stdout.contains("Settings {"), "{stdout}");
}

/// `dev token` takes `serve`'s own flags (`--listen`, `--public-url`, `--data-dir`), so a token
/// minted with the flags a server was started with is for that server; one minted for another
/// address is refused by it (its audience is another resource).
#[tokio::test]
async fn dev_token_takes_the_flags_serve_was_started_with() {
    let server = Palisade::start_app("demo", &[]);
    let mint = |listen: &str| {
        let args = [
            "dev",
            "token",
            "--subject",
            "alice",
            "--tenant",
            "acme",
            "--client",
            "it",
            "--scope",
            "shop:read",
            "--listen",
            listen,
            "--data-dir",
            server.data_dir.path(),
        ];
        let output = palisade(&args, &[]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    };
    let same = send(product_call(&server, Some(&mint("127.0.0.1:0")))).await;
    assert_eq!(same.status, 200, "{:?}", same.response());
    let other = send(product_call(&server, Some(&mint("127.0.0.1:9000")))).await;
    assert_eq!(other.status, 401, "a token for another server's address is refused");
}

/// `dev token --config FILE` resolves the settings `serve --config FILE` runs with: with a
/// listen address in the file (not the default), its token is for that server (issuer and
/// audience from the file), while one minted without the file is refused.
#[tokio::test]
async fn dev_token_reads_the_config_file_serve_runs_with() {
    let data_dir = TempDir::new();
    // A free port for the file (the server binds it itself).
    let port = free_port();
    let file = data_dir.0.join("palisade.toml");
    let data = data_dir.path().to_owned();
    std::fs::write(&file, format!("listen = \"127.0.0.1:{port}\"\ndata_dir = \"{data}\"\n")).unwrap();
    let file = file.to_str().unwrap().to_owned();
    let server = Palisade::spawn(&["serve", "--config", &file], &[], data_dir);
    assert_eq!(server.port, port);
    let mint = |extra: &[&str]| {
        let mut args = vec!["dev", "token", "--subject", "alice", "--tenant", "acme", "--client", "it"];
        args.extend(["--scope", "shop:read"]);
        args.extend(extra);
        let output = palisade(&args, &[]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    };
    let token = mint(&["--config", &file]);
    let accepted = send(product_call(&server, Some(&token))).await;
    assert_eq!(accepted.status, 200, "{:?}", accepted.response());
    // The same key, but the default address's audience and issuer: another server's token.
    let refused = send(product_call(&server, Some(&mint(&["--data-dir", &data])))).await;
    assert_eq!(refused.status, 401, "a token for the default address is refused");
    // A flag still overrides the file, exactly as it would for `serve`.
    let moved = send(product_call(&server, Some(&mint(&["--config", &file, "--listen", "127.0.0.1:1"])))).await;
    assert_eq!(moved.status, 401);
    // A bad flag value is a configuration error naming the flag (exit 2), as for `serve`.
    let bad =
        palisade(&["dev", "token", "--subject", "a", "--tenant", "t", "--client", "c", "--max-body-bytes", "big"], &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--max-body-bytes"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// `dev token` never creates a signing key: run where no server created one (another working
/// directory, a data directory no server ran in), it refuses, names the data directory it looked
/// in and the flags that point it at the server's, and leaves nothing behind. (A new key would
/// sign a token every server refuses with 401.)
#[tokio::test]
async fn dev_token_refuses_to_mint_with_a_key_no_server_holds() {
    let elsewhere = TempDir::new();
    let mint = |extra: &[&str]| {
        let mut args = vec!["dev", "token", "--subject", "alice", "--tenant", "acme", "--client", "it"];
        args.extend(extra);
        Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(&args)
            .current_dir(elsewhere.path())
            .env_remove("PALISADE_DATA_DIR")
            .output()
            .expect("run palisade")
    };
    let refused = mint(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && refused.stdout.is_empty(), "{stderr}");
    let expected = elsewhere.0.join("palisade-data");
    assert!(stderr.contains(&expected.display().to_string()), "names the data directory: {stderr}");
    assert!(stderr.contains("--config") && stderr.contains("--data-dir"), "{stderr}");
    assert!(!expected.exists(), "dev token created the data directory");

    // A data directory no server ran in: refused, and still empty.
    let empty = TempDir::new();
    let refused = mint(&["--data-dir", empty.path()]);
    assert!(!refused.status.success(), "{}", String::from_utf8_lossy(&refused.stderr));
    assert!(String::from_utf8_lossy(&refused.stderr).contains(empty.path()));
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0, "dev token wrote into the data directory");

    // Once the server created its key there, the same command mints a token it accepts.
    let dir = empty.path().to_owned();
    let server =
        Palisade::spawn(&["serve", "--app", "demo", "--listen", "127.0.0.1:0", "--data-dir", &dir], &[], empty);
    let minted = mint(&["--data-dir", server.data_dir.path(), "--listen", "127.0.0.1:0", "--scope", "shop:read"]);
    assert!(minted.status.success(), "{}", String::from_utf8_lossy(&minted.stderr));
    let token = String::from_utf8(minted.stdout).unwrap().trim().to_owned();
    let accepted = send(product_call(&server, Some(&token))).await;
    assert_eq!(accepted.status, 200, "{:?}", accepted.response());
}

/// `metrics_listen` is a second HTTP listener: with `--stdio` it is a configuration error
/// naming the key, before anything is opened.
#[test]
fn metrics_listen_is_refused_with_stdio() {
    let dir = TempDir::new();
    let args = ["serve", "--stdio", "--data-dir", dir.path(), "--metrics-listen", "127.0.0.1:0"];
    let output = palisade(&args, &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("metrics_listen"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!dir.0.join("palisade.db").exists(), "nothing was created");
}
