//! An instance's local audit segment: the append-only files its request path writes the audit
//! chain to before a handler runs, and the shipper that moves them into the store in large
//! batches.
//!
//! Layout: `<dir>/<chain id>/lock` (held with an exclusive `flock` by the one process writing
//! that chain) and `<dir>/<chain id>/<first seq, 20 digits>.seg`. A file starts with a header —
//! `PALAUD01`, the chain id, the first record's `seq` (u64 LE) and the `prev_hash` it links to —
//! followed by frames: payload length (u32 LE), CRC-32 of the payload (u32 LE), payload = `seq`
//! (u64 LE), `hash` (32 bytes), the record's RFC 8785 JSON. A file that reaches the size limit is
//! closed and the next begins; a file is deleted once every record in it is shipped and a newer
//! one exists.
//!
//! Durability: an append is one `write(2)` of the whole frame into the page cache before the
//! handler runs (survives the process being killed, as a commit to SQLite's WAL did before it);
//! [`Durability::Power`] adds a group-committed `fdatasync` that the append waits for. Opening
//! recovers every chain of the directory no other process holds: frames are read and checked
//! (framing, CRC, link, hash) and a torn tail of the newest file is cut at the first bad frame
//! when no checksummed record follows it (a write cut by a crash); damage anywhere else, or
//! followed by valid frames, refuses the start (fail closed: nothing is cut, and [`salvage`]
//! shows the damage and keeps what follows it in a new chain that records the break). The
//! live chain continues where its files end, unless the store is ahead of them (records shipped
//! and then lost from the page cache by a power loss), in which case a new chain begins rather
//! than fork it; other recovered chains are drained by the shipper and removed.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use aws_lc_rs::digest;
use tokio::sync::{Notify, watch};

use crate::chain::{is_chain_id, new_chain_id};
use crate::record::{AuditRecord, GENESIS_HASH, StoredAuditRecord};
use crate::{AuditStore, StoreError};

const MAGIC: &[u8; 8] = b"PALAUD01";
const HEADER_LEN: u64 = 8 + 32 + 8 + 32;
const FRAME_HEAD: usize = 8;
const PAYLOAD_FIXED: usize = 8 + 32;
/// Largest payload accepted when reading (a valid record is far smaller: 4 KiB fields).
const MAX_PAYLOAD: usize = 4 << 20;
/// Bytes read per step while shipping or recovering.
const READ_CHUNK: usize = 1 << 20;
/// Most records per shipped batch.
const SHIP_BATCH: usize = 2048;

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

/// One `.seg` file of a chain.
#[derive(Debug, Clone)]
struct SegmentFile {
    first_seq: u64,
    path: PathBuf,
}

struct WriterState {
    file: Arc<File>,
    file_len: u64,
    files: VecDeque<SegmentFile>,
    next_seq: u64,
    prev_hash: [u8; 32],
    /// A write failed and could not be undone: no further append (fail closed).
    broken: bool,
}

