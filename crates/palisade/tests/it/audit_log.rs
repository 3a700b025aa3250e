//! `palisade audit verify` and the audit segment end to end: a log written before the hashed form
//! was named RFC 8785 (`fixtures/audit-log-before-rfc8785.sql`, hashes computed outside this code
//! base) verifies as written and breaks once a field is edited; a server killed with SIGKILL loses
//! no acknowledged record (its segment is recovered and shipped at the next start); the signed
//! checkpoints catch a tail cut behind them that the chain walk alone cannot see.

use std::process::Command;

use serde_json::json;

use crate::harness::{Client, Palisade, TempDir};

const LOG_BEFORE_RFC_8785: &str = include_str!("fixtures/audit-log-before-rfc8785.sql");
const SECRET: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// Runs `palisade audit verify` on the data directory: (exit success, stdout and stderr).
fn verify(data_dir: &str) -> (bool, String) {
    let (code, text) = verify_code(data_dir);
    (code == Some(0), text)
}

/// Runs `palisade audit verify` on the data directory: (exit code, stdout and stderr).
fn verify_code(data_dir: &str) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["audit", "verify"])
        .env("PALISADE_DATA_DIR", data_dir)
        .output()
        .expect("run palisade");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), text)
}

fn with_secret() -> TempDir {
    let dir = TempDir::new();
    std::fs::write(dir.0.join("server-secret"), SECRET).unwrap();
    dir
}

#[test]
fn a_log_written_before_rfc_8785_still_verifies() {
    let dir = with_secret();
    // The first run creates and migrates the store: no chain yet.
    let (intact, output) = verify(dir.path());
    assert!(intact && output.contains("audit log intact: 0 records in 0 chains; no checkpoint yet"), "{output}");

    // The old log as the migration leaves it: the chain 00…0 with its head.
    let log = LOG_BEFORE_RFC_8785
        .replace("INSERT INTO audit_log (seq,", "INSERT INTO audit_log (chain_id, seq,")
        .replace("VALUES (", "VALUES ('00000000000000000000000000000000', ")
        .replace(
            "UPDATE audit_chain_head SET last_seq = 3, last_hash = X'1dd57cceead7d92535f02609412c644401f754f64a2218db94c59f5faffa01e2' WHERE id = 1;",
            "INSERT INTO audit_chains (chain_id, head_seq, head_hash) VALUES ('00000000000000000000000000000000', 3, X'1dd57cceead7d92535f02609412c644401f754f64a2218db94c59f5faffa01e2');",
        );
    let database = rusqlite::Connection::open(dir.0.join("palisade.db")).unwrap();
    database.execute_batch(&log).unwrap();
    let (intact, output) = verify(dir.path());
    assert!(intact, "{output}");
    assert!(output.contains("audit log intact: 3 records in 1 chains"), "{output}");

    // The same check finds an edit: the second record's operation without its accent.
    let edited = database
        .execute("UPDATE audit_log SET operation = 'tools/call:cafe ' || char(129408) WHERE seq = 2", [])
        .unwrap();
    assert_eq!(edited, 1);
    let (code, output) = verify_code(dir.path());
    assert_eq!(code, Some(1), "a log read and found damaged is exit 1: {output}");
    assert!(output.contains("audit log BROKEN: chain 00000000000000000000000000000000 at record 2"), "{output}");
}

/// "Could not read" is exit 2, never the "not intact" of exit 1 (nor success): a missing or bad
/// server secret, and a store that does not open.
#[test]
fn verify_tells_could_not_read_from_not_intact() {
    let dir = TempDir::new();
    let (code, output) = verify_code(dir.path());
    assert_eq!(code, Some(2), "{output}");
    assert!(output.contains("could not be read") && output.contains("reading the server secret"), "{output}");
    std::fs::write(dir.0.join("server-secret"), "not hex").unwrap();
    let (code, output) = verify_code(dir.path());
    assert_eq!(code, Some(2), "{output}");

    // A store file that is not a database: nothing could be read.
    let dir = with_secret();
    std::fs::write(dir.0.join("palisade.db"), vec![0x5a; 8192]).unwrap();
    let (code, output) = verify_code(dir.path());
    assert_eq!(code, Some(2), "{output}");
    assert!(output.contains("could not be read"), "{output}");
}

