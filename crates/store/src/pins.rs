//! The `PinStore` trait: durable pins of the definitions a gateway's upstreams send (tools,
//! prompts, resources, resource templates, instructions) and the reviewers' decisions on them.
//! A pin row holds the definition as last observed (its digest and canonical JSON text) and the
//! latest decision, which names the digest the reviewer was shown and keeps a copy of the
//! definition it was made on.
//!
//! **Invariant:** a decision is recorded only for the digest the pin has at that instant: one
//! `UPDATE … WHERE pin_id = … AND digest = …` that also copies the definition text, so a
//! definition that changed after it was shown is never decided, whichever instance observes or
//! decides concurrently. Observing never touches a decision: whether a pin is approved, held or
//! rejected is the caller's comparison of the current digest with the decided one.

use std::collections::BTreeSet;

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::StoreError;
use crate::backend::Backend;
use crate::store::StoreFuture;

/// Most rows [`PinStore::pins`] returns, and most observations one
/// [`PinStore::observe_pins`] call accepts.
pub const MAX_PIN_LIST: u32 = 10_000;
/// Longest pin id ([`PinObservation::pin_id`]).
pub const MAX_PIN_ID_BYTES: usize = 64;
/// Longest upstream id ([`PinObservation::upstream_id`]).
pub const MAX_PIN_UPSTREAM_ID_BYTES: usize = 63;
/// Longest upstream URL, and longest name, URI or template ([`PinObservation::name`]).
pub const MAX_PIN_TEXT_BYTES: usize = 2048;
/// Largest canonical definition text ([`PinObservation::definition`]): 1 MiB.
pub const MAX_PIN_DEFINITION_BYTES: usize = 1024 * 1024;
/// Longest reviewer name ([`PinDecision::reviewer`]).
pub const MAX_PIN_REVIEWER_BYTES: usize = 200;
/// Longest reviewer note ([`PinDecision::note`]).
pub const MAX_PIN_NOTE_BYTES: usize = 4096;
/// Longest reviewer signature text ([`PinDecision::signature`]).
pub const MAX_PIN_SIGNATURE_BYTES: usize = 200;
/// The kinds of definition a pin can hold ([`PinObservation::kind`]).
pub const PIN_KINDS: [&str; 6] = ["tool", "prompt", "resource", "resource_template", "instructions", "launch"];

/// One definition an upstream sent, as last observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinObservation {
    /// The stable id the gateway derives: 1..=64 ASCII bytes of `[a-z0-9_-]`. One pin id stays
    /// bound to one upstream (id and URL), kind and name.
    pub pin_id: String,
    /// The upstream's id: 1..=63 ASCII bytes of `[A-Za-z0-9._-]`.
    pub upstream_id: String,
    /// The upstream's URL: 1..=2048 bytes, no control characters.
    pub upstream_url: String,
    /// One of [`PIN_KINDS`]: `tool`, `prompt`, `resource`, `resource_template`, `instructions` or
    /// `launch` (a stdio upstream's launch).
    pub kind: String,
    /// The upstream's own name, URI or URI template: 1..=2048 bytes without control characters;
    /// empty for `instructions` and `launch` (and only there).
    pub name: String,
    /// SHA-256 of the canonical definition: 64 lowercase hex digits.
    pub digest: String,
    /// The canonical JSON text of the definition, at most 1 MiB.
    pub definition: String,
    /// When it was observed, Unix milliseconds (not negative).
    pub seen_at_ms: i64,
}

