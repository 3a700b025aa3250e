//! The tasks checks of another identity's task: `tasks/get | update | cancel` as another
//! subject, tenant, client or without a token, the existence oracle and `Mcp-Name` ≠ `taskId`.

use super::common::*;
use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::identity::Other;
use crate::modules::Context;
use crate::target::Exchange;

// ---------------------------------------------------------------------------------------------
// Cross identity

/// Whether the foreign call changed the task, from the owner's view before and after.
pub(super) fn changed(op: Op, before: Option<&str>, after: &Exchange) -> Option<String> {
    let after_status = status_of(after);
    match (op, before, after_status) {
        (_, _, None) => Some(format!("the owner's tasks/get no longer serves the task ({})", after.summary())),
        (Op::Cancel, Some(before), Some("cancelled")) if before != "cancelled" => {
            Some(format!("the task went from {before} to cancelled"))
        }
        (Op::Update, Some("input_required"), Some(after)) if after != "input_required" => {
            Some(format!("the task went from input_required to {after}: the foreign answers were taken"))
        }
        _ => None,
    }
}

pub(super) async fn cross(ctx: &Context, check: Check, op: Op, role: Role) -> Outcome {
    let pick = match role.pick(ctx) {
        Ok(pick) => pick,
        Err(why) => return not_testable(&check, why),
    };
    let mut task = match create_task(ctx).await {
        Ok(task) => task,
        Err(blocked) => return blocked.outcome(&check),
    };
    let control = task.last.clone();
    let before = status_of(&control).map(str::to_owned);
    let negative = ctx.target.send(op.probe(auth_for(ctx, pick.as_ref()), &task, &task.id)).await;
    let (judgement, odd, after) = if op == Op::Get {
        let (judgement, odd) = if negative.accepted() {
            let shown = status_of(&negative).map_or("its answer".to_owned(), |status| format!("status {status}"));
            (
                Judgement::Accepted(format!(
                    "served ({}) to {}: it revealed {shown}",
                    negative.summary(),
                    role.label()
                )),
                Verdict::Fail,
            )
        } else if reveals(&negative, before.as_deref()) {
            (
                Judgement::Accepted(format!(
                    "refused ({}), but the refusal reveals the task's state",
                    negative.summary()
                )),
                Verdict::Fail,
            )
        } else {
            refusal_shape(&negative, role)
        };
        (judgement, odd, None)
    } else {
        let after = ctx.target.send(get(ctx.auth(), &task.id)).await;
        let (judgement, odd) = match (changed(op, before.as_deref(), &after), negative.accepted()) {
            (Some(change), true) => (
                Judgement::Accepted(format!("served ({}) to {}, and {change}", negative.summary(), role.label())),
                Verdict::Fail,
            ),
            (Some(change), false) => {
                (Judgement::Accepted(format!("refused ({}), but {change}", negative.summary())), Verdict::Fail)
            }
            (None, true) => (
                Judgement::RefusedOddly(format!(
                    "acknowledged ({}) for {} (nothing changed): -32602, as for an unknown id, expected",
                    negative.summary(),
                    role.label()
                )),
                Verdict::Warning,
            ),
            (None, false) => refusal_shape(&negative, role),
        };
        task.last = after.clone();
        (judgement, odd, Some(after))
    };
    let mut outcome = paired(&check, &control, &negative, judgement, odd);
    if let Some(after) = &after {
        outcome = outcome.with(&[after]);
    }
    if outcome.verdict == Verdict::Pass {
        outcome.detail =
            format!("{} was refused ({}); the owner's tasks/get was served", role.label(), negative.summary());
        if after.is_some() {
            outcome.detail.push_str(" before and after, the task unchanged");
        }
    }
    if let Some(caveat) = pick.as_ref().and_then(|found| found.caveat.as_deref()) {
        outcome.detail = format!("{} ({caveat})", outcome.detail);
    }
    dispose(ctx, &task).await;
    with_creation(outcome, &task)
}