/// One chain's segment files and, for the live chain, its writer.
pub struct SegmentLog {
    chain: String,
    dir: PathBuf,
    /// Held for the process's lifetime: the `flock` that makes this process the chain's writer.
    _lock: File,
    state: Mutex<WriterState>,
    /// False for a recovered chain that is only drained.
    live: bool,
    durability: Durability,
    max_file_bytes: u64,
    max_backlog_bytes: u64,
    sync_timeout: Duration,
    /// Frame bytes written and shipped since the process started (backlog = the difference).
    written: AtomicU64,
    shipped: AtomicU64,
    wake: Notify,
    sync: Option<SyncGroup>,
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
    fn from_parts(
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
    fn write(&self, record: &AuditRecord) -> Result<Option<u64>, StoreError> {
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
        self.written.fetch_add(frame.len() as u64, Ordering::SeqCst);
        Ok(ticket)
    }

    /// Closes the current file and begins the next, named by the next record's `seq`.
    fn rotate(&self, state: &mut MutexGuard<'_, WriterState>) -> Result<(), StoreError> {
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
    fn view(&self) -> (Vec<SegmentFile>, u64) {
        let state = lock(&self.state);
        (state.files.iter().cloned().collect(), state.file_len)
    }

    /// Forgets and deletes the oldest file (every record of it shipped, a newer one exists).
    fn retire_oldest(&self) {
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

fn hash_canonical(prev_hash: &[u8; 32], canonical: &[u8]) -> [u8; 32] {
    let mut context = digest::Context::new(&digest::SHA256);
    context.update(prev_hash);
    context.update(canonical);
    let mut hash = [0u8; 32];
    hash.copy_from_slice(context.finish().as_ref());
    hash
}

fn encode_frame(seq: u64, hash: &[u8; 32], canonical: &[u8]) -> Vec<u8> {
    let payload_len = PAYLOAD_FIXED + canonical.len();
    let mut frame = Vec::with_capacity(FRAME_HEAD + payload_len);
    frame.extend_from_slice(&u32::try_from(payload_len).unwrap_or(u32::MAX).to_le_bytes());
    frame.extend_from_slice(&[0; 4]);
    frame.extend_from_slice(&seq.to_le_bytes());
    frame.extend_from_slice(hash);
    frame.extend_from_slice(canonical);
    let crc = crc32fast::hash(&frame[FRAME_HEAD..]);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
    frame
}

fn encode_header(chain: &str, first_seq: u64, prev_hash: &[u8; 32]) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_LEN as usize);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(chain.as_bytes());
    header.extend_from_slice(&first_seq.to_le_bytes());
    header.extend_from_slice(prev_hash);
    header
}

fn decode_header(bytes: &[u8], chain: &str) -> Option<(u64, [u8; 32])> {
    if bytes.len() < HEADER_LEN as usize || &bytes[..8] != MAGIC || &bytes[8..40] != chain.as_bytes() {
        return None;
    }
    let first_seq = u64::from_le_bytes(bytes[40..48].try_into().ok()?);
    let prev_hash: [u8; 32] = bytes[48..80].try_into().ok()?;
    Some((first_seq, prev_hash))
}

/// What the frame at the front of `bytes` is.
enum Frame {
    /// A whole, checksummed frame: `seq`, `hash`, the record's JSON, and its length.
    Whole { seq: u64, hash: [u8; 32], json_range: std::ops::Range<usize>, len: usize },
    /// Fewer bytes than the frame needs (the rest is not written yet, or was torn off).
    Short,
    /// Not a frame (bad length or checksum).
    Bad,
}

fn parse_frame(bytes: &[u8]) -> Frame {
    if bytes.len() < FRAME_HEAD {
        return Frame::Short;
    }
    let payload_len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    if !(PAYLOAD_FIXED + 2..=MAX_PAYLOAD).contains(&payload_len) {
        return Frame::Bad;
    }
    let len = FRAME_HEAD + payload_len;
    if bytes.len() < len {
        return Frame::Short;
    }
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let payload = &bytes[FRAME_HEAD..len];
    if crc32fast::hash(payload) != crc {
        return Frame::Bad;
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&payload[..8]);
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&payload[8..40]);
    Frame::Whole { seq: u64::from_le_bytes(seq), hash, json_range: FRAME_HEAD + PAYLOAD_FIXED..len, len }
}

/// Reads a file's frames from `offset` up to `end`, checking each links on from
/// `(next_seq, prev_hash)`; stops after `limit` records, at a short frame, or at the first bad
/// one. Returns the records, the offset after the last whole one, and whether it stopped at a
/// bad frame.
fn read_frames(
    file: &File,
    chain: &str,
    mut offset: u64,
    end: u64,
    mut next: (u64, [u8; 32]),
    limit: usize,
) -> std::io::Result<(Vec<StoredAuditRecord>, u64, bool)> {
    let mut records = Vec::new();
    let mut buffer = Vec::new();
    let mut chunk = READ_CHUNK;
    while offset < end && records.len() < limit {
        let want = usize::try_from(end - offset).unwrap_or(usize::MAX).min(chunk);
        buffer.resize(want, 0);
        let read = read_at_most(file, &mut buffer, offset)?;
        buffer.truncate(read);
        if read == 0 {
            break;
        }
        let mut at = 0usize;
        while records.len() < limit {
            match parse_frame(&buffer[at..]) {
                Frame::Short => break,
                Frame::Bad => return Ok((records, offset + at as u64, true)),
                Frame::Whole { seq, hash, json_range, len } => {
                    let json = &buffer[at + json_range.start..at + json_range.end];
                    let record: Option<AuditRecord> = serde_json::from_slice(json).ok();
                    let linked = record.filter(|record| {
                        seq == next.0 && record.canonical_bytes() == json && hash_canonical(&next.1, json) == hash
                    });
                    let Some(record) = linked else { return Ok((records, offset + at as u64, true)) };
                    records.push(StoredAuditRecord { chain: chain.to_owned(), seq, record, prev_hash: next.1, hash });
                    next = (seq + 1, hash);
                    at += len;
                }
            }
        }
        if at == 0 {
            // Not even one whole frame: the end of what is written (a frame still being written,
            // or torn), unless the frame is larger than the chunk.
            if read < want || offset + read as u64 >= end || chunk >= MAX_PAYLOAD + FRAME_HEAD {
                break;
            }
            chunk = (chunk * 2).min(MAX_PAYLOAD + FRAME_HEAD);
        }
        offset += at as u64;
    }
    Ok((records, offset, false))
}

fn read_at_most(file: &File, buffer: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read_at(&mut buffer[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(count) => filled += count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// A checksummed record found while scanning past damage.
#[derive(Debug, Clone)]
struct Found {
    seq: u64,
    record: AuditRecord,
}

/// Where a chain's files stop continuing the chain, and what follows: checksummed records (in
/// the rest of the file and in the newer files) that the chain cannot take, since what links
/// them to it is gone. Nothing is cut then (only a torn tail, with nothing after it, is): the
/// start is refused and [`salvage`] shows and keeps what follows.
#[derive(Debug, Clone)]
pub struct Damage {
    /// The damaged file.
    pub path: PathBuf,
    /// Offset in it of the first byte that does not continue the chain.
    pub offset: u64,
    /// What is wrong there.
    pub reason: &'static str,
    /// Whole, linked records of the chain before it (in this file and the older ones).
    pub records_before: u64,
    /// Checksummed records after it (the rest of the file and every newer file).
    pub following: u64,
    /// Their first and last `seq` as written.
    pub following_seqs: Option<(u64, u64)>,
    /// Bytes after it that are no checksummed record.
    pub unreadable_bytes: u64,
    /// The chain's newer files (they follow the damage too).
    pub later_files: Vec<PathBuf>,
    found: Vec<Found>,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "audit segment file {} is damaged at offset {} ({}): ",
            self.path.display(),
            self.offset,
            self.reason
        )?;
        match self.following_seqs {
            Some((first, last)) => write!(
                f,
                "{} valid records follow it (seq {first} to {last} as written, {} unreadable bytes)",
                self.following, self.unreadable_bytes
            )?,
            None => write!(f, "no valid record follows it ({} unreadable bytes)", self.unreadable_bytes)?,
        }
        write!(
            f,
            "; {} records before it are intact. Not started: `palisade audit salvage` shows the damage, `palisade audit salvage --apply` keeps the records after it in a new chain (recording the break) and moves the damaged file aside",
            self.records_before
        )
    }
}

/// A chain directory's files read and checked, nothing changed yet.
struct Walk {
    files: VecDeque<SegmentFile>,
    /// The newest readable file: opened, the end of its last whole frame, and its length (longer
    /// by a torn tail).
    last: Option<(File, u64, u64)>,
    next: Option<(u64, [u8; 32])>,
    records: u64,
    /// The newest file, torn while being created (shorter than a header, nothing in it).
    torn_header: Option<PathBuf>,
    damage: Option<Damage>,
}

/// The `.seg` files of a chain directory, by first seq.
fn segment_paths(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut paths: Vec<(u64, PathBuf)> = fs::read_dir(dir)
        .map_err(|error| StoreError::from_io("audit segment (reading a chain directory)", error))?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let seq = name.strip_suffix(".seg")?;
            (seq.len() == 20).then(|| seq.parse::<u64>().ok()).flatten().map(|seq| (seq, entry.path()))
        })
        .collect();
    paths.sort();
    Ok(paths)
}

