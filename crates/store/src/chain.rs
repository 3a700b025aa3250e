//! Backend-independent chain logic: one hash chain per writer (a chain id, `seq` from 1), linking
//! records onto a chain's head, checking a shipped batch before it is stored, and walking stored
//! rows chain by chain to verify them. Backends only move rows in and out.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;

use crate::StoreError;
use crate::record::{AuditRecord, Decision, GENESIS_HASH, StoredAuditRecord, chain_hash};

/// The chain id of the records written before the log had one chain per writer (migrated from
/// the single global chain): 32 zeros. Every other chain id is random.
pub const LEGACY_CHAIN: &str = "00000000000000000000000000000000";

/// True for a well-formed chain id: 32 lowercase hex characters.
pub fn is_chain_id(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

/// A new random chain id. Fails only if the system's random source does.
pub fn new_chain_id() -> Result<String, StoreError> {
    let mut bytes = [0u8; 16];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| StoreError::unavailable("random chain id"))?;
    Ok(palisade_base::hex::hex(&bytes))
}

/// One chain's head as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainHead {
    /// The chain id.
    pub chain: String,
    /// The newest record's sequence number.
    pub seq: u64,
    /// The newest record's hash.
    pub hash: [u8; 32],
    /// The head's `seq` as of the latest checkpoint that included a change of this chain (0
    /// before any): the checkpointer's note of what changed since, covered by no signature.
    pub checkpointed_seq: u64,
}

/// What signed checkpoints say some records' hashes are: chain id → (seq → hash). The walk
/// checks each against the stored record.
pub type CheckpointedHeads = HashMap<String, BTreeMap<u64, [u8; 32]>>;

/// What [`AuditStore::verify_chain`](crate::AuditStore::verify_chain) found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainReport {
    /// Records walked, over every chain (those at or below each chain's head when its walk began).
    pub records: u64,
    /// Chains walked.
    pub chains: u64,
    /// Checkpointed hashes compared with their records.
    pub checkpointed: u64,
    /// The first place a chain does not verify, if any.
    pub first_break: Option<ChainBreak>,
}

impl ChainReport {
    /// True when every record verified and every head matches its chain's last record.
    pub fn is_intact(&self) -> bool {
        self.first_break.is_none()
    }
}

/// Where and how a chain first fails to verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainBreak {
    /// The chain.
    pub chain: String,
    /// The sequence number at which it breaks.
    pub seq: u64,
    /// What is wrong there.
    pub kind: ChainBreakKind,
}

impl std::fmt::Display for ChainBreak {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "chain {} at record {}: {}", self.chain, self.seq, self.kind.describe())
    }
}

/// The ways a chain can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChainBreakKind {
    /// No record with this sequence number, though the head says it exists (deleted).
    MissingRecord,
    /// The record's `prev_hash` is not the previous record's hash (reordered, or a predecessor
    /// deleted and the rest renumbered).
    PrevHashMismatch,
    /// The record's fields no longer hash to its stored hash (edited).
    HashMismatch,
    /// The stored columns do not form a valid record (e.g. malformed scopes, bad hash length).
    Undecodable,
    /// The last record's hash differs from the hash the chain head recorded.
    HeadMismatch,
    /// Records exist beyond the chain head, or for a chain with no head (inserted behind the
    /// store's back).
    BeyondHead,
    /// A signed checkpoint names this record's hash, and the stored record (or its absence)
    /// disagrees: the chain was rewritten or truncated after it was checkpointed.
    CheckpointMismatch,
    /// A signed checkpoint names this chain, and the store has no head for it (deleted).
    ChainDisappeared,
    /// The chain's head is behind a signed checkpoint's (its tail deleted, head row rewound).
    WentBackwards,
}

