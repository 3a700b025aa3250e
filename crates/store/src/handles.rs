//! The `HandleStore` trait: durable records of explicit application handles (seed 000). The store
//! never sees a raw handle: rows are keyed by its SHA-256, owners by a keyed subject digest.
//! Minting, policy and per-use authorization live in the server; the store's job is to make the
//! binding checks and revocation atomic: a lookup matches the owner, liveness and expiry in one
//! statement, and a revocation is one statement, so no lookup that starts after a revocation
//! committed can see the handle live.

use std::future::Future;

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::StoreError;
use crate::backend::Backend;
use crate::store::StoreFuture;

/// Most rows [`HandleStore::list_handles`] returns.
pub const MAX_HANDLE_LIST: u32 = 1_000;
/// Longest text field (tenant, client, object type/ref/version, scope, reason, receipt) accepted.
pub const MAX_HANDLE_FIELD_BYTES: usize = 512;
/// Most scopes one handle may carry, whatever a policy says.
pub const MAX_HANDLE_SCOPES: usize = 32;

/// Who a handle belongs to: the keyed subject digest, the tenant and the OAuth client.
#[derive(Clone, PartialEq, Eq)]
pub struct HandleOwner {
    /// HMAC-SHA256 of the principal's issuer and subject under the deployment's subject key.
    pub subject_key: [u8; 32],
    /// The tenant the principal acted in.
    pub tenant: String,
    /// The OAuth client the principal used.
    pub client: String,
}

impl std::fmt::Debug for HandleOwner {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("HandleOwner")
            .field("subject_key", &hex_prefix(&self.subject_key))
            .field("tenant", &self.tenant)
            .field("client", &self.client)
            .finish()
    }
}

/// A new handle row.
#[derive(Clone)]
pub struct NewHandle {
    /// SHA-256 of the handle.
    pub digest: [u8; 32],
    /// Its owner.
    pub owner: HandleOwner,
    /// The application object type (`basket`).
    pub object_type: String,
    /// The application's reference to the object.
    pub object_ref: String,
    /// The object's version when the handle was minted.
    pub object_version: String,
    /// Granted scopes: sorted, unique, non-empty.
    pub scopes: Vec<String>,
    /// The object type's policy version at minting.
    pub policy_version: i64,
    /// Unix milliseconds.
    pub created_ms: i64,
    /// Unix milliseconds; the handle is dead from this instant on.
    pub expires_ms: i64,
}

impl std::fmt::Debug for NewHandle {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("NewHandle")
            .field("digest", &hex_prefix(&self.digest))
            .field("owner", &self.owner)
            .field("object_type", &self.object_type)
            .field("policy_version", &self.policy_version)
            .field("expires_ms", &self.expires_ms)
            .finish_non_exhaustive()
    }
}

impl NewHandle {
    /// Checks the invariants the schema also enforces, so a bad row is refused with a clear
    /// reason before it reaches the database.
    pub fn validate(&self) -> Result<(), StoreError> {
        let invalid = |reason| Err(StoreError::InvalidRecord { reason });
        let texts = [&self.owner.tenant, &self.owner.client, &self.object_type, &self.object_ref, &self.object_version];
        if texts.iter().any(|text| text.is_empty() || text.len() > MAX_HANDLE_FIELD_BYTES) {
            return invalid("a handle's tenant, client and object fields must be 1..=512 bytes");
        }
        if self.scopes.is_empty() || self.scopes.len() > MAX_HANDLE_SCOPES {
            return invalid("a handle needs 1..=32 scopes");
        }
        if self.scopes.windows(2).any(|pair| pair[0] >= pair[1]) {
            return invalid("a handle's scopes must be sorted and unique");
        }
        if self.scopes.iter().any(|scope| !valid_scope(scope)) {
            return invalid("a handle scope must be printable ASCII without spaces or quotes");
        }
        if self.policy_version <= 0 {
            return invalid("a handle's policy version must be positive");
        }
        if self.created_ms < 0 || self.expires_ms <= self.created_ms {
            return invalid("a handle must expire after it is created");
        }
        Ok(())
    }
}

