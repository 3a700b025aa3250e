//! The killswitch module against the real demo (`palisade serve --app demo`, whose kill switch
//! runs in its default `dev` mode: generated keys and an in-process development authority in the
//! data directory), flipping targets with the real `palisade authority disable|enable`: every
//! check passes (its prompt flipped as `prompt:shop_assistant`) and every flipped target ends
//! enabled; with a disable
//! command that changes nothing, the disabled-tool check fails.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;

use palisade_verify::check::Verdict;
use palisade_verify::report::Report;
use palisade_verify::{VerifyArgs, verify};
use support::{Demo, Scratch, assert_no_token, identity, palisade_binary};

/// The demo's data directory as one command-line word.
fn data_dir(demo: &Demo) -> String {
    let dir = demo.data.0.to_str().unwrap().to_owned();
    assert!(!dir.contains(char::is_whitespace), "the flip commands are split on white space: {dir}");
    dir
}

/// `palisade authority <action> --target {target} … --data-dir <the demo's data directory>`.
fn authority_command(demo: &Demo, action: &str) -> String {
    let binary: PathBuf = palisade_binary();
    let binary = binary.to_str().unwrap();
    assert!(!binary.contains(char::is_whitespace), "{binary}");
    let reason = if action == "status" { String::new() } else { " --reason palisade-verify".to_owned() };
    format!("{binary} authority {action} --target {{target}}{reason} --data-dir {}", data_dir(demo))
}