impl ChainBreakKind {
    /// A short description for reports.
    pub fn describe(self) -> &'static str {
        match self {
            ChainBreakKind::MissingRecord => "record missing (deleted)",
            ChainBreakKind::PrevHashMismatch => {
                "prev_hash does not link to the previous record (reordered or renumbered)"
            }
            ChainBreakKind::HashMismatch => "record does not hash to its stored hash (edited)",
            ChainBreakKind::Undecodable => "stored columns do not form a record",
            ChainBreakKind::HeadMismatch => "last record differs from the chain head",
            ChainBreakKind::BeyondHead => "records beyond the chain head (inserted)",
            ChainBreakKind::CheckpointMismatch => "differs from the signed checkpoint (rewritten or truncated)",
            ChainBreakKind::ChainDisappeared => "a checkpointed chain has disappeared",
            ChainBreakKind::WentBackwards => "head is behind a signed checkpoint (truncated)",
        }
    }
}

/// One `audit_log` row as both backends return it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct AuditRow {
    pub chain_id: String,
    pub seq: i64,
    pub at_ms: i64,
    pub trace_id: String,
    pub stage: String,
    pub decision: String,
    pub operation: String,
    pub principal_digest: Option<String>,
    pub tenant_digest: Option<String>,
    pub client_digest: Option<String>,
    pub scopes: String,
    pub policy_version: Option<String>,
    pub code: Option<i64>,
    pub detail: Option<String>,
    pub prev_hash: Vec<u8>,
    pub hash: Vec<u8>,
}

impl AuditRow {
    /// Rebuilds the stored record, or says why it cannot.
    pub fn decode(self) -> Result<StoredAuditRecord, &'static str> {
        let seq = u64::try_from(self.seq).map_err(|_| "negative sequence number")?;
        let at_ms = u64::try_from(self.at_ms).map_err(|_| "negative at_ms")?;
        let decision = Decision::parse(&self.decision).ok_or("unknown decision")?;
        let scopes: Vec<String> =
            serde_json::from_str(&self.scopes).map_err(|_| "scopes are not a JSON string array")?;
        let prev_hash: [u8; 32] = self.prev_hash.as_slice().try_into().map_err(|_| "prev_hash is not 32 bytes")?;
        let hash: [u8; 32] = self.hash.as_slice().try_into().map_err(|_| "hash is not 32 bytes")?;
        let record = AuditRecord {
            at_ms,
            trace_id: self.trace_id,
            stage: self.stage,
            decision,
            operation: self.operation,
            principal_digest: self.principal_digest,
            tenant_digest: self.tenant_digest,
            client_digest: self.client_digest,
            scopes,
            policy_version: self.policy_version,
            code: self.code,
            detail: self.detail,
        };
        Ok(StoredAuditRecord { chain: self.chain_id, seq, record, prev_hash, hash })
    }
}

/// Decodes a row for reading, turning a bad row into `Corrupt` naming its sequence number.
pub(crate) fn decode_row(row: AuditRow) -> Result<StoredAuditRecord, StoreError> {
    let (chain, seq) = (row.chain_id.clone(), row.seq);
    row.decode().map_err(|why| StoreError::corrupt(format!("chain {chain} record {seq}: {why}")))
}

/// Links `records` after `head` of `chain` (`None`: a new chain): sequence numbers from the
/// head's plus one, each hash over the previous one. Every record is validated first; nothing
/// is written here.
pub fn link(
    chain: &str,
    head: Option<(u64, [u8; 32])>,
    records: Vec<AuditRecord>,
) -> Result<Vec<StoredAuditRecord>, StoreError> {
    for record in &records {
        record.validate()?;
    }
    let (mut seq, mut prev_hash) = head.unwrap_or((0, GENESIS_HASH));
    let mut linked = Vec::with_capacity(records.len());
    for record in records {
        seq = seq.checked_add(1).ok_or_else(|| StoreError::corrupt("sequence number overflow"))?;
        let hash = chain_hash(&prev_hash, &record);
        linked.push(StoredAuditRecord { chain: chain.to_owned(), seq, record, prev_hash, hash });
        prev_hash = hash;
    }
    Ok(linked)
}

