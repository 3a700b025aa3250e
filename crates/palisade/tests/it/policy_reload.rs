//! Operator policies that change while the server runs, through the real binary: an edit of a
//! policy file reloads (`palisade reload`) as one snapshot with the registry, and each open listen
//! stream hears of a list change only when what *its* caller may see changed; an edit naming a
//! tool the registry lacks changes nothing and says why; `require_signed` refuses a file whose
//! signature by the kill switch's policy root key is missing or stale; `context.source` is the
//! caller's address; completions are refused for a prompt the caller may not use.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Client, Palisade, Stream, TempDir, dev_token, dev_token_with_groups, send, tool_call, with_meta};

/// Everyone may open a listen stream and read; shoppers may call every tool; anyone may look
/// up a product.
const BASE: &str = r#"
@id("listen")
permit (principal, action == Palisade::Action::"subscriptions/listen", resource);

@id("shoppers")
permit (principal in Palisade::Group::"shoppers", action, resource);

@id("products")
permit (principal, action == Palisade::Action::"tools/call", resource == Palisade::Tool::"product_get");
"#;

/// [`BASE`] plus bob's search.
const WITH_BOB_SEARCH: &str = r#"
@id("bob-search")
permit (principal, action == Palisade::Action::"tools/call", resource == Palisade::Tool::"catalog_search")
when { principal.subject == "bob" };
"#;

