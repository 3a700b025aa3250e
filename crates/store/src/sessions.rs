//! The `SessionStore` trait: durable state of 2025-era sessions (`Mcp-Session-Id`). A session id
//! is never identity: rows are keyed by the id's SHA-256 *and* the owner (keyed subject digest,
//! tenant, client) of the principal that created it, and every statement matches both plus both
//! expiries (absolute and idle), so a lookup by anyone else, or after expiry, finds nothing. The
//! state lives here so that any instance can serve any request of a session.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::StoreError;
use crate::backend::Backend;
use crate::store::StoreFuture;

/// Longest tenant or client id accepted in a session owner.
pub const MAX_SESSION_FIELD_BYTES: usize = 512;
/// Largest JSON text (client capabilities, client info) stored with a session.
pub const MAX_SESSION_JSON_BYTES: usize = 64 * 1024;
/// Longest resource URI a session may subscribe to.
pub const MAX_SUBSCRIPTION_URI_BYTES: usize = 2048;
/// Most resource subscriptions one session may hold.
pub const MAX_SESSION_SUBSCRIPTIONS: usize = 256;

/// Who a session belongs to: the keyed subject digest, the tenant and the OAuth client (empty
/// strings when the principal has none).
#[derive(Clone, PartialEq, Eq)]
pub struct SessionOwner {
    /// HMAC-SHA256 of the principal's issuer and subject under a deployment key.
    pub subject_key: [u8; 32],
    /// The tenant, or empty.
    pub tenant: String,
    /// The OAuth client, or empty.
    pub client: String,
}

impl std::fmt::Debug for SessionOwner {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SessionOwner")
            .field("subject_key", &crate::hex_prefix(&self.subject_key))
            .field("tenant", &self.tenant)
            .field("client", &self.client)
            .finish()
    }
}

/// A new session row.
#[derive(Clone)]
pub struct NewSession {
    /// SHA-256 of the session id.
    pub digest: [u8; 32],
    /// Its owner.
    pub owner: SessionOwner,
    /// The negotiated protocol version.
    pub protocol_version: String,
    /// The client capabilities declared at `initialize`, as JSON object text.
    pub client_capabilities: String,
    /// The client info sent at `initialize`, as JSON object text.
    pub client_info: Option<String>,
    /// Unix milliseconds.
    pub created_ms: i64,
    /// The session dies after this long without a request.
    pub idle_ms: i64,
    /// Unix milliseconds; the session is dead from this instant on, however active.
    pub expires_ms: i64,
}

impl std::fmt::Debug for NewSession {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("NewSession")
            .field("digest", &crate::hex_prefix(&self.digest))
            .field("owner", &self.owner)
            .field("protocol_version", &self.protocol_version)
            .field("expires_ms", &self.expires_ms)
            .finish_non_exhaustive()
    }
}

impl NewSession {
    /// Checks the invariants the schema also enforces, so a bad row is refused with a clear
    /// reason before it reaches the database.
    pub fn validate(&self) -> Result<(), StoreError> {
        let invalid = |reason| Err(StoreError::InvalidRecord { reason });
        if self.owner.tenant.len() > MAX_SESSION_FIELD_BYTES || self.owner.client.len() > MAX_SESSION_FIELD_BYTES {
            return invalid("a session's tenant and client must be at most 512 bytes");
        }
        if self.protocol_version.is_empty() || self.protocol_version.len() > 64 {
            return invalid("a session's protocol version must be 1..=64 bytes");
        }
        let json_object = |text: &str| {
            text.len() <= MAX_SESSION_JSON_BYTES
                && serde_json::from_str::<serde_json::Value>(text).is_ok_and(|value| value.is_object())
        };
        if !json_object(&self.client_capabilities) || !self.client_info.as_deref().is_none_or(json_object) {
            return invalid("a session's client capabilities and info must be JSON objects of at most 64 KiB");
        }
        if self.created_ms < 0 || self.idle_ms <= 0 || self.expires_ms <= self.created_ms {
            return invalid("a session needs a positive idle timeout and must expire after it is created");
        }
        Ok(())
    }
}

/// A live session, as [`SessionStore::touch_session`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSession {
    /// The negotiated protocol version.
    pub protocol_version: String,
    /// The client capabilities, JSON object text.
    pub client_capabilities: String,
    /// The client info, JSON object text.
    pub client_info: Option<String>,
    /// The level set with `logging/setLevel`, if any.
    pub log_level: Option<String>,
    /// Unix milliseconds.
    pub created_ms: i64,
    /// Unix milliseconds (after this touch).
    pub last_seen_ms: i64,
    /// Absolute expiry, Unix milliseconds.
    pub expires_ms: i64,
}

