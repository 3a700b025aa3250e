//! The audit record of the surfaces beside the MCP pipeline (control C11): the development
//! authorization server (stage `authorization_server`) and the gateway's web pages (stage
//! `web`). Same writer, same chain, same keyed digests as the pipeline's records; digest-only.
//!
//! - A **grant** (a registration accepted, a consent approved, a token issued, a sign-in, a
//!   connection made) is one record, written at once: [`SurfaceAudit::grant`] answers `Ok` only
//!   once it is durable, and the surface does not grant on an error (fail closed, like the
//!   pipeline's allow). `operation` is `<endpoint>/<outcome>` (`token/issued`), `decision` `allow`; the person
//!   (`issuer#subject`), tenant and client are keyed digests; `detail` is
//!   `source=<16 hex> <fixed words>`.
//! - A **refusal** is counted per (stage, endpoint, reason, status, source) and, every
//!   `transport_refusal_interval` (and at shutdown), each non-zero count becomes one record:
//!   `decision` `deny`, `operation` `<endpoint>/<reason>` (`review/token_wrong`), `code` the
//!   HTTP status, `detail`
//!   `source=<16 hex> count=<n>` — the transport refusals' form, so a flood from one source costs
//!   one record per interval, and from many at most [`MAX_KEYS`] records plus one per reason.
//!
//! The source is the first 8 bytes (hex) of the keyed audit digest of the peer's IP address (its
//! text form, IPv4-mapped addresses as IPv4), never the address; `unknown` without one, `other`
//! past [`MAX_KEYS`]. Never recorded: tokens, codes, secrets, cookies, `state` values, URLs,
//! redirect URIs, form fields.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use palisade_store::{AuditRecord, AuditWriter, Decision, StoreError};

use crate::audit::{fresh_trace_id, keyed_digest};
use crate::clock::Clock;
use crate::secret::ServerSecret;

/// Distinct (stage, reason, status, source) keys counted per interval; later sources count as
/// `other`.
pub const MAX_KEYS: usize = 1024;

/// Characters of a source digest kept in a record (8 bytes, hex).
const SOURCE_PREFIX: usize = 16;

/// The stage of the development authorization server's records.
pub const STAGE_AUTHORIZATION_SERVER: &str = "authorization_server";
/// The stage of the gateway's web pages' records.
pub const STAGE_WEB: &str = "web";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Peer(IpAddr),
    Unknown,
    Other,
}

type Key = (&'static str, &'static str, &'static str, u16, Source);

/// One grant, as recorded. Every text here is digested or a fixed word of the surface.
#[derive(Debug, Clone, Default)]
pub struct Grant<'a> {
    /// [`STAGE_WEB`] or [`STAGE_AUTHORIZATION_SERVER`].
    pub stage: &'static str,
    /// Where it was granted (`token`, `review`, …): the first half of the record's `operation`.
    pub endpoint: &'static str,
    /// What was granted, a stable code (`issued`, `signed_in`, …): `operation` is
    /// `<endpoint>/<outcome>`.
    pub outcome: &'static str,
    /// The person it was granted to: issuer and subject (digested together, as the pipeline's
    /// principal digest).
    pub person: Option<(&'a str, &'a str)>,
    /// Their tenant (digested).
    pub tenant: Option<&'a str>,
    /// The OAuth client it concerns (digested).
    pub client: Option<&'a str>,
    /// Scopes granted (scope names are the server's vocabulary, recorded as the pipeline does).
    pub scopes: Vec<String>,
    /// Fixed words or configuration ids after the source (`upstream=files`, `grant=refresh_token`).
    pub detail: Option<String>,
    /// The peer's address.
    pub source: Option<IpAddr>,
}

/// Records a surface's grants at once and its refusals aggregated (see the module).
pub struct SurfaceAudit {
    writer: Option<Arc<AuditWriter>>,
    key: aws_lc_rs::hmac::Key,
    clock: Arc<dyn Clock>,
    pending: Mutex<HashMap<Key, u64>>,
}

impl std::fmt::Debug for SurfaceAudit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SurfaceAudit").field("writer", &self.writer.is_some()).finish_non_exhaustive()
    }
}

impl SurfaceAudit {
    /// Records through `writer` (`None`: no audit log, as a server without one), digesting
    /// under `secret`'s audit-digest key (the pipeline's).
    pub fn new(writer: Option<Arc<AuditWriter>>, secret: &ServerSecret, clock: Arc<dyn Clock>) -> Self {
        Self { writer, key: secret.audit_digest_key(), clock, pending: Mutex::new(HashMap::new()) }
    }

    /// The keyed audit digest of `value` (as `Server::digest`).
    pub fn digest(&self, value: &str) -> String {
        keyed_digest(&self.key, value)
    }

    fn source_text(&self, source: Source) -> String {
        match source {
            Source::Peer(ip) => {
                let mut digest = keyed_digest(&self.key, &ip.to_string());
                digest.truncate(SOURCE_PREFIX);
                digest
            }
            Source::Unknown => "unknown".to_owned(),
            Source::Other => "other".to_owned(),
        }
    }

    fn source_of(peer: Option<IpAddr>) -> Source {
        peer.map_or(Source::Unknown, |ip| Source::Peer(ip.to_canonical()))
    }

