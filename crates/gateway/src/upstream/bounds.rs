//! What one upstream can make the gateway hold, bounded: a line reader that keeps at most a cap
//! of bytes of a line and discards (counting, never allocating) the rest, the limit on
//! concurrent answers to server-to-client requests, the change stream's byte and message-rate
//! caps, and the per-upstream counters of what was dropped because of them.
//!
//! The bounds (SECURITY.md, "Gateway → upstream"):
//! - a stdio server's stderr: [`MAX_STDERR_LINE`] bytes kept of one line, the rest of the line
//!   discarded as it is read;
//! - a stdio server's stdout frame and an event of an event stream: the upstream's
//!   `max_response_bytes` (a larger one is a protocol error, never an allocation);
//! - answers to server-to-client requests being sent at once (refusals, and answers the gateway
//!   relays or gives): [`MAX_CONCURRENT_REFUSALS`] per upstream (one outbound connection each at
//!   most); past it the answer is dropped unsent;
//! - a change stream: [`CHANGE_STREAM_MAX_BYTES`] bytes over its life, and messages at
//!   [`CHANGE_STREAM_PER_SECOND`] a second after a burst of [`CHANGE_STREAM_BURST`]; past
//!   either the stream is closed (the gateway re-opens it with backoff).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(test)]
use std::time::Duration;
use std::time::Instant;

use serde::Serialize;
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Longest stderr line kept (and logged); the rest of the line is discarded as it is read.
pub const MAX_STDERR_LINE: usize = 1024;
/// Most refusals of server-to-client requests in flight at once, per upstream.
pub const MAX_CONCURRENT_REFUSALS: usize = 8;
/// Most bytes one change stream may carry before it is closed (16 MiB).
pub const CHANGE_STREAM_MAX_BYTES: usize = 16 * 1024 * 1024;
/// Messages a change stream may carry at once before the rate applies.
pub const CHANGE_STREAM_BURST: u32 = 64;
/// Messages a second a change stream may carry after its burst.
pub const CHANGE_STREAM_PER_SECOND: u32 = 8;
/// Idle pooled connections kept per upstream.
pub(super) const MAX_IDLE_CONNECTIONS: usize = 16;

/// What the bounds dropped, per upstream (counters since the gateway started).
#[derive(Debug, Default)]
pub(super) struct Drops {
    stderr_bytes: AtomicU64,
    oversized_messages: AtomicU64,
    refusals: AtomicU64,
    change_streams_cut: AtomicU64,
}

/// What the operator sees of [`Drops`] (`gateway status`, under an upstream's health).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DropReport {
    /// Bytes of a stdio server's stderr neither kept nor logged (past the line cap or the log
    /// cap).
    pub stderr_bytes: u64,
    /// Stdout frames and event-stream events refused for their size (each failed its call or
    /// closed its stream).
    pub oversized_messages: u64,
    /// Server-to-client requests dropped unanswered because the refusals in flight were at
    /// their cap.
    pub refusals: u64,
    /// Change streams closed for passing their byte or message-rate cap.
    pub change_streams_cut: u64,
}

