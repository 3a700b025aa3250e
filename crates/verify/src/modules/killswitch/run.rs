//! The run's flip sequence (`Run`): recording outcomes, finding a prompt, resource and tool to
//! flip, running the flip commands, polling and judging one flip.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::*;
use crate::check::{Check, Judgement, Outcome, Severity, Verdict, paired};
use crate::modules::Context;
use crate::target::{Exchange, Probe};

/// The run's flip sequence.
pub(super) struct Run<'a> {
    pub(super) ctx: &'a Context,
    /// The checks of this module's registry.
    pub(super) checks: Vec<Check>,
    pub(super) disable: &'a str,
    pub(super) enable: &'a str,
    pub(super) results: HashMap<&'static str, Outcome>,
    /// Targets whose enable command failed: retried at the end.
    pub(super) to_restore: Vec<String>,
}

impl<'a> Run<'a> {
    pub(super) fn new(ctx: &'a Context, checks: Vec<Check>, disable: &'a str, enable: &'a str) -> Self {
        Self { ctx, checks, disable, enable, results: HashMap::new(), to_restore: Vec::new() }
    }

    /// The check of `id` (for outcomes built before the case asks for them).
    pub(super) fn check_of(&self, id: &'static str) -> Check {
        self.checks.iter().copied().find(|check| check.id == id).unwrap_or(Check {
            id,
            title: "",
            requirement: "",
            severity: Severity::Medium,
        })
    }

    pub(super) fn record(&mut self, outcome: Outcome) {
        let id = check_of_static(&self.checks, &outcome.id);
        if let Some(id) = id {
            self.results.insert(id, outcome);
        }
    }

    pub(super) fn verdict(
        &mut self,
        id: &'static str,
        verdict: Verdict,
        detail: impl Into<String>,
        with: &[&Exchange],
    ) {
        self.record(Outcome::new(&self.check_of(id), verdict, detail).with(with));
    }

    /// The first listed prompt and a `prompts/get` of it (its required arguments filled with a
    /// constant string); `Err(listing)` when none is listed.
    pub(super) async fn first_prompt(&self) -> Result<(String, Probe), Exchange> {
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
    pub(super) async fn served_resource(&self) -> (Exchange, Option<(String, Probe, Exchange)>) {
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
    pub(super) async fn probe_tool(&self, tools: &[Value]) -> Option<(String, Exchange)> {
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
    pub(super) fn callable_tools(&self, listed: &Exchange) -> Vec<Value> {
        let tools = listed.result().and_then(|r| r.get("tools")).and_then(Value::as_array).cloned().unwrap_or_default();
        self.ctx.callable_tools(&tools).into_iter().map(|(_, tool)| tool.clone()).collect()
    }

    /// Runs a flip command for `target`; `Err` says why it failed.
    pub(super) async fn command(&self, line: &str, target: &str) -> Result<(), CommandError> {
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
    pub(super) async fn restore(&mut self, target: &str) {
        if let Err(CommandError::Failed(_)) = self.command(self.enable, target).await {
            self.to_restore.push(target.to_owned());
        }
    }

    /// Sends `probe` until `done` holds of the answer (at most [`FLIP_BOUND`]); the last answer
    /// and how long after the start it came.
    pub(super) async fn poll(&self, probe: &Probe, done: impl Fn(&Exchange) -> bool) -> (Exchange, Duration) {
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
    pub(super) async fn flip(
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
    pub(super) fn judge_flip(
        &mut self,
        flip: &Flip,
        target: &str,
        disabled_id: &'static str,
        reenabled_id: &'static str,
    ) {
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
        let mut outcome = paired(&self.check_of(disabled_id), control, disabled, judgement, Verdict::Fail);
        if outcome.verdict == Verdict::Pass {
            outcome.detail = format!(
                "{target} refused {:.2} s after the disable command returned ({}); served before",
                took.as_secs_f64(),
                disabled.summary()
            );
        }
        self.record(outcome);
        let reenabled_check = self.check_of(reenabled_id);
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
}
