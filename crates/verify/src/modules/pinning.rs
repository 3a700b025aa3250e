//! The gateway pinning module (seed 004, "rug pull"): a gateway pins every tool definition it
//! serves, and a definition that changes after review must be held until someone reviews it
//! again. The verifier is a client only, so it cannot change an upstream itself: the operator
//! gives `--change-upstream-command CMD` (run without a shell, split on white space, `{tool}`
//! replaced by the tool's name as the target lists it and `{state}` by `changed` or `original`),
//! which makes the operator's fixture upstream serve a changed definition of that tool, or the
//! original again. Without it every check is NOT TESTABLE and nothing is sent.
//!
//! One scenario serves every check, run once per run (the first case to start drives it, the
//! others wait for its record): list the tools and pick one (the first listed without required
//! arguments, else the first listed); call it (the positive control); run `changed`; poll
//! `tools/list` (and a call) for up to `--pin-wait-secs` until the tool is held (withdrawn or its
//! calls refused) or its changed definition is served; compare the hold with a name that never
//! existed; run `original` (always, once `changed` was attempted) and poll until the tool is served
//! again or the wait ends. A change that never shows (the tool listed with its reviewed definition
//! and served through the whole wait) did not reach the target: every check after it is
//! INCONCLUSIVE, never a FAIL. A restored definition served again is a PASS (its digest is the reviewed
//! one, which is all seed 004 asks), and so is one still held awaiting review (stricter).
//!
//! Calls of the chosen tool (and of another tool, for over-blocking) are made only when the one
//! rule of [`crate::callable`] permits them (a tool annotated `readOnlyHint: true`, or with
//! `--allow-mutations` one not destructive by annotation or name); the change command
//! is the operator's own consent to flip their fixture. Run this module alone (`--module
//! pinning`) against a gateway whose tools other modules also call: while the tool is held,
//! their calls of it are refused.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::check::{Check, Outcome, Verdict};
use crate::modules::{Context, Module, cases};
use crate::target::{Exchange, Probe};

/// `--pin-wait-secs` by default: how long the target may take to notice a change.
pub const DEFAULT_WAIT_SECS: u64 = 10;
/// `--pin-wait-secs` at most.
pub const MAX_WAIT_SECS: u64 = 120;
/// Between two polls.
const POLL: Duration = Duration::from_millis(200);
/// The change command's time limit (it is killed after).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// `tools/list` pages followed at most.
const MAX_PAGES: usize = 5;

/// The operator's pinning options, and the one scenario every pinning check reads.
#[derive(Debug)]
pub struct Options {
    command: Option<Vec<String>>,
    wait: Duration,
    scenario: OnceCell<Scenario>,
}

