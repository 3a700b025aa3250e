//! The 2025-era wire toward an upstream: the `initialize` handshake (2025-11-25, then
//! 2025-06-18), and one upstream session per caller partition and declared client capabilities
//! (a 2026-07-28 caller declares them per request, a 2025 session once, at `initialize`: a
//! request is made in a session that declared exactly its caller's), created lazily, never
//! shared between partitions, bounded in number (the least recently used one is evicted and DELETEd,
//! best effort); and the caller's log level (a 2026-07-28 request's `_meta` logLevel) as the
//! session's own, set with `logging/setLevel` when it changes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

use super::http::Body;
use super::{Inner, Target, UpstreamError};
use crate::credentials::CallerContext;

/// Most upstream sessions held at once per upstream.
pub const MAX_SESSIONS: usize = 10_000;
/// Most upstream sessions of one caller partition (one per set of declared capabilities).
pub const MAX_SESSIONS_PER_PARTITION: usize = 4;
/// The partition of the gateway's own session (listings, change stream).
pub const GATEWAY_PARTITION: &str = "";

/// Separates the partition from the capabilities' digest in a session's key.
const CAPABILITIES_SEPARATOR: char = '\u{1f}';

/// The key of a partition's session for `capabilities`: the partition alone when none are
/// declared (the gateway's own session, and callers that declare nothing), else the partition
/// and the digest of the capabilities' canonical JSON.
fn session_key(partition: &str, capabilities: Option<&Value>) -> String {
    match capabilities {
        None => partition.to_owned(),
        Some(Value::Object(caps)) if caps.is_empty() => partition.to_owned(),
        Some(caps) => {
            let digest = crate::pins::definition_digest(caps).unwrap_or_else(|_| caps.to_string());
            format!("{partition}{CAPABILITIES_SEPARATOR}{digest}")
        }
    }
}

/// The partition a session key belongs to.
fn partition_of(key: &str) -> &str {
    key.split_once(CAPABILITIES_SEPARATOR).map_or(key, |(partition, _)| partition)
}

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
    /// The log level last set with `logging/setLevel`, with the session id it was set on.
    level: tokio::sync::Mutex<Option<(Option<String>, String)>>,
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

    /// The slot of session `key` (created when absent) and, when making room evicted another
    /// slot, that one: the least recently used of the same partition when the partition holds
    /// [`MAX_SESSIONS_PER_PARTITION`] (a caller varying its capabilities churns only its own
    /// sessions), else the least recently used of all when [`MAX_SESSIONS`] are held; never the
    /// gateway's own.
    fn slot(&self, key: &str) -> (Arc<Slot>, Option<(String, Arc<Slot>)>) {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut slots = self.lock();
        if let Some(slot) = slots.get(key) {
            slot.last_used.store(tick, Ordering::Relaxed);
            return (slot.clone(), None);
        }
        let partition = partition_of(key);
        let evictable = |candidate: &String| candidate.as_str() != GATEWAY_PARTITION;
        let same_partition =
            slots.keys().filter(|candidate| evictable(candidate) && partition_of(candidate) == partition).count();
        let oldest = |slots: &HashMap<String, Arc<Slot>>, only_partition: bool| {
            slots
                .iter()
                .filter(|(candidate, _)| evictable(candidate))
                .filter(|(candidate, _)| !only_partition || partition_of(candidate) == partition)
                .min_by_key(|(_, slot)| slot.last_used.load(Ordering::Relaxed))
                .map(|(candidate, _)| candidate.clone())
        };
        let victim = if same_partition >= MAX_SESSIONS_PER_PARTITION {
            oldest(&slots, true)
        } else if slots.len() >= MAX_SESSIONS {
            oldest(&slots, false)
        } else {
            None
        };
        let evicted = victim.and_then(|victim| slots.remove(&victim).map(|slot| (victim, slot)));
        let slot = Arc::new(Slot {
            session: tokio::sync::Mutex::new(None),
            level: tokio::sync::Mutex::new(None),
            last_used: AtomicU64::new(tick),
        });
        slots.insert(key.to_owned(), slot.clone());
        (slot, evicted)
    }

    /// Forgets every session (the upstream's era changed).
    pub fn clear(&self) {
        self.lock().clear();
    }
}

impl Inner {
    /// The slot of session `key` (created if missing; another evicted and its session closed
    /// when the partition or the map is full, [`Sessions::slot`]).
    fn partition_slot(self: &Arc<Self>, key: &str) -> Arc<Slot> {
        let (slot, evicted) = self.sessions.slot(key);
        if let Some(evicted) = evicted {
            self.close_evicted(evicted);
        }
        slot
    }

