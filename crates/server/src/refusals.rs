//! Transport refusals on the audit record (control C11: every decision on the record).
//!
//! The HTTP transport refuses some requests before they reach the pipeline: a foreign `Host` or
//! `Origin` (DNS rebinding), a wrong method, `Accept` or `Content-Type`, a body too large or too
//! slow, headers too large, a frame that is not one JSON-RPC message, a token in the URL, a
//! request head that never completes. The pipeline audits each of its own decisions one record
//! per request; these would let a flood fill the log, so they are *aggregated*:
//! [`TransportRefusals`] counts them per (reason, source) and, once per interval
//! ([`crate::ServerConfig::transport_refusal_interval`]), every non-zero count becomes one
//! [`AuditRecord`]:
//!
//! | field | value |
//! |---|---|
//! | `stage` | `transport` |
//! | `decision` | `deny` |
//! | `operation` | the reason, one of [`Reason::as_str`] (`host`, `origin`, `method`, …) |
//! | `code` | the HTTP status of the refusal (`403`, `405`, `408`, …) |
//! | `detail` | `source=<16 hex characters> count=<n>` |
//!
//! The source is the first 8 bytes (hex) of the keyed audit digest of the peer's IP address
//! (its text form, IPv4-mapped IPv6 addresses as IPv4; [`crate::Server::digest`] of that text
//! gives the full digest), never the address itself; `unknown` when the request carried no peer
//! address (an embedder serving [`crate::http::router`] without connect info), and `other` once
//! [`MAX_KEYS`] distinct (reason, source) pairs were counted in one interval. No principal,
//! header value, path or body is recorded: a refused request has no authenticated principal.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use palisade_store::{AuditRecord, AuditWriter, Decision};

use crate::pipeline::Server;

/// Distinct (reason, source) pairs counted per interval; later sources count under `other`.
pub(crate) const MAX_KEYS: usize = 1024;

/// Characters of the source digest kept in a record (8 bytes, hex).
const SOURCE_PREFIX: usize = 16;

/// Why the transport refused a request (or a connection's request head).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Reason {
    /// `Host` (or the request target's authority) not allowed, absent, or repeated: 403.
    Host,
    /// `Origin` not allowed or repeated: 403.
    Origin,
    /// A method `/mcp` does not serve: 405.
    Method,
    /// `Accept` allows neither JSON nor SSE: 406.
    Accept,
    /// `Content-Type` missing or not `application/json`: 415.
    ContentType,
    /// The body did not arrive within the body read timeout: 408.
    BodyTimeout,
    /// The body is over the limit: 413.
    BodyTooLarge,
    /// Too many or too large headers: 431.
    HeadersTooLarge,
    /// The body is not JSON: 400 (`-32700`).
    Parse,
    /// The body is JSON but not one JSON-RPC request or notification: 400 (`-32600`).
    Frame,
    /// A JSON-RPC batch: 400 (`-32600`).
    Batch,
    /// `access_token` in the URL query: 400.
    TokenInUrl,
    /// A request head that did not complete within the header read timeout: the connection is
    /// closed (nothing is sent; recorded as 408).
    HeaderTimeout,
    /// A request head HTTP could not parse (hyper answers 400 or 431 and closes).
    MalformedHttp,
}

impl Reason {
    /// Every reason, in the order of the metrics' exposition.
    pub(crate) const ALL: [Reason; 14] = [
        Reason::Host,
        Reason::Origin,
        Reason::Method,
        Reason::Accept,
        Reason::ContentType,
        Reason::BodyTimeout,
        Reason::BodyTooLarge,
        Reason::HeadersTooLarge,
        Reason::Parse,
        Reason::Frame,
        Reason::Batch,
        Reason::TokenInUrl,
        Reason::HeaderTimeout,
        Reason::MalformedHttp,
    ];

