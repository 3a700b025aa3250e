//! The tasks module (seed 002; the `io.modelcontextprotocol/tasks` extension, protocol.md §13):
//! negotiation (`-32021` without the extension, no task returned to a client that did not ask),
//! invalid task ids, another identity's `tasks/get | update | cancel` (another subject of the
//! same tenant, another tenant, another client of the same user, no token), the existence
//! oracle (a foreign task must be refused exactly like an unknown one), `Mcp-Name` ≠ `taskId`,
//! the removed `tasks/list` and `tasks/result`, terminal immutability, duplicate and unknown
//! `inputResponses` keys, the shape of a `CreateTaskResult` and the entropy of task ids.
//!
//! Cases that need no task (negotiation, invalid ids, removed methods) are read-only: their
//! positive control is the target's `server/discover` advertising the extension. Every case that
//! needs a task creates its own as the first identity (a `tools/call` of a task-capable tool,
//! found from `tools/list`), which is a side effect: without `--allow-mutations` those cases
//! are NOT TESTABLE and nothing is called. Their control is the owner's own `tasks/get`; the
//! owner cancels what it created when the case is done. Task ids are handles: each one issued
//! (and each one made up) is added to the run's redactor before any transcript is kept.

use std::time::Duration;

use tokio::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value, json};

use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::identity::{Other, OtherCaller};
use crate::modules::{Context, Module, cases, estimated_bits};
use crate::target::{Auth, Exchange, Probe, meta};

/// The extension's identifier.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// Task ids shorter than this are not added to the redactor (they would garble every
/// transcript, and are no secret anyway: the entropy check reports them).
const MIN_REDACTED_ID: usize = 8;

/// The longest a case waits for a task to leave `working` (or to finish), in total.
const SETTLE_BUDGET: Duration = Duration::from_millis(2500);

/// How many tools at most are tried to find a task-capable one.
const MAX_TOOL_TRIES: usize = 3;