    /// The session of `caller.partition` with these declared `capabilities`, opened with
    /// `initialize` when it has none yet.
    pub(super) async fn session(
        self: &Arc<Self>,
        version: &str,
        caller: CallerContext<'_>,
        capabilities: Option<&Value>,
    ) -> Result<Session, UpstreamError> {
        let slot = self.partition_slot(&session_key(caller.partition, capabilities));
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
        let slot = self.partition_slot(&session_key(caller.partition, capabilities));
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

    /// Makes `level` the log level of `caller.partition`'s `session` with `logging/setLevel`,
    /// unless it is already (the upstream declared `logging`; the caller asked for logs at
    /// `level`). An upstream's refusal is not the request's: the gateway filters what it relays
    /// by the caller's level anyway.
    pub(super) async fn set_level(
        self: &Arc<Self>,
        session: &Session,
        caller: CallerContext<'_>,
        capabilities: Option<&Value>,
        level: &str,
    ) -> Result<(), UpstreamError> {
        let slot = self.partition_slot(&session_key(caller.partition, capabilities));
        let mut set = slot.level.lock().await;
        if set.as_ref().is_some_and(|(id, current)| *id == session.id && current == level) {
            return Ok(());
        }
        let mut params = Map::new();
        params.insert("level".into(), json!(level));
        let target = Target { caller, session: Some(session), version: Some(&session.version) };
        let headers = super::messages::method_headers("logging/setLevel", &params);
        match self.exchange("logging/setLevel", params, target, &headers, super::Relays::NONE, None).await?.body {
            Body::Result(_) => *set = Some((session.id.clone(), level.to_owned())),
            Body::Error { code, .. } => {
                tracing::debug!(upstream = %self.id, code, "upstream refused logging/setLevel");
            }
        }
        Ok(())
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
    fn close_evicted(self: &Arc<Self>, (key, slot): (String, Arc<Slot>)) {
        let inner = self.clone();
        tokio::spawn(async move {
            let Some(session) = slot.session.lock().await.take() else { return };
            if session.id.is_none() {
                return;
            }
            let partition = partition_of(&key);
            let caller = CallerContext { partition, subject_token: None, user: None };
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
    fn a_session_is_keyed_by_partition_and_declared_capabilities() {
        let sampling = json!({ "sampling": {} });
        let both = json!({ "elicitation": { "form": {} }, "sampling": {} });
        let reordered = json!({ "sampling": {}, "elicitation": { "form": {} } });
        assert_eq!(session_key("p", None), "p");
        assert_eq!(session_key("p", Some(&json!({}))), "p", "nothing declared: the partition's plain session");
        assert_ne!(session_key("p", Some(&sampling)), session_key("p", Some(&both)));
        assert_ne!(session_key("p", Some(&both)), session_key("q", Some(&both)), "never shared between partitions");
        assert_eq!(
            session_key("p", Some(&both)),
            session_key("p", Some(&reordered)),
            "canonical: order is no difference"
        );
        assert_eq!(partition_of(&session_key("p", Some(&both))), "p");
    }

    #[test]
    fn a_partition_varying_its_capabilities_evicts_only_its_own_sessions() {
        let sessions = Sessions::default();
        sessions.slot(GATEWAY_PARTITION);
        sessions.slot("bob");
        let variants: Vec<String> =
            (0..MAX_SESSIONS_PER_PARTITION + 3).map(|n| session_key("alice", Some(&json!({ "x": n })))).collect();
        for (n, key) in variants.iter().enumerate() {
            let (_, evicted) = sessions.slot(key);
            match n.checked_sub(MAX_SESSIONS_PER_PARTITION) {
                None => assert!(evicted.is_none(), "{n}"),
                // The oldest of alice's own goes, never bob's nor the gateway's.
                Some(oldest) => assert_eq!(evicted.map(|(key, _)| key).as_ref(), Some(&variants[oldest]), "{n}"),
            }
        }
        // The same capabilities again: the same slot, nothing evicted.
        let newest = variants.last().unwrap();
        let (first, _) = sessions.slot(newest);
        let (again, evicted) = sessions.slot(newest);
        assert!(Arc::ptr_eq(&first, &again) && evicted.is_none());
        let slots = sessions.lock();
        assert!(slots.contains_key("bob") && slots.contains_key(GATEWAY_PARTITION));
        assert_eq!(slots.keys().filter(|key| partition_of(key) == "alice").count(), MAX_SESSIONS_PER_PARTITION);
    }

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
