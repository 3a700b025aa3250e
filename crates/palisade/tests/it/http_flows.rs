//! Well-formed 2026-07-28 traffic over HTTP: discovery, lists with pagination, calls, MRTR,
//! listen streams, timeouts and graceful shutdown.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Client, Palisade, Stream, with_meta};

#[tokio::test]
async fn discover_advertises_the_version_capabilities_and_server_info() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    let exchange = client.request("server/discover", json!({})).await;
    assert_eq!(exchange.status, 200);
    let result = exchange.result();
    // 2026-07-28 first; the session-era versions follow while that wire is on (the default).
    assert_eq!(result["supportedVersions"], json!(["2026-07-28", "2025-11-25", "2025-06-18"]));
    assert_eq!(result["resultType"], "complete");
    assert!(result["capabilities"]["tools"]["listChanged"].as_bool().unwrap());
    assert_eq!(result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "palisade-conformance-fixture");
    assert!(result["ttlMs"].as_u64().is_some());
}

#[tokio::test]
async fn lists_page_with_opaque_cursors_until_exhausted() {
    let server = Palisade::start(&["--page-size", "4"]);
    let client = Client::new(&server);
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(cursor) => json!({ "cursor": cursor }),
            None => json!({}),
        };
        let exchange = client.request("tools/list", params).await;
        let result = exchange.result();
        let tools = result["tools"].as_array().unwrap();
        assert!(tools.len() <= 4);
        names.extend(tools.iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        pages += 1;
        match result.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert!(pages > 2, "the fixture has more than eight tools");
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "no tool is listed twice across pages");
    assert_eq!(names[0], "test_simple_text");

    // The same list in one page is the concatenation of the pages, in the same order.
    let big = Palisade::start(&["--page-size", "1000"]);
    let all = Client::new(&big).request("tools/list", json!({})).await;
    let all: Vec<String> =
        all.result()["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(all, names);
}

#[tokio::test]
async fn tools_resources_prompts_and_completion() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    let text = client.request("tools/call", json!({ "name": "test_simple_text" })).await;
    assert_eq!(text.content_type, "application/json");
    assert_eq!(text.result()["content"][0]["text"], "This is a simple text response for testing.");

    let structured =
        client.request("tools/call", json!({ "name": "echo_structured", "arguments": { "text": "hi" } })).await;
    assert_eq!(structured.result()["structuredContent"], json!({ "echo": "hi" }));

    let error = client.request("tools/call", json!({ "name": "test_error_handling", "arguments": {} })).await;
    assert_eq!(error.result()["isError"], true);

    let read = client.request("resources/read", json!({ "uri": "test://template/42/data" })).await;
    let contents = &read.result()["contents"][0];
    assert_eq!(contents["uri"], "test://template/42/data");
    assert!(contents["text"].as_str().unwrap().contains("\"42\""));
    assert!(read.result()["ttlMs"].is_u64());

    let binary = client.request("resources/read", json!({ "uri": "test://static-binary" })).await;
    assert!(binary.result()["contents"][0]["blob"].as_str().unwrap().starts_with("iVBOR"));

    let prompt = client
        .request(
            "prompts/get",
            json!({ "name": "test_prompt_with_arguments", "arguments": { "arg1": "a", "arg2": "b" } }),
        )
        .await;
    assert_eq!(prompt.result()["messages"][0]["content"]["text"], "Prompt with arguments: arg1='a', arg2='b'");

    let completion = client
        .request(
            "completion/complete",
            json!({ "ref": { "type": "ref/prompt", "name": "test_prompt_with_arguments" }, "argument": { "name": "arg1", "value": "testV" } }),
        )
        .await;
    assert_eq!(completion.result()["completion"]["values"], json!(["testValue1", "testValue2"]));

    for list in ["resources/list", "resources/templates/list", "prompts/list"] {
        let exchange = client.request(list, json!({})).await;
        assert_eq!(exchange.result()["cacheScope"], "public");
    }
}

#[tokio::test]
async fn progress_turns_the_answer_into_a_stream_and_logs_need_an_opt_in() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    let mut params = with_meta(json!({ "name": "test_tool_with_progress" }), json!({}));
    params["_meta"]["progressToken"] = json!(7);
    let exchange = client.request("tools/call", params).await;
    assert!(exchange.content_type.starts_with("text/event-stream"));
    let progress: Vec<&Value> = exchange.notifications();
    assert_eq!(progress.len(), 3);
    assert!(progress.iter().all(|n| n["params"]["progressToken"] == json!(7)));

    let quiet = client.request("tools/call", json!({ "name": "test_tool_with_logging" })).await;
    assert!(quiet.notifications().is_empty(), "no logs without logLevel");

    let mut params = with_meta(json!({ "name": "test_tool_with_logging" }), json!({}));
    params["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
    let loud = client.request("tools/call", params.clone()).await;
    assert_eq!(loud.notifications().len(), 3);
    params["_meta"]["io.modelcontextprotocol/logLevel"] = json!("error");
    let filtered = client.request("tools/call", params).await;
    assert!(filtered.notifications().is_empty(), "info logs are below an error threshold");
}

