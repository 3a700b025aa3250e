//! The listen module (seed 002, "Bind each listen stream to its request and filters"): every
//! `subscriptions/listen` stream is re-authorized and bound to the request that opened it. The
//! acknowledgement comes first and carries the request's exact id (its JSON type kept), and
//! honours only what was asked; unknown, forged and malformed filters are refused or left out of
//! the acknowledgement; another identity's task ids are never honoured and never answered
//! differently from ids that do not exist; another identity's (or tenant's) task events never
//! reach a stream; no token, another resource's token and an expired one are refused; an
//! `Mcp-Session-Id` or `Last-Event-ID` resumes nothing; the 2025-era GET stream is gone.
//!
//! Every negative case is paired with its positive control: the same listen by the right
//! identity acknowledged. A listen is read as a stream ([`Target::send_stream`]): for at most
//! [`WINDOW`], or only until its acknowledgement when nothing more is needed, then dropped.
//! Cases that need a task (created by calling a read-only tool without arguments that answers
//! with a task, then advanced or cancelled) are NOT TESTABLE without `--allow-mutations`. Task
//! ids are added to the run's redactor.
//!
//! [`Target::send_stream`]: crate::target::Target::send_stream

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value, json};

use crate::check::{Check, Judgement, Outcome, Verdict};
use crate::identity::{Identity, Other, Token};
use crate::modules::{Context, Module, cases};
use crate::target::{Auth, Exchange, Probe};

/// The method under test.
const METHOD: &str = "subscriptions/listen";
/// The acknowledgement's method.
const ACKNOWLEDGED: &str = "notifications/subscriptions/acknowledged";
/// The tasks extension's key.
const TASKS: &str = "io.modelcontextprotocol/tasks";
/// The longest a stream is read.
const WINDOW: Duration = Duration::from_millis(1500);
/// How long after the listens open the task they watch is changed.
const TRIGGER_DELAY: Duration = Duration::from_millis(400);

/// The listen module.
pub fn module() -> Module {
    Module {
        name: "listen",
        exclusive: false,
        cases: cases! {
            string_id: "listen.ack.string_id", "The acknowledgement comes first and carries the exact string request id (two concurrent listens)",
                "2026-07-28 subscriptions §Acknowledgement: first message, subscriptionId = the request's id, type kept; seed 002 (listen)", Medium;
            integer_id: "listen.ack.integer_id", "The acknowledgement comes first and carries the exact integer request id",
                "2026-07-28 subscriptions §Acknowledgement: the id keeps its JSON type; seed 002 (listen)", Medium;
            subset: "listen.ack.honoured_subset", "The acknowledgement honours only what was requested",
                "SubscriptionFilter: the server MUST NOT send notification types the client has not requested", Medium;
            unknown_key: "listen.filter.unknown_key", "An unknown filter key is refused or left out of the acknowledgement",
                "SubscriptionsAcknowledgedNotification: only the honoured subset is acknowledged; seed 002 (forged filters)", Medium;
            forged_resource: "listen.filter.forged_resource", "A subscription to a resource that does not exist is refused or not acknowledged",
                "seed 002: authorize every core filter and resource URI", Medium;
            missing: "listen.filter.missing", "A listen without `notifications` is refused with -32602",
                "SubscriptionsListenRequestParams: `notifications` is required; basic §Error Codes -32602", Low;
            not_object: "listen.filter.not_object", "A filter that is not an object is refused with -32602",
                "SubscriptionsListenRequestParams: `notifications` is a SubscriptionFilter object", Low;
            flag_type: "listen.filter.flag_type", "A list-changed flag that is not a boolean is refused",
                "SubscriptionFilter: toolsListChanged is a boolean", Low;
            subscriptions_type: "listen.filter.subscriptions_type", "`resourceSubscriptions` that is not an array is refused",
                "SubscriptionFilter: resourceSubscriptions is an array of URIs", Low;
            task_ids_capability: "listen.filter.task_ids_capability", "A `taskIds` filter without the tasks extension is refused with -32021",
                "ext-tasks §Notifications: taskIds without the capability gets -32021", Medium;
            task_other: "listen.task.other_identity", "Another identity's task id in `taskIds` is refused or not acknowledged",
                "seed 002: for Tasks, accept only owned task IDs; ext-tasks §Security", Critical;
            task_oracle: "listen.task.existence_oracle", "Another identity's task id is answered like a task id that does not exist",
                "seed 002 (unowned task IDs); seed 000: a refusal must not reveal whether a foreign object exists", High;
            own_events: "listen.delivery.own_events", "The owner's stream delivers its task's notifications/tasks, each tagged with its subscription id",
                "2026-07-28 basic: listen notifications MUST carry subscriptionId; ext-tasks §Notifications", Medium;
            other_identity: "listen.delivery.other_identity", "Another identity's task events never reach a stream",
                "seed 002: re-check authorization before every event (cross-identity delivery)", Critical;
            other_tenant: "listen.delivery.other_tenant", "Another tenant's task events never reach a stream",
                "seed 002: filter by principal, client and tenant (cross-identity delivery)", Critical;
            no_token: "listen.auth.no_token", "A listen without a token is refused with 401",
                "authorization §Token Requirements: every request carries the token; RFC 6750 §3", Critical;
            other_resource: "listen.auth.other_resource", "A listen with a token issued for another resource is refused",
                "authorization §Token Audience Binding (RFC 8707); seed 002: authorize each stream", Critical;
            expired: "listen.auth.expired", "A listen with an expired token is refused",
                "authorization §Token Handling; seed 002: close on token expiry", Critical;
            session_id: "listen.resume.session_id", "An `Mcp-Session-Id` on a listen resumes nothing",
                "2026-07-28 streamable HTTP: ignore Mcp-Session-Id, no resumption; seed 002", High;
            last_event_id: "listen.resume.last_event_id", "A `Last-Event-ID` on a listen resumes nothing",
                "2026-07-28 streamable HTTP: ignore Last-Event-ID, no resumption; seed 002", High;
            get_stream: "listen.get.stream", "GET on the endpoint (the 2025-era stream) is refused on the 2026-07-28 wire",
                "2026-07-28 streamable HTTP: POST only, GET gets 405; subscriptions replace the GET stream", Medium;
        },
    }
}

