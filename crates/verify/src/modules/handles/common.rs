//! What every handles check shares: the name words that find the handle tools, the surface found
//! from `tools/list`, minting a handle, the callers, and the refusal judgements.

use serde_json::{Map, Value, json};

use crate::callable::{CallableTool, words as name_words};
use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::identity::Other;
use crate::modules::Context;
use crate::target::{Auth, Exchange, Probe};

/// Handles shorter than this are not added to the redactor (a one- or two-character string
/// would garble every transcript; such a handle is no secret anyway).
pub(super) const MIN_REDACTED: usize = 8;
/// The most tools of one role a case exercises.
pub(super) const MAX_TOOLS_PER_ROLE: usize = 3;
/// The longest wait for an announced expiry.
pub(super) const MAX_EXPIRY_WAIT_MS: u64 = 2_000;

/// Words of tool names that create a handle.
pub(super) const CREATE_WORDS: &[&str] = &["create", "new", "open", "start"];
/// Words of tool names that consume or end the object: never called as an ordinary use (the
/// ones of [`crate::callable::NEVER_WORDS`] are never called at all).
pub(super) const CONSUMING_WORDS: &[&str] = &[
    "checkout",
    "pay",
    "purchase",
    "buy",
    "order",
    "submit",
    "commit",
    "confirm",
    "delete",
    "remove",
    "revoke",
    "close",
    "destroy",
    "discard",
    "release",
    "cancel",
    "finish",
    "complete",
    "finalize",
    "transfer",
    "send",
    "publish",
    "invalidate",
    "replace",
    "rotate",
    "regenerate",
    "renew",
    "reissue",
    "reset",
    "clear",
    "empty",
    "expire",
    "end",
    "drop",
    "archive",
];
/// Words of tool names that revoke the handle (`revoke`, `delete`, `drop` or `destroy` names
/// are never called: [`crate::callable`]).
pub(super) const REVOKE_WORDS: &[&str] = &["close", "discard", "release", "invalidate"];
/// Words of tool names that replace the object (a new version: old handles must die).
pub(super) const REPLACE_WORDS: &[&str] = &["replace", "rotate", "regenerate", "renew", "reissue"];
/// Words of tool names that only read.
pub(super) const READ_WORDS: &[&str] =
    &["view", "get", "read", "show", "list", "describe", "status", "inspect", "peek", "fetch"];

/// One tool of `tools/list` a check may call (made only from a [`CallableTool`]).
#[derive(Debug, Clone)]
pub(super) struct Tool {
    pub(super) name: String,
    pub(super) input: Value,
    pub(super) output: Value,
    pub(super) annotations: Value,
}

impl Tool {
    pub(super) fn from_listing(callable: &CallableTool, tool: &Value) -> Self {
        Self {
            name: callable.name().to_owned(),
            input: tool.get("inputSchema").cloned().unwrap_or(Value::Null),
            output: tool.get("outputSchema").cloned().unwrap_or(Value::Null),
            annotations: tool.get("annotations").cloned().unwrap_or(Value::Null),
        }
    }

    pub(super) fn properties(&self) -> Option<&Map<String, Value>> {
        self.input.get("properties").and_then(Value::as_object)
    }

    pub(super) fn required(&self) -> Vec<&str> {
        self.input.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect()
    }

    pub(super) fn takes(&self, property: &str) -> bool {
        self.properties().is_some_and(|properties| properties.contains_key(property))
    }

    pub(super) fn words(&self) -> Vec<String> {
        name_words(&self.name)
    }

    pub(super) fn named(&self, list: &[&str]) -> bool {
        self.words().iter().any(|word| list.contains(&word.as_str()))
    }

    pub(super) fn hint(&self, name: &str) -> Option<bool> {
        self.annotations.get(name).and_then(Value::as_bool)
    }

