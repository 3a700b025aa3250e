//! Durable storage behind traits: the hash-chained audit log ([`AuditStore`]: one chain per
//! writer, signed [checkpoints](checkpoint) over every chain's head) and explicit
//! application handles ([`HandleStore`]), durable tasks ([`TaskStore`]), 2025-era session state
//! ([`SessionStore`]), single-use records ([`OnceStore`]), a gateway's pins of upstream
//! definitions with their review decisions ([`PinStore`]) and the ledger of delegated
//! capabilities with its single-use approvals ([`DelegationStore`]) and per-user upstream OAuth
//! connections with their consent, pending flows and registrations ([`ConnectionStore`]) on SQLite
//! and PostgreSQL, group commit the request path's writer in front of the log ([`AuditWriter`]: an
//! instance's local [segment](segment) file and its shipper, or group commit), and [`open_store`]
//! choosing a backend from a URL ([`Store`] is every trait at once).
//!
//! **Architecture Invariant:** every audit chain has exactly one writer. Record `seq` of a chain
//! stores `hash = SHA-256(prev_hash || canonical JSON of the record)`; the writer links its own
//! records and the store checks each shipped batch (linked, continuing the stored head), so
//! writers in any number of processes or instances share no row, lock or sequence, no chain forks,
//! and verification finds edits, deletions and reorderings — and, against the signed
//! checkpoints, truncation and chains that disappeared.
//!
//! **API Boundary:** nothing outside this crate sees the store's SQL or sqlx (an application with
//! tables of its own in a SQLite store's file reads them inline through [`InlineSqlite`], with its
//! own SQL); errors are [`StoreError`] with
//! fixed texts (never SQL, never a connection string). Any error from an append means nothing of
//! that batch was written: the request path fails closed.
//!
//! Layers, low to high: `backend`, `error` → `record` → `chain` → `store` → `checkpoint` → `handles`, `once`,
//! `pins` → `audit_query`, `audit_sql`, `connections`, `delegations`, `segment`, `sessions`, `sqlite_sync`,
//! `tasks` → `connection_sql`, `writer` → `postgres`, `sqlite` → `conformance`.

// Tests may unwrap; the library may not (workspace lint `unwrap_used`).
#![cfg_attr(test, allow(clippy::unwrap_used))]

use std::sync::Arc;

/// The `audit_log` column list, in table order, shared by every query of both backends.
macro_rules! audit_columns {
    () => {
        "seq, at_ms, trace_id, stage, decision, operation, principal_digest, tenant_digest, client_digest, \
         scopes, policy_version, code, detail, prev_hash, hash"
    };
}

mod audit_query;
mod audit_sql;
mod backend;
mod chain;
pub mod checkpoint;
#[cfg(any(test, feature = "conformance"))]
#[doc(hidden)]
pub mod conformance;
mod connection_sql;
mod connections;
mod delegations;
mod error;
mod handles;
mod once;
mod pins;
mod postgres;
mod record;
pub mod segment;
mod sessions;
mod sqlite;
mod sqlite_sync;
mod store;
mod tasks;
mod writer;