fn palisade(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .expect("run palisade");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// `palisade reload` of `server`'s configuration: (exit code, stdout + stderr).
fn reload(server: &Palisade, config: &str) -> (i32, String) {
    let (code, stdout, stderr) = palisade(&["reload", "--config", config, "--data-dir", server.data_dir.path()], &[]);
    (code, format!("{stdout}{stderr}"))
}

/// A demo configuration in `dir` whose `[policies]` is `policy_file` (and `extra` keys).
fn configure(dir: &TempDir, policy_file: &str, extra: &str) -> String {
    let config = format!("{}/palisade.toml", dir.path());
    let text =
        format!("watch_config = false\n[policies]\nfiles = [{policy_file:?}]\ngroup_claims = [\"groups\"]\n{extra}");
    std::fs::write(&config, text).unwrap();
    config
}

async fn listen(server: &Palisade, token: &str, id: &str) -> Stream {
    let client = Client::new(server);
    let params = with_meta(json!({ "notifications": { "toolsListChanged": true } }), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": params });
    let builder = client.post("subscriptions/listen", &params).bearer_auth(token).body(body.to_string());
    let mut stream = Stream::open(builder).await;
    let ack = stream.next(Duration::from_secs(5)).await.expect("the acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    stream
}

/// The names `tools/list` shows `token`.
async fn tool_names(server: &Palisade, token: &str) -> Vec<String> {
    let client = Client::new(server);
    let params = with_meta(json!({}), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params });
    let exchange = send(client.post("tools/list", &params).bearer_auth(token).body(body.to_string())).await;
    let tools = exchange.result()["tools"].as_array().expect("tools").clone();
    tools.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect()
}

fn refused_by_policy(exchange: &crate::harness::Exchange) -> bool {
    exchange.status == 200 && exchange.error_code() == -32033
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_edit_reloads_and_each_listener_hears_only_of_a_change_in_its_own_view() {
    let dir = TempDir::new();
    let policy_file = format!("{}/shop.cedar", dir.path());
    std::fs::write(&policy_file, BASE).unwrap();
    let config = configure(&dir, &policy_file, "");
    let server = Palisade::start_app_env("demo", &["--config", &config], &[]);
    let scopes = "shop:read shop:basket";
    let alice = dev_token_with_groups(&server, "alice", "acme", "cli", scopes, &["shoppers"]);
    let bob = dev_token(&server, "bob", "acme", "cli", scopes);
    let search = |token: &str| send(tool_call(&server, token, "catalog_search", json!({ "query": "tea" })));
    assert!(refused_by_policy(&search(&bob).await));
    let bob_before = tool_names(&server, &bob).await;
    assert!(!bob_before.contains(&"catalog_search".to_owned()), "{bob_before:?}");
    assert!(tool_names(&server, &alice).await.contains(&"catalog_search".to_owned()));

    let mut alice_stream = listen(&server, &alice, "alice-listen").await;
    let mut bob_stream = listen(&server, &bob, "bob-listen").await;

    // An edit that names a tool the registry does not have: nothing changes, and the reload
    // says which file and line.
    std::fs::write(
        &policy_file,
        format!("{BASE}\n@id(\"typo\")\npermit (principal, action, resource == Palisade::Tool::\"catalog_serach\");\n"),
    )
    .unwrap();
    let (code, said) = reload(&server, &config);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("not reloaded, nothing changed") && said.contains("shop.cedar:"), "{said}");
    assert!(said.contains("catalog_serach"), "{said}");
    assert!(refused_by_policy(&search(&bob).await));
    assert!(bob_stream.next(Duration::from_millis(500)).await.is_none(), "a refused reload announces nothing");

    // The edit that lets bob search: in force for the next request, and announced to bob
    // (whose list changed) but not to alice (who saw every tool before and after).
    std::fs::write(&policy_file, format!("{BASE}{WITH_BOB_SEARCH}")).unwrap();
    let (code, said) = reload(&server, &config);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("policies ") && said.contains("(4)"), "{said}");
    let change = bob_stream.next(Duration::from_secs(5)).await.expect("bob hears of his list's change");
    assert_eq!(change["method"], "notifications/tools/list_changed", "{change}");
    assert!(alice_stream.next(Duration::from_secs(1)).await.is_none(), "alice's view did not change");
    let exchange = search(&bob).await;
    assert!(exchange.response().get("result").is_some(), "{:?}", exchange.response());
    assert!(tool_names(&server, &bob).await.contains(&"catalog_search".to_owned()));

    // Taking it away again: bob hears of it, and is refused at once.
    std::fs::write(&policy_file, BASE).unwrap();
    assert_eq!(reload(&server, &config).0, 0);
    let change = bob_stream.next(Duration::from_secs(5)).await.expect("bob hears of it again");
    assert_eq!(change["method"], "notifications/tools/list_changed");
    assert!(refused_by_policy(&search(&bob).await));
    assert!(alice_stream.next(Duration::from_millis(500)).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_signed_only_files_signed_by_the_policy_root_key_load_or_reload() {
    let dir = TempDir::new();
    let policy_file = format!("{}/shop.cedar", dir.path());
    std::fs::write(&policy_file, BASE).unwrap();
    // A first start (unsigned) makes the development kill switch's policy root key.
    let first = Palisade::start_app_env("demo", &["--config", &configure(&dir, &policy_file, "")], &[]);
    let data = first.kill_keeping_data();
    let root_key = format!("{}/killswitch-dev/policy-root.key", data.path());
    let config = configure(&dir, &policy_file, "require_signed = true\n");
    let env = [("PALISADE_DATA_DIR", data.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let check = |envs: &[(&str, &str)]| palisade(&["policy", "check", "--config", &config, "--app", "demo"], envs);

    // Unsigned: refused, naming the missing signature.
    let (code, _, stderr) = check(&env);
    assert_ne!(code, 0);
    assert!(stderr.contains("shop.cedar") && stderr.contains("no signature"), "{stderr}");
    // Signed by another key: refused.
    let other = TempDir::new();
    let (code, _, stderr) = palisade(&["keys", "gen", "--dir", other.path(), "--name", "other"], &[]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) =
        palisade(&["policy", "sign-files", "--root-key", &format!("{}/other.key", other.path()), &policy_file], &[]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = check(&env);
    assert!(code != 0 && stderr.contains("is not the policy root key's signature"), "{stderr}");
    // Signed by the root key: valid, and the server starts on it.
    let (code, _, stderr) = palisade(&["policy", "sign-files", "--root-key", &root_key, &policy_file], &[]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = check(&env);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let dir_arg = data.path().to_owned();
    let server = Palisade::spawn(
        &["serve", "--app", "demo", "--listen", "127.0.0.1:0", "--data-dir", &dir_arg, "--config", &config],
        &[],
        data,
    );
    let bob = dev_token(&server, "bob", "acme", "cli", "shop:read");
    let search = || send(tool_call(&server, &bob, "catalog_search", json!({ "query": "tea" })));
    assert!(refused_by_policy(&search().await));

    // A widening edit written without the key: the reload refuses it and nothing changes.
    std::fs::write(&policy_file, format!("{BASE}{WITH_BOB_SEARCH}")).unwrap();
    let (code, said) = reload(&server, &config);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("is not the policy root key's signature"), "{said}");
    assert!(refused_by_policy(&search().await));
    // Signed, it reloads.
    let (code, _, stderr) = palisade(&["policy", "sign-files", "--root-key", &root_key, &policy_file], &[]);
    assert_eq!(code, 0, "{stderr}");
    let (code, said) = reload(&server, &config);
    assert_eq!(code, 0, "{said}");
    assert!(search().await.response().get("result").is_some());
    // Signing cannot be switched off by a reload.
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap().replace("require_signed = true\n", "")).unwrap();
    let (code, said) = reload(&server, &config);
    assert!(code == 1 && said.contains("policies.require_signed"), "{said}");
}

#[tokio::test]
async fn a_policy_sees_the_callers_address_and_completions_follow_the_prompt_decision() {
    let dir = TempDir::new();
    let policy_file = format!("{}/fixture.cedar", dir.path());
    std::fs::write(
        &policy_file,
        r#"
@id("everything")
permit (principal, action, resource);

@id("no-simple-text-from-loopback")
forbid (principal, action == Palisade::Action::"tools/call", resource == Palisade::Tool::"test_simple_text")
when { context has source && context.source.isLoopback() };

@id("no-argument-prompt")
forbid (principal, action == Palisade::Action::"prompts/get", resource == Palisade::Prompt::"test_prompt_with_arguments");
"#,
    )
    .unwrap();
    let config = configure(&dir, &policy_file, "");
    let server = Palisade::start_app_env("conformance", &["--config", &config], &[]);
    let client = Client::new(&server);

    // The call comes from 127.0.0.1: refused, and not listed; another tool is served.
    let refused = client.call(json!(1), "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    assert_eq!(refused.error_code(), -32033, "{:?}", refused.response());
    let listed = client.call(json!(2), "tools/list", json!({})).await;
    let names: Vec<&str> =
        listed.result()["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(!names.contains(&"test_simple_text") && names.contains(&"test_image_content"), "{names:?}");

    // Completions: for the forbidden prompt, the answer of a prompt that does not exist; for
    // another reference, values.
    let complete =
        |reference: Value, argument: &str| json!({ "ref": reference, "argument": { "name": argument, "value": "te" } });
    let hidden = client
        .call(
            json!(3),
            "completion/complete",
            complete(json!({ "type": "ref/prompt", "name": "test_prompt_with_arguments" }), "arg1"),
        )
        .await;
    let unknown = client
        .call(
            json!(4),
            "completion/complete",
            complete(json!({ "type": "ref/prompt", "name": "no_such_prompt" }), "arg1"),
        )
        .await;
    assert_eq!(hidden.error_code(), -32602, "{:?}", hidden.response());
    assert_eq!(hidden.response()["error"]["message"], unknown.response()["error"]["message"]);
    let prompts = client.call(json!(5), "prompts/list", json!({})).await;
    let names: Vec<&str> =
        prompts.result()["prompts"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(!names.contains(&"test_prompt_with_arguments") && names.contains(&"test_simple_prompt"), "{names:?}");
}
