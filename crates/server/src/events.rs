//! Server-side events that listen streams deliver or end on: list changes, resource updates,
//! task changes, revocations and handle-policy changes.
//!
//! The bus is in-process today; fan-out across instances plugs in behind the same type.

use tokio::sync::broadcast;

/// One server event.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

/// Publishes events to every open listen stream.
#[derive(Clone)]
pub struct EventBus {
    sender: broadcast::Sender<ServerEvent>,
}

impl EventBus {
    /// A bus whose subscribers may lag `capacity` events before they are cut off.
    pub fn new(capacity: usize) -> Self {
        let (sender, _) = broadcast::channel(capacity.max(1));
        Self { sender }
    }

    /// Publishes an event (no-op when nobody listens).
    pub fn publish(&self, event: ServerEvent) {
        let _ = self.sender.send(event);
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
