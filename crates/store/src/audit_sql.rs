//! The audit log's statements, written once with `$n` placeholders (SQLite gets them as `?n`),
//! the [`AuditStore`](crate::AuditStore) implementation both backends share
//! ([`impl_audit_store!`]), and a store handle's own chain for [`append_batch`].
//!
//! [`append_batch`]: crate::AuditStore::append_batch

use std::sync::OnceLock;

use crate::chain::{is_chain_id, link, new_chain_id};
use crate::{AuditRecord, AuditStore, ChainHead, StoreError, StoredCheckpoint};

pub(crate) mod sql {
    pub const HEADS: &str =
        "SELECT chain_id, head_seq, head_hash, checkpointed_seq FROM audit_chains ORDER BY chain_id";
    pub const HEAD: &str =
        "SELECT chain_id, head_seq, head_hash, checkpointed_seq FROM audit_chains WHERE chain_id = $1";
    pub const PAGE: &str = concat!(
        "SELECT chain_id, ",
        audit_columns!(),
        " FROM audit_log WHERE chain_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4"
    );
    pub const MAXIMA: &str = "SELECT chain_id, max(seq) FROM audit_log GROUP BY chain_id";
    pub const RECENT: &str =
        concat!("SELECT chain_id, ", audit_columns!(), " FROM audit_log ORDER BY at_ms DESC, seq DESC LIMIT $1");
    /// Only ever forward: a batch shipped again leaves the head where it is.
    pub const UPSERT_HEAD: &str = "INSERT INTO audit_chains (chain_id, head_seq, head_hash) VALUES ($1, $2, $3) \
        ON CONFLICT (chain_id) DO UPDATE SET head_seq = excluded.head_seq, head_hash = excluded.head_hash \
        WHERE audit_chains.head_seq < excluded.head_seq";
    pub const CLAIM: &str = "UPDATE audit_checkpointer SET holder = $1, until_ms = $2 \
        WHERE id = 1 AND (holder = $1 OR until_ms < $3)";
    pub const INSERT_CHECKPOINT: &str = "INSERT INTO audit_checkpoints (seq, at_ms, body, signature, delta) \
        VALUES ($1, $2, $3, $4, $5) ON CONFLICT (seq) DO NOTHING";
    pub const MARK_CHECKPOINTED: &str =
        "UPDATE audit_chains SET checkpointed_seq = $2 WHERE chain_id = $1 AND checkpointed_seq < $2";
    pub const CHECKPOINTS: &str =
        "SELECT seq, at_ms, body, signature, delta FROM audit_checkpoints WHERE seq > $1 ORDER BY seq LIMIT $2";
    pub const LATEST_CHECKPOINT: &str =
        "SELECT seq, at_ms, body, signature, delta FROM audit_checkpoints ORDER BY seq DESC LIMIT 1";
    pub const PING: &str = "SELECT holder FROM audit_checkpointer WHERE id = 1";
}

/// Most rows per INSERT statement (16 parameters each, within both backends' limits).
pub(crate) const INSERT_CHUNK: usize = 64;

/// `INSERT INTO audit_log (chain_id, …) VALUES (…), … ON CONFLICT DO NOTHING` for `rows` rows
/// (1..=[`INSERT_CHUNK`]) with `marker` placeholders (`$n`, or SQLite's anonymous `?`), built
/// once per size.
pub(crate) fn insert_statement(rows: usize, marker: char) -> sqlx::AssertSqlSafe<&'static str> {
    static DOLLAR: OnceLock<Vec<String>> = OnceLock::new();
    static QUESTION: OnceLock<Vec<String>> = OnceLock::new();
    let cache = if marker == '$' { &DOLLAR } else { &QUESTION };
    let statements = cache.get_or_init(|| {
        (1..=INSERT_CHUNK)
            .map(|count| {
                let values: Vec<String> = (0..count)
                    .map(|row| {
                        // SQLite gets anonymous `?`s: for numbered ones sqlx looks each name up
                        // (`sqlite3_bind_parameter_name`, a linear scan), quadratic in the row count
                        // (measured at 14 % of the server's CPU with 64-row statements).
                        let params: Vec<String> = (1..=16)
                            .map(
                                |column| if marker == '$' { format!("${}", row * 16 + column) } else { "?".to_owned() },
                            )
                            .collect();
                        format!("({})", params.join(", "))
                    })
                    .collect();
                format!(
                    "INSERT INTO audit_log (chain_id, {}) VALUES {} ON CONFLICT (chain_id, seq) DO NOTHING",
                    audit_columns!(),
                    values.join(", ")
                )
            })
            .collect()
    });
    // Only ever built above from constants: safe to send as SQL.
    sqlx::AssertSqlSafe(statements[rows.clamp(1, INSERT_CHUNK) - 1].as_str())
}

