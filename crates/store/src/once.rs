//! The `OnceStore` trait: records that are used at most once (an accepted confirmation, …),
//! shared by every instance on the store. A record is a 32-byte digest the caller computes (e.g.
//! the SHA-256 of a sealed state) and an expiry after which the retention job may delete it.
//!
//! **Invariant:** a digest is answered "first use" at most once while its record exists, however
//! many callers, tasks, processes or instances race for it: the claim is one
//! `INSERT … ON CONFLICT DO NOTHING` and its rows-affected count. An expired record that is not
//! purged yet still answers "used before": the store never re-allows on its own clock (the
//! caller's sealed state carries its own expiry, so keep `expires_ms` at or after that one).

use sqlx::{Database, Encode, Executor, IntoArguments, Pool, Type};

use crate::StoreError;
use crate::backend::Backend;
use crate::store::StoreFuture;

/// Records that are used at most once (an accepted confirmation, …), shared by every instance on
/// the store. Implemented by every store backend.
pub trait OnceStore: Send + Sync + std::fmt::Debug + 'static {
    /// Marks `digest` used until `expires_ms`. `Ok(true)`: this call is the first use; `Ok(false)`:
    /// it was used before (and has not been purged). One statement (`INSERT … ON CONFLICT DO
    /// NOTHING`, rows affected), so two instances racing for the same digest get exactly one
    /// `true`. A record whose expiry passed but that is not purged yet still answers `false`; a
    /// digest already used keeps its first expiry. Any error means "not known to be unused": the
    /// caller refuses (fail closed).
    fn consume_once(&self, digest: [u8; 32], expires_ms: i64) -> StoreFuture<'_, bool>;

    /// Deletes at most `limit` records whose `expires_ms` is at or before `now_ms`; returns how
    /// many. Bounded so a retention job never holds the writer for long.
    fn purge_once(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64>;
}

/// The statements both backends run, with `$n` placeholders (SQLite gets them as `?n`).
pub(crate) mod sql {
    use crate::backend::Statement;

    pub static CONSUME: Statement =
        Statement::new("INSERT INTO used_once (digest, expires_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING");
    pub static PURGE: Statement = Statement::new(
        "DELETE FROM used_once WHERE digest IN (SELECT digest FROM used_once WHERE expires_ms <= $1 LIMIT $2)",
    );
}

/// [`OnceStore`] for every backend, from the shared statements (one text for both).
impl<B> OnceStore for B
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
{
    fn consume_once(&self, digest: [u8; 32], expires_ms: i64) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let done = sqlx::query(B::sql(&sql::CONSUME))
                .bind(digest.to_vec())
                .bind(expires_ms)
                .execute(self.writer())
                .await
                .map_err(|error| StoreError::from_sqlx("consume_once", error))?;
            Ok(B::rows_affected(&done) == 1)
        })
    }

    fn purge_once(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let done = sqlx::query(B::sql(&sql::PURGE))
                .bind(now_ms)
                .bind(i64::from(limit))
                .execute(self.writer())
                .await
                .map_err(|error| StoreError::from_sqlx("purge_once", error))?;
            Ok(B::rows_affected(&done))
        })
    }
}
