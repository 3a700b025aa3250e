//! Backend-independent chain logic: linking a batch onto the chain head before it is inserted,
//! and walking stored rows to verify the chain. Backends only move rows in and out.

use std::future::Future;

use crate::StoreError;
use crate::record::{AuditRecord, Decision, GENESIS_HASH, StoredAuditRecord, chain_hash};

/// What [`AuditStore::verify_chain`](crate::AuditStore::verify_chain) found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainReport {
    /// Records walked (those at or below `head_seq` when the walk began).
    pub records: u64,
    /// The chain head's sequence number when the walk began (0 for an empty log).
    pub head_seq: u64,
    /// The chain head's hash when the walk began ([`GENESIS_HASH`] for an empty log).
    pub head_hash: [u8; 32],
    /// The first place the chain does not verify, if any.
    pub first_break: Option<ChainBreak>,
}

impl ChainReport {
    /// True when every record verified and the head matches the last record.
    pub fn is_intact(&self) -> bool {
        self.first_break.is_none()
    }
}

/// Where and how the chain first fails to verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainBreak {
    /// The sequence number at which the chain breaks.
    pub seq: u64,
    /// What is wrong there.
    pub kind: ChainBreakKind,
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
    /// Records exist beyond the chain head (inserted behind the store's back).
    BeyondHead,
}

/// One `audit_log` row as both backends return it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct AuditRow {
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
        Ok(StoredAuditRecord { seq, record, prev_hash, hash })
    }
}

/// Decodes a row for reading, turning a bad row into `Corrupt` naming its sequence number.
pub(crate) fn decode_row(row: AuditRow) -> Result<StoredAuditRecord, StoreError> {
    let seq = row.seq;
    row.decode().map_err(|why| StoreError::corrupt(format!("record {seq}: {why}")))
}

/// Pages through the records from the first to `head` (inclusive) and feeds them to a
/// [`Verifier`]. `fetch_page(after_seq, up_to_seq, limit)` returns rows with
/// `after_seq < seq <= up_to_seq` in ascending order, at most `limit`.
pub(crate) async fn walk<F, Fut>(head: Head, mut fetch_page: F) -> Result<Verifier, StoreError>
where
    F: FnMut(i64, i64, i64) -> Fut,
    Fut: Future<Output = Result<Vec<AuditRow>, StoreError>>,
{
    let mut verifier = Verifier::new(head);
    loop {
        let page = fetch_page(verifier.last_seq(), head.seq, VERIFY_PAGE).await?;
        let full = page.len() as i64 == VERIFY_PAGE;
        for row in page {
            verifier.feed(row);
        }
        if !full {
            return Ok(verifier);
        }
    }
}

/// Rows fetched per page while verifying.
const VERIFY_PAGE: i64 = 1000;

/// A record linked onto the chain, in column form, ready to insert.
#[derive(Debug)]
pub(crate) struct LinkedRow {
    pub seq: i64,
    pub at_ms: i64,
    pub record: AuditRecord,
    pub decision: &'static str,
    pub scopes_json: String,
    pub prev_hash: [u8; 32],
    pub hash: [u8; 32],
}

/// The chain head as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub seq: i64,
    pub hash: [u8; 32],
}

impl Head {
    pub fn from_columns(seq: i64, hash: &[u8]) -> Result<Self, StoreError> {
        let hash: [u8; 32] = hash.try_into().map_err(|_| StoreError::corrupt("chain head hash is not 32 bytes"))?;
        if seq < 0 {
            return Err(StoreError::corrupt("chain head sequence is negative"));
        }
        Ok(Head { seq, hash })
    }
}

/// Validates every record, then links them after `head`: sequence numbers `head.seq + 1 ..` and
/// each hash over the previous one. Returns the rows and the new head. Nothing is written here.
pub(crate) fn link(head: Head, records: Vec<AuditRecord>) -> Result<(Vec<LinkedRow>, Head), StoreError> {
    for record in &records {
        record.validate()?;
    }
    let mut rows = Vec::with_capacity(records.len());
    let mut seq = head.seq;
    let mut prev_hash = head.hash;
    for record in records {
        seq = seq.checked_add(1).ok_or_else(|| StoreError::corrupt("sequence number overflow"))?;
        let hash = chain_hash(&prev_hash, &record);
        let at_ms = i64::try_from(record.at_ms)
            .map_err(|_| StoreError::InvalidRecord { reason: "at_ms is larger than i64::MAX" })?;
        let scopes_json = serde_json::to_string(&record.scopes)
            .map_err(|_| StoreError::InvalidRecord { reason: "scopes do not serialize to JSON" })?;
        rows.push(LinkedRow { seq, at_ms, decision: record.decision.as_str(), record, scopes_json, prev_hash, hash });
        prev_hash = hash;
    }
    Ok((rows, Head { seq, hash: prev_hash }))
}

