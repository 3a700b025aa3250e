//! Server-side events that listen streams deliver or end on: list changes, resource updates,
//! task changes, revocations and handle-policy changes.
//!
//! The bus is in-process; instances sharing a store fan their events out to each other through
//! a bridge (the `palisade` binary's `events_redis`), which reads [`EventBus::subscribe_local`]
//! (only what this instance raised, so nothing echoes back) and injects what other instances
//! raised with [`EventBus::publish_remote`]. Every event is a hint: a listen stream re-reads and
//! re-authorizes what it delivers for its own caller.

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

/// One server event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ServerEvent {
    /// The tool list changed.
    ToolsListChanged,
    /// The prompt list changed.
    PromptsListChanged,
    /// The resource list changed.
    ResourcesListChanged,
    /// A resource's contents changed.
    ResourceUpdated {
        /// The resource URI.
        uri: String,
    },
    /// A task's row changed (on this or, through the store, another instance). Carries only the
    /// digest: a listen stream re-reads the task for its own caller before delivering anything.
    TaskChanged {
        /// SHA-256 of the task id.
        digest: [u8; 32],
    },
    /// A principal lost its standing (tokens revoked, role changed, left a tenant): its open
    /// listen streams end.
    PrincipalRevoked {
        /// Issuer.
        issuer: String,
        /// Subject.
        subject: String,
        /// Only streams in this tenant; `None`: every tenant.
        tenant: Option<String>,
    },
    /// A published application snapshot changed a handle type's policy: every open listen
    /// stream (and 2025-era GET stream) ends, and its client re-opens it under the new policy.
    HandlePoliciesChanged,
    /// An OAuth client was disabled: its open listen streams end.
    ClientRevoked {
        /// Client id.
        client: String,
    },
    /// A 2025-era session subscribed to or unsubscribed from a resource: its GET stream (on
    /// whichever instance holds it) re-reads what it listens for.
    SessionSubscriptionsChanged {
        /// The session's digest.
        session: [u8; 32],
    },
}

/// Publishes events to every open listen stream.
#[derive(Clone)]
pub struct EventBus {
    sender: broadcast::Sender<ServerEvent>,
    /// What this instance raised, for a bridge to other instances.
    local: broadcast::Sender<ServerEvent>,
}

impl EventBus {
    /// A bus whose subscribers may lag `capacity` events before they are cut off.
    pub fn new(capacity: usize) -> Self {
        let (sender, _) = broadcast::channel(capacity.max(1));
        let (local, _) = broadcast::channel(capacity.max(1));
        Self { sender, local }
    }

    /// Publishes an event raised on this instance (no-op when nobody listens).
    pub fn publish(&self, event: ServerEvent) {
        let _ = self.local.send(event.clone());
        let _ = self.sender.send(event);
    }

    /// Publishes an event another instance raised (from a bridge): delivered to this instance's
    /// streams, never handed back to a bridge.
    pub fn publish_remote(&self, event: ServerEvent) {
        let _ = self.sender.send(event);
    }

    /// Delivers an event to this instance's streams only, never to a bridge: for what each
    /// instance raises for its own streams (the gateway's upstream resource updates, which every
    /// instance with a listener receives from the upstream itself).
    pub fn deliver_here(&self, event: ServerEvent) {
        let _ = self.sender.send(event);
    }

    /// The events raised on this instance from now on (for a bridge to other instances).
    pub fn subscribe_local(&self) -> broadcast::Receiver<ServerEvent> {
        self.local.subscribe()
    }

    /// Announces that the tool list changed.
    pub fn tools_list_changed(&self) {
        self.publish(ServerEvent::ToolsListChanged);
    }

    /// Announces that the prompt list changed.
    pub fn prompts_list_changed(&self) {
        self.publish(ServerEvent::PromptsListChanged);
    }

    /// Announces that the resource list changed.
    pub fn resources_list_changed(&self) {
        self.publish(ServerEvent::ResourcesListChanged);
    }

    /// Announces that a resource's contents changed.
    pub fn resource_updated(&self, uri: impl Into<String>) {
        self.publish(ServerEvent::ResourceUpdated { uri: uri.into() });
    }

    /// Announces that a task changed.
    pub(crate) fn task_changed(&self, digest: [u8; 32]) {
        self.publish(ServerEvent::TaskChanged { digest });
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<ServerEvent> {
        self.sender.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_events_reach_streams_but_never_the_bridge() {
        let bus = EventBus::new(8);
        let mut streams = bus.subscribe();
        let mut bridge = bus.subscribe_local();
        bus.publish_remote(ServerEvent::PromptsListChanged);
        bus.tools_list_changed();
        assert_eq!(streams.try_recv().unwrap(), ServerEvent::PromptsListChanged);
        assert_eq!(streams.try_recv().unwrap(), ServerEvent::ToolsListChanged);
        assert_eq!(bridge.try_recv().unwrap(), ServerEvent::ToolsListChanged, "only what this instance raised");
        assert!(bridge.try_recv().is_err());
    }

    #[test]
    fn events_cross_the_wire_as_tagged_json() {
        let events = [
            ServerEvent::ResourceUpdated { uri: "test://r".into() },
            ServerEvent::TaskChanged { digest: [7; 32] },
            ServerEvent::PrincipalRevoked { issuer: "i".into(), subject: "s".into(), tenant: None },
            ServerEvent::HandlePoliciesChanged,
            ServerEvent::SessionSubscriptionsChanged { session: [3; 32] },
        ];
        for event in events {
            let text = serde_json::to_string(&event).unwrap();
            assert_eq!(serde_json::from_str::<ServerEvent>(&text).unwrap(), event, "{text}");
        }
        assert_eq!(serde_json::to_string(&ServerEvent::ToolsListChanged).unwrap(), r#"{"kind":"tools_list_changed"}"#);
        assert!(serde_json::from_str::<ServerEvent>(r#"{"kind":"nothing"}"#).is_err());
    }
}
