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

/// The owner-bound handle lookup as the PostgreSQL backend sends it (`$n` placeholders), for a
/// backend test that checks its query plan. Not an interface: SQL stays inside this crate.
pub const HANDLE_LOOKUP_STATEMENT: &str = crate::handles::sql::LOOKUP;

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

/// A fresh store holds nothing and verifies.
pub async fn empty_store_verifies(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let report = fixture.store().verify_chain().await.expect("verify_chain");
    assert!(report.is_intact(), "{report:?}");
    assert_eq!((report.records, report.chains), (0, 0));
    assert!(fixture.store().chain_heads().await.expect("chain_heads").is_empty());
    assert!(fixture.store().recent(10).await.expect("recent").is_empty());
    fixture.cleanup().await;
}

/// Readiness succeeds on a working store.
pub async fn ping_succeeds(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    fixture.store().ping().await.expect("ping");
    fixture.cleanup().await;
}

/// What goes in comes back, field for field, newest first, and verifies.
pub async fn append_and_verify_round_trip(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let written = records(1..5);
    store.append_batch(written.clone()).await.expect("append_batch");
    expect_intact(store.as_ref(), 4).await;

    let recent = store.recent(10).await.expect("recent");
    assert_eq!(recent.iter().map(|stored| stored.seq).collect::<Vec<_>>(), vec![4, 3, 2, 1]);
    let read: Vec<AuditRecord> = recent.into_iter().rev().map(|stored| stored.record).collect();
    assert_eq!(read, written);
    assert_eq!(store.recent(2).await.expect("recent").len(), 2);
    fixture.cleanup().await;
}

/// Sequence numbers continue without gaps across batches, each record's `prev_hash` is its
/// predecessor's hash, and every stored hash is `chain_hash(prev_hash, record)`.
pub async fn chain_links_across_batches(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    append(store.as_ref(), 1..2).await;
    append(store.as_ref(), 2..7).await;
    append(store.as_ref(), 7..9).await;
    expect_intact(store.as_ref(), 8).await;

    let mut stored = store.recent(100).await.expect("recent");
    stored.reverse();
    let mut prev_hash = GENESIS_HASH;
    for (index, record) in stored.iter().enumerate() {
        assert_eq!(record.seq, index as u64 + 1);
        assert_eq!(record.prev_hash, prev_hash, "prev_hash of {}", record.seq);
        assert_eq!(record.hash, chain_hash(&prev_hash, &record.record), "hash of {}", record.seq);
        prev_hash = record.hash;
    }
    let heads = store.chain_heads().await.expect("chain_heads");
    assert_eq!(heads.len(), 1, "one store handle appends to one chain");
    assert_eq!((heads[0].seq, heads[0].hash), (8, prev_hash));
    assert!(stored.iter().all(|record| record.chain == heads[0].chain));
    fixture.cleanup().await;
}

/// An empty batch writes nothing and succeeds.
pub async fn empty_batch_is_a_no_op(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    store.append_batch(Vec::new()).await.expect("empty append_batch");
    append(store.as_ref(), 1..3).await;
    store.append_batch(Vec::new()).await.expect("empty append_batch");
    expect_intact(store.as_ref(), 2).await;
    fixture.cleanup().await;
}

/// One record the store refuses fails its whole batch, and nothing of it is written.
pub async fn invalid_record_rejects_the_whole_batch(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    append(store.as_ref(), 1..3).await;
    let mut batch = records(3..6);
    batch[1].trace_id = "nul\0inside".into();
    let result = store.append_batch(batch).await;
    assert!(matches!(result, Err(StoreError::InvalidRecord { .. })), "{result:?}");
    expect_intact(store.as_ref(), 2).await;
    append(store.as_ref(), 3..4).await;
    expect_intact(store.as_ref(), 3).await;
    fixture.cleanup().await;
}

/// Editing any column of a stored record is found at that record.
pub async fn edited_field_is_detected(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    append(store.as_ref(), 1..7).await;
    fixture.tamper("UPDATE audit_log SET detail = 'nothing to see' WHERE seq = 5").await;
    expect_break(store.as_ref(), 5, ChainBreakKind::HashMismatch).await;
    fixture.tamper("UPDATE audit_log SET decision = 'allow' WHERE seq = 3").await;
    expect_break(store.as_ref(), 3, ChainBreakKind::HashMismatch).await;
    fixture.tamper("UPDATE audit_log SET at_ms = at_ms + 1 WHERE seq = 2").await;
    expect_break(store.as_ref(), 2, ChainBreakKind::HashMismatch).await;
    fixture.tamper("UPDATE audit_log SET tenant_digest = 't-other' WHERE seq = 1").await;
    expect_break(store.as_ref(), 1, ChainBreakKind::HashMismatch).await;
    fixture.cleanup().await;
}

/// Deleting a record from the middle is found at its sequence number.
pub async fn deleted_middle_record_is_detected(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    append(store.as_ref(), 1..6).await;
    fixture.tamper("DELETE FROM audit_log WHERE seq = 3").await;
    expect_break(store.as_ref(), 3, ChainBreakKind::MissingRecord).await;
    fixture.cleanup().await;
}

/// Deleting the newest record is found through the chain head.
pub async fn deleted_last_record_is_detected(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    append(store.as_ref(), 1..6).await;
    fixture.tamper("DELETE FROM audit_log WHERE seq = 5").await;
    expect_break(store.as_ref(), 5, ChainBreakKind::MissingRecord).await;
    fixture.cleanup().await;
}

/// Swapping two records' places is found at the first of them.
pub async fn reordered_records_are_detected(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    append(store.as_ref(), 1..6).await;
    fixture.tamper("UPDATE audit_log SET seq = 1000 WHERE seq = 2").await;
    fixture.tamper("UPDATE audit_log SET seq = 2 WHERE seq = 3").await;
    fixture.tamper("UPDATE audit_log SET seq = 3 WHERE seq = 1000").await;
    expect_break(store.as_ref(), 2, ChainBreakKind::PrevHashMismatch).await;
    fixture.cleanup().await;
}

/// A record slipped in beyond the chain head is found.
pub async fn record_beyond_the_head_is_detected(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    append(store.as_ref(), 1..4).await;
    fixture
        .tamper(
            "INSERT INTO audit_log (chain_id, seq, at_ms, trace_id, stage, decision, operation, principal_digest, \
             tenant_digest, client_digest, scopes, policy_version, code, detail, prev_hash, hash) \
             SELECT chain_id, seq + 1, at_ms, trace_id, stage, decision, operation, principal_digest, tenant_digest, \
             client_digest, scopes, policy_version, code, detail, hash, hash FROM audit_log WHERE seq = 3",
        )
        .await;
    expect_break(store.as_ref(), 4, ChainBreakKind::BeyondHead).await;
    fixture.cleanup().await;
}

/// A chain longer than one verification page verifies, and a break deep inside it is found.
pub async fn verify_pages_through_a_long_chain(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    for start in (1..2501).step_by(500) {
        append(store.as_ref(), start..start + 500).await;
    }
    expect_intact(store.as_ref(), 2500).await;
    fixture.tamper("UPDATE audit_log SET operation = 'tools/call:other' WHERE seq = 1700").await;
    let report = store.verify_chain().await.expect("verify_chain");
    let found = report.first_break.as_ref().map(|broken| (broken.seq, broken.kind));
    assert_eq!(found, Some((1700, ChainBreakKind::HashMismatch)), "{report:?}");
    assert_eq!(report.records, 2500);
    fixture.cleanup().await;
}

/// Many tasks on two instances append at once: one unforked chain per instance, every record
/// stored once, and the two instances never share a chain.
pub async fn concurrent_appenders_never_fork_the_chain(harness: &dyn Harness) {
    const TASKS_PER_INSTANCE: u64 = 8;
    const BATCHES_PER_TASK: u64 = 10;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    let mut tasks = tokio::task::JoinSet::new();
    let mut expected = BTreeSet::new();
    let mut next = 0u64;
    for (instance_index, instance) in instances.iter().enumerate() {
        for task in 0..TASKS_PER_INSTANCE {
            let mut batches = Vec::new();
            for batch in 0..BATCHES_PER_TASK {
                let size = 1 + (task + batch) % 3;
                let batch: Vec<AuditRecord> = (next..next + size)
                    .map(|n| {
                        let mut record = sample_record(n);
                        record.trace_id = format!("instance{instance_index}-{n}");
                        expected.insert(record.trace_id.clone());
                        record
                    })
                    .collect();
                next += size;
                batches.push(batch);
            }
            let instance = instance.clone();
            tasks.spawn(async move {
                for batch in batches {
                    instance.append_batch(batch).await.expect("concurrent append_batch");
                }
            });
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("appender task");
    }
    for instance in &instances {
        expect_intact(instance.as_ref(), next).await;
    }
    assert_eq!(instances[0].chain_heads().await.expect("chain_heads").len(), 2, "a chain per instance");
    let stored = instances[1].recent(u32::try_from(next).unwrap_or(u32::MAX)).await.expect("recent");
    let found: BTreeSet<String> = stored.into_iter().map(|stored| stored.record.trace_id).collect();
    assert_eq!(found, expected, "every record exactly once");
    instances[1].close().await;
    fixture.cleanup().await;
}

/// Through an [`AuditWriter`], concurrent appends all commit, into one intact chain.
pub async fn writer_groups_concurrent_appends(harness: &dyn Harness) {
    const APPENDS: u64 = 200;
    let fixture = harness.fresh().await;
    let writer = Arc::new(AuditWriter::new(fixture.store(), AuditWriterConfig::default()));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..APPENDS {
        let writer = writer.clone();
        tasks.spawn(async move { writer.append(sample_record(n)).await });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("append task").expect("append");
    }
    writer.shutdown().await;
    expect_intact(fixture.store().as_ref(), APPENDS).await;
    fixture.cleanup().await;
}

const LEASE: Duration = Duration::from_secs(10);

fn checkpoint_key() -> CheckpointKey {
    CheckpointKey::from_seed([42; 32])
}

/// Signs a checkpoint as holder `"conformance"` at time `at`; panics unless one was stored.
async fn sign_checkpoint(store: &dyn AuditStore, at: u64) -> u64 {
    crate::checkpoint::checkpoint_once(store, &checkpoint_key(), "conformance", 1_800_000_000_000 + at, LEASE)
        .await
        .expect("checkpoint_once")
        .expect("a checkpoint was signed")
}

async fn verify_log(store: &dyn AuditStore) -> crate::LogReport {
    crate::verify_log(store, &checkpoint_key().verifying()).await.expect("verify_log")
}

/// A writer's linked batch ships once: shipping it (or an overlapping part) again changes
/// nothing, and a batch with a gap, not linking onto the stored head, edited after linking, of
/// another chain or with a malformed chain id is refused with nothing written.
pub async fn shipping_is_idempotent_and_refuses_what_does_not_continue_the_chain(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let chain = crate::new_chain_id().expect("chain id");
    let linked = crate::link(&chain, None, records(1..6)).expect("link");
    store.ship(&chain, linked[..3].to_vec()).await.expect("ship");
    store.ship(&chain, linked.clone()).await.expect("ship overlapping");
    store.ship(&chain, linked.clone()).await.expect("ship again");
    store.ship(&chain, Vec::new()).await.expect("ship nothing");
    expect_intact(store.as_ref(), 5).await;
    let head = store.chain_head(&chain).await.expect("chain_head").expect("a head");
    assert_eq!((head.seq, head.hash), (5, linked[4].hash));

    let more = crate::link(&chain, Some((5, linked[4].hash)), records(6..9)).expect("link");
    let forged = crate::link(&chain, Some((5, [9; 32])), records(6..7)).expect("link");
    let mut edited = more.clone();
    edited[0].record.detail = Some("edited after linking".into());
    let other = crate::new_chain_id().expect("chain id");
    let refused: [(&str, &str, Vec<crate::StoredAuditRecord>); 5] = [
        ("a gap", &chain, more[1..].to_vec()),
        ("not linked onto the head", &chain, forged),
        ("edited", &chain, edited),
        ("another chain's records", &other, more.clone()),
        ("a malformed chain id", "not-a-chain", more.clone()),
    ];
    for (what, chain, batch) in refused {
        let result = store.ship(chain, batch).await;
        assert!(matches!(result, Err(StoreError::InvalidRecord { .. })), "{what}: {result:?}");
    }
    expect_intact(store.as_ref(), 5).await;
    store.ship(&chain, more).await.expect("ship the rest");
    expect_intact(store.as_ref(), 8).await;
    fixture.cleanup().await;
}

/// Checkpoints sign every chain's head (two instances, two chains), only when something changed,
/// linked one to the next; the whole log verifies against them, and not under another key.
pub async fn checkpoints_cover_every_chain_and_verify(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    append(store.as_ref(), 1..6).await;
    append(other.as_ref(), 6..9).await;
    assert_eq!(sign_checkpoint(store.as_ref(), 1).await, 1);
    let unchanged =
        crate::checkpoint::checkpoint_once(store.as_ref(), &checkpoint_key(), "conformance", 1_800_000_000_002, LEASE)
            .await
            .expect("checkpoint_once");
    assert_eq!(unchanged, None, "nothing new, nothing signed");
    append(other.as_ref(), 9..12).await;
    assert_eq!(sign_checkpoint(store.as_ref(), 3).await, 2);
    append(store.as_ref(), 12..13).await;

    let report = verify_log(store.as_ref()).await;
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.checkpoints, 2);
    let last = report.last.clone().expect("a last checkpoint");
    assert_eq!((last.seq, last.chains, last.records), (2, 2, 11));
    // The heads the checkpoints named (5 and 3, then 6) were each compared with their record.
    assert_eq!(report.chains.checkpointed, 3);
    assert_eq!((report.chains.records, report.chains.chains), (12, 2));

    let wrong =
        crate::verify_log(store.as_ref(), &CheckpointKey::from_seed([7; 32]).verifying()).await.expect("verify_log");
    assert_eq!(wrong.checkpoint_break.map(|broken| (broken.seq, broken.reason)), Some((1, "signed by another key")));
    other.close().await;
    fixture.cleanup().await;
}

/// One signer at a time: the lease goes to whoever asks while it is free or expired, its holder
/// renews it, and nobody else signs meanwhile.
pub async fn checkpoint_signer_lease_is_exclusive_until_it_runs_out(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    assert!(store.claim_checkpointer("a", 1_000, 4_000).await.expect("claim"));
    assert!(!store.claim_checkpointer("b", 2_000, 5_000).await.expect("claim"));
    assert!(store.claim_checkpointer("a", 2_000, 5_000).await.expect("renew"));
    assert!(!store.claim_checkpointer("b", 4_999, 8_000).await.expect("claim"));
    assert!(store.claim_checkpointer("b", 5_001, 8_000).await.expect("take over"));
    append(store.as_ref(), 1..3).await;
    let signed = crate::checkpoint::checkpoint_once(store.as_ref(), &checkpoint_key(), "a", 6_000, LEASE)
        .await
        .expect("checkpoint_once");
    assert_eq!(signed, None, "not a's turn");
    assert!(store.latest_checkpoint().await.expect("latest").is_none());
    fixture.cleanup().await;
}

/// Cutting a checkpointed chain's tail and rewinding its head row onto the last record left
/// leaves a chain that walks clean; the checkpoints find it.
pub async fn truncation_behind_a_checkpoint_is_detected(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    append(store.as_ref(), 1..8).await;
    sign_checkpoint(store.as_ref(), 1).await;
    fixture.tamper("DELETE FROM audit_log WHERE seq > 4").await;
    fixture
        .tamper("UPDATE audit_chains SET head_seq = 4, head_hash = (SELECT hash FROM audit_log WHERE seq = 4)")
        .await;
    assert!(store.verify_chain().await.expect("verify_chain").is_intact(), "the cut is invisible to the walk alone");
    let report = verify_log(store.as_ref()).await;
    let found = report.chains.first_break.as_ref().map(|broken| (broken.seq, broken.kind));
    assert_eq!(found, Some((7, ChainBreakKind::WentBackwards)), "{report:?}");
    fixture.cleanup().await;
}

/// Deleting a whole chain (its records and its head) leaves the rest walking clean; the
/// checkpoints find it gone.
pub async fn a_deleted_chain_is_detected_by_the_checkpoints(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    append(store.as_ref(), 1..4).await;
    append(other.as_ref(), 4..6).await;
    sign_checkpoint(store.as_ref(), 1).await;
    fixture.tamper("DELETE FROM audit_log WHERE chain_id = (SELECT min(chain_id) FROM audit_chains)").await;
    fixture.tamper("DELETE FROM audit_chains WHERE chain_id NOT IN (SELECT chain_id FROM audit_log)").await;
    assert!(store.verify_chain().await.expect("verify_chain").is_intact());
    let report = verify_log(store.as_ref()).await;
    let found = report.chains.first_break.as_ref().map(|broken| broken.kind);
    assert_eq!(found, Some(ChainBreakKind::ChainDisappeared), "{report:?}");
    other.close().await;
    fixture.cleanup().await;
}

/// A chain replaced by a consistent one (every hash recomputed, as anyone can) walks clean; the
/// signed head it no longer has gives it away.
pub async fn a_rewritten_chain_differs_from_its_checkpoint(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    append(store.as_ref(), 1..6).await;
    sign_checkpoint(store.as_ref(), 1).await;
    let chain = store.chain_heads().await.expect("heads").remove(0).chain;
    fixture.tamper("DELETE FROM audit_log").await;
    fixture.tamper("DELETE FROM audit_chains").await;
    let rewritten = crate::link(&chain, None, records(101..106)).expect("link");
    store.ship(&chain, rewritten).await.expect("ship");
    assert!(store.verify_chain().await.expect("verify_chain").is_intact());
    let report = verify_log(store.as_ref()).await;
    let found = report.chains.first_break.as_ref().map(|broken| (broken.seq, broken.kind));
    assert_eq!(found, Some((5, ChainBreakKind::CheckpointMismatch)), "{report:?}");
    fixture.cleanup().await;
}

