//! `palisade audit show|search|tail` through the binary, on the log a real server wrote: every
//! filter selects exactly its records, a subject is found by name with the server secret, JSON
//! lines parse, a record edited in the database is flagged (exit 1), bad filters and a store that
//! cannot be read are exit 2 and create nothing, `tail` prints a record written after it started,
//! the same on PostgreSQL, and README's "Reading the audit log" example runs as written.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use palisade_base::clock::Clock as _;
use serde_json::{Value, json};

use crate::gateway_pins::{PATIENCE, boot, upstream};
use crate::harness::{Client, Palisade, TempDir, dev_token, send, tool_call};
use crate::upstream_fixture::{Upstream, tool};

/// `palisade ARGS` with `envs`: (exit code, stdout, stderr).
fn palisade(args: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_palisade")).args(args).envs(envs.iter().copied()).output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The environment that points a command at a test server's settings (its data directory,
/// its listen address as every test server is started with).
fn server_env(server: &Palisade) -> Vec<(&'static str, String)> {
    vec![("PALISADE_DATA_DIR", server.data_dir.path().to_owned()), ("PALISADE_LISTEN", "127.0.0.1:0".to_owned())]
}

fn borrowed<'a>(envs: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    envs.iter().map(|(key, value)| (*key, value.as_str())).collect()
}

