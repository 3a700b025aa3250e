//! The 2025-era session module (seed 004): on the 2025-11-25 wire (`initialize`, then
//! `Mcp-Session-Id` on every request), a session id must never stand for an identity. The first
//! identity opens a session; its own `tools/list` in that session is every case's positive
//! control; the same id presented with another identity's token, another tenant's or client's,
//! no token, a made-up or near-miss id, another identity's `DELETE`, and the id after its owner's
//! `DELETE` must all be refused. Session ids are credentials too: each one (real, made up or
//! near-miss) is added to the run's redactor, so no output shows it.
//!
//! Opening a session and deleting one's own are allowed without `--allow-mutations`: they are
//! the protocol's handshake and its cleanup, and change nothing the target serves to others.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use crate::check::{Check, Judgement, Outcome, Verdict, paired};
use crate::identity::Other;
use crate::modules::{Context, Module, cases};
use crate::target::{Auth, Exchange, Probe};

/// How a sessions check's detail begins when the target does not speak the 2025-era session
/// wire: the run then says so in one line ([`crate::report::Report::session_wire`]).
pub const UNSPOKEN: &str = "the target does not speak the 2025-era session wire";

/// The revision the session probes ask for at `initialize`.
pub const LEGACY_VERSION: &str = "2025-11-25";

/// Session ids shorter than this are not added to the redactor (redacting a one- or
/// two-character string would garble every transcript; such an id is no secret anyway).
const MIN_REDACTED_ID: usize = 8;

/// The sessions module.
pub fn module() -> Module {
    Module {
        name: "sessions",
        exclusive: false,
        cases: cases! {
            open: "sessions.open", "initialize on 2025-11-25 issues a session id its owner can use",
                "2025-11-25 transports §Session Management; seed 004 (2025-era wire)", Low;
            other_identity: "sessions.other_identity", "A session id presented with another identity's token is refused",
                "2025-11-25 security best practices §Session Hijacking: sessions MUST NOT be used for authentication", Critical;
            other_tenant: "sessions.other_tenant", "A session id presented with another tenant's token is refused",
                "seed 004: a session is bound to its principal (subject, client, tenant)", Critical;
            other_client: "sessions.other_client", "A session id presented with another client's token is refused",
                "seed 004: a session is bound to its principal (subject, client, tenant)", Critical;
            no_token: "sessions.no_token", "A session id presented with no token is refused",
                "2025-11-25 authorization §Token Requirements: every request carries the token", Critical;
            unknown: "sessions.unknown", "A made-up session id is refused with 404",
                "2025-11-25 transports §Session Management (404 for an id that is not a live session)", High;
            near_miss: "sessions.near_miss", "The session id with its last character changed is refused with 404",
                "2025-11-25 transports §Session Management; security best practices §Session Hijacking", High;
            delete_other: "sessions.delete.other_identity", "Another identity's DELETE of a session is refused and the session survives",
                "2025-11-25 transports §Session Management (DELETE); seed 004", Critical;
            after_delete: "sessions.after_delete", "After its owner's DELETE the session id is refused with 404",
                "2025-11-25 transports §Session Management: a terminated session's id gets 404", High;
        },
    }
}

/// A session the first identity opened, and the exchanges that opened it.
pub(crate) struct Session {
    pub(crate) id: String,
    pub(crate) version: String,
    pub(crate) opened: Vec<Exchange>,
}

/// A 2025-era request: no 2026 `_meta`, no `Mcp-Method`/`Mcp-Name`, the session's version
/// header and, when given, its session id.
pub(crate) fn legacy(method: &str, params: Value, auth: Auth, session: Option<&str>, version: &str) -> Probe {
    let mut probe = Probe::request(method, params, auth)
        .header("mcp-protocol-version", version)
        .without("mcp-method")
        .without("mcp-name");
    if let Some(params) = probe.params.as_object_mut() {
        params.remove("_meta");
    }
    match session {
        Some(id) => probe.header("mcp-session-id", id),
        None => probe,
    }
}

/// Adds a session id to the run's redactor (and redacts what was written before it was known).
fn redact_id(ctx: &Context, id: &str, name: &str, exchanges: &mut [Exchange]) {
    if id.len() >= MIN_REDACTED_ID {
        ctx.target.redactor().add(id, name);
    }
    for exchange in exchanges {
        exchange.transcript = ctx.target.redactor().redact(&exchange.transcript);
    }
}

