//! The `DelegationStore` trait: the ledger of delegated capabilities. A sub-agent acts under a
//! capability minted from its parent's, which can only narrow; the server checks the policy (what
//! a body may grant) and walks the chain on every use, and the store makes the ledger's structural
//! invariants atomic across instances. The store never sees a capability reference, only its
//! SHA-256 (`digest`); the principal is a keyed digest; the body is opaque JSON text.
//!
//! **Invariant:** a child is minted only under a parent that exists, is not revoked and has not
//! expired at the child's creation, acts for the same principal, is shallow enough, outlives the
//! child and has the child's call budget left, and that budget moves from the parent to the child
//! in the same transaction (the parent row locked: `SELECT … FOR UPDATE` on PostgreSQL, the
//! single `BEGIN IMMEDIATE` writer on SQLite). So however many instances mint or spend at once, the
//! budgets granted below a row never exceed what it had, a budget of N is spent exactly N times
//! (one conditional `UPDATE` each) and `remaining` never goes negative. Approvals are single-use:
//! taking one is one `DELETE` and its row count.

use std::collections::BTreeMap;

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::StoreError;
use crate::backend::Backend;
use crate::handles::hex_prefix;
use crate::store::StoreFuture;

/// Deepest chain the store accepts whatever the caller's maximum (a root is depth 0).
pub const MAX_DELEGATION_DEPTH: u32 = 16;
/// Largest `body` accepted (JSON text): 64 KiB.
pub const MAX_DELEGATION_BODY_BYTES: usize = 64 * 1024;
/// Longest agent id.
pub const MAX_DELEGATION_AGENT_BYTES: usize = 256;
/// Most rows [`DelegationStore::delegations`] returns.
pub const MAX_DELEGATION_LIST: u32 = 10_000;

/// A delegation to mint: a root (no parent) or a child of a stored delegation.
#[derive(Clone, PartialEq, Eq)]
pub struct NewDelegation {
    /// SHA-256 of the capability reference (the reference is never stored).
    pub digest: [u8; 32],
    /// The parent's digest; `None` for a root.
    pub parent: Option<[u8; 32]>,
    /// Keyed digest of the principal the delegation acts for; equal along a chain.
    pub principal_key: [u8; 32],
    /// The holder agent's id: 1..=256 bytes, no control characters.
    pub agent: String,
    /// A JSON object as text, at most [`MAX_DELEGATION_BODY_BYTES`]; opaque to the store.
    pub body: String,
    /// Unix milliseconds; the delegation is dead from this instant on. After `created_ms`.
    pub expires_ms: i64,
    /// The call budget granted: not negative.
    pub calls: i64,
    /// Unix milliseconds: not negative.
    pub created_ms: i64,
}

impl std::fmt::Debug for NewDelegation {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("NewDelegation")
            .field("digest", &hex_prefix(&self.digest))
            .field("parent", &self.parent.as_ref().map(|parent| hex_prefix(parent)))
            .field("principal_key", &hex_prefix(&self.principal_key))
            .field("agent", &self.agent)
            .field("body_bytes", &self.body.len())
            .field("expires_ms", &self.expires_ms)
            .field("calls", &self.calls)
            .field("created_ms", &self.created_ms)
            .finish()
    }
}

impl NewDelegation {
    /// Checks every field (the schema checks some of them again), so a bad delegation is refused
    /// with a fixed reason before it reaches the database. The reason never quotes a value.
    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        if self.agent.is_empty()
            || self.agent.len() > MAX_DELEGATION_AGENT_BYTES
            || self.agent.chars().any(char::is_control)
        {
            return invalid("a delegation's agent id must be 1..=256 bytes without control characters");
        }
        if self.body.len() > MAX_DELEGATION_BODY_BYTES {
            return invalid("a delegation's body must be at most 64 KiB");
        }
        if serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&self.body).is_err() {
            return invalid("a delegation's body must be a JSON object");
        }
        if self.calls < 0 {
            return invalid("a delegation's call budget must not be negative");
        }
        if self.created_ms < 0 || self.expires_ms <= self.created_ms {
            return invalid("a delegation must expire after it is created, at a time that is not negative");
        }
        Ok(())
    }
}

/// A delegation as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct DelegationRow {
    /// SHA-256 of the capability reference.
    pub digest: [u8; 32],
    /// The parent's digest; `None` for a root.
    pub parent: Option<[u8; 32]>,
    /// The root's digest (a root's own digest).
    pub root: [u8; 32],
    /// 0 for a root, the parent's depth + 1 for a child.
    pub depth: u32,
    /// Keyed digest of the principal the delegation acts for.
    pub principal_key: [u8; 32],
    /// The holder agent's id.
    pub agent: String,
    /// The body as minted (JSON object text).
    pub body: String,
    /// Unix milliseconds; dead from this instant on.
    pub expires_ms: i64,
    /// The call budget granted at mint.
    pub calls: i64,
    /// Calls left to spend or to reserve for children.
    pub remaining: i64,
    /// Unix milliseconds.
    pub created_ms: i64,
    /// When it was revoked, if it was.
    pub revoked_ms: Option<i64>,
}

