//! The multi-round state module (2026-07-28 MRTR, seed 002's requestState): a call that answers
//! `resultType: "input_required"` with a `requestState` is found (a resource or a prompt; with
//! `--allow-mutations` also a read-only tool without required arguments, or a tool taking the
//! handle a creating tool returns), and the state is attacked: flipped, changed, truncated,
//! emptied, garbage, its decoded payload rewritten, replayed by another identity or tenant, on
//! other arguments, another tool or another method, and again after its round completed.
//!
//! Every negative case is paired with its positive control: a fresh state of the same call,
//! echoed exactly by its owner with the answers to its input requests, proceeds (a result that
//! is not `input_required`). The negative is sent first, on a state of its own, so a state a
//! target spends on use cannot make the control look refused. States are credentials: each one,
//! real or forged, is added to the run's redactor before any output shows it.
//!
//! The call found for a target is remembered for the process (by URL, identity and mutation
//! permission) so each case does not search again.

use std::sync::LazyLock;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Map, Value, json};

use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::identity::Other;
use crate::modules::{Context, Module, cases};
use crate::target::{Exchange, Probe};

/// The state module.
pub fn module() -> Module {
    Module {
        name: "state",
        exclusive: false,
        cases: cases! {
            echo: "state.round.echo", "The state echoed exactly by its owner, with the answers, proceeds",
                "2026-07-28 MRTR §Client side: retry with inputResponses and the exact requestState", Low;
            flipped: "state.tamper.flipped", "The state with one byte in the middle changed is refused",
                "2026-07-28 MRTR §Server side: requestState MUST be integrity-protected (HMAC/AEAD)", High;
            last_char: "state.tamper.last_char", "The state with its last character changed is refused",
                "2026-07-28 MRTR §Server side: requestState MUST be integrity-protected", High;
            truncated: "state.tamper.truncated", "The state cut short is refused",
                "2026-07-28 MRTR §Server side: treat requestState as attacker-controlled", High;
            empty: "state.tamper.empty", "An empty requestState does not complete the round",
                "2026-07-28 MRTR §Server side: treat requestState as attacker-controlled", Medium;
            garbage: "state.tamper.garbage", "A requestState of random base64 is refused",
                "2026-07-28 MRTR §Server side: treat requestState as attacker-controlled", High;
            payload: "state.tamper.payload", "The state with its decoded payload rewritten is refused",
                "2026-07-28 MRTR §Server side: requestState MUST be integrity-protected if it affects logic", Critical;
            other_identity: "state.replay.other_identity", "Another identity replaying the owner's state is refused",
                "2026-07-28 MRTR §Server side: requestState SHOULD be bound to the principal; seed 002", Critical;
            other_tenant: "state.replay.other_tenant", "An identity of another tenant replaying the owner's state is refused",
                "2026-07-28 MRTR §Server side: bound to the principal; seed 004 (tenant boundaries)", Critical;
            oracle: "state.replay.existence_oracle", "Another identity's state is refused like garbage (no oracle of its validity)",
                "seed 000: a refusal must not reveal whether a foreign object exists", Medium;
            other_arguments: "state.replay.other_arguments", "The state replayed on the same call with other arguments is refused",
                "2026-07-28 MRTR §Server side: SHOULD be bound to the method plus a params digest", High;
            other_tool: "state.replay.other_tool", "The state presented to another tool is not taken",
                "2026-07-28 MRTR §Server side: SHOULD be bound to the method plus a params digest", Low;
            other_method: "state.replay.other_method", "The state presented to another method (a read or a prompt) is not taken",
                "2026-07-28 MRTR §Server side: SHOULD be bound to the method plus a params digest", Low;
            after_use: "state.replay.after_use", "The state replayed after its round completed is not taken again",
                "2026-07-28 MRTR §Server side: treat requestState as attacker-controlled (a confirmation authorizes one call)", Medium;
            expired: "state.expired", "An expired requestState is refused",
                "2026-07-28 MRTR §Server side: requestState SHOULD be bound to an expiry", Medium;
        },
    }
}

// ----- finding a round ----------------------------------------------------------------------