/// Whether the 2025-era wire opens a session for a request with no token at all: `Some` says
/// what `initialize` without a token got (the session it opened is deleted again, its id
/// redacted). The no-authentication root cause on a target that speaks only that wire.
pub(crate) async fn opened_without_token(ctx: &Context) -> Option<String> {
    let params = json!({
        "protocolVersion": LEGACY_VERSION,
        "capabilities": {},
        "clientInfo": { "name": "palisade-verify", "version": env!("CARGO_PKG_VERSION") }
    });
    let mut initialize = [ctx.target.send(legacy("initialize", params, Auth::None, None, LEGACY_VERSION)).await];
    let id = initialize[0].header("mcp-session-id").map(str::to_owned);
    let id = id.filter(|_| initialize[0].accepted())?;
    redact_id(ctx, &id, "session-without-token", &mut initialize);
    let said = format!("initialize without a token on the {LEGACY_VERSION} wire: {}", initialize[0].summary());
    // Best effort: the session was the verifier's own.
    let _ = ctx.target.send(delete(Auth::None, &id, LEGACY_VERSION)).await;
    Some(said)
}

/// Opens a session as the first identity: `initialize`, then `notifications/initialized`.
/// `Err` says why the target cannot be tested on the session wire.
pub(crate) async fn open_session(ctx: &Context) -> Result<Session, String> {
    open_session_as(ctx, 0).await
}

/// Opens a session as identity `index` (its owner), like [`open_session`].
pub(crate) async fn open_session_as(ctx: &Context, index: usize) -> Result<Session, String> {
    let params = json!({
        "protocolVersion": LEGACY_VERSION,
        "capabilities": {},
        "clientInfo": { "name": "palisade-verify", "version": env!("CARGO_PKG_VERSION") }
    });
    let auth = ctx.auth_of(index);
    let initialize = ctx.target.send(legacy("initialize", params, auth.clone(), None, LEGACY_VERSION)).await;
    if !initialize.accepted() {
        return Err(format!("{UNSPOKEN}: initialize refused ({})", initialize.summary()));
    }
    let Some(id) = initialize.header("mcp-session-id").map(str::to_owned) else {
        return Err("initialize was served without an Mcp-Session-Id: the target issues no sessions".into());
    };
    let owner = ctx.identities.get(index).map_or("owner", |identity| identity.name.as_str());
    let mut opened = vec![initialize];
    redact_id(ctx, &id, &format!("session-{owner}"), &mut opened);
    let version = opened[0]
        .result()
        .and_then(|result| result.get("protocolVersion"))
        .and_then(Value::as_str)
        .filter(|version| version.starts_with("2024-") || version.starts_with("2025-"))
        .unwrap_or(LEGACY_VERSION)
        .to_owned();
    let body = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }).to_string().into_bytes();
    let initialized = legacy("notifications/initialized", json!({}), auth, Some(&id), &version).body(body);
    opened.push(ctx.target.send(initialized).await);
    Ok(Session { id, version, opened })
}

/// Ends the session as its owner (the protocol's cleanup; the answer does not matter).
pub(crate) async fn close(ctx: &Context, session: &Session) {
    close_as(ctx, 0, session).await;
}

/// Ends identity `index`'s session as that identity, like [`close`].
pub(crate) async fn close_as(ctx: &Context, index: usize, session: &Session) {
    ctx.target.send(delete(ctx.auth_of(index), &session.id, &session.version)).await;
}

/// `DELETE` of the session `id` with `auth`.
fn delete(auth: Auth, id: &str, version: &str) -> Probe {
    legacy("session/delete", json!({}), auth, Some(id), version).http_method(reqwest::Method::DELETE)
}

/// `tools/list` in session `id` with `auth`.
fn list(auth: Auth, id: &str, version: &str) -> Probe {
    legacy("tools/list", json!({}), auth, Some(id), version)
}

fn not_testable(check: &Check, why: impl Into<String>) -> Outcome {
    Outcome::new(check, Verdict::NotTestable, why)
}

/// A refused request is a JSON-RPC error or a 4xx, never a `result`. `expected`: the status the
/// spec requires (another refusal is a WARNING); no answer at all is inconclusive.
fn judge(negative: &Exchange, expected: Option<u16>) -> (Judgement, Verdict) {
    if negative.accepted() {
        let why = format!("served ({}): the session id was honoured for the wrong caller", negative.summary());
        return (Judgement::Accepted(why), Verdict::Fail);
    }
    let Some(status) = negative.status else {
        return (Judgement::RefusedOddly(format!("no answer ({})", negative.summary())), Verdict::Inconclusive);
    };
    let refused = (400..500).contains(&status) || negative.error().is_some();
    match expected {
        _ if !refused => {
            (Judgement::RefusedOddly(format!("neither served nor refused ({})", negative.summary())), Verdict::Warning)
        }
        Some(code) if code != status => (
            Judgement::RefusedOddly(format!("refused, but with {} ({code} expected)", negative.summary())),
            Verdict::Warning,
        ),
        _ => (Judgement::Refused, Verdict::Warning),
    }
}