    /// Handle arguments other than `property` with the same schema (a second handle position).
    pub(super) fn other_positions(&self, property: &str) -> Vec<String> {
        let Some(properties) = self.properties() else { return Vec::new() };
        let Some(main) = properties.get(property).map(without_description) else { return Vec::new() };
        properties
            .iter()
            .filter(|(name, schema)| name.as_str() != property && without_description(schema) == main)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

pub(super) fn without_description(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object.remove("description");
        object.remove("title");
    }
    schema
}

/// What the target offers around one kind of handle.
#[derive(Debug, Clone)]
pub(super) struct Surface {
    /// The tool that creates a handle.
    pub(super) creator: String,
    /// The result property holding the handle, and the argument other tools take it as.
    pub(super) property: String,
    /// Tools that only read the object.
    pub(super) read: Vec<Tool>,
    /// Tools that change the object (without consuming it).
    pub(super) write: Vec<Tool>,
    /// A tool that revokes the handle, if any.
    pub(super) revoke: Option<Tool>,
    /// A tool that replaces the object, if any.
    pub(super) replace: Option<Tool>,
    /// Tools taking the handle and a second handle of the same kind.
    pub(super) two_handles: Vec<(Tool, String)>,
    /// The listing and any create made to learn the handle's property.
    pub(super) found: Vec<Exchange>,
}

impl Surface {
    /// The tool ordinary cases use: the first reading tool, else the first changing tool.
    pub(super) fn primary(&self) -> Option<&Tool> {
        self.read.first().or_else(|| self.write.first())
    }
}

/// A handle one identity created.
#[derive(Debug, Clone)]
pub(super) struct Minted {
    pub(super) value: String,
    pub(super) exchange: Exchange,
    pub(super) result: Value,
}

/// Why a case stops before its negative: NOT TESTABLE or INCONCLUSIVE, with what was sent.
pub(super) struct Stop(pub(super) Outcome);

pub(super) fn not_testable(check: &Check, why: impl Into<String>) -> Outcome {
    Outcome::new(check, Verdict::NotTestable, why)
}

pub(super) fn inconclusive(check: &Check, why: impl Into<String>, exchanges: &[&Exchange]) -> Outcome {
    Outcome::new(check, Verdict::Inconclusive, why).with(exchanges)
}

pub(super) const NEEDS_MUTATIONS: &str =
    "creating a handle is a side effect: run with --allow-mutations to test handles (nothing was sent)";

/// The structured result of a tool call: `structuredContent`, else the first text content
/// that parses as a JSON object.
pub(super) fn structured(result: &Value) -> Option<Value> {
    if let Some(content) = result.get("structuredContent").filter(|content| content.is_object()) {
        return Some(content.clone());
    }
    result.get("content").and_then(Value::as_array).into_iter().flatten().find_map(|content| {
        let text = content.get("text").and_then(Value::as_str)?;
        serde_json::from_str::<Value>(text).ok().filter(Value::is_object)
    })
}

/// Whether the call was served: a JSON-RPC `result` for the id that is not `isError: true`.
pub(super) fn served(exchange: &Exchange) -> bool {
    exchange.accepted() && !is_tool_error(exchange)
}

pub(super) fn is_tool_error(exchange: &Exchange) -> bool {
    exchange.result().and_then(|result| result.get("isError")).and_then(Value::as_bool) == Some(true)
}

/// One line: the exchange's summary, with a tool error said as such.
pub(super) fn describe(exchange: &Exchange) -> String {
    if is_tool_error(exchange) {
        format!("{}, isError: true", exchange.summary().replace(", a result", ", a tool result"))
    } else {
        exchange.summary()
    }
}

/// A negative use is judged from the body: served is a failure; a JSON-RPC error, a 4xx or an
/// `isError` result is the refusal; no answer is inconclusive.
pub(super) fn judge(negative: &Exchange) -> (Judgement, Verdict) {
    if served(negative) {
        let why = format!("served ({}): the handle was honoured for a caller it was not issued to", describe(negative));
        return (Judgement::Accepted(why), Verdict::Fail);
    }
    if negative.status.is_none() {
        return (Judgement::RefusedOddly(format!("no answer ({})", describe(negative))), Verdict::Inconclusive);
    }
    if negative.error().is_some() || negative.client_error() || is_tool_error(negative) {
        return (Judgement::Refused, Verdict::Warning);
    }
    (Judgement::RefusedOddly(format!("neither served nor refused ({})", describe(negative))), Verdict::Warning)
}

/// `paired`, with the control judged as a tool call (an `isError` control is not accepted) and
/// the exchanges that prepared the case written first.
pub(super) fn pair(check: &Check, prelude: &[&Exchange], control: &Exchange, negative: &Exchange) -> Outcome {
    let mut outcome = if served(control) {
        let (judgement, odd) = judge(negative);
        let mut outcome = paired(check, control, negative, judgement, odd);
        if outcome.verdict == Verdict::Pass {
            outcome.detail = format!("refused ({}); the owner's own use was served", describe(negative));
        }
        outcome
    } else {
        let detail = format!("positive control not served ({}): nothing to compare with", describe(control));
        inconclusive(check, detail, &[control, negative])
    };
    outcome.transcript.splice(0..0, prelude.iter().map(|exchange| exchange.transcript.clone()));
    outcome
}

/// Several pairs of one case (one per tool): a FAIL if any negative was served, INCONCLUSIVE if
/// any control was not, WARNING if any refusal was odd, else PASS.
pub(super) fn merge(check: &Check, parts: Vec<(String, Outcome)>) -> Outcome {
    let rank = |verdict: Verdict| match verdict {
        Verdict::Fail => 4,
        Verdict::Inconclusive => 3,
        Verdict::Warning => 2,
        Verdict::NotTestable => 1,
        Verdict::Pass => 0,
    };
    let verdict = parts.iter().map(|(_, outcome)| outcome.verdict).max_by_key(|verdict| rank(*verdict));
    let Some(verdict) = verdict else { return not_testable(check, "no tool to test with") };
    let detail =
        parts.iter().map(|(tool, outcome)| format!("{tool}: {}", outcome.detail)).collect::<Vec<_>>().join("; ");
    let mut merged = Outcome::new(check, verdict, detail);
    merged.transcript = parts.into_iter().flat_map(|(_, outcome)| outcome.transcript).collect();
    merged
}

/// Adds a handle to the redactor and redacts what was written before it was known.
pub(super) fn redact_handle(ctx: &Context, value: &str, name: &str, exchanges: &mut [&mut Exchange]) {
    if value.chars().count() >= MIN_REDACTED {
        ctx.target.redactor().add(value, name);
    }
    for exchange in exchanges {
        exchange.transcript = ctx.target.redactor().redact(&exchange.transcript);
    }
}

pub(super) fn name_of(ctx: &Context, i: usize) -> String {
    ctx.identities.get(i).map_or_else(|| format!("identity-{i}"), |identity| identity.name.clone())
}

/// A value for a required argument from its schema: `const`, the first `enum` value, `default`,
/// the first of `examples`, a backticked example in the description (`e.g. \`TEA-001\``), else
/// the least value of its type.
pub(super) fn example(schema: &Value) -> Value {
    for key in ["const", "default"] {
        if let Some(value) = schema.get(key) {
            return value.clone();
        }
    }
    for key in ["enum", "examples"] {
        if let Some(value) = schema.get(key).and_then(Value::as_array).and_then(|values| values.first()) {
            return value.clone();
        }
    }
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(Value::Array(kinds)) => {
            kinds.iter().filter_map(Value::as_str).find(|kind| *kind != "null").unwrap_or("string")
        }
        _ => "string",
    };
    match kind {
        "integer" | "number" => {
            let least = schema
                .get("minimum")
                .and_then(Value::as_i64)
                .or_else(|| schema.get("exclusiveMinimum").and_then(Value::as_i64).map(|least| least + 1))
                .unwrap_or(1);
            let most = schema.get("maximum").and_then(Value::as_i64).unwrap_or(i64::MAX);
            json!(least.min(most))
        }
        "boolean" => json!(false),
        "array" => json!([]),
        "object" => json!({}),
        _ => {
            let described = schema.get("description").and_then(Value::as_str).and_then(described_example);
            let least = schema.get("minLength").and_then(Value::as_u64).unwrap_or(1);
            json!(described.unwrap_or_else(|| "x".repeat(usize::try_from(least.max(1)).unwrap_or(1))))
        }
    }
}

