//! The `access` module: what a caller is listed must agree with what it may call. Every
//! identity lists the target's tools (every page; on 2026-07-28 when the target speaks it,
//! otherwise on a 2025-era session of its own), and tools are called with empty arguments —
//! which fail the input schema of a tool with a required property, so the call stops at its
//! validation and has no effect; a tool that requires nothing would run, and is called only when
//! the one rule of [`crate::callable`] permits it, like every tool call of every module.
//!
//! - `access.tool.unlisted_callable` (FAIL): a tool listed to one identity and hidden from
//!   another must be refused to the one it is hidden from — as an unknown tool or by
//!   authorization. An invalid-params answer (the tool's own validation) or a result means the
//!   call reached the tool: a list filtered per caller is not access control. NOT TESTABLE
//!   when every identity is listed the same tools (most servers list the same for everyone).
//! - `access.tool.listed_refused` (WARNING at most): a tool listed to an identity whose call
//!   by that identity is refused by authorization rather than answered by the tool's input
//!   validation. A rule that reads the arguments legitimately lists a tool and decides when it
//!   is called, so this is a warning, never a failure; a 403 `insufficient_scope` challenge is
//!   the spec's step-up (the client may obtain the scope) and not counted.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::check::{Check, Outcome, Verdict};
use crate::modules::{Context, Module, cases, protocol_gap, sessions};
use crate::target::{Exchange, Probe};

/// Most pages of one identity's `tools/list` read.
const MAX_PAGES: usize = 20;
/// Most hidden tools called (each by the identity it is hidden from).
const MAX_HIDDEN_CALLS: usize = 12;
/// Most listed tools called per identity.
const MAX_LISTED_CALLS: usize = 8;
/// Most tools one detail names.
const MAX_NAMED: usize = 5;

/// The access module.
pub fn module() -> Module {
    Module {
        name: "access",
        exclusive: false,
        cases: cases! {
            unlisted_callable: "access.tool.unlisted_callable", "A tool listed to another identity but hidden from the caller is refused to the caller",
                "server/tools §Security Considerations: servers MUST implement proper access controls (a list filtered per caller is not one)", High;
            listed_refused: "access.tool.listed_refused", "A tool listed to the caller is not refused to it by authorization",
                "server/tools §Listing Tools: the list is what the caller may invoke (a rule reading the arguments may list a tool and refuse some calls)", Low;
        },
    }
}

/// The wire the module speaks: stateless 2026-07-28, or a 2025-era session per identity.
enum Wire {
    /// 2026-07-28: every request carries its own token.
    Current,
    /// One session per identity (`Err`: why that identity has none).
    Sessions(Vec<Result<sessions::Session, String>>),
}

impl Wire {
    /// 2026-07-28 when the target speaks it (`server/discover` served and listing it), otherwise
    /// a 2025-era session for each identity; `Err`: why the first identity can use neither.
    async fn open(ctx: &Context) -> Result<Self, String> {
        let discover = ctx.target.send(Probe::request("server/discover", json!({}), ctx.auth())).await;
        if protocol_gap(&discover).is_none() && discover.accepted() {
            return Ok(Self::Current);
        }
        let mut opened = Vec::with_capacity(ctx.identities.len());
        for index in 0..ctx.identities.len() {
            opened.push(sessions::open_session_as(ctx, index).await);
        }
        if let Some(Err(why)) = opened.first() {
            return Err(why.clone());
        }
        Ok(Self::Sessions(opened))
    }

    /// `method` with `params` as identity `index`; `Err`: why that identity has no session.
    fn probe(&self, ctx: &Context, index: usize, method: &str, params: Value) -> Result<Probe, String> {
        match self {
            Self::Current => Ok(Probe::request(method, params, ctx.auth_of(index))),
            Self::Sessions(opened) => match opened.get(index) {
                Some(Ok(session)) => {
                    Ok(sessions::legacy(method, params, ctx.auth_of(index), Some(&session.id), &session.version))
                }
                Some(Err(why)) => Err(why.clone()),
                None => Err("no such identity".into()),
            },
        }
    }

