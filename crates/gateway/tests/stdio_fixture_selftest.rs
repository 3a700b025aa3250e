//! Self-test of the hostile stdio fixture (`examples/stdio_fixture.rs`), run directly and
//! unconfined: its wire (2026-07-28 and `--legacy`), its tools, and that `probe` reports honest
//! observations when nothing stops it — so a failed attempt under the sandbox means the sandbox.

#[path = "support/stdio_fixture.rs"]
mod stdio_fixture;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Generous bound that only proves "did not hang".
const HANG: Duration = Duration::from_secs(60);

/// One running fixture with its stdin and a reader thread over its stdout lines.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: u64,
}

impl Running {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(stdio_fixture::fixture_path());
        command.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("start the fixture");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, stdin, lines, next_id: 1 }
    }

    fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(line.as_bytes()).expect("write to the fixture");
        stdin.write_all(b"\n").expect("write to the fixture");
        stdin.flush().expect("flush to the fixture");
    }

    fn read_message(&self) -> Value {
        let line = self.lines.recv_timeout(HANG).expect("the fixture answered");
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("stdout carries JSON only ({error}): {line}"))
    }

    /// Sends a request and returns the whole response, checking it answers this request's id.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_line(&message.to_string());
        let response = self.read_message();
        assert_eq!(response["jsonrpc"], "2.0", "{response}");
        assert_eq!(response["id"], json!(id), "{response}");
        response
    }

    fn result(&mut self, method: &str, params: Value) -> Value {
        let response = self.request(method, params);
        assert!(response.get("error").is_none(), "{method} failed: {response}");
        response["result"].clone()
    }

    fn error_code(&mut self, method: &str, params: Value) -> i64 {
        let response = self.request(method, params);
        assert!(response.get("result").is_none(), "{method} should fail: {response}");
        assert!(response["error"]["message"].as_str().is_some_and(|text| !text.is_empty()), "{response}");
        response["error"]["code"].as_i64().expect("an integer error code")
    }

    /// Calls a tool and returns its report, checking the text content is the same report.
    fn call(&mut self, name: &str, arguments: Value) -> Value {
        let result = self.result("tools/call", json!({"name": name, "arguments": arguments}));
        let report = result["structuredContent"].clone();
        assert_eq!(result["content"][0]["type"], "text", "{result}");
        let text = result["content"][0]["text"].as_str().expect("text content");
        let parsed: Value = serde_json::from_str(text).expect("the text content is the report's JSON");
        assert_eq!(parsed, report);
        report
    }

    fn call_error(&mut self, name: &str, arguments: Value) -> i64 {
        self.error_code("tools/call", json!({"name": name, "arguments": arguments}))
    }

    /// Closes stdin and waits (bounded) for the fixture to exit by itself.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + HANG;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the fixture") {
                return status;
            }
            assert!(Instant::now() < deadline, "the fixture did not exit on stdin EOF");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn meta() -> Value {
    json!({"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }})
}

#[test]
fn the_modern_wire_answers_discover_ping_and_lists_every_tool() {
    let mut fixture = Running::start(&[], &[]);
    let discover = fixture.result("server/discover", meta());
    assert_eq!(
        discover,
        json!({
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}, "logging": {}},
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "stdio-fixture", "version": "1"}},
        })
    );
    assert_eq!(fixture.result("ping", json!({})), json!({}));
    assert_eq!(fixture.error_code("initialize", json!({"protocolVersion": "2025-11-25"})), -32601);
    assert_eq!(fixture.error_code("resources/list", meta()), -32601);

    // A notification gets no answer: the next line answers the next request.
    fixture.send_line(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#);
    let list = fixture.result("tools/list", meta());
    assert_eq!(list["resultType"], "complete");
    let mut names: Vec<&str> =
        list["tools"].as_array().expect("tools").iter().map(|t| t["name"].as_str().expect("name")).collect();
    names.sort_unstable();
    assert_eq!(names, ["echo", "log", "noise", "probe", "recall", "remember", "spin", "whoami"]);
    for tool in list["tools"].as_array().expect("tools") {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
    }

    // Malformed lines get JSON-RPC errors, and the fixture keeps serving.
    fixture.send_line("{not json");
    let parse = fixture.read_message();
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    fixture.send_line("[1,2]");
    let invalid = fixture.read_message();
    assert_eq!(invalid["error"]["code"], -32600, "{invalid}");

    let echo = fixture.call("echo", json!({"text": "hello, fixture"}));
    assert_eq!(echo, json!({"text": "hello, fixture"}));
    assert_eq!(fixture.call("spin", json!({"secs": 0})), json!({"spun_secs": 0}));
    assert_eq!(fixture.call("spin", json!({"secs": 1})), json!({"spun_secs": 1}));
    assert!(fixture.finish().success());
}

