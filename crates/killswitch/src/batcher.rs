//! The client side of the batched envelope: one driver task per kill switch collects the
//! queries waiting at the moment it is free, sends them in one request over the client's
//! persistent mTLS connection, and sends the next batch as soon as that answer is in. No timer:
//! a caller alone goes out at once.
//!
//! Each caller keeps its own fresh 256-bit nonce and its own query. For each answer the driver
//! checks the batch signature once (under the batch signing context), then each item on its own:
//! index and exact path length against the signed tree size, the leaf recomputed from the query
//! this instance sent, the fold to the signed root, and every head field against that query
//! (`check_head`, as for v2). A bad item fails only its caller. The verified heads of the batch
//! then go to the generation store in one `accept_all` (exact duplicates merged); if the store
//! refuses anything, or one subject appears with two different records, each caller's heads are
//! offered on their own instead, so a rollback refuses exactly the callers it concerns.

use std::collections::HashMap;
use std::sync::Arc;

use palisade_base::clock::Clock;
use palisade_base::time::parse_rfc3339_ms;
use tokio::sync::{mpsc, oneshot};

use crate::batch::{
    BATCH_QUERY_SCHEMA_VERSION, BATCH_SCHEMA_VERSION, BatchItem, BatchQuery, BatchResponse, Hash, MAX_BATCH_QUERIES,
    key_id, leaf_hash_bytes, parse_hash, root_from_path, verify_batch,
};
use crate::client::{AuthorityClient, AuthorityError, VerifiedHead, check_head};
use crate::error::KillSwitchError;
use crate::generation::{GenerationRecord, GenerationStore, GenerationStoreError, GenerationSubject, MonotonicOutcome};
use crate::head::{Canonical as _, HeadPayload, HeadQuery, MAX_TARGETS_PER_QUERY, Phase, QUERY_SCHEMA_VERSION};
use crate::policy::Policy;
use crate::target::TargetDigest;

/// Queries per request: like Roughtime's reference server, 64.
const BATCH_LIMIT: usize = if MAX_BATCH_QUERIES < 64 { MAX_BATCH_QUERIES } else { 64 };

type Reply = oneshot::Sender<Result<Vec<VerifiedHead>, KillSwitchError>>;

struct Pending {
    phase: Phase,
    targets: Vec<TargetDigest>,
    reply: Reply,
}

/// The handle callers submit through. Dropping the last one ends the driver.
#[derive(Debug)]
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    stats: Arc<Counters>,
}

/// Requests sent and queries they carried (for benchmarks and operators' metrics).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub batches: std::sync::atomic::AtomicU64,
    pub queries: std::sync::atomic::AtomicU64,
}

pub(crate) struct DriverContext {
    pub policy: Arc<Policy>,
    pub client: AuthorityClient,
    pub store: Arc<dyn GenerationStore>,
    pub clock: Arc<dyn Clock>,
}

impl Batcher {
    /// Spawns the driver on the current runtime.
    pub(crate) fn start(context: DriverContext) -> Self {
        let (queue, receiver) = mpsc::unbounded_channel();
        let stats = Arc::new(Counters::default());
        tokio::spawn(drive(Arc::new(context), receiver, stats.clone()));
        Self { queue, stats }
    }

    /// (batches sent, queries carried) so far.
    pub(crate) fn stats(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.stats.batches.load(Relaxed), self.stats.queries.load(Relaxed))
    }

    /// One caller's query: verified heads, already accepted by the generation store.
    pub(crate) async fn current_heads(
        &self,
        phase: Phase,
        targets: Vec<TargetDigest>,
    ) -> Result<Vec<VerifiedHead>, KillSwitchError> {
        if targets.is_empty() || targets.len() > MAX_TARGETS_PER_QUERY {
            return Err(AuthorityError::Malformed { what: "target count" }.into());
        }
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Pending { phase, targets, reply })
            .map_err(|_| KillSwitchError::from(AuthorityError::Unreachable { source: None }))?;
        answer.await.map_err(|_| KillSwitchError::from(AuthorityError::Unreachable { source: None }))?
    }
}

async fn drive(context: Arc<DriverContext>, mut receiver: mpsc::UnboundedReceiver<Pending>, stats: Arc<Counters>) {
    let key_id: Arc<str> = key_id(context.policy.authority_key()).into();
    while let Some(first) = receiver.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH_LIMIT {
            match receiver.try_recv() {
                Ok(pending) => batch.push(pending),
                Err(_) => break,
            }
        }
        stats.batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        stats.queries.fetch_add(u64::try_from(batch.len()).unwrap_or(u64::MAX), std::sync::atomic::Ordering::Relaxed);
        run_batch(&context, &key_id, batch).await;
    }
}

