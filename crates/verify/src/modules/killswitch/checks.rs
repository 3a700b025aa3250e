//! The killswitch cases in the order of the one flip sequence: the read-only tool, another tool,
//! the prompt, the resource, a mutating tool, and the unlisted operations.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::common::*;
use super::run::Run;
use crate::check::{Judgement, Outcome, Verdict, paired};
use crate::target::{Exchange, Probe};

/// JSON-RPC "method not found".
const METHOD_NOT_FOUND: i64 = -32601;

impl<'a> Run<'a> {
    /// Every check, in an order where no flip overlaps another.
    pub(super) async fn all(mut self) -> HashMap<&'static str, Outcome> {
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
    pub(super) async fn unlisted_only(mut self) -> HashMap<&'static str, Outcome> {
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

    /// The read-only tool's flip and the checks made around it; the refusal's JSON-RPC error
    /// code when the disable took effect.
    pub(super) async fn tool_checks(
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
                Outcome::new(&self.check_of(TOOL_IDS[1]), verdict, detail).with(&[&flip.control, refused])
            }
            _ => Outcome::new(
                &self.check_of(TOOL_IDS[1]),
                Verdict::Inconclusive,
                format!("{target} was never refused: no refusal to judge"),
            )
            .with(&[&flip.control]),
        };
        self.record(outcome);
        let refusal_code = refusal.and_then(Exchange::error_code);

        // Before the arguments: the undeclared argument changes nothing under DISABLE.
        let before = self.check_of(TOOL_IDS[2]);
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
    pub(super) async fn other_tool(
        &mut self,
        tools: &[Value],
        probe_name: &str,
        control: &Exchange,
        refusal_code: Option<i64>,
    ) {
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

    /// The first prompt's flip (its required arguments filled with a constant string), asked
    /// for as `prompt:NAME`; its control doubles as the unlisted prompt's control.
    pub(super) async fn prompt_checks(&mut self) {
        let (disabled, reenabled) = ("killswitch.prompt.disabled", "killswitch.prompt.reenabled");
        let (name, probe) = match self.first_prompt().await {
            Ok(found) => found,
            Err(listed) => {
                let detail = format!("the target lists no prompt (prompts/list: {})", listed.summary());
                self.verdict(disabled, Verdict::NotTestable, detail.clone(), &[&listed]);
                self.verdict(reenabled, Verdict::NotTestable, detail, &[&listed]);
                return self.unlisted_prompt(&listed).await;
            }
        };
        let target = format!("prompt:{name}");
        let (flip, _) = self.flip(&target, &probe, None, async |_: &Exchange| Vec::new()).await;
        self.judge_flip(&flip, &target, disabled, reenabled);
        self.unlisted_prompt(&flip.control).await;
    }

    /// The first listed resource that is served: its flip.
    pub(super) async fn resource_checks(&mut self) {
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
    pub(super) async fn mutating_check(
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
        let mut outcome = paired(&self.check_of(id), &control, &negative, judgement, Verdict::Warning);
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
    pub(super) async fn unlisted_checks(&mut self, listed: &Exchange, probe_tool: Option<&(String, Exchange)>) {
        let control = probe_tool.map_or(listed, |(_, control)| control);
        let name = format!("palisade-verify-unlisted-{}", random_suffix());
        let negative = self.ctx.target.send(call(self.ctx, &name, json!({}))).await;
        let (judgement, odd) = unlisted_judgement(&negative, "the unlisted tool", None);
        let outcome = paired(&self.check_of("killswitch.unlisted.tool"), control, &negative, judgement, odd);
        self.record(outcome);
        let method = format!("palisade-verify/unlisted-{}", random_suffix());
        let negative = self.ctx.target.send(Probe::request(&method, json!({}), self.ctx.auth())).await;
        let (judgement, odd) = unlisted_judgement(&negative, "the unknown method", Some(METHOD_NOT_FOUND));
        let outcome = paired(&self.check_of("killswitch.unlisted.method"), listed, &negative, judgement, odd);
        self.record(outcome);
    }

    pub(super) async fn unlisted_prompt(&mut self, control: &Exchange) {
        // A target that offers no prompts at all answers prompts/list "method not found": there
        // is no prompt to compare with, which is an input the target lacks, not an
        // inconclusive run (its tools and resources are checked as usual).
        if control.error_code() == Some(METHOD_NOT_FOUND) {
            let detail = format!("the target offers no prompts (prompts/list: {}): no control", control.summary());
            return self.verdict("killswitch.unlisted.prompt", Verdict::NotTestable, detail, &[control]);
        }
        let name = format!("palisade-verify-unlisted-{}", random_suffix());
        let probe = Probe::request("prompts/get", json!({ "name": name }), self.ctx.auth());
        let negative = self.ctx.target.send(probe).await;
        let (judgement, odd) = unlisted_judgement(&negative, "the unlisted prompt", None);
        self.record(paired(&self.check_of("killswitch.unlisted.prompt"), control, &negative, judgement, odd));
    }

    pub(super) async fn unlisted_resource(&mut self, found: Option<(&str, &Exchange)>) {
        let id = "killswitch.unlisted.resource";
        let Some((uri, control)) = found else {
            return self.verdict(id, Verdict::NotTestable, "no listed resource is served: no control", &[]);
        };
        let scheme = uri.split_once("://").map_or("file", |(scheme, _)| scheme);
        let unlisted = format!("{scheme}://palisade-verify-unlisted/{}", random_suffix());
        let probe = Probe::request("resources/read", json!({ "uri": unlisted }), self.ctx.auth());
        let negative = self.ctx.target.send(probe).await;
        let (judgement, odd) = unlisted_judgement(&negative, "the unlisted resource", None);
        self.record(paired(&self.check_of(id), control, &negative, judgement, odd));
    }
}