    /// Ends every session this run opened, each as its owner.
    async fn close(&self, ctx: &Context) {
        if let Self::Sessions(opened) = self {
            for (index, session) in opened.iter().enumerate() {
                if let Ok(session) = session {
                    sessions::close_as(ctx, index, session).await;
                }
            }
        }
    }

    /// The wire, as a detail says it.
    fn label(&self) -> String {
        match self {
            Self::Current => crate::target::PROTOCOL_VERSION.to_owned(),
            Self::Sessions(opened) => {
                let version = opened.iter().find_map(|session| session.as_ref().ok()).map(|s| s.version.as_str());
                format!("a {} session", version.unwrap_or(sessions::LEGACY_VERSION))
            }
        }
    }
}

/// What one identity is listed.
struct Listing {
    /// The identity's index.
    index: usize,
    /// Every tool listed (every page); `Err`: why the list was not served.
    tools: Result<Vec<Value>, String>,
    /// The exchanges that listed them.
    exchanges: Vec<Exchange>,
}

impl Listing {
    fn names(&self) -> BTreeSet<&str> {
        self.tools.iter().flatten().filter_map(|tool| tool.get("name").and_then(Value::as_str)).collect()
    }
}

/// Lists every page of `tools/list` as identity `index`.
async fn list(ctx: &Context, wire: &Wire, index: usize) -> Listing {
    let mut tools = Vec::new();
    let mut exchanges = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let params = cursor.as_ref().map_or_else(|| json!({}), |cursor| json!({ "cursor": cursor }));
        let probe = match wire.probe(ctx, index, "tools/list", params) {
            Ok(probe) => probe,
            Err(why) => return Listing { index, tools: Err(why), exchanges },
        };
        let exchange = ctx.target.send(probe).await;
        let Some(page) = exchange.result().and_then(|result| result.get("tools")).and_then(Value::as_array) else {
            let why = format!("tools/list was not served ({})", exchange.summary());
            exchanges.push(exchange);
            return Listing { index, tools: Err(why), exchanges };
        };
        tools.extend(page.iter().cloned());
        cursor = exchange.result().and_then(|r| r.get("nextCursor")).and_then(Value::as_str).map(str::to_owned);
        exchanges.push(exchange);
        if cursor.is_none() {
            break;
        }
    }
    Listing { index, tools: Ok(tools), exchanges }
}

/// Every identity's listing, in identity order.
async fn list_all(ctx: &Context, wire: &Wire) -> Vec<Listing> {
    let mut listings = Vec::with_capacity(ctx.identities.len());
    for index in 0..ctx.identities.len() {
        listings.push(list(ctx, wire, index).await);
    }
    listings
}

/// How a `tools/call` was answered, as these checks read it (each with a short account).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// The call reached the tool: a result, or an invalid-params error of its input validation.
    Reached(String),
    /// Refused by authorization: HTTP 401 or 403, -32033, or an error saying forbidden or denied.
    Forbidden(String),
    /// A 403 `insufficient_scope` challenge: the spec's step-up, the client may obtain the scope.
    StepUp(String),
    /// Refused as an unknown tool: -32601, or an error or tool error saying unknown or not found.
    Unknown(String),
    /// Another error: nothing tells whether the call reached the tool.
    Unclear(String),
}

/// Words of an error (or a tool error) that refuse the caller by authorization.
const FORBIDDEN_WORDS: &[&str] = &["forbidden", "denied", "unauthori", "not permitted", "not allowed", "permission"];
/// Words that, beside the word `tool`, call the tool unknown.
const UNKNOWN_WORDS: &[&str] = &["unknown", "not found", "no such", "not exist", "doesn't exist", "not registered"];

fn says(text: &str, words: &[&str]) -> bool {
    words.iter().any(|word| text.contains(word))
}

