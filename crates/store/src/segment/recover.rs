//! Reading a chain's files back: the walk that checks every frame, damage found past a bad one, and recovery of a torn tail.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::StoreError;
use crate::record::AuditRecord;

use super::format::*;

/// One `.seg` file of a chain.
#[derive(Debug, Clone)]
pub(super) struct SegmentFile {
    pub(super) first_seq: u64,
    pub(super) path: PathBuf,
}

pub(super) struct WriterState {
    pub(super) file: Arc<File>,
    pub(super) file_len: u64,
    pub(super) files: VecDeque<SegmentFile>,
    pub(super) next_seq: u64,
    pub(super) prev_hash: [u8; 32],
    /// A write failed and could not be undone: no further append (fail closed).
    pub(super) broken: bool,
}

/// A checksummed record found while scanning past damage.
#[derive(Debug, Clone)]
pub(super) struct Found {
    pub(super) seq: u64,
    pub(super) record: AuditRecord,
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
    pub(super) found: Vec<Found>,
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
pub(super) struct Walk {
    pub(super) files: VecDeque<SegmentFile>,
    /// The newest readable file: opened, the end of its last whole frame, and its length (longer
    /// by a torn tail).
    pub(super) last: Option<(File, u64, u64)>,
    pub(super) next: Option<(u64, [u8; 32])>,
    pub(super) records: u64,
    /// The newest file, torn while being created (shorter than a header, nothing in it).
    pub(super) torn_header: Option<PathBuf>,
    pub(super) damage: Option<Damage>,
}

/// The `.seg` files of a chain directory, by first seq.
pub(super) fn segment_paths(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
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
pub(super) fn walk_chain(chain: &str, dir: &Path) -> Result<Option<Walk>, StoreError> {
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
pub(super) fn scan_frames(path: &Path, from: u64) -> std::io::Result<(Vec<Found>, u64)> {
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
pub(super) fn recover(chain: &str, dir: &Path) -> Result<Option<WriterState>, StoreError> {
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
