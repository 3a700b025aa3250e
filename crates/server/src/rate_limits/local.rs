//! The in-process state of rate limits: per rule, a table of keys in shards under their own
//! locks, each key holding its GCRA timestamp and its quota window's count; and the one check
//! that reads and advances several of them together ([`check`]). The shared store's script
//! computes the same functions ([`gcra`], [`quota`]) by the store's clock.
//!
//! - A check locks each shard it needs once, in the order of its cells (rules in configuration
//!   order, so two checks never wait on each other in a circle), decides every cell, and
//!   advances them only if every one allows.
//! - Tables are bounded: past their share of [`super::MAX_KEYS_PER_RULE`] a shard drops the keys
//!   whose state says nothing any more (bucket full, quota window over); if none has, a new key
//!   is refused for a second (fail closed) rather than growing without bound.

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{Limit, Quota, Rate, Verdict};

/// Shards of one rule's table (independent locks).
const SHARDS: usize = 16;

/// How long a new key is refused while its rule's table is full of live keys.
const FULL_TABLE_WAIT_US: u64 = 1_000_000;

/// One key's state.
#[derive(Debug, Clone, Copy, Default)]
struct State {
    /// GCRA: the theoretical arrival time of the next request, in µs since the epoch.
    tat_us: u64,
    /// The quota window the count is of (index since the epoch), plus one (0: none yet).
    window: u64,
    /// Requests counted in that window.
    count: u64,
    /// When the state stops saying anything (the bucket is full again and the window over).
    idle_at_us: u64,
}

/// One rule's keys.
#[derive(Debug)]
pub struct Table {
    shards: [Mutex<HashMap<Box<str>, State>>; SHARDS],
    hasher: std::collections::hash_map::RandomState,
    max_per_shard: usize,
}

impl Table {
    /// An empty table keeping at most about `max_keys` keys.
    pub fn new(max_keys: usize) -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            hasher: std::collections::hash_map::RandomState::new(),
            max_per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    fn shard_of(&self, key: &str) -> usize {
        usize::try_from(self.hasher.hash_one(key) % SHARDS as u64).unwrap_or(0)
    }

    /// Keys held (for tests and the bound).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().unwrap_or_else(PoisonError::into_inner).len()).sum()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One state a check reads: the rule's table, the key, and the limit asked of it.
#[derive(Debug, Clone, Copy)]
pub struct Cell<'a> {
    /// The rule's table.
    pub table: &'a Table,
    /// The key within it.
    pub key: &'a str,
    /// What is asked.
    pub limit: Limit,
}

/// GCRA: with the key's theoretical arrival time `tat_us`, a request at `now_us` is allowed
/// when the new arrival time stays within `burst` intervals of now: `Ok(new tat)`; else
/// `Err(µs until it would be)`.
pub fn gcra(tat_us: u64, now_us: u64, rate: Rate) -> Result<u64, u64> {
    let new_tat = tat_us.max(now_us).saturating_add(rate.interval_us);
    let allowed_until = now_us.saturating_add(rate.interval_us.saturating_mul(u64::from(rate.burst)));
    if new_tat <= allowed_until { Ok(new_tat) } else { Err(new_tat - allowed_until) }
}

/// A fixed-window quota: with `count` requests counted in window `window` (index plus one),
/// a request at `now_us` is allowed when its window holds fewer than the limit: `Ok((window,
/// count))` after it; else `Err(µs until the next window)`.
pub fn quota(window: u64, count: u64, now_us: u64, quota: Quota) -> Result<(u64, u64), u64> {
    let length_us = quota.window_secs.saturating_mul(1_000_000).max(1);
    let current = now_us / length_us + 1;
    let count = if window == current { count } else { 0 };
    if count < quota.limit {
        Ok((current, count + 1))
    } else {
        Err((current * length_us).saturating_sub(now_us).max(1))
    }
}

/// The end of the window a quota state counts in, in µs.
fn window_end_us(window: u64, quota: Quota) -> u64 {
    window.saturating_mul(quota.window_secs.saturating_mul(1_000_000))
}

