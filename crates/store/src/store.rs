//! The `AuditStore` trait: what every audit backend offers, dyn-compatible so the server can hold
//! an `Arc<dyn AuditStore>` chosen at start-up.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{AuditRecord, BlockingAppend, ChainReport, StoreError, StoredAuditRecord};

/// The boxed future every store method returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Most records [`AuditStore::recent`] returns, whatever limit is asked for.
pub const MAX_RECENT: u32 = 10_000;

/// A durable, hash-chained, append-only audit log. `Debug` so holders can derive it; an
/// implementation's `Debug` must not print connection strings.
///
/// **Invariant:** records form one chain. Record `seq` (from 1, no gaps) stores
/// `hash = SHA-256(prev_hash || canonical JSON of the record)` with `prev_hash` the hash of record
/// `seq - 1` ([`GENESIS_HASH`](crate::GENESIS_HASH) for the first), however many appenders, tasks
/// or processes write concurrently: backends serialize appends on the chain head.
pub trait AuditStore: Send + Sync + std::fmt::Debug + 'static {
    /// Appends `records` in order as one transaction: all are linked and committed, or none is.
    /// An empty batch is a no-op. On the request path prefer [`AuditWriter`](crate::AuditWriter),
    /// which groups concurrent appends into one call.
    fn append_batch(&self, records: Vec<AuditRecord>) -> StoreFuture<'_, ()>;

    /// The same append as a synchronous call, for a backend where that is cheaper than the async
    /// path; the [`AuditWriter`](crate::AuditWriter) then commits from a thread of its own. `None`
    /// (the default) keeps the writer on `append_batch`.
    fn blocking_append(&self) -> Option<Arc<dyn BlockingAppend>> {
        None
    }

    /// Walks every record from the first to the chain head, recomputing each hash, and reports the
    /// count and the first break. Tampering is a report, not an error; errors mean the walk could
    /// not be done.
    fn verify_chain(&self) -> StoreFuture<'_, ChainReport>;

    /// The newest `limit` records (capped at [`MAX_RECENT`]), newest first.
    fn recent(&self, limit: u32) -> StoreFuture<'_, Vec<StoredAuditRecord>>;

    /// Readiness: succeeds when the store can be reached and its schema read (it reads the chain
    /// head). Fails with [`StoreError::Unavailable`] when the store is down.
    fn ping(&self) -> StoreFuture<'_, ()>;

    /// Closes the connections. Later calls fail with [`StoreError::Unavailable`].
    fn close(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}
