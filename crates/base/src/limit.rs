//! Token buckets per source address, for the unauthenticated endpoints that must not be
//! flooded: a bucket of `burst` tokens per source, refilled at one token per `refill_ms`, and one
//! shared bucket over every source. An attempt takes one token from its source's bucket and one
//! from the shared one, before any work is done; without both it is refused at once.
//!
//! - IPv6 sources are counted per /64 (one host usually holds a whole /64); IPv4-mapped IPv6
//!   addresses as their IPv4 address.
//! - The table is bounded: past `max_sources` sources, buckets that have refilled completely are
//!   dropped (they say nothing a new bucket would not); if none has, a new source is refused
//!   (fail closed) until some bucket refills.
//! - [`SourceLimiter::refund`] gives a token back (an attempt that turned out fine, such as a
//!   correct sign-in, need not count against its source).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

/// The shape of one limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tokens of one source's bucket (attempts in a burst).
    pub burst: u32,
    /// Milliseconds to refill one token of a source's bucket.
    pub refill_ms: u64,
    /// Tokens of the shared bucket.
    pub total_burst: u32,
    /// Milliseconds to refill one token of the shared bucket.
    pub total_refill_ms: u64,
    /// Sources kept at once.
    pub max_sources: usize,
}

/// Why an attempt was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its source used up its bucket.
    Source,
    /// Every source together used up the shared bucket, or the table is full.
    Total,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens, in thousandths (so refill is exact in integers).
    milli: u64,
    /// When `milli` was last brought up to date, in ms.
    at_ms: i64,
}

impl Bucket {
    fn full(burst: u32, now_ms: i64) -> Self {
        Self { milli: u64::from(burst) * 1000, at_ms: now_ms }
    }

    fn refill(&mut self, burst: u32, refill_ms: u64, now_ms: i64) {
        let elapsed = u64::try_from(now_ms.saturating_sub(self.at_ms)).unwrap_or(0);
        let gained = elapsed.saturating_mul(1000) / refill_ms.max(1);
        self.milli = self.milli.saturating_add(gained).min(u64::from(burst) * 1000);
        self.at_ms = self.at_ms.max(now_ms);
    }

    fn is_full(&self, burst: u32) -> bool {
        self.milli >= u64::from(burst) * 1000
    }
}

#[derive(Debug)]
struct Table {
    sources: HashMap<IpAddr, Bucket>,
    total: Bucket,
}

/// Token buckets per source and in total (see the module documentation).
#[derive(Debug)]
pub struct SourceLimiter {
    limits: Limits,
    table: Mutex<Table>,
}

/// The key an address is counted under: IPv4 as is, IPv6 by its /64.
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let mut octets = v6.octets();
            octets[8..].fill(0);
            IpAddr::from(octets)
        }
        v4 => v4,
    }
}

impl SourceLimiter {
    /// A limiter of `limits`, every bucket full.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            table: Mutex::new(Table { sources: HashMap::new(), total: Bucket::full(limits.total_burst, 0) }),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // Only counters: a panic elsewhere cannot leave them unsafe to read.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one token of `source`'s bucket and one of the shared bucket at `now_ms`, or says
    /// why not (then nothing is taken). `None` (no address known) counts under one shared
    /// unknown source.
    pub fn try_take(&self, source: Option<IpAddr>, now_ms: i64) -> Result<(), Refusal> {
        let limits = self.limits;
        let key = source.map_or(IpAddr::from([0u8; 16]), source_key);
        let mut table = self.table();
        let table = &mut *table;
        table.total.refill(limits.total_burst, limits.total_refill_ms, now_ms);
        if !table.sources.contains_key(&key) && table.sources.len() >= limits.max_sources {
            table.sources.retain(|_, bucket| {
                bucket.refill(limits.burst, limits.refill_ms, now_ms);
                !bucket.is_full(limits.burst)
            });
            if table.sources.len() >= limits.max_sources {
                return Err(Refusal::Total);
            }
        }
        let bucket = table.sources.entry(key).or_insert_with(|| Bucket::full(limits.burst, now_ms));
        bucket.refill(limits.burst, limits.refill_ms, now_ms);
        if bucket.milli < 1000 {
            return Err(Refusal::Source);
        }
        if table.total.milli < 1000 {
            return Err(Refusal::Total);
        }
        bucket.milli -= 1000;
        table.total.milli -= 1000;
        Ok(())
    }