/// The backticked text after `e.g.` / `example` in a description.
pub(super) fn described_example(description: &str) -> Option<String> {
    let lower = description.to_ascii_lowercase();
    let start = ["e.g.", "example", "such as"].iter().filter_map(|marker| lower.find(marker)).min()?;
    let rest = &description[start..];
    let open = rest.find('`')?;
    let after = &rest[open + 1..];
    let close = after.find('`')?;
    Some(after[..close].to_owned()).filter(|text| !text.is_empty())
}

/// The arguments of a use of `tool`: `handle` under `property` (and under any other handle
/// position), every other required argument from its schema.
pub(super) fn arguments(tool: &Tool, property: &str, handle: &str) -> Value {
    let mut arguments = Map::new();
    let others = tool.other_positions(property);
    for name in tool.required() {
        let value = if name == property || others.iter().any(|other| other == name) {
            json!(handle)
        } else {
            tool.properties().and_then(|properties| properties.get(name)).map_or_else(|| json!("x"), example)
        };
        arguments.insert(name.to_owned(), value);
    }
    arguments.insert(property.to_owned(), json!(handle));
    Value::Object(arguments)
}

pub(super) fn call(tool: &str, arguments: Value, auth: Auth) -> Probe {
    Probe::request("tools/call", json!({ "name": tool, "arguments": arguments }), auth)
}

