//! The reference disable authority: authoritative ENABLE/DISABLE state per target with a
//! generation and a reason, persisted in SQLite; signed heads over an mTLS HTTPS endpoint;
//! one-use commit tokens bound to target and generation; redemption inside a backend's own
//! transaction ([`redeem_commit_token`]) or over HTTPS; admin functions for the CLI.
//!
//! **Architecture Invariant:** a token redeems only while its target's current generation is
//! the one it was issued at and the state is ENABLE, in one SQL statement: any DISABLE (or
//! re-enable) committed before the backend's commit makes the redemption, and so the commit, fail.

mod db;
mod server;

pub use db::{AuthorityDb, RedeemError, RedeemRejection, TargetStatus, redeem_commit_token};
pub use server::{AuthorityServerConfig, serve, server_tls_config};

/// Why an authority operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthorityServiceError {
    /// The database could not be used.
    #[error("authority database unavailable during {during}")]
    Storage {
        /// The operation.
        during: &'static str,
        /// The driver's error.
        #[source]
        source: Option<sqlx::Error>,
    },
    /// A stored value is impossible.
    #[error("authority database holds an impossible value: {what}")]
    Corrupt {
        /// What.
        what: &'static str,
    },
    /// An admin input is unusable (reason code empty, too long or with control characters; bad
    /// target digest).
    #[error("authority input rejected: {what}")]
    InvalidInput {
        /// What.
        what: &'static str,
    },
    /// The TLS material is unusable.
    #[error("authority TLS configuration rejected: {reason}")]
    Tls {
        /// What (never key material).
        reason: String,
    },
    /// The listener failed.
    #[error("authority listener failed")]
    Io(#[from] std::io::Error),
}
