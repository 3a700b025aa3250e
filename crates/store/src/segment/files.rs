//! A chain directory's files: creating a segment file and the private directory, syncing it, its lock.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::StoreError;

use super::format::*;

pub(super) fn create_segment_file(
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

pub(super) fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    let mut builder = fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.recursive(true);
    builder.create(dir).map_err(|error| StoreError::from_io("audit segment (creating the directory)", error))
}

pub(super) fn sync_dir(dir: &Path) {
    if let Err(error) = File::open(dir).and_then(|dir| dir.sync_all()) {
        tracing::warn!(%error, "could not sync the audit segment directory");
    }
}

/// Takes the chain's lock file without waiting: `None` if another process holds it.
pub(super) fn try_lock(dir: &Path) -> Result<Option<File>, StoreError> {
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

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
