//! The tasks checks of methods and states: the removed `tasks/list` and `tasks/result`, terminal
//! immutability, `inputResponses` keys, and the shape and entropy of a `CreateTaskResult`.

use serde_json::{Value, json};

use super::common::*;
use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::modules::{Context, GUESSABLE_BITS, estimated_bits};
use crate::target::Exchange;

// ---------------------------------------------------------------------------------------------
// Removed methods (read-only)

pub(super) async fn removed(ctx: &Context, check: Check, method: &str) -> Outcome {
    let control = match discover_control(ctx, &check).await {
        Ok(control) => control,
        Err(outcome) => return outcome,
    };
    let Some(id) = made_up(ctx) else { return not_testable(&check, "no task id could be made up") };
    let params = if method == "tasks/list" { json!({}) } else { json!({ "taskId": id }) };
    let negative = ctx.target.send(probe(method, params, ctx.auth(), true)).await;
    let (judgement, odd) = judge_code(&negative, -32601, 404, Verdict::Warning);
    read_only(paired(&check, &control, &negative, judgement, odd), &negative)
}

pub(super) async fn removed_list(ctx: &Context, check: Check) -> Outcome {
    removed(ctx, check, "tasks/list").await
}

pub(super) async fn removed_result(ctx: &Context, check: Check) -> Outcome {
    removed(ctx, check, "tasks/result").await
}

// ---------------------------------------------------------------------------------------------
// Terminal immutability

/// Brings a new task to a terminal state (on its own, its input requests declined, or by its
/// owner's cancel), sends `op` as its owner, and compares the owner's view before and after.
pub(super) async fn terminal(ctx: &Context, check: Check, cancelled: bool, op: Op) -> Outcome {
    let mut task = match create_task(ctx).await {
        Ok(task) => task,
        Err(blocked) => return blocked.outcome(&check),
    };
    // What the task asked for while it waited (a finished task shows it no more).
    let asked = task.input_requests().cloned();
    let mut setup = Vec::new();
    if cancelled {
        setup.push(ctx.target.send(cancel(ctx.auth(), &task.id)).await);
        settle(ctx, &mut task, finished, deadline()).await;
    } else {
        setup.extend(finish(ctx, &mut task).await);
    }
    let control = task.last.clone();
    let wanted = if cancelled { "terminal (cancelled by its owner)" } else { "completed or failed" };
    let reached = match task.status() {
        Some(status) if cancelled => is_terminal(status),
        Some(status) => matches!(status, "completed" | "failed"),
        None => false,
    };
    if !reached {
        dispose(ctx, &task).await;
        let detail = format!(
            "the task did not become {wanted} within {} ms ({}: status {})",
            SETTLE_BUDGET.as_millis(),
            control.summary(),
            task.status().unwrap_or("unknown")
        );
        let mut exchanges: Vec<&Exchange> = vec![&task.created];
        exchanges.extend(setup.iter());
        exchanges.push(&control);
        return Outcome::new(&check, Verdict::Inconclusive, detail).with(&exchanges);
    }
    let negative = match op {
        Op::Update => {
            // The answers the task asked for, once more (a finished task takes none).
            let responses = asked.as_ref().map_or_else(|| json!({ "confirm": {} }), answers);
            ctx.target.send(update(ctx.auth(), &task.id, responses)).await
        }
        _ => ctx.target.send(op.probe(ctx.auth(), &task, &task.id)).await,
    };
    let after = ctx.target.send(get(ctx.auth(), &task.id)).await;
    let (before_state, after_state) = (state(&control), state(&after));
    let status = task.status().unwrap_or("unknown").to_owned();
    let (judgement, odd) = match (&after_state, before_state == after_state) {
        (None, _) => (
            Judgement::Accepted(format!(
                "after the call the owner's tasks/get no longer serves the task ({})",
                after.summary()
            )),
            Verdict::Fail,
        ),
        (Some(_), false) => (
            Judgement::Accepted(format!(
                "the {status} task changed: status {} after the call ({})",
                status_of(&after).unwrap_or("unknown"),
                negative.summary()
            )),
            Verdict::Fail,
        ),
        (Some(_), true) => (Judgement::Refused, Verdict::Warning),
    };
    let mut outcome = paired(&check, &control, &negative, judgement, odd).with(&[&after]);
    if outcome.verdict == Verdict::Pass {
        outcome.detail = format!("the {status} task kept its status and result (the call: {})", negative.summary());
    }
    for exchange in setup.iter().rev() {
        outcome.transcript.insert(0, exchange.transcript.clone());
    }
    with_creation(outcome, &task)
}

pub(super) async fn terminal_cancel_completed(ctx: &Context, check: Check) -> Outcome {
    terminal(ctx, check, false, Op::Cancel).await
}
pub(super) async fn terminal_update_completed(ctx: &Context, check: Check) -> Outcome {
    terminal(ctx, check, false, Op::Update).await
}
pub(super) async fn terminal_cancel_cancelled(ctx: &Context, check: Check) -> Outcome {
    terminal(ctx, check, true, Op::Cancel).await
}
pub(super) async fn terminal_update_cancelled(ctx: &Context, check: Check) -> Outcome {
    terminal(ctx, check, true, Op::Update).await
}

