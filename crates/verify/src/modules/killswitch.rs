//! The kill-switch module (seed 003): when the operator supplies a way to flip a target
//! (`--disable-command` and `--enable-command`, each run without a shell with `{target}`
//! replaced by `kind:name`, `kind` one of [`FLIPPED_KINDS`]), a disabled tool and resource must be refused before
//! dispatch and served again once re-enabled; disabling one tool must leave the others served;
//! a disabled mutating tool must create nothing; operations the server does not list must be
//! refused. Every flip is preceded by its positive control (the call served) and followed by the
//! enable command, whatever the verdict.
//!
//! The flips run once per run, one after another (a shared [`Switch`]), so no case of this
//! module sees another's disabled target; each case reports its part of that one sequence.
//! A command exiting with [`UNSUPPORTED_EXIT`] says it cannot flip targets of that kind: the
//! checks of that kind are NOT TESTABLE. Any other failure (an exit code, a timeout) makes them
//! INCONCLUSIVE. A command's output is never shown except a short excerpt of its stderr, through
//! the run's redactor; the command line itself is never shown.

use std::collections::HashMap;
use std::io::Read as _;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::check::{Check, Judgement, Outcome, Severity, Verdict, paired};
use crate::modules::{Context, Module, cases};
use crate::target::{Exchange, Probe};

/// The exit code with which a flip command says it cannot flip a target of this kind.
pub const UNSUPPORTED_EXIT: i32 = 2;

/// How long a flip may take to apply, polled.
const FLIP_BOUND: Duration = Duration::from_secs(3);
/// The interval between two polls of a flip.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// How long a flip command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a command's stderr kept (its last line is shown, redacted).
const STDERR_KEPT: usize = 4096;
/// The most characters of a command's stderr shown.
const STDERR_SHOWN: usize = 200;
/// The kill-switch target kinds the flip commands are asked for (`{target}` = `kind:name`):
/// of the kinds Palisade's kill switch has (`server_release`, `tenant`, `client`, `tool`,
/// `resource`, `task`, `subscription`, `upstream`, `object`, `agent`), the two a client can
/// name from what a server lists. A prompt is no kind: the prompt checks are NOT TESTABLE.
pub const FLIPPED_KINDS: [&str; 2] = ["tool", "resource"];
/// The value given to a prompt's required arguments.
const PROMPT_ARGUMENT: &str = "palisade-verify";

/// The killswitch module.
pub fn module() -> Module {
    Module {
        name: "killswitch",
        exclusive: true,
        cases: cases! {
            from_run: "killswitch.tool.disabled", "A disabled read-only tool is refused",
                "seed 003 AID-H-034.009-G001: covered operations are blocked under DISABLE before dispatch", Critical;
            from_run: "killswitch.tool.refusal", "The refusal of a disabled tool is a JSON-RPC error, not a 5xx or a hang",
                "seed 003 (fail closed); 2026-07-28 basic §Responses (an error object for the request's id)", Medium;
            from_run: "killswitch.tool.before_arguments", "A disabled tool is refused before its arguments are looked at",
                "seed 003 AID-H-034.009-G001: verify the current state before MCP dispatch", Medium;
            from_run: "killswitch.tool.reenabled", "A re-enabled tool is served again",
                "seed 003 Verify safely: signed ENABLE and DISABLE, newer re-enable", High;
            from_run: "killswitch.tool.other_served", "Disabling one tool leaves another tool served",
                "seed 003: the disable state is per target (exact target in each signed head)", Medium;
            from_run: "killswitch.prompt.disabled", "A disabled prompt is refused",
                "seed 003 Verify safely: enumerate every exposed MCP method against the registry", High;
            from_run: "killswitch.prompt.reenabled", "A re-enabled prompt is served again",
                "seed 003 Verify safely: signed ENABLE and DISABLE, newer re-enable", Medium;
            from_run: "killswitch.resource.disabled", "A disabled resource is refused",
                "seed 003 AID-H-034.009-G001 (target kind `resource`)", Critical;
            from_run: "killswitch.resource.reenabled", "A re-enabled resource is served again",
                "seed 003 Verify safely: signed ENABLE and DISABLE, newer re-enable", Medium;
            from_run: "killswitch.dispatch.no_side_effect", "A disabled mutating tool is refused before it creates anything",
                "seed 003: fail-closed pre-dispatch and pre-effect checks; no protected effect under DISABLE", Critical;
            from_run: "killswitch.unlisted.tool", "A tools/call of a tool the server does not list is refused",
                "seed 003 G001: an unlisted operation is an error and never inherits an allow", High;
            from_run: "killswitch.unlisted.prompt", "A prompts/get of a prompt the server does not list is refused",
                "seed 003 G001: an unlisted operation is an error and never inherits an allow", Medium;
            from_run: "killswitch.unlisted.resource", "A resources/read of a resource the server does not list is refused",
                "seed 003 G001: an unlisted operation is an error and never inherits an allow", Medium;
            from_run: "killswitch.unlisted.method", "A method the protocol does not define is refused with -32601",
                "seed 003 Verify safely: an omitted operation; 2026-07-28 basic (JSON-RPC -32601)", Medium;
        },
    }
}