    /// The fixed name: the audit record's `operation` and the metric's `reason` label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Host => "host",
            Reason::Origin => "origin",
            Reason::Method => "method",
            Reason::Accept => "accept",
            Reason::ContentType => "content_type",
            Reason::BodyTimeout => "body_timeout",
            Reason::BodyTooLarge => "body_too_large",
            Reason::HeadersTooLarge => "headers_too_large",
            Reason::Parse => "parse",
            Reason::Frame => "frame",
            Reason::Batch => "batch",
            Reason::TokenInUrl => "token_in_url",
            Reason::HeaderTimeout => "header_timeout",
            Reason::MalformedHttp => "malformed_http",
        }
    }

    /// The HTTP status of the refusal: the audit record's `code`.
    pub(crate) fn status(self) -> u16 {
        match self {
            Reason::Host | Reason::Origin => 403,
            Reason::Method => 405,
            Reason::Accept => 406,
            Reason::ContentType => 415,
            Reason::BodyTimeout | Reason::HeaderTimeout => 408,
            Reason::BodyTooLarge => 413,
            Reason::HeadersTooLarge => 431,
            Reason::Parse | Reason::Frame | Reason::Batch | Reason::TokenInUrl | Reason::MalformedHttp => 400,
        }
    }

    /// The position in [`Reason::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Who sent a refused request, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Peer(IpAddr),
    Unknown,
    Other,
}

/// The counts of the current interval, and where they go.
pub(crate) struct TransportRefusals {
    /// The server's audit-digest key (the one principal digests use).
    key: aws_lc_rs::hmac::Key,
    writer: Mutex<Option<Arc<AuditWriter>>>,
    pending: Mutex<HashMap<(Reason, Source), u64>>,
    flusher: AtomicBool,
}

impl TransportRefusals {
    /// An aggregator digesting sources under `key`; it records nothing until it has a writer.
    pub(crate) fn new(key: aws_lc_rs::hmac::Key) -> Self {
        Self { key, writer: Mutex::new(None), pending: Mutex::new(HashMap::new()), flusher: AtomicBool::new(false) }
    }

    /// Writes future flushes through `writer` (the server's audit writer).
    pub(crate) fn attach(&self, writer: Arc<AuditWriter>) {
        *self.writer.lock().unwrap_or_else(PoisonError::into_inner) = Some(writer);
    }

    /// Counts one refusal of `reason` from `peer` (`None`: no peer address known).
    pub(crate) fn record(&self, reason: Reason, peer: Option<IpAddr>) {
        let source = match peer {
            Some(ip) => Source::Peer(ip.to_canonical()),
            None => Source::Unknown,
        };
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let key = if pending.len() >= MAX_KEYS && source != Source::Unknown && !pending.contains_key(&(reason, source))
        {
            (reason, Source::Other)
        } else {
            (reason, source)
        };
        let count = pending.entry(key).or_insert(0);
        *count = count.saturating_add(1);
    }

    /// The records of everything counted since the last flush, which is emptied; `at_ms` is
    /// their time. Ordered by reason, then source digest.
    fn drain(&self, at_ms: u64) -> Vec<AuditRecord> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        let mut buckets: Vec<(Reason, String, u64)> = pending
            .into_iter()
            .map(|((reason, source), count)| {
                let source = match source {
                    Source::Peer(ip) => {
                        let tag = aws_lc_rs::hmac::sign(&self.key, ip.to_string().as_bytes());
                        let mut digest = palisade_wire::hex(&tag.as_ref()[..16]);
                        digest.truncate(SOURCE_PREFIX);
                        digest
                    }
                    Source::Unknown => "unknown".to_owned(),
                    Source::Other => "other".to_owned(),
                };
                (reason, source, count)
            })
            .collect();
        buckets.sort();
        buckets
            .into_iter()
            .map(|(reason, source, count)| AuditRecord {
                at_ms,
                trace_id: crate::pipeline::fresh_trace_id(),
                stage: "transport".to_owned(),
                decision: Decision::Deny,
                operation: reason.as_str().to_owned(),
                principal_digest: None,
                tenant_digest: None,
                client_digest: None,
                scopes: Vec::new(),
                policy_version: None,
                code: Some(i64::from(reason.status())),
                detail: Some(format!("source={source} count={count}")),
            })
            .collect()
    }

    /// Appends one record per non-zero (reason, source) count since the last flush, at `at_ms`;
    /// returns how many were made durable. Without an audit writer the counts are dropped.
    pub(crate) async fn flush(&self, at_ms: u64) -> usize {
        let records = self.drain(at_ms);
        if records.is_empty() {
            return 0;
        }
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(writer) = writer else { return 0 };
        let total = records.len();
        // Appended together, so the writer commits them as one group.
        let results = futures::future::join_all(records.into_iter().map(|record| writer.append(record))).await;
        let failed = results.iter().filter(|result| result.is_err()).count();
        if let Some(Err(error)) = results.into_iter().find(Result::is_err) {
            tracing::error!(%error, failed, "audit log unavailable: transport refusal records lost");
        }
        total - failed
    }
}