impl std::fmt::Debug for DelegationRow {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("DelegationRow")
            .field("digest", &hex_prefix(&self.digest))
            .field("parent", &self.parent.as_ref().map(|parent| hex_prefix(parent)))
            .field("root", &hex_prefix(&self.root))
            .field("depth", &self.depth)
            .field("principal_key", &hex_prefix(&self.principal_key))
            .field("agent", &self.agent)
            .field("body_bytes", &self.body.len())
            .field("expires_ms", &self.expires_ms)
            .field("calls", &self.calls)
            .field("remaining", &self.remaining)
            .field("created_ms", &self.created_ms)
            .field("revoked_ms", &self.revoked_ms)
            .finish()
    }
}

/// Why a mint was refused (nothing was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MintRefusal {
    /// No delegation has the parent's digest.
    ParentUnknown,
    /// The parent was revoked.
    ParentRevoked,
    /// The parent expired at or before the child's creation.
    ParentExpired,
    /// The parent acts for another principal.
    OtherPrincipal,
    /// The child would be deeper than the caller's maximum or [`MAX_DELEGATION_DEPTH`].
    TooDeep,
    /// The child would expire after its parent.
    OutlivesParent,
    /// The child's call budget is more than the parent has left.
    BudgetExceeded,
    /// A delegation with the child's digest exists already.
    Exists,
}

impl MintRefusal {
    /// A fixed sentence saying why (never a value).
    pub fn reason(self) -> &'static str {
        match self {
            MintRefusal::ParentUnknown => "the parent delegation is unknown",
            MintRefusal::ParentRevoked => "the parent delegation is revoked",
            MintRefusal::ParentExpired => "the parent delegation has expired",
            MintRefusal::OtherPrincipal => "the parent delegation acts for another principal",
            MintRefusal::TooDeep => "the delegation chain would be deeper than allowed",
            MintRefusal::OutlivesParent => "the child would expire after its parent",
            MintRefusal::BudgetExceeded => "the child's call budget is more than the parent has left",
            MintRefusal::Exists => "a delegation with this digest exists already",
        }
    }
}