pub use audit_query::{AuditQuery, ChainRange, MAX_SEARCH};
pub use chain::{
    ChainBreak, ChainBreakKind, ChainHead, ChainReport, CheckpointedHeads, LEGACY_CHAIN, is_chain_id, link,
    new_chain_id,
};
pub use checkpoint::{CheckpointKey, Checkpointer, LogReport, verify_log};
pub use connections::{
    ApprovedClient, ConnectionRow, ConnectionStore, MAX_CONNECTION_LIST, MAX_CONNECTION_SCOPES_BYTES,
    MAX_CONNECTION_SEALED_BYTES, MAX_CONNECTION_TEXT_BYTES, MAX_CONNECTION_UPSTREAM_BYTES, MAX_FLOW_KIND_BYTES,
    MAX_OAUTH_BODY_BYTES,
};
pub use delegations::{
    DelegationRow, DelegationStore, MAX_DELEGATION_AGENT_BYTES, MAX_DELEGATION_BODY_BYTES, MAX_DELEGATION_DEPTH,
    MAX_DELEGATION_LIST, MAX_DELEGATION_TOOL_BUDGETS, MintRefusal, NewDelegation,
};
pub use error::{ErrorSource, StoreError};
pub use handles::{
    HandleOwner, HandleStore, HandleSummary, LiveHandle, MAX_HANDLE_FIELD_BYTES, MAX_HANDLE_LIST, MAX_HANDLE_SCOPES,
    NewHandle, Revocation, RevokeSelector, hex_prefix,
};
pub use once::OnceStore;
pub use pins::{
    MAX_PIN_DEFINITION_BYTES, MAX_PIN_ID_BYTES, MAX_PIN_LIST, MAX_PIN_NOTE_BYTES, MAX_PIN_REVIEWER_BYTES,
    MAX_PIN_SIGNATURE_BYTES, MAX_PIN_TEXT_BYTES, MAX_PIN_UPSTREAM_ID_BYTES, PIN_KINDS, PinDecision, PinObservation,
    PinRow, PinStore, PinVerdict,
};
pub use postgres::{MAX_LOOKUP_CONNECTIONS, PostgresOptions, PostgresStore};
pub use record::{AuditRecord, Decision, GENESIS_HASH, MAX_FIELD_BYTES, MAX_SCOPES, StoredAuditRecord, chain_hash};
/// The SQLite driver [`InlineSqlite`] hands its connections out of.
pub use rusqlite;
pub use sessions::{
    LiveSession, MAX_SESSION_FIELD_BYTES, MAX_SESSION_JSON_BYTES, MAX_SESSION_SUBSCRIPTIONS,
    MAX_SUBSCRIPTION_URI_BYTES, NewSession, SessionOwner, SessionStore,
};
pub use sqlite::SqliteStore;
pub use sqlite_sync::InlineSqlite;
pub use store::{AuditStore, MAX_RECENT, StoreFuture, StoredCheckpoint};
pub use tasks::{MAX_TASK_HISTORY, TaskRow, TaskStatus, TaskStore};
pub use writer::{AuditWriter, AuditWriterConfig, Shipping};

/// Every store trait at once: what [`open_store`] returns. One database holds the audit log and
/// the handles, so an operator backs up, migrates and fails over one thing.
pub trait Store:
    AuditStore + HandleStore + TaskStore + SessionStore + OnceStore + PinStore + DelegationStore + ConnectionStore
{
}

impl<T> Store for T where
    T: AuditStore + HandleStore + TaskStore + SessionStore + OnceStore + PinStore + DelegationStore + ConnectionStore
{
}

/// Opens the store a URL names: `sqlite:…` (see [`SqliteStore::open`]) or
/// `postgres://…` / `postgresql://…` (see [`PostgresStore::connect`]). Migrates and checks
/// readiness before returning. Any other scheme is a [`StoreError::Config`] naming only the scheme.
pub async fn open_store(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::connect(url).await?))
    } else {
        Err(StoreError::Config { reason: unsupported_scheme(url) })
    }
}

/// Opens the store a URL names for reading only, as [`open_store`] chooses the backend: nothing
/// is created or migrated, and the database itself refuses writes (SQLite `mode=ro`, PostgreSQL
/// read-only transactions). A missing SQLite file or an unreachable server is
/// [`StoreError::Unavailable`]; a schema of another version is [`StoreError::Config`].
pub async fn open_store_read_only(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open_read_only(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let options = PostgresOptions { max_connections: 2, ..PostgresOptions::default() };
        Ok(Arc::new(PostgresStore::connect_read_only(url, options).await?))
    } else {
        Err(StoreError::Config { reason: unsupported_scheme(url) })
    }
}

/// The error text for an unsupported URL: names the scheme if it looks like one, never the rest.
fn unsupported_scheme(url: &str) -> String {
    let scheme = url.split_once(':').map(|(scheme, _)| scheme).filter(|scheme| {
        !scheme.is_empty()
            && scheme.len() <= 32
            && scheme.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"+-.".contains(&byte))
    });
    let expected = "expected a sqlite:, postgres:// or postgresql:// URL";
    match scheme {
        Some(scheme) => format!("unsupported store URL scheme `{scheme}`; {expected}"),
        None => format!("the store URL has no recognisable scheme; {expected}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_schemes_are_refused_without_echoing_the_url() {
        for url in ["mysql://root:hunter2@db/audit", "hunter2", "SQLITE:x.db", "file:///tmp/x"] {
            let error = open_store(url).await.err().unwrap();
            assert!(matches!(error, StoreError::Config { .. }), "{url}: {error:?}");
            let text = format!("{error} {error:?}");
            assert!(!text.contains("hunter2") && !text.contains("x.db"), "{text}");
        }
        let error = open_store("mysql://root:hunter2@db/audit").await.err().unwrap();
        assert_eq!(
            error.to_string(),
            "store configuration rejected: unsupported store URL scheme `mysql`; expected a sqlite:, postgres:// or postgresql:// URL"
        );
    }
}