/// How to reach a call that answers `input_required` with a `requestState`.
#[derive(Debug, Clone)]
enum Recipe {
    /// This method and these params (besides `_meta`), as they are.
    Fixed { method: String, params: Value },
    /// `tools/call` of `creator` (no arguments) returns a handle in `field` of its structured
    /// result; `tools/call` of `tool` with `{field: handle}` asks for input. `shared`: the params
    /// of the call found (the first identity's handle), which every case uses while it still
    /// asks (so a run does not create an object per case).
    Chain { creator: String, field: String, tool: String, shared: Value },
}

/// What was found for a target: (URL, first identity, mutations allowed) → recipe or why none.
type Found = Vec<((String, String, bool), Result<Recipe, String>)>;

static FOUND: LazyLock<tokio::sync::Mutex<Found>> = LazyLock::new(|| tokio::sync::Mutex::new(Vec::new()));

/// Declares form elicitation (the input the cases answer).
fn request(ctx: &Context, who: usize, method: &str, params: Value) -> Probe {
    let mut probe = Probe::request(method, params, ctx.auth_of(who));
    if let Some(meta) = probe.params.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.insert("io.modelcontextprotocol/clientCapabilities".into(), json!({ "elicitation": {} }));
    }
    probe
}

/// The state an answer asks to be echoed, when it is an `input_required` result.
fn state_of(exchange: &Exchange) -> Option<&str> {
    let result = exchange.result()?;
    if result.get("resultType").and_then(Value::as_str) != Some("input_required") {
        return None;
    }
    result.get("requestState").and_then(Value::as_str).filter(|state| !state.is_empty())
}

/// The recipe for this run's target, found once per process.
async fn recipe(ctx: &Context) -> Result<Recipe, String> {
    let key = (
        ctx.target.url().to_string(),
        ctx.identities.first().map(|identity| identity.name.clone()).unwrap_or_default(),
        ctx.allow_mutations,
    );
    let mut found = FOUND.lock().await;
    if let Some((_, recipe)) = found.iter().find(|(k, _)| *k == key) {
        return recipe.clone();
    }
    let recipe = discover(ctx).await;
    found.push((key, recipe.clone()));
    recipe
}

fn listed<'a>(exchange: &'a Exchange, key: &str) -> Vec<&'a Value> {
    exchange
        .result()
        .and_then(|r| r.get(key))
        .and_then(Value::as_array)
        .map(|items| items.iter().collect())
        .unwrap_or_default()
}