impl PinObservation {
    /// Checks every field (the schema checks some of them again), so a bad observation is refused
    /// with a fixed reason before it reaches the database. The reason never quotes a value.
    pub fn validate(&self) -> Result<(), StoreError> {
        check_pin_id(&self.pin_id)?;
        check_upstream_id(&self.upstream_id)?;
        if self.upstream_url.is_empty()
            || self.upstream_url.len() > MAX_PIN_TEXT_BYTES
            || self.upstream_url.chars().any(char::is_control)
        {
            return invalid("a pin's upstream URL must be 1..=2048 bytes without control characters");
        }
        if !PIN_KINDS.contains(&self.kind.as_str()) {
            return invalid("a pin's kind must be tool, prompt, resource, resource_template or instructions");
        }
        // A name is printed in tables and pages: a control character (a terminal escape) in it
        // could rewrite what a reviewer sees.
        if self.name.len() > MAX_PIN_TEXT_BYTES || self.name.chars().any(char::is_control) {
            return invalid("a pin's name must be at most 2048 bytes without control characters");
        }
        if self.name.is_empty() != matches!(self.kind.as_str(), "instructions" | "launch") {
            return invalid("a pin's name must be empty for instructions and launches, and only for them");
        }
        check_digest(&self.digest)?;
        if self.definition.is_empty() || self.definition.len() > MAX_PIN_DEFINITION_BYTES {
            return invalid("a pin's definition must be 1 byte to 1 MiB");
        }
        if serde_json::from_str::<serde::de::IgnoredAny>(&self.definition).is_err() {
            return invalid("a pin's definition must be JSON text");
        }
        if self.seen_at_ms < 0 {
            return invalid("a pin's observation time must not be negative");
        }
        Ok(())
    }
}

/// A reviewer's verdict on one digest of one pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinVerdict {
    /// The definition with that digest may be served.
    Approved,
    /// The definition with that digest must not be served.
    Rejected,
}

impl PinVerdict {
    /// The stored (and displayed) name: `approved` or `rejected`.
    pub fn as_str(self) -> &'static str {
        match self {
            PinVerdict::Approved => "approved",
            PinVerdict::Rejected => "rejected",
        }
    }

    /// The verdict named `name` ([`as_str`](Self::as_str)), or `None`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "approved" => Some(PinVerdict::Approved),
            "rejected" => Some(PinVerdict::Rejected),
            _ => None,
        }
    }
}

/// A reviewer's decision about one digest of one pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinDecision {
    /// The pin decided on (same rules as [`PinObservation::pin_id`]).
    pub pin_id: String,
    /// The digest the reviewer was shown: 64 lowercase hex digits.
    pub digest: String,
    /// Approved or rejected.
    pub verdict: PinVerdict,
    /// Who decided: 1..=200 bytes without control characters.
    pub reviewer: String,
    /// The reviewer's note: at most 4096 bytes, no control characters but line feeds and tabs.
    pub note: Option<String>,
    /// A base64 Ed25519 signature (1..=200 bytes of the standard or URL-safe base64 alphabet),
    /// verified by the gateway and stored as is.
    pub signature: Option<String>,
    /// When it was decided, Unix milliseconds (not negative).
    pub decided_at_ms: i64,
}

impl PinDecision {
    /// Checks every field, so a bad decision is refused with a fixed reason before it reaches the
    /// database. The reason never quotes a value.
    pub fn validate(&self) -> Result<(), StoreError> {
        check_pin_id(&self.pin_id)?;
        check_digest(&self.digest)?;
        if self.reviewer.is_empty()
            || self.reviewer.len() > MAX_PIN_REVIEWER_BYTES
            || self.reviewer.chars().any(char::is_control)
        {
            return invalid("a pin reviewer must be 1..=200 bytes without control characters");
        }
        let note_ok = |note: &String| {
            note.len() <= MAX_PIN_NOTE_BYTES && !note.chars().any(|c| c.is_control() && c != '\n' && c != '\t')
        };
        if !self.note.as_ref().is_none_or(note_ok) {
            return invalid("a pin note must be at most 4096 bytes without control characters but line feeds and tabs");
        }
        let signature_ok = |signature: &String| {
            !signature.is_empty()
                && signature.len() <= MAX_PIN_SIGNATURE_BYTES
                && signature.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"+/=-_".contains(&byte))
        };
        if !self.signature.as_ref().is_none_or(signature_ok) {
            return invalid("a pin signature must be 1..=200 bytes of base64");
        }
        if self.decided_at_ms < 0 {
            return invalid("a pin decision's time must not be negative");
        }
        Ok(())
    }
}

