//! The stdio upstream client in process, against the stdio fixture: nothing starts without the
//! approved launch digest, answers are matched to their own requests under concurrency, a
//! deadline and a cancellation end one call without breaking the process, processes are one per
//! caller partition and capped, a changed executable is refused at the next launch, and every
//! process stops when the launch is withdrawn.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used)]

#[path = "support/stdio_fixture.rs"]
mod stdio_fixture;

use std::time::Duration;

use palisade_gateway::config::{GatewaySettings, RawGateway, RawPins, RawUpstream};
use palisade_gateway::credentials::CallerContext;
use palisade_gateway::launch::LaunchSpec;
use palisade_gateway::upstream::stdio::SandboxIdentities;
use palisade_gateway::upstream::{ListKind, UpstreamClient, UpstreamError, UpstreamReply, UpstreamRequest};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

fn settings(command: &str, extra: &str) -> GatewaySettings {
    #[derive(serde::Deserialize)]
    struct File {
        upstreams: Vec<RawUpstream>,
    }
    let timeout = if extra.contains("request_timeout_secs") { "" } else { "request_timeout_secs = 2\n" };
    let text = format!("[[upstreams]]\nid = \"fx\"\ncommand = {command:?}\n{timeout}{extra}");
    let file: File = toml::from_str(&text).unwrap();
    palisade_gateway::config::validate(RawGateway::default(), RawPins::default(), file.upstreams, None).unwrap()
}

fn client(settings: &GatewaySettings) -> UpstreamClient {
    UpstreamClient::stdio(&settings.upstreams[0], SandboxIdentities::new(settings.sandbox), Vec::new()).unwrap()
}

fn digest(settings: &GatewaySettings) -> String {
    let path = std::env::var("PATH").ok();
    LaunchSpec::resolve(&settings.upstreams[0], path.as_deref()).unwrap().unwrap().digest().unwrap()
}

async fn call(client: &UpstreamClient, partition: &str, tool: &str, arguments: Value) -> Result<Value, UpstreamError> {
    call_with(client, partition, tool, arguments, CancellationToken::new()).await
}

async fn call_with(
    client: &UpstreamClient,
    partition: &str,
    tool: &str,
    arguments: Value,
    cancel: CancellationToken,
) -> Result<Value, UpstreamError> {
    let mut params = Map::new();
    params.insert("name".into(), json!(tool));
    params.insert("arguments".into(), arguments);
    let request = UpstreamRequest {
        method: "tools/call",
        params,
        caller: CallerContext { partition, subject_token: None, user: None },
        client_capabilities: None,
        notifications: None,
        asks: None,
        cancel,
    };
    match client.request(request).await? {
        UpstreamReply::Result(result) => Ok(result.get("structuredContent").cloned().unwrap_or(Value::Null)),
        other => panic!("unexpected reply {other:?}"),
    }
}

/// An unconfined fixture (fast, and its pids are the host's): the client's own behaviour.
fn unconfined(extra: &str) -> GatewaySettings {
    settings(stdio_fixture::fixture_path().to_str().unwrap(), &format!("confinement = \"none\"\n{extra}"))
}

#[tokio::test]
async fn nothing_starts_without_the_approved_digest() {
    let settings = unconfined("");
    let client = client(&settings);
    let refused = client.connect().await;
    assert!(matches!(refused, Err(UpstreamError::Refused(_))), "{refused:?}");
    assert_eq!(client.processes(), Some(0));
    client.set_launch_approved(Some("0".repeat(64))).await;
    let refused = client.connect().await;
    assert!(matches!(refused, Err(UpstreamError::Refused(_))), "another digest: {refused:?}");
    assert_eq!(client.processes(), Some(0));
    client.set_launch_approved(Some(digest(&settings))).await;
    let info = client.connect().await.unwrap();
    assert_eq!(info.era.to_string(), "2026-07-28");
    let (tools, _) = client.list(ListKind::Tools).await.unwrap();
    assert!(tools.iter().any(|tool| tool["name"] == "echo"), "{tools:?}");
    // Withdrawing the approval stops the process: its pid is gone.
    let pid = call(&client, "", "whoami", json!({})).await.unwrap()["pid"].as_u64().unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    client.set_launch_approved(None).await;
    assert_eq!(client.processes(), Some(0));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}/exe")).exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!std::path::Path::new(&format!("/proc/{pid}/exe")).exists(), "process {pid} still runs");
}

#[tokio::test]
async fn concurrent_answers_reach_their_own_requests() {
    let settings = unconfined("");
    let client = client(&settings);
    client.set_launch_approved(Some(digest(&settings))).await;
    let calls = (0..64).map(|n| {
        let client = client.clone();
        async move { (n, call(&client, "alice", "echo", json!({"text": format!("n{n}")})).await) }
    });
    for (n, answer) in futures::future::join_all(calls).await {
        assert_eq!(answer.unwrap()["text"], format!("n{n}"));
    }
    // One process for alice, one for the gateway's own listing partition.
    assert_eq!(client.processes(), Some(2));
}

