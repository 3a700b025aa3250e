//! The explicit application-handle module (seed 000, DESIGN C2): cross-call state is an opaque
//! handle passed back as an ordinary tool argument, and the server must authorize its owner
//! (subject, tenant, client, scope) on every use. The module finds the handle tools from
//! `tools/list` (a tool named like create/new/open/start without required arguments whose
//! result holds a string under a property that other tools take as an argument), has the first
//! identity create a handle, and checks that its owner is served while another subject, another
//! tenant, another client, no token, a token without the scope, guessed and near-miss handles,
//! a revoked or replaced handle are refused; that the refusal for another identity's handle is
//! the refusal for a handle that does not exist (no existence oracle) and echoes nothing of the
//! object; and that handles are distinct, long enough and never listed.
//!
//! Creating a handle is a side effect: without `--allow-mutations` every case is NOT TESTABLE
//! and nothing is sent. Only tools the one rule of [`crate::callable`] permits are considered at
//! all (never one annotated destructive or named like delete, revoke or checkout), so a revoke
//! case needs a tool named like close, discard, release or invalidate. Handles are credentials:
//! each one (real, guessed, near-miss) is added to the run's redactor before a transcript that
//! could show it is kept.

use std::collections::BTreeSet;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value, json};

use crate::callable::{CallableTool, words as name_words};
use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::identity::{Other, Relation};
use crate::modules::{Context, Module, cases, estimated_bits};
use crate::target::{Auth, Exchange, Probe};

/// The handles module.
pub fn module() -> Module {
    Module {
        name: "handles",
        exclusive: false,
        cases: cases! {
            create: "handles.discover.create", "A create tool issues a handle its owner can use in another tool",
                "seed 000 G001: cross-call state is an explicit handle passed as an ordinary argument", Low;
            read_other_subject: "handles.read.other_subject", "Another subject of the same tenant cannot read through the owner's handle",
                "seed 000 G001: authorize the referenced object on every use; Verify safely: substitution across subject", Critical;
            read_other_tenant: "handles.read.other_tenant", "Another tenant cannot read through the owner's handle",
                "seed 000: handles bound to tenant; Verify safely: substitution across tenant", Critical;
            read_other_client: "handles.read.other_client", "The same subject through another client cannot read through the handle",
                "seed 000: handles bound to client; Verify safely: substitution across client", Critical;
            read_no_token: "handles.read.no_token", "The owner's handle without a token is refused by a reading tool",
                "seed 000 G001: a handle is an untrusted argument, not authentication", Critical;
            write_other_subject: "handles.write.other_subject", "Another subject of the same tenant cannot change the object through the handle",
                "seed 000 G001: authorize the referenced object on every use; Verify safely: substitution across subject", Critical;
            write_other_tenant: "handles.write.other_tenant", "Another tenant cannot change the object through the owner's handle",
                "seed 000: handles bound to tenant; Verify safely: substitution across tenant", Critical;
            write_other_client: "handles.write.other_client", "The same subject through another client cannot change the object",
                "seed 000: handles bound to client; Verify safely: substitution across client", Critical;
            write_no_token: "handles.write.no_token", "The owner's handle without a token is refused by a changing tool",
                "seed 000 G001: a handle is an untrusted argument, not authentication", Critical;
            forge_random: "handles.forge.random", "A random handle of the same length and alphabet is refused",
                "seed 000 Verify safely: guessing", High;
            forge_last_char: "handles.forge.last_char", "The owner's handle with its last character changed is refused",
                "seed 000 Verify safely: guessing (near misses)", High;
            forge_first_char: "handles.forge.first_char", "The owner's handle with its first character changed is refused",
                "seed 000 Verify safely: guessing (near misses)", High;
            forge_truncated: "handles.forge.truncated", "The owner's handle shortened by one character is refused",
                "seed 000 Verify safely: guessing (near misses)", High;
            forge_appended: "handles.forge.appended", "The owner's handle with one character appended is refused",
                "seed 000 Verify safely: guessing (near misses)", High;
            forge_case_flipped: "handles.forge.case_flipped", "The owner's handle with its letters' case flipped is refused",
                "seed 000 Verify safely: guessing (near misses); handles compared exactly (by digest)", High;
            foreign_handle: "handles.substitution.foreign_handle", "An identity presenting another subject's handle is refused",
                "seed 000 Verify safely: substitution across subject", Critical;
            other_position: "handles.substitution.other_position", "Another identity's handle in a second handle argument is refused",
                "seed 000 G001: every handle argument authorized on every use", Critical;
            oracle_other_subject: "handles.oracle.other_subject", "Another subject's handle is refused exactly like one that does not exist",
                "seed 000 (no oracle: one refusal for every reason); existence oracle", High;
            oracle_other_tenant: "handles.oracle.other_tenant", "Another tenant's handle is refused exactly like one that does not exist",
                "seed 000 (no oracle: one refusal for every reason); existence oracle", High;
            no_echo: "handles.oracle.no_echo", "The refusal of another identity's handle shows nothing of the object",
                "seed 000 G001: the referenced object is authorized before any of it is returned", High;
            distinct: "handles.issue.distinct", "Two creates issue two different handles",
                "seed 000 G001: one high-entropy handle per object; Verify safely: database uniqueness", High;
            entropy: "handles.issue.entropy", "A handle carries at least 128 bits (length × alphabet)",
                "seed 000 G001: store only a high-entropy handle at the client (256-bit in the seed)", Medium;
            not_listed: "handles.issue.not_listed", "A handle appears in no listing (tools, resources, templates, prompts)",
                "seed 000 G001: the handle is given to its owner only; DESIGN C2", High;
            revoked: "handles.lifecycle.revoked", "After its owner revokes a handle it is refused",
                "seed 000 G001: independently revocable handles; Verify safely: revocation", High;
            revoke_other: "handles.lifecycle.revoke_other", "Another identity cannot revoke the owner's handle",
                "seed 000 revokeHandle: revocation bound to the owner", High;
            replaced: "handles.lifecycle.replaced", "After the object is replaced the old handle is refused",
                "seed 000: handles bound to the object's version; Verify safely: object/version change", Medium;
            expired: "handles.lifecycle.expired", "After its announced expiry a handle is refused",
                "seed 000 G001: expiring handles; Verify safely: expiry boundaries", High;
            scope_escalation: "handles.scope.escalation", "The owner's handle with a token of the owner lacking a scope is refused",
                "seed 000 resolveHandle: required scope checked on every use; Verify safely: scope escalation", High;
        },
    }
}

