//! An independent Rust client, the official SDK `rmcp` pinned to 2026-07-28, against the real
//! binary: discover, tools/list, tools/call, resources/read, prompts/get and a listen.

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientConfig, GetPromptRequestParams, ProtocolVersion, ReadResourceRequestParams,
    RequestMetaObject, ServerNotification, SubscriptionFilter,
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
