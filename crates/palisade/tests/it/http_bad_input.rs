//! Every malformed frame, wrong or missing header, oversized body, unknown method, missing
//! `_meta`, bad cursor and invalid params gets its documented status and code over HTTP, and
//! the server keeps serving afterwards.

use serde_json::{Value, json};

use crate::harness::{Client, Palisade, send, with_meta};

/// A raw POST with standard headers that `tweak` may change.
async fn raw(
    client: &Client,
    method: &str,
    body: String,
    tweak: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
) -> crate::harness::Exchange {
    send(tweak(client.post(method, &json!({}))).body(body)).await
}

/// Replaces (rather than adds) a header of a prepared request.
fn set(builder: reqwest::RequestBuilder, name: &'static str, value: &str) -> reqwest::RequestBuilder {
    let mut request = builder.build().unwrap();
    request.headers_mut().insert(name, value.parse().unwrap());
    reqwest::RequestBuilder::from_parts(reqwest::Client::new(), request)
}

fn frame(method: &str, params: Value) -> String {
    json!({ "jsonrpc": "2.0", "id": 9, "method": method, "params": params }).to_string()
}

fn expect(exchange: &crate::harness::Exchange, status: u16, code: i64, case: &str) {
    assert_eq!(exchange.status, status, "{case}: status; body {:?}", exchange.frames);
    assert_eq!(exchange.error_code(), code, "{case}: code");
    crate::schema::check_response("tools/list", exchange.response());
    let message = exchange.response()["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.contains("panick") && !message.contains("src/"), "{case}: internal detail leaked: {message}");
}

#[tokio::test]
async fn malformed_frames() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    let cases: &[(&str, &str, u16, i64)] = &[
        ("not JSON", "{", 400, -32700),
        ("empty body", "", 400, -32700),
        ("batch", r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#, 400, -32600),
        ("scalar", "42", 400, -32600),
        ("null id", r#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#, 400, -32600),
        ("float id", r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#, 400, -32600),
        ("object id", r#"{"jsonrpc":"2.0","id":{},"method":"tools/list"}"#, 400, -32600),
        ("wrong version", r#"{"jsonrpc":"1.0","id":1,"method":"tools/list"}"#, 400, -32600),
        ("no jsonrpc", r#"{"id":1,"method":"tools/list"}"#, 400, -32600),
        ("params array", r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":[]}"#, 400, -32600),
        ("a response", r#"{"jsonrpc":"2.0","id":1,"result":{}}"#, 400, -32600),
        ("extra member", r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","x":1}"#, 400, -32600),
        ("truncated frame", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\u{fffd}\"", 400, -32700),
        // A first-wins parser in front would read another request than the one run.
        ("duplicate method", r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call"}"#, 400, -32600),
        ("duplicate id", r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}"#, 400, -32600),
        (
            "duplicate tool name",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"name":"a","name":"b"}}"#,
            400,
            -32600,
        ),
        (
            "duplicate _meta version",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            400,
            -32600,
        ),
    ];
    for (case, body, status, code) in cases {
        let exchange = raw(&client, "tools/list", (*body).to_owned(), |b| b).await;
        expect(&exchange, *status, *code, case);
    }
    let deep = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
    expect(&raw(&client, "tools/list", deep, |b| b).await, 400, -32700, "deep nesting");
    // Still serving.
    assert_eq!(client.request("tools/list", json!({})).await.status, 200);
}

#[tokio::test]
async fn meta_and_version() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    let no_meta = raw(&client, "tools/list", frame("tools/list", json!({})), |b| b).await;
    expect(&no_meta, 400, -32602, "no _meta");
    let no_caps = frame("tools/list", json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28" } }));
    expect(&raw(&client, "tools/list", no_caps, |b| b).await, 400, -32602, "no clientCapabilities");
    let caps_not_object = frame(
        "tools/list",
        json!({ "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": [] } }),
    );
    expect(&raw(&client, "tools/list", caps_not_object, |b| b).await, 400, -32602, "clientCapabilities not an object");
    let bad_level = frame(
        "tools/list",
        json!({ "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/logLevel": "shout" } }),
    );
    expect(&raw(&client, "tools/list", bad_level, |b| b).await, 400, -32602, "unknown log level");

    let old = json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": "1999-01-01", "io.modelcontextprotocol/clientCapabilities": {} } });
    let unsupported =
        raw(&client, "tools/list", frame("tools/list", old), |b| set(b, "mcp-protocol-version", "1999-01-01")).await;
    expect(&unsupported, 400, -32022, "unsupported version");
    assert_eq!(unsupported.response()["error"]["data"]["requested"], "1999-01-01");
    assert_eq!(unsupported.response()["error"]["data"]["supported"], json!(["2026-07-28"]));
}

#[tokio::test]
async fn headers_must_match_the_body() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    let list = frame("tools/list", with_meta(json!({}), json!({})));
    type Tweak = Box<dyn FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder>;
    let cases: Vec<(&str, Tweak)> = vec![
        (
            "version header missing",
            Box::new(|b| {
                let mut request = b.build().unwrap();
                request.headers_mut().remove("mcp-protocol-version");
                reqwest::RequestBuilder::from_parts(reqwest::Client::new(), request)
            }),
        ),
        ("version header differs", Box::new(|b| set(b, "mcp-protocol-version", "2025-11-25"))),
        ("method header differs", Box::new(|b| set(b, "mcp-method", "prompts/list"))),
        ("method header sent twice", Box::new(|b| b.header("mcp-method", "tools/list"))),
        (
            "method header case differs",
            Box::new(|b| {
                let mut request = b.build().unwrap();
                request.headers_mut().insert("mcp-method", "TOOLS/LIST".parse().unwrap());
                reqwest::RequestBuilder::from_parts(reqwest::Client::new(), request)
            }),
        ),
        (
            "method header missing",
            Box::new(|b| {
                let mut request = b.build().unwrap();
                request.headers_mut().remove("mcp-method");
                reqwest::RequestBuilder::from_parts(reqwest::Client::new(), request)
            }),
        ),
        // The encoded form exists for Mcp-Name and Mcp-Param-* only.
        ("method header base64-encoded", Box::new(|b| set(b, "mcp-method", "=?base64?dG9vbHMvbGlzdA==?="))),
        ("version header base64-encoded", Box::new(|b| set(b, "mcp-protocol-version", "=?base64?MjAyNi0wNy0yOA==?="))),
        (
            "malformed base64 header",
            Box::new(|b| {
                let mut request = b.build().unwrap();
                request.headers_mut().insert("mcp-method", "=?base64?!!!?=".parse().unwrap());
                reqwest::RequestBuilder::from_parts(reqwest::Client::new(), request)
            }),
        ),
    ];
    for (case, tweak) in cases {
        expect(&raw(&client, "tools/list", list.clone(), tweak).await, 400, -32020, case);
    }
    // Mcp-Name is required and compared for tools/call, prompts/get and resources/read.
    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": with_meta(json!({ "name": "test_simple_text" }), json!({})) })
    .to_string();
    let missing_name = send(client.post("tools/call", &json!({})).body(call.clone())).await;
    expect(&missing_name, 400, -32020, "Mcp-Name missing");
    let wrong_name =
        send(client.post("tools/call", &json!({ "name": "test_error_handling" })).body(call.clone())).await;
    expect(&wrong_name, 400, -32020, "Mcp-Name differs");
    let encoded = send(
        client.post("tools/call", &json!({})).header("mcp-name", "=?base64?dGVzdF9zaW1wbGVfdGV4dA==?=").body(call),
    )
    .await;
    assert_eq!(encoded.status, 200, "a base64-encoded Mcp-Name that decodes to the name is accepted");
    // A mirrored argument needs its Mcp-Param header, with the same value.
    let param_call = |region: &str| {
        json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": with_meta(json!({ "name": "test_header_param", "arguments": { "region": region } }), json!({})) })
        .to_string()
    };
    let without = send(client.post("tools/call", &json!({ "name": "test_header_param" })).body(param_call("eu"))).await;
    expect(&without, 400, -32020, "Mcp-Param missing");
    let differs = send(
        client
            .post("tools/call", &json!({ "name": "test_header_param" }))
            .header("mcp-param-region", "us")
            .body(param_call("eu")),
    )
    .await;
    expect(&differs, 400, -32020, "Mcp-Param differs");
    for (first, second) in [("eu", "us"), ("us", "eu")] {
        let twice = send(
            client
                .post("tools/call", &json!({ "name": "test_header_param" }))
                .header("Mcp-Param-Region", first)
                .header("mcp-param-region", second)
                .body(param_call("eu")),
        )
        .await;
        expect(&twice, 400, -32020, "Mcp-Param repeated, in either order");
    }
    let matches = send(
        client
            .post("tools/call", &json!({ "name": "test_header_param" }))
            .header("Mcp-Param-Region", "eu")
            .body(param_call("eu")),
    )
    .await;
    assert_eq!(matches.status, 200);
}

#[tokio::test]
async fn methods_and_params() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    for method in [
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "tasks/list",
        "tasks/result",
    ] {
        let exchange = raw(&client, method, frame(method, with_meta(json!({}), json!({}))), |b| b).await;
        expect(&exchange, 404, -32601, method);
        assert_eq!(exchange.response()["error"]["data"]["supported"], json!(["2026-07-28"]), "{method}");
    }
    let unknown = raw(&client, "nope/nope", frame("nope/nope", with_meta(json!({}), json!({}))), |b| b).await;
    expect(&unknown, 404, -32601, "unknown");
    assert_eq!(unknown.response()["error"]["message"], "method not found", "the client's string is not echoed");
    // A legacy client's initialize (no version header, no _meta) is served on the session wire
    // (on by default): a session and the negotiated 2025-era version.
    let legacy_init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": { "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "old", "version": "1" } } });
    let post_legacy = || client.http.post(&client.url).header("content-type", "application/json");
    let served = post_legacy().body(legacy_init.to_string()).send().await.unwrap();
    assert_eq!(served.status(), 200);
    assert!(served.headers().contains_key("mcp-session-id"), "no Mcp-Session-Id");
    let served: Value = served.json().await.unwrap();
    assert_eq!(served["result"]["protocolVersion"], "2025-11-25");
    // An unknown earlier version gets the newest one this server speaks (the client decides).
    let old = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": { "protocolVersion": "2024-11-05", "capabilities": {} } });
    let answer: Value = post_legacy().body(old.to_string()).send().await.unwrap().json().await.unwrap();
    assert_eq!(answer["result"]["protocolVersion"], "2025-11-25");
    // With the session wire switched off, it learns which versions exist instead.
    let config = server.data_dir.path().to_owned() + "/legacy-off.toml";
    std::fs::write(&config, "[legacy]\nenabled = false\n").unwrap();
    let modern_only = Palisade::start(&["--config", &config]);
    let modern_client = Client::new(&modern_only);
    let legacy = send(
        modern_client
            .http
            .post(&modern_client.url)
            .header("content-type", "application/json")
            .body(legacy_init.to_string()),
    )
    .await;
    expect(&legacy, 404, -32601, "legacy initialize with the session wire off");

    let exchange = client.request("tools/list", json!({ "cursor": "bogus" })).await;
    assert_eq!(exchange.error_code(), -32602, "bad cursor");
    let exchange = client.request("prompts/list", json!({ "cursor": 5 })).await;
    assert_eq!(exchange.error_code(), -32602, "cursor of the wrong type");
    let exchange = client.request("tools/call", json!({ "name": "no_such_tool" })).await;
    assert_eq!(exchange.error_code(), -32602, "unknown tool");
    assert_eq!(exchange.response()["error"]["message"], "invalid params: unknown tool", "no echo of the name");
    let exchange = client.request("tools/call", json!({ "name": "test_simple_text", "arguments": [1] })).await;
    assert_eq!(exchange.error_code(), -32602, "arguments not an object");
    let exchange = client.request("tools/call", json!({ "name": "echo_structured", "arguments": { "text": 5 } })).await;
    assert_eq!(exchange.result()["isError"], true, "schema-invalid arguments are a tool error");
    let exchange = client
        .request("prompts/get", json!({ "name": "test_prompt_with_arguments", "arguments": { "arg1": "x" } }))
        .await;
    assert_eq!(exchange.error_code(), -32602, "missing required prompt argument");
    let exchange =
        client.request("prompts/get", json!({ "name": "test_simple_prompt", "arguments": { "a": 1 } })).await;
    assert_eq!(exchange.error_code(), -32602, "non-string prompt argument");
    let exchange = client.request("resources/read", json!({ "uri": "test://missing" })).await;
    assert_eq!(exchange.error_code(), -32602, "missing resource");
    assert_eq!(exchange.response()["error"]["data"]["uri"], "test://missing");
    let exchange = client
        .request(
            "completion/complete",
            json!({ "ref": { "type": "ref/prompt", "name": "nope" }, "argument": { "name": "a", "value": "" } }),
        )
        .await;
    assert_eq!(exchange.error_code(), -32602, "completion for an unknown prompt");
    let exchange = client.request("subscriptions/listen", json!({})).await;
    assert_eq!(exchange.error_code(), -32602, "listen without a filter");
    let exchange = client.request("subscriptions/listen", json!({ "notifications": { "taskIds": ["x"] } })).await;
    assert_eq!(exchange.error_code(), -32021, "taskIds need the tasks extension");
    let exchange = client
        .request("tools/call", json!({ "name": "test_input_required_result_elicitation", "inputResponses": null }))
        .await;
    assert_eq!(exchange.error_code(), -32602, "inputResponses null");
    let exchange = client
        .request("tools/call", json!({ "name": "test_input_required_result_elicitation", "requestState": 5 }))
        .await;
    assert_eq!(exchange.error_code(), -32602, "requestState not a string");
}