impl Options {
    /// Options from `--change-upstream-command` (white-space split; none: not testable) and
    /// `--pin-wait-secs` (clamped to 1–120).
    pub fn new(command: Option<&str>, wait_secs: u64) -> Self {
        let command = command
            .map(|line| line.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .filter(|argv| !argv.is_empty());
        Self { command, wait: Duration::from_secs(wait_secs.clamp(1, MAX_WAIT_SECS)), scenario: OnceCell::new() }
    }
}

impl Default for Options {
    fn default() -> Self {
        Self::new(None, DEFAULT_WAIT_SECS)
    }
}

/// The pinning module.
pub fn module() -> Module {
    Module {
        name: "pinning",
        exclusive: true,
        cases: cases! {
            control: "pinning.control.served", "Before the change the chosen tool is listed and a call of it is served",
                "seed 004 (Verify safely): a changed tool definition is held for review; positive control", Low;
            held: "pinning.changed.held", "After the upstream changes the tool's definition, the tool is held within the wait",
                "seed 004: hold any tool whose hash changes until someone reviews it again (rug pull)", Critical;
            call_refused: "pinning.changed.call_refused", "A call of the changed tool is refused, never forwarded",
                "seed 004: hold any tool whose hash changes until someone reviews it again (rug pull)", Critical;
            definition_withheld: "pinning.changed.definition_withheld", "No tools/list ever shows the changed definition before approval",
                "seed 004: review each definition before enabling it; record a hash of the whole definition", Critical;
            others_served: "pinning.changed.others_served", "The other tools stay listed and callable while one is held",
                "seed 004: hold the tool whose hash changes (that tool, not its neighbours)", Medium;
            refusal_jsonrpc: "pinning.changed.refusal_jsonrpc", "The refusal of a held tool is a JSON-RPC error, not a 5xx",
                "2026-07-28 tools: an unknown tool gets -32602; basic §Error Codes (a JSON-RPC error response)", Medium;
            no_oracle: "pinning.changed.no_oracle", "A held tool is refused exactly like a name that never existed",
                "seed 004 (tool poisoning: held definitions are not served); existence oracles", Low;
            restored: "pinning.restored.served", "After the original is restored the tool is served again, or stays held for review",
                "seed 004: only a definition whose hash is not the reviewed one is held", Low;
        },
    }
}

/// Where the chosen tool stands in one listing.
#[derive(Debug, Clone, PartialEq)]
enum ToolState {
    /// Not listed.
    Absent,
    /// Listed with the definition listed before the change.
    Approved,
    /// Listed with another definition (the one listed now).
    Changed(Value),
    /// The listing itself was not served.
    Unavailable,
}

/// One `tools/list`, all pages.
#[derive(Debug, Clone)]
struct Listing {
    exchanges: Vec<Exchange>,
    /// `None`: not served.
    tools: Option<Vec<Value>>,
}

/// What was seen after a command, at the moment that decided it (or the last poll).
#[derive(Debug, Default)]
struct Observation {
    /// The tool's state in `listing`.
    state: Option<ToolState>,
    /// Whether the tool counted as held (withdrawn, or its call refused).
    held: bool,
    /// Since the command returned.
    elapsed: Duration,
    polls: usize,
    listing: Option<Listing>,
    call: Option<Exchange>,
}

/// Everything the scenario did and saw.
#[derive(Debug)]
struct Run {
    tool: String,
    /// `Some(why)`: calls are not made.
    no_calls: Option<String>,
    approved: Value,
    before: Listing,
    control_call: Option<Exchange>,
    /// The other tools listed before, and their definitions.
    others: Vec<Value>,
    /// Another tool without required arguments, and its control call.
    other_control: Option<(String, Exchange)>,
    changed: Result<(), String>,
    after_change: Observation,
    /// A call of a name that never existed, at the moment the tool was held.
    unknown_call: Option<(String, Exchange)>,
    /// The other tool's call while the chosen one was held.
    other_call: Option<Exchange>,
    restored: Result<(), String>,
    after_restore: Option<Observation>,
}

#[derive(Debug)]
enum Scenario {
    NotTestable(String),
    /// The positive control failed: nothing was changed.
    Inconclusive(String, Vec<String>),
    Ran(Box<Run>),
}

/// The record of this run's scenario (run by the first check to ask).
async fn scenario(ctx: &Context) -> &Scenario {
    ctx.pinning.scenario.get_or_init(|| run_scenario(ctx)).await
}

/// The command line for `state` with `{tool}` and `{state}` replaced in every word.
fn command_line(command: &[String], tool: &str, state: &str) -> Vec<String> {
    command.iter().map(|word| word.replace("{tool}", tool).replace("{state}", state)).collect()
}

/// Runs the operator's command (no shell, no input, output discarded), killed after the limit.
async fn run_command(command: &[String], tool: &str, state: &str) -> Result<(), String> {
    let argv = command_line(command, tool, state);
    let state = state.to_owned();
    let joined = tokio::task::spawn_blocking(move || run_blocking(&argv)).await;
    match joined {
        Ok(result) => result.map_err(|why| format!("the change command ({state}) {why}")),
        Err(error) => Err(format!("the change command ({state}) did not finish: {error}")),
    }
}

fn run_blocking(argv: &[String]) -> Result<(), String> {
    let (program, args) = argv.split_first().ok_or("names no program")?;
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|error| format!("could not start {program:?}: {error}"))?;
    let deadline = std::time::Instant::now() + COMMAND_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("{program:?} exited with {status}")),
            Ok(None) if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{program:?} ran longer than {} s and was killed", COMMAND_TIMEOUT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(error) => return Err(format!("{program:?}: {error}")),
        }
    }
}