/// The delegation ledger and single-use approvals. Implemented by every store backend; every
/// instance on the store sees the same rows.
pub trait DelegationStore: Send + Sync + std::fmt::Debug + 'static {
    /// Inserts a root (`parent` `None`: `root = digest`, depth 0, `remaining = calls`) or a child,
    /// as one transaction. For a child the parent row is read under a write lock (PostgreSQL
    /// `SELECT … FOR UPDATE`; SQLite's `BEGIN IMMEDIATE` writer) and checked, in this order: it
    /// exists ([`ParentUnknown`](MintRefusal::ParentUnknown)), is not revoked
    /// ([`ParentRevoked`](MintRefusal::ParentRevoked)), expires after `new.created_ms`
    /// ([`ParentExpired`](MintRefusal::ParentExpired)), has the same `principal_key`
    /// ([`OtherPrincipal`](MintRefusal::OtherPrincipal)), `parent.depth + 1 <= min(max_depth,
    /// MAX_DELEGATION_DEPTH)` ([`TooDeep`](MintRefusal::TooDeep)), `new.expires_ms <=
    /// parent.expires_ms` ([`OutlivesParent`](MintRefusal::OutlivesParent)) and `new.calls <=
    /// parent.remaining` ([`BudgetExceeded`](MintRefusal::BudgetExceeded)); then the parent's
    /// `remaining` goes down by `new.calls` and the child is inserted with the parent's root, its
    /// depth + 1 and `remaining = new.calls`. A digest that exists already is
    /// [`Exists`](MintRefusal::Exists) (checked first). Any refusal leaves every row unchanged.
    /// Invalid fields (see [`NewDelegation`]) are [`StoreError::InvalidRecord`], nothing written.
    /// `max_depth` does not matter for a root. Ancestors above the parent are not checked here
    /// (the server checks the chain on every use).
    fn mint_delegation(
        &self,
        new: NewDelegation,
        max_depth: u32,
    ) -> StoreFuture<'_, Result<DelegationRow, MintRefusal>> {
        self.mint_delegation_with_tools(new, max_depth, BTreeMap::new())
    }

    /// [`mint_delegation`](Self::mint_delegation) with per-tool budgets: each `(tool, calls)`
    /// becomes a counter of the new row (at most [`MAX_DELEGATION_TOOL_BUDGETS`], each tool
    /// 1..=256 bytes without control characters, `0..=new.calls`). Where the parent has a
    /// counter for that tool, `calls` is reserved from it in the same transaction; more than it
    /// has left is [`BudgetExceeded`](MintRefusal::BudgetExceeded), nothing written.
    fn mint_delegation_with_tools(
        &self,
        new: NewDelegation,
        max_depth: u32,
        tool_calls: BTreeMap<String, i64>,
    ) -> StoreFuture<'_, Result<DelegationRow, MintRefusal>>;

    /// Spends one call of `digest`'s budget *and* one of its counter for `tool`, both or neither,
    /// in one transaction (each an `UPDATE` requiring `remaining > 0`; the overall one also no
    /// revocation and no expiry). `Ok(false)` when either is spent (or `digest` has no counter
    /// for `tool`).
    fn spend_delegation_tool_call(&self, digest: [u8; 32], tool: &str, now_ms: i64) -> StoreFuture<'_, bool>;

    /// The per-tool counters of `digest`: tool → (calls granted, remaining).
    fn delegation_tool_budgets(&self, digest: [u8; 32]) -> StoreFuture<'_, BTreeMap<String, (i64, i64)>>;

    /// The chain from the root to `digest`: root first, the row of `digest` last; empty if
    /// `digest` is unknown. One statement (a recursive query following `parent`, at most
    /// `MAX_DELEGATION_DEPTH + 1` rows). If an ancestor row is missing (purged) the chain simply
    /// starts below it: the caller sees `chain[0].depth != 0` and refuses.
    fn delegation_chain(&self, digest: [u8; 32]) -> StoreFuture<'_, Vec<DelegationRow>>;

    /// Spends one call of `digest`'s own remaining budget: one `UPDATE` that requires
    /// `remaining > 0`, no revocation and `expires_ms > now_ms`. `Ok(true)` iff it spent one, so
    /// however many callers race on any instance, a budget of N gives exactly N `true`s and
    /// `remaining` never goes negative.
    fn spend_delegation_call(&self, digest: [u8; 32], now_ms: i64) -> StoreFuture<'_, bool>;

    /// Marks `digest` revoked at `at_ms` if it is not already: `Ok(true)` iff this call revoked it
    /// (unknown or already revoked: `false`). Descendants are refused by the server's chain check.
    fn revoke_delegation(&self, digest: [u8; 32], at_ms: i64) -> StoreFuture<'_, bool>;

    /// Rows of one principal (or every row when `None`), newest first (`created_ms` descending,
    /// then digest), at most `min(limit, MAX_DELEGATION_LIST)`.
    fn delegations(&self, principal_key: Option<[u8; 32]>, limit: u32) -> StoreFuture<'_, Vec<DelegationRow>>;

    /// Records a single-use approval `key` until `expires_ms` (`INSERT … ON CONFLICT DO
    /// NOTHING`): `Ok(true)` iff it was new.
    fn put_approval(&self, key: [u8; 32], expires_ms: i64) -> StoreFuture<'_, bool>;

    /// Takes an approval: one `DELETE` of `key` if it expires after `now_ms`; `Ok(true)` iff a row
    /// was deleted, so however many callers race, an approval is taken at most once, and an
    /// expired one is never taken.
    fn take_approval(&self, key: [u8; 32], now_ms: i64) -> StoreFuture<'_, bool>;

    /// Retention: deletes at most `limit` approvals and at most `limit` delegation rows whose
    /// `expires_ms` is at or before `now_ms` (bounded statements, so a retention job never holds
    /// the writer for long); returns how many rows in all.
    fn purge_delegations(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64>;
}

/// Most per-tool budgets one capability may have.
pub const MAX_DELEGATION_TOOL_BUDGETS: usize = 64;

/// Checks per-tool budgets against the new row's overall budget.
pub(crate) fn check_tool_calls(tool_calls: &BTreeMap<String, i64>, calls: i64) -> Result<(), StoreError> {
    if tool_calls.len() > MAX_DELEGATION_TOOL_BUDGETS {
        return invalid("a delegation has at most 64 per-tool budgets");
    }
    for (tool, count) in tool_calls {
        if tool.is_empty() || tool.len() > MAX_DELEGATION_AGENT_BYTES || tool.chars().any(char::is_control) {
            return invalid("a per-tool budget's tool must be 1..=256 bytes without control characters");
        }
        if *count < 0 || *count > calls {
            return invalid("a per-tool budget must be between 0 and the delegation's call budget");
        }
    }
    Ok(())
}

fn invalid<T>(reason: &'static str) -> Result<T, StoreError> {
    Err(StoreError::InvalidRecord { reason })
}

/// The refusal a child of `parent` earns, if any, in the documented order (the parent exists).
pub(crate) fn check_child(parent: &DelegationRow, new: &NewDelegation, max_depth: u32) -> Option<MintRefusal> {
    if parent.revoked_ms.is_some() {
        Some(MintRefusal::ParentRevoked)
    } else if parent.expires_ms <= new.created_ms {
        Some(MintRefusal::ParentExpired)
    } else if parent.principal_key != new.principal_key {
        Some(MintRefusal::OtherPrincipal)
    } else if parent.depth >= max_depth.min(MAX_DELEGATION_DEPTH) {
        Some(MintRefusal::TooDeep)
    } else if new.expires_ms > parent.expires_ms {
        Some(MintRefusal::OutlivesParent)
    } else if new.calls > parent.remaining {
        Some(MintRefusal::BudgetExceeded)
    } else {
        None
    }
}