#[test]
fn verify_needs_the_server_secret_and_never_creates_one() {
    let dir = TempDir::new();
    let (intact, output) = verify(dir.path());
    assert!(!intact && output.contains("reading the server secret"), "{output}");
    assert!(!dir.0.join("server-secret").exists(), "verify created a secret");
    std::fs::write(dir.0.join("server-secret"), "not hex").unwrap();
    let (intact, output) = verify(dir.path());
    assert!(!intact && output.contains("must be 64 hex characters"), "{output}");
}

async fn call_simple_text(server: &Palisade, calls: usize) {
    let client = Client::new(server);
    for n in 0..calls {
        let exchange =
            client.call(json!(n), "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
        assert!(exchange.response().get("result").is_some(), "{:?}", exchange.response());
    }
}

fn allow_records(dir: &TempDir) -> i64 {
    let database = rusqlite::Connection::open(dir.0.join("palisade.db")).unwrap();
    database
        .query_row(
            "SELECT count(*) FROM audit_log WHERE decision = 'allow' AND operation = 'tools/call:test_simple_text'",
            [],
            |row| row.get(0),
        )
        .unwrap()
}

#[tokio::test]
async fn a_killed_server_loses_no_acknowledged_record_and_checkpoints_catch_a_cut_tail() {
    for durability in ["process", "power"] {
        let dir = with_secret();
        let data = dir.path().to_owned();
        let envs = [("PALISADE_AUDIT_DURABILITY", durability), ("PALISADE_AUDIT_CHECKPOINT_INTERVAL_SECS", "1")];
        let args = ["serve", "--app", "conformance", "--listen", "127.0.0.1:0", "--data-dir", data.as_str()];
        let server = Palisade::spawn(&args, &envs, dir);
        call_simple_text(&server, 20).await;
        // SIGKILL right after the last answer: whatever was not shipped yet is only in the segment.
        let dir = server.kill_keeping_data();
        let segment = dir.0.join("audit-segment");
        assert_eq!(std::fs::read_dir(&segment).unwrap().count(), 1, "{durability}: one chain directory");

        // The next start recovers the segment and ships it; a clean stop signs a last checkpoint.
        let mut server = Palisade::spawn(&args, &envs, dir);
        call_simple_text(&server, 5).await;
        assert!(server.terminate().success());
        let dir = server.kill_keeping_data();
        assert_eq!(allow_records(&dir), 25, "{durability}: every acknowledged call has its allow record");
        let (intact, output) = verify(dir.path());
        assert!(intact, "{durability}: {output}");
        assert!(
            output.contains("in 1 chains;") && output.contains("checkpoints, the last #"),
            "{durability}: {output}"
        );

        // Cut the tail and rewind the head row onto what is left: the chain walks clean, the
        // signed checkpoint does not agree.
        let database = rusqlite::Connection::open(dir.0.join("palisade.db")).unwrap();
        database.execute("DELETE FROM audit_log WHERE seq > 10", []).unwrap();
        database
            .execute(
                "UPDATE audit_chains SET head_seq = 10, head_hash = (SELECT hash FROM audit_log WHERE seq = 10)",
                [],
            )
            .unwrap();
        let (intact, output) = verify(dir.path());
        assert!(!intact, "{durability}: {output}");
        assert!(output.contains("head is behind a signed checkpoint (truncated)"), "{durability}: {output}");
    }
}

/// Runs `palisade audit salvage [--apply]` on the data directory: (exit success, output).
fn salvage(data_dir: &str, apply: bool) -> (bool, String) {
    let mut args = vec!["audit", "salvage"];
    if apply {
        args.push("--apply");
    }
    let output = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(&args)
        .env("PALISADE_DATA_DIR", data_dir)
        .output()
        .expect("run palisade");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// The newest segment file of the one chain, and the offset of each frame in it.
fn newest_segment(dir: &TempDir) -> (std::path::PathBuf, Vec<usize>) {
    let chains: Vec<_> =
        std::fs::read_dir(dir.0.join("audit-segment")).unwrap().map(|entry| entry.unwrap().path()).collect();
    assert_eq!(chains.len(), 1, "{chains:?}");
    let mut files: Vec<_> = std::fs::read_dir(&chains[0])
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "seg"))
        .collect();
    files.sort();
    let path = files.pop().expect("a segment file");
    let bytes = std::fs::read(&path).unwrap();
    // Header: magic, chain id, first seq, prev hash; then frames: length (u32 LE), CRC, payload.
    let mut offsets = Vec::new();
    let mut at = 80;
    while at + 8 <= bytes.len() {
        offsets.push(at);
        at += 8 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    }
    assert_eq!(at, bytes.len(), "whole frames");
    (path, offsets)
}