/// The tasks module.
pub fn module() -> Module {
    Module {
        name: "tasks",
        exclusive: false,
        cases: cases! {
            advertised: "tasks.negotiation.advertised", "The extension is advertised under capabilities.extensions and tasks/get is served",
                "protocol.md §13 Negotiation: the server advertises io.modelcontextprotocol/tasks; a v1 capabilities.tasks is forbidden", Low;
            negotiation_get: "tasks.negotiation.get", "tasks/get without the extension declared is refused with -32021",
                "protocol.md §13 Errors: any tasks/* call without the capability gets -32021; seed 002 Verify safely", Medium;
            negotiation_update: "tasks.negotiation.update", "tasks/update without the extension declared is refused with -32021",
                "protocol.md §13 Errors: any tasks/* call without the capability gets -32021; seed 002 Verify safely", Medium;
            negotiation_cancel: "tasks.negotiation.cancel", "tasks/cancel without the extension declared is refused with -32021",
                "protocol.md §13 Errors: any tasks/* call without the capability gets -32021; seed 002 Verify safely", Medium;
            negotiation_tool: "tasks.negotiation.tool_call", "A task-capable tool called without the extension gets no task",
                "protocol.md §13 Creating a task: never return a task to a request without the capability (-32021 instead)", Medium;
            id_empty: "tasks.id.empty", "tasks/get with an empty taskId is refused with a JSON-RPC error, not a 5xx",
                "protocol.md §13 Errors: unknown taskId gets -32602; seed 002 Verify safely (invalid ID)", Medium;
            id_unknown: "tasks.id.unknown", "tasks/get of a random well-formed taskId is refused with -32602",
                "protocol.md §13 Errors: unknown or expired taskId gets -32602 (MUST for get)", Medium;
            id_long: "tasks.id.long", "tasks/get with a 4096-character taskId is refused with a JSON-RPC error, not a 5xx",
                "protocol.md §13 Errors; seed 002 Verify safely (invalid ID)", Medium;
            id_non_string: "tasks.id.non_string", "tasks/get with a numeric taskId is refused with a JSON-RPC error, not a 5xx",
                "ext-tasks schema GetTaskRequest: taskId is a string; seed 002 Verify safely (invalid ID)", Medium;
            id_missing: "tasks.id.missing", "tasks/get without a taskId is refused with a JSON-RPC error, not a 5xx",
                "ext-tasks schema GetTaskRequest: taskId is required; seed 002 Verify safely (invalid ID)", Medium;
            get_other_subject: "tasks.get.other_subject", "Another subject of the same tenant cannot read the task",
                "seed 002 G001: authorize each Task request independently, partitioned by principal", Critical;
            get_other_tenant: "tasks.get.other_tenant", "Another tenant cannot read the task",
                "seed 002 G001: partition durable Tasks by tenant", Critical;
            get_other_client: "tasks.get.other_client", "Another client of the same user cannot read the task",
                "seed 002 G001: partition durable Tasks by client", Critical;
            get_no_token: "tasks.get.no_token", "tasks/get of the task without a token is refused with 401",
                "authorization §Token Requirements; seed 002 G001", Critical;
            update_other_subject: "tasks.update.other_subject", "Another subject of the same tenant cannot answer the task's input requests",
                "seed 002 G001: authorize each Task request independently (update)", Critical;
            update_other_tenant: "tasks.update.other_tenant", "Another tenant cannot answer the task's input requests",
                "seed 002 G001: partition durable Tasks by tenant (update)", Critical;
            update_other_client: "tasks.update.other_client", "Another client of the same user cannot answer the task's input requests",
                "seed 002 G001: partition durable Tasks by client (update)", Critical;
            update_no_token: "tasks.update.no_token", "tasks/update of the task without a token is refused and changes nothing",
                "authorization §Token Requirements; seed 002 G001", Critical;
            cancel_other_subject: "tasks.cancel.other_subject", "Another subject of the same tenant cannot cancel the task",
                "seed 002 G001: authorize each Task request independently (cancel)", Critical;
            cancel_other_tenant: "tasks.cancel.other_tenant", "Another tenant cannot cancel the task",
                "seed 002 G001: partition durable Tasks by tenant (cancel)", Critical;
            cancel_other_client: "tasks.cancel.other_client", "Another client of the same user cannot cancel the task",
                "seed 002 G001: partition durable Tasks by client (cancel)", Critical;
            cancel_no_token: "tasks.cancel.no_token", "tasks/cancel of the task without a token is refused and cancels nothing",
                "authorization §Token Requirements; seed 002 G001", Critical;
            oracle_get: "tasks.oracle.get", "Another identity's task id is refused for tasks/get exactly like an unknown id",
                "protocol.md §13: unknown, expired or foreign taskId are the same -32602; seed 000 (no existence oracle)", High;
            oracle_update: "tasks.oracle.update", "Another identity's task id is refused for tasks/update exactly like an unknown id",
                "protocol.md §13: unknown, expired or foreign taskId are the same -32602; seed 000 (no existence oracle)", High;
            oracle_cancel: "tasks.oracle.cancel", "Another identity's task id is refused for tasks/cancel exactly like an unknown id",
                "protocol.md §13: unknown, expired or foreign taskId are the same -32602; seed 000 (no existence oracle)", High;
            mcp_name_mismatch: "tasks.mcp_name.mismatch", "tasks/get whose Mcp-Name differs from params.taskId is refused with 400 / -32020",
                "protocol.md §6 Headers: Mcp-Name equals params.taskId (tasks extension); a mismatch gets 400 + -32020", Medium;
            mcp_name_missing: "tasks.mcp_name.missing", "tasks/get without an Mcp-Name header is refused with 400 / -32020",
                "protocol.md §6 Validation: a missing header gets 400 + -32020; seed 002 (routing names)", Medium;
            removed_list: "tasks.removed.list", "The removed tasks/list is refused with -32601",
                "protocol.md §13 Errors: tasks/list is removed; conformance expects -32601 (HTTP 404)", Medium;
            removed_result: "tasks.removed.result", "The removed tasks/result is refused with -32601",
                "protocol.md §13 Errors: tasks/result is removed; conformance expects -32601 (HTTP 404)", Medium;
            terminal_cancel_completed: "tasks.terminal.cancel_completed", "tasks/cancel of a completed (or failed) task changes neither its status nor its result",
                "seed 002 G001: keep terminal states immutable; protocol.md §13 tasks/cancel", High;
            terminal_update_completed: "tasks.terminal.update_completed", "tasks/update of a completed (or failed) task changes neither its status nor its result",
                "seed 002 G001: keep terminal states immutable", High;
            terminal_cancel_cancelled: "tasks.terminal.cancel_cancelled", "tasks/cancel of a task its owner cancelled changes nothing",
                "seed 002 G001: keep terminal states immutable", High;
            terminal_update_cancelled: "tasks.terminal.update_cancelled", "tasks/update of a task its owner cancelled does not revive it",
                "seed 002 G001: keep terminal states immutable", High;
            input_duplicate: "tasks.input.duplicate_keys", "inputResponses naming a key twice (two answers) is refused or ignored",
                "seed 002 Verify safely (duplicate updates); wire strict JSON: one document, one meaning", Medium;
            input_unknown: "tasks.input.unknown_keys", "inputResponses with only unknown keys is ignored or refused without changing the task",
                "protocol.md §13 tasks/update: unknown or answered keys are ignored", Medium;
            create_flat: "tasks.create.flat", "A CreateTaskResult is flat (no result, inputRequests, error) and tasks/get resolves at once",
                "ext-tasks schema CreateTaskResult; protocol.md §13: send it only once tasks/get would resolve", Medium;
            create_entropy: "tasks.create.id_entropy", "Task ids are long and unguessable (at least 128 bits estimated)",
                "protocol.md §13: task ids must be unguessable; seed 002 G001 (high-entropy IDs)", High;
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Probes

/// The `_meta` of a request, with the tasks extension declared when `extension`.
fn task_meta(extension: bool) -> Value {
    let mut meta = meta();
    if extension {
        meta["io.modelcontextprotocol/clientCapabilities"] = json!({ "extensions": { TASKS_EXTENSION: {} } });
    }
    meta
}

/// A request of `method` with `params`, declaring the extension when `extension`.
fn probe(method: &str, params: Value, auth: Auth, extension: bool) -> Probe {
    let mut params = params.as_object().cloned().unwrap_or_default();
    params.insert("_meta".into(), task_meta(extension));
    Probe::request(method, Value::Object(params), auth)
}

fn get(auth: Auth, id: &str) -> Probe {
    probe("tasks/get", json!({ "taskId": id }), auth, true)
}

fn cancel(auth: Auth, id: &str) -> Probe {
    probe("tasks/cancel", json!({ "taskId": id }), auth, true)
}

fn update(auth: Auth, id: &str, responses: Value) -> Probe {
    probe("tasks/update", json!({ "taskId": id, "inputResponses": responses }), auth, true)
}

/// 32 random bytes, base64url: a task id no one was issued, added to the redactor.
fn made_up(ctx: &Context) -> Option<String> {
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes).ok()?;
    let id = URL_SAFE_NO_PAD.encode(bytes);
    ctx.target.redactor().add(&id, "task-made-up");
    Some(id)
}

fn status_of(exchange: &Exchange) -> Option<&str> {
    exchange.result().and_then(|result| result.get("status")).and_then(Value::as_str)
}

fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

fn not_testable(check: &Check, why: impl Into<String>) -> Outcome {
    Outcome::new(check, Verdict::NotTestable, why)
}

const NEEDS_MUTATIONS: &str = "needs --allow-mutations: the case creates a task (a tools/call of a task-capable tool)";

// ---------------------------------------------------------------------------------------------
// Redaction

/// Adds a task id to the run's redactor and redacts what was written before it was known.
fn redact_id(ctx: &Context, id: &str, name: &str, exchanges: &mut [&mut Exchange]) {
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
enum Role {
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
    fn pick(self, ctx: &Context) -> Result<Option<OtherCaller>, &'static str> {
        let kind = match self {
            Self::NoToken => return Ok(None),
            Self::Subject => Other::Subject,
            Self::Tenant => Other::Tenant,
            Self::Client => Other::Client,
        };
        ctx.other(kind).map(Some)
    }

    fn label(self) -> &'static str {
        match self {
            Self::Subject => "another subject of the same tenant",
            Self::Tenant => "another tenant",
            Self::Client => "another client of the same user",
            Self::NoToken => "no token",
        }
    }
}

fn auth_for(ctx: &Context, pick: Option<&OtherCaller>) -> Auth {
    pick.map_or(Auth::None, |found| ctx.auth_of(found.index))
}

// ---------------------------------------------------------------------------------------------
// The read-only control: the target advertises the extension

fn advertises(discover: &Exchange) -> bool {
    discover
        .result()
        .and_then(|result| result.pointer("/capabilities/extensions"))
        .and_then(Value::as_object)
        .is_some_and(|extensions| extensions.get(TASKS_EXTENSION).is_some_and(|v| !v.is_null()))
}

/// A read-only case's outcome, its PASS saying what the control was.
fn read_only(mut outcome: Outcome, negative: &Exchange) -> Outcome {
    if outcome.verdict == Verdict::Pass {
        outcome.detail =
            format!("refused ({}); the control, server/discover, advertises the extension", negative.summary());
    }
    outcome
}

/// `server/discover` as the first identity; NOT TESTABLE when it is served but does not
/// advertise the extension (the control of a case that creates no task).
async fn discover_control(ctx: &Context, check: &Check) -> Result<Exchange, Outcome> {
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
struct Task {
    id: String,
    /// The `tools/call` that created it (and what it was called with).
    created: Exchange,
    call: Probe,
    /// The owner's `tasks/get` right after the creation.
    first_get: Exchange,
    /// The owner's latest `tasks/get`.
    last: Exchange,
}

impl Task {
    fn status(&self) -> Option<&str> {
        status_of(&self.last)
    }

    fn input_requests(&self) -> Option<&Map<String, Value>> {
        self.last.result().and_then(|result| result.get("inputRequests")).and_then(Value::as_object)
    }
}

/// Why a case could not get the task it needs.
enum Blocked {
    NotTestable(String),
    Inconclusive(String, Vec<Exchange>),
}

impl Blocked {
    fn outcome(self, check: &Check) -> Outcome {
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
fn candidates(ctx: &Context, list: &Exchange) -> Vec<String> {
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
fn created_id(exchange: &Exchange) -> Option<String> {
    let result = exchange.result()?;
    if result.get("resultType").and_then(Value::as_str) != Some("task") {
        return None;
    }
    result.get("taskId").and_then(Value::as_str).map(str::to_owned)
}

/// Creates a task as the first identity (after the mutation gate) and waits, bounded, until it
/// has left `working`.
async fn create_task(ctx: &Context) -> Result<Task, Blocked> {
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
async fn settle(ctx: &Context, task: &mut Task, done: impl Fn(&Task) -> bool, deadline: Instant) {
    let mut pause = Duration::from_millis(25);
    while !done(task) && Instant::now() + pause < deadline {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
        task.last = ctx.target.send(get(ctx.auth(), &task.id)).await;
    }
}

/// When a case stops waiting for a task: [`SETTLE_BUDGET`] from now.
fn deadline() -> Instant {
    Instant::now() + SETTLE_BUDGET
}

fn finished(task: &Task) -> bool {
    task.status().is_some_and(is_terminal)
}

/// An answer to each of `requests`: an elicitation accepted with its schema's properties
/// filled in (`true`, the first enum value, `1`, a string), a sampling request and a roots
/// request answered minimally.
fn answers(requests: &Map<String, Value>) -> Value {
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
fn sample(schema: &Value) -> Value {
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
fn declines(requests: &Map<String, Value>) -> Value {
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
async fn finish(ctx: &Context, task: &mut Task) -> Vec<Exchange> {
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
async fn dispose(ctx: &Context, task: &Task) {
    if !task.status().is_some_and(is_terminal) {
        ctx.target.send(cancel(ctx.auth(), &task.id)).await;
    }
}

/// The outcome of `paired` with the creating call written first.
fn with_creation(mut outcome: Outcome, task: &Task) -> Outcome {
    outcome.transcript.insert(0, task.created.transcript.clone());
    outcome
}

// ---------------------------------------------------------------------------------------------
// Judgements

/// The error of an answer as text (what a refusal reveals).
fn error_text(exchange: &Exchange) -> String {
    exchange.error().map(Value::to_string).unwrap_or_default()
}

/// A refusal of an invalid request: a JSON-RPC error, never a result, never a 5xx.
fn judge_invalid(negative: &Exchange, expected_code: Option<i64>) -> (Judgement, Verdict) {
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
fn judge_code(negative: &Exchange, code: i64, status: u16, odd: Verdict) -> (Judgement, Verdict) {
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
fn refusal_shape(negative: &Exchange, role: Role) -> (Judgement, Verdict) {
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
fn reveals(negative: &Exchange, status: Option<&str>) -> bool {
    let text = error_text(negative);
    ["inputRequests", "statusMessage", "structuredContent", "\"result\""].iter().any(|key| text.contains(key))
        || status.is_some_and(|status| text.contains(&format!("\"{status}\"")) || text.contains(&format!(" {status}")))
}

/// The task's observable state in an owner's `tasks/get`: status, result, error.
fn state(exchange: &Exchange) -> Option<(Value, Value, Value)> {
    let result = exchange.result()?;
    let field = |key: &str| result.get(key).cloned().unwrap_or(Value::Null);
    Some((field("status"), field("result"), field("error")))
}

// ---------------------------------------------------------------------------------------------
// Negotiation

async fn advertised(ctx: &Context, check: Check) -> Outcome {
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
async fn without_extension(ctx: &Context, check: Check, method: &str) -> Outcome {
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

fn names_extension(exchange: &Exchange) -> bool {
    exchange
        .error()
        .and_then(|error| error.pointer("/data/requiredCapabilities/extensions"))
        .and_then(Value::as_object)
        .is_some_and(|extensions| extensions.contains_key(TASKS_EXTENSION))
}

async fn negotiation_get(ctx: &Context, check: Check) -> Outcome {
    without_extension(ctx, check, "tasks/get").await
}

async fn negotiation_update(ctx: &Context, check: Check) -> Outcome {
    without_extension(ctx, check, "tasks/update").await
}

async fn negotiation_cancel(ctx: &Context, check: Check) -> Outcome {
    without_extension(ctx, check, "tasks/cancel").await
}

async fn negotiation_tool(ctx: &Context, check: Check) -> Outcome {
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

async fn invalid_id(ctx: &Context, check: Check, params: Value, name: Option<String>, code: Option<i64>) -> Outcome {
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

async fn id_empty(ctx: &Context, check: Check) -> Outcome {
    invalid_id(ctx, check, json!({ "taskId": "" }), None, None).await
}

async fn id_unknown(ctx: &Context, check: Check) -> Outcome {
    let Some(id) = made_up(ctx) else { return not_testable(&check, "no task id could be made up") };
    invalid_id(ctx, check, json!({ "taskId": id }), None, Some(-32602)).await
}

async fn id_long(ctx: &Context, check: Check) -> Outcome {
    let Some(seed) = made_up(ctx) else { return not_testable(&check, "no task id could be made up") };
    let long: String = seed.chars().cycle().take(4096).collect();
    ctx.target.redactor().add(&long, "task-long");
    invalid_id(ctx, check, json!({ "taskId": long }), None, None).await
}

async fn id_non_string(ctx: &Context, check: Check) -> Outcome {
    invalid_id(ctx, check, json!({ "taskId": 12345 }), Some("12345".into()), None).await
}

async fn id_missing(ctx: &Context, check: Check) -> Outcome {
    invalid_id(ctx, check, json!({}), None, None).await
}

// ---------------------------------------------------------------------------------------------
// Cross identity

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Get,
    Update,
    Cancel,
}

impl Op {
    fn probe(self, auth: Auth, task: &Task, id: &str) -> Probe {
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

/// Whether the foreign call changed the task, from the owner's view before and after.
fn changed(op: Op, before: Option<&str>, after: &Exchange) -> Option<String> {
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

async fn cross(ctx: &Context, check: Check, op: Op, role: Role) -> Outcome {
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

async fn get_other_subject(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Get, Role::Subject).await
}
async fn get_other_tenant(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Get, Role::Tenant).await
}
async fn get_other_client(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Get, Role::Client).await
}
async fn get_no_token(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Get, Role::NoToken).await
}
async fn update_other_subject(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Update, Role::Subject).await
}
async fn update_other_tenant(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Update, Role::Tenant).await
}
async fn update_other_client(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Update, Role::Client).await
}
async fn update_no_token(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Update, Role::NoToken).await
}
async fn cancel_other_subject(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Cancel, Role::Subject).await
}
async fn cancel_other_tenant(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Cancel, Role::Tenant).await
}
async fn cancel_other_client(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Cancel, Role::Client).await
}
async fn cancel_no_token(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Op::Cancel, Role::NoToken).await
}

// ---------------------------------------------------------------------------------------------
// Existence oracle

/// Another identity's call on the owner's task and on a made-up id must be answered alike.
async fn oracle(ctx: &Context, check: Check, op: Op) -> Outcome {
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

async fn oracle_get(ctx: &Context, check: Check) -> Outcome {
    oracle(ctx, check, Op::Get).await
}
async fn oracle_update(ctx: &Context, check: Check) -> Outcome {
    oracle(ctx, check, Op::Update).await
}
async fn oracle_cancel(ctx: &Context, check: Check) -> Outcome {
    oracle(ctx, check, Op::Cancel).await
}

// ---------------------------------------------------------------------------------------------
// Mcp-Name

async fn mcp_name(ctx: &Context, check: Check, header: Option<String>) -> Outcome {
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

async fn mcp_name_mismatch(ctx: &Context, check: Check) -> Outcome {
    let Some(other) = made_up(ctx) else { return not_testable(&check, "no task id could be made up") };
    mcp_name(ctx, check, Some(other)).await
}

async fn mcp_name_missing(ctx: &Context, check: Check) -> Outcome {
    mcp_name(ctx, check, None).await
}

// ---------------------------------------------------------------------------------------------
// Removed methods (read-only)

async fn removed(ctx: &Context, check: Check, method: &str) -> Outcome {
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

async fn removed_list(ctx: &Context, check: Check) -> Outcome {
    removed(ctx, check, "tasks/list").await
}

async fn removed_result(ctx: &Context, check: Check) -> Outcome {
    removed(ctx, check, "tasks/result").await
}

// ---------------------------------------------------------------------------------------------
// Terminal immutability

/// Brings a new task to a terminal state (on its own, its input requests declined, or by its
/// owner's cancel), sends `op` as its owner, and compares the owner's view before and after.
async fn terminal(ctx: &Context, check: Check, cancelled: bool, op: Op) -> Outcome {
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

async fn terminal_cancel_completed(ctx: &Context, check: Check) -> Outcome {
    terminal(ctx, check, false, Op::Cancel).await
}
async fn terminal_update_completed(ctx: &Context, check: Check) -> Outcome {
    terminal(ctx, check, false, Op::Update).await
}
async fn terminal_cancel_cancelled(ctx: &Context, check: Check) -> Outcome {
    terminal(ctx, check, true, Op::Cancel).await
}
async fn terminal_update_cancelled(ctx: &Context, check: Check) -> Outcome {
    terminal(ctx, check, true, Op::Update).await
}

// ---------------------------------------------------------------------------------------------
// inputResponses

/// The raw body of a `tasks/update` whose `inputResponses` holds `key` twice: first declined,
/// then answered.
fn duplicate_body(id: &Value, task_id: &str, key: &str, answer: &Value) -> Vec<u8> {
    let key = Value::from(key).to_string();
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tasks/update\",\"params\":{{\"taskId\":{},\"inputResponses\":{{{key}:{},{key}:{answer}}},\"_meta\":{}}}}}",
        Value::from(task_id),
        json!({ "action": "decline" }),
        task_meta(true)
    )
    .into_bytes()
}

async fn input_case(ctx: &Context, check: Check, duplicate: bool) -> Outcome {
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

async fn input_duplicate(ctx: &Context, check: Check) -> Outcome {
    input_case(ctx, check, true).await
}

async fn input_unknown(ctx: &Context, check: Check) -> Outcome {
    input_case(ctx, check, false).await
}

// ---------------------------------------------------------------------------------------------
// CreateTaskResult and ids

/// What is wrong with a CreateTaskResult (empty: nothing).
fn create_problems(result: &Value) -> Vec<String> {
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

async fn create_flat(ctx: &Context, check: Check) -> Outcome {
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
fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

async fn create_entropy(ctx: &Context, check: Check) -> Outcome {
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
        (
            Judgement::RefusedOddly(format!(
                "the ids carry at most about {bits:.0} bits ({} characters): at least 128 expected",
                first.id.len()
            )),
            Verdict::Warning,
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
