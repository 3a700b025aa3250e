//! Two instances of one deployment (same store, same server secret, same `public_url`) on one
//! Redis: a 2025-era server request (elicitation) sent by A is answered by a POST that lands on
//! B, and the answer reaches the request waiting on A; a message on the answer channel that is
//! not signed with the deployment's key, or an answer admitted for another session, changes
//! nothing (the first is counted as dropped).

use std::time::Duration;

use aws_lc_rs::hmac;
use serde_json::{Value, json};

use crate::harness::{Palisade, Stream, TempDir};

const VERSION: &str = "2025-11-25";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes).as_ref().to_vec()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Deployment {
    _shared: TempDir,
    public_url: String,
    a: Palisade,
    b: Palisade,
    a_metrics: u16,
}

fn deployment() -> Deployment {
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| {
        panic!("REDIS_URL is not set: the answer relay tests need a Redis (scripts/test starts one)")
    });
    let shared = TempDir::new();
    let mut secret = [0u8; 32];
    aws_lc_rs::rand::fill(&mut secret).unwrap();
    let secret_file = format!("{}/server-secret", shared.path());
    std::fs::write(&secret_file, hex(&secret)).unwrap();
    let store = format!("sqlite:{}/palisade.db", shared.path());
    let public_url = format!("http://answers-{}.test/mcp", hex(&secret[..6]));
    let a_metrics = free_port();
    let a_metrics_listen = format!("127.0.0.1:{a_metrics}");
    let common = [
        ("PALISADE_EVENTS_REDIS", redis.as_str()),
        ("PALISADE_PUBLIC_URL", public_url.as_str()),
        ("PALISADE_STORE", store.as_str()),
        ("PALISADE_SECRET_FILE", secret_file.as_str()),
    ];
    let mut with_metrics = common.to_vec();
    with_metrics.push(("PALISADE_METRICS_LISTEN", a_metrics_listen.as_str()));
    let a = Palisade::start_app_env("conformance", &[], &with_metrics);
    let b = Palisade::start_app_env("conformance", &[], &common);
    Deployment { _shared: shared, public_url, a, b, a_metrics }
}

fn post(server: &Palisade, session: Option<&str>, body: Value) -> reqwest::RequestBuilder {
    let mut builder = reqwest::Client::new()
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", VERSION)
        .body(body.to_string());
    if let Some(session) = session {
        builder = builder.header("mcp-session-id", session);
    }
    builder
}

async fn initialize(server: &Palisade) -> String {
    let params = json!({
        "protocolVersion": VERSION,
        "capabilities": { "elicitation": {} },
        "clientInfo": { "name": "relay-test", "version": "1" }
    });
    let body = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params });
    let response = post(server, None, body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let session = response.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    assert_eq!(post(server, Some(&session), initialized).send().await.unwrap().status(), 202);
    session
}

async fn answer(server: &Palisade, session: &str, id: &str, username: &str) -> u16 {
    let content = json!({ "username": username, "email": "a@example.com" });
    let body = json!({ "jsonrpc": "2.0", "id": id, "result": { "action": "accept", "content": content } });
    post(server, Some(session), body).send().await.unwrap().status().as_u16()
}

async fn dropped(metrics_port: u16, reason: &str) -> u64 {
    let text = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics")).await.unwrap().text().await.unwrap();
    let series = format!("palisade_answer_relay_dropped_total{{reason=\"{reason}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&series)).map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test]
async fn an_answer_posted_to_another_instance_reaches_the_request_waiting_on_the_first() {
    let deployment = deployment();
    let (a, b) = (&deployment.a, &deployment.b);
    let session = initialize(a).await;
    let other_session = initialize(b).await;
    let call = json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": { "name": "test_elicitation", "arguments": { "message": "who are you?" } }
    });
    let mut stream = Stream::open(post(a, Some(&session), call)).await;
    let request = stream.next(Duration::from_secs(10)).await.expect("the elicitation request");
    assert_eq!(request["method"], "elicitation/create", "{request}");
    let id = request["id"].as_str().expect("a string id").to_owned();

    // A message on the answer channel under a key that is not the deployment's: dropped, counted.
    let channel_digest = hex(&sha256(deployment.public_url.as_bytes())[..16]);
    let channel = format!("palisade:answers:{channel_digest}");
    let forged_key = hmac::Key::new(hmac::HMAC_SHA256, &[9; 32]);
    let forged_answer =
        json!({ "jsonrpc": "2.0", "id": id, "result": { "action": "accept", "content": { "username": "mallory" } } })
            .to_string();
    let session_digest = sha256(session.as_bytes());
    let mut signed = b"palisade answer relay v1\0".to_vec();
    signed.extend_from_slice(&session_digest);
    for part in [id.as_bytes(), forged_answer.as_bytes()] {
        signed.extend_from_slice(&(part.len() as u64).to_be_bytes());
        signed.extend_from_slice(part);
    }
    let forged = json!({
        "origin": "ff".repeat(16),
        "session": hex(&session_digest),
        "id": id,
        "answer": forged_answer,
        "tag": hex(hmac::sign(&forged_key, &signed).as_ref()),
    });
    let redis = redis::Client::open(std::env::var("REDIS_URL").unwrap()).unwrap();
    let mut connection = redis.get_multiplexed_async_connection().await.unwrap();
    let heard: i64 =
        redis::cmd("PUBLISH").arg(&channel).arg(forged.to_string()).query_async(&mut connection).await.unwrap();
    assert_eq!(heard, 2, "both instances listen on the deployment's answer channel");
    let _: i64 = redis::cmd("PUBLISH").arg(&channel).arg("{not json").query_async(&mut connection).await.unwrap();

    // The right request id, admitted on B for another session: relayed, and taken by nobody.
    assert_eq!(answer(b, &other_session, &id, "eve").await, 202, "handed to the relay, as locally");
    assert!(stream.next(Duration::from_millis(1500)).await.is_none(), "a foreign answer was delivered");
    assert_eq!(dropped(deployment.a_metrics, "forged").await, 1);
    assert_eq!(dropped(deployment.a_metrics, "malformed").await, 1);

    // The client's real answer, POSTed to B: it reaches the tool waiting on A.
    assert_eq!(answer(b, &session, &id, "alice").await, 202);
    let result = stream.next(Duration::from_secs(10)).await.expect("the tool's result");
    assert_eq!(result["id"], 7, "{result}");
    let text = result["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("User response: action=accept") && text.contains("alice"), "{result}");
    assert!(!text.contains("mallory") && !text.contains("eve"), "{result}");
}

#[tokio::test]
async fn without_a_relay_an_answer_for_nothing_waiting_is_refused_as_before() {
    let server = Palisade::start(&[]);
    let session = initialize(&server).await;
    assert_eq!(answer(&server, &session, "palisade-0123456789abcdef0123456789abcdef", "x").await, 400);
}
