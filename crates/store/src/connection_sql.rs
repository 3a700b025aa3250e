//! The connection store's rows and statements, written once with `$n` placeholders (SQLite gets
//! them as `?n`), and the [`ConnectionStore`](crate::ConnectionStore) implementation both backends
//! share.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::StoreError;
use crate::backend::Backend;
use crate::connections::{ApprovedClient, ConnectionRow, ConnectionStore};
use crate::store::StoreFuture;

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
    use crate::backend::Statement;

    macro_rules! connection_columns {
        () => {
            "principal_key, upstream, principal, issuer, client_id, scopes, sealed, version, created_ms, updated_ms, \
             expires_ms"
        };
    }
    /// Inserts at version 1, or replaces all but `created_ms` and bumps the version.
    pub static PUT: Statement = Statement::new(concat!(
        "INSERT INTO oauth_connections (",
        connection_columns!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8, $9, $10) \
         ON CONFLICT (principal_key, upstream) DO UPDATE SET principal = excluded.principal, \
         issuer = excluded.issuer, client_id = excluded.client_id, scopes = excluded.scopes, \
         sealed = excluded.sealed, version = oauth_connections.version + 1, updated_ms = excluded.updated_ms, \
         expires_ms = excluded.expires_ms"
    ));
    /// The compare-and-swap: only from version `$10`.
    pub static REPLACE: Statement = Statement::new(
        "UPDATE oauth_connections SET principal = $3, issuer = $4, client_id = $5, \
        scopes = $6, sealed = $7, version = version + 1, updated_ms = $8, expires_ms = $9 \
        WHERE principal_key = $1 AND upstream = $2 AND version = $10",
    );
    pub static ONE: Statement = Statement::new(concat!(
        "SELECT ",
        connection_columns!(),
        " FROM oauth_connections WHERE principal_key = $1 AND upstream = $2"
    ));
    pub static OF_PRINCIPAL: Statement = Statement::new(concat!(
        "SELECT ",
        connection_columns!(),
        " FROM oauth_connections WHERE principal_key = $1 ORDER BY created_ms DESC, upstream LIMIT $2"
    ));
    pub static ALL: Statement = Statement::new(concat!(
        "SELECT ",
        connection_columns!(),
        " FROM oauth_connections ORDER BY created_ms DESC, principal_key, upstream LIMIT $1"
    ));
    pub static DELETE: Statement =
        Statement::new("DELETE FROM oauth_connections WHERE principal_key = $1 AND upstream = $2");
    pub static DELETE_OF_PRINCIPAL: Statement =
        Statement::new("DELETE FROM oauth_connections WHERE principal_key = $1");

    pub static APPROVE: Statement = Statement::new(
        "INSERT INTO oauth_client_approvals (principal_key, upstream, client_id, approved_ms) \
        VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
    );
    pub static APPROVED: Statement = Statement::new(
        "SELECT 1 FROM oauth_client_approvals WHERE principal_key = $1 AND upstream = $2 AND client_id = $3",
    );
    pub static APPROVALS_OF_PRINCIPAL: Statement = Statement::new(
        "SELECT principal_key, upstream, client_id, approved_ms \
        FROM oauth_client_approvals WHERE principal_key = $1 ORDER BY approved_ms DESC, upstream, client_id LIMIT $2",
    );
    pub static APPROVALS: Statement = Statement::new(
        "SELECT principal_key, upstream, client_id, approved_ms FROM oauth_client_approvals \
        ORDER BY approved_ms DESC, principal_key, upstream, client_id LIMIT $1",
    );
    pub static REVOKE: Statement = Statement::new(
        "DELETE FROM oauth_client_approvals WHERE principal_key = $1 AND upstream = $2 AND client_id = $3",
    );

    /// An existing digest is kept (no row affected).
    pub static PUT_FLOW: Statement = Statement::new(
        "INSERT INTO oauth_flows (id_digest, kind, body, expires_ms) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
    );
    pub static FLOW: Statement =
        Statement::new("SELECT body FROM oauth_flows WHERE id_digest = $1 AND kind = $2 AND expires_ms > $3");
    /// Deletes the flow whatever its expiry (the caller checks it), so an expired one is gone too.
    pub static TAKE_FLOW: Statement =
        Statement::new("DELETE FROM oauth_flows WHERE id_digest = $1 AND kind = $2 RETURNING body, expires_ms");
    pub static PURGE_FLOWS: Statement = Statement::new(
        "DELETE FROM oauth_flows WHERE id_digest IN \
        (SELECT id_digest FROM oauth_flows WHERE expires_ms <= $1 LIMIT $2)",
    );

    pub static PUT_CLIENT: Statement = Statement::new(
        "INSERT INTO oauth_clients (issuer, redirect_uri, body, registered_ms) \
        VALUES ($1, $2, $3, $4) ON CONFLICT (issuer, redirect_uri) DO UPDATE SET body = excluded.body, \
        registered_ms = excluded.registered_ms",
    );
    pub static CLIENT: Statement =
        Statement::new("SELECT body FROM oauth_clients WHERE issuer = $1 AND redirect_uri = $2");
}

