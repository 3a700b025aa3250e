//! The `ConnectionStore` trait: what a gateway keeps as an OAuth client toward upstream servers
//! on behalf of each user — one connection per (principal, upstream) holding the tokens as a
//! ciphertext the caller sealed, the MCP clients each principal approved per upstream, the
//! pending browser flows (connect links, sign-in state, an authorization request's `state`) and
//! Palisade's own registrations at authorization servers. The store never sees a token, a flow id
//! or a principal in clear: tokens arrive sealed, flows by the SHA-256 of their id, principals as
//! a keyed digest (with a display label for operators).
//!
//! **Invariant:** a connection's `version` goes up by one with every write, and
//! [`replace_connection`](ConnectionStore::replace_connection) is one `UPDATE … WHERE version =
//! expected`, so of two instances refreshing the same connection from the same version exactly
//! one stores its rotated refresh token and the other learns it lost. A pending flow is inserted
//! once (an existing digest is never overwritten) and taken by one `DELETE … RETURNING`, so however
//! many callers race for it on any instance, it is taken at most once.

use crate::StoreError;
use crate::handles::hex_prefix;
use crate::store::StoreFuture;

/// Longest upstream id.
pub const MAX_CONNECTION_UPSTREAM_BYTES: usize = 128;
/// Longest principal label, issuer, client id or redirect URI.
pub const MAX_CONNECTION_TEXT_BYTES: usize = 1024;
/// Longest scope list.
pub const MAX_CONNECTION_SCOPES_BYTES: usize = 4096;
/// Largest sealed token set: 64 KiB.
pub const MAX_CONNECTION_SEALED_BYTES: usize = 64 * 1024;
/// Largest flow or registration body (JSON text): 64 KiB.
pub const MAX_OAUTH_BODY_BYTES: usize = 64 * 1024;
/// Longest flow kind.
pub const MAX_FLOW_KIND_BYTES: usize = 32;
/// Most rows [`ConnectionStore::connections`] and [`ConnectionStore::approved_clients`] return.
pub const MAX_CONNECTION_LIST: u32 = 10_000;

/// One principal's stored connection to one upstream.
///
/// As an argument of [`put_connection`](ConnectionStore::put_connection) and
/// [`replace_connection`](ConnectionStore::replace_connection), `version` is ignored (the store
/// assigns it) and so is `created_ms` when a row is replaced (the first one is kept).
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionRow {
    /// Keyed digest of the principal (the caller computes it).
    pub principal_key: [u8; 32],
    /// A display label of the principal (issuer, subject, tenant) for operators: not secret; at
    /// most 1 KiB without control characters.
    pub principal: String,
    /// The upstream's id: 1..=128 bytes without control characters.
    pub upstream: String,
    /// The issuer of the upstream's authorization server: 1..=1024 bytes without control
    /// characters.
    pub issuer: String,
    /// Palisade's client id at that server: 1..=1024 bytes without control characters.
    pub client_id: String,
    /// The granted scopes, space-separated: at most 4096 bytes of RFC 6749 scope characters
    /// (printable ASCII but `"` and `\`) and spaces.
    pub scopes: String,
    /// The tokens as an AEAD ciphertext the caller made: 1 byte to 64 KiB, opaque to the store.
    pub sealed: Vec<u8>,
    /// 1 for a new row, one more with every write.
    pub version: i64,
    /// Unix milliseconds: when the connection was first stored (not negative).
    pub created_ms: i64,
    /// Unix milliseconds: when it was last written (not before `created_ms`).
    pub updated_ms: i64,
    /// Unix milliseconds: when the connection stops being usable without a refresh, if known
    /// (not negative). For listings; the store never acts on it.
    pub expires_ms: Option<i64>,
}

impl std::fmt::Debug for ConnectionRow {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ConnectionRow")
            .field("principal_key", &hex_prefix(&self.principal_key))
            .field("principal_bytes", &self.principal.len())
            .field("upstream", &self.upstream)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("scopes", &self.scopes)
            .field("sealed_bytes", &self.sealed.len())
            .field("version", &self.version)
            .field("created_ms", &self.created_ms)
            .field("updated_ms", &self.updated_ms)
            .field("expires_ms", &self.expires_ms)
            .finish()
    }
}

impl ConnectionRow {
    /// Checks every field the store writes (the schema checks some of them again), so a bad row
    /// is refused with a fixed reason before it reaches the database. The reason never quotes a
    /// value.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.principal.len() > MAX_CONNECTION_TEXT_BYTES || self.principal.chars().any(char::is_control) {
            return invalid("a connection's principal label must be at most 1 KiB without control characters");
        }
        check_upstream(&self.upstream)?;
        if !is_text(&self.issuer, MAX_CONNECTION_TEXT_BYTES) {
            return invalid("a connection's issuer must be 1..=1024 bytes without control characters");
        }
        if !is_text(&self.client_id, MAX_CONNECTION_TEXT_BYTES) {
            return invalid("a connection's client id must be 1..=1024 bytes without control characters");
        }
        let scope_byte = |byte: u8| byte == b' ' || (byte.is_ascii_graphic() && byte != b'"' && byte != b'\\');
        if self.scopes.len() > MAX_CONNECTION_SCOPES_BYTES || !self.scopes.bytes().all(scope_byte) {
            return invalid("a connection's scopes must be at most 4096 bytes of scope characters and spaces");
        }
        if self.sealed.is_empty() || self.sealed.len() > MAX_CONNECTION_SEALED_BYTES {
            return invalid("a connection's sealed tokens must be 1 byte to 64 KiB");
        }
        if self.created_ms < 0 || self.updated_ms < self.created_ms {
            return invalid("a connection's times must not be negative, nor its update before its creation");
        }
        if self.expires_ms.is_some_and(|expires_ms| expires_ms < 0) {
            return invalid("a connection's expiry must not be negative");
        }
        Ok(())
    }
}

