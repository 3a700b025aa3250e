//! Delegation through the real binary (`[delegation] enabled`): the demo's user delegates one
//! tool to a helper agent, the helper calls with its own token and the capability, a wider call
//! and a wider child are refused, `authority disable --target agent:<subject>` stops the helper
//! before dispatch (the user keeps working), and `palisade delegation list|revoke` see and end it.

use std::process::Command;

use serde_json::{Value, json};

use crate::harness::{Exchange, Palisade, dev_token, send, tool_call, with_meta};

fn palisade(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).envs(envs.iter().copied()).output().expect("run palisade")
}

/// `tools/call` of `tool` with `capability` in `_meta`.
async fn call_under(server: &Palisade, token: &str, capability: &str, tool: &str, arguments: Value) -> Exchange {
    let mut params = with_meta(json!({ "name": tool, "arguments": arguments }), json!({}));
    params["_meta"]["dev.palisade/capability"] = json!(capability);
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
    send(tool_call(server, token, tool, json!({})).body(body.to_string())).await
}

#[tokio::test]
async fn a_helper_acts_within_its_capability_and_can_be_stopped() {
    let server = Palisade::start_app_env("demo", &[], &[("PALISADE_DELEGATION_ENABLED", "true")]);
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let alice = dev_token(&server, "alice", "acme", "cli", "shop:read shop:basket");
    let helper = dev_token(&server, "helper-h", "acme", "helper-app", "shop:read shop:basket");
    let minted = send(tool_call(
        &server,
        &alice,
        "palisade_delegate",
        json!({ "agent": "helper-h", "agentClient": "helper-app", "tools": ["product_get"],
                "scopes": ["shop:read"], "expiresInSeconds": 600, "calls": 5 }),
    ))
    .await;
    let capability = minted.result()["structuredContent"]["capability"].as_str().unwrap().to_owned();
    let id = minted.result()["structuredContent"]["id"].as_str().unwrap().to_owned();

    let allowed = call_under(&server, &helper, &capability, "product_get", json!({ "sku": "TEA-001" })).await;
    assert_eq!(allowed.status, 200, "{:?}", allowed.response());
    assert!(allowed.result().get("isError").is_none_or(|e| e == false), "{:?}", allowed.response());
    let outside = call_under(&server, &helper, &capability, "basket_create", json!({})).await;
    assert_eq!((outside.status, outside.error_code()), (200, -32031), "{:?}", outside.response());
    let wider = call_under(
        &server,
        &helper,
        &capability,
        "palisade_delegate",
        json!({ "agent": "helper-g", "agentClient": "g-app", "tools": ["basket_create"],
                "expiresInSeconds": 60, "calls": 1 }),
    )
    .await;
    assert_eq!(wider.result()["isError"], true, "{:?}", wider.response());
    assert_eq!(wider.result()["content"][0]["text"], "a tool is outside the parent capability");

    // The operator stops the helper everywhere, before dispatch; the user is unaffected.
    let disabled = palisade(&["authority", "disable", "--target", "agent:helper-h", "--reason", "runaway"], &env);
    assert!(disabled.status.success(), "{}", String::from_utf8_lossy(&disabled.stderr));
    let stopped = call_under(&server, &helper, &capability, "product_get", json!({ "sku": "TEA-001" })).await;
    assert_eq!((stopped.status, stopped.error_code()), (200, -32030), "{:?}", stopped.response());
    let user = send(tool_call(&server, &alice, "product_get", json!({ "sku": "TEA-001" }))).await;
    assert_eq!(user.status, 200, "{:?}", user.response());
    let enabled = palisade(&["authority", "enable", "--target", "agent:helper-h", "--reason", "fixed"], &env);
    assert!(enabled.status.success());
    let again = call_under(&server, &helper, &capability, "product_get", json!({ "sku": "TEA-001" })).await;
    assert_eq!(again.status, 200, "{:?}", again.response());

    // The operator sees the capability (by id, never the reference) and revokes it.
    let listed = palisade(&["delegation", "list"], &env);
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(listed.contains(&id) && listed.contains("agent=helper-h") && listed.contains("calls=3/5"), "{listed}");
    assert!(!listed.contains(&capability), "{listed}");
    let revoked = palisade(&["delegation", "revoke", "--id", &id, "--reason", "done"], &env);
    assert!(revoked.status.success(), "{}", String::from_utf8_lossy(&revoked.stderr));
    let after = call_under(&server, &helper, &capability, "product_get", json!({ "sku": "TEA-001" })).await;
    assert_eq!((after.status, after.error_code()), (200, -32031), "{:?}", after.response());
    let twice = palisade(&["delegation", "revoke", "--id", &id, "--reason", "done"], &env);
    assert_eq!(twice.status.code(), Some(1));
    let bad = palisade(&["delegation", "revoke", "--id", "nothex", "--reason", "x"], &env);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--id"));
}