/// A delegation row as both backends read it (columns by name).
#[derive(sqlx::FromRow)]
pub(crate) struct DelegationTuple {
    digest: Vec<u8>,
    parent: Option<Vec<u8>>,
    root: Vec<u8>,
    depth: i32,
    principal_key: Vec<u8>,
    agent: String,
    body: String,
    expires_ms: i64,
    calls: i64,
    remaining: i64,
    created_ms: i64,
    revoked_ms: Option<i64>,
}

pub(crate) fn decode_delegation(row: DelegationTuple) -> Result<DelegationRow, StoreError> {
    let digest = |bytes: &[u8]| -> Result<[u8; 32], StoreError> {
        bytes.try_into().map_err(|_| StoreError::corrupt("a delegation digest is not 32 bytes"))
    };
    Ok(DelegationRow {
        digest: digest(&row.digest)?,
        parent: row.parent.as_deref().map(digest).transpose()?,
        root: digest(&row.root)?,
        depth: u32::try_from(row.depth).map_err(|_| StoreError::corrupt("a delegation depth is negative"))?,
        principal_key: digest(&row.principal_key)?,
        agent: row.agent,
        body: row.body,
        expires_ms: row.expires_ms,
        calls: row.calls,
        remaining: row.remaining,
        created_ms: row.created_ms,
        revoked_ms: row.revoked_ms,
    })
}

/// The statements both backends run, with `$n` placeholders (SQLite gets them as `?n`).
pub(crate) mod sql {
    use crate::backend::Statement;

    macro_rules! delegation_columns {
        () => {
            "digest, parent, root, depth, principal_key, agent, body, expires_ms, calls, remaining, created_ms, \
             revoked_ms"
        };
    }
    pub static EXISTS: Statement = Statement::new("SELECT 1 FROM delegations WHERE digest = $1");
    /// The parent row (SQLite: inside the `BEGIN IMMEDIATE` writer transaction, already locked).
    pub static PARENT: Statement =
        Statement::new(concat!("SELECT ", delegation_columns!(), " FROM delegations WHERE digest = $1"));
    /// The parent row, locked until commit (PostgreSQL).
    pub static PARENT_FOR_UPDATE: Statement =
        Statement::new(concat!("SELECT ", delegation_columns!(), " FROM delegations WHERE digest = $1 FOR UPDATE"));
    /// Moves the child's budget out of the parent (guarded again, though the row is locked).
    pub static RESERVE: Statement =
        Statement::new("UPDATE delegations SET remaining = remaining - $2 WHERE digest = $1 AND remaining >= $2");
    pub static INSERT: Statement = Statement::new(concat!(
        "INSERT INTO delegations (",
        delegation_columns!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, NULL) ON CONFLICT DO NOTHING"
    ));
    /// `digest`'s row and its ancestors, root first; `$2` bounds the hops followed.
    pub static CHAIN: Statement = Statement::new(concat!(
        "WITH RECURSIVE chain (",
        delegation_columns!(),
        ", hops) AS (SELECT ",
        delegation_columns!(),
        ", 0 FROM delegations WHERE digest = $1 \
         UNION ALL SELECT d.digest, d.parent, d.root, d.depth, d.principal_key, d.agent, d.body, d.expires_ms, \
         d.calls, d.remaining, d.created_ms, d.revoked_ms, chain.hops + 1 \
         FROM delegations d JOIN chain ON d.digest = chain.parent WHERE chain.hops < $2) \
         SELECT ",
        delegation_columns!(),
        " FROM chain ORDER BY hops DESC LIMIT $3"
    ));
    pub static SPEND: Statement = Statement::new(
        "UPDATE delegations SET remaining = remaining - 1 \
        WHERE digest = $1 AND remaining > 0 AND revoked_ms IS NULL AND expires_ms > $2",
    );
    pub static REVOKE: Statement =
        Statement::new("UPDATE delegations SET revoked_ms = $2 WHERE digest = $1 AND revoked_ms IS NULL");
    pub static OF_PRINCIPAL: Statement = Statement::new(concat!(
        "SELECT ",
        delegation_columns!(),
        " FROM delegations WHERE principal_key = $1 ORDER BY created_ms DESC, digest LIMIT $2"
    ));
    pub static ALL: Statement = Statement::new(concat!(
        "SELECT ",
        delegation_columns!(),
        " FROM delegations ORDER BY created_ms DESC, digest LIMIT $1"
    ));
    pub static PUT_APPROVAL: Statement =
        Statement::new("INSERT INTO delegation_approvals (key, expires_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING");
    pub static TAKE_APPROVAL: Statement =
        Statement::new("DELETE FROM delegation_approvals WHERE key = $1 AND expires_ms > $2");
    pub static PURGE_APPROVALS: Statement = Statement::new(
        "DELETE FROM delegation_approvals WHERE key IN \
        (SELECT key FROM delegation_approvals WHERE expires_ms <= $1 LIMIT $2)",
    );
    pub static PURGE: Statement = Statement::new(
        "DELETE FROM delegations WHERE digest IN \
        (SELECT digest FROM delegations WHERE expires_ms <= $1 ORDER BY digest LIMIT $2)",
    );
    /// The per-tool counters of the rows [`PURGE`] is about to delete (the same selection).
    pub static PURGE_TOOL_BUDGETS: Statement = Statement::new(
        "DELETE FROM delegation_tool_budgets WHERE digest IN \
        (SELECT digest FROM delegations WHERE expires_ms <= $1 ORDER BY digest LIMIT $2)",
    );
    /// Reserves `$3` calls of the parent's counter for tool `$2` (guarded: never below zero).
    pub static RESERVE_TOOL: Statement = Statement::new(
        "UPDATE delegation_tool_budgets SET remaining = remaining - $3 \
        WHERE digest = $1 AND tool = $2 AND remaining >= $3",
    );
    pub static HAS_TOOL_BUDGET: Statement =
        Statement::new("SELECT 1 FROM delegation_tool_budgets WHERE digest = $1 AND tool = $2");
    pub static INSERT_TOOL_BUDGET: Statement =
        Statement::new("INSERT INTO delegation_tool_budgets (digest, tool, calls, remaining) VALUES ($1, $2, $3, $3)");
    pub static SPEND_TOOL: Statement = Statement::new(
        "UPDATE delegation_tool_budgets SET remaining = remaining - 1 \
        WHERE digest = $1 AND tool = $2 AND remaining > 0",
    );
    pub static TOOL_BUDGETS: Statement =
        Statement::new("SELECT tool, calls, remaining FROM delegation_tool_budgets WHERE digest = $1 ORDER BY tool");
}