/// Handles shorter than this are not added to the redactor (a one- or two-character string
/// would garble every transcript; such a handle is no secret anyway).
const MIN_REDACTED: usize = 8;
/// The most tools of one role a case exercises.
const MAX_TOOLS_PER_ROLE: usize = 3;
/// The longest wait for an announced expiry.
const MAX_EXPIRY_WAIT_MS: u64 = 2_000;

/// Words of tool names that create a handle.
const CREATE_WORDS: &[&str] = &["create", "new", "open", "start"];
/// Words of tool names that consume or end the object: never called as an ordinary use (the
/// ones of [`crate::callable::NEVER_WORDS`] are never called at all).
const CONSUMING_WORDS: &[&str] = &[
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
const REVOKE_WORDS: &[&str] = &["close", "discard", "release", "invalidate"];
/// Words of tool names that replace the object (a new version: old handles must die).
const REPLACE_WORDS: &[&str] = &["replace", "rotate", "regenerate", "renew", "reissue"];
/// Words of tool names that only read.
const READ_WORDS: &[&str] = &["view", "get", "read", "show", "list", "describe", "status", "inspect", "peek", "fetch"];

/// One tool of `tools/list` a check may call (made only from a [`CallableTool`]).
#[derive(Debug, Clone)]
struct Tool {
    name: String,
    input: Value,
    output: Value,
    annotations: Value,
}

impl Tool {
    fn from_listing(callable: &CallableTool, tool: &Value) -> Self {
        Self {
            name: callable.name().to_owned(),
            input: tool.get("inputSchema").cloned().unwrap_or(Value::Null),
            output: tool.get("outputSchema").cloned().unwrap_or(Value::Null),
            annotations: tool.get("annotations").cloned().unwrap_or(Value::Null),
        }
    }

    fn properties(&self) -> Option<&Map<String, Value>> {
        self.input.get("properties").and_then(Value::as_object)
    }

    fn required(&self) -> Vec<&str> {
        self.input.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect()
    }

    fn takes(&self, property: &str) -> bool {
        self.properties().is_some_and(|properties| properties.contains_key(property))
    }

    fn words(&self) -> Vec<String> {
        name_words(&self.name)
    }

    fn named(&self, list: &[&str]) -> bool {
        self.words().iter().any(|word| list.contains(&word.as_str()))
    }

    fn hint(&self, name: &str) -> Option<bool> {
        self.annotations.get(name).and_then(Value::as_bool)
    }

    /// Handle arguments other than `property` with the same schema (a second handle position).
    fn other_positions(&self, property: &str) -> Vec<String> {
        let Some(properties) = self.properties() else { return Vec::new() };
        let Some(main) = properties.get(property).map(without_description) else { return Vec::new() };
        properties
            .iter()
            .filter(|(name, schema)| name.as_str() != property && without_description(schema) == main)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

fn without_description(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object.remove("description");
        object.remove("title");
    }
    schema
}

/// What the target offers around one kind of handle.
#[derive(Debug, Clone)]
struct Surface {
    /// The tool that creates a handle.
    creator: String,
    /// The result property holding the handle, and the argument other tools take it as.
    property: String,
    /// Tools that only read the object.
    read: Vec<Tool>,
    /// Tools that change the object (without consuming it).
    write: Vec<Tool>,
    /// A tool that revokes the handle, if any.
    revoke: Option<Tool>,
    /// A tool that replaces the object, if any.
    replace: Option<Tool>,
    /// Tools taking the handle and a second handle of the same kind.
    two_handles: Vec<(Tool, String)>,
    /// The listing and any create made to learn the handle's property.
    found: Vec<Exchange>,
}

impl Surface {
    /// The tool ordinary cases use: the first reading tool, else the first changing tool.
    fn primary(&self) -> Option<&Tool> {
        self.read.first().or_else(|| self.write.first())
    }
}

/// A handle one identity created.
#[derive(Debug, Clone)]
struct Minted {
    value: String,
    exchange: Exchange,
    result: Value,
}

/// Why a case stops before its negative: NOT TESTABLE or INCONCLUSIVE, with what was sent.
struct Stop(Outcome);

fn not_testable(check: &Check, why: impl Into<String>) -> Outcome {
    Outcome::new(check, Verdict::NotTestable, why)
}

fn inconclusive(check: &Check, why: impl Into<String>, exchanges: &[&Exchange]) -> Outcome {
    Outcome::new(check, Verdict::Inconclusive, why).with(exchanges)
}

const NEEDS_MUTATIONS: &str =
    "creating a handle is a side effect: run with --allow-mutations to test handles (nothing was sent)";

/// The structured result of a tool call: `structuredContent`, else the first text content
/// that parses as a JSON object.
fn structured(result: &Value) -> Option<Value> {
    if let Some(content) = result.get("structuredContent").filter(|content| content.is_object()) {
        return Some(content.clone());
    }
    result.get("content").and_then(Value::as_array).into_iter().flatten().find_map(|content| {
        let text = content.get("text").and_then(Value::as_str)?;
        serde_json::from_str::<Value>(text).ok().filter(Value::is_object)
    })
}

/// Whether the call was served: a JSON-RPC `result` for the id that is not `isError: true`.
fn served(exchange: &Exchange) -> bool {
    exchange.accepted() && !is_tool_error(exchange)
}

fn is_tool_error(exchange: &Exchange) -> bool {
    exchange.result().and_then(|result| result.get("isError")).and_then(Value::as_bool) == Some(true)
}

/// One line: the exchange's summary, with a tool error said as such.
fn describe(exchange: &Exchange) -> String {
    if is_tool_error(exchange) {
        format!("{}, isError: true", exchange.summary().replace(", a result", ", a tool result"))
    } else {
        exchange.summary()
    }
}

/// A negative use is judged from the body: served is a failure; a JSON-RPC error, a 4xx or an
/// `isError` result is the refusal; no answer is inconclusive.
fn judge(negative: &Exchange) -> (Judgement, Verdict) {
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
fn pair(check: &Check, prelude: &[&Exchange], control: &Exchange, negative: &Exchange) -> Outcome {
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
fn merge(check: &Check, parts: Vec<(String, Outcome)>) -> Outcome {
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
fn redact_handle(ctx: &Context, value: &str, name: &str, exchanges: &mut [&mut Exchange]) {
    if value.chars().count() >= MIN_REDACTED {
        ctx.target.redactor().add(value, name);
    }
    for exchange in exchanges {
        exchange.transcript = ctx.target.redactor().redact(&exchange.transcript);
    }
}

fn name_of(ctx: &Context, i: usize) -> String {
    ctx.identities.get(i).map_or_else(|| format!("identity-{i}"), |identity| identity.name.clone())
}

/// A value for a required argument from its schema: `const`, the first `enum` value, `default`,
/// the first of `examples`, a backticked example in the description (`e.g. \`TEA-001\``), else
/// the least value of its type.
fn example(schema: &Value) -> Value {
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
fn described_example(description: &str) -> Option<String> {
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
fn arguments(tool: &Tool, property: &str, handle: &str) -> Value {
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

fn call(tool: &str, arguments: Value, auth: Auth) -> Probe {
    Probe::request("tools/call", json!({ "name": tool, "arguments": arguments }), auth)
}

/// A use of the handle `handle` with `tool` by `auth`.
async fn use_handle(ctx: &Context, surface: &Surface, tool: &Tool, handle: &str, auth: Auth) -> Exchange {
    ctx.target.send(call(&tool.name, arguments(tool, &surface.property, handle), auth)).await
}

/// Every tool of `tools/list` (following `nextCursor`, five pages at most), as the first
/// identity, as listed; the listing exchanges.
async fn list_tools(ctx: &Context) -> (Vec<Value>, Vec<Exchange>) {
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
fn declared_properties(creator: &Tool, tools: &[Tool]) -> Vec<String> {
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
async fn discover(ctx: &Context, check: &Check) -> Result<Surface, Stop> {
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
async fn mint(ctx: &Context, surface: &Surface, i: usize) -> Result<Minted, Exchange> {
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
async fn setup(ctx: &Context, check: &Check) -> Result<(Surface, Minted), Stop> {
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

/// Who a cross-identity case calls as.
#[derive(Debug, Clone, Copy)]
enum Caller {
    Other(Other),
    NoToken,
}

/// The caller's authentication and what the identity files leave unknown about it; `Err`: why
/// no identity fits.
fn caller_auth(ctx: &Context, caller: Caller) -> Result<(Auth, Option<String>), &'static str> {
    match caller {
        Caller::NoToken => Ok((Auth::None, None)),
        Caller::Other(kind) => ctx.other(kind).map(|found| (ctx.auth_of(found.index), found.caveat)),
    }
}

/// The outcome with the caveat about its caller (a tenant not declared) added to its detail.
fn noted(mut outcome: Outcome, caveat: Option<&str>) -> Outcome {
    if let Some(caveat) = caveat {
        outcome.detail = format!("{} ({caveat})", outcome.detail);
    }
    outcome
}

/// Which tools a role case uses.
#[derive(Debug, Clone, Copy)]
enum Role {
    Read,
    Write,
}

/// The owner's handle used through every tool of `role` by `caller`, each next to the owner's
/// own use of the same tool.
async fn cross(ctx: &Context, check: Check, role: Role, caller: Caller) -> Outcome {
    if !ctx.allow_mutations {
        return not_testable(&check, NEEDS_MUTATIONS);
    }
    let (auth, caveat) = match caller_auth(ctx, caller) {
        Ok(found) => found,
        Err(why) => return not_testable(&check, why),
    };
    let (surface, minted) = ready!(setup(ctx, &check).await);
    let tools = match role {
        Role::Read => &surface.read,
        Role::Write => &surface.write,
    };
    if tools.is_empty() {
        let kind = match role {
            Role::Read => "reads the object (readOnlyHint or a view/get/read name)",
            Role::Write => "changes the object without consuming it",
        };
        return not_testable(&check, format!("no tool taking `{}` {kind}", surface.property));
    }
    let mut parts = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let control = use_handle(ctx, &surface, tool, &minted.value, ctx.auth()).await;
        let negative = use_handle(ctx, &surface, tool, &minted.value, auth.clone()).await;
        let prelude: Vec<&Exchange> = if i == 0 { vec![&minted.exchange] } else { Vec::new() };
        parts.push((tool.name.clone(), pair(&check, &prelude, &control, &negative)));
    }
    noted(merge(&check, parts), caveat.as_deref())
}

async fn create(ctx: &Context, check: Check) -> Outcome {
    let (surface, minted) = ready!(setup(ctx, &check).await);
    let Some(tool) = surface.primary() else {
        return not_testable(&check, format!("every tool taking `{}` consumes the object", surface.property));
    };
    let control = use_handle(ctx, &surface, tool, &minted.value, ctx.auth()).await;
    let (verdict, detail) = if served(&control) {
        (
            Verdict::Pass,
            format!(
                "{} issued a handle (`{}`) that {} served to its owner",
                surface.creator, surface.property, tool.name
            ),
        )
    } else {
        (
            Verdict::Fail,
            format!(
                "{} issued a handle but {} refused it to its owner ({})",
                surface.creator,
                tool.name,
                describe(&control)
            ),
        )
    };
    let mut exchanges: Vec<&Exchange> = surface.found.iter().collect();
    exchanges.extend([&minted.exchange, &control]);
    Outcome::new(&check, verdict, detail).with(&exchanges)
}

async fn read_other_subject(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Read, Caller::Other(Other::Subject)).await
}

async fn read_other_tenant(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Read, Caller::Other(Other::Tenant)).await
}

async fn read_other_client(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Read, Caller::Other(Other::Client)).await
}

async fn read_no_token(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Read, Caller::NoToken).await
}

async fn write_other_subject(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Write, Caller::Other(Other::Subject)).await
}

async fn write_other_tenant(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Write, Caller::Other(Other::Tenant)).await
}

async fn write_other_client(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Write, Caller::Other(Other::Client)).await
}

async fn write_no_token(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Write, Caller::NoToken).await
}

/// The alphabet a handle seems drawn from and the bits each character carries.
#[derive(Debug, Clone, PartialEq)]
struct Alphabet {
    chars: Vec<char>,
}

impl Alphabet {
    /// The smallest usual alphabet holding every character of `samples`: hexadecimal (either
    /// case), digits, else the union of the classes present (lower, upper, digits, `-_`, `+/`,
    /// any other character itself).
    fn of(samples: &[&str]) -> Self {
        let all: BTreeSet<char> = samples.iter().flat_map(|sample| sample.chars()).collect();
        let range = |from: char, to: char| (from..=to).collect::<Vec<char>>();
        if !all.is_empty() && all.iter().all(char::is_ascii_digit) {
            return Self { chars: range('0', '9') };
        }
        if !all.is_empty() && all.iter().all(|c| c.is_ascii_digit() || ('a'..='f').contains(c)) {
            return Self { chars: [range('0', '9'), range('a', 'f')].concat() };
        }
        if !all.is_empty() && all.iter().all(|c| c.is_ascii_digit() || ('A'..='F').contains(c)) {
            return Self { chars: [range('0', '9'), range('A', 'F')].concat() };
        }
        let mut chars = Vec::new();
        if all.iter().any(char::is_ascii_uppercase) {
            chars.extend(range('A', 'Z'));
        }
        if all.iter().any(char::is_ascii_lowercase) {
            chars.extend(range('a', 'z'));
        }
        if all.iter().any(char::is_ascii_digit) {
            chars.extend(range('0', '9'));
        }
        if all.iter().any(|c| matches!(c, '-' | '_')) {
            chars.extend(['-', '_']);
        }
        if all.iter().any(|c| matches!(c, '+' | '/')) {
            chars.extend(['+', '/']);
        }
        chars.extend(all.iter().filter(|c| !c.is_ascii_alphanumeric() && !matches!(c, '-' | '_' | '+' | '/' | '=')));
        Self { chars }
    }

    /// Another character of the alphabet than `c` (the next one, cyclically).
    fn other_than(&self, c: char) -> Option<char> {
        let position = self.chars.iter().position(|known| *known == c).unwrap_or(0);
        let next = self.chars.get((position + 1) % self.chars.len().max(1)).copied()?;
        (next != c).then_some(next)
    }
}

/// The near misses of a handle.
#[derive(Debug, Clone, Copy)]
enum NearMiss {
    LastChar,
    FirstChar,
    Truncated,
    Appended,
    CaseFlipped,
}

/// `real` changed by `kind`, staying in its alphabet; `None` when no such change exists.
fn near_miss(real: &str, kind: NearMiss) -> Option<String> {
    let alphabet = Alphabet::of(&[real]);
    let mut chars: Vec<char> = real.chars().collect();
    match kind {
        NearMiss::LastChar => {
            let last = chars.last_mut()?;
            *last = alphabet.other_than(*last)?;
        }
        NearMiss::FirstChar => {
            let first = chars.first_mut()?;
            *first = alphabet.other_than(*first)?;
        }
        NearMiss::Truncated => {
            chars.pop()?;
            if chars.is_empty() {
                return None;
            }
        }
        NearMiss::Appended => {
            let last = *chars.last()?;
            chars.push(alphabet.other_than(last).unwrap_or(last));
        }
        NearMiss::CaseFlipped => {
            if !chars.iter().any(char::is_ascii_alphabetic) {
                return None;
            }
            for c in &mut chars {
                *c = if c.is_ascii_uppercase() { c.to_ascii_lowercase() } else { c.to_ascii_uppercase() };
            }
        }
    }
    let forged: String = chars.into_iter().collect();
    (forged != real).then_some(forged)
}

/// A random handle of `real`'s length from its alphabet; `None` when the random source fails.
fn random_like(real: &str) -> Option<String> {
    let alphabet = Alphabet::of(&[real]);
    let length = real.chars().count().max(1);
    if alphabet.chars.len() < 2 {
        let mut bytes = [0u8; 32];
        aws_lc_rs::rand::fill(&mut bytes).ok()?;
        return Some(URL_SAFE_NO_PAD.encode(bytes));
    }
    let mut bytes = vec![0u8; length * 2];
    aws_lc_rs::rand::fill(&mut bytes).ok()?;
    let size = alphabet.chars.len();
    let made: String = bytes
        .chunks(2)
        .map(|pair| {
            let index = ((usize::from(pair[0]) << 8) | usize::from(pair.get(1).copied().unwrap_or(0))) % size;
            alphabet.chars[index]
        })
        .collect();
    (made != real).then_some(made)
}

/// The owner's use with the real handle next to the owner's use with `forged` (redacted first).
async fn forged_use(ctx: &Context, check: Check, forge: impl Fn(&str) -> Option<String>, label: &str) -> Outcome {
    let (surface, minted) = ready!(setup(ctx, &check).await);
    let Some(tool) = surface.primary().cloned() else {
        return not_testable(&check, format!("every tool taking `{}` consumes the object", surface.property));
    };
    let Some(forged) = forge(&minted.value) else {
        return not_testable(&check, format!("no {label} of this handle exists (its characters do not allow one)"));
    };
    redact_handle(ctx, &forged, &format!("handle-{label}"), &mut []);
    let control = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    let negative = use_handle(ctx, &surface, &tool, &forged, ctx.auth()).await;
    pair(&check, &[&minted.exchange], &control, &negative)
}

async fn forge_random(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, random_like, "guessed").await
}

async fn forge_last_char(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, |real| near_miss(real, NearMiss::LastChar), "near-miss-last").await
}

async fn forge_first_char(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, |real| near_miss(real, NearMiss::FirstChar), "near-miss-first").await
}

