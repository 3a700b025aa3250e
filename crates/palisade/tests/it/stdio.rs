//! The stdio transport of the real binary: newline-delimited JSON, MCP only on stdout,
//! cancellation by notification, a line-length limit, exit on EOF.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::with_meta;

pub(crate) struct StdioServer {
    _data_dir: crate::harness::TempDir,
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl StdioServer {
    pub(crate) fn start(extra: &[&str]) -> Self {
        let data_dir = crate::harness::TempDir::new();
        let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["serve", "--app", "conformance", "--stdio", "--data-dir", data_dir.path()])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start palisade --stdio");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { _data_dir: data_dir, child, stdin, lines }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub(crate) fn request(&mut self, id: Value, method: &str, params: Value) {
        let frame = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": with_meta(params, json!({})) });
        self.send(&frame.to_string());
    }

    /// The next stdout line, which must be one JSON message.
    pub(crate) fn next(&self, timeout: Duration) -> Option<Value> {
        let line = self.lines.recv_timeout(timeout).ok()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|_| panic!("stdout carried a non-JSON line: {line:?}")))
    }

    fn next_response(&self) -> Value {
        loop {
            let frame = self.next(Duration::from_secs(10)).expect("a message");
            if frame.get("method").is_none() {
                return frame;
            }
        }
    }
}

impl Drop for StdioServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn requests_notifications_and_errors_over_stdio() {
    let mut server = StdioServer::start(&[]);
    server.request(json!("d"), "server/discover", json!({}));
    let discover = server.next_response();
    assert_eq!(discover["id"], "d");
    crate::schema::check_response("server/discover", &discover);

    let mut params = with_meta(json!({ "name": "test_tool_with_progress" }), json!({}));
    params["_meta"]["progressToken"] = json!("p");
    server.send(&json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params }).to_string());
    let mut progress = 0;
    let response = loop {
        let frame = server.next(Duration::from_secs(10)).expect("frame");
        if frame["method"] == "notifications/progress" {
            crate::schema::check_notification(&frame);
            progress += 1;
        } else {
            break frame;
        }
    };
    assert_eq!(progress, 3);
    crate::schema::check_response("tools/call", &response);

    server.send("{not json");
    assert_eq!(server.next_response()["error"]["code"], -32700);
    server.send(r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#);
    assert_eq!(server.next_response()["error"]["code"], -32600);
    server.request(json!(4), "ping", json!({}));
    assert_eq!(server.next_response()["error"]["code"], -32601);
    // No headers on stdio: no -32020, the version still matters.
    let old = json!({ "jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": { "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2025-01-01", "io.modelcontextprotocol/clientCapabilities": {} } } });
    server.send(&old.to_string());
    assert_eq!(server.next_response()["error"]["code"], -32022);
}

#[test]
fn cancellation_suppresses_the_response() {
    let mut server = StdioServer::start(&[]);
    server.request(json!(10), "tools/call", json!({ "name": "test_slow", "arguments": { "ms": 30000 } }));
    std::thread::sleep(Duration::from_millis(200));
    server.send(&json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 10, "reason": "test" } }).to_string());
    server.request(json!(11), "tools/list", json!({}));
    let next = server.next_response();
    assert_eq!(next["id"], 11, "the cancelled request gets no response");
    assert!(server.next(Duration::from_millis(500)).is_none());
}

#[test]
fn listen_over_stdio_ends_gracefully_at_eof() {
    let mut server = StdioServer::start(&[]);
    server.request(json!("l"), "subscriptions/listen", json!({ "notifications": { "toolsListChanged": true } }));
    let ack = server.next(Duration::from_secs(5)).expect("ack");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "l");
    server.request(json!(1), "tools/call", json!({ "name": "test_trigger_tool_change" }));
    let mut saw_event = false;
    for _ in 0..2 {
        let frame = server.next(Duration::from_secs(5)).expect("frame");
        if frame["method"] == "notifications/tools/list_changed" {
            assert_eq!(frame["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "l");
            saw_event = true;
        }
    }
    assert!(saw_event);
    // EOF: the listen ends with its complete result and the process exits 0.
    drop(server.stdin.take());
    let last = server.next(Duration::from_secs(5)).expect("complete result");
    assert_eq!(last["id"], "l");
    assert_eq!(last["result"]["resultType"], "complete");
    let status = server.child.wait().unwrap();
    assert!(status.success());
}

#[test]
fn an_overlong_line_is_refused_and_the_next_one_served() {
    let mut server = StdioServer::start(&["--max-body-bytes", "1024"]);
    server.send(&format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"pad":"{}"}}}}"#,
        "x".repeat(5000)
    ));
    let refused = server.next_response();
    assert_eq!(refused["error"]["code"], -32600);
    assert_eq!(refused["error"]["message"], "request body too large");
    server.request(json!(2), "tools/list", json!({}));
    assert_eq!(server.next_response()["id"], 2);
}
