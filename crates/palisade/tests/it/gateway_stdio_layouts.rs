//! Stdio servers as people install them, served confined with no hand-written grant for their
//! code: the real `@modelcontextprotocol/server-filesystem` from its `node_modules/.bin` link and
//! from an `npm install -g --prefix` layout (its `node_modules` tree found, hashed and bound
//! read-only; the interpreter its `#!/usr/bin/env node` names found on the gateway's `PATH`), the
//! Python SDK server from a virtual environment made by `python3 -m venv`, a changed dependency
//! making the launch unapproved, and a real Node server whose dependency is missing, whose cause
//! (`ERR_MODULE_NOT_FOUND`) `gateway status` and `upstreams show --start` name. README's
//! recipes (Node with `--prefix`, Python in a venv, a static binary) are run as written, only
//! their paths moved.

use serde_json::json;
use std::path::{Path, PathBuf};

use crate::gateway_boundary::GatewayUnderTest;
use crate::gateway_stdio::stdio_fixture;
use crate::gateway_stdio_servers::{approve_and_serve, node_modules, result_text, stdio_entry, test_tools, text};
use crate::harness::{Palisade, TempDir};

/// The gateway's `PATH`: the tools' Node first, then the system's.
fn gateway_path() -> String {
    format!("{}:/usr/bin:/bin", text(&test_tools().join("bin")))
}

/// Starts the gateway with [`gateway_path`] as its `PATH` (the CLI then resolves on the same
/// one), and `MCP_TOOL_TOKEN` set.
fn start(gateway: &mut GatewayUnderTest) {
    let args = ["gateway", "--config", gateway.config.as_str()];
    let envs = [("PATH", gateway_path()), ("MCP_TOOL_TOKEN", "tool-token-for-the-recipe".to_owned())];
    let envs: Vec<(&str, &str)> = envs.iter().map(|(name, value)| (*name, value.as_str())).collect();
    gateway.server = Some(Palisade::spawn(&args, &envs, TempDir::new()));
}

/// `cp -al`: a copy of the tree `from` at `to` whose files are hard links (no bytes copied).
fn link_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    let status = std::process::Command::new("cp").arg("-al").arg(from).arg(to).status().unwrap();
    assert!(status.success(), "cp -al {} {}", from.display(), to.display());
}

/// The `[[upstreams]]` recipe of README's "Installing a server for the gateway" whose id is
/// `id`, with each `(from, to)` replaced: the recipes are run as written, only their paths moved.
fn readme_recipe(id: &str, replace: &[(&str, &Path)]) -> String {
    let readme = include_str!("../../../../README.md");
    let section = &readme[readme.find("#### Installing a server for the gateway").expect("README has the recipes")..];
    let section = &section[..section.find("\n### ").unwrap()];
    let block = section
        .split("```toml\n")
        .skip(1)
        .map(|rest| &rest[..rest.find("```").unwrap()])
        .find(|block| block.contains(&format!("id = \"{id}\"")))
        .unwrap_or_else(|| panic!("README has no recipe with id {id}"));
    replace.iter().fold(block.to_owned(), |text, (from, to)| text.replace(from, text_of(to)))
}