async fn forge_truncated(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, |real| near_miss(real, NearMiss::Truncated), "near-miss-truncated").await
}

async fn forge_appended(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, |real| near_miss(real, NearMiss::Appended), "near-miss-appended").await
}

async fn forge_case_flipped(ctx: &Context, check: Check) -> Outcome {
    forged_use(ctx, check, |real| near_miss(real, NearMiss::CaseFlipped), "near-miss-case").await
}

async fn foreign_handle(ctx: &Context, check: Check) -> Outcome {
    if !ctx.allow_mutations {
        return not_testable(&check, NEEDS_MUTATIONS);
    }
    let (other, caveat) = match ctx.other(Other::Subject) {
        Ok(found) => (found.index, found.caveat),
        Err(why) => return not_testable(&check, why),
    };
    let (surface, _) = ready!(setup(ctx, &check).await);
    let Some(tool) = surface.primary().cloned() else {
        return not_testable(&check, format!("every tool taking `{}` consumes the object", surface.property));
    };
    let theirs = match mint(ctx, &surface, other).await {
        Ok(theirs) => theirs,
        Err(created) => {
            let detail = format!(
                "{}'s {} was not served with a handle ({})",
                name_of(ctx, other),
                surface.creator,
                describe(&created)
            );
            return inconclusive(&check, detail, &[&created]);
        }
    };
    // The control: the other identity uses its own handle; the negative: the first identity uses it.
    let control = use_handle(ctx, &surface, &tool, &theirs.value, ctx.auth_of(other)).await;
    let negative = use_handle(ctx, &surface, &tool, &theirs.value, ctx.auth()).await;
    noted(pair(&check, &[&theirs.exchange], &control, &negative), caveat.as_deref())
}