// ----- probes and reading ---------------------------------------------------------------------

/// A listen with `filter` (the tasks extension declared when `tasks`).
fn listen(filter: Value, auth: Auth, tasks: bool) -> Probe {
    with_params(json!({ "notifications": filter }), auth, tasks)
}

/// A listen with these params verbatim (besides `_meta`).
fn with_params(params: Value, auth: Auth, tasks: bool) -> Probe {
    let mut probe = Probe::request(METHOD, params, auth);
    if tasks {
        declare(&mut probe, json!({ "extensions": { TASKS: {} } }));
    }
    probe
}

/// Sets the probe's declared client capabilities.
fn declare(probe: &mut Probe, capabilities: Value) {
    if let Some(meta) = probe.params.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.insert("io.modelcontextprotocol/clientCapabilities".into(), capabilities);
    }
}

/// The filter every control uses: tool list changes only (any server can honour or drop it).
fn plain() -> Value {
    json!({ "toolsListChanged": true })
}

/// A listen read until its acknowledgement (or the window's end).
async fn first(ctx: &Context, probe: Probe) -> Exchange {
    ctx.target.send_stream(probe, WINDOW, 1).await
}

/// A listen read for the whole window.
async fn whole(ctx: &Context, probe: Probe) -> Exchange {
    ctx.target.send_stream(probe, WINDOW, usize::MAX).await
}

/// The subscription id a stream message carries.
fn subscription_of(frame: &Value) -> Option<&Value> {
    frame.pointer("/params/_meta/io.modelcontextprotocol~1subscriptionId")
}

fn is_ack(frame: &Value) -> bool {
    frame.get("method").and_then(Value::as_str) == Some(ACKNOWLEDGED)
}

/// The acknowledgement, when it is the stream's first message and carries the request's id.
fn ack(exchange: &Exchange) -> Option<&Value> {
    exchange.frames.first().filter(|frame| is_ack(frame) && subscription_of(frame) == Some(&exchange.id))
}

/// Whether any message of the answer acknowledges a subscription (whatever its id).
fn any_ack(exchange: &Exchange) -> bool {
    exchange.frames.iter().any(is_ack)
}

/// The honoured filter of the acknowledgement.
fn honoured(exchange: &Exchange) -> Option<&Map<String, Value>> {
    exchange.frames.iter().find(|frame| is_ack(frame))?.pointer("/params/notifications")?.as_object()
}

/// One line on a listen's answer.
fn summary(exchange: &Exchange) -> String {
    let Some(status) = exchange.status else { return exchange.summary() };
    if let Some(frame) = exchange.frames.iter().find(|frame| is_ack(frame)) {
        let honoured = frame.pointer("/params/notifications").map_or_else(|| "?".into(), Value::to_string);
        let tagged = subscription_of(frame).map_or_else(|| "no subscription id".into(), Value::to_string);
        let rest = exchange.frames.len() - 1;
        return format!("HTTP {status}, acknowledged for {tagged} (honoured {honoured}), {rest} more message(s)");
    }
    exchange.summary()
}

/// The same as `check::paired`, for listens: the control must be acknowledged (a listen has no
/// result until it ends). A target that does not serve listen at all makes the case NOT TESTABLE.
fn paired(check: &Check, control: &Exchange, negative: &Exchange, judgement: Judgement, odd: Verdict) -> Outcome {
    if ack(control).is_none() {
        if control.error_code() == Some(-32601) {
            let detail = format!("the target does not serve subscriptions/listen ({})", control.summary());
            return Outcome::new(check, Verdict::NotTestable, detail).with(&[control, negative]);
        }
        let detail = format!("positive control not acknowledged ({}): nothing to compare with", summary(control));
        return Outcome::new(check, Verdict::Inconclusive, detail).with(&[control, negative]);
    }
    let (verdict, detail) = match judgement {
        Judgement::Refused if any_ack(negative) => (
            Verdict::Pass,
            format!("not honoured: acknowledged without it ({}); the control was acknowledged", summary(negative)),
        ),
        Judgement::Refused => (Verdict::Pass, format!("refused ({}); the control was acknowledged", summary(negative))),
        Judgement::RefusedOddly(why) => (odd, why),
        Judgement::Accepted(why) => (Verdict::Fail, why),
    };
    Outcome::new(check, verdict, detail).with(&[control, negative])
}