fn text_of(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// A directory the sandbox uids can reach, with one file in it.
fn served_dir(scratch: &TempDir, marker: &str) -> PathBuf {
    let dir = Path::new(scratch.path()).join("served");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hello.txt"), format!("{marker}\n")).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filesystem_server_runs_from_its_bin_link_and_from_a_prefix_install_without_grants_for_its_code() {
    let scratch = TempDir::new();
    let served = served_dir(&scratch, "served-by-node");
    // `npm install -g --prefix PREFIX @modelcontextprotocol/server-filesystem` lays out
    // PREFIX/lib/node_modules/… and PREFIX/bin/NAME -> ../lib/node_modules/…/dist/index.js.
    let prefix = Path::new(scratch.path()).join("opt-mcp");
    link_copy(&node_modules(), &prefix.join("lib/node_modules"));
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    let bin = prefix.join("bin/mcp-server-filesystem");
    std::os::unix::fs::symlink("../lib/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js", &bin)
        .unwrap();
    let dot_bin = node_modules().join(".bin/mcp-server-filesystem");
    // Only the served directory is granted: the code and its dependencies are not.
    let entries = stdio_entry("fsbin", text(&dot_bin), &[text(&served)], &[&served], "")
        + &readme_recipe("files", &[("/opt/mcp/files", &prefix), ("/srv/shared", &served)]);
    assert!(entries.contains(text(&bin)), "README's recipe names the prefix's bin link: {entries}");
    let mut gateway = GatewayUnderTest::new(&entries);
    start(&mut gateway);

    for (upstream, tree) in [("fsbin", node_modules()), ("files", prefix.join("lib/node_modules"))] {
        let shown = gateway.cli_ok(&["upstreams", "show", upstream]);
        let tree_line = format!("package tree      {} (node_modules, ", text(&tree));
        assert!(shown.contains(&tree_line), "{upstream}: its node_modules tree is found and hashed:\n{shown}");
        let node = std::fs::canonicalize(test_tools().join("bin/node")).unwrap();
        assert!(
            shown.contains(&format!("interpreter       {} ", text(&test_tools().join("bin/node")))),
            "{upstream}: `#!/usr/bin/env node` is resolved on the gateway's PATH:\n{shown}"
        );
        assert!(shown.contains(&format!("runs              {} ", text(&node))), "{shown}");
        let token = approve_and_serve(&gateway, upstream, &["read_text_file", "list_directory"]).await;
        let hello = served.join("hello.txt");
        let read = gateway.call(&token, &format!("{upstream}_read_text_file"), json!({"path": text(&hello)})).await;
        assert_eq!(result_text(&read, upstream).trim(), "served-by-node");
        let listed = gateway.call(&token, &format!("{upstream}_list_directory"), json!({"path": text(&served)})).await;
        assert!(result_text(&listed, upstream).contains("hello.txt"));
        let started = gateway.cli_ok(&["upstreams", "show", upstream, "--start"]);
        assert!(started.contains("start check       started; it answers ("), "{started}");
    }

    // A changed dependency is a changed launch: nothing starts until it is approved again.
    let before = gateway.cli_ok(&["upstreams", "show", "files"]);
    let dependency = prefix.join("lib/node_modules/zod/package.json");
    let original = std::fs::read(&dependency).unwrap();
    std::fs::remove_file(&dependency).unwrap();
    std::fs::write(&dependency, [original.as_slice(), b"\n"].concat()).unwrap();
    let after = gateway.cli_ok(&["upstreams", "show", "files"]);
    let digest = |shown: &str| shown.lines().find(|line| line.starts_with("launch digest")).unwrap().to_owned();
    assert_ne!(digest(&before), digest(&after), "one dependency's bytes change the launch digest");
    assert!(after.contains("state             pending") || after.contains("state             held"), "{after}");
    assert!(gateway.is_running());
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_server_runs_from_its_virtual_environment_without_grants() {
    // `python3 -m venv VENV` and the SDK installed into it (here: the tools' site-packages,
    // linked in, which is what `VENV/bin/pip install mcp` would have put there).
    let scratch = TempDir::new();
    let venv = Path::new(scratch.path()).join("py");
    let made = std::process::Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success(), "python3 -m venv");
    let lib = std::fs::read_dir(venv.join("lib")).unwrap().next().unwrap().unwrap().path();
    std::fs::remove_dir(lib.join("site-packages")).unwrap();
    let tools_lib = std::fs::read_dir(test_tools().join("py/lib")).unwrap().next().unwrap().unwrap().path();
    link_copy(&tools_lib.join("site-packages"), &lib.join("site-packages"));
    let script =
        std::fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/interop/tiny_py_stdio_server.py"))
            .unwrap();
    let python = venv.join("bin/python");
    let entry = readme_recipe("py", &[("/opt/mcp/py", &venv), ("/opt/mcp/server.py", &script)]);
    let mut gateway = GatewayUnderTest::new(&entry);
    start(&mut gateway);
    let shown = gateway.cli_ok(&["upstreams", "show", "py"]);
    assert!(shown.contains(&format!("package tree      {} (python-venv, ", text(&venv))), "{shown}");
    // It runs by the environment's own `bin/python`, which finds the environment by its path.
    assert!(shown.contains(&format!("runs              {} {}", text(&python), text(&script))), "{shown}");
    assert!(shown.contains("grants            (none)"), "{shown}");
    let token = approve_and_serve(&gateway, "py", &["add", "identity"]).await;
    let sum = gateway.call(&token, "py_add", json!({"a": 2, "b": 40})).await;
    assert_eq!(result_text(&sum, "py_add"), "PY-STDIO: 2 + 40 = 42");
    let identity = result_text(&gateway.call(&token, "py_identity", json!({})).await, "py_identity");
    assert!(identity.ends_with(" host=sandbox"), "it runs in the sandbox: {identity}");
    assert!(gateway.is_running());
    gateway.stop();
}

/// A real Node server whose dependency is not installed dies at start with
/// `ERR_MODULE_NOT_FOUND` spread over a dozen stderr lines: the one error the operator reads
/// names it, in `gateway status` and in `upstreams show`.
#[test]
fn a_node_server_missing_a_dependency_is_reported_with_its_cause() {
    let scratch = TempDir::new();
    let server = Path::new(scratch.path()).join("srv/index.mjs");
    std::fs::create_dir_all(server.parent().unwrap()).unwrap();
    std::fs::write(
        &server,
        "import { McpServer } from \"@modelcontextprotocol/sdk/server/mcp.js\";\nnew McpServer();\n",
    )
    .unwrap();
    let node = test_tools().join("bin/node");
    let body = "[gateway]\nsandbox_uid_base = 692000\n\n".to_owned()
        + &stdio_entry("broken", text(&node), &[text(&server)], &[], "");
    let gateway = GatewayUnderTest::new(&body);
    // Before its approval nothing is started.
    let pending = gateway.cli(&["upstreams", "show", "broken", "--start"]);
    let pending_text = String::from_utf8_lossy(&pending.stdout);
    assert_eq!(pending.status.code(), Some(1), "{pending_text}");
    assert!(pending_text.contains("start check       not run (only an approved launch is started)"), "{pending_text}");
    gateway.cli_ok(&["upstreams", "approve", "broken", "--reviewer", "alice"]);
    let cause = "Error [ERR_MODULE_NOT_FOUND]: Cannot find package '@modelcontextprotocol/sdk' imported from";
    let status = gateway.cli(&["gateway", "status"]);
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(!status.status.success(), "{stdout}");
    let line = stdout.lines().find(|line| line.starts_with("broken ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("closed its stdout; its last stderr lines:"), "{line}");
    assert!(line.contains(cause), "gateway status names the cause: {line}");
    assert!(!line.contains(" at "), "the stack frames are left out: {line}");
    let show = gateway.cli(&["upstreams", "show", "broken", "--start"]);
    let shown = String::from_utf8_lossy(&show.stdout);
    assert_eq!(show.status.code(), Some(1), "an approved launch that cannot start fails the show: {shown}");
    let check = shown.lines().find(|line| line.starts_with("start check")).unwrap_or_else(|| panic!("{shown}"));
    assert!(check.contains("FAILED") && check.contains(cause), "{check}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_binary_runs_from_readme_s_recipe_with_nothing_but_itself() {
    let fixture = stdio_fixture::fixture_path();
    let entry = readme_recipe("tool", &[("/opt/mcp/bin/mcp-tool", &fixture)]);
    let mut gateway = GatewayUnderTest::new(&entry);
    start(&mut gateway);
    let shown = gateway.cli_ok(&["upstreams", "show", "tool"]);
    assert!(!shown.contains("package tree"), "a static binary has no package tree: {shown}");
    assert!(!shown.contains("interpreter"), "{shown}");
    assert!(
        shown.contains(&format!("runs              {}\n", text(&std::fs::canonicalize(&fixture).unwrap()))),
        "{shown}"
    );
    assert!(shown.contains("env               MCP_TOOL_TOKEN"), "{shown}");
    let token = approve_and_serve(&gateway, "tool", &["echo"]).await;
    let echoed = gateway.call(&token, "tool_echo", json!({"text": "static"})).await;
    assert_eq!(echoed.result()["structuredContent"], json!({"text": "static"}), "{:?}", echoed.response());
    assert!(gateway.is_running());
    gateway.stop();
}
