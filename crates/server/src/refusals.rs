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
//! (its text form, IPv4-mapped IPv6 addresses as IPv4; `Server::digest` of that text
//! gives the full digest), never the address itself; `unknown` when the request carried no peer
//! address (an embedder serving `http::router` without connect info), and `other` once
//! [`MAX_KEYS`] distinct (reason, source) pairs were counted in one interval. No principal,
//! header value, path or body is recorded: a refused request has no authenticated principal.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use palisade_store::{AuditRecord, AuditWriter, Decision};

pub(crate) use crate::refusal_reason::Reason;

/// Distinct (reason, source) pairs counted per interval; later sources count under `other`.
pub(crate) const MAX_KEYS: usize = 1024;

/// Characters of the source digest kept in a record (8 bytes, hex).
const SOURCE_PREFIX: usize = 16;

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
    writer: Option<Arc<AuditWriter>>,
    pending: Mutex<HashMap<(Reason, Source), u64>>,
    flusher: AtomicBool,
}

impl TransportRefusals {
    /// An aggregator digesting sources under `key` and writing through `writer` (the server's
    /// audit writer); without one it records nothing.
    pub(crate) fn new(key: aws_lc_rs::hmac::Key, writer: Option<Arc<AuditWriter>>) -> Self {
        Self { key, writer, pending: Mutex::new(HashMap::new()), flusher: AtomicBool::new(false) }
    }

    /// Claims the one flushing task of these counts (`false`: one is already running).
    pub(crate) fn claim_flusher(&self) -> bool {
        !self.flusher.swap(true, Ordering::SeqCst)
    }

    /// Gives the claim back (the task could not be started).
    pub(crate) fn release_flusher(&self) {
        self.flusher.store(false, Ordering::SeqCst);
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
                        let mut digest = palisade_base::hex::hex(&tag.as_ref()[..16]);
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
                trace_id: crate::audit::fresh_trace_id(),
                stage: crate::audit::AuditStage::Transport.as_str().to_owned(),
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
        let Some(writer) = &self.writer else { return 0 };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refusals() -> TransportRefusals {
        TransportRefusals::new(aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, b"test key"), None)
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
            palisade_base::hex::hex(&tag.as_ref()[..8])
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
    fn each_reason_is_recorded_with_the_status_it_is_answered_with() {
        let statuses: Vec<(&str, u16)> = Reason::ALL.iter().map(|reason| (reason.as_str(), reason.status())).collect();
        assert_eq!(
            statuses,
            [
                ("host", 403),
                ("origin", 403),
                ("method", 405),
                ("accept", 406),
                ("content_type", 415),
                ("body_timeout", 408),
                ("body_too_large", 413),
                ("headers_too_large", 431),
                ("parse", 400),
                ("frame", 400),
                ("batch", 400),
                ("token_in_url", 400),
                ("header_timeout", 408),
                ("malformed_http", 400),
            ]
        );
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
