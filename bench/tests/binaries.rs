//! Every benchmark binary starts and answers `--help`. Having this integration test also makes
//! `cargo test --workspace` build the binaries into `target/debug`, where the benchmark scripts'
//! `--smoke` mode (run by `scripts/test`) finds them without a build of its own.

use std::process::Command;

#[test]
fn every_benchmark_binary_answers_help() {
    let binaries = [
        ("echo-server", env!("CARGO_BIN_EXE_echo-server")),
        ("loadgen", env!("CARGO_BIN_EXE_loadgen")),
        ("tasks-bench", env!("CARGO_BIN_EXE_tasks-bench")),
        ("handle-store", env!("CARGO_BIN_EXE_handle-store")),
        ("audit-append", env!("CARGO_BIN_EXE_audit-append")),
        ("authority", env!("CARGO_BIN_EXE_authority")),
        ("many-tools-upstream", env!("CARGO_BIN_EXE_many-tools-upstream")),
        ("gateway-relist", env!("CARGO_BIN_EXE_gateway-relist")),
        ("policy-decide", env!("CARGO_BIN_EXE_policy-decide")),
        ("rate-limit", env!("CARGO_BIN_EXE_rate-limit")),
    ];
    for (name, path) in binaries {
        let output = Command::new(path).arg("--help").output().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(output.status.success(), "{name} --help failed: {}", String::from_utf8_lossy(&output.stderr));
        assert!(!output.stdout.is_empty(), "{name} --help printed nothing");
    }
}

#[test]
fn loadgen_takes_a_fractional_warm_up_and_refuses_a_negative_one() {
    let loadgen = env!("CARGO_BIN_EXE_loadgen");
    // Argument checks run before any connection: a bad warm-up fails at once.
    let output = Command::new(loadgen)
        .args(["--url", "http://127.0.0.1:9/mcp", "--warmup-secs=-1"])
        .output()
        .expect("loadgen runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("warm-up"), "{}", String::from_utf8_lossy(&output.stderr));
    let output = Command::new(loadgen)
        .args(["--url", "http://127.0.0.1:9/mcp", "--warmup-secs", "0.2"])
        .output()
        .expect("loadgen runs");
    // Port 9 (discard) has no listener on loopback: the probe fails to connect, after the
    // arguments were accepted.
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("connecting"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