/// A pin as stored: its current observation and its latest decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinRow {
    /// The definition as last observed.
    pub observation: PinObservation,
    /// When the pin was first observed, Unix milliseconds (kept by later observations).
    pub first_seen_ms: i64,
    /// The latest decision, if any (its digest may differ from the current one).
    pub decision: Option<PinDecision>,
    /// The definition text the decision was made on (copied from the observation at decision time).
    pub decided_definition: Option<String>,
}

/// Durable pins of upstream definitions and their review decisions. Implemented by every store
/// backend; every instance on the store sees the same pins.
pub trait PinStore: Send + Sync + std::fmt::Debug + 'static {
    /// Records the current definition of a pin (insert, or update digest/definition/seen_at; first_seen kept).
    /// Does not touch the decision.
    ///
    /// One transaction: every observation is written, or none is. Refused with
    /// [`StoreError::InvalidRecord`] (nothing written) when an observation is invalid, a pin id
    /// appears twice, there are more than [`MAX_PIN_LIST`], or an existing pin id is observed
    /// with another upstream id, URL, kind or name.
    fn observe_pins(&self, observations: Vec<PinObservation>) -> StoreFuture<'_, ()>;

    /// Records a decision only when the pin exists and its *current* observed digest equals
    /// `decision.digest` (atomically: a definition that changed after it was shown is not
    /// decided). Returns whether it was recorded. Replaces any previous decision of that pin.
    ///
    /// One statement, which also copies the current definition text into
    /// [`PinRow::decided_definition`]. An invalid decision is [`StoreError::InvalidRecord`].
    fn decide_pin(&self, decision: PinDecision) -> StoreFuture<'_, bool>;

    /// The pin with `pin_id`, or `None`. An id that no pin can have is [`StoreError::InvalidRecord`].
    fn pin(&self, pin_id: &str) -> StoreFuture<'_, Option<PinRow>>;

    /// Every pin, optionally of one upstream, ordered by (upstream_id, kind, name), at most MAX_PIN_LIST (10_000).
    ///
    /// The order compares bytes (then the pin id), the same on every backend. An upstream id that
    /// no pin can have is [`StoreError::InvalidRecord`].
    fn pins(&self, upstream_id: Option<&str>) -> StoreFuture<'_, Vec<PinRow>>;

    /// Every recorded decision, by pin id, at most [`MAX_PIN_LIST`]: what a running gateway
    /// polls to learn of reviewers' decisions without reading any definition.
    fn pin_decisions(&self) -> StoreFuture<'_, Vec<PinDecision>>;
}

fn invalid<T>(reason: &'static str) -> Result<T, StoreError> {
    Err(StoreError::InvalidRecord { reason })
}

pub(crate) fn check_pin_id(pin_id: &str) -> Result<(), StoreError> {
    let shape = |byte: u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_' || byte == b'-';
    if pin_id.is_empty() || pin_id.len() > MAX_PIN_ID_BYTES || !pin_id.bytes().all(shape) {
        return invalid("a pin id must be 1..=64 characters of a-z, 0-9, '_' and '-'");
    }
    Ok(())
}

pub(crate) fn check_upstream_id(upstream_id: &str) -> Result<(), StoreError> {
    let shape = |byte: u8| byte.is_ascii_alphanumeric() || b"._-".contains(&byte);
    if upstream_id.is_empty() || upstream_id.len() > MAX_PIN_UPSTREAM_ID_BYTES || !upstream_id.bytes().all(shape) {
        return invalid("a pin's upstream id must be 1..=63 characters of A-Z, a-z, 0-9, '.', '_' and '-'");
    }
    Ok(())
}