/// RFC 6749 scope-token characters (so a space-joined list round-trips).
fn valid_scope(scope: &str) -> bool {
    !scope.is_empty()
        && scope.len() <= MAX_HANDLE_FIELD_BYTES
        && scope.bytes().all(|byte| byte == 0x21 || (0x23..=0x5b).contains(&byte) || (0x5d..=0x7e).contains(&byte))
}

/// A live handle, as a successful [`HandleStore::lookup_handle`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveHandle {
    /// The application object type.
    pub object_type: String,
    /// The application's reference to the object.
    pub object_ref: String,
    /// The object's version when minted.
    pub object_version: String,
    /// Granted scopes, sorted.
    pub scopes: Vec<String>,
    /// The policy version at minting.
    pub policy_version: i64,
    /// Unix milliseconds.
    pub expires_ms: i64,
}

/// One row for operators (`palisade handles list`): never the handle, only its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleSummary {
    /// SHA-256 of the handle.
    pub digest: [u8; 32],
    /// Tenant and client of the owner.
    pub tenant: String,
    /// The owner's OAuth client.
    pub client: String,
    /// Object type.
    pub object_type: String,
    /// Object reference.
    pub object_ref: String,
    /// Policy version at minting.
    pub policy_version: i64,
    /// Unix milliseconds.
    pub created_ms: i64,
    /// Unix milliseconds.
    pub expires_ms: i64,
    /// When it was revoked, if it was.
    pub revoked_ms: Option<i64>,
    /// Why it was revoked.
    pub revocation_reason: Option<String>,
    /// The operator's receipt id for the revocation.
    pub revocation_receipt: Option<String>,
}

/// Which handles a revocation covers. Every selector touches only handles not yet revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeSelector {
    /// One handle by digest, whoever owns it (operators).
    Digest([u8; 32]),
    /// One handle by digest, only if `owner` owns it (a holder revoking its own handle).
    Owned {
        /// SHA-256 of the handle.
        digest: [u8; 32],
        /// Who must own it.
        owner: HandleOwner,
    },
    /// Every handle of a subject (token revocation, role change), in any tenant and client.
    Subject([u8; 32]),
    /// Every handle of a subject in one tenant (tenant switch away from it).
    SubjectInTenant {
        /// The subject.
        subject_key: [u8; 32],
        /// The tenant.
        tenant: String,
    },
    /// Every handle in a tenant.
    Tenant(String),
    /// Every handle minted for an OAuth client.
    Client(String),
    /// Every handle on one object (the object was deleted).
    Object {
        /// Tenant of the object.
        tenant: String,
        /// Object type.
        object_type: String,
        /// Object reference.
        object_ref: String,
    },
    /// Every handle of an object type minted under a policy version below `below`.
    PolicyBelow {
        /// Object type.
        object_type: String,
        /// The first policy version that stays valid.
        below: i64,
    },
}

/// Why and on whose authority handles are revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// A short reason (`logout`, `object deleted`, …).
    pub reason: String,
    /// The operator's receipt id, when an operator asked.
    pub receipt: Option<String>,
    /// Unix milliseconds.
    pub at_ms: i64,
}

impl Revocation {
    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        let too_long = |text: &str| text.is_empty() || text.len() > MAX_HANDLE_FIELD_BYTES;
        if too_long(&self.reason) || self.receipt.as_deref().is_some_and(too_long) {
            return Err(StoreError::InvalidRecord { reason: "a revocation reason and receipt must be 1..=512 bytes" });
        }
        Ok(())
    }
}