fn required(schema: Option<&Value>) -> Vec<&str> {
    schema
        .and_then(|s| s.get("required"))
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether a tool's name says it creates something (the only side-effecting tools called
/// without arguments).
fn creates(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["create", "new", "open", "start"].iter().any(|verb| name.contains(verb))
}

/// Searches the target as the first identity: resources, prompts without required arguments,
/// then (with `--allow-mutations`) read-only tools without required arguments, then tools that
/// take exactly the handle a creating tool returns.
async fn discover(ctx: &Context) -> Result<Recipe, String> {
    let asks = |exchange: &Exchange| state_of(exchange).is_some();
    let resources = ctx.target.send(request(ctx, 0, "resources/list", json!({}))).await;
    for uri in listed(&resources, "resources").iter().filter_map(|r| r.get("uri")?.as_str()).take(3) {
        let params = json!({ "uri": uri });
        if asks(&ctx.target.send(request(ctx, 0, "resources/read", params.clone())).await) {
            return Ok(Recipe::Fixed { method: "resources/read".into(), params });
        }
    }
    let prompts = ctx.target.send(request(ctx, 0, "prompts/list", json!({}))).await;
    let free = |p: &&Value| {
        p.get("arguments")
            .and_then(Value::as_array)
            .is_none_or(|a| !a.iter().any(|a| a.get("required") == Some(&json!(true))))
    };
    for name in listed(&prompts, "prompts").into_iter().filter(free).filter_map(|p| p.get("name")?.as_str()).take(3) {
        let params = json!({ "name": name });
        if asks(&ctx.target.send(request(ctx, 0, "prompts/get", params.clone())).await) {
            return Ok(Recipe::Fixed { method: "prompts/get".into(), params });
        }
    }
    if !ctx.allow_mutations {
        return Err(
            "no resource or prompt asks for input with a requestState; tool calls need --allow-mutations".into()
        );
    }
    let listing = ctx.target.send(request(ctx, 0, "tools/list", json!({}))).await;
    let every: Vec<Value> = listed(&listing, "tools").into_iter().cloned().collect();
    // Only the tools the one rule lets a check call.
    let tools = ctx.callable_tools(&every);
    let no_required = |tool: &Value| required(tool.get("inputSchema")).is_empty();
    for (tool, _) in tools.iter().filter(|(tool, listing)| tool.read_only() && no_required(listing)).take(5) {
        let params = json!({ "name": tool.name(), "arguments": {} });
        if asks(&ctx.target.send(request(ctx, 0, "tools/call", params.clone())).await) {
            return Ok(Recipe::Fixed { method: "tools/call".into(), params });
        }
    }
    let creators = tools
        .iter()
        .filter(|(tool, listing)| no_required(listing) && creates(tool.name()))
        .map(|(tool, _)| tool.name().to_owned())
        .take(3);
    for creator in creators {
        let made = ctx.target.send(request(ctx, 0, "tools/call", json!({ "name": creator, "arguments": {} }))).await;
        let structured = made.result().and_then(|r| r.get("structuredContent")).and_then(Value::as_object);
        for (field, handle) in structured.into_iter().flatten() {
            let Some(handle) = handle.as_str() else { continue };
            ctx.target.redactor().add(handle, "handle");
            let users = tools
                .iter()
                .filter(|(_, listing)| required(listing.get("inputSchema")) == [field.as_str()])
                .map(|(tool, _)| tool.name());
            for tool in users.take(4) {
                let params = json!({ "name": tool, "arguments": { field.as_str(): handle } });
                if asks(&ctx.target.send(request(ctx, 0, "tools/call", params.clone())).await) {
                    return Ok(Recipe::Chain { creator, field: field.clone(), tool: tool.to_owned(), shared: params });
                }
            }
        }
    }
    Err("no resource, prompt or tool found answers input_required with a requestState".into())
}

// ----- one round ------------------------------------------------------------------------------

/// The params of one call, made for identity `owner` (a chain's handle created for it).
struct Call {
    method: String,
    params: Value,
    made: Vec<Exchange>,
}

/// Makes the recipe's call for `owner`.
async fn call(ctx: &Context, recipe: &Recipe, owner: usize) -> Result<Call, String> {
    match recipe {
        Recipe::Fixed { method, params } => {
            Ok(Call { method: method.clone(), params: params.clone(), made: Vec::new() })
        }
        Recipe::Chain { creator, field, tool, .. } => {
            let made =
                ctx.target.send(request(ctx, owner, "tools/call", json!({ "name": creator, "arguments": {} }))).await;
            let handle = made
                .result()
                .and_then(|r| r.pointer(&format!("/structuredContent/{field}")))
                .and_then(Value::as_str)
                .map(str::to_owned);
            let Some(handle) = handle else {
                return Err(format!("{creator} returned no {field} this time ({})", made.summary()));
            };
            let who = ctx.identities.get(owner).map_or("owner", |identity| identity.name.as_str());
            ctx.target.redactor().add(&handle, &format!("handle-{who}"));
            let mut made = vec![made];
            redact(ctx, &mut made);
            let params = json!({ "name": tool, "arguments": { field.as_str(): handle } });
            Ok(Call { method: "tools/call".into(), params, made })
        }
    }
}

/// A state of the call, asked for as `owner`, and the answers to its input requests.
struct Asked {
    state: String,
    responses: Value,
}

/// Asks the call once as `owner`: its state (redacted from here on) and the answers.
async fn ask(ctx: &Context, call: &Call, owner: usize, log: &mut Vec<Exchange>) -> Option<Asked> {
    let answer = ctx.target.send(request(ctx, owner, &call.method, call.params.clone())).await;
    log.push(answer);
    let answer = log.last()?.clone();
    let asked = state_of(&answer).map(|state| {
        let who = ctx.identities.get(owner).map_or("owner", |identity| identity.name.as_str());
        ctx.target.redactor().add(state, &format!("request-state-{who}"));
        redact(ctx, log);
        let requests = answer.result().and_then(|r| r.get("inputRequests")).and_then(Value::as_object);
        let responses: Map<String, Value> =
            requests.into_iter().flatten().filter_map(|(key, r)| answer_to(r).map(|a| (key.clone(), a))).collect();
        Asked { state: state.to_owned(), responses: Value::Object(responses) }
    });
    redact(ctx, log);
    asked
}

/// The answer to one input request: an accepted elicitation (a value per property), no roots.
fn answer_to(request: &Value) -> Option<Value> {
    match request.get("method").and_then(Value::as_str)? {
        "elicitation/create" => {
            let mut content = Map::new();
            let properties = request.pointer("/params/requestedSchema/properties").and_then(Value::as_object);
            for (name, property) in properties.into_iter().flatten() {
                let value = match property.get("type").and_then(Value::as_str) {
                    Some("boolean") => json!(true),
                    Some("integer" | "number") => property.get("minimum").cloned().unwrap_or(json!(1)),
                    _ => property.get("enum").and_then(|e| e.get(0)).cloned().unwrap_or(json!("yes")),
                };
                content.insert(name.clone(), value);
            }
            Some(json!({ "action": "accept", "content": content }))
        }
        "roots/list" => Some(json!({ "roots": [] })),
        _ => None,
    }
}

/// The retry of `method` with `params` as `who`, presenting `state` and `responses`.
fn retry(ctx: &Context, who: usize, method: &str, params: &Value, state: &str, responses: &Value) -> Probe {
    let mut params = params.as_object().cloned().unwrap_or_default();
    params.insert("requestState".into(), json!(state));
    params.insert("inputResponses".into(), responses.clone());
    request(ctx, who, method, Value::Object(params))
}

/// Redacts transcripts written before the secrets now registered were known.
pub(crate) fn redact(ctx: &Context, exchanges: &mut [Exchange]) {
    for exchange in exchanges {
        exchange.transcript = ctx.target.redactor().redact(&exchange.transcript);
    }
}

/// Sends a retry; a state its answer carries (a server asking again) is redacted like the others.
async fn send(ctx: &Context, probe: Probe) -> Exchange {
    let mut answer = ctx.target.send(probe).await;
    if let Some(state) = state_of(&answer).map(str::to_owned) {
        ctx.target.redactor().add(&state, "request-state-issued");
        redact(ctx, std::slice::from_mut(&mut answer));
    }
    answer
}

/// Whether the call went past its input: a result that is not `input_required`.
fn proceeded(exchange: &Exchange) -> bool {
    exchange.result().is_some_and(|r| r.get("resultType").and_then(Value::as_str) != Some("input_required"))
}

fn is_error(exchange: &Exchange) -> bool {
    exchange.result().and_then(|r| r.get("isError")) == Some(&json!(true))
}

/// A negative answer next to the control's: it must not proceed like the control did. A tool
/// error where the control succeeded is a refusal, though not the JSON-RPC one (`odd`).
fn judge(negative: &Exchange, control: &Exchange) -> Judgement {
    if proceeded(negative) {
        if is_error(negative) && !is_error(control) {
            return Judgement::RefusedOddly(format!(
                "refused as a tool error result ({}), not as a JSON-RPC error",
                negative.summary()
            ));
        }
        return Judgement::Accepted(format!("the call proceeded with the altered state ({})", negative.summary()));
    }
    match negative.status {
        None => Judgement::RefusedOddly(format!("no answer ({})", negative.summary())),
        Some(_) if negative.result().is_some() => Judgement::Refused, // asked again
        Some(_) if negative.error().is_some() || negative.client_error() => Judgement::Refused,
        Some(_) => Judgement::RefusedOddly(format!("neither proceeded nor refused ({})", negative.summary())),
    }
}

/// `check::paired`, with the control required to have proceeded (not merely answered).
fn judged(check: &Check, control: &Exchange, negative: &Exchange, judgement: Judgement, odd: Verdict) -> Outcome {
    if !proceeded(control) {
        let detail = format!("positive control did not proceed ({}): nothing to compare with", control.summary());
        return Outcome::new(check, Verdict::Inconclusive, detail).with(&[control, negative]);
    }
    paired(check, control, negative, judgement, odd)
}

fn not_testable(check: &Check, why: impl Into<String>) -> Outcome {
    Outcome::new(check, Verdict::NotTestable, why)
}

/// The outcome with `before` written first in its transcript.
fn after(mut outcome: Outcome, before: &[Exchange]) -> Outcome {
    outcome.transcript.splice(0..0, before.iter().map(|exchange| exchange.transcript.clone()));
    outcome
}

/// What a negative presents, made from the owner's call and a state of it.
struct Negative {
    who: usize,
    method: String,
    params: Value,
    state: String,
}

/// How a case builds its negative; `Err`: why it cannot (NOT TESTABLE).
type Build<'a> = Box<dyn FnOnce(&Call, &Asked) -> Result<Negative, String> + Send + 'a>;

/// A case's start: the owner's call (the shared one while it asks, else a fresh one) and a
/// first state of it, with what was sent to get them.
struct Started {
    call: Call,
    first: Asked,
    log: Vec<Exchange>,
}

/// Starts a case; `Err`: its outcome already (NOT TESTABLE, or INCONCLUSIVE when the call no
/// longer asks). `log` holds what was sent before (written first).
async fn begin(ctx: &Context, check: &Check, mut log: Vec<Exchange>) -> Result<Started, Outcome> {
    let recipe = recipe(ctx).await.map_err(|why| not_testable(check, why))?;
    if let Recipe::Chain { shared, .. } = &recipe {
        let call = Call { method: "tools/call".into(), params: shared.clone(), made: Vec::new() };
        if let Some(first) = ask(ctx, &call, 0, &mut log).await {
            return Ok(Started { call, first, log });
        }
    }
    let call = call(ctx, &recipe, 0).await.map_err(|why| after(not_testable(check, why), &log))?;
    log.extend(call.made.iter().cloned());
    let Some(first) = ask(ctx, &call, 0, &mut log).await else {
        let why = "the call did not ask for input with a requestState this time";
        return Err(after(Outcome::new(check, Verdict::Inconclusive, why), &log));
    };
    Ok(Started { call, first, log })
}

/// The common case: the owner's call (a state for the negative, another for the control), the
/// negative first, then the control; `extra` exchanges of the negative's own setup come before.
/// `lenient`: the negative being taken is a WARNING, not a FAIL (a SHOULD of the spec).
async fn against(ctx: &Context, check: Check, build: Build<'_>, extra: Vec<Exchange>, lenient: bool) -> Outcome {
    let Started { call, first, mut log } = match begin(ctx, &check, extra).await {
        Ok(started) => started,
        Err(outcome) => return outcome,
    };
    let negative = match build(&call, &first) {
        Ok(negative) => negative,
        Err(why) => return after(not_testable(&check, why), &log),
    };
    let name = ctx.identities.first().map_or("state", |identity| identity.name.as_str());
    if negative.state.len() >= 8 {
        ctx.target.redactor().add(&negative.state, &format!("request-state-{name}-forged"));
    }
    let probe = retry(ctx, negative.who, &negative.method, &negative.params, &negative.state, &first.responses);
    let sent = send(ctx, probe).await;
    let Some(second) = ask(ctx, &call, 0, &mut log).await else {
        let why = "the call did not ask for input with a requestState a second time";
        return after(Outcome::new(&check, Verdict::Inconclusive, why).with(&[&sent]), &log);
    };
    let control = send(ctx, retry(ctx, 0, &call.method, &call.params, &second.state, &second.responses)).await;
    let judgement = match judge(&sent, &control) {
        Judgement::Accepted(why) if lenient => {
            Judgement::RefusedOddly(format!("{why}: the state is not bound to the call"))
        }
        other => other,
    };
    after(judged(&check, &control, &sent, judgement, Verdict::Warning), &log)
}

/// The negative: the owner's own call with the state changed by `change`.
fn tampered(change: fn(&str) -> Option<String>) -> Build<'static> {
    Box::new(move |call: &Call, asked: &Asked| {
        let state = change(&asked.state).ok_or("the state is too short to change")?;
        Ok(Negative { who: 0, method: call.method.clone(), params: call.params.clone(), state })
    })
}