/// Checks a batch before a backend ships it: one well-formed chain id, consecutive sequence
/// numbers, each record valid, linked to the one before and hashing to its stored hash. The
/// first record must link onto the stored head (`stored`: its `seq` and `hash`) or lie at or
/// below it (a batch shipped again after a crash); a gap is refused. Returns the batch's head.
pub(crate) fn check_batch(
    chain: &str,
    records: &[StoredAuditRecord],
    stored: Option<(u64, [u8; 32])>,
) -> Result<Option<(u64, [u8; 32])>, StoreError> {
    if !is_chain_id(chain) {
        return Err(StoreError::InvalidRecord { reason: "a chain id is 32 lowercase hex characters" });
    }
    let Some(first) = records.first() else { return Ok(None) };
    let (stored_seq, stored_hash) = stored.unwrap_or((0, GENESIS_HASH));
    if first.seq == 0 || first.seq > stored_seq.saturating_add(1) {
        return Err(StoreError::InvalidRecord { reason: "the batch does not continue its chain (a gap)" });
    }
    if first.seq == stored_seq.saturating_add(1) && first.prev_hash != stored_hash {
        return Err(StoreError::InvalidRecord { reason: "the batch does not link onto its chain's head" });
    }
    if first.seq == 1 && first.prev_hash != GENESIS_HASH {
        return Err(StoreError::InvalidRecord { reason: "a chain's first record links to the genesis hash" });
    }
    let mut previous: Option<&StoredAuditRecord> = None;
    for record in records {
        record.record.validate()?;
        if record.chain != chain {
            return Err(StoreError::InvalidRecord { reason: "a batch holds one chain's records" });
        }
        if let Some(before) = previous
            && (record.seq != before.seq.saturating_add(1) || record.prev_hash != before.hash)
        {
            return Err(StoreError::InvalidRecord { reason: "the batch's records are not linked in order" });
        }
        if chain_hash(&record.prev_hash, &record.record) != record.hash {
            return Err(StoreError::InvalidRecord { reason: "a record does not hash to its hash" });
        }
        previous = Some(record);
    }
    Ok(previous.map(|last| (last.seq, last.hash)))
}

/// Rows fetched per page while verifying.
pub(crate) const VERIFY_PAGE: i64 = 1000;

/// Verifies every chain: `heads` as read before the walk; `fetch_page(chain, after_seq,
/// up_to_seq, limit)` returns that chain's rows with `after_seq < seq <= up_to_seq` in ascending
/// order, at most `limit`; `after` reads, once the walk is done, every chain's head and highest
/// stored `seq` (a record beyond its head as of that read was not written by a store).
pub(crate) async fn verify_all<F, Fut, A, AFut>(
    heads: Vec<ChainHead>,
    checkpointed: &CheckpointedHeads,
    mut fetch_page: F,
    after: A,
) -> Result<ChainReport, StoreError>
where
    F: FnMut(String, i64, i64, i64) -> Fut,
    Fut: Future<Output = Result<Vec<AuditRow>, StoreError>>,
    A: FnOnce() -> AFut,
    AFut: Future<Output = Result<(Vec<ChainHead>, Vec<(String, i64)>), StoreError>>,
{
    let mut report = ChainReport { records: 0, chains: 0, checkpointed: 0, first_break: None };
    for head in &heads {
        let seq = i64::try_from(head.seq).map_err(|_| StoreError::corrupt("chain head sequence out of range"))?;
        let mut verifier = Verifier::new(head, checkpointed.get(&head.chain));
        loop {
            let page = fetch_page(head.chain.clone(), verifier.last_seq(), seq, VERIFY_PAGE).await?;
            let full = page.len() as i64 == VERIFY_PAGE;
            for row in page {
                verifier.feed(row);
            }
            if !full {
                break;
            }
        }
        let (records, checked, broken) = verifier.finish();
        report.records += records;
        report.checkpointed += checked;
        report.chains += 1;
        if report.first_break.is_none() {
            report.first_break = broken;
        }
    }
    let (heads_now, maxima) = after().await?;
    if report.first_break.is_none() {
        let now: HashMap<&str, u64> = heads_now.iter().map(|head| (head.chain.as_str(), head.seq)).collect();
        for (chain, max_seq) in &maxima {
            let head_seq = now.get(chain.as_str()).copied().unwrap_or(0);
            if u64::try_from(*max_seq).unwrap_or(0) > head_seq {
                report.first_break =
                    Some(ChainBreak { chain: chain.clone(), seq: head_seq + 1, kind: ChainBreakKind::BeyondHead });
                break;
            }
        }
    }
    if report.first_break.is_none() {
        // Checkpointed chains the walk did not see, and heads behind a checkpoint.
        let walked: HashMap<&str, u64> = heads.iter().map(|head| (head.chain.as_str(), head.seq)).collect();
        let mut names: Vec<&String> = checkpointed.keys().collect();
        names.sort();
        for chain in names {
            let newest = checkpointed[chain].keys().next_back().copied().unwrap_or(0);
            let kind = match walked.get(chain.as_str()) {
                None => ChainBreakKind::ChainDisappeared,
                Some(&seq) if seq < newest => ChainBreakKind::WentBackwards,
                Some(_) => continue,
            };
            report.first_break = Some(ChainBreak { chain: chain.clone(), seq: newest, kind });
            break;
        }
    }
    Ok(report)
}

