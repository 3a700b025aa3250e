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
    let output = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["audit", "verify"])
        .env("PALISADE_DATA_DIR", data_dir)
        .output()
        .expect("run palisade");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
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
    let (intact, output) = verify(dir.path());
    assert!(!intact, "{output}");
    assert!(output.contains("audit log BROKEN: chain 00000000000000000000000000000000 at record 2"), "{output}");
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