/// Refused is no acknowledgement and a 4xx or a JSON-RPC error; `status` / `code`: the way
/// required (another refusal is `odd`).
fn judge(negative: &Exchange, status: &[u16], code: Option<i64>) -> Judgement {
    if any_ack(negative) || negative.accepted() {
        return Judgement::Accepted(format!("the listen was served ({})", summary(negative)));
    }
    let Some(got) = negative.status else {
        return Judgement::RefusedOddly(format!("no answer ({})", negative.summary()));
    };
    if !negative.client_error() && negative.error().is_none() {
        return Judgement::RefusedOddly(format!("neither acknowledged nor refused ({})", summary(negative)));
    }
    if !status.is_empty() && !status.contains(&got) {
        return Judgement::RefusedOddly(format!("refused, but with {} ({status:?} expected)", negative.summary()));
    }
    match code {
        Some(code) if negative.error_code() != Some(code) => {
            Judgement::RefusedOddly(format!("refused, but with {} (error {code} expected)", negative.summary()))
        }
        _ => Judgement::Refused,
    }
}

/// A filter that may be ignored: refused, or acknowledged without `key` (a PASS either way);
/// acknowledged with it is served.
fn judge_ignored(negative: &Exchange, key: &str, shows: impl Fn(&Value) -> bool) -> Judgement {
    if !any_ack(negative) {
        return judge(negative, &[], None);
    }
    match honoured(negative).and_then(|h| h.get(key)) {
        Some(value) if shows(value) => {
            Judgement::Accepted(format!("acknowledged with {key} = {value} honoured ({})", summary(negative)))
        }
        _ if ack(negative).is_none() => Judgement::Accepted(format!(
            "acknowledged, but not first or not for the request's id ({})",
            summary(negative)
        )),
        _ => Judgement::Refused,
    }
}

fn not_testable(check: &Check, why: impl Into<String>) -> Outcome {
    Outcome::new(check, Verdict::NotTestable, why)
}

/// 32 random bytes, base64url (a made-up id).
fn random_id() -> Option<String> {
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes).ok()?;
    Some(URL_SAFE_NO_PAD.encode(bytes))
}

/// The outcome with `before` written first in its transcript.
fn after(mut outcome: Outcome, before: &[Exchange]) -> Outcome {
    outcome.transcript.splice(0..0, before.iter().map(|exchange| exchange.transcript.clone()));
    outcome
}

// ----- the acknowledgement ------------------------------------------------------------------

/// The positive control of the acknowledgement checks: the first identity's `tools/list` on
/// the 2026-07-28 wire is served; `Err` (inconclusive) when it is not — a server that does not
/// speak this revision cannot be judged on its listen streams.
async fn control(ctx: &Context, check: &Check) -> Result<Exchange, Outcome> {
    let control = ctx.target.send(ctx.base()).await;
    if control.accepted() {
        return Ok(control);
    }
    let detail = format!("positive control not accepted (tools/list: {}): nothing to compare with", control.summary());
    Err(Outcome::new(check, Verdict::Inconclusive, detail).with(&[&control]))
}

/// Two concurrent listens with ids `a` and `b`: each acknowledged first with its own id.
async fn two_ids(ctx: &Context, check: Check, a: Value, b: Value) -> Outcome {
    if let Err(outcome) = control(ctx, &check).await {
        return outcome;
    }
    let (one, two) = tokio::join!(
        first(ctx, listen(plain(), ctx.auth(), false).id(a)),
        first(ctx, listen(plain(), ctx.auth(), false).id(b))
    );
    if one.error_code() == Some(-32601) {
        return not_testable(&check, format!("the target does not serve subscriptions/listen ({})", one.summary()))
            .with(&[&one, &two]);
    }
    let wrong = [&one, &two].into_iter().find(|exchange| ack(exchange).is_none());
    let (verdict, detail) = match wrong {
        None => (Verdict::Pass, format!("each listen was acknowledged first with its own id ({}; {})", one.id, two.id)),
        Some(exchange) => match exchange.frames.first() {
            None => (Verdict::Fail, format!("no acknowledgement came ({})", summary(exchange))),
            Some(frame) if !is_ack(frame) => (
                Verdict::Fail,
                format!(
                    "the first message is not the acknowledgement: {}",
                    frame.get("method").unwrap_or(&Value::Null)
                ),
            ),
            Some(frame) => (
                Verdict::Fail,
                format!(
                    "acknowledged with subscriptionId {} for request id {} (the exact id, type kept, is required)",
                    subscription_of(frame).unwrap_or(&Value::Null),
                    exchange.id
                ),
            ),
        },
    };
    Outcome::new(&check, verdict, detail).with(&[&one, &two])
}

async fn string_id(ctx: &Context, check: Check) -> Outcome {
    let n = ctx.target.next_id();
    two_ids(ctx, check, json!(format!("verify-listen-{n}-a")), json!(format!("verify-listen-{n}-b"))).await
}

async fn integer_id(ctx: &Context, check: Check) -> Outcome {
    let (a, b) = (ctx.target.next_id(), ctx.target.next_id());
    two_ids(ctx, check, a, b).await
}