/// Durable session state. Implemented by every store backend. Every method that names a session
/// takes its owner and the current time: a session is found only by its owner, before both of
/// its expiries. Anything else behaves exactly like an unknown session.
pub trait SessionStore: Send + Sync + std::fmt::Debug + 'static {
    /// Inserts a new session. A digest that already exists is [`StoreError::Conflict`].
    fn insert_session(&self, session: NewSession) -> StoreFuture<'_, ()>;

    /// The live session with `digest` owned by `owner`, marking it used at `now_ms` (which
    /// restarts its idle timeout): one statement.
    fn touch_session(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        now_ms: i64,
    ) -> StoreFuture<'_, Option<LiveSession>>;

    /// Sets the session's log level; `false` when there is no such live session.
    fn set_session_log_level(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        level: &str,
        now_ms: i64,
    ) -> StoreFuture<'_, bool>;

    /// Adds a resource subscription (idempotent); `false` when there is no such live session.
    /// More than [`MAX_SESSION_SUBSCRIPTIONS`] is [`StoreError::InvalidRecord`].
    fn subscribe_session(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        uri: &str,
        now_ms: i64,
    ) -> StoreFuture<'_, bool>;

    /// Removes a resource subscription (idempotent); `false` when there is no such live session.
    fn unsubscribe_session(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        uri: &str,
        now_ms: i64,
    ) -> StoreFuture<'_, bool>;

    /// The session's subscriptions, sorted; `None` when there is no such live session.
    fn session_subscriptions(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        now_ms: i64,
    ) -> StoreFuture<'_, Option<Vec<String>>>;

    /// Deletes the session (and its subscriptions) if `owner` owns it; `false` otherwise.
    fn delete_session(&self, digest: [u8; 32], owner: &SessionOwner) -> StoreFuture<'_, bool>;

    /// Deletes at most `limit` sessions dead at `now_ms`; returns how many.
    fn purge_sessions(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64>;
}

pub(crate) fn check_uri(uri: &str) -> Result<(), StoreError> {
    if uri.is_empty() || uri.len() > MAX_SUBSCRIPTION_URI_BYTES {
        return Err(StoreError::InvalidRecord { reason: "a subscription URI must be 1..=2048 bytes" });
    }
    Ok(())
}

pub(crate) fn check_level(level: &str) -> Result<(), StoreError> {
    if level.is_empty() || level.len() > 16 {
        return Err(StoreError::InvalidRecord { reason: "a log level must be 1..=16 bytes" });
    }
    Ok(())
}

/// The columns a touch returns, in order.
pub(crate) type LiveRow = (String, String, Option<String>, Option<String>, i64, i64, i64);

pub(crate) fn decode_live(row: LiveRow) -> LiveSession {
    let (protocol_version, client_capabilities, client_info, log_level, created_ms, last_seen_ms, expires_ms) = row;
    LiveSession { protocol_version, client_capabilities, client_info, log_level, created_ms, last_seen_ms, expires_ms }
}

/// The statements both backends run, with `$n` placeholders (SQLite gets them as `?n`). `$1`..`$5`
/// are always digest, subject key, tenant, client and now.
pub(crate) mod sql {
    use crate::backend::Statement;

