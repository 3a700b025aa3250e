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
    AuditRecord, AuditStore, AuditWriter, AuditWriterConfig, ChainBreak, ChainBreakKind, Decision, GENESIS_HASH,
    StoreError, chain_hash,
};

/// A boxed future for harness methods.
pub type HarnessFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the suite needs from a backend. Setup failures panic (they are test failures).
pub trait Harness: Send + Sync {
    /// A fresh, empty store on storage no other test shares.
    fn fresh(&self) -> HarnessFuture<'_, Box<dyn Fixture>>;
    /// Opens a store whose storage cannot be reached (closed port, unwritable path). The suite
    /// expects `Err(StoreError::Unavailable)`.
    fn open_unreachable(&self) -> HarnessFuture<'_, Result<Arc<dyn AuditStore>, StoreError>>;
}

/// One fresh store and a handle on the storage under it.
pub trait Fixture: Send + Sync {
    /// The store under test.
    fn store(&self) -> Arc<dyn AuditStore>;
    /// A second, independent store on the same storage: another process or instance, with its
    /// own connections.
    fn another_instance(&self) -> HarnessFuture<'_, Arc<dyn AuditStore>>;
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
            closed_store_is_unavailable,
            unreachable_store_is_unavailable,
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
    assert_eq!(report.head_seq, count, "head sequence");
}

async fn expect_break(store: &dyn AuditStore, seq: u64, kind: ChainBreakKind) {
    let report = store.verify_chain().await.expect("verify_chain");
    assert_eq!(report.first_break, Some(ChainBreak { seq, kind }), "{report:?}");
}

fn expect_unavailable<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(matches!(result, Err(StoreError::Unavailable { .. })), "{what}: expected Unavailable, got {result:?}");
}

/// A fresh store holds nothing and verifies.
pub async fn empty_store_verifies(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let report = fixture.store().verify_chain().await.expect("verify_chain");
    assert!(report.is_intact(), "{report:?}");
    assert_eq!((report.records, report.head_seq, report.head_hash), (0, 0, GENESIS_HASH));
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
        assert_eq!(record.hash, chain_hash(&prev_hash, &record.record).expect("hash"), "hash of {}", record.seq);
        prev_hash = record.hash;
    }
    assert_eq!(store.verify_chain().await.expect("verify_chain").head_hash, prev_hash);
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
            "INSERT INTO audit_log (seq, at_ms, trace_id, stage, decision, operation, principal_digest, tenant_digest, \
             client_digest, scopes, policy_version, code, detail, prev_hash, hash) \
             SELECT seq + 1, at_ms, trace_id, stage, decision, operation, principal_digest, tenant_digest, \
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
    assert_eq!(report.first_break, Some(ChainBreak { seq: 1700, kind: ChainBreakKind::HashMismatch }));
    assert_eq!(report.records, 2500);
    fixture.cleanup().await;
}

/// Many tasks on two instances append at once: one unforked chain holding every record once.
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