/// A different character at byte `at` (an ASCII state; else the nearest boundary).
fn change_at(state: &str, at: usize) -> Option<String> {
    let mut chars: Vec<char> = state.chars().collect();
    let at = at.min(chars.len().checked_sub(1)?);
    let c = chars.get_mut(at)?;
    *c = match *c {
        'A' => 'B',
        '.' => 'A',
        _ => 'A',
    };
    Some(chars.into_iter().collect())
}

fn flip_middle(state: &str) -> Option<String> {
    let chars = state.chars().count();
    // The middle, avoiding a separator (a changed '.' would only break the format).
    let mut at = chars / 2;
    if state.chars().nth(at) == Some('.') {
        at += 1;
    }
    change_at(state, at)
}

fn change_last(state: &str) -> Option<String> {
    let last = state.chars().count().checked_sub(1)?;
    change_at(state, last)
}

fn truncate(state: &str) -> Option<String> {
    let keep = state.chars().count() * 3 / 4;
    (keep > 0).then(|| state.chars().take(keep).collect())
}

/// 48 random bytes, base64url.
fn garbage_state(_state: &str) -> Option<String> {
    let mut bytes = [0u8; 48];
    aws_lc_rs::rand::fill(&mut bytes).ok()?;
    Some(URL_SAFE_NO_PAD.encode(bytes))
}