async fn other_position(ctx: &Context, check: Check) -> Outcome {
    if !ctx.allow_mutations {
        return not_testable(&check, NEEDS_MUTATIONS);
    }
    let other = match ctx.other(Other::Caller) {
        Ok(found) => found.index,
        Err(why) => return not_testable(&check, why),
    };
    let (surface, mine) = ready!(setup(ctx, &check).await);
    let Some((tool, position)) = surface.two_handles.first().cloned() else {
        return not_testable(&check, format!("no tool takes a second handle of the kind `{}` holds", surface.property));
    };
    let theirs = match mint(ctx, &surface, other).await {
        Ok(theirs) => theirs,
        Err(created) => {
            let detail = format!(
                "{}'s {} was not served with a handle ({})",
                name_of(ctx, other),
                surface.creator,
                describe(&created)
            );
            return inconclusive(&check, detail, &[&mine.exchange, &created]);
        }
    };
    let control = use_handle(ctx, &surface, &tool, &mine.value, ctx.auth()).await;
    let mut arguments = arguments(&tool, &surface.property, &mine.value);
    if let Some(arguments) = arguments.as_object_mut() {
        arguments.insert(position, json!(theirs.value));
    }
    let negative = ctx.target.send(call(&tool.name, arguments, ctx.auth())).await;
    pair(&check, &[&mine.exchange, &theirs.exchange], &control, &negative)
}

