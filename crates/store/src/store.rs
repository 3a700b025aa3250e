//! The `AuditStore` trait: what every audit backend offers, dyn-compatible so the server can hold
//! an `Arc<dyn AuditStore>` chosen at start-up.

use std::future::Future;
use std::pin::Pin;

use crate::{AuditQuery, AuditRecord, ChainHead, ChainReport, CheckpointedHeads, StoreError, StoredAuditRecord};

/// A checkpoint as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    /// From 1, without gaps.
    pub seq: u64,
    /// When it was signed, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The signed bytes: canonical JSON of a `checkpoint::CheckpointBody`.
    pub body: String,
    /// Ed25519 over `body`.
    pub signature: Vec<u8>,
    /// JSON `[[chain, seq, hash hex], …]`: the heads that changed since the previous checkpoint,
    /// sorted by chain id.
    pub delta: String,
}

/// The boxed future every store method returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Most records [`AuditStore::recent`] returns, whatever limit is asked for.
pub const MAX_RECENT: u32 = 10_000;

/// A durable, hash-chained, append-only audit log of many chains, and the signed checkpoints over
/// their heads. `Debug` so holders can derive it; an implementation's `Debug` must not print
/// connection strings.
///
/// **Invariant:** each chain has one writer. Record `seq` of a chain (from 1, no gaps) stores
/// `hash = SHA-256(prev_hash || canonical JSON of the record)` with `prev_hash` the hash of that
/// chain's record `seq - 1` ([`GENESIS_HASH`](crate::GENESIS_HASH) for the first). Writers link
/// their own records ([`link`](crate::link)) and the store only checks and keeps them: no row,
/// lock or sequence is shared between writers.
pub trait AuditStore: Send + Sync + std::fmt::Debug + 'static {
    /// Stores records of `chain` that its writer linked, as one transaction: checked (one chain,
    /// consecutive, linked, each hashing to its hash, continuing the stored head), then inserted
    /// keyed by `(chain, seq)` — a record already stored is skipped, so a batch shipped again
    /// after a crash is harmless — and the chain's head advanced. An empty batch is a no-op.
    fn ship(&self, chain: &str, records: Vec<StoredAuditRecord>) -> StoreFuture<'_, ()>;

    /// Appends `records` onto this store handle's own chain (begun at its first append, with a
    /// random id) as one transaction: all are linked and committed, or none is. For writers of a
    /// few records (an operator command, a gateway's review decisions); a server's request path
    /// uses an [`AuditWriter`](crate::AuditWriter). After a failed append the handle begins a
    /// new chain (the old one may or may not have the failed batch: never forked either way).
    fn append_batch(&self, records: Vec<AuditRecord>) -> StoreFuture<'_, ()>;

    /// Every chain's head, ordered by chain id.
    fn chain_heads(&self) -> StoreFuture<'_, Vec<ChainHead>>;

    /// One chain's stored head (`None` for a chain with nothing stored).
    fn chain_head(&self, chain: &str) -> StoreFuture<'_, Option<ChainHead>>;

    /// Walks every chain from its first record to its head, recomputing each hash, and reports
    /// the counts and the first break. Tampering is a report, not an error; errors mean the walk
    /// could not be done.
    fn verify_chain(&self) -> StoreFuture<'_, ChainReport> {
        self.verify_chain_against(CheckpointedHeads::new())
    }

    /// [`verify_chain`](AuditStore::verify_chain), also comparing every hash that signed
    /// checkpoints name with its stored record, and finding chains that are gone or behind them.
    /// [`verify_log`](crate::verify_log) calls it with what the checkpoints say.
    fn verify_chain_against(&self, checkpointed: CheckpointedHeads) -> StoreFuture<'_, ChainReport>;

    /// The newest `limit` records (capped at [`MAX_RECENT`]) over every chain, newest first.
    fn recent(&self, limit: u32) -> StoreFuture<'_, Vec<StoredAuditRecord>>;

    /// The records `query` matches: the newest `query.limit` (capped at
    /// [`MAX_SEARCH`](crate::MAX_SEARCH)) newest first, or, for one chain's range, oldest first.
    /// Reads only.
    fn search(&self, query: AuditQuery) -> StoreFuture<'_, Vec<StoredAuditRecord>>;

    /// Takes or renews the lease to sign checkpoints: `Ok(true)` if `holder` holds it until
    /// `until_ms` (it was free, expired at `now_ms`, or already `holder`'s).
    fn claim_checkpointer(&self, holder: &str, now_ms: i64, until_ms: i64) -> StoreFuture<'_, bool>;

    /// Stores a signed checkpoint and notes `advanced` (the heads its delta names) as
    /// checkpointed, in one transaction. `Ok(false)`: a checkpoint with that `seq` exists
    /// (another signer won; nothing changed).
    fn add_checkpoint(&self, checkpoint: StoredCheckpoint, advanced: Vec<ChainHead>) -> StoreFuture<'_, bool>;

    /// Checkpoints with `seq > after_seq`, ascending, at most `limit` (capped at 1000).
    fn checkpoints(&self, after_seq: u64, limit: u32) -> StoreFuture<'_, Vec<StoredCheckpoint>>;

    /// The checkpoint with the highest `seq`, if any.
    fn latest_checkpoint(&self) -> StoreFuture<'_, Option<StoredCheckpoint>>;

    /// Readiness: succeeds when the store can be reached and its schema read. Fails with
    /// [`StoreError::Unavailable`] when the store is down.
    fn ping(&self) -> StoreFuture<'_, ()>;

    /// Closes the connections. Later calls fail with [`StoreError::Unavailable`].
    fn close(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}