/// Durable handle records. Implemented by every store backend.
pub trait HandleStore: Send + Sync + std::fmt::Debug + 'static {
    /// Inserts a new handle. A digest that already exists is [`StoreError::Conflict`] (the
    /// primary key refuses it; with 256-bit handles it means a broken random source).
    fn insert_handle(&self, handle: NewHandle) -> StoreFuture<'_, ()>;

    /// The handle with `digest`, if `owner` owns it, it is not revoked and `now_ms` is before its
    /// expiry: all checked in one statement. Anything else is `None`, whichever check failed.
    fn lookup_handle(&self, digest: [u8; 32], owner: &HandleOwner, now_ms: i64) -> StoreFuture<'_, Option<LiveHandle>>;

    /// Revokes the handles `selector` covers that are not revoked yet; returns how many. One
    /// statement: once it returns, no lookup sees any of them live.
    fn revoke_handles(&self, selector: RevokeSelector, revocation: Revocation) -> StoreFuture<'_, u64>;

    /// How many handles [`revoke_handles`](Self::revoke_handles) with `selector` would revoke
    /// now (those it covers that are not revoked yet), changing nothing: what an operator is
    /// told before a revocation that ends more than one.
    fn count_handles(&self, selector: RevokeSelector) -> StoreFuture<'_, u64>;

    /// Handles of a subject (revoked ones included), newest first, at most `limit`
    /// (capped at [`MAX_HANDLE_LIST`]).
    fn list_handles(&self, subject_key: [u8; 32], limit: u32) -> StoreFuture<'_, Vec<HandleSummary>>;

    /// Deletes at most `limit` rows that expired or were revoked before `before_ms`; returns how
    /// many. Bounded so a retention job never holds the writer for long.
    fn purge_handles(&self, before_ms: i64, limit: u32) -> StoreFuture<'_, u64>;
}

/// The first 8 bytes of a digest, in hex: enough to correlate, useless to forge.
pub use palisade_base::hex::hex_prefix;

/// The columns of a summary row, in `SELECT` order, shared by both backends.
pub(crate) type SummaryRow =
    (Vec<u8>, String, String, String, String, i64, i64, i64, Option<i64>, Option<String>, Option<String>);

pub(crate) fn decode_summary(row: SummaryRow) -> Result<HandleSummary, StoreError> {
    let (
        digest,
        tenant,
        client,
        object_type,
        object_ref,
        policy_version,
        created_ms,
        expires_ms,
        revoked_ms,
        reason,
        receipt,
    ) = row;
    Ok(HandleSummary {
        digest: digest_array(&digest)?,
        tenant,
        client,
        object_type,
        object_ref,
        policy_version,
        created_ms,
        expires_ms,
        revoked_ms,
        revocation_reason: reason,
        revocation_receipt: receipt,
    })
}

pub(crate) fn digest_array(bytes: &[u8]) -> Result<[u8; 32], StoreError> {
    bytes.try_into().map_err(|_| StoreError::Corrupt { what: "a handle digest is not 32 bytes".into(), source: None })
}

/// The columns of a summary, for both backends' `SELECT`s.
macro_rules! handle_summary_columns {
    () => {
        "handle_digest, tenant_id, client_id, object_type, object_ref, policy_version, created_ms, expires_ms, \
         revoked_ms, revocation_reason, revocation_receipt"
    };
}

/// A value bound to a shared handle statement.
pub(crate) enum Bind {
    Bytes(Vec<u8>),
    Text(String),
    OptText(Option<String>),
    Int(i64),
}

/// The handle statements both backends run, written once with `$n` placeholders (SQLite gets
/// them rewritten to `?n`). Scopes are the one column whose type differs: a space-separated
/// string on SQLite, `TEXT[]` on PostgreSQL; the backends bind and decode it themselves.
pub(crate) mod sql {
    use crate::backend::Statement;

