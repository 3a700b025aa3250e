//! The 2025-era wire toward an upstream: the `initialize` handshake (2025-11-25, then
//! 2025-06-18), and one upstream session per caller partition, created lazily, never shared
//! between partitions, bounded in number (the least recently used one is evicted and DELETEd,
//! best effort).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

use super::http::Body;
use super::{Inner, Target, UpstreamError};
use crate::credentials::CallerContext;

/// Most upstream sessions held at once per upstream.
pub const MAX_SESSIONS: usize = 10_000;
/// The partition of the gateway's own session (listings, change stream).
pub const GATEWAY_PARTITION: &str = "";

/// One open upstream session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Session {
    /// The upstream's `Mcp-Session-Id` (`None`: the upstream runs without sessions).
    pub id: Option<String>,
    /// The negotiated protocol version.
    pub version: String,
}

/// One partition's place in the map: its session once opened, and when it was last used.
#[derive(Debug, Default)]
pub(super) struct Slot {
    session: tokio::sync::Mutex<Option<Session>>,
    last_used: AtomicU64,
}

/// The sessions of one upstream, by partition.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    tick: AtomicU64,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The slot of `partition` (created when absent) and, when making room evicted another
    /// partition's slot, that slot.
    fn slot(&self, partition: &str) -> (Arc<Slot>, Option<(String, Arc<Slot>)>) {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut slots = self.lock();
        if let Some(slot) = slots.get(partition) {
            slot.last_used.store(tick, Ordering::Relaxed);
            return (slot.clone(), None);
        }
        let mut evicted = None;
        if slots.len() >= MAX_SESSIONS {
            let oldest = slots
                .iter()
                .filter(|(key, _)| key.as_str() != GATEWAY_PARTITION)
                .min_by_key(|(_, slot)| slot.last_used.load(Ordering::Relaxed))
                .map(|(key, _)| key.clone());
            if let Some(key) = oldest {
                evicted = slots.remove(&key).map(|slot| (key, slot));
            }
        }
        let slot = Arc::new(Slot { session: tokio::sync::Mutex::new(None), last_used: AtomicU64::new(tick) });
        slots.insert(partition.to_owned(), slot.clone());
        (slot, evicted)
    }

    /// Forgets every session (the upstream's era changed).
    pub fn clear(&self) {
        self.lock().clear();
    }
}

impl Inner {
    /// The slot of `partition` (created if missing; the least recently used one evicted and its
    /// session closed when the map is full).
    fn partition_slot(self: &Arc<Self>, partition: &str) -> Arc<Slot> {
        let (slot, evicted) = self.sessions.slot(partition);
        if let Some(evicted) = evicted {
            self.close_evicted(evicted);
        }
        slot
    }

    /// The session of `caller.partition`, opened with `initialize` when it has none yet.
    pub(super) async fn session(
        self: &Arc<Self>,
        version: &str,
        caller: CallerContext<'_>,
        capabilities: Option<&Value>,
    ) -> Result<Session, UpstreamError> {
        let slot = self.partition_slot(caller.partition);
        let mut guard = slot.session.lock().await;
        if let Some(session) = guard.as_ref() {
            return Ok(session.clone());
        }
        let (session, _) = self.handshake(&[version], caller, capabilities).await?;
        *guard = Some(session.clone());
        Ok(session)
    }

    /// The upstream said `stale` is gone (404): opens a new session for the partition, unless a
    /// concurrent request already did.
    pub(super) async fn reopen(
        self: &Arc<Self>,
        stale: &Session,
        caller: CallerContext<'_>,
        capabilities: Option<&Value>,
    ) -> Result<Session, UpstreamError> {
        let slot = self.partition_slot(caller.partition);
        let mut guard = slot.session.lock().await;
        if let Some(current) = guard.as_ref()
            && current != stale
        {
            return Ok(current.clone());
        }
        *guard = None;
        let (session, _) = self.handshake(&[stale.version.as_str()], caller, capabilities).await?;
        *guard = Some(session.clone());
        Ok(session)
    }

