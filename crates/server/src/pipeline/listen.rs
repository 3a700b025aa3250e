//! `subscriptions/listen` (dispatched after the allow): the honoured filter acknowledged, then
//! matching events delivered, each re-authorized for this caller (a task is re-read for it;
//! only its own tasks, only resources that exist and that the operator's policies in force let
//! it read; a `list_changed` only when what it may see of that list changed, under the
//! registry and policies in force at the change), until the client leaves, the server shuts
//! down, the credential expires, the principal or client is revoked, a handle policy changes,
//! a target is disabled (the kill switch's watch), or the client falls behind.
//!
//! Knows the event bus, the task service, the server's current snapshot and the clearance's watch.

use std::collections::BTreeMap;

use palisade_wire::jsonrpc::notification_frame;
use palisade_wire::{ProtocolError, meta_keys};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::dispatch::Dispatch;
use super::dispatch::lists::{ListKind, Viewer};
use crate::context::RequestContext;
use crate::events::ServerEvent;
use crate::tasks::{TASKS_EXTENSION, missing_tasks_capability};

impl Dispatch {
    /// `subscriptions/listen`: acknowledge the honoured filter, then deliver matching events
    /// until the client leaves, the server shuts down or the client falls behind.
    pub(super) async fn listen(
        &self,
        current: &super::Current,
        ctx: RequestContext,
        params: &Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        let app = &current.app;
        let filter = match params.get("notifications") {
            Some(Value::Object(filter)) => filter,
            _ => return Err(ProtocolError::invalid_params("notifications filter is required")),
        };
        let flag = |key: &str| -> Result<bool, ProtocolError> {
            match filter.get(key) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(ProtocolError::invalid_params(format!("{key} must be a boolean"))),
            }
        };
        let caps = app.capabilities();
        let tools = flag("toolsListChanged")? && caps.get("tools").is_some();
        let prompts = flag("promptsListChanged")? && caps.get("prompts").is_some();
        let resources = flag("resourcesListChanged")? && caps.get("resources").is_some();
        let uris: Vec<String> = match filter.get("resourceSubscriptions") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(uris)) => uris
                .iter()
                .map(|u| {
                    u.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| ProtocolError::invalid_params("resourceSubscriptions must be strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(ProtocolError::invalid_params("resourceSubscriptions must be an array")),
        };
        let requested_tasks: Option<Vec<String>> = match filter.get("taskIds") {
            None | Some(Value::Null) => None,
            Some(Value::Array(ids)) => Some(
                ids.iter()
                    .map(|id| {
                        id.as_str()
                            .filter(|id| !id.is_empty())
                            .map(str::to_owned)
                            .ok_or_else(|| ProtocolError::invalid_params("taskIds must be non-empty strings"))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(_) => return Err(ProtocolError::invalid_params("taskIds must be an array")),
        };
        if requested_tasks.is_some() && !ctx.meta.has_extension(TASKS_EXTENSION) {
            return Err(missing_tasks_capability());
        }
        // Bounded work per stream: each named task is a store lookup now and at every change.
        let most = self.config.max_listen_filter_entries;
        if requested_tasks.as_ref().is_some_and(|ids| ids.len() > most) || uris.len() > most {
            return Err(ProtocolError::invalid_params("a listen filter names more entries than allowed"));
        }
        let _permit = self.stream_permit(&ctx.principal)?;
        // Only the caller's own tasks: others are dropped from the acknowledged set, silently
        // (the same answer for unknown and foreign ids).
        let mut tasks: BTreeMap<[u8; 32], (String, i64)> = BTreeMap::new();
        if let (Some(requested), Some(service)) = (&requested_tasks, &self.tasks) {
            for id in requested {
                if service.owns(&ctx.principal, id).await? {
                    tasks.insert(crate::tasks::task_digest(id), (id.clone(), -1));
                }
            }
        }
        // Only resources that exist (stage 5 required the read scopes of every one named), and
        // only when the application can report their updates at all.
        let subscribable = app.offers_resource_subscriptions();
        let uris: Vec<String> = uris.into_iter().filter(|uri| subscribable && app.knows_resource(uri)).collect();
        // Wanted while the stream is open (the gateway asks its upstreams for these).
        let _interest = self.interest.hold(uris.clone());

        let subscription_id = ctx.id.to_value();
        let stream_meta = json!({ meta_keys::SUBSCRIPTION_ID: subscription_id });
        let mut honoured = Map::new();
        for (key, on) in
            [("toolsListChanged", tools), ("promptsListChanged", prompts), ("resourcesListChanged", resources)]
        {
            if on {
                honoured.insert(key.into(), json!(true));
            }
        }
        if !uris.is_empty() {
            honoured.insert("resourceSubscriptions".into(), json!(uris));
        }
        if requested_tasks.is_some() {
            let ids: Vec<&String> = tasks.values().map(|(id, _)| id).collect();
            honoured.insert("taskIds".into(), json!(ids));
        }
        // Subscribe before acknowledging, so no event between the two is lost.
        let mut events = self.events.subscribe();
        // A DISABLE the kill switch observes for one of this stream's targets ends the stream.
        let mut disables = crate::clearance::DisableWatch::new(ctx.kill_switch.as_ref());
        let ack = notification_frame(
            "notifications/subscriptions/acknowledged",
            json!({ "notifications": honoured, "_meta": stream_meta }),
        );
        if !ctx.sink.send(ack).await {
            return Err(ProtocolError::Internal);
        }
        let complete = json!({ "resultType": "complete", "_meta": stream_meta });
        // The stream ends (gracefully) when the credential it was opened with expires, by the
        // server's clock (the token verifier's too: the builder checks they are one).
        let clock = self.clock.clone();
        let credential_expired = async {
            match ctx.principal.expires_at_ms() {
                Some(at) => clock.sleep_until_ms(i64::try_from(at).unwrap_or(i64::MAX)).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(credential_expired);
        // What this caller sees of each list it listens to now; a change of that list is
        // announced only when it differs.
        let viewer = |now_ms| Viewer { principal: &ctx.principal, legacy: false, source: ctx.source, now_ms };
        let mut seen = [None; 3];
        for (list, on) in [(ListKind::Tools, tools), (ListKind::Prompts, prompts), (ListKind::Resources, resources)] {
            if on {
                viewer(self.clock.now_unsigned_ms()).changed(current.policies.as_deref(), app, list, &mut seen);
            }
        }
        loop {
            let event = tokio::select! {
                () = self.shutdown.cancelled() => return Ok(complete),
                () = ctx.cancel.cancelled() => return Err(ProtocolError::Internal),
                () = &mut credential_expired => {
                    tracing::info!(stage = "listen", "listen stream closed: the credential expired");
                    return Ok(complete);
                }
                () = disables.disabled() => {
                    tracing::info!(stage = "listen", "listen stream closed: a target was disabled");
                    return Ok(complete);
                }
                event = events.recv() => event,
            };
            let changed = |list: ListKind, seen: &mut [Option<[u8; 32]>; 3]| {
                let current = self.current.load();
                viewer(self.clock.now_unsigned_ms()).changed(current.policies.as_deref(), &current.app, list, seen)
            };
            let frame = match event {
                Ok(ServerEvent::ToolsListChanged) if tools => {
                    if !changed(ListKind::Tools, &mut seen) {
                        continue;
                    }
                    notification_frame("notifications/tools/list_changed", json!({ "_meta": stream_meta }))
                }
                Ok(ServerEvent::PromptsListChanged) if prompts => {
                    if !changed(ListKind::Prompts, &mut seen) {
                        continue;
                    }
                    notification_frame("notifications/prompts/list_changed", json!({ "_meta": stream_meta }))
                }
                Ok(ServerEvent::ResourcesListChanged) if resources => {
                    if !changed(ListKind::Resources, &mut seen) {
                        continue;
                    }
                    notification_frame("notifications/resources/list_changed", json!({ "_meta": stream_meta }))
                }
                Ok(ServerEvent::ResourceUpdated { uri })
                    if uris.contains(&uri) && {
                        let current = self.current.load();
                        viewer(self.clock.now_unsigned_ms()).may_read(current.policies.as_deref(), &current.app, &uri)
                    } =>
                {
                    notification_frame("notifications/resources/updated", json!({ "uri": uri, "_meta": stream_meta }))
                }
                Ok(ServerEvent::PrincipalRevoked { issuer, subject, tenant })
                    if issuer == ctx.principal.issuer()
                        && subject == ctx.principal.subject()
                        && tenant.as_deref().is_none_or(|t| Some(t) == ctx.principal.tenant()) =>
                {
                    tracing::info!(stage = "listen", "listen stream closed: the principal was revoked");
                    return Ok(complete);
                }
                Ok(ServerEvent::HandlePoliciesChanged) => {
                    tracing::info!(stage = "listen", "listen stream closed: a handle policy changed");
                    return Ok(complete);
                }
                Ok(ServerEvent::ClientRevoked { client }) if Some(client.as_str()) == ctx.principal.client_id() => {
                    tracing::info!(stage = "listen", "listen stream closed: the client was revoked");
                    return Ok(complete);
                }
                Ok(ServerEvent::TaskChanged { digest }) if tasks.contains_key(&digest) => {
                    let (Some(service), Some((id, last_version))) = (&self.tasks, tasks.get_mut(&digest)) else {
                        continue;
                    };
                    // Re-authorized at delivery: the task is re-read for this listener's caller.
                    let Some((version, mut detailed)) = service.detailed_for(&ctx.principal, id).await? else {
                        continue;
                    };
                    if version <= *last_version {
                        continue; // already delivered (local and store fan-out both announce)
                    }
                    *last_version = version;
                    detailed["_meta"] = stream_meta.clone();
                    notification_frame("notifications/tasks", detailed)
                }
                Ok(_) => continue,
                // The client fell behind the bus or its own queue: end the stream gracefully.
                Err(RecvError::Lagged(_)) => return Ok(complete),
                Err(RecvError::Closed) => return Ok(complete),
            };
            if !ctx.sink.try_send(frame) {
                tracing::info!(stage = "listen", "listen stream closed: client fell behind");
                return Ok(complete);
            }
        }
    }
}

impl Dispatch {
    /// A place for one more open stream of `principal` (listen, GET), or the refusal.
    pub(crate) fn stream_permit(
        &self,
        principal: &crate::auth::VerifiedPrincipal,
    ) -> Result<crate::streams::StreamPermit, ProtocolError> {
        self.streams.acquire(principal.partition_key(), self.config.max_streams_per_principal).ok_or_else(|| {
            tracing::info!(stage = "listen", "stream refused: the principal holds the most streams allowed");
            ProtocolError::InvalidRequest("too many open streams for this caller")
        })
    }
}
