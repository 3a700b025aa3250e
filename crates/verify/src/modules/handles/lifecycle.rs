//! The handles checks of a handle's life: nothing of the object echoed, distinct, long and
//! unlisted handles, revoked, replaced and expired handles, and scope escalation.

use std::collections::BTreeSet;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::common::*;
use super::forged::{Alphabet, random_like};
use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::identity::{Other, Relation};
use crate::modules::{Context, GUESSABLE_BITS, estimated_bits};
use crate::target::{Exchange, Probe};

/// The pieces of an object's answer a foreign refusal must not show: string values of three
/// characters or more and keys of four or more.
pub(super) fn markers(value: &Value, into: &mut BTreeSet<String>) {
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

pub(super) async fn no_echo(ctx: &Context, check: Check) -> Outcome {
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
pub(super) async fn two(ctx: &Context, check: &Check) -> Result<(Surface, Minted, Minted), Stop> {
    let (surface, first) = setup(ctx, check).await?;
    let second = mint(ctx, &surface, 0).await.map_err(|created| {
        let detail = format!("the second {} was not served with a handle ({})", surface.creator, describe(&created));
        Stop(inconclusive(check, detail, &[&first.exchange, &created]))
    })?;
    Ok((surface, first, second))
}

pub(super) async fn distinct(ctx: &Context, check: Check) -> Outcome {
    let (surface, first, second) = ready!(two(ctx, &check).await);
    let (verdict, detail) = if first.value == second.value {
        (Verdict::Fail, format!("two calls of {} issued the same handle", surface.creator))
    } else {
        (Verdict::Pass, format!("two calls of {} issued two different handles", surface.creator))
    };
    Outcome::new(&check, verdict, detail).with(&[&first.exchange, &second.exchange])
}

pub(super) async fn entropy(ctx: &Context, check: Check) -> Outcome {
    let (_, first, second) = ready!(two(ctx, &check).await);
    let bits = estimated_bits(&first.value).min(estimated_bits(&second.value));
    let length = first.value.chars().count();
    let size = Alphabet::of(&[&first.value, &second.value]).chars.len();
    let (verdict, detail) = if bits >= 128.0 {
        (Verdict::Pass, format!("{length} characters of a {size}-character alphabet: about {bits:.0} bits"))
    } else if bits < GUESSABLE_BITS {
        (
            Verdict::Fail,
            format!(
                "{length} characters of a {size}-character alphabet: at most about {bits:.0} bits, under \
                 {GUESSABLE_BITS:.0} (enumerable: another caller's handle can be guessed)"
            ),
        )
    } else {
        (
            Verdict::Warning,
            format!("{length} characters of a {size}-character alphabet: about {bits:.0} bits, under 128 (guessable)"),
        )
    };
    Outcome::new(&check, verdict, detail).with(&[&first.exchange, &second.exchange])
}

pub(super) async fn not_listed(ctx: &Context, check: Check) -> Outcome {
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
pub(super) async fn after_step(
    ctx: &Context,
    check: Check,
    pick: fn(&Surface) -> Option<&Tool>,
    what: &str,
) -> Outcome {
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
pub(super) const REVOKES: &str =
    "revokes it (a close/discard/release/invalidate name; a revoke or delete one is never called)";

pub(super) async fn revoked(ctx: &Context, check: Check) -> Outcome {
    after_step(ctx, check, |surface| surface.revoke.as_ref(), REVOKES).await
}

pub(super) async fn replaced(ctx: &Context, check: Check) -> Outcome {
    after_step(ctx, check, |surface| surface.replace.as_ref(), "replaces the object (a replace/rotate/renew name)")
        .await
}

pub(super) async fn revoke_other(ctx: &Context, check: Check) -> Outcome {
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
pub(super) fn announced_expiry_ms(result: &Value) -> Option<u64> {
    let number = |key: &str| result.get(key).and_then(Value::as_f64).filter(|value| *value >= 0.0);
    if let Some(ms) = number("expiresInMs").or_else(|| number("ttlMs")) {
        return Some(ms as u64);
    }
    let seconds = number("expiresIn").or_else(|| number("expires_in")).or_else(|| number("ttl"))?;
    Some((seconds * 1000.0) as u64)
}

pub(super) async fn expired(ctx: &Context, check: Check) -> Outcome {
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
pub(super) fn token_scopes(token: &str) -> Option<BTreeSet<String>> {
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
pub(super) fn fewer_scopes(ctx: &Context) -> Option<usize> {
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

pub(super) async fn scope_escalation(ctx: &Context, check: Check) -> Outcome {
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
