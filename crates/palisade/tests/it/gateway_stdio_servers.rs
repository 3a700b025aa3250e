//! Real third-party stdio servers behind the gateway, each confined by bubblewrap and started
//! only after its launch and then its tools are approved: `@modelcontextprotocol/server-filesystem`
//! granted one directory (it lists and reads there, and no tool argument — `../`, an absolute
//! path, a symlink planted in the grant — returns a byte of a sibling directory's secret, of the
//! gateway's data directory or of `/etc/shadow`), a Python SDK server, and server-everything.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::gateway_boundary::GatewayUnderTest;
use crate::harness::{Exchange, Palisade, TempDir};

/// Longest a server may take to be started, listed and pinned after its launch is approved
/// (a cold Node start inside the sandbox included): a "did not hang" bound, not a timing.
const LISTING_DEADLINE: Duration = Duration::from_secs(60);

/// The tools folder scripts/test installs (Node 22 at bin/node, npm packages, the Python venv).
pub(crate) fn test_tools() -> PathBuf {
    let tools = std::env::var_os("PALISADE_TEST_TOOLS").unwrap_or_else(|| {
        panic!(
            "PALISADE_TEST_TOOLS is not set: these tests run real stdio servers and need the tools folder \
             scripts/test installs (Node 22 at bin/node, npm packages in npm/node_modules, a Python venv with mcp)"
        )
    });
    let tools = std::fs::canonicalize(&tools).unwrap_or_else(|error| panic!("PALISADE_TEST_TOOLS {tools:?}: {error}"));
    // The confined servers run as sandbox uids of their own: the folder must be reachable by
    // any uid, which a checkout under a private (0700) directory is not. Say so plainly.
    for dir in tools.ancestors() {
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(dir).unwrap().permissions());
        assert!(
            mode & 0o001 != 0,
            "PALISADE_TEST_TOOLS {} is not reachable by the sandbox uids: {} is mode {:04o} (give every uid search \
             permission, e.g. chmod o+x, or install the tools elsewhere)",
            tools.display(),
            dir.display(),
            mode & 0o7777
        );
    }
    tools
}

pub(crate) fn node_modules() -> PathBuf {
    test_tools().join("npm/node_modules")
}

pub(crate) fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// A fresh random string (hex) nobody could guess or find by accident.
fn random_marker(label: &str) -> String {
    let mut bytes = [0_u8; 16];
    aws_lc_rs::rand::fill(&mut bytes).unwrap();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{label}-{hex}")
}

/// One confined stdio `[[upstreams]]` entry (`extra`: more keys, then tables).
pub(crate) fn stdio_entry(id: &str, command: &str, args: &[&str], grants: &[&Path], extra: &str) -> String {
    let args: Vec<String> = args.iter().map(|arg| format!("{arg:?}")).collect();
    let grants: Vec<String> = grants.iter().map(|path| format!("{{ path = {:?} }}", text(path))).collect();
    format!(
        "[[upstreams]]\nid = \"{id}\"\ncommand = {command:?}\nargs = [{}]\ngrants = [{}]\nrequest_timeout_secs = 20\n{extra}\n",
        args.join(", "),
        grants.join(", ")
    )
}

/// The names `pins list --upstream ID` shows for its tools.
fn pinned_tools(gateway: &GatewayUnderTest, upstream: &str) -> Vec<String> {
    let listing = gateway.cli_ok(&["pins", "list", "--upstream", upstream]);
    listing
        .lines()
        .skip(1)
        .filter_map(|line| {
            let columns: Vec<&str> = line.split_whitespace().collect();
            (columns.len() >= 6 && columns[2] == "tool").then(|| columns[5].to_owned())
        })
        .collect()
}

