//! Two instances on one Redis (`events_redis`): a list change raised on one reaches a listen
//! stream held on the other, exactly once, for what the stream asked for only; the instance
//! that raised it hears it once too (its own message is not delivered a second time); a bad
//! `events_redis` refuses the start.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Client, Palisade, Stream, with_meta};

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| {
        panic!("REDIS_URL is not set: the event fan-out tests need a Redis (scripts/test starts one)")
    })
}

/// A conformance instance of the deployment `public_url` whose events go through Redis.
fn instance(public_url: &str) -> Palisade {
    let redis = redis_url();
    Palisade::start_app_env(
        "conformance",
        &[],
        &[("PALISADE_EVENTS_REDIS", redis.as_str()), ("PALISADE_PUBLIC_URL", public_url)],
    )
}

async fn listen(client: &Client, id: &str, filter: Value) -> Stream {
    let params = with_meta(json!({ "notifications": filter }), json!({}));
    let body = json!({ "jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": params });
    let mut stream = Stream::open(client.post("subscriptions/listen", &params).body(body.to_string())).await;
    let ack = stream.next(Duration::from_secs(5)).await.expect("the acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    stream
}

#[tokio::test]
async fn a_list_change_on_one_instance_reaches_a_listen_stream_on_another() {
    let mut marker = [0u8; 8];
    aws_lc_rs::rand::fill(&mut marker).unwrap();
    let public_url =
        format!("http://events-{}.test/mcp", marker.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let (a, b) = (instance(&public_url), instance(&public_url));
    let (on_a, on_b) = (Client::new(&a), Client::new(&b));
    let mut far = listen(&on_b, "far", json!({ "promptsListChanged": true })).await;
    let mut near = listen(&on_a, "near", json!({ "promptsListChanged": true })).await;
    // Each bridge subscribed before its instance printed its listening line; a change on A:
    let answer = on_a.request("tools/call", json!({ "name": "test_trigger_prompt_change" })).await;
    assert_eq!(answer.result()["content"][0]["text"], "Mutation triggered");
    for (stream, id) in [(&mut far, "far"), (&mut near, "near")] {
        let event = stream.next(Duration::from_secs(10)).await.unwrap_or_else(|| panic!("no event on {id}"));
        crate::schema::check_notification(&event);
        assert_eq!(event["method"], "notifications/prompts/list_changed");
        assert_eq!(event["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], json!(id));
    }
    // A tool change nobody asked for is not delivered, and nothing comes twice: the next event
    // on each stream is the prompt change raised on B.
    on_a.request("tools/call", json!({ "name": "test_trigger_tool_change" })).await;
    on_b.request("tools/call", json!({ "name": "test_trigger_prompt_change" })).await;
    for (stream, id) in [(&mut far, "far"), (&mut near, "near")] {
        let event = stream.next(Duration::from_secs(10)).await.unwrap_or_else(|| panic!("no second event on {id}"));
        assert_eq!(event["method"], "notifications/prompts/list_changed", "{id}: {event}");
        assert!(stream.next(Duration::from_millis(500)).await.is_none(), "{id}: an event came twice");
    }
}

#[tokio::test]
async fn another_deployment_on_the_same_redis_hears_nothing() {
    let (a, other) = (instance("http://deployment-a.test/mcp"), instance("http://deployment-b.test/mcp"));
    let mut stream = listen(&Client::new(&other), "other", json!({ "toolsListChanged": true })).await;
    Client::new(&a).request("tools/call", json!({ "name": "test_trigger_tool_change" })).await;
    Client::new(&other).request("tools/call", json!({ "name": "test_trigger_prompt_change" })).await;
    // Only an event of its own would come; a prompt change was not asked for: nothing arrives.
    assert!(stream.next(Duration::from_millis(1500)).await.is_none(), "an event crossed deployments");
}

#[test]
fn a_bad_or_unreachable_events_redis_refuses_the_start() {
    let data = crate::harness::TempDir::new();
    for (url, expected) in [("http://127.0.0.1:6379", "events_redis"), ("redis://127.0.0.1:1/", "cannot connect")] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["serve", "--app", "conformance", "--listen", "127.0.0.1:0", "--data-dir", data.path()])
            .env("PALISADE_EVENTS_REDIS", url)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{url}: started");
        assert!(stderr.contains(expected), "{url}: {stderr}");
    }
}
