//! Operator policies (Cedar, `[policies]`) through the real binary: permit, `forbid` wins, the
//! default deny once policies are on, an argument rule and a delegated principal, on both wires,
//! with the deciding policy ids on the audit record; `palisade policy check` refusing a policy
//! that names a tool or attribute the registry does not have (with file and line), and
//! `palisade policy test` failing on a mismatch.

use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::harness::{
    Exchange, Palisade, TempDir, dev_token, dev_token_with_groups, initialize, legacy_post, send, tool_call, with_meta,
};

/// The policies of the demo shop these tests run under.
const SHOP_POLICIES: &str = r#"// Shoppers may search the catalogue, but not for anything secret.
@id("shoppers-search")
permit (
    principal in Palisade::Group::"shoppers",
    action == Palisade::Action::"tools/call",
    resource == Palisade::Tool::"catalog_search"
) when {
    !(context.arguments has query && context.arguments.query like "*secret*")
};

// Anyone may read the returns policy and look up a product.
@id("public-reads")
permit (
    principal,
    action in [Palisade::Action::"resources/read", Palisade::Action::"tools/call"],
    resource
) when {
    resource is Palisade::Resource || (resource is Palisade::Tool && resource.name == "product_get")
};

// Shoppers may use their baskets.
@id("shoppers-baskets")
permit (principal in Palisade::Group::"shoppers", action == Palisade::Action::"tools/call", resource)
when { resource is Palisade::Tool && resource.name like "basket_*" };

// A blocked account: forbid wins over every permit.
@id("blocked")
forbid (principal, action, resource) when { principal.subject == "mallory" };

// Delegated agents act read-only, whatever their principal may do.
@id("agents-read-only")
forbid (principal, action == Palisade::Action::"tools/call", resource)
when { principal.delegated && !resource.readOnly };

// The delegation tools themselves.
@id("delegation-tools")
permit (principal in Palisade::Group::"shoppers", action == Palisade::Action::"tools/call", resource)
when { resource.name like "palisade_*" };
"#;

fn palisade(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).envs(envs.iter().copied()).output().expect("run palisade")
}

/// A configuration file in `dir` with `[policies]` naming `policies` (written beside it).
fn configure(dir: &TempDir, policies: &str, extra: &str) -> String {
    let policy_file = format!("{}/shop.cedar", dir.path());
    std::fs::write(&policy_file, policies).unwrap();
    let config = format!("{}/palisade.toml", dir.path());
    let text = format!("{extra}\n[policies]\nfiles = [{policy_file:?}]\ngroup_claims = [\"groups\"]\n");
    std::fs::write(&config, text).unwrap();
    config
}

fn start(config: &str, envs: &[(&str, &str)]) -> Palisade {
    Palisade::start_app_env("demo", &["--config", config], envs)
}

/// The reason of a `PolicyDenied` refusal, asserting it is one (-32033 in HTTP 200) and that it
/// carries no policy text or id.
fn denied_reason(exchange: &Exchange) -> String {
    assert_eq!((exchange.status, exchange.error_code()), (200, -32033), "{:?}", exchange.response());
    let error = &exchange.response()["error"];
    assert_eq!(error["message"], "refused by operator policy");
    let text = error.to_string();
    assert!(
        !["shoppers", "blocked", "public-reads", "principal", "Palisade::"].iter().any(|t| text.contains(t)),
        "{text}"
    );
    error["data"]["reason"].as_str().unwrap().to_owned()
}

fn allowed(exchange: &Exchange) -> bool {
    exchange.status == 200 && exchange.response().get("result").is_some()
}