fn check_digest(digest: &str) -> Result<(), StoreError> {
    if digest.len() != 64 || !digest.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte)) {
        return invalid("a pin digest must be 64 lowercase hex digits");
    }
    Ok(())
}

/// Validates a whole batch before anything is written.
pub(crate) fn check_observations(observations: &[PinObservation]) -> Result<(), StoreError> {
    if observations.len() > MAX_PIN_LIST as usize {
        return invalid("at most 10000 pins can be observed at once");
    }
    let mut seen = BTreeSet::new();
    for observation in observations {
        observation.validate()?;
        if !seen.insert(observation.pin_id.as_str()) {
            return invalid("a pin id must appear at most once per observation batch");
        }
    }
    Ok(())
}

/// A pin row as both backends read it (columns by name).
#[derive(sqlx::FromRow)]
pub(crate) struct PinTuple {
    pin_id: String,
    upstream_id: String,
    upstream_url: String,
    kind: String,
    name: String,
    digest: String,
    definition: String,
    first_seen_ms: i64,
    seen_at_ms: i64,
    verdict: Option<String>,
    decision_digest: Option<String>,
    reviewer: Option<String>,
    note: Option<String>,
    signature: Option<String>,
    decided_at_ms: Option<i64>,
    decided_definition: Option<String>,
}

pub(crate) fn decode_pin(row: PinTuple) -> Result<PinRow, StoreError> {
    let decision = match (row.verdict, row.decision_digest, row.reviewer, row.decided_at_ms) {
        (None, None, None, None) => None,
        (Some(verdict), Some(digest), Some(reviewer), Some(decided_at_ms)) => Some(PinDecision {
            pin_id: row.pin_id.clone(),
            digest,
            verdict: PinVerdict::from_name(&verdict).ok_or_else(|| StoreError::corrupt("unknown pin verdict"))?,
            reviewer,
            note: row.note,
            signature: row.signature,
            decided_at_ms,
        }),
        _ => return Err(StoreError::corrupt("a stored pin decision is incomplete")),
    };
    if decision.is_some() != row.decided_definition.is_some() {
        return Err(StoreError::corrupt("a stored pin decision is incomplete"));
    }
    Ok(PinRow {
        observation: PinObservation {
            pin_id: row.pin_id,
            upstream_id: row.upstream_id,
            upstream_url: row.upstream_url,
            kind: row.kind,
            name: row.name,
            digest: row.digest,
            definition: row.definition,
            seen_at_ms: row.seen_at_ms,
        },
        first_seen_ms: row.first_seen_ms,
        decision,
        decided_definition: row.decided_definition,
    })
}

/// A decision as both backends read it (only decided pins are selected).
#[derive(sqlx::FromRow)]
pub(crate) struct DecisionTuple {
    pin_id: String,
    decision_digest: String,
    verdict: String,
    reviewer: String,
    note: Option<String>,
    signature: Option<String>,
    decided_at_ms: i64,
}

pub(crate) fn decode_decision(row: DecisionTuple) -> Result<PinDecision, StoreError> {
    Ok(PinDecision {
        pin_id: row.pin_id,
        digest: row.decision_digest,
        verdict: PinVerdict::from_name(&row.verdict).ok_or_else(|| StoreError::corrupt("unknown pin verdict"))?,
        reviewer: row.reviewer,
        note: row.note,
        signature: row.signature,
        decided_at_ms: row.decided_at_ms,
    })
}

/// The statements both backends run, with `$n` placeholders (SQLite gets them as `?n`).
pub(crate) mod sql {
    use crate::backend::Statement;

