//! What every tasks check shares: the extension id and limits, the probes, the roles of the
//! other identities, creating, settling and disposing of a task, and the refusal judgements.

use std::time::Duration;

use tokio::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value, json};

use crate::check::{Check, Judgement, Outcome, Verdict};
use crate::identity::{Other, OtherCaller};
use crate::modules::Context;
use crate::target::{Auth, Exchange, Probe, meta};

/// The extension's identifier.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// Task ids shorter than this are not added to the redactor (they would garble every
/// transcript, and are no secret anyway: the entropy check reports them).
pub(super) const MIN_REDACTED_ID: usize = 8;

/// The longest a case waits for a task to leave `working` (or to finish), in total.
pub(super) const SETTLE_BUDGET: Duration = Duration::from_millis(2500);

/// How many tools at most are tried to find a task-capable one.
pub(super) const MAX_TOOL_TRIES: usize = 3;

// ---------------------------------------------------------------------------------------------
// Probes

/// The `_meta` of a request, with the tasks extension declared when `extension`.
pub(super) fn task_meta(extension: bool) -> Value {
    let mut meta = meta();
    if extension {
        meta["io.modelcontextprotocol/clientCapabilities"] = json!({ "extensions": { TASKS_EXTENSION: {} } });
    }
    meta
}

/// A request of `method` with `params`, declaring the extension when `extension`.
pub(super) fn probe(method: &str, params: Value, auth: Auth, extension: bool) -> Probe {
    let mut params = params.as_object().cloned().unwrap_or_default();
    params.insert("_meta".into(), task_meta(extension));
    Probe::request(method, Value::Object(params), auth)
}

pub(super) fn get(auth: Auth, id: &str) -> Probe {
    probe("tasks/get", json!({ "taskId": id }), auth, true)
}

pub(super) fn cancel(auth: Auth, id: &str) -> Probe {
    probe("tasks/cancel", json!({ "taskId": id }), auth, true)
}

pub(super) fn update(auth: Auth, id: &str, responses: Value) -> Probe {
    probe("tasks/update", json!({ "taskId": id, "inputResponses": responses }), auth, true)
}

/// 32 random bytes, base64url: a task id no one was issued, added to the redactor.
pub(super) fn made_up(ctx: &Context) -> Option<String> {
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes).ok()?;
    let id = URL_SAFE_NO_PAD.encode(bytes);
    ctx.target.redactor().add(&id, "task-made-up");
    Some(id)
}

pub(super) fn status_of(exchange: &Exchange) -> Option<&str> {
    exchange.result().and_then(|result| result.get("status")).and_then(Value::as_str)
}

pub(super) fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

pub(super) fn not_testable(check: &Check, why: impl Into<String>) -> Outcome {
    Outcome::new(check, Verdict::NotTestable, why)
}

pub(super) const NEEDS_MUTATIONS: &str =
    "needs --allow-mutations: the case creates a task (a tools/call of a task-capable tool)";

// ---------------------------------------------------------------------------------------------
// Redaction

/// Adds a task id to the run's redactor and redacts what was written before it was known.
pub(super) fn redact_id(ctx: &Context, id: &str, name: &str, exchanges: &mut [&mut Exchange]) {
    if id.len() < MIN_REDACTED_ID {
        return;
    }
    ctx.target.redactor().add(id, name);
    for exchange in exchanges.iter_mut() {
        exchange.transcript = ctx.target.redactor().redact(&exchange.transcript);
    }
}

// ---------------------------------------------------------------------------------------------
// Identities

/// Who a cross-identity case calls as.
#[derive(Clone, Copy)]
pub(super) enum Role {
    /// Another subject of the first identity's tenant (and client, when one matches).
    Subject,
    /// An identity of another tenant.
    Tenant,
    /// The first identity's user and tenant through another client.
    Client,
    /// No token at all.
    NoToken,
}