/// The connection statements of one backend, for the [`ConnectionStore`] implementation below.
struct Connections<'a, B>(&'a B);

impl<B> Connections<'_, B>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<i64>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> ConnectionTuple: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> ApprovalTuple: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i32,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i64): FromRow<'r, <B::Db as Database>::Row>,
{
    async fn put_connection_inner(self, row: crate::ConnectionRow) -> Result<(), StoreError> {
        row.validate()?;
        sqlx::query(B::sql(&sql::PUT))
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
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("put_connection", error))?;
        Ok(())
    }

    async fn connection_inner(
        self,
        principal_key: [u8; 32],
        upstream: String,
    ) -> Result<Option<crate::ConnectionRow>, StoreError> {
        crate::connections::check_upstream(&upstream)?;
        let row: Option<ConnectionTuple> = sqlx::query_as(B::sql(&sql::ONE))
            .bind(principal_key.to_vec())
            .bind(upstream)
            .fetch_optional(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx("connection", error))?;
        row.map(decode_connection).transpose()
    }

    async fn replace_connection_inner(
        self,
        row: crate::ConnectionRow,
        expected_version: i64,
    ) -> Result<bool, StoreError> {
        row.validate()?;
        crate::connections::check_expected_version(expected_version)?;
        let done = sqlx::query(B::sql(&sql::REPLACE))
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
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("replace_connection", error))?;
        Ok(B::rows_affected(&done) == 1)
    }

    async fn connections_inner(
        self,
        principal_key: Option<[u8; 32]>,
        limit: u32,
    ) -> Result<Vec<crate::ConnectionRow>, StoreError> {
        let limit = i64::from(limit.min(crate::MAX_CONNECTION_LIST));
        let rows: Vec<ConnectionTuple> = match principal_key {
            Some(principal_key) => {
                sqlx::query_as(B::sql(&sql::OF_PRINCIPAL))
                    .bind(principal_key.to_vec())
                    .bind(limit)
                    .fetch_all(self.0.reader())
                    .await
            }
            None => sqlx::query_as(B::sql(&sql::ALL)).bind(limit).fetch_all(self.0.reader()).await,
        }
        .map_err(|error| StoreError::from_sqlx("connections", error))?;
        rows.into_iter().map(decode_connection).collect()
    }

    async fn delete_connection_inner(self, principal_key: [u8; 32], upstream: String) -> Result<bool, StoreError> {
        crate::connections::check_upstream(&upstream)?;
        let done = sqlx::query(B::sql(&sql::DELETE))
            .bind(principal_key.to_vec())
            .bind(upstream)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("delete_connection", error))?;
        Ok(B::rows_affected(&done) == 1)
    }

    async fn delete_connections_of_inner(self, principal_key: [u8; 32]) -> Result<u64, StoreError> {
        let done = sqlx::query(B::sql(&sql::DELETE_OF_PRINCIPAL))
            .bind(principal_key.to_vec())
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("delete_connections_of", error))?;
        Ok(B::rows_affected(&done))
    }

    async fn approve_client_inner(
        self,
        principal_key: [u8; 32],
        upstream: String,
        client_id: String,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        crate::connections::check_upstream(&upstream)?;
        crate::connections::check_client_id(&client_id)?;
        crate::connections::check_time(now_ms)?;
        sqlx::query(B::sql(&sql::APPROVE))
            .bind(principal_key.to_vec())
            .bind(upstream)
            .bind(client_id)
            .bind(now_ms)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("approve_client", error))?;
        Ok(())
    }

    async fn client_approved_inner(
        self,
        principal_key: [u8; 32],
        upstream: String,
        client_id: String,
    ) -> Result<bool, StoreError> {
        crate::connections::check_upstream(&upstream)?;
        crate::connections::check_client_id(&client_id)?;
        let found: Option<(i32,)> = sqlx::query_as(B::sql(&sql::APPROVED))
            .bind(principal_key.to_vec())
            .bind(upstream)
            .bind(client_id)
            .fetch_optional(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx("client_approved", error))?;
        Ok(found.is_some())
    }

    async fn approved_clients_inner(
        self,
        principal_key: Option<[u8; 32]>,
        limit: u32,
    ) -> Result<Vec<crate::ApprovedClient>, StoreError> {
        let limit = i64::from(limit.min(crate::MAX_CONNECTION_LIST));
        let rows: Vec<ApprovalTuple> = match principal_key {
            Some(principal_key) => {
                sqlx::query_as(B::sql(&sql::APPROVALS_OF_PRINCIPAL))
                    .bind(principal_key.to_vec())
                    .bind(limit)
                    .fetch_all(self.0.reader())
                    .await
            }
            None => sqlx::query_as(B::sql(&sql::APPROVALS)).bind(limit).fetch_all(self.0.reader()).await,
        }
        .map_err(|error| StoreError::from_sqlx("approved_clients", error))?;
        rows.into_iter().map(decode_approval).collect()
    }

    async fn revoke_client_inner(
        self,
        principal_key: [u8; 32],
        upstream: String,
        client_id: String,
    ) -> Result<bool, StoreError> {
        crate::connections::check_upstream(&upstream)?;
        crate::connections::check_client_id(&client_id)?;
        let done = sqlx::query(B::sql(&sql::REVOKE))
            .bind(principal_key.to_vec())
            .bind(upstream)
            .bind(client_id)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("revoke_client", error))?;
        Ok(B::rows_affected(&done) == 1)
    }

    async fn put_flow_inner(
        self,
        id_digest: [u8; 32],
        kind: String,
        body: String,
        expires_ms: i64,
    ) -> Result<(), StoreError> {
        crate::connections::check_kind(&kind)?;
        crate::connections::check_body(&body)?;
        crate::connections::check_time(expires_ms)?;
        let done = sqlx::query(B::sql(&sql::PUT_FLOW))
            .bind(id_digest.to_vec())
            .bind(kind)
            .bind(body)
            .bind(expires_ms)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("put_flow", error))?;
        if B::rows_affected(&done) != 1 {
            return Err(StoreError::InvalidRecord { reason: "a pending flow with this digest exists already" });
        }
        Ok(())
    }

    async fn flow_inner(self, id_digest: [u8; 32], kind: String, now_ms: i64) -> Result<Option<String>, StoreError> {
        crate::connections::check_kind(&kind)?;
        let row: Option<(String,)> = sqlx::query_as(B::sql(&sql::FLOW))
            .bind(id_digest.to_vec())
            .bind(kind)
            .bind(now_ms)
            .fetch_optional(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx("flow", error))?;
        Ok(row.map(|(body,)| body))
    }

    async fn take_flow_inner(
        self,
        id_digest: [u8; 32],
        kind: String,
        now_ms: i64,
    ) -> Result<Option<String>, StoreError> {
        crate::connections::check_kind(&kind)?;
        let row: Option<(String, i64)> = sqlx::query_as(B::sql(&sql::TAKE_FLOW))
            .bind(id_digest.to_vec())
            .bind(kind)
            .fetch_optional(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("take_flow", error))?;
        Ok(row.and_then(|(body, expires_ms)| (expires_ms > now_ms).then_some(body)))
    }

    async fn purge_flows_inner(self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(B::sql(&sql::PURGE_FLOWS))
            .bind(now_ms)
            .bind(i64::from(limit))
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("purge_flows", error))?;
        Ok(B::rows_affected(&done))
    }

    async fn put_oauth_client_inner(
        self,
        issuer: String,
        redirect_uri: String,
        body: String,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        crate::connections::check_registration_key(&issuer, &redirect_uri)?;
        crate::connections::check_body(&body)?;
        crate::connections::check_time(now_ms)?;
        sqlx::query(B::sql(&sql::PUT_CLIENT))
            .bind(issuer)
            .bind(redirect_uri)
            .bind(body)
            .bind(now_ms)
            .execute(self.0.writer())
            .await
            .map_err(|error| StoreError::from_sqlx("put_oauth_client", error))?;
        Ok(())
    }

    async fn oauth_client_inner(self, issuer: String, redirect_uri: String) -> Result<Option<String>, StoreError> {
        crate::connections::check_registration_key(&issuer, &redirect_uri)?;
        let row: Option<(String,)> = sqlx::query_as(B::sql(&sql::CLIENT))
            .bind(issuer)
            .bind(redirect_uri)
            .fetch_optional(self.0.reader())
            .await
            .map_err(|error| StoreError::from_sqlx("oauth_client", error))?;
        Ok(row.map(|(body,)| body))
    }
}