struct Prepared {
    query: HeadQuery,
    query_bytes: Vec<u8>,
    reply: Reply,
}

/// A refusal of the whole batch (transport, status, document, signature): every caller of it.
fn fail_batch(prepared: Vec<Prepared>, error: AuthorityError) {
    tracing::debug!(%error, callers = prepared.len(), "kill switch batch refused (fail closed)");
    let copy = error.for_another_caller();
    let mut first = Some(error);
    for item in prepared {
        let error = first.take().unwrap_or_else(|| copy.for_another_caller());
        let _ = item.reply.send(Err(error.into()));
    }
}

/// Sends one batch, waits for its answer, checks it and replies to its callers.
async fn run_batch(context: &Arc<DriverContext>, key_id: &Arc<str>, batch: Vec<Pending>) {
    let policy = &context.policy;
    let mut prepared = Vec::with_capacity(batch.len());
    for pending in batch {
        let nonce = match context.client.nonce() {
            Ok(nonce) => nonce,
            Err(error) => {
                let _ = pending.reply.send(Err(error.into()));
                continue;
            }
        };
        let query = HeadQuery {
            schema_version: QUERY_SCHEMA_VERSION.to_owned(),
            policy_digest: policy.digest().to_owned(),
            policy_generation: policy.generation(),
            query_nonce: nonce,
            phase: pending.phase,
            targets: pending.targets,
        };
        let query_bytes = query.canonical_bytes();
        prepared.push(Prepared { query, query_bytes, reply: pending.reply });
    }
    if prepared.is_empty() {
        return;
    }
    let request = BatchQuery {
        schema_version: BATCH_QUERY_SCHEMA_VERSION.to_owned(),
        queries: prepared.iter().map(|item| item.query.clone()).collect(),
    };
    let (status, body) = match context.client.post_batch(request.canonical_bytes(), prepared.len()).await {
        Ok(answer) => answer,
        Err(error) => return fail_batch(prepared, error),
    };
    // Checked and answered before the next batch leaves: the time this takes is also the window
    // in which the next batch gathers (measured: handing it to a task of its own made batches
    // smaller and the cost per call higher, see BENCHMARKS.md).
    finish(context, key_id, prepared, status, body).await;
}

async fn finish(context: &DriverContext, key_id: &str, prepared: Vec<Prepared>, status: u16, body: Vec<u8>) {
    let policy = &context.policy;
    if status != 200 {
        return fail_batch(prepared, AuthorityError::HttpStatus { status });
    }
    let Ok(response) = serde_json::from_slice::<BatchResponse>(&body) else {
        return fail_batch(prepared, AuthorityError::Malformed { what: "batch response document" });
    };
    if response.items.len() != prepared.len() {
        return fail_batch(prepared, AuthorityError::Malformed { what: "batch item count" });
    }
    // The signature: once per batch.
    let signed = match verify_batch(&response.batch, policy.authority_key()) {
        Ok(signed) => signed,
        Err(error) => return fail_batch(prepared, AuthorityError::Envelope(error)),
    };
    let now_ms = context.clock.now_ms();
    if let Err(error) = check_batch_payload(&signed, policy, key_id, now_ms) {
        return fail_batch(prepared, error);
    }
    let Some(root) = parse_hash(&signed.root) else {
        return fail_batch(prepared, AuthorityError::HeadMismatch { field: "root" });
    };

    // Each item on its own.
    let mut verified: Vec<(Prepared, Result<Vec<VerifiedHead>, KillSwitchError>)> = Vec::with_capacity(prepared.len());
    for (item, answer) in prepared.into_iter().zip(response.items) {
        let result = check_item(&item, &answer, &root, signed.tree_size, policy, now_ms).map_err(KillSwitchError::from);
        verified.push((item, result));
    }
    accept(context, &mut verified).await;
    for (item, result) in verified {
        let _ = item.reply.send(result);
    }
}

fn check_batch_payload(
    signed: &crate::batch::BatchPayload,
    policy: &Policy,
    key_id: &str,
    now_ms: i64,
) -> Result<(), AuthorityError> {
    let mismatch = |field| Err(AuthorityError::HeadMismatch { field });
    if signed.schema_version != BATCH_SCHEMA_VERSION {
        return mismatch("batch schema_version");
    }
    if signed.authority != policy.authority() {
        return mismatch("batch authority");
    }
    if signed.key_id != key_id {
        return mismatch("batch key_id");
    }
    if signed.tree_size == 0 {
        return mismatch("tree_size");
    }
    let issued_at_ms =
        parse_rfc3339_ms(&signed.issued_at).ok_or(AuthorityError::HeadMismatch { field: "batch issued_at" })?;
    let max_age = i64::try_from(policy.payload().max_authority_response_age_ms).unwrap_or(i64::MAX);
    if issued_at_ms > now_ms || now_ms.saturating_sub(issued_at_ms) > max_age {
        return Err(AuthorityError::Stale);
    }
    Ok(())
}