impl Role {
    /// The identity to call as (`Ok(None)`: no token), or why there is none: the one notion of
    /// another caller ([`Other`]).
    pub(super) fn pick(self, ctx: &Context) -> Result<Option<OtherCaller>, &'static str> {
        let kind = match self {
            Self::NoToken => return Ok(None),
            Self::Subject => Other::Subject,
            Self::Tenant => Other::Tenant,
            Self::Client => Other::Client,
        };
        ctx.other(kind).map(Some)
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Subject => "another subject of the same tenant",
            Self::Tenant => "another tenant",
            Self::Client => "another client of the same user",
            Self::NoToken => "no token",
        }
    }
}

pub(super) fn auth_for(ctx: &Context, pick: Option<&OtherCaller>) -> Auth {
    pick.map_or(Auth::None, |found| ctx.auth_of(found.index))
}

// ---------------------------------------------------------------------------------------------
// The read-only control: the target advertises the extension

pub(super) fn advertises(discover: &Exchange) -> bool {
    discover
        .result()
        .and_then(|result| result.pointer("/capabilities/extensions"))
        .and_then(Value::as_object)
        .is_some_and(|extensions| extensions.get(TASKS_EXTENSION).is_some_and(|v| !v.is_null()))
}

/// A read-only case's outcome, its PASS saying what the control was.
pub(super) fn read_only(mut outcome: Outcome, negative: &Exchange) -> Outcome {
    if outcome.verdict == Verdict::Pass {
        outcome.detail =
            format!("refused ({}); the control, server/discover, advertises the extension", negative.summary());
    }
    outcome
}

/// `server/discover` as the first identity; NOT TESTABLE when it is served but does not
/// advertise the extension (the control of a case that creates no task).
pub(super) async fn discover_control(ctx: &Context, check: &Check) -> Result<Exchange, Outcome> {
    let discover = ctx.target.send(Probe::request("server/discover", json!({}), ctx.auth())).await;
    if discover.accepted() && !advertises(&discover) {
        let why = format!("server/discover does not advertise {TASKS_EXTENSION} under capabilities.extensions");
        return Err(not_testable(check, why).with(&[&discover]));
    }
    Ok(discover)
}

// ---------------------------------------------------------------------------------------------
// Tasks the first identity creates

/// A task the first identity created, and what is known of it.
pub(super) struct Task {
    pub(super) id: String,
    /// The `tools/call` that created it (and what it was called with).
    pub(super) created: Exchange,
    pub(super) call: Probe,
    /// The owner's `tasks/get` right after the creation.
    pub(super) first_get: Exchange,
    /// The owner's latest `tasks/get`.
    pub(super) last: Exchange,
}

impl Task {
    pub(super) fn status(&self) -> Option<&str> {
        status_of(&self.last)
    }

    pub(super) fn input_requests(&self) -> Option<&Map<String, Value>> {
        self.last.result().and_then(|result| result.get("inputRequests")).and_then(Value::as_object)
    }
}

/// Why a case could not get the task it needs.
pub(super) enum Blocked {
    NotTestable(String),
    Inconclusive(String, Vec<Exchange>),
}

impl Blocked {
    pub(super) fn outcome(self, check: &Check) -> Outcome {
        match self {
            Self::NotTestable(why) => not_testable(check, why),
            Self::Inconclusive(why, exchanges) => {
                Outcome::new(check, Verdict::Inconclusive, why).with(&exchanges.iter().collect::<Vec<_>>())
            }
        }
    }
}