    macro_rules! pin_columns {
        () => {
            "pin_id, upstream_id, upstream_url, kind, name, digest, definition, first_seen_ms, seen_at_ms, \
             verdict, decision_digest, reviewer, note, signature, decided_at_ms, decided_definition"
        };
    }
    /// Inserts a pin, or updates the digest, definition and time of one with the same identity;
    /// a pin id observed with another identity changes nothing (no row affected).
    pub static OBSERVE: Statement = Statement::new(
        "INSERT INTO pins (pin_id, upstream_id, upstream_url, kind, name, digest, definition, \
        first_seen_ms, seen_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8) \
        ON CONFLICT (pin_id) DO UPDATE SET digest = excluded.digest, definition = excluded.definition, \
        seen_at_ms = excluded.seen_at_ms \
        WHERE pins.upstream_id = excluded.upstream_id AND pins.upstream_url = excluded.upstream_url \
        AND pins.kind = excluded.kind AND pins.name = excluded.name",
    );
    /// The decision, only on the current digest, with the definition it was made on.
    pub static DECIDE: Statement = Statement::new(
        "UPDATE pins SET verdict = $3, decision_digest = $2, reviewer = $4, note = $5, \
        signature = $6, decided_at_ms = $7, decided_definition = definition WHERE pin_id = $1 AND digest = $2",
    );
    pub static ONE: Statement = Statement::new(concat!("SELECT ", pin_columns!(), " FROM pins WHERE pin_id = $1"));
    pub static DECISIONS: Statement = Statement::new(
        "SELECT pin_id, decision_digest, verdict, reviewer, note, signature, decided_at_ms \
        FROM pins WHERE verdict IS NOT NULL ORDER BY pin_id LIMIT $1",
    );
    pub static ALL: Statement = Statement::new(concat!(
        "SELECT ",
        pin_columns!(),
        " FROM pins ORDER BY upstream_id, kind, name, pin_id LIMIT $1"
    ));
    pub static OF_UPSTREAM: Statement = Statement::new(concat!(
        "SELECT ",
        pin_columns!(),
        " FROM pins WHERE upstream_id = $1 ORDER BY upstream_id, kind, name, pin_id LIMIT $2"
    ));
}

/// The pin statements of one backend, for the [`PinStore`] implementation below.
struct Pins<'a, B>(&'a B);

impl<B> Pins<'_, B>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<String>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> PinTuple: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> DecisionTuple: FromRow<'r, <B::Db as Database>::Row>,
{
    async fn observe_pins_inner(self, observations: Vec<crate::PinObservation>) -> Result<(), StoreError> {
        check_observations(&observations)?;
        if observations.is_empty() {
            return Ok(());
        }
        let sqlx_error = |error| StoreError::from_sqlx("observe_pins", error);
        let mut transaction = self.0.begin().await.map_err(sqlx_error)?;
        for observation in observations {
            let done = sqlx::query(B::sql(&sql::OBSERVE))
                .bind(observation.pin_id)
                .bind(observation.upstream_id)
                .bind(observation.upstream_url)
                .bind(observation.kind)
                .bind(observation.name)
                .bind(observation.digest)
                .bind(observation.definition)
                .bind(observation.seen_at_ms)
                .execute(&mut *transaction)
                .await
                .map_err(sqlx_error)?;
            if B::rows_affected(&done) != 1 {
                // Dropping the transaction rolls the whole batch back.
                return Err(StoreError::InvalidRecord {
                    reason: "a pin id is bound to its upstream id, URL, kind and name",
                });
            }
        }
        transaction.commit().await.map_err(sqlx_error)
    }