/// What a refusal is compared by: HTTP status and JSON-RPC error code, or a tool error.
fn signature(exchange: &Exchange) -> String {
    if is_tool_error(exchange) {
        return format!("HTTP {}, isError: true", exchange.status.unwrap_or_default());
    }
    let code = exchange.error_code().map_or_else(|| "no JSON-RPC error".to_owned(), |code| format!("error {code}"));
    format!("HTTP {}, {code}", exchange.status.map_or_else(|| "none".to_owned(), |status| status.to_string()))
}

/// The refusal's message (the JSON-RPC error message or the tool error's text) with the
/// handles sent replaced, so two refusals can be compared.
fn message(exchange: &Exchange, handles: &[&str]) -> String {
    let text = if is_tool_error(exchange) {
        let content = exchange.result().and_then(|result| result.get("content")).and_then(Value::as_array);
        content
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        exchange.error().and_then(|error| error.get("message")).and_then(Value::as_str).unwrap_or_default().to_owned()
    };
    handles.iter().fold(text, |text, handle| if handle.is_empty() { text } else { text.replace(handle, "<handle>") })
}

/// The refusal for the owner's handle and for a handle that does not exist, both presented by
/// identity `other`, must be the same refusal.
async fn oracle(ctx: &Context, check: Check, kind: Other) -> Outcome {
    if !ctx.allow_mutations {
        return not_testable(&check, NEEDS_MUTATIONS);
    }
    let (other, caveat) = match ctx.other(kind) {
        Ok(found) => (found.index, found.caveat),
        Err(why) => return not_testable(&check, why),
    };
    let (surface, minted) = ready!(setup(ctx, &check).await);
    let Some(tool) = surface.primary().cloned() else {
        return not_testable(&check, format!("every tool taking `{}` consumes the object", surface.property));
    };
    let Some(unknown) = random_like(&minted.value) else {
        return not_testable(&check, "no handle could be made up (the random source failed)");
    };
    redact_handle(ctx, &unknown, "handle-unknown", &mut []);
    let control = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    let foreign = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth_of(other)).await;
    let absent = use_handle(ctx, &surface, &tool, &unknown, ctx.auth_of(other)).await;
    let exchanges = [&minted.exchange, &control, &foreign, &absent];
    if !served(&control) {
        let detail = format!("positive control not served ({}): nothing to compare with", describe(&control));
        return inconclusive(&check, detail, &exchanges);
    }
    let (verdict, detail) = if served(&foreign) {
        (
            Verdict::Fail,
            format!("another identity's handle was served ({}): the object is reachable", describe(&foreign)),
        )
    } else if served(&absent) {
        (Verdict::Inconclusive, format!("a handle that does not exist was served ({})", describe(&absent)))
    } else if foreign.status.is_none() || absent.status.is_none() {
        (Verdict::Inconclusive, "no answer to one of the two refusals".to_owned())
    } else if signature(&foreign) != signature(&absent) {
        (
            Verdict::Fail,
            format!(
                "another identity's handle is refused with {}, one that does not exist with {}: the answer tells \
                 whether a handle exists",
                signature(&foreign),
                signature(&absent)
            ),
        )
    } else if message(&foreign, &[&minted.value]) != message(&absent, &[&unknown]) {
        (
            Verdict::Warning,
            format!(
                "both refused with {}, but with different messages: the text tells whether a handle exists",
                signature(&foreign)
            ),
        )
    } else {
        (Verdict::Pass, format!("both refused alike ({}); the owner's own use was served", signature(&foreign)))
    };
    noted(Outcome::new(&check, verdict, detail).with(&exchanges), caveat.as_deref())
}

async fn oracle_other_subject(ctx: &Context, check: Check) -> Outcome {
    oracle(ctx, check, Other::Subject).await
}

async fn oracle_other_tenant(ctx: &Context, check: Check) -> Outcome {
    oracle(ctx, check, Other::Tenant).await
}

/// The pieces of an object's answer a foreign refusal must not show: string values of three
/// characters or more and keys of four or more.
fn markers(value: &Value, into: &mut BTreeSet<String>) {
    match value {
        Value::String(text) if text.chars().count() >= 3 => {
            into.insert(text.clone());
        }
        Value::Array(items) => items.iter().for_each(|item| markers(item, into)),
        Value::Object(object) => {
            for (key, item) in object {
                if key.chars().count() >= 4 {
                    into.insert(format!("\"{key}\""));
                }
                markers(item, into);
            }
        }
        _ => {}
    }
}

