//! The storage conformance suite for [`AuditStore`] backends: written once, run against every
//! backend through a [`Harness`] (`tests/sqlite.rs`, `tests/postgres.rs`). Each check panics with
//! a message on failure, like a test. [`audit_store_conformance!`](crate::audit_store_conformance)
//! turns every check into a `#[tokio::test]`.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{
    ApprovedClient, AuditRecord, AuditStore, AuditWriter, AuditWriterConfig, ChainBreakKind, CheckpointKey,
    ConnectionRow, Decision, DelegationRow, GENESIS_HASH, HandleOwner, HandleStore, MAX_DELEGATION_DEPTH,
    MAX_DELEGATION_LIST, MintRefusal, NewDelegation, NewHandle, NewSession, PinDecision, PinObservation, PinRow,
    PinVerdict, Revocation, RevokeSelector, SessionOwner, Store, StoreError, TaskRow, TaskStatus, chain_hash,
};

mod audit;
mod connections;
mod delegations;
mod handles;
mod once;
mod pins;
mod sessions;
mod tasks;

pub use audit::*;
pub use connections::*;
pub use delegations::*;
pub use handles::*;
pub use once::*;
pub use pins::*;
pub use sessions::*;
pub use tasks::*;

/// The owner-bound handle lookup as the PostgreSQL backend sends it (`$n` placeholders), for a
/// backend test that checks its query plan. Not an interface: SQL stays inside this crate.
pub const HANDLE_LOOKUP_STATEMENT: &str = crate::handles::sql::LOOKUP_TEXT;

/// A boxed future for harness methods.
pub type HarnessFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the suite needs from a backend. Setup failures panic (they are test failures).
pub trait Harness: Send + Sync {
    /// A fresh, empty store on storage no other test shares.
    fn fresh(&self) -> HarnessFuture<'_, Box<dyn Fixture>>;
    /// Opens a store whose storage cannot be reached (closed port, unwritable path). The suite
    /// expects `Err(StoreError::Unavailable)`.
    fn open_unreachable(&self) -> HarnessFuture<'_, Result<Arc<dyn Store>, StoreError>>;
}

/// One fresh store and a handle on the storage under it.
pub trait Fixture: Send + Sync {
    /// The store under test.
    fn store(&self) -> Arc<dyn Store>;
    /// A second, independent store on the same storage: another process or instance, with its
    /// own connections.
    fn another_instance(&self) -> HarnessFuture<'_, Arc<dyn Store>>;
    /// Runs one SQL statement on the storage behind the store's back (an attacker with database
    /// access). The statements the suite uses are valid on every SQL backend.
    fn tamper(&self, sql: &'static str) -> HarnessFuture<'_, ()>;
    /// Releases the storage (drops the schema, removes the file).
    fn cleanup(self: Box<Self>) -> HarnessFuture<'static, ()>;
}

/// Every check, as `#[tokio::test]`s in the calling test file. `$harness` is an expression
/// evaluated in each test that yields a value implementing [`Harness`].
#[macro_export]
macro_rules! audit_store_conformance {
    ($harness:expr) => {
        $crate::audit_store_conformance!(@tests $harness;
            empty_store_verifies,
            ping_succeeds,
            append_and_verify_round_trip,
            chain_links_across_batches,
            empty_batch_is_a_no_op,
            invalid_record_rejects_the_whole_batch,
            edited_field_is_detected,
            deleted_middle_record_is_detected,
            deleted_last_record_is_detected,
            reordered_records_are_detected,
            record_beyond_the_head_is_detected,
            verify_pages_through_a_long_chain,
            concurrent_appenders_never_fork_the_chain,
            writer_groups_concurrent_appends,
            shipping_is_idempotent_and_refuses_what_does_not_continue_the_chain,
            checkpoints_cover_every_chain_and_verify,
            checkpoint_signer_lease_is_exclusive_until_it_runs_out,
            truncation_behind_a_checkpoint_is_detected,
            a_deleted_chain_is_detected_by_the_checkpoints,
            a_rewritten_chain_differs_from_its_checkpoint,
            tampered_checkpoints_are_detected,
            search_filters_and_follows_chains,
            closed_store_is_unavailable,
            unreachable_store_is_unavailable,
            handle_round_trips_for_its_owner_only,
            handle_expires_at_the_exact_instant,
            handle_digest_is_unique,
            invalid_handles_are_refused,
            handle_revocation_selectors_cover_exactly_their_rows,
            no_lookup_sees_a_handle_after_its_revocation_committed,
            handle_list_shows_digests_and_purge_is_bounded,
            closed_store_refuses_handle_operations,
            task_is_visible_to_its_owner_until_it_expires,
            task_changes_are_compare_and_swap_and_terminal_rows_never_change,
            orphaned_tasks_are_found_and_expired_tasks_purged,
            closed_store_refuses_task_operations,
            session_round_trips_for_its_owner_only,
            session_expires_idle_and_absolute,
            session_state_is_shared_and_deleted_with_the_session,
            closed_store_refuses_session_operations,
            once_record_is_used_exactly_once,
            expired_once_record_stays_used_until_purged,
            once_purge_takes_only_expired_records_and_is_bounded,
            racing_consumers_of_one_digest_get_exactly_one_first_use,
            closed_store_refuses_once_operations,
            pins_round_trip_and_reobservation_keeps_first_seen,
            pin_decision_needs_the_current_digest,
            pin_rejection_replaces_an_approval,
            pins_are_listed_by_upstream_in_order,
            invalid_pins_are_refused_and_nothing_is_written,
            racing_observations_never_pair_a_decision_with_another_definition,
            closed_store_refuses_pin_operations,
            delegation_chain_links_root_to_grandchild,
            every_mint_refusal_leaves_every_row_unchanged,
            invalid_delegations_are_refused_and_nothing_is_written,
            concurrent_spends_never_exceed_the_budget,
            racing_mints_and_spends_share_the_parent_budget_exactly,
            per_tool_budgets_are_reserved_and_spent_with_the_overall_one,
            delegation_revocation_is_once_and_stays_in_the_chain,
            delegations_are_listed_by_principal_newest_first,
            approvals_are_taken_at_most_once,
            delegation_purge_takes_only_expired_rows_and_is_bounded,
            closed_store_refuses_delegation_operations,
            connection_round_trips_and_every_write_bumps_the_version,
            stale_connection_replacements_are_refused_and_change_nothing,
            connections_are_listed_by_principal_newest_first,
            connection_deletes_cover_exactly_their_rows,
            client_approvals_are_per_principal_and_upstream_and_revocable,
            flows_are_taken_exactly_once,
            expired_or_other_kind_flows_are_not_taken,
            an_existing_flow_digest_is_never_overwritten,
            flow_purge_takes_only_expired_flows_and_is_bounded,
            oauth_client_registrations_round_trip_and_are_replaced,
            invalid_connection_inputs_are_refused_and_nothing_is_written,
            closed_store_refuses_connection_operations,
        );
    };
    (@tests $harness:expr; $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let harness = $harness;
                $crate::conformance::$check(&harness).await;
            }
        )*
    };
}