impl Drops {
    pub(super) fn stderr_bytes(&self, bytes: usize) {
        self.stderr_bytes.fetch_add(u64::try_from(bytes).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub(super) fn oversized_message(&self) {
        self.oversized_messages.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a dropped refusal; the new total.
    fn refusal(&self) -> u64 {
        self.refusals.fetch_add(1, Ordering::Relaxed).saturating_add(1)
    }

    pub(super) fn change_stream_cut(&self) {
        self.change_streams_cut.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn report(&self) -> DropReport {
        DropReport {
            stderr_bytes: self.stderr_bytes.load(Ordering::Relaxed),
            oversized_messages: self.oversized_messages.load(Ordering::Relaxed),
            refusals: self.refusals.load(Ordering::Relaxed),
            change_streams_cut: self.change_streams_cut.load(Ordering::Relaxed),
        }
    }
}

/// What [`read_line_bounded`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LineRead {
    /// Bytes taken from the reader, the newline included (0: the stream had ended).
    pub consumed: usize,
    /// Bytes of the line past the cap, discarded (not kept in the line).
    pub discarded: usize,
}

/// What to do with the rest of a line past the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Overflow {
    /// Read and discard it up to the newline (counted in [`LineRead::discarded`], and as
    /// stderr bytes in `stderr_drops` as it goes): the next call starts at the next line.
    Discard,
    /// Stop at once, the rest unread; [`LineRead::discarded`] is 1 or more. The reader is then
    /// mid-line: for a stream that is given up.
    Stop,
}

/// Reads one line (its newline not kept) into `line`, which the caller cleared: at most `cap`
/// bytes of it are kept, and `line` never grows past `cap` bytes of capacity; what lies beyond
/// is read in the reader's own fixed buffer and discarded, or not read at all
/// ([`Overflow::Stop`]). A last line without a newline ends at the end of the stream.
pub(super) async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    cap: usize,
    overflow: Overflow,
    stderr_drops: Option<&Drops>,
) -> io::Result<LineRead> {
    let mut read = LineRead { consumed: 0, discarded: 0 };
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(read);
        }
        let (chunk, used, done) = match buffer.iter().position(|b| *b == b'\n') {
            Some(end) => (&buffer[..end], end + 1, true),
            None => (buffer, buffer.len(), false),
        };
        let room = cap.saturating_sub(line.len());
        let kept = chunk.len().min(room);
        if kept > 0 {
            // Grow geometrically, but never past the cap.
            let want = (line.len() + kept).max(line.capacity().saturating_mul(2)).min(cap);
            if want > line.capacity() {
                line.reserve_exact(want - line.len());
            }
            line.extend_from_slice(&chunk[..kept]);
        }
        let excess = chunk.len() - kept;
        if excess > 0 && overflow == Overflow::Stop {
            reader.consume(kept);
            read.consumed += kept;
            read.discarded += excess;
            return Ok(read);
        }
        read.discarded += excess;
        if excess > 0
            && let Some(drops) = stderr_drops
        {
            drops.stderr_bytes(excess);
        }
        reader.consume(used);
        read.consumed += used;
        if done {
            return Ok(read);
        }
    }
}

/// The cap on concurrent refusals of server-to-client requests of one upstream.
#[derive(Debug)]
pub(super) struct RefusalLimit {
    permits: Arc<Semaphore>,
}

impl RefusalLimit {
    pub(super) fn new(cap: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(cap)) }
    }

    /// A permit for one refusal, held until it is done; `None` (counted in `drops`, logged at
    /// the first drop and at every power of two) when the cap is reached.
    pub(super) fn try_start(&self, upstream: &str, drops: &Drops) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Some(permit);
        }
        let total = drops.refusal();
        if total.is_power_of_two() {
            tracing::warn!(%upstream, dropped_total = total, cap = MAX_CONCURRENT_REFUSALS, "upstream sent more server-to-client requests than the gateway refuses at once: dropped unanswered");
        } else {
            tracing::debug!(%upstream, dropped_total = total, "server-to-client request dropped unanswered");
        }
        None
    }
}

/// A token bucket: `burst` messages at once, then `per_second`.
#[derive(Debug)]
pub(super) struct RateLimit {
    burst: f64,
    per_second: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    pub(super) fn new(burst: u32, per_second: u32, now: Instant) -> Self {
        Self { burst: f64::from(burst), per_second: f64::from(per_second), tokens: f64::from(burst), last: now }
    }

    /// Whether one more message is within the rate at `now`.
    pub(super) fn allow(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.per_second).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long the rate needs to grant one more message.
    fn rate_period() -> Duration {
        Duration::from_secs(1) / CHANGE_STREAM_PER_SECOND
    }

    /// An in-memory reader of `size` bytes of `byte`, then `tail`, served in 8 KiB reads.
    fn reader(size: usize, tail: &[u8]) -> tokio::io::BufReader<std::io::Cursor<Vec<u8>>> {
        let mut bytes = vec![b'x'; size];
        bytes.extend_from_slice(tail);
        tokio::io::BufReader::with_capacity(8192, std::io::Cursor::new(bytes))
    }