async fn no_echo(ctx: &Context, check: Check) -> Outcome {
    if !ctx.allow_mutations {
        return not_testable(&check, NEEDS_MUTATIONS);
    }
    let other = match ctx.other(Other::Caller) {
        Ok(found) => found.index,
        Err(why) => return not_testable(&check, why),
    };
    let (surface, minted) = ready!(setup(ctx, &check).await);
    let Some(tool) = surface.read.first().cloned() else {
        return not_testable(&check, format!("no tool taking `{}` reads the object", surface.property));
    };
    // Give the object some content first, through the first changing tool (if any).
    let mut prelude = vec![minted.exchange.clone()];
    if let Some(writer) = surface.write.first() {
        prelude.push(use_handle(ctx, &surface, writer, &minted.value, ctx.auth()).await);
    }
    let Some(unknown) = random_like(&minted.value) else {
        return not_testable(&check, "no handle could be made up (the random source failed)");
    };
    redact_handle(ctx, &unknown, "handle-unknown", &mut []);
    let control = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    let foreign = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth_of(other)).await;
    let absent = use_handle(ctx, &surface, &tool, &unknown, ctx.auth_of(other)).await;
    let mut exchanges: Vec<&Exchange> = prelude.iter().collect();
    exchanges.extend([&control, &foreign, &absent]);
    if !served(&control) {
        let detail = format!("positive control not served ({}): nothing to compare with", describe(&control));
        return inconclusive(&check, detail, &exchanges);
    }
    let body = |exchange: &Exchange| exchange.frames.iter().map(Value::to_string).collect::<Vec<_>>().join("\n");
    let baseline = body(&absent);
    let mut seen = BTreeSet::new();
    if let Some(result) = control.result() {
        markers(
            &structured(result).unwrap_or_else(|| result.get("content").cloned().unwrap_or(Value::Null)),
            &mut seen,
        );
    }
    seen.retain(|marker| {
        !baseline.contains(marker.as_str()) && *marker != minted.value && !marker.contains(&surface.property)
    });
    if seen.is_empty() {
        return not_testable(&check, "the owner's answer holds no data to look for in the refusal").with(&exchanges);
    }
    let shown = body(&foreign);
    let echoed: Vec<&String> = seen.iter().filter(|marker| shown.contains(marker.as_str())).collect();
    let (verdict, detail) = if served(&foreign) {
        (Verdict::Fail, format!("another identity's use was served ({}): the object is reachable", describe(&foreign)))
    } else if !echoed.is_empty() {
        (
            Verdict::Fail,
            format!("the refusal of another identity shows {} piece(s) of the object's answer", echoed.len()),
        )
    } else {
        (
            Verdict::Pass,
            format!(
                "refused ({}) showing none of the {} piece(s) of the owner's answer",
                describe(&foreign),
                seen.len()
            ),
        )
    };
    Outcome::new(&check, verdict, detail).with(&exchanges)
}

/// The first identity creates two handles.
async fn two(ctx: &Context, check: &Check) -> Result<(Surface, Minted, Minted), Stop> {
    let (surface, first) = setup(ctx, check).await?;
    let second = mint(ctx, &surface, 0).await.map_err(|created| {
        let detail = format!("the second {} was not served with a handle ({})", surface.creator, describe(&created));
        Stop(inconclusive(check, detail, &[&first.exchange, &created]))
    })?;
    Ok((surface, first, second))
}

async fn distinct(ctx: &Context, check: Check) -> Outcome {
    let (surface, first, second) = ready!(two(ctx, &check).await);
    let (verdict, detail) = if first.value == second.value {
        (Verdict::Fail, format!("two calls of {} issued the same handle", surface.creator))
    } else {
        (Verdict::Pass, format!("two calls of {} issued two different handles", surface.creator))
    };
    Outcome::new(&check, verdict, detail).with(&[&first.exchange, &second.exchange])
}

async fn entropy(ctx: &Context, check: Check) -> Outcome {
    let (_, first, second) = ready!(two(ctx, &check).await);
    let bits = estimated_bits(&first.value).min(estimated_bits(&second.value));
    let length = first.value.chars().count();
    let size = Alphabet::of(&[&first.value, &second.value]).chars.len();
    let (verdict, detail) = if bits >= 128.0 {
        (Verdict::Pass, format!("{length} characters of a {size}-character alphabet: about {bits:.0} bits"))
    } else {
        (
            Verdict::Warning,
            format!("{length} characters of a {size}-character alphabet: about {bits:.0} bits, under 128 (guessable)"),
        )
    };
    Outcome::new(&check, verdict, detail).with(&[&first.exchange, &second.exchange])
}

async fn not_listed(ctx: &Context, check: Check) -> Outcome {
    let (_, minted) = ready!(setup(ctx, &check).await);
    let mut listings = Vec::new();
    let callers: Vec<usize> = (0..ctx.identities.len().min(2)).collect();
    for i in callers {
        for method in ["tools/list", "resources/list", "resources/templates/list", "prompts/list"] {
            listings.push((method, i, ctx.target.send(Probe::request(method, json!({}), ctx.auth_of(i))).await));
        }
    }
    let mut exchanges = vec![&minted.exchange];
    exchanges.extend(listings.iter().map(|(_, _, exchange)| exchange));
    let control = listings.first().map(|(_, _, exchange)| exchange);
    if !control.is_some_and(Exchange::accepted) {
        return inconclusive(&check, "the first identity's tools/list was not served", &exchanges);
    }
    let shown: Vec<String> = listings
        .iter()
        .filter(|(_, _, exchange)| exchange.frames.iter().any(|frame| frame.to_string().contains(&minted.value)))
        .map(|(method, i, _)| format!("{method} as {}", name_of(ctx, *i)))
        .collect();
    let (verdict, detail) = if shown.is_empty() {
        (Verdict::Pass, format!("the handle appears in none of {} listings", listings.len()))
    } else {
        (Verdict::Fail, format!("the handle appears in {}", shown.join(", ")))
    };
    Outcome::new(&check, verdict, detail).with(&exchanges)
}

/// The owner's use, then `step` (a revoke or replace call) served, then the owner's use again,
/// which must be refused.
async fn after_step(ctx: &Context, check: Check, pick: fn(&Surface) -> Option<&Tool>, what: &str) -> Outcome {
    let (surface, minted) = ready!(setup(ctx, &check).await);
    let Some(step) = pick(&surface).cloned() else {
        return not_testable(&check, format!("no tool taking `{}` {what}", surface.property));
    };
    let Some(tool) = surface.primary().cloned() else {
        return not_testable(&check, format!("every tool taking `{}` consumes the object", surface.property));
    };
    let control = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    let mut stepped = use_handle(ctx, &surface, &step, &minted.value, ctx.auth()).await;
    // A replacement may come with a new handle: a credential too.
    let replacement = stepped.result().and_then(structured);
    if let Some(new) = replacement.as_ref().and_then(|result| result.get(&surface.property)).and_then(Value::as_str) {
        redact_handle(ctx, new, &format!("handle-{}", name_of(ctx, 0)), &mut [&mut stepped]);
    }
    if !served(&stepped) {
        let detail = format!("the owner's {} was not served ({})", step.name, describe(&stepped));
        return inconclusive(&check, detail, &[&minted.exchange, &control, &stepped]);
    }
    let negative = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    pair(&check, &[&minted.exchange, &stepped], &control, &negative)
}