/// Approves `upstream`'s launch, waits until the started server's tools `expected` are pinned,
/// approves them all, and returns alice's token once the gateway lists them.
pub(crate) async fn approve_and_serve(gateway: &GatewayUnderTest, upstream: &str, expected: &[&str]) -> String {
    let shown = gateway.cli_ok(&["upstreams", "show", upstream]);
    assert!(shown.contains("bubblewrap"), "the launch is confined: {shown}");
    gateway.cli_ok(&["upstreams", "approve", upstream, "--reviewer", "it"]);
    let deadline = Instant::now() + LISTING_DEADLINE;
    loop {
        let pinned = pinned_tools(gateway, upstream);
        if expected.iter().all(|name| pinned.iter().any(|p| p == name)) {
            break;
        }
        if Instant::now() >= deadline {
            let status = gateway.cli(&["gateway", "status"]);
            panic!(
                "{upstream}: its tools {expected:?} were never pinned (pinned {pinned:?}); status:\n{}{}",
                String::from_utf8_lossy(&status.stdout),
                String::from_utf8_lossy(&status.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    gateway.approve_all(upstream);
    let token = gateway.token("alice");
    let exposed: Vec<String> = expected.iter().map(|name| format!("{upstream}_{name}")).collect();
    gateway.wait_for_tools(&token, &exposed.iter().map(String::as_str).collect::<Vec<_>>()).await;
    token
}

/// Everything an answer carries (result or error), as one string to search.
fn everything(answer: &Exchange) -> String {
    answer.frames.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")
}

/// The text of a successful tool result (its first content item).
pub(crate) fn result_text(answer: &Exchange, what: &str) -> String {
    let result = answer.result();
    assert_ne!(result["isError"], true, "{what}: {result}");
    result["content"][0]["text"].as_str().unwrap_or_else(|| panic!("{what}: no text in {result}")).to_owned()
}

/// Whether a tool answer is a refusal: a JSON-RPC error or a tool error.
fn refused(answer: &Exchange) -> bool {
    let response = answer.response();
    response.get("error").is_some() || response["result"]["isError"] == true
}

/// Who refused a read: the server's own path check ("Access denied"), or the sandbox (the
/// file is absent from its view, or its permissions keep the sandbox's uid out). The server
/// resolves a symlink before it checks it; a target absent from the sandbox makes that
/// resolution fail with ENOENT, which it reports as "Parent directory does not exist".
fn refused_by(answer: &Exchange) -> &'static str {
    let all = everything(answer);
    if all.contains("Access denied") {
        "server"
    } else if ["ENOENT", "EACCES", "no such file", "permission denied", "does not exist"]
        .iter()
        .any(|s| all.contains(s))
    {
        "sandbox"
    } else {
        "unknown"
    }
}

/// Every way `secret` (a file's whole content) could appear in an answer: as text, and as the
/// base64 a media read would return.
fn forms_of(secret: &str) -> Vec<String> {
    let base64 = base64::engine::general_purpose::STANDARD;
    vec![secret.trim_end().to_owned(), base64.encode(secret.as_bytes()), base64.encode(secret.trim_end().as_bytes())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filesystem_server_reads_its_grant_and_nothing_else() {
    let modules = node_modules();
    let node = test_tools().join("bin/node");
    let server = modules.join("@modelcontextprotocol/server-filesystem/dist/index.js");
    // The grant, and beside it a directory the server is never given.
    let scratch = TempDir::new();
    let root = Path::new(scratch.path());
    let grant = root.join("grant");
    let sibling = root.join("sibling");
    std::fs::create_dir_all(grant.join("sub")).unwrap();
    std::fs::create_dir_all(&sibling).unwrap();
    let inside = random_marker("inside");
    std::fs::write(grant.join("hello.txt"), format!("{inside}\n")).unwrap();
    std::fs::write(grant.join("sub/inner.txt"), "inner\n").unwrap();
    let secret = random_marker("sibling-secret");
    let secret_file = sibling.join("secret.txt");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();

    let entry = stdio_entry("fs", text(&node), &[text(&server), text(&grant)], &[&grant, &modules], "");
    let mut gateway = GatewayUnderTest::new(&entry);
    let gateway_dir = Path::new(&gateway.config).parent().unwrap().to_owned();
    let data_dir = gateway_dir.join("data");
    gateway.start();
    // A file of the gateway's data directory, and the host's /etc/shadow (the test runs as root
    // or reads it as nothing).
    let canary = random_marker("data-dir-canary");
    let canary_file = data_dir.join("canary.txt");
    std::fs::write(&canary_file, format!("{canary}\n")).unwrap();
    let shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    // Symlinks planted inside the grant, pointing out of it.
    std::os::unix::fs::symlink(&secret_file, grant.join("to_secret")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", grant.join("to_shadow")).unwrap();
    std::os::unix::fs::symlink(&canary_file, grant.join("to_canary")).unwrap();
    std::os::unix::fs::symlink(&sibling, grant.join("to_sibling")).unwrap();
    std::os::unix::fs::symlink(&data_dir, grant.join("to_data")).unwrap();
    std::os::unix::fs::symlink("../sibling/secret.txt", grant.join("relative_secret")).unwrap();

    let token = approve_and_serve(
        &gateway,
        "fs",
        &["read_text_file", "read_media_file", "read_multiple_files", "list_directory", "search_files"],
    )
    .await;

    // Positive control: the grant is listed and read.
    let hello = text(&grant.join("hello.txt")).to_owned();
    let read = gateway.call(&token, "fs_read_text_file", json!({"path": hello})).await;
    assert_eq!(result_text(&read, "read inside the grant").trim(), inside, "the file inside the grant is read");
    let listed = gateway.call(&token, "fs_list_directory", json!({"path": text(&grant)})).await;
    let listing = result_text(&listed, "list the grant");
    assert!(listing.contains("hello.txt") && listing.contains("sub"), "{listing}");
    let nested = gateway.call(&token, "fs_read_text_file", json!({"path": text(&grant.join("sub/inner.txt"))})).await;
    assert_eq!(result_text(&nested, "read a nested file").trim(), "inner");

    // Every path that leads out of the grant, each way of naming it.
    let g = text(&grant);
    let root_name = root.file_name().unwrap().to_str().unwrap();
    let gateway_name = gateway_dir.file_name().unwrap().to_str().unwrap();
    let escapes: Vec<(String, &str)> = vec![
        (text(&secret_file).to_owned(), "absolute path to the sibling secret"),
        (format!("{g}/../sibling/secret.txt"), "../ to the sibling secret"),
        (format!("{g}/sub/../../sibling/secret.txt"), "../../ through a subdirectory"),
        (format!("{g}/../../{root_name}/sibling/secret.txt"), "../ out and back in"),
        ("../sibling/secret.txt".to_owned(), "relative ../ path"),
        ("/etc/shadow".to_owned(), "absolute /etc/shadow"),
        (format!("{g}/../../../../../../etc/shadow"), "../ to /etc/shadow"),
        (text(&canary_file).to_owned(), "absolute path into the data directory"),
        (format!("{g}/../../{gateway_name}/data/canary.txt"), "../ into the data directory"),
        (format!("{g}/to_secret"), "symlink in the grant to the sibling secret"),
        (format!("{g}/relative_secret"), "relative symlink in the grant to the sibling secret"),
        (format!("{g}/to_shadow"), "symlink in the grant to /etc/shadow"),
        (format!("{g}/to_canary"), "symlink in the grant into the data directory"),
        (format!("{g}/to_sibling/secret.txt"), "directory symlink in the grant to the sibling"),
        (format!("{g}/to_data/canary.txt"), "directory symlink in the grant to the data directory"),
    ];
    let dirs: Vec<(String, &str)> = vec![
        (text(&sibling).to_owned(), "the sibling directory"),
        (format!("{g}/.."), "the grant's parent"),
        (text(&data_dir).to_owned(), "the data directory"),
        (format!("{g}/to_sibling"), "a directory symlink to the sibling"),
        (format!("{g}/to_data"), "a directory symlink to the data directory"),
    ];
    let mut forbidden = forms_of(&secret);
    forbidden.extend(forms_of(&canary));
    if let Some(line) = shadow.lines().next() {
        forbidden.push(line.to_owned());
    }
    if !shadow.is_empty() {
        forbidden.push(base64::engine::general_purpose::STANDARD.encode(shadow.as_bytes()));
    }
    let assert_no_leak = |answer: &Exchange, what: &str| {
        let all = everything(answer);
        for form in &forbidden {
            assert!(!all.contains(form.as_str()), "{what}: protected bytes leaked: {all}");
        }
    };

    let mut observed = Vec::new();
    for (path, what) in &escapes {
        let answer = gateway.call(&token, "fs_read_text_file", json!({"path": path})).await;
        assert_no_leak(&answer, what);
        assert!(refused(&answer), "{what}: read_text_file {path} was not refused: {}", everything(&answer));
        let by = refused_by(&answer);
        assert_ne!(by, "unknown", "{what}: a refusal of unknown origin: {}", everything(&answer));
        observed.push(format!("{what}: refused by the {by}"));
        for (tool, arguments) in
            [("fs_read_media_file", json!({"path": path})), ("fs_read_multiple_files", json!({"paths": [path, hello]}))]
        {
            let answer = gateway.call(&token, tool, arguments).await;
            assert_no_leak(&answer, &format!("{what} ({tool})"));
        }
    }
    for (path, what) in &dirs {
        for (tool, arguments) in [
            ("fs_list_directory", json!({"path": path})),
            ("fs_search_files", json!({"path": path, "pattern": "**/*.txt"})),
            ("fs_directory_tree", json!({"path": path})),
        ] {
            let answer = gateway.call(&token, tool, arguments).await;
            assert_no_leak(&answer, &format!("{what} ({tool})"));
            let all = everything(&answer);
            assert!(
                !all.contains("secret.txt") && !all.contains("canary.txt"),
                "{what} ({tool}): a protected directory's entries were listed: {all}"
            );
        }
    }
    // Symlinks whose target is absent from the sandbox's view pass the server's own check and
    // fail in the sandbox; one whose target is visible (/etc/shadow) is refused by the server.
    let of = |what: &str| observed.iter().find(|line| line.starts_with(&format!("{what}:"))).unwrap().clone();
    assert!(of("symlink in the grant to the sibling secret").ends_with("sandbox"), "{observed:#?}");
    assert!(of("symlink in the grant into the data directory").ends_with("sandbox"), "{observed:#?}");
    assert!(of("symlink in the grant to /etc/shadow").ends_with("server"), "{observed:#?}");
    eprintln!("server-filesystem escapes:\n  {}", observed.join("\n  "));

    // The positive control still holds after every refusal.
    let again = gateway.call(&token, "fs_read_text_file", json!({"path": hello})).await;
    assert_eq!(result_text(&again, "read inside the grant again").trim(), inside);
    assert!(gateway.is_running());
    gateway.stop();
}

/// The venv's `site-packages` (it holds `mcp` 2.3.0 and what it pulls in).
fn site_packages() -> PathBuf {
    let lib = test_tools().join("py/lib");
    std::fs::read_dir(&lib)
        .unwrap_or_else(|error| panic!("{}: {error}", lib.display()))
        .map(|entry| entry.unwrap().path().join("site-packages"))
        .find(|path| path.is_dir())
        .unwrap_or_else(|| panic!("no site-packages under {}", lib.display()))
}

/// The real uid of this test process.
fn own_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|line| line.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_server_answers_over_stdio_from_its_sandbox() {
    let site = site_packages();
    let script =
        std::fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/interop/tiny_py_stdio_server.py"))
            .unwrap();
    let script_dir = script.parent().unwrap().to_owned();
    // The system interpreter (the venv's own python resolves to a directory the sandbox's uid
    // cannot traverse); the SDK comes from the venv's site-packages through PYTHONPATH.
    let entry =
        stdio_entry("py", "/usr/bin/python3", &[text(&script)], &[&site, &script_dir], "env = [\"PYTHONPATH\"]");
    let mut gateway = GatewayUnderTest::new(&entry);
    let args = ["gateway", "--config", gateway.config.as_str()];
    let server = Palisade::spawn(&args, &[("PYTHONPATH", text(&site))], TempDir::new());
    gateway.server = Some(server);

    let token = approve_and_serve(&gateway, "py", &["add", "identity"]).await;
    let sum = gateway.call(&token, "py_add", json!({"a": 2, "b": 40})).await;
    assert_eq!(result_text(&sum, "py_add"), "PY-STDIO: 2 + 40 = 42");
    let bad = gateway.call(&token, "py_add", json!({"a": "two", "b": 40})).await;
    assert!(refused(&bad), "an argument of the wrong type is refused: {}", everything(&bad));

    // It runs in the sandbox: its own host name, and a uid of its own when the gateway is root.
    let identity = result_text(&gateway.call(&token, "py_identity", json!({})).await, "py_identity");
    assert!(identity.ends_with(" host=sandbox"), "{identity}");
    let uid: u32 = identity.strip_prefix("uid=").unwrap().split(' ').next().unwrap().parse().unwrap();
    if own_uid() == 0 {
        assert!(uid >= 600_000, "a root gateway runs the server as a sandbox uid: {identity}");
        assert!(identity.contains(" gid=65534 "), "{identity}");
    } else {
        assert_eq!(uid, own_uid(), "{identity}");
    }
    assert!(gateway.is_running());
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_lists_and_echoes_over_stdio() {
    let modules = node_modules();
    let node = test_tools().join("bin/node");
    let server = modules.join("@modelcontextprotocol/server-everything/dist/index.js");
    let entry = stdio_entry("every", text(&node), &[text(&server), "stdio"], &[&modules], "");
    let mut gateway = GatewayUnderTest::new(&entry);
    // The operator's private listener, for the metrics of a real stdio server.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = std::fs::read_to_string(&gateway.config).unwrap();
    std::fs::write(&gateway.config, format!("metrics_listen = \"127.0.0.1:{port}\"\n{config}")).unwrap();
    gateway.start();
    let token = approve_and_serve(&gateway, "every", &["echo", "get-sum"]).await;
    let listed = gateway.tool_names(&token).await;
    assert!(listed.len() >= 2 && listed.iter().all(|name| name.starts_with("every_")), "{listed:?}");
    let echo = gateway.call(&token, "every_echo", json!({"message": "through the sandbox"})).await;
    assert_eq!(result_text(&echo, "every_echo"), "Echo: through the sandbox");
    let sum = gateway.call(&token, "every_get-sum", json!({"a": 20, "b": 22})).await;
    assert!(result_text(&sum, "every_get-sum").contains("42"), "{}", everything(&sum));
    // Its series: up, its running process, its calls under the tool and the upstream.
    let scrape = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().text().await.unwrap();
    let value = |series: &str| -> f64 {
        let line = scrape.lines().find(|line| line.starts_with(series)).unwrap_or_else(|| panic!("{series}: {scrape}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value(r#"palisade_upstream_up{upstream="every"}"#), 1.0);
    assert!(value(r#"palisade_upstream_processes{upstream="every"}"#) >= 1.0, "{scrape}");
    assert_eq!(value(r#"palisade_tool_calls_total{tool="every_echo",upstream="every",outcome="ok"}"#), 1.0);
    assert!(value(r#"palisade_upstream_request_duration_seconds_count{upstream="every",method="tools/call"}"#) >= 2.0);
    assert!(gateway.is_running());
    gateway.stop();
}