/// Rewrites a JSON value: the first boolean negated, else the first number increased, else a
/// key added.
fn rewrite(value: &mut Value) -> bool {
    match value {
        Value::Bool(b) => {
            *b = !*b;
            true
        }
        Value::Object(map) => map.values_mut().any(rewrite),
        Value::Array(items) => items.iter_mut().any(rewrite),
        _ => false,
    }
}

fn bump(value: &mut Value) -> bool {
    match value {
        Value::Number(n) => match n.as_i64() {
            Some(i) => {
                *value = json!(i.saturating_add(1));
                true
            }
            None => false,
        },
        Value::Object(map) => map.values_mut().any(bump),
        Value::Array(items) => items.iter_mut().any(bump),
        _ => false,
    }
}

/// The state with a base64 JSON segment (dot-separated, or the whole state) decoded, rewritten
/// and re-encoded in the same alphabet, the other segments kept.
fn rewrite_payload(state: &str) -> Option<String> {
    let segments: Vec<&str> = state.split('.').collect();
    for (i, segment) in segments.iter().enumerate() {
        for (url_safe, decoded) in
            [(true, URL_SAFE_NO_PAD.decode(segment.trim_end_matches('='))), (false, STANDARD.decode(segment))]
        {
            let Ok(bytes) = decoded else { continue };
            let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else { continue };
            if !value.is_object() {
                continue;
            }
            if !rewrite(&mut value)
                && !bump(&mut value)
                && let Some(map) = value.as_object_mut()
            {
                map.insert("palisadeVerify".into(), json!(true));
            }
            let text = value.to_string();
            let encoded = if url_safe { URL_SAFE_NO_PAD.encode(text) } else { STANDARD.encode(text) };
            let mut rebuilt: Vec<String> = segments.iter().map(|s| (*s).to_owned()).collect();
            if let Some(slot) = rebuilt.get_mut(i) {
                *slot = encoded;
            }
            return Some(rebuilt.join("."));
        }
    }
    None
}