/// The tools worth trying for a task: those whose text mentions a task first, then read-only
/// ones; only tools the one rule lets a check call, and none with required arguments (they are
/// called with none).
pub(super) fn candidates(ctx: &Context, list: &Exchange) -> Vec<String> {
    let tools = list.result().and_then(|r| r.get("tools")).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut ranked: Vec<(u8, String)> = ctx
        .callable_tools(&tools)
        .into_iter()
        .filter_map(|(callable, tool)| {
            let name = callable.name();
            let hint = |key: &str| tool.pointer(&format!("/annotations/{key}")) == Some(&json!(true));
            let required = tool
                .pointer("/inputSchema/required")
                .and_then(Value::as_array)
                .is_some_and(|required| !required.is_empty());
            if required {
                return None;
            }
            let text = ["description", "title"]
                .iter()
                .filter_map(|key| tool.get(*key).and_then(Value::as_str))
                .collect::<String>()
                .to_ascii_lowercase();
            let rank = match (text.contains("task"), hint("readOnlyHint")) {
                (true, true) => 0,
                (true, false) => 1,
                (false, true) => 2,
                (false, false) => return None,
            };
            Some((rank, name.to_owned()))
        })
        .collect();
    ranked.sort();
    ranked.into_iter().map(|(_, name)| name).take(MAX_TOOL_TRIES).collect()
}

/// The task a `tools/call` answer created: a result with `resultType: "task"` and a taskId.
pub(super) fn created_id(exchange: &Exchange) -> Option<String> {
    let result = exchange.result()?;
    if result.get("resultType").and_then(Value::as_str) != Some("task") {
        return None;
    }
    result.get("taskId").and_then(Value::as_str).map(str::to_owned)
}

/// Creates a task as the first identity (after the mutation gate) and waits, bounded, until it
/// has left `working`.
pub(super) async fn create_task(ctx: &Context) -> Result<Task, Blocked> {
    if !ctx.allow_mutations {
        return Err(Blocked::NotTestable(NEEDS_MUTATIONS.into()));
    }
    let list = ctx.target.send(Probe::request("tools/list", json!({}), ctx.auth())).await;
    if !list.accepted() {
        return Err(Blocked::Inconclusive(format!("tools/list was not served ({})", list.summary()), vec![list]));
    }
    let tried = candidates(ctx, &list);
    for name in &tried {
        let call = probe("tools/call", json!({ "name": name, "arguments": {} }), ctx.auth(), true);
        let mut created = ctx.target.send(call.clone()).await;
        let Some(id) = created_id(&created) else { continue };
        let owner = ctx.identities.first().map_or("owner", |identity| identity.name.as_str());
        redact_id(ctx, &id, &format!("task-{owner}"), &mut [&mut created]);
        let first_get = ctx.target.send(get(ctx.auth(), &id)).await;
        let mut task = Task { id, created, call, last: first_get.clone(), first_get };
        settle(ctx, &mut task, |task| task.status().is_some_and(|status| status != "working"), deadline()).await;
        return Ok(task);
    }
    Err(Blocked::NotTestable(format!(
        "no tool answered a tools/call (declaring {TASKS_EXTENSION}) with a task; tried: {}",
        if tried.is_empty() { "none (no candidate tool)".to_owned() } else { tried.join(", ") }
    )))
}

/// Polls the owner's `tasks/get` until `done(task)` or the deadline; `task.last` is the latest.
pub(super) async fn settle(ctx: &Context, task: &mut Task, done: impl Fn(&Task) -> bool, deadline: Instant) {
    let mut pause = Duration::from_millis(25);
    while !done(task) && Instant::now() + pause < deadline {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
        task.last = ctx.target.send(get(ctx.auth(), &task.id)).await;
    }
}

/// When a case stops waiting for a task: [`SETTLE_BUDGET`] from now.
pub(super) fn deadline() -> Instant {
    Instant::now() + SETTLE_BUDGET
}

pub(super) fn finished(task: &Task) -> bool {
    task.status().is_some_and(is_terminal)
}