    /// Gives back the token an attempt of `source` took (to its bucket and the shared one).
    pub fn refund(&self, source: Option<IpAddr>) {
        let limits = self.limits;
        let key = source.map_or(IpAddr::from([0u8; 16]), source_key);
        let mut table = self.table();
        table.total.milli = (table.total.milli + 1000).min(u64::from(limits.total_burst) * 1000);
        if let Some(bucket) = table.sources.get_mut(&key) {
            bucket.milli = (bucket.milli + 1000).min(u64::from(limits.burst) * 1000);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { burst: 3, refill_ms: 1000, total_burst: 5, total_refill_ms: 100, max_sources: 4 };

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn a_source_gets_its_burst_then_refills_one_token_per_interval() {
        let limiter = SourceLimiter::new(LIMITS);
        for _ in 0..3 {
            assert_eq!(limiter.try_take(ip("192.0.2.1"), 0), Ok(()));
        }
        assert_eq!(limiter.try_take(ip("192.0.2.1"), 0), Err(Refusal::Source));
        // The same address as IPv4-mapped IPv6 is the same source.
        assert_eq!(limiter.try_take(ip("::ffff:192.0.2.1"), 999), Err(Refusal::Source));
        assert_eq!(limiter.try_take(ip("192.0.2.1"), 1000), Ok(()));
        assert_eq!(limiter.try_take(ip("192.0.2.1"), 1000), Err(Refusal::Source));
        // Another source has its own bucket.
        assert_eq!(limiter.try_take(ip("192.0.2.2"), 1000), Ok(()));
    }

    #[test]
    fn ipv6_sources_count_per_64_and_the_total_caps_every_source() {
        let limiter = SourceLimiter::new(LIMITS);
        for host in 1..=3 {
            assert_eq!(limiter.try_take(ip(&format!("2001:db8::{host}")), 0), Ok(()));
        }
        assert_eq!(limiter.try_take(ip("2001:db8::ffff:1"), 0), Err(Refusal::Source));
        assert_eq!(limiter.try_take(ip("2001:db8:0:1::1"), 0), Ok(()));
        assert_eq!(limiter.try_take(ip("192.0.2.9"), 0), Ok(()));
        // Five taken in total: a fresh source is refused by the shared bucket.
        assert_eq!(limiter.try_take(ip("192.0.2.10"), 0), Err(Refusal::Total));
        assert_eq!(limiter.try_take(ip("192.0.2.10"), 100), Ok(()));
    }

    #[test]
    fn a_refund_gives_the_token_back_and_a_full_table_refuses_new_sources() {
        let limiter = SourceLimiter::new(Limits { total_burst: 100, ..LIMITS });
        for _ in 0..3 {
            assert_eq!(limiter.try_take(ip("192.0.2.1"), 0), Ok(()));
        }
        limiter.refund(ip("192.0.2.1"));
        assert_eq!(limiter.try_take(ip("192.0.2.1"), 0), Ok(()));
        for n in 2..=4 {
            assert_eq!(limiter.try_take(ip(&format!("192.0.2.{n}")), 0), Ok(()));
        }
        // Four sources, none refilled: a fifth is refused; once they refill it is admitted.
        assert_eq!(limiter.try_take(ip("192.0.2.5"), 0), Err(Refusal::Total));
        assert_eq!(limiter.try_take(ip("192.0.2.5"), 3000), Ok(()));
        assert_eq!(limiter.try_take(None, 3000), Ok(()));
    }
}