/// Reads every file of a chain in order, checking framing, CRC, link and hash, up to the first
/// place that does not continue the chain. A bad or short frame at the end of the newest file
/// with no checksummed record anywhere after it is a torn tail (a write cut by a crash); any
/// other is [`Damage`], with what follows it counted. `None` for a directory without files.
fn walk_chain(chain: &str, dir: &Path) -> Result<Option<Walk>, StoreError> {
    let io = |during| move |error| StoreError::from_io(during, error);
    let paths = segment_paths(dir)?;
    if paths.is_empty() {
        return Ok(None);
    }
    let count = paths.len();
    let mut walk = Walk { files: VecDeque::new(), last: None, next: None, records: 0, torn_header: None, damage: None };
    for (index, (named_seq, path)) in paths.iter().enumerate() {
        let newest = index + 1 == count;
        let file =
            OpenOptions::new().read(true).append(true).open(path).map_err(io("audit segment (opening a file)"))?;
        let len = file.metadata().map_err(io("audit segment (reading a file)"))?.len();
        let mut header = vec![0u8; HEADER_LEN as usize];
        let read = read_at_most(&file, &mut header, 0).map_err(io("audit segment (reading a file)"))?;
        let decoded = decode_header(&header[..read], chain).filter(|(seq, _)| seq == named_seq);
        let found = match decoded {
            None if newest && len < HEADER_LEN && walk.next.is_some() => {
                walk.torn_header = Some(path.clone());
                break;
            }
            None => Some((0, "bad header", false)),
            Some(linked) if walk.next.is_some_and(|expected| expected != linked) => {
                Some((0, "the file does not continue the one before it", false))
            }
            Some((first_seq, prev_hash)) => {
                let (records, end, bad) =
                    read_frames(&file, chain, HEADER_LEN, len, (first_seq, prev_hash), usize::MAX)
                        .map_err(io("audit segment (reading a file)"))?;
                walk.records += records.len() as u64;
                walk.next =
                    Some(records.last().map(|record| (record.seq + 1, record.hash)).unwrap_or((first_seq, prev_hash)));
                (end < len).then_some((end, if bad { "a bad frame" } else { "a frame cut short" }, true))
            }
        };
        let Some((offset, reason, frames_before)) = found else {
            if let Some((first_seq, _)) = decoded {
                walk.files.push_back(SegmentFile { first_seq, path: path.clone() });
            }
            walk.last = Some((file, len, len));
            continue;
        };
        let mut following = Vec::new();
        let mut unreadable = 0;
        for (later, (_, later_path)) in paths.iter().enumerate().skip(index) {
            let from = if later == index {
                offset
            } else {
                let mut header = vec![0u8; HEADER_LEN as usize];
                let read = File::open(later_path)
                    .and_then(|later| read_at_most(&later, &mut header, 0))
                    .map_err(io("audit segment (reading a file)"))?;
                if decode_header(&header[..read], chain).is_some() { HEADER_LEN } else { 0 }
            };
            let (found, skipped) = scan_frames(later_path, from).map_err(io("audit segment (reading a file)"))?;
            following.extend(found);
            unreadable += skipped;
        }
        if newest && frames_before && following.is_empty() {
            // A torn tail: nothing checksummed after it.
            if let Some((first_seq, _)) = decoded {
                walk.files.push_back(SegmentFile { first_seq, path: path.clone() });
            }
            walk.last = Some((file, offset, len));
            break;
        }
        walk.damage = Some(Damage {
            path: path.clone(),
            offset,
            reason,
            records_before: walk.records,
            following: following.len() as u64,
            following_seqs: following.first().zip(following.last()).map(|(first, last)| (first.seq, last.seq)),
            unreadable_bytes: unreadable,
            later_files: paths[index + 1..].iter().map(|(_, path)| path.clone()).collect(),
            found: following,
        });
        break;
    }
    Ok(Some(walk))
}

/// Every checksummed frame holding a canonical record in `path` from `from` on, resynchronising
/// byte by byte past anything else; and how many bytes were no such frame. Reads the rest of the
/// file at once: only run past damage.
fn scan_frames(path: &Path, from: u64) -> std::io::Result<(Vec<Found>, u64)> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut bytes = vec![0u8; usize::try_from(len.saturating_sub(from)).unwrap_or(usize::MAX)];
    let read = read_at_most(&file, &mut bytes, from)?;
    bytes.truncate(read);
    let mut at = 0;
    let mut found = Vec::new();
    let mut skipped = 0u64;
    while at < bytes.len() {
        if let Frame::Whole { seq, json_range, len, .. } = parse_frame(&bytes[at..]) {
            let json = &bytes[at + json_range.start..at + json_range.end];
            if let Some(record) =
                serde_json::from_slice::<AuditRecord>(json).ok().filter(|record| record.canonical_bytes() == json)
            {
                found.push(Found { seq, record });
                at += len;
                continue;
            }
        }
        at += 1;
        skipped += 1;
    }
    Ok((found, skipped))
}

