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