/// What a revoking tool is, for NOT TESTABLE details.
const REVOKES: &str = "revokes it (a close/discard/release/invalidate name; a revoke or delete one is never called)";

async fn revoked(ctx: &Context, check: Check) -> Outcome {
    after_step(ctx, check, |surface| surface.revoke.as_ref(), REVOKES).await
}

async fn replaced(ctx: &Context, check: Check) -> Outcome {
    after_step(ctx, check, |surface| surface.replace.as_ref(), "replaces the object (a replace/rotate/renew name)")
        .await
}

async fn revoke_other(ctx: &Context, check: Check) -> Outcome {
    if !ctx.allow_mutations {
        return not_testable(&check, NEEDS_MUTATIONS);
    }
    let other = match ctx.other(Other::Caller) {
        Ok(found) => found.index,
        Err(why) => return not_testable(&check, why),
    };
    let (surface, minted) = ready!(setup(ctx, &check).await);
    let Some(step) = surface.revoke.clone() else {
        return not_testable(&check, format!("no tool taking `{}` {REVOKES}", surface.property));
    };
    let Some(tool) = surface.primary().cloned() else {
        return not_testable(&check, format!("every tool taking `{}` consumes the object", surface.property));
    };
    let control = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    let negative = use_handle(ctx, &surface, &step, &minted.value, ctx.auth_of(other)).await;
    let after = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    let (judgement, odd) = match judge(&negative) {
        (Judgement::Refused, _) if !served(&after) => (
            Judgement::Accepted(format!(
                "the revocation was refused ({}), but the handle no longer serves its owner ({})",
                describe(&negative),
                describe(&after)
            )),
            Verdict::Fail,
        ),
        judged => judged,
    };
    let mut outcome = if served(&control) {
        paired(&check, &control, &negative, judgement, odd).with(&[&after])
    } else {
        let detail = format!("positive control not served ({}): nothing to compare with", describe(&control));
        inconclusive(&check, detail, &[&control, &negative, &after])
    };
    outcome.transcript.insert(0, minted.exchange.transcript.clone());
    outcome
}

/// An announced expiry in a create result, in milliseconds from now: `expiresInMs`/`ttlMs`,
/// or `expiresIn`/`expires_in`/`ttl` in seconds. (An absolute `expiresAt` would need the wall
/// clock, which the verifier does not read.)
fn announced_expiry_ms(result: &Value) -> Option<u64> {
    let number = |key: &str| result.get(key).and_then(Value::as_f64).filter(|value| *value >= 0.0);
    if let Some(ms) = number("expiresInMs").or_else(|| number("ttlMs")) {
        return Some(ms as u64);
    }
    let seconds = number("expiresIn").or_else(|| number("expires_in")).or_else(|| number("ttl"))?;
    Some((seconds * 1000.0) as u64)
}

async fn expired(ctx: &Context, check: Check) -> Outcome {
    let (surface, minted) = ready!(setup(ctx, &check).await);
    let Some(tool) = surface.primary().cloned() else {
        return not_testable(&check, format!("every tool taking `{}` consumes the object", surface.property));
    };
    let Some(wait) = announced_expiry_ms(&minted.result) else {
        return not_testable(&check, "the create result announces no relative expiry (expiresIn, expiresInMs, ttl)")
            .with(&[&minted.exchange]);
    };
    if wait > MAX_EXPIRY_WAIT_MS {
        let detail =
            format!("the handle lives {} s, longer than this run waits ({} s)", wait / 1000, MAX_EXPIRY_WAIT_MS / 1000);
        return not_testable(&check, detail).with(&[&minted.exchange]);
    }
    let control = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    tokio::time::sleep(std::time::Duration::from_millis(wait + 250)).await;
    let negative = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    pair(&check, &[&minted.exchange], &control, &negative)
}

