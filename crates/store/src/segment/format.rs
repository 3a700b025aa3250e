//! The segment file format: the header, a frame's encoding and checks, and reading frames from a file.

use std::fs::File;
use std::os::unix::fs::FileExt as _;

use aws_lc_rs::digest;

use crate::record::{AuditRecord, StoredAuditRecord};

pub(super) const MAGIC: &[u8; 8] = b"PALAUD01";
pub(super) const HEADER_LEN: u64 = 8 + 32 + 8 + 32;
pub(super) const FRAME_HEAD: usize = 8;
pub(super) const PAYLOAD_FIXED: usize = 8 + 32;
/// Largest payload accepted when reading (a valid record is far smaller: 4 KiB fields).
pub(super) const MAX_PAYLOAD: usize = 4 << 20;
/// Bytes read per step while shipping or recovering.
pub(super) const READ_CHUNK: usize = 1 << 20;
/// Most records per shipped batch.
pub(super) const SHIP_BATCH: usize = 2048;

pub(super) fn hash_canonical(prev_hash: &[u8; 32], canonical: &[u8]) -> [u8; 32] {
    let mut context = digest::Context::new(&digest::SHA256);
    context.update(prev_hash);
    context.update(canonical);
    let mut hash = [0u8; 32];
    hash.copy_from_slice(context.finish().as_ref());
    hash
}

pub(super) fn encode_frame(seq: u64, hash: &[u8; 32], canonical: &[u8]) -> Vec<u8> {
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

pub(super) fn encode_header(chain: &str, first_seq: u64, prev_hash: &[u8; 32]) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_LEN as usize);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(chain.as_bytes());
    header.extend_from_slice(&first_seq.to_le_bytes());
    header.extend_from_slice(prev_hash);
    header
}

pub(super) fn decode_header(bytes: &[u8], chain: &str) -> Option<(u64, [u8; 32])> {
    if bytes.len() < HEADER_LEN as usize || &bytes[..8] != MAGIC || &bytes[8..40] != chain.as_bytes() {
        return None;
    }
    let first_seq = u64::from_le_bytes(bytes[40..48].try_into().ok()?);
    let prev_hash: [u8; 32] = bytes[48..80].try_into().ok()?;
    Some((first_seq, prev_hash))
}

/// What the frame at the front of `bytes` is.
pub(super) enum Frame {
    /// A whole, checksummed frame: `seq`, `hash`, the record's JSON, and its length.
    Whole { seq: u64, hash: [u8; 32], json_range: std::ops::Range<usize>, len: usize },
    /// Fewer bytes than the frame needs (the rest is not written yet, or was torn off).
    Short,
    /// Not a frame (bad length or checksum).
    Bad,
}

pub(super) fn parse_frame(bytes: &[u8]) -> Frame {
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
pub(super) fn read_frames(
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

pub(super) fn read_at_most(file: &File, buffer: &mut [u8], offset: u64) -> std::io::Result<usize> {
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
