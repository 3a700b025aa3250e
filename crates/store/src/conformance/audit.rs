//! The audit log's checks: appends, chain links, tampering, shipping, checkpoints, searching by
//! what records say, a store that is down.

use super::*;

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

/// The `n` of [`sample_record`]s, from their trace ids, in the order given.
fn numbers(found: &[crate::StoredAuditRecord]) -> Vec<u64> {
    found
        .iter()
        .map(|stored| stored.record.trace_id.trim_start_matches("trace-").parse().expect("a sample record"))
        .collect()
}

/// `search`: each filter matches exactly its records, filters combine, values of one filter are
/// alternatives, values are data (never SQL), newest first within the limit, and one chain's
/// range oldest first with the filters still applied.
pub async fn search_filters_and_follows_chains(harness: &dyn Harness) {
    let fixture = harness.fresh().await;
    let store = fixture.store();
    let other = fixture.another_instance().await;
    append(store.as_ref(), 1..13).await;
    let upstream = |n: u64, detail: &str| AuditRecord { detail: Some(detail.to_owned()), ..sample_record(n) };
    other
        .append_batch(vec![
            upstream(13, "upstream=bank exposed=bank_pay upstream_name=pay pin=0123456789ab"),
            upstream(14, "upstream=bank"),
            upstream(15, "upstream=bank2 exposed=x"),
            upstream(16, "exposed=y upstream=bank"),
            upstream(17, "UPSTREAM=BANK z"),
        ])
        .await
        .expect("append_batch");
    let search = |query: crate::AuditQuery| {
        let store = store.clone();
        async move { numbers(&store.search(crate::AuditQuery { limit: 100, ..query }).await.expect("search")) }
    };
    let all = || crate::AuditQuery::default();
    let newest_first: Vec<u64> = (1..18).rev().collect();
    assert_eq!(search(all()).await, newest_first);
    let expect = |filter: fn(u64) -> bool| newest_first.iter().copied().filter(|n| filter(*n)).collect::<Vec<_>>();
    let base = 1_764_000_000_000;
    assert_eq!(
        search(crate::AuditQuery { since_ms: Some(base + 3), until_ms: Some(base + 6), ..all() }).await,
        vec![6, 5, 4, 3]
    );
    assert_eq!(search(crate::AuditQuery { decision: Some(Decision::Deny), ..all() }).await, expect(|n| n % 2 == 1));
    assert_eq!(
        search(crate::AuditQuery { stages: vec!["authenticate".into()], ..all() }).await,
        expect(|n| n % 3 == 0)
    );
    assert_eq!(search(crate::AuditQuery { codes: vec![-32_003], ..all() }).await, expect(|n| n % 2 == 1));
    assert_eq!(search(crate::AuditQuery { codes: vec![403], ..all() }).await, Vec::<u64>::new());
    assert_eq!(search(crate::AuditQuery { operations: vec!["tools/call".into()], ..all() }).await, newest_first);
    assert_eq!(search(crate::AuditQuery { operations: vec!["tools".into()], ..all() }).await, Vec::<u64>::new());
    assert_eq!(
        search(crate::AuditQuery {
            operations: vec!["tools/call:basket_1".into(), "tools/call:basket_3".into()],
            ..all()
        })
        .await,
        expect(|n| n % 5 == 1 || n % 5 == 3)
    );
    assert_eq!(search(crate::AuditQuery { tools: vec!["basket_2".into()], ..all() }).await, expect(|n| n % 5 == 2));
    assert_eq!(search(crate::AuditQuery { tools: vec!["BASKET_2".into()], ..all() }).await, Vec::<u64>::new());
    assert_eq!(search(crate::AuditQuery { upstreams: vec!["bank".into()], ..all() }).await, vec![14, 13]);
    assert_eq!(search(crate::AuditQuery { upstreams: vec!["ban".into()], ..all() }).await, Vec::<u64>::new());
    assert_eq!(
        search(crate::AuditQuery { principal_digests: vec![format!("p-{:x}", 4 * 7919)], ..all() }).await,
        vec![4]
    );
    assert_eq!(
        search(crate::AuditQuery { trace_ids: vec!["trace-00000009".into(), "trace-00000011".into()], ..all() }).await,
        vec![11, 9]
    );
    // Combined: every filter at once must hold.
    assert_eq!(
        search(crate::AuditQuery {
            decision: Some(Decision::Deny),
            stages: vec!["authorize".into()],
            since_ms: Some(base + 5),
            ..all()
        })
        .await,
        expect(|n| n >= 5 && n % 2 == 1 && n % 3 != 0)
    );
    for hostile in ["x' OR '1'='1", "%", "_", "authorize' --"] {
        assert_eq!(search(crate::AuditQuery { stages: vec![hostile.into()], ..all() }).await, Vec::<u64>::new());
        assert_eq!(search(crate::AuditQuery { upstreams: vec![hostile.into()], ..all() }).await, Vec::<u64>::new());
        assert_eq!(search(crate::AuditQuery { operations: vec![hostile.into()], ..all() }).await, Vec::<u64>::new());
    }
    let three = store.search(crate::AuditQuery { limit: 3, ..all() }).await.expect("search");
    assert_eq!(numbers(&three), vec![17, 16, 15]);

    // One chain's range, oldest first, the filters still applied; the head bounds it.
    let heads = store.chain_heads().await.expect("chain_heads");
    let first = heads.iter().find(|head| head.seq == 12).expect("the first handle's chain");
    let range = |after_seq, up_to_seq| Some(crate::ChainRange { chain: first.chain.clone(), after_seq, up_to_seq });
    assert_eq!(search(crate::AuditQuery { chain: range(2, 7), ..all() }).await, vec![3, 4, 5, 6, 7]);
    let denied = store
        .search(crate::AuditQuery { chain: range(2, 7), decision: Some(Decision::Deny), limit: 100, ..all() })
        .await
        .expect("search");
    assert_eq!(numbers(&denied), vec![3, 5, 7]);
    assert!(
        denied
            .iter()
            .all(|stored| stored.chain == first.chain && stored.hash == chain_hash(&stored.prev_hash, &stored.record))
    );
    assert_eq!(search(crate::AuditQuery { chain: range(12, 12), ..all() }).await, Vec::<u64>::new());
    fixture.cleanup().await;
}