/// The scopes a JWT bearer token claims (`scope`, space-separated, or `scp`), read without
/// verifying it: only to choose which identity lacks a scope.
fn token_scopes(token: &str) -> Option<BTreeSet<String>> {
    let mut parts = token.split('.');
    let payload = parts.nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    let words = |text: &str| text.split_whitespace().map(str::to_owned).collect::<BTreeSet<_>>();
    match (claims.get("scope"), claims.get("scp")) {
        (Some(Value::String(scope)), _) | (None, Some(Value::String(scope))) => Some(words(scope)),
        (None, Some(Value::Array(scopes))) => {
            Some(scopes.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        }
        _ => None,
    }
}

/// An identity of the first identity's subject, tenant and client whose token claims fewer
/// scopes than the first identity's.
fn fewer_scopes(ctx: &Context) -> Option<usize> {
    let first = ctx.identities.first()?;
    let owned = token_scopes(first.token.expose())?;
    ctx.identities.iter().enumerate().skip(1).find_map(|(i, other)| {
        let fits = first.subject_relation(other) == Relation::Same
            && first.tenant_relation(other) != Relation::Different
            && first.client_relation(other) != Relation::Different
            && token_scopes(other.token.expose()).is_some_and(|scopes| scopes.is_subset(&owned) && scopes != owned);
        fits.then_some(i)
    })
}

async fn scope_escalation(ctx: &Context, check: Check) -> Outcome {
    if !ctx.allow_mutations {
        return not_testable(&check, NEEDS_MUTATIONS);
    }
    let Some(lesser) = fewer_scopes(ctx) else {
        let why = "no identity of the first identity's subject, tenant and client whose token claims fewer scopes \
                   (a JWT `scope` claim that is a strict subset of the first identity's)";
        return not_testable(&check, why);
    };
    let (surface, minted) = ready!(setup(ctx, &check).await);
    let Some(tool) = surface.primary().cloned() else {
        return not_testable(&check, format!("every tool taking `{}` consumes the object", surface.property));
    };
    let control = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth()).await;
    let negative = use_handle(ctx, &surface, &tool, &minted.value, ctx.auth_of(lesser)).await;
    pair(&check, &[&minted.exchange], &control, &negative)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HANDLE: &str = "SgHyNgItGjNOOSHNGjOmqFs2XBn3tSP5Nqw45ti-g1g";

    #[test]
    fn near_misses_differ_from_the_handle_by_one_change_in_its_alphabet() {
        let last = near_miss(HANDLE, NearMiss::LastChar).unwrap();
        assert_eq!(&last[..42], &HANDLE[..42]);
        assert_ne!(last, HANDLE);
        let first = near_miss(HANDLE, NearMiss::FirstChar).unwrap();
        assert_eq!(&first[1..], &HANDLE[1..]);
        assert_ne!(first, HANDLE);
        assert_eq!(near_miss(HANDLE, NearMiss::Truncated).unwrap(), &HANDLE[..42]);
        let appended = near_miss(HANDLE, NearMiss::Appended).unwrap();
        assert_eq!(appended.len(), 44);
        assert!(appended.starts_with(HANDLE));
        let flipped = near_miss(HANDLE, NearMiss::CaseFlipped).unwrap();
        assert!(flipped.eq_ignore_ascii_case(HANDLE) && flipped != HANDLE);
        assert!(flipped.starts_with("sGhYnG"));
        // A hex handle stays hex; a digits-only one has no case to flip.
        let hex = near_miss("00ff", NearMiss::LastChar).unwrap();
        assert_eq!(hex, "00f0");
        assert_eq!(near_miss("1234", NearMiss::CaseFlipped), None);
        assert_eq!(near_miss("", NearMiss::LastChar), None);
        assert_eq!(near_miss("a", NearMiss::Truncated), None);
    }

    #[test]
    fn a_random_guess_has_the_length_and_alphabet_of_the_handle() {
        let (a, b) = (random_like(HANDLE).unwrap(), random_like(HANDLE).unwrap());
        assert_eq!(a.len(), HANDLE.len());
        assert_ne!(a, b);
        let alphabet = Alphabet::of(&[HANDLE]);
        assert!(a.chars().all(|c| alphabet.chars.contains(&c)), "{a}");
        let hex = random_like("0123456789abcdef0123456789abcdef").unwrap();
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{hex}");
    }

    #[test]
    fn tool_names_split_into_words() {
        assert_eq!(name_words("basket_create"), ["basket", "create"]);
        assert_eq!(name_words("createBasket"), ["create", "basket"]);
        assert_eq!(name_words("cart.new-v2"), ["cart", "new", "v2"]);
        let tool =
            |name: &str| Tool { name: name.into(), input: Value::Null, output: Value::Null, annotations: Value::Null };
        assert!(tool("basket_checkout").named(CONSUMING_WORDS));
        assert!(!tool("basket_add_item").named(CONSUMING_WORDS));
        assert!(!tool("append_note").named(CONSUMING_WORDS), "a word, not a substring");
        assert!(tool("basket_view").named(READ_WORDS));
    }

    #[test]
    fn required_arguments_are_filled_from_their_schemas() {
        let tool = Tool {
            name: "basket_add_item".into(),
            input: json!({ "type": "object", "required": ["sku", "quantity", "basket"], "properties": {
                "basket": { "type": "string", "minLength": 43 },
                "sku": { "type": "string", "description": "Stock-keeping unit, e.g. `TEA-001`." },
                "quantity": { "type": "integer", "minimum": 1, "maximum": 99 },
                "note": { "type": "string" } } }),
            output: Value::Null,
            annotations: Value::Null,
        };
        assert_eq!(arguments(&tool, "basket", "h"), json!({ "basket": "h", "sku": "TEA-001", "quantity": 1 }));
        assert_eq!(example(&json!({ "enum": ["a", "b"] })), json!("a"));
        assert_eq!(example(&json!({ "type": "boolean" })), json!(false));
        assert_eq!(example(&json!({ "type": "string", "minLength": 3 })), json!("xxx"));
        assert_eq!(described_example("no example here"), None);
    }

    #[test]
    fn scopes_are_read_from_a_jwt_payload_and_expiry_from_a_result() {
        let payload = URL_SAFE_NO_PAD.encode(r#"{"sub":"alice","scope":"shop:read shop:basket"}"#);
        let scopes = token_scopes(&format!("eyJhbGciOiJub25lIn0.{payload}.sig")).unwrap();
        assert_eq!(scopes.into_iter().collect::<Vec<_>>(), ["shop:basket", "shop:read"]);
        let scp = URL_SAFE_NO_PAD.encode(r#"{"scp":["a"]}"#);
        assert_eq!(token_scopes(&format!("h.{scp}.s")).unwrap().len(), 1);
        assert_eq!(token_scopes("opaque-token"), None);
        assert_eq!(announced_expiry_ms(&json!({ "expiresIn": 2 })), Some(2000));
        assert_eq!(announced_expiry_ms(&json!({ "ttlMs": 1500 })), Some(1500));
        assert_eq!(announced_expiry_ms(&json!({ "basket": "x" })), None);
    }

    #[test]
    fn refusals_include_tool_errors() {
        let exchange = |frame: Value, status: u16| Exchange::answered(json!(1), status, vec![frame]);
        let ok = exchange(json!({ "id": 1, "result": { "structuredContent": { "items": [] } } }), 200);
        let tool_error = exchange(json!({ "id": 1, "result": { "isError": true, "content": [] } }), 200);
        let rpc_error = exchange(json!({ "id": 1, "error": { "code": -32602, "message": "m" } }), 400);
        assert!(served(&ok) && !served(&tool_error) && !served(&rpc_error));
        assert_eq!(judge(&tool_error).0, Judgement::Refused);
        assert_eq!(judge(&rpc_error).0, Judgement::Refused);
        assert!(matches!(judge(&ok).0, Judgement::Accepted(_)));
        assert_ne!(signature(&tool_error), signature(&rpc_error));
        const CHECK: Check =
            Check { id: "handles.test", title: "t", requirement: "r", severity: crate::check::Severity::High };
        assert_eq!(pair(&CHECK, &[], &tool_error, &rpc_error).verdict, Verdict::Inconclusive);
        assert_eq!(pair(&CHECK, &[], &ok, &rpc_error).verdict, Verdict::Pass);
        assert_eq!(pair(&CHECK, &[], &ok, &ok).verdict, Verdict::Fail);
    }
}
