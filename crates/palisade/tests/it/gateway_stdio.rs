//! Stdio upstreams through the real binary: a hostile server is confined (network, files,
//! environment, signals, processes, memory, CPU) while the gateway keeps serving others; nothing
//! starts until its launch is approved, and a changed executable or argument is a new,
//! unapproved launch; every caller gets a process of their own, stopped when idle and capped in
//! number; a 2025-era server over stdio is served too.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::gateway_boundary::GatewayUnderTest;
use crate::harness::{Exchange, Palisade, TempDir, tool_call};

#[path = "../../../gateway/tests/support/stdio_fixture.rs"]
pub(crate) mod stdio_fixture;

/// How long a wanted change (a process started or stopped, tools withdrawn) may take.
const DEADLINE: Duration = Duration::from_secs(30);
/// How long the gateway gets to do something it must not do (start an unapproved launch).
const GRACE: Duration = Duration::from_secs(3);

fn chmod(path: &str, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A directory `path` with `mode` (created with its parents).
fn dir(path: &str, mode: u32) -> String {
    std::fs::create_dir_all(path).unwrap();
    chmod(path, mode);
    path.to_owned()
}

/// The configuration's directory, traversable by the sandbox's uids (the executable copied
/// there and the grants must be reachable by them); its data directory stays the gateway's.
fn config_dir(gateway: &GatewayUnderTest) -> String {
    let dir = Path::new(&gateway.config).parent().unwrap().to_str().unwrap().to_owned();
    chmod(&dir, 0o755);
    dir
}

/// Starts the gateway with extra environment variables.
fn start_with_env(gateway: &mut GatewayUnderTest, envs: &[(&str, &str)]) {
    assert!(gateway.server.is_none(), "already running");
    let args = ["gateway", "--config", gateway.config.as_str()];
    gateway.server = Some(Palisade::spawn(&args, envs, TempDir::new()));
}

/// Appends `text` to the configuration file.
fn append_config(gateway: &GatewayUnderTest, text: &str) {
    let config = std::fs::read_to_string(&gateway.config).unwrap() + text;
    std::fs::write(&gateway.config, config).unwrap();
}

/// The pid of the running gateway process (found by its command line, which names the
/// test's own configuration file).
fn gateway_pid(gateway: &GatewayUnderTest) -> u32 {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_gateway = args.get(1) == Some(&b"gateway".as_slice())
            && args.windows(2).any(|pair| pair[0] == b"--config" && pair[1] == gateway.config.as_bytes());
        if is_gateway {
            return pid;
        }
    }
    panic!("the gateway process of {} is not running", gateway.config);
}

/// The JSON report a fixture tool answered.
fn report(answer: &Exchange) -> Value {
    let text = answer.result()["content"][0]["text"].as_str().unwrap_or_else(|| panic!("{:?}", answer.response()));
    serde_json::from_str(text).unwrap()
}

/// A tool call that must succeed; its report.
async fn ok(gateway: &GatewayUnderTest, token: &str, tool: &str, arguments: Value) -> Value {
    let answer = gateway.call(token, tool, arguments).await;
    assert!(answer.response().get("error").is_none(), "{tool}: {:?}", answer.response());
    assert_ne!(answer.result()["isError"], json!(true), "{tool}: {:?}", answer.response());
    report(&answer)
}

/// Whether the answer is a failure: a JSON-RPC error or a tool error.
fn failed_call(answer: &Exchange) -> bool {
    let response = answer.response();
    response.get("error").is_some() || response["result"]["isError"] == json!(true)
}

/// `echo` by `token` answers `text`.
async fn echo(gateway: &GatewayUnderTest, token: &str, tool: &str, text: &str) {
    assert_eq!(ok(gateway, token, tool, json!({"text": text})).await, json!({"text": text}));
}

/// An empty start marker file every sandbox uid may append to (the first process would
/// otherwise create it as its own, closed to the others).
fn marker_file(path: &str) -> String {
    std::fs::write(path, "").unwrap();
    chmod(path, 0o666);
    path.to_owned()
}

/// The `started <pid>` lines in the start marker file.
fn starts(marker: &str) -> usize {
    std::fs::read_to_string(marker).map(|text| text.lines().filter(|l| l.starts_with("started ")).count()).unwrap_or(0)
}