/// A head row as both backends return it.
pub(crate) type HeadRow = (String, i64, Vec<u8>, i64);

pub(crate) fn decode_head(row: HeadRow) -> Result<ChainHead, StoreError> {
    let (chain, seq, hash, checkpointed) = row;
    let bad = || StoreError::corrupt(format!("chain {chain}: head row is malformed"));
    if !is_chain_id(&chain) {
        return Err(StoreError::corrupt("a chain head row has a malformed chain id"));
    }
    let hash: [u8; 32] = hash.as_slice().try_into().map_err(|_| bad())?;
    let seq = u64::try_from(seq).map_err(|_| bad())?;
    let checkpointed_seq = u64::try_from(checkpointed).map_err(|_| bad())?;
    Ok(ChainHead { chain, seq, hash, checkpointed_seq })
}

/// A checkpoint row as both backends return it.
pub(crate) type CheckpointRow = (i64, i64, String, Vec<u8>, String);

pub(crate) fn decode_checkpoint(row: CheckpointRow) -> Result<StoredCheckpoint, StoreError> {
    let (seq, at_ms, body, signature, delta) = row;
    let seq = u64::try_from(seq).map_err(|_| StoreError::corrupt("a checkpoint's seq is negative"))?;
    let at_ms = u64::try_from(at_ms).map_err(|_| StoreError::corrupt("a checkpoint's time is negative"))?;
    Ok(StoredCheckpoint { seq, at_ms, body, signature, delta })
}

/// The chain a store handle appends to through [`AuditStore::append_batch`]: begun with a random
/// id at the first append, continued while appends succeed, abandoned after a failed one (its
/// state in the store is then unknown, and a new chain can never fork it).
#[derive(Debug, Default)]
pub(crate) struct OwnChain {
    state: tokio::sync::Mutex<Option<(String, u64, [u8; 32])>>,
}

impl OwnChain {
    pub async fn append<S: AuditStore + ?Sized>(&self, store: &S, records: Vec<AuditRecord>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut state = self.state.lock().await;
        let (chain, head) = match &*state {
            Some((chain, seq, hash)) => (chain.clone(), Some((*seq, *hash))),
            None => (new_chain_id()?, None),
        };
        let linked = link(&chain, head, records)?;
        let last = linked.last().map(|record| (record.seq, record.hash));
        match store.ship(&chain, linked).await {
            Ok(()) => {
                *state = last.map(|(seq, hash)| (chain, seq, hash));
                Ok(())
            }
            Err(error) => {
                *state = None;
                Err(error)
            }
        }
    }
}