/// How the operator flips a target, and the results of the one flip sequence of a run.
pub struct Switch {
    disable: Option<String>,
    enable: Option<String>,
    results: OnceCell<HashMap<&'static str, Outcome>>,
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The command lines may carry credentials: only whether they were given.
        f.debug_struct("Switch")
            .field("disable", &self.disable.is_some())
            .field("enable", &self.enable.is_some())
            .finish_non_exhaustive()
    }
}

impl Switch {
    /// The operator's disable and enable command lines (`{target}` stands for `kind:name`).
    pub fn new(disable: Option<String>, enable: Option<String>) -> Self {
        let given = |command: Option<String>| command.filter(|line| !line.trim().is_empty());
        Self { disable: given(disable), enable: given(enable), results: OnceCell::new() }
    }

    /// No way to flip a target was given.
    pub fn none() -> Self {
        Self::new(None, None)
    }
}

/// Every case: its part of the run's one flip sequence.
async fn from_run(ctx: &Context, check: Check) -> Outcome {
    let switch = &ctx.killswitch;
    let results = match (switch.disable.as_deref(), switch.enable.as_deref()) {
        (Some(disable), Some(enable)) => switch.results.get_or_init(|| Run::new(ctx, disable, enable).all()).await,
        // An operation the server does not list is refused with or without a flip.
        _ if check.id.starts_with("killswitch.unlisted.") => {
            switch.results.get_or_init(|| Run::new(ctx, "", "").unlisted_only()).await
        }
        _ => {
            return Outcome::new(
                &check,
                Verdict::NotTestable,
                "no way to flip a target was supplied (--disable-command and --enable-command)",
            );
        }
    };
    results
        .get(check.id)
        .cloned()
        .unwrap_or_else(|| Outcome::new(&check, Verdict::Inconclusive, "the case did not run"))
}

/// Why a flip command did not succeed.
#[derive(Debug, Clone)]
enum CommandError {
    /// It exited with [`UNSUPPORTED_EXIT`]: it cannot flip targets of this kind.
    Unsupported(String),
    /// Any other failure.
    Failed(String),
}

/// The check of `id` (for outcomes built before the case asks for them).
fn check_of(id: &'static str) -> Check {
    module().cases.into_iter().map(|case| case.check).find(|check| check.id == id).unwrap_or(Check {
        id,
        title: "",
        requirement: "",
        severity: Severity::Medium,
    })
}

/// A tool's required arguments are none.
fn no_required(tool: &Value) -> bool {
    tool.pointer("/inputSchema/required").and_then(Value::as_array).is_none_or(Vec::is_empty)
}

/// A tool is annotated read-only.
fn read_only(tool: &Value) -> bool {
    tool.pointer("/annotations/readOnlyHint") == Some(&json!(true))
}

/// A tool must run as a task.
fn task_only(tool: &Value) -> bool {
    tool.pointer("/execution/taskSupport").and_then(Value::as_str) == Some("required")
}

fn name_of(value: &Value) -> Option<&str> {
    value.get("name").and_then(Value::as_str)
}

/// A result that is neither a JSON-RPC error nor a tool error.
fn served(exchange: &Exchange) -> bool {
    exchange.accepted() && exchange.result().and_then(|r| r.get("isError")) != Some(&json!(true))
}

/// A short random hex suffix for names no server lists.
fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    if aws_lc_rs::rand::fill(&mut bytes).is_err() {
        return "0f1e2d3c4b5a6978".into();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What one flip of a target observed.
struct Flip {
    /// The call served before the flip.
    control: Exchange,
    /// The disable command's failure, if it failed.
    disable_error: Option<CommandError>,
    /// The last answer polled while disabled, and how long after the command it came.
    disabled: Option<(Exchange, Duration)>,
    /// The enable command's failure, if it failed.
    enable_error: Option<CommandError>,
    /// The last answer polled after the enable command, and how long after it came.
    reenabled: Option<(Exchange, Duration)>,
}

impl Flip {
    /// The answer under DISABLE when it was a refusal.
    fn refusal(&self) -> Option<&Exchange> {
        self.disabled.as_ref().map(|(exchange, _)| exchange).filter(|exchange| !exchange.accepted())
    }
}

/// The run's flip sequence.
struct Run<'a> {
    ctx: &'a Context,
    disable: &'a str,
    enable: &'a str,
    results: HashMap<&'static str, Outcome>,
    /// Targets whose enable command failed: retried at the end.
    to_restore: Vec<String>,
}

impl<'a> Run<'a> {
    fn new(ctx: &'a Context, disable: &'a str, enable: &'a str) -> Self {
        Self { ctx, disable, enable, results: HashMap::new(), to_restore: Vec::new() }
    }

    fn record(&mut self, outcome: Outcome) {
        let id = check_of_static(&outcome.id);
        if let Some(id) = id {
            self.results.insert(id, outcome);
        }
    }

