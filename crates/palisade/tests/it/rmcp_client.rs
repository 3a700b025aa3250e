//! An independent Rust client, the official SDK `rmcp` pinned to 2026-07-28, against the real
//! binary: discover, tools/list, tools/call, resources/read, prompts/get and a listen; and the
//! tasks extension driven end to end (create, tasks/get, tasks/update, tasks/cancel).

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientConfig, DetailedTask, GetPromptRequestParams,
    GetTaskParams, InputRequest, JsonObject, ProtocolVersion, ReadResourceRequestParams, RequestMetaObject,
    ServerNotification, SubscriptionFilter, TASKS_EXTENSION_ID, TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt};

use crate::harness::{Client, Palisade};

#[tokio::test]
async fn rmcp_client_pinned_to_2026_07_28() {
    let server = Palisade::start(&[]);
    let transport =
        StreamableHttpClientTransport::from_config(StreamableHttpClientTransportConfig::with_uri(server.url.clone()));
    let client = ClientConfig::default()
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
        )
        .await
        .expect("rmcp connects");
    assert_eq!(client.peer_info().map(|info| info.protocol_version.clone()), Some(ProtocolVersion::V_2026_07_28));

    let discovered = client.discover(RequestMetaObject::new()).await.expect("discover");
    assert!(discovered.supported_versions.contains(&ProtocolVersion::V_2026_07_28));

    let tools = client.list_tools(None).await.expect("tools/list");
    assert!(tools.tools.iter().any(|t| t.name == "test_simple_text"));

    let called = client.call_tool(CallToolRequestParams::new("test_simple_text")).await.expect("tools/call");
    let text = serde_json::to_value(&called.content).unwrap();
    assert_eq!(text[0]["text"], "This is a simple text response for testing.");

    let read =
        client.read_resource(ReadResourceRequestParams::new("test://static-text")).await.expect("resources/read");
    let read = serde_json::to_value(&read.contents).unwrap();
    assert_eq!(read[0]["text"], "This is the content of the static text resource.");

    let prompt = client.get_prompt(GetPromptRequestParams::new("test_simple_prompt")).await.expect("prompts/get");
    assert_eq!(prompt.messages.len(), 1);

    let mut subscription =
        client.listen(SubscriptionFilter::builder().tools_list_changed().build()).await.expect("listen acknowledged");
    assert_eq!(subscription.acknowledged().tools_list_changed, Some(true));
    // Trigger a change through a second, plain HTTP client and see it arrive on the stream.
    Client::new(&server).request("tools/call", serde_json::json!({ "name": "test_trigger_tool_change" })).await;
    let event = tokio::time::timeout(Duration::from_secs(5), subscription.next()).await.expect("event in time");
    assert!(matches!(event, Ok(Some(ServerNotification::ToolListChangedNotification(_)))), "{event:?}");
    drop(subscription);
    client.cancel().await.expect("close");
}