/// Deleting a checkpoint, or editing one's time, delta or signature, is found at that checkpoint.
pub async fn tampered_checkpoints_are_detected(harness: &dyn Harness) {
    let cases: [(&'static str, u64, &str); 5] = [
        ("DELETE FROM audit_checkpoints WHERE seq = 2", 2, "checkpoint missing (deleted)"),
        ("DELETE FROM audit_checkpoints WHERE seq = 1", 1, "checkpoint missing (deleted)"),
        (
            "UPDATE audit_checkpoints SET at_ms = at_ms + 1 WHERE seq = 2",
            2,
            "stored columns differ from the signed body",
        ),
        ("UPDATE audit_checkpoints SET delta = '[]' WHERE seq = 2", 2, "root does not match the heads its deltas name"),
        (
            "UPDATE audit_checkpoints SET signature = (SELECT signature FROM audit_checkpoints WHERE seq = 1) WHERE seq = 2",
            2,
            "signature does not verify",
        ),
    ];
    for (tamper, seq, reason) in cases {
        let fixture = harness.fresh().await;
        let store = fixture.store();
        for round in 0..3u64 {
            append(store.as_ref(), round * 2 + 1..round * 2 + 3).await;
            sign_checkpoint(store.as_ref(), round).await;
        }
        assert!(verify_log(store.as_ref()).await.is_intact());
        fixture.tamper(tamper).await;
        let report = verify_log(store.as_ref()).await;
        assert_eq!(report.checkpoint_break.map(|broken| (broken.seq, broken.reason)), Some((seq, reason)), "{tamper}");
        fixture.cleanup().await;
    }
}

/// Once the store is down (its connections closed), every operation is `Unavailable`, and an
/// [`AuditWriter`] hands that error to every waiter.
pub async fn closed_store_is_unavailable(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    append(store.as_ref(), 1..3).await;
    store.close().await;
    expect_unavailable(store.ping().await, "ping");
    expect_unavailable(store.append_batch(records(3..4)).await, "append_batch");
    expect_unavailable(store.verify_chain().await, "verify_chain");
    expect_unavailable(store.recent(5).await, "recent");

    let writer = Arc::new(AuditWriter::new(store, AuditWriterConfig::default()));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..20 {
        let writer = writer.clone();
        tasks.spawn(async move { writer.append(sample_record(n)).await });
    }
    while let Some(joined) = tasks.join_next().await {
        expect_unavailable(joined.expect("append task"), "AuditWriter::append");
    }
    writer.shutdown().await;
    fixture.cleanup().await;
}

/// Storage that cannot be reached fails to open with `Unavailable`, promptly.
pub async fn unreachable_store_is_unavailable(harness: &dyn Harness) {
    let started = Instant::now();
    let result = harness.open_unreachable().await;
    expect_unavailable(result, "open");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
}

// ---- Handles ----------------------------------------------------------------------------------

fn owner(subject: u8, tenant: &str, client: &str) -> HandleOwner {
    HandleOwner { subject_key: [subject; 32], tenant: tenant.into(), client: client.into() }
}

/// A handle row numbered `n`, owned by `owner`, live from 1_000 to 2_000.
pub fn sample_handle(n: u8, owner: &HandleOwner) -> NewHandle {
    NewHandle {
        digest: [n; 32],
        owner: owner.clone(),
        object_type: "basket".into(),
        object_ref: format!("basket-{n}"),
        object_version: "3".into(),
        scopes: vec!["shop:basket".into(), "shop:read".into()],
        policy_version: 2,
        created_ms: 1_000,
        expires_ms: 2_000,
    }
}

fn revocation(reason: &str) -> Revocation {
    Revocation { reason: reason.into(), receipt: Some("receipt-1".into()), at_ms: 1_500 }
}

async fn live(store: &dyn HandleStore, digest: u8, owner: &HandleOwner, now_ms: i64) -> bool {
    store.lookup_handle([digest; 32], owner, now_ms).await.expect("lookup_handle").is_some()
}

/// A handle comes back field for field to its owner, and to nobody who differs in subject,
/// tenant or client (each alone and every pair).
pub async fn handle_round_trips_for_its_owner_only(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_handle(sample_handle(7, &alice)).await.expect("insert");
    let found = store.lookup_handle([7; 32], &alice, 1_500).await.expect("lookup").expect("live for its owner");
    assert_eq!(found.object_type, "basket");
    assert_eq!(found.object_ref, "basket-7");
    assert_eq!(found.object_version, "3");
    assert_eq!(found.scopes, ["shop:basket", "shop:read"]);
    assert_eq!((found.policy_version, found.expires_ms), (2, 2_000));
    for other in [
        owner(2, "shop", "cli"),
        owner(1, "other", "cli"),
        owner(1, "shop", "web"),
        owner(2, "other", "cli"),
        owner(2, "shop", "web"),
        owner(1, "other", "web"),
        owner(2, "other", "web"),
    ] {
        assert!(!live(store.as_ref(), 7, &other, 1_500).await, "{other:?} must not see the handle");
    }
    // A near-miss digest (one bit) and an unknown one find nothing.
    let mut near = [7u8; 32];
    near[31] ^= 1;
    assert!(store.lookup_handle(near, &alice, 1_500).await.expect("lookup").is_none());
    assert!(!live(store.as_ref(), 8, &alice, 1_500).await);
    fixture.cleanup().await;
}

/// Live one millisecond before `expires_ms`, dead at it.
pub async fn handle_expires_at_the_exact_instant(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_handle(sample_handle(1, &alice)).await.expect("insert");
    assert!(live(store.as_ref(), 1, &alice, 1_999).await);
    assert!(!live(store.as_ref(), 1, &alice, 2_000).await);
    assert!(!live(store.as_ref(), 1, &alice, 2_001).await);
    fixture.cleanup().await;
}

/// A second row with the same digest is a conflict and leaves the first untouched.
pub async fn handle_digest_is_unique(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_handle(sample_handle(1, &alice)).await.expect("insert");
    let mallory = owner(9, "evil", "cli");
    let result = store.insert_handle(sample_handle(1, &mallory)).await;
    assert!(matches!(result, Err(StoreError::Conflict { .. })), "{result:?}");
    assert!(live(store.as_ref(), 1, &alice, 1_500).await);
    assert!(!live(store.as_ref(), 1, &mallory, 1_500).await);
    fixture.cleanup().await;
}

/// Rows breaking an invariant are refused before the database, and nothing is stored.
pub async fn invalid_handles_are_refused(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    let mut no_scopes = sample_handle(1, &alice);
    no_scopes.scopes.clear();
    let mut expired = sample_handle(1, &alice);
    expired.expires_ms = expired.created_ms;
    let mut no_tenant = sample_handle(1, &owner(1, "", "cli"));
    no_tenant.object_ref = "basket-1".into();
    for bad in [no_scopes, expired, no_tenant] {
        let result = store.insert_handle(bad).await;
        assert!(matches!(result, Err(StoreError::InvalidRecord { .. })), "{result:?}");
    }
    assert!(!live(store.as_ref(), 1, &alice, 1_500).await);
    let empty_reason = Revocation { reason: String::new(), receipt: None, at_ms: 1 };
    let result = store.revoke_handles(RevokeSelector::Digest([1; 32]), empty_reason).await;
    assert!(matches!(result, Err(StoreError::InvalidRecord { .. })), "{result:?}");
    fixture.cleanup().await;
}

/// Each selector revokes exactly the rows it names; a second revocation changes nothing and the
/// first reason stands.
pub async fn handle_revocation_selectors_cover_exactly_their_rows(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let a = owner(1, "shop", "cli");
    let b = owner(2, "shop", "cli");
    let c = owner(1, "other", "web");
    // 1,2: a; 3: b; 4: c; 5: b on object basket-1 (same object as 1); 6: a, old policy.
    for (n, who) in [(1, &a), (2, &a), (3, &b), (4, &c)] {
        store.insert_handle(sample_handle(n, who)).await.expect("insert");
    }
    let mut same_object = sample_handle(5, &b);
    same_object.object_ref = "basket-1".into();
    store.insert_handle(same_object).await.expect("insert");
    let mut old_policy = sample_handle(6, &a);
    old_policy.policy_version = 1;
    store.insert_handle(old_policy).await.expect("insert");
    let owners = [(1, &a), (2, &a), (3, &b), (4, &c), (5, &b), (6, &a)];
    let alive = |store: Arc<dyn Store>| async move {
        let mut alive = Vec::new();
        for (n, who) in owners {
            if live(store.as_ref(), n, who, 1_600).await {
                alive.push(n);
            }
        }
        alive
    };

    // Each revocation revokes exactly what `count_handles` counted just before it.
    let revoke = |selector: RevokeSelector| {
        let store = store.clone();
        async move {
            let counted = store.count_handles(selector.clone()).await.expect("count");
            let revoked = store.revoke_handles(selector, revocation("test")).await;
            if let Ok(revoked) = &revoked {
                assert_eq!(*revoked, counted, "count_handles and revoke_handles disagree");
            }
            revoked
        }
    };
    assert_eq!(store.count_handles(RevokeSelector::Subject([1; 32])).await.expect("count"), 4);
    assert_eq!(
        revoke(RevokeSelector::PolicyBelow { object_type: "basket".into(), below: 2 }).await.expect("revoke"),
        1
    );
    assert_eq!(alive(store.clone()).await, [1, 2, 3, 4, 5]);
    let object =
        RevokeSelector::Object { tenant: "shop".into(), object_type: "basket".into(), object_ref: "basket-1".into() };
    assert_eq!(revoke(object).await.expect("revoke"), 2);
    assert_eq!(alive(store.clone()).await, [2, 3, 4]);
    // The owner-bound form refuses someone else's handle.
    let foreign = RevokeSelector::Owned { digest: [2; 32], owner: b.clone() };
    assert_eq!(revoke(foreign).await.expect("revoke"), 0);
    assert_eq!(revoke(RevokeSelector::Owned { digest: [2; 32], owner: a.clone() }).await.expect("revoke"), 1);
    assert_eq!(alive(store.clone()).await, [3, 4]);
    assert_eq!(revoke(RevokeSelector::Client("web".into())).await.expect("revoke"), 1);
    assert_eq!(alive(store.clone()).await, [3]);
    assert_eq!(
        revoke(RevokeSelector::SubjectInTenant { subject_key: [2; 32], tenant: "other".into() }).await.expect("revoke"),
        0
    );
    assert_eq!(revoke(RevokeSelector::Tenant("shop".into())).await.expect("revoke"), 1);
    assert!(alive(store.clone()).await.is_empty());
    assert_eq!(store.count_handles(RevokeSelector::Subject([1; 32])).await.expect("count"), 0);
    // Already revoked: nothing changes, the first reason and receipt stand.
    let again = Revocation { reason: "later".into(), receipt: None, at_ms: 1_700 };
    assert_eq!(store.revoke_handles(RevokeSelector::Subject([1; 32]), again).await.expect("revoke"), 0);
    let listed = store.list_handles([1; 32], 10).await.expect("list");
    assert!(listed.iter().all(|row| row.revocation_reason.as_deref() == Some("test")), "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|row| row.revocation_receipt.as_deref() == Some("receipt-1") && row.revoked_ms == Some(1_500))
    );
    fixture.cleanup().await;
}

/// Lookups racing a revocation (on another instance): any lookup that starts after the
/// revocation returned finds nothing.
pub async fn no_lookup_sees_a_handle_after_its_revocation_committed(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let alice = owner(1, "shop", "cli");
    for round in 0..20u8 {
        store.insert_handle(sample_handle(round, &alice)).await.expect("insert");
        let revoked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut lookups = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (other, alice, revoked) = (other.clone(), alice.clone(), revoked.clone());
            lookups.spawn(async move {
                for _ in 0..25 {
                    let after_revoke = revoked.load(std::sync::atomic::Ordering::SeqCst);
                    let found = live(other.as_ref(), round, &alice, 1_500).await;
                    assert!(!(after_revoke && found), "a lookup started after the revocation saw the handle");
                    tokio::task::yield_now().await;
                }
            });
        }
        tokio::task::yield_now().await;
        let revoked_rows = store.revoke_handles(RevokeSelector::Digest([round; 32]), revocation("race")).await;
        revoked.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(revoked_rows.expect("revoke"), 1);
        while let Some(joined) = lookups.join_next().await {
            joined.expect("lookup task");
        }
        assert!(!live(other.as_ref(), round, &alice, 1_500).await);
    }
    fixture.cleanup().await;
}

/// Listing shows a subject's rows (digests, never handles) newest first; purging removes only
/// expired or revoked rows older than the cut-off, at most `limit` per call.
pub async fn handle_list_shows_digests_and_purge_is_bounded(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    for n in 1..=5u8 {
        let mut handle = sample_handle(n, &alice);
        handle.created_ms = 1_000 + i64::from(n);
        handle.expires_ms = if n <= 3 { 1_100 } else { 5_000 };
        store.insert_handle(handle).await.expect("insert");
    }
    let mut someone_else = sample_handle(9, &owner(2, "shop", "cli"));
    someone_else.expires_ms = 5_000;
    store.insert_handle(someone_else).await.expect("insert");
    store.revoke_handles(RevokeSelector::Digest([4; 32]), revocation("test")).await.expect("revoke");
    let listed = store.list_handles([1; 32], 100).await.expect("list");
    let digests: Vec<u8> = listed.iter().map(|row| row.digest[0]).collect();
    assert_eq!(digests, [5, 4, 3, 2, 1]);
    assert_eq!(store.list_handles([1; 32], 2).await.expect("list").len(), 2);
    // At 3_000: 1..=3 expired (1_100) and 4 revoked (1_500) are purgeable; 5 and 9 are not.
    assert_eq!(store.purge_handles(3_000, 3).await.expect("purge"), 3);
    assert_eq!(store.purge_handles(3_000, 100).await.expect("purge"), 1);
    assert_eq!(store.purge_handles(3_000, 100).await.expect("purge"), 0);
    let left: Vec<u8> = store.list_handles([1; 32], 100).await.expect("list").iter().map(|row| row.digest[0]).collect();
    assert_eq!(left, [5]);
    assert!(live(store.as_ref(), 9, &owner(2, "shop", "cli"), 1_500).await);
    fixture.cleanup().await;
}

/// A store that is down refuses every handle operation with `Unavailable` (the pipeline then
/// refuses the call: fail closed).
pub async fn closed_store_refuses_handle_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_handle(sample_handle(1, &alice)).await.expect("insert");
    store.close().await;
    expect_unavailable(store.lookup_handle([1; 32], &alice, 1_500).await, "lookup_handle");
    expect_unavailable(store.insert_handle(sample_handle(2, &alice)).await, "insert_handle");
    expect_unavailable(store.revoke_handles(RevokeSelector::Digest([1; 32]), revocation("x")).await, "revoke");
    expect_unavailable(store.count_handles(RevokeSelector::Digest([1; 32])).await, "count");
    expect_unavailable(store.list_handles([1; 32], 5).await, "list_handles");
    expect_unavailable(store.purge_handles(5_000, 5).await, "purge_handles");
    fixture.cleanup().await;
}

// ---- Tasks ------------------------------------------------------------------------------------

/// A `working` task numbered `n`, owned by `owner`, created at 1_000 with a 10 s retention.
pub fn sample_task(n: u8, owner: &HandleOwner) -> TaskRow {
    TaskRow {
        digest: [n; 32],
        owner: owner.clone(),
        request_id: format!("{n}"),
        method: "tools/call".into(),
        tool: "slow_compute".into(),
        arguments_digest: [0xaa; 32],
        scopes: "jobs:run".into(),
        execution: "{}".into(),
        status: TaskStatus::Working,
        status_message: None,
        input_requests: None,
        input_responses: "{}".into(),
        answered_keys: "[]".into(),
        result: None,
        error: None,
        cancel_requested: false,
        created_ms: 1_000,
        updated_ms: 1_000,
        ttl_ms: Some(10_000),
        poll_interval_ms: Some(500),
        lease_owner: Some("instance-a".into()),
        lease_until_ms: Some(5_000),
        attempts: 1,
        version: 1,
    }
}

/// Owners see their task until its retention ends; nobody else ever does.
pub async fn task_is_visible_to_its_owner_until_it_expires(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_task(sample_task(1, &alice)).await.expect("insert_task");
    let found = store.load_owned_task([1; 32], &alice, 2_000).await.expect("load").expect("visible");
    assert_eq!(found, sample_task(1, &alice));
    for other in [owner(2, "shop", "cli"), owner(1, "other", "cli"), owner(1, "shop", "web")] {
        assert!(store.load_owned_task([1; 32], &other, 2_000).await.expect("load").is_none(), "{other:?}");
    }
    assert!(store.load_owned_task([1; 32], &alice, 10_999).await.expect("load").is_some());
    assert!(store.load_owned_task([1; 32], &alice, 11_000).await.expect("load").is_none(), "expired");
    let active = |tenant: Option<&'static str>| store.active_tasks_of([1; 32], tenant, 10);
    assert_eq!(active(None).await.expect("active").len(), 1);
    assert_eq!(active(Some("shop")).await.expect("active").len(), 1);
    assert!(active(Some("other")).await.expect("active").is_empty());
    let duplicate = store.insert_task(sample_task(1, &owner(9, "evil", "x"))).await;
    assert!(matches!(duplicate, Err(StoreError::Conflict { .. })), "{duplicate:?}");
    fixture.cleanup().await;
}