/// Walks one chain's rows in ascending `seq` order (fed page by page) and remembers the first break.
#[derive(Debug)]
struct Verifier<'a> {
    chain: String,
    head_seq: u64,
    head_hash: [u8; 32],
    checkpointed: Option<&'a BTreeMap<u64, [u8; 32]>>,
    checked: u64,
    records: u64,
    next_seq: i64,
    running_hash: [u8; 32],
    first_break: Option<ChainBreak>,
}

impl<'a> Verifier<'a> {
    /// Starts a walk that must end exactly at `head`.
    fn new(head: &ChainHead, checkpointed: Option<&'a BTreeMap<u64, [u8; 32]>>) -> Self {
        Verifier {
            chain: head.chain.clone(),
            head_seq: head.seq,
            head_hash: head.hash,
            checkpointed,
            checked: 0,
            records: 0,
            next_seq: 1,
            running_hash: GENESIS_HASH,
            first_break: None,
        }
    }

    /// The highest sequence number fed so far (0 before the first row): the next page starts after it.
    fn last_seq(&self) -> i64 {
        self.next_seq - 1
    }

    fn at(&self, seq: i64, kind: ChainBreakKind) -> Option<ChainBreak> {
        Some(ChainBreak { chain: self.chain.clone(), seq: u64::try_from(seq).unwrap_or(0), kind })
    }

    /// Feeds the next row (ascending `seq`, at most the head's).
    fn feed(&mut self, row: AuditRow) {
        self.records += 1;
        let seq = row.seq;
        let stored_hash = row.hash.clone();
        if self.first_break.is_none() {
            self.first_break = self.check(row);
        }
        // Continue from what is stored, so only the first break is reported.
        if let Ok(hash) = <[u8; 32]>::try_from(stored_hash.as_slice()) {
            self.running_hash = hash;
            if let Some(expected) = self.checkpointed.and_then(|map| map.get(&u64::try_from(seq).unwrap_or(0))) {
                self.checked += 1;
                if *expected != hash && self.first_break.is_none() {
                    self.first_break = self.at(seq, ChainBreakKind::CheckpointMismatch);
                }
            }
        }
        self.next_seq = seq.saturating_add(1);
    }

    fn check(&self, row: AuditRow) -> Option<ChainBreak> {
        if row.seq != self.next_seq {
            return self.at(self.next_seq, ChainBreakKind::MissingRecord);
        }
        let seq = row.seq;
        let stored = match row.decode() {
            Ok(stored) => stored,
            Err(_) => return self.at(seq, ChainBreakKind::Undecodable),
        };
        if stored.prev_hash != self.running_hash {
            return self.at(seq, ChainBreakKind::PrevHashMismatch);
        }
        if chain_hash(&stored.prev_hash, &stored.record) == stored.hash {
            None
        } else {
            self.at(seq, ChainBreakKind::HashMismatch)
        }
    }