/// Starts, once per server, the task that flushes the server's transport refusals every
/// [`crate::ServerConfig::transport_refusal_interval`], and a last time when the server shuts
/// down. Needs a Tokio runtime (without one nothing is started). The task holds the server
/// weakly: it ends when the server is dropped.
pub(crate) fn spawn_flusher(server: &Arc<Server>) {
    let refusals = server.transport_refusals();
    if refusals.flusher.swap(true, Ordering::SeqCst) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        refusals.flusher.store(false, Ordering::SeqCst);
        return;
    };
    let period = server.config().transport_refusal_interval.max(Duration::from_millis(1));
    let shutdown = server.shutdown_token().clone();
    let server = Arc::downgrade(server);
    runtime.spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let last = tokio::select! {
                biased;
                () = shutdown.cancelled() => true,
                _ = ticks.tick() => false,
            };
            let Some(server) = server.upgrade() else { return };
            server.transport_refusals().flush(server.clock().now_ms()).await;
            if last {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusals() -> TransportRefusals {
        TransportRefusals::new(aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, b"test key"))
    }

    #[test]
    fn counts_per_reason_and_source_with_digests_only() {
        let refusals = refusals();
        let one: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        for _ in 0..3 {
            refusals.record(Reason::Host, Some(one));
        }
        refusals.record(Reason::Host, Some(mapped));
        refusals.record(Reason::ContentType, Some(one));
        refusals.record(Reason::Method, None);
        let records = refusals.drain(7);
        let summary: Vec<(&str, Option<i64>, &str)> =
            records.iter().map(|r| (r.operation.as_str(), r.code, r.detail.as_deref().unwrap_or_default())).collect();
        let digest = {
            let tag = aws_lc_rs::hmac::sign(&refusals.key, b"192.0.2.1");
            palisade_wire::hex(&tag.as_ref()[..8])
        };
        assert_eq!(
            summary,
            vec![
                ("host", Some(403), format!("source={digest} count=4").as_str()),
                ("method", Some(405), "source=unknown count=1"),
                ("content_type", Some(415), format!("source={digest} count=1").as_str()),
            ]
        );
        for record in &records {
            assert_eq!((record.stage.as_str(), record.decision, record.at_ms), ("transport", Decision::Deny, 7));
            assert!(record.principal_digest.is_none() && record.scopes.is_empty());
            assert!(!record.detail.as_deref().unwrap_or_default().contains("192.0.2.1"));
            assert!(record.validate().is_ok());
        }
        assert!(refusals.drain(8).is_empty(), "a flush empties the counts");
    }

    #[test]
    fn past_the_key_limit_sources_count_as_other() {
        let refusals = refusals();
        for i in 0..(MAX_KEYS as u32 + 10) {
            refusals.record(Reason::Origin, Some(IpAddr::from((0x0a00_0000 + i).to_be_bytes())));
        }
        // Sources already counted keep their own bucket; unknown is never merged.
        refusals.record(Reason::Origin, Some(IpAddr::from(0x0a00_0000u32.to_be_bytes())));
        refusals.record(Reason::Parse, None);
        let records = refusals.drain(1);
        assert!(records.len() <= MAX_KEYS + 2, "{}", records.len());
        let detail = |source: &str| {
            records
                .iter()
                .filter(|r| r.detail.as_deref().is_some_and(|d| d.starts_with(&format!("source={source} "))))
                .map(|r| r.detail.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        };
        assert_eq!(detail("other"), ["source=other count=10"]);
        assert_eq!(detail("unknown"), ["source=unknown count=1"]);
        let total: u64 =
            records.iter().filter_map(|r| r.detail.as_deref()?.rsplit("count=").next()?.parse::<u64>().ok()).sum();
        assert_eq!(total, MAX_KEYS as u64 + 10 + 2);
    }
}