/// Whether a filter entry asks for something (a true flag, a non-empty list).
fn asks(value: &Value) -> bool {
    match value {
        Value::Bool(on) => *on,
        Value::Array(items) => !items.is_empty(),
        Value::Null => false,
        _ => true,
    }
}

async fn subset(ctx: &Context, check: Check) -> Outcome {
    if let Err(outcome) = control(ctx, &check).await {
        return outcome;
    }
    let (tools, nothing) =
        tokio::join!(first(ctx, listen(plain(), ctx.auth(), false)), first(ctx, listen(json!({}), ctx.auth(), false)));
    if tools.error_code() == Some(-32601) {
        return not_testable(&check, format!("the target does not serve subscriptions/listen ({})", tools.summary()))
            .with(&[&tools, &nothing]);
    }
    let mut problems = Vec::new();
    for (exchange, allowed) in [(&tools, &["toolsListChanged"][..]), (&nothing, &[][..])] {
        match (ack(exchange), honoured(exchange)) {
            (Some(_), Some(honoured)) => {
                let extra: Vec<&String> = honoured
                    .iter()
                    .filter(|(k, v)| asks(v) && !allowed.contains(&k.as_str()))
                    .map(|(k, _)| k)
                    .collect();
                if !extra.is_empty() {
                    problems.push(format!("asked for {allowed:?}, acknowledged {extra:?} too"));
                }
            }
            (Some(_), None) => problems.push("the acknowledgement has no `notifications` (it is required)".into()),
            (None, _) => problems.push(format!("not acknowledged first for its id ({})", summary(exchange))),
        }
    }
    let (verdict, detail) = if problems.is_empty() {
        (Verdict::Pass, "each acknowledgement honours a subset of what was asked".to_owned())
    } else {
        (Verdict::Fail, problems.join("; "))
    };
    Outcome::new(&check, verdict, detail).with(&[&tools, &nothing])
}

// ----- filters ------------------------------------------------------------------------------

/// A resource URI the first identity is listed (if any).
async fn listed_resource(ctx: &Context) -> (Option<String>, Exchange) {
    let listed = ctx.target.send(Probe::request("resources/list", json!({}), ctx.auth())).await;
    let uri = listed
        .result()
        .and_then(|r| r.get("resources"))
        .and_then(Value::as_array)
        .and_then(|resources| resources.iter().find_map(|r| r.get("uri").and_then(Value::as_str)))
        .map(str::to_owned);
    (uri, listed)
}

/// The control (the plain filter) and the negative (`params` verbatim), judged by `judge`.
async fn against(
    ctx: &Context,
    check: Check,
    params: Value,
    judgement: fn(&Exchange) -> Judgement,
    odd: Verdict,
) -> Outcome {
    let control = first(ctx, listen(plain(), ctx.auth(), false)).await;
    let negative = first(ctx, with_params(params, ctx.auth(), false)).await;
    paired(&check, &control, &negative, judgement(&negative), odd)
}

async fn unknown_key(ctx: &Context, check: Check) -> Outcome {
    let control = first(ctx, listen(plain(), ctx.auth(), false)).await;
    let filter = json!({ "toolsListChanged": true, "palisadeVerifyUnknown": true });
    let negative = first(ctx, listen(filter, ctx.auth(), false)).await;
    let judgement = judge_ignored(&negative, "palisadeVerifyUnknown", asks);
    paired(&check, &control, &negative, judgement, Verdict::Warning)
}

async fn forged_resource(ctx: &Context, check: Check) -> Outcome {
    let (uri, listed) = listed_resource(ctx).await;
    let (control_filter, forged) = match &uri {
        Some(uri) => (json!({ "resourceSubscriptions": [uri] }), format!("{uri}-palisade-verify-missing")),
        None => (plain(), "palisade-verify://missing/resource".to_owned()),
    };
    let control = first(ctx, listen(control_filter, ctx.auth(), false)).await;
    let filter = json!({ "resourceSubscriptions": [forged.clone()] });
    let negative = first(ctx, listen(filter, ctx.auth(), false)).await;
    let judgement = judge_ignored(&negative, "resourceSubscriptions", |value| {
        value.as_array().is_some_and(|uris| uris.iter().any(|u| u.as_str() == Some(forged.as_str())))
    });
    after(paired(&check, &control, &negative, judgement, Verdict::Warning), &[listed])
}

async fn missing(ctx: &Context, check: Check) -> Outcome {
    against(ctx, check, json!({}), |n| judge(n, &[], Some(-32602)), Verdict::Warning).await
}

async fn not_object(ctx: &Context, check: Check) -> Outcome {
    against(ctx, check, json!({ "notifications": "all" }), |n| judge(n, &[], Some(-32602)), Verdict::Warning).await
}

async fn flag_type(ctx: &Context, check: Check) -> Outcome {
    let params = json!({ "notifications": { "toolsListChanged": "yes" } });
    against(ctx, check, params, |n| judge(n, &[], None), Verdict::Warning).await
}

async fn subscriptions_type(ctx: &Context, check: Check) -> Outcome {
    let params = json!({ "notifications": { "resourceSubscriptions": "palisade-verify://a" } });
    against(ctx, check, params, |n| judge(n, &[], None), Verdict::Warning).await
}