/// An MCP client a principal approved for an upstream.
#[derive(Clone, PartialEq, Eq)]
pub struct ApprovedClient {
    /// Keyed digest of the principal who approved.
    pub principal_key: [u8; 32],
    /// The upstream the approval is for.
    pub upstream: String,
    /// The MCP client's id.
    pub client_id: String,
    /// Unix milliseconds: when it was first approved.
    pub approved_ms: i64,
}

impl std::fmt::Debug for ApprovedClient {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ApprovedClient")
            .field("principal_key", &hex_prefix(&self.principal_key))
            .field("upstream", &self.upstream)
            .field("client_id", &self.client_id)
            .field("approved_ms", &self.approved_ms)
            .finish()
    }
}

/// Per-user upstream OAuth connections, consent, pending flows and Palisade's registrations.
/// Implemented by every store backend; every instance on the store sees the same rows. Invalid
/// arguments are [`StoreError::InvalidRecord`] with a fixed reason, nothing written or read.
pub trait ConnectionStore: Send + Sync + std::fmt::Debug + 'static {
    /// Inserts the connection of `(row.principal_key, row.upstream)` with version 1, or replaces
    /// every field of the stored one but `created_ms`, its version going up by one. One statement
    /// (`INSERT … ON CONFLICT DO UPDATE`), so a concurrent
    /// [`replace_connection`](Self::replace_connection) from the old version fails.
    fn put_connection(&self, row: &ConnectionRow) -> StoreFuture<'_, ()>;

    /// The connection of `principal_key` to `upstream`, or `None`.
    fn connection(&self, principal_key: [u8; 32], upstream: &str) -> StoreFuture<'_, Option<ConnectionRow>>;

    /// Compare-and-swap for refresh-token rotation: replaces the stored connection of
    /// `(row.principal_key, row.upstream)` (every field but `created_ms`) and sets its version to
    /// `expected_version + 1`, only if its version is `expected_version` — one `UPDATE`.
    /// `Ok(false)`: there is no such connection or another write came first; nothing changed.
    /// An `expected_version` below 1 is [`StoreError::InvalidRecord`].
    fn replace_connection(&self, row: &ConnectionRow, expected_version: i64) -> StoreFuture<'_, bool>;

    /// The connections of one principal (or every connection when `None`), newest first
    /// (`created_ms` descending, then principal key and upstream by bytes), at most
    /// `min(limit, MAX_CONNECTION_LIST)`.
    fn connections(&self, principal_key: Option<[u8; 32]>, limit: u32) -> StoreFuture<'_, Vec<ConnectionRow>>;

    /// Deletes the connection of `principal_key` to `upstream`: `Ok(true)` iff there was one.
    fn delete_connection(&self, principal_key: [u8; 32], upstream: &str) -> StoreFuture<'_, bool>;

    /// Deletes every connection of `principal_key` (logout, role change, …) and returns how many.
    /// Approvals are left alone (see [`revoke_client`](Self::revoke_client)).
    fn delete_connections_of(&self, principal_key: [u8; 32]) -> StoreFuture<'_, u64>;

    /// Records that `principal_key` approved the MCP client `client_id` for `upstream` at
    /// `now_ms` (not negative). Approving again changes nothing (the first time is kept).
    fn approve_client(
        &self,
        principal_key: [u8; 32],
        upstream: &str,
        client_id: &str,
        now_ms: i64,
    ) -> StoreFuture<'_, ()>;

    /// Whether `principal_key` approved `client_id` for `upstream` (and has not revoked it).
    fn client_approved(&self, principal_key: [u8; 32], upstream: &str, client_id: &str) -> StoreFuture<'_, bool>;

    /// The approvals of one principal (or every approval when `None`), newest first
    /// (`approved_ms` descending, then principal key, upstream and client id by bytes), at most
    /// `min(limit, MAX_CONNECTION_LIST)`.
    fn approved_clients(&self, principal_key: Option<[u8; 32]>, limit: u32) -> StoreFuture<'_, Vec<ApprovedClient>>;

    /// Revokes an approval: `Ok(true)` iff there was one.
    fn revoke_client(&self, principal_key: [u8; 32], upstream: &str, client_id: &str) -> StoreFuture<'_, bool>;

    /// Stores a pending flow of `kind` (1..=32 ASCII letters, digits, `_` and `-`) under the
    /// SHA-256 of its id, with `body` (JSON text, at most 64 KiB, opaque to the store) until
    /// `expires_ms` (not negative). A digest stored already (expired or not) is never
    /// overwritten: [`StoreError::InvalidRecord`], the first body kept.
    fn put_flow(&self, id_digest: [u8; 32], kind: &str, body: &str, expires_ms: i64) -> StoreFuture<'_, ()>;

    /// The body of the flow `id_digest` if it is of `kind` and expires after `now_ms`, without
    /// consuming it.
    fn flow(&self, id_digest: [u8; 32], kind: &str, now_ms: i64) -> StoreFuture<'_, Option<String>>;

    /// Consumes the flow `id_digest` of `kind`: one `DELETE … RETURNING`, so however many callers
    /// race on any instance, at most one gets `Some`. A flow that expired at or before `now_ms`
    /// is deleted and answers `None`; a flow of another kind answers `None` and stays.
    fn take_flow(&self, id_digest: [u8; 32], kind: &str, now_ms: i64) -> StoreFuture<'_, Option<String>>;

    /// Deletes at most `limit` flows whose `expires_ms` is at or before `now_ms`; returns how
    /// many. Bounded so a retention job never holds the writer for long.
    fn purge_flows(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64>;

    /// Stores (or replaces) Palisade's registration at the authorization server `issuer` for
    /// `redirect_uri` (each 1..=1024 bytes without control characters): `body` is the Dynamic
    /// Client Registration result as JSON text (at most 64 KiB), registered at `now_ms` (not
    /// negative). A body holding a client secret should be sealed by the caller first.
    fn put_oauth_client(&self, issuer: &str, redirect_uri: &str, body: &str, now_ms: i64) -> StoreFuture<'_, ()>;

    /// The registration body stored for `issuer` and `redirect_uri`, or `None`.
    fn oauth_client(&self, issuer: &str, redirect_uri: &str) -> StoreFuture<'_, Option<String>>;
}

