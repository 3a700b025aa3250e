//! `palisade verify`, through the binary, against the real `@modelcontextprotocol/server-everything`
//! (2025-11-25 only, streamable HTTP, no authentication), started as `scripts/interop` leg j
//! starts it: one line says it does not speak 2026-07-28 and the checks that need it are NOT
//! TESTABLE (no INCONCLUSIVE flood); its failures, which all follow from serving a request
//! with no token, are grouped under the root cause `auth.none` in the summary, JSON and
//! Markdown; the run says which program each operator command runs.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Scratch, identity, palisade_binary};

/// How long server-everything may take to listen (a bound on waiting, not an assertion).
const START_BOUND: Duration = Duration::from_secs(60);

/// server-everything in its streamable HTTP mode on a free loopback port, killed on drop.
struct Everything {
    child: Child,
    url: String,
}

impl Everything {
    fn start(log: &Path) -> Self {
        let tools = std::env::var_os("PALISADE_TEST_TOOLS").map(PathBuf::from).unwrap_or_else(|| {
            panic!(
                "PALISADE_TEST_TOOLS is not set: this test runs the real server-everything and needs the tools \
                 folder scripts/test installs (Node at bin/node, npm packages under npm/node_modules)"
            )
        });
        let node = tools.join("bin/node");
        let entry = tools.join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
        // Binds 127.0.0.1 where the server would bind every interface (it takes a port only).
        let loopback = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/loopback_only.cjs");
        for file in [&node, &entry, &loopback] {
            assert!(file.exists(), "missing {}", file.display());
        }
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let child = Command::new(&node)
            .arg("-r")
            .arg(&loopback)
            .arg(&entry)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
            .spawn()
            .unwrap();
        let mut server = Self { child, url: format!("http://127.0.0.1:{port}/mcp") };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = server.child.try_wait().unwrap();
            assert!(
                exited.is_none() && start.elapsed() < START_BOUND,
                "server-everything did not listen on {port} (exit: {exited:?}): {}",
                std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }
}

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `palisade verify URL --i-am-authorized` with two identities of two tenants and `extra`.
fn verify(scratch: &Scratch, url: &str, extra: &[&str]) -> std::process::Output {
    let alice = identity(scratch, "alice", "everything-token-alice-0123456789abcdef", "acme", "web");
    let bob = identity(scratch, "bob", "everything-token-bob-0123456789abcdefgh", "globex", "cli");
    Command::new(palisade_binary())
        .args(["verify", url, "--i-am-authorized"])
        .args(["--identity", alice.to_str().unwrap(), "--identity", bob.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn server_everything_gets_one_protocol_line_not_testable_checks_and_its_failures_under_one_root_cause() {
    let scratch = Scratch::new("everything");
    let server = Everything::start(&scratch.0.join("everything.log"));
    let json_path = scratch.0.join("report.json");
    let output = verify(
        &scratch,
        &server.url,
        &[
            "--output",
            json_path.to_str().unwrap(),
            "--disable-command",
            "true {target}",
            "--enable-command",
            "true {target}",
        ],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "its failures are not baselined\n{stdout}\n{stderr}");

    // The run says which program each command runs, before it runs.
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("--disable-command runs /") && first.ends_with("(true found on PATH)"), "{stderr}");
    assert!(stderr.contains("--enable-command runs /"), "{stderr}");

    // One line, first on stdout, says it does not speak 2026-07-28; no INCONCLUSIVE flood.
    let line = stdout.lines().next().unwrap();
    assert!(line.starts_with("the target does not speak 2026-07-28: "), "{stdout}");
    assert!(line.ends_with("; the checks that need it are NOT TESTABLE"), "{line}");
    assert_eq!(stdout.matches("the target does not speak").count(), 1, "{stdout}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(report["protocol"]["spoken"], false);
    let checks = report["checks"].as_array().unwrap();
    let with = |verdict: &str| checks.iter().filter(|c| c["verdict"] == verdict).collect::<Vec<_>>();
    let inconclusive: Vec<&Value> = with("inconclusive").into_iter().map(|c| &c["id"]).collect();
    assert!(inconclusive.is_empty(), "INCONCLUSIVE: {inconclusive:?}");
    let for_protocol = with("not_testable")
        .into_iter()
        .filter(|c| c["detail"].as_str().unwrap().starts_with("needs 2026-07-28, not spoken by the target"))
        .count();
    // The others are NOT TESTABLE for what their modules found missing (no tool, prompt or
    // resource listed on a wire the target refuses).
    assert!(for_protocol >= 50, "{for_protocol} checks not testable for the protocol\n{stdout}");
    assert!(with("not_testable").len() >= 150, "{stdout}");
    // The 2025-era session checks ran on the wire it speaks.
    let open = checks.iter().find(|c| c["id"] == "sessions.open").unwrap();
    assert_eq!(open["verdict"], "pass", "{open}");

    // Its failures follow from serving requests with no token: grouped under auth.none.
    let causes = report["root_causes"].as_array().unwrap();
    assert_eq!(causes.len(), 1, "{stdout}");
    assert_eq!(causes[0]["id"], "auth.none");
    let detail = causes[0]["detail"].as_str().unwrap();
    assert!(detail.contains("initialize without a token on the 2025-11-25 wire"), "{detail}");
    let failures: Vec<&str> = with("fail").into_iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert!(failures.contains(&"sessions.no_token") && failures.contains(&"sessions.other_identity"), "{failures:?}");
    let grouped: Vec<&str> = causes[0]["checks"].as_array().unwrap().iter().map(|id| id.as_str().unwrap()).collect();
    assert_eq!(grouped, failures, "every failure is under the root cause");
    for check in with("fail") {
        assert_eq!(check["root_cause"], "auth.none", "{check}");
    }
    // The summary: the root cause once, its checks indented under it.
    assert_eq!(stdout.matches("ROOT CAUSE auth.none").count(), 1, "{stdout}");
    let (_, under) = stdout.split_once("ROOT CAUSE auth.none").unwrap();
    for id in &failures {
        assert!(under.contains(&format!("\n  {id} ")), "{id} not under the root cause\n{stdout}");
    }

    // Markdown (the sessions module alone): the head (target, date, version, verdicts), then the root
    // cause's section before the other checks.
    let markdown_path = scratch.0.join("report.md");
    let output = verify(
        &scratch,
        &server.url,
        &["--module", "sessions", "--format", "markdown", "--output", markdown_path.to_str().unwrap()],
    );
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
    let markdown = std::fs::read_to_string(&markdown_path).unwrap();
    let (head, rest) = markdown.split_once("## Root cause `auth.none`").unwrap();
    for part in ["# palisade verify report", "- **Target:** ", "- **Date:** 20", "- **Verifier:** palisade-verify "] {
        assert!(head.contains(part), "{part}\n{markdown}");
    }
    assert!(head.contains("- **Verdicts:** 9 checks: "), "{markdown}");
    assert!(!head.contains("| check |"), "no table before the head ends\n{markdown}");
    let (section, _) = rest.split_once("## Other checks").unwrap();
    assert!(section.contains("| `sessions.no_token` | fail |"), "{markdown}");
}
