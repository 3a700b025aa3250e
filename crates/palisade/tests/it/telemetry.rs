//! OpenTelemetry trace export, end to end: the real binary exports one span per request over
//! OTLP/HTTP to a test receiver; each span's trace id is the request's audit trace id; a valid
//! `_meta.traceparent` is continued, a malformed one ignored; nothing secret is exported.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue as ProtoAnyValue, KeyValue};
use prost::Message as _;
use serde_json::{Value, json};

use crate::harness::{Palisade, send, tool_call, with_meta};

/// A test OTLP/HTTP receiver on 127.0.0.1:0: keeps every `POST /v1/traces` body with its headers
/// and answers with an empty (successful) `ExportTraceServiceResponse`.
struct TestOtlpReceiver {
    base_url: String,
    received: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
}

impl TestOtlpReceiver {
    async fn start() -> Self {
        let received: Arc<Mutex<Vec<(HeaderMap, Bytes)>>> = Arc::default();
        let store = received.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let store = store.clone();
                async move {
                    store.lock().unwrap().push((headers, body));
                    ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { base_url, received }
    }

    fn requests(&self) -> Vec<(HeaderMap, Bytes)> {
        self.received.lock().unwrap().clone()
    }

    /// Every exported span with its resource attributes, decoded.
    fn spans(&self) -> Vec<(BTreeMap<String, String>, ExportedSpan)> {
        let mut spans = Vec::new();
        for (_, body) in self.requests() {
            let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf ExportTraceServiceRequest");
            for resource_spans in request.resource_spans {
                let resource = attributes(&resource_spans.resource.map(|r| r.attributes).unwrap_or_default());
                for scope_spans in resource_spans.scope_spans {
                    for span in scope_spans.spans {
                        spans.push((
                            resource.clone(),
                            ExportedSpan {
                                trace_id: hex(&span.trace_id),
                                parent_span_id: hex(&span.parent_span_id),
                                name: span.name,
                                attributes: attributes(&span.attributes),
                                events: span
                                    .events
                                    .iter()
                                    .map(|e| (e.name.clone(), attributes(&e.attributes)))
                                    .collect(),
                            },
                        ));
                    }
                }
            }
        }
        spans
    }
}

#[derive(Debug)]
struct ExportedSpan {
    trace_id: String,
    parent_span_id: String,
    name: String,
    attributes: BTreeMap<String, String>,
    events: Vec<(String, BTreeMap<String, String>)>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    let text = |value: &Option<ProtoAnyValue>| match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    };
    list.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect()
}

fn dev_token(server: &Palisade, scope: &str) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["dev", "token", "--subject", SUBJECT, "--tenant", TENANT, "--client", CLIENT, "--scope", scope])
        .envs([("PALISADE_DATA_DIR", server.data_dir.path()), ("PALISADE_LISTEN", "127.0.0.1:0")])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// A request with `_meta.traceparent` set.
fn traced_call(
    server: &Palisade,
    token: &str,
    tool: &str,
    arguments: Value,
    traceparent: &str,
) -> reqwest::RequestBuilder {
    let mut params = with_meta(json!({ "name": tool, "arguments": arguments }), json!({}));
    params["_meta"]["traceparent"] = json!(traceparent);
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
    tool_call(server, token, tool, json!({})).body(body.to_string())
}

const SUBJECT: &str = "subject-canary-4e1f";
const TENANT: &str = "tenant-canary-90ab";
const CLIENT: &str = "client-canary-77cd";
const ARGUMENT: &str = "argument-canary-5d1e";
const COLLECTOR_SECRET: &str = "collector-secret-canary-b3a2";
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