/// A use of the handle `handle` with `tool` by `auth`.
pub(super) async fn use_handle(ctx: &Context, surface: &Surface, tool: &Tool, handle: &str, auth: Auth) -> Exchange {
    ctx.target.send(call(&tool.name, arguments(tool, &surface.property, handle), auth)).await
}

/// Every tool of `tools/list` (following `nextCursor`, five pages at most), as the first
/// identity, as listed; the listing exchanges.
pub(super) async fn list_tools(ctx: &Context) -> (Vec<Value>, Vec<Exchange>) {
    let mut tools = Vec::new();
    let mut exchanges = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let params = cursor.as_ref().map_or_else(|| json!({}), |cursor| json!({ "cursor": cursor }));
        let listed = ctx.target.send(Probe::request("tools/list", params, ctx.auth())).await;
        let page = listed.result().and_then(|result| result.get("tools")).and_then(Value::as_array);
        tools.extend(page.into_iter().flatten().cloned());
        cursor = listed.result().and_then(|result| result.get("nextCursor")).and_then(Value::as_str).map(str::to_owned);
        exchanges.push(listed);
        if cursor.is_none() {
            break;
        }
    }
    (tools, exchanges)
}

/// The string properties of a create tool's declared output that another tool takes.
pub(super) fn declared_properties(creator: &Tool, tools: &[Tool]) -> Vec<String> {
    let properties = creator.output.get("properties").and_then(Value::as_object);
    properties
        .into_iter()
        .flatten()
        .filter(|(_, schema)| schema.get("type").and_then(Value::as_str) == Some("string"))
        .map(|(name, _)| name.clone())
        .filter(|name| tools.iter().any(|tool| tool.name != creator.name && tool.takes(name)))
        .collect()
}

/// The handle tools of the target. `Err`: why the module cannot run (NOT TESTABLE, or
/// INCONCLUSIVE when the listing itself was refused).
pub(super) async fn discover(ctx: &Context, check: &Check) -> Result<Surface, Stop> {
    let (listed, mut found) = list_tools(ctx).await;
    let all: Vec<&Exchange> = found.iter().collect();
    if listed.is_empty() {
        let refused = found.first().is_some_and(|listed| !listed.accepted());
        return Err(Stop(if refused {
            inconclusive(check, "the first identity's tools/list was not served", &all)
        } else {
            not_testable(check, "the target lists no tools").with(&all)
        }));
    }
    let tools: Vec<Tool> =
        ctx.callable_tools(&listed).into_iter().map(|(callable, tool)| Tool::from_listing(&callable, tool)).collect();
    if tools.is_empty() {
        let why = "no tool the target lists may be called (each is annotated destructive or named like one)";
        return Err(Stop(not_testable(check, why).with(&all)));
    }
    let creators: Vec<&Tool> = tools
        .iter()
        .filter(|tool| tool.named(CREATE_WORDS) && tool.required().is_empty() && !tool.named(CONSUMING_WORDS))
        .collect();
    let mut chosen: Option<(String, String)> = creators
        .iter()
        .find_map(|creator| declared_properties(creator, &tools).into_iter().next().map(|p| (creator.name.clone(), p)));
    if chosen.is_none() {
        // No declared output names the handle: create once and look at the result.
        for creator in creators.iter().take(MAX_TOOLS_PER_ROLE) {
            let mut created = ctx.target.send(call(&creator.name, json!({}), ctx.auth())).await;
            let content = created.result().and_then(structured).unwrap_or(Value::Null);
            let hit = content.as_object().into_iter().flatten().find_map(|(name, value)| {
                let value = value.as_str()?;
                tools.iter().any(|tool| tool.name != creator.name && tool.takes(name)).then(|| (name.clone(), value))
            });
            if let Some((property, value)) = hit {
                let value = value.to_owned();
                redact_handle(ctx, &value, &format!("handle-{}", name_of(ctx, 0)), &mut [&mut created]);
                chosen = Some((creator.name.clone(), property));
            }
            found.push(created);
            if chosen.is_some() {
                break;
            }
        }
    }
    let Some((creator, property)) = chosen else {
        let why = "no tool creates a handle another tool takes (a tool named create/new/open/start without \
                   required arguments whose result holds a string that another tool's inputSchema names)";
        return Err(Stop(not_testable(check, why)));
    };
    let users: Vec<&Tool> = tools.iter().filter(|tool| tool.name != creator && tool.takes(&property)).collect();
    let consuming = |tool: &Tool| tool.named(CONSUMING_WORDS) || tool.hint("destructiveHint") == Some(true);
    let reads = |tool: &Tool| tool.hint("readOnlyHint") == Some(true) || tool.named(READ_WORDS);
    let pick = |keep: &dyn Fn(&Tool) -> bool| -> Vec<Tool> {
        users.iter().filter(|tool| keep(tool)).take(MAX_TOOLS_PER_ROLE).map(|tool| (*tool).clone()).collect()
    };
    let read = pick(&|tool| !consuming(tool) && reads(tool));
    let write = pick(&|tool| !consuming(tool) && !reads(tool));
    let revoke = users.iter().find(|tool| tool.named(REVOKE_WORDS)).map(|tool| (*tool).clone());
    let replace = users.iter().find(|tool| tool.named(REPLACE_WORDS)).map(|tool| (*tool).clone());
    let two_handles = users
        .iter()
        .filter(|tool| !consuming(tool))
        .filter_map(|tool| tool.other_positions(&property).into_iter().next().map(|other| ((*tool).clone(), other)))
        .collect();
    Ok(Surface { creator, property, read, write, revoke, replace, two_handles, found })
}

