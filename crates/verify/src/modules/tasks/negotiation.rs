//! The tasks checks that need no task: negotiation of the extension and invalid task ids.

use serde_json::{Value, json};

use super::common::*;
use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::modules::Context;
use crate::target::Exchange;

// ---------------------------------------------------------------------------------------------
// Negotiation

pub(super) async fn advertised(ctx: &Context, check: Check) -> Outcome {
    let control = match discover_control(ctx, &check).await {
        Ok(control) => control,
        Err(outcome) => return outcome,
    };
    let Some(id) = made_up(ctx) else { return not_testable(&check, "no task id could be made up") };
    let served = ctx.target.send(get(ctx.auth(), &id)).await;
    let v1 = control.result().and_then(|result| result.pointer("/capabilities/tasks")).is_some();
    let judgement = if v1 {
        Judgement::Accepted("server/discover advertises a v1 capabilities.tasks, which the extension forbids".into())
    } else if served.error_code() == Some(-32601) || served.status.is_none() {
        Judgement::Accepted(format!("the extension is advertised but tasks/get is not served ({})", served.summary()))
    } else {
        Judgement::Refused
    };
    let mut outcome = paired(&check, &control, &served, judgement, Verdict::Fail);
    if outcome.verdict == Verdict::Pass {
        outcome.detail =
            format!("{TASKS_EXTENSION} is advertised and tasks/get is served ({} for an unknown id)", served.summary());
    }
    outcome
}

/// `method` without the extension declared must get -32021 naming it (HTTP 400).
pub(super) async fn without_extension(ctx: &Context, check: Check, method: &str) -> Outcome {
    let control = match discover_control(ctx, &check).await {
        Ok(control) => control,
        Err(outcome) => return outcome,
    };
    let Some(id) = made_up(ctx) else { return not_testable(&check, "no task id could be made up") };
    let params = match method {
        "tasks/update" => json!({ "taskId": id, "inputResponses": {} }),
        _ => json!({ "taskId": id }),
    };
    let negative = ctx.target.send(probe(method, params, ctx.auth(), false)).await;
    let (mut judgement, odd) = judge_code(&negative, -32021, 400, Verdict::Fail);
    if judgement == Judgement::Refused && !names_extension(&negative) {
        judgement = Judgement::RefusedOddly(format!(
            "refused with -32021, but its data.requiredCapabilities does not name {TASKS_EXTENSION}"
        ));
        return paired(&check, &control, &negative, judgement, Verdict::Warning);
    }
    read_only(paired(&check, &control, &negative, judgement, odd), &negative)
}

pub(super) fn names_extension(exchange: &Exchange) -> bool {
    exchange
        .error()
        .and_then(|error| error.pointer("/data/requiredCapabilities/extensions"))
        .and_then(Value::as_object)
        .is_some_and(|extensions| extensions.contains_key(TASKS_EXTENSION))
}

pub(super) async fn negotiation_get(ctx: &Context, check: Check) -> Outcome {
    without_extension(ctx, check, "tasks/get").await
}

pub(super) async fn negotiation_update(ctx: &Context, check: Check) -> Outcome {
    without_extension(ctx, check, "tasks/update").await
}

pub(super) async fn negotiation_cancel(ctx: &Context, check: Check) -> Outcome {
    without_extension(ctx, check, "tasks/cancel").await
}

pub(super) async fn negotiation_tool(ctx: &Context, check: Check) -> Outcome {
    let task = match create_task(ctx).await {
        Ok(task) => task,
        Err(blocked) => return blocked.outcome(&check),
    };
    // The same tools/call, the extension not declared.
    let mut plain = task.call.clone();
    plain.id = None;
    if let Some(params) = plain.params.as_object_mut() {
        params.insert("_meta".into(), task_meta(false));
    }
    let mut negative = ctx.target.send(plain).await;
    let leaked = created_id(&negative).or_else(|| {
        negative.result().and_then(|result| result.get("taskId")).and_then(Value::as_str).map(str::to_owned)
    });
    if let Some(id) = &leaked {
        redact_id(ctx, id, "task-unasked", &mut [&mut negative]);
        // A task created against the client's wishes is still the owner's to clean up.
        ctx.target.send(cancel(ctx.auth(), id)).await;
    }
    let (judgement, odd) = match (&leaked, negative.accepted(), negative.error_code()) {
        (Some(_), _, _) => (
            Judgement::Accepted("a task was returned to a request that did not declare the extension".into()),
            Verdict::Fail,
        ),
        (None, true, _) => (Judgement::Refused, Verdict::Warning),
        (None, false, Some(-32021)) if names_extension(&negative) => (Judgement::Refused, Verdict::Warning),
        (None, false, Some(-32021)) => (
            Judgement::RefusedOddly(format!(
                "refused with -32021, but its data.requiredCapabilities does not name {TASKS_EXTENSION}"
            )),
            Verdict::Warning,
        ),
        (None, false, _) => (
            Judgement::RefusedOddly(format!(
                "refused with {} (-32021 naming the extension, or a synchronous answer, expected)",
                negative.summary()
            )),
            Verdict::Warning,
        ),
    };
    let served_sync = leaked.is_none() && negative.accepted();
    // The control: the call declaring the extension got its task.
    let mut outcome = paired(&check, &task.created, &negative, judgement, odd);
    if outcome.verdict == Verdict::Pass {
        outcome.detail = if served_sync {
            "without the extension the call was answered synchronously, with no task; with it, a task".into()
        } else {
            format!("without the extension: {}; with it, a task", negative.summary())
        };
    }
    dispose(ctx, &task).await;
    outcome
}

// ---------------------------------------------------------------------------------------------
// Invalid ids (read-only)

pub(super) async fn invalid_id(
    ctx: &Context,
    check: Check,
    params: Value,
    name: Option<String>,
    code: Option<i64>,
) -> Outcome {
    let control = match discover_control(ctx, &check).await {
        Ok(control) => control,
        Err(outcome) => return outcome,
    };
    let mut negative = probe("tasks/get", params, ctx.auth(), true);
    if let Some(name) = name {
        negative = negative.header("mcp-name", name);
    }
    let negative = ctx.target.send(negative).await;
    let (judgement, odd) = judge_invalid(&negative, code);
    read_only(paired(&check, &control, &negative, judgement, odd), &negative)
}

pub(super) async fn id_empty(ctx: &Context, check: Check) -> Outcome {
    invalid_id(ctx, check, json!({ "taskId": "" }), None, None).await
}

pub(super) async fn id_unknown(ctx: &Context, check: Check) -> Outcome {
    let Some(id) = made_up(ctx) else { return not_testable(&check, "no task id could be made up") };
    invalid_id(ctx, check, json!({ "taskId": id }), None, Some(-32602)).await
}

pub(super) async fn id_long(ctx: &Context, check: Check) -> Outcome {
    let Some(seed) = made_up(ctx) else { return not_testable(&check, "no task id could be made up") };
    let long: String = seed.chars().cycle().take(4096).collect();
    ctx.target.redactor().add(&long, "task-long");
    invalid_id(ctx, check, json!({ "taskId": long }), None, None).await
}

pub(super) async fn id_non_string(ctx: &Context, check: Check) -> Outcome {
    invalid_id(ctx, check, json!({ "taskId": 12345 }), Some("12345".into()), None).await
}

pub(super) async fn id_missing(ctx: &Context, check: Check) -> Outcome {
    invalid_id(ctx, check, json!({}), None, None).await
}