    async fn decide_pin_inner(self, decision: crate::PinDecision) -> Result<bool, StoreError> {
        decision.validate()?;
        let done = sqlx::query(B::sql(&sql::DECIDE))
            .bind(decision.pin_id)
            .bind(decision.digest)
            .bind(decision.verdict.as_str())
            .bind(decision.reviewer)
            .bind(decision.note)
            .bind(decision.signature)
            .bind(decision.decided_at_ms)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("decide_pin", error))?;
        Ok(B::rows_affected(&done) == 1)
    }

    async fn pin_inner(self, pin_id: String) -> Result<Option<crate::PinRow>, StoreError> {
        check_pin_id(&pin_id)?;
        let row: Option<PinTuple> = sqlx::query_as(B::sql(&sql::ONE))
            .bind(pin_id)
            .fetch_optional(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx("pin", error))?;
        row.map(decode_pin).transpose()
    }

    async fn pins_inner(self, upstream_id: Option<String>) -> Result<Vec<crate::PinRow>, StoreError> {
        let limit = i64::from(crate::MAX_PIN_LIST);
        let rows: Vec<PinTuple> = match upstream_id {
            Some(upstream_id) => {
                check_upstream_id(&upstream_id)?;
                sqlx::query_as(B::sql(&sql::OF_UPSTREAM)).bind(upstream_id).bind(limit).fetch_all(self.0.reader()).await
            }
            None => sqlx::query_as(B::sql(&sql::ALL)).bind(limit).fetch_all(self.0.reader()).await,
        }
        .map_err(|error| StoreError::from_sqlx("pins", error))?;
        rows.into_iter().map(decode_pin).collect()
    }

    async fn pin_decisions_inner(self) -> Result<Vec<crate::PinDecision>, StoreError> {
        let rows: Vec<DecisionTuple> = sqlx::query_as(B::sql(&sql::DECISIONS))
            .bind(i64::from(crate::MAX_PIN_LIST))
            .fetch_all(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx("pin_decisions", error))?;
        rows.into_iter().map(decode_decision).collect()
    }
}