    /// The owner-and-liveness condition on `sessions`.
    macro_rules! live {
        () => {
            "session_digest = $1 AND subject_key = $2 AND tenant_id = $3 AND client_id = $4 \
             AND expires_ms > $5 AND last_seen_ms + idle_ms > $5"
        };
    }
    pub static INSERT: Statement = Statement::new(
        "INSERT INTO sessions (session_digest, subject_key, tenant_id, client_id, \
        protocol_version, client_capabilities, client_info, created_ms, last_seen_ms, idle_ms, expires_ms) \
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $10)",
    );
    pub static TOUCH: Statement = Statement::new(concat!(
        "UPDATE sessions SET last_seen_ms = CASE WHEN last_seen_ms < $5 THEN $5 ELSE last_seen_ms END WHERE ",
        live!(),
        " RETURNING protocol_version, client_capabilities, client_info, log_level, created_ms, last_seen_ms, expires_ms"
    ));
    pub static SET_LEVEL: Statement = Statement::new(concat!("UPDATE sessions SET log_level = $6 WHERE ", live!()));
    pub static COUNT_SUBSCRIPTIONS: Statement =
        Statement::new("SELECT count(*) FROM session_subscriptions WHERE session_digest = $1");
    pub static SUBSCRIBE: Statement = Statement::new(concat!(
        "INSERT INTO session_subscriptions (session_digest, uri) SELECT session_digest, $6 FROM sessions WHERE ",
        live!(),
        " ON CONFLICT DO NOTHING"
    ));
    pub static UNSUBSCRIBE: Statement = Statement::new(concat!(
        "DELETE FROM session_subscriptions WHERE uri = $6 AND session_digest IN (SELECT session_digest FROM sessions WHERE ",
        live!(),
        ")"
    ));
    pub static SUBSCRIPTIONS: Statement =
        Statement::new("SELECT uri FROM session_subscriptions WHERE session_digest = $1 ORDER BY uri");
    pub static DELETE: Statement = Statement::new(
        "DELETE FROM sessions WHERE session_digest = $1 AND subject_key = $2 AND tenant_id = $3 AND client_id = $4",
    );
    // Subscriptions go with their session (ON DELETE CASCADE).
    pub static PURGE: Statement = Statement::new(
        "DELETE FROM sessions WHERE session_digest IN (SELECT session_digest FROM sessions \
        WHERE expires_ms <= $1 OR last_seen_ms + idle_ms <= $1 LIMIT $2)",
    );
}

/// The session statements of one backend, for the [`SessionStore`] implementation below.
struct Sessions<'a, B>(&'a B);

impl<B> Sessions<'_, B>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<String>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> LiveRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <B::Db as Database>::Row>,
{
    async fn touch_inner(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        now_ms: i64,
    ) -> Result<Option<LiveSession>, StoreError> {
        let row: Option<LiveRow> = sqlx::query_as(B::sql(&sql::TOUCH))
            .bind(digest.to_vec())
            .bind(owner.subject_key.to_vec())
            .bind(owner.tenant.as_str())
            .bind(owner.client.as_str())
            .bind(now_ms)
            .fetch_optional(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("touch_session", error))?;
        Ok(row.map(decode_live))
    }

    /// Runs one session statement whose `$6` is `text`; returns rows affected.
    async fn session_statement(
        &self,
        statement: &'static str,
        during: &'static str,
        digest: [u8; 32],
        owner: &SessionOwner,
        now_ms: i64,
        text: &str,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(statement)
            .bind(digest.to_vec())
            .bind(owner.subject_key.to_vec())
            .bind(owner.tenant.as_str())
            .bind(owner.client.as_str())
            .bind(now_ms)
            .bind(text)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx(during, error))?;
        Ok(B::rows_affected(&done))
    }

    async fn subscribe_inner(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        uri: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        check_uri(uri)?;
        if self.touch_inner(digest, owner, now_ms).await?.is_none() {
            return Ok(false);
        }
        let (count,): (i64,) = sqlx::query_as(B::sql(&sql::COUNT_SUBSCRIPTIONS))
            .bind(digest.to_vec())
            .fetch_one(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("subscribe_session", error))?;
        if usize::try_from(count).unwrap_or(usize::MAX) >= MAX_SESSION_SUBSCRIPTIONS {
            return Err(StoreError::InvalidRecord { reason: "a session may hold at most 256 subscriptions" });
        }
        self.session_statement(B::sql(&sql::SUBSCRIBE), "subscribe_session", digest, owner, now_ms, uri).await?;
        Ok(true)
    }

    async fn subscriptions_inner(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        now_ms: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        if self.touch_inner(digest, owner, now_ms).await?.is_none() {
            return Ok(None);
        }
        let rows: Vec<(String,)> = sqlx::query_as(B::sql(&sql::SUBSCRIPTIONS))
            .bind(digest.to_vec())
            .fetch_all(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx("session_subscriptions", error))?;
        Ok(Some(rows.into_iter().map(|(uri,)| uri).collect()))
    }
}