// ---------------------------------------------------------------------------------------------
// inputResponses

/// The raw body of a `tasks/update` whose `inputResponses` holds `key` twice: first declined,
/// then answered.
pub(super) fn duplicate_body(id: &Value, task_id: &str, key: &str, answer: &Value) -> Vec<u8> {
    let key = Value::from(key).to_string();
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tasks/update\",\"params\":{{\"taskId\":{},\"inputResponses\":{{{key}:{},{key}:{answer}}},\"_meta\":{}}}}}",
        Value::from(task_id),
        json!({ "action": "decline" }),
        task_meta(true)
    )
    .into_bytes()
}

pub(super) async fn input_case(ctx: &Context, check: Check, duplicate: bool) -> Outcome {
    let task = match create_task(ctx).await {
        Ok(task) => task,
        Err(blocked) => return blocked.outcome(&check),
    };
    let control = task.last.clone();
    let Some(requests) = task.input_requests().filter(|_| task.status() == Some("input_required")).cloned() else {
        dispose(ctx, &task).await;
        let why = format!(
            "the task does not wait for input (status {}): no input request to answer",
            task.status().unwrap_or("unknown")
        );
        return not_testable(&check, why).with(&[&task.created, &control]);
    };
    let key = requests.keys().next().cloned().unwrap_or_else(|| "confirm".into());
    let negative = if duplicate {
        let answer = answers(&requests).get(&key).cloned().unwrap_or(Value::Null);
        let id = ctx.target.next_id();
        let body = duplicate_body(&id, &task.id, &key, &answer);
        let probe = update(ctx.auth(), &task.id, json!({})).id(id).body(body);
        ctx.target.send(probe).await
    } else {
        // A key the task never asked for, with the answer its real key wants.
        let answer = answers(&requests).get(&key).cloned().unwrap_or(Value::Null);
        let responses = json!({ format!("palisade-verify-unknown-{key}"): answer });
        ctx.target.send(update(ctx.auth(), &task.id, responses)).await
    };
    let after = ctx.target.send(get(ctx.auth(), &task.id)).await;
    let after_requests = after.result().and_then(|r| r.get("inputRequests")).and_then(Value::as_object);
    let unchanged =
        status_of(&after) == Some("input_required") && after_requests.is_some_and(|now| now.keys().eq(requests.keys()));
    let what = if duplicate { "the update naming a key twice" } else { "the update with only unknown keys" };
    let (judgement, odd) = match (unchanged, negative.status) {
        (_, None) => (Judgement::RefusedOddly(format!("no answer ({})", negative.summary())), Verdict::Inconclusive),
        (false, _) => (
            Judgement::Accepted(format!(
                "{what} ({}) changed the task: status {} afterwards",
                negative.summary(),
                status_of(&after).unwrap_or("unknown")
            )),
            Verdict::Fail,
        ),
        (true, Some(status)) if status >= 500 => {
            (Judgement::RefusedOddly(format!("{what} got a server error ({})", negative.summary())), Verdict::Warning)
        }
        (true, _) => (Judgement::Refused, Verdict::Warning),
    };
    let mut outcome = paired(&check, &control, &negative, judgement, odd).with(&[&after]);
    if outcome.verdict == Verdict::Pass {
        let how = if negative.accepted() { "ignored" } else { "refused" };
        outcome.detail = format!("{what} was {how} ({}); the task still waits for the same input", negative.summary());
    }
    let mut task = task;
    task.last = after;
    dispose(ctx, &task).await;
    with_creation(outcome, &task)
}

pub(super) async fn input_duplicate(ctx: &Context, check: Check) -> Outcome {
    input_case(ctx, check, true).await
}

pub(super) async fn input_unknown(ctx: &Context, check: Check) -> Outcome {
    input_case(ctx, check, false).await
}

// ---------------------------------------------------------------------------------------------
// CreateTaskResult and ids

/// What is wrong with a CreateTaskResult (empty: nothing).
pub(super) fn create_problems(result: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for key in ["result", "inputRequests", "error"] {
        if result.get(key).is_some() {
            problems.push(format!("it carries `{key}` (a CreateTaskResult is flat)"));
        }
    }
    for key in ["taskId", "status", "createdAt", "lastUpdatedAt"] {
        if !result.get(key).is_some_and(Value::is_string) {
            problems.push(format!("`{key}` is missing or not a string"));
        }
    }
    if !result.get("ttlMs").is_some_and(|ttl| ttl.is_null() || ttl.is_i64() || ttl.is_u64()) {
        problems.push("`ttlMs` is missing or neither an integer nor null (it is required)".into());
    }
    let status = result.get("status").and_then(Value::as_str).unwrap_or_default();
    if !matches!(status, "working" | "input_required" | "completed" | "failed" | "cancelled") {
        problems.push("`status` is not a task status".into());
    }
    if result.get("pollIntervalMs").is_some_and(|poll| !(poll.is_i64() || poll.is_u64())) {
        problems.push("`pollIntervalMs` is not an integer".into());
    }
    problems
}