// Multi-threaded: the receiver must keep serving while `terminate` blocks this thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_exported_as_spans_that_join_the_audit_log() {
    let receiver = TestOtlpReceiver::start().await;
    let authorization = format!("authorization=Bearer {COLLECTOR_SECRET}");
    let mut server = Palisade::start_app_env(
        "demo",
        &[],
        &[
            ("PALISADE_TELEMETRY_OTLP_ENDPOINT", receiver.base_url.as_str()),
            ("PALISADE_TELEMETRY_OTLP_HEADERS", authorization.as_str()),
            ("PALISADE_TELEMETRY_SERVICE_NAME", "palisade-it"),
            // Spans leave only at shutdown: the flush is what this test sees.
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    );
    let token = dev_token(&server, "shop:read shop:basket");
    let reader = dev_token(&server, "shop:read");

    // A fresh trace.
    let search = send(tool_call(&server, &token, "catalog_search", json!({ "query": ARGUMENT }))).await;
    assert_eq!(search.status, 200);
    // A handle: minted by one call, used by the next.
    let created = send(tool_call(&server, &token, "basket_create", json!({}))).await;
    let handle = created.result()["structuredContent"]["basket"].as_str().unwrap().to_owned();
    let viewed = send(tool_call(&server, &token, "basket_view", json!({ "basket": handle }))).await;
    assert_eq!(viewed.status, 200);
    // The caller's trace, continued.
    let valid = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let continued = send(traced_call(&server, &token, "product_get", json!({ "sku": "TEA-001" }), &valid)).await;
    assert_eq!(continued.result()["structuredContent"]["sku"], "TEA-001");
    // A malformed traceparent (uppercase hex) is ignored, never an error.
    let malformed = format!("00-{}-{CALLER_SPAN}-01", "4BF92F3577B34DA6A3CE929D0E0E4737");
    let ignored = send(traced_call(&server, &token, "catalog_search", json!({}), &malformed)).await;
    assert_eq!(ignored.status, 200);
    // A refusal: a read-only token cannot create a basket.
    let refused = send(tool_call(&server, &reader, "basket_create", json!({}))).await;
    assert_eq!(refused.status, 403);

    assert!(receiver.requests().is_empty(), "nothing is exported before the batch is due or shutdown");
    assert!(server.terminate().success());
    for _ in 0..50 {
        if !receiver.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The collector credentials travel in the header, and only there.
    let requests = receiver.requests();
    assert!(!requests.is_empty(), "the spans are flushed at shutdown");
    for (headers, _) in &requests {
        assert_eq!(headers["authorization"], format!("Bearer {COLLECTOR_SECRET}").as_str());
        assert_eq!(headers["content-type"], "application/x-protobuf");
    }
    // No token, handle, argument value, identifier or collector secret in any exported byte.
    let exported: Vec<u8> = requests.iter().flat_map(|(_, body)| body.to_vec()).collect();
    let exported = String::from_utf8_lossy(&exported);
    for secret in
        [token.as_str(), reader.as_str(), handle.as_str(), ARGUMENT, SUBJECT, TENANT, CLIENT, COLLECTOR_SECRET]
    {
        assert!(!exported.contains(secret), "{secret} must not be exported");
    }

    let spans = receiver.spans();
    let audit = {
        let url = format!("sqlite:{}/palisade.db", server.data_dir.path());
        let store = palisade_store::open_store(&url).await.unwrap();
        store.recent(1000).await.unwrap()
    };
    let requests: Vec<&ExportedSpan> = spans.iter().map(|(_, span)| span).filter(|s| s.name == "mcp.request").collect();
    assert_eq!(requests.len(), 6, "one span per request: {spans:#?}");
    for (resource, _) in &spans {
        assert_eq!(resource["service.name"], "palisade-it");
    }
    let find = |operation: &str, decision: &str| -> &ExportedSpan {
        requests
            .iter()
            .find(|s| s.attributes["palisade.operation"] == operation && s.attributes["palisade.decision"] == decision)
            .unwrap_or_else(|| panic!("a span for {operation} ({decision}): {requests:#?}"))
    };
    // Every span's trace id is its request's audit trace id.
    for span in &requests {
        assert_eq!(span.attributes["mcp.method.name"], "tools/call");
        let operation = &span.attributes["palisade.operation"];
        let record = audit.iter().find(|r| r.record.trace_id == span.trace_id).unwrap_or_else(|| {
            panic!("an audit record with trace id {} ({operation})", span.trace_id);
        });
        assert_eq!(&record.record.operation, operation);
        assert_eq!(record.record.decision.as_str(), span.attributes["palisade.decision"]);
        assert_eq!(record.record.stage, span.attributes["palisade.stage"]);
        // The decision is also an event of the span.
        assert!(span.events.iter().any(|(name, attrs)| name == "decision" && attrs["stage"] == record.record.stage));
    }
    let fresh = find("tools/call:catalog_search", "allow");
    assert!(fresh.parent_span_id.is_empty(), "a fresh trace has no parent");
    assert_ne!(fresh.trace_id, CALLER_TRACE);

    let continued = find("tools/call:product_get", "allow");
    assert_eq!(continued.trace_id, CALLER_TRACE);
    assert_eq!(continued.parent_span_id, CALLER_SPAN);

    let ignored: Vec<&&ExportedSpan> =
        requests.iter().filter(|s| s.attributes["palisade.operation"] == "tools/call:catalog_search").collect();
    assert_eq!(ignored.len(), 2);
    for span in ignored {
        assert!(span.parent_span_id.is_empty(), "a malformed traceparent is ignored");
        assert_ne!(span.trace_id, CALLER_TRACE);
        assert_ne!(span.trace_id, "4bf92f3577b34da6a3ce929d0e0e4737");
    }

    let denied = find("tools/call:basket_create", "deny");
    assert_eq!(denied.attributes["palisade.stage"], "authorize");
    let code = refused.error_code();
    assert_eq!(denied.attributes["rpc.jsonrpc.error_code"], code.to_string());
    assert!(!find("tools/call:basket_create", "allow").attributes.contains_key("rpc.jsonrpc.error_code"));
}

fn palisade(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).envs(envs.iter().copied()).output().unwrap()
}