/// The audit records the policy stage decided (`stage = policy`) and the allows, as JSON.
fn audit_records(server: &Palisade) -> Vec<Value> {
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let output = palisade(&["audit", "show", "--format", "json", "--limit", "1000"], &env);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

#[tokio::test]
async fn policies_permit_forbid_and_deny_by_default_on_both_wires() {
    let dir = TempDir::new();
    let config = configure(&dir, SHOP_POLICIES, "");
    let server = start(&config, &[]);
    let scopes = "shop:read shop:basket";
    let alice = dev_token_with_groups(&server, "alice", "acme", "cli", scopes, &["shoppers"]);
    let bob = dev_token(&server, "bob", "acme", "cli", scopes);
    let mallory = dev_token_with_groups(&server, "mallory", "acme", "cli", scopes, &["shoppers"]);
    let search =
        |token: &str, query: &str| send(tool_call(&server, token, "catalog_search", json!({ "query": query })));

    // Permit: a shopper searches.
    assert!(allowed(&search(&alice, "tea").await));
    // Default deny: bob is in no group, and no policy permits his search.
    assert_eq!(denied_reason(&search(&bob, "tea").await), "no policy permits this request");
    // Forbid wins: mallory is a shopper, and blocked.
    assert_eq!(denied_reason(&search(&mallory, "tea").await), "a policy forbids this request");
    // The argument rule: the same shopper, a query the permit does not cover.
    assert_eq!(denied_reason(&search(&alice, "top secret blend").await), "no policy permits this request");
    // A permit for everyone still loses to the forbid, and covers only what it names.
    let product = |token: &str| send(tool_call(&server, token, "product_get", json!({ "sku": "TEA-001" })));
    assert!(allowed(&product(&bob).await));
    assert_eq!(denied_reason(&product(&mallory).await), "a policy forbids this request");
    let basket = |token: &str| send(tool_call(&server, token, "basket_create", json!({})));
    assert!(allowed(&basket(&alice).await));
    assert_eq!(denied_reason(&basket(&bob).await), "no policy permits this request");

    // The 2025 session wire: the same decisions for the same callers.
    let call = |name: &str, arguments: Value| json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": name, "arguments": arguments } });
    for (token, query, expected) in [
        (&alice, "tea", None),
        (&bob, "tea", Some("no policy permits this request")),
        (&mallory, "tea", Some("a policy forbids this request")),
        (&alice, "secret", Some("no policy permits this request")),
    ] {
        let session = initialize(&server, token).await;
        let exchange =
            send(legacy_post(&server, token, Some(&session), call("catalog_search", json!({ "query": query })))).await;
        match expected {
            None => assert!(allowed(&exchange), "{:?}", exchange.response()),
            Some(reason) => assert_eq!(denied_reason(&exchange), reason),
        }
    }
    let session = initialize(&server, &bob).await;
    let read = json!({ "jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": { "uri": "shop://policies/returns" } });
    assert!(allowed(&send(legacy_post(&server, &bob, Some(&session), read)).await));

    // Every decision's record names the policy set and the policies that made it; the refusal
    // is the policy stage's.
    let records = audit_records(&server);
    let policy_denies: Vec<&Value> = records.iter().filter(|r| r["stage"] == "policy").collect();
    assert!(policy_denies.iter().all(|r| r["decision"] == "deny" && r["code"] == -32033), "{policy_denies:?}");
    let details: Vec<&str> = policy_denies.iter().filter_map(|r| r["detail"].as_str()).collect();
    assert!(details.iter().any(|d| d.contains("by=blocked")), "{details:?}");
    assert!(details.iter().any(|d| d.contains("by=none")), "{details:?}");
    let allows: Vec<&str> =
        records.iter().filter(|r| r["decision"] == "allow").filter_map(|r| r["detail"].as_str()).collect();
    assert!(allows.iter().any(|d| d.contains("by=shoppers-search")), "{allows:?}");
    assert!(allows.iter().any(|d| d.contains("by=public-reads")), "{allows:?}");

    // `policy explain` answers why, from the records of one trace: mallory's refusal was the
    // blocking forbid's, and it shows that policy's text to the operator.
    let blocked =
        policy_denies.iter().find(|r| r["detail"].as_str().unwrap_or_default().contains("by=blocked")).unwrap();
    let trace = blocked["trace_id"].as_str().or_else(|| blocked["traceId"].as_str()).expect("a trace id");
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let explained = palisade(&["policy", "explain", "--config", &config, "--app", "demo", "--trace", trace], &env);
    let stdout = String::from_utf8_lossy(&explained.stdout);
    assert!(explained.status.success(), "{stdout}{}", String::from_utf8_lossy(&explained.stderr));
    assert!(stdout.contains("deny at stage policy code -32033"), "{stdout}");
    assert!(stdout.contains("decided by blocked:") && stdout.contains("principal.subject == \"mallory\""), "{stdout}");
    let default_deny =
        policy_denies.iter().find(|r| r["detail"].as_str().unwrap_or_default().contains("by=none")).unwrap();
    let trace = default_deny["trace_id"].as_str().or_else(|| default_deny["traceId"].as_str()).unwrap();
    let explained = palisade(&["policy", "explain", "--config", &config, "--app", "demo", "--trace", trace], &env);
    assert!(String::from_utf8_lossy(&explained.stdout).contains("no policy permitted it"));
}

#[tokio::test]
async fn a_delegated_agent_is_decided_as_its_principal_and_its_chain() {
    let dir = TempDir::new();
    let config = configure(&dir, SHOP_POLICIES, "");
    let server = start(&config, &[("PALISADE_DELEGATION_ENABLED", "true")]);
    let scopes = "shop:read shop:basket";
    let alice = dev_token_with_groups(&server, "alice", "acme", "cli", scopes, &["shoppers"]);
    let helper = dev_token(&server, "helper-h", "acme", "helper-app", scopes);
    let minted = send(tool_call(
        &server,
        &alice,
        "palisade_delegate",
        json!({ "agent": "helper-h", "agentClient": "helper-app", "tools": ["catalog_search", "basket_create"],
                "scopes": ["shop:read", "shop:basket"], "expiresInSeconds": 600, "calls": 5 }),
    ))
    .await;
    assert!(allowed(&minted), "{:?}", minted.response());
    let capability = minted.result()["structuredContent"]["capability"].as_str().unwrap().to_owned();
    let under = |tool: &str, arguments: Value| {
        let mut params = with_meta(json!({ "name": tool, "arguments": arguments }), json!({}));
        params["_meta"]["dev.palisade/capability"] = json!(capability);
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
        send(tool_call(&server, &helper, tool, json!({})).body(body.to_string()))
    };
    // The helper acts as alice (a shopper): her permit covers its read-only search...
    assert!(allowed(&under("catalog_search", json!({ "query": "tea" })).await));
    // ...but not a side effect: the agents' forbid sees the delegated principal.
    assert_eq!(denied_reason(&under("basket_create", json!({})).await), "a policy forbids this request");
    // Alice herself may.
    assert!(allowed(&send(tool_call(&server, &alice, "basket_create", json!({}))).await));
    // The helper without the capability is itself, in no group: default deny.
    let own = send(tool_call(&server, &helper, "catalog_search", json!({ "query": "tea" }))).await;
    assert_eq!(denied_reason(&own), "no policy permits this request");
}

#[test]
fn policy_check_names_unknown_tools_and_attributes_with_file_and_line() {
    let dir = TempDir::new();
    let config = configure(&dir, SHOP_POLICIES, "");
    let data = TempDir::new();
    let env = [("PALISADE_DATA_DIR", data.path())];
    let good = palisade(&["policy", "check", "--config", &config, "--app", "demo"], &env);
    assert!(good.status.success(), "{}", String::from_utf8_lossy(&good.stderr));
    assert!(String::from_utf8_lossy(&good.stdout).contains("6 policies"), "{}", String::from_utf8_lossy(&good.stdout));

    let bad = format!("{}/bad.cedar", dir.path());
    std::fs::write(
        &bad,
        "permit (principal, action, resource == Palisade::Tool::\"basket_create\");\n\
         permit (principal, action == Palisade::Action::\"tools/call\",\n    resource == Palisade::Tool::\"nope\");\n\
         permit (principal, action == Palisade::Action::\"tools/call\", resource)\n    when { resource.colour == \"red\" };\n",
    )
    .unwrap();
    let refused = palisade(&["policy", "check", "--app", "demo", "--file", &bad], &env);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{bad}:3: unknown tool \"nope\"")), "{stderr}");
    assert!(stderr.lines().any(|l| l.starts_with(&format!("{bad}:5:")) && l.contains("colour")), "{stderr}");
    // And `serve` refuses to start with it.
    let bad_dir = TempDir::new();
    let config = configure(&bad_dir, &std::fs::read_to_string(&bad).unwrap(), "");
    let serve = palisade(&["serve", "--app", "demo", "--listen", "127.0.0.1:0", "--config", &config], &env);
    assert!(!serve.status.success());
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert!(stderr.contains("unknown tool \"nope\""), "{stderr}");
}

