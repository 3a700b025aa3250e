//! The segment's tests: appends, recovery, damage, salvage and shipping against a SQLite store.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::AuditStore;
use crate::record::GENESIS_HASH;

use super::format::*;
use super::log::*;
use super::salvage::*;
use super::ship::*;
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
        read_frames(&File::open(&files[0].path).unwrap(), &chain, HEADER_LEN, u64::MAX, (1, GENESIS_HASH), 2).unwrap();
    let keep = HEADER_LEN
        + records.iter().map(|r| (FRAME_HEAD + PAYLOAD_FIXED + r.record.canonical_bytes().len()) as u64).sum::<u64>();
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