#[tokio::test]
async fn damage_in_the_middle_of_the_segment_refuses_the_start_and_salvage_keeps_what_follows() {
    let dir = with_secret();
    let data = dir.path().to_owned();
    let args = ["serve", "--app", "conformance", "--listen", "127.0.0.1:0", "--data-dir", data.as_str()];
    let server = Palisade::spawn(&args, &[], dir);
    call_simple_text(&server, 30).await;
    let dir = server.kill_keeping_data();
    // One byte flipped inside a record in the middle of the newest file.
    let (path, offsets) = newest_segment(&dir);
    let middle = offsets.len() / 2;
    let following = offsets.len() - middle - 1;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[offsets[middle] + 8 + 40 + 5] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();

    // The server refuses to start, naming the file, the offset and what follows.
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut first_line).unwrap();
    if first_line.starts_with("listening") {
        let _ = child.kill();
        panic!("the server started on a damaged segment");
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{stderr}");
    for expected in [
        format!("{} is damaged at offset {}", path.display(), offsets[middle]),
        format!("{following} valid records follow it"),
        "palisade audit salvage".to_owned(),
    ] {
        assert!(stderr.contains(&expected), "{expected}: {stderr}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing was cut");

    // `audit salvage` shows it (exit 1) and changes nothing; `--apply` keeps what follows.
    let (clean, output) = salvage(dir.path(), false);
    assert!(!clean, "{output}");
    assert!(output.contains(&format!("DAMAGED: file {} at offset {}", path.display(), offsets[middle])), "{output}");
    assert!(output.contains(&format!("{following} valid records follow it")), "{output}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    let (done, output) = salvage(dir.path(), true);
    assert!(done && output.contains("salvaged:") && output.contains("kept aside:"), "{output}");
    let aside: Vec<_> = std::fs::read_dir(dir.0.join("audit-segment").join("damaged")).unwrap().collect();
    assert_eq!(aside.len(), 1);

    // The server starts again; the log verifies, with the break recorded in it.
    let mut server = Palisade::spawn(&args, &[], dir);
    call_simple_text(&server, 1).await;
    assert!(server.terminate().success());
    let dir = server.kill_keeping_data();
    let (intact, output) = verify(dir.path());
    assert!(intact, "{output}");
    let database = rusqlite::Connection::open(dir.0.join("palisade.db")).unwrap();
    let detail: String = database
        .query_row("SELECT detail FROM audit_log WHERE operation = 'audit.salvage'", [], |row| row.get(0))
        .unwrap();
    assert!(detail.contains(&format!("damaged at offset {}", offsets[middle])), "{detail}");
    // At most the one damaged record is missing (unless it was shipped before the kill).
    assert!(allow_records(&dir) >= 30, "{}", allow_records(&dir));
}
