//! The library API's examples (`crates/server/examples/`), built fresh by this test process and
//! run here with `--self-test`: their output is what the pipeline answered, step by step.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Builds every example of `palisade-server` once per test process, so that no test runs a stale
/// binary left by an earlier build (`cargo test --test it` alone does not build examples).
fn build_examples() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let output = Command::new(cargo)
            .args(["build", "--quiet", "--examples", "-p", "palisade-server"])
            .output()
            .expect("running cargo build for the examples");
        assert!(output.status.success(), "building the examples: {}", String::from_utf8_lossy(&output.stderr));
    });
}

/// Runs the example `name` (next to this test binary: `<target>/<profile>/examples/<name>`),
/// freshly built.
fn run_example(name: &str) -> String {
    build_examples();
    let exe = std::env::current_exe().expect("the test binary's own path");
    let profile_dir =
        exe.parent().and_then(|deps| deps.parent()).expect("the test binary lives in <target>/<profile>/deps");
    let path: PathBuf = profile_dir.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let output = Command::new(&path).arg("--self-test").output().unwrap_or_else(|e| panic!("running {path:?}: {e}"));
    assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// The line of `out` that starts with `step` (the self-tests print one line per step).
fn step<'a>(out: &'a str, step: &str) -> &'a str {
    out.lines().find(|line| line.starts_with(step)).unwrap_or_else(|| panic!("no step {step:?} in {out}"))
}

#[test]
fn the_minimal_server_answers_a_typed_call() {
    assert_eq!(run_example("minimal"), "sum = 5\n");
}

#[test]
fn a_needs_confirmation_tool_asks_runs_once_when_accepted_and_refuses_a_replay() {
    let out = run_example("confirmation");
    let asked = step(&out, "asked: ");
    assert!(asked.contains(r#""resultType":"input_required""#), "{out}");
    assert!(asked.contains(r#"Send 500 cents to \"bob\"?"#), "{out}");
    assert!(asked.contains(r#""requestState":"v1."#), "{out}");
    assert_eq!(step(&out, "accepted: "), "accepted: sent 500 cents to bob", "{out}");
    assert_eq!(
        step(&out, "replayed: "),
        r#"replayed: {"code":-32602,"message":"invalid params: this confirmation was already used"}"#,
        "{out}"
    );
    assert_eq!(step(&out, "handler runs: "), "handler runs: 1", "{out}");
    assert_eq!(out.lines().count(), 4, "{out}");
}

#[test]
fn a_task_capable_tool_answers_synchronously_or_as_a_task_polled_to_its_result() {
    let out = run_example("task");
    assert_eq!(step(&out, "synchronous: "), r#"synchronous: {"month":"2026-10","orders":42}"#, "{out}");
    // The task may already be done when it is created; it is a task either way.
    let created = step(&out, "created: ");
    assert!(created.starts_with(r#"created: "task" ""#), "{out}");
    assert_eq!(step(&out, "completed: "), r#"completed: {"month":"2026-11","orders":42}"#, "{out}");
    assert_eq!(out.lines().count(), 3, "{out}");
}

#[test]
fn a_handle_minted_by_one_call_is_resolved_for_the_next() {
    assert_eq!(run_example("handle"), "note: buy milk\n");
}