/// rmcp drives the tasks extension (`io.modelcontextprotocol/tasks`) end to end with its typed
/// API: the client declares the extension in its capabilities (rmcp sends them in every
/// request's `_meta` clientCapabilities), `call_tool_once` returns the server's
/// `CreateTaskResult`, and `get_task` / `update_task` / `cancel_task` are tasks/get, tasks/update
/// and tasks/cancel (rmcp sets `Mcp-Name` to the task id). rmcp has no task-polling loop of its
/// own, so the test polls `tasks/get` until the task is terminal.
#[tokio::test]
async fn rmcp_client_drives_tasks() {
    let server = Palisade::start(&[]);
    let transport =
        StreamableHttpClientTransport::from_config(StreamableHttpClientTransportConfig::with_uri(server.url.clone()));
    // `ClientCapabilities::builder().enable_tasks()` needs rmcp's `server` feature; this is it.
    let mut config = ClientConfig::default();
    config.capabilities.extensions = Some([(TASKS_EXTENSION_ID.to_owned(), JsonObject::new())].into());
    let client = config
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
        )
        .await
        .expect("rmcp connects");
    let discovered = client.discover(RequestMetaObject::new()).await.expect("discover");
    assert!(discovered.capabilities.supports_tasks(), "server advertises the tasks extension: {discovered:?}");

    // Polls tasks/get until the task is terminal (or `limit` passes); returns the last state.
    let poll = |task_id: String, limit: Duration| {
        let client = &client;
        async move {
            let deadline = tokio::time::Instant::now() + limit;
            loop {
                let got = client.get_task(GetTaskParams::new(task_id.clone())).await.expect("tasks/get");
                assert_eq!(got.task.task.task_id, task_id);
                if got.task.status().is_terminal() || tokio::time::Instant::now() >= deadline {
                    return got.task;
                }
                let wait = got.task.task.poll_interval_ms.unwrap_or(100).clamp(20, 500);
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
        }
    };
    let create = |name: &'static str, arguments: serde_json::Value| {
        let client = &client;
        async move {
            let params = CallToolRequestParams::new(name).with_arguments(arguments.as_object().unwrap().clone());
            match client.call_tool_once(params).await.expect("tools/call") {
                CallToolResponse::Task(created) => {
                    assert!(created.result_type.is_task());
                    assert!(!created.task.status.is_terminal(), "a new task is not terminal: {created:?}");
                    created.task.task_id
                }
                other => panic!("{name}: expected a task, got {other:?}"),
            }
        }
    };
    let result_text = |task: &DetailedTask| match &task.payload {
        TaskPayload::Completed { result } => {
            // The original call's 2026-07-28 result, `resultType` included.
            assert_eq!(result.get("resultType"), Some(&serde_json::json!("complete")), "{result:?}");
            assert_ne!(result.get("isError"), Some(&serde_json::Value::Bool(true)), "{result:?}");
            result["content"][0]["text"].as_str().unwrap_or_default().to_owned()
        }
        other => panic!("expected completed, got {other:?}"),
    };

    // 1. slow_compute as a task: working, then completed with the tool's result.
    let task_id = create("slow_compute", serde_json::json!({ "seconds": 1 })).await;
    let done = poll(task_id, Duration::from_secs(20)).await;
    assert_eq!(done.status(), TaskStatus::Completed, "{done:?}");
    assert_eq!(result_text(&done), "Computed result after 1 s");

    // 2. confirm_delete waits in input_required for `confirm`; tasks/update answers it.
    let task_id = create("confirm_delete", serde_json::json!({ "filename": "a.txt" })).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let waiting = loop {
        let got = client.get_task(GetTaskParams::new(task_id.clone())).await.expect("tasks/get");
        if got.task.status() != TaskStatus::Working || tokio::time::Instant::now() >= deadline {
            break got.task;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    match &waiting.payload {
        TaskPayload::InputRequired { input_requests } => {
            assert!(
                matches!(input_requests.get("confirm"), Some(InputRequest::Elicitation(_))),
                "an elicitation under `confirm`: {input_requests:?}"
            );
        }
        other => panic!("expected input_required, got {other:?}"),
    }
    let answer = serde_json::json!({ "action": "accept", "content": { "confirm": true } });
    client
        .update_task(UpdateTaskParams::new(task_id.clone(), [("confirm".to_owned(), answer)].into()))
        .await
        .expect("tasks/update");
    let done = poll(task_id, Duration::from_secs(20)).await;
    assert_eq!(done.status(), TaskStatus::Completed, "{done:?}");
    assert_eq!(result_text(&done), "Deleted a.txt");

    // 3. A long slow_compute is cancelled: tasks/cancel is acknowledged and the task ends cancelled.
    let task_id = create("slow_compute", serde_json::json!({ "seconds": 60 })).await;
    client.cancel_task(CancelTaskParams::new(task_id.clone())).await.expect("tasks/cancel");
    let done = poll(task_id.clone(), Duration::from_secs(20)).await;
    assert_eq!(done.status(), TaskStatus::Cancelled, "{done:?}");
    assert!(matches!(done.payload, TaskPayload::Cancelled));

    // 4. An id the server never issued is an error, not a task.
    let stranger = client.get_task(GetTaskParams::new("not-a-task")).await;
    assert!(stranger.is_err(), "unknown task id: {stranger:?}");

    client.cancel().await.expect("close");
}