/// The text of a JSON-RPC error (message and data) or of a tool result's content, lower case,
/// without the tool's own name and its properties' names (a tool named `find_unknown` or a
/// property named `permission` says nothing about the answer), white space collapsed.
fn text_of(value: Option<&Value>, tool: &Value) -> String {
    let Some(value) = value else { return String::new() };
    let mut text = String::new();
    for key in ["message", "data"] {
        match value.get(key) {
            Some(Value::String(s)) => text.push_str(s),
            Some(other) => text.push_str(&other.to_string()),
            None => {}
        }
        text.push(' ');
    }
    for item in value.get("content").and_then(Value::as_array).into_iter().flatten() {
        text.push_str(item.get("text").and_then(Value::as_str).unwrap_or_default());
        text.push(' ');
    }
    let mut text = text.to_lowercase();
    let properties = tool.pointer("/inputSchema/properties").and_then(Value::as_object);
    let mut own: Vec<String> = properties.into_iter().flat_map(|p| p.keys()).map(|k| k.to_lowercase()).collect();
    own.extend(tool.get("name").and_then(Value::as_str).map(str::to_lowercase));
    own.sort_by_key(|name| std::cmp::Reverse(name.len()));
    for name in own.iter().filter(|name| !name.is_empty()) {
        text = text.replace(name.as_str(), " ");
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The [`Answer`] of a `tools/call` of `tool` (its listing); `None` when no answer came.
fn read(exchange: &Exchange, tool: &Value) -> Option<Answer> {
    let status = exchange.status?;
    let summary = exchange.summary();
    let unknown = |text: &str| text.contains("tool") && says(text, UNKNOWN_WORDS);
    if let Some(result) = exchange.result() {
        if result.get("isError") != Some(&json!(true)) {
            return Some(Answer::Reached(format!("served: {summary}")));
        }
        let text = text_of(Some(result), tool);
        return Some(if unknown(&text) {
            Answer::Unknown(format!("a tool error calling the tool unknown: {summary}"))
        } else if says(&text, FORBIDDEN_WORDS) {
            Answer::Forbidden(format!("a tool error refusing the caller: {summary}"))
        } else {
            Answer::Reached(format!("a tool error of the tool itself: {summary}"))
        });
    }
    let text = text_of(exchange.error(), tool);
    let challenge = exchange.header("www-authenticate").unwrap_or_default().to_ascii_lowercase();
    if status == 403 && (challenge.contains("insufficient_scope") || text.contains("insufficient scope")) {
        return Some(Answer::StepUp(format!("a scope challenge: {summary}")));
    }
    let code = exchange.error_code();
    Some(match code {
        _ if status == 401 || status == 403 || code == Some(-32033) => Answer::Forbidden(summary),
        Some(-32601) => Answer::Unknown(summary),
        _ if unknown(&text) => Answer::Unknown(format!("{summary}, calling the tool unknown")),
        _ if says(&text, FORBIDDEN_WORDS) => Answer::Forbidden(format!("{summary}, refusing the caller")),
        Some(-32602) => Answer::Reached(format!("the tool's input validation: {summary}")),
        _ => Answer::Unclear(summary),
    })
}

/// A tool's required properties (its input schema's `required`).
fn required(tool: &Value) -> Vec<String> {
    let names = tool.pointer("/inputSchema/required").and_then(Value::as_array);
    names.into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
}

/// The arguments every call sends, as a detail says them for `tool`.
fn arguments_said(tool: &Value) -> String {
    match required(tool).first() {
        Some(first) => {
            format!("empty arguments, failing its input schema (`{}` is required)", crate::escape::visible(first))
        }
        None => "empty arguments (it requires none, so it runs; the callable rule permits it)".into(),
    }
}

/// `tools/call` of `name` with empty arguments as identity `index`.
async fn call(ctx: &Context, wire: &Wire, index: usize, name: &str) -> Result<Exchange, String> {
    let probe = wire.probe(ctx, index, "tools/call", json!({ "name": name, "arguments": {} }))?;
    Ok(ctx.target.send(probe).await)
}

fn name_of(ctx: &Context, index: usize) -> String {
    ctx.identities.get(index).map_or_else(|| format!("identity {index}"), |identity| identity.name.clone())
}

fn tool_name(tool: &Value) -> String {
    crate::escape::visible(tool.get("name").and_then(Value::as_str).unwrap_or_default()).into_owned()
}

/// The first `MAX_NAMED` of `items`, joined, with how many more.
fn named(items: &[String]) -> String {
    let mut text = items.iter().take(MAX_NAMED).cloned().collect::<Vec<_>>().join("; ");
    if items.len() > MAX_NAMED {
        text.push_str(&format!("; and {} more", items.len() - MAX_NAMED));
    }
    text
}

/// `n` and the singular or plural words.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn not_testable(check: &Check, why: impl Into<String>) -> Outcome {
    Outcome::new(check, Verdict::NotTestable, why)
}

/// Opens the wire and lists every identity's tools; `Err`: the check's outcome when the wire
/// cannot be opened (NOT TESTABLE) or the first identity is listed nothing (INCONCLUSIVE), the
/// sessions closed again.
async fn open_and_list(ctx: &Context, check: &Check) -> Result<(Wire, Vec<Listing>), Outcome> {
    let wire = Wire::open(ctx).await.map_err(|why| not_testable(check, why))?;
    let listings = list_all(ctx, &wire).await;
    if let Some(Listing { tools: Err(why), exchanges, .. }) = listings.first() {
        let detail = format!("{why} as {}: nothing to compare", name_of(ctx, 0));
        let outcome = Outcome::new(check, Verdict::Inconclusive, detail).with(&exchanges.iter().collect::<Vec<_>>());
        wire.close(ctx).await;
        return Err(outcome);
    }
    Ok((wire, listings))
}

async fn unlisted_callable(ctx: &Context, check: Check) -> Outcome {
    let (wire, listings) = match open_and_list(ctx, &check).await {
        Ok(opened) => opened,
        Err(outcome) => return outcome,
    };
    let outcome = judge_unlisted(ctx, &check, &wire, &listings).await;
    wire.close(ctx).await;
    outcome
}

/// A tool listed to `shown` and hidden from `hidden`.
struct Hidden<'a> {
    hidden: usize,
    shown: usize,
    tool: &'a Value,
}

