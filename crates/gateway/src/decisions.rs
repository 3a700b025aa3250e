//! A reviewer's decision on a pinned definition, as every review surface records it (the
//! `palisade pins` and `palisade upstreams` commands, the review page): the state a stored pin is
//! in, and one decision written to the store (only if the definition is still the one the
//! reviewer was shown: the store compares digests atomically) with its audit record.

use palisade_base::clock::Clock;
use palisade_store::{AuditRecord, Decision, PinDecision, PinRow, PinVerdict, Store, StoreError};

use crate::pins::PinSettings;
use crate::pins::{DecisionView, DefinitionKind, PinState, PinSubject, evaluate, sign_approval};

/// The identity a stored pin's signature is checked under (`None` for an unknown kind).
pub fn subject_of(row: &PinRow) -> Option<PinSubject> {
    Some(PinSubject {
        upstream_id: row.observation.upstream_id.clone(),
        upstream_url: row.observation.upstream_url.clone(),
        kind: DefinitionKind::from_name(&row.observation.kind)?,
        name: row.observation.name.clone(),
    })
}

/// The diff of the definition last decided on and the current one, each side labelled with its
/// state (`rejected by alice at …`, `current, pending`): `None` when nothing was decided yet,
/// empty when the current definition is the one decided on. Shared by `pins diff` and the
/// review page.
pub fn decided_diff(row: &PinRow, pins: &PinSettings) -> Option<String> {
    let decided_label = decision_label(row, pins)?;
    let decided = row.decided_definition.as_deref()?;
    let current_label = format!("current, {}", state_of(row, pins).as_str());
    Some(crate::pins::diff(&decided_label, decided, &current_label, &row.observation.definition))
}

/// The decision last made on `row`, as the reviewer should read it: `approved by alice at <RFC
/// 3339>` or `rejected by …`, and for an approval that does not count under `require_signed`
/// (no valid signature of that reviewer) that it does not. `None` when nothing was decided.
pub fn decision_label(row: &PinRow, pins: &PinSettings) -> Option<String> {
    let decision = row.decision.as_ref()?;
    let mut label = format!(
        "{} by {} at {}",
        decision.verdict.as_str(),
        decision.reviewer,
        palisade_base::time::format_rfc3339_ms(decision.decided_at_ms)
    );
    if decision.verdict == PinVerdict::Approved && pins.require_signed && !signature_valid(row, decision, pins) {
        label.push_str(" without a valid signature of that reviewer (not counted: require_signed)");
    }
    Some(label)
}

/// Whether `decision` on `row` carries a valid signature of its reviewer under `pins`' keys.
fn signature_valid(row: &PinRow, decision: &PinDecision, pins: &PinSettings) -> bool {
    match (subject_of(row), &decision.signature) {
        (Some(subject), Some(signature)) => {
            pins.reviewers.verify(&decision.reviewer, &subject, &decision.digest, signature)
        }
        _ => false,
    }
}

/// The state `row` is in under `pins` (signatures checked against its reviewer keys).
pub fn state_of(row: &PinRow, pins: &PinSettings) -> PinState {
    let decision = row.decision.as_ref().map(|decision| DecisionView {
        approved: decision.verdict == PinVerdict::Approved,
        digest: &decision.digest,
        signature_valid: signature_valid(row, decision, pins),
    });
    evaluate(&row.observation.digest, decision, pins.require_signed)
}

/// Who decides, and how.
#[derive(Debug, Clone, Copy)]
pub struct Reviewer<'a> {
    /// The name recorded (and the one a signature is checked under).
    pub name: &'a str,
    /// Why (recorded).
    pub note: Option<&'a str>,
    /// The reviewer's Ed25519 secret key: signs an approval.
    pub sign_key: Option<&'a [u8; 32]>,
    /// Where the decision was made, for the audit record (`cli`, `review-page`).
    pub surface: &'a str,
}

/// Records `verdict` on `row`'s current definition by `reviewer`: `Ok(true)` when recorded (and
/// audited), `Ok(false)` when the stored definition is no longer the one in `row` (nothing
/// recorded: the reviewer must look again).
pub async fn record(
    store: &dyn Store,
    clock: &dyn Clock,
    row: &PinRow,
    verdict: PinVerdict,
    reviewer: Reviewer<'_>,
) -> Result<bool, StoreError> {
    let o = &row.observation;
    let signature = match (reviewer.sign_key, verdict, subject_of(row)) {
        (Some(key), PinVerdict::Approved, Some(subject)) => Some(sign_approval(key, &subject, &o.digest)),
        _ => None,
    };
    let signed = signature.is_some();
    let decision = PinDecision {
        pin_id: o.pin_id.clone(),
        digest: o.digest.clone(),
        verdict,
        reviewer: reviewer.name.to_owned(),
        note: reviewer.note.map(str::to_owned),
        signature,
        decided_at_ms: clock.now_ms(),
    };
    // Recorded only if the stored definition is still the one read (atomic in the store).
    if !store.decide_pin(decision).await? {
        return Ok(false);
    }
    let record = AuditRecord {
        at_ms: clock.now_unsigned_ms(),
        trace_id: palisade_server::audit::fresh_trace_id(),
        stage: "pins".into(),
        decision: if verdict == PinVerdict::Approved { Decision::Allow } else { Decision::Deny },
        operation: format!("pins/{}:{}", verdict.as_str(), o.pin_id),
        principal_digest: None,
        tenant_digest: None,
        client_digest: None,
        scopes: Vec::new(),
        policy_version: Some(format!("pin:{}", &o.digest[..12.min(o.digest.len())])),
        code: None,
        detail: Some(format!(
            "upstream={} kind={} upstream_name={} reviewer={} signed={signed} via={}",
            o.upstream_id, o.kind, o.name, reviewer.name, reviewer.surface
        )),
    };
    store.append_batch(vec![record]).await?;
    Ok(true)
}
