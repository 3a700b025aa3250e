//! One chain's log and its writer: the segment configuration, opening the directory, appends and file rotation.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::chain::{is_chain_id, new_chain_id};
use crate::record::{AuditRecord, GENESIS_HASH};
use crate::{AuditStore, StoreError};

use super::files::*;
use super::format::*;
use super::recover::*;
use super::sync::*;

/// When an acknowledged audit record is safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Written to the file (the page cache) before the request goes on: survives the process
    /// being killed, not a power loss before the kernel writes it back.
    #[default]
    Process,
    /// Also `fdatasync`ed (group commit: one sync for every append waiting) before the request
    /// goes on: survives a power loss.
    Power,
}

/// Where and how an instance keeps its audit segment.
#[derive(Debug, Clone)]
pub struct SegmentConfig {
    /// The segment directory (created, mode 0700).
    pub dir: PathBuf,
    /// See [`Durability`].
    pub durability: Durability,
    /// A file is closed and the next begun once it would grow past this.
    pub max_file_bytes: u64,
    /// Appends are refused (fail closed) while more than this many bytes wait to be shipped.
    pub max_backlog_bytes: u64,
    /// How long an append waits for its `fdatasync` under [`Durability::Power`].
    pub sync_timeout: Duration,
}

impl SegmentConfig {
    /// Defaults: process durability, 64 MiB files, 1 GiB backlog, 5 s sync timeout.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SegmentConfig {
            dir: dir.into(),
            durability: Durability::Process,
            max_file_bytes: 64 << 20,
            max_backlog_bytes: 1 << 30,
            sync_timeout: Duration::from_secs(5),
        }
    }
}

/// One chain's segment files and, for the live chain, its writer.
pub struct SegmentLog {
    pub(super) chain: String,
    pub(super) dir: PathBuf,
    /// Held for the process's lifetime: the `flock` that makes this process the chain's writer.
    pub(super) _lock: File,
    pub(super) state: Mutex<WriterState>,
    /// False for a recovered chain that is only drained.
    pub(super) live: bool,
    pub(super) durability: Durability,
    pub(super) max_file_bytes: u64,
    pub(super) max_backlog_bytes: u64,
    pub(super) sync_timeout: Duration,
    /// Frame bytes written and shipped since the process started (backlog = the difference).
    pub(super) written: AtomicU64,
    pub(super) shipped: AtomicU64,
    /// Since when (milliseconds after `epoch`, plus one) records have been waiting to be
    /// shipped; 0 while none waits. Set by the append that finds nothing waiting, cleared by the
    /// shipper once it has caught up.
    pub(super) waiting_since: AtomicU64,
    pub(super) epoch: std::time::Instant,
    pub(super) wake: Notify,
    pub(super) sync: Option<SyncGroup>,
}

impl std::fmt::Debug for SegmentLog {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("SegmentLog").field("chain", &self.chain).field("live", &self.live).finish()
    }
}

/// Opens the segment directory: recovers every chain no other process holds and returns the live
/// chain's log (first) and the recovered ones to drain. `store` is asked for the heads, so that a
/// chain the store is ahead of is never continued.
pub async fn open(config: &SegmentConfig, store: &dyn AuditStore) -> Result<Vec<Arc<SegmentLog>>, StoreError> {
    create_private_dir(&config.dir)?;
    let mut recovered = Vec::new();
    let mut names: Vec<String> = fs::read_dir(&config.dir)
        .map_err(|error| StoreError::from_io("audit segment (reading the directory)", error))?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| is_chain_id(name))
        .collect();
    names.sort();
    for chain in names {
        let dir = config.dir.join(&chain);
        let Some(lock) = try_lock(&dir)? else {
            tracing::info!(%chain, "audit segment chain held by another process; left to it");
            continue;
        };
        let Some(state) = recover(&chain, &dir)? else { continue };
        recovered.push((chain, dir, lock, state));
    }
    let mut logs = Vec::new();
    let mut live_taken = false;
    for (chain, dir, lock, state) in recovered {
        let stored = store.chain_head(&chain).await?.map(|head| head.seq).unwrap_or(0);
        let local = state.next_seq - 1;
        let continue_it = !live_taken && stored <= local;
        if stored > local {
            tracing::warn!(%chain, stored, local, "the store holds more of this audit chain than its segment (a power loss after shipping?); a new chain begins");
        }
        live_taken |= continue_it;
        logs.push(Arc::new(SegmentLog::from_parts(chain, dir, lock, state, continue_it, config)?));
    }
    if !live_taken {
        let chain = new_chain_id()?;
        let dir = config.dir.join(&chain);
        create_private_dir(&dir)?;
        let lock = try_lock(&dir)?.ok_or_else(|| StoreError::unavailable("audit segment (lock of a new chain)"))?;
        let (file, path) = create_segment_file(&dir, &chain, 1, &GENESIS_HASH)?;
        let state = WriterState {
            file: Arc::new(file),
            file_len: HEADER_LEN,
            files: VecDeque::from([SegmentFile { first_seq: 1, path }]),
            next_seq: 1,
            prev_hash: GENESIS_HASH,
            broken: false,
        };
        sync_dir(&dir);
        logs.push(Arc::new(SegmentLog::from_parts(chain, dir, lock, state, true, config)?));
    }
    // The live chain first.
    logs.sort_by_key(|log| !log.live);
    Ok(logs)
}