// ----- the cases --------------------------------------------------------------------------------

async fn echo(ctx: &Context, check: Check) -> Outcome {
    let Started { call, first: asked, log } = match begin(ctx, &check, Vec::new()).await {
        Ok(started) => started,
        Err(outcome) => return outcome,
    };
    let answer = send(ctx, retry(ctx, 0, &call.method, &call.params, &asked.state, &asked.responses)).await;
    let (verdict, detail) = if proceeded(&answer) {
        (
            Verdict::Pass,
            format!(
                "{} asked for input; the exact echo with the answers proceeded ({})",
                call.method,
                answer.summary()
            ),
        )
    } else {
        (Verdict::Fail, format!("the exact echo of the state with the answers did not proceed ({})", answer.summary()))
    };
    after(Outcome::new(&check, verdict, detail).with(&[&answer]), &log)
}

async fn flipped(ctx: &Context, check: Check) -> Outcome {
    against(ctx, check, tampered(flip_middle), Vec::new(), false).await
}

async fn last_char(ctx: &Context, check: Check) -> Outcome {
    against(ctx, check, tampered(change_last), Vec::new(), false).await
}

async fn truncated(ctx: &Context, check: Check) -> Outcome {
    against(ctx, check, tampered(truncate), Vec::new(), false).await
}

async fn empty(ctx: &Context, check: Check) -> Outcome {
    against(ctx, check, tampered(|_| Some(String::new())), Vec::new(), false).await
}

async fn garbage(ctx: &Context, check: Check) -> Outcome {
    against(ctx, check, tampered(garbage_state), Vec::new(), false).await
}

async fn payload(ctx: &Context, check: Check) -> Outcome {
    let build: Build<'static> = Box::new(|call: &Call, asked: &Asked| {
        let state =
            rewrite_payload(&asked.state).ok_or("the state has no base64 JSON part to rewrite (it is opaque)")?;
        Ok(Negative { who: 0, method: call.method.clone(), params: call.params.clone(), state })
    });
    against(ctx, check, build, Vec::new(), false).await
}