async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until none of `names` is listed.
async fn wait_for_withdrawal(gateway: &GatewayUnderTest, token: &str, names: &[&str]) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let listed = gateway.tool_names(token).await;
        if names.iter().all(|name| !listed.contains(*name)) {
            return;
        }
        assert!(Instant::now() < deadline, "{names:?} were never withdrawn; listed {listed:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asserts `attempt` of the probe report is a failed attempt.
fn assert_blocked(report: &Value, pointer: &str) {
    let attempt = report.pointer(pointer).unwrap_or_else(|| panic!("no {pointer} in {report}"));
    assert_eq!(attempt["ok"], json!(false), "{pointer} was not stopped: {attempt}");
}

fn assert_allowed(report: &Value, pointer: &str) {
    let attempt = report.pointer(pointer).unwrap_or_else(|| panic!("no {pointer} in {report}"));
    assert_eq!(attempt["ok"], json!(true), "{pointer} (a positive control) failed: {attempt}");
}

/// A JSON pointer segment.
fn seg(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// One `[[upstreams]]` entry running `command`, with `extra` keys (and tables) after it.
fn stdio_entry(id: &str, command: &str, extra: &str) -> String {
    format!("[[upstreams]]\nid = \"{id}\"\ncommand = \"{command}\"\n{extra}\n")
}

/// The `[gateway]` table with a uid range of the test's own, so that tests running at once
/// never share a sandbox uid.
fn uid_range(base: u32) -> String {
    format!("[gateway]\nsandbox_uid_base = {base}\n\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_stdio_server_is_confined_and_the_gateway_keeps_serving() {
    let fixture = stdio_fixture::fixture_path();
    let mut gateway = GatewayUnderTest::new("");
    let root = config_dir(&gateway);
    let grants = dir(&format!("{root}/grants"), 0o755);
    let rw = dir(&format!("{grants}/rw"), 0o777);
    let ro = dir(&format!("{grants}/ro"), 0o777);
    let sibling = dir(&format!("{grants}/sibling"), 0o755);
    let open = dir(&format!("{root}/open"), 0o777);
    let sibling_secret = format!("{sibling}/secret.txt");
    std::fs::write(&sibling_secret, "sibling-secret-4c1d").unwrap();
    chmod(&sibling_secret, 0o644);
    let ro_file = format!("{ro}/readable.txt");
    std::fs::write(&ro_file, "read-only-content").unwrap();
    chmod(&ro_file, 0o644);
    let marker = marker_file(&format!("{rw}/started"));
    let body = uid_range(610_000)
        + &stdio_entry(
            "fx",
            fixture.to_str().unwrap(),
            &format!(
                "env = [\"FIXTURE_START_MARKER\"]\ngrants = [{{ path = \"{rw}\", rw = true }}, {{ path = \"{ro}\" }}]\n\
                 request_timeout_secs = 30\n[upstreams.limits]\nmemory_mib = 512\nprocesses = 32\ncpu_secs = 2\nopen_files = 256"
            ),
        );
    append_config(&gateway, &body);
    gateway.cli_ok(&["upstreams", "approve", "fx", "--reviewer", "alice"]);
    let canary = "PALISADE_IT_CANARY_7e21";
    start_with_env(&mut gateway, &[("FIXTURE_START_MARKER", &marker), (canary, "canary-value-9d3f")]);
    gateway.approve_all("fx");
    let alice = gateway.token("alice");
    let bob = gateway.token("bob");
    gateway.wait_for_tools(&alice, &["fx_probe", "fx_spin", "fx_echo", "fx_whoami"]).await;
    echo(&gateway, &bob, "fx_echo", "before").await;

    // Each process runs as a uid of its own, not root.
    let alice_id = ok(&gateway, &alice, "fx_whoami", json!({})).await;
    let bob_id = ok(&gateway, &bob, "fx_whoami", json!({})).await;
    assert_ne!(alice_id["uid"], json!(0), "{alice_id}");
    assert_ne!(alice_id["uid"], bob_id["uid"], "alice {alice_id} bob {bob_id}");

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let tcp = listener.local_addr().unwrap().to_string();
    let data_dir = format!("{root}/data");
    let mut data_files: Vec<String> = std::fs::read_dir(&data_dir)
        .unwrap()
        .flatten()
        .filter(|entry| entry.path().is_file())
        .map(|entry| entry.path().to_str().unwrap().to_owned())
        .collect();
    assert!(!data_files.is_empty(), "the gateway's data directory has files");
    data_files.sort();
    let pid = gateway_pid(&gateway);
    let environ = format!("/proc/{pid}/environ");
    let mut reads = data_files.clone();
    reads.extend([gateway.config.clone(), sibling_secret.clone(), "/etc/shadow".into(), environ, ro_file.clone()]);
    let rw_file = format!("{rw}/written");
    let ro_write = format!("{ro}/written");
    let open_write = format!("{open}/written");
    let writes = [rw_file.clone(), ro_write.clone(), open_write.clone(), "/usr/x".into(), "/etc/x".into()];
    let arguments = json!({
        "tcp": [tcp],
        "resolve": ["example.com:443"],
        "read": reads,
        "write": writes,
        "env": [canary, "FIXTURE_START_MARKER"],
        "kill": [pid],
        "fork": 40,
        "alloc_mib": 1024,
    });
    let probed = ok(&gateway, &alice, "fx_probe", arguments).await;

    assert_blocked(&probed, &format!("/tcp/{}", seg(&tcp)));
    assert!(listener.accept().is_err(), "a connection reached the test's listener");
    assert_blocked(&probed, "/resolve/example.com:443");
    for path in data_files.iter().chain([&gateway.config, &sibling_secret]) {
        assert_blocked(&probed, &format!("/read/{}", seg(path)));
    }
    assert_blocked(&probed, "/read/~1etc~1shadow");
    assert_blocked(&probed, &format!("/read/~1proc~1{pid}~1environ"));
    assert_allowed(&probed, &format!("/read/{}", seg(&ro_file)));
    assert_allowed(&probed, &format!("/write/{}", seg(&rw_file)));
    assert_eq!(std::fs::read_to_string(&rw_file).unwrap(), "x", "the rw grant is the host's directory");
    for path in [&ro_write, &open_write] {
        assert_blocked(&probed, &format!("/write/{}", seg(path)));
        assert!(!Path::new(path).exists(), "{path} was written");
    }
    assert_blocked(&probed, "/write/~1usr~1x");
    assert_blocked(&probed, "/write/~1etc~1x");
    assert!(!Path::new("/usr/x").exists() && !Path::new("/etc/x").exists());
    assert_blocked(&probed, &format!("/env/{canary}"));
    assert_allowed(&probed, "/env/FIXTURE_START_MARKER");
    assert_blocked(&probed, &format!("/kill/{pid}"));
    let fork = &probed["fork"];
    assert_eq!(fork["ok"], json!(false), "forked past limits.processes: {fork}");
    assert!(fork["started"].as_u64().unwrap() < 32, "{fork}");
    assert_blocked(&probed, "/alloc_mib");
    assert!(gateway.is_running(), "the gateway survived the probe");
    echo(&gateway, &bob, "fx_echo", "after the probe").await;

    // CPU past cpu_secs: the process is killed, the call fails; the next call gets a new one.
    let spun = gateway.call(&alice, "fx_spin", json!({"secs": 20})).await;
    assert!(failed_call(&spun), "spin past cpu_secs succeeded: {:?}", spun.response());
    assert!(gateway.is_running());
    echo(&gateway, &bob, "fx_echo", "after the spin").await;
    let deadline = Instant::now() + DEADLINE;
    let again = loop {
        let answer = gateway.call(&alice, "fx_whoami", json!({})).await;
        if !failed_call(&answer) {
            break report(&answer);
        }
        assert!(Instant::now() < deadline, "alice never got a new process: {:?}", answer.response());
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_ne!(again["pid"], json!(null));
    assert!(starts(&marker) >= 4, "the gateway's, alice's, bob's and alice's new process started");
    gateway.stop();
}

/// An approval test's configuration: the fixture copied into the configuration's directory (so
/// the test can replace its bytes), the start marker in a read-write grant.
struct Launch {
    gateway: GatewayUnderTest,
    executable: String,
    marker: String,
    grant: String,
}

impl Launch {
    fn new(uid_base: u32, args: &str) -> Self {
        let mut launch = Self {
            gateway: GatewayUnderTest::new(""),
            executable: String::new(),
            marker: String::new(),
            grant: String::new(),
        };
        let root = config_dir(&launch.gateway);
        let bin = dir(&format!("{root}/bin"), 0o755);
        launch.executable = format!("{bin}/stdio_fixture");
        std::fs::copy(stdio_fixture::fixture_path(), &launch.executable).unwrap();
        chmod(&launch.executable, 0o755);
        launch.grant = dir(&format!("{root}/markers"), 0o777);
        launch.marker = marker_file(&format!("{}/started", launch.grant));
        launch.write_config(uid_base, args);
        launch
    }

    fn write_config(&self, uid_base: u32, args: &str) {
        let text = std::fs::read_to_string(&self.gateway.config).unwrap();
        let head = text.split("[gateway]").next().unwrap().to_owned();
        let entry = stdio_entry(
            "ap",
            &self.executable,
            &format!(
                "args = [{args}]\nenv = [\"FIXTURE_START_MARKER\"]\ngrants = [{{ path = \"{}\", rw = true }}]",
                self.grant
            ),
        );
        std::fs::write(&self.gateway.config, head + &uid_range(uid_base) + &entry).unwrap();
    }

    fn start(&mut self) {
        let marker = self.marker.clone();
        start_with_env(&mut self.gateway, &[("FIXTURE_START_MARKER", &marker)]);
    }

    /// The `state` line of `palisade upstreams show ap`.
    fn shown_state(&self) -> String {
        let shown = self.gateway.cli_ok(&["upstreams", "show", "ap"]);
        let line = shown.lines().find(|line| line.starts_with("state ")).unwrap_or_else(|| panic!("{shown}"));
        line.trim_start_matches("state").trim().to_owned()
    }

    /// Waits until the gateway has answered a listing and had `GRACE` to start something.
    async fn settle(&self, token: &str) {
        assert!(self.gateway.tool_names(token).await.is_empty());
        tokio::time::sleep(GRACE).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_starts_until_the_launch_is_approved_and_a_changed_executable_is_held() {
    let mut launch = Launch::new(620_000, "");
    launch.start();
    let alice = launch.gateway.token("alice");
    let bob = launch.gateway.token("bob");
    launch.settle(&alice).await;
    assert_eq!(starts(&launch.marker), 0, "an unapproved launch started");
    assert!(launch.gateway.tool_names(&alice).await.is_empty());
    let status = launch.gateway.cli(&["gateway", "status"]);
    let stdout = String::from_utf8_lossy(&status.stdout);
    let line = stdout.lines().find(|line| line.trim_start().starts_with("launch: ap ")).unwrap_or_else(|| {
        panic!("no launch line: {stdout}{}", String::from_utf8_lossy(&status.stderr));
    });
    assert!(line.contains(" pending ") && line.contains("never approved"), "{line}");
    assert_eq!(launch.shown_state(), "pending");

    // A wrong digest changes nothing.
    let wrong = launch.gateway.cli(&["upstreams", "approve", "ap", "--reviewer", "alice", "--digest", "0123456789ab"]);
    assert!(!wrong.status.success(), "{}", String::from_utf8_lossy(&wrong.stdout));
    assert_eq!(launch.shown_state(), "pending");
    launch.settle(&alice).await;
    assert_eq!(starts(&launch.marker), 0);

    launch.gateway.cli_ok(&["upstreams", "approve", "ap", "--reviewer", "alice"]);
    assert_eq!(launch.shown_state(), "approved");
    let marker = launch.marker.clone();
    wait_until("the approved launch starts", || starts(&marker) >= 1).await;
    launch.gateway.approve_all("ap");
    launch.gateway.wait_for_tools(&alice, &["ap_echo", "ap_recall"]).await;
    echo(&launch.gateway, &alice, "ap_echo", "approved").await;
    let started = starts(&launch.marker);

    // Other bytes at the same path (a runnable fixture still): new launches are refused and
    // the tools withdrawn.
    let replacement = format!("{}.new", launch.executable);
    let mut bytes = std::fs::read(&launch.executable).unwrap();
    bytes.extend_from_slice(b"appended after the ELF image");
    std::fs::write(&replacement, bytes).unwrap();
    chmod(&replacement, 0o755);
    std::fs::rename(&replacement, &launch.executable).unwrap();
    let refused = launch.gateway.call(&bob, "ap_echo", json!({"text": "new process"})).await;
    assert!(failed_call(&refused), "a process of the changed executable served: {:?}", refused.response());
    // The refused launch makes the gateway re-list at once (pins.relist_secs is 60 here).
    wait_for_withdrawal(&launch.gateway, &alice, &["ap_echo", "ap_recall"]).await;
    assert_eq!(starts(&launch.marker), started, "the changed executable was started");
    assert_eq!(launch.shown_state(), "held");
    let held = launch.gateway.call(&alice, "ap_echo", json!({"text": "held"})).await;
    assert!(failed_call(&held), "{:?}", held.response());
    assert!(launch.gateway.is_running());
    launch.gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_argument_is_a_new_unapproved_launch() {
    let mut launch = Launch::new(630_000, "");
    launch.gateway.cli_ok(&["upstreams", "approve", "ap", "--reviewer", "alice"]);
    launch.start();
    let alice = launch.gateway.token("alice");
    let marker = launch.marker.clone();
    wait_until("the approved launch starts", || starts(&marker) >= 1).await;
    launch.gateway.approve_all("ap");
    launch.gateway.wait_for_tools(&alice, &["ap_echo"]).await;
    launch.gateway.stop();
    let started = starts(&launch.marker);

    launch.write_config(630_000, "\"--legacy\"");
    launch.start();
    launch.settle(&alice).await;
    assert_eq!(starts(&launch.marker), started, "the launch with an added argument started");
    assert!(launch.gateway.tool_names(&alice).await.is_empty());
    assert_eq!(launch.shown_state(), "held");
    launch.gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_a_launch_holds_it_without_a_restart() {
    let mut launch = Launch::new(635_000, "");
    launch.gateway.cli_ok(&["upstreams", "approve", "ap", "--reviewer", "alice"]);
    launch.start();
    let alice = launch.gateway.token("alice");
    let marker = launch.marker.clone();
    wait_until("the approved launch starts", || starts(&marker) >= 1).await;
    launch.gateway.approve_all("ap");
    launch.gateway.wait_for_tools(&alice, &["ap_echo"]).await;
    echo(&launch.gateway, &alice, "ap_echo", "before").await;
    let started = starts(&launch.marker);

    // The same upstream with an added argument, reloaded: a new launch, pinned and held (never
    // started), and the old launch's tools withdrawn when `palisade reload` returns.
    launch.write_config(635_000, "\"--legacy\"");
    launch.gateway.cli_ok(&["reload"]);
    assert!(launch.gateway.tool_names(&alice).await.is_empty(), "the changed launch's tools are still served");
    assert_eq!(launch.shown_state(), "held");
    let held = launch.gateway.call(&alice, "ap_echo", json!({"text": "held"})).await;
    assert!(failed_call(&held), "{:?}", held.response());
    launch.settle(&alice).await;
    assert_eq!(starts(&launch.marker), started, "the reloaded launch started without an approval");

    // Approved again, it serves without a restart.
    launch.gateway.cli_ok(&["upstreams", "approve", "ap", "--reviewer", "alice"]);
    wait_until("the re-approved launch starts", || starts(&marker) > started).await;
    launch.gateway.wait_for_tools(&alice, &["ap_echo"]).await;
    echo(&launch.gateway, &alice, "ap_echo", "after").await;
    assert!(launch.gateway.is_running());
    launch.gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_caller_has_a_process_of_their_own_stopped_when_idle_and_capped() {
    let fixture = stdio_fixture::fixture_path();
    let mut gateway = GatewayUnderTest::new("");
    let root = config_dir(&gateway);
    let grant = dir(&format!("{root}/markers"), 0o777);
    let marker = marker_file(&format!("{grant}/idle-started"));
    let command = fixture.to_str().unwrap();
    let body = uid_range(640_000)
        + &stdio_entry("pu", command, "max_processes = 3")
        + &stdio_entry(
            "idle",
            command,
            &format!("idle_secs = 1\nenv = [\"FIXTURE_START_MARKER\"]\ngrants = [{{ path = \"{grant}\", rw = true }}]"),
        )
        + &stdio_entry("cap", command, "max_processes = 2");
    append_config(&gateway, &body);
    for id in ["pu", "idle", "cap"] {
        gateway.cli_ok(&["upstreams", "approve", id, "--reviewer", "alice"]);
    }
    start_with_env(&mut gateway, &[("FIXTURE_START_MARKER", &marker)]);
    for id in ["pu", "idle", "cap"] {
        gateway.approve_all(id);
    }
    let alice = gateway.token("alice");
    let bob = gateway.token("bob");
    gateway.wait_for_tools(&alice, &["pu_remember", "pu_recall", "idle_remember", "idle_recall", "cap_echo"]).await;

    ok(&gateway, &alice, "pu_remember", json!({"value": "a-secret"})).await;
    assert_eq!(ok(&gateway, &bob, "pu_recall", json!({})).await, json!({"value": null}), "bob sees alice's state");
    assert_eq!(ok(&gateway, &alice, "pu_recall", json!({})).await, json!({"value": "a-secret"}));
    // Inside their PID namespaces both pids may be the same number: the uids tell them apart.
    let alice_uid = ok(&gateway, &alice, "pu_whoami", json!({})).await["uid"].clone();
    let bob_uid = ok(&gateway, &bob, "pu_whoami", json!({})).await["uid"].clone();
    assert_ne!(alice_uid, bob_uid, "one process for two callers");

    // An idle process is stopped: a call after idle_secs without calls meets a new process.
    ok(&gateway, &alice, "idle_remember", json!({"value": "a-secret"})).await;
    let before = starts(&marker);
    let deadline = Instant::now() + DEADLINE;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let recalled = ok(&gateway, &alice, "idle_recall", json!({})).await;
        if recalled == json!({"value": null}) {
            break;
        }
        assert_eq!(recalled, json!({"value": "a-secret"}));
        assert!(Instant::now() < deadline, "alice's idle process was never stopped");
    }
    assert!(starts(&marker) > before, "a new process started for alice");

    // max_processes = 2: the gateway's own and alice's. Bob is refused; alice keeps working,
    // however often bob tries.
    echo(&gateway, &alice, "cap_echo", "first").await;
    let refused = gateway.call(&bob, "cap_echo", json!({"text": "bob"})).await;
    assert!(refused.response().get("error").is_some(), "bob over the cap: {:?}", refused.response());
    echo(&gateway, &alice, "cap_echo", "after bob's first attempt").await;
    // Bob's refusals are the cap's, not the upstream's failures: however often in a row he
    // tries, alice's process keeps serving her.
    for attempt in 0..3 {
        let refused = gateway.call(&bob, "cap_echo", json!({"text": "bob"})).await;
        assert!(refused.response().get("error").is_some(), "bob {attempt}: {:?}", refused.response());
    }
    echo(&gateway, &alice, "cap_echo", "after bob's attempts in a row").await;
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2025_era_stdio_server_is_served_one_process_per_caller() {
    let fixture = stdio_fixture::fixture_path();
    let body = uid_range(650_000) + &stdio_entry("old", fixture.to_str().unwrap(), "args = [\"--legacy\"]");
    let mut gateway = GatewayUnderTest::new(&body);
    config_dir(&gateway);
    gateway.cli_ok(&["upstreams", "approve", "old", "--reviewer", "alice"]);
    gateway.start();
    gateway.approve_all("old");
    let alice = gateway.token("alice");
    let bob = gateway.token("bob");
    gateway.wait_for_tools(&alice, &["old_echo", "old_whoami", "old_remember"]).await;
    ok(&gateway, &alice, "old_remember", json!({"value": "alice's"})).await;
    for (who, token) in [("alice", &alice), ("bob", &bob)] {
        echo(&gateway, token, "old_echo", who).await;
    }
    assert_eq!(ok(&gateway, &bob, "old_recall", json!({})).await, json!({"value": null}));
    assert_eq!(ok(&gateway, &alice, "old_recall", json!({})).await, json!({"value": "alice's"}));
    let alice_uid = ok(&gateway, &alice, "old_whoami", json!({})).await["uid"].clone();
    let bob_uid = ok(&gateway, &bob, "old_whoami", json!({})).await["uid"].clone();
    assert_ne!(alice_uid, bob_uid);
    gateway.stop();

    // The era as the gateway found it.
    let status = gateway.cli(&["gateway", "status"]);
    let stdout = String::from_utf8_lossy(&status.stdout);
    let line = stdout.lines().find(|line| line.starts_with("old  ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("protocol=2025-"), "{line}");
}

/// `upstreams show|approve` and `gateway status` resolve a bare stdio command on the `PATH` the
/// running gateway recorded at its start, not on the operator's shell's: the command here is
/// found only on the gateway's. Before any gateway ran, they say whose `PATH` they used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_resolve_a_bare_command_on_the_gateways_path() {
    let mut gateway = GatewayUnderTest::new("");
    let root = config_dir(&gateway);
    let bin = dir(&format!("{root}/gateway-bin"), 0o755);
    let executable = format!("{bin}/palisade-path-fixture");
    std::fs::copy(stdio_fixture::fixture_path(), &executable).unwrap();
    chmod(&executable, 0o755);
    append_config(&gateway, &(uid_range(655_000) + &stdio_entry("bare", "palisade-path-fixture", "")));
    assert!(!std::env::var("PATH").unwrap_or_default().contains(&bin), "the test's own PATH must not find it");

    let before = gateway.cli(&["upstreams", "show", "bare"]);
    let stderr = String::from_utf8_lossy(&before.stderr);
    assert!(!before.status.success(), "{stderr}");
    assert!(stderr.contains("no gateway has started") && stderr.contains("this shell's PATH"), "{stderr}");

    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    start_with_env(&mut gateway, &[("PATH", &path)]);
    let shown = gateway.cli_ok(&["upstreams", "show", "bare"]);
    assert!(shown.lines().any(|line| line.starts_with("executable ") && line.ends_with(&executable)), "{shown}");
    let status = gateway.cli(&["gateway", "status"]);
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(!stdout.contains("cannot be resolved"), "status resolved on its own PATH: {stdout}");
    let launch = stdout.lines().find(|line| line.starts_with("  launch: bare ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(launch.contains("pending"), "{launch}");
    // The launch the operator approves is the gateway's: it starts the process and lists.
    gateway.cli_ok(&["upstreams", "approve", "bare", "--reviewer", "alice"]);
    let alice = gateway.token("alice");
    wait_until("the gateway listed the approved launch's tools", || {
        gateway.cli_ok(&["pins", "list", "--upstream", "bare"]).lines().any(|line| line.contains("pending"))
    })
    .await;
    gateway.approve_all("bare");
    gateway.wait_for_tools(&alice, &["bare_echo"]).await;
    echo(&gateway, &alice, "bare_echo", "found").await;
}

/// `gateway status` takes `palisade gateway`'s configuration flags and resolves them as it
/// does: with the gateway's `--data-dir` it reads that gateway's state (here, the `PATH` it
/// recorded); without it, it is another data directory, and it says so.
#[test]
fn gateway_status_resolves_the_flags_the_gateway_runs_with() {
    let gateway = GatewayUnderTest::new("");
    let root = config_dir(&gateway);
    let bin = dir(&format!("{root}/gateway-bin"), 0o755);
    let executable = format!("{bin}/palisade-flags-fixture");
    std::fs::copy(stdio_fixture::fixture_path(), &executable).unwrap();
    chmod(&executable, 0o755);
    append_config(&gateway, &(uid_range(656_000) + &stdio_entry("flagged", "palisade-flags-fixture", "")));
    let data = TempDir::new();
    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    let args = ["gateway", "--config", gateway.config.as_str(), "--data-dir", data.path()];
    let _server = Palisade::spawn(&args, &[("PATH", &path)], TempDir::new());

    let status = gateway.cli(&["gateway", "status", "--data-dir", data.path()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&status.stdout), String::from_utf8_lossy(&status.stderr));
    assert!(!stderr.contains("no gateway has started"), "{stderr}");
    let launch =
        stdout.lines().find(|line| line.starts_with("  launch: flagged ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(launch.contains("pending") && !stdout.contains("cannot be resolved"), "{stdout}");

    let elsewhere = gateway.cli(&["gateway", "status"]);
    assert!(String::from_utf8_lossy(&elsewhere.stderr).contains("no gateway has started"));
}

/// The host's processes whose command line names `program` (the sandbox's bubblewrap and the
/// server inside it).
fn processes_running(program: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .filter(|cmdline| cmdline.split(|b| *b == 0).any(|arg| arg == program.as_bytes()))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sandboxed_process_outlives_a_killed_gateway() {
    let mut gateway = GatewayUnderTest::new("");
    let root = config_dir(&gateway);
    let bin = dir(&format!("{root}/bin"), 0o755);
    let program = format!("{bin}/stdio_fixture");
    std::fs::copy(stdio_fixture::fixture_path(), &program).unwrap();
    chmod(&program, 0o755);
    append_config(&gateway, &(uid_range(660_000) + &stdio_entry("orph", &program, "")));
    gateway.cli_ok(&["upstreams", "approve", "orph", "--reviewer", "alice"]);
    gateway.start();
    gateway.approve_all("orph");
    let alice = gateway.token("alice");
    let bob = gateway.token("bob");
    gateway.wait_for_tools(&alice, &["orph_echo"]).await;
    echo(&gateway, &alice, "orph_echo", "a").await;
    echo(&gateway, &bob, "orph_echo", "b").await;
    assert!(processes_running(&program) >= 3, "the gateway's own, alice's and bob's servers run");
    // Alice's server busy for a minute: it reads no stdin, so it would not notice the gateway's
    // end by itself; only the sandbox's death with its parent stops it.
    let spin = tool_call(gateway.server(), &alice, "orph_spin", json!({"secs": 60}));
    tokio::spawn(async move { drop(spin.send().await) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = gateway_pid(&gateway);
    let killed = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    assert!(killed.success());
    wait_until("every sandboxed server is gone with the gateway", || processes_running(&program) == 0).await;
    gateway.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_stdio_upstream_starts_no_process_for_anyone() {
    let mut gateway = GatewayUnderTest::new("[killswitch]\nmode = \"dev\"\n\n");
    let root = config_dir(&gateway);
    let grant = dir(&format!("{root}/markers"), 0o777);
    let marker = marker_file(&format!("{grant}/started"));
    let entry = stdio_entry(
        "ks",
        stdio_fixture::fixture_path().to_str().unwrap(),
        &format!("env = [\"FIXTURE_START_MARKER\"]\ngrants = [{{ path = \"{grant}\", rw = true }}]"),
    );
    append_config(&gateway, &(uid_range(670_000) + &entry));
    gateway.cli_ok(&["upstreams", "approve", "ks", "--reviewer", "alice"]);
    // First run lists and pins; restarted, the development policy is signed over what was approved.
    start_with_env(&mut gateway, &[("FIXTURE_START_MARKER", &marker)]);
    gateway.approve_all("ks");
    gateway.stop();
    start_with_env(&mut gateway, &[("FIXTURE_START_MARKER", &marker)]);
    let alice = gateway.token("alice");
    let bob = gateway.token("bob");
    gateway.wait_for_tools(&alice, &["ks_echo"]).await;
    echo(&gateway, &alice, "ks_echo", "on").await;
    let started = starts(&marker);

    gateway.cli_ok(&["authority", "disable", "--target", "upstream:ks", "--reason", "incident"]);
    for token in [&alice, &bob] {
        let refused = gateway.call(token, "ks_echo", json!({"text": "off"})).await;
        assert_eq!(refused.error_code(), -32030, "{:?}", refused.response());
    }
    assert_eq!(starts(&marker), started, "no process was started for bob while the upstream was disabled");

    gateway.cli_ok(&["authority", "enable", "--target", "upstream:ks", "--reason", "resolved"]);
    echo(&gateway, &bob, "ks_echo", "back").await;
    assert_eq!(starts(&marker), started + 1, "bob's process starts once the upstream is enabled");
    gateway.stop();
}

/// The gateway itself over stdio (`palisade gateway --stdio`, the principal from the
/// environment) in front of a confined stdio upstream: a local client's MCP over two stdio hops.
#[test]
fn the_gateway_over_stdio_relays_to_a_confined_stdio_upstream() {
    use std::io::{BufRead as _, Write as _};
    let body = uid_range(680_000) + &stdio_entry("lo", stdio_fixture::fixture_path().to_str().unwrap(), "");
    let gateway = GatewayUnderTest::new(&body);
    config_dir(&gateway);
    gateway.cli_ok(&["upstreams", "approve", "lo", "--reviewer", "alice"]);
    // `gateway status` lists (and so pins) what the upstream offers; then it is approved.
    let _ = gateway.cli(&["gateway", "status"]);
    gateway.approve_all("lo");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["gateway", "--stdio", "--config", &gateway.config])
        .env("PALISADE_PRINCIPAL_SUBJECT", "alice")
        .env("PALISADE_PRINCIPAL_TENANT", "t1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let value =
                serde_json::from_str(&line).unwrap_or_else(|_| panic!("stdout carried a non-JSON line: {line:?}"));
            if tx.send(value).is_err() {
                break;
            }
        }
    });
    let mut ask = |id: u64, method: &str, params: Value| -> Value {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method,
            "params": crate::harness::with_meta(params, json!({}))});
        writeln!(stdin, "{frame}").unwrap();
        stdin.flush().unwrap();
        loop {
            let message = lines.recv_timeout(DEADLINE).expect("the gateway answered over stdio");
            if message["id"] == json!(id) {
                return message;
            }
        }
    };
    let listed = ask(1, "tools/list", json!({}));
    let names: Vec<&str> =
        listed["result"]["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"lo_echo"), "{listed}");
    let echoed = ask(2, "tools/call", json!({"name": "lo_echo", "arguments": {"text": "two hops"}}));
    assert_eq!(echoed["result"]["structuredContent"], json!({"text": "two hops"}), "{echoed}");
    let me = ask(3, "tools/call", json!({"name": "lo_whoami", "arguments": {}}));
    assert_eq!(me["result"]["structuredContent"]["pid"], 2, "the upstream runs in its own PID namespace: {me}");
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "the gateway exits cleanly at EOF: {status}");
}

/// How most MCP client configurations name a server — `npx -y <package>` — downloads it at every
/// start: the gateway refuses the launch at once (it could not be pinned, finds no network in the
/// sandbox, and used to hang until the answer timeout) and says what to install instead.
#[test]
fn a_launcher_that_downloads_the_server_is_refused_with_what_to_install() {
    let entry = stdio_entry("files", "npx", "args = [\"-y\", \"@modelcontextprotocol/server-filesystem\", \"/srv\"]");
    let gateway = GatewayUnderTest::new(&entry);
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["config", "check", &gateway.config])
        .output()
        .expect("run palisade");
    let outputs = [
        ("config check", check),
        ("gateway status", gateway.cli(&["gateway", "status"])),
        ("upstreams show", gateway.cli(&["upstreams", "show", "files"])),
    ];
    for (args, output) in outputs {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("upstreams[0].command"), "{args:?}: {stderr}");
        assert!(stderr.contains("npx downloads the server each time it starts"), "{args:?}: {stderr}");
        assert!(stderr.contains("npm install -g --prefix"), "{args:?}: {stderr}");
    }
}

/// A server that exits at start says why on stderr (here as a Node server with a missing module
/// does): its last lines are in the error `gateway status` shows, not only in the log.
#[test]
fn a_server_that_exits_at_start_shows_its_last_stderr_lines_in_gateway_status() {
    let script = "echo 'node:internal/modules/esm/resolve:873' >&2; \
                  echo \\\"Error [ERR_MODULE_NOT_FOUND]: Cannot find package 'zod'\\\" >&2; exit 1";
    let body = uid_range(690_000) + &stdio_entry("dies", "/bin/sh", &format!("args = [\"-c\", \"{script}\"]"));
    let gateway = GatewayUnderTest::new(&body);
    gateway.cli_ok(&["upstreams", "approve", "dies", "--reviewer", "alice"]);
    let output = gateway.cli(&["gateway", "status"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "an upstream that cannot start is not healthy: {stdout}");
    let line = stdout.lines().find(|line| line.starts_with("dies ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("closed its stdout; its last stderr lines:"), "{line}");
    assert!(line.contains("Error [ERR_MODULE_NOT_FOUND]: Cannot find package 'zod'"), "{line}");
    assert!(line.contains("node:internal/modules/esm/resolve:873 | Error"), "{line}");
}