    /// Sets the gateway's own session (after the connect handshake).
    pub(super) async fn set_gateway_session(&self, session: Session) {
        let (slot, _) = self.sessions.slot(GATEWAY_PARTITION);
        *slot.session.lock().await = Some(session);
    }

    /// `initialize` with each version in turn (an error answer tries the next), then
    /// `notifications/initialized`. Returns the session and the initialize result.
    pub(super) async fn handshake(
        self: &Arc<Self>,
        versions: &[&str],
        caller: CallerContext<'_>,
        capabilities: Option<&Value>,
    ) -> Result<(Session, Map<String, Value>), UpstreamError> {
        let capabilities = match capabilities {
            Some(Value::Object(caps)) => Value::Object(caps.clone()),
            _ => json!({}),
        };
        let mut last = UpstreamError::Protocol("no protocol version to offer".into());
        for version in versions {
            let mut params = Map::new();
            params.insert("protocolVersion".into(), json!(version));
            params.insert("capabilities".into(), capabilities.clone());
            params.insert("clientInfo".into(), super::messages::client_info());
            let target = Target { caller, session: None, version: None };
            let headers = super::messages::method_headers("initialize", &Map::new());
            let answer = self.exchange("initialize", params, target, &headers, super::Relays::NONE, None).await?;
            let result = match answer.body {
                Body::Result(result) => result,
                Body::Error { code, .. } => {
                    last = UpstreamError::Protocol(format!("refused initialize (code {code})"));
                    continue;
                }
            };
            let negotiated = result.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
            let Some(negotiated) = palisade_wire::LEGACY_VERSIONS.iter().find(|v| **v == negotiated) else {
                return Err(UpstreamError::Protocol(
                    "negotiated a protocol version this gateway does not speak".into(),
                ));
            };
            if !result.get("capabilities").is_some_and(Value::is_object) {
                return Err(UpstreamError::Protocol("answered initialize without capabilities".into()));
            }
            let session = Session { id: answer.session_id, version: (*negotiated).to_owned() };
            let target = Target { caller, session: Some(&session), version: Some(negotiated) };
            let headers = super::messages::method_headers("notifications/initialized", &Map::new());
            self.notify("notifications/initialized", target, headers).await?;
            return Ok((session, result));
        }
        Err(last)
    }

    /// DELETEs an evicted partition's session, in the background and best effort.
    fn close_evicted(self: &Arc<Self>, (partition, slot): (String, Arc<Slot>)) {
        let inner = self.clone();
        tokio::spawn(async move {
            let Some(session) = slot.session.lock().await.take() else { return };
            if session.id.is_none() {
                return;
            }
            let caller = CallerContext { partition: &partition, subject_token: None, user: None };
            let target = Target { caller, session: Some(&session), version: Some(&session.version) };
            let Ok(out) = inner.outgoing(target, Vec::new()).await else { return };
            let _ = tokio::time::timeout(inner.limits.request_timeout, inner.transport.delete(&out)).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_partition_is_evicted_never_the_gateway_s() {
        let sessions = Sessions::default();
        sessions.slot(GATEWAY_PARTITION);
        for n in 0..MAX_SESSIONS - 1 {
            assert!(sessions.slot(&format!("p{n}")).1.is_none());
        }
        // p0 used again: p1 is now the least recently used.
        assert!(sessions.slot("p0").1.is_none());
        let (_, evicted) = sessions.slot("newcomer");
        assert_eq!(evicted.map(|(key, _)| key).as_deref(), Some("p1"));
        let (_, evicted) = sessions.slot("another");
        assert_eq!(evicted.map(|(key, _)| key).as_deref(), Some("p2"));
        let slots = sessions.lock();
        assert_eq!(slots.len(), MAX_SESSIONS);
        assert!(slots.contains_key(GATEWAY_PARTITION) && slots.contains_key("p0"));
    }
}