/// Reads a chain directory's files and repairs a torn tail; refuses [`Damage`]. `None` for a
/// directory without any segment file (removed).
fn recover(chain: &str, dir: &Path) -> Result<Option<WriterState>, StoreError> {
    let io = |during| move |error| StoreError::from_io(during, error);
    let Some(walk) = walk_chain(chain, dir)? else {
        tracing::warn!(%chain, "audit segment chain directory without files; removed");
        let _ = fs::remove_dir_all(dir);
        return Ok(None);
    };
    if let Some(damage) = walk.damage {
        return Err(StoreError::corrupt(damage.to_string()));
    }
    if let Some(path) = walk.torn_header {
        // Torn while being created: the previous file is the newest.
        tracing::warn!(chain, path = %path.display(), "removed a torn audit segment header");
        let _ = fs::remove_file(&path);
    }
    let (Some((file, end, len)), Some((next_seq, prev_hash))) = (walk.last, walk.next) else {
        return Err(StoreError::corrupt("audit segment: no usable file"));
    };
    if end < len {
        tracing::warn!(
            chain,
            kept = end,
            cut = len - end,
            "cut the torn tail of the audit segment (nothing valid follows it)"
        );
        file.set_len(end).map_err(io("audit segment (cutting a torn tail)"))?;
        file.sync_data().map_err(io("audit segment (cutting a torn tail)"))?;
    }
    Ok(Some(WriterState { file: Arc::new(file), file_len: end, files: walk.files, next_seq, prev_hash, broken: false }))
}

/// What [`salvage`] found in one chain of the segment directory, and what it did.
#[derive(Debug, Clone)]
pub struct ChainSalvage {
    /// The chain id.
    pub chain: String,
    /// Held by a running process: left alone, not read.
    pub held: bool,
    /// Whole, linked records readable in order (before any damage).
    pub records: u64,
    /// Bytes of a torn tail that the next start cuts (nothing valid follows them).
    pub torn_tail_bytes: u64,
    /// Where the chain stops, if it does before its end.
    pub damage: Option<Damage>,
    /// What `apply` did.
    pub applied: Option<Salvaged>,
}

/// What [`salvage`] did with a damaged chain.
#[derive(Debug, Clone)]
pub struct Salvaged {
    /// The new chain, beginning with a record of this salvage, then the records re-chained.
    pub chain: String,
    /// Records after the damage written to it (their content as it was, new seq and hash).
    pub rechained: u64,
    /// Records after the damage not written: the store holds the chain up to their seq already.
    pub in_store: u64,
    /// Where the damaged file (whole, as it was) and the chain's newer files now are.
    pub aside: Vec<PathBuf>,
}

/// The directory of the segment directory where salvaged files are kept.
pub const DAMAGED_DIR: &str = "damaged";

/// Reads every chain of the segment directory that no process holds and reports where any stops
/// before its end. With `apply`, for each damaged chain: the damaged file is copied whole to
/// `<dir>/damaged/` and cut at the damage (moved there whole when the damage is its header), the
/// chain's newer files are moved there, and the checksummed records after the damage that the
/// store does not hold yet are written, in order and unchanged, to a new chain whose first
/// record (stage `operator`, operation `audit.salvage`) states the break: the file, the offset,
/// the counts and where the original is. The damaged chain then ends where its intact part ends
/// and both are shipped by the next start; nothing is dropped. A run interrupted after the new
/// chain was written and before the cut writes another one when run again (each with its own
/// record of the break): a duplicate, never a loss.
pub async fn salvage(
    config: &SegmentConfig,
    store: &dyn AuditStore,
    apply: bool,
    now_ms: u64,
) -> Result<Vec<ChainSalvage>, StoreError> {
    let io = |during| move |error| StoreError::from_io(during, error);
    let mut names: Vec<String> = match fs::read_dir(&config.dir) {
        Ok(entries) => entries
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|name| is_chain_id(name))
            .collect(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(io("audit segment (reading the directory)")(error)),
    };
    names.sort();
    let mut report = Vec::new();
    for chain in names {
        let dir = config.dir.join(&chain);
        let Some(_lock) = try_lock(&dir)? else {
            report.push(ChainSalvage {
                chain,
                held: true,
                records: 0,
                torn_tail_bytes: 0,
                damage: None,
                applied: None,
            });
            continue;
        };
        let Some(walk) = walk_chain(&chain, &dir)? else { continue };
        let torn_tail_bytes = walk.last.as_ref().map(|(_, end, len)| len - end).unwrap_or(0);
        let mut entry = ChainSalvage {
            chain,
            held: false,
            records: walk.records,
            torn_tail_bytes,
            damage: walk.damage,
            applied: None,
        };
        if apply && let Some(damage) = &entry.damage {
            let stored = store.chain_head(&entry.chain).await?.map(|head| head.seq).unwrap_or(0);
            entry.applied = Some(apply_salvage(config, &entry.chain, damage, stored, now_ms)?);
        }
        report.push(entry);
    }
    Ok(report)
}