fn invalid<T>(reason: &'static str) -> Result<T, StoreError> {
    Err(StoreError::InvalidRecord { reason })
}

/// 1..=`max` bytes without control characters.
fn is_text(text: &str, max: usize) -> bool {
    !text.is_empty() && text.len() <= max && !text.chars().any(char::is_control)
}

pub(crate) fn check_upstream(upstream: &str) -> Result<(), StoreError> {
    if !is_text(upstream, MAX_CONNECTION_UPSTREAM_BYTES) {
        return invalid("an upstream id must be 1..=128 bytes without control characters");
    }
    Ok(())
}

pub(crate) fn check_client_id(client_id: &str) -> Result<(), StoreError> {
    if !is_text(client_id, MAX_CONNECTION_TEXT_BYTES) {
        return invalid("a client id must be 1..=1024 bytes without control characters");
    }
    Ok(())
}

pub(crate) fn check_kind(kind: &str) -> Result<(), StoreError> {
    let shape = |byte: u8| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-';
    if kind.is_empty() || kind.len() > MAX_FLOW_KIND_BYTES || !kind.bytes().all(shape) {
        return invalid("a flow kind must be 1..=32 characters of A-Z, a-z, 0-9, '_' and '-'");
    }
    Ok(())
}

pub(crate) fn check_body(body: &str) -> Result<(), StoreError> {
    if body.len() > MAX_OAUTH_BODY_BYTES {
        return invalid("a flow or registration body must be at most 64 KiB");
    }
    if serde_json::from_str::<serde::de::IgnoredAny>(body).is_err() {
        return invalid("a flow or registration body must be JSON text");
    }
    Ok(())
}

pub(crate) fn check_time(time_ms: i64) -> Result<(), StoreError> {
    if time_ms < 0 {
        return invalid("a time must not be negative");
    }
    Ok(())
}

pub(crate) fn check_registration_key(issuer: &str, redirect_uri: &str) -> Result<(), StoreError> {
    if !is_text(issuer, MAX_CONNECTION_TEXT_BYTES) {
        return invalid("an issuer must be 1..=1024 bytes without control characters");
    }
    if !is_text(redirect_uri, MAX_CONNECTION_TEXT_BYTES) {
        return invalid("a redirect URI must be 1..=1024 bytes without control characters");
    }
    Ok(())
}

pub(crate) fn check_expected_version(expected_version: i64) -> Result<(), StoreError> {
    if expected_version < 1 {
        return invalid("an expected connection version must be at least 1");
    }
    Ok(())
}

/// A connection row as both backends read it (columns by name).
#[derive(sqlx::FromRow)]
pub(crate) struct ConnectionTuple {
    principal_key: Vec<u8>,
    principal: String,
    upstream: String,
    issuer: String,
    client_id: String,
    scopes: String,
    sealed: Vec<u8>,
    version: i64,
    created_ms: i64,
    updated_ms: i64,
    expires_ms: Option<i64>,
}

fn principal_key(bytes: &[u8]) -> Result<[u8; 32], StoreError> {
    bytes.try_into().map_err(|_| StoreError::corrupt("a stored principal key is not 32 bytes"))
}

pub(crate) fn decode_connection(row: ConnectionTuple) -> Result<ConnectionRow, StoreError> {
    Ok(ConnectionRow {
        principal_key: principal_key(&row.principal_key)?,
        principal: row.principal,
        upstream: row.upstream,
        issuer: row.issuer,
        client_id: row.client_id,
        scopes: row.scopes,
        sealed: row.sealed,
        version: row.version,
        created_ms: row.created_ms,
        updated_ms: row.updated_ms,
        expires_ms: row.expires_ms,
    })
}

