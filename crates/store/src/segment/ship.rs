//! The shipper: moves one chain's records from its segment files into the store.

use std::fs::{self, File};
use std::sync::Arc;

use crate::record::StoredAuditRecord;
use crate::{AuditStore, StoreError};

use super::format::*;
use super::log::*;

/// Where the shipper stands in one chain: the file it reads, the offset in it, and the record
/// expected next there.
#[derive(Debug, Clone)]
pub(super) struct Cursor {
    pub(super) first_seq: u64,
    pub(super) offset: u64,
    pub(super) next: (u64, [u8; 32]),
}

/// Moves one chain's records from its segment into the store.
#[derive(Debug)]
pub(crate) struct ChainShipper {
    pub(super) log: Arc<SegmentLog>,
    pub(super) cursor: Option<Cursor>,
    /// The store's head when shipping began: records up to it are in the store already.
    pub(super) stored_head: u64,
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
                self.log.shipped(bytes);
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