    /// Records `grant`: `Ok` once durable (or when there is no audit log); on an error the
    /// surface must not grant.
    pub async fn grant(&self, grant: Grant<'_>) -> Result<(), StoreError> {
        let source = self.source_text(Self::source_of(grant.source));
        let operation = format!("{}/{}", grant.endpoint, grant.outcome);
        tracing::info!(stage = grant.stage, %operation, decision = "allow", "surface decision");
        let Some(writer) = &self.writer else { return Ok(()) };
        let record = AuditRecord {
            at_ms: self.clock.now_unsigned_ms(),
            trace_id: fresh_trace_id(),
            stage: grant.stage.to_owned(),
            decision: Decision::Allow,
            operation: operation.clone(),
            principal_digest: grant.person.map(|(issuer, subject)| self.digest(&format!("{issuer}#{subject}"))),
            tenant_digest: grant.tenant.map(|tenant| self.digest(tenant)),
            client_digest: grant.client.map(|client| self.digest(client)),
            scopes: grant.scopes,
            policy_version: None,
            code: None,
            detail: Some(match grant.detail {
                Some(detail) => format!("source={source} {detail}"),
                None => format!("source={source}"),
            }),
        };
        writer.append(record).await.inspect_err(|error| {
            tracing::error!(%error, stage = grant.stage, %operation, "audit log unavailable: not granted");
        })
    }

    /// Counts one refusal at `endpoint` for `reason` (a stable code; the record's `operation` is
    /// `<endpoint>/<reason>`), answered with `status`, from `peer`.
    pub fn refuse(
        &self,
        stage: &'static str,
        endpoint: &'static str,
        reason: &'static str,
        status: u16,
        peer: Option<IpAddr>,
    ) {
        tracing::info!(stage, endpoint, reason, status, decision = "deny", "surface decision");
        let source = Self::source_of(peer);
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let mut key = (stage, endpoint, reason, status, source);
        if pending.len() >= MAX_KEYS && source != Source::Unknown && !pending.contains_key(&key) {
            key.4 = Source::Other;
        }
        let count = pending.entry(key).or_insert(0);
        *count = count.saturating_add(1);
    }

    fn drain(&self) -> Vec<AuditRecord> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        let at_ms = self.clock.now_unsigned_ms();
        let mut rows: Vec<(&'static str, String, u16, String, u64)> = pending
            .into_iter()
            .map(|((stage, endpoint, reason, status, source), count)| {
                (stage, format!("{endpoint}/{reason}"), status, self.source_text(source), count)
            })
            .collect();
        rows.sort();
        rows.into_iter()
            .map(|(stage, operation, status, source, count)| AuditRecord {
                at_ms,
                trace_id: fresh_trace_id(),
                stage: stage.to_owned(),
                decision: Decision::Deny,
                operation,
                principal_digest: None,
                tenant_digest: None,
                client_digest: None,
                scopes: Vec::new(),
                policy_version: None,
                code: Some(i64::from(status)),
                detail: Some(format!("source={source} count={count}")),
            })
            .collect()
    }

    /// Writes one record per non-zero count since the last flush; returns how many were made
    /// durable. Without an audit log the counts are dropped.
    pub async fn flush(&self) -> usize {
        let records = self.drain();
        let Some(writer) = &self.writer else { return 0 };
        if records.is_empty() {
            return 0;
        }
        let total = records.len();
        let results = futures::future::join_all(records.into_iter().map(|record| writer.append(record))).await;
        let failed = results.iter().filter(|result| result.is_err()).count();
        if failed > 0 {
            tracing::error!(failed, "audit log unavailable: surface refusal records lost");
        }
        total - failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_store::AuditStore as _;

    #[tokio::test]
    async fn grants_are_written_at_once_and_refusals_counted_per_source_digest_only() {
        let store = Arc::new(palisade_store::SqliteStore::open("sqlite::memory:").await.unwrap());
        let writer = Arc::new(AuditWriter::new(store.clone(), Default::default()));
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::ManualClock::new(5_000));
        let audit = SurfaceAudit::new(Some(writer), &ServerSecret::from_bytes([9; 32]), clock);
        let peer: IpAddr = "192.0.2.7".parse().unwrap();
        audit
            .grant(Grant {
                stage: STAGE_AUTHORIZATION_SERVER,
                endpoint: "token",
                outcome: "issued",
                person: Some(("https://issuer", "alice")),
                tenant: Some("acme"),
                client: Some("dcr-secret-client"),
                scopes: vec!["shop:read".into()],
                detail: Some("grant=authorization_code".into()),
                source: Some(peer),
            })
            .await
            .unwrap();
        for _ in 0..3 {
            audit.refuse(STAGE_WEB, "review", "token_wrong", 403, Some(peer));
        }
        audit.refuse(STAGE_WEB, "surface", "origin", 403, None);
        assert_eq!(audit.flush().await, 2);
        assert_eq!(audit.flush().await, 0, "a flush empties the counts");
        let records = store.recent(10).await.unwrap();
        let source = &audit.digest("192.0.2.7")[..16];
        let mut seen: Vec<(String, String, Option<i64>, String)> = records
            .iter()
            .map(|r| {
                let r = &r.record;
                (r.stage.clone(), r.operation.clone(), r.code, r.detail.clone().unwrap_or_default())
            })
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            vec![
                (
                    "authorization_server".into(),
                    "token/issued".into(),
                    None,
                    format!("source={source} grant=authorization_code")
                ),
                ("web".into(), "review/token_wrong".into(), Some(403), format!("source={source} count=3")),
                ("web".into(), "surface/origin".into(), Some(403), "source=unknown count=1".into()),
            ]
        );
        let grant = records.iter().find(|r| r.record.operation == "token/issued").unwrap();
        assert_eq!(grant.record.principal_digest.as_deref(), Some(audit.digest("https://issuer#alice").as_str()));
        assert_eq!(grant.record.client_digest.as_deref(), Some(audit.digest("dcr-secret-client").as_str()));
        let text = format!("{records:?}");
        assert!(!text.contains("192.0.2.7") && !text.contains("dcr-secret-client") && !text.contains("alice"));
    }
}
