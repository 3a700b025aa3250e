//! Group commit of `fdatasync` for the live chain under power durability.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use crate::StoreError;

use super::files::*;

/// Group commit of `fdatasync`: appends ask for a sync of the current file, one thread syncs for
/// all of them at once, and each append waits until a sync that began after its write is done.
pub(super) struct SyncGroup {
    pub(super) shared: Arc<SyncShared>,
    pub(super) synced: watch::Receiver<SyncedUpTo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SyncedUpTo {
    /// Every request up to this ticket is synced.
    pub(super) covered: u64,
    pub(super) failed: bool,
}

pub(super) struct SyncShared {
    pub(super) state: Mutex<SyncState>,
    pub(super) wake: Condvar,
    pub(super) stopped: AtomicBool,
}

pub(super) struct SyncState {
    /// The file to sync next, set by a write since the last round began.
    pub(super) pending: Option<Arc<File>>,
    /// Tickets handed out (one per write).
    pub(super) requested: u64,
}

impl SyncGroup {
    pub(super) fn start() -> Result<Self, StoreError> {
        let shared = Arc::new(SyncShared {
            state: Mutex::new(SyncState { pending: None, requested: 0 }),
            wake: Condvar::new(),
            stopped: AtomicBool::new(false),
        });
        let (sender, synced) = watch::channel(SyncedUpTo { covered: 0, failed: false });
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("palisade-audit-sync".into())
            .spawn(move || run_sync(&thread_shared, &sender))
            .map_err(|error| StoreError::from_io("audit segment (starting the sync thread)", error))?;
        Ok(SyncGroup { shared, synced })
    }

    /// Called under the writer's lock right after a write: the write's ticket. A round that
    /// takes the file after this covers the write.
    pub(super) fn request(&self, file: Arc<File>) -> u64 {
        let mut state = lock(&self.shared.state);
        state.pending = Some(file);
        state.requested += 1;
        let ticket = state.requested;
        drop(state);
        self.shared.wake.notify_one();
        ticket
    }

    /// Waits until a round covering `ticket` has synced.
    pub(super) async fn wait(&self, ticket: u64, timeout: Duration) -> Result<(), StoreError> {
        let mut synced = self.synced.clone();
        let waited =
            tokio::time::timeout(timeout, synced.wait_for(|up_to| up_to.covered >= ticket || up_to.failed)).await;
        match waited {
            Ok(Ok(up_to)) if !up_to.failed => Ok(()),
            Ok(_) => Err(StoreError::unavailable("audit append (syncing the segment failed)")),
            Err(_) => Err(StoreError::unavailable("audit append (syncing the segment timed out)")),
        }
    }
}

impl Drop for SyncGroup {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
    }
}

pub(super) fn run_sync(shared: &SyncShared, sender: &watch::Sender<SyncedUpTo>) {
    loop {
        let (file, covered) = {
            let mut state = lock(&shared.state);
            while state.pending.is_none() && !shared.stopped.load(Ordering::SeqCst) {
                state = shared.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
            }
            if shared.stopped.load(Ordering::SeqCst) {
                return;
            }
            (state.pending.take(), state.requested)
        };
        let Some(file) = file else { continue };
        let failed = match file.sync_data() {
            Ok(()) => false,
            Err(error) => {
                tracing::error!(%error, "fdatasync of the audit segment failed; appends waiting for it fail");
                true
            }
        };
        sender.send_replace(SyncedUpTo { covered, failed });
    }
}