#[tokio::test]
async fn transport_limits_and_rebinding() {
    let server = Palisade::start(&["--max-body-bytes", "2048", "--allow-origin", "https://app.example"]);
    let client = Client::new(&server);
    let big = frame("tools/list", json!({ "pad": "x".repeat(4096), "_meta": crate::harness::meta(json!({})) }));
    expect(&raw(&client, "tools/list", big, |b| b).await, 413, -32600, "oversized body");

    let list = frame("tools/list", with_meta(json!({}), json!({})));
    let evil_host = raw(&client, "tools/list", list.clone(), |b| set(b, "host", "evil.example.com")).await;
    assert_eq!(evil_host.status, 403);
    let evil_origin = raw(&client, "tools/list", list.clone(), |b| b.header("origin", "http://evil.example.com")).await;
    assert_eq!(evil_origin.status, 403);
    let null_origin = raw(&client, "tools/list", list.clone(), |b| b.header("origin", "null")).await;
    assert_eq!(null_origin.status, 403);
    let own_origin = format!("http://localhost:{}", client.port);
    let ok_origin = raw(&client, "tools/list", list.clone(), |b| {
        set(b, "host", &format!("localhost:{}", client.port)).header("origin", own_origin)
    })
    .await;
    assert_eq!(ok_origin.status, 200);
    let configured = raw(&client, "tools/list", list.clone(), |b| b.header("origin", "https://app.example")).await;
    assert_eq!(configured.status, 200);

    let mut many = client.post("tools/list", &json!({}));
    for i in 0..80 {
        many = many.header(format!("x-filler-{i}"), "1");
    }
    assert_eq!(send(many.body(list.clone())).await.status, 431, "too many headers");
    let huge = raw(&client, "tools/list", list.clone(), |b| b.header("x-filler", "y".repeat(20_000))).await;
    assert_eq!(huge.status, 431, "headers too large");

    for method in [reqwest::Method::GET, reqwest::Method::DELETE, reqwest::Method::PUT] {
        let response = client.http.request(method.clone(), &client.url).send().await.unwrap();
        assert_eq!(response.status(), 405, "{method}");
        assert_eq!(response.headers()["allow"], "POST");
    }
    let other_path = client.http.post(client.url.replace("/mcp", "/other")).body(list.clone()).send().await.unwrap();
    assert_eq!(other_path.status(), 404);
    let html_only = raw(&client, "tools/list", list.clone(), |b| set(b, "accept", "text/html")).await;
    assert_eq!(html_only.status, 406);
    let form =
        raw(&client, "tools/list", list.clone(), |b| set(b, "content-type", "application/x-www-form-urlencoded")).await;
    assert_eq!(form.status, 415);
    let notification = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 1 } });
    let accepted = raw(&client, "notifications/cancelled", notification.to_string(), |b| b).await;
    assert_eq!(accepted.status, 202);
    assert!(accepted.frames.is_empty());
    // A JSON-only client still gets a JSON answer from a tool that reports progress.
    let mut params = with_meta(json!({ "name": "test_tool_with_progress" }), json!({}));
    params["_meta"]["progressToken"] = json!("t");
    let body = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params }).to_string();
    let json_only = send(set(client.post("tools/call", &params), "accept", "application/json").body(body)).await;
    assert_eq!(json_only.content_type, "application/json");
    assert!(json_only.result()["content"].is_array());
}