/// `palisade audit COMMAND ARGS --format json` on `envs`: the records (each line parsed),
/// asserting success.
fn records(envs: &[(&'static str, String)], command: &str, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["audit", command, "--format", "json"];
    all.extend(args);
    let (code, stdout, stderr) = palisade(&all, &borrowed(envs));
    assert_eq!(code, Some(0), "{all:?}: {stdout}{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("{all:?}: not a JSON line: {line}")))
        .collect();
    let times: Vec<u64> = lines.iter().map(|line| line["at_ms"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|pair| pair[0] <= pair[1]), "{all:?}: newest last: {times:?}");
    for line in &lines {
        assert_eq!(line["hash_ok"], true, "{line}");
        assert_eq!(line["chain"].as_str().unwrap().len(), 32, "{line}");
        assert!(line["at"].as_str().unwrap().ends_with('Z'), "{line}");
    }
    lines
}

/// Waits (polling `show`) until the records `wanted` picks are in the store: the server ships
/// its segment in batches.
fn wait_for(envs: &[(&'static str, String)], args: &[&str], wanted: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = records(envs, "show", args);
        if wanted(&found) {
            return found;
        }
        assert!(Instant::now() < deadline, "the records never arrived: {found:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Polls `show` until the log stops growing for a second (the server ships in batches), and
/// returns it.
fn settled(envs: &[(&'static str, String)]) -> Vec<Value> {
    let mut last = records(envs, "show", &["--limit", "1000"]);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = records(envs, "show", &["--limit", "1000"]);
        if now == last {
            return now;
        }
        last = now;
    }
}

fn operations(found: &[Value]) -> Vec<&str> {
    found.iter().map(|record| record["operation"].as_str().unwrap()).collect()
}

/// Alice reads a product and is refused a basket (her token lacks `shop:basket`); bob searches
/// the catalogue.
async fn alice_and_bob(server: &Palisade) {
    let alice = dev_token(server, "alice", "acme", "cli", "shop:read");
    let bob = dev_token(server, "bob", "acme", "cli", "shop:read");
    let read = send(tool_call(server, &alice, "product_get", json!({ "sku": "TEA-001" }))).await;
    assert!(read.response().get("result").is_some(), "{:?}", read.response());
    let refused = send(tool_call(server, &alice, "basket_create", json!({}))).await;
    assert_eq!(refused.status, 403, "{:?}", refused.frames);
    let searched = send(tool_call(server, &bob, "catalog_search", json!({ "query": "tea" }))).await;
    assert!(searched.response().get("result").is_some(), "{:?}", searched.response());
}

#[tokio::test]
async fn every_filter_selects_its_records_and_a_subject_is_found_by_name() {
    let server = Palisade::start_app("demo", &[]);
    alice_and_bob(&server).await;
    let envs = server_env(&server);
    wait_for(&envs, &["--limit", "1000"], |found| {
        ["tools/call:product_get", "tools/call:basket_create", "tools/call:catalog_search"]
            .iter()
            .all(|operation| found.iter().any(|record| record["operation"] == *operation))
    });
    let all = settled(&envs);
    let refusal = all
        .iter()
        .find(|record| record["operation"] == "tools/call:basket_create" && record["decision"] == "deny")
        .expect("the refusal of basket_create is on the record");
    assert_eq!(refusal["stage"], "authorize", "{refusal}");

    // Each filter: what it keeps all matches it, and it keeps every record that matches.
    let check = |args: &[&str], keep: &dyn Fn(&Value) -> bool| {
        let mut full = vec!["--limit", "1000"];
        full.extend(args);
        let found = records(&envs, "search", &full);
        let expected: Vec<&Value> = all.iter().filter(|record| keep(record)).collect();
        assert!(!expected.is_empty(), "{args:?} must select something");
        assert_eq!(found.iter().collect::<Vec<_>>(), expected, "{args:?}");
        found
    };
    check(&["--decision", "deny"], &|record| record["decision"] == "deny");
    check(&["--decision", "allow", "--stage", "authorize"], &|record| {
        record["decision"] == "allow" && record["stage"] == "authorize"
    });
    let code_value = refusal["code"].as_i64().expect("a refusal has a code");
    let code = code_value.to_string();
    check(&["--code", &code], &|record| record["code"].as_i64() == Some(code_value));
    check(&["--operation", "tools/call"], &|record| record["operation"].as_str().unwrap().starts_with("tools/call:"));
    check(&["--operation", "tools/call:catalog_search"], &|record| record["operation"] == "tools/call:catalog_search");
    check(&["--tool", "product_get", "--tool", "basket_create"], &|record| {
        record["operation"] == "tools/call:product_get" || record["operation"] == "tools/call:basket_create"
    });
    let trace = refusal["trace_id"].as_str().unwrap();
    check(&["--trace", trace], &|record| record["trace_id"] == trace);
    let first_ms = all[0]["at_ms"].as_u64().unwrap();
    let last_ms = all.last().unwrap()["at_ms"].as_u64().unwrap();
    check(&["--since", "1h"], &|_| true);
    let last = typed_time(last_ms);
    check(&["--since", &last], &|record| record["at_ms"].as_u64().unwrap() >= last_ms);
    let first = typed_time(first_ms);
    check(&["--until", &first], &|record| record["at_ms"].as_u64().unwrap() <= first_ms);
    let (code_after, _, stderr) =
        palisade(&["audit", "search", "--format", "json", "--since", &typed_time(last_ms + 1)], &borrowed(&envs));
    assert_eq!(code_after, Some(0));
    assert!(stderr.contains("no record matches"), "{stderr}");

    // By subject name: the digest under the development issuer, computed with the server secret.
    let alice = check(&["--subject", "alice"], &|record| record["principal_digest"] == refusal["principal_digest"]);
    assert!(operations(&alice).contains(&"tools/call:product_get"), "{alice:?}");
    assert!(!operations(&alice).contains(&"tools/call:catalog_search"), "bob's search is not alice's: {alice:?}");
    let digest = refusal["principal_digest"].as_str().unwrap();
    check(&["--principal-digest", digest], &|record| record["principal_digest"] == digest);
    let (_, _, stderr) = palisade(&["audit", "search", "--format", "json", "--subject", "alice"], &borrowed(&envs));
    assert!(stderr.contains(&format!("principal digest {digest}")), "{stderr}");
    let bob = check(&["--subject", "bob", "--tool", "catalog_search"], &|record| {
        record["operation"] == "tools/call:catalog_search" && record["principal_digest"] != refusal["principal_digest"]
    });
    assert!(bob.iter().all(|record| record["principal_digest"].is_string()));
    let elsewhere = records(&envs, "search", &["--subject", "alice", "--issuer", "https://idp.example"]);
    assert!(elsewhere.is_empty(), "alice of another issuer is another person: {elsewhere:?}");

    // The limit keeps the newest, shown oldest first, and says more match.
    let (code_limited, stdout, stderr) =
        palisade(&["audit", "show", "--format", "json", "--limit", "2"], &borrowed(&envs));
    assert_eq!(code_limited, Some(0));
    let limited: Vec<Value> = stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let newest = records(&envs, "show", &["--limit", "1000"]);
    assert_eq!(limited, newest[newest.len() - 2..].to_vec());
    assert!(stderr.contains("more match than --limit 2"), "{stderr}");
    assert!(stderr.contains("palisade audit verify"), "{stderr}");

    // The table: a header, one row per record, the hash column, the summary.
    let (code_table, table, _) =
        palisade(&["audit", "show", "--format", "table", "--tool", "basket_create"], &borrowed(&envs));
    assert_eq!(code_table, Some(0));
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("TIME") && lines[0].contains("DECISION") && lines[0].contains("PRINCIPAL"), "{table}");
    assert!(
        lines.iter().any(|line| line.contains("deny")
            && line.contains("tools/call:basket_create")
            && line.split_whitespace().any(|cell| cell == "ok")),
        "{table}"
    );
    assert!(lines.last().unwrap().contains(", oldest first; each matches its hash"), "{table}");

    // Reading wrote nothing: the log is what it was, and verifies.
    assert_eq!(records(&envs, "show", &["--limit", "1000"]).len(), newest.len());
    let (verified, output, _) = palisade(&["audit", "verify"], &borrowed(&envs));
    assert_eq!(verified, Some(0), "{output}");

    // A record edited in the database is shown, flagged, and the command exits 1.
    let database = rusqlite::Connection::open(server.data_dir.0.join("palisade.db")).unwrap();
    let edited = database
        .execute("UPDATE audit_log SET decision = 'allow' WHERE trace_id = ?1 AND decision = 'deny'", [trace])
        .unwrap();
    assert_eq!(edited, 1);
    let (code_edited, stdout, stderr) =
        palisade(&["audit", "search", "--format", "json", "--trace", trace], &borrowed(&envs));
    assert_eq!(code_edited, Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("does not match its hash"), "{stderr}");
    assert!(stdout.lines().any(|line| serde_json::from_str::<Value>(line).unwrap()["hash_ok"] == false), "{stdout}");
}

fn typed_time(at_ms: u64) -> String {
    // RFC 3339 with an offset, as an operator east of UTC might type it: UTC+01:00.
    let utc = palisade_base::time::format_rfc3339_ms(i64::try_from(at_ms + 3_600_000).unwrap());
    format!("{}+01:00", utc.trim_end_matches('Z'))
}

/// `--upstream`: a gateway's records of one upstream (its definitions' pin records, its
/// approvals, its calls), none of another's.
#[tokio::test]
async fn the_upstream_filter_keeps_one_upstreams_records() {
    let bank = Upstream::start(vec![tool("pay", "Pays.")]).await;
    let shop = Upstream::start(vec![tool("buy", "Buys.")]).await;
    let upstreams = format!("{}{}", upstream("bank", &bank.url, ""), upstream("shop", &shop.url, ""));
    let gateway = boot("", &upstreams);
    gateway.approve_all("bank");
    let config = gateway.config.clone();
    let envs: Vec<(&'static str, String)> = Vec::new();
    let with_config = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--config", config.as_str()]);
        all.iter().map(|arg| (*arg).to_owned()).collect::<Vec<String>>()
    };
    let read = |args: &[&str]| {
        let all = with_config(args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        records(&envs, all[0], &all[1..])
    };
    let deadline = Instant::now() + PATIENCE;
    let bank_records = loop {
        let found = read(&["search", "--upstream", "bank", "--limit", "1000"]);
        if found.iter().any(|record| record["operation"].as_str().unwrap().starts_with("pins/approved:")) {
            break found;
        }
        assert!(Instant::now() < deadline, "no approval of bank's tool on the record: {found:?}");
        std::thread::sleep(Duration::from_millis(300));
    };
    for record in &bank_records {
        let detail = record["detail"].as_str().unwrap();
        assert!(detail == "upstream=bank" || detail.starts_with("upstream=bank "), "{record}");
    }
    let shop_records = read(&["search", "--upstream", "shop", "--limit", "1000"]);
    assert!(!shop_records.is_empty());
    assert!(shop_records.iter().all(|record| record["detail"].as_str().unwrap().starts_with("upstream=shop ")));
    // Two values are alternatives: read first, then everything, which holds all of it (the log
    // only grows) and nothing else of the two upstreams up to the last record read first.
    let either = read(&["search", "--upstream", "bank", "--upstream", "shop", "--limit", "1000"]);
    let everything = read(&["show", "--limit", "1000"]);
    let last_ms = either.last().unwrap()["at_ms"].as_u64().unwrap();
    let expected: Vec<&Value> = everything
        .iter()
        .filter(|record| {
            record["at_ms"].as_u64().unwrap() <= last_ms
                && record["detail"]
                    .as_str()
                    .is_some_and(|detail| detail.starts_with("upstream=bank ") || detail.starts_with("upstream=shop "))
        })
        .collect();
    assert_eq!(
        either.iter().filter(|record| record["at_ms"].as_u64().unwrap() <= last_ms).collect::<Vec<_>>(),
        expected
    );
    assert!(either.iter().any(|record| record["detail"].as_str().unwrap().starts_with("upstream=bank ")));
}

#[test]
fn bad_filters_and_unreadable_stores_are_exit_2_and_create_nothing() {
    let empty = TempDir::new();
    let data = empty.0.join("data");
    let envs = [("PALISADE_DATA_DIR", data.to_str().unwrap())];
    let (code, _, stderr) = palisade(&["audit", "show"], &envs);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("could not be read") && stderr.contains("read-only"), "{stderr}");
    assert!(!data.exists(), "reading created the data directory");
    std::fs::create_dir_all(&data).unwrap();
    let (code, _, stderr) = palisade(&["audit", "tail"], &envs);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(!data.join("palisade.db").exists(), "reading created a database");
    std::fs::write(data.join("palisade.db"), vec![0x5a; 8192]).unwrap();
    let (code, _, stderr) = palisade(&["audit", "show"], &envs);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("could not be read"), "{stderr}");

    for (args, names) in [
        (&["search"][..], "at least one filter"),
        (&["show", "--decision", "maybe"], "--decision"),
        (&["show", "--since", "yesterday"], "--since"),
        (&["show", "--until", "2026-12-07T09:00:00"], "--until"),
        (&["show", "--since", "1h", "--until", "2h"], "later than --until"),
        (&["show", "--stage", "Authorize"], "--stage"),
        (&["show", "--code", "forbidden"], "--code"),
        (&["show", "--tool", "two words"], "--tool"),
        (&["show", "--upstream", "Bank"], "--upstream"),
        (&["show", "--principal-digest", "alice"], "--principal-digest"),
        (&["show", "--limit", "0"], "--limit"),
        (&["show", "--limit", "10001"], "--limit"),
        (&["show", "--subject", "alice"], "server secret"),
        (&["show", "--subject", "alice", "--issuer", "https://idp.example"], "server secret"),
        (&["show", "--issuer", "https://idp.example"], "--subject"),
        (&["tail", "--interval", "0"], "--interval"),
    ] {
        let mut all = vec!["audit"];
        all.extend(args);
        let (code, stdout, stderr) = palisade(&all, &envs);
        assert_eq!(code, Some(2), "{all:?}: {stdout}{stderr}");
        assert!(stderr.contains(names), "{all:?}: {stderr}");
        assert!(stdout.is_empty(), "{all:?}: {stdout}");
    }
    assert!(!data.join("server-secret").exists(), "--subject created a server secret");
}

/// A running `palisade audit tail`, killed on drop; its stdout lines arrive on a channel.
struct Tail {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Tail {
    /// Starts it and waits for its "following" line: what is written from then on must appear.
    fn start(args: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["audit", "tail", "--format", "json"])
            .args(args)
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut said = String::new();
        while !said.contains("following the audit log") {
            let mut line = String::new();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "tail ended before following: {said}");
            said.push_str(&line);
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Tail { child, lines }
    }

    /// The next record it prints whose operation is `operation` and that was made at or after
    /// `after_ms`, skipping others.
    fn next_record(&self, operation: &str, after_ms: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("tail never printed {operation}"));
            let record: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not a JSON line: {line}"));
            assert_eq!(record["hash_ok"], true, "{record}");
            if record["operation"] == operation && record["at_ms"].as_u64().unwrap() >= after_ms {
                return record;
            }
        }
    }

    /// Every line printed so far.
    fn drain(&self) -> Vec<Value> {
        self.lines.try_iter().map(|line| serde_json::from_str(&line).unwrap()).collect()
    }
}

/// Now, in milliseconds since the epoch (this machine's clock, as the server's).
fn now_ms() -> u64 {
    palisade_base::clock::SystemClock.now_unsigned_ms()
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn tail_prints_a_record_written_after_it_started() {
    let server = Palisade::start_app("demo", &[]);
    let envs = server_env(&server);
    let alice = dev_token(&server, "alice", "acme", "cli", "shop:read");
    // A read before tail starts: shown at its start, as `tail -f` shows the last lines.
    let read = send(tool_call(&server, &alice, "product_get", json!({ "sku": "TEA-001" }))).await;
    assert!(read.response().get("result").is_some());
    wait_for(&envs, &["--tool", "product_get"], |found| !found.is_empty());
    let tail = Tail::start(&["--tool", "product_get", "--decision", "allow"], &borrowed(&envs));
    let started = now_ms();
    let first = tail.next_record("tools/call:product_get", 0);
    assert!(first["at_ms"].as_u64().unwrap() < started, "{first}");
    // Written after tail started: a search its filter excludes, then the read it includes.
    let searched = send(tool_call(&server, &alice, "catalog_search", json!({ "query": "tea" }))).await;
    assert!(searched.response().get("result").is_some());
    let read = send(tool_call(&server, &alice, "product_get", json!({ "sku": "TEA-001" }))).await;
    assert!(read.response().get("result").is_some());
    let record = tail.next_record("tools/call:product_get", started);
    assert_eq!(record["decision"], "allow");
    assert_ne!(record["trace_id"], first["trace_id"], "a new record, not one shown at the start");
    std::thread::sleep(Duration::from_secs(2));
    let later = tail.drain();
    assert!(
        later.iter().all(|record| record["operation"] == "tools/call:product_get" && record["decision"] == "allow"),
        "the filter holds while following: {later:?}"
    );
}

/// PostgreSQL: a fresh schema a conformance server writes; `show`, `search` and `tail` read it
/// read-only; a schema never migrated is exit 2 and stays empty.
#[tokio::test]
async fn the_same_on_postgresql() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        panic!("DATABASE_URL is not set: this test needs a running PostgreSQL server (scripts/test starts one)")
    };
    let admin = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
    let schema = format!("audit_read_{}_{}", std::process::id(), unique_suffix());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&admin).await.unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    let store = format!("{url}{separator}options[search_path]={schema}");

    // Never migrated: nothing to read, and reading does not migrate it.
    let dir = TempDir::new();
    let envs = [("PALISADE_STORE", store.as_str()), ("PALISADE_DATA_DIR", dir.path())];
    let (code, _, stderr) = palisade(&["audit", "show"], &envs);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("holds no palisade schema") && !stderr.contains(&url), "{stderr}");
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM information_schema.tables WHERE table_schema = $1")
        .bind(&schema)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(tables, 0, "reading created tables");

    let data = TempDir::new();
    let data_path = data.path().to_owned();
    let args =
        ["serve", "--app", "conformance", "--listen", "127.0.0.1:0", "--data-dir", &data_path, "--store", &store];
    let server = Palisade::spawn(&args, &[], data);
    let client = Client::new(&server);
    let call = |n: i64| client.call(json!(n), "tools/call", json!({ "name": "test_simple_text", "arguments": {} }));
    for n in 0..3 {
        assert!(call(n).await.response().get("result").is_some());
    }
    let envs = vec![("PALISADE_STORE", store.clone()), ("PALISADE_DATA_DIR", data_path.clone())];
    let shown = wait_for(&envs, &["--tool", "test_simple_text", "--decision", "allow"], |found| found.len() >= 3);
    assert!(shown.iter().all(|record| record["operation"] == "tools/call:test_simple_text"));
    let denied = records(&envs, "search", &["--decision", "deny", "--tool", "test_simple_text"]);
    assert!(denied.is_empty(), "{denied:?}");

    let tail = Tail::start(&["--tool", "test_simple_text"], &borrowed(&envs));
    let started = now_ms();
    assert!(call(10).await.response().get("result").is_some());
    let record = tail.next_record("tools/call:test_simple_text", started);
    assert!(shown.iter().all(|old| old["trace_id"] != record["trace_id"]), "{record}");
    drop(tail);
    drop(server);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(&admin).await.unwrap();
}

fn unique_suffix() -> String {
    let mut random = [0u8; 6];
    aws_lc_rs::rand::fill(&mut random).unwrap();
    palisade_base::hex::hex(&random)
}

/// README's example, command by command, against a demo server's data (the README's own
/// `cargo run … --` prefix is the binary here): each runs, and says what the README says.
#[tokio::test]
async fn readme_reading_the_audit_log_runs_as_written() {
    let readme = include_str!("../../../../README.md");
    let start = readme.find("**Reading the audit log.**").expect("README has the example");
    let block = &readme[start..];
    let block = &block[block.find("```sh\n").unwrap() + 6..];
    let block = &block[..block.find("```").unwrap()];
    let commands: Vec<Vec<&str>> = block
        .lines()
        .map(|line| {
            let line = line.split("  #").next().unwrap().trim();
            let rest = line.strip_prefix("cargo run -q --release -p palisade -- ").expect("a palisade command");
            rest.split_whitespace().collect()
        })
        .collect();
    assert!(commands.len() >= 4, "{block}");

    let server = Palisade::start_app("demo", &[]);
    alice_and_bob(&server).await;
    let envs = server_env(&server);
    wait_for(&envs, &["--tool", "basket_create", "--decision", "deny"], |found| !found.is_empty());
    for command in &commands {
        if command[1] == "tail" {
            let tail = Tail::start(&command[2..], &borrowed(&envs));
            let started = now_ms();
            let alice = dev_token(&server, "alice", "acme", "cli", "shop:read");
            let refused = send(tool_call(&server, &alice, "basket_create", json!({}))).await;
            assert_eq!(refused.status, 403);
            let record = tail.next_record("tools/call:basket_create", started);
            assert_eq!(record["decision"], "deny");
            continue;
        }
        let (code, stdout, stderr) = palisade(command, &borrowed(&envs));
        assert_eq!(code, Some(0), "{command:?}: {stdout}{stderr}");
        let lines: Vec<Value> = stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        assert!(!lines.is_empty(), "{command:?} shows records: {stderr}");
        if command.contains(&"--subject") {
            assert!(lines.iter().all(|record| record["principal_digest"] == lines[0]["principal_digest"]));
            assert!(lines.iter().any(|record| record["operation"] == "tools/call:product_get"), "{lines:?}");
        }
        if command.contains(&"deny") {
            assert!(lines.iter().all(|record| record["decision"] == "deny"), "{lines:?}");
            assert!(lines.iter().any(|record| record["operation"] == "tools/call:basket_create"), "{lines:?}");
        }
    }
}