/// Whether the target advertises the tasks extension (`server/discover`), with the exchange.
async fn tasks_advertised(ctx: &Context) -> (bool, Exchange) {
    let discover = ctx.target.send(Probe::request("server/discover", json!({}), ctx.auth())).await;
    let advertised = discover.result().and_then(|r| r.pointer("/capabilities/extensions")).and_then(|e| e.get(TASKS));
    (advertised.is_some(), discover)
}

async fn task_ids_capability(ctx: &Context, check: Check) -> Outcome {
    let (advertised, discover) = tasks_advertised(ctx).await;
    if !advertised {
        return not_testable(&check, "the target does not advertise the tasks extension (server/discover)")
            .with(&[&discover]);
    }
    let made_up = random_id().unwrap_or_else(|| "palisade-verify-task".into());
    ctx.target.redactor().add(&made_up, "task-made-up");
    let filter = json!({ "taskIds": [made_up] });
    let control = first(ctx, listen(filter.clone(), ctx.auth(), true)).await;
    let negative = first(ctx, listen(filter, ctx.auth(), false)).await;
    let judgement = judge(&negative, &[], Some(-32021));
    after(paired(&check, &control, &negative, judgement, Verdict::Warning), &[discover])
}

// ----- tasks ----------------------------------------------------------------------------------

/// A task one identity created for the case (its id redacted from here on).
struct Task {
    id: String,
    owner: usize,
    made: Vec<Exchange>,
}

/// A request as identity `who`, declaring the tasks extension and form elicitation.
fn task_request(ctx: &Context, who: usize, method: &str, params: Value) -> Probe {
    let mut probe = Probe::request(method, params, ctx.auth_of(who));
    declare(&mut probe, json!({ "elicitation": {}, "extensions": { TASKS: {} } }));
    probe
}

/// Read-only tools without required arguments (of those the one rule lets a check call), those
/// that say they run as tasks first.
fn task_candidates(ctx: &Context, listed: &Exchange) -> Vec<String> {
    let tools = listed.result().and_then(|r| r.get("tools")).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut candidates: Vec<(u8, String)> = ctx
        .callable_tools(&tools)
        .into_iter()
        .filter(|(callable, _)| callable.read_only())
        .map(|(_, tool)| tool)
        .filter(|tool| {
            tool.pointer("/inputSchema/required").and_then(Value::as_array).is_none_or(|required| required.is_empty())
        })
        .filter(|tool| tool.pointer("/execution/taskSupport").and_then(Value::as_str) != Some("forbidden"))
        .filter_map(|tool| {
            let rank = match tool.pointer("/execution/taskSupport").and_then(Value::as_str) {
                Some("required") => 0,
                Some("optional") => 1,
                _ => 2,
            };
            Some((rank, tool.get("name")?.as_str()?.to_owned()))
        })
        .collect();
    candidates.sort_by_key(|(rank, _)| *rank);
    candidates.into_iter().map(|(_, name)| name).take(5).collect()
}