async fn judge_unlisted(ctx: &Context, check: &Check, wire: &Wire, listings: &[Listing]) -> Outcome {
    let served: Vec<&Listing> = listings.iter().filter(|listing| listing.tools.is_ok()).collect();
    if served.len() < 2 {
        let refused: Vec<String> = listings
            .iter()
            .filter_map(|l| l.tools.as_ref().err().map(|why| format!("{}: {why}", name_of(ctx, l.index))))
            .collect();
        return not_testable(check, format!("tools/list was served to one identity only ({})", named(&refused)));
    }
    let mut hidden: Vec<Hidden> = Vec::new();
    for x in &served {
        let names = x.names();
        for y in served.iter().filter(|y| y.index != x.index) {
            for tool in y.tools.iter().flatten() {
                let Some(name) = tool.get("name").and_then(Value::as_str) else { continue };
                let seen = hidden.iter().any(|h| h.hidden == x.index && h.tool.get("name") == tool.get("name"));
                if !names.contains(name) && !seen {
                    hidden.push(Hidden { hidden: x.index, shown: y.index, tool });
                }
            }
        }
    }
    let counts: Vec<String> =
        served.iter().map(|l| format!("{} {}", name_of(ctx, l.index), l.tools.as_ref().map_or(0, Vec::len))).collect();
    if hidden.is_empty() {
        return not_testable(
            check,
            format!(
                "every identity is listed the same tools ({}, on {}): no tool is hidden from one identity and shown \
                 to another, so list filtering cannot be told from access control here",
                counts.join(", "),
                wire.label()
            ),
        );
    }
    // The hidden tools the one rule lets a check call, those that fail their schema first.
    let mut refused_by_rule = Vec::new();
    let mut candidates: Vec<(&Hidden, crate::callable::CallableTool)> = Vec::new();
    for entry in &hidden {
        match ctx.permit(entry.tool) {
            Ok(callable) => candidates.push((entry, callable)),
            Err(why) => refused_by_rule.push(why.to_string()),
        }
    }
    if candidates.is_empty() {
        let examples: Vec<String> = hidden
            .iter()
            .map(|h| {
                format!(
                    "{} (listed to {}, not to {})",
                    tool_name(h.tool),
                    name_of(ctx, h.shown),
                    name_of(ctx, h.hidden)
                )
            })
            .collect();
        return not_testable(
            check,
            format!(
                "{} hidden from one identity and listed to another ({}), but the callable rule permits calling none \
                 of them: {}",
                count(hidden.len(), "tool is", "tools are"),
                named(&examples),
                refused_by_rule.first().map(String::as_str).unwrap_or_default()
            ),
        );
    }
    candidates.sort_by_key(|(entry, _)| required(entry.tool).is_empty());
    candidates.truncate(MAX_HIDDEN_CALLS);
    // Listed again as each identity a tool is hidden from: a list that changed meanwhile (a
    // tool added while the run listed) hides nothing.
    let mut relisted: Vec<Listing> = Vec::new();
    for index in candidates.iter().map(|(entry, _)| entry.hidden).collect::<BTreeSet<_>>() {
        relisted.push(list(ctx, wire, index).await);
    }
    let listing_of = |index: usize| listings.iter().find(|l| l.index == index);
    let mut refusals = Vec::new();
    let mut unclear = Vec::new();
    let mut evidence: Vec<Exchange> = Vec::new();
    for (entry, callable) in &candidates {
        let again = relisted.iter().find(|l| l.index == entry.hidden);
        if again.is_none_or(|l| l.tools.is_err() || l.names().contains(callable.name())) {
            continue;
        }
        let (x, y) = (name_of(ctx, entry.hidden), name_of(ctx, entry.shown));
        let tool = crate::escape::visible(callable.name()).into_owned();
        let exchange = match call(ctx, wire, entry.hidden, callable.name()).await {
            Ok(exchange) => exchange,
            Err(why) => {
                unclear.push(format!("{tool} as {x}: {why}"));
                continue;
            }
        };
        match read(&exchange, entry.tool) {
            Some(Answer::Reached(what)) => {
                let detail = format!(
                    "{tool} is listed to {y} but not to {x}, yet {x}'s call with {} reached the tool ({what}): a list \
                     filtered per caller is not access control; the call must be refused like an unknown tool or by \
                     authorization",
                    arguments_said(entry.tool)
                );
                let mut shown: Vec<&Exchange> = Vec::new();
                shown.extend(again.map(|l| l.exchanges.iter()).into_iter().flatten());
                shown.extend(listing_of(entry.shown).map(|l| l.exchanges.iter()).into_iter().flatten());
                shown.push(&exchange);
                return Outcome::new(check, Verdict::Fail, detail).with(&shown);
            }
            Some(Answer::Forbidden(what) | Answer::StepUp(what) | Answer::Unknown(what)) => {
                refusals.push(format!("{tool} to {x} ({what})"));
            }
            Some(Answer::Unclear(what)) => unclear.push(format!("{tool} as {x}: {what}")),
            None => unclear.push(format!("{tool} as {x}: {}", exchange.summary())),
        }
        evidence.push(exchange);
    }
    let mut shown: Vec<&Exchange> = listings.iter().flat_map(|l| l.exchanges.first()).collect();
    shown.extend(evidence.iter());
    if refusals.is_empty() {
        let detail = if unclear.is_empty() {
            "every hidden tool was listed again by the time it was called: the lists changed during the run".to_owned()
        } else {
            format!(
                "no call of a hidden tool was answered in a way that tells a refusal from the tool's own answer: {}",
                named(&unclear)
            )
        };
        return Outcome::new(check, Verdict::Inconclusive, detail).with(&shown);
    }
    let mut detail = format!(
        "{} hidden from an identity and listed to another (on {}; listed: {}) called by the identity they are \
         hidden from, with empty arguments; each was refused: {}",
        count(refusals.len(), "tool", "tools"),
        wire.label(),
        counts.join(", "),
        named(&refusals)
    );
    if !unclear.is_empty() {
        detail.push_str(&format!("; not judged: {}", named(&unclear)));
    }
    Outcome::new(check, Verdict::Pass, detail).with(&shown)
}

