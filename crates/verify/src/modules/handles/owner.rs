//! The handles checks of who may use a handle: its owner and every other identity, another
//! identity's handle, a handle in another argument, and the existence oracle.

use serde_json::{Value, json};

use super::common::*;
use super::forged::random_like;
use crate::check::{Check, Outcome, Verdict};
use crate::identity::Other;
use crate::modules::Context;
use crate::target::Exchange;

/// Which tools a role case uses.
#[derive(Debug, Clone, Copy)]
pub(super) enum Role {
    Read,
    Write,
}

/// The owner's handle used through every tool of `role` by `caller`, each next to the owner's
/// own use of the same tool.
pub(super) async fn cross(ctx: &Context, check: Check, role: Role, caller: Caller) -> Outcome {
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

pub(super) async fn create(ctx: &Context, check: Check) -> Outcome {
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

pub(super) async fn read_other_subject(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Read, Caller::Other(Other::Subject)).await
}

pub(super) async fn read_other_tenant(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Read, Caller::Other(Other::Tenant)).await
}

pub(super) async fn read_other_client(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Read, Caller::Other(Other::Client)).await
}

pub(super) async fn read_no_token(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Read, Caller::NoToken).await
}

pub(super) async fn write_other_subject(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Write, Caller::Other(Other::Subject)).await
}

pub(super) async fn write_other_tenant(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Write, Caller::Other(Other::Tenant)).await
}

pub(super) async fn write_other_client(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Write, Caller::Other(Other::Client)).await
}

pub(super) async fn write_no_token(ctx: &Context, check: Check) -> Outcome {
    cross(ctx, check, Role::Write, Caller::NoToken).await
}

pub(super) async fn foreign_handle(ctx: &Context, check: Check) -> Outcome {
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

pub(super) async fn other_position(ctx: &Context, check: Check) -> Outcome {
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
pub(super) fn signature(exchange: &Exchange) -> String {
    if is_tool_error(exchange) {
        return format!("HTTP {}, isError: true", exchange.status.unwrap_or_default());
    }
    let code = exchange.error_code().map_or_else(|| "no JSON-RPC error".to_owned(), |code| format!("error {code}"));
    format!("HTTP {}, {code}", exchange.status.map_or_else(|| "none".to_owned(), |status| status.to_string()))
}

/// The refusal's message (the JSON-RPC error message or the tool error's text) with the
/// handles sent replaced, so two refusals can be compared.
pub(super) fn message(exchange: &Exchange, handles: &[&str]) -> String {
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
pub(super) async fn oracle(ctx: &Context, check: Check, kind: Other) -> Outcome {
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

pub(super) async fn oracle_other_subject(ctx: &Context, check: Check) -> Outcome {
    oracle(ctx, check, Other::Subject).await
}

pub(super) async fn oracle_other_tenant(ctx: &Context, check: Check) -> Outcome {
    oracle(ctx, check, Other::Tenant).await
}