fn check_item(
    item: &Prepared,
    answer: &BatchItem,
    root: &Hash,
    tree_size: u64,
    policy: &Policy,
    now_ms: i64,
) -> Result<Vec<VerifiedHead>, AuthorityError> {
    if answer.heads.len() != item.query.targets.len() {
        return Err(AuthorityError::Malformed { what: "head count" });
    }
    let path = answer
        .path
        .iter()
        .map(|node| parse_hash(node))
        .collect::<Option<Vec<Hash>>>()
        .ok_or(AuthorityError::Inclusion)?;
    let heads: Vec<Vec<u8>> = answer.heads.iter().map(HeadPayload::canonical_bytes).collect();
    let leaf = leaf_hash_bytes(&item.query_bytes, &heads);
    match root_from_path(&leaf, answer.index, tree_size, &path) {
        Some(folded) if folded == *root => {}
        _ => return Err(AuthorityError::Inclusion),
    }
    answer
        .heads
        .iter()
        .zip(&item.query.targets)
        .map(|(head, target)| check_head(head, policy, &item.query, target, now_ms))
        .collect()
}

fn record(policy: &Policy, head: &VerifiedHead) -> GenerationRecord {
    GenerationRecord {
        authority: policy.authority().to_owned(),
        subject: GenerationSubject::Target(head.target.clone()),
        generation: head.generation,
        digest: head.state_digest.clone(),
        state: head.state.as_str().to_owned(),
    }
}

/// Maps outcomes to a refusal (the first unacceptable one), as the single path does.
pub(crate) fn outcome_refusal(heads: &[VerifiedHead], outcomes: &[MonotonicOutcome]) -> Result<(), KillSwitchError> {
    if outcomes.len() != heads.len() {
        return Err(GenerationStoreError::Corrupt { what: "outcome count" }.into());
    }
    for (head, outcome) in heads.iter().zip(outcomes) {
        match outcome {
            MonotonicOutcome::Stale => return Err(KillSwitchError::StaleGeneration { kind: head.target.kind }),
            MonotonicOutcome::Conflict => return Err(KillSwitchError::GenerationConflict { kind: head.target.kind }),
            MonotonicOutcome::Accepted | MonotonicOutcome::Replay => {}
        }
    }
    Ok(())
}

/// Offers every verified head of the batch to the generation store: once, merged, when that
/// is unambiguous and all acceptable; otherwise caller by caller.
async fn accept(context: &DriverContext, verified: &mut [(Prepared, Result<Vec<VerifiedHead>, KillSwitchError>)]) {
    let policy = &context.policy;
    let mut merged: Vec<GenerationRecord> = Vec::new();
    let mut by_subject: HashMap<GenerationSubject, usize> = HashMap::new();
    let mut ambiguous = false;
    for (_, result) in verified.iter() {
        let Ok(heads) = result else { continue };
        for head in heads {
            let candidate = record(policy, head);
            match by_subject.get(&candidate.subject) {
                Some(&at) if merged.get(at) == Some(&candidate) => {}
                Some(_) => ambiguous = true,
                None => {
                    by_subject.insert(candidate.subject.clone(), merged.len());
                    merged.push(candidate);
                }
            }
        }
    }
    if merged.is_empty() {
        return;
    }
    if !ambiguous {
        match context.store.accept_all(&merged).await {
            Ok(outcomes)
                if outcomes.len() == merged.len() && outcomes.iter().all(|outcome| outcome.is_acceptable()) =>
            {
                return;
            }
            Ok(_) => {}
            Err(error) => {
                for (_, result) in verified.iter_mut() {
                    if result.is_ok() {
                        *result = Err(error.clone().into());
                    }
                }
                return;
            }
        }
    }
    // Something was refused (or one subject had two records): each caller on its own, so the
    // refusal reaches exactly the callers whose heads it concerns.
    for (_, result) in verified.iter_mut() {
        let Ok(heads) = result else { continue };
        let records: Vec<GenerationRecord> = heads.iter().map(|head| record(policy, head)).collect();
        let outcome = match context.store.accept_all(&records).await {
            Ok(outcomes) => outcome_refusal(heads, &outcomes),
            Err(error) => Err(error.into()),
        };
        if let Err(error) = outcome {
            *result = Err(error);
        }
    }
}
