//! The library API's examples (`crates/server/examples/`), each built by the test run and run
//! here with `--self-test`: their output is what the pipeline answered.

use std::path::PathBuf;
use std::process::Command;

/// Runs the example `name` (next to this test binary: `<target>/<profile>/examples/<name>`,
/// built first when it is missing).
fn run_example(name: &str) -> String {
    let exe = std::env::current_exe().expect("the test binary's own path");
    let profile_dir =
        exe.parent().and_then(|deps| deps.parent()).expect("the test binary lives in <target>/<profile>/deps");
    let path: PathBuf = profile_dir.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.is_file() {
        // `cargo test` builds the examples; a run of one test target (`--test it`) does not.
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "palisade-server", "--example", name])
            .status()
            .expect("running cargo build for the example");
        assert!(status.success(), "building the example {name}");
    }
    let output = Command::new(&path).arg("--self-test").output().unwrap_or_else(|e| panic!("running {path:?}: {e}"));
    assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

#[test]
fn the_minimal_server_answers_a_typed_call() {
    assert_eq!(run_example("minimal"), "sum = 5\n");
}

#[test]
fn a_needs_confirmation_tool_asks_before_it_runs() {
    let out = run_example("confirmation");
    assert!(out.contains(r#""resultType":"input_required""#), "{out}");
    assert!(out.contains(r#"Send 500 cents to \"bob\"?"#), "{out}");
    assert!(!out.contains("sent 500"), "{out}");
}

#[test]
fn a_task_capable_tool_answers_synchronously_without_the_extension() {
    assert_eq!(run_example("task"), "{\"month\":\"2026-11\",\"orders\":42}\n");
}

#[test]
fn a_handle_minted_by_one_call_is_resolved_for_the_next() {
    assert_eq!(run_example("handle"), "note: buy milk\n");
}