/// An approval as both backends read it (columns by name).
#[derive(sqlx::FromRow)]
pub(crate) struct ApprovalTuple {
    principal_key: Vec<u8>,
    upstream: String,
    client_id: String,
    approved_ms: i64,
}

pub(crate) fn decode_approval(row: ApprovalTuple) -> Result<ApprovedClient, StoreError> {
    Ok(ApprovedClient {
        principal_key: principal_key(&row.principal_key)?,
        upstream: row.upstream,
        client_id: row.client_id,
        approved_ms: row.approved_ms,
    })
}

/// The statements both backends run, with `$n` placeholders (SQLite gets them as `?n`).
pub(crate) mod sql {
    macro_rules! connection_columns {
        () => {
            "principal_key, upstream, principal, issuer, client_id, scopes, sealed, version, created_ms, updated_ms, \
             expires_ms"
        };
    }
    /// Inserts at version 1, or replaces all but `created_ms` and bumps the version.
    pub const PUT: &str = concat!(
        "INSERT INTO oauth_connections (",
        connection_columns!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8, $9, $10) \
         ON CONFLICT (principal_key, upstream) DO UPDATE SET principal = excluded.principal, \
         issuer = excluded.issuer, client_id = excluded.client_id, scopes = excluded.scopes, \
         sealed = excluded.sealed, version = oauth_connections.version + 1, updated_ms = excluded.updated_ms, \
         expires_ms = excluded.expires_ms"
    );
    /// The compare-and-swap: only from version `$10`.
    pub const REPLACE: &str = "UPDATE oauth_connections SET principal = $3, issuer = $4, client_id = $5, \
        scopes = $6, sealed = $7, version = version + 1, updated_ms = $8, expires_ms = $9 \
        WHERE principal_key = $1 AND upstream = $2 AND version = $10";
    pub const ONE: &str =
        concat!("SELECT ", connection_columns!(), " FROM oauth_connections WHERE principal_key = $1 AND upstream = $2");
    pub const OF_PRINCIPAL: &str = concat!(
        "SELECT ",
        connection_columns!(),
        " FROM oauth_connections WHERE principal_key = $1 ORDER BY created_ms DESC, upstream LIMIT $2"
    );
    pub const ALL: &str = concat!(
        "SELECT ",
        connection_columns!(),
        " FROM oauth_connections ORDER BY created_ms DESC, principal_key, upstream LIMIT $1"
    );
    pub const DELETE: &str = "DELETE FROM oauth_connections WHERE principal_key = $1 AND upstream = $2";
    pub const DELETE_OF_PRINCIPAL: &str = "DELETE FROM oauth_connections WHERE principal_key = $1";

    pub const APPROVE: &str = "INSERT INTO oauth_client_approvals (principal_key, upstream, client_id, approved_ms) \
        VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";
    pub const APPROVED: &str =
        "SELECT 1 FROM oauth_client_approvals WHERE principal_key = $1 AND upstream = $2 AND client_id = $3";
    pub const APPROVALS_OF_PRINCIPAL: &str = "SELECT principal_key, upstream, client_id, approved_ms \
        FROM oauth_client_approvals WHERE principal_key = $1 ORDER BY approved_ms DESC, upstream, client_id LIMIT $2";
    pub const APPROVALS: &str = "SELECT principal_key, upstream, client_id, approved_ms FROM oauth_client_approvals \
        ORDER BY approved_ms DESC, principal_key, upstream, client_id LIMIT $1";
    pub const REVOKE: &str =
        "DELETE FROM oauth_client_approvals WHERE principal_key = $1 AND upstream = $2 AND client_id = $3";

    /// An existing digest is kept (no row affected).
    pub const PUT_FLOW: &str =
        "INSERT INTO oauth_flows (id_digest, kind, body, expires_ms) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";
    pub const FLOW: &str = "SELECT body FROM oauth_flows WHERE id_digest = $1 AND kind = $2 AND expires_ms > $3";
    /// Deletes the flow whatever its expiry (the caller checks it), so an expired one is gone too.
    pub const TAKE_FLOW: &str = "DELETE FROM oauth_flows WHERE id_digest = $1 AND kind = $2 RETURNING body, expires_ms";
    pub const PURGE_FLOWS: &str = "DELETE FROM oauth_flows WHERE id_digest IN \
        (SELECT id_digest FROM oauth_flows WHERE expires_ms <= $1 LIMIT $2)";

    pub const PUT_CLIENT: &str = "INSERT INTO oauth_clients (issuer, redirect_uri, body, registered_ms) \
        VALUES ($1, $2, $3, $4) ON CONFLICT (issuer, redirect_uri) DO UPDATE SET body = excluded.body, \
        registered_ms = excluded.registered_ms";
    pub const CLIENT: &str = "SELECT body FROM oauth_clients WHERE issuer = $1 AND redirect_uri = $2";
}