/// [`ConnectionStore`] for every backend, from the shared statements (one text for both).
impl<B> ConnectionStore for B
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> Vec<u8>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> i64: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> String: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> Option<i64>: Encode<'q, B::Db> + Type<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + Type<B::Db>,
    for<'r> ConnectionTuple: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> ApprovalTuple: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i32,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i64): FromRow<'r, <B::Db as Database>::Row>,
{
    fn put_connection(&self, row: &crate::ConnectionRow) -> StoreFuture<'_, ()> {
        Box::pin(Connections(self).put_connection_inner(row.clone()))
    }

    fn connection(&self, principal_key: [u8; 32], upstream: &str) -> StoreFuture<'_, Option<crate::ConnectionRow>> {
        Box::pin(Connections(self).connection_inner(principal_key, upstream.to_owned()))
    }

    fn replace_connection(&self, row: &crate::ConnectionRow, expected_version: i64) -> StoreFuture<'_, bool> {
        Box::pin(Connections(self).replace_connection_inner(row.clone(), expected_version))
    }

    fn connections(&self, principal_key: Option<[u8; 32]>, limit: u32) -> StoreFuture<'_, Vec<crate::ConnectionRow>> {
        Box::pin(Connections(self).connections_inner(principal_key, limit))
    }

    fn delete_connection(&self, principal_key: [u8; 32], upstream: &str) -> StoreFuture<'_, bool> {
        Box::pin(Connections(self).delete_connection_inner(principal_key, upstream.to_owned()))
    }

    fn delete_connections_of(&self, principal_key: [u8; 32]) -> StoreFuture<'_, u64> {
        Box::pin(Connections(self).delete_connections_of_inner(principal_key))
    }

    fn approve_client(
        &self,
        principal_key: [u8; 32],
        upstream: &str,
        client_id: &str,
        now_ms: i64,
    ) -> StoreFuture<'_, ()> {
        Box::pin(Connections(self).approve_client_inner(
            principal_key,
            upstream.to_owned(),
            client_id.to_owned(),
            now_ms,
        ))
    }

    fn client_approved(&self, principal_key: [u8; 32], upstream: &str, client_id: &str) -> StoreFuture<'_, bool> {
        Box::pin(Connections(self).client_approved_inner(principal_key, upstream.to_owned(), client_id.to_owned()))
    }

    fn approved_clients(
        &self,
        principal_key: Option<[u8; 32]>,
        limit: u32,
    ) -> StoreFuture<'_, Vec<crate::ApprovedClient>> {
        Box::pin(Connections(self).approved_clients_inner(principal_key, limit))
    }

    fn revoke_client(&self, principal_key: [u8; 32], upstream: &str, client_id: &str) -> StoreFuture<'_, bool> {
        Box::pin(Connections(self).revoke_client_inner(principal_key, upstream.to_owned(), client_id.to_owned()))
    }

    fn put_flow(&self, id_digest: [u8; 32], kind: &str, body: &str, expires_ms: i64) -> StoreFuture<'_, ()> {
        Box::pin(Connections(self).put_flow_inner(id_digest, kind.to_owned(), body.to_owned(), expires_ms))
    }

    fn flow(&self, id_digest: [u8; 32], kind: &str, now_ms: i64) -> StoreFuture<'_, Option<String>> {
        Box::pin(Connections(self).flow_inner(id_digest, kind.to_owned(), now_ms))
    }

    fn take_flow(&self, id_digest: [u8; 32], kind: &str, now_ms: i64) -> StoreFuture<'_, Option<String>> {
        Box::pin(Connections(self).take_flow_inner(id_digest, kind.to_owned(), now_ms))
    }

    fn purge_flows(&self, now_ms: i64, limit: u32) -> StoreFuture<'_, u64> {
        Box::pin(Connections(self).purge_flows_inner(now_ms, limit))
    }

    fn put_oauth_client(&self, issuer: &str, redirect_uri: &str, body: &str, now_ms: i64) -> StoreFuture<'_, ()> {
        Box::pin(Connections(self).put_oauth_client_inner(
            issuer.to_owned(),
            redirect_uri.to_owned(),
            body.to_owned(),
            now_ms,
        ))
    }

    fn oauth_client(&self, issuer: &str, redirect_uri: &str) -> StoreFuture<'_, Option<String>> {
        Box::pin(Connections(self).oauth_client_inner(issuer.to_owned(), redirect_uri.to_owned()))
    }
}