/// A change applies only at the expected version; once terminal, no change applies; every
/// status passed through is in the history, once.
pub async fn task_changes_are_compare_and_swap_and_terminal_rows_never_change(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let alice = owner(1, "shop", "cli");
    store.insert_task(sample_task(1, &alice)).await.expect("insert_task");
    let mut next = sample_task(1, &alice);
    next.status = TaskStatus::InputRequired;
    next.input_requests = Some(r#"{"confirm":{}}"#.into());
    next.updated_ms = 1_100;
    assert!(store.swap_task(next.clone(), 1).await.expect("swap"));
    assert!(!other.swap_task(next.clone(), 1).await.expect("swap"), "a stale version must lose");
    // Two instances racing from the same version: exactly one wins.
    let mut done = next.clone();
    done.status = TaskStatus::Completed;
    done.input_requests = None;
    done.result = Some(r#"{"content":[]}"#.into());
    done.updated_ms = 1_200;
    let mut cancelled = next.clone();
    cancelled.status = TaskStatus::Cancelled;
    cancelled.updated_ms = 1_200;
    let (a, b) = tokio::join!(store.swap_task(done.clone(), 2), other.swap_task(cancelled.clone(), 2));
    assert!(a.expect("swap") ^ b.expect("swap"), "exactly one of two racing writers wins");
    let terminal = store.load_task([1; 32]).await.expect("load").expect("present");
    assert!(terminal.is_terminal());
    assert_eq!(terminal.version, 3);
    // Terminal: even a writer holding the current version changes nothing.
    let mut reopen = terminal.clone();
    reopen.status = TaskStatus::Working;
    reopen.result = None;
    assert!(!store.swap_task(reopen, 3).await.expect("swap"));
    assert_eq!(store.load_task([1; 32]).await.expect("load").expect("present"), terminal);
    let history: Vec<String> =
        store.task_history([1; 32]).await.expect("history").into_iter().map(|(_, s)| s).collect();
    assert_eq!(history, ["working", "input_required", terminal.status.as_str()]);
    // A row breaking the schema's rules is refused before the database (an unknown status
    // cannot be written at all: it is a `TaskStatus`; one read back is an invalid record).
    let mut broken = sample_task(2, &alice);
    broken.tool = String::new();
    assert!(matches!(store.insert_task(broken).await, Err(StoreError::InvalidRecord { .. })));
    fixture.cleanup().await;
}

/// Working tasks whose lease ended are orphans; terminal or leased ones are not. Purging takes
/// only tasks past retention, at most `limit` per call.
pub async fn orphaned_tasks_are_found_and_expired_tasks_purged(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    for n in 1..=4u8 {
        let mut task = sample_task(n, &alice);
        task.created_ms = 1_000 + i64::from(n);
        task.lease_until_ms = Some(if n == 2 { 9_000 } else { 5_000 });
        if n == 3 {
            task.status = TaskStatus::Completed;
            task.result = Some("{}".into());
        }
        if n == 4 {
            task.ttl_ms = None;
        }
        store.insert_task(task).await.expect("insert_task");
    }
    let orphans: Vec<u8> =
        store.orphaned_tasks(6_000, 10).await.expect("orphans").iter().map(|t| t.digest[0]).collect();
    assert_eq!(orphans, [1, 4]);
    assert_eq!(store.orphaned_tasks(6_000, 1).await.expect("orphans").len(), 1);
    // Retention 10 s from ~1 s: 1..=3 expire by 20 s; 4 never does.
    assert_eq!(store.purge_tasks(20_000, 2).await.expect("purge"), 2);
    assert_eq!(store.purge_tasks(20_000, 10).await.expect("purge"), 1);
    assert!(store.load_task([4; 32]).await.expect("load").is_some());
    assert!(store.task_history([1; 32]).await.expect("history").is_empty(), "history purged with its task");
    fixture.cleanup().await;
}

/// A store that is down refuses every task operation with `Unavailable`.
pub async fn closed_store_refuses_task_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = owner(1, "shop", "cli");
    store.insert_task(sample_task(1, &alice)).await.expect("insert_task");
    store.close().await;
    expect_unavailable(store.insert_task(sample_task(2, &alice)).await, "insert_task");
    expect_unavailable(store.load_owned_task([1; 32], &alice, 2_000).await, "load_owned_task");
    expect_unavailable(store.swap_task(sample_task(1, &alice), 1).await, "swap_task");
    expect_unavailable(store.orphaned_tasks(6_000, 5).await, "orphaned_tasks");
    fixture.cleanup().await;
}

// ---- Sessions ---------------------------------------------------------------------------------

fn session_owner(subject: u8, tenant: &str, client: &str) -> SessionOwner {
    SessionOwner { subject_key: [subject; 32], tenant: tenant.into(), client: client.into() }
}

/// A session row numbered `n`, owned by `owner`: created at 1_000, idle timeout 100, absolute
/// expiry 2_000.
pub fn sample_session(n: u8, owner: &SessionOwner) -> NewSession {
    NewSession {
        digest: [n; 32],
        owner: owner.clone(),
        protocol_version: "2025-11-25".into(),
        client_capabilities: r#"{"sampling":{}}"#.into(),
        client_info: Some(r#"{"name":"client","version":"1"}"#.into()),
        created_ms: 1_000,
        idle_ms: 100,
        expires_ms: 2_000,
    }
}

/// A session comes back to its owner, and to nobody who differs in subject, tenant or client;
/// a duplicate digest is a conflict; invalid rows are refused.
pub async fn session_round_trips_for_its_owner_only(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = session_owner(1, "", "cli");
    store.insert_session(sample_session(7, &alice)).await.expect("insert");
    let found = store.touch_session([7; 32], &alice, 1_050).await.expect("touch").expect("live for its owner");
    assert_eq!(found.protocol_version, "2025-11-25");
    assert_eq!(found.client_capabilities, r#"{"sampling":{}}"#);
    assert_eq!(found.client_info.as_deref(), Some(r#"{"name":"client","version":"1"}"#));
    assert_eq!((found.created_ms, found.last_seen_ms, found.expires_ms, found.log_level), (1_000, 1_050, 2_000, None));
    for other in [session_owner(2, "", "cli"), session_owner(1, "acme", "cli"), session_owner(1, "", "web")] {
        assert!(store.touch_session([7; 32], &other, 1_050).await.expect("touch").is_none(), "{other:?}");
        assert!(!store.set_session_log_level([7; 32], &other, "debug", 1_050).await.expect("level"));
        assert!(!store.subscribe_session([7; 32], &other, "test://x", 1_050).await.expect("subscribe"));
        assert!(store.session_subscriptions([7; 32], &other, 1_050).await.expect("list").is_none());
        assert!(!store.delete_session([7; 32], &other).await.expect("delete"), "{other:?} deleted it");
    }
    assert!(store.touch_session([8; 32], &alice, 1_050).await.expect("touch").is_none());
    let duplicate = store.insert_session(sample_session(7, &session_owner(9, "", "cli"))).await;
    assert!(matches!(duplicate, Err(StoreError::Conflict { .. })), "{duplicate:?}");
    let mut bad = sample_session(3, &alice);
    bad.client_capabilities = "[1]".into();
    assert!(matches!(store.insert_session(bad).await, Err(StoreError::InvalidRecord { .. })));
    assert!(store.touch_session([3; 32], &alice, 1_050).await.expect("touch").is_none());
    assert!(store.touch_session([7; 32], &alice, 1_060).await.expect("touch").is_some());
    fixture.cleanup().await;
}

/// Idle expiry (restarted by every touch) and absolute expiry (not restarted), at the exact
/// instant; dead sessions are purged in bounded batches.
pub async fn session_expires_idle_and_absolute(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = session_owner(1, "t", "c");
    store.insert_session(sample_session(1, &alice)).await.expect("insert");
    store.insert_session(sample_session(2, &alice)).await.expect("insert");
    // Idle: last seen at 1_000, idle 100: live at 1_099, dead at 1_100.
    assert!(store.touch_session([1; 32], &alice, 1_099).await.expect("touch").is_some());
    // The touch at 1_099 restarted the idle timeout: live until 1_199.
    assert!(store.touch_session([1; 32], &alice, 1_198).await.expect("touch").is_some());
    assert!(store.touch_session([2; 32], &alice, 1_100).await.expect("touch").is_none(), "idle expiry missed");
    // A dead session stays dead: a later touch does not revive it.
    assert!(store.touch_session([2; 32], &alice, 1_101).await.expect("touch").is_none());
    // Absolute: keep it active right up to 2_000, then it dies whatever the activity.
    let mut now = 1_198;
    while now < 1_999 {
        now = (now + 90).min(1_999);
        assert!(store.touch_session([1; 32], &alice, now).await.expect("touch").is_some(), "at {now}");
    }
    assert!(store.touch_session([1; 32], &alice, 2_000).await.expect("touch").is_none(), "absolute expiry missed");
    store.insert_session(sample_session(3, &alice)).await.expect("insert");
    assert_eq!(store.purge_sessions(2_000, 1).await.expect("purge"), 1);
    assert_eq!(store.purge_sessions(2_000, 10).await.expect("purge"), 2);
    assert_eq!(store.purge_sessions(2_000, 10).await.expect("purge"), 0);
    fixture.cleanup().await;
}

/// Log level and subscriptions are stored per session, visible from another instance, bounded,
/// and gone with the session once deleted.
pub async fn session_state_is_shared_and_deleted_with_the_session(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let alice = session_owner(1, "t", "c");
    store.insert_session(sample_session(1, &alice)).await.expect("insert");
    assert!(store.set_session_log_level([1; 32], &alice, "warning", 1_010).await.expect("level"));
    assert!(store.subscribe_session([1; 32], &alice, "test://b", 1_010).await.expect("subscribe"));
    assert!(store.subscribe_session([1; 32], &alice, "test://a", 1_010).await.expect("subscribe"));
    assert!(store.subscribe_session([1; 32], &alice, "test://a", 1_010).await.expect("subscribe again"));
    let seen = other.touch_session([1; 32], &alice, 1_020).await.expect("touch").expect("live on another instance");
    assert_eq!(seen.log_level.as_deref(), Some("warning"));
    let uris = other.session_subscriptions([1; 32], &alice, 1_020).await.expect("list").expect("live");
    assert_eq!(uris, ["test://a", "test://b"]);
    assert!(other.unsubscribe_session([1; 32], &alice, "test://b", 1_030).await.expect("unsubscribe"));
    assert_eq!(store.session_subscriptions([1; 32], &alice, 1_030).await.expect("list").expect("live"), ["test://a"]);
    // Bad input changes nothing.
    let empty = store.subscribe_session([1; 32], &alice, "", 1_030).await;
    assert!(matches!(empty, Err(StoreError::InvalidRecord { .. })), "{empty:?}");
    let long_level = store.set_session_log_level([1; 32], &alice, &"x".repeat(17), 1_030).await;
    assert!(matches!(long_level, Err(StoreError::InvalidRecord { .. })), "{long_level:?}");
    for n in 1..crate::MAX_SESSION_SUBSCRIPTIONS {
        let uri = format!("test://n/{n}");
        assert!(store.subscribe_session([1; 32], &alice, &uri, 1_040).await.expect("subscribe"));
    }
    let full = store.subscribe_session([1; 32], &alice, "test://one-too-many", 1_040).await;
    assert!(matches!(full, Err(StoreError::InvalidRecord { .. })), "{full:?}");
    assert!(store.delete_session([1; 32], &alice).await.expect("delete"));
    assert!(!store.delete_session([1; 32], &alice).await.expect("delete again"));
    assert!(other.touch_session([1; 32], &alice, 1_050).await.expect("touch").is_none());
    assert!(other.session_subscriptions([1; 32], &alice, 1_050).await.expect("list").is_none());
    // A new session under the same digest starts with no subscriptions.
    store.insert_session(sample_session(1, &alice)).await.expect("insert");
    assert_eq!(store.session_subscriptions([1; 32], &alice, 1_050).await.expect("list"), Some(Vec::new()));
    fixture.cleanup().await;
}

/// A store that is down refuses every session operation with `Unavailable` (fail closed).
pub async fn closed_store_refuses_session_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let alice = session_owner(1, "t", "c");
    store.insert_session(sample_session(1, &alice)).await.expect("insert");
    store.close().await;
    expect_unavailable(store.touch_session([1; 32], &alice, 1_010).await, "touch_session");
    expect_unavailable(store.insert_session(sample_session(2, &alice)).await, "insert_session");
    expect_unavailable(store.set_session_log_level([1; 32], &alice, "info", 1_010).await, "set_session_log_level");
    expect_unavailable(store.subscribe_session([1; 32], &alice, "test://a", 1_010).await, "subscribe_session");
    expect_unavailable(store.delete_session([1; 32], &alice).await, "delete_session");
    expect_unavailable(store.purge_sessions(5_000, 5).await, "purge_sessions");
    fixture.cleanup().await;
}

// ---- Single-use records -----------------------------------------------------------------------

/// A digest numbered `n`, with a last byte that differs from every other test digest's.
fn once_digest(n: u8) -> [u8; 32] {
    let mut digest = [n; 32];
    digest[31] = n.wrapping_mul(31).wrapping_add(7);
    digest
}

/// The first use is `true`, every later one `false`, from this instance or another; another
/// digest (even one bit away) is its own first use.
pub async fn once_record_is_used_exactly_once(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    assert!(store.consume_once(once_digest(1), 10_000).await.expect("consume"), "first use");
    assert!(!store.consume_once(once_digest(1), 10_000).await.expect("consume"), "second use");
    assert!(!other.consume_once(once_digest(1), 10_000).await.expect("consume"), "second use, another instance");
    assert!(!store.consume_once(once_digest(1), 20_000).await.expect("consume"), "a later expiry is no new use");
    assert!(other.consume_once(once_digest(2), 10_000).await.expect("consume"), "another digest");
    assert!(!store.consume_once(once_digest(2), 10_000).await.expect("consume"), "seen from the first instance");
    let mut near = once_digest(1);
    near[0] ^= 1;
    assert!(store.consume_once(near, 10_000).await.expect("consume"), "a near-miss digest is another record");
    other.close().await;
    fixture.cleanup().await;
}

/// Expiry never re-allows: a record past its expiry but not purged yet still answers `false`;
/// only once purged can the digest be used again.
pub async fn expired_once_record_stays_used_until_purged(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    assert!(store.consume_once(once_digest(1), 1_000).await.expect("consume"));
    // `expires_ms` is in the past for any caller's clock; the store has no clock of its own.
    assert!(!store.consume_once(once_digest(1), 1_000).await.expect("consume"), "expired, not purged");
    assert!(!store.consume_once(once_digest(1), i64::MAX).await.expect("consume"), "expired, not purged");
    // The second call did not extend the record: it goes with the first expiry.
    assert_eq!(store.purge_once(999, 10).await.expect("purge"), 0);
    assert!(!store.consume_once(once_digest(1), 1_000).await.expect("consume"));
    assert_eq!(store.purge_once(1_000, 10).await.expect("purge"), 1);
    assert!(store.consume_once(once_digest(1), 5_000).await.expect("consume"), "purged: usable again");
    fixture.cleanup().await;
}

/// A purge deletes only records whose expiry is at or before `now_ms` (the exact instant
/// included), at most `limit` per call; the rest stay used.
pub async fn once_purge_takes_only_expired_records_and_is_bounded(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let expiries = [(1, 1_000), (2, 1_999), (3, 2_000), (4, 2_001), (5, 3_000), (6, 3_000), (7, 3_000)];
    for (n, expires_ms) in expiries {
        assert!(store.consume_once(once_digest(n), expires_ms).await.expect("consume"), "{n}");
    }
    assert_eq!(store.purge_once(999, 10).await.expect("purge"), 0, "nothing expired yet");
    assert_eq!(store.purge_once(2_000, 0).await.expect("purge"), 0, "limit 0");
    assert_eq!(store.purge_once(2_000, 10).await.expect("purge"), 3, "1, 2 and 3 (at the instant)");
    assert_eq!(store.purge_once(2_000, 10).await.expect("purge"), 0);
    for n in 4..=7 {
        assert!(!store.consume_once(once_digest(n), 9_000).await.expect("consume"), "{n} must survive the purge");
    }
    assert_eq!(store.purge_once(3_000, 2).await.expect("purge"), 2, "bounded by the limit");
    assert_eq!(store.purge_once(3_000, 2).await.expect("purge"), 2);
    assert_eq!(store.purge_once(3_000, 2).await.expect("purge"), 0);
    for n in 1..=7 {
        assert!(store.consume_once(once_digest(n), 9_000).await.expect("consume"), "{n} was purged");
    }
    fixture.cleanup().await;
}

/// 16 concurrent claims of one digest, spread over two instances: exactly one is the first use.
/// Repeated over several digests so that a lucky interleaving does not hide a race.
pub async fn racing_consumers_of_one_digest_get_exactly_one_first_use(harness: &dyn Harness) {
    const RACERS: usize = 16;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    for round in 1..=5u8 {
        let digest = once_digest(round);
        let mut tasks = tokio::task::JoinSet::new();
        for racer in 0..RACERS {
            let instance = instances[racer % instances.len()].clone();
            tasks.spawn(async move { instance.consume_once(digest, 60_000).await });
        }
        let mut firsts = 0;
        while let Some(joined) = tasks.join_next().await {
            if joined.expect("consumer task").expect("consume_once") {
                firsts += 1;
            }
        }
        assert_eq!(firsts, 1, "round {round}: {firsts} of {RACERS} racing claims were the first use");
        for instance in &instances {
            assert!(!instance.consume_once(digest, 60_000).await.expect("consume"), "round {round}: used");
        }
    }
    instances[1].close().await;
    fixture.cleanup().await;
}

/// A store that is down answers every single-use operation with `Unavailable`, never `true`
/// (fail closed), and a digest refused that way is still usable once the store is back.
pub async fn closed_store_refuses_once_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    assert!(store.consume_once(once_digest(1), 10_000).await.expect("consume"));
    store.close().await;
    expect_unavailable(store.consume_once(once_digest(1), 10_000).await, "consume_once (used digest)");
    expect_unavailable(store.consume_once(once_digest(2), 10_000).await, "consume_once (new digest)");
    expect_unavailable(store.purge_once(20_000, 10).await, "purge_once");
    // The refused calls wrote nothing: the storage still holds the first use only.
    assert!(!other.consume_once(once_digest(1), 10_000).await.expect("consume"));
    assert!(other.consume_once(once_digest(2), 10_000).await.expect("consume"));
    other.close().await;
    fixture.cleanup().await;
}

// ---- Pins -------------------------------------------------------------------------------------

/// The SHA-256 of `definition`, as a pin digest (64 lowercase hex digits).
pub fn pin_digest(definition: &str) -> String {
    palisade_base::hex::hex(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, definition.as_bytes()).as_ref())
}

/// An observation of the definition `name` of `kind` on `upstream` (URL
/// `https://<upstream>.example/mcp`), in `version` of its text, seen at `seen_at_ms`.
pub fn sample_pin(
    pin_id: &str,
    upstream: &str,
    kind: &str,
    name: &str,
    version: u32,
    seen_at_ms: i64,
) -> PinObservation {
    let definition = if kind == "instructions" {
        serde_json::Value::String(format!("Instructions, version {version}."))
    } else {
        serde_json::json!({ "name": name, "description": format!("Version {version} — ünïcode."), "inputSchema": {} })
    };
    let definition = definition.to_string();
    PinObservation {
        pin_id: pin_id.into(),
        upstream_id: upstream.into(),
        upstream_url: format!("https://{upstream}.example/mcp"),
        kind: kind.into(),
        name: name.into(),
        digest: pin_digest(&definition),
        definition,
        seen_at_ms,
    }
}

/// A decision on `digest` of `pin_id`.
pub fn sample_decision(pin_id: &str, digest: &str, verdict: PinVerdict, at_ms: i64) -> PinDecision {
    PinDecision {
        pin_id: pin_id.into(),
        digest: digest.into(),
        verdict,
        reviewer: format!("reviewer at {at_ms}"),
        note: Some(format!("looked at it at {at_ms}\nall fine")),
        signature: Some("bm90IGEgcmVhbCBzaWduYXR1cmU+/w==".into()),
        decided_at_ms: at_ms,
    }
}

async fn expect_pin(store: &dyn Store, pin_id: &str) -> PinRow {
    store.pin(pin_id).await.expect("pin").unwrap_or_else(|| panic!("pin {pin_id} should exist"))
}

fn expect_invalid<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(matches!(result, Err(StoreError::InvalidRecord { .. })), "{what}: expected InvalidRecord, got {result:?}");
}

/// An observation reads back whole, from this instance and another; observing it again keeps
/// its first sighting and takes the new digest, definition and time; a pin id observed under
/// another identity is refused with the whole batch.
pub async fn pins_round_trip_and_reobservation_keeps_first_seen(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    assert!(store.pins(None).await.expect("pins").is_empty());
    assert_eq!(store.pin("weather-tool-forecast").await.expect("pin"), None);
    store.observe_pins(Vec::new()).await.expect("an empty batch is a no-op");
    let forecast = sample_pin("weather-tool-forecast", "weather", "tool", "forecast", 1, 100);
    let instructions = sample_pin("weather-instructions", "weather", "instructions", "", 1, 100);
    // A stdio upstream's launch is a pin too (nameless, like instructions; migration 0008).
    let launch = sample_pin("weather-launch", "weather", "launch", "", 1, 100);
    store.observe_pins(vec![forecast.clone(), instructions.clone(), launch.clone()]).await.expect("observe");
    assert_eq!(expect_pin(store.as_ref(), "weather-launch").await.observation, launch);
    let expected =
        PinRow { observation: forecast.clone(), first_seen_ms: 100, decision: None, decided_definition: None };
    assert_eq!(expect_pin(store.as_ref(), "weather-tool-forecast").await, expected);
    assert_eq!(expect_pin(other.as_ref(), "weather-tool-forecast").await, expected, "another instance");
    assert_eq!(expect_pin(store.as_ref(), "weather-instructions").await.observation, instructions);

    // Changed text: new digest and definition, same first sighting.
    let changed = sample_pin("weather-tool-forecast", "weather", "tool", "forecast", 2, 200);
    assert_ne!(changed.digest, forecast.digest);
    other.observe_pins(vec![changed.clone()]).await.expect("observe again");
    let row = expect_pin(store.as_ref(), "weather-tool-forecast").await;
    assert_eq!((row.observation, row.first_seen_ms, row.decision), (changed.clone(), 100, None));
    // The same text seen later: only the time moves.
    let again = sample_pin("weather-tool-forecast", "weather", "tool", "forecast", 2, 300);
    store.observe_pins(vec![again.clone()]).await.expect("observe unchanged");
    let row = expect_pin(store.as_ref(), "weather-tool-forecast").await;
    assert_eq!((row.observation, row.first_seen_ms), (again.clone(), 100));

    // One pin id is one identity: another URL, kind or name under it refuses the whole batch.
    let newcomer = sample_pin("weather-tool-radar", "weather", "tool", "radar", 1, 400);
    let mut moved = sample_pin("weather-tool-forecast", "weather", "tool", "forecast", 3, 400);
    moved.upstream_url = "https://elsewhere.example/mcp".into();
    let mut renamed = sample_pin("weather-tool-forecast", "weather", "tool", "forecast_v2", 3, 400);
    renamed.definition = moved.definition.clone();
    let mut rekinded = sample_pin("weather-tool-forecast", "weather", "prompt", "forecast", 3, 400);
    rekinded.definition = moved.definition.clone();
    let mut other_upstream = sample_pin("weather-tool-forecast", "climate", "tool", "forecast", 3, 400);
    other_upstream.upstream_url = again.upstream_url.clone();
    for conflicting in [moved, renamed, rekinded, other_upstream] {
        let result = store.observe_pins(vec![newcomer.clone(), conflicting.clone()]).await;
        expect_invalid(result, &format!("{conflicting:?}"));
    }
    assert_eq!(store.pin("weather-tool-radar").await.expect("pin"), None, "the batch was rolled back");
    let row = expect_pin(store.as_ref(), "weather-tool-forecast").await;
    assert_eq!((row.observation, row.first_seen_ms), (again, 100), "the conflicting pin is unchanged");
    assert_eq!(store.pins(None).await.expect("pins").len(), 3);
    other.close().await;
    fixture.cleanup().await;
}

/// A decision is recorded only on the digest the pin has now: the matching digest is recorded
/// with the definition it was made on; a digest from before the definition changed, or an
/// unknown pin, records nothing; observations never touch a decision.
pub async fn pin_decision_needs_the_current_digest(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let shown = sample_pin("docs-tool-search", "docs", "tool", "search", 1, 100);
    store.observe_pins(vec![shown.clone()]).await.expect("observe");
    let approval = sample_decision("docs-tool-search", &shown.digest, PinVerdict::Approved, 150);
    assert!(store.decide_pin(approval.clone()).await.expect("decide"), "the current digest is decided");
    let row = expect_pin(store.as_ref(), "docs-tool-search").await;
    assert_eq!(row.decision.as_ref(), Some(&approval));
    assert_eq!(row.decided_definition.as_deref(), Some(shown.definition.as_str()));
    assert_eq!(row.observation, shown);

    // The definition changes (a rug pull); the decision stays as it was, on the old digest.
    let pulled = sample_pin("docs-tool-search", "docs", "tool", "search", 2, 200);
    store.observe_pins(vec![pulled.clone()]).await.expect("observe the change");
    let held = expect_pin(store.as_ref(), "docs-tool-search").await;
    assert_eq!(held.observation, pulled);
    assert_eq!(held.decision.as_ref(), Some(&approval), "observing does not touch the decision");
    assert_eq!(held.decided_definition.as_deref(), Some(shown.definition.as_str()));

    // A reviewer who was shown the old text cannot approve (or reject) the new one.
    for verdict in [PinVerdict::Approved, PinVerdict::Rejected] {
        let stale = sample_decision("docs-tool-search", &shown.digest, verdict, 250);
        assert!(!store.decide_pin(stale).await.expect("decide"), "a stale digest is not decided");
    }
    assert_eq!(expect_pin(store.as_ref(), "docs-tool-search").await, held, "nothing changed");

    // An unknown pin: nothing recorded, nothing created.
    let unknown = sample_decision("docs-tool-missing", &shown.digest, PinVerdict::Approved, 260);
    assert!(!store.decide_pin(unknown).await.expect("decide"));
    assert_eq!(store.pin("docs-tool-missing").await.expect("pin"), None);

    // Shown the new text, the reviewer decides it.
    let fresh = sample_decision("docs-tool-search", &pulled.digest, PinVerdict::Approved, 300);
    assert!(store.decide_pin(fresh.clone()).await.expect("decide"));
    let row = expect_pin(store.as_ref(), "docs-tool-search").await;
    assert_eq!(row.decision, Some(fresh));
    assert_eq!(row.decided_definition.as_deref(), Some(pulled.definition.as_str()));
    assert_eq!(row.first_seen_ms, 100);
    fixture.cleanup().await;
}

/// A later decision replaces the earlier one whole (verdict, reviewer, note, signature, time),
/// on every instance.
pub async fn pin_rejection_replaces_an_approval(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let pin = sample_pin("mail-prompt-draft", "mail", "prompt", "draft", 1, 100);
    store.observe_pins(vec![pin.clone()]).await.expect("observe");
    let approval = sample_decision("mail-prompt-draft", &pin.digest, PinVerdict::Approved, 110);
    assert!(store.decide_pin(approval).await.expect("approve"));
    let rejection = PinDecision {
        pin_id: "mail-prompt-draft".into(),
        digest: pin.digest.clone(),
        verdict: PinVerdict::Rejected,
        reviewer: "second reviewer".into(),
        note: None,
        signature: None,
        decided_at_ms: 120,
    };
    assert!(other.decide_pin(rejection.clone()).await.expect("reject"));
    let row = expect_pin(store.as_ref(), "mail-prompt-draft").await;
    assert_eq!(row.decision, Some(rejection), "the rejection replaced the approval, note and signature included");
    assert_eq!(row.decided_definition.as_deref(), Some(pin.definition.as_str()));
    let again = sample_decision("mail-prompt-draft", &pin.digest, PinVerdict::Approved, 130);
    assert!(store.decide_pin(again.clone()).await.expect("approve again"));
    assert_eq!(expect_pin(other.as_ref(), "mail-prompt-draft").await.decision, Some(again.clone()));
    // The decisions alone (what a running gateway polls): only decided pins, the latest each.
    let undecided = sample_pin("mail-tool-send", "mail", "tool", "send", 2, 140);
    store.observe_pins(vec![undecided]).await.expect("observe another");
    assert_eq!(other.pin_decisions().await.expect("decisions"), vec![again]);
    other.close().await;
    fixture.cleanup().await;
}

/// The listing is ordered by (upstream id, kind, name) comparing bytes, the same on every
/// backend, and filters by upstream exactly.
pub async fn pins_are_listed_by_upstream_in_order(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    // Given out of order, with names whose byte order differs from a natural-language order.
    let pins = vec![
        sample_pin("beta-tool-b", "beta", "tool", "b", 1, 100),
        sample_pin("alpha-tool-zeta", "alpha", "tool", "zeta", 1, 100),
        sample_pin("alpha-prompt-ab", "alpha", "prompt", "ab", 1, 100),
        sample_pin("alpha-tool-upper", "alpha", "tool", "Zeta", 1, 100),
        sample_pin("alpha-instructions", "alpha", "instructions", "", 1, 100),
        sample_pin("alpha-prompt-a-b", "alpha", "prompt", "a_b", 1, 100),
        sample_pin("alpha-resource", "alpha", "resource", "file:///a", 1, 100),
        sample_pin("alpha-template", "alpha", "resource_template", "file:///{path}", 1, 100),
        sample_pin("alpha-beta-tool-a", "alpha-beta", "tool", "a", 1, 100),
        sample_pin("beta-prompt-b", "beta", "prompt", "b", 1, 100),
    ];
    store.observe_pins(pins.clone()).await.expect("observe");
    let mut expected = pins.clone();
    expected.sort_by(|a, b| (&a.upstream_id, &a.kind, &a.name).cmp(&(&b.upstream_id, &b.kind, &b.name)));
    let ids = |rows: Vec<PinRow>| rows.into_iter().map(|row| row.observation.pin_id).collect::<Vec<_>>();
    let all = ids(store.pins(None).await.expect("pins"));
    assert_eq!(all, expected.iter().map(|pin| pin.pin_id.clone()).collect::<Vec<_>>());
    assert_eq!(
        all[..7],
        [
            "alpha-instructions",
            "alpha-prompt-a-b",
            "alpha-prompt-ab",
            "alpha-resource",
            "alpha-template",
            "alpha-tool-upper",
            "alpha-tool-zeta"
        ]
    );
    let alpha = store.pins(Some("alpha")).await.expect("pins of alpha");
    assert!(alpha.iter().all(|row| row.observation.upstream_id == "alpha" && row.decision.is_none()));
    assert_eq!(ids(alpha), all[..7]);
    assert_eq!(ids(store.pins(Some("beta")).await.expect("pins of beta")), ["beta-prompt-b", "beta-tool-b"]);
    assert_eq!(ids(store.pins(Some("alpha-beta")).await.expect("pins")), ["alpha-beta-tool-a"]);
    assert!(store.pins(Some("gamma")).await.expect("pins of gamma").is_empty());
    assert!(store.pins(Some("ALPHA")).await.expect("pins").is_empty(), "upstream ids compare exactly");
    expect_invalid(store.pins(Some("alpha/../beta")).await, "an impossible upstream id");
    expect_invalid(store.pins(Some("")).await, "an empty upstream id");
    fixture.cleanup().await;
}

/// Breaks one field of an observation.
type BreakObservation = fn(&mut PinObservation);
/// Breaks one field of a decision.
type BreakDecision = fn(&mut PinDecision);

/// Bad observations and decisions are refused with `InvalidRecord` and write nothing: not the
/// bad row, not the valid rows of its batch, not a decision.
pub async fn invalid_pins_are_refused_and_nothing_is_written(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let valid = sample_pin("shop-tool-buy", "shop", "tool", "buy", 1, 100);
    let broken: Vec<(&str, BreakObservation)> = vec![
        ("uppercase digest", |pin| pin.digest = pin.digest.to_uppercase()),
        ("short digest", |pin| pin.digest.truncate(63)),
        ("too-long name", |pin| pin.name = "n".repeat(crate::MAX_PIN_TEXT_BYTES + 1)),
        ("unknown kind", |pin| pin.kind = "widget".into()),
        ("bad pin id", |pin| pin.pin_id = "Shop Tool".into()),
        ("too-long upstream id", |pin| pin.upstream_id = "u".repeat(64)),
        ("too-long URL", |pin| pin.upstream_url = format!("https://x/{}", "a".repeat(2048))),
        ("definition not JSON", |pin| pin.definition = "{".into()),
        ("named instructions", |pin| pin.kind = "instructions".into()),
        ("named launch", |pin| pin.kind = "launch".into()),
        ("negative time", |pin| pin.seen_at_ms = -1),
    ];
    for (what, break_it) in broken {
        let mut bad = sample_pin("shop-tool-sell", "shop", "tool", "sell", 1, 100);
        break_it(&mut bad);
        expect_invalid(store.observe_pins(vec![valid.clone(), bad]).await, what);
        assert!(store.pins(None).await.expect("pins").is_empty(), "{what}: the batch wrote something");
    }
    expect_invalid(store.observe_pins(vec![valid.clone(), valid.clone()]).await, "a pin id twice in a batch");
    assert!(store.pins(None).await.expect("pins").is_empty(), "duplicate ids: the batch wrote something");

    store.observe_pins(vec![valid.clone()]).await.expect("observe");
    let before = expect_pin(store.as_ref(), "shop-tool-buy").await;
    let broken: Vec<(&str, BreakDecision)> = vec![
        ("bad digest", |decision| decision.digest = "x".repeat(64)),
        ("too-long reviewer", |decision| decision.reviewer = "r".repeat(201)),
        ("empty reviewer", |decision| decision.reviewer.clear()),
        ("too-long note", |decision| decision.note = Some("n".repeat(4097))),
        ("signature not base64", |decision| decision.signature = Some("not base64!".into())),
        ("bad pin id", |decision| decision.pin_id = "shop tool buy".into()),
    ];
    for (what, break_it) in broken {
        let mut decision = sample_decision("shop-tool-buy", &valid.digest, PinVerdict::Approved, 200);
        break_it(&mut decision);
        expect_invalid(store.decide_pin(decision).await, what);
        assert_eq!(expect_pin(store.as_ref(), "shop-tool-buy").await, before, "{what}: the pin changed");
    }
    expect_invalid(store.pin("Shop-Tool-Buy").await, "an impossible pin id");
    expect_invalid(store.pin("").await, "an empty pin id");
    fixture.cleanup().await;
}

/// Two instances race: one keeps changing a definition between two texts, the other keeps
/// deciding on the first text's digest. Whatever the interleaving, a recorded decision is always
/// paired with the definition whose digest it names, and it succeeds only while that text is
/// current.
pub async fn racing_observations_never_pair_a_decision_with_another_definition(harness: &dyn Harness) {
    const ROUNDS: i64 = 60;
    let fixture = harness.fresh().await;
    let observer = fixture.store();
    let decider = fixture.another_instance().await;
    let first = sample_pin("race-tool-t", "race", "tool", "t", 1, 0);
    let second = sample_pin("race-tool-t", "race", "tool", "t", 2, 0);
    observer.observe_pins(vec![first.clone()]).await.expect("observe");
    let observing = {
        let (observer, first, second) = (observer.clone(), first.clone(), second.clone());
        tokio::spawn(async move {
            for round in 1..=ROUNDS {
                let mut next = if round % 2 == 1 { second.clone() } else { first.clone() };
                next.seen_at_ms = round;
                observer.observe_pins(vec![next]).await.expect("observe");
            }
        })
    };
    let deciding = {
        let (decider, digest) = (decider.clone(), first.digest.clone());
        tokio::spawn(async move {
            let mut recorded = 0;
            for round in 1..=ROUNDS {
                let verdict = if round % 2 == 0 { PinVerdict::Approved } else { PinVerdict::Rejected };
                if decider.decide_pin(sample_decision("race-tool-t", &digest, verdict, round)).await.expect("decide") {
                    recorded += 1;
                }
                let row = expect_pin(decider.as_ref(), "race-tool-t").await;
                if let (Some(decision), Some(text)) = (&row.decision, &row.decided_definition) {
                    assert_eq!(pin_digest(text), decision.digest, "round {round}: decision paired with another text");
                }
            }
            recorded
        })
    };
    observing.await.expect("observer task");
    let recorded = deciding.await.expect("decider task");
    // The observer's last write (an even round) restored the first text: one more decision
    // must be recorded, with that text.
    let last = sample_decision("race-tool-t", &first.digest, PinVerdict::Approved, ROUNDS + 1);
    assert!(decider.decide_pin(last.clone()).await.expect("decide"));
    let row = expect_pin(observer.as_ref(), "race-tool-t").await;
    assert_eq!(row.decision, Some(last));
    assert_eq!(row.decided_definition.as_deref(), Some(first.definition.as_str()));
    assert!(recorded <= ROUNDS);
    decider.close().await;
    fixture.cleanup().await;
}

/// A store that is down refuses every pin operation with `Unavailable` (fail closed), and the
/// refused calls wrote nothing.
pub async fn closed_store_refuses_pin_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let pin = sample_pin("ops-tool-restart", "ops", "tool", "restart", 1, 100);
    store.observe_pins(vec![pin.clone()]).await.expect("observe");
    store.close().await;
    let changed = sample_pin("ops-tool-restart", "ops", "tool", "restart", 2, 200);
    expect_unavailable(store.observe_pins(vec![changed]).await, "observe_pins");
    let approval = sample_decision("ops-tool-restart", &pin.digest, PinVerdict::Approved, 300);
    expect_unavailable(store.decide_pin(approval).await, "decide_pin");
    expect_unavailable(store.pin("ops-tool-restart").await, "pin");
    expect_unavailable(store.pins(None).await, "pins");
    expect_unavailable(store.pins(Some("ops")).await, "pins of one upstream");
    let row = expect_pin(other.as_ref(), "ops-tool-restart").await;
    assert_eq!((row.observation, row.decision), (pin, None));
    other.close().await;
    fixture.cleanup().await;
}