/// Implements [`AuditStore`](crate::AuditStore) for a backend from the shared statements.
/// `begin` opens a write transaction, `writer`/`reader` name the pools, `sql` adapts a
/// statement's placeholders, `marker` is the placeholder character of `insert_statement`, `own`
/// the [`OwnChain`] field, `close` the backend's own close.
macro_rules! impl_audit_store {
    (store: $store:ty, begin: $begin:ident, writer: $writer:ident, reader: $reader:ident, sql: $sql:ident,
     marker: $marker:literal, own: $own:ident, close: $close:ident) => {
        impl $store {
            async fn ship_inner(&self, chain: &str, records: Vec<crate::StoredAuditRecord>) -> Result<(), StoreError> {
                if records.is_empty() {
                    return Ok(());
                }
                let during = "ship";
                let sqlx_error = |error| StoreError::from_sqlx(during, error);
                let mut transaction = self.$begin().await.map_err(sqlx_error)?;
                let stored: Option<crate::audit_sql::HeadRow> = sqlx::query_as($sql!(crate::audit_sql::sql::HEAD))
                    .bind(chain)
                    .fetch_optional(&mut *transaction)
                    .await
                    .map_err(sqlx_error)?;
                let stored = stored.map(crate::audit_sql::decode_head).transpose()?;
                let Some((head_seq, head_hash)) =
                    crate::chain::check_batch(chain, &records, stored.map(|head| (head.seq, head.hash)))?
                else {
                    return Ok(());
                };
                let mut records = records.into_iter().peekable();
                while records.peek().is_some() {
                    let chunk: Vec<_> = records.by_ref().take(crate::audit_sql::INSERT_CHUNK).collect();
                    let mut query = sqlx::query(crate::audit_sql::insert_statement(chunk.len(), $marker));
                    for stored in chunk {
                        let record = stored.record;
                        let scopes = serde_json::to_string(&record.scopes)
                            .map_err(|_| StoreError::InvalidRecord { reason: "scopes do not serialize to JSON" })?;
                        query = query
                            .bind(stored.chain)
                            .bind(
                                i64::try_from(stored.seq)
                                    .map_err(|_| StoreError::corrupt("sequence number overflow"))?,
                            )
                            .bind(
                                i64::try_from(record.at_ms)
                                    .map_err(|_| StoreError::InvalidRecord { reason: "at_ms out of range" })?,
                            )
                            .bind(record.trace_id)
                            .bind(record.stage)
                            .bind(record.decision.as_str())
                            .bind(record.operation)
                            .bind(record.principal_digest)
                            .bind(record.tenant_digest)
                            .bind(record.client_digest)
                            .bind(scopes)
                            .bind(record.policy_version)
                            .bind(record.code)
                            .bind(record.detail)
                            .bind(stored.prev_hash.to_vec())
                            .bind(stored.hash.to_vec());
                    }
                    query.execute(&mut *transaction).await.map_err(sqlx_error)?;
                }
                sqlx::query($sql!(crate::audit_sql::sql::UPSERT_HEAD))
                    .bind(chain)
                    .bind(i64::try_from(head_seq).map_err(|_| StoreError::corrupt("sequence number overflow"))?)
                    .bind(head_hash.to_vec())
                    .execute(&mut *transaction)
                    .await
                    .map_err(sqlx_error)?;
                transaction.commit().await.map_err(sqlx_error)
            }

            async fn heads_inner(&self, during: &'static str) -> Result<Vec<crate::ChainHead>, StoreError> {
                let rows: Vec<crate::audit_sql::HeadRow> = sqlx::query_as($sql!(crate::audit_sql::sql::HEADS))
                    .fetch_all(&self.$reader)
                    .await
                    .map_err(|error| StoreError::from_sqlx(during, error))?;
                rows.into_iter().map(crate::audit_sql::decode_head).collect()
            }

            async fn verify_inner(&self, checkpointed: crate::CheckpointedHeads) -> Result<ChainReport, StoreError> {
                let during = "verify";
                let heads = self.heads_inner(during).await?;
                crate::chain::verify_all(
                    heads,
                    &checkpointed,
                    |chain, after_seq, up_to_seq, limit| async move {
                        sqlx::query_as($sql!(crate::audit_sql::sql::PAGE))
                            .bind(chain)
                            .bind(after_seq)
                            .bind(up_to_seq)
                            .bind(limit)
                            .fetch_all(&self.$reader)
                            .await
                            .map_err(|error| StoreError::from_sqlx(during, error))
                    },
                    || async move {
                        // Maxima first, heads second: a batch shipped between the two statements
                        // moves its head in the same transaction as its records, so an honest
                        // log never shows a record beyond the head read after it.
                        let maxima: Vec<(String, i64)> = sqlx::query_as($sql!(crate::audit_sql::sql::MAXIMA))
                            .fetch_all(&self.$reader)
                            .await
                            .map_err(|error| StoreError::from_sqlx(during, error))?;
                        let heads = self.heads_inner(during).await?;
                        Ok((heads, maxima))
                    },
                )
                .await
            }

            async fn recent_inner(&self, limit: u32) -> Result<Vec<StoredAuditRecord>, StoreError> {
                let rows: Vec<crate::chain::AuditRow> = sqlx::query_as($sql!(crate::audit_sql::sql::RECENT))
                    .bind(i64::from(limit.min(crate::MAX_RECENT)))
                    .fetch_all(&self.$reader)
                    .await
                    .map_err(|error| StoreError::from_sqlx("recent", error))?;
                rows.into_iter().map(crate::chain::decode_row).collect()
            }

            async fn add_checkpoint_inner(
                &self,
                checkpoint: crate::StoredCheckpoint,
                advanced: Vec<crate::ChainHead>,
            ) -> Result<bool, StoreError> {
                let during = "checkpoint";
                let sqlx_error = |error| StoreError::from_sqlx(during, error);
                let range = |value: u64| {
                    i64::try_from(value)
                        .map_err(|_| StoreError::InvalidRecord { reason: "checkpoint value out of range" })
                };
                let mut transaction = self.$begin().await.map_err(sqlx_error)?;
                let inserted = sqlx::query($sql!(crate::audit_sql::sql::INSERT_CHECKPOINT))
                    .bind(range(checkpoint.seq)?)
                    .bind(range(checkpoint.at_ms)?)
                    .bind(checkpoint.body)
                    .bind(checkpoint.signature)
                    .bind(checkpoint.delta)
                    .execute(&mut *transaction)
                    .await
                    .map_err(sqlx_error)?;
                if inserted.rows_affected() != 1 {
                    return Ok(false);
                }
                for head in advanced {
                    sqlx::query($sql!(crate::audit_sql::sql::MARK_CHECKPOINTED))
                        .bind(head.chain)
                        .bind(range(head.seq)?)
                        .execute(&mut *transaction)
                        .await
                        .map_err(sqlx_error)?;
                }
                transaction.commit().await.map_err(sqlx_error)?;
                Ok(true)
            }
        }

        impl crate::AuditStore for $store {
            fn ship(&self, chain: &str, records: Vec<StoredAuditRecord>) -> StoreFuture<'_, ()> {
                let chain = chain.to_owned();
                Box::pin(async move { self.ship_inner(&chain, records).await })
            }

            fn append_batch(&self, records: Vec<AuditRecord>) -> StoreFuture<'_, ()> {
                Box::pin(self.$own.append(self, records))
            }

            fn chain_heads(&self) -> StoreFuture<'_, Vec<crate::ChainHead>> {
                Box::pin(self.heads_inner("chain heads"))
            }

            fn chain_head(&self, chain: &str) -> StoreFuture<'_, Option<crate::ChainHead>> {
                let chain = chain.to_owned();
                Box::pin(async move {
                    let row: Option<crate::audit_sql::HeadRow> = sqlx::query_as($sql!(crate::audit_sql::sql::HEAD))
                        .bind(chain)
                        .fetch_optional(&self.$reader)
                        .await
                        .map_err(|error| StoreError::from_sqlx("chain head", error))?;
                    row.map(crate::audit_sql::decode_head).transpose()
                })
            }

            fn verify_chain_against(&self, checkpointed: crate::CheckpointedHeads) -> StoreFuture<'_, ChainReport> {
                Box::pin(self.verify_inner(checkpointed))
            }

            fn recent(&self, limit: u32) -> StoreFuture<'_, Vec<StoredAuditRecord>> {
                Box::pin(self.recent_inner(limit))
            }

            fn claim_checkpointer(&self, holder: &str, now_ms: i64, until_ms: i64) -> StoreFuture<'_, bool> {
                let holder = holder.to_owned();
                Box::pin(async move {
                    let done = sqlx::query($sql!(crate::audit_sql::sql::CLAIM))
                        .bind(holder)
                        .bind(until_ms)
                        .bind(now_ms)
                        .execute(&self.$writer)
                        .await
                        .map_err(|error| StoreError::from_sqlx("checkpoint lease", error))?;
                    Ok(done.rows_affected() == 1)
                })
            }

            fn add_checkpoint(
                &self,
                checkpoint: crate::StoredCheckpoint,
                advanced: Vec<crate::ChainHead>,
            ) -> StoreFuture<'_, bool> {
                Box::pin(self.add_checkpoint_inner(checkpoint, advanced))
            }

            fn checkpoints(&self, after_seq: u64, limit: u32) -> StoreFuture<'_, Vec<crate::StoredCheckpoint>> {
                Box::pin(async move {
                    let rows: Vec<crate::audit_sql::CheckpointRow> =
                        sqlx::query_as($sql!(crate::audit_sql::sql::CHECKPOINTS))
                            .bind(i64::try_from(after_seq).unwrap_or(i64::MAX))
                            .bind(i64::from(limit.min(1000)))
                            .fetch_all(&self.$reader)
                            .await
                            .map_err(|error| StoreError::from_sqlx("checkpoints", error))?;
                    rows.into_iter().map(crate::audit_sql::decode_checkpoint).collect()
                })
            }

            fn latest_checkpoint(&self) -> StoreFuture<'_, Option<crate::StoredCheckpoint>> {
                Box::pin(async move {
                    let row: Option<crate::audit_sql::CheckpointRow> =
                        sqlx::query_as($sql!(crate::audit_sql::sql::LATEST_CHECKPOINT))
                            .fetch_optional(&self.$reader)
                            .await
                            .map_err(|error| StoreError::from_sqlx("checkpoints", error))?;
                    row.map(crate::audit_sql::decode_checkpoint).transpose()
                })
            }

            fn ping(&self) -> StoreFuture<'_, ()> {
                Box::pin(self.ping_inner())
            }

            fn close(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
                Box::pin(self.$close())
            }
        }
    };
}
pub(crate) use impl_audit_store;