#[tokio::test]
async fn mrtr_state_is_sealed_bound_and_single_purpose() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    let tool = with_meta(
        json!({ "name": "test_input_required_result_multi_round", "arguments": {} }),
        json!({ "elicitation": {} }),
    );
    let r1 = client.request("tools/call", tool.clone()).await;
    let r1 = r1.result();
    assert_eq!(r1["resultType"], "input_required");
    let state = r1["requestState"].as_str().unwrap().to_owned();

    let mut retry = tool.clone();
    retry["inputResponses"] = json!({ "step1": { "action": "accept", "content": { "name": "Ada" } } });
    retry["requestState"] = json!(state);
    let r2 = client.request("tools/call", retry.clone()).await;
    assert_eq!(r2.result()["inputRequests"]["step2"]["method"], "elicitation/create");

    // The same state presented with other arguments, to another tool, or altered is refused.
    let mut other_args = retry.clone();
    other_args["arguments"] = json!({ "x": 1 });
    assert_eq!(client.request("tools/call", other_args).await.error_code(), -32602);
    let mut other_tool = retry.clone();
    other_tool["name"] = json!("test_input_required_result_request_state");
    assert_eq!(client.request("tools/call", other_tool).await.error_code(), -32602);
    let mut tampered = retry.clone();
    tampered["requestState"] = json!(format!("{state}x"));
    assert_eq!(client.request("tools/call", tampered).await.error_code(), -32602);
    // A state minted by another server (another secret) is refused too.
    let other_server = Palisade::start(&[]);
    assert_eq!(Client::new(&other_server).request("tools/call", retry).await.error_code(), -32602);

    // Asking for a capability the request did not declare is -32021, not an input request.
    let mut no_caps = with_meta(json!({ "name": "test_input_required_result_sampling" }), json!({ "elicitation": {} }));
    no_caps["arguments"] = json!({});
    let refused = client.request("tools/call", no_caps).await;
    assert_eq!(refused.error_code(), -32021);
    assert_eq!(refused.status, 400);
    assert_eq!(refused.response()["error"]["data"]["requiredCapabilities"], json!({ "sampling": {} }));
}