#[test]
fn the_legacy_wire_initializes_and_refuses_discover() {
    let mut fixture = Running::start(&["--legacy"], &[]);
    assert_eq!(fixture.error_code("server/discover", meta()), -32601);
    let init = fixture.result(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
    );
    assert_eq!(
        init,
        json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}, "logging": {}},
            "serverInfo": {"name": "stdio-fixture", "version": "1"},
        })
    );
    let newest = fixture.result("initialize", json!({"protocolVersion": "2025-11-25"}));
    assert_eq!(newest["protocolVersion"], "2025-11-25");
    let unknown = fixture.result("initialize", json!({"protocolVersion": "1999-01-01"}));
    assert_eq!(unknown["protocolVersion"], "2025-11-25");
    fixture.send_line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let list = fixture.result("tools/list", json!({}));
    assert!(list.get("resultType").is_none(), "the 2025 wire has no resultType: {list}");
    assert_eq!(list["tools"].as_array().expect("tools").len(), 8);
    assert_eq!(fixture.call("echo", json!({"text": "old"})), json!({"text": "old"}));
    assert!(fixture.finish().success());
}

#[test]
fn whoami_reports_this_process_and_remember_is_per_process() {
    let mut first = Running::start(&[], &[("FIXTURE_SELFTEST_VISIBLE", "1")]);
    let me = first.call("whoami", json!({}));
    assert_eq!(me["pid"], json!(first.child.id()), "{me}");
    assert_eq!(me["uid"], json!(rustix::process::getuid().as_raw()), "{me}");
    assert_eq!(me["gid"], json!(rustix::process::getgid().as_raw()), "{me}");
    assert_eq!(me["ppid"], json!(std::process::id()), "{me}");
    let env: Vec<&str> = me["env"].as_array().expect("env").iter().map(|n| n.as_str().expect("name")).collect();
    assert!(env.contains(&"FIXTURE_SELFTEST_VISIBLE"), "{me}");
    assert!(env.windows(2).all(|pair| pair[0] <= pair[1]), "sorted: {me}");
    let cwd = std::env::current_dir().expect("cwd");
    assert_eq!(me["cwd"], json!(cwd.to_string_lossy()), "{me}");
    assert!(me["hostname"].as_str().is_some_and(|name| !name.is_empty() && !name.starts_with("error")), "{me}");

    assert_eq!(first.call("recall", json!({})), json!({"value": null}));
    assert_eq!(first.call("remember", json!({"value": "alice's secret"})), json!({"stored": true}));
    assert_eq!(first.call("recall", json!({})), json!({"value": "alice's secret"}));

    let mut second = Running::start(&[], &[]);
    assert_eq!(second.call("recall", json!({})), json!({"value": null}));
    assert_ne!(second.call("whoami", json!({}))["pid"], me["pid"]);
    assert!(second.finish().success());
    assert!(first.finish().success());
}

#[test]
fn probe_reports_what_succeeds_when_nothing_confines_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let readable = dir.path().join("readable.txt");
    std::fs::write(&readable, "visible bytes").expect("write the readable file");
    let written = dir.path().join("written.txt");
    let link = dir.path().join("link");
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
    let open_port = listener.local_addr().expect("address").to_string();
    let closed_port = {
        let closed = TcpListener::bind("127.0.0.1:0").expect("bind");
        closed.local_addr().expect("address").to_string()
    };
    let mut victim = Command::new("/bin/sleep").arg("30").spawn().expect("start a victim process");
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();

    let mut fixture = Running::start(&[], &[("FIXTURE_SELFTEST_SET", "four")]);
    let report = fixture.call(
        "probe",
        json!({
            "tcp": [open_port, closed_port, "not-an-address"],
            "resolve": [format!("localhost:{}", listener.local_addr().expect("address").port())],
            "read": [path(&readable), path(&dir.path().join("missing"))],
            "write": [path(&written), path(&dir.path().join("no-such-dir").join("f"))],
            "list": [path(dir.path())],
            "env": ["FIXTURE_SELFTEST_SET", "FIXTURE_SELFTEST_UNSET"],
            "kill": [victim.id()],
            "fork": 3,
            "alloc_mib": 8,
            "symlink": [{"link": path(&link), "target": path(&readable)}],
        }),
    );

    assert_eq!(report["tcp"][&open_port]["ok"], true, "{report}");
    assert_eq!(report["tcp"][&closed_port]["ok"], false, "{report}");
    assert_eq!(report["tcp"]["not-an-address"]["ok"], false, "{report}");
    let resolved = report["resolve"].as_object().expect("resolve entries").values().next().expect("one entry");
    assert_eq!(resolved["ok"], true, "{report}");

    let read = &report["read"][path(&readable).as_str()];
    assert_eq!(read["ok"], true, "{report}");
    assert_eq!(read["detail"], "visible bytes", "{report}");
    assert_eq!(report["read"][path(&dir.path().join("missing")).as_str()]["ok"], false, "{report}");

    assert_eq!(report["write"][path(&written).as_str()]["ok"], true, "{report}");
    assert_eq!(std::fs::read_to_string(&written).expect("the fixture wrote the file"), "x");
    assert_eq!(report["write"][path(&dir.path().join("no-such-dir").join("f")).as_str()]["ok"], false, "{report}");

    let listed = &report["list"][path(dir.path()).as_str()];
    assert_eq!(listed["ok"], true, "{report}");
    assert!(listed["names"].as_array().expect("names").contains(&json!("readable.txt")), "{report}");

    assert_eq!(report["env"]["FIXTURE_SELFTEST_SET"]["ok"], true, "{report}");
    assert_eq!(report["env"]["FIXTURE_SELFTEST_SET"]["len"], 4, "{report}");
    assert!(!report.to_string().contains("four"), "env reports only a length: {report}");
    assert_eq!(report["env"]["FIXTURE_SELFTEST_UNSET"]["ok"], false, "{report}");

    assert_eq!(report["kill"][victim.id().to_string().as_str()]["ok"], true, "{report}");
    let status = victim.wait().expect("reap the victim");
    assert!(!status.success(), "the victim was signalled: {status}");

    assert_eq!(report["fork"]["ok"], true, "{report}");
    assert_eq!(report["fork"]["started"], 3, "{report}");
    assert_eq!(report["alloc_mib"]["ok"], true, "{report}");

    let through = &report["symlink"][path(&link).as_str()];
    assert_eq!(through["ok"], true, "{report}");
    assert_eq!(through["create"]["ok"], true, "{report}");
    assert_eq!(through["read"]["detail"], "visible bytes", "{report}");

    // Only the attempts asked for run.
    let only_env = fixture.call("probe", json!({"env": ["FIXTURE_SELFTEST_SET"]}));
    assert_eq!(only_env.as_object().expect("report").keys().collect::<Vec<_>>(), ["env"]);
    // A failed attempt does not stop the later ones.
    let mixed = fixture.call("probe", json!({"read": [path(&dir.path().join("missing")), path(&readable)]}));
    assert_eq!(mixed["read"][path(&readable).as_str()]["ok"], true, "{mixed}");
    assert!(fixture.finish().success());
}