/// An answer to each of `requests`: an elicitation accepted with its schema's properties
/// filled in (`true`, the first enum value, `1`, a string), a sampling request and a roots
/// request answered minimally.
pub(super) fn answers(requests: &Map<String, Value>) -> Value {
    let mut responses = Map::new();
    for (key, request) in requests {
        let method = request.get("method").and_then(Value::as_str).unwrap_or_default();
        let response = match method {
            "sampling/createMessage" => json!({
                "role": "assistant",
                "content": { "type": "text", "text": "ok" },
                "model": "palisade-verify"
            }),
            "roots/list" => json!({ "roots": [] }),
            _ => {
                let properties = request
                    .pointer("/params/requestedSchema/properties")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                let content: Map<String, Value> =
                    properties.iter().map(|(name, schema)| (name.clone(), sample(schema))).collect();
                json!({ "action": "accept", "content": content })
            }
        };
        responses.insert(key.clone(), response);
    }
    Value::Object(responses)
}

/// A value a primitive schema accepts.
pub(super) fn sample(schema: &Value) -> Value {
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|values| values.first()) {
        return first.clone();
    }
    if let Some(first) = schema.pointer("/oneOf/0/const") {
        return first.clone();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("boolean") => json!(true),
        Some("integer" | "number") => json!(schema.get("minimum").cloned().unwrap_or(json!(1))),
        Some("array") => json!([]),
        _ => json!("palisade-verify"),
    }
}

/// Declines each of `requests` that is an elicitation (the client says no: a tool finishes
/// without doing its work, whatever state other callers left); answers the others.
pub(super) fn declines(requests: &Map<String, Value>) -> Value {
    let Value::Object(mut responses) = answers(requests) else { return json!({}) };
    for (key, request) in requests {
        if request.get("method").and_then(Value::as_str) == Some("elicitation/create") {
            responses.insert(key.clone(), json!({ "action": "decline" }));
        }
    }
    Value::Object(responses)
}

/// Lets the task finish on its own, as its owner: declines what it asks (a declined export ends
/// at once, however much there would be to export) and waits, bounded in total, for a
/// terminal state. Returns the owner's answers.
pub(super) async fn finish(ctx: &Context, task: &mut Task) -> Vec<Exchange> {
    let deadline = deadline();
    let mut answered = Vec::new();
    for _ in 0..3 {
        let Some(requests) = task.input_requests().filter(|_| task.status() == Some("input_required")).cloned() else {
            break;
        };
        answered.push(ctx.target.send(update(ctx.auth(), &task.id, declines(&requests))).await);
        // Done when finished, or when it asks for something else.
        let asked_again = move |task: &Task| {
            finished(task)
                || (task.status() == Some("input_required")
                    && task.input_requests().is_some_and(|now| !now.keys().eq(requests.keys())))
        };
        settle(ctx, task, asked_again, deadline).await;
    }
    settle(ctx, task, finished, deadline).await;
    answered
}

/// The owner cancels a task it created when the case is done (unless it is finished).
pub(super) async fn dispose(ctx: &Context, task: &Task) {
    if !task.status().is_some_and(is_terminal) {
        ctx.target.send(cancel(ctx.auth(), &task.id)).await;
    }
}

/// The outcome of `paired` with the creating call written first.
pub(super) fn with_creation(mut outcome: Outcome, task: &Task) -> Outcome {
    outcome.transcript.insert(0, task.created.transcript.clone());
    outcome
}

// ---------------------------------------------------------------------------------------------
// Judgements

/// The error of an answer as text (what a refusal reveals).
pub(super) fn error_text(exchange: &Exchange) -> String {
    exchange.error().map(Value::to_string).unwrap_or_default()
}

/// A refusal of an invalid request: a JSON-RPC error, never a result, never a 5xx.
pub(super) fn judge_invalid(negative: &Exchange, expected_code: Option<i64>) -> (Judgement, Verdict) {
    if negative.accepted() {
        return (
            Judgement::Accepted(format!("served ({}): the invalid taskId was accepted", negative.summary())),
            Verdict::Fail,
        );
    }
    match (negative.status, negative.error_code()) {
        (None, _) => (Judgement::RefusedOddly(format!("no answer ({})", negative.summary())), Verdict::Inconclusive),
        (Some(status), _) if status >= 500 => {
            (Judgement::RefusedOddly(format!("a server error ({}), not a refusal", negative.summary())), Verdict::Fail)
        }
        (Some(_), None) => (
            Judgement::RefusedOddly(format!("refused without a JSON-RPC error ({})", negative.summary())),
            Verdict::Warning,
        ),
        (Some(_), Some(code)) if expected_code.is_some_and(|expected| expected != code) => (
            Judgement::RefusedOddly(format!(
                "refused, but with {} ({} expected)",
                negative.summary(),
                expected_code.unwrap_or_default()
            )),
            Verdict::Warning,
        ),
        _ => (Judgement::Refused, Verdict::Warning),
    }
}

