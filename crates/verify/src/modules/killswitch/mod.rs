//! The kill-switch module (seed 003): when the operator supplies a way to flip a target
//! (`--disable-command` and `--enable-command`, each run without a shell with `{target}`
//! replaced by `kind:name`, `kind` one of [`FLIPPED_KINDS`]), a disabled tool, prompt and resource must be refused before
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

mod checks;
mod common;
mod run;
mod switch;

use crate::check::{Check, Outcome, Verdict};
use crate::modules::{Context, Module, cases};
pub use common::{FLIPPED_KINDS, UNSUPPORTED_EXIT};
use run::Run;
pub use switch::Switch;

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

/// Every case: its part of the run's one flip sequence.
async fn from_run(ctx: &Context, check: Check) -> Outcome {
    let switch = &ctx.killswitch;
    let results = match (switch.disable.as_deref(), switch.enable.as_deref()) {
        (Some(disable), Some(enable)) => {
            switch.results.get_or_init(|| Run::new(ctx, registry(), disable, enable).all()).await
        }
        // An operation the server does not list is refused with or without a flip.
        _ if check.id.starts_with("killswitch.unlisted.") => {
            switch.results.get_or_init(|| Run::new(ctx, registry(), "", "").unlisted_only()).await
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

/// The checks of this module's registry, for the run's flip sequence.
fn registry() -> Vec<Check> {
    module().cases.into_iter().map(|case| case.check).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::common::*;
    use super::*;
    use crate::check::Judgement;
    use crate::target::Exchange;

    #[test]
    fn the_flip_commands_are_asked_only_for_kinds_the_kill_switch_has() {
        let kinds: Vec<&str> = palisade_killswitch::TargetKind::ALL.iter().map(|kind| kind.as_str()).collect();
        for kind in FLIPPED_KINDS {
            assert!(kinds.contains(&kind), "{kind} is no kill-switch target kind: {kinds:?}");
        }
        assert_eq!(FLIPPED_KINDS, ["tool", "prompt", "resource"], "every kind a client names from a listing");
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
            assert_eq!(check_of_static(&registry(), id), Some(*id));
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