    /// Ends the walk: records walked, checkpointed hashes compared, the first break.
    fn finish(mut self) -> (u64, u64, Option<ChainBreak>) {
        let head_seq = i64::try_from(self.head_seq).unwrap_or(i64::MAX);
        if self.first_break.is_none() {
            if self.last_seq() != head_seq {
                self.first_break = self.at(self.next_seq, ChainBreakKind::MissingRecord);
            } else if self.running_hash != self.head_hash {
                self.first_break = self.at(head_seq, ChainBreakKind::HeadMismatch);
            }
        }
        if self.first_break.is_none()
            && let Some((&seq, _)) = self.checkpointed.and_then(|map| map.range(self.head_seq + 1..).next())
        {
            // A checkpointed record beyond the head: the tail was cut.
            self.first_break = self.at(i64::try_from(seq).unwrap_or(0), ChainBreakKind::WentBackwards);
        }
        (self.records, self.checked, self.first_break)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAIN: &str = "0123456789abcdef0123456789abcdef";

    fn record(n: u64) -> AuditRecord {
        AuditRecord {
            at_ms: 1_000 + n,
            trace_id: format!("trace-{n}"),
            stage: "authorize".into(),
            decision: if n.is_multiple_of(2) { Decision::Allow } else { Decision::Deny },
            operation: "tools/call:basket_view".into(),
            principal_digest: None,
            tenant_digest: Some("t".into()),
            client_digest: None,
            scopes: vec!["a".into(), "b".into()],
            policy_version: None,
            code: None,
            detail: None,
        }
    }

    fn row(stored: &StoredAuditRecord) -> AuditRow {
        AuditRow {
            chain_id: stored.chain.clone(),
            seq: stored.seq as i64,
            at_ms: stored.record.at_ms as i64,
            trace_id: stored.record.trace_id.clone(),
            stage: stored.record.stage.clone(),
            decision: stored.record.decision.as_str().into(),
            operation: stored.record.operation.clone(),
            principal_digest: stored.record.principal_digest.clone(),
            tenant_digest: stored.record.tenant_digest.clone(),
            client_digest: stored.record.client_digest.clone(),
            scopes: serde_json::to_string(&stored.record.scopes).unwrap(),
            policy_version: stored.record.policy_version.clone(),
            code: stored.record.code,
            detail: stored.record.detail.clone(),
            prev_hash: stored.prev_hash.to_vec(),
            hash: stored.hash.to_vec(),
        }
    }

    fn head_of(linked: &[StoredAuditRecord]) -> ChainHead {
        let last = linked.last().unwrap();
        ChainHead { chain: CHAIN.into(), seq: last.seq, hash: last.hash, checkpointed_seq: 0 }
    }

    fn verify_with(head: ChainHead, rows: Vec<AuditRow>, checkpointed: &CheckpointedHeads) -> Option<ChainBreak> {
        let mut verifier = Verifier::new(&head, checkpointed.get(CHAIN));
        for row in rows {
            verifier.feed(row);
        }
        verifier.finish().2
    }

    fn verify(head: ChainHead, rows: Vec<AuditRow>) -> Option<ChainBreak> {
        verify_with(head, rows, &CheckpointedHeads::new())
    }

    fn chain(n: u64) -> (Vec<AuditRow>, ChainHead) {
        let linked = link(CHAIN, None, (1..=n).map(record).collect()).unwrap();
        (linked.iter().map(row).collect(), head_of(&linked))
    }

    fn broken(seq: u64, kind: ChainBreakKind) -> Option<ChainBreak> {
        Some(ChainBreak { chain: CHAIN.into(), seq, kind })
    }

    #[test]
    fn linked_rows_verify_and_continue_across_batches() {
        let first = link(CHAIN, None, vec![record(1), record(2)]).unwrap();
        let second = link(CHAIN, Some((2, first[1].hash)), vec![record(3)]).unwrap();
        assert_eq!(second[0].prev_hash, first[1].hash);
        assert_eq!(second[0].seq, 3);
        let mut all: Vec<AuditRow> = first.iter().map(row).collect();
        all.extend(second.iter().map(row));
        assert_eq!(verify(head_of(&second), all), None);
    }

    #[test]
    fn edits_gaps_and_swaps_are_found_at_their_sequence() {
        let (mut edited, head) = chain(5);
        edited[2].detail = Some("edited".into());
        assert_eq!(verify(head, edited), broken(3, ChainBreakKind::HashMismatch));

        let (mut gap, head) = chain(5);
        gap.remove(1);
        assert_eq!(verify(head, gap), broken(2, ChainBreakKind::MissingRecord));

        let (mut tail, head) = chain(5);
        tail.pop();
        assert_eq!(verify(head, tail), broken(5, ChainBreakKind::MissingRecord));

        let (mut swapped, head) = chain(5);
        swapped.swap(1, 2);
        swapped[1].seq = 2;
        swapped[2].seq = 3;
        assert_eq!(verify(head, swapped), broken(2, ChainBreakKind::PrevHashMismatch));

        let (mut bad_scopes, head) = chain(3);
        bad_scopes[0].scopes = "not json".into();
        assert_eq!(verify(head, bad_scopes), broken(1, ChainBreakKind::Undecodable));

        let (rows, mut head) = chain(3);
        head.hash = [7; 32];
        assert_eq!(verify(head, rows), broken(3, ChainBreakKind::HeadMismatch));
    }

    #[test]
    fn checkpointed_hashes_are_compared_and_a_cut_tail_is_found() {
        let (rows, head) = chain(6);
        let hash_of = |seq: usize| <[u8; 32]>::try_from(rows[seq - 1].hash.as_slice()).unwrap();
        let mut checkpointed = CheckpointedHeads::new();
        checkpointed.entry(CHAIN.into()).or_default().extend([(2, hash_of(2)), (6, hash_of(6))]);
        assert_eq!(verify_with(head.clone(), rows.clone(), &checkpointed), None);

        // The whole chain rewritten consistently (hashes recomputed) still differs from the
        // checkpoint.
        let rewritten = link(CHAIN, None, (1..=6).map(|n| record(n + 100)).collect()).unwrap();
        let new_head = head_of(&rewritten);
        assert_eq!(
            verify_with(new_head, rewritten.iter().map(row).collect(), &checkpointed),
            broken(2, ChainBreakKind::CheckpointMismatch)
        );

        // The tail cut and the head row rewound onto the last record left.
        let cut: Vec<AuditRow> = rows[..4].to_vec();
        let cut_head = ChainHead { chain: CHAIN.into(), seq: 4, hash: hash_of(4), checkpointed_seq: 0 };
        assert_eq!(verify_with(cut_head, cut, &checkpointed), broken(6, ChainBreakKind::WentBackwards));
    }

    #[test]
    fn a_shipped_batch_must_continue_and_link_its_chain() {
        let linked = link(CHAIN, None, (1..=4).map(record).collect()).unwrap();
        assert_eq!(check_batch(CHAIN, &linked, None).unwrap(), Some((4, linked[3].hash)));
        // Shipped again after a crash: at or below the stored head is fine.
        assert!(check_batch(CHAIN, &linked[1..], Some((4, linked[3].hash))).is_ok());
        // A gap, a batch not linking onto the head, an edited record, a foreign chain id.
        assert!(check_batch(CHAIN, &linked[2..], Some((1, linked[0].hash))).is_err());
        assert!(check_batch(CHAIN, &linked[1..], Some((1, [9; 32]))).is_err());
        let mut edited = linked.clone();
        edited[2].record.detail = Some("edited".into());
        assert!(check_batch(CHAIN, &edited, None).is_err());
        assert!(check_batch("not-a-chain", &linked, None).is_err());
        let other = link("fedcba9876543210fedcba9876543210", None, vec![record(1)]).unwrap();
        assert!(check_batch(CHAIN, &other, None).is_err());
    }

    #[test]
    fn an_invalid_record_fails_the_whole_link() {
        let mut bad = record(2);
        bad.operation = "x\0".into();
        assert!(matches!(link(CHAIN, None, vec![record(1), bad]), Err(StoreError::InvalidRecord { .. })));
    }

    #[test]
    fn chain_ids_are_32_lowercase_hex() {
        let id = new_chain_id().unwrap();
        assert!(is_chain_id(&id) && is_chain_id(LEGACY_CHAIN));
        assert!(!is_chain_id("0123456789ABCDEF0123456789abcdef") && !is_chain_id("abc"));
        assert_ne!(id, new_chain_id().unwrap());
    }
}
