//! Salvage of a damaged chain: report where it stops and keep what follows in a new chain.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::chain::{is_chain_id, new_chain_id};
use crate::record::{AuditRecord, GENESIS_HASH};
use crate::{AuditStore, StoreError};

use super::files::*;
use super::format::*;
use super::log::*;
use super::recover::*;

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

pub(super) fn apply_salvage(
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