/// `tools/list` as the first identity, following `nextCursor`. An unknown-method answer reads as
/// no tools (a gateway with nothing approved may answer so).
async fn list(ctx: &Context) -> Listing {
    let mut exchanges = Vec::new();
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let params = match &cursor {
            Some(cursor) => json!({ "cursor": cursor }),
            None => json!({}),
        };
        let exchange = ctx.target.send(Probe::request("tools/list", params, ctx.auth())).await;
        let result = exchange.result().cloned();
        let unknown_method = exchange.error_code() == Some(-32601);
        exchanges.push(exchange);
        let Some(result) = result else {
            return Listing { exchanges, tools: unknown_method.then(Vec::new) };
        };
        tools.extend(result.get("tools").and_then(Value::as_array).into_iter().flatten().cloned());
        cursor = result.get("nextCursor").and_then(Value::as_str).map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    Listing { exchanges, tools: Some(tools) }
}

fn name_of(tool: &Value) -> Option<&str> {
    tool.get("name").and_then(Value::as_str)
}

/// A name of the spec's alphabet (so `{tool}` can go into a command line safely).
fn plain_name(name: &str) -> bool {
    (1..=128).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn has_required(tool: &Value) -> bool {
    tool.pointer("/inputSchema/required").and_then(Value::as_array).is_some_and(|required| !required.is_empty())
}

/// The tool to change: the first listed without required arguments that `may_call` allows,
/// else the first without required arguments, else the first listed (names outside the spec's
/// alphabet are skipped).
fn choose(tools: &[Value], may_call: impl Fn(&Value) -> bool) -> Option<&Value> {
    let plain = || tools.iter().filter(|tool| name_of(tool).is_some_and(plain_name));
    plain()
        .find(|tool| !has_required(tool) && may_call(tool))
        .or_else(|| plain().find(|tool| !has_required(tool)))
        .or_else(|| plain().next())
}

/// The tool's state in `listing`, against the definition listed before the change.
fn state_in(listing: &Listing, name: &str, approved: &Value) -> ToolState {
    let Some(tools) = &listing.tools else { return ToolState::Unavailable };
    match tools.iter().find(|tool| name_of(tool) == Some(name)) {
        None => ToolState::Absent,
        Some(tool) if tool == approved => ToolState::Approved,
        Some(tool) => ToolState::Changed(tool.clone()),
    }
}

/// `tools/call` of `name` with no arguments, as the first identity.
async fn call(ctx: &Context, name: &str) -> Exchange {
    ctx.target.send(Probe::request("tools/call", json!({ "name": name, "arguments": {} }), ctx.auth())).await
}

/// Served: a result for the id that is not an `isError` result.
fn served(exchange: &Exchange) -> bool {
    exchange.accepted() && exchange.result().and_then(|result| result.get("isError")) != Some(&json!(true))
}

/// A name that was never listed, as close to `tool` as possible (same prefix).
fn never_listed(tool: &str, listed: &[Value]) -> String {
    let mut name = if tool.len() <= 100 { format!("{tool}_unlisted") } else { "palisade_verify_unlisted".to_owned() };
    while listed.iter().any(|t| name_of(t) == Some(name.as_str())) {
        name.push('x');
    }
    name
}

async fn run_scenario(ctx: &Context) -> Scenario {
    let Some(command) = ctx.pinning.command.clone() else {
        return Scenario::NotTestable(
            "no --change-upstream-command: the verifier cannot make the upstream change a definition".into(),
        );
    };
    let before = list(ctx).await;
    let transcripts = |listing: &Listing| listing.exchanges.iter().map(|e| e.transcript.clone()).collect::<Vec<_>>();
    let Some(tools) = before.tools.clone() else {
        let summary = before.exchanges.last().map(Exchange::summary).unwrap_or_default();
        return Scenario::Inconclusive(format!("tools/list was not served ({summary})"), transcripts(&before));
    };
    // Calls only of tools the one rule lets a check call.
    let may_call = |t: &Value| ctx.permit(t).is_ok();
    let Some(chosen) = choose(&tools, may_call).cloned() else {
        return Scenario::NotTestable("the target lists no tool (with a name of the spec's alphabet) to change".into());
    };
    let tool = name_of(&chosen).unwrap_or_default().to_owned();
    let no_calls = ctx.permit(&chosen).err().map(|why| why.to_string());
    let control_call = if no_calls.is_none() { Some(call(ctx, &tool).await) } else { None };
    if let Some(control) = control_call.as_ref().filter(|control| !served(control)) {
        let mut shown = transcripts(&before);
        shown.push(control.transcript.clone());
        let why = format!("the control call of {tool:?} with no arguments was not served ({})", control.summary());
        return Scenario::Inconclusive(why, shown);
    }
    let others: Vec<Value> = tools.iter().filter(|t| name_of(t) != Some(tool.as_str())).cloned().collect();
    let other_name = others.iter().find(|t| !has_required(t) && may_call(t)).and_then(name_of).map(str::to_owned);
    let mut other_control = None;
    if let Some(name) = other_name {
        let exchange = call(ctx, &name).await;
        if served(&exchange) {
            other_control = Some((name, exchange));
        }
    }
    let changed = run_command(&command, &tool, "changed").await;
    let mut run = Run {
        tool,
        no_calls,
        approved: chosen,
        before,
        control_call,
        others,
        other_control,
        changed,
        after_change: Observation::default(),
        unknown_call: None,
        other_call: None,
        restored: Ok(()),
        after_restore: None,
    };
    if run.changed.is_ok() {
        run.after_change = observe_change(ctx, &run).await;
        if run.after_change.held {
            if run.no_calls.is_none() {
                let listed = run.after_change.listing.as_ref().and_then(|l| l.tools.clone()).unwrap_or_default();
                let name = never_listed(&run.tool, &listed);
                let exchange = call(ctx, &name).await;
                run.unknown_call = Some((name, exchange));
            }
            if let Some((name, _)) = &run.other_control {
                run.other_call = Some(call(ctx, name).await);
            }
        }
    }
    // Always put the original back once a change was attempted.
    run.restored = run_command(&command, &run.tool, "original").await;
    if run.restored.is_ok() && run.after_change.held {
        run.after_restore = Some(observe_restore(ctx, &run).await);
    }
    Scenario::Ran(Box::new(run))
}

/// Polls until the tool is held (withdrawn from the listing, or its call refused) or its changed
/// definition is listed, or the wait ends.
async fn observe_change(ctx: &Context, run: &Run) -> Observation {
    let start = Instant::now();
    let deadline = start + ctx.pinning.wait;
    let mut polls = 0;
    loop {
        polls += 1;
        let listing = list(ctx).await;
        let state = state_in(&listing, &run.tool, &run.approved);
        let call = if run.no_calls.is_none() { Some(call(ctx, &run.tool).await) } else { None };
        let refused = call.as_ref().is_some_and(|call| call.status.is_some() && !served(call));
        let held = match &state {
            ToolState::Absent => true,
            ToolState::Approved => refused,
            ToolState::Changed(_) | ToolState::Unavailable => false,
        };
        let decided = held || matches!(state, ToolState::Changed(_));
        if decided || Instant::now() + POLL >= deadline {
            let elapsed = start.elapsed();
            return Observation { state: Some(state), held, elapsed, polls, listing: Some(listing), call };
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls until the tool is served again (listed with its reviewed definition and, when calls
/// are made, its call served), or listed with another definition, or the wait ends.
async fn observe_restore(ctx: &Context, run: &Run) -> Observation {
    let start = Instant::now();
    let deadline = start + ctx.pinning.wait;
    let mut polls = 0;
    loop {
        polls += 1;
        let listing = list(ctx).await;
        let state = state_in(&listing, &run.tool, &run.approved);
        let call = if run.no_calls.is_none() && state == ToolState::Approved {
            Some(call(ctx, &run.tool).await)
        } else {
            None
        };
        let back = state == ToolState::Approved && call.as_ref().is_none_or(served);
        let decided = back || matches!(state, ToolState::Changed(_));
        if decided || Instant::now() + POLL >= deadline {
            let elapsed = start.elapsed();
            return Observation { state: Some(state), held: !back, elapsed, polls, listing: Some(listing), call };
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The scenario's run, or the outcome of a check that has none.
async fn ran<'a>(ctx: &'a Context, check: &Check) -> Result<&'a Run, Outcome> {
    match scenario(ctx).await {
        Scenario::NotTestable(why) => Err(Outcome::new(check, Verdict::NotTestable, why.clone())),
        Scenario::Inconclusive(why, transcripts) => {
            let mut outcome = Outcome::new(check, Verdict::Inconclusive, format!("positive control failed: {why}"));
            outcome.transcript.clone_from(transcripts);
            Err(outcome)
        }
        Scenario::Ran(run) => Ok(run),
    }
}

/// The run, once `changed` ran: else the outcome (inconclusive when the command failed).
async fn changed_run<'a>(ctx: &'a Context, check: &Check) -> Result<&'a Run, Outcome> {
    let run = ran(ctx, check).await?;
    if let Err(why) = &run.changed {
        return Err(Outcome::new(check, Verdict::Inconclusive, format!("{why}: nothing was changed"))
            .with(&control_exchanges(run)));
    }
    let observed = &run.after_change;
    if observed.state == Some(ToolState::Approved) && !observed.held {
        // The listing never changed and nothing was refused: the change may not have reached
        // the target (the command changes another tool or another upstream, or the target
        // re-lists less often than the wait), which tells nothing about holding.
        let detail = format!(
            "the change did not reach the target: the change command ran, but {:?} was listed with its \
             reviewed definition{} through the {} wait ({} polls); check that the command changes this \
             tool of the upstream behind this target, or raise --pin-wait-secs",
            run.tool,
            if run.no_calls.is_none() { " and served" } else { "" },
            secs(ctx.pinning.wait),
            observed.polls
        );
        return Err(Outcome::new(check, Verdict::Inconclusive, detail)
            .with(&control_exchanges(run))
            .with(&seen(observed)));
    }
    Ok(run)
}

/// The control's exchanges (the listing before, and the call).
fn control_exchanges(run: &Run) -> Vec<&Exchange> {
    run.before.exchanges.iter().chain(&run.control_call).collect()
}

/// The decisive exchanges of an observation.
fn seen(observation: &Observation) -> Vec<&Exchange> {
    observation.listing.iter().flat_map(|listing| &listing.exchanges).chain(&observation.call).collect()
}

fn secs(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

/// What a changed definition shows, shortened: its description.
fn describe_change(definition: &Value) -> String {
    let description = definition.get("description").and_then(Value::as_str).unwrap_or("(no description)");
    let cut: String = description.chars().take(120).collect();
    format!("description {cut:?}")
}

async fn control(ctx: &Context, check: Check) -> Outcome {
    let run = match ran(ctx, &check).await {
        Ok(run) => run,
        Err(outcome) => return outcome,
    };
    let detail = match &run.no_calls {
        None => format!("{:?} is listed and a call of it is served", run.tool),
        Some(why) => format!("{:?} is listed; {why}", run.tool),
    };
    Outcome::new(&check, Verdict::Pass, detail).with(&control_exchanges(run))
}

async fn held(ctx: &Context, check: Check) -> Outcome {
    let run = match changed_run(ctx, &check).await {
        Ok(run) => run,
        Err(outcome) => return outcome,
    };
    let seen_after = &run.after_change;
    let wait = secs(ctx.pinning.wait);
    let (verdict, detail) = match &seen_after.state {
        _ if seen_after.held => {
            let how = if seen_after.state == Some(ToolState::Absent) {
                "withdrawn from tools/list"
            } else {
                "still listed with its reviewed definition, but its call refused"
            };
            (Verdict::Pass, format!("{:?} was held {} after the change: {how}", run.tool, secs(seen_after.elapsed)))
        }
        Some(ToolState::Changed(definition)) => (
            Verdict::Fail,
            format!(
                "{:?} was served with its changed definition ({}) {} after the change, without a review",
                run.tool,
                describe_change(definition),
                secs(seen_after.elapsed)
            ),
        ),
        Some(ToolState::Unavailable) => (
            Verdict::Inconclusive,
            format!("tools/list was not served at the end of the {wait} wait: whether the tool is held is unknown"),
        ),
        _ => (
            Verdict::Fail,
            format!(
                "{:?} was still served {wait} after the change ({} polls); raise --pin-wait-secs if the target re-lists less often",
                run.tool, seen_after.polls
            ),
        ),
    };
    Outcome::new(&check, verdict, detail).with(&control_exchanges(run)).with(&seen(seen_after))
}

async fn call_refused(ctx: &Context, check: Check) -> Outcome {
    let run = match changed_run(ctx, &check).await {
        Ok(run) => run,
        Err(outcome) => return outcome,
    };
    if let Some(why) = &run.no_calls {
        return Outcome::new(&check, Verdict::NotTestable, why.clone());
    }
    let observed = &run.after_change;
    let Some(answer) = &observed.call else {
        return Outcome::new(&check, Verdict::Inconclusive, "no call was made after the change");
    };
    let (verdict, detail) = if answer.status.is_none() {
        (Verdict::Inconclusive, format!("the call after the change got no answer ({})", answer.summary()))
    } else if served(answer) {
        let where_listed = match &observed.state {
            Some(ToolState::Absent) => "withdrawn from tools/list, yet",
            Some(ToolState::Changed(_)) => "listed with its changed definition, and",
            _ => "still listed, and",
        };
        let after = secs(observed.elapsed);
        (
            Verdict::Fail,
            format!(
                "{after} after the change {:?} was {where_listed} a call of it was served ({})",
                run.tool,
                answer.summary()
            ),
        )
    } else {
        (
            Verdict::Pass,
            format!(
                "a call of {:?} was refused {} after the change ({})",
                run.tool,
                secs(observed.elapsed),
                answer.summary()
            ),
        )
    };
    Outcome::new(&check, verdict, detail).with(&control_exchanges(run)).with(&seen(observed))
}

async fn definition_withheld(ctx: &Context, check: Check) -> Outcome {
    let run = match changed_run(ctx, &check).await {
        Ok(run) => run,
        Err(outcome) => return outcome,
    };
    let observed = &run.after_change;
    let (verdict, detail) = match &observed.state {
        Some(ToolState::Changed(definition)) => (
            Verdict::Fail,
            format!("tools/list showed {:?} with its changed definition ({}) before any review", run.tool, describe_change(definition)),
        ),
        _ if observed.held => (
            Verdict::Pass,
            format!("no listing of {} polls showed the changed definition; the tool was held instead", observed.polls),
        ),
        _ => (
            Verdict::Inconclusive,
            "the tool was neither held nor shown changed within the wait: whether the change reached the target is unknown"
                .to_owned(),
        ),
    };
    let restored = run.after_restore.as_ref().and_then(|after| match &after.state {
        Some(ToolState::Changed(definition)) => Some(definition),
        _ => None,
    });
    if let (Verdict::Pass, Some(definition)) = (verdict, restored) {
        let detail = format!(
            "after the original was restored tools/list showed a definition of {:?} that was never reviewed ({})",
            run.tool,
            describe_change(definition)
        );
        let after = run.after_restore.iter().flat_map(seen).collect::<Vec<_>>();
        return Outcome::new(&check, Verdict::Fail, detail).with(&control_exchanges(run)).with(&after);
    }
    Outcome::new(&check, verdict, detail).with(&control_exchanges(run)).with(&seen(observed))
}

async fn others_served(ctx: &Context, check: Check) -> Outcome {
    let run = match changed_run(ctx, &check).await {
        Ok(run) => run,
        Err(outcome) => return outcome,
    };
    if run.others.is_empty() {
        return Outcome::new(
            &check,
            Verdict::NotTestable,
            "the target lists one tool only: no other tool to keep serving",
        );
    }
    let observed = &run.after_change;
    if !observed.held {
        return Outcome::new(
            &check,
            Verdict::Inconclusive,
            "the changed tool was never held: no hold to over-block with",
        )
        .with(&control_exchanges(run));
    }
    let listed = observed.listing.as_ref().and_then(|listing| listing.tools.clone()).unwrap_or_default();
    let missing: Vec<&str> = run
        .others
        .iter()
        .filter_map(name_of)
        .filter(|name| !listed.iter().any(|tool| name_of(tool) == Some(name)))
        .collect();
    let mut shown = control_exchanges(run);
    shown.extend(run.other_control.as_ref().map(|(_, exchange)| exchange));
    shown.extend(seen(observed));
    shown.extend(&run.other_call);
    let other_refused = match (&run.other_control, &run.other_call) {
        (Some((name, _)), Some(after)) if !served(after) => Some((name, after)),
        _ => None,
    };
    let (verdict, detail) = if !missing.is_empty() {
        (
            Verdict::Fail,
            format!("while {:?} was held, other tools were withdrawn too: {}", run.tool, missing.join(", ")),
        )
    } else if let Some((name, after)) = other_refused {
        (Verdict::Fail, format!("while {:?} was held, a call of {name:?} was refused ({})", run.tool, after.summary()))
    } else {
        let called = match &run.other_control {
            Some((name, _)) => format!("; a call of {name:?} was still served"),
            None => String::new(),
        };
        (
            Verdict::Pass,
            format!("every other tool ({}) stayed listed while {:?} was held{called}", run.others.len(), run.tool),
        )
    };
    Outcome::new(&check, verdict, detail).with(&shown)
}

/// The held call's refusal, when there is one to judge; else the outcome.
async fn refusal<'a>(ctx: &'a Context, check: &Check) -> Result<(&'a Run, &'a Exchange), Outcome> {
    let run = changed_run(ctx, check).await?;
    if let Some(why) = &run.no_calls {
        return Err(Outcome::new(check, Verdict::NotTestable, why.clone()));
    }
    match &run.after_change.call {
        Some(answer) if run.after_change.held && answer.status.is_some() && !served(answer) => Ok((run, answer)),
        _ => Err(Outcome::new(
            check,
            Verdict::Inconclusive,
            "no call of the changed tool was refused (see pinning.changed.call_refused): no refusal to judge",
        )
        .with(&control_exchanges(run))),
    }
}

async fn refusal_jsonrpc(ctx: &Context, check: Check) -> Outcome {
    let (run, answer) = match refusal(ctx, &check).await {
        Ok(found) => found,
        Err(outcome) => return outcome,
    };
    let status = answer.status.unwrap_or_default();
    let (verdict, detail) = if status >= 500 {
        (Verdict::Fail, format!("the held tool's call was answered with a server error ({})", answer.summary()))
    } else if answer.error().is_none() {
        (Verdict::Fail, format!("the held tool's call was refused without a JSON-RPC error ({})", answer.summary()))
    } else {
        (Verdict::Pass, format!("refused with a JSON-RPC error ({})", answer.summary()))
    };
    Outcome::new(&check, verdict, detail).with(&control_exchanges(run)).with(&[answer])
}

/// The parts of a refusal that must not differ: status, code, and the message with the name
/// taken out.
fn refusal_shape(exchange: &Exchange, name: &str) -> (Option<u16>, Option<i64>, String) {
    let message = exchange.error().and_then(|error| error.get("message")).and_then(Value::as_str).unwrap_or_default();
    (exchange.status, exchange.error_code(), message.replace(name, "<name>"))
}

async fn no_oracle(ctx: &Context, check: Check) -> Outcome {
    let (run, answer) = match refusal(ctx, &check).await {
        Ok(found) => found,
        Err(outcome) => return outcome,
    };
    let Some((unknown_name, unknown)) = &run.unknown_call else {
        return Outcome::new(&check, Verdict::Inconclusive, "no call of an unlisted name was made");
    };
    let held_shape = refusal_shape(answer, &run.tool);
    let unknown_shape = refusal_shape(unknown, unknown_name);
    let (verdict, detail) = if held_shape == unknown_shape {
        (
            Verdict::Pass,
            format!("the held tool and the never-listed {unknown_name:?} get the same refusal ({})", answer.summary()),
        )
    } else {
        (
            Verdict::Warning,
            format!(
                "the held tool's refusal ({}) differs from that of the never-listed {unknown_name:?} ({}): a caller learns a held tool exists",
                answer.summary(),
                unknown.summary()
            ),
        )
    };
    Outcome::new(&check, verdict, detail).with(&control_exchanges(run)).with(&[answer, unknown])
}

async fn restored(ctx: &Context, check: Check) -> Outcome {
    let run = match changed_run(ctx, &check).await {
        Ok(run) => run,
        Err(outcome) => return outcome,
    };
    if let Err(why) = &run.restored {
        let detail = format!("{why}: the fixture upstream may still serve the changed definition");
        return Outcome::new(&check, Verdict::Inconclusive, detail).with(&control_exchanges(run));
    }
    let Some(after) = &run.after_restore else {
        return Outcome::new(&check, Verdict::Inconclusive, "the change was never held: nothing to restore from")
            .with(&control_exchanges(run));
    };
    let wait = secs(ctx.pinning.wait);
    let (verdict, detail) = match &after.state {
        Some(ToolState::Approved) if !after.held => (
            Verdict::Pass,
            format!(
                "{:?} was served again {} after the original was restored: its definition is the reviewed one",
                run.tool,
                secs(after.elapsed)
            ),
        ),
        Some(ToolState::Changed(definition)) => (
            Verdict::Fail,
            format!(
                "after the original was restored, {:?} was listed with an unreviewed definition ({})",
                run.tool,
                describe_change(definition)
            ),
        ),
        Some(ToolState::Absent) => (
            Verdict::Pass,
            format!(
                "{:?} stays held {wait} after the original was restored, awaiting a new review (stricter than required)",
                run.tool
            ),
        ),
        Some(ToolState::Approved) => (
            Verdict::Warning,
            format!(
                "{:?} is listed again with its reviewed definition, but a call of it is still refused {wait} later",
                run.tool
            ),
        ),
        Some(ToolState::Unavailable) | None => {
            (Verdict::Inconclusive, format!("tools/list was not served {wait} after the original was restored"))
        }
    };
    Outcome::new(&check, verdict, detail).with(&control_exchanges(run)).with(&seen(after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, required: &[&str]) -> Value {
        json!({ "name": name, "inputSchema": { "type": "object", "required": required } })
    }

    #[test]
    fn the_command_is_split_without_a_shell_and_its_placeholders_replaced() {
        let options = Options::new(Some("  cp  dir/{state}.json  served.json --tool={tool} "), 500);
        let command = options.command.clone().unwrap();
        assert_eq!(command, ["cp", "dir/{state}.json", "served.json", "--tool={tool}"]);
        assert_eq!(command_line(&command, "fx_a", "changed"), ["cp", "dir/changed.json", "served.json", "--tool=fx_a"]);
        assert_eq!(options.wait, Duration::from_secs(MAX_WAIT_SECS));
        assert!(Options::new(Some("   "), 10).command.is_none());
        assert_eq!(Options::default().wait, Duration::from_secs(DEFAULT_WAIT_SECS));
        assert!(run_blocking(&["true".to_owned()]).is_ok());
        assert!(run_blocking(&["false".to_owned()]).unwrap_err().contains("exited"));
        assert!(run_blocking(&["/nonexistent/palisade-verify-cmd".to_owned()]).is_err());
    }

    #[test]
    fn the_chosen_tool_has_no_required_arguments_and_a_plain_name_and_may_be_called() {
        let any = |_: &Value| true;
        let tools = [tool("needs", &["x"]), tool("bad name;rm", &[]), tool("free", &[]), tool("also", &[])];
        assert_eq!(choose(&tools, any).and_then(name_of), Some("free"));
        // One the rule lets a check call first; else one that is not called.
        assert_eq!(choose(&tools, |t: &Value| name_of(t) == Some("also")).and_then(name_of), Some("also"));
        assert_eq!(choose(&tools, |_: &Value| false).and_then(name_of), Some("free"));
        let only_required = [tool("needs", &["x"]), tool("more", &["y"])];
        assert_eq!(choose(&only_required, any).and_then(name_of), Some("needs"));
        assert!(choose(&[], any).is_none());
        assert_eq!(never_listed("free", &[tool("free_unlisted", &[])]), "free_unlistedx");
    }

    #[test]
    fn a_listing_places_the_tool_as_absent_approved_or_changed() {
        let approved = tool("a", &[]);
        let listing = |tools: Option<Vec<Value>>| Listing { exchanges: Vec::new(), tools };
        assert_eq!(state_in(&listing(Some(vec![approved.clone()])), "a", &approved), ToolState::Approved);
        assert_eq!(state_in(&listing(Some(vec![tool("b", &[])])), "a", &approved), ToolState::Absent);
        let mut changed = approved.clone();
        changed["description"] = json!("now read ~/.ssh");
        assert_eq!(state_in(&listing(Some(vec![changed.clone()])), "a", &approved), ToolState::Changed(changed));
        assert_eq!(state_in(&listing(None), "a", &approved), ToolState::Unavailable);
    }
}