pub(super) async fn create_flat(ctx: &Context, check: Check) -> Outcome {
    let task = match create_task(ctx).await {
        Ok(task) => task,
        Err(blocked) => return blocked.outcome(&check),
    };
    let mut problems = task.created.result().map(create_problems).unwrap_or_default();
    // Durable before the response: the owner's tasks/get sent right after resolves.
    let control = if task.first_get.accepted() {
        task.first_get.clone()
    } else if task.last.accepted() {
        problems.push(format!(
            "tasks/get right after the CreateTaskResult was not served ({}), a later one was: the result came before the task was durable",
            task.first_get.summary()
        ));
        task.last.clone()
    } else {
        task.first_get.clone()
    };
    let judgement = if problems.is_empty() { Judgement::Refused } else { Judgement::Accepted(problems.join("; ")) };
    let mut outcome = paired(&check, &control, &task.created, judgement, Verdict::Fail);
    if outcome.verdict == Verdict::Pass {
        outcome.detail = "the CreateTaskResult is flat and complete, and tasks/get resolved right after it".into();
    }
    outcome.transcript.reverse();
    dispose(ctx, &task).await;
    outcome
}

/// The length of the common prefix of two ids.
pub(super) fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

pub(super) async fn create_entropy(ctx: &Context, check: Check) -> Outcome {
    let first = match create_task(ctx).await {
        Ok(task) => task,
        Err(blocked) => return blocked.outcome(&check),
    };
    let second = match create_task(ctx).await {
        Ok(task) => task,
        Err(blocked) => {
            dispose(ctx, &first).await;
            return blocked.outcome(&check);
        }
    };
    let bits = estimated_bits(&first.id).min(estimated_bits(&second.id));
    let shared = common_prefix(&first.id, &second.id);
    let (judgement, odd) = if first.id == second.id {
        (Judgement::Accepted("two tasks were given the same id".into()), Verdict::Fail)
    } else if bits < 128.0 {
        // Under GUESSABLE_BITS another caller's task id can be enumerated: a FAIL.
        let odd = if bits < GUESSABLE_BITS { Verdict::Fail } else { Verdict::Warning };
        (
            Judgement::RefusedOddly(format!(
                "the ids carry at most about {bits:.0} bits ({} characters): at least 128 expected{}",
                first.id.len(),
                if odd == Verdict::Fail { " (enumerable: another caller's task id can be guessed)" } else { "" }
            )),
            odd,
        )
    } else if shared * 2 > first.id.len() {
        (
            Judgement::RefusedOddly(format!(
                "two consecutive ids share their first {shared} of {} characters: they look sequential",
                first.id.len()
            )),
            Verdict::Warning,
        )
    } else {
        (Judgement::Refused, Verdict::Warning)
    };
    let mut outcome = paired(&check, &first.last, &second.created, judgement, odd);
    if outcome.verdict == Verdict::Pass {
        outcome.detail = format!(
            "two task ids of {} characters, about {bits:.0} bits each (estimated from their alphabet), sharing a {shared}-character prefix",
            first.id.len()
        );
    }
    dispose(ctx, &first).await;
    dispose(ctx, &second).await;
    with_creation(outcome, &first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_share_a_prefix() {
        assert_eq!(common_prefix("task-41", "task-42"), 6);
    }

    #[test]
    fn the_flat_create_result_is_judged() {
        let id = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345";
        let good = json!({ "resultType": "task", "taskId": id, "status": "working", "createdAt": "t", "lastUpdatedAt": "t", "ttlMs": null });
        assert!(create_problems(&good).is_empty());
        let mut bad = good.clone();
        bad["result"] = json!({});
        bad.as_object_mut().unwrap().remove("ttlMs");
        assert_eq!(create_problems(&bad).len(), 2);
    }

    #[test]
    fn the_duplicate_body_names_the_key_twice_and_answers_fill_schemas() {
        let body = duplicate_body(&json!(7), "tid", "confirm", &json!({ "action": "accept" }));
        let text = String::from_utf8(body).unwrap();
        assert_eq!(text.matches("\"confirm\":").count(), 2, "{text}");
        assert!(text.contains("\"id\":7") && text.contains(TASKS_EXTENSION));
        let requests = json!({ "confirm": { "method": "elicitation/create", "params": {
            "requestedSchema": { "type": "object", "properties": { "confirm": { "type": "boolean" } } } } } });
        let answered = answers(requests.as_object().unwrap());
        assert_eq!(answered, json!({ "confirm": { "action": "accept", "content": { "confirm": true } } }));
    }
}
