//! `palisade audit verify` on an audit log written before the hashed form was named RFC 8785
//! (`fixtures/audit-log-before-rfc8785.sql`, hashes computed outside this code base): intact as
//! written, broken once a stored field is edited.

use std::process::Command;

use crate::harness::TempDir;

const LOG_BEFORE_RFC_8785: &str = include_str!("fixtures/audit-log-before-rfc8785.sql");

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

#[test]
fn a_log_written_before_rfc_8785_still_verifies() {
    let dir = TempDir::new();
    // The first run creates and migrates the store: an empty chain.
    let (intact, output) = verify(dir.path());
    assert!(intact && output.contains("audit log intact: 0 records"), "{output}");

    let database = rusqlite::Connection::open(dir.0.join("palisade.db")).unwrap();
    database.execute_batch(LOG_BEFORE_RFC_8785).unwrap();
    let (intact, output) = verify(dir.path());
    assert!(intact, "{output}");
    assert!(output.contains("audit log intact: 3 records"), "{output}");

    // The same check finds an edit: the second record's operation without its accent.
    let edited = database
        .execute("UPDATE audit_log SET operation = 'tools/call:cafe ' || char(129408) WHERE seq = 2", [])
        .unwrap();
    assert_eq!(edited, 1);
    let (intact, output) = verify(dir.path());
    assert!(!intact, "{output}");
    assert!(output.contains("audit log BROKEN") && output.contains("seq: 2"), "{output}");
}
