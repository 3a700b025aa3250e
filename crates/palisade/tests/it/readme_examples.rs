//! README.md's examples, held to what they say. Every fenced block of README is extracted: each
//! `toml` configuration goes through `palisade config check` (only what names this machine is
//! swapped: data directories, the directories a grant names, stand-ins for the files it names);
//! every `palisade` command of a `sh` block names subcommands and flags the binary has; and every
//! block that is not a configuration carries a marker on the line above its fence —
//! `<!-- example: proven by FILE::TEST, … -->` naming the tests that run it (they must exist and
//! be tests), or `<!-- example: not run: WHY -->` for a block that cannot run here. A new example
//! with neither fails the suite. Run here as written: the demo's walk-through, the gateway's with
//! the real server-everything README pins, and the `connections` block.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{Palisade, TempDir};
use crate::production_gateway::{Running, free_port};

const README: &str = include_str!("../../../../README.md");
const MARKER: &str = "<!-- example:";
/// This file, as README's markers name it.
const THIS_FILE: &str = "crates/palisade/tests/it/readme_examples.rs";

/// One fenced block of README.
#[derive(Debug, Clone)]
struct Block {
    /// The line of its opening fence (1-based).
    line: usize,
    lang: String,
    text: String,
    marker: Option<Marker>,
}

/// What the line above a block's fence says about it.
#[derive(Debug, Clone, PartialEq)]
enum Marker {
    /// `proven by FILE::TEST, …`: these tests run what the block shows.
    ProvenBy(Vec<String>),
    /// `not run: WHY`: the block cannot run here, and why.
    NotRun(String),
}

impl Block {
    fn proven_by(&self, test: &str) -> bool {
        matches!(&self.marker, Some(Marker::ProvenBy(tests)) if tests.iter().any(|t| t == &format!("{THIS_FILE}::{test}")))
    }
}

fn parse_marker(line: usize, text: &str) -> Option<Marker> {
    let rest = text.trim().strip_prefix(MARKER)?;
    let body = rest
        .strip_suffix("-->")
        .unwrap_or_else(|| panic!("README line {line}: a marker is one line ending in -->: {text}"))
        .trim();
    if let Some(tests) = body.strip_prefix("proven by ") {
        return Some(Marker::ProvenBy(tests.split(',').map(|t| t.trim().to_owned()).collect()));
    }
    if let Some(why) = body.strip_prefix("not run: ") {
        assert!(why.trim().len() >= 20, "README line {line}: say why the block cannot run here: {text}");
        return Some(Marker::NotRun(why.trim().to_owned()));
    }
    panic!("README line {line}: a marker says `proven by FILE::TEST, …` or `not run: WHY`: {text}")
}

/// Every fenced block of README, with its marker.
fn blocks() -> Vec<Block> {
    let lines: Vec<&str> = README.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(marker) = parse_marker(i + 1, lines[i]) {
            let next = lines.get(i + 1).copied().unwrap_or_default();
            assert!(next.starts_with("```"), "README line {}: a marker stands right above a fence: {marker:?}", i + 1);
        }
        let Some(lang) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].starts_with("```"))
            .unwrap_or_else(|| panic!("README line {}: a fence that never closes", i + 1));
        let marker = i.checked_sub(1).and_then(|above| parse_marker(above + 1, lines[above]));
        blocks.push(Block {
            line: i + 1,
            lang: lang.trim().to_owned(),
            text: lines[i + 1..end].join("\n") + "\n",
            marker,
        });
        i = end + 1;
    }
    blocks
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether `FILE::TEST` names a test function: `fn TEST(` in FILE, under a test attribute.
fn names_a_test(reference: &str) -> Result<(), String> {
    let (file, test) = reference.rsplit_once("::").ok_or_else(|| format!("{reference:?} is not FILE::TEST"))?;
    let source = std::fs::read_to_string(repo_root().join(file)).map_err(|e| format!("{file}: {e}"))?;
    let lines: Vec<&str> = source.lines().collect();
    let at = lines
        .iter()
        .position(|line| {
            line.trim_start().starts_with(&format!("fn {test}(")) || line.contains(&format!(" fn {test}("))
        })
        .ok_or_else(|| format!("{file} has no fn {test}"))?;
    let attributes = &lines[at.saturating_sub(4)..at];
    if attributes.iter().any(|line| line.trim_start().starts_with("#[test]") || line.contains("::test")) {
        Ok(())
    } else {
        Err(format!("{file}: fn {test} is not a test"))
    }
}

