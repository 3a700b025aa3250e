//! The periodic purge of a running server: dead 2025-era sessions, expired single-use records
//! and expired delegation capabilities, in bounded batches.

use std::sync::Arc;

use palisade_base::clock::{Clock as _, SystemClock};
use palisade_server::Server;

/// Deletes dead 2025-era sessions and expired single-use records every five minutes, in bounded
/// batches, until `server` shuts down. (A single-use record expires no earlier than the sealed
/// state it spends, so a purged one can no longer be presented.)
pub fn spawn_session_purge(
    store: Arc<dyn palisade_store::SessionStore>,
    once: Arc<dyn palisade_store::OnceStore>,
    ledger: Arc<dyn palisade_store::DelegationStore>,
    server: &Server,
) -> tokio::task::JoinHandle<()> {
    let (period, shutdown) = (std::time::Duration::from_secs(300), server.shutdown_token().clone());
    palisade_server::periodic::spawn_periodic("session purge", period, shutdown, move || {
        let (store, once, ledger) = (store.clone(), once.clone(), ledger.clone());
        async move {
            let now = SystemClock.now_ms();
            // Up to ten batches of each per tick; the next tick picks up the rest.
            purge_in_batches("session", |limit| store.purge_sessions(now, limit)).await;
            purge_in_batches("single-use record", |limit| once.purge_once(now, limit)).await;
            // Expired capabilities and approvals (a child never outlives its parent).
            purge_in_batches("delegation", |limit| ledger.purge_delegations(now, limit)).await;
        }
    })
}

/// Runs `purge` (which deletes at most its argument's worth of rows and says how many it did)
/// until a batch comes back short, at most ten times; a failure waits for the next tick.
async fn purge_in_batches<'a>(what: &str, purge: impl Fn(u32) -> palisade_store::StoreFuture<'a, u64>) {
    const BATCH: u32 = 1_000;
    for _ in 0..10 {
        match purge(BATCH).await {
            Ok(done) if done == u64::from(BATCH) => continue,
            Ok(_) => break,
            Err(error) => {
                tracing::warn!(%error, "{what} purge failed; retrying at the next tick");
                break;
            }
        }
    }
}