/// [`PinStore`] for every backend, from the shared statements (one text for both).
impl<B> PinStore for B
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<String>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> PinTuple: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> DecisionTuple: FromRow<'r, <B::Db as Database>::Row>,
{
    fn observe_pins(&self, observations: Vec<crate::PinObservation>) -> StoreFuture<'_, ()> {
        Box::pin(Pins(self).observe_pins_inner(observations))
    }

    fn decide_pin(&self, decision: crate::PinDecision) -> StoreFuture<'_, bool> {
        Box::pin(Pins(self).decide_pin_inner(decision))
    }

    fn pin(&self, pin_id: &str) -> StoreFuture<'_, Option<crate::PinRow>> {
        Box::pin(Pins(self).pin_inner(pin_id.to_owned()))
    }

    fn pins(&self, upstream_id: Option<&str>) -> StoreFuture<'_, Vec<crate::PinRow>> {
        Box::pin(Pins(self).pins_inner(upstream_id.map(str::to_owned)))
    }

    fn pin_decisions(&self) -> StoreFuture<'_, Vec<crate::PinDecision>> {
        Box::pin(Pins(self).pin_decisions_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observation() -> PinObservation {
        PinObservation {
            pin_id: "weather-tool-forecast".into(),
            upstream_id: "weather".into(),
            upstream_url: "https://weather.example/mcp".into(),
            kind: "tool".into(),
            name: "forecast".into(),
            digest: "ab".repeat(32),
            definition: r#"{"name":"forecast"}"#.into(),
            seen_at_ms: 10,
        }
    }

    fn decision() -> PinDecision {
        PinDecision {
            pin_id: "weather-tool-forecast".into(),
            digest: "ab".repeat(32),
            verdict: PinVerdict::Approved,
            reviewer: "Ada Lovelace".into(),
            note: Some("checked\tthe schema\nand the description".into()),
            signature: Some("c2lnbmF0dXJl+/-_==".into()),
            decided_at_ms: 20,
        }
    }

    #[test]
    fn verdict_names_round_trip() {
        for verdict in [PinVerdict::Approved, PinVerdict::Rejected] {
            assert_eq!(PinVerdict::from_name(verdict.as_str()), Some(verdict));
        }
        assert_eq!(PinVerdict::from_name("Approved"), None);
        assert_eq!(PinVerdict::from_name(""), None);
    }

    #[test]
    fn observation_validation_refuses_each_broken_field() {
        assert!(observation().validate().is_ok());
        let mut instructions = observation();
        instructions.kind = "instructions".into();
        instructions.name.clear();
        instructions.definition = r#""Use the forecast tool.""#.into();
        assert!(instructions.validate().is_ok());
        let cases: Vec<fn(&mut PinObservation)> = vec![
            |p| p.pin_id.clear(),
            |p| p.pin_id = "x".repeat(65),
            |p| p.pin_id = "Upper".into(),
            |p| p.pin_id = "has space".into(),
            |p| p.upstream_id.clear(),
            |p| p.upstream_id = "u".repeat(64),
            |p| p.upstream_id = "a/b".into(),
            |p| p.upstream_url.clear(),
            |p| p.upstream_url = format!("https://x/{}", "a".repeat(2048)),
            |p| p.upstream_url = "https://x/\n".into(),
            |p| p.kind = "Tool".into(),
            |p| p.kind = "tools".into(),
            |p| p.name = "n".repeat(2049),
            |p| p.name = "x\u{1b}[1A\u{1b}[2K".into(),
            |p| p.name = "tab\tname".into(),
            |p| p.name = "c1\u{9b}".into(),
            |p| p.name.clear(),
            |p| p.kind = "instructions".into(),
            |p| p.digest = "AB".repeat(32),
            |p| p.digest = "ab".repeat(31),
            |p| p.digest = "g".repeat(64),
            |p| p.definition.clear(),
            |p| p.definition = "{not json".into(),
            |p| p.definition = format!("\"{}\"", "a".repeat(MAX_PIN_DEFINITION_BYTES)),
            |p| p.seen_at_ms = -1,
        ];
        for (index, break_it) in cases.into_iter().enumerate() {
            let mut pin = observation();
            break_it(&mut pin);
            assert!(matches!(pin.validate(), Err(StoreError::InvalidRecord { .. })), "case {index}");
        }
    }

    #[test]
    fn decision_validation_refuses_each_broken_field() {
        assert!(decision().validate().is_ok());
        let cases: Vec<fn(&mut PinDecision)> = vec![
            |d| d.pin_id = "x".repeat(65),
            |d| d.digest = "ab".repeat(33),
            |d| d.reviewer.clear(),
            |d| d.reviewer = "r".repeat(201),
            |d| d.reviewer = "evil\u{1b}[2J".into(),
            |d| d.note = Some("n".repeat(4097)),
            |d| d.note = Some("bell\u{7}".into()),
            |d| d.signature = Some(String::new()),
            |d| d.signature = Some("s".repeat(201)),
            |d| d.signature = Some("not base64!".into()),
            |d| d.decided_at_ms = -5,
        ];
        for (index, break_it) in cases.into_iter().enumerate() {
            let mut decided = decision();
            break_it(&mut decided);
            assert!(matches!(decided.validate(), Err(StoreError::InvalidRecord { .. })), "case {index}");
        }
    }

    #[test]
    fn a_batch_is_checked_whole_and_reasons_never_quote_values() {
        let mut second = observation();
        second.pin_id = "weather-tool-other".into();
        assert!(check_observations(&[observation(), second]).is_ok());
        let duplicate = check_observations(&[observation(), observation()]);
        assert!(matches!(duplicate, Err(StoreError::InvalidRecord { .. })), "{duplicate:?}");
        let mut secret = observation();
        secret.upstream_url = "https://user:hunter2@x/\u{0}".into();
        let error = check_observations(&[observation(), secret]).err().unwrap();
        let text = format!("{error} {error:?}");
        assert!(!text.contains("hunter2"), "{text}");
        let too_many = vec![observation(); MAX_PIN_LIST as usize + 1];
        assert!(matches!(check_observations(&too_many), Err(StoreError::InvalidRecord { .. })));
    }
}