#[tokio::test]
async fn a_deadline_or_a_cancellation_ends_one_call_only() {
    let settings = unconfined("");
    let client = client(&settings);
    client.set_launch_approved(Some(digest(&settings))).await;
    call(&client, "alice", "remember", json!({"value": "kept"})).await.unwrap();
    let slow = call(&client, "alice", "spin", json!({"secs": 5})).await;
    assert!(matches!(slow, Err(UpstreamError::Timeout)), "{slow:?}");
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        trigger.cancel();
    });
    let cancelled = call_with(&client, "alice", "spin", json!({"secs": 1}), cancel).await;
    assert!(matches!(cancelled, Err(UpstreamError::Cancelled)), "{cancelled:?}");
    // The same process still answers (its memory is intact), after the spins end.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let recalled = loop {
        match call(&client, "alice", "recall", json!({})).await {
            Ok(value) => break value,
            // The fixture answers one call at a time: it is still spinning (two timeouts put the
            // upstream in a short backoff).
            Err(UpstreamError::Timeout | UpstreamError::Unhealthy) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("{error:?}"),
        }
    };
    assert_eq!(recalled["value"], "kept");
}

#[tokio::test]
async fn processes_are_per_partition_capped_and_shared_only_when_declared() {
    let settings = unconfined("max_processes = 3");
    let client = client(&settings);
    client.set_launch_approved(Some(digest(&settings))).await;
    call(&client, "alice", "remember", json!({"value": "alice's"})).await.unwrap();
    assert_eq!(call(&client, "bob", "recall", json!({})).await.unwrap()["value"], Value::Null);
    assert_eq!(call(&client, "alice", "recall", json!({})).await.unwrap()["value"], "alice's");
    client.connect().await.unwrap();
    let refused = call(&client, "carol", "recall", json!({})).await;
    assert!(matches!(refused, Err(UpstreamError::Refused(_))), "past the cap: {refused:?}");
    assert!(client.check_health().is_ok(), "a refusal by the cap is not the upstream's failure");
    assert_eq!(call(&client, "alice", "recall", json!({})).await.unwrap()["value"], "alice's");

    let shared = unconfined("shared = true");
    let client = self::client(&shared);
    client.set_launch_approved(Some(digest(&shared))).await;
    call(&client, "alice", "remember", json!({"value": "everyone's"})).await.unwrap();
    assert_eq!(call(&client, "bob", "recall", json!({})).await.unwrap()["value"], "everyone's");
    assert_eq!(client.processes(), Some(1));
}

#[tokio::test]
async fn idle_processes_are_stopped() {
    let settings = unconfined("idle_secs = 1\nrequest_timeout_secs = 10");
    let client = client(&settings);
    client.set_launch_approved(Some(digest(&settings))).await;
    call(&client, "alice", "remember", json!({"value": "v"})).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while client.processes() != Some(1) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(client.processes(), Some(1), "only the gateway's own process stays");
    assert_eq!(call(&client, "alice", "recall", json!({})).await.unwrap()["value"], Value::Null, "a new process");
    // A call longer than idle_secs is not idleness: its process is not stopped under it.
    call(&client, "alice", "remember", json!({"value": "w"})).await.unwrap();
    let slow = call(&client, "alice", "spin", json!({"secs": 3})).await;
    assert!(slow.is_ok(), "{slow:?}");
    assert_eq!(call(&client, "alice", "recall", json!({})).await.unwrap()["value"], "w", "the same process");
}

#[tokio::test]
async fn a_replaced_executable_is_not_launched() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("fixture");
    std::fs::copy(stdio_fixture::fixture_path(), &copy).unwrap();
    let settings = settings(copy.to_str().unwrap(), "confinement = \"none\"");
    let client = client(&settings);
    let approved = digest(&settings);
    client.set_launch_approved(Some(approved.clone())).await;
    call(&client, "alice", "echo", json!({"text": "x"})).await.unwrap();
    // Same path, other bytes (still a runnable fixture: bytes appended to the ELF).
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes.extend_from_slice(b"other bytes");
    let replaced = dir.path().join("fixture.new");
    std::fs::write(&replaced, bytes).unwrap();
    std::fs::set_permissions(&replaced, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::rename(&replaced, &copy).unwrap();
    let refused = call(&client, "bob", "echo", json!({"text": "x"})).await;
    assert!(matches!(refused, Err(UpstreamError::Refused(_))), "{refused:?}");
    assert_ne!(digest(&settings), approved, "the bytes are part of the launch digest");
    // A process already running keeps serving until the gateway withdraws the launch.
    call(&client, "alice", "echo", json!({"text": "x"})).await.unwrap();
}

