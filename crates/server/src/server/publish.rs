//! Publication: the snapshot a request is served from (`Current`: the registry and the
//! operator's policies validated against it, swapped whole) and the ways it changes while the
//! server runs — a new registry ([`Server::publish`]), a new policy set
//! ([`Server::publish_policies`]), or both at once ([`Server::publish_with_policies`], a
//! reload) — and what an open stream asks of it: whether a list change is news to its caller.

use std::net::IpAddr;
use std::sync::Arc;

use super::{BuildError, Parts, Server};
use crate::auth::VerifiedPrincipal;
use crate::events::ServerEvent;
use crate::pipeline::{Current, ListKind, Viewer};
use crate::policy::Policies;
use crate::registry::App;

/// What a publication changed, as the listen streams are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Published {
    /// The tool list differs.
    pub tools_changed: bool,
    /// The prompt list differs.
    pub prompts_changed: bool,
    /// The resource or template list differs.
    pub resources_changed: bool,
}

impl Server {
    /// The application snapshot requests are served from right now. A request loads it once and
    /// keeps it to the end: it never sees half of an update.
    pub fn app(&self) -> Arc<App> {
        self.current.load().app.clone()
    }

    /// The operator policy set in force (`None`: the scope rules only).
    pub fn policies(&self) -> Option<Arc<Policies>> {
        self.current.load().policies.clone()
    }

    /// Puts a policy set in force (or, with `None`, none) for every request that starts from
    /// now on; a request already running finishes under the set it started with. The set was
    /// validated by [`Policies::load`] against the registry in force (see
    /// [`Server::publish_with_policies`] to replace both at once). Every open stream re-checks
    /// what its caller may see, and hears of a list change only if that changed.
    pub fn publish_policies(&self, policies: Option<Policies>) {
        let _one_at_a_time = self.publishing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let app = self.current.load().app.clone();
        self.current.store(Arc::new(Current { app, policies: policies.map(Arc::new) }));
        self.events.publish(ServerEvent::ToolsListChanged);
        self.events.publish(ServerEvent::PromptsListChanged);
        self.events.publish(ServerEvent::ResourcesListChanged);
    }

    /// [`Server::publish`] with `policies` put in force in the same snapshot (a reload that
    /// changes the registry and the policies together): no request sees the new registry with
    /// the old policies, or the reverse. `policies` was validated against `app`.
    pub fn publish_with_policies(&self, app: App, policies: Option<Policies>) -> Result<Published, BuildError> {
        self.publish_snapshot(app, Some(policies.map(Arc::new)))
    }

    /// Publishes a new application snapshot while serving, with the policies in force. `app`
    /// has passed [`crate::AppBuilder::build`]; here it must also pass the checks
    /// [`super::ServerBuilder::build`] made (the services its tools need) and, with a kill
    /// switch, be covered by the signed registry — else it is refused and the current snapshot
    /// stays. Requests already running finish on the snapshot they started with. Each list that
    /// changed is announced on every open listen stream (and 2025-era GET stream) that asked for
    /// it (with policies in force, to those whose caller's view of it changed).
    pub fn publish(&self, app: App) -> Result<Published, BuildError> {
        self.publish_snapshot(app, None)
    }

    /// Publishes `app` with `policies` (`None`: the policies in force stay).
    fn publish_snapshot(&self, app: App, policies: Option<Option<Arc<Policies>>>) -> Result<Published, BuildError> {
        let _one_at_a_time = self.publishing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let parts = Parts { handles: self.handles.as_deref(), tasks: self.tasks.is_some(), once: self.once.is_some() };
        let handle_types = match &self.handles {
            Some(handles) => Some(handles.prepare(app.handle_types()).map_err(BuildError::HandlePolicy)?),
            None => None,
        };
        parts.check_with(&app, handle_types.as_ref())?;
        if let Some(stage) = self.stages.kill_switch.stage() {
            stage.check_covers(&app)?;
        }
        let current = self.current.load_full();
        let old = &current.app;
        let published = Published {
            tools_changed: !same_definitions(
                old.tools().iter().map(|t| &t.definition),
                app.tools().iter().map(|t| &t.definition),
            ),
            prompts_changed: !same_definitions(
                old.prompts.iter().map(|p| &p.definition),
                app.prompts.iter().map(|p| &p.definition),
            ),
            resources_changed: !same_definitions(
                old.resources.iter().map(|r| &r.definition).chain(old.templates.iter().map(|t| &t.definition)),
                app.resources.iter().map(|r| &r.definition).chain(app.templates.iter().map(|t| &t.definition)),
            ),
        };
        let policies_replaced = policies.is_some();
        let policies = policies.unwrap_or_else(|| current.policies.clone());
        self.current.store(Arc::new(Current { app: Arc::new(app), policies }));
        let handle_policies_changed = match (&self.handles, handle_types) {
            (Some(handles), Some(prepared)) => !handles.republish(prepared).is_empty(),
            _ => false,
        };
        if handle_policies_changed {
            self.events.publish(ServerEvent::HandlePoliciesChanged);
        }
        if published.tools_changed || policies_replaced {
            self.events.publish(ServerEvent::ToolsListChanged);
        }
        if published.prompts_changed || policies_replaced {
            self.events.publish(ServerEvent::PromptsListChanged);
        }
        if published.resources_changed || policies_replaced {
            self.events.publish(ServerEvent::ResourcesListChanged);
        }
        Ok(published)
    }

    /// Whether a change of `list` announced now is news to `principal`, whose view a stream
    /// last saw as `seen` ([`Viewer::changed`], under the snapshot in force).
    pub(crate) fn list_changed_for(
        &self,
        principal: &VerifiedPrincipal,
        (legacy, source): (bool, Option<IpAddr>),
        list: ListKind,
        seen: &mut [Option<[u8; 32]>; 3],
    ) -> bool {
        let current = self.current.load();
        let viewer = Viewer { principal, legacy, source, now_ms: self.clock.now_unsigned_ms() };
        viewer.changed(current.policies.as_deref(), &current.app, list, seen)
    }

    /// Whether `principal` may read `uri` under the registry and policies in force now.
    pub(crate) fn may_read_now(
        &self,
        principal: &VerifiedPrincipal,
        (legacy, source): (bool, Option<IpAddr>),
        uri: &str,
    ) -> bool {
        let current = self.current.load();
        let viewer = Viewer { principal, legacy, source, now_ms: self.clock.now_unsigned_ms() };
        viewer.may_read(current.policies.as_deref(), &current.app, uri)
    }
}

/// Whether two definition lists are the same, in order.
fn same_definitions<'a>(
    old: impl Iterator<Item = &'a serde_json::Value>,
    new: impl Iterator<Item = &'a serde_json::Value>,
) -> bool {
    old.eq(new)
}