async fn listed_refused(ctx: &Context, check: Check) -> Outcome {
    let (wire, listings) = match open_and_list(ctx, &check).await {
        Ok(opened) => opened,
        Err(outcome) => return outcome,
    };
    let outcome = judge_listed(ctx, &check, &wire, &listings).await;
    wire.close(ctx).await;
    outcome
}

async fn judge_listed(ctx: &Context, check: &Check, wire: &Wire, listings: &[Listing]) -> Outcome {
    let mut findings = Vec::new();
    let mut reached = Vec::new();
    let mut step_ups = Vec::new();
    let mut unclear = Vec::new();
    let mut not_callable = Vec::new();
    // Every refused call with its identity's listing; of the others, the first few.
    let mut evidence: Vec<Exchange> = Vec::new();
    let mut called = 0;
    for listing in listings {
        let Ok(tools) = &listing.tools else { continue };
        let who = name_of(ctx, listing.index);
        let mut candidates = Vec::new();
        for tool in tools {
            match ctx.permit(tool) {
                Ok(callable) => candidates.push((tool, callable)),
                Err(why) => not_callable.push(why.to_string()),
            }
        }
        candidates.sort_by_key(|(tool, _)| required(tool).is_empty());
        let mut listing_shown = false;
        for (tool, callable) in candidates.into_iter().take(MAX_LISTED_CALLS) {
            let name = crate::escape::visible(callable.name()).into_owned();
            let exchange = match call(ctx, wire, listing.index, callable.name()).await {
                Ok(exchange) => exchange,
                Err(why) => {
                    unclear.push(format!("{name} as {who}: {why}"));
                    continue;
                }
            };
            called += 1;
            let refused = match read(&exchange, tool) {
                Some(Answer::Reached(_)) => {
                    reached.push(format!("{name} as {who}"));
                    false
                }
                Some(Answer::Forbidden(what)) => {
                    findings.push(format!("{name} to {who} with {} ({what})", arguments_said(tool)));
                    true
                }
                Some(Answer::Unknown(what)) => {
                    findings.push(format!("{name} to {who}, refused as an unknown tool though listed ({what})"));
                    true
                }
                Some(Answer::StepUp(what)) => {
                    step_ups.push(format!("{name} to {who} ({what})"));
                    false
                }
                Some(Answer::Unclear(what)) => {
                    unclear.push(format!("{name} as {who}: {what}"));
                    false
                }
                None => {
                    unclear.push(format!("{name} as {who}: {}", exchange.summary()));
                    false
                }
            };
            if refused || evidence.len() < 4 {
                if !listing_shown {
                    evidence.extend(listing.exchanges.iter().cloned());
                    listing_shown = true;
                }
                evidence.push(exchange);
            }
        }
    }
    let shown: Vec<&Exchange> = evidence.iter().collect();
    if called == 0 {
        let why = not_callable.first().map_or_else(
            || "no identity is listed any tool".to_owned(),
            |why| format!("the callable rule permits calling no listed tool ({why})"),
        );
        return not_testable(check, why);
    }
    let step_note = if step_ups.is_empty() {
        String::new()
    } else {
        format!("; answered with a scope challenge (the spec's step-up, not counted): {}", named(&step_ups))
    };
    if !findings.is_empty() {
        let detail = format!(
            "{} refused by authorization, not answered by the tool's input validation, though the caller is listed \
             it, on {}: {}. This may be a rule that reads the arguments (it lists the tool and decides when it is \
             called); otherwise the list shows tools the caller may not use{step_note}",
            count(findings.len(), "listed tool was", "listed tools were"),
            wire.label(),
            named(&findings)
        );
        return Outcome::new(check, Verdict::Warning, detail).with(&shown);
    }
    if reached.is_empty() {
        let detail = format!(
            "no call of a listed tool was answered in a way that tells authorization from the tool's own answer: {}{step_note}",
            named(&unclear)
        );
        return Outcome::new(check, Verdict::Inconclusive, detail).with(&shown);
    }
    let mut detail = format!(
        "{} by the identities they are listed to, with empty arguments, on {}: each reached the tool (a result or \
         its input validation), none was refused by authorization: {}{step_note}",
        count(reached.len(), "listed tool called", "listed tools called"),
        wire.label(),
        named(&reached)
    );
    if !unclear.is_empty() {
        detail.push_str(&format!("; not judged: {}", named(&unclear)));
    }
    Outcome::new(check, Verdict::Pass, detail).with(&shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16, frame: Value) -> Exchange {
        Exchange::answered(json!(1), status, vec![frame])
    }

    fn error(status: u16, code: i64, message: &str) -> Exchange {
        answered(status, json!({ "jsonrpc": "2.0", "id": 1, "error": { "code": code, "message": message } }))
    }

    fn tool_error(text: &str) -> Exchange {
        answered(
            200,
            json!({ "jsonrpc": "2.0", "id": 1, "result": { "isError": true, "content": [{ "type": "text", "text": text }] } }),
        )
    }

    fn kind(exchange: &Exchange) -> &'static str {
        kind_for(exchange, &json!({ "name": "report_view", "inputSchema": { "type": "object" } }))
    }

    fn kind_for(exchange: &Exchange, tool: &Value) -> &'static str {
        match read(exchange, tool) {
            Some(Answer::Reached(_)) => "reached",
            Some(Answer::Forbidden(_)) => "forbidden",
            Some(Answer::StepUp(_)) => "step-up",
            Some(Answer::Unknown(_)) => "unknown",
            Some(Answer::Unclear(_)) => "unclear",
            None => "none",
        }
    }

    #[test]
    fn a_call_reached_the_tool_or_was_refused_by_authorization_or_as_unknown() {
        // What reaches the tool: a result, its validation as -32602 or as a tool error.
        let result = answered(200, json!({ "jsonrpc": "2.0", "id": 1, "result": { "content": [] } }));
        assert_eq!(kind(&result), "reached");
        assert_eq!(kind(&error(400, -32602, "invalid params: 'query' is a required property")), "reached");
        assert_eq!(kind(&tool_error("invalid arguments: /required")), "reached");
        assert_eq!(kind(&tool_error("Input validation error: 'a' is a required property")), "reached");
        // Unknown tools, as -32602 (the spec's), -32601 or a tool error (some SDKs).
        assert_eq!(kind(&error(400, -32602, "invalid params: unknown tool")), "unknown");
        assert_eq!(kind(&error(200, -32601, "method not found")), "unknown");
        assert_eq!(kind(&tool_error("Unknown tool: report_view")), "unknown");
        assert_eq!(kind(&error(200, -32000, "Tool not found: x")), "unknown");
        // Authorization: 401/403, the operator-policy code, or an error saying so.
        assert_eq!(kind(&error(403, -32600, "forbidden")), "forbidden");
        assert_eq!(kind(&error(200, -32033, "refused by operator policy")), "forbidden");
        assert_eq!(kind(&error(200, -32000, "Access denied for team")), "forbidden");
        assert_eq!(kind(&tool_error("permission denied")), "forbidden");
        // A scope challenge is the spec's step-up, told apart from a plain 403.
        let mut challenge = error(403, -32600, "insufficient scope");
        challenge.headers.push(("www-authenticate".into(), "Bearer error=\"insufficient_scope\", scope=\"x\"".into()));
        assert_eq!(kind(&challenge), "step-up");
        // The tool's own name and its properties' names say nothing about the answer.
        let tool = json!({ "name": "find_unknown_tool", "inputSchema": { "type": "object",
            "properties": { "permission": { "type": "string" } }, "required": ["permission"] } });
        assert_eq!(kind_for(&error(400, -32602, "invalid params: permission is required"), &tool), "reached");
        assert_eq!(kind_for(&tool_error("find_unknown_tool: `permission` missing"), &tool), "reached");
        assert_eq!(kind_for(&error(400, -32602, "unknown tool: find_unknown_tool"), &tool), "unknown");
        // A tool's own "not found" (of what it looks up) is the tool answering.
        assert_eq!(kind(&tool_error("Product not found")), "reached");
        // Anything else tells nothing, and no answer is none.
        assert_eq!(kind(&error(500, -32603, "internal error")), "unclear");
        assert_eq!(kind(&error(400, -32021, "missing required client capability")), "unclear");
        assert_eq!(kind(&Exchange::unanswered(json!(1))), "none");
    }

    #[test]
    fn the_arguments_are_said_as_failing_the_schema_or_running_the_tool() {
        let strict = json!({ "name": "v", "inputSchema": { "type": "object", "required": ["report"] } });
        assert!(arguments_said(&strict).contains("`report` is required"));
        let open = json!({ "name": "v", "inputSchema": { "type": "object" } });
        assert!(arguments_said(&open).contains("it requires none, so it runs"));
        assert_eq!(named(&["a".into(), "b".into()]), "a; b");
        let many: Vec<String> = (0..7).map(|i| i.to_string()).collect();
        assert_eq!(named(&many), "0; 1; 2; 3; 4; and 2 more");
    }
}