/// A record whose fields all depend on `n` (some optional fields present, some absent).
pub fn sample_record(n: u64) -> AuditRecord {
    AuditRecord {
        at_ms: 1_764_000_000_000 + n,
        trace_id: format!("trace-{n:08}"),
        stage: if n.is_multiple_of(3) { "authenticate".into() } else { "authorize".into() },
        decision: if n.is_multiple_of(2) { Decision::Allow } else { Decision::Deny },
        operation: format!("tools/call:basket_{}", n % 5),
        principal_digest: Some(format!("p-{:x}", n * 7919)),
        tenant_digest: n.is_multiple_of(2).then(|| "t-shop".to_string()),
        client_digest: n.is_multiple_of(4).then(|| "c-cli".to_string()),
        scopes: (0..n % 3).map(|index| format!("mcp:scope{index}")).collect(),
        policy_version: Some(format!("{}", n / 10)),
        code: (n % 2 == 1).then_some(-32_003),
        detail: (n % 2 == 1).then(|| "insufficient_scope — ünïcode".to_string()),
    }
}

fn records(range: std::ops::Range<u64>) -> Vec<AuditRecord> {
    range.map(sample_record).collect()
}

async fn append(store: &dyn AuditStore, range: std::ops::Range<u64>) {
    store.append_batch(records(range)).await.expect("append_batch");
}

async fn expect_intact(store: &dyn AuditStore, count: u64) {
    let report = store.verify_chain().await.expect("verify_chain");
    assert!(report.is_intact(), "chain should be intact: {report:?}");
    assert_eq!(report.records, count, "records walked");
    let heads = store.chain_heads().await.expect("chain_heads");
    assert_eq!(heads.iter().map(|head| head.seq).sum::<u64>(), count, "heads");
}

async fn expect_break(store: &dyn AuditStore, seq: u64, kind: ChainBreakKind) {
    let report = store.verify_chain().await.expect("verify_chain");
    let found = report.first_break.as_ref().map(|broken| (broken.seq, broken.kind));
    assert_eq!(found, Some((seq, kind)), "{report:?}");
}

fn expect_unavailable<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(matches!(result, Err(StoreError::Unavailable { .. })), "{what}: expected Unavailable, got {result:?}");
}

fn expect_invalid<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(matches!(result, Err(StoreError::InvalidRecord { .. })), "{what}: expected InvalidRecord, got {result:?}");
}

fn owner(subject: u8, tenant: &str, client: &str) -> HandleOwner {
    HandleOwner { subject_key: [subject; 32], tenant: tenant.into(), client: client.into() }
}