/// The outcome of `paired`, with the exchanges that opened the session written first.
fn outcome(
    check: &Check,
    session: &Session,
    control: &Exchange,
    negative: &Exchange,
    expected: Option<u16>,
) -> Outcome {
    let (judgement, odd) = judge(negative, expected);
    let mut outcome = paired(check, control, negative, judgement, odd);
    outcome.transcript.splice(0..0, session.opened.iter().map(|exchange| exchange.transcript.clone()));
    outcome
}

/// Opens a session, runs its control, sends `negative(session)` and judges it; the session is
/// closed by its owner after.
async fn against(ctx: &Context, check: Check, auth: Auth, expected: Option<u16>) -> Outcome {
    let session = match open_session(ctx).await {
        Ok(session) => session,
        Err(why) => return not_testable(&check, why),
    };
    let control = ctx.target.send(list(ctx.auth(), &session.id, &session.version)).await;
    let negative = ctx.target.send(list(auth, &session.id, &session.version)).await;
    close(ctx, &session).await;
    outcome(&check, &session, &control, &negative, expected)
}

async fn open(ctx: &Context, check: Check) -> Outcome {
    let session = match open_session(ctx).await {
        Ok(session) => session,
        Err(why) => return not_testable(&check, why),
    };
    let control = ctx.target.send(list(ctx.auth(), &session.id, &session.version)).await;
    close(ctx, &session).await;
    let (verdict, detail) = if control.accepted() {
        (Verdict::Pass, format!("a session was opened on {} and served its owner's tools/list", session.version))
    } else {
        (
            Verdict::Fail,
            format!("a session id was issued but its owner's tools/list was not served ({})", control.summary()),
        )
    };
    let mut outcome = Outcome::new(&check, verdict, detail).with(&[&control]);
    outcome.transcript.splice(0..0, session.opened.iter().map(|exchange| exchange.transcript.clone()));
    outcome
}

async fn other_identity(ctx: &Context, check: Check) -> Outcome {
    match ctx.other(Other::Caller) {
        Ok(found) => against(ctx, check, ctx.auth_of(found.index), None).await,
        Err(why) => not_testable(&check, why),
    }
}

async fn other_tenant(ctx: &Context, check: Check) -> Outcome {
    match ctx.other(Other::Tenant) {
        Ok(found) => against(ctx, check, ctx.auth_of(found.index), None).await,
        Err(why) => not_testable(&check, why),
    }
}

/// Another client's token (any identity whose declared client differs: a session is its
/// client's whoever the subject is).
async fn other_client(ctx: &Context, check: Check) -> Outcome {
    let first = ctx.identities.first();
    let other = ctx.identities.iter().enumerate().skip(1).find(|(_, other)| {
        first.is_some_and(|first| first.client_relation(other) == crate::identity::Relation::Different)
    });
    match other {
        Some((i, _)) => against(ctx, check, ctx.auth_of(i), None).await,
        None => not_testable(&check, "no identity of another client than the first's (the identity files' `client`)"),
    }
}

async fn no_token(ctx: &Context, check: Check) -> Outcome {
    against(ctx, check, Auth::None, None).await
}

/// Sends the owner's `tools/list` with a session id made from the real one by `make`.
async fn with_forged_id(ctx: &Context, check: Check, make: fn(&str) -> Option<String>, name: &str) -> Outcome {
    let session = match open_session(ctx).await {
        Ok(session) => session,
        Err(why) => return not_testable(&check, why),
    };
    let control = ctx.target.send(list(ctx.auth(), &session.id, &session.version)).await;
    let Some(forged) = make(&session.id) else {
        close(ctx, &session).await;
        return not_testable(&check, "no session id could be made up (the random source failed)");
    };
    redact_id(ctx, &forged, name, &mut []);
    let negative = ctx.target.send(list(ctx.auth(), &forged, &session.version)).await;
    close(ctx, &session).await;
    outcome(&check, &session, &control, &negative, Some(404))
}