fn apply_salvage(
    config: &SegmentConfig,
    chain: &str,
    damage: &Damage,
    stored: u64,
    now_ms: u64,
) -> Result<Salvaged, StoreError> {
    let io = |during| move |error| StoreError::from_io(during, error);
    let aside_dir = config.dir.join(DAMAGED_DIR);
    create_private_dir(&aside_dir)?;
    let aside_path = |path: &Path| {
        let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        aside_dir.join(format!("{chain}-{name}.{now_ms}.damaged"))
    };
    let damaged_aside = aside_path(&damage.path);
    let cut = damage.offset >= HEADER_LEN;
    // 1. The damaged file, whole, kept aside (durably) before anything changes.
    if cut {
        fs::copy(&damage.path, &damaged_aside).map_err(io("audit salvage (copying the damaged file aside)"))?;
        File::open(&damaged_aside)
            .and_then(|file| file.sync_all())
            .map_err(io("audit salvage (syncing the copy of the damaged file)"))?;
    }
    // 2. The records after the damage, in a new chain that begins with the record of the break.
    let kept: Vec<&Found> = damage.found.iter().filter(|found| found.seq > stored).collect();
    let in_store = damage.found.len() as u64 - kept.len() as u64;
    let name = damage.path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let written = damage
        .following_seqs
        .map(|(first, last)| format!("seq {first} to {last} as written"))
        .unwrap_or_else(|| "none".into());
    let detail = format!(
        "audit segment salvage: chain {chain} file {name} damaged at offset {offset} ({reason}); {before} records before it stay in that chain; {following} valid records after it ({written}): {in_store} held by the store already, {rechained} re-chained here after this record; {unreadable} bytes unreadable; the original file is kept as {damaged_dir}/{aside}",
        offset = damage.offset,
        reason = damage.reason,
        before = damage.records_before,
        following = damage.following,
        rechained = kept.len(),
        unreadable = damage.unreadable_bytes,
        damaged_dir = DAMAGED_DIR,
        aside = damaged_aside.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default(),
    );
    let marker = AuditRecord {
        at_ms: now_ms,
        trace_id: format!("audit-salvage-{now_ms}"),
        stage: "operator".into(),
        decision: crate::Decision::Allow,
        operation: "audit.salvage".into(),
        principal_digest: None,
        tenant_digest: None,
        client_digest: None,
        scopes: Vec::new(),
        policy_version: None,
        code: None,
        detail: Some(detail),
    };
    marker.validate()?;
    let new_chain = new_chain_id()?;
    let new_dir = config.dir.join(&new_chain);
    create_private_dir(&new_dir)?;
    let _new_lock =
        try_lock(&new_dir)?.ok_or_else(|| StoreError::unavailable("audit salvage (lock of the new chain)"))?;
    let (mut file, _) = create_segment_file(&new_dir, &new_chain, 1, &GENESIS_HASH)?;
    let mut frames = Vec::new();
    let mut prev_hash = GENESIS_HASH;
    for (seq, record) in (1u64..).zip(std::iter::once(&marker).chain(kept.iter().map(|found| &found.record))) {
        let canonical = record.canonical_bytes();
        let hash = hash_canonical(&prev_hash, &canonical);
        frames.extend_from_slice(&encode_frame(seq, &hash, &canonical));
        prev_hash = hash;
    }
    file.write_all(&frames).map_err(io("audit salvage (writing the new chain)"))?;
    file.sync_all().map_err(io("audit salvage (syncing the new chain)"))?;
    sync_dir(&new_dir);
    sync_dir(&config.dir);
    // 3. The damaged chain ends where its intact part ends.
    let mut aside = vec![damaged_aside.clone()];
    if cut {
        let file = OpenOptions::new()
            .write(true)
            .open(&damage.path)
            .map_err(io("audit salvage (cutting the damaged file)"))?;
        file.set_len(damage.offset).map_err(io("audit salvage (cutting the damaged file)"))?;
        file.sync_all().map_err(io("audit salvage (cutting the damaged file)"))?;
    } else {
        fs::rename(&damage.path, &damaged_aside).map_err(io("audit salvage (moving the damaged file aside)"))?;
    }
    for later in &damage.later_files {
        let target = aside_path(later);
        fs::rename(later, &target).map_err(io("audit salvage (moving a newer file aside)"))?;
        aside.push(target);
    }
    sync_dir(&aside_dir);
    if let Some(parent) = damage.path.parent() {
        sync_dir(parent);
    }
    Ok(Salvaged { chain: new_chain, rechained: kept.len() as u64, in_store, aside })
}

fn create_segment_file(
    dir: &Path,
    chain: &str,
    first_seq: u64,
    prev_hash: &[u8; 32],
) -> Result<(File, PathBuf), StoreError> {
    let path = dir.join(format!("{first_seq:020}.seg"));
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|error| StoreError::from_io("audit segment (creating a file)", error))?;
    file.write_all(&encode_header(chain, first_seq, prev_hash))
        .map_err(|error| StoreError::from_io("audit segment (writing a header)", error))?;
    Ok((file, path))
}

fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    let mut builder = fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.recursive(true);
    builder.create(dir).map_err(|error| StoreError::from_io("audit segment (creating the directory)", error))
}

fn sync_dir(dir: &Path) {
    if let Err(error) = File::open(dir).and_then(|dir| dir.sync_all()) {
        tracing::warn!(%error, "could not sync the audit segment directory");
    }
}

/// Takes the chain's lock file without waiting: `None` if another process holds it.
fn try_lock(dir: &Path) -> Result<Option<File>, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join("lock"))
        .map_err(|error| StoreError::from_io("audit segment (opening a lock)", error))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => Ok(None),
        Err(fs::TryLockError::Error(error)) => Err(StoreError::from_io("audit segment (taking a lock)", error)),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Group commit of `fdatasync`: appends ask for a sync of the current file, one thread syncs for