#[tokio::test]
async fn a_legacy_server_is_initialized_in_every_process() {
    let fixture = stdio_fixture::fixture_path();
    let settings = settings(fixture.to_str().unwrap(), "confinement = \"none\"\nargs = [\"--legacy\"]");
    let client = client(&settings);
    client.set_launch_approved(Some(digest(&settings))).await;
    let info = client.connect().await.unwrap();
    assert_eq!(info.era.to_string(), "2025-11-25");
    for user in ["alice", "bob"] {
        assert_eq!(call(&client, user, "echo", json!({"text": user})).await.unwrap()["text"], user);
    }
    assert_eq!(client.processes(), Some(3));
}

#[tokio::test]
async fn a_2025_process_is_set_to_each_request_s_log_level() {
    let fixture = stdio_fixture::fixture_path();
    let settings = settings(fixture.to_str().unwrap(), "confinement = \"none\"\nargs = [\"--legacy\"]");
    let client = client(&settings);
    client.set_launch_approved(Some(digest(&settings))).await;
    client.connect().await.unwrap();
    // The 2026-07-28 per-request level (as the gateway's relay sends it) becomes the 2025
    // process's own with logging/setLevel, each time it changes.
    for (level, logs) in [("info", true), ("error", false), ("debug", true)] {
        let mut params = Map::new();
        params.insert("name".into(), json!("log"));
        params.insert("arguments".into(), json!({}));
        params.insert("_meta".into(), json!({ "io.modelcontextprotocol/logLevel": level }));
        let (sink, mut received) = tokio::sync::mpsc::channel(8);
        let request = UpstreamRequest {
            method: "tools/call",
            params,
            caller: CallerContext { partition: "alice", subject_token: None, user: None },
            client_capabilities: None,
            notifications: Some(sink),
            asks: None,
            cancel: CancellationToken::new(),
        };
        let UpstreamReply::Result(result) = client.request(request).await.unwrap() else { panic!("a result") };
        assert_eq!(result["structuredContent"]["level"], level, "the process's level");
        assert_eq!(result["structuredContent"]["logged"], logs, "{level}");
        let message = received.try_recv().ok();
        assert_eq!(message.is_some(), logs, "{level}: {message:?}");
        if let Some(message) = message {
            assert_eq!(message["method"], "notifications/message");
            assert_eq!(message["params"]["data"], "logged");
        }
    }
}

#[tokio::test]
async fn a_confined_process_runs_as_its_own_uid_without_the_gateway_environment() {
    if !std::path::Path::new("/usr/bin/bwrap").exists() {
        panic!("bubblewrap is required for the confinement tests (scripts/test installs it)");
    }
    let fixture = stdio_fixture::fixture_path();
    let settings = settings(fixture.to_str().unwrap(), "");
    let client = client(&settings);
    client.set_launch_approved(Some(digest(&settings))).await;
    let me = call(&client, "alice", "whoami", json!({})).await.unwrap();
    assert_eq!(me["pid"], 2, "its own PID namespace (bubblewrap's init is 1): {me}");
    // bubblewrap sets PWD for --chdir; nothing of the gateway's environment arrives.
    assert_eq!(me["env"], json!(["HOME", "PATH", "PWD", "TMPDIR"]), "a cleared environment: {me}");
    if rustix::process::geteuid().is_root() {
        let uid = me["uid"].as_u64().unwrap();
        assert!(uid >= 600_000, "an unprivileged uid of its own: {me}");
        let other = call(&client, "bob", "whoami", json!({})).await.unwrap();
        assert_ne!(other["uid"], me["uid"], "one uid per process");
    }
}

#[tokio::test]
async fn a_stderr_line_without_end_is_read_under_its_cap_and_the_rest_counted() {
    let settings = unconfined("");
    let client = client(&settings);
    client.set_launch_approved(Some(digest(&settings))).await;
    let bytes: u64 = 10 * 1024 * 1024;
    let wrote = call(&client, "alice", "noise", json!({"stderr_bytes": bytes})).await.unwrap();
    assert_eq!(wrote["stderr_bytes"], bytes);
    // One line, never ended: its first bytes are kept (and logged), the rest discarded as read.
    let kept = u64::try_from(palisade_gateway::upstream::MAX_STDERR_LINE).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client.health().dropped.stderr_bytes < bytes - kept {
        assert!(std::time::Instant::now() < deadline, "{:?}", client.health().dropped);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(client.health().dropped.stderr_bytes, bytes - kept);
    assert_eq!(call(&client, "alice", "echo", json!({"text": "still here"})).await.unwrap()["text"], "still here");
}
