//! What the killswitch checks share: the flip bounds, the exit code of an unsupported kind, the
//! flip commands and their failures, what one flip observed, and the refusal judgement.

use std::io::Read as _;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::check::{Check, Judgement, Verdict};
use crate::modules::Context;
use crate::target::{Exchange, Probe};

/// The exit code with which a flip command says it cannot flip a target of this kind.
pub const UNSUPPORTED_EXIT: i32 = 2;

/// How long a flip may take to apply, polled.
pub(super) const FLIP_BOUND: Duration = Duration::from_secs(3);
/// The interval between two polls of a flip.
pub(super) const POLL_EVERY: Duration = Duration::from_millis(100);
/// How long a flip command may run.
pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a command's stderr kept (its last line is shown, redacted).
pub(super) const STDERR_KEPT: usize = 4096;
/// The most characters of a command's stderr shown.
pub(super) const STDERR_SHOWN: usize = 200;
/// The kill-switch target kinds the flip commands are asked for (`{target}` = `kind:name`):
/// of the kinds Palisade's kill switch has (`server_release`, `tenant`, `client`, `tool`,
/// `prompt`, `resource`, `task`, `subscription`, `upstream`, `object`, `agent`), the three a
/// client can name from what a server lists. A command that cannot flip one of them exits
/// [`UNSUPPORTED_EXIT`], and the checks of that kind are NOT TESTABLE.
pub const FLIPPED_KINDS: [&str; 3] = ["tool", "prompt", "resource"];
/// The value given to a prompt's required arguments.
pub(super) const PROMPT_ARGUMENT: &str = "palisade-verify";

/// Why a flip command did not succeed.
#[derive(Debug, Clone)]
pub(super) enum CommandError {
    /// It exited with [`UNSUPPORTED_EXIT`]: it cannot flip targets of this kind.
    Unsupported(String),
    /// Any other failure.
    Failed(String),
}

/// A tool's required arguments are none.
pub(super) fn no_required(tool: &Value) -> bool {
    tool.pointer("/inputSchema/required").and_then(Value::as_array).is_none_or(Vec::is_empty)
}

/// A tool is annotated read-only.
pub(super) fn read_only(tool: &Value) -> bool {
    tool.pointer("/annotations/readOnlyHint") == Some(&json!(true))
}

/// A tool must run as a task.
pub(super) fn task_only(tool: &Value) -> bool {
    tool.pointer("/execution/taskSupport").and_then(Value::as_str) == Some("required")
}

pub(super) fn name_of(value: &Value) -> Option<&str> {
    value.get("name").and_then(Value::as_str)
}

/// A result that is neither a JSON-RPC error nor a tool error.
pub(super) fn served(exchange: &Exchange) -> bool {
    exchange.accepted() && exchange.result().and_then(|r| r.get("isError")) != Some(&json!(true))
}

/// A short random hex suffix for names no server lists.
pub(super) fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    if aws_lc_rs::rand::fill(&mut bytes).is_err() {
        return "0f1e2d3c4b5a6978".into();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What one flip of a target observed.
pub(super) struct Flip {
    /// The call served before the flip.
    pub(super) control: Exchange,
    /// The disable command's failure, if it failed.
    pub(super) disable_error: Option<CommandError>,
    /// The last answer polled while disabled, and how long after the command it came.
    pub(super) disabled: Option<(Exchange, Duration)>,
    /// The enable command's failure, if it failed.
    pub(super) enable_error: Option<CommandError>,
    /// The last answer polled after the enable command, and how long after it came.
    pub(super) reenabled: Option<(Exchange, Duration)>,
}

impl Flip {
    /// The answer under DISABLE when it was a refusal.
    pub(super) fn refusal(&self) -> Option<&Exchange> {
        self.disabled.as_ref().map(|(exchange, _)| exchange).filter(|exchange| !exchange.accepted())
    }
}

/// A call of an operation the server does not list: a JSON-RPC error (of `expected` when
/// given) is the refusal; a tool-error result is odd; a plain result is an allow.
pub(super) fn unlisted_judgement(negative: &Exchange, what: &str, expected: Option<i64>) -> (Judgement, Verdict) {
    if served(negative) {
        return (Judgement::Accepted(format!("{what} was served ({})", negative.summary())), Verdict::Fail);
    }
    if negative.accepted() {
        let why =
            format!("{what} was answered with a tool-error result, not a JSON-RPC error ({})", negative.summary());
        return (Judgement::RefusedOddly(why), Verdict::Warning);
    }
    match (negative.status, negative.error_code()) {
        (None, _) => (Judgement::RefusedOddly(format!("no answer ({})", negative.summary())), Verdict::Inconclusive),
        (Some(status), _) if status >= 500 => (
            Judgement::RefusedOddly(format!("{what} was refused with a server error ({})", negative.summary())),
            Verdict::Warning,
        ),
        (_, None) => (
            Judgement::RefusedOddly(format!("{what} got no JSON-RPC error ({})", negative.summary())),
            Verdict::Warning,
        ),
        (_, Some(code)) if expected.is_some_and(|expected| expected != code) => (
            Judgement::RefusedOddly(format!(
                "{what} was refused with error {code} ({} expected)",
                expected.unwrap_or_default()
            )),
            Verdict::Warning,
        ),
        _ => (Judgement::Refused, Verdict::Warning),
    }
}

/// `tools/call` of `name` with `arguments` as the first identity.
pub(super) fn call(ctx: &Context, name: &str, arguments: Value) -> Probe {
    Probe::request("tools/call", json!({ "name": name, "arguments": arguments }), ctx.auth())
}

/// Runs `argv` (no shell, stdin closed, stdout discarded), waits at most [`COMMAND_TIMEOUT`];
/// `Err` carries the exit status and the last line of stderr (not yet redacted).
pub(super) fn run_command(argv: &[String]) -> Result<(), CommandError> {
    let (program, args) = argv.split_first().ok_or_else(|| CommandError::Failed("the command is empty".into()))?;
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|error| CommandError::Failed(format!("the command could not be started: {error}")))?;
    let reader = child.stderr.take().map(|mut stderr| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut buffer = [0u8; 1024];
            while let Ok(n) = stderr.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                kept.extend_from_slice(&buffer[..n]);
                if kept.len() > STDERR_KEPT {
                    kept.drain(..kept.len() - STDERR_KEPT);
                }
            }
            kept
        })
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if start.elapsed() >= COMMAND_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("the command did not finish within {} s (killed)", COMMAND_TIMEOUT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(error) => break Err(format!("the command could not be waited for: {error}")),
        }
    };
    let stderr = reader.and_then(|reader| reader.join().ok()).unwrap_or_default();
    let last_line = String::from_utf8_lossy(&stderr)
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .map(|line| line.trim().chars().take(STDERR_SHOWN).collect::<String>())
        .unwrap_or_default();
    let status = status.map_err(CommandError::Failed)?;
    if status.success() {
        return Ok(());
    }
    let said = if last_line.is_empty() { "no stderr".to_owned() } else { format!("stderr: {last_line}") };
    match status.code() {
        Some(UNSUPPORTED_EXIT) => Err(CommandError::Unsupported(said)),
        Some(code) => Err(CommandError::Failed(format!("exit {code}; {said}"))),
        None => Err(CommandError::Failed(format!("killed by a signal; {said}"))),
    }
}

/// The static id of the check among `checks` named `id`.
pub(super) fn check_of_static(checks: &[Check], id: &str) -> Option<&'static str> {
    checks.iter().map(|check| check.id).find(|known| *known == id)
}