/// all of them at once, and each append waits until a sync that began after its write is done.
struct SyncGroup {
    shared: Arc<SyncShared>,
    synced: watch::Receiver<SyncedUpTo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SyncedUpTo {
    /// Every request up to this ticket is synced.
    covered: u64,
    failed: bool,
}

struct SyncShared {
    state: Mutex<SyncState>,
    wake: Condvar,
    stopped: AtomicBool,
}

struct SyncState {
    /// The file to sync next, set by a write since the last round began.
    pending: Option<Arc<File>>,
    /// Tickets handed out (one per write).
    requested: u64,
}

impl SyncGroup {
    fn start() -> Result<Self, StoreError> {
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
    fn request(&self, file: Arc<File>) -> u64 {
        let mut state = lock(&self.shared.state);
        state.pending = Some(file);
        state.requested += 1;
        let ticket = state.requested;
        drop(state);
        self.shared.wake.notify_one();
        ticket
    }

    /// Waits until a round covering `ticket` has synced.
    async fn wait(&self, ticket: u64, timeout: Duration) -> Result<(), StoreError> {
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

fn run_sync(shared: &SyncShared, sender: &watch::Sender<SyncedUpTo>) {
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

/// Where the shipper stands in one chain: the file it reads, the offset in it, and the record
/// expected next there.
#[derive(Debug, Clone)]
struct Cursor {
    first_seq: u64,
    offset: u64,
    next: (u64, [u8; 32]),
}

/// Moves one chain's records from its segment into the store.
#[derive(Debug)]
pub(crate) struct ChainShipper {
    log: Arc<SegmentLog>,
    cursor: Option<Cursor>,
    /// The store's head when shipping began: records up to it are in the store already.
    stored_head: u64,
}

impl ChainShipper {
    pub(crate) fn new(log: Arc<SegmentLog>) -> Self {
        ChainShipper { log, cursor: None, stored_head: 0 }
    }

    pub(crate) fn log(&self) -> &Arc<SegmentLog> {
        &self.log
    }

    /// Ships everything written so far. `Ok(true)` when the chain is a drained recovered one
    /// (nothing is left, its directory removed).
    pub(crate) async fn ship_available(&mut self, store: &dyn AuditStore) -> Result<bool, StoreError> {
        if self.cursor.is_none() {
            let (files, _) = self.log.view();
            let first = files.first().ok_or_else(|| StoreError::corrupt("audit segment without files"))?;
            let file =
                File::open(&first.path).map_err(|error| StoreError::from_io("audit shipper (opening)", error))?;
            let mut header = vec![0u8; HEADER_LEN as usize];
            let read =
                read_at_most(&file, &mut header, 0).map_err(|error| StoreError::from_io("audit shipper", error))?;
            let next = decode_header(&header[..read], &self.log.chain)
                .ok_or_else(|| StoreError::corrupt("audit segment header changed under the shipper"))?;
            // Records the store has already (shipped before a crash) are skipped by seq below.
            self.stored_head = store.chain_head(&self.log.chain).await?.map(|head| head.seq).unwrap_or(0);
            self.cursor = Some(Cursor { first_seq: first.first_seq, offset: HEADER_LEN, next });
        }
        let stored_head = self.stored_head;
        loop {
            let Some(cursor) = self.cursor.clone() else { return Ok(false) };
            let (files, newest_len) = self.log.view();
            let Some(index) = files.iter().position(|file| file.first_seq == cursor.first_seq) else {
                return Err(StoreError::corrupt("audit segment file vanished under the shipper"));
            };
            let newest = index + 1 == files.len();
            let path = &files[index].path;
            let file = File::open(path).map_err(|error| StoreError::from_io("audit shipper (opening)", error))?;
            let end = if newest {
                newest_len
            } else {
                file.metadata().map_err(|error| StoreError::from_io("audit shipper", error))?.len()
            };
            let (records, offset, bad) =
                read_frames(&file, &self.log.chain, cursor.offset, end, cursor.next, SHIP_BATCH)
                    .map_err(|error| StoreError::from_io("audit shipper (reading)", error))?;
            if bad {
                return Err(StoreError::corrupt(format!(
                    "audit segment {} changed on disk after it was written",
                    path.display()
                )));
            }
            let bytes = offset - cursor.offset;
            if let Some(last) = records.last() {
                let next = (last.seq + 1, last.hash);
                let unshipped: Vec<StoredAuditRecord> =
                    records.into_iter().filter(|record| record.seq > stored_head).collect();
                store.ship(&self.log.chain, unshipped).await?;
                self.log.shipped.fetch_add(bytes, Ordering::SeqCst);
                self.cursor = Some(Cursor { first_seq: cursor.first_seq, offset, next });
                continue;
            }
            if newest {
                if !self.log.live {
                    // A recovered chain, fully shipped: its files go.
                    if let Err(error) = fs::remove_dir_all(&self.log.dir) {
                        tracing::warn!(%error, chain = %self.log.chain, "could not remove a drained audit segment");
                    }
                    return Ok(true);
                }
                return Ok(false);
            }
            // The older file is fully shipped: delete it and go on with the next.
            let next_file = files[index + 1].first_seq;
            self.log.retire_oldest();
            self.cursor = Some(Cursor { first_seq: next_file, offset: HEADER_LEN, next: cursor.next });
        }
    }
}

impl SegmentLog {
    /// Waits until an append happened since the last call (or `timeout` passed).
    pub(crate) async fn appended(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.wake.notified()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SqliteStore;
    use crate::conformance::sample_record;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("palisade-segment-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    async fn ship_all(logs: &[Arc<SegmentLog>], store: &dyn AuditStore) {
        for log in logs {
            let mut shipper = ChainShipper::new(log.clone());
            shipper.ship_available(store).await.unwrap();
        }
    }

    #[tokio::test]
    async fn appends_ship_verify_and_continue_after_reopen() {
        let dir = temp_dir("reopen");
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let config = SegmentConfig::new(&dir);
        let logs = open(&config, &store).await.unwrap();
        assert_eq!(logs.len(), 1);
        let chain = logs[0].chain().to_owned();
        for n in 0..10 {
            logs[0].append(&sample_record(n)).await.unwrap();
        }
        ship_all(&logs, &store).await;
        assert_eq!(logs[0].backlog_bytes(), 0);
        drop(logs);
        // Reopened: the same chain continues from record 11.
        let logs = open(&config, &store).await.unwrap();
        assert_eq!(logs[0].chain(), chain);
        logs[0].append(&sample_record(10)).await.unwrap();
        ship_all(&logs, &store).await;
        let report = store.verify_chain().await.unwrap();
        assert!(report.is_intact(), "{report:?}");
        assert_eq!((report.records, report.chains), (11, 1));
        let _ = fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_torn_tail_is_cut_and_every_whole_record_kept() {
        let dir = temp_dir("torn");
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let config = SegmentConfig::new(&dir);
        let logs = open(&config, &store).await.unwrap();
        for n in 0..5 {
            logs[0].append(&sample_record(n)).await.unwrap();
        }
        let (files, len) = logs[0].view();
        drop(logs);
        // Half a frame appended (a write torn by a crash), then garbage after a whole one.
        let mut file = OpenOptions::new().append(true).open(&files[0].path).unwrap();
        let frame = encode_frame(6, &[1; 32], b"{\"x\":1}");
        file.write_all(&frame[..frame.len() / 2]).unwrap();
        drop(file);
        let logs = open(&config, &store).await.unwrap();
        assert_eq!(fs::metadata(&files[0].path).unwrap().len(), len, "the torn frame is cut");
        logs[0].append(&sample_record(5)).await.unwrap();
        ship_all(&logs, &store).await;
        let report = store.verify_chain().await.unwrap();
        assert!(report.is_intact(), "{report:?}");
        assert_eq!(report.records, 6);
        let _ = fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn damage_inside_the_segment_refuses_the_start() {
        let dir = temp_dir("damaged");
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let mut config = SegmentConfig::new(&dir);
        config.max_file_bytes = 8192;
        let logs = open(&config, &store).await.unwrap();
        for n in 0..60 {
            logs[0].append(&sample_record(n)).await.unwrap();
        }
        let (files, _) = logs[0].view();
        assert!(files.len() > 2, "rotated into several files");
        drop(logs);
        // One byte flipped in the middle of an older file.
        let mut bytes = fs::read(&files[0].path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x20;
        fs::write(&files[0].path, bytes).unwrap();
        let error = open(&config, &store).await.unwrap_err();
        assert!(error.to_string().contains("damaged"), "{error}");
        let _ = fs::remove_dir_all(&dir);
    }

    /// Writes `count` records to a new chain (nothing shipped); returns the chain, its one file
    /// and each frame's offset.
    async fn one_file(config: &SegmentConfig, store: &dyn AuditStore, count: u64) -> (String, PathBuf, Vec<u64>) {
        let logs = open(config, store).await.unwrap();
        let mut offsets = Vec::new();
        let mut at = HEADER_LEN;
        for n in 0..count {
            let record = sample_record(n);
            offsets.push(at);
            at += (FRAME_HEAD + PAYLOAD_FIXED + record.canonical_bytes().len()) as u64;
            logs[0].append(&record).await.unwrap();
        }
        let (files, len) = logs[0].view();
        assert_eq!((files.len(), len), (1, at));
        (logs[0].chain().to_owned(), files[0].path.clone(), offsets)
    }

    fn flip(path: &Path, offset: u64) {
        let mut bytes = fs::read(path).unwrap();
        bytes[usize::try_from(offset).unwrap()] ^= 0x20;
        fs::write(path, bytes).unwrap();
    }

    #[tokio::test]
    async fn damage_in_the_middle_of_the_newest_file_refuses_the_start_and_cuts_nothing() {
        let dir = temp_dir("middle");
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let config = SegmentConfig::new(&dir);
        let (_, path, offsets) = one_file(&config, &store, 30).await;
        // One byte flipped inside the 15th record's JSON; 15 whole records follow it.
        flip(&path, offsets[14] + (FRAME_HEAD + PAYLOAD_FIXED) as u64 + 5);
        let len = fs::metadata(&path).unwrap().len();
        let error = open(&config, &store).await.unwrap_err().to_string();
        for expected in [
            format!("{} is damaged at offset {}", path.display(), offsets[14]),
            "15 valid records follow it (seq 16 to 30".to_owned(),
            "14 records before it are intact".to_owned(),
            "palisade audit salvage".to_owned(),
        ] {
            assert!(error.contains(&expected), "{expected}: {error}");
        }
        assert_eq!(fs::metadata(&path).unwrap().len(), len, "nothing cut");
        // Every start refuses the same way until the damage is dealt with.
        assert!(open(&config, &store).await.is_err());
        let _ = fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_damaged_last_frame_is_a_torn_tail() {
        let dir = temp_dir("last");
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let config = SegmentConfig::new(&dir);
        let (chain, path, offsets) = one_file(&config, &store, 10).await;
        flip(&path, offsets[9] + (FRAME_HEAD + PAYLOAD_FIXED) as u64 + 5);
        let logs = open(&config, &store).await.unwrap();
        assert_eq!(logs[0].chain(), chain, "the chain continues");
        assert_eq!(fs::metadata(&path).unwrap().len(), offsets[9], "the last frame is cut");
        logs[0].append(&sample_record(10)).await.unwrap();
        ship_all(&logs, &store).await;
        let report = store.verify_chain().await.unwrap();
        assert!(report.is_intact(), "{report:?}");
        assert_eq!((report.records, report.chains), (10, 1));
        let _ = fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn salvage_shows_the_damage_and_keeps_every_record_after_it_in_a_new_chain() {
        let dir = temp_dir("salvage");
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let config = SegmentConfig::new(&dir);
        let (chain, path, offsets) = one_file(&config, &store, 30).await;
        flip(&path, offsets[14] + (FRAME_HEAD + PAYLOAD_FIXED) as u64 + 5);
        let original = fs::read(&path).unwrap();

        // Looking changes nothing.
        let report = salvage(&config, &store, false, 1_000).await.unwrap();
        assert_eq!(report.len(), 1);
        let damage = report[0].damage.as_ref().expect("damage found");
        assert_eq!((damage.offset, damage.records_before, damage.following), (offsets[14], 14, 15));
        assert_eq!(damage.following_seqs, Some((16, 30)));
        assert!(report[0].applied.is_none());
        assert_eq!(fs::read(&path).unwrap(), original);

        let report = salvage(&config, &store, true, 1_000).await.unwrap();
        let applied = report[0].applied.as_ref().expect("applied");
        assert_eq!((applied.rechained, applied.in_store), (15, 0));
        assert_eq!(fs::read(&applied.aside[0]).unwrap(), original, "the damaged file is kept whole");
        assert!(applied.aside[0].starts_with(dir.join(DAMAGED_DIR)));
        assert_eq!(fs::metadata(&path).unwrap().len(), offsets[14], "cut at the damage");
        assert_ne!(applied.chain, chain);

        // The next start takes both chains and ships them: 14 + the salvage record + 15.
        let logs = open(&config, &store).await.unwrap();
        assert_eq!(logs.len(), 2);
        ship_all(&logs, &store).await;
        let report = store.verify_chain().await.unwrap();
        assert!(report.is_intact(), "{report:?}");
        assert_eq!((report.records, report.chains), (30, 2));
        let salvaged = store.recent(50).await.unwrap();
        let marker =
            salvaged.iter().find(|record| record.record.operation == "audit.salvage").expect("the break is recorded");
        assert_eq!((marker.chain.as_str(), marker.seq), (applied.chain.as_str(), 1));
        let detail = marker.record.detail.as_deref().unwrap();
        assert!(
            detail.contains(&format!("chain {chain}")) && detail.contains(&format!("offset {}", offsets[14])),
            "{detail}"
        );
        assert!(detail.contains("15 re-chained"), "{detail}");
        drop(logs);
        let report = salvage(&config, &store, false, 2_000).await.unwrap();
        assert!(report.iter().all(|chain| chain.damage.is_none()), "{report:?}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn salvage_does_not_rechain_what_the_store_holds_and_moves_newer_files_aside() {
        let dir = temp_dir("salvage-shipped");
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let mut config = SegmentConfig::new(&dir);
        config.max_file_bytes = 8192;
        let logs = open(&config, &store).await.unwrap();
        for n in 0..60 {
            logs[0].append(&sample_record(n)).await.unwrap();
        }
        let (files, _) = logs[0].view();
        assert!(files.len() > 2);
        let chain = logs[0].chain().to_owned();
        drop(logs);
        // The first 50 records shipped (the files not deleted yet).
        let mut stored = Vec::new();
        let mut next = (1, GENESIS_HASH);
        for file in &files {
            let (records, _, _) =
                read_frames(&File::open(&file.path).unwrap(), &chain, HEADER_LEN, u64::MAX, next, usize::MAX).unwrap();
            next = records.last().map(|record| (record.seq + 1, record.hash)).unwrap_or(next);
            stored.extend(records);
        }
        assert_eq!(stored.len(), 60);
        store.ship(&chain, stored[..50].to_vec()).await.unwrap();
        // Damage in the middle of the first file.
        let first_len = fs::metadata(&files[0].path).unwrap().len();
        flip(&files[0].path, first_len / 2);
        let report = salvage(&config, &store, true, 1_000).await.unwrap();
        let damage = report[0].damage.as_ref().unwrap();
        let applied = report[0].applied.as_ref().unwrap();
        assert_eq!(damage.later_files.len(), files.len() - 1);
        assert_eq!(applied.in_store + applied.rechained, damage.following);
        assert_eq!(applied.rechained, 10, "only seq 51 to 60 are not in the store");
        assert_eq!(applied.aside.len(), files.len());
        for file in &files[1..] {
            assert!(!file.path.exists(), "newer files moved aside");
        }
        let logs = open(&config, &store).await.unwrap();
        ship_all(&logs, &store).await;
        let report = store.verify_chain().await.unwrap();
        assert!(report.is_intact(), "{report:?}");
        assert_eq!(report.chains, 2);
        let _ = fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn rotated_files_ship_in_order_and_shipped_ones_are_deleted() {
        let dir = temp_dir("rotate");
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let mut config = SegmentConfig::new(&dir);
        config.max_file_bytes = 8192;
        config.durability = Durability::Power;
        let logs = open(&config, &store).await.unwrap();
        for n in 0..100 {
            logs[0].append(&sample_record(n)).await.unwrap();
        }
        assert!(logs[0].view().0.len() > 3);
        ship_all(&logs, &store).await;
        // Every file but the newest is gone; every record is in the store, in one chain.
        assert_eq!(logs[0].view().0.len(), 1);
        let report = store.verify_chain().await.unwrap();
        assert!(report.is_intact(), "{report:?}");
        assert_eq!(report.records, 100);
        let _ = fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_chain_held_by_another_process_is_left_alone_and_a_new_one_begins() {
        let dir = temp_dir("held");
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let config = SegmentConfig::new(&dir);
        let first = open(&config, &store).await.unwrap();
        let second = open(&config, &store).await.unwrap();
        assert_ne!(first[0].chain(), second[0].chain());
        assert_eq!(second.len(), 1);
        let _ = fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_store_ahead_of_the_segment_starts_a_new_chain_instead_of_forking() {
        let dir = temp_dir("ahead");
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let config = SegmentConfig::new(&dir);
        let logs = open(&config, &store).await.unwrap();
        for n in 0..4 {
            logs[0].append(&sample_record(n)).await.unwrap();
        }
        ship_all(&logs, &store).await;
        let (files, _) = logs[0].view();
        let chain = logs[0].chain().to_owned();
        drop(logs);
        // The last two records lost from the file (a power loss after shipping).
        let (records, _, _) =
            read_frames(&File::open(&files[0].path).unwrap(), &chain, HEADER_LEN, u64::MAX, (1, GENESIS_HASH), 2)
                .unwrap();
        let keep = HEADER_LEN
            + records
                .iter()
                .map(|r| (FRAME_HEAD + PAYLOAD_FIXED + r.record.canonical_bytes().len()) as u64)
                .sum::<u64>();
        OpenOptions::new().write(true).open(&files[0].path).unwrap().set_len(keep).unwrap();
        let logs = open(&config, &store).await.unwrap();
        let live = logs.iter().find(|log| log.is_live()).unwrap();
        assert_ne!(live.chain(), chain, "never continues behind the store");
        live.append(&sample_record(9)).await.unwrap();
        ship_all(&logs, &store).await;
        let report = store.verify_chain().await.unwrap();
        assert!(report.is_intact(), "{report:?}");
        assert_eq!((report.records, report.chains), (5, 2));
        let _ = fs::remove_dir_all(&dir);
    }
}
