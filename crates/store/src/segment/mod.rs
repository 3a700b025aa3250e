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

mod files;
mod format;
mod log;
mod recover;
mod salvage;
mod ship;
mod sync;
#[cfg(test)]
mod tests;

pub use log::{Durability, SegmentConfig, SegmentLog, open};
pub use recover::Damage;
pub use salvage::{ChainSalvage, DAMAGED_DIR, Salvaged, salvage};
pub(crate) use ship::ChainShipper;
