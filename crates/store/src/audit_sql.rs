//! The audit log's statements, written once with `$n` placeholders (SQLite gets them as `?n`),
//! the [`AuditStore`](crate::AuditStore) implementation both backends share
//! (over [`AuditBackend`]), and a store handle's own chain for [`append_batch`].
//!
//! [`append_batch`]: crate::AuditStore::append_batch

use std::sync::OnceLock;

use std::future::Future;

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::backend::Backend;
use crate::chain::{AuditRow, is_chain_id, link, new_chain_id};
use crate::store::StoreFuture;
use crate::{AuditRecord, AuditStore, ChainHead, ChainReport, StoreError, StoredAuditRecord, StoredCheckpoint};

/// What the audit log needs from a backend beyond [`Backend`].
pub(crate) trait AuditBackend: Backend {
    /// The placeholder character of the multi-row insert (`$n`, or SQLite's anonymous `?`).
    const MARKER: char;

    /// The readiness probe.
    fn ping_backend(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Closes the backend's connections.
    fn close_backend(&self) -> impl Future<Output = ()> + Send;

    /// The chain of [`AuditStore::append_batch`].
    fn own_chain(&self) -> &OwnChain;
}

pub(crate) mod sql {
    use crate::backend::Statement;

    pub static HEADS: Statement =
        Statement::new("SELECT chain_id, head_seq, head_hash, checkpointed_seq FROM audit_chains ORDER BY chain_id");
    pub static HEAD: Statement =
        Statement::new("SELECT chain_id, head_seq, head_hash, checkpointed_seq FROM audit_chains WHERE chain_id = $1");
    pub static PAGE: Statement = Statement::new(concat!(
        "SELECT chain_id, ",
        audit_columns!(),
        " FROM audit_log WHERE chain_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4"
    ));
    pub static MAXIMA: Statement = Statement::new("SELECT chain_id, max(seq) FROM audit_log GROUP BY chain_id");
    pub static RECENT: Statement = Statement::new(concat!(
        "SELECT chain_id, ",
        audit_columns!(),
        " FROM audit_log ORDER BY at_ms DESC, seq DESC LIMIT $1"
    ));
    /// Only ever forward: a batch shipped again leaves the head where it is.
    pub static UPSERT_HEAD: Statement = Statement::new(
        "INSERT INTO audit_chains (chain_id, head_seq, head_hash) VALUES ($1, $2, $3) \
        ON CONFLICT (chain_id) DO UPDATE SET head_seq = excluded.head_seq, head_hash = excluded.head_hash \
        WHERE audit_chains.head_seq < excluded.head_seq",
    );
    pub static CLAIM: Statement = Statement::new(
        "UPDATE audit_checkpointer SET holder = $1, until_ms = $2 \
        WHERE id = 1 AND (holder = $1 OR until_ms < $3)",
    );
    pub static INSERT_CHECKPOINT: Statement = Statement::new(
        "INSERT INTO audit_checkpoints (seq, at_ms, body, signature, delta) \
        VALUES ($1, $2, $3, $4, $5) ON CONFLICT (seq) DO NOTHING",
    );
    pub static MARK_CHECKPOINTED: Statement =
        Statement::new("UPDATE audit_chains SET checkpointed_seq = $2 WHERE chain_id = $1 AND checkpointed_seq < $2");
    pub static CHECKPOINTS: Statement = Statement::new(
        "SELECT seq, at_ms, body, signature, delta FROM audit_checkpoints WHERE seq > $1 ORDER BY seq LIMIT $2",
    );
    pub static LATEST_CHECKPOINT: Statement =
        Statement::new("SELECT seq, at_ms, body, signature, delta FROM audit_checkpoints ORDER BY seq DESC LIMIT 1");
    pub static PING: Statement = Statement::new("SELECT holder FROM audit_checkpointer WHERE id = 1");
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

/// The audit statements of one backend, for the [`AuditStore`] implementation below.
struct Audit<'a, B>(&'a B);

impl<B> Clone for Audit<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Audit<'_, B> {}

impl<B> Audit<'_, B>
where
    B: AuditBackend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<i64>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<String>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> HeadRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> AuditRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> CheckpointRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i64): FromRow<'r, <B::Db as Database>::Row>,
{
    async fn ship_inner(self, chain: &str, records: Vec<crate::StoredAuditRecord>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let during = "ship";
        let sqlx_error = |error| StoreError::from_sqlx(during, error);
        let mut transaction = self.0.begin().await.map_err(sqlx_error)?;
        let stored: Option<HeadRow> = sqlx::query_as(B::sql(&sql::HEAD))
            .bind(chain)
            .fetch_optional(&mut *transaction)
            .await
            .map_err(sqlx_error)?;
        let stored = stored.map(decode_head).transpose()?;
        let Some((head_seq, head_hash)) =
            crate::chain::check_batch(chain, &records, stored.map(|head| (head.seq, head.hash)))?
        else {
            return Ok(());
        };
        let mut records = records.into_iter().peekable();
        while records.peek().is_some() {
            let chunk: Vec<_> = records.by_ref().take(INSERT_CHUNK).collect();
            let mut query = sqlx::query(insert_statement(chunk.len(), B::MARKER));
            for stored in chunk {
                let record = stored.record;
                let scopes = serde_json::to_string(&record.scopes)
                    .map_err(|_| StoreError::InvalidRecord { reason: "scopes do not serialize to JSON" })?;
                query = query
                    .bind(stored.chain)
                    .bind(i64::try_from(stored.seq).map_err(|_| StoreError::corrupt("sequence number overflow"))?)
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
        sqlx::query(B::sql(&sql::UPSERT_HEAD))
            .bind(chain)
            .bind(i64::try_from(head_seq).map_err(|_| StoreError::corrupt("sequence number overflow"))?)
            .bind(head_hash.to_vec())
            .execute(&mut *transaction)
            .await
            .map_err(sqlx_error)?;
        transaction.commit().await.map_err(sqlx_error)
    }

    async fn heads_inner(self, during: &'static str) -> Result<Vec<crate::ChainHead>, StoreError> {
        let rows: Vec<HeadRow> = sqlx::query_as(B::sql(&sql::HEADS))
            .fetch_all(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx(during, error))?;
        rows.into_iter().map(decode_head).collect()
    }

    async fn verify_inner(self, checkpointed: crate::CheckpointedHeads) -> Result<ChainReport, StoreError> {
        let during = "verify";
        let heads = self.heads_inner(during).await?;
        crate::chain::verify_all(
            heads,
            &checkpointed,
            |chain, after_seq, up_to_seq, limit| async move {
                sqlx::query_as(B::sql(&sql::PAGE))
                    .bind(chain)
                    .bind(after_seq)
                    .bind(up_to_seq)
                    .bind(limit)
                    .fetch_all(self.0.reader())
                    .await
                    .map_err(|error| StoreError::from_sqlx(during, error))
            },
            || async move {
                // Maxima first, heads second: a batch shipped between the two statements
                // moves its head in the same transaction as its records, so an honest
                // log never shows a record beyond the head read after it.
                let maxima: Vec<(String, i64)> = sqlx::query_as(B::sql(&sql::MAXIMA))
                    .fetch_all(self.0.reader())
                    .await
                    .map_err(|error| StoreError::from_sqlx(during, error))?;
                let heads = self.heads_inner(during).await?;
                Ok((heads, maxima))
            },
        )
        .await
    }

    async fn recent_inner(self, limit: u32) -> Result<Vec<StoredAuditRecord>, StoreError> {
        let rows: Vec<crate::chain::AuditRow> = sqlx::query_as(B::sql(&sql::RECENT))
            .bind(i64::from(limit.min(crate::MAX_RECENT)))
            .fetch_all(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx("recent", error))?;
        rows.into_iter().map(crate::chain::decode_row).collect()
    }

    async fn search_inner(self, query: crate::AuditQuery) -> Result<Vec<StoredAuditRecord>, StoreError> {
        let (statement, binds) = crate::audit_query::search_statement(&query);
        // Built by `search_statement` from constant clauses: safe to send as SQL.
        let rows: Vec<AuditRow> =
            crate::handles::bind_all!(sqlx::query_as(sqlx::AssertSqlSafe(B::built_sql(statement))), binds)
                .fetch_all(self.0.reader())
                .await
                .map_err(|error| StoreError::from_sqlx("search", error))?;
        rows.into_iter().map(crate::chain::decode_row).collect()
    }

    async fn add_checkpoint_inner(
        self,
        checkpoint: crate::StoredCheckpoint,
        advanced: Vec<crate::ChainHead>,
    ) -> Result<bool, StoreError> {
        let during = "checkpoint";
        let sqlx_error = |error| StoreError::from_sqlx(during, error);
        let range = |value: u64| {
            i64::try_from(value).map_err(|_| StoreError::InvalidRecord { reason: "checkpoint value out of range" })
        };
        let mut transaction = self.0.begin().await.map_err(sqlx_error)?;
        let inserted = sqlx::query(B::sql(&sql::INSERT_CHECKPOINT))
            .bind(range(checkpoint.seq)?)
            .bind(range(checkpoint.at_ms)?)
            .bind(checkpoint.body)
            .bind(checkpoint.signature)
            .bind(checkpoint.delta)
            .execute(&mut *transaction)
            .await
            .map_err(sqlx_error)?;
        if B::rows_affected(&inserted) != 1 {
            return Ok(false);
        }
        for head in advanced {
            sqlx::query(B::sql(&sql::MARK_CHECKPOINTED))
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

/// [`AuditStore`] for every backend, from the shared statements (one text for both).
impl<B> AuditStore for B
where
    B: AuditBackend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<i64>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<String>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> HeadRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> AuditRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> CheckpointRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i64): FromRow<'r, <B::Db as Database>::Row>,
{
    fn ship(&self, chain: &str, records: Vec<StoredAuditRecord>) -> StoreFuture<'_, ()> {
        let chain = chain.to_owned();
        Box::pin(async move { Audit(self).ship_inner(&chain, records).await })
    }

    fn append_batch(&self, records: Vec<AuditRecord>) -> StoreFuture<'_, ()> {
        Box::pin(self.own_chain().append(self, records))
    }

    fn chain_heads(&self) -> StoreFuture<'_, Vec<crate::ChainHead>> {
        Box::pin(Audit(self).heads_inner("chain heads"))
    }

    fn chain_head(&self, chain: &str) -> StoreFuture<'_, Option<crate::ChainHead>> {
        let chain = chain.to_owned();
        Box::pin(async move {
            let row: Option<HeadRow> = sqlx::query_as(B::sql(&sql::HEAD))
                .bind(chain)
                .fetch_optional(self.reader())
                .await
                .map_err(|error| StoreError::from_sqlx("chain head", error))?;
            row.map(decode_head).transpose()
        })
    }

    fn verify_chain_against(&self, checkpointed: crate::CheckpointedHeads) -> StoreFuture<'_, ChainReport> {
        Box::pin(Audit(self).verify_inner(checkpointed))
    }

    fn recent(&self, limit: u32) -> StoreFuture<'_, Vec<StoredAuditRecord>> {
        Box::pin(Audit(self).recent_inner(limit))
    }

    fn search(&self, query: crate::AuditQuery) -> StoreFuture<'_, Vec<StoredAuditRecord>> {
        Box::pin(Audit(self).search_inner(query))
    }

    fn claim_checkpointer(&self, holder: &str, now_ms: i64, until_ms: i64) -> StoreFuture<'_, bool> {
        let holder = holder.to_owned();
        Box::pin(async move {
            let done = sqlx::query(B::sql(&sql::CLAIM))
                .bind(holder)
                .bind(until_ms)
                .bind(now_ms)
                .execute(self.writer())
                .await
                .map_err(|error| StoreError::from_sqlx("checkpoint lease", error))?;
            Ok(B::rows_affected(&done) == 1)
        })
    }

    fn add_checkpoint(
        &self,
        checkpoint: crate::StoredCheckpoint,
        advanced: Vec<crate::ChainHead>,
    ) -> StoreFuture<'_, bool> {
        Box::pin(Audit(self).add_checkpoint_inner(checkpoint, advanced))
    }

    fn checkpoints(&self, after_seq: u64, limit: u32) -> StoreFuture<'_, Vec<crate::StoredCheckpoint>> {
        Box::pin(async move {
            let rows: Vec<CheckpointRow> = sqlx::query_as(B::sql(&sql::CHECKPOINTS))
                .bind(i64::try_from(after_seq).unwrap_or(i64::MAX))
                .bind(i64::from(limit.min(1000)))
                .fetch_all(self.reader())
                .await
                .map_err(|error| StoreError::from_sqlx("checkpoints", error))?;
            rows.into_iter().map(decode_checkpoint).collect()
        })
    }

    fn latest_checkpoint(&self) -> StoreFuture<'_, Option<crate::StoredCheckpoint>> {
        Box::pin(async move {
            let row: Option<CheckpointRow> = sqlx::query_as(B::sql(&sql::LATEST_CHECKPOINT))
                .fetch_optional(self.reader())
                .await
                .map_err(|error| StoreError::from_sqlx("checkpoints", error))?;
            row.map(decode_checkpoint).transpose()
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(self.ping_backend())
    }

    fn close(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(self.close_backend())
    }
}
