//! `StoreError`: every way a store operation can fail, and the one place sqlx errors are sorted
//! into those kinds. Display texts are fixed phrases: never SQL, never a connection string.

use std::error::Error as StdError;
use std::sync::Arc;

/// The underlying cause, kept for operators' logs (`source()`), shared so the error can be cloned
/// to every waiter of a failed batch.
pub type ErrorSource = Arc<dyn StdError + Send + Sync + 'static>;

/// Why a store operation failed. Every variant means "nothing was written" for an append (a batch
/// is one transaction), so callers on the request path refuse the request: fail closed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached or used right now: connecting failed, the pool timed out or is
    /// closed, an I/O error, the database is shutting down, a lock was not granted in time, or the
    /// commit did not finish within the writer's timeout. Retrying later may succeed.
    #[error("store unavailable during {during}")]
    Unavailable {
        /// The operation that failed, e.g. `"append"`.
        during: &'static str,
        /// The driver's error, if any.
        #[source]
        source: Option<ErrorSource>,
    },
    /// A write lost a race that the store's serialization should have prevented (unique key
    /// violation, serialization failure, deadlock). Nothing was written; retrying may succeed.
    #[error("store write conflict during {during}")]
    Conflict {
        /// The operation that failed.
        during: &'static str,
        /// The driver's error.
        #[source]
        source: Option<ErrorSource>,
    },
    /// Stored data does not decode or breaks an invariant the schema should guarantee (the chain
    /// head row is missing, a column has an impossible value, the file is not a database).
    /// Tampering with records is *not* reported this way: `verify_chain` reports it in its
    /// [`ChainReport`](crate::ChainReport).
    #[error("store data is corrupt: {what}")]
    Corrupt {
        /// What is wrong, in a fixed phrase (may name a sequence number).
        what: String,
        /// The driver's error, if any.
        #[source]
        source: Option<ErrorSource>,
    },
    /// The schema could not be brought to this version: an applied migration was modified or is
    /// unknown to this binary (a newer binary migrated the database), or a migration failed.
    #[error("store schema migration failed")]
    Migration {
        /// The migrator's error.
        #[source]
        source: Option<ErrorSource>,
    },
    /// The store URL or options are unusable (unsupported scheme, unparseable URL). The text names
    /// at most the scheme, never the URL (it may hold a password).
    #[error("store configuration rejected: {reason}")]
    Config {
        /// What is wrong.
        reason: String,
    },
    /// A record this store refuses to write (see [`AuditRecord::validate`](crate::AuditRecord::validate)).
    /// Nothing of its batch was written.
    #[error("record rejected: {reason}")]
    InvalidRecord {
        /// Which rule the record broke.
        reason: &'static str,
    },
    /// The database refused an operation for a reason none of the other variants covers (e.g. a
    /// missing table after someone dropped it).
    #[error("store database error during {during}")]
    Backend {
        /// The operation that failed.
        during: &'static str,
        /// The driver's error.
        #[source]
        source: Option<ErrorSource>,
    },
    /// The [`AuditWriter`](crate::AuditWriter) has shut down (or its task died); the record was
    /// not written.
    #[error("audit writer has shut down")]
    Closed,
}

impl StoreError {
    /// `Unavailable` without an underlying driver error.
    pub(crate) fn unavailable(during: &'static str) -> Self {
        StoreError::Unavailable { during, source: None }
    }

    /// `Unavailable` caused by a file-system error (the audit segment).
    pub(crate) fn from_io(during: &'static str, error: std::io::Error) -> Self {
        StoreError::Unavailable { during, source: Some(Arc::new(error)) }
    }

    /// `Corrupt` without an underlying driver error.
    pub(crate) fn corrupt(what: impl Into<String>) -> Self {
        StoreError::Corrupt { what: what.into(), source: None }
    }

    /// Sorts a sqlx error into a kind. `during` names the operation for the Display text.
    pub(crate) fn from_sqlx(during: &'static str, error: sqlx::Error) -> Self {
        Self::of_kind(classify(&error), during, Arc::new(error))
    }

    fn of_kind(kind: Kind, during: &'static str, source: ErrorSource) -> Self {
        let source = Some(source);
        match kind {
            Kind::Unavailable => StoreError::Unavailable { during, source },
            Kind::Conflict => StoreError::Conflict { during, source },
            Kind::Corrupt => StoreError::Corrupt { what: format!("unexpected stored data during {during}"), source },
            // Configuration errors are dropped on purpose: their text may quote the URL.
            Kind::Config => StoreError::Config { reason: format!("the driver rejected the options during {during}") },
            Kind::Backend => StoreError::Backend { during, source },
        }
    }

    /// Sorts a rusqlite error (the synchronous SQLite paths) into the same kinds as sqlx's.
    pub(crate) fn from_rusqlite(during: &'static str, error: rusqlite::Error) -> Self {
        let kind = match &error {
            rusqlite::Error::SqliteFailure(failure, _) => match failure.extended_code {
                // SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE
                1555 | 2067 => Kind::Conflict,
                code => classify_sqlite(code),
            },
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::InvalidColumnIndex(_)
            | rusqlite::Error::Utf8Error(..) => Kind::Corrupt,
            _ => Kind::Backend,
        };
        Self::of_kind(kind, during, Arc::new(error))
    }