#[test]
fn bad_telemetry_settings_exit_2_naming_the_key_and_never_echo_header_values() {
    let dir = crate::harness::TempDir::new();
    let data_dir = dir.path();
    // `serve` checks them before it starts anything.
    for (key, value, named) in [
        ("PALISADE_TELEMETRY_OTLP_ENDPOINT", "ftp://collector:4318", "telemetry.otlp_endpoint"),
        ("PALISADE_TELEMETRY_OTLP_ENDPOINT", "collector:4318", "telemetry.otlp_endpoint"),
        ("PALISADE_TELEMETRY_SAMPLING_RATIO", "1.5", "telemetry.sampling_ratio"),
        ("PALISADE_TELEMETRY_OTLP_HEADERS", "authorization Bearer header-canary", "PALISADE_TELEMETRY_OTLP_HEADERS"),
        ("PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES", "maybe", "PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES"),
    ] {
        let output = palisade(
            &["serve", "--app", "conformance", "--listen", "127.0.0.1:0", "--data-dir", data_dir],
            &[("PALISADE_TELEMETRY_OTLP_ENDPOINT", "http://127.0.0.1:4318"), (key, value)],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{key}={value}: {stderr}");
        assert!(stderr.contains(named), "{key}={value}: {stderr}");
        assert!(!stderr.contains("header-canary"), "{stderr}");
    }
    let file = dir.0.join("palisade.toml");
    std::fs::write(&file, "[telemetry]\notlp_endpoint = \"unix:///run/collector.sock\"\n").unwrap();
    let output = palisade(&["config", "check", file.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("telemetry.otlp_endpoint"));

    // A good one: `config check` shows the traces URL and the header names, not their values.
    std::fs::write(&file, "[telemetry]\notlp_endpoint = \"https://otel.example.com:4318\"\n").unwrap();
    let headers = [("PALISADE_TELEMETRY_OTLP_HEADERS", "authorization=Bearer header-canary")];
    let output = palisade(&["config", "check", file.to_str().unwrap()], &headers);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("https://otel.example.com:4318/v1/traces"), "{stdout}");
    assert!(stdout.contains("authorization") && !stdout.contains("header-canary"), "{stdout}");
}

/// One stdio `tools/call` of the conformance app carrying the caller's `traceparent`, with
/// `envs` added; returns the one exported span and the audit log.
async fn stdio_traced_call(envs: &[(&str, &str)]) -> (ExportedSpan, Vec<palisade_store::StoredAuditRecord>) {
    use std::io::Write as _;
    let receiver = TestOtlpReceiver::start().await;
    let data_dir = crate::harness::TempDir::new();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["serve", "--app", "conformance", "--stdio", "--data-dir", data_dir.path()])
        .envs([("PALISADE_TELEMETRY_OTLP_ENDPOINT", receiver.base_url.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "600000")])
        .envs(envs.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut params = with_meta(json!({ "name": "test_simple_text" }), json!({}));
    params["_meta"]["traceparent"] = json!(format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"));
    let frame = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{frame}").unwrap();
    drop(stdin);
    let output = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();
    assert!(output.status.success());
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(reply.get("result").is_some(), "{reply}");

    let mut spans = receiver.spans();
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let span = spans.remove(0).1;
    assert_eq!(span.attributes["palisade.operation"], "tools/call:test_simple_text");
    let audit = {
        let store = palisade_store::open_store(&format!("sqlite:{}/palisade.db", data_dir.path())).await.unwrap();
        store.recent(100).await.unwrap()
    };
    (span, audit)
}

/// stdio carries the same `_meta.traceparent`, and the exit on EOF flushes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_requests_continue_the_callers_trace_and_flush_on_exit() {
    let (span, audit) = stdio_traced_call(&[]).await;
    assert_eq!((span.trace_id.as_str(), span.parent_span_id.as_str()), (CALLER_TRACE, CALLER_SPAN));
    assert!(
        audit.iter().any(|r| r.record.trace_id == CALLER_TRACE && r.record.operation == "tools/call:test_simple_text")
    );
}

/// With `continue_incoming_traces = false` the caller's trace context is ignored: the request
/// starts a trace of its own, and the caller does not choose its audit trace id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_trace_context_is_ignored_when_continuing_is_off() {
    let (span, audit) = stdio_traced_call(&[("PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES", "false")]).await;
    assert_ne!(span.trace_id, CALLER_TRACE);
    assert!(span.parent_span_id.is_empty(), "no parent from the caller");
    assert!(audit.iter().all(|r| r.record.trace_id != CALLER_TRACE));
    assert!(
        audit.iter().any(|r| r.record.trace_id == span.trace_id && r.record.operation == "tools/call:test_simple_text")
    );
}
