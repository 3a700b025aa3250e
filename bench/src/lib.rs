//! Shared pieces of the benchmark binaries: the loopback-only rule the HTTP ones enforce, the
//! `tools/call` requests the load generator sends, latency percentiles, CPU time from `/proc` (of a
//! process or a whole process group), and a throw-away PostgreSQL schema for the in-process store
//! benchmarks.
//!
//! The benchmark drives servers (some unauthenticated) as hard as it can, so neither binary ever
//! talks to, or listens on, anything but a loopback address.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{Value, json};

/// The tool [`DEFAULT_TOOLS_CALL`] calls.
pub const DEFAULT_TOOL: &str = "test_simple_text";

/// The default request: a 2026-07-28 `tools/call` of the conformance fixture's simplest tool,
/// with the `_meta` every request of that revision must carry.
pub const DEFAULT_TOOLS_CALL: &str = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_simple_text","arguments":{},"#,
    r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","#,
    r#""io.modelcontextprotocol/clientCapabilities":{}}}}"#
);

/// A 2026-07-28 `tools/call` of `tool` with `arguments`, shaped like [`DEFAULT_TOOLS_CALL`].
pub fn tools_call(tool: &str, arguments: Value) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": palisade_wire::PROTOCOL_VERSION,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    })
    .to_string()
}

/// `Ok` when every address is loopback, otherwise an error naming the first one that is not.
pub fn require_loopback<'a>(addrs: impl IntoIterator<Item = &'a SocketAddr>) -> anyhow::Result<()> {
    let mut any = false;
    for addr in addrs {
        any = true;
        if !addr.ip().is_loopback() {
            anyhow::bail!("refusing {addr}: the benchmark only runs against loopback addresses");
        }
    }
    anyhow::ensure!(any, "no address to check");
    Ok(())
}

/// The `q` quantile (0..=1) of sorted `latencies`, in microseconds (0 when empty).
pub fn percentile_us(latencies: &[std::time::Duration], q: f64) -> u128 {
    let index = ((latencies.len() as f64 - 1.0) * q).max(0.0) as usize;
    latencies.get(index).map_or(0, |d| d.as_micros())
}

/// A fresh schema on the PostgreSQL server at `url`, dropped by [`PgSchema::drop`].
pub struct PgSchema {
    admin: sqlx::PgPool,
    name: String,
    /// `url` with the schema as its search path.
    pub url: String,
}

impl PgSchema {
    /// Creates a schema named after `prefix` and this process.
    pub async fn create(url: &str, prefix: &str) -> anyhow::Result<Self> {
        let name = format!("{prefix}_{}", std::process::id());
        let admin = sqlx::PgPool::connect(url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}"))).execute(&admin).await?;
        let separator = if url.contains('?') { '&' } else { '?' };
        Ok(Self { url: format!("{url}{separator}options[search_path]={name}"), admin, name })
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) -> anyhow::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", self.name))).execute(&self.admin).await?;
        Ok(())
    }
}

/// utime + stime of `/proc/<pid>/stat` (`pid` may be `self`), in seconds (the kernel reports
/// USER_HZ = 100 ticks/s). `None` where there is no Linux `/proc`.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// utime + stime, in clock ticks, of every process in process group `pgid` now, by pid (the
/// fields after the command name of each `/proc/<pid>/stat`: pgrp is the third, utime and stime
/// the twelfth and thirteenth). `None` where there is no Linux `/proc`.
pub fn group_cpu_ticks(pgid: u32) -> Option<BTreeMap<u32, u64>> {
    let mut ticks = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        // A process may exit between the listing and the read: it is simply not counted.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|group| group.parse::<u32>().ok()) != Some(pgid) {
            continue;
        }
        let used = fields.get(11).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0)
            + fields.get(12).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
        ticks.insert(pid, used);
    }
    Some(ticks)
}

/// CPU seconds a process group used between two [`group_cpu_ticks`] snapshots: a process in
/// `after` but not in `before` counts from zero; one that exited in between is lost (its last
/// interval uncounted).
pub fn group_cpu_seconds_between(before: &BTreeMap<u32, u64>, after: &BTreeMap<u32, u64>) -> f64 {
    let ticks: u64 = after.iter().map(|(pid, &now)| now.saturating_sub(before.get(pid).copied().unwrap_or(0))).sum();
    ticks as f64 / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_group_is_counted_over_its_members() {
        // This test's own process group holds at least this process.
        let stat = std::fs::read_to_string("/proc/self/stat").expect("Linux /proc");
        let fields: Vec<&str> = stat.rsplit_once(')').expect("a stat line").1.split_whitespace().collect();
        let pgid: u32 = fields[2].parse().expect("a pgrp");
        let group = group_cpu_ticks(pgid).expect("Linux /proc");
        assert!(group.contains_key(&std::process::id()));
        let before = BTreeMap::from([(1, 10), (2, 5)]);
        let after = BTreeMap::from([(1, 15), (3, 7)]);
        assert!((group_cpu_seconds_between(&before, &after) - 0.12).abs() < 1e-9);
    }

    #[test]
    fn only_loopback_passes() {
        let ok: Vec<SocketAddr> = ["127.0.0.1:1", "127.8.9.10:2", "[::1]:3"].iter().flat_map(|a| a.parse()).collect();
        assert!(require_loopback(&ok).is_ok());
        for bad in ["10.0.0.1:80", "0.0.0.0:80", "[::]:80", "192.168.1.1:80"] {
            let addr: SocketAddr = bad.parse().expect("a socket address");
            assert!(require_loopback(&[addr]).is_err(), "{bad}");
        }
        assert!(require_loopback(&[]).is_err());
    }

    #[test]
    fn the_default_request_is_a_tools_call_with_meta() {
        let frame: serde_json::Value = serde_json::from_str(DEFAULT_TOOLS_CALL).expect("valid JSON");
        assert_eq!(frame["method"], "tools/call");
        assert_eq!(frame["params"]["name"], "test_simple_text");
        assert_eq!(frame["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"], "2026-07-28");
    }

    #[test]
    fn tools_call_matches_the_default_shape() {
        let default: Value = serde_json::from_str(DEFAULT_TOOLS_CALL).expect("valid JSON");
        let built: Value = serde_json::from_str(&tools_call(DEFAULT_TOOL, json!({}))).expect("valid JSON");
        assert_eq!(built, default);
        let product: Value =
            serde_json::from_str(&tools_call("product_get", json!({ "sku": "TEA-001" }))).expect("valid JSON");
        assert_eq!(product["params"]["name"], "product_get");
        assert_eq!(product["params"]["arguments"]["sku"], "TEA-001");
    }
}