/// Implements [`ConnectionStore`] for a backend from the shared statements (one text for both).
/// `writer`/`reader` name the pools and `sql` adapts a statement's placeholders.
macro_rules! impl_connection_store {
    (store: $store:ty, writer: $writer:ident, reader: $reader:ident, sql: $sql:ident) => {
        impl $store {
            async fn put_connection_inner(&self, row: crate::ConnectionRow) -> Result<(), StoreError> {
                row.validate()?;
                sqlx::query($sql!(crate::connections::sql::PUT))
                    .bind(row.principal_key.to_vec())
                    .bind(row.upstream)
                    .bind(row.principal)
                    .bind(row.issuer)
                    .bind(row.client_id)
                    .bind(row.scopes)
                    .bind(row.sealed)
                    .bind(row.created_ms)
                    .bind(row.updated_ms)
                    .bind(row.expires_ms)
                    .execute(&self.$writer)
                    .await
                    .map_err(|error| StoreError::from_sqlx("put_connection", error))?;
                Ok(())
            }

            async fn connection_inner(
                &self,
                principal_key: [u8; 32],
                upstream: String,
            ) -> Result<Option<crate::ConnectionRow>, StoreError> {
                crate::connections::check_upstream(&upstream)?;
                let row: Option<crate::connections::ConnectionTuple> =
                    sqlx::query_as($sql!(crate::connections::sql::ONE))
                        .bind(principal_key.to_vec())
                        .bind(upstream)
                        .fetch_optional(&self.$reader)
                        .await
                        .map_err(|error| StoreError::from_sqlx("connection", error))?;
                row.map(crate::connections::decode_connection).transpose()
            }

            async fn replace_connection_inner(
                &self,
                row: crate::ConnectionRow,
                expected_version: i64,
            ) -> Result<bool, StoreError> {
                row.validate()?;
                crate::connections::check_expected_version(expected_version)?;
                let done = sqlx::query($sql!(crate::connections::sql::REPLACE))
                    .bind(row.principal_key.to_vec())
                    .bind(row.upstream)
                    .bind(row.principal)
                    .bind(row.issuer)
                    .bind(row.client_id)
                    .bind(row.scopes)
                    .bind(row.sealed)
                    .bind(row.updated_ms)
                    .bind(row.expires_ms)
                    .bind(expected_version)
                    .execute(&self.$writer)
                    .await
                    .map_err(|error| StoreError::from_sqlx("replace_connection", error))?;
                Ok(done.rows_affected() == 1)
            }

            async fn connections_inner(
                &self,
                principal_key: Option<[u8; 32]>,
                limit: u32,
            ) -> Result<Vec<crate::ConnectionRow>, StoreError> {
                use crate::connections::sql;
                let limit = i64::from(limit.min(crate::MAX_CONNECTION_LIST));
                let rows: Vec<crate::connections::ConnectionTuple> = match principal_key {
                    Some(principal_key) => {
                        sqlx::query_as($sql!(sql::OF_PRINCIPAL))
                            .bind(principal_key.to_vec())
                            .bind(limit)
                            .fetch_all(&self.$reader)
                            .await
                    }
                    None => sqlx::query_as($sql!(sql::ALL)).bind(limit).fetch_all(&self.$reader).await,
                }
                .map_err(|error| StoreError::from_sqlx("connections", error))?;
                rows.into_iter().map(crate::connections::decode_connection).collect()
            }

            async fn delete_connection_inner(
                &self,
                principal_key: [u8; 32],
                upstream: String,
            ) -> Result<bool, StoreError> {
                crate::connections::check_upstream(&upstream)?;
                let done = sqlx::query($sql!(crate::connections::sql::DELETE))
                    .bind(principal_key.to_vec())
                    .bind(upstream)
                    .execute(&self.$writer)
                    .await
                    .map_err(|error| StoreError::from_sqlx("delete_connection", error))?;
                Ok(done.rows_affected() == 1)
            }

            async fn delete_connections_of_inner(&self, principal_key: [u8; 32]) -> Result<u64, StoreError> {
                let done = sqlx::query($sql!(crate::connections::sql::DELETE_OF_PRINCIPAL))
                    .bind(principal_key.to_vec())
                    .execute(&self.$writer)
                    .await
                    .map_err(|error| StoreError::from_sqlx("delete_connections_of", error))?;
                Ok(done.rows_affected())
            }

            async fn approve_client_inner(
                &self,
                principal_key: [u8; 32],
                upstream: String,
                client_id: String,
                now_ms: i64,
            ) -> Result<(), StoreError> {
                crate::connections::check_upstream(&upstream)?;
                crate::connections::check_client_id(&client_id)?;
                crate::connections::check_time(now_ms)?;
                sqlx::query($sql!(crate::connections::sql::APPROVE))
                    .bind(principal_key.to_vec())
                    .bind(upstream)
                    .bind(client_id)
                    .bind(now_ms)
                    .execute(&self.$writer)
                    .await
                    .map_err(|error| StoreError::from_sqlx("approve_client", error))?;
                Ok(())
            }

            async fn client_approved_inner(
                &self,
                principal_key: [u8; 32],
                upstream: String,
                client_id: String,
            ) -> Result<bool, StoreError> {
                crate::connections::check_upstream(&upstream)?;
                crate::connections::check_client_id(&client_id)?;
                let found: Option<(i32,)> = sqlx::query_as($sql!(crate::connections::sql::APPROVED))
                    .bind(principal_key.to_vec())
                    .bind(upstream)
                    .bind(client_id)
                    .fetch_optional(&self.$reader)
                    .await
                    .map_err(|error| StoreError::from_sqlx("client_approved", error))?;
                Ok(found.is_some())
            }

            async fn approved_clients_inner(
                &self,
                principal_key: Option<[u8; 32]>,
                limit: u32,
            ) -> Result<Vec<crate::ApprovedClient>, StoreError> {
                use crate::connections::sql;
                let limit = i64::from(limit.min(crate::MAX_CONNECTION_LIST));
                let rows: Vec<crate::connections::ApprovalTuple> = match principal_key {
                    Some(principal_key) => {
                        sqlx::query_as($sql!(sql::APPROVALS_OF_PRINCIPAL))
                            .bind(principal_key.to_vec())
                            .bind(limit)
                            .fetch_all(&self.$reader)
                            .await
                    }
                    None => sqlx::query_as($sql!(sql::APPROVALS)).bind(limit).fetch_all(&self.$reader).await,
                }
                .map_err(|error| StoreError::from_sqlx("approved_clients", error))?;
                rows.into_iter().map(crate::connections::decode_approval).collect()
            }

            async fn revoke_client_inner(
                &self,
                principal_key: [u8; 32],
                upstream: String,
                client_id: String,
            ) -> Result<bool, StoreError> {
                crate::connections::check_upstream(&upstream)?;
                crate::connections::check_client_id(&client_id)?;
                let done = sqlx::query($sql!(crate::connections::sql::REVOKE))
                    .bind(principal_key.to_vec())
                    .bind(upstream)
                    .bind(client_id)
                    .execute(&self.$writer)
                    .await
                    .map_err(|error| StoreError::from_sqlx("revoke_client", error))?;
                Ok(done.rows_affected() == 1)
            }

            async fn put_flow_inner(
                &self,
                id_digest: [u8; 32],
                kind: String,
                body: String,
                expires_ms: i64,
            ) -> Result<(), StoreError> {
                crate::connections::check_kind(&kind)?;
                crate::connections::check_body(&body)?;
                crate::connections::check_time(expires_ms)?;
                let done = sqlx::query($sql!(crate::connections::sql::PUT_FLOW))
                    .bind(id_digest.to_vec())
                    .bind(kind)
                    .bind(body)
                    .bind(expires_ms)
                    .execute(&self.$writer)
                    .await
                    .map_err(|error| StoreError::from_sqlx("put_flow", error))?;
                if done.rows_affected() != 1 {
                    return Err(StoreError::InvalidRecord { reason: "a pending flow with this digest exists already" });
                }
                Ok(())
            }

            async fn flow_inner(
                &self,
                id_digest: [u8; 32],
                kind: String,
                now_ms: i64,
            ) -> Result<Option<String>, StoreError> {
                crate::connections::check_kind(&kind)?;
                let row: Option<(String,)> = sqlx::query_as($sql!(crate::connections::sql::FLOW))
                    .bind(id_digest.to_vec())
                    .bind(kind)
                    .bind(now_ms)
                    .fetch_optional(&self.$reader)
                    .await
                    .map_err(|error| StoreError::from_sqlx("flow", error))?;
                Ok(row.map(|(body,)| body))
            }

            async fn take_flow_inner(
                &self,
                id_digest: [u8; 32],
                kind: String,
                now_ms: i64,
            ) -> Result<Option<String>, StoreError> {
                crate::connections::check_kind(&kind)?;
                let row: Option<(String, i64)> = sqlx::query_as($sql!(crate::connections::sql::TAKE_FLOW))
                    .bind(id_digest.to_vec())
                    .bind(kind)
                    .fetch_optional(&self.$writer)
                    .await
                    .map_err(|error| StoreError::from_sqlx("take_flow", error))?;
                Ok(row.and_then(|(body, expires_ms)| (expires_ms > now_ms).then_some(body)))
            }

            async fn purge_flows_inner(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
                let done = sqlx::query($sql!(crate::connections::sql::PURGE_FLOWS))
                    .bind(now_ms)
                    .bind(i64::from(limit))
                    .execute(&self.$writer)
                    .await
                    .map_err(|error| StoreError::from_sqlx("purge_flows", error))?;
                Ok(done.rows_affected())
            }

            async fn put_oauth_client_inner(
                &self,
                issuer: String,
                redirect_uri: String,
                body: String,
                now_ms: i64,
            ) -> Result<(), StoreError> {
                crate::connections::check_registration_key(&issuer, &redirect_uri)?;
                crate::connections::check_body(&body)?;
                crate::connections::check_time(now_ms)?;
                sqlx::query($sql!(crate::connections::sql::PUT_CLIENT))
                    .bind(issuer)
                    .bind(redirect_uri)
                    .bind(body)
                    .bind(now_ms)
                    .execute(&self.$writer)
                    .await
                    .map_err(|error| StoreError::from_sqlx("put_oauth_client", error))?;
                Ok(())
            }

            async fn oauth_client_inner(
                &self,
                issuer: String,
                redirect_uri: String,
            ) -> Result<Option<String>, StoreError> {
                crate::connections::check_registration_key(&issuer, &redirect_uri)?;
                let row: Option<(String,)> = sqlx::query_as($sql!(crate::connections::sql::CLIENT))
                    .bind(issuer)
                    .bind(redirect_uri)
                    .fetch_optional(&self.$reader)
                    .await
                    .map_err(|error| StoreError::from_sqlx("oauth_client", error))?;
                Ok(row.map(|(body,)| body))
            }
        }

        impl crate::ConnectionStore for $store {
            fn put_connection(&self, row: &crate::ConnectionRow) -> StoreFuture<'_, ()> {
                Box::pin(self.put_connection_inner(row.clone()))
            }

            fn connection(
                &self,
                principal_key: [u8; 32],
                upstream: &str,
            ) -> StoreFuture<'_, Option<crate::ConnectionRow>> {
                Box::pin(self.connection_inner(principal_key, upstream.to_owned()))
            }

            fn replace_connection(&self, row: &crate::ConnectionRow, expected_version: i64) -> StoreFuture<'_, bool> {
                Box::pin(self.replace_connection_inner(row.clone(), expected_version))
            }

            fn connections(
                &self,
                principal_key: Option<[u8; 32]>,
                limit: u32,
            ) -> StoreFuture<'_, Vec<crate::ConnectionRow>> {
                Box::pin(self.connections_inner(principal_key, limit))
            }

            fn delete_connection(&self, principal_key: [u8; 32], upstream: &str) -> StoreFuture<'_, bool> {
                Box::pin(self.delete_connection_inner(principal_key, upstream.to_owned()))
            }

            fn delete_connections_of(&self, principal_key: [u8; 32]) -> StoreFuture<'_, u64> {
                Box::pin(self.delete_connections_of_inner(principal_key))
            }

            fn approve_client(
                &self,
                principal_key: [u8; 32],
                upstream: &str,
                client_id: &str,
                now_ms: i64,
            ) -> StoreFuture<'_, ()> {
                Box::pin(self.approve_client_inner(principal_key, upstream.to_owned(), client_id.to_owned(), now_ms))
            }

            fn client_approved(
                &self,
                principal_key: [u8; 32],
                upstream: &str,
                client_id: &str,
            ) -> StoreFuture<'_, bool> {
                Box::pin(self.client_approved_inner(principal_key, upstream.to_owned(), client_id.to_owned()))
            }

            fn approved_clients(
                &self,
                principal_key: Option<[u8; 32]>,
                limit: u32,
            ) -> StoreFuture<'_, Vec<crate::ApprovedClient>> {
                Box::pin(self.approved_clients_inner(principal_key, limit))
            }

            fn revoke_client(&self, principal_key: [u8; 32], upstream: &str, client_id: &str) -> StoreFuture<'_, bool> {
                Box::pin(self.revoke_client_inner(principal_key, upstream.to_owned(), client_id.to_owned()))
            }

            fn put_flow(&self, id_digest: [u8; 32], kind: &str, body: &str, expires_ms: i64) -> StoreFuture<'_, ()> {
                Box::pin(self.put_flow_inner(id_digest, kind.to_owned(), body.to_owned(), expires_ms))
            }

            fn flow(&self, id_digest: [u8; 32], kind: &str, now_ms: i64) -> StoreFuture<'_, Option<String>> {
                Box::pin(self.flow_inner(id_digest, kind.to_owned(), now_ms))
            }

            fn take_flow(&self, id_digest: [u8; 32], kind: &str, now_ms: i64) -> StoreFuture<'_, Option<String>> {
                Box::pin(self.take_flow_inner(id_digest, kind.to_owned(), now_ms))
            }

            fn purge_flows(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64> {
                Box::pin(self.purge_flows_inner(now_ms, limit))
            }

            fn put_oauth_client(
                &self,
                issuer: &str,
                redirect_uri: &str,
                body: &str,
                now_ms: i64,
            ) -> StoreFuture<'_, ()> {
                Box::pin(self.put_oauth_client_inner(
                    issuer.to_owned(),
                    redirect_uri.to_owned(),
                    body.to_owned(),
                    now_ms,
                ))
            }

            fn oauth_client(&self, issuer: &str, redirect_uri: &str) -> StoreFuture<'_, Option<String>> {
                Box::pin(self.oauth_client_inner(issuer.to_owned(), redirect_uri.to_owned()))
            }
        }
    };
}
pub(crate) use impl_connection_store;

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ConnectionRow {
        ConnectionRow {
            principal_key: [3; 32],
            principal: "https://idp.example alice acme".into(),
            upstream: "github".into(),
            issuer: "https://github.com/login/oauth".into(),
            client_id: "palisade-gateway".into(),
            scopes: "repo read:org".into(),
            sealed: vec![9; 48],
            version: 1,
            created_ms: 1_000,
            updated_ms: 1_000,
            expires_ms: Some(4_600_000),
        }
    }

    #[test]
    fn connection_validation_refuses_each_broken_field() {
        assert!(sample().validate().is_ok());
        let edge = ConnectionRow {
            principal: "p".repeat(MAX_CONNECTION_TEXT_BYTES),
            upstream: "u".repeat(MAX_CONNECTION_UPSTREAM_BYTES),
            issuer: "i".repeat(MAX_CONNECTION_TEXT_BYTES),
            client_id: "c".repeat(MAX_CONNECTION_TEXT_BYTES),
            scopes: "s".repeat(MAX_CONNECTION_SCOPES_BYTES),
            sealed: vec![0; MAX_CONNECTION_SEALED_BYTES],
            created_ms: 0,
            updated_ms: 0,
            expires_ms: Some(0),
            ..sample()
        };
        assert!(edge.validate().is_ok());
        let unlabelled =
            ConnectionRow { principal: String::new(), scopes: String::new(), expires_ms: None, ..sample() };
        assert!(unlabelled.validate().is_ok(), "an empty label and no scopes are allowed");
        let cases: Vec<fn(&mut ConnectionRow)> = vec![
            |c| c.principal = "p".repeat(MAX_CONNECTION_TEXT_BYTES + 1),
            |c| c.principal = "alice\n".into(),
            |c| c.upstream.clear(),
            |c| c.upstream = "u".repeat(MAX_CONNECTION_UPSTREAM_BYTES + 1),
            |c| c.upstream = "git\u{0}hub".into(),
            |c| c.issuer.clear(),
            |c| c.issuer = "i".repeat(MAX_CONNECTION_TEXT_BYTES + 1),
            |c| c.issuer = "https://x/\r".into(),
            |c| c.client_id.clear(),
            |c| c.client_id = "c".repeat(MAX_CONNECTION_TEXT_BYTES + 1),
            |c| c.client_id = "client\u{7f}".into(),
            |c| c.scopes = "s".repeat(MAX_CONNECTION_SCOPES_BYTES + 1),
            |c| c.scopes = "repo\tread".into(),
            |c| c.scopes = "say\"hi\"".into(),
            |c| c.scopes = "back\\slash".into(),
            |c| c.scopes = "ünïcode".into(),
            |c| c.sealed.clear(),
            |c| c.sealed = vec![0; MAX_CONNECTION_SEALED_BYTES + 1],
            |c| c.created_ms = -1,
            |c| c.updated_ms = c.created_ms - 1,
            |c| c.expires_ms = Some(-1),
        ];
        for (index, break_it) in cases.into_iter().enumerate() {
            let mut row = sample();
            break_it(&mut row);
            assert!(matches!(row.validate(), Err(StoreError::InvalidRecord { .. })), "case {index}");
        }
    }

    #[test]
    fn argument_checks_refuse_what_no_row_can_hold() {
        assert!(check_kind("connect").is_ok() && check_kind("sign-in_2").is_ok());
        assert!(check_kind(&"k".repeat(MAX_FLOW_KIND_BYTES)).is_ok());
        for kind in ["", "sign in", "état", "a/b", &"k".repeat(MAX_FLOW_KIND_BYTES + 1)] {
            assert!(check_kind(kind).is_err(), "{kind:?}");
        }
        assert!(check_body(r#"{"a":1}"#).is_ok() && check_body("[1, 2]").is_ok() && check_body("\"x\"").is_ok());
        let largest = format!("\"{}\"", "b".repeat(MAX_OAUTH_BODY_BYTES - 2));
        assert!(check_body(&largest).is_ok());
        let too_large = format!("\"{}\"", "b".repeat(MAX_OAUTH_BODY_BYTES - 1));
        for body in ["", "{", "{} {}", too_large.as_str()] {
            assert!(check_body(body).is_err(), "{body:?}");
        }
        assert!(check_registration_key("https://as.example", "https://gw.example/callback").is_ok());
        assert!(check_registration_key("", "https://gw.example/callback").is_err());
        assert!(check_registration_key("https://as.example", "").is_err());
        assert!(check_registration_key("https://as.example\n", "https://gw.example/callback").is_err());
        assert!(check_registration_key("https://as.example", &"r".repeat(MAX_CONNECTION_TEXT_BYTES + 1)).is_err());
        assert!(check_client_id("").is_err() && check_client_id("c\u{1b}").is_err() && check_client_id("cli").is_ok());
        assert!(check_time(0).is_ok() && check_time(-1).is_err());
        assert!(check_expected_version(1).is_ok() && check_expected_version(0).is_err());
    }

    #[test]
    fn reasons_never_quote_a_value() {
        let secret = ConnectionRow { issuer: "https://hunter2.example/\u{0}".into(), ..sample() };
        let error = secret.validate().err().unwrap();
        let text = format!("{error} {error:?}");
        assert!(!text.contains("hunter2"), "{text}");
        let error = check_kind("hunter2 ").err().unwrap();
        assert!(!format!("{error} {error:?}").contains("hunter2"));
    }

    #[test]
    fn debug_shows_neither_the_sealed_tokens_nor_the_principal() {
        let row =
            ConnectionRow { principal: "alice@example.com".into(), sealed: b"hunter2-ciphertext".to_vec(), ..sample() };
        let shown = format!("{row:?}");
        assert!(!shown.contains("alice") && shown.contains("principal_bytes: 17"), "{shown}");
        assert!(shown.contains("sealed_bytes: 18") && !shown.contains("104, 117"), "{shown}");
        assert!(shown.contains("0303030303030303") && !shown.contains(&"03".repeat(9)), "{shown}");
        let approval =
            ApprovedClient { principal_key: [5; 32], upstream: "u".into(), client_id: "c".into(), approved_ms: 1 };
        let shown = format!("{approval:?}");
        assert!(shown.contains("0505050505050505") && !shown.contains(&"05".repeat(9)), "{shown}");
    }
}