/// Identity `i` creates a handle. `Err`: the create exchange, not served or without a handle.
pub(super) async fn mint(ctx: &Context, surface: &Surface, i: usize) -> Result<Minted, Exchange> {
    let mut exchange = ctx.target.send(call(&surface.creator, json!({}), ctx.auth_of(i))).await;
    let result = exchange.result().and_then(structured).unwrap_or(Value::Null);
    let value = result.get(&surface.property).and_then(Value::as_str).map(str::to_owned);
    match value {
        Some(value) if served(&exchange) && !value.is_empty() => {
            redact_handle(ctx, &value, &format!("handle-{}", name_of(ctx, i)), &mut [&mut exchange]);
            Ok(Minted { value, exchange, result })
        }
        _ => Err(exchange),
    }
}

/// The common start of a case: mutations allowed, the handle tools found, and the first
/// identity's handle created.
pub(super) async fn setup(ctx: &Context, check: &Check) -> Result<(Surface, Minted), Stop> {
    if !ctx.allow_mutations {
        return Err(Stop(not_testable(check, NEEDS_MUTATIONS)));
    }
    let surface = discover(ctx, check).await?;
    let minted = mint(ctx, &surface, 0).await.map_err(|created| {
        let detail =
            format!("the first identity's {} was not served with a handle ({})", surface.creator, describe(&created));
        Stop(inconclusive(check, detail, &[&created]))
    })?;
    Ok((surface, minted))
}

macro_rules! ready {
    ($expression:expr) => {
        match $expression {
            Ok(value) => value,
            Err(Stop(outcome)) => return outcome,
        }
    };
}
pub(super) use ready;

/// Who a cross-identity case calls as.
#[derive(Debug, Clone, Copy)]
pub(super) enum Caller {
    Other(Other),
    NoToken,
}

/// The caller's authentication and what the identity files leave unknown about it; `Err`: why
/// no identity fits.
pub(super) fn caller_auth(ctx: &Context, caller: Caller) -> Result<(Auth, Option<String>), &'static str> {
    match caller {
        Caller::NoToken => Ok((Auth::None, None)),
        Caller::Other(kind) => ctx.other(kind).map(|found| (ctx.auth_of(found.index), found.caveat)),
    }
}

/// The outcome with the caveat about its caller (a tenant not declared) added to its detail.
pub(super) fn noted(mut outcome: Outcome, caveat: Option<&str>) -> Outcome {
    if let Some(caveat) = caveat {
        outcome.detail = format!("{} ({caveat})", outcome.detail);
    }
    outcome
}