    pub static INSERT: Statement = Statement::new(
        "INSERT INTO handles (handle_digest, subject_key, tenant_id, client_id, object_type, \
        object_ref, object_version, scopes, policy_version, created_ms, expires_ms) \
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    );
    /// The owner-bound lookup as written (also what benchmarks and tests name).
    pub const LOOKUP_TEXT: &str = "SELECT object_type, object_ref, object_version, scopes, policy_version, expires_ms \
        FROM handles WHERE handle_digest = $1 AND subject_key = $2 AND tenant_id = $3 AND client_id = $4 \
        AND revoked_ms IS NULL AND expires_ms > $5";
    pub static LOOKUP: Statement = Statement::new(LOOKUP_TEXT);
    pub static LIST: Statement = Statement::new(concat!(
        "SELECT ",
        handle_summary_columns!(),
        " FROM handles WHERE subject_key = $1 ORDER BY created_ms DESC, handle_digest LIMIT $2"
    ));
    pub static PURGE: Statement = Statement::new(
        "DELETE FROM handles WHERE handle_digest IN (SELECT handle_digest FROM handles \
        WHERE expires_ms < $1 OR revoked_ms < $1 LIMIT $2)",
    );
}

/// The `WHERE` condition naming the rows `selector` covers, with placeholders from `$first` on,
/// and its bound values in placeholder order.
fn selector_clause(selector: RevokeSelector, first: usize) -> (String, Vec<Bind>) {
    let p = |n: usize| format!("${}", first + n);
    match selector {
        RevokeSelector::Digest(digest) => (format!("handle_digest = {}", p(0)), vec![Bind::Bytes(digest.to_vec())]),
        RevokeSelector::Owned { digest, owner } => (
            format!(
                "handle_digest = {} AND subject_key = {} AND tenant_id = {} AND client_id = {}",
                p(0),
                p(1),
                p(2),
                p(3)
            ),
            vec![
                Bind::Bytes(digest.to_vec()),
                Bind::Bytes(owner.subject_key.to_vec()),
                Bind::Text(owner.tenant),
                Bind::Text(owner.client),
            ],
        ),
        RevokeSelector::Subject(subject_key) => {
            (format!("subject_key = {}", p(0)), vec![Bind::Bytes(subject_key.to_vec())])
        }
        RevokeSelector::SubjectInTenant { subject_key, tenant } => (
            format!("subject_key = {} AND tenant_id = {}", p(0), p(1)),
            vec![Bind::Bytes(subject_key.to_vec()), Bind::Text(tenant)],
        ),
        RevokeSelector::Tenant(tenant) => (format!("tenant_id = {}", p(0)), vec![Bind::Text(tenant)]),
        RevokeSelector::Client(client) => (format!("client_id = {}", p(0)), vec![Bind::Text(client)]),
        RevokeSelector::Object { tenant, object_type, object_ref } => (
            format!("tenant_id = {} AND object_type = {} AND object_ref = {}", p(0), p(1), p(2)),
            vec![Bind::Text(tenant), Bind::Text(object_type), Bind::Text(object_ref)],
        ),
        RevokeSelector::PolicyBelow { object_type, below } => (
            format!("object_type = {} AND policy_version < {}", p(0), p(1)),
            vec![Bind::Text(object_type), Bind::Int(below)],
        ),
    }
}

/// The `UPDATE` for a revocation and its bound values, in placeholder order.
pub(crate) fn revoke_statement(selector: RevokeSelector, revocation: Revocation) -> (String, Vec<Bind>) {
    let mut binds = vec![Bind::Int(revocation.at_ms), Bind::Text(revocation.reason), Bind::OptText(revocation.receipt)];
    let (clause, more) = selector_clause(selector, 4);
    binds.extend(more);
    let statement = format!(
        "UPDATE handles SET revoked_ms = $1, revocation_reason = $2, revocation_receipt = $3 \
         WHERE revoked_ms IS NULL AND {clause}"
    );
    (statement, binds)
}

/// The `SELECT COUNT(*)` of the handles a revocation by `selector` would revoke now (those not
/// revoked yet), and its bound values.
pub(crate) fn count_statement(selector: RevokeSelector) -> (String, Vec<Bind>) {
    let (clause, binds) = selector_clause(selector, 1);
    (format!("SELECT COUNT(*) FROM handles WHERE revoked_ms IS NULL AND {clause}"), binds)
}

/// The handle lookup's route: a backend answers `lookup_handle` on a connection of its choice
/// (SQLite's inline connection, PostgreSQL's lookup connections), falling back to
/// [`lookup_handle_on`] on its reader pool. A plain method of each backend: the request path's
/// one statement goes through nothing that allocates or boxes beyond [`HandleStore`]'s future.
pub(crate) trait HandleLookup: Backend {
    /// The owner-bound lookup of [`HandleStore::lookup_handle`].
    fn lookup_handle_routed(
        &self,
        digest: [u8; 32],
        owner: &HandleOwner,
        now_ms: i64,
    ) -> impl Future<Output = Result<Option<LiveHandle>, StoreError>> + Send;
}

/// The columns of a live handle, in `LOOKUP` order.
pub(crate) type LiveRow = (String, String, String, String, i64, i64);

/// The owner-bound lookup statement, on `executor` (a backend's reader pool or one connection).
pub(crate) async fn lookup_handle_on<'e, B, E>(
    executor: E,
    digest: [u8; 32],
    owner: &HandleOwner,
    now_ms: i64,
) -> Result<Option<LiveHandle>, StoreError>
where
    B: Backend,
    E: Executor<'e, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> LiveRow: FromRow<'r, <B::Db as Database>::Row>,
{
    let row: Option<LiveRow> = sqlx::query_as(B::sql(&sql::LOOKUP))
        .bind(digest.to_vec())
        .bind(owner.subject_key.to_vec())
        .bind(owner.tenant.as_str())
        .bind(owner.client.as_str())
        .bind(now_ms)
        .fetch_optional(executor)
        .await
        .map_err(|error| StoreError::from_sqlx("lookup_handle", error))?;
    Ok(row.map(|(object_type, object_ref, object_version, scopes, policy_version, expires_ms)| LiveHandle {
        object_type,
        object_ref,
        object_version,
        scopes: scopes.split(' ').map(str::to_owned).collect(),
        policy_version,
        expires_ms,
    }))
}