/// Walks rows in ascending `seq` order (fed page by page) and remembers the first break.
#[derive(Debug)]
pub(crate) struct Verifier {
    head: Head,
    records: u64,
    next_seq: i64,
    running_hash: [u8; 32],
    first_break: Option<ChainBreak>,
}

impl Verifier {
    /// Starts a walk that must end exactly at `head`.
    pub fn new(head: Head) -> Self {
        Verifier { head, records: 0, next_seq: 1, running_hash: GENESIS_HASH, first_break: None }
    }

    /// The highest sequence number fed so far (0 before the first row): the next page starts after it.
    pub fn last_seq(&self) -> i64 {
        self.next_seq - 1
    }

    /// Feeds the next row (ascending `seq`, at most `head.seq`).
    pub fn feed(&mut self, row: AuditRow) {
        self.records += 1;
        let seq = row.seq;
        let stored_hash = row.hash.clone();
        if self.first_break.is_none() {
            self.first_break = self.check(row);
        }
        // Continue from what is stored, so only the first break is reported.
        if let Ok(hash) = <[u8; 32]>::try_from(stored_hash.as_slice()) {
            self.running_hash = hash;
        }
        self.next_seq = seq.saturating_add(1);
    }

    fn check(&self, row: AuditRow) -> Option<ChainBreak> {
        let at = |seq: i64, kind| Some(ChainBreak { seq: u64::try_from(seq).unwrap_or(0), kind });
        if row.seq != self.next_seq {
            return at(self.next_seq, ChainBreakKind::MissingRecord);
        }
        let seq = row.seq;
        let stored = match row.decode() {
            Ok(stored) => stored,
            Err(_) => return at(seq, ChainBreakKind::Undecodable),
        };
        if stored.prev_hash != self.running_hash {
            return at(seq, ChainBreakKind::PrevHashMismatch);
        }
        if chain_hash(&stored.prev_hash, &stored.record) == stored.hash {
            None
        } else {
            at(seq, ChainBreakKind::HashMismatch)
        }
    }