/// The owner's exact call and state, presented by identity `who`.
fn replayed_by(who: usize) -> Build<'static> {
    Box::new(move |call: &Call, asked: &Asked| {
        Ok(Negative { who, method: call.method.clone(), params: call.params.clone(), state: asked.state.clone() })
    })
}

async fn other_identity(ctx: &Context, check: Check) -> Outcome {
    match ctx.other(Other::Caller) {
        Ok(found) => against(ctx, check, replayed_by(found.index), Vec::new(), false).await,
        Err(why) => not_testable(&check, why),
    }
}

async fn other_tenant(ctx: &Context, check: Check) -> Outcome {
    match ctx.other(Other::Tenant) {
        Ok(found) => against(ctx, check, replayed_by(found.index), Vec::new(), false).await,
        Err(why) => not_testable(&check, why),
    }
}

async fn oracle(ctx: &Context, check: Check) -> Outcome {
    let other = match ctx.other(Other::Caller) {
        Ok(found) => found.index,
        Err(why) => return not_testable(&check, why),
    };
    let Started { call, first, mut log } = match begin(ctx, &check, Vec::new()).await {
        Ok(started) => started,
        Err(outcome) => return outcome,
    };
    let Some(random) = garbage_state("") else {
        return after(not_testable(&check, "no state could be made up (the random source failed)"), &log);
    };
    ctx.target.redactor().add(&random, "request-state-made-up");
    let foreign = send(ctx, retry(ctx, other, &call.method, &call.params, &first.state, &first.responses)).await;
    let made_up = send(ctx, retry(ctx, other, &call.method, &call.params, &random, &first.responses)).await;
    let Some(second) = ask(ctx, &call, 0, &mut log).await else {
        let why = "the call did not ask for input a second time";
        return after(Outcome::new(&check, Verdict::Inconclusive, why).with(&[&foreign, &made_up]), &log);
    };
    let control = send(ctx, retry(ctx, 0, &call.method, &call.params, &second.state, &second.responses)).await;
    let shape = |e: &Exchange| (e.status, e.error_code(), proceeded(e));
    let judgement = if shape(&foreign) == shape(&made_up) {
        Judgement::Refused
    } else {
        Judgement::Accepted(format!(
            "another identity's state is answered ({}) unlike a made-up one ({}): the refusal tells a valid state apart",
            foreign.summary(),
            made_up.summary()
        ))
    };
    let mut outcome = judged(&check, &control, &foreign, judgement, Verdict::Fail).with(&[&made_up]);
    if outcome.verdict == Verdict::Pass {
        outcome.detail =
            format!("another identity's state and a made-up one are answered alike ({})", foreign.summary());
    }
    after(outcome, &log)
}

async fn other_arguments(ctx: &Context, check: Check) -> Outcome {
    let recipe = match recipe(ctx).await {
        Ok(recipe) => recipe,
        Err(why) => return not_testable(&check, why),
    };
    if matches!(recipe, Recipe::Fixed { .. }) {
        return not_testable(&check, "the call found takes no arguments that could be varied");
    }
    // Another object of the owner's own, for the same tool.
    let other = match call(ctx, &recipe, 0).await {
        Ok(other) => other,
        Err(why) => return not_testable(&check, why),
    };
    let params = other.params.clone();
    let build: Build<'static> = Box::new(move |call: &Call, asked: &Asked| {
        Ok(Negative { who: 0, method: call.method.clone(), params, state: asked.state.clone() })
    });
    against(ctx, check, build, other.made, false).await
}

async fn other_tool(ctx: &Context, check: Check) -> Outcome {
    if !ctx.allow_mutations {
        return not_testable(&check, "calling another tool needs --allow-mutations");
    }
    let tools = ctx.target.send(request(ctx, 0, "tools/list", json!({}))).await;
    let recipe_tool = match recipe(ctx).await {
        Ok(Recipe::Chain { tool, .. }) => Some(tool),
        Ok(Recipe::Fixed { params, .. }) => params.get("name").and_then(Value::as_str).map(str::to_owned),
        Err(why) => return not_testable(&check, why),
    };
    let every: Vec<Value> = listed(&tools, "tools").into_iter().cloned().collect();
    let other = ctx
        .callable_tools(&every)
        .into_iter()
        .filter(|(tool, listing)| tool.read_only() && required(listing.get("inputSchema")).is_empty())
        .map(|(tool, _)| tool.name().to_owned())
        .find(|name| Some(name) != recipe_tool.as_ref());
    let Some(other) = other else {
        return after(not_testable(&check, "no other read-only tool without required arguments"), &[tools]);
    };
    let build: Build<'static> = Box::new(move |_: &Call, asked: &Asked| {
        let params = json!({ "name": other, "arguments": {} });
        Ok(Negative { who: 0, method: "tools/call".into(), params, state: asked.state.clone() })
    });
    against(ctx, check, build, vec![tools], true).await
}