#[test]
fn policy_test_exits_non_zero_on_a_mismatch() {
    let dir = TempDir::new();
    let config = configure(&dir, SHOP_POLICIES, "");
    let data = TempDir::new();
    let env = [("PALISADE_DATA_DIR", data.path())];
    let cases = |expect_bob: &str| {
        format!(
            r#"[[case]]
name = "a shopper searches"
principal = {{ subject = "alice", groups = ["shoppers"] }}
action = "tools/call"
resource = "catalog_search"
arguments = {{ query = "tea" }}
expect = "allow"
policies = ["shoppers-search"]

[[case]]
name = "mallory is blocked"
principal = {{ subject = "mallory", groups = ["shoppers"] }}
action = "tools/call"
resource = "catalog_search"
expect = "deny"
policies = ["blocked"]

[[case]]
name = "bob may not search"
principal = {{ subject = "bob" }}
action = "tools/call"
resource = "catalog_search"
expect = "{expect_bob}"
"#
        )
    };
    let file = format!("{}/cases.toml", dir.path());
    std::fs::write(&file, cases("deny")).unwrap();
    let passed = palisade(&["policy", "test", "--config", &config, "--app", "demo", &file], &env);
    let stdout = String::from_utf8_lossy(&passed.stdout);
    assert!(passed.status.success(), "{stdout}{}", String::from_utf8_lossy(&passed.stderr));
    assert!(stdout.contains("3 case(s), 3 passed, 0 failed"), "{stdout}");

    std::fs::write(&file, cases("allow")).unwrap();
    let failed = palisade(&["policy", "test", "--config", &config, "--app", "demo", &file], &env);
    let stdout = String::from_utf8_lossy(&failed.stdout);
    assert_eq!(failed.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("MISMATCH bob may not search: expected allow, got deny"), "{stdout}");
}

