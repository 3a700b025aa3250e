//! An operator's command on the record: one audit record (stage `operator`) per command that
//! changes state.

use anyhow::Context as _;
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_store::{AuditRecord, Decision};

/// Records an operator command in the audit log (stage `operator`, allow), on the store
/// handle's own chain.
pub async fn record_operator_action(
    store: &dyn palisade_store::Store,
    now: i64,
    operation: &str,
    detail: String,
) -> anyhow::Result<()> {
    let record = AuditRecord {
        at_ms: SystemClock.now_unsigned_ms(),
        trace_id: format!("operator-{now}"),
        stage: "operator".into(),
        decision: Decision::Allow,
        operation: operation.into(),
        principal_digest: None,
        tenant_digest: None,
        client_digest: None,
        scopes: Vec::new(),
        policy_version: None,
        code: None,
        detail: Some(detail),
    };
    store.append_batch(vec![record]).await.context("recording the operator's command in the audit log")
}