/// The delegation statements of one backend, for the [`DelegationStore`] implementation below.
struct Delegations<'a, B>(&'a B);

impl<B> Delegations<'_, B>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<Vec<u8>>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i32: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> DelegationTuple: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i32,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i64, i64): FromRow<'r, <B::Db as Database>::Row>,
{
    async fn mint_delegation_inner(
        self,
        new: crate::NewDelegation,
        max_depth: u32,
        tool_calls: std::collections::BTreeMap<String, i64>,
    ) -> Result<Result<crate::DelegationRow, crate::MintRefusal>, StoreError> {
        use {DelegationTuple, decode_delegation, sql};
        new.validate()?;
        check_tool_calls(&tool_calls, new.calls)?;
        let sqlx_error = |error| StoreError::from_sqlx("mint_delegation", error);
        let mut transaction = self.0.begin().await.map_err(sqlx_error)?;
        let refusal = 'checks: {
            let exists: Option<(i32,)> = sqlx::query_as(B::sql(&sql::EXISTS))
                .bind(new.digest.to_vec())
                .fetch_optional(&mut *transaction)
                .await
                .map_err(sqlx_error)?;
            if exists.is_some() {
                break 'checks crate::MintRefusal::Exists;
            }
            let (root, depth) = match new.parent {
                None => (new.digest, 0),
                Some(parent) => {
                    let row: Option<DelegationTuple> =
                        sqlx::query_as(B::locking_read(&sql::PARENT, &sql::PARENT_FOR_UPDATE))
                            .bind(parent.to_vec())
                            .fetch_optional(&mut *transaction)
                            .await
                            .map_err(sqlx_error)?;
                    let Some(row) = row else { break 'checks crate::MintRefusal::ParentUnknown };
                    let row = decode_delegation(row)?;
                    if let Some(refusal) = check_child(&row, &new, max_depth) {
                        break 'checks refusal;
                    }
                    let reserved = sqlx::query(B::sql(&sql::RESERVE))
                        .bind(parent.to_vec())
                        .bind(new.calls)
                        .execute(&mut *transaction)
                        .await
                        .map_err(sqlx_error)?;
                    if B::rows_affected(&reserved) != 1 {
                        break 'checks crate::MintRefusal::BudgetExceeded;
                    }
                    // Per-tool counters the parent keeps: reserved from them too.
                    for (tool, count) in &tool_calls {
                        let reserved = sqlx::query(B::sql(&sql::RESERVE_TOOL))
                            .bind(parent.to_vec())
                            .bind(tool.as_str())
                            .bind(*count)
                            .execute(&mut *transaction)
                            .await
                            .map_err(sqlx_error)?;
                        if B::rows_affected(&reserved) == 1 {
                            continue;
                        }
                        let counted: Option<(i32,)> = sqlx::query_as(B::sql(&sql::HAS_TOOL_BUDGET))
                            .bind(parent.to_vec())
                            .bind(tool.as_str())
                            .fetch_optional(&mut *transaction)
                            .await
                            .map_err(sqlx_error)?;
                        if counted.is_some() {
                            break 'checks crate::MintRefusal::BudgetExceeded;
                        }
                    }
                    (row.root, row.depth + 1)
                }
            };
            let inserted = sqlx::query(B::sql(&sql::INSERT))
                .bind(new.digest.to_vec())
                .bind(new.parent.map(|parent| parent.to_vec()))
                .bind(root.to_vec())
                .bind(i32::try_from(depth).unwrap_or(i32::MAX))
                .bind(new.principal_key.to_vec())
                .bind(new.agent.as_str())
                .bind(new.body.as_str())
                .bind(new.expires_ms)
                .bind(new.calls)
                .bind(new.created_ms)
                .execute(&mut *transaction)
                .await
                .map_err(sqlx_error)?;
            if B::rows_affected(&inserted) != 1 {
                // Another mint of the same digest committed after the check above.
                break 'checks crate::MintRefusal::Exists;
            }
            for (tool, count) in &tool_calls {
                sqlx::query(B::sql(&sql::INSERT_TOOL_BUDGET))
                    .bind(new.digest.to_vec())
                    .bind(tool.as_str())
                    .bind(*count)
                    .execute(&mut *transaction)
                    .await
                    .map_err(sqlx_error)?;
            }
            transaction.commit().await.map_err(sqlx_error)?;
            return Ok(Ok(crate::DelegationRow {
                digest: new.digest,
                parent: new.parent,
                root,
                depth,
                principal_key: new.principal_key,
                agent: new.agent,
                body: new.body,
                expires_ms: new.expires_ms,
                calls: new.calls,
                remaining: new.calls,
                created_ms: new.created_ms,
                revoked_ms: None,
            }));
        };
        // Nothing of this mint stays: the reservation (if any) goes with the transaction.
        transaction.rollback().await.map_err(sqlx_error)?;
        Ok(Err(refusal))
    }

