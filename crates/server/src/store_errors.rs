//! The one conversion from a store error to the client's error, for every service on the
//! request path (sessions, tasks, handles, single-use records): a record the store refuses as
//! invalid is the caller's bad input (`-32602`, the store's fixed reason); anything else is
//! logged for the operator and answered `503` (fail closed), never with the store's detail.

use palisade_store::StoreError;
use palisade_wire::ProtocolError;

/// `error` from the `store` named (for the log) as the client's error.
pub(crate) fn store_refusal(store: &'static str, error: &StoreError) -> ProtocolError {
    match error {
        StoreError::InvalidRecord { reason } => ProtocolError::invalid_params(*reason),
        _ => {
            tracing::error!(store, %error, "store unavailable: refusing the request (fail closed)");
            ProtocolError::Unavailable
        }
    }
}