#[test]
fn wrong_arguments_get_invalid_params_and_change_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let untouched = dir.path().join("untouched");
    let mut fixture = Running::start(&[], &[]);
    assert_eq!(fixture.call_error("probe", json!({"tcp": "127.0.0.1:1"})), -32602);
    assert_eq!(fixture.call_error("probe", json!({"read": [1]})), -32602);
    // The wrong `fork` is found before the well-typed `write` runs.
    assert_eq!(fixture.call_error("probe", json!({"write": [untouched.to_string_lossy()], "fork": "3"})), -32602);
    assert!(!untouched.exists());
    assert_eq!(fixture.call_error("probe", json!({"kill": [0]})), -32602);
    assert_eq!(fixture.call_error("probe", json!({"kill": [-1]})), -32602);
    assert_eq!(fixture.call_error("probe", json!({"symlink": [{"link": "/x"}]})), -32602);
    assert_eq!(fixture.call_error("probe", json!({"teleport": []})), -32602);
    assert_eq!(fixture.call_error("remember", json!({})), -32602);
    assert_eq!(fixture.call_error("remember", json!({"value": 5})), -32602);
    assert_eq!(fixture.call_error("spin", json!({"secs": "a"})), -32602);
    assert_eq!(fixture.call_error("echo", json!({})), -32602);
    assert_eq!(fixture.call_error("nope", json!({})), -32602);
    assert_eq!(fixture.error_code("tools/call", json!({"arguments": {}})), -32602);
    assert_eq!(fixture.error_code("tools/call", json!({"name": "echo", "arguments": []})), -32602);
    assert_eq!(fixture.error_code("tools/list", json!([1])), -32602);
    assert_eq!(fixture.call("recall", json!({})), json!({"value": null}));
    assert!(fixture.finish().success());
}

#[test]
fn the_start_marker_records_each_start_and_a_bad_one_is_not_fatal() {
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("marker");
    let marker_text = marker.to_string_lossy().into_owned();
    let first = Running::start(&[], &[("FIXTURE_START_MARKER", &marker_text)]);
    let first_pid = first.child.id();
    let mut second = Running::start(&["--legacy"], &[("FIXTURE_START_MARKER", &marker_text)]);
    let second_pid = second.child.id();
    // Once a process answers, its marker line has been written (it is written before reading).
    assert_eq!(second.result("ping", json!({})), json!({}));
    assert!(second.finish().success());
    let mut first = first;
    assert_eq!(first.result("ping", json!({})), json!({}));
    assert!(first.finish().success());
    let text = std::fs::read_to_string(&marker).expect("the marker exists");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    let mut expected = vec![format!("started {first_pid}"), format!("started {second_pid}")];
    expected.sort_unstable();
    assert_eq!(lines, expected);

    let unwritable = dir.path().join("no-such-dir").join("marker");
    let mut fixture = Running::start(&[], &[("FIXTURE_START_MARKER", &unwritable.to_string_lossy())]);
    assert_eq!(fixture.result("ping", json!({})), json!({}));
    assert!(fixture.finish().success());
    assert!(!unwritable.exists());
}