    async fn delegation_chain_inner(self, digest: [u8; 32]) -> Result<Vec<crate::DelegationRow>, StoreError> {
        let rows: Vec<DelegationTuple> = sqlx::query_as(B::sql(&sql::CHAIN))
            .bind(digest.to_vec())
            .bind(i64::from(crate::MAX_DELEGATION_DEPTH))
            .bind(i64::from(crate::MAX_DELEGATION_DEPTH) + 1)
            .fetch_all(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx("delegation_chain", error))?;
        rows.into_iter().map(decode_delegation).collect()
    }

    async fn spend_delegation_call_inner(self, digest: [u8; 32], now_ms: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(B::sql(&sql::SPEND))
            .bind(digest.to_vec())
            .bind(now_ms)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("spend_delegation_call", error))?;
        Ok(B::rows_affected(&done) == 1)
    }

    async fn spend_delegation_tool_call_inner(
        self,
        digest: [u8; 32],
        tool: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let sqlx_error = |error| StoreError::from_sqlx("spend_delegation_tool_call", error);
        let mut transaction = self.0.begin().await.map_err(sqlx_error)?;
        let tool_spent = sqlx::query(B::sql(&sql::SPEND_TOOL))
            .bind(digest.to_vec())
            .bind(tool)
            .execute(&mut *transaction)
            .await
            .map_err(sqlx_error)?;
        let spent = B::rows_affected(&tool_spent) == 1
            && B::rows_affected(
                &sqlx::query(B::sql(&sql::SPEND))
                    .bind(digest.to_vec())
                    .bind(now_ms)
                    .execute(&mut *transaction)
                    .await
                    .map_err(sqlx_error)?,
            ) == 1;
        if spent {
            transaction.commit().await.map_err(sqlx_error)?;
        } else {
            transaction.rollback().await.map_err(sqlx_error)?;
        }
        Ok(spent)
    }

    async fn delegation_tool_budgets_inner(
        self,
        digest: [u8; 32],
    ) -> Result<std::collections::BTreeMap<String, (i64, i64)>, StoreError> {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(B::sql(&sql::TOOL_BUDGETS))
            .bind(digest.to_vec())
            .fetch_all(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx("delegation_tool_budgets", error))?;
        Ok(rows.into_iter().map(|(tool, calls, remaining)| (tool, (calls, remaining))).collect())
    }

    async fn revoke_delegation_inner(self, digest: [u8; 32], at_ms: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(B::sql(&sql::REVOKE))
            .bind(digest.to_vec())
            .bind(at_ms)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("revoke_delegation", error))?;
        Ok(B::rows_affected(&done) == 1)
    }

    async fn delegations_inner(
        self,
        principal_key: Option<[u8; 32]>,
        limit: u32,
    ) -> Result<Vec<crate::DelegationRow>, StoreError> {
        let limit = i64::from(limit.min(crate::MAX_DELEGATION_LIST));
        let rows: Vec<DelegationTuple> = match principal_key {
            Some(principal_key) => {
                sqlx::query_as(B::sql(&sql::OF_PRINCIPAL))
                    .bind(principal_key.to_vec())
                    .bind(limit)
                    .fetch_all(self.0.reader())
                    .await
            }
            None => sqlx::query_as(B::sql(&sql::ALL)).bind(limit).fetch_all(self.0.reader()).await,
        }
        .map_err(|error| StoreError::from_sqlx("delegations", error))?;
        rows.into_iter().map(decode_delegation).collect()
    }

    async fn put_approval_inner(self, key: [u8; 32], expires_ms: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(B::sql(&sql::PUT_APPROVAL))
            .bind(key.to_vec())
            .bind(expires_ms)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("put_approval", error))?;
        Ok(B::rows_affected(&done) == 1)
    }

    async fn take_approval_inner(self, key: [u8; 32], now_ms: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(B::sql(&sql::TAKE_APPROVAL))
            .bind(key.to_vec())
            .bind(now_ms)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("take_approval", error))?;
        Ok(B::rows_affected(&done) == 1)
    }

    async fn purge_delegations_inner(self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let sqlx_error = |error| StoreError::from_sqlx("purge_delegations", error);
        sqlx::query(B::sql(&sql::PURGE_TOOL_BUDGETS))
            .bind(now_ms)
            .bind(i64::from(limit))
            .execute(self.0.writer())
            .await
            .map_err(sqlx_error)?;
        let approvals = sqlx::query(B::sql(&sql::PURGE_APPROVALS))
            .bind(now_ms)
            .bind(i64::from(limit))
            .execute(self.0.writer())
            .await
            .map_err(sqlx_error)?;
        let rows = sqlx::query(B::sql(&sql::PURGE))
            .bind(now_ms)
            .bind(i64::from(limit))
            .execute(self.0.writer())
            .await
            .map_err(sqlx_error)?;
        Ok(B::rows_affected(&approvals) + B::rows_affected(&rows))
    }
}