/// [`SessionStore`] for every backend, from the shared statements (one text for both).
impl<B> SessionStore for B
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<String>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> LiveRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <B::Db as Database>::Row>,
{
    fn insert_session(&self, session: NewSession) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            session.validate()?;
            sqlx::query(B::sql(&sql::INSERT))
                .bind(session.digest.to_vec())
                .bind(session.owner.subject_key.to_vec())
                .bind(session.owner.tenant)
                .bind(session.owner.client)
                .bind(session.protocol_version)
                .bind(session.client_capabilities)
                .bind(session.client_info)
                .bind(session.created_ms)
                .bind(session.idle_ms)
                .bind(session.expires_ms)
                .execute(self.writer())
                .await
                .map_err(|error| StoreError::from_sqlx("insert_session", error))?;
            Ok(())
        })
    }

    fn touch_session(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        now_ms: i64,
    ) -> StoreFuture<'_, Option<LiveSession>> {
        let owner = owner.clone();
        Box::pin(async move { Sessions(self).touch_inner(digest, &owner, now_ms).await })
    }

    fn set_session_log_level(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        level: &str,
        now_ms: i64,
    ) -> StoreFuture<'_, bool> {
        let (owner, level) = (owner.clone(), level.to_owned());
        Box::pin(async move {
            check_level(&level)?;
            let sql = B::sql(&sql::SET_LEVEL);
            Ok(Sessions(self).session_statement(sql, "set_session_log_level", digest, &owner, now_ms, &level).await?
                > 0)
        })
    }

    fn subscribe_session(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        uri: &str,
        now_ms: i64,
    ) -> StoreFuture<'_, bool> {
        let (owner, uri) = (owner.clone(), uri.to_owned());
        Box::pin(async move { Sessions(self).subscribe_inner(digest, &owner, &uri, now_ms).await })
    }

    fn unsubscribe_session(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        uri: &str,
        now_ms: i64,
    ) -> StoreFuture<'_, bool> {
        let (owner, uri) = (owner.clone(), uri.to_owned());
        Box::pin(async move {
            check_uri(&uri)?;
            if Sessions(self).touch_inner(digest, &owner, now_ms).await?.is_none() {
                return Ok(false);
            }
            let sql = B::sql(&sql::UNSUBSCRIBE);
            Sessions(self).session_statement(sql, "unsubscribe_session", digest, &owner, now_ms, &uri).await?;
            Ok(true)
        })
    }

    fn session_subscriptions(
        &self,
        digest: [u8; 32],
        owner: &SessionOwner,
        now_ms: i64,
    ) -> StoreFuture<'_, Option<Vec<String>>> {
        let owner = owner.clone();
        Box::pin(async move { Sessions(self).subscriptions_inner(digest, &owner, now_ms).await })
    }

    fn delete_session(&self, digest: [u8; 32], owner: &SessionOwner) -> StoreFuture<'_, bool> {
        let owner = owner.clone();
        Box::pin(async move {
            let done = sqlx::query(B::sql(&sql::DELETE))
                .bind(digest.to_vec())
                .bind(owner.subject_key.to_vec())
                .bind(owner.tenant)
                .bind(owner.client)
                .execute(self.writer())
                .await
                .map_err(|error| StoreError::from_sqlx("delete_session", error))?;
            Ok(B::rows_affected(&done) > 0)
        })
    }

    fn purge_sessions(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let done = sqlx::query(B::sql(&sql::PURGE))
                .bind(now_ms)
                .bind(i64::from(limit))
                .execute(self.writer())
                .await
                .map_err(|error| StoreError::from_sqlx("purge_sessions", error))?;
            Ok(B::rows_affected(&done))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NewSession {
        NewSession {
            digest: [1; 32],
            owner: SessionOwner { subject_key: [2; 32], tenant: String::new(), client: "c".into() },
            protocol_version: "2025-11-25".into(),
            client_capabilities: "{}".into(),
            client_info: Some(r#"{"name":"x","version":"1"}"#.into()),
            created_ms: 10,
            idle_ms: 5,
            expires_ms: 20,
        }
    }

    #[test]
    fn validation_refuses_each_broken_field() {
        assert!(sample().validate().is_ok());
        let cases: Vec<fn(&mut NewSession)> = vec![
            |s| s.owner.tenant = "x".repeat(513),
            |s| s.protocol_version.clear(),
            |s| s.client_capabilities = "[]".into(),
            |s| s.client_capabilities = "not json".into(),
            |s| s.client_info = Some("1".into()),
            |s| s.idle_ms = 0,
            |s| s.expires_ms = s.created_ms,
            |s| s.created_ms = -1,
        ];
        for (index, break_it) in cases.into_iter().enumerate() {
            let mut session = sample();
            break_it(&mut session);
            assert!(matches!(session.validate(), Err(StoreError::InvalidRecord { .. })), "case {index}");
        }
    }
}
