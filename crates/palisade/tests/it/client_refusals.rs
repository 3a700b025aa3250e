//! What real MCP clients show their caller when the server refuses a call: the TypeScript SDK
//! client 2.4.0 and the Python SDK client 2.3.0 (tests/interop/ts_refusal_client.mjs,
//! py_refusal_client.py) call a kill-switched demo tool on both wires, and each must surface the
//! JSON-RPC error (-32030 "operation disabled") rather than an HTTP failure.

use std::process::Command;

use serde_json::Value;

use crate::gateway_stdio_servers::test_tools;
use crate::harness::{Palisade, dev_token};

/// The driver script `name` of tests/interop.
fn driver(name: &str) -> String {
    format!("{}/../../tests/interop/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs a driver and returns the one JSON line it printed per wire.
fn outcomes(mut command: Command, token: &str) -> Vec<Value> {
    let output = command.env("INTEROP_TOKEN", token).output().expect("run the client driver");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the driver failed: {stdout}\n{stderr}");
    stdout.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"))).collect()
}

/// Each wire's outcome is the client's own JSON-RPC error type with the server's code and
/// message: the client read the refusal, it did not fail on the HTTP status.
fn assert_surfaced(client: &str, error_class: &str, lines: &[Value]) {
    let wires: Vec<(&str, &str)> =
        lines.iter().map(|line| (line["wire"].as_str().unwrap(), line["negotiated"].as_str().unwrap_or(""))).collect();
    assert_eq!(wires, [("2026-07-28", "2026-07-28"), ("legacy", "2025-11-25")], "{client}: {lines:?}");
    for line in lines {
        assert_eq!(line["outcome"], "error", "{client}: {line}");
        assert_eq!(
            (line["class"].as_str(), line["code"].as_i64(), line["message"].as_str()),
            (Some(error_class), Some(-32030), Some("operation disabled")),
            "{client}: {line}"
        );
        assert!(line["status"].is_null(), "{client}: no HTTP failure: {line}");
    }
}

#[test]
fn real_clients_show_a_kill_switch_refusal_as_the_json_rpc_error_on_both_wires() {
    let tools = test_tools();
    let server = Palisade::start_app("demo", &[]);
    let token = dev_token(&server, "alice", "acme", "it", "shop:read");
    let env = [("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")];
    let args = ["authority", "disable", "--target", "tool:product_get", "--reason", "clients"];
    let disabled = Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).envs(env).output().unwrap();
    assert!(disabled.status.success(), "{}", String::from_utf8_lossy(&disabled.stderr));
    let arguments = r#"{"sku":"TEA-001"}"#;

    let mut ts = Command::new(tools.join("bin/node"));
    ts.arg(driver("ts_refusal_client.mjs")).args([server.url.as_str(), "product_get", arguments]);
    ts.env("INTEROP_NODE_MODULES", tools.join("npm/node_modules"));
    assert_surfaced("TypeScript", "ProtocolError", &outcomes(ts, &token));

    let mut py = Command::new(tools.join("py/bin/python"));
    py.arg(driver("py_refusal_client.py")).args([server.url.as_str(), "product_get", arguments]);
    assert_surfaced("Python", "MCPError", &outcomes(py, &token));

    // The same clients call another tool normally: the refusal is the tool's, not the session's.
    let mut ts = Command::new(tools.join("bin/node"));
    ts.arg(driver("ts_refusal_client.mjs")).args([server.url.as_str(), "catalog_search", r#"{"query":"tea"}"#]);
    ts.env("INTEROP_NODE_MODULES", tools.join("npm/node_modules"));
    for line in outcomes(ts, &token) {
        assert_eq!((line["outcome"].as_str(), line["isError"].as_bool()), (Some("result"), Some(false)), "{line}");
    }
}