/// [`DelegationStore`] for every backend, from the shared statements (one text for both but the
/// parent's read, which locks the row on PostgreSQL).
impl<B> DelegationStore for B
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<Vec<u8>>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i32: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> DelegationTuple: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i32,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i64, i64): FromRow<'r, <B::Db as Database>::Row>,
{
    fn mint_delegation_with_tools(
        &self,
        new: crate::NewDelegation,
        max_depth: u32,
        tool_calls: std::collections::BTreeMap<String, i64>,
    ) -> StoreFuture<'_, Result<crate::DelegationRow, crate::MintRefusal>> {
        Box::pin(Delegations(self).mint_delegation_inner(new, max_depth, tool_calls))
    }

    fn spend_delegation_tool_call(&self, digest: [u8; 32], tool: &str, now_ms: i64) -> StoreFuture<'_, bool> {
        let tool = tool.to_owned();
        Box::pin(async move { Delegations(self).spend_delegation_tool_call_inner(digest, &tool, now_ms).await })
    }

    fn delegation_tool_budgets(
        &self,
        digest: [u8; 32],
    ) -> StoreFuture<'_, std::collections::BTreeMap<String, (i64, i64)>> {
        Box::pin(Delegations(self).delegation_tool_budgets_inner(digest))
    }

    fn delegation_chain(&self, digest: [u8; 32]) -> StoreFuture<'_, Vec<crate::DelegationRow>> {
        Box::pin(Delegations(self).delegation_chain_inner(digest))
    }

    fn spend_delegation_call(&self, digest: [u8; 32], now_ms: i64) -> StoreFuture<'_, bool> {
        Box::pin(Delegations(self).spend_delegation_call_inner(digest, now_ms))
    }

    fn revoke_delegation(&self, digest: [u8; 32], at_ms: i64) -> StoreFuture<'_, bool> {
        Box::pin(Delegations(self).revoke_delegation_inner(digest, at_ms))
    }

    fn delegations(&self, principal_key: Option<[u8; 32]>, limit: u32) -> StoreFuture<'_, Vec<crate::DelegationRow>> {
        Box::pin(Delegations(self).delegations_inner(principal_key, limit))
    }

    fn put_approval(&self, key: [u8; 32], expires_ms: i64) -> StoreFuture<'_, bool> {
        Box::pin(Delegations(self).put_approval_inner(key, expires_ms))
    }

    fn take_approval(&self, key: [u8; 32], now_ms: i64) -> StoreFuture<'_, bool> {
        Box::pin(Delegations(self).take_approval_inner(key, now_ms))
    }

    fn purge_delegations(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64> {
        Box::pin(Delegations(self).purge_delegations_inner(now_ms, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NewDelegation {
        NewDelegation {
            digest: [1; 32],
            parent: Some([2; 32]),
            principal_key: [3; 32],
            agent: "planner/sub-1".into(),
            body: r#"{"tools":["search"]}"#.into(),
            expires_ms: 2_000,
            calls: 5,
            created_ms: 1_000,
        }
    }

    fn parent() -> DelegationRow {
        DelegationRow {
            digest: [2; 32],
            parent: None,
            root: [2; 32],
            depth: 0,
            principal_key: [3; 32],
            agent: "planner".into(),
            body: "{}".into(),
            expires_ms: 3_000,
            calls: 10,
            remaining: 10,
            created_ms: 500,
            revoked_ms: None,
        }
    }

    #[test]
    fn validation_refuses_each_broken_field() {
        assert!(sample().validate().is_ok());
        let mut edge = sample();
        edge.agent = "a".repeat(MAX_DELEGATION_AGENT_BYTES);
        edge.calls = 0;
        edge.created_ms = 0;
        edge.expires_ms = 1;
        edge.body = format!(r#"{{"x":"{}"}}"#, "b".repeat(MAX_DELEGATION_BODY_BYTES - 8));
        assert_eq!(edge.body.len(), MAX_DELEGATION_BODY_BYTES);
        assert!(edge.validate().is_ok());
        let cases: Vec<fn(&mut NewDelegation)> = vec![
            |d| d.agent.clear(),
            |d| d.agent = "a".repeat(MAX_DELEGATION_AGENT_BYTES + 1),
            |d| d.agent = "agent\n".into(),
            |d| d.agent = "agent\u{7f}".into(),
            |d| d.body = "[]".into(),
            |d| d.body = "\"text\"".into(),
            |d| d.body = "{".into(),
            |d| d.body.clear(),
            |d| d.body = format!(r#"{{"x":"{}"}}"#, "b".repeat(MAX_DELEGATION_BODY_BYTES - 7)),
            |d| d.calls = -1,
            |d| d.expires_ms = d.created_ms,
            |d| d.expires_ms = d.created_ms - 1,
            |d| d.created_ms = -1,
        ];
        for (index, break_it) in cases.into_iter().enumerate() {
            let mut delegation = sample();
            break_it(&mut delegation);
            assert!(matches!(delegation.validate(), Err(StoreError::InvalidRecord { .. })), "case {index}");
        }
    }

    #[test]
    fn child_checks_come_in_the_documented_order() {
        assert_eq!(check_child(&parent(), &sample(), 4), None);
        let revoked = DelegationRow { revoked_ms: Some(1), expires_ms: 0, ..parent() };
        assert_eq!(check_child(&revoked, &sample(), 4), Some(MintRefusal::ParentRevoked));
        let expired = DelegationRow { expires_ms: 1_000, principal_key: [9; 32], ..parent() };
        assert_eq!(check_child(&expired, &sample(), 4), Some(MintRefusal::ParentExpired));
        let other = DelegationRow { principal_key: [9; 32], depth: 16, ..parent() };
        assert_eq!(check_child(&other, &sample(), 4), Some(MintRefusal::OtherPrincipal));
        assert_eq!(check_child(&parent(), &sample(), 0), Some(MintRefusal::TooDeep));
        let deep = DelegationRow { depth: MAX_DELEGATION_DEPTH, ..parent() };
        assert_eq!(check_child(&deep, &sample(), u32::MAX), Some(MintRefusal::TooDeep));
        let shallower = DelegationRow { depth: MAX_DELEGATION_DEPTH - 1, ..parent() };
        assert_eq!(check_child(&shallower, &sample(), u32::MAX), None);
        let short = DelegationRow { expires_ms: 1_999, remaining: 0, ..parent() };
        assert_eq!(check_child(&short, &sample(), 4), Some(MintRefusal::OutlivesParent));
        let poor = DelegationRow { remaining: 4, ..parent() };
        assert_eq!(check_child(&poor, &sample(), 4), Some(MintRefusal::BudgetExceeded));
        let exact = DelegationRow { remaining: 5, expires_ms: 2_000, ..parent() };
        assert_eq!(check_child(&exact, &sample(), 1), None);
    }

    #[test]
    fn refusal_reasons_are_distinct_sentences() {
        let all = [
            MintRefusal::ParentUnknown,
            MintRefusal::ParentRevoked,
            MintRefusal::ParentExpired,
            MintRefusal::OtherPrincipal,
            MintRefusal::TooDeep,
            MintRefusal::OutlivesParent,
            MintRefusal::BudgetExceeded,
            MintRefusal::Exists,
        ];
        let reasons: std::collections::BTreeSet<_> = all.iter().map(|refusal| refusal.reason()).collect();
        assert_eq!(reasons.len(), all.len());
        assert_eq!(MintRefusal::BudgetExceeded.reason(), "the child's call budget is more than the parent has left");
    }

    #[test]
    fn debug_shows_digest_prefixes_and_the_body_length_only() {
        let mut row = parent();
        row.body = r#"{"secret":"hunter2"}"#.into();
        let mut new = sample();
        new.body = row.body.clone();
        for shown in [format!("{row:?}"), format!("{new:?}")] {
            assert!(shown.contains("0202020202020202") && !shown.contains(&"02".repeat(9)), "{shown}");
            assert!(!shown.contains(&"03".repeat(9)), "{shown}");
            assert!(!shown.contains("hunter2") && shown.contains("body_bytes: 20"), "{shown}");
        }
    }
}