/// 32 random bytes, base64url: a session id no one was issued.
fn made_up(_real: &str) -> Option<String> {
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes).ok()?;
    Some(URL_SAFE_NO_PAD.encode(bytes))
}

/// The real id with its last character changed.
fn near_miss_of(real: &str) -> Option<String> {
    let mut chars: Vec<char> = real.chars().collect();
    let last = chars.last_mut()?;
    *last = if *last == 'A' { 'B' } else { 'A' };
    Some(chars.into_iter().collect())
}

async fn unknown(ctx: &Context, check: Check) -> Outcome {
    with_forged_id(ctx, check, made_up, "session-made-up").await
}

async fn near_miss(ctx: &Context, check: Check) -> Outcome {
    with_forged_id(ctx, check, near_miss_of, "session-near-miss").await
}

async fn delete_other(ctx: &Context, check: Check) -> Outcome {
    let other = match ctx.other(Other::Caller) {
        Ok(found) => found.index,
        Err(why) => return not_testable(&check, why),
    };
    let session = match open_session(ctx).await {
        Ok(session) => session,
        Err(why) => return not_testable(&check, why),
    };
    let control = ctx.target.send(list(ctx.auth(), &session.id, &session.version)).await;
    let negative = ctx.target.send(delete(ctx.auth_of(other), &session.id, &session.version)).await;
    let after = ctx.target.send(list(ctx.auth(), &session.id, &session.version)).await;
    close(ctx, &session).await;
    let deleted = negative.status.is_some_and(|status| (200..300).contains(&status));
    let (judgement, odd) = match negative.status {
        _ if deleted => (
            Judgement::Accepted(format!("another identity's DELETE was served ({})", negative.summary())),
            Verdict::Fail,
        ),
        None => (Judgement::RefusedOddly(format!("no answer ({})", negative.summary())), Verdict::Inconclusive),
        Some(_) if !after.accepted() => (
            Judgement::Accepted(format!(
                "the DELETE was refused ({}), but the session no longer serves its owner ({})",
                negative.summary(),
                after.summary()
            )),
            Verdict::Fail,
        ),
        Some(_) => (Judgement::Refused, Verdict::Warning),
    };
    let mut outcome = paired(&check, &control, &negative, judgement, odd).with(&[&after]);
    outcome.transcript.splice(0..0, session.opened.iter().map(|exchange| exchange.transcript.clone()));
    outcome
}

async fn after_delete(ctx: &Context, check: Check) -> Outcome {
    let session = match open_session(ctx).await {
        Ok(session) => session,
        Err(why) => return not_testable(&check, why),
    };
    let control = ctx.target.send(list(ctx.auth(), &session.id, &session.version)).await;
    let deletion = ctx.target.send(delete(ctx.auth(), &session.id, &session.version)).await;
    match deletion.status {
        Some(status) if (200..300).contains(&status) => {}
        Some(405) => {
            return not_testable(&check, "the target does not let clients end sessions (DELETE answered 405)")
                .with(&[&control, &deletion]);
        }
        _ => {
            let detail = format!("the owner's DELETE was not served ({})", deletion.summary());
            return Outcome::new(&check, Verdict::Inconclusive, detail).with(&[&control, &deletion]);
        }
    }
    let negative = ctx.target.send(list(ctx.auth(), &session.id, &session.version)).await;
    let mut outcome = outcome(&check, &session, &control, &negative, Some(404));
    outcome.transcript.push(deletion.transcript.clone());
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_probes_speak_the_2025_wire() {
        let probe = legacy("tools/list", json!({}), Auth::None, Some("sid-0123456789"), LEGACY_VERSION);
        assert!(probe.params.get("_meta").is_none());
        let has = |name: &str, value: &str| probe.headers.iter().any(|(n, v)| n == name && v == value);
        assert!(has("mcp-protocol-version", LEGACY_VERSION));
        assert!(has("mcp-session-id", "sid-0123456789"));
        assert!(probe.without.contains(&"mcp-method".to_owned()));
    }

    #[test]
    fn forged_ids_differ_from_the_real_one() {
        assert_eq!(near_miss_of("abcdef").as_deref(), Some("abcdeA"));
        assert_eq!(near_miss_of("abcdeA").as_deref(), Some("abcdeB"));
        assert_eq!(near_miss_of(""), None);
        let (a, b) = (made_up("x").unwrap(), made_up("x").unwrap());
        assert_eq!(a.len(), 43);
        assert_ne!(a, b);
    }
}