// ---- Delegations ------------------------------------------------------------------------------

/// A delegation digest numbered `n` (distinct from every other test digest).
pub fn delegation_digest(n: u8) -> [u8; 32] {
    let mut digest = [0xd0; 32];
    digest[0] = n;
    digest[31] = n.wrapping_mul(13).wrapping_add(1);
    digest
}

/// The keyed digest of principal number `n`.
fn principal(n: u8) -> [u8; 32] {
    [0x50_u8.wrapping_add(n); 32]
}

/// A delegation numbered `n` under the parent numbered `parent` (a root for `None`), acting for
/// principal 1 with a budget of `calls`, created at 1_000 + n and expiring at 10_000.
pub fn sample_delegation(n: u8, parent: Option<u8>, calls: i64) -> NewDelegation {
    NewDelegation {
        digest: delegation_digest(n),
        parent: parent.map(delegation_digest),
        principal_key: principal(1),
        agent: format!("agent-{n}"),
        body: format!(r#"{{"tools":["tool_{n}"],"note":"ünïcode"}}"#),
        expires_ms: 10_000,
        calls,
        created_ms: 1_000 + i64::from(n),
    }
}

async fn mint_ok(store: &dyn Store, new: NewDelegation, max_depth: u32) -> DelegationRow {
    let what = format!("{new:?}");
    match store.mint_delegation(new, max_depth).await.expect("mint_delegation") {
        Ok(row) => row,
        Err(refusal) => panic!("{what}: refused: {}", refusal.reason()),
    }
}

/// Every row in the store, newest first.
async fn all_delegations(store: &dyn Store) -> Vec<DelegationRow> {
    store.delegations(None, MAX_DELEGATION_LIST).await.expect("delegations")
}

/// The stored row of `n` (the last of its chain).
async fn delegation_row(store: &dyn Store, n: u8) -> DelegationRow {
    let chain = store.delegation_chain(delegation_digest(n)).await.expect("delegation_chain");
    chain.last().cloned().unwrap_or_else(|| panic!("delegation {n} should exist"))
}

/// A root and two generations below it: each mint returns the row as stored (root, depth,
/// parent, budget), each child's budget comes out of its parent's `remaining`, and a chain reads
/// back root first from either instance. A chain whose root is gone starts below it.
pub async fn delegation_chain_links_root_to_grandchild(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    assert!(store.delegation_chain(delegation_digest(1)).await.expect("chain").is_empty(), "unknown digest");
    let root = mint_ok(store.as_ref(), sample_delegation(1, None, 10), 0).await;
    let expected_root = DelegationRow {
        digest: delegation_digest(1),
        parent: None,
        root: delegation_digest(1),
        depth: 0,
        principal_key: principal(1),
        agent: "agent-1".into(),
        body: sample_delegation(1, None, 10).body,
        expires_ms: 10_000,
        calls: 10,
        remaining: 10,
        created_ms: 1_001,
        revoked_ms: None,
    };
    assert_eq!(root, expected_root);
    let child = mint_ok(other.as_ref(), sample_delegation(2, Some(1), 4), 4).await;
    assert_eq!((child.parent, child.root, child.depth), (Some(delegation_digest(1)), delegation_digest(1), 1));
    assert_eq!((child.calls, child.remaining), (4, 4));
    let grandchild = mint_ok(store.as_ref(), sample_delegation(3, Some(2), 1), 4).await;
    assert_eq!((grandchild.parent, grandchild.root, grandchild.depth), (Some(delegation_digest(2)), root.root, 2));
    assert_eq!((grandchild.calls, grandchild.remaining), (1, 1));

    for instance in [&store, &other] {
        let chain = instance.delegation_chain(delegation_digest(3)).await.expect("chain");
        let digests: Vec<[u8; 32]> = chain.iter().map(|row| row.digest).collect();
        assert_eq!(digests, vec![delegation_digest(1), delegation_digest(2), delegation_digest(3)], "root first");
        assert_eq!(chain.iter().map(|row| row.depth).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(chain.iter().all(|row| row.root == delegation_digest(1)), "{chain:?}");
        assert_eq!(chain.iter().map(|row| row.remaining).collect::<Vec<_>>(), vec![6, 3, 1], "budgets moved down");
        assert_eq!(chain[0], DelegationRow { remaining: 6, ..expected_root.clone() });
        assert_eq!(chain[2], grandchild);
    }
    let chain = store.delegation_chain(delegation_digest(2)).await.expect("chain");
    assert_eq!(
        chain.iter().map(|row| row.digest).collect::<Vec<_>>(),
        vec![delegation_digest(1), delegation_digest(2)]
    );
    // A second child may take exactly what the root has left.
    let second = mint_ok(store.as_ref(), sample_delegation(4, Some(1), 6), 4).await;
    assert_eq!((second.depth, second.remaining), (1, 6));
    assert_eq!(delegation_row(store.as_ref(), 1).await.remaining, 0);
    assert_eq!(all_delegations(store.as_ref()).await.len(), 4);

    fixture.tamper("DELETE FROM delegations WHERE depth = 0").await;
    let chain = store.delegation_chain(delegation_digest(3)).await.expect("chain");
    assert_eq!(
        chain.iter().map(|row| (row.digest, row.depth)).collect::<Vec<_>>(),
        vec![(delegation_digest(2), 1), (delegation_digest(3), 2)]
    );
    other.close().await;
    fixture.cleanup().await;
}

/// Mints `new` expecting `refusal`, and checks that no row changed (not the parent's budget, not
/// the number of rows).
async fn expect_refusal(store: &dyn Store, new: NewDelegation, max_depth: u32, refusal: MintRefusal, what: &str) {
    let before = all_delegations(store).await;
    let result = store.mint_delegation(new, max_depth).await.expect("mint_delegation");
    assert_eq!(result.err(), Some(refusal), "{what}");
    assert_eq!(all_delegations(store).await, before, "{what}: a refused mint changed the rows");
}

/// Each refusal, in its own case and at its exact edge, with every row unchanged after it; the
/// mint just inside each edge is accepted.
pub async fn every_mint_refusal_leaves_every_row_unchanged(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let store = store.as_ref();
    mint_ok(store, sample_delegation(1, None, 10), 0).await;
    mint_ok(store, sample_delegation(2, Some(1), 4), 8).await;
    mint_ok(store, sample_delegation(3, None, 10), 0).await;
    assert!(store.revoke_delegation(delegation_digest(3), 1_500).await.expect("revoke"));
    mint_ok(store, NewDelegation { expires_ms: 2_000, ..sample_delegation(4, None, 10) }, 0).await;

    let unknown = sample_delegation(10, Some(99), 1);
    expect_refusal(store, unknown, 8, MintRefusal::ParentUnknown, "unknown parent").await;
    let revoked = sample_delegation(10, Some(3), 1);
    expect_refusal(store, revoked, 8, MintRefusal::ParentRevoked, "revoked parent").await;
    let at_expiry = NewDelegation { created_ms: 2_000, expires_ms: 2_001, ..sample_delegation(10, Some(4), 1) };
    expect_refusal(store, at_expiry, 8, MintRefusal::ParentExpired, "parent expires at the child's creation").await;
    let after_expiry = NewDelegation { created_ms: 5_000, expires_ms: 6_000, ..sample_delegation(10, Some(4), 1) };
    expect_refusal(store, after_expiry, 8, MintRefusal::ParentExpired, "parent expired before").await;
    let before_expiry = NewDelegation { created_ms: 1_999, expires_ms: 2_000, ..sample_delegation(10, Some(4), 1) };
    assert_eq!(mint_ok(store, before_expiry, 8).await.depth, 1, "a parent live at creation");
    let stranger = NewDelegation { principal_key: principal(2), ..sample_delegation(11, Some(1), 1) };
    expect_refusal(store, stranger, 8, MintRefusal::OtherPrincipal, "another principal").await;
    // Depth: the caller's maximum (2 is at depth 1: its child would be depth 2).
    expect_refusal(store, sample_delegation(11, Some(2), 1), 1, MintRefusal::TooDeep, "max_depth 1").await;
    expect_refusal(store, sample_delegation(11, Some(1), 1), 0, MintRefusal::TooDeep, "max_depth 0").await;
    let outlives = NewDelegation { expires_ms: 10_001, ..sample_delegation(11, Some(1), 1) };
    expect_refusal(store, outlives, 8, MintRefusal::OutlivesParent, "outlives its parent").await;
    let greedy = sample_delegation(11, Some(1), 7);
    expect_refusal(store, greedy, 8, MintRefusal::BudgetExceeded, "more than the parent has left").await;
    let greedy_child = sample_delegation(11, Some(2), 5);
    expect_refusal(store, greedy_child, 8, MintRefusal::BudgetExceeded, "more than the child has").await;
    expect_refusal(store, sample_delegation(1, None, 1), 8, MintRefusal::Exists, "an existing root digest").await;
    let twice = sample_delegation(2, Some(1), 1);
    expect_refusal(store, twice, 8, MintRefusal::Exists, "an existing child digest").await;
    let own_parent = NewDelegation { parent: Some(delegation_digest(1)), ..sample_delegation(1, None, 1) };
    expect_refusal(store, own_parent, 8, MintRefusal::Exists, "a delegation as its own child").await;

    // Just inside each edge: expiring with the parent, exactly the budget left, the deepest max_depth allows.
    let exact = NewDelegation { expires_ms: 10_000, ..sample_delegation(11, Some(1), 6) };
    let exact = mint_ok(store, exact, 2).await;
    assert_eq!((exact.depth, exact.remaining), (1, 6));
    assert_eq!(delegation_row(store, 1).await.remaining, 0, "the exact budget left is granted");
    expect_refusal(store, sample_delegation(12, Some(1), 1), 8, MintRefusal::BudgetExceeded, "nothing left").await;
    assert_eq!(mint_ok(store, sample_delegation(12, Some(1), 0), 8).await.calls, 0, "a budget of 0 fits");
    assert_eq!(mint_ok(store, sample_delegation(13, Some(2), 1), 2).await.depth, 2, "depth 2 at max_depth 2");

    // The hard cap: a chain to depth MAX_DELEGATION_DEPTH, whatever maximum the caller gives.
    mint_ok(store, sample_delegation(100, None, 0), 0).await;
    for n in 101..=100 + MAX_DELEGATION_DEPTH as u8 {
        mint_ok(store, sample_delegation(n, Some(n - 1), 0), u32::MAX).await;
    }
    let deepest = 100 + MAX_DELEGATION_DEPTH as u8;
    let chain = store.delegation_chain(delegation_digest(deepest)).await.expect("chain");
    assert_eq!(chain.len(), MAX_DELEGATION_DEPTH as usize + 1, "the longest chain reads back whole");
    assert_eq!((chain[0].depth, chain[chain.len() - 1].depth), (0, MAX_DELEGATION_DEPTH));
    let too_deep = sample_delegation(deepest + 1, Some(deepest), 0);
    expect_refusal(store, too_deep, u32::MAX, MintRefusal::TooDeep, "beyond MAX_DELEGATION_DEPTH").await;
    fixture.cleanup().await;
}

/// Breaks one field of a delegation.
type BreakDelegation = fn(&mut NewDelegation);

/// Invalid fields are `InvalidRecord` with a reason that quotes no value, for a root and for a
/// child, and nothing is written (not the row, not the parent's budget).
pub async fn invalid_delegations_are_refused_and_nothing_is_written(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    mint_ok(store.as_ref(), sample_delegation(1, None, 10), 0).await;
    let before = all_delegations(store.as_ref()).await;
    let broken: Vec<(&str, BreakDelegation)> = vec![
        ("empty agent", |new| new.agent.clear()),
        ("too-long agent", |new| new.agent = "a".repeat(crate::MAX_DELEGATION_AGENT_BYTES + 1)),
        ("control character in agent", |new| new.agent = "hunter2\u{1b}[2J".into()),
        ("body an array", |new| new.body = r#"["hunter2"]"#.into()),
        ("body a string", |new| new.body = r#""hunter2""#.into()),
        ("body not JSON", |new| new.body = "{hunter2".into()),
        ("empty body", |new| new.body.clear()),
        ("too-large body", |new| new.body = format!(r#"{{"x":"{}"}}"#, "b".repeat(crate::MAX_DELEGATION_BODY_BYTES))),
        ("negative calls", |new| new.calls = -1),
        ("expires at creation", |new| new.expires_ms = new.created_ms),
        ("expires before creation", |new| new.expires_ms = new.created_ms - 1),
        ("negative creation", |new| new.created_ms = -10),
    ];
    for (what, break_it) in broken {
        for parent in [None, Some(1)] {
            let mut new = sample_delegation(2, parent, 1);
            break_it(&mut new);
            let result = store.mint_delegation(new, 8).await;
            if let Err(error) = &result {
                let text = format!("{error} {error:?}");
                assert!(!text.contains("hunter2"), "{what}: the reason quotes a value: {text}");
            }
            expect_invalid(result, what);
            assert_eq!(all_delegations(store.as_ref()).await, before, "{what}: something was written");
        }
    }
    let largest = NewDelegation {
        body: format!(r#"{{"x":"{}"}}"#, "b".repeat(crate::MAX_DELEGATION_BODY_BYTES - 8)),
        ..sample_delegation(2, Some(1), 1)
    };
    assert_eq!(mint_ok(store.as_ref(), largest.clone(), 8).await.body, largest.body, "the largest body fits");
    assert_eq!(delegation_row(store.as_ref(), 2).await.body.len(), crate::MAX_DELEGATION_BODY_BYTES);
    fixture.cleanup().await;
}

/// 50 concurrent spends of a budget of 10 over two instances: exactly 10 succeed and the budget
/// ends at 0. A child spends its own budget, not its parent's; a revoked or expired row (at the
/// exact instant) spends nothing.
pub async fn concurrent_spends_never_exceed_the_budget(harness: &dyn Harness) {
    const SPENDERS: usize = 50;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    mint_ok(instances[0].as_ref(), sample_delegation(1, None, 10), 0).await;
    let mut tasks = tokio::task::JoinSet::new();
    for spender in 0..SPENDERS {
        let instance = instances[spender % instances.len()].clone();
        tasks.spawn(async move { instance.spend_delegation_call(delegation_digest(1), 5_000).await });
    }
    let mut spent = 0;
    while let Some(joined) = tasks.join_next().await {
        if joined.expect("spender task").expect("spend_delegation_call") {
            spent += 1;
        }
    }
    assert_eq!(spent, 10, "{spent} of {SPENDERS} racing spends of a budget of 10 succeeded");
    for instance in &instances {
        assert_eq!(delegation_row(instance.as_ref(), 1).await.remaining, 0);
        assert!(!instance.spend_delegation_call(delegation_digest(1), 5_000).await.expect("spend"), "spent out");
    }
    assert_eq!(delegation_row(instances[0].as_ref(), 1).await.remaining, 0, "never negative");

    let store = instances[0].as_ref();
    mint_ok(store, sample_delegation(2, None, 3), 0).await;
    mint_ok(store, sample_delegation(3, Some(2), 2), 4).await;
    assert!(store.spend_delegation_call(delegation_digest(3), 5_000).await.expect("spend"), "the child's own");
    assert_eq!(delegation_row(store, 2).await.remaining, 1, "the parent keeps what it did not grant");
    assert_eq!(delegation_row(store, 3).await.remaining, 1);
    assert!(!store.spend_delegation_call(delegation_digest(3), 10_000).await.expect("spend"), "at expiry");
    assert!(!store.spend_delegation_call(delegation_digest(3), 20_000).await.expect("spend"), "after expiry");
    assert!(store.spend_delegation_call(delegation_digest(3), 9_999).await.expect("spend"), "just before");
    assert!(store.revoke_delegation(delegation_digest(2), 6_000).await.expect("revoke"));
    assert!(!store.spend_delegation_call(delegation_digest(2), 6_001).await.expect("spend"), "revoked");
    assert_eq!(delegation_row(store, 2).await.remaining, 1, "a refused spend takes nothing");
    assert!(!store.spend_delegation_call(delegation_digest(99), 5_000).await.expect("spend"), "unknown");
    instances[1].close().await;
    fixture.cleanup().await;
}

/// Per-tool counters: a call spends the tool's counter and the overall budget together (exactly
/// the counter's worth under racing spends on two instances, the overall budget untouched by a
/// refused one); a child's counter for a tool the parent counts is reserved from the parent's
/// (more than it has left: refused, nothing written); a tool the parent does not count is not
/// reserved; invalid counters are refused.
pub async fn per_tool_budgets_are_reserved_and_spent_with_the_overall_one(harness: &dyn Harness) {
    use std::collections::BTreeMap;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    let store = instances[0].as_ref();
    let counters = |pairs: &[(&str, i64)]| -> BTreeMap<String, i64> {
        pairs.iter().map(|(tool, count)| ((*tool).to_owned(), *count)).collect()
    };
    let minted = store
        .mint_delegation_with_tools(sample_delegation(1, None, 10), 0, counters(&[("export", 3)]))
        .await
        .expect("mint");
    assert!(minted.is_ok());
    assert_eq!(
        store.delegation_tool_budgets(delegation_digest(1)).await.expect("budgets"),
        [("export".to_owned(), (3, 3))].into()
    );
    let mut tasks = tokio::task::JoinSet::new();
    for spender in 0..20 {
        let instance = instances[spender % 2].clone();
        tasks.spawn(async move { instance.spend_delegation_tool_call(delegation_digest(1), "export", 5_000).await });
    }
    let mut spent = 0;
    while let Some(joined) = tasks.join_next().await {
        spent += usize::from(joined.expect("spender").expect("spend"));
    }
    assert_eq!(spent, 3, "exactly the tool's counter");
    assert_eq!(delegation_row(store, 1).await.remaining, 7, "the overall budget spent with it, no more");
    assert!(
        !store.spend_delegation_tool_call(delegation_digest(1), "other", 5_000).await.expect("spend"),
        "no counter"
    );
    assert_eq!(delegation_row(store, 1).await.remaining, 7, "a refused spend takes nothing");
    assert!(store.spend_delegation_call(delegation_digest(1), 5_000).await.expect("spend"), "uncounted calls go on");

    // A child: its counter for `export` is reserved from the parent's (0 left: refused) ...
    let refused = store
        .mint_delegation_with_tools(sample_delegation(2, Some(1), 2), 4, counters(&[("export", 1)]))
        .await
        .expect("mint");
    assert_eq!(refused.err(), Some(MintRefusal::BudgetExceeded));
    assert_eq!(delegation_row(store, 1).await.remaining, 6, "nothing reserved by a refused mint");
    assert!(store.delegation_chain(delegation_digest(2)).await.expect("chain").is_empty());
    // ... a counter the parent does not keep is not reserved from anything but the overall budget.
    let minted = store
        .mint_delegation_with_tools(sample_delegation(3, Some(1), 2), 4, counters(&[("read", 2)]))
        .await
        .expect("mint");
    assert!(minted.is_ok());
    assert_eq!(store.delegation_tool_budgets(delegation_digest(1)).await.expect("budgets")["export"], (3, 0));
    assert_eq!(store.delegation_tool_budgets(delegation_digest(3)).await.expect("budgets")["read"], (2, 2));
    // A grandchild's counter for `read` comes out of the child's.
    let minted = store
        .mint_delegation_with_tools(sample_delegation(4, Some(3), 1), 4, counters(&[("read", 1)]))
        .await
        .expect("mint");
    assert!(minted.is_ok());
    assert_eq!(store.delegation_tool_budgets(delegation_digest(3)).await.expect("budgets")["read"], (2, 1));
    // Invalid counters: more than the overall budget, negative, an empty tool name.
    for bad in [counters(&[("x", 3)]), counters(&[("x", -1)]), counters(&[("", 1)])] {
        let result = store.mint_delegation_with_tools(sample_delegation(5, None, 2), 0, bad).await;
        assert!(matches!(result, Err(StoreError::InvalidRecord { .. })), "{result:?}");
    }
    assert!(store.delegation_chain(delegation_digest(5)).await.expect("chain").is_empty());
    instances[1].close().await;
    fixture.cleanup().await;
}

/// Mints of children and spends race on one parent over two instances: whatever the interleaving,
/// the calls spent and the budgets granted add up to exactly the parent's budget.
pub async fn racing_mints_and_spends_share_the_parent_budget_exactly(harness: &dyn Harness) {
    const RACERS: u8 = 30;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    mint_ok(instances[0].as_ref(), sample_delegation(1, None, 12), 0).await;
    let mut tasks = tokio::task::JoinSet::new();
    for racer in 0..RACERS {
        let instance = instances[usize::from(racer) % instances.len()].clone();
        tasks.spawn(async move {
            if racer % 2 == 0 {
                let child = sample_delegation(10 + racer, Some(1), 1);
                instance.mint_delegation(child, 4).await.expect("mint_delegation").is_ok()
            } else {
                instance.spend_delegation_call(delegation_digest(1), 5_000).await.expect("spend_delegation_call")
            }
        });
    }
    let mut granted = 0;
    while let Some(joined) = tasks.join_next().await {
        if joined.expect("racer task") {
            granted += 1;
        }
    }
    assert_eq!(granted, 12, "{granted} calls spent or granted from a budget of 12");
    let rows = all_delegations(instances[1].as_ref()).await;
    let children = rows.iter().filter(|row| row.parent == Some(delegation_digest(1))).count();
    assert_eq!(delegation_row(instances[1].as_ref(), 1).await.remaining, 0);
    assert!(children <= usize::from(RACERS / 2) && rows.len() == children + 1, "{children} children");
    instances[1].close().await;
    fixture.cleanup().await;
}

/// A revocation succeeds once (from either instance), an unknown digest is not revoked, and the
/// revoked row stays in its chain with its revocation time, its descendants unchanged.
pub async fn delegation_revocation_is_once_and_stays_in_the_chain(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    mint_ok(store.as_ref(), sample_delegation(1, None, 10), 0).await;
    mint_ok(store.as_ref(), sample_delegation(2, Some(1), 5), 4).await;
    mint_ok(store.as_ref(), sample_delegation(3, Some(2), 5), 4).await;
    assert!(store.revoke_delegation(delegation_digest(2), 2_500).await.expect("revoke"), "first revocation");
    assert!(!other.revoke_delegation(delegation_digest(2), 2_600).await.expect("revoke"), "already revoked");
    assert!(!store.revoke_delegation(delegation_digest(2), 2_700).await.expect("revoke"), "already revoked");
    assert!(!store.revoke_delegation(delegation_digest(99), 2_500).await.expect("revoke"), "unknown");
    let chain = other.delegation_chain(delegation_digest(3)).await.expect("chain");
    assert_eq!(chain.len(), 3);
    assert_eq!(chain.iter().map(|row| row.revoked_ms).collect::<Vec<_>>(), vec![None, Some(2_500), None]);
    assert_eq!(chain[1].remaining, 0, "revocation moves no budget");
    other.close().await;
    fixture.cleanup().await;
}

/// Listing by principal returns only that principal's rows, newest first (then by digest), at
/// most the limit; without a principal, every row.
pub async fn delegations_are_listed_by_principal_newest_first(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    assert!(all_delegations(store.as_ref()).await.is_empty());
    // (n, principal, created_ms): 3 and 4 share a creation time.
    for (n, who, created_ms) in [(1, 1, 1_000), (2, 2, 1_500), (3, 1, 3_000), (4, 1, 3_000), (5, 1, 2_000), (6, 2, 50)]
    {
        let new = NewDelegation { principal_key: principal(who), created_ms, ..sample_delegation(n, None, 1) };
        mint_ok(store.as_ref(), new, 0).await;
    }
    let numbers = |rows: Vec<DelegationRow>| -> Vec<u8> { rows.iter().map(|row| row.digest[0]).collect() };
    let first = store.delegations(Some(principal(1)), 100).await.expect("delegations");
    assert!(first.iter().all(|row| row.principal_key == principal(1)), "{first:?}");
    // Same instant: by digest ascending (3's first byte sorts before 4's).
    assert_eq!(numbers(first), vec![3, 4, 5, 1]);
    assert_eq!(numbers(store.delegations(Some(principal(1)), 2).await.expect("delegations")), vec![3, 4]);
    assert_eq!(numbers(store.delegations(Some(principal(2)), 100).await.expect("delegations")), vec![2, 6]);
    assert!(store.delegations(Some(principal(3)), 100).await.expect("delegations").is_empty());
    assert!(store.delegations(Some(principal(1)), 0).await.expect("delegations").is_empty());
    assert_eq!(numbers(store.delegations(None, 100).await.expect("delegations")), vec![3, 4, 5, 2, 1, 6]);
    assert_eq!(numbers(store.delegations(None, 3).await.expect("delegations")), vec![3, 4, 5]);
    assert_eq!(store.delegations(None, u32::MAX).await.expect("delegations").len(), 6);
    fixture.cleanup().await;
}

/// An approval is recorded once (a duplicate is `false`, from either instance) and taken at most
/// once: 20 concurrent takers over two instances, exactly one succeeds, per key. An expired
/// approval (at the exact instant) is never taken.
pub async fn approvals_are_taken_at_most_once(harness: &dyn Harness) {
    const TAKERS: usize = 20;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    let key = |n: u8| {
        let mut key = delegation_digest(n);
        key[15] = 0xaa;
        key
    };
    assert!(instances[0].put_approval(key(1), 10_000).await.expect("put"), "new");
    assert!(!instances[0].put_approval(key(1), 10_000).await.expect("put"), "duplicate");
    assert!(!instances[1].put_approval(key(1), 20_000).await.expect("put"), "duplicate, another instance");
    assert!(!instances[0].take_approval(key(2), 5_000).await.expect("take"), "unknown");
    for round in 1..=3u8 {
        let key = key(round);
        if round > 1 {
            assert!(instances[1].put_approval(key, 10_000).await.expect("put"));
        }
        let mut tasks = tokio::task::JoinSet::new();
        for taker in 0..TAKERS {
            let instance = instances[taker % instances.len()].clone();
            tasks.spawn(async move { instance.take_approval(key, 5_000).await });
        }
        let mut taken = 0;
        while let Some(joined) = tasks.join_next().await {
            if joined.expect("taker task").expect("take_approval") {
                taken += 1;
            }
        }
        assert_eq!(taken, 1, "round {round}: {taken} of {TAKERS} racing takers took the approval");
        assert!(!instances[0].take_approval(key, 5_000).await.expect("take"), "round {round}: taken already");
    }
    assert!(instances[0].put_approval(key(9), 1_000).await.expect("put"));
    assert!(!instances[0].take_approval(key(9), 1_000).await.expect("take"), "at expiry");
    assert!(!instances[1].take_approval(key(9), 2_000).await.expect("take"), "after expiry");
    assert!(!instances[0].put_approval(key(9), 9_000).await.expect("put"), "the expired approval is still stored");
    assert!(instances[0].take_approval(key(9), 999).await.expect("take"), "a caller whose clock is before expiry");
    instances[1].close().await;
    fixture.cleanup().await;
}

/// Retention deletes approvals and delegation rows whose expiry is at or before `now_ms`, at most
/// `limit` of each per call, and counts both; live ones stay usable.
pub async fn delegation_purge_takes_only_expired_rows_and_is_bounded(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let store = store.as_ref();
    for (n, expires_ms) in [(1, 2_000), (2, 3_000), (3, 3_000), (4, 3_001)] {
        mint_ok(store, NewDelegation { expires_ms, ..sample_delegation(n, None, 5) }, 0).await;
        assert!(store.put_approval([n; 32], expires_ms).await.expect("put"));
    }
    assert_eq!(store.purge_delegations(1_999, 10).await.expect("purge"), 0, "nothing expired yet");
    assert_eq!(store.purge_delegations(3_000, 0).await.expect("purge"), 0, "limit 0");
    assert_eq!(store.purge_delegations(2_000, 10).await.expect("purge"), 2, "one row and one approval");
    assert!(store.delegation_chain(delegation_digest(1)).await.expect("chain").is_empty(), "row 1 purged");
    assert!(store.put_approval([1; 32], 9_000).await.expect("put"), "approval 1 purged");
    assert_eq!(store.purge_delegations(3_000, 1).await.expect("purge"), 2, "at most one of each");
    assert_eq!(store.purge_delegations(3_000, 1).await.expect("purge"), 2, "and the other two");
    assert_eq!(store.purge_delegations(3_000, 10).await.expect("purge"), 0);
    let left: Vec<u8> = all_delegations(store).await.iter().map(|row| row.digest[0]).collect();
    assert_eq!(left, vec![4], "the live row stays");
    assert!(store.spend_delegation_call(delegation_digest(4), 3_000).await.expect("spend"), "and is usable");
    assert!(store.take_approval([4; 32], 3_000).await.expect("take"), "the live approval stays");
    for n in 2..=3 {
        assert!(!store.take_approval([n; 32], 0).await.expect("take"), "approval {n} was purged");
        assert!(store.put_approval([n; 32], 9_000).await.expect("put"), "approval {n} was purged");
    }
    fixture.cleanup().await;
}

/// A store that is down refuses every delegation operation with `Unavailable` (fail closed), and
/// the refused calls wrote nothing.
pub async fn closed_store_refuses_delegation_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    mint_ok(store.as_ref(), sample_delegation(1, None, 10), 0).await;
    assert!(store.put_approval([7; 32], 10_000).await.expect("put"));
    let before = all_delegations(other.as_ref()).await;
    store.close().await;
    expect_unavailable(store.mint_delegation(sample_delegation(2, None, 1), 4).await, "mint_delegation (root)");
    expect_unavailable(store.mint_delegation(sample_delegation(2, Some(1), 1), 4).await, "mint_delegation (child)");
    expect_unavailable(store.delegation_chain(delegation_digest(1)).await, "delegation_chain");
    expect_unavailable(store.spend_delegation_call(delegation_digest(1), 5_000).await, "spend_delegation_call");
    expect_unavailable(store.revoke_delegation(delegation_digest(1), 5_000).await, "revoke_delegation");
    expect_unavailable(store.delegations(None, 10).await, "delegations");
    expect_unavailable(store.delegations(Some(principal(1)), 10).await, "delegations of a principal");
    expect_unavailable(store.put_approval([8; 32], 10_000).await, "put_approval");
    expect_unavailable(store.take_approval([7; 32], 5_000).await, "take_approval");
    expect_unavailable(store.purge_delegations(20_000, 10).await, "purge_delegations");
    assert_eq!(all_delegations(other.as_ref()).await, before, "a refused call wrote something");
    assert!(other.take_approval([7; 32], 5_000).await.expect("take"), "the approval was not taken");
    assert!(other.put_approval([8; 32], 10_000).await.expect("put"), "no approval was recorded");
    other.close().await;
    fixture.cleanup().await;
}

// ---- Upstream OAuth connections ---------------------------------------------------------------

/// The keyed digest of the principal numbered `n` in the connection checks.
fn connection_principal(n: u8) -> [u8; 32] {
    let mut key = [n; 32];
    key[0] = 0xc0;
    key
}

/// A connection of the principal numbered `who` to `upstream`, stored at `created_ms`, whose
/// sealed tokens and times depend on `generation`.
pub fn sample_connection(who: u8, upstream: &str, created_ms: i64, generation: u8) -> ConnectionRow {
    ConnectionRow {
        principal_key: connection_principal(who),
        principal: format!("https://idp.example principal-{who} tenant ünïcode"),
        upstream: upstream.into(),
        issuer: format!("https://{upstream}.example/oauth"),
        client_id: format!("palisade-at-{upstream}"),
        scopes: format!("read write:{generation}"),
        sealed: (0..64).map(|index: u8| index ^ generation ^ who).collect(),
        version: 1,
        created_ms,
        updated_ms: created_ms + i64::from(generation),
        expires_ms: Some(created_ms + 3_600_000 + i64::from(generation)),
    }
}

async fn expect_connection(store: &dyn Store, who: u8, upstream: &str) -> ConnectionRow {
    store
        .connection(connection_principal(who), upstream)
        .await
        .expect("connection")
        .unwrap_or_else(|| panic!("the connection of {who} to {upstream} should exist"))
}

/// Every connection and every approval: what a refused call must leave as it was.
async fn connection_rows(store: &dyn Store) -> (Vec<ConnectionRow>, Vec<ApprovedClient>) {
    let connections = store.connections(None, crate::MAX_CONNECTION_LIST).await.expect("connections");
    let approvals = store.approved_clients(None, crate::MAX_CONNECTION_LIST).await.expect("approved_clients");
    (connections, approvals)
}

/// A put reads back whole (version 1), from this instance and another; a put over it replaces
/// every field but its creation time and bumps the version; a replacement from the current
/// version sets `expected + 1`. Nothing else is touched.
pub async fn connection_round_trips_and_every_write_bumps_the_version(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    assert!(store.connection(connection_principal(1), "github").await.expect("connection").is_none());
    let first = sample_connection(1, "github", 1_000, 0);
    store.put_connection(&first).await.expect("put_connection");
    store.put_connection(&sample_connection(2, "github", 1_100, 0)).await.expect("put_connection");
    store.put_connection(&sample_connection(1, "linear", 1_200, 0)).await.expect("put_connection");
    assert_eq!(expect_connection(store.as_ref(), 1, "github").await, first);
    assert_eq!(expect_connection(other.as_ref(), 1, "github").await, first, "seen from another instance");

    // A put over an existing row: a caller's version and creation time are not taken.
    let again = ConnectionRow { version: 40, created_ms: 5_000, ..sample_connection(1, "github", 5_000, 1) };
    other.put_connection(&again).await.expect("put_connection");
    let stored = expect_connection(store.as_ref(), 1, "github").await;
    assert_eq!(stored, ConnectionRow { version: 2, created_ms: 1_000, ..again.clone() });

    // The compare-and-swap from the current version.
    let refreshed =
        ConnectionRow { expires_ms: None, principal: String::new(), ..sample_connection(1, "github", 6_000, 2) };
    assert!(store.replace_connection(&refreshed, 2).await.expect("replace_connection"), "from the current version");
    let stored = expect_connection(other.as_ref(), 1, "github").await;
    assert_eq!(stored, ConnectionRow { version: 3, created_ms: 1_000, ..refreshed.clone() });
    assert!(stored.sealed != again.sealed && stored.expires_ms.is_none(), "{stored:?}");
    // A put after a replacement continues the count.
    store.put_connection(&sample_connection(1, "github", 9_000, 3)).await.expect("put_connection");
    assert_eq!(expect_connection(store.as_ref(), 1, "github").await.version, 4);
    // The other rows did not move.
    assert_eq!(expect_connection(store.as_ref(), 2, "github").await, sample_connection(2, "github", 1_100, 0));
    assert_eq!(expect_connection(store.as_ref(), 1, "linear").await, sample_connection(1, "linear", 1_200, 0));
    assert!(store.connection(connection_principal(3), "github").await.expect("connection").is_none());
    assert!(store.connection(connection_principal(1), "GitHub").await.expect("connection").is_none());
    // The largest sealed value fits.
    let largest = ConnectionRow { sealed: vec![0xa5; crate::MAX_CONNECTION_SEALED_BYTES], ..first.clone() };
    store.put_connection(&largest).await.expect("put_connection");
    assert_eq!(expect_connection(store.as_ref(), 1, "github").await.sealed, largest.sealed);
    other.close().await;
    fixture.cleanup().await;
}

/// A replacement from a stale version (or of an unknown connection) is refused and changes
/// nothing; racing refreshes from the same version on two instances: exactly one stores its
/// tokens.
pub async fn stale_connection_replacements_are_refused_and_change_nothing(harness: &dyn Harness) {
    const RACERS: u8 = 8;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    let store = instances[0].as_ref();
    store.put_connection(&sample_connection(1, "github", 1_000, 0)).await.expect("put_connection");
    store.put_connection(&sample_connection(1, "github", 1_000, 1)).await.expect("put_connection");
    let before = expect_connection(store, 1, "github").await;
    assert_eq!(before.version, 2);
    for stale in [1, 3, 99] {
        let refused = store.replace_connection(&sample_connection(1, "github", 1_000, 7), stale).await;
        assert!(!refused.expect("replace_connection"), "version {stale} is not the stored one");
        assert_eq!(expect_connection(store, 1, "github").await, before, "version {stale}: the row changed");
    }
    let unknown = store.replace_connection(&sample_connection(2, "github", 1_000, 7), 1).await;
    assert!(!unknown.expect("replace_connection"), "no such connection");
    assert!(store.connection(connection_principal(2), "github").await.expect("connection").is_none(), "not created");

    for round in 0..3u8 {
        let expected = expect_connection(store, 1, "github").await.version;
        let mut tasks = tokio::task::JoinSet::new();
        for racer in 0..RACERS {
            let instance = instances[usize::from(racer) % instances.len()].clone();
            let row = sample_connection(1, "github", 1_000, 10 + racer);
            tasks.spawn(async move { instance.replace_connection(&row, expected).await.map(|won| (won, racer)) });
        }
        let mut winners = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let (won, racer) = joined.expect("refresh task").expect("replace_connection");
            if won {
                winners.push(racer);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?} of {RACERS} racing refreshes won");
        let stored = expect_connection(instances[1].as_ref(), 1, "github").await;
        assert_eq!(stored.version, expected + 1, "round {round}");
        assert_eq!(stored.sealed, sample_connection(1, "github", 1_000, 10 + winners[0]).sealed, "the winner's");
    }
    instances[1].close().await;
    fixture.cleanup().await;
}

/// Listing by principal returns only that principal's connections, newest first (then by
/// upstream), at most the limit; without a principal, every connection (then by principal key).
pub async fn connections_are_listed_by_principal_newest_first(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    assert!(store.connections(None, 100).await.expect("connections").is_empty());
    // (principal, upstream, created_ms): b and c of principal 1 share a creation time.
    let rows = [(1, "a", 1_000), (2, "a", 1_500), (1, "c", 3_000), (1, "b", 3_000), (1, "d", 2_000), (2, "b", 50)];
    for (who, upstream, created_ms) in rows {
        store.put_connection(&sample_connection(who, upstream, created_ms, 0)).await.expect("put_connection");
    }
    // Replacing a row keeps its place (its creation time).
    store.put_connection(&sample_connection(1, "a", 9_000, 5)).await.expect("put_connection");
    let names = |rows: Vec<ConnectionRow>| -> Vec<(u8, String)> {
        rows.into_iter().map(|row| (row.principal_key[1], row.upstream)).collect()
    };
    let named = |pairs: &[(u8, &str)]| -> Vec<(u8, String)> {
        pairs.iter().map(|(who, upstream)| (*who, (*upstream).to_owned())).collect()
    };
    let first = store.connections(Some(connection_principal(1)), 100).await.expect("connections");
    assert!(first.iter().all(|row| row.principal_key == connection_principal(1)), "{first:?}");
    assert_eq!(names(first), named(&[(1, "b"), (1, "c"), (1, "d"), (1, "a")]));
    let two = store.connections(Some(connection_principal(1)), 2).await.expect("connections");
    assert_eq!(names(two), named(&[(1, "b"), (1, "c")]));
    let second = store.connections(Some(connection_principal(2)), 100).await.expect("connections");
    assert_eq!(names(second), named(&[(2, "a"), (2, "b")]));
    assert!(store.connections(Some(connection_principal(3)), 100).await.expect("connections").is_empty());
    assert!(store.connections(Some(connection_principal(1)), 0).await.expect("connections").is_empty());
    let all = store.connections(None, 100).await.expect("connections");
    assert_eq!(names(all), named(&[(1, "b"), (1, "c"), (1, "d"), (2, "a"), (1, "a"), (2, "b")]));
    let three = store.connections(None, 3).await.expect("connections");
    assert_eq!(names(three), named(&[(1, "b"), (1, "c"), (1, "d")]));
    assert_eq!(store.connections(None, u32::MAX).await.expect("connections").len(), 6);
    fixture.cleanup().await;
}

/// Deleting one connection removes exactly it (once); deleting a principal's connections
/// removes all of them and nothing of anyone else's (nor that principal's approvals).
pub async fn connection_deletes_cover_exactly_their_rows(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    for (who, upstream) in [(1, "a"), (1, "b"), (1, "c"), (2, "a"), (2, "b")] {
        store.put_connection(&sample_connection(who, upstream, 1_000, 0)).await.expect("put_connection");
    }
    store.approve_client(connection_principal(1), "a", "cursor", 1_000).await.expect("approve_client");
    assert!(store.delete_connection(connection_principal(1), "a").await.expect("delete_connection"));
    assert!(!other.delete_connection(connection_principal(1), "a").await.expect("delete_connection"), "gone");
    assert!(!store.delete_connection(connection_principal(3), "a").await.expect("delete_connection"), "unknown");
    assert!(store.connection(connection_principal(1), "a").await.expect("connection").is_none());
    assert_eq!(expect_connection(store.as_ref(), 2, "a").await, sample_connection(2, "a", 1_000, 0));
    assert_eq!(other.delete_connections_of(connection_principal(1)).await.expect("delete_connections_of"), 2);
    assert_eq!(store.delete_connections_of(connection_principal(1)).await.expect("delete_connections_of"), 0);
    assert!(store.connections(Some(connection_principal(1)), 100).await.expect("connections").is_empty());
    let left = store.connections(None, 100).await.expect("connections");
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|row| row.principal_key == connection_principal(2)), "{left:?}");
    assert!(store.client_approved(connection_principal(1), "a", "cursor").await.expect("client_approved"));
    // A deleted connection can be made again, from version 1.
    store.put_connection(&sample_connection(1, "a", 2_000, 1)).await.expect("put_connection");
    assert_eq!(expect_connection(store.as_ref(), 1, "a").await.version, 1);
    other.close().await;
    fixture.cleanup().await;
}

/// An approval is per principal, upstream and client: visible from every instance, invisible to
/// another principal, another upstream or another client; approving again keeps the first time;
/// revoking succeeds once and touches nothing else.
pub async fn client_approvals_are_per_principal_and_upstream_and_revocable(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let alice = connection_principal(1);
    let bob = connection_principal(2);
    assert!(!store.client_approved(alice, "github", "cursor").await.expect("client_approved"));
    store.approve_client(alice, "github", "cursor", 1_000).await.expect("approve_client");
    other.approve_client(alice, "github", "cursor", 5_000).await.expect("approve again");
    store.approve_client(alice, "linear", "claude", 2_000).await.expect("approve_client");
    store.approve_client(bob, "github", "claude", 3_000).await.expect("approve_client");
    store.approve_client(alice, "github", "zed", 2_000).await.expect("approve_client");
    for instance in [&store, &other] {
        assert!(instance.client_approved(alice, "github", "cursor").await.expect("client_approved"));
        assert!(!instance.client_approved(bob, "github", "cursor").await.expect("client_approved"), "bob");
        assert!(!instance.client_approved(alice, "linear", "cursor").await.expect("client_approved"), "upstream");
        assert!(!instance.client_approved(alice, "github", "claude").await.expect("client_approved"), "client");
        assert!(!instance.client_approved(alice, "github", "Cursor").await.expect("client_approved"), "exact id");
    }
    let listed = |rows: Vec<ApprovedClient>| -> Vec<(u8, String, String, i64)> {
        rows.into_iter().map(|row| (row.principal_key[1], row.upstream, row.client_id, row.approved_ms)).collect()
    };
    let row = |who: u8, upstream: &str, client: &str, at: i64| (who, upstream.to_owned(), client.to_owned(), at);
    let of_alice = store.approved_clients(Some(alice), 100).await.expect("approved_clients");
    assert!(of_alice.iter().all(|approval| approval.principal_key == alice));
    assert_eq!(
        listed(of_alice),
        vec![row(1, "github", "zed", 2_000), row(1, "linear", "claude", 2_000), row(1, "github", "cursor", 1_000)],
        "newest first, the first approval's time kept"
    );
    assert_eq!(listed(store.approved_clients(Some(alice), 1).await.expect("approved_clients")).len(), 1);
    let all = other.approved_clients(None, 100).await.expect("approved_clients");
    assert_eq!(
        listed(all),
        vec![
            row(2, "github", "claude", 3_000),
            row(1, "github", "zed", 2_000),
            row(1, "linear", "claude", 2_000),
            row(1, "github", "cursor", 1_000),
        ]
    );
    assert!(store.approved_clients(Some(connection_principal(3)), 100).await.expect("approved").is_empty());
    assert!(!store.revoke_client(bob, "github", "cursor").await.expect("revoke_client"), "not bob's approval");
    assert!(store.revoke_client(alice, "github", "cursor").await.expect("revoke_client"));
    assert!(!other.revoke_client(alice, "github", "cursor").await.expect("revoke_client"), "revoked already");
    assert!(!other.client_approved(alice, "github", "cursor").await.expect("client_approved"), "revoked");
    assert!(other.client_approved(alice, "github", "zed").await.expect("client_approved"), "the others stay");
    assert!(other.client_approved(bob, "github", "claude").await.expect("client_approved"));
    assert_eq!(store.approved_clients(None, 100).await.expect("approved_clients").len(), 3);
    // Approved again after a revocation: a new approval with its own time.
    store.approve_client(alice, "github", "cursor", 7_000).await.expect("approve_client");
    let newest = store.approved_clients(Some(alice), 1).await.expect("approved_clients");
    assert_eq!(listed(newest), vec![row(1, "github", "cursor", 7_000)]);
    other.close().await;
    fixture.cleanup().await;
}

/// The digest of the flow numbered `n`.
fn flow_digest(n: u8) -> [u8; 32] {
    let mut digest = [n; 32];
    digest[0] = 0xf1;
    digest
}

/// A flow is read without being consumed, taken once (from any instance) and then gone; of 8
/// concurrent takers over two instances exactly one gets it, in every round.
pub async fn flows_are_taken_exactly_once(harness: &dyn Harness) {
    const TAKERS: usize = 8;
    let fixture = harness.fresh().await;
    let instances = [fixture.store(), fixture.another_instance().await];
    let store = instances[0].as_ref();
    let body = r#"{"upstream":"github","verifier":"ünïcode"}"#;
    store.put_flow(flow_digest(1), "connect", body, 10_000).await.expect("put_flow");
    store.put_flow(flow_digest(2), "connect", "{}", 10_000).await.expect("put_flow");
    for _ in 0..3 {
        assert_eq!(instances[1].flow(flow_digest(1), "connect", 5_000).await.expect("flow").as_deref(), Some(body));
    }
    assert_eq!(store.take_flow(flow_digest(1), "connect", 5_000).await.expect("take_flow").as_deref(), Some(body));
    assert_eq!(store.take_flow(flow_digest(1), "connect", 5_000).await.expect("take_flow"), None, "taken");
    assert_eq!(instances[1].take_flow(flow_digest(1), "connect", 5_000).await.expect("take_flow"), None, "taken");
    assert_eq!(store.flow(flow_digest(1), "connect", 5_000).await.expect("flow"), None, "gone");
    assert_eq!(store.take_flow(flow_digest(9), "connect", 5_000).await.expect("take_flow"), None, "unknown");
    assert_eq!(store.flow(flow_digest(2), "connect", 5_000).await.expect("flow").as_deref(), Some("{}"), "untouched");

    for round in 10..15u8 {
        let digest = flow_digest(round);
        let body = format!(r#"{{"round":{round}}}"#);
        instances[usize::from(round) % 2].put_flow(digest, "state", &body, 60_000).await.expect("put_flow");
        let mut tasks = tokio::task::JoinSet::new();
        for taker in 0..TAKERS {
            let instance = instances[taker % instances.len()].clone();
            tasks.spawn(async move { instance.take_flow(digest, "state", 5_000).await });
        }
        let mut taken = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            if let Some(body) = joined.expect("taker task").expect("take_flow") {
                taken.push(body);
            }
        }
        assert_eq!(taken, vec![body], "round {round}: {} of {TAKERS} racing takers got the flow", taken.len());
        assert_eq!(store.flow(digest, "state", 5_000).await.expect("flow"), None, "round {round}: gone");
    }
    instances[1].close().await;
    fixture.cleanup().await;
}

/// An expired flow (at the exact instant) is neither read nor taken, and taking it deletes it; a
/// flow asked for under another kind is neither read nor taken, and stays takable under its own.
pub async fn expired_or_other_kind_flows_are_not_taken(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let store = store.as_ref();
    store.put_flow(flow_digest(1), "signin", r#"{"n":1}"#, 2_000).await.expect("put_flow");
    assert_eq!(store.flow(flow_digest(1), "signin", 1_999).await.expect("flow").as_deref(), Some(r#"{"n":1}"#));
    assert_eq!(store.flow(flow_digest(1), "signin", 2_000).await.expect("flow"), None, "at expiry");
    assert_eq!(store.flow(flow_digest(1), "signin", 3_000).await.expect("flow"), None, "after expiry");
    assert_eq!(store.take_flow(flow_digest(1), "signin", 2_000).await.expect("take_flow"), None, "at expiry");
    // The expired take deleted it: even a caller whose clock is earlier finds nothing.
    assert_eq!(store.flow(flow_digest(1), "signin", 0).await.expect("flow"), None, "the expired flow is gone");
    assert_eq!(store.take_flow(flow_digest(1), "signin", 0).await.expect("take_flow"), None);
    assert_eq!(store.purge_flows(i64::MAX, 10).await.expect("purge_flows"), 0, "nothing left to purge");

    store.put_flow(flow_digest(2), "connect", r#"{"n":2}"#, 9_000).await.expect("put_flow");
    assert_eq!(store.flow(flow_digest(2), "signin", 1_000).await.expect("flow"), None, "another kind");
    assert_eq!(store.take_flow(flow_digest(2), "signin", 1_000).await.expect("take_flow"), None, "another kind");
    assert_eq!(store.take_flow(flow_digest(2), "Connect", 1_000).await.expect("take_flow"), None, "exact kind");
    assert_eq!(store.flow(flow_digest(2), "connect", 1_000).await.expect("flow").as_deref(), Some(r#"{"n":2}"#));
    let taken = store.take_flow(flow_digest(2), "connect", 8_999).await.expect("take_flow");
    assert_eq!(taken.as_deref(), Some(r#"{"n":2}"#), "still takable under its own kind, just before expiry");
    assert_eq!(store.take_flow(flow_digest(2), "connect", 1_000).await.expect("take_flow"), None);
    fixture.cleanup().await;
}

/// A digest stored already is refused (from either instance, whatever the kind, body or expiry,
/// and even once expired) and the first flow is kept; once taken, the digest can be stored again.
pub async fn an_existing_flow_digest_is_never_overwritten(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    store.put_flow(flow_digest(1), "connect", r#"{"first":true}"#, 2_000).await.expect("put_flow");
    for (instance, kind, body, expires_ms) in
        [(&store, "connect", r#"{"second":true}"#, 9_000), (&other, "signin", r#"{"third":true}"#, 2_000)]
    {
        let refused = instance.put_flow(flow_digest(1), kind, body, expires_ms).await;
        expect_invalid(refused, "an existing digest");
    }
    assert_eq!(other.flow(flow_digest(1), "connect", 1_000).await.expect("flow").as_deref(), Some(r#"{"first":true}"#));
    assert_eq!(other.flow(flow_digest(1), "signin", 1_000).await.expect("flow"), None, "the kind was kept");
    assert_eq!(other.flow(flow_digest(1), "connect", 1_999).await.expect("flow").as_deref(), Some(r#"{"first":true}"#));
    assert_eq!(other.flow(flow_digest(1), "connect", 2_000).await.expect("flow"), None, "the expiry was kept");
    expect_invalid(store.put_flow(flow_digest(1), "connect", "{}", 9_000).await, "an expired, unpurged digest");
    assert_eq!(store.purge_flows(2_000, 10).await.expect("purge_flows"), 1);
    store.put_flow(flow_digest(1), "connect", r#"{"again":true}"#, 9_000).await.expect("put_flow after purge");
    assert_eq!(
        store.take_flow(flow_digest(1), "connect", 3_000).await.expect("take").as_deref(),
        Some(r#"{"again":true}"#)
    );
    store.put_flow(flow_digest(1), "connect", "{}", 9_000).await.expect("put_flow after take");
    other.close().await;
    fixture.cleanup().await;
}

/// A purge deletes only flows whose expiry is at or before `now_ms` (the exact instant included),
/// at most `limit` per call; live flows stay readable and takable.
pub async fn flow_purge_takes_only_expired_flows_and_is_bounded(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let store = store.as_ref();
    let expiries = [(1, 1_000), (2, 1_999), (3, 2_000), (4, 2_001), (5, 3_000), (6, 3_000), (7, 3_000), (8, 3_001)];
    for (n, expires_ms) in expiries {
        store.put_flow(flow_digest(n), "state", &format!("{n}"), expires_ms).await.expect("put_flow");
    }
    assert_eq!(store.purge_flows(999, 10).await.expect("purge_flows"), 0, "nothing expired yet");
    assert_eq!(store.purge_flows(2_000, 0).await.expect("purge_flows"), 0, "limit 0");
    assert_eq!(store.purge_flows(2_000, 10).await.expect("purge_flows"), 3, "1, 2 and 3 (at the instant)");
    assert_eq!(store.purge_flows(2_000, 10).await.expect("purge_flows"), 0);
    for n in 1..=3 {
        assert_eq!(store.flow(flow_digest(n), "state", 0).await.expect("flow"), None, "{n} was purged");
    }
    for n in 4..=8 {
        let body = store.flow(flow_digest(n), "state", 2_000).await.expect("flow");
        assert_eq!(body, Some(format!("{n}")), "{n} must survive the purge");
    }
    assert_eq!(store.purge_flows(3_000, 2).await.expect("purge_flows"), 2, "bounded by the limit");
    assert_eq!(store.purge_flows(3_000, 2).await.expect("purge_flows"), 2);
    assert_eq!(store.purge_flows(3_000, 2).await.expect("purge_flows"), 0, "only 8 is left, live");
    assert_eq!(store.take_flow(flow_digest(8), "state", 3_000).await.expect("take_flow"), Some("8".into()), "live");
    fixture.cleanup().await;
}

/// A registration reads back for its issuer and redirect URI only, from either instance, and a
/// second put replaces it.
pub async fn oauth_client_registrations_round_trip_and_are_replaced(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let issuer = "https://auth.github.example";
    let callback = "https://gateway.example/oauth/callback";
    assert_eq!(store.oauth_client(issuer, callback).await.expect("oauth_client"), None);
    let first = r#"{"client_id":"abc","client_id_issued_at":1}"#;
    store.put_oauth_client(issuer, callback, first, 1_000).await.expect("put_oauth_client");
    store.put_oauth_client(issuer, "https://other.example/cb", "{}", 1_000).await.expect("put_oauth_client");
    store.put_oauth_client("https://auth.linear.example", callback, "[]", 1_000).await.expect("put_oauth_client");
    assert_eq!(other.oauth_client(issuer, callback).await.expect("oauth_client").as_deref(), Some(first));
    assert_eq!(other.oauth_client(issuer, "https://gateway.example/oauth/callback/").await.expect("get"), None);
    assert_eq!(other.oauth_client("https://auth.github.example/", callback).await.expect("get"), None);
    let second = r#"{"client_id":"def","client_id_issued_at":2}"#;
    other.put_oauth_client(issuer, callback, second, 2_000).await.expect("put_oauth_client");
    assert_eq!(store.oauth_client(issuer, callback).await.expect("oauth_client").as_deref(), Some(second));
    let unchanged = store.oauth_client(issuer, "https://other.example/cb").await.expect("oauth_client");
    assert_eq!(unchanged.as_deref(), Some("{}"), "other registrations stay");
    let largest = format!(r#"{{"x":"{}"}}"#, "b".repeat(crate::MAX_OAUTH_BODY_BYTES - 8));
    store.put_oauth_client(issuer, callback, &largest, 3_000).await.expect("the largest body fits");
    assert_eq!(store.oauth_client(issuer, callback).await.expect("oauth_client"), Some(largest));
    other.close().await;
    fixture.cleanup().await;
}

/// `InvalidRecord`, with a text that quotes none of the values the checks plant (`hunter2`).
fn expect_quiet_invalid<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    if let Err(error) = &result {
        let text = format!("{error} {error:?}");
        assert!(!text.contains("hunter2"), "{what}: the reason quotes a value: {text}");
    }
    expect_invalid(result, what);
}

/// Breaks one field of a connection.
type BreakConnection = fn(&mut ConnectionRow);

/// Every invalid argument is `InvalidRecord` with a reason that quotes no value, and nothing is
/// written: no connection put or replaced, no approval, flow or registration stored or removed.
pub async fn invalid_connection_inputs_are_refused_and_nothing_is_written(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let store = store.as_ref();
    store.put_connection(&sample_connection(1, "github", 1_000, 0)).await.expect("put_connection");
    store.approve_client(connection_principal(1), "github", "cursor", 1_000).await.expect("approve_client");
    store.put_flow(flow_digest(1), "connect", "{}", 9_000).await.expect("put_flow");
    let before = connection_rows(store).await;
    let broken: Vec<(&str, BreakConnection)> = vec![
        ("control character in the label", |row| row.principal = "hunter2\u{1b}[2J".into()),
        ("too-long label", |row| row.principal = "p".repeat(crate::MAX_CONNECTION_TEXT_BYTES + 1)),
        ("empty upstream", |row| row.upstream.clear()),
        ("too-long upstream", |row| row.upstream = "u".repeat(crate::MAX_CONNECTION_UPSTREAM_BYTES + 1)),
        ("control character in the upstream", |row| row.upstream = "github\n".into()),
        ("empty issuer", |row| row.issuer.clear()),
        ("control character in the issuer", |row| row.issuer = "https://hunter2.example/\u{0}".into()),
        ("empty client id", |row| row.client_id.clear()),
        ("too-long client id", |row| row.client_id = "c".repeat(crate::MAX_CONNECTION_TEXT_BYTES + 1)),
        ("a quote in the scopes", |row| row.scopes = "read \"hunter2\"".into()),
        ("too-long scopes", |row| row.scopes = "s".repeat(crate::MAX_CONNECTION_SCOPES_BYTES + 1)),
        ("empty sealed tokens", |row| row.sealed.clear()),
        ("too-large sealed tokens", |row| row.sealed = vec![1; crate::MAX_CONNECTION_SEALED_BYTES + 1]),
        ("negative creation", |row| row.created_ms = -1),
        ("update before creation", |row| row.updated_ms = row.created_ms - 1),
        ("negative expiry", |row| row.expires_ms = Some(-5)),
    ];
    for (what, break_it) in broken {
        for upstream in ["github", "linear"] {
            let mut row = sample_connection(1, upstream, 1_000, 9);
            break_it(&mut row);
            let put = store.put_connection(&row).await;
            expect_quiet_invalid(put, what);
            let replaced = store.replace_connection(&row, 1).await;
            expect_quiet_invalid(replaced, what);
            assert_eq!(connection_rows(store).await, before, "{what}: something was written");
        }
    }
    let current = sample_connection(1, "github", 1_000, 9);
    expect_invalid(store.replace_connection(&current, 0).await, "expected version 0");
    expect_invalid(store.replace_connection(&current, -1).await, "expected version -1");

    let long_upstream = "u".repeat(crate::MAX_CONNECTION_UPSTREAM_BYTES + 1);
    let long_client = "c".repeat(crate::MAX_CONNECTION_TEXT_BYTES + 1);
    let key = connection_principal(1);
    for (upstream, client) in [
        ("", "cursor"),
        (long_upstream.as_str(), "cursor"),
        ("github", ""),
        ("github", &long_client),
        ("git\u{7f}hub", "cursor"),
        ("github", "hunter2\r"),
    ] {
        let what = "a bad upstream or client id";
        let approved = store.approve_client(key, upstream, client, 2_000).await;
        expect_quiet_invalid(approved, what);
        expect_invalid(store.client_approved(key, upstream, client).await, what);
        expect_invalid(store.revoke_client(key, upstream, client).await, what);
        if client == "cursor" {
            expect_invalid(store.connection(key, upstream).await, what);
            expect_invalid(store.delete_connection(key, upstream).await, what);
        }
    }
    expect_invalid(store.connection(key, "").await, "an empty upstream");
    expect_invalid(store.delete_connection(key, &long_upstream).await, "a too-long upstream");
    expect_invalid(store.approve_client(key, "github", "zed", -1).await, "a negative approval time");

    let too_large = format!("\"{}\"", "b".repeat(crate::MAX_OAUTH_BODY_BYTES));
    let long_kind = "k".repeat(crate::MAX_FLOW_KIND_BYTES + 1);
    for (kind, body, expires_ms, what) in [
        ("", "{}", 9_000, "an empty kind"),
        ("sign in", "{}", 9_000, "a kind with a space"),
        (long_kind.as_str(), "{}", 9_000, "a too-long kind"),
        ("connect", "", 9_000, "an empty body"),
        ("connect", "{hunter2", 9_000, "a body that is not JSON"),
        ("connect", too_large.as_str(), 9_000, "a too-large body"),
        ("connect", "{}", -1, "a negative expiry"),
    ] {
        let put = store.put_flow(flow_digest(2), kind, body, expires_ms).await;
        expect_quiet_invalid(put, what);
    }
    for kind in ["", "état", "hunter2 "] {
        expect_invalid(store.flow(flow_digest(1), kind, 1_000).await, "flow with a bad kind");
        expect_invalid(store.take_flow(flow_digest(1), kind, 1_000).await, "take_flow with a bad kind");
    }
    assert_eq!(store.flow(flow_digest(2), "connect", 1_000).await.expect("flow"), None, "no flow was stored");
    assert_eq!(store.flow(flow_digest(1), "connect", 1_000).await.expect("flow"), Some("{}".into()), "not taken");

    let issuer = "https://as.example";
    let callback = "https://gateway.example/cb";
    for (issuer, callback, body, now_ms, what) in [
        ("", callback, "{}", 1_000, "an empty issuer"),
        (issuer, "", "{}", 1_000, "an empty redirect URI"),
        ("https://hunter2.example\n", callback, "{}", 1_000, "a control character in the issuer"),
        (issuer, long_client.as_str(), "{}", 1_000, "a too-long redirect URI"),
        (issuer, callback, "{hunter2", 1_000, "a body that is not JSON"),
        (issuer, callback, too_large.as_str(), 1_000, "a too-large body"),
        (issuer, callback, "{}", -1, "a negative time"),
    ] {
        let put = store.put_oauth_client(issuer, callback, body, now_ms).await;
        expect_quiet_invalid(put, what);
    }
    expect_invalid(store.oauth_client("", callback).await, "oauth_client with an empty issuer");
    assert_eq!(store.oauth_client(issuer, callback).await.expect("oauth_client"), None, "nothing registered");
    assert_eq!(connection_rows(store).await, before, "a refused call wrote something");
    fixture.cleanup().await;
}

/// A store that is down refuses every connection operation with `Unavailable` (fail closed): no
/// connection, approval, flow or registration is answered, and the refused calls wrote or
/// consumed nothing.
pub async fn closed_store_refuses_connection_operations(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    let key = connection_principal(1);
    let row = sample_connection(1, "github", 1_000, 0);
    store.put_connection(&row).await.expect("put_connection");
    store.approve_client(key, "github", "cursor", 1_000).await.expect("approve_client");
    store.put_flow(flow_digest(1), "connect", "{}", 9_000).await.expect("put_flow");
    store.put_oauth_client("https://as.example", "https://gw.example/cb", "{}", 1_000).await.expect("register");
    let before = connection_rows(other.as_ref()).await;
    store.close().await;
    let newer = sample_connection(1, "github", 1_000, 5);
    expect_unavailable(store.put_connection(&newer).await, "put_connection");
    expect_unavailable(store.connection(key, "github").await, "connection");
    expect_unavailable(store.replace_connection(&newer, 1).await, "replace_connection");
    expect_unavailable(store.connections(None, 10).await, "connections");
    expect_unavailable(store.connections(Some(key), 10).await, "connections of a principal");
    expect_unavailable(store.delete_connection(key, "github").await, "delete_connection");
    expect_unavailable(store.delete_connections_of(key).await, "delete_connections_of");
    expect_unavailable(store.approve_client(key, "github", "zed", 2_000).await, "approve_client");
    expect_unavailable(store.client_approved(key, "github", "cursor").await, "client_approved");
    expect_unavailable(store.approved_clients(None, 10).await, "approved_clients");
    expect_unavailable(store.approved_clients(Some(key), 10).await, "approved_clients of a principal");
    expect_unavailable(store.revoke_client(key, "github", "cursor").await, "revoke_client");
    expect_unavailable(store.put_flow(flow_digest(2), "connect", "{}", 9_000).await, "put_flow");
    expect_unavailable(store.flow(flow_digest(1), "connect", 1_000).await, "flow");
    expect_unavailable(store.take_flow(flow_digest(1), "connect", 1_000).await, "take_flow");
    expect_unavailable(store.purge_flows(i64::MAX, 10).await, "purge_flows");
    expect_unavailable(
        store.put_oauth_client("https://as.example", "https://gw.example/cb", "[]", 2_000).await,
        "put_oauth_client",
    );
    expect_unavailable(store.oauth_client("https://as.example", "https://gw.example/cb").await, "oauth_client");
    assert_eq!(connection_rows(other.as_ref()).await, before, "a refused call wrote something");
    assert_eq!(expect_connection(other.as_ref(), 1, "github").await, row);
    assert_eq!(
        other.take_flow(flow_digest(1), "connect", 1_000).await.expect("take_flow"),
        Some("{}".into()),
        "not taken"
    );
    assert_eq!(other.flow(flow_digest(2), "connect", 1_000).await.expect("flow"), None, "no flow was stored");
    let registration = other.oauth_client("https://as.example", "https://gw.example/cb").await.expect("oauth_client");
    assert_eq!(registration.as_deref(), Some("{}"), "the registration was not replaced");
    other.close().await;
    fixture.cleanup().await;
}