    #[tokio::test]
    async fn a_10_mib_line_without_newline_is_capped_and_its_rest_counted() {
        let size = 10 * 1024 * 1024;
        let mut input = reader(size, b"");
        let drops = Drops::default();
        let mut line = Vec::new();
        let read = read_line_bounded(&mut input, &mut line, 1024, Overflow::Discard, Some(&drops)).await.unwrap();
        assert_eq!(read, LineRead { consumed: size, discarded: size - 1024 });
        assert_eq!(line.len(), 1024);
        assert!(line.capacity() <= 1024, "the kept line never grows past its cap: {}", line.capacity());
        assert_eq!(drops.report().stderr_bytes, u64::try_from(size - 1024).unwrap());
        line.clear();
        let end = read_line_bounded(&mut input, &mut line, 1024, Overflow::Discard, None).await.unwrap();
        assert_eq!(end, LineRead { consumed: 0, discarded: 0 });
    }

    #[tokio::test]
    async fn the_line_after_an_overlong_one_is_read_whole() {
        let mut input = reader(5000, b"\nshort\nlast");
        let mut line = Vec::new();
        let first = read_line_bounded(&mut input, &mut line, 100, Overflow::Discard, None).await.unwrap();
        assert_eq!(first, LineRead { consumed: 5001, discarded: 4900 });
        assert!(line.capacity() <= 100);
        line.clear();
        let second = read_line_bounded(&mut input, &mut line, 100, Overflow::Discard, None).await.unwrap();
        assert_eq!((second, line.as_slice()), (LineRead { consumed: 6, discarded: 0 }, &b"short"[..]));
        line.clear();
        let third = read_line_bounded(&mut input, &mut line, 100, Overflow::Discard, None).await.unwrap();
        assert_eq!((third, line.as_slice()), (LineRead { consumed: 4, discarded: 0 }, &b"last"[..]));
    }

    #[tokio::test]
    async fn stop_leaves_the_rest_of_an_overlong_frame_unread() {
        let size = 10 * 1024 * 1024;
        let mut input = reader(size, b"\n");
        let mut line = Vec::new();
        let read = read_line_bounded(&mut input, &mut line, 4096, Overflow::Stop, None).await.unwrap();
        assert_eq!(read.consumed, 4096);
        assert!(read.discarded > 0);
        assert_eq!(line.len(), 4096);
        assert!(line.capacity() <= 4096);
        // Only what the reader's own fixed buffer took in was read from the source.
        assert!(input.get_ref().position() <= 4096 + 8192);
    }

    #[tokio::test]
    async fn refusals_past_the_cap_are_dropped_and_counted_until_one_ends() {
        let limit = RefusalLimit::new(MAX_CONCURRENT_REFUSALS);
        let drops = Drops::default();
        let extra = 1992;
        let held: Vec<_> = (0..MAX_CONCURRENT_REFUSALS + extra).filter_map(|_| limit.try_start("up", &drops)).collect();
        assert_eq!(held.len(), MAX_CONCURRENT_REFUSALS);
        assert_eq!(drops.report().refusals, u64::try_from(extra).unwrap());
        drop(held);
        assert!(limit.try_start("up", &drops).is_some(), "a finished refusal frees its place");
    }

    #[test]
    fn the_rate_allows_a_burst_then_the_rate() {
        let start = Instant::now();
        let mut rate = RateLimit::new(CHANGE_STREAM_BURST, CHANGE_STREAM_PER_SECOND, start);
        for _ in 0..CHANGE_STREAM_BURST {
            assert!(rate.allow(start));
        }
        assert!(!rate.allow(start), "past the burst at once");
        assert!(rate.allow(start + rate_period()), "one more after one period");
        assert!(!rate.allow(start + rate_period()));
        let later = start + Duration::from_secs(3600);
        let granted = (0..1000).filter(|_| rate.allow(later)).count();
        assert_eq!(
            granted,
            usize::try_from(CHANGE_STREAM_BURST).unwrap(),
            "a long quiet refills no more than the burst"
        );
    }
}