/// Creates a task as identity `owner`. `Err`: why no task can be had (NOT TESTABLE).
async fn create_task(ctx: &Context, owner: usize) -> Result<Task, (String, Vec<Exchange>)> {
    if !ctx.allow_mutations {
        return Err(("creating a task is a side effect: run with --allow-mutations".into(), Vec::new()));
    }
    let (advertised, discover) = tasks_advertised(ctx).await;
    if !advertised {
        return Err(("the target does not advertise the tasks extension (server/discover)".into(), vec![discover]));
    }
    let listed = ctx.target.send(task_request(ctx, owner, "tools/list", json!({}))).await;
    let mut made = vec![discover];
    let candidates = task_candidates(ctx, &listed);
    made.push(listed);
    for name in candidates {
        let call = task_request(ctx, owner, "tools/call", json!({ "name": name, "arguments": {} }));
        let answer = ctx.target.send(call).await;
        let result = answer.result();
        let id = result
            .filter(|r| r.get("resultType").and_then(Value::as_str) == Some("task"))
            .and_then(|r| r.get("taskId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        made.push(answer);
        if let Some(id) = id {
            let who = ctx.identities.get(owner).map_or("owner", |identity| identity.name.as_str());
            ctx.target.redactor().add(&id, &format!("task-{who}"));
            crate::modules::state::redact(ctx, &mut made);
            return Ok(Task { id, owner, made });
        }
    }
    Err(("no read-only tool without required arguments answered with a task".into(), made))
}

/// A value for each property of an elicitation's requested schema (accepting it).
fn fill(schema: &Value) -> Value {
    let mut content = Map::new();
    for (name, property) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
        let value = match property.get("type").and_then(Value::as_str) {
            Some("boolean") => json!(true),
            Some("integer" | "number") => property.get("minimum").cloned().unwrap_or(json!(1)),
            _ => property.get("enum").and_then(|e| e.get(0)).cloned().unwrap_or(json!("yes")),
        };
        content.insert(name.clone(), value);
    }
    Value::Object(content)
}

/// Changes the task as its owner: answers its elicitations when it waits for input, else
/// cancels it. Either is an event for its listeners.
async fn advance(ctx: &Context, task: &Task) -> Vec<Exchange> {
    let get = ctx.target.send(task_request(ctx, task.owner, "tasks/get", json!({ "taskId": task.id }))).await;
    let mut responses = Map::new();
    if get.result().and_then(|r| r.get("status")).and_then(Value::as_str) == Some("input_required") {
        let requests = get.result().and_then(|r| r.get("inputRequests")).and_then(Value::as_object);
        for (key, request) in requests.into_iter().flatten() {
            if request.get("method").and_then(Value::as_str) == Some("elicitation/create") {
                let schema = request.pointer("/params/requestedSchema").cloned().unwrap_or(Value::Null);
                responses.insert(key.clone(), json!({ "action": "accept", "content": fill(&schema) }));
            }
        }
    }
    let change = if responses.is_empty() {
        task_request(ctx, task.owner, "tasks/cancel", json!({ "taskId": task.id }))
    } else {
        task_request(ctx, task.owner, "tasks/update", json!({ "taskId": task.id, "inputResponses": responses }))
    };
    vec![get, ctx.target.send(change).await]
}

/// Ends the case's task (the answer does not matter).
async fn cancel(ctx: &Context, task: &Task) -> Exchange {
    ctx.target.send(task_request(ctx, task.owner, "tasks/cancel", json!({ "taskId": task.id }))).await
}

/// Whether the acknowledged `taskIds` hold `id`.
fn honours_task(exchange: &Exchange, id: &str) -> bool {
    honoured(exchange)
        .and_then(|h| h.get("taskIds"))
        .and_then(Value::as_array)
        .is_some_and(|ids| ids.iter().any(|i| i.as_str() == Some(id)))
}

async fn task_other(ctx: &Context, check: Check) -> Outcome {
    let other = match ctx.other(Other::Caller) {
        Ok(found) => found.index,
        Err(why) => return not_testable(&check, why),
    };
    let task = match create_task(ctx, 0).await {
        Ok(task) => task,
        Err((why, made)) => return after(not_testable(&check, why), &made),
    };
    let filter = json!({ "taskIds": [task.id] });
    let control = first(ctx, listen(filter.clone(), ctx.auth(), true)).await;
    let negative = first(ctx, listen(filter, ctx.auth_of(other), true)).await;
    let cleanup = cancel(ctx, &task).await;
    let judgement = if honours_task(&negative, &task.id) {
        Judgement::Accepted(format!("another identity's task id was acknowledged ({})", summary(&negative)))
    } else if any_ack(&negative) {
        Judgement::Refused
    } else {
        judge(&negative, &[], None)
    };
    let judgement = match judgement {
        Judgement::Refused if !honours_task(&control, &task.id) => Judgement::RefusedOddly(format!(
            "the owner's own listen did not acknowledge the task ({}): nothing to compare with",
            summary(&control)
        )),
        other => other,
    };
    let odd = if honours_task(&control, &task.id) { Verdict::Warning } else { Verdict::Inconclusive };
    after(paired(&check, &control, &negative, judgement, odd).with(&[&cleanup]), &task.made)
}

/// What a listen's answer reveals: status, error code, and whether any task id was honoured.
fn shape(exchange: &Exchange) -> (Option<u16>, Option<i64>, bool, bool) {
    let tasks =
        honoured(exchange).and_then(|h| h.get("taskIds")).and_then(Value::as_array).is_some_and(|ids| !ids.is_empty());
    (exchange.status, exchange.error_code(), any_ack(exchange), tasks)
}

async fn task_oracle(ctx: &Context, check: Check) -> Outcome {
    let other = match ctx.other(Other::Caller) {
        Ok(found) => found.index,
        Err(why) => return not_testable(&check, why),
    };
    let task = match create_task(ctx, 0).await {
        Ok(task) => task,
        Err((why, made)) => return after(not_testable(&check, why), &made),
    };
    let Some(made_up) = random_id() else {
        return after(not_testable(&check, "no task id could be made up (the random source failed)"), &task.made);
    };
    ctx.target.redactor().add(&made_up, "task-made-up");
    let control = first(ctx, listen(json!({ "taskIds": [task.id] }), ctx.auth(), true)).await;
    let foreign = first(ctx, listen(json!({ "taskIds": [task.id] }), ctx.auth_of(other), true)).await;
    let unknown = first(ctx, listen(json!({ "taskIds": [made_up] }), ctx.auth_of(other), true)).await;
    let cleanup = cancel(ctx, &task).await;
    let judgement = if shape(&foreign) == shape(&unknown) {
        Judgement::Refused
    } else {
        Judgement::Accepted(format!(
            "another identity's task id is answered differently ({}) from a task id that does not exist ({}): \
             the answer reveals that the task exists",
            summary(&foreign),
            summary(&unknown)
        ))
    };
    let outcome = match judgement {
        Judgement::Refused if ack(&control).is_some() => Outcome::new(
            &check,
            Verdict::Pass,
            format!("another identity's task id and a made-up one are answered alike ({})", summary(&foreign)),
        )
        .with(&[&control, &foreign]),
        other => paired(&check, &control, &foreign, other, Verdict::Fail),
    };
    after(outcome.with(&[&unknown, &cleanup]), &task.made)
}

/// The frames of a stream that are task notifications.
fn task_events(exchange: &Exchange) -> Vec<&Value> {
    exchange.frames.iter().filter(|f| f.get("method").and_then(Value::as_str) == Some("notifications/tasks")).collect()
}

/// The owner listens on its task, `others` listen with every filter they can name (the task id
/// too), the owner changes the task: returns the owner's stream, the others', and the change.
async fn watch(
    ctx: &Context,
    task: &Task,
    others: &[usize],
    extra: &Value,
) -> (Exchange, Vec<Exchange>, Vec<Exchange>) {
    let mut everything = json!({
        "toolsListChanged": true, "promptsListChanged": true, "resourcesListChanged": true, "taskIds": [task.id]
    });
    if let (Some(filter), Some(uris)) = (everything.as_object_mut(), extra.as_array()) {
        filter.insert("resourceSubscriptions".into(), json!(uris));
    }
    let owner = whole(ctx, listen(json!({ "taskIds": [task.id] }), ctx.auth_of(task.owner), true));
    let streams = futures::future::join_all(
        others.iter().map(|other| whole(ctx, listen(everything.clone(), ctx.auth_of(*other), true))),
    );
    let change = async {
        tokio::time::sleep(TRIGGER_DELAY).await;
        advance(ctx, task).await
    };
    tokio::join!(owner, streams, change)
}

/// Whether the owner's stream shows the event the case relies on.
fn delivered(owner: &Exchange, id: &str) -> bool {
    ack(owner).is_some()
        && task_events(owner).iter().any(|f| f.pointer("/params/taskId").and_then(Value::as_str) == Some(id))
}

async fn own_events(ctx: &Context, check: Check) -> Outcome {
    let task = match create_task(ctx, 0).await {
        Ok(task) => task,
        Err((why, made)) => return after(not_testable(&check, why), &made),
    };
    let (owner, _, change) = watch(ctx, &task, &[], &Value::Null).await;
    let events = task_events(&owner);
    let untagged = owner.frames.iter().filter(|f| subscription_of(f) != Some(&owner.id)).count();
    let (verdict, detail) = if owner.error_code() == Some(-32601) {
        (Verdict::NotTestable, format!("the target does not serve subscriptions/listen ({})", owner.summary()))
    } else if ack(&owner).is_none() {
        (Verdict::Fail, format!("the owner's listen was not acknowledged first for its id ({})", summary(&owner)))
    } else if !delivered(&owner, &task.id) {
        (Verdict::Fail, format!("the task changed, but no notifications/tasks for it came ({})", summary(&owner)))
    } else if untagged > 0 {
        (Verdict::Fail, format!("{untagged} message(s) of the stream do not carry its subscription id {}", owner.id))
    } else {
        (
            Verdict::Pass,
            format!("{} notifications/tasks delivered after the acknowledgement, each tagged", events.len()),
        )
    };
    let outcome = Outcome::new(&check, verdict, detail).with(&[&owner]);
    let change: Vec<&Exchange> = change.iter().collect();
    after(outcome.with(&change), &task.made)
}

/// The owner's task changes while `other` listens with every filter (the task id included):
/// nothing of it may reach `other`'s stream; the owner's own stream must show it (the control).
async fn cross(ctx: &Context, check: Check, other: usize) -> Outcome {
    let task = match create_task(ctx, 0).await {
        Ok(task) => task,
        Err((why, made)) => return after(not_testable(&check, why), &made),
    };
    let (uri, listed) = listed_resource(ctx).await;
    let uris = json!(uri.into_iter().collect::<Vec<_>>());
    let (owner, mut streams, change) = watch(ctx, &task, &[other], &uris).await;
    let stream = streams.pop().unwrap_or_else(|| owner.clone());
    let leaked: Vec<&Value> = stream
        .frames
        .iter()
        .filter(|frame| {
            !is_ack(frame)
                && (frame.to_string().contains(&task.id)
                    || subscription_of(frame) == Some(&owner.id)
                    || frame.get("method").and_then(Value::as_str) == Some("notifications/tasks"))
        })
        .collect();
    let judgement = if !leaked.is_empty() {
        let methods: Vec<&str> = leaked.iter().filter_map(|f| f.get("method").and_then(Value::as_str)).collect();
        Judgement::Accepted(format!(
            "the owner's task events reached another identity's stream: {} message(s) ({methods:?}) ({})",
            leaked.len(),
            summary(&stream)
        ))
    } else if !delivered(&owner, &task.id) {
        Judgement::RefusedOddly(format!(
            "the owner's own stream showed no event of the task ({}): nothing to compare with",
            summary(&owner)
        ))
    } else if stream.status.is_none() {
        Judgement::RefusedOddly(format!("the other stream got no answer ({})", stream.summary()))
    } else {
        Judgement::Refused
    };
    let odd = Verdict::Inconclusive;
    let mut outcome = paired(&check, &owner, &stream, judgement, odd);
    if outcome.verdict == Verdict::Pass {
        outcome.detail = format!(
            "the owner's stream got {} event(s) of its task; the other identity's stream ({}) got none",
            task_events(&owner).len(),
            summary(&stream)
        );
    }
    let change: Vec<&Exchange> = change.iter().collect();
    let mut before = task.made;
    before.push(listed);
    after(outcome.with(&change), &before)
}

async fn other_identity(ctx: &Context, check: Check) -> Outcome {
    match ctx.other(Other::Caller) {
        Ok(found) => cross(ctx, check, found.index).await,
        Err(why) => not_testable(&check, why),
    }
}

async fn other_tenant(ctx: &Context, check: Check) -> Outcome {
    match ctx.other(Other::Tenant) {
        Ok(found) => cross(ctx, check, found.index).await,
        Err(why) => not_testable(&check, why),
    }
}

// ----- authentication ---------------------------------------------------------------------------

/// The control as `control_auth`, the same listen as `auth`; 401 required.
async fn against_auth(ctx: &Context, check: Check, control_auth: Auth, auth: Auth) -> Outcome {
    let control = first(ctx, listen(plain(), control_auth, false)).await;
    let negative = first(ctx, listen(plain(), auth, false)).await;
    paired(&check, &control, &negative, judge(&negative, &[401], None), Verdict::Warning)
}

async fn no_token(ctx: &Context, check: Check) -> Outcome {
    against_auth(ctx, check, ctx.auth(), Auth::None).await
}

/// The first identity holding `token`, with its own token's auth and the other one's.
fn holding(ctx: &Context, token: fn(&Identity) -> Option<&Token>) -> Option<(Auth, Auth)> {
    ctx.identities
        .iter()
        .find_map(|identity| Some((Auth::Bearer(identity.token.clone()), Auth::Bearer(token(identity)?.clone()))))
}

async fn other_resource(ctx: &Context, check: Check) -> Outcome {
    match holding(ctx, |identity| identity.other_resource_token.as_ref()) {
        Some((control, other)) => against_auth(ctx, check, control, other).await,
        None => not_testable(&check, "no identity carries an `other_resource_token`"),
    }
}

async fn expired(ctx: &Context, check: Check) -> Outcome {
    match holding(ctx, |identity| identity.expired_token.as_ref()) {
        Some((control, expired)) => against_auth(ctx, check, control, expired).await,
        None => not_testable(&check, "no identity carries an `expired_token`"),
    }
}

// ----- resumption and the GET stream ----------------------------------------------------------

/// A listen opened and dropped, then the same listen with `header: value` (a new id): refused,
/// or a fresh stream whose first message is its own acknowledgement and that carries nothing of
/// the first stream.
async fn resume(ctx: &Context, check: Check, header: &str, value: String) -> Outcome {
    let control = first(ctx, listen(plain(), ctx.auth(), false)).await;
    let negative = whole_or_first(ctx, listen(plain(), ctx.auth(), false).header(header, value)).await;
    let judgement = if !any_ack(&negative) && !negative.accepted() {
        judge(&negative, &[], None)
    } else if negative.frames.iter().any(|f| subscription_of(f) == Some(&control.id)) {
        Judgement::Accepted(format!(
            "the new stream carries the earlier stream's id {} ({})",
            control.id,
            summary(&negative)
        ))
    } else if ack(&negative).is_none() {
        Judgement::Accepted(format!(
            "the stream did not start with its own acknowledgement: something was resumed or replayed ({})",
            summary(&negative)
        ))
    } else {
        Judgement::Refused
    };
    let mut outcome = paired(&check, &control, &negative, judgement, Verdict::Warning);
    if outcome.verdict == Verdict::Pass && any_ack(&negative) {
        outcome.detail =
            format!("{header} was ignored: a fresh stream with its own acknowledgement ({})", summary(&negative));
    }
    outcome
}

/// A listen read until two messages (its acknowledgement and one more: anything replayed).
async fn whole_or_first(ctx: &Context, probe: Probe) -> Exchange {
    ctx.target.send_stream(probe, Duration::from_millis(600), 2).await
}

async fn session_id(ctx: &Context, check: Check) -> Outcome {
    let Some(id) = random_id() else {
        return not_testable(&check, "no session id could be made up (the random source failed)");
    };
    ctx.target.redactor().add(&id, "session-made-up");
    resume(ctx, check, "mcp-session-id", id).await
}

async fn last_event_id(ctx: &Context, check: Check) -> Outcome {
    resume(ctx, check, "last-event-id", "0".into()).await
}

async fn get_stream(ctx: &Context, check: Check) -> Outcome {
    let control = first(ctx, listen(plain(), ctx.auth(), false)).await;
    let get = Probe::request(METHOD, json!({}), ctx.auth())
        .http_method(reqwest::Method::GET)
        .header("accept", "text/event-stream")
        .without("content-type")
        .without("mcp-method");
    let negative = first(ctx, get).await;
    let judgement = match negative.status {
        Some(status) if (200..300).contains(&status) => Judgement::Accepted(format!(
            "GET was served ({}): the 2025-era stream is still open on the 2026-07-28 wire",
            negative.summary()
        )),
        Some(405 | 400) => Judgement::Refused,
        Some(status) if (400..500).contains(&status) => {
            Judgement::RefusedOddly(format!("refused, but with HTTP {status} (405 expected)"))
        }
        _ => Judgement::RefusedOddly(format!("neither served nor refused ({})", negative.summary())),
    };
    paired(&check, &control, &negative, judgement, Verdict::Warning)
}

#[cfg(test)]
mod tests;