/// A built statement (`revoke_statement`, `count_statement`) with its values bound, in this
/// backend's placeholders.
macro_rules! bind_all {
    ($query:expr, $binds:expr) => {{
        let mut query = $query;
        for bind in $binds {
            query = match bind {
                $crate::handles::Bind::Bytes(bytes) => query.bind(bytes),
                $crate::handles::Bind::Text(text) => query.bind(text),
                $crate::handles::Bind::OptText(text) => query.bind(text),
                $crate::handles::Bind::Int(int) => query.bind(int),
            };
        }
        query
    }};
}
pub(crate) use bind_all;

/// [`HandleStore`] for every backend, from the shared statements (one text for both); the
/// lookup goes the backend's own route ([`HandleLookup`]).
impl<B> HandleStore for B
where
    B: HandleLookup,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<String>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> SummaryRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64,): FromRow<'r, <B::Db as Database>::Row>,
    i64: for<'r> Decode<'r, B::Db> + Type<B::Db>,
    usize: ColumnIndex<<B::Db as Database>::Row>,
{
    fn insert_handle(&self, handle: NewHandle) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            handle.validate()?;
            sqlx::query(B::sql(&sql::INSERT))
                .bind(handle.digest.to_vec())
                .bind(handle.owner.subject_key.to_vec())
                .bind(handle.owner.tenant)
                .bind(handle.owner.client)
                .bind(handle.object_type)
                .bind(handle.object_ref)
                .bind(handle.object_version)
                .bind(handle.scopes.join(" "))
                .bind(handle.policy_version)
                .bind(handle.created_ms)
                .bind(handle.expires_ms)
                .execute(self.writer())
                .await
                .map_err(|error| StoreError::from_sqlx("insert_handle", error))?;
            Ok(())
        })
    }

    fn lookup_handle(&self, digest: [u8; 32], owner: &HandleOwner, now_ms: i64) -> StoreFuture<'_, Option<LiveHandle>> {
        let owner = owner.clone();
        Box::pin(async move { self.lookup_handle_routed(digest, &owner, now_ms).await })
    }

    fn revoke_handles(&self, selector: RevokeSelector, revocation: Revocation) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            revocation.validate()?;
            let (statement, binds) = revoke_statement(selector, revocation);
            // Built by `revoke_statement` from constant clauses: safe to send as SQL.
            let query = bind_all!(sqlx::query(sqlx::AssertSqlSafe(B::built_sql(statement))), binds);
            let done =
                query.execute(self.writer()).await.map_err(|error| StoreError::from_sqlx("revoke_handles", error))?;
            Ok(B::rows_affected(&done))
        })
    }

    fn count_handles(&self, selector: RevokeSelector) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let (statement, binds) = count_statement(selector);
            // Built by `count_statement` from constant clauses: safe to send as SQL.
            let query = bind_all!(sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(B::built_sql(statement))), binds);
            let count =
                query.fetch_one(self.reader()).await.map_err(|error| StoreError::from_sqlx("count_handles", error))?;
            u64::try_from(count)
                .map_err(|_| StoreError::Corrupt { what: "a negative handle count".into(), source: None })
        })
    }

    fn list_handles(&self, subject_key: [u8; 32], limit: u32) -> StoreFuture<'_, Vec<HandleSummary>> {
        Box::pin(async move {
            let rows: Vec<SummaryRow> = sqlx::query_as(B::sql(&sql::LIST))
                .bind(subject_key.to_vec())
                .bind(i64::from(limit.min(MAX_HANDLE_LIST)))
                .fetch_all(self.reader())
                .await
                .map_err(|error| StoreError::from_sqlx("list_handles", error))?;
            rows.into_iter().map(decode_summary).collect()
        })
    }

    fn purge_handles(&self, before_ms: i64, limit: u32) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let done = sqlx::query(B::sql(&sql::PURGE))
                .bind(before_ms)
                .bind(i64::from(limit))
                .execute(self.writer())
                .await
                .map_err(|error| StoreError::from_sqlx("purge_handles", error))?;
            Ok(B::rows_affected(&done))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NewHandle {
        NewHandle {
            digest: [1; 32],
            owner: HandleOwner { subject_key: [2; 32], tenant: "t".into(), client: "c".into() },
            object_type: "basket".into(),
            object_ref: "b-1".into(),
            object_version: "1".into(),
            scopes: vec!["shop:basket".into(), "shop:read".into()],
            policy_version: 1,
            created_ms: 10,
            expires_ms: 20,
        }
    }

    #[test]
    fn validation_refuses_each_broken_field() {
        assert!(sample().validate().is_ok());
        let cases: Vec<fn(&mut NewHandle)> = vec![
            |h| h.owner.tenant.clear(),
            |h| h.owner.client = "x".repeat(513),
            |h| h.scopes.clear(),
            |h| h.scopes.reverse(),
            |h| h.scopes = vec!["a".into(), "a".into()],
            |h| h.scopes = vec!["has space".into()],
            |h| h.policy_version = 0,
            |h| h.expires_ms = h.created_ms,
            |h| h.object_ref.clear(),
        ];
        for (index, break_it) in cases.into_iter().enumerate() {
            let mut handle = sample();
            break_it(&mut handle);
            assert!(matches!(handle.validate(), Err(StoreError::InvalidRecord { .. })), "case {index}");
        }
    }

    #[test]
    fn debug_shows_digest_prefixes_only() {
        let shown = format!("{:?}", sample());
        assert!(shown.contains("0101010101010101") && !shown.contains(&"01".repeat(9)), "{shown}");
    }
}