#[tokio::test]
async fn confirmation_is_bound_to_the_exact_arguments() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    let elicit = json!({ "elicitation": {} });
    let call = with_meta(json!({ "name": "test_confirmed_action", "arguments": { "target": "a" } }), elicit.clone());
    let asked = client.request("tools/call", call.clone()).await;
    let asked = asked.result();
    assert_eq!(asked["resultType"], "input_required");
    let question = &asked["inputRequests"]["palisade.confirm"];
    assert_eq!(question["method"], "elicitation/create");
    assert!(question["params"]["message"].as_str().unwrap().contains(r#"{"target":"a"}"#));
    let state = asked["requestState"].clone();
    let answer = |action: &str| json!({ "palisade.confirm": { "action": action, "content": { "confirm": true } } });

    // The approval for target "a" does not approve target "b".
    let mut other =
        with_meta(json!({ "name": "test_confirmed_action", "arguments": { "target": "b" } }), elicit.clone());
    other["inputResponses"] = answer("accept");
    other["requestState"] = state.clone();
    assert_eq!(client.request("tools/call", other).await.error_code(), -32602);
    // An answer without the server's question is not a confirmation: it is asked again.
    let mut unasked = call.clone();
    unasked["inputResponses"] = answer("accept");
    assert_eq!(client.request("tools/call", unasked).await.result()["resultType"], "input_required");
    // Declined: a tool error, the action does not run.
    let mut declined = call.clone();
    declined["inputResponses"] = answer("decline");
    declined["requestState"] = state.clone();
    assert_eq!(client.request("tools/call", declined).await.result()["isError"], true);
    // Accepted: it runs.
    let mut accepted = call.clone();
    accepted["inputResponses"] = answer("accept");
    accepted["requestState"] = state;
    assert_eq!(client.request("tools/call", accepted.clone()).await.result()["content"][0]["text"], "action done on a");
    // A confirmation authorizes one execution: the same accepted state again is refused.
    let replayed = client.request("tools/call", accepted).await;
    assert_eq!(replayed.error_code(), -32602, "{:?}", replayed.response());
    assert_eq!(replayed.response()["error"]["message"], "invalid params: this confirmation was already used");
    // Without the elicitation capability the server cannot ask: -32021.
    let no_caps = with_meta(json!({ "name": "test_confirmed_action", "arguments": { "target": "a" } }), json!({}));
    assert_eq!(client.request("tools/call", no_caps).await.error_code(), -32021);
}

#[tokio::test]
async fn listen_acknowledges_first_tags_every_message_and_honours_the_filter() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    let filter = json!({ "notifications": {
        "toolsListChanged": true,
        "resourceSubscriptions": ["test://watched-resource", "test://no-such-resource"]
    } });
    let params = with_meta(filter, json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen", "params": params });
    let mut stream = Stream::open(client.post("subscriptions/listen", &params).body(body.to_string())).await;

    let ack = stream.next(Duration::from_secs(5)).await.expect("ack");
    crate::schema::check_notification(&ack);
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], json!("sub-1"));
    // Unknown resources are not acknowledged; nothing unrequested is added.
    assert_eq!(
        ack["params"]["notifications"],
        json!({ "toolsListChanged": true, "resourceSubscriptions": ["test://watched-resource"] })
    );

    client.request("tools/call", json!({ "name": "test_trigger_prompt_change" })).await;
    client.request("tools/call", json!({ "name": "test_trigger_tool_change" })).await;
    client.request("tools/call", json!({ "name": "test_trigger_resource_update" })).await;
    let first = stream.next(Duration::from_secs(5)).await.expect("tools event");
    let second = stream.next(Duration::from_secs(5)).await.expect("resource event");
    for event in [&first, &second] {
        crate::schema::check_notification(event);
        assert_eq!(event["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], json!("sub-1"));
    }
    assert_eq!(first["method"], "notifications/tools/list_changed", "prompt changes were not requested");
    assert_eq!(second["method"], "notifications/resources/updated");
    assert_eq!(second["params"]["uri"], "test://watched-resource");
    assert!(stream.next(Duration::from_millis(300)).await.is_none(), "resources list_changed was not requested");
}

#[tokio::test]
async fn shutdown_ends_listen_streams_with_the_complete_result() {
    let mut server = Palisade::start(&[]);
    let client = Client::new(&server);
    let params = with_meta(json!({ "notifications": { "toolsListChanged": true } }), json!({}));
    let id = 1_780_000_000_000_i64;
    let body = json!({ "jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": params });
    let mut stream = Stream::open(client.post("subscriptions/listen", &params).body(body.to_string())).await;
    assert!(stream.next(Duration::from_secs(5)).await.is_some());
    let terminate = tokio::task::spawn_blocking(move || {
        let status = server.terminate();
        (server, status)
    });
    let last = stream.next(Duration::from_secs(10)).await.expect("the complete result");
    crate::schema::check_response("subscriptions/listen", &last);
    assert_eq!(last["id"], json!(id), "the listen id keeps its integer type");
    assert_eq!(last["result"]["resultType"], "complete");
    assert_eq!(last["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], json!(id));
    let (_server, status) = terminate.await.unwrap();
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
}

#[tokio::test]
async fn slow_requests_time_out_with_a_generic_error() {
    let server = Palisade::start(&["--request-timeout-secs", "1"]);
    let client = Client::new(&server);
    let exchange = client.request("tools/call", json!({ "name": "test_slow", "arguments": { "ms": 5000 } })).await;
    assert_eq!(exchange.error_code(), -32603);
    assert_eq!(exchange.response()["error"]["message"], "request timed out");
    let quick = client.request("tools/call", json!({ "name": "test_slow", "arguments": { "ms": 10 } })).await;
    assert_eq!(quick.result()["content"][0]["text"], "slept 10 ms");
}

#[tokio::test]
async fn header_values_may_be_base64_encoded() {
    let server = Palisade::start(&[]);
    let client = Client::new(&server);
    let params =
        with_meta(json!({ "name": "test_header_param", "arguments": { "region": "ünïcode region" } }), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params });
    let exchange = crate::harness::send(
        client
            .post("tools/call", &params)
            .header("mcp-param-region", palisade_wire::header::encode_value("ünïcode region"))
            .body(body.to_string()),
    )
    .await;
    assert_eq!(exchange.result()["content"][0]["text"], "region=ünïcode region");
}