    /// Ends the walk. `max_seq_now` and `head_seq_now` come from one read after the walk: a record
    /// beyond the head as of that read was not written by a store.
    pub fn finish(mut self, head_seq_now: i64, max_seq_now: Option<i64>) -> ChainReport {
        if self.first_break.is_none() {
            if self.last_seq() != self.head.seq {
                self.first_break = Some(ChainBreak {
                    seq: u64::try_from(self.next_seq).unwrap_or(0),
                    kind: ChainBreakKind::MissingRecord,
                });
            } else if self.running_hash != self.head.hash {
                self.first_break = Some(ChainBreak {
                    seq: u64::try_from(self.head.seq).unwrap_or(0),
                    kind: ChainBreakKind::HeadMismatch,
                });
            }
        }
        if self.first_break.is_none()
            && let Some(max_seq) = max_seq_now
            && max_seq > head_seq_now
        {
            self.first_break = Some(ChainBreak {
                seq: u64::try_from(head_seq_now.saturating_add(1)).unwrap_or(0),
                kind: ChainBreakKind::BeyondHead,
            });
        }
        ChainReport {
            records: self.records,
            head_seq: u64::try_from(self.head.seq).unwrap_or(0),
            head_hash: self.head.hash,
            first_break: self.first_break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn rows(linked: &[LinkedRow]) -> Vec<AuditRow> {
        linked
            .iter()
            .map(|row| AuditRow {
                seq: row.seq,
                at_ms: row.at_ms,
                trace_id: row.record.trace_id.clone(),
                stage: row.record.stage.clone(),
                decision: row.decision.into(),
                operation: row.record.operation.clone(),
                principal_digest: row.record.principal_digest.clone(),
                tenant_digest: row.record.tenant_digest.clone(),
                client_digest: row.record.client_digest.clone(),
                scopes: row.scopes_json.clone(),
                policy_version: row.record.policy_version.clone(),
                code: row.record.code,
                detail: row.record.detail.clone(),
                prev_hash: row.prev_hash.to_vec(),
                hash: row.hash.to_vec(),
            })
            .collect()
    }

    fn verify(head: Head, rows: Vec<AuditRow>) -> ChainReport {
        let mut verifier = Verifier::new(head);
        let max = rows.iter().map(|row| row.seq).max();
        for row in rows {
            verifier.feed(row);
        }
        verifier.finish(head.seq, max)
    }

    fn chain(n: u64) -> (Vec<AuditRow>, Head) {
        let genesis = Head { seq: 0, hash: GENESIS_HASH };
        let (linked, head) = link(genesis, (1..=n).map(record).collect()).unwrap();
        (rows(&linked), head)
    }

    #[test]
    fn linked_rows_verify_and_continue_across_batches() {
        let genesis = Head { seq: 0, hash: GENESIS_HASH };
        let (first, head) = link(genesis, vec![record(1), record(2)]).unwrap();
        let (second, head) = link(head, vec![record(3)]).unwrap();
        assert_eq!(second[0].prev_hash, first[1].hash);
        assert_eq!(head.seq, 3);
        let mut all = rows(&first);
        all.extend(rows(&second));
        let report = verify(head, all);
        assert!(report.is_intact(), "{report:?}");
        assert_eq!(report.records, 3);
    }

    #[test]
    fn edits_gaps_and_swaps_are_found_at_their_sequence() {
        let (mut edited, head) = chain(5);
        edited[2].detail = Some("edited".into());
        assert_eq!(verify(head, edited).first_break, Some(ChainBreak { seq: 3, kind: ChainBreakKind::HashMismatch }));

        let (mut gap, head) = chain(5);
        gap.remove(1);
        assert_eq!(verify(head, gap).first_break, Some(ChainBreak { seq: 2, kind: ChainBreakKind::MissingRecord }));

        let (mut tail, head) = chain(5);
        tail.pop();
        assert_eq!(verify(head, tail).first_break, Some(ChainBreak { seq: 5, kind: ChainBreakKind::MissingRecord }));

        let (mut swapped, head) = chain(5);
        swapped.swap(1, 2);
        swapped[1].seq = 2;
        swapped[2].seq = 3;
        assert_eq!(
            verify(head, swapped).first_break,
            Some(ChainBreak { seq: 2, kind: ChainBreakKind::PrevHashMismatch })
        );

        let (mut bad_scopes, head) = chain(3);
        bad_scopes[0].scopes = "not json".into();
        assert_eq!(
            verify(head, bad_scopes).first_break,
            Some(ChainBreak { seq: 1, kind: ChainBreakKind::Undecodable })
        );
    }

    #[test]
    fn head_mismatch_and_rows_beyond_the_head() {
        let (rows_, _) = chain(3);
        let wrong_head = Head { seq: 3, hash: [7; 32] };
        assert_eq!(
            verify(wrong_head, rows_).first_break,
            Some(ChainBreak { seq: 3, kind: ChainBreakKind::HeadMismatch })
        );

        let (rows_, head) = chain(3);
        let mut verifier = Verifier::new(head);
        for row in rows_ {
            verifier.feed(row);
        }
        let report = verifier.finish(3, Some(4));
        assert_eq!(report.first_break, Some(ChainBreak { seq: 4, kind: ChainBreakKind::BeyondHead }));
    }

    #[test]
    fn empty_chain_verifies() {
        let report = verify(Head { seq: 0, hash: GENESIS_HASH }, Vec::new());
        assert!(report.is_intact());
        assert_eq!(report.records, 0);
    }

    #[test]
    fn an_invalid_record_fails_the_whole_link() {
        let mut bad = record(2);
        bad.operation = "x\0".into();
        let result = link(Head { seq: 0, hash: GENESIS_HASH }, vec![record(1), bad]);
        assert!(matches!(result, Err(StoreError::InvalidRecord { .. })));
    }
}