#[test]
fn every_readme_example_is_run_or_says_why_not() {
    let blocks = blocks();
    assert!(blocks.len() > 20, "README's blocks were not found: {}", blocks.len());
    let mut failures = Vec::new();
    for block in &blocks {
        let at = format!("README line {} (```{})", block.line, block.lang);
        if !["sh", "toml", "text", "rust", "cedar"].contains(&block.lang.as_str()) {
            failures.push(format!("{at}: a block of a kind this test does not know; add it here"));
        }
        match &block.marker {
            None if block.lang == "toml" => {}
            None => failures.push(format!(
                "{at}: an example no test is named for: run it in a test and put \
                 `<!-- example: proven by FILE::TEST -->` on the line above its fence, or \
                 `<!-- example: not run: WHY -->` if it cannot run here\n{}",
                block.text
            )),
            Some(Marker::ProvenBy(tests)) => {
                failures.extend(tests.iter().filter_map(|test| names_a_test(test).err()).map(|e| format!("{at}: {e}")));
            }
            Some(Marker::NotRun(_)) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// README's configurations, each as `config check` reads it: a block opening with
/// `# appended to NAME` is the nearest block above it that opens with `# NAME`, plus itself.
/// What names this machine is swapped: `data_dir`, the directories a stdio upstream is granted;
/// and the files a configuration names by a relative path (`tls_cert_file = "web.crt"`, …) are
/// written into the directory the check runs in.
fn configurations(dir: &Path) -> Vec<(usize, String)> {
    let data = dir.join("data");
    let shared = dir.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let swap = |text: &str| -> String {
        text.lines()
            .map(|line| {
                let (key, value) = line.split_once('=').unwrap_or((line, ""));
                let value = value.split('#').next().unwrap_or_default().trim().trim_matches('"');
                if key.trim() == "data_dir" {
                    return format!("data_dir = \"{}\"", data.display());
                }
                if key.trim().ends_with("_file") && !value.is_empty() && !value.starts_with('/') {
                    // An operators file holds `name token` lines; every other file one secret.
                    let stand_in = if key.trim() == "operators_file" { "alice " } else { "" };
                    std::fs::write(dir.join(value), format!("{stand_in}stand-in-0123456789abcdef\n")).unwrap();
                }
                line.replace("/srv/shared", shared.to_str().unwrap())
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    };
    let mut bases: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    for block in blocks().into_iter().filter(|b| b.lang == "toml") {
        if matches!(block.marker, Some(Marker::NotRun(_))) {
            // Not checked against this machine, but at least TOML.
            toml::from_str::<toml::Table>(&block.text)
                .unwrap_or_else(|e| panic!("README line {}: not TOML: {e}", block.line));
            continue;
        }
        let first = block.text.lines().next().unwrap_or_default();
        let text = match first.strip_prefix("# appended to ") {
            Some(rest) => {
                let name = rest.split_whitespace().next().unwrap_or_default();
                let base = bases
                    .get(name)
                    .unwrap_or_else(|| panic!("README line {}: no block above opens with `# {name}`", block.line));
                format!("{base}\n{}", block.text)
            }
            None => {
                if let Some(name) = first.strip_prefix("# ").and_then(|rest| rest.split_whitespace().next()) {
                    bases.insert(name.to_owned(), block.text.clone());
                }
                block.text.clone()
            }
        };
        out.push((block.line, swap(&text)));
    }
    out
}

#[test]
fn every_readme_configuration_passes_config_check() {
    let dir = TempDir::new();
    let configurations = configurations(&dir.0);
    assert!(configurations.len() >= 5, "{configurations:?}");
    let mut failures = Vec::new();
    for (n, (line, text)) in configurations.iter().enumerate() {
        let file = dir.0.join(format!("readme-{n}.toml"));
        std::fs::write(&file, text).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["config", "check", file.to_str().unwrap()])
            .current_dir(&dir.0)
            .output()
            .expect("run palisade");
        if !output.status.success() {
            failures.push(format!(
                "README line {line}: `config check` refused it: {}\n{text}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A line of a shell block with every `cargo run … -p palisade --` written `palisade`.
fn as_palisade(line: &str) -> String {
    let mut line = line.to_owned();
    while let Some(start) = line.find("cargo run") {
        let Some(end) = line[start..].find("-p palisade --") else { break };
        line.replace_range(start..start + end + "-p palisade --".len(), "palisade");
    }
    line
}

/// The words of one shell command at the start of `text`, up to what ends it (`)`, `;`, `|`,
/// `&`, a redirection or a comment). Quotes are removed; `<placeholder>` is one word.
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                chars.by_ref().take_while(|&c| c != '\'').for_each(|c| w.push(c));
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                let mut depth = 0usize;
                for c in chars.by_ref() {
                    match c {
                        '"' if depth == 0 => break,
                        '(' => depth += 1,
                        ')' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                    w.push(c);
                }
            }
            '<' if word.is_none() && text.contains('>') => {
                let placeholder: String = chars.by_ref().take_while(|&c| c != '>').collect();
                words.push(format!("<{placeholder}>"));
            }
            c if c.is_whitespace() => words.extend(word.take()),
            ')' | ';' | '|' | '&' | '<' | '>' => break,
            '#' if word.is_none() => break,
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// Every `palisade` command of a shell block (the README's shell function, or `cargo run`), as
/// its words after `palisade`. Continued lines are joined; comment lines are skipped.
fn palisade_commands(script: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    for line in script.replace("\\\n", " ").lines().map(as_palisade) {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let mut from = 0;
        while let Some(found) = line[from..].find("palisade ") {
            let at = from + found;
            from = at + "palisade ".len();
            let before = line[..at].chars().last();
            if before.is_none_or(|c| c.is_whitespace() || "(;|&{".contains(c)) {
                commands.push(shell_words(&line[from..]));
            }
        }
    }
    commands
}

/// `palisade PATH --help`, remembered.
fn help<'a>(cache: &'a mut HashMap<Vec<String>, String>, path: &[String]) -> &'a str {
    cache.entry(path.to_vec()).or_insert_with(|| {
        let output =
            Command::new(env!("CARGO_BIN_EXE_palisade")).args(path).arg("--help").output().expect("run palisade");
        assert!(
            output.status.success(),
            "palisade {} --help: {}",
            path.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    })
}

/// The subcommand names a `--help` text lists.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Whether a `--help` text offers the flag `--NAME` as an option of its own (an option line's
/// spelling, `-x, --name <VALUE>`; a description mentioning it, or a longer flag, is not).
fn offers(help: &str, flag: &str) -> bool {
    help.lines().map(str::trim_start).filter(|line| line.starts_with('-')).any(|line| {
        let spelling = line.split("  ").next().unwrap_or_default();
        spelling.split([',', ' ']).any(|token| token == flag)
    })
}

/// What is wrong with `palisade WORDS`: a first word that is no subcommand, or a flag the
/// subcommand it names does not offer (the binary's own `--help` says which it has).
fn command_problems(cache: &mut HashMap<Vec<String>, String>, words: &[String]) -> Vec<String> {
    let mut path: Vec<String> = Vec::new();
    for word in words.iter().take_while(|w| !w.starts_with('-')) {
        if subcommands(help(cache, &path)).contains(word) {
            path.push(word.clone());
        } else {
            break;
        }
    }
    if path.is_empty() {
        return vec![format!("`palisade {}` names no subcommand", words.join(" "))];
    }
    let text = help(cache, &path).to_owned();
    words
        .iter()
        .filter(|w| w.starts_with("--"))
        .map(|flag| flag.split('=').next().unwrap_or_default())
        .filter(|flag| !offers(&text, flag))
        .map(|flag| format!("`palisade {}` has no {flag}: palisade {}", path.join(" "), words.join(" ")))
        .collect()
}

#[test]
fn every_palisade_command_in_readme_has_the_subcommands_and_flags_it_names() {
    let mut cache = HashMap::new();
    let mut failures = Vec::new();
    let mut checked = 0;
    for block in blocks().iter().filter(|b| b.lang == "sh") {
        // `"$@"`: the definition of README's `palisade` shell function, not a command.
        for words in palisade_commands(&block.text).into_iter().filter(|w| w.first().is_some_and(|w| w != "$@")) {
            let problems = command_problems(&mut cache, &words);
            failures.extend(problems.into_iter().map(|problem| format!("README line {}: {problem}", block.line)));
            checked += 1;
        }
    }
    assert!(checked >= 20, "README's commands were not found: {checked}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The check finds what a stale example would have: a renamed flag, a longer flag's prefix, a
    // subcommand that does not exist.
    let words = |text: &str| text.split(' ').map(str::to_owned).collect::<Vec<_>>();
    let stale = command_problems(&mut cache, &words("handles revoke --subjekt alice --reason r --receipt t"));
    assert_eq!(
        stale,
        ["`palisade handles revoke` has no --subjekt: palisade handles revoke --subjekt alice --reason r --receipt t"]
    );
    assert_eq!(
        command_problems(&mut cache, &words("serve --allow")).len(),
        1,
        "--allow is only a prefix of --allow-host"
    );
    assert_eq!(command_problems(&mut cache, &words("handles forget --all")).len(), 1);
    assert!(
        command_problems(&mut cache, &words("handles revoke --subject alice --all --reason r --receipt t")).is_empty()
    );
}

#[test]
fn shell_words_end_where_the_command_ends() {
    let words = shell_words("dev token --scope 'a b' --subject \"$name\")\" > x # no");
    assert_eq!(words, ["dev", "token", "--scope", "a b", "--subject", "$name"]);
    let words = shell_words("pins approve x --digest <first 12 hex> --config g.toml   # why");
    assert_eq!(words, ["pins", "approve", "x", "--digest", "<first 12 hex>", "--config", "g.toml"]);
    let commands = palisade_commands(
        "palisade() { cargo run -q --release -p palisade -- \"$@\"; }\nX=$(palisade dev token --subject a \\\n  --tenant t)\n# palisade gateway\nPALISADE_BIN=target/debug/palisade scripts/cluster\n",
    );
    assert_eq!(commands, [vec!["$@"], vec!["dev", "token", "--subject", "a", "--tenant", "t"]]);
}

/// A shell block as it runs here: `cargo run … -p palisade --` is this build's binary, and the
/// demo's `127.0.0.1:8080` is the address the test server got.
fn runnable(script: &str, address: &str) -> String {
    let binary = format!("'{}'", env!("CARGO_BIN_EXE_palisade"));
    // README's `palisade` shell function, for blocks that use it without defining it.
    let mut out = format!("set -euo pipefail\npalisade() {{ {binary} \"$@\"; }}\n");
    for line in script.lines() {
        let mut line = line.replace("127.0.0.1:8080", address);
        while let Some(start) = line.find("cargo run") {
            let Some(end) = line[start..].find("-p palisade --") else { break };
            line.replace_range(start..start + end + "-p palisade --".len(), &binary);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn run_block(block: &Block, address: &str, dir: &Path, env: &[(&str, &str)]) -> String {
    let output = Command::new("bash")
        .arg("-c")
        .arg(runnable(&block.text, address))
        .current_dir(dir)
        .envs(env.iter().copied())
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "README line {}: the block failed: {stdout}{}\n{}",
        block.line,
        String::from_utf8_lossy(&output.stderr),
        block.text
    );
    stdout
}

/// The demo's walk-through as README writes it, block after block, on a server started by its
/// first block: the token and the curl call, the kill switch flipped off and on, and delegation
/// (with `PALISADE_DELEGATION_ENABLED=true`, as README says). What changes: the binary is this
/// build's, the server listens on a port of its own (the environment says so to `serve` and to
/// `dev token` alike, as README asks), and its data directory is a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_walkthrough_runs_as_readme_writes_it() {
    let blocks: Vec<Block> =
        blocks().into_iter().filter(|b| b.proven_by("the_demo_walkthrough_runs_as_readme_writes_it")).collect();
    assert_eq!(blocks.len(), 4, "serve, token and curl, the kill switch, delegation: {blocks:#?}");
    let data = TempDir::new();
    let data_dir = data.path().to_owned();
    let work = TempDir::new();
    let env = [
        ("PALISADE_DATA_DIR", data_dir.as_str()),
        ("PALISADE_LISTEN", "127.0.0.1:0"),
        ("PALISADE_DELEGATION_ENABLED", "true"),
    ];
    let commands = palisade_commands(&blocks[0].text);
    assert_eq!(commands.len(), 1, "the first block starts the server: {}", blocks[0].text);
    let args: Vec<&str> = commands[0].iter().map(String::as_str).collect();
    assert_eq!(args.first(), Some(&"serve"), "{args:?}");
    let server = Palisade::spawn(&args, &env, data);
    let address = format!("127.0.0.1:{}", server.port);

    let called = run_block(&blocks[1], &address, &work.0, &env);
    assert!(called.contains("\"result\"") && called.contains("TEA-001") && !called.contains("\"error\""), "{called}");

    let flipped = run_block(&blocks[2], &address, &work.0, &env);
    assert!(flipped.lines().any(|l| l.starts_with("tool:basket_checkout DISABLE ")), "{flipped}");
    assert!(flipped.contains("is now ENABLE"), "{flipped}");

    let delegated = run_block(&blocks[3], &address, &work.0, &env);
    // curl prints each answer without a newline: the JSON values one after another, then the
    // kill switch's own line.
    let answers: Vec<serde_json::Value> =
        serde_json::Deserializer::from_str(&delegated).into_iter().map_while(Result::ok).collect();
    assert_eq!(answers.len(), 3, "three calls answer: {delegated}");
    assert!(answers[0]["result"]["structuredContent"].to_string().contains("TEA-001"), "allowed: {delegated}");
    assert_eq!(answers[1]["error"]["code"], -32031, "outside the capability: {delegated}");
    assert!(answers[2].get("error").is_some() || answers[2]["result"]["isError"] == true, "refused: {delegated}");
    drop(server);
}

/// `text` with each `(from, to)` replaced, every one of which must occur.
fn swapped(text: &str, swaps: &[(&str, &str)]) -> String {
    swaps.iter().fold(text.to_owned(), |text, (from, to)| {
        assert!(text.contains(from), "README's example no longer has {from:?}:\n{text}");
        text.replace(from, to)
    })
}

/// The gateway's walk-through as README writes it, with the real server-everything of the
/// version README pins: both upstreams started, README's `gateway.toml` checked and run, and the
/// review block run as written (its `everything-…` and `<first 12 hex …>` placeholders filled
/// with a real pin). README's security example must hold against that server: no per-tool rule
/// names a tool it does not list (no "matches nothing" warning at start or in `gateway status`),
/// and `get-env`, which `deny` names, is never served, even after every other definition of the
/// upstream is approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_walkthrough_runs_as_readme_writes_it() {
    use crate::gateway_pins::Gateway;
    let all = blocks();
    let blocks: Vec<&Block> =
        all.iter().filter(|b| b.proven_by("the_gateway_walkthrough_runs_as_readme_writes_it")).collect();
    assert_eq!(blocks.len(), 3, "the upstreams, config check and start, the review: {blocks:#?}");
    let config = all
        .iter()
        .find(|b| b.lang == "toml" && b.text.starts_with("# gateway.toml — for trying it"))
        .expect("README's gateway.toml");

    // Upstream 1, the conformance fixture, on a port of its own.
    let fx_data = TempDir::new();
    let commands = palisade_commands(&blocks[0].text);
    assert_eq!(commands.len(), 1, "{}", blocks[0].text);
    let fx_dir = fx_data.path().to_owned();
    let args: Vec<&str> = commands[0]
        .iter()
        .map(|word| match word.as_str() {
            "127.0.0.1:9001" => "127.0.0.1:0",
            "fx-data" => fx_dir.as_str(),
            word => word,
        })
        .collect();
    let fx = Palisade::spawn(&args, &[], fx_data);

    // Upstream 2, server-everything of the version README names, as installed for the tests.
    let line = blocks[0].text.lines().find(|l| l.contains("npx -y @modelcontextprotocol/server-everything@")).unwrap();
    let version = line.split("server-everything@").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap();
    let tools = crate::gateway_stdio_servers::test_tools();
    let package = tools.join("npm/node_modules/@modelcontextprotocol/server-everything");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(package.join("package.json")).unwrap()).unwrap();
    assert_eq!(manifest["version"], version, "README pins the server-everything the tests run");
    let port = free_port();
    let _everything = Running(
        Command::new(tools.join("bin/node"))
            .arg(package.join("dist/index.js"))
            .arg(line.split_whitespace().last().unwrap())
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start server-everything"),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "server-everything did not listen");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // README's gateway.toml, with the addresses and the data directory swapped.
    let work = TempDir::new();
    let gateway_data = TempDir::new();
    let text = swapped(
        &config.text,
        &[
            ("\"127.0.0.1:8090\"", "\"127.0.0.1:0\""),
            ("\"gateway-data\"", &format!("\"{}\"", gateway_data.path())),
            ("http://127.0.0.1:9001/mcp", &fx.url),
            ("http://127.0.0.1:9002/mcp", &format!("http://127.0.0.1:{port}/mcp")),
        ],
    );
    let file = work.0.join("gateway.toml");
    std::fs::write(&file, text).unwrap();
    let file = file.to_str().unwrap().to_owned();

    // `config check`, then the gateway, as the second block says.
    let commands = palisade_commands(&blocks[1].text);
    assert_eq!(commands, [vec!["config", "check", "gateway.toml"], vec!["gateway", "--config", "gateway.toml"]]);
    let checked =
        Command::new(env!("CARGO_BIN_EXE_palisade")).args(&commands[0]).current_dir(&work.0).output().unwrap();
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    let server = Palisade::spawn(&["gateway", "--config", &file], &[], gateway_data);
    let gateway = Gateway { server, config: file };

    // Every definition is pending; the review block runs as written, `everything-…` being
    // server-everything's `echo`.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let echo = loop {
        if let Some((id, _)) = gateway.pin("everything", "tool", "echo")
            && gateway.pin("fx", "tool", "test_simple_text").is_some()
        {
            break id;
        }
        assert!(std::time::Instant::now() < deadline, "the gateway did not list its upstreams");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let shown = gateway.cli(&["pins", "show", &echo]);
    let digest = shown
        .split_whitespace()
        .find(|word| word.len() == 64 && word.chars().all(|c| c.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("pins show shows the digest: {shown}"));
    // The fx pin README shows is the id an operator gets for one of fx's tools at README's
    // address; here the same tool has the id of this gateway's address.
    let readme_id = blocks[2]
        .text
        .split(|c: char| c.is_whitespace())
        .find(|word| word.starts_with("fx-") && word.len() == 19)
        .expect("the review block shows an fx pin");
    let listing = gateway.cli(&["pins", "list", "--upstream", "fx"]);
    let named = listing
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|name| {
            let subject = palisade_gateway::pins::PinSubject {
                upstream_id: "fx".into(),
                upstream_url: "http://127.0.0.1:9001/mcp".into(),
                kind: palisade_gateway::pins::DefinitionKind::Tool,
                name: (*name).to_owned(),
            };
            subject.pin_id() == readme_id
        })
        .unwrap_or_else(|| panic!("README's {readme_id} is no tool of fx at 127.0.0.1:9001: {listing}"));
    let fx_id = gateway.pin("fx", "tool", named).unwrap().0;
    let review = Block {
        text: swapped(
            &blocks[2].text,
            &[
                (readme_id, fx_id.as_str()),
                ("everything-…", echo.as_str()),
                ("<first 12 hex of the shown digest>", &digest[..12]),
            ],
        ),
        ..blocks[2].clone()
    };
    run_block(&review, "", &work.0, &[]);

    let token = gateway.token("alice", "");
    let served = gateway
        .wait_tools(&token, "fx's tools and everything's echo", |t| {
            t.iter().any(|t| t == "everything_echo") && t.iter().any(|t| t == "fx_test_simple_text")
        })
        .await;
    assert!(served.iter().filter(|t| t.starts_with("everything_")).count() == 1, "{served:?}");
    // The operator approves the rest of server-everything: `deny` still keeps get-env out.
    gateway.approve_all("everything");
    let served =
        gateway.wait_tools(&token, "all of everything's", |t| t.iter().any(|t| t == "everything_get-sum")).await;
    assert!(!served.iter().any(|t| t == "everything_get-env"), "a denied tool is served: {served:?}");
    let status = gateway.cli(&["gateway", "status"]);
    assert!(status.contains("everything") && !status.contains("matches nothing"), "{status}");
}

/// README's `connections` block as written, on a store holding one person's connection (written
/// as the gateway writes it; the sign-in that makes one needs an identity provider): the listing
/// names the person, the upstream and the scopes with RFC 3339 times and never a token, and the
/// revocation removes it, recorded in the audit log.
#[test]
fn the_connections_block_runs_as_readme_writes_it() {
    let all = blocks();
    let blocks: Vec<&Block> =
        all.iter().filter(|b| b.proven_by("the_connections_block_runs_as_readme_writes_it")).collect();
    assert_eq!(blocks.len(), 1, "{blocks:#?}");
    let work = TempDir::new();
    std::fs::write(work.0.join("gateway.toml"), format!("data_dir = \"{}/data\"\n", work.path())).unwrap();
    // The store, created as every command creates it; nobody is connected yet, so there is
    // nothing to revoke (exit 1).
    let revoke = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["connections", "revoke", "--subject", "alice", "--reason", "r", "--config", "gateway.toml"])
        .current_dir(&work.0)
        .output()
        .unwrap();
    assert_eq!(revoke.status.code(), Some(1), "{}", String::from_utf8_lossy(&revoke.stdout));

    let database = rusqlite::Connection::open(work.0.join("data/palisade.db")).unwrap();
    let person = r#"{"issuer":"https://idp.example","subject":"alice","tenant":"acme"}"#;
    let inserted = database
        .execute(
            "INSERT INTO oauth_connections (principal_key, upstream, principal, issuer, client_id, scopes, sealed, \
             version, created_ms, updated_ms) VALUES (?1, 'tracker', ?2, 'https://tracker.example', 'palisade-connect', \
             'issues:read', X'5345414c4544', 1, 1780000000000, 1780000060000)",
            rusqlite::params![vec![7_u8; 32], person],
        )
        .unwrap();
    assert_eq!(inserted, 1);
    let listed = run_block(blocks[0], "", &work.0, &[]);
    let line = listed.lines().find(|l| l.starts_with("subject=alice ")).unwrap_or_else(|| panic!("{listed}"));
    for part in [
        "upstream=tracker",
        "scopes=\"issues:read\"",
        "created=2026-05-28T20:26:40.000Z",
        "updated=2026-05-28T20:27:40.000Z",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }
    assert!(!listed.contains("SEALED") && listed.contains("removed 1 connection(s)"), "{listed}");
    let count: i64 = database.query_row("SELECT count(*) FROM oauth_connections", [], |row| row.get(0)).unwrap();
    assert_eq!(count, 0, "the revocation removed the connection");
}