impl SegmentLog {
    pub(super) fn from_parts(
        chain: String,
        dir: PathBuf,
        lock: File,
        state: WriterState,
        live: bool,
        config: &SegmentConfig,
    ) -> Result<Self, StoreError> {
        let sync = (live && config.durability == Durability::Power).then(SyncGroup::start).transpose()?;
        Ok(SegmentLog {
            chain,
            dir,
            _lock: lock,
            state: Mutex::new(state),
            live,
            durability: config.durability,
            max_file_bytes: config.max_file_bytes.max(HEADER_LEN + 4096),
            max_backlog_bytes: config.max_backlog_bytes,
            sync_timeout: config.sync_timeout,
            written: AtomicU64::new(0),
            shipped: AtomicU64::new(0),
            waiting_since: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            wake: Notify::new(),
            sync,
        })
    }

    /// The chain id.
    pub fn chain(&self) -> &str {
        &self.chain
    }

    /// Whether this is the chain appends go to (else a recovered one being drained).
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// Bytes written and not yet shipped since the process started.
    pub fn backlog_bytes(&self) -> u64 {
        self.written.load(Ordering::SeqCst).saturating_sub(self.shipped.load(Ordering::SeqCst))
    }

    /// How long the oldest record not yet shipped has waited, at most (since the backlog was
    /// last empty); zero when nothing waits.
    pub fn shipping_lag(&self) -> Duration {
        if self.backlog_bytes() == 0 {
            return Duration::ZERO;
        }
        match self.waiting_since.load(Ordering::SeqCst) {
            // An append raced the shipper's catching up: waiting from now on.
            0 => {
                self.mark_waiting();
                Duration::ZERO
            }
            since => self.epoch.elapsed().saturating_sub(Duration::from_millis(since - 1)),
        }
    }

    /// Records that something waits from now on, unless something already did.
    fn mark_waiting(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        let _ = self.waiting_since.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The shipper moved `bytes` into the store.
    pub(super) fn shipped(&self, bytes: u64) {
        self.shipped.fetch_add(bytes, Ordering::SeqCst);
        if self.backlog_bytes() == 0 {
            self.waiting_since.store(0, Ordering::SeqCst);
        }
    }

    /// Appends `record` to the chain: validated, linked, framed and written in one `write(2)`;
    /// under [`Durability::Power`] also synced before this returns. An error means the record is
    /// not in the segment (a partial frame is cut off again; if even that fails, every later
    /// append fails too).
    pub async fn append(&self, record: &AuditRecord) -> Result<(), StoreError> {
        let ticket = self.write(record)?;
        self.wake.notify_one();
        match (&self.sync, ticket) {
            (Some(sync), Some(ticket)) => sync.wait(ticket, self.sync_timeout).await,
            _ => Ok(()),
        }
    }

    /// Writes the frame; returns the sync ticket to wait for under [`Durability::Power`].
    pub(super) fn write(&self, record: &AuditRecord) -> Result<Option<u64>, StoreError> {
        if !self.live {
            return Err(StoreError::Closed);
        }
        record.validate()?;
        if self.backlog_bytes() > self.max_backlog_bytes {
            return Err(StoreError::unavailable(
                "audit append (the local backlog is full: the store is not taking records)",
            ));
        }
        let canonical = record.canonical_bytes();
        let mut state = lock(&self.state);
        if state.broken {
            return Err(StoreError::unavailable(
                "audit append (the segment could not be repaired after a failed write)",
            ));
        }
        let seq = state.next_seq;
        let hash = hash_canonical(&state.prev_hash, &canonical);
        let frame = encode_frame(seq, &hash, &canonical);
        if state.file_len + frame.len() as u64 > self.max_file_bytes {
            self.rotate(&mut state)?;
        }
        if let Err(error) = (&*state.file).write_all(&frame) {
            // Cut whatever part of the frame reached the file, so the next frame follows a whole one.
            if state.file.set_len(state.file_len).is_err() {
                state.broken = true;
            }
            return Err(StoreError::from_io("audit append (writing the segment)", error));
        }
        state.file_len += frame.len() as u64;
        state.next_seq += 1;
        state.prev_hash = hash;
        let ticket = self.sync.as_ref().map(|sync| sync.request(state.file.clone()));
        self.mark_waiting();
        self.written.fetch_add(frame.len() as u64, Ordering::SeqCst);
        Ok(ticket)
    }

    /// Closes the current file and begins the next, named by the next record's `seq`.
    pub(super) fn rotate(&self, state: &mut MutexGuard<'_, WriterState>) -> Result<(), StoreError> {
        if self.durability == Durability::Power {
            state.file.sync_data().map_err(|error| StoreError::from_io("audit append (syncing the segment)", error))?;
        }
        let (file, path) = create_segment_file(&self.dir, &self.chain, state.next_seq, &state.prev_hash)?;
        if self.durability == Durability::Power {
            sync_dir(&self.dir);
        }
        state.file = Arc::new(file);
        state.file_len = HEADER_LEN;
        let first_seq = state.next_seq;
        state.files.push_back(SegmentFile { first_seq, path });
        Ok(())
    }

    /// The files as they are now: every path in order, and the length written so far of the
    /// newest (older files are complete).
    pub(super) fn view(&self) -> (Vec<SegmentFile>, u64) {
        let state = lock(&self.state);
        (state.files.iter().cloned().collect(), state.file_len)
    }

    /// Forgets and deletes the oldest file (every record of it shipped, a newer one exists).
    pub(super) fn retire_oldest(&self) {
        let mut state = lock(&self.state);
        if state.files.len() < 2 {
            return;
        }
        if let Some(file) = state.files.pop_front()
            && let Err(error) = fs::remove_file(&file.path)
        {
            tracing::warn!(%error, chain = %self.chain, "could not delete a shipped audit segment file");
        }
    }
}

impl SegmentLog {
    /// Waits until an append happened since the last call (or `timeout` passed).
    pub(crate) async fn appended(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.wake.notified()).await;
    }
}