/// Checks every cell at `now_us` and advances all of them only if every one allows; a refusal
/// names the cell with the longest wait (a retry after it passes every refusing cell).
pub fn check(cells: &[Cell<'_>], now_us: u64) -> Verdict {
    type Guard<'g> = (*const Table, usize, MutexGuard<'g, HashMap<Box<str>, State>>);
    let mut guards: Vec<Guard<'_>> = Vec::with_capacity(cells.len());
    let mut slots = Vec::with_capacity(cells.len());
    for cell in cells {
        let shard = cell.table.shard_of(cell.key);
        let table: *const Table = cell.table;
        let slot = match guards.iter().position(|(t, s, _)| std::ptr::eq(*t, table) && *s == shard) {
            Some(slot) => slot,
            None => {
                let guard = cell.table.shards[shard].lock().unwrap_or_else(PoisonError::into_inner);
                guards.push((table, shard, guard));
                guards.len() - 1
            }
        };
        slots.push(slot);
    }
    // Decide every cell on a copy of its state (a rule's rate and quota share one state).
    let mut next: Vec<State> = Vec::with_capacity(cells.len());
    let mut refused: Option<(usize, u64)> = None;
    for (index, cell) in cells.iter().enumerate() {
        let earlier = (0..index).rev().find(|&i| slots[i] == slots[index] && cells[i].key == cell.key);
        let mut state = match earlier {
            Some(i) => next[i],
            None => guards[slots[index]].2.get(cell.key).copied().unwrap_or_default(),
        };
        let outcome = match cell.limit {
            Limit::Rate(rate) => gcra(state.tat_us, now_us, rate).map(|tat| {
                state.tat_us = tat;
                state.idle_at_us = state.idle_at_us.max(tat);
            }),
            Limit::Quota(q) => quota(state.window, state.count, now_us, q).map(|(window, count)| {
                state.window = window;
                state.count = count;
                state.idle_at_us = state.idle_at_us.max(window_end_us(window, q));
            }),
        };
        if let Err(wait_us) = outcome
            && refused.is_none_or(|(_, longest)| wait_us > longest)
        {
            refused = Some((index, wait_us));
        }
        next.push(state);
    }
    if let Some((cell, wait_us)) = refused {
        return Verdict::Refused { cell, wait_us };
    }
    // Room for every new key first, so that a refusal for a full table advances nothing.
    for (index, cell) in cells.iter().enumerate() {
        let max = cell.table.max_per_shard;
        let map = &mut guards[slots[index]].2;
        if !map.contains_key(cell.key) && map.len() >= max {
            map.retain(|_, state| state.idle_at_us > now_us);
            if map.len() >= max {
                tracing::warn!(keys = max * SHARDS, "a rate-limit rule's table is full of live keys: new key refused");
                return Verdict::Refused { cell: index, wait_us: FULL_TABLE_WAIT_US };
            }
        }
    }
    for (index, cell) in cells.iter().enumerate() {
        let map = &mut guards[slots[index]].2;
        match map.get_mut(cell.key) {
            Some(state) => *state = next[index],
            None => {
                map.insert(cell.key.into(), next[index]);
            }
        }
    }
    Verdict::Allowed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(requests: u32, per_secs: u64, burst: u32) -> Limit {
        Limit::Rate(Rate::new(requests, per_secs, burst).unwrap())
    }

    #[test]
    fn gcra_allows_the_burst_then_the_rate() {
        let table = Table::new(100);
        let cell = [Cell { table: &table, key: "k", limit: rate(2, 1, 3) }];
        let now = 1_000_000_000;
        for _ in 0..3 {
            assert_eq!(check(&cell, now), Verdict::Allowed);
        }
        // The fourth waits half a second (one interval at 2/s).
        assert_eq!(check(&cell, now), Verdict::Refused { cell: 0, wait_us: 500_000 });
        assert_eq!(check(&cell, now + 499_999), Verdict::Refused { cell: 0, wait_us: 1 });
        assert_eq!(check(&cell, now + 500_000), Verdict::Allowed);
        // Another key has its own bucket.
        let other = [Cell { table: &table, key: "other", limit: rate(2, 1, 3) }];
        assert_eq!(check(&other, now), Verdict::Allowed);
    }

    #[test]
    fn a_quota_resets_with_its_window() {
        let table = Table::new(100);
        let q = Limit::Quota(Quota { limit: 2, window_secs: 60 });
        let cell = [Cell { table: &table, key: "k", limit: q }];
        let start = 120_000_000; // the start of a minute
        assert_eq!(check(&cell, start + 1), Verdict::Allowed);
        assert_eq!(check(&cell, start + 2), Verdict::Allowed);
        assert_eq!(check(&cell, start + 10_000_000), Verdict::Refused { cell: 0, wait_us: 50_000_000 });
        assert_eq!(check(&cell, start + 60_000_000), Verdict::Allowed);
    }

    /// Refused by one limit, the request costs nothing under the others.
    #[test]
    fn all_or_nothing() {
        let a = Table::new(100);
        let b = Table::new(100);
        let now = 5_000_000;
        let cells = [
            Cell { table: &a, key: "k", limit: rate(1, 1, 10) },
            Cell { table: &a, key: "k", limit: Limit::Quota(Quota { limit: 100, window_secs: 3600 }) },
            Cell { table: &b, key: "k", limit: rate(1, 1, 1) },
        ];
        assert_eq!(check(&cells, now), Verdict::Allowed);
        for _ in 0..5 {
            assert!(matches!(check(&cells, now), Verdict::Refused { cell: 2, .. }));
        }
        // `a` counted one request only: nine more fit its burst of ten.
        let only_a = &cells[..2];
        for _ in 0..9 {
            assert_eq!(check(only_a, now), Verdict::Allowed);
        }
        assert!(matches!(check(only_a, now), Verdict::Refused { cell: 0, .. }));
        let state = a.shards[a.shard_of("k")].lock().unwrap()["k"];
        assert_eq!(state.count, 10, "the quota counted exactly the allowed requests");
    }

    /// A full table drops idle keys; with none idle, a new key is refused, never stored.
    #[test]
    fn the_table_is_bounded() {
        let table = Table::new(SHARDS); // one key per shard
        let limit = rate(1, 1, 1);
        let now = 1_000_000_000;
        let mut refused_new = false;
        for i in 0..200 {
            let key = format!("k{i}");
            if let Verdict::Refused { wait_us, .. } = check(&[Cell { table: &table, key: &key, limit }], now) {
                assert_eq!(wait_us, FULL_TABLE_WAIT_US);
                refused_new = true;
            }
        }
        assert!(refused_new);
        assert!(table.len() <= SHARDS);
        // A second later every bucket is full again: new keys replace them.
        assert_eq!(check(&[Cell { table: &table, key: "late", limit }], now + 1_000_000), Verdict::Allowed);
        assert!(table.len() <= SHARDS);
    }

    /// N allowed of 3N concurrent requests on one key, from many threads.
    #[test]
    fn exact_under_concurrency() {
        let table = std::sync::Arc::new(Table::new(100));
        let n = 50;
        let limit = rate(1, 3600, n);
        let now = 1_000_000_000;
        let allowed = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|scope| {
            for _ in 0..6 {
                scope.spawn(|| {
                    for _ in 0..(3 * n / 6) {
                        if check(&[Cell { table: &table, key: "shared", limit }], now) == Verdict::Allowed {
                            allowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(allowed.into_inner(), n);
    }
}