async fn other_method(ctx: &Context, check: Check) -> Outcome {
    let Some(named) = ctx.named().await else {
        return not_testable(&check, "the target serves no resource or prompt to present the state to");
    };
    let build: Build<'static> = Box::new(move |call: &Call, asked: &Asked| {
        if named.method == call.method {
            return Err(format!("the call found is itself a {}: no other method to present it to", call.method));
        }
        let mut params = named.params.as_object().cloned().unwrap_or_default();
        params.remove("_meta");
        Ok(Negative { who: 0, method: named.method.clone(), params: Value::Object(params), state: asked.state.clone() })
    });
    against(ctx, check, build, Vec::new(), true).await
}

async fn after_use(ctx: &Context, check: Check) -> Outcome {
    let Started { call, first: asked, log } = match begin(ctx, &check, Vec::new()).await {
        Ok(started) => started,
        Err(outcome) => return outcome,
    };
    let control = send(ctx, retry(ctx, 0, &call.method, &call.params, &asked.state, &asked.responses)).await;
    let again = send(ctx, retry(ctx, 0, &call.method, &call.params, &asked.state, &asked.responses)).await;
    let judgement = match judge(&again, &control) {
        Judgement::Accepted(why) => Judgement::RefusedOddly(format!(
            "{why}: a state whose round completed was taken again (a confirmation replayed runs the call twice)"
        )),
        other => other,
    };
    after(judged(&check, &control, &again, judgement, Verdict::Warning), &log)
}

async fn expired(ctx: &Context, check: Check) -> Outcome {
    let why = "a requestState's lifetime is the target's own and none expires within the run's time budget";
    match recipe(ctx).await {
        Ok(_) => not_testable(&check, why),
        Err(none) => not_testable(&check, none),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tampering_changes_the_state_and_keeps_its_shape() {
        let state = "v1.eyJhIjpmYWxzZX0.c2lnbmF0dXJl";
        let flipped = flip_middle(state).unwrap();
        assert_ne!(flipped, state);
        assert_eq!(flipped.len(), state.len());
        assert!(change_last("abc").unwrap().ends_with('A'));
        assert!(change_last("abA").unwrap().ends_with('B'));
        assert_eq!(truncate("abcdefgh").as_deref(), Some("abcdef"));
        assert_eq!(change_last(""), None);
        assert_ne!(garbage_state("").unwrap(), garbage_state("").unwrap());
        // The payload {"a":false} is rewritten to {"a":true}, the signature kept.
        let rewritten = rewrite_payload(state).unwrap();
        let parts: Vec<&str> = rewritten.split('.').collect();
        assert_eq!(parts[0], "v1");
        assert_eq!(URL_SAFE_NO_PAD.decode(parts[1]).unwrap(), br#"{"a":true}"#);
        assert_eq!(parts[2], "c2lnbmF0dXJl");
        assert_eq!(rewrite_payload("opaque-bytes-only"), None);
    }

    #[test]
    fn a_negative_is_judged_against_the_controls_answer() {
        let answer = |result: Value| {
            Exchange::answered(json!(1), 200, vec![json!({ "jsonrpc": "2.0", "id": 1, "result": result })])
        };
        let done = answer(json!({ "resultType": "complete", "content": [] }));
        let tool_error = answer(json!({ "resultType": "complete", "isError": true }));
        let again = answer(json!({ "resultType": "input_required", "requestState": "x" }));
        assert!(matches!(judge(&done, &done), Judgement::Accepted(_)));
        assert!(matches!(judge(&tool_error, &done), Judgement::RefusedOddly(_)));
        // The control's own result is a tool error: the same from the negative is acceptance.
        assert!(matches!(judge(&tool_error, &tool_error), Judgement::Accepted(_)));
        assert_eq!(judge(&again, &done), Judgement::Refused);
        assert!(!proceeded(&again) && proceeded(&tool_error));
    }
}