/// README's three policy examples (`examples/policies/`), each run by `palisade policy test`
/// against the snapshot of the real filesystem server's tool list, as an operator's CI would;
/// every Cedar block of README is taken verbatim from one of them.
#[test]
fn the_readme_policy_examples_pass_their_tests() {
    let examples = format!("{}/../../examples/policies", env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(format!("{}/../../README.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let files: Vec<String> = ["contractors", "tenant-paths", "oncall"]
        .iter()
        .map(|name| std::fs::read_to_string(format!("{examples}/{name}.cedar")).unwrap())
        .collect();
    let blocks: Vec<&str> =
        readme.split("```cedar\n").skip(1).map(|rest| rest.split("```").next().unwrap_or_default()).collect();
    assert_eq!(blocks.len(), 3, "README's Cedar blocks");
    for block in blocks {
        for policy in block.split("\n\n") {
            assert!(files.iter().any(|file| file.contains(policy.trim())), "not in examples/policies/: {policy}");
        }
    }
    let data = TempDir::new();
    let env = [("PALISADE_DATA_DIR", data.path())];
    for example in ["contractors", "tenant-paths", "oncall"] {
        let (policies, cases) = (format!("{examples}/{example}.cedar"), format!("{examples}/{example}.cases.toml"));
        let registry = format!("{examples}/registry.json");
        let args = ["policy", "test", "--registry", &registry, "--file", &policies, &cases];
        let output = palisade(&args, &env);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{example}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        assert!(stdout.contains(" 0 failed") && !stdout.contains("MISMATCH"), "{example}: {stdout}");
    }
}

/// The tools `tools/list` shows `token` on the 2026-07-28 wire and, in a session, on the 2025 one.
async fn listed_tools(server: &Palisade, token: &str) -> (Vec<String>, Vec<String>) {
    let names = |exchange: &Exchange| -> Vec<String> {
        let tools = exchange.result()["tools"].as_array().unwrap_or_else(|| panic!("{:?}", exchange.response()));
        let mut names: Vec<String> = tools.iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect();
        names.sort();
        names
    };
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": with_meta(json!({}), json!({})) });
    let request = reqwest::Client::new()
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list")
        .header("authorization", format!("Bearer {token}"))
        .body(body.to_string());
    let stateless = names(&send(request).await);
    let session = initialize(server, token).await;
    let list = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {} });
    let legacy = names(&send(legacy_post(server, token, Some(&session), list)).await);
    (stateless, legacy)
}

#[tokio::test]
async fn lists_show_each_caller_what_its_policies_let_it_use_on_both_wires() {
    let dir = TempDir::new();
    let config = configure(&dir, SHOP_POLICIES, "");
    let server = start(&config, &[]);
    let scopes = "shop:read shop:basket";
    let alice = dev_token_with_groups(&server, "alice", "acme", "cli", scopes, &["shoppers"]);
    let bob = dev_token(&server, "bob", "acme", "cli", scopes);
    let mallory = dev_token_with_groups(&server, "mallory", "acme", "cli", scopes, &["shoppers"]);
    // A shopper: the search (its permit reads the arguments, so it is listed and decided at
    // call time), the baskets and the public product lookup; never the export.
    let shopper =
        ["basket_add_item", "basket_checkout", "basket_create", "basket_view", "catalog_search", "product_get"];
    let (stateless, legacy) = listed_tools(&server, &alice).await;
    assert_eq!(stateless, shopper);
    assert_eq!(legacy, shopper);
    // Anyone else: the public lookup only.
    assert_eq!(listed_tools(&server, &bob).await, (vec!["product_get".to_owned()], vec!["product_get".to_owned()]));
    // The blocked account: nothing.
    assert_eq!(listed_tools(&server, &mallory).await, (Vec::new(), Vec::new()));
    // What bob does not see, he cannot call.
    for tool in ["orders_export", "basket_create"] {
        let refused = send(tool_call(&server, &bob, tool, json!({}))).await;
        assert_eq!(denied_reason(&refused), "no policy permits this request");
    }
}