    fn verdict(&mut self, id: &'static str, verdict: Verdict, detail: impl Into<String>, with: &[&Exchange]) {
        self.record(Outcome::new(&check_of(id), verdict, detail).with(with));
    }

    /// Every check, in an order where no flip overlaps another.
    async fn all(mut self) -> HashMap<&'static str, Outcome> {
        let listed = self.ctx.target.send(Probe::request("tools/list", json!({}), self.ctx.auth())).await;
        let tools = self.callable_tools(&listed);
        let probe_tool = self.probe_tool(&tools).await;
        let refusal_code = self.tool_checks(&listed, &tools, probe_tool.as_ref()).await;
        self.prompt_checks().await;
        self.resource_checks().await;
        self.mutating_check(&tools, probe_tool.as_ref(), refusal_code).await;
        self.unlisted_checks(&listed, probe_tool.as_ref()).await;
        for target in std::mem::take(&mut self.to_restore) {
            // Best effort: the failure was already reported on the case.
            let _ = self.command(self.enable, &target).await;
        }
        self.results
    }

    /// Only the unlisted-operation checks (no flip command was given): each with the control a
    /// full run would use.
    async fn unlisted_only(mut self) -> HashMap<&'static str, Outcome> {
        let listed = self.ctx.target.send(Probe::request("tools/list", json!({}), self.ctx.auth())).await;
        let tools = self.callable_tools(&listed);
        let probe_tool = self.probe_tool(&tools).await;
        self.unlisted_checks(&listed, probe_tool.as_ref()).await;
        match self.first_prompt().await {
            Ok((_, probe)) => {
                let control = self.ctx.target.send(probe).await;
                self.unlisted_prompt(&control).await;
            }
            Err(listed) => self.unlisted_prompt(&listed).await,
        }
        let found = self.served_resource().await.1;
        self.unlisted_resource(found.as_ref().map(|(uri, _, control)| (uri.as_str(), control))).await;
        self.results
    }

    /// The first listed prompt and a `prompts/get` of it (its required arguments filled with a
    /// constant string); `Err(listing)` when none is listed.
    async fn first_prompt(&self) -> Result<(String, Probe), Exchange> {
        let listed = self.ctx.target.send(Probe::request("prompts/list", json!({}), self.ctx.auth())).await;
        let prompts = listed.result().and_then(|r| r.get("prompts")).and_then(Value::as_array).cloned();
        let Some(prompt) = prompts.unwrap_or_default().into_iter().next() else { return Err(listed) };
        let Some(name) = name_of(&prompt) else { return Err(listed) };
        let arguments: serde_json::Map<String, Value> = prompt
            .get("arguments")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|argument| argument.get("required") == Some(&json!(true)))
            .filter_map(name_of)
            .map(|argument| (argument.to_owned(), json!(PROMPT_ARGUMENT)))
            .collect();
        let probe = Probe::request("prompts/get", json!({ "name": name, "arguments": arguments }), self.ctx.auth());
        Ok((name.to_owned(), probe))
    }

    /// The listing and the first of its first three resources whose read is served (its URI,
    /// read probe and answer).
    async fn served_resource(&self) -> (Exchange, Option<(String, Probe, Exchange)>) {
        let listed = self.ctx.target.send(Probe::request("resources/list", json!({}), self.ctx.auth())).await;
        let resources = listed.result().and_then(|r| r.get("resources")).and_then(Value::as_array).cloned();
        let uris: Vec<String> = resources
            .unwrap_or_default()
            .iter()
            .filter_map(|r| r.get("uri").and_then(Value::as_str).map(str::to_owned))
            .collect();
        for uri in uris.iter().take(3) {
            let probe = Probe::request("resources/read", json!({ "uri": uri }), self.ctx.auth());
            let control = self.ctx.target.send(probe.clone()).await;
            if control.accepted() {
                return (listed, Some((uri.clone(), probe, control)));
            }
        }
        (listed, None)
    }

    /// The first tool annotated read-only with no required arguments whose call is served,
    /// with that call.
    async fn probe_tool(&self, tools: &[Value]) -> Option<(String, Exchange)> {
        for tool in tools.iter().filter(|t| read_only(t) && no_required(t) && !task_only(t)).take(3) {
            let Some(name) = name_of(tool) else { continue };
            let exchange = self.ctx.target.send(call(self.ctx, name, json!({}))).await;
            if served(&exchange) {
                return Some((name.to_owned(), exchange));
            }
        }
        None
    }

    /// The listed tools the one rule lets a check call (every tool this module calls is one).
    fn callable_tools(&self, listed: &Exchange) -> Vec<Value> {
        let tools = listed.result().and_then(|r| r.get("tools")).and_then(Value::as_array).cloned().unwrap_or_default();
        self.ctx.callable_tools(&tools).into_iter().map(|(_, tool)| tool.clone()).collect()
    }

    /// Runs a flip command for `target`; `Err` says why it failed.
    async fn command(&self, line: &str, target: &str) -> Result<(), CommandError> {
        let argv: Vec<String> = line.split_whitespace().map(|word| word.replace("{target}", target)).collect();
        let result = tokio::task::spawn_blocking(move || run_command(&argv))
            .await
            .unwrap_or_else(|error| Err(CommandError::Failed(format!("the command could not be waited for: {error}"))));
        result.map_err(|error| match error {
            CommandError::Unsupported(why) => CommandError::Unsupported(self.ctx.target.redactor().redact(&why)),
            CommandError::Failed(why) => CommandError::Failed(self.ctx.target.redactor().redact(&why)),
        })
    }

    /// Runs the enable command for `target` after a failed disable; a target it fails for
    /// (other than by saying it cannot flip that kind) is retried at the end.
    async fn restore(&mut self, target: &str) {
        if let Err(CommandError::Failed(_)) = self.command(self.enable, target).await {
            self.to_restore.push(target.to_owned());
        }
    }

    /// Sends `probe` until `done` holds of the answer (at most [`FLIP_BOUND`]); the last answer
    /// and how long after the start it came.
    async fn poll(&self, probe: &Probe, done: impl Fn(&Exchange) -> bool) -> (Exchange, Duration) {
        let start = Instant::now();
        loop {
            let exchange = self.ctx.target.send(probe.clone()).await;
            if done(&exchange) || start.elapsed() >= FLIP_BOUND {
                return (exchange, start.elapsed());
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Flips `target` off and on around `probe` (served first); `while_disabled` runs once
    /// the refusal is seen, before the enable command.
    async fn flip(
        &mut self,
        target: &str,
        probe: &Probe,
        control: Option<Exchange>,
        while_disabled: impl AsyncFnOnce(&Exchange) -> Vec<Exchange>,
    ) -> (Flip, Vec<Exchange>) {
        let control = match control {
            Some(control) => control,
            None => self.ctx.target.send(probe.clone()).await,
        };
        let mut flip = Flip { control, disable_error: None, disabled: None, enable_error: None, reenabled: None };
        if !flip.control.accepted() {
            return (flip, Vec::new());
        }
        let mut extra = Vec::new();
        match self.command(self.disable, target).await {
            Err(error) => {
                flip.disable_error = Some(error);
                // Whatever the command did before failing is undone.
                self.restore(target).await;
                return (flip, extra);
            }
            Ok(()) => {
                let (exchange, took) = self.poll(probe, |exchange| !exchange.accepted()).await;
                if !exchange.accepted() {
                    extra = while_disabled(&exchange).await;
                }
                flip.disabled = Some((exchange, took));
            }
        }
        match self.command(self.enable, target).await {
            Err(error) => {
                flip.enable_error = Some(error);
                self.to_restore.push(target.to_owned());
            }
            Ok(()) => flip.reenabled = Some(self.poll(probe, Exchange::accepted).await),
        }
        (flip, extra)
    }

    /// The `disabled` and `reenabled` outcomes of a flip of `target`.
    fn judge_flip(&mut self, flip: &Flip, target: &str, disabled_id: &'static str, reenabled_id: &'static str) {
        let control = &flip.control;
        if !control.accepted() {
            let detail = format!("positive control not accepted ({}): nothing to flip", control.summary());
            self.verdict(disabled_id, Verdict::Inconclusive, detail.clone(), &[control]);
            self.verdict(reenabled_id, Verdict::Inconclusive, detail, &[control]);
            return;
        }
        if let Some(error) = &flip.disable_error {
            let (verdict, detail) = match error {
                CommandError::Unsupported(why) => (
                    Verdict::NotTestable,
                    format!("the disable command cannot flip {target} (exit {UNSUPPORTED_EXIT}: {why})"),
                ),
                CommandError::Failed(why) => {
                    (Verdict::Inconclusive, format!("the disable command for {target} failed: {why}"))
                }
            };
            self.verdict(disabled_id, verdict, detail.clone(), &[control]);
            self.verdict(reenabled_id, verdict, detail, &[control]);
            return;
        }
        let Some((disabled, took)) = &flip.disabled else { return };
        let judgement = if disabled.accepted() {
            Judgement::Accepted(format!(
                "{target} was still served {:.1} s after the disable command succeeded ({})",
                took.as_secs_f64(),
                disabled.summary()
            ))
        } else {
            Judgement::Refused
        };
        let mut outcome = paired(&check_of(disabled_id), control, disabled, judgement, Verdict::Fail);
        if outcome.verdict == Verdict::Pass {
            outcome.detail = format!(
                "{target} refused {:.2} s after the disable command returned ({}); served before",
                took.as_secs_f64(),
                disabled.summary()
            );
        }
        self.record(outcome);
        let reenabled_check = check_of(reenabled_id);
        let outcome = match (&flip.enable_error, &flip.reenabled) {
            _ if disabled.accepted() => Outcome::new(
                &reenabled_check,
                Verdict::Inconclusive,
                format!("the disable of {target} never took effect: nothing was re-enabled"),
            )
            .with(&[control, disabled]),
            (Some(CommandError::Failed(why) | CommandError::Unsupported(why)), _) => Outcome::new(
                &reenabled_check,
                Verdict::Inconclusive,
                format!("the enable command for {target} failed: {why}"),
            )
            .with(&[control, disabled]),
            (None, Some((after, took))) if after.accepted() => Outcome::new(
                &reenabled_check,
                Verdict::Pass,
                format!(
                    "{target} served again {:.2} s after the enable command returned; refused while disabled",
                    took.as_secs_f64()
                ),
            )
            .with(&[control, disabled, after]),
            (None, Some((after, took))) => Outcome::new(
                &reenabled_check,
                Verdict::Fail,
                format!(
                    "{target} was still refused {:.1} s after the enable command succeeded ({})",
                    took.as_secs_f64(),
                    after.summary()
                ),
            )
            .with(&[control, disabled, after]),
            (None, None) => Outcome::new(&reenabled_check, Verdict::Inconclusive, "the enable step did not run"),
        };
        self.record(outcome);
    }

    /// The read-only tool's flip and the checks made around it; the refusal's JSON-RPC error
    /// code when the disable took effect.
    async fn tool_checks(
        &mut self,
        listed: &Exchange,
        tools: &[Value],
        probe_tool: Option<&(String, Exchange)>,
    ) -> Option<i64> {
        const TOOL_IDS: [&str; 5] = [
            "killswitch.tool.disabled",
            "killswitch.tool.refusal",
            "killswitch.tool.before_arguments",
            "killswitch.tool.reenabled",
            "killswitch.tool.other_served",
        ];
        let Some((name, control)) = probe_tool else {
            let detail = format!(
                "no tool annotated read-only without required arguments is served (tools/list: {})",
                listed.summary()
            );
            for id in TOOL_IDS {
                self.verdict(id, Verdict::NotTestable, detail.clone(), &[listed]);
            }
            return None;
        };
        let target = format!("tool:{name}");
        let probe = call(self.ctx, name, json!({}));
        // The same call with an argument the tool does not declare, while still enabled.
        let odd_arguments = json!({ "palisade_verify_undeclared": true });
        let odd_probe = call(self.ctx, name, odd_arguments);
        let odd_enabled = self.ctx.target.send(odd_probe.clone()).await;
        let ctx = self.ctx;
        let (flip, extra) = self
            .flip(&target, &probe, Some(control.clone()), async |_refusal: &Exchange| {
                vec![ctx.target.send(odd_probe.clone()).await]
            })
            .await;
        self.judge_flip(&flip, &target, "killswitch.tool.disabled", "killswitch.tool.reenabled");

        // The refusal's shape.
        let refusal = flip.refusal();
        let outcome = match (&flip.disabled, refusal) {
            (_, Some(refused)) => {
                let status = refused.status;
                let (verdict, detail) = match (status, refused.error()) {
                    (None, _) => (Verdict::Fail, format!("no answer under DISABLE ({})", refused.summary())),
                    (Some(code), _) if code >= 500 => {
                        (Verdict::Fail, format!("refused with a server error ({})", refused.summary()))
                    }
                    (Some(_), None) => {
                        (Verdict::Fail, format!("refused without a JSON-RPC error object ({})", refused.summary()))
                    }
                    (Some(_), Some(_)) => {
                        (Verdict::Pass, format!("refused with a JSON-RPC error ({})", refused.summary()))
                    }
                };
                Outcome::new(&check_of(TOOL_IDS[1]), verdict, detail).with(&[&flip.control, refused])
            }
            _ => Outcome::new(
                &check_of(TOOL_IDS[1]),
                Verdict::Inconclusive,
                format!("{target} was never refused: no refusal to judge"),
            )
            .with(&[&flip.control]),
        };
        self.record(outcome);
        let refusal_code = refusal.and_then(Exchange::error_code);

        // Before the arguments: the undeclared argument changes nothing under DISABLE.
        let before = check_of(TOOL_IDS[2]);
        let outcome = match (refusal, extra.first()) {
            (Some(refused), Some(odd_disabled)) => {
                let differs_when_enabled = odd_enabled.accepted() || odd_enabled.error_code() != refusal_code;
                if !differs_when_enabled {
                    Outcome::new(
                        &before,
                        Verdict::Inconclusive,
                        format!(
                            "the undeclared argument is refused like the disabled call even when enabled ({}): \
                             nothing to tell apart",
                            odd_enabled.summary()
                        ),
                    )
                    .with(&[&odd_enabled, refused, odd_disabled])
                } else {
                    let judgement = if odd_disabled.accepted() {
                        Judgement::Accepted(format!(
                            "under DISABLE the call with an undeclared argument reached the tool ({}): \
                             its arguments were handled before the kill switch",
                            odd_disabled.summary()
                        ))
                    } else if odd_disabled.error_code() != refusal_code {
                        Judgement::RefusedOddly(format!(
                            "under DISABLE the call with an undeclared argument got {} instead of the kill \
                             switch's refusal ({}): the arguments were checked first",
                            odd_disabled.summary(),
                            refused.summary()
                        ))
                    } else {
                        Judgement::Refused
                    };
                    let mut outcome = paired(&before, &flip.control, odd_disabled, judgement, Verdict::Warning)
                        .with(&[&odd_enabled, refused]);
                    if outcome.verdict == Verdict::Pass {
                        outcome.detail = format!(
                            "under DISABLE an undeclared argument gets the same refusal ({}) as a valid call; \
                             enabled it gets {}",
                            odd_disabled.summary(),
                            odd_enabled.summary()
                        );
                    }
                    outcome
                }
            }
            _ => {
                Outcome::new(&before, Verdict::Inconclusive, format!("{target} was never refused: nothing to compare"))
                    .with(&[&flip.control])
            }
        };
        self.record(outcome);
        self.other_tool(tools, name, control, refusal_code).await;
        refusal_code
    }

    /// Disables another read-only tool and calls the probe tool: it must still be served.
    async fn other_tool(&mut self, tools: &[Value], probe_name: &str, control: &Exchange, refusal_code: Option<i64>) {
        let id = "killswitch.tool.other_served";
        let Some(refusal_code) = refusal_code else {
            let detail = "the probe tool's disable never produced a refusal: an unflipped other tool proves nothing";
            return self.verdict(id, Verdict::Inconclusive, detail, &[control]);
        };
        let Some(other) = tools.iter().filter(|t| read_only(t)).filter_map(name_of).find(|name| *name != probe_name)
        else {
            let detail = "the target lists only one read-only tool: there is no other tool to keep served";
            return self.verdict(id, Verdict::NotTestable, detail, &[control]);
        };
        let target = format!("tool:{other}");
        // Empty arguments: a read-only tool, and refused or answered with an error when it
        // needs some. Its answer must change to the kill switch's refusal once disabled.
        let other_probe = call(self.ctx, other, json!({}));
        let other_before = self.ctx.target.send(other_probe.clone()).await;
        if other_before.error_code() == Some(refusal_code) {
            let detail = format!(
                "{target} is already answered with the kill switch's refusal code ({}): its disable cannot be told",
                other_before.summary()
            );
            return self.verdict(id, Verdict::Inconclusive, detail, &[control, &other_before]);
        }
        if let Err(error) = self.command(self.disable, &target).await {
            self.restore(&target).await;
            let (verdict, why) = match error {
                CommandError::Unsupported(why) => (Verdict::NotTestable, why),
                CommandError::Failed(why) => (Verdict::Inconclusive, why),
            };
            return self.verdict(id, verdict, format!("the disable command for {target} failed: {why}"), &[control]);
        }
        let (other_disabled, _) = self.poll(&other_probe, |exchange| exchange.error_code() == Some(refusal_code)).await;
        let probe_now = self.ctx.target.send(call(self.ctx, probe_name, json!({}))).await;
        if self.command(self.enable, &target).await.is_err() {
            self.to_restore.push(target.clone());
        } else {
            // Restored before the next flip; not judged here.
            let _ = self.poll(&other_probe, |exchange| exchange.error_code() != Some(refusal_code)).await;
        }
        let exchanges = [control, &other_before, &other_disabled, &probe_now];
        if other_disabled.error_code() != Some(refusal_code) {
            let detail = format!(
                "{target} was not refused like a disabled tool ({}): its disable did not take effect",
                other_disabled.summary()
            );
            return self.verdict(id, Verdict::Inconclusive, detail, &exchanges);
        }
        let (verdict, detail) = if served(&probe_now) {
            (Verdict::Pass, format!("with {target} disabled (refused), tool:{probe_name} was still served"))
        } else {
            (
                Verdict::Fail,
                format!(
                    "disabling {target} also stopped tool:{probe_name} ({}): the disable is not per target",
                    probe_now.summary()
                ),
            )
        };
        self.verdict(id, verdict, detail, &exchanges);
    }

    /// The prompt checks: a prompt is no kill-switch target kind ([`FLIPPED_KINDS`]), so the
    /// flip commands are never asked for one and both checks are NOT TESTABLE; the first
    /// prompt's `prompts/get` is still the unlisted prompt's control.
    async fn prompt_checks(&mut self) {
        let (disabled, reenabled) = ("killswitch.prompt.disabled", "killswitch.prompt.reenabled");
        let detail = format!(
            "a prompt is no kill-switch target kind (the flip commands are asked only for {} targets): \
             a prompt is switched through the kinds it falls under (server_release, tenant, client)",
            FLIPPED_KINDS.iter().map(|kind| format!("{kind}:")).collect::<Vec<_>>().join(" and ")
        );
        self.verdict(disabled, Verdict::NotTestable, detail.clone(), &[]);
        self.verdict(reenabled, Verdict::NotTestable, detail, &[]);
        match self.first_prompt().await {
            Ok((_, probe)) => {
                let control = self.ctx.target.send(probe).await;
                self.unlisted_prompt(&control).await;
            }
            Err(listed) => self.unlisted_prompt(&listed).await,
        }
    }

    /// The first listed resource that is served: its flip.
    async fn resource_checks(&mut self) {
        let (disabled, reenabled) = ("killswitch.resource.disabled", "killswitch.resource.reenabled");
        let (listed, found) = self.served_resource().await;
        let Some((uri, probe, control)) = found else {
            let detail = format!("no listed resource is served (resources/list: {})", listed.summary());
            self.verdict(disabled, Verdict::NotTestable, detail.clone(), &[&listed]);
            self.verdict(reenabled, Verdict::NotTestable, detail, &[&listed]);
            return self.unlisted_resource(None).await;
        };
        let target = format!("resource:{uri}");
        let (flip, _) = self.flip(&target, &probe, Some(control), async |_: &Exchange| Vec::new()).await;
        self.judge_flip(&flip, &target, disabled, reenabled);
        self.unlisted_resource(Some((&uri, &flip.control))).await;
    }

    /// A mutating tool without required arguments, disabled, called once: refused like the
    /// read-only tool and no object returned.
    async fn mutating_check(
        &mut self,
        tools: &[Value],
        probe_tool: Option<&(String, Exchange)>,
        refusal_code: Option<i64>,
    ) {
        let id = "killswitch.dispatch.no_side_effect";
        if !self.ctx.allow_mutations {
            let detail = "calling a mutating tool has a side effect: not run without --allow-mutations";
            return self.verdict(id, Verdict::NotTestable, detail, &[]);
        }
        let probe_name = probe_tool.map(|(name, _)| name.as_str());
        let Some(name) = tools
            .iter()
            .filter(|t| !read_only(t) && no_required(t) && !task_only(t))
            .filter_map(name_of)
            .find(|name| Some(*name) != probe_name)
        else {
            let detail = "the target lists no mutating tool without required arguments";
            return self.verdict(id, Verdict::NotTestable, detail, &[]);
        };
        let Some(refusal_code) = refusal_code else {
            let detail = "the read-only tool's disable never produced a refusal: a mutating tool is not called \
                          under a disable that may not apply";
            return self.verdict(id, Verdict::Inconclusive, detail, &[]);
        };
        let target = format!("tool:{name}");
        let probe = call(self.ctx, name, json!({}));
        let control = self.ctx.target.send(probe.clone()).await;
        if !served(&control) {
            let detail = format!("positive control not served ({}): nothing to compare with", control.summary());
            return self.verdict(id, Verdict::Inconclusive, detail, &[&control]);
        }
        if let Err(error) = self.command(self.disable, &target).await {
            self.restore(&target).await;
            let (verdict, why) = match error {
                CommandError::Unsupported(why) => (Verdict::NotTestable, why),
                CommandError::Failed(why) => (Verdict::Inconclusive, why),
            };
            return self.verdict(id, verdict, format!("the disable command for {target} failed: {why}"), &[&control]);
        }
        // Called once only: every call that is served creates something.
        let negative = self.ctx.target.send(probe.clone()).await;
        if self.command(self.enable, &target).await.is_err() {
            self.to_restore.push(target.clone());
        }
        let judgement = if negative.accepted() {
            Judgement::Accepted(format!(
                "the disabled mutating {target} was dispatched ({}): it ran and returned a result",
                negative.summary()
            ))
        } else if negative.error_code() != Some(refusal_code) {
            Judgement::RefusedOddly(format!(
                "the disabled {target} was refused with {} rather than the pre-dispatch refusal (error {refusal_code}) \
                 of a disabled read-only tool: the refusal may come from the handler after it began",
                negative.summary()
            ))
        } else {
            Judgement::Refused
        };
        let mut outcome = paired(&check_of(id), &control, &negative, judgement, Verdict::Warning);
        if outcome.verdict == Verdict::Pass {
            outcome.detail = format!(
                "the disabled {target} got the pre-dispatch refusal ({}) and returned no result, so no object; \
                 served (an object returned) before",
                negative.summary()
            );
        }
        self.record(outcome);
    }

    /// Operations the server does not list: a tool name and a method.
    async fn unlisted_checks(&mut self, listed: &Exchange, probe_tool: Option<&(String, Exchange)>) {
        let control = probe_tool.map_or(listed, |(_, control)| control);
        let name = format!("palisade-verify-unlisted-{}", random_suffix());
        let negative = self.ctx.target.send(call(self.ctx, &name, json!({}))).await;
        let (judgement, odd) = unlisted_judgement(&negative, "the unlisted tool", None);
        let outcome = paired(&check_of("killswitch.unlisted.tool"), control, &negative, judgement, odd);
        self.record(outcome);
        let method = format!("palisade-verify/unlisted-{}", random_suffix());
        let negative = self.ctx.target.send(Probe::request(&method, json!({}), self.ctx.auth())).await;
        let (judgement, odd) = unlisted_judgement(&negative, "the unknown method", Some(-32601));
        let outcome = paired(&check_of("killswitch.unlisted.method"), listed, &negative, judgement, odd);
        self.record(outcome);
    }

    async fn unlisted_prompt(&mut self, control: &Exchange) {
        let name = format!("palisade-verify-unlisted-{}", random_suffix());
        let probe = Probe::request("prompts/get", json!({ "name": name }), self.ctx.auth());
        let negative = self.ctx.target.send(probe).await;
        let (judgement, odd) = unlisted_judgement(&negative, "the unlisted prompt", None);
        self.record(paired(&check_of("killswitch.unlisted.prompt"), control, &negative, judgement, odd));
    }

    async fn unlisted_resource(&mut self, found: Option<(&str, &Exchange)>) {
        let id = "killswitch.unlisted.resource";
        let Some((uri, control)) = found else {
            return self.verdict(id, Verdict::NotTestable, "no listed resource is served: no control", &[]);
        };
        let scheme = uri.split_once("://").map_or("file", |(scheme, _)| scheme);
        let unlisted = format!("{scheme}://palisade-verify-unlisted/{}", random_suffix());
        let probe = Probe::request("resources/read", json!({ "uri": unlisted }), self.ctx.auth());
        let negative = self.ctx.target.send(probe).await;
        let (judgement, odd) = unlisted_judgement(&negative, "the unlisted resource", None);
        self.record(paired(&check_of(id), control, &negative, judgement, odd));
    }
}

/// The static id of a check of this module named `id`.
fn check_of_static(id: &str) -> Option<&'static str> {
    module().cases.into_iter().map(|case| case.check.id).find(|known| *known == id)
}

/// A call of an operation the server does not list: a JSON-RPC error (of `expected` when
/// given) is the refusal; a tool-error result is odd; a plain result is an allow.
fn unlisted_judgement(negative: &Exchange, what: &str, expected: Option<i64>) -> (Judgement, Verdict) {
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
fn call(ctx: &Context, name: &str, arguments: Value) -> Probe {
    Probe::request("tools/call", json!({ "name": name, "arguments": arguments }), ctx.auth())
}

/// Runs `argv` (no shell, stdin closed, stdout discarded), waits at most [`COMMAND_TIMEOUT`];
/// `Err` carries the exit status and the last line of stderr (not yet redacted).
fn run_command(argv: &[String]) -> Result<(), CommandError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flip_commands_are_asked_only_for_kinds_the_kill_switch_has() {
        let kinds: Vec<&str> = palisade_killswitch::TargetKind::ALL.iter().map(|kind| kind.as_str()).collect();
        for kind in FLIPPED_KINDS {
            assert!(kinds.contains(&kind), "{kind} is no kill-switch target kind: {kinds:?}");
        }
        assert!(!kinds.contains(&"prompt"), "a prompt kind exists now: the prompt checks could flip it");
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn commands_report_success_unsupported_and_failure() {
        assert!(run_command(&strings(&["true"])).is_ok());
        assert!(matches!(run_command(&strings(&["false"])), Err(CommandError::Failed(_))));
        let unsupported = run_command(&strings(&["sh", "-c", "echo 'no such kind' >&2; exit 2"]));
        assert!(matches!(&unsupported, Err(CommandError::Unsupported(why)) if why.contains("no such kind")));
        let missing = run_command(&strings(&["/nonexistent/palisade-verify-no-such-program"]));
        assert!(matches!(missing, Err(CommandError::Failed(_))));
        assert!(matches!(run_command(&[]), Err(CommandError::Failed(_))));
    }

    #[test]
    fn the_catalogue_has_stable_unique_ids_and_the_switch_hides_its_commands() {
        let ids: Vec<&str> = module().cases.iter().map(|case| case.check.id).collect();
        assert!(ids.len() >= 8);
        for (i, id) in ids.iter().enumerate() {
            assert!(id.starts_with("killswitch.") && id.split('.').count() == 3, "{id}");
            assert!(!ids[..i].contains(id), "{id} twice");
            assert_eq!(check_of_static(id), Some(*id));
        }
        let switch = Switch::new(Some("disable --token s3cr3t {target}".into()), Some("  ".into()));
        assert!(!format!("{switch:?}").contains("s3cr3t"));
        assert!(switch.enable.is_none(), "a blank command is no command");
    }

    #[test]
    fn unlisted_operations_must_be_json_rpc_errors() {
        let exchange = |status: u16, frame: Value| Exchange::answered(json!(3), status, vec![frame]);
        let refused = exchange(400, json!({ "jsonrpc": "2.0", "id": 3, "error": { "code": -32602 } }));
        assert_eq!(unlisted_judgement(&refused, "x", None).0, Judgement::Refused);
        assert!(matches!(unlisted_judgement(&refused, "x", Some(-32601)).0, Judgement::RefusedOddly(_)));
        let tool_error = exchange(200, json!({ "jsonrpc": "2.0", "id": 3, "result": { "isError": true } }));
        assert!(matches!(unlisted_judgement(&tool_error, "x", None), (Judgement::RefusedOddly(_), Verdict::Warning)));
        let served = exchange(200, json!({ "jsonrpc": "2.0", "id": 3, "result": { "content": [] } }));
        assert!(matches!(unlisted_judgement(&served, "x", None), (Judgement::Accepted(_), Verdict::Fail)));
    }
}