/// The state `palisade authority status` reports for `target` (`ENABLE`, `DISABLE`, or what it said).
fn state_of(demo: &Demo, target: &str) -> String {
    let output = std::process::Command::new(palisade_binary())
        .args(["authority", "status", "--target", target, "--data-dir", &data_dir(demo)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return format!("status failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    // A target never switched has no row: it is enabled.
    if stdout.contains(" DISABLE ") { "DISABLE".into() } else { "ENABLE".into() }
}

/// Runs the killswitch module with `--allow-mutations` and the given flip commands.
async fn run(demo: &Demo, disable: &str, enable: &str) -> (Report, Vec<String>) {
    let scratch = Scratch::new("killswitch-identities");
    let scope = "shop:read shop:basket";
    let tokens = vec![
        demo.token("alice", "acme", "shop-web", scope),
        demo.token("bob", "acme", "shop-web", scope),
        demo.token("carol", "globex", "shop-cli", scope),
    ];
    let files = [
        identity(&scratch, "alice", &tokens[0], "acme", "shop-web"),
        identity(&scratch, "bob", &tokens[1], "acme", "shop-web"),
        identity(&scratch, "carol", &tokens[2], "globex", "shop-cli"),
    ];
    let mut argv = vec![demo.url.clone(), "--i-am-authorized".into(), "--allow-mutations".into()];
    argv.extend(["--module".into(), "killswitch".into()]);
    argv.extend(["--disable-command".into(), disable.to_owned(), "--enable-command".into(), enable.to_owned()]);
    for file in &files {
        argv.extend(["--identity".into(), file.to_str().unwrap().to_owned()]);
    }
    let args = VerifyArgs::parse_from(&argv).unwrap();
    let report = verify(&args, &mut |_, _| {}).await.unwrap();
    (report, tokens)
}

fn verdict_of(report: &Report, id: &str) -> Verdict {
    report.entries.iter().find(|entry| entry.check.id == id).map(|entry| entry.outcome.verdict).unwrap()
}

fn explain(report: &Report) -> String {
    report
        .entries
        .iter()
        .map(|entry| format!("{} {:?}: {}", entry.check.id, entry.outcome.verdict, entry.outcome.detail))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The targets the module flips on the demo.
const FLIPPED: [&str; 5] = [
    "tool:catalog_search",
    "tool:basket_view",
    "prompt:shop_assistant",
    "resource:shop://policies/returns",
    "tool:basket_create",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_passes_every_killswitch_check_it_can_exercise_and_ends_enabled() {
    let demo = Demo::start();
    // The demo's default kill switch: the development authority in its data directory.
    assert!(demo.data.0.join("killswitch-dev").is_dir(), "the demo runs the kill switch in dev mode");
    // Every target the flip commands are asked for is written down by a wrapper that then runs
    // the real command.
    let scratch = Scratch::new("killswitch-asked");
    let asked = scratch.0.join("asked.log");
    let wrapper =
        scratch.file("asked", &format!("#!/bin/sh\nprintf '%s\\n' \"$*\" >> {}\nexec \"$@\"\n", asked.display()));
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let wrapped = |action: &str| format!("{} {}", wrapper.display(), authority_command(&demo, action));
    let (report, tokens) = run(&demo, &wrapped("disable"), &wrapped("enable")).await;
    let all = explain(&report);
    assert!(report.entries.len() >= 8, "{all}");
    assert!(report.entries.iter().all(|entry| entry.check.id.starts_with("killswitch.")), "{all}");
    // Only kinds the kill switch has are asked for, the demo's prompt among them (the real
    // `authority disable --target prompt:shop_assistant`).
    let log = std::fs::read_to_string(&asked).unwrap();
    let targets: Vec<&str> =
        log.lines().filter_map(|line| line.split_whitespace().skip_while(|w| *w != "--target").nth(1)).collect();
    assert!(!targets.is_empty(), "{log}");
    for target in &targets {
        let parsed = palisade_killswitch::parse_target_spec(target);
        assert!(parsed.is_some(), "the flip commands were asked for {target}, no kill-switch target\n{log}");
    }
    assert!(targets.contains(&"prompt:shop_assistant"), "{log}");
    for entry in &report.entries {
        assert_eq!(entry.outcome.verdict, Verdict::Pass, "{}\n{}", all, entry.outcome.transcript.join("\n"));
        assert!(entry.outcome.transcript.len() >= 2, "a pass shows its control and its case: {}", entry.check.id);
    }
    for id in [
        "killswitch.tool.disabled",
        "killswitch.tool.reenabled",
        "killswitch.tool.other_served",
        "killswitch.prompt.disabled",
        "killswitch.prompt.reenabled",
        "killswitch.resource.disabled",
        "killswitch.resource.reenabled",
        "killswitch.dispatch.no_side_effect",
        "killswitch.unlisted.tool",
    ] {
        assert_eq!(verdict_of(&report, id), Verdict::Pass, "{id}\n{all}");
    }
    assert_eq!(report.exit_code(), 0);
    // Every target the run switched off is on again.
    for target in FLIPPED {
        assert_eq!(state_of(&demo, target), "ENABLE", "{target}");
    }
    let json = report.render(palisade_verify::report::Format::Json);
    assert_no_token(&json, &tokens, "killswitch report");
    assert!(!json.contains(&data_dir(&demo)), "the flip command lines are not shown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killswitch_disable_command_that_changes_nothing_fails_the_disabled_tool_check() {
    let demo = Demo::start();
    // `authority status` exits 0 and switches nothing.
    let (report, _) = run(&demo, &authority_command(&demo, "status"), &authority_command(&demo, "enable")).await;
    let all = explain(&report);
    assert_eq!(verdict_of(&report, "killswitch.tool.disabled"), Verdict::Fail, "{all}");
    assert_eq!(verdict_of(&report, "killswitch.resource.disabled"), Verdict::Fail, "{all}");
    assert_eq!(verdict_of(&report, "killswitch.prompt.disabled"), Verdict::Fail, "{all}");
    // Nothing was disabled, so nothing can be judged re-enabled, and the mutating tool is
    // never called under a disable that did not apply.
    assert_eq!(verdict_of(&report, "killswitch.tool.reenabled"), Verdict::Inconclusive, "{all}");
    assert_eq!(verdict_of(&report, "killswitch.dispatch.no_side_effect"), Verdict::Inconclusive, "{all}");
    assert_eq!(report.exit_code(), 1);
    for target in FLIPPED {
        assert_eq!(state_of(&demo, target), "ENABLE", "{target}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_flip_commands_only_the_unlisted_operation_checks_run() {
    let demo = Demo::start();
    let scratch = Scratch::new("killswitch-none");
    let scope = "shop:read shop:basket";
    let alice = identity(&scratch, "alice", &demo.token("alice", "acme", "shop-web", scope), "acme", "shop-web");
    let bob = identity(&scratch, "bob", &demo.token("bob", "acme", "shop-web", scope), "acme", "shop-web");
    let argv = [
        demo.url.as_str(),
        "--i-am-authorized",
        "--allow-mutations",
        "--module",
        "killswitch",
        "--identity",
        alice.to_str().unwrap(),
        "--identity",
        bob.to_str().unwrap(),
    ];
    let report = verify(&VerifyArgs::parse_from(argv).unwrap(), &mut |_, _| {}).await.unwrap();
    assert!(!report.entries.is_empty());
    // An operation the server does not list is refused whether or not a target can be flipped;
    // everything that needs a flip is not testable.
    for entry in &report.entries {
        let expected =
            if entry.check.id.starts_with("killswitch.unlisted.") { Verdict::Pass } else { Verdict::NotTestable };
        assert_eq!(
            entry.outcome.verdict,
            expected,
            "{}: {}\n{}",
            entry.check.id,
            entry.outcome.detail,
            explain(&report)
        );
    }
    assert_eq!(report.entries.iter().filter(|entry| entry.outcome.verdict == Verdict::Pass).count(), 4);
    // One command alone is refused at the command line.
    let mut half: Vec<&str> = argv.to_vec();
    half.extend(["--disable-command", "true"]);
    assert!(VerifyArgs::parse_from(half).is_err());
}