pub(super) async fn get_other_subject(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Get, Role::Subject).await
}
pub(super) async fn get_other_tenant(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Get, Role::Tenant).await
}
pub(super) async fn get_other_client(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Get, Role::Client).await
}
pub(super) async fn get_no_token(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Get, Role::NoToken).await
}
pub(super) async fn update_other_subject(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Update, Role::Subject).await
}
pub(super) async fn update_other_tenant(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Update, Role::Tenant).await
}
pub(super) async fn update_other_client(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Update, Role::Client).await
}
pub(super) async fn update_no_token(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Update, Role::NoToken).await
}
pub(super) async fn cancel_other_subject(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Cancel, Role::Subject).await
}
pub(super) async fn cancel_other_tenant(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Cancel, Role::Tenant).await
}
pub(super) async fn cancel_other_client(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Cancel, Role::Client).await
}
pub(super) async fn cancel_no_token(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Cancel, Role::NoToken).await
}

// ---------------------------------------------------------------------------------------------
// Existence oracle

/// Another identity's call on the owner's task and on a made-up id must be answered alike.
pub(super) async fn oracle(ctx: &Context, check: Check, op: Op) -> Outcome {
    let other = match ctx.other(Other::Caller) {
        Ok(found) => found.index,
        Err(why) => return not_testable(&check, why),
    };
    let mut task = match create_task(ctx).await {
        Ok(task) => task,
        Err(blocked) => return blocked.outcome(&check),
    };
    let Some(unknown) = made_up(ctx) else {
        dispose(ctx, &task).await;
        return not_testable(&check, "no task id could be made up");
    };
    let control = task.last.clone();
    let foreign = ctx.target.send(op.probe(ctx.auth_of(other), &task, &task.id)).await;
    let missing = ctx.target.send(op.probe(ctx.auth_of(other), &task, &unknown)).await;
    let shape = |exchange: &Exchange| (exchange.status, exchange.accepted(), exchange.error_code());
    let describe = |exchange: &Exchange| exchange.summary();
    let (judgement, odd) = if foreign.status.is_none() || missing.status.is_none() {
        (Judgement::RefusedOddly("no answer to one of the two calls".into()), Verdict::Inconclusive)
    } else if shape(&foreign) == shape(&missing) {
        (Judgement::Refused, Verdict::Fail)
    } else {
        (
            Judgement::RefusedOddly(format!(
                "another identity's task id gets {}, an unknown id {}: the answer reveals that the task exists",
                describe(&foreign),
                describe(&missing)
            )),
            Verdict::Fail,
        )
    };
    let mut outcome = paired(&check, &control, &foreign, judgement, odd).with(&[&missing]);
    if outcome.verdict == Verdict::Pass {
        outcome.detail = format!(
            "another identity's task id and an unknown id get the same answer ({}); the owner's tasks/get was served",
            describe(&foreign)
        );
    }
    task.last = ctx.target.send(get(ctx.auth(), &task.id)).await;
    dispose(ctx, &task).await;
    with_creation(outcome, &task)
}

pub(super) async fn oracle_get(ctx: &Context, check: Check) -> Outcome {
    oracle(ctx, check, Op::Get).await
}
pub(super) async fn oracle_update(ctx: &Context, check: Check) -> Outcome {
    oracle(ctx, check, Op::Update).await
}
pub(super) async fn oracle_cancel(ctx: &Context, check: Check) -> Outcome {
    oracle(ctx, check, Op::Cancel).await
}

// ---------------------------------------------------------------------------------------------
// Mcp-Name

pub(super) async fn mcp_name(ctx: &Context, check: Check, header: Option<String>) -> Outcome {
    let task = match create_task(ctx).await {
        Ok(task) => task,
        Err(blocked) => return blocked.outcome(&check),
    };
    let control = task.last.clone();
    let negative = get(ctx.auth(), &task.id);
    let negative = match header {
        Some(name) => negative.header("mcp-name", name),
        None => negative.without("mcp-name"),
    };
    let negative = ctx.target.send(negative).await;
    let (judgement, odd) = judge_code(&negative, -32020, 400, Verdict::Warning);
    let outcome = paired(&check, &control, &negative, judgement, odd);
    dispose(ctx, &task).await;
    with_creation(outcome, &task)
}

pub(super) async fn mcp_name_mismatch(ctx: &Context, check: Check) -> Outcome {
    let Some(other) = made_up(ctx) else { return not_testable(&check, "no task id could be made up") };
    mcp_name(ctx, check, Some(other)).await
}

pub(super) async fn mcp_name_missing(ctx: &Context, check: Check) -> Outcome {
    mcp_name(ctx, check, None).await
}