/// A refusal with one required code (and HTTP status): accepted is a FAIL, another code `odd`.
pub(super) fn judge_code(negative: &Exchange, code: i64, status: u16, odd: Verdict) -> (Judgement, Verdict) {
    if negative.accepted() {
        return (Judgement::Accepted(format!("served ({})", negative.summary())), Verdict::Fail);
    }
    match (negative.status, negative.error_code()) {
        (None, _) => (Judgement::RefusedOddly(format!("no answer ({})", negative.summary())), Verdict::Inconclusive),
        (Some(got), Some(got_code)) if got_code == code && got == status => (Judgement::Refused, odd),
        (Some(_), Some(got_code)) if got_code == code => (
            Judgement::RefusedOddly(format!(
                "refused with {code}, but {} (HTTP {status} expected)",
                negative.summary()
            )),
            Verdict::Warning,
        ),
        _ => (Judgement::RefusedOddly(format!("refused, but with {} ({code} expected)", negative.summary())), odd),
    }
}

/// The refusal a cross-identity case expects: 401 without a token, -32602 otherwise.
pub(super) fn refusal_shape(negative: &Exchange, role: Role) -> (Judgement, Verdict) {
    match (role, negative.status, negative.error_code()) {
        (_, None, _) => (Judgement::RefusedOddly(format!("no answer ({})", negative.summary())), Verdict::Inconclusive),
        (Role::NoToken, Some(401), _) => (Judgement::Refused, Verdict::Warning),
        (Role::NoToken, Some(_), _) => (
            Judgement::RefusedOddly(format!("refused, but with {} (401 expected)", negative.summary())),
            Verdict::Warning,
        ),
        (_, Some(_), Some(-32602)) => (Judgement::Refused, Verdict::Warning),
        (_, Some(status), _) if status >= 500 => (
            Judgement::RefusedOddly(format!("a server error ({}), not a refusal", negative.summary())),
            Verdict::Warning,
        ),
        _ => (
            Judgement::RefusedOddly(format!(
                "refused, but with {} (-32602, as for an unknown id, expected)",
                negative.summary()
            )),
            Verdict::Warning,
        ),
    }
}

/// What a refusal's error reveals of the task (its status word, its input requests, its result).
pub(super) fn reveals(negative: &Exchange, status: Option<&str>) -> bool {
    let text = error_text(negative);
    ["inputRequests", "statusMessage", "structuredContent", "\"result\""].iter().any(|key| text.contains(key))
        || status.is_some_and(|status| text.contains(&format!("\"{status}\"")) || text.contains(&format!(" {status}")))
}

/// The task's observable state in an owner's `tasks/get`: status, result, error.
pub(super) fn state(exchange: &Exchange) -> Option<(Value, Value, Value)> {
    let result = exchange.result()?;
    let field = |key: &str| result.get(key).cloned().unwrap_or(Value::Null);
    Some((field("status"), field("result"), field("error")))
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Get,
    Update,
    Cancel,
}

impl Op {
    pub(super) fn probe(self, auth: Auth, task: &Task, id: &str) -> Probe {
        match self {
            Self::Get => get(auth, id),
            Self::Cancel => cancel(auth, id),
            Self::Update => {
                let responses = task.input_requests().map(answers).unwrap_or_else(|| json!({ "confirm": {} }));
                update(auth, id, responses)
            }
        }
    }
}