    /// Sorts a migration error: a connection failure while migrating is `Unavailable`, anything
    /// else (modified or unknown migrations, failing SQL) is `Migration`.
    pub(crate) fn from_migrate(error: sqlx::migrate::MigrateError) -> Self {
        use sqlx::migrate::MigrateError;
        let connection_failure = match &error {
            MigrateError::Execute(inner) => classify(inner) == Kind::Unavailable,
            _ => false,
        };
        if connection_failure {
            StoreError::Unavailable { during: "migrate", source: Some(Arc::new(error)) }
        } else {
            StoreError::Migration { source: Some(Arc::new(error)) }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Unavailable,
    Conflict,
    Corrupt,
    Config,
    Backend,
}

fn classify(error: &sqlx::Error) -> Kind {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => Kind::Unavailable,
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => Kind::Config,
        sqlx::Error::RowNotFound
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_) => Kind::Corrupt,
        sqlx::Error::Database(database) => classify_database(database.as_ref()),
        sqlx::Error::Migrate(inner) => match inner.as_ref() {
            sqlx::migrate::MigrateError::Execute(inner) => classify(inner),
            _ => Kind::Backend,
        },
        _ => Kind::Backend,
    }
}

fn classify_database(error: &dyn sqlx::error::DatabaseError) -> Kind {
    if error.is_unique_violation() {
        return Kind::Conflict;
    }
    let Some(code) = error.code() else { return Kind::Backend };
    if let Ok(sqlite_code) = code.parse::<i32>() {
        return classify_sqlite(sqlite_code);
    }
    classify_sqlstate(&code)
}

/// SQLite result codes (extended codes carry the primary code in the low byte).
fn classify_sqlite(code: i32) -> Kind {
    match code & 0xff {
        // BUSY, LOCKED: still contended after busy_timeout. NOMEM, READONLY, IOERR, FULL, CANTOPEN,
        // PROTOCOL, AUTH: the file cannot be used right now.
        5 | 6 | 7 | 8 | 10 | 13 | 14 | 15 | 23 => Kind::Unavailable,
        // CORRUPT, NOTADB.
        11 | 26 => Kind::Corrupt,
        // CONSTRAINT other than unique (handled above): data that the schema refuses.
        19 => Kind::Corrupt,
        _ => Kind::Backend,
    }
}

/// PostgreSQL SQLSTATE codes.
fn classify_sqlstate(code: &str) -> Kind {
    match code {
        // serialization_failure, deadlock_detected
        "40001" | "40P01" => Kind::Conflict,
        // admin_shutdown, crash_shutdown, cannot_connect_now, query_canceled (statement_timeout),
        // lock_not_available, idle_in_transaction_session_timeout, read_only_sql_transaction
        "57P01" | "57P02" | "57P03" | "57014" | "55P03" | "25P03" | "25006" => Kind::Unavailable,
        // connection exceptions (08), insufficient resources (53), operator intervention (57),
        // system errors (58), invalid authorization (28), unknown database (3D)
        _ if ["08", "53", "57", "58", "28", "3D"].iter().any(|class| code.starts_with(class)) => Kind::Unavailable,
        // data corrupted (XX001, XX002)
        "XX001" | "XX002" => Kind::Corrupt,
        _ => Kind::Backend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_and_io_failures_are_unavailable() {
        let timed_out = StoreError::from_sqlx("append", sqlx::Error::PoolTimedOut);
        assert!(matches!(timed_out, StoreError::Unavailable { during: "append", .. }));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(matches!(StoreError::from_sqlx("ping", sqlx::Error::Io(refused)), StoreError::Unavailable { .. }));
    }

    #[test]
    fn configuration_errors_do_not_keep_the_driver_text() {
        let secret = "postgres://user:hunter2@db/x";
        let error = StoreError::from_sqlx("open", sqlx::Error::Configuration(secret.into()));
        assert!(matches!(error, StoreError::Config { .. }));
        assert!(!format!("{error} {error:?}").contains("hunter2"));
    }

    #[test]
    fn sqlstate_classes() {
        assert_eq!(classify_sqlstate("08006"), Kind::Unavailable);
        assert_eq!(classify_sqlstate("57P01"), Kind::Unavailable);
        assert_eq!(classify_sqlstate("40001"), Kind::Conflict);
        assert_eq!(classify_sqlstate("42P01"), Kind::Backend);
        assert_eq!(classify_sqlite(5), Kind::Unavailable);
        assert_eq!(classify_sqlite(14), Kind::Unavailable);
        assert_eq!(classify_sqlite(26), Kind::Corrupt);
    }

    #[test]
    fn errors_clone_with_their_source() {
        let error = StoreError::from_sqlx("append", sqlx::Error::PoolClosed);
        let copy = error.clone();
        assert!(std::error::Error::source(&copy).is_some());
        assert_eq!(error.to_string(), "store unavailable during append");
    }
}
