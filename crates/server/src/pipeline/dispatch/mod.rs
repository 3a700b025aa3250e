//! Stage 8, dispatch: the operation's work, once the allow decision is on the record. Lists
//! (paginated with sealed cursors), `server/discover`, completions, prompts and resource reads,
//! and `tools/call`: its MRTR round opened and verified, arguments validated against the tool's
//! `inputSchema`, handle arguments removed (the handler reads `ctx.handle(name)`), the
//! confirmation step of a needs-confirmation tool ([`super::confirm`]), then the handler through
//! [`crate::execute::run_tool`] — or, for a task-capable tool called with the tasks extension, a
//! durable task whose worker runs the same cleared handler. `tasks/*` go to the task service.
//!
//! One file per method family under `pipeline/dispatch/`: `lists.rs` (the lists and
//! `server/discover`), `tools.rs`, `prompts.rs`, `resources.rs`, `completion.rs`, `tasks.rs`;
//! this file is the match that picks one, and stage 9's decoration.
//!
//! Holds what stage 8 uses (see [`Dispatch`]); knows the application snapshot it is handed;
//! never the transport.

mod completion;
pub(crate) mod lists;
mod prompts;
mod resources;
mod tasks;
mod tools;

use std::sync::Arc;

use palisade_store::OnceStore;
use palisade_wire::{ProtocolError, meta_keys};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::audit::{Allowed, AuditTrail};
use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::context::RequestContext;
use crate::cursor::Cursors;
use crate::delegation::DelegationService;
use crate::events::EventBus;
use crate::handles::HandleService;
use crate::method::{Method, OperationKey};
use crate::mrtr::StateSealer;
use crate::registry::App;
use crate::streams::{ResourceInterest, StreamLimiter};
use crate::tasks::TaskService;

/// Stage 8 (and the session-free `subscriptions/listen`): the services the handlers' requests
/// use — the configuration (page size, timeouts, limits, versions), the cursor key and the
/// request-state sealer, the clock, the event bus and the shutdown token listen streams end on,
/// the per-principal stream limiter and the streams' resource interest, and when the server has them the task, handle,
/// single-use and delegation services (a confirmation under a capability is the ledger's).
pub(crate) struct Dispatch {
    pub(crate) config: ServerConfig,
    pub(crate) cursors: Cursors,
    pub(crate) sealer: StateSealer,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) events: EventBus,
    pub(crate) shutdown: CancellationToken,
    pub(crate) streams: Arc<StreamLimiter>,
    /// What the open streams want resource updates of.
    pub(crate) interest: Arc<ResourceInterest>,
    pub(crate) tasks: Option<Arc<TaskService>>,
    pub(crate) handles: Option<Arc<HandleService>>,
    pub(crate) once: Option<Arc<dyn OnceStore>>,
    pub(crate) delegation: Option<Arc<DelegationService>>,
    /// `public` without authentication, else `private` (lists and reads say so).
    pub(crate) cache_scope: &'static str,
    /// The registry and policies in force now (the server's cell): an open listen stream
    /// re-checks what its caller may see against it at every change.
    pub(crate) current: Arc<arc_swap::ArcSwap<super::Current>>,
}

impl Dispatch {
    /// Stage 8. Takes the stage-7 proof by value: nothing here runs unless the allow decision
    /// is on the record.
    pub(super) async fn dispatch(
        &self,
        current: &super::Current,
        operation: &OperationKey,
        ctx: RequestContext,
        params: &Map<String, Value>,
        audit: &AuditTrail<'_>,
        allowed: Allowed,
    ) -> Result<Value, ProtocolError> {
        let (app, policies) = (&current.app, current.policies.as_deref());
        match operation.method() {
            Method::Discover => Ok(self.discover(app)),
            Method::ToolsList => {
                let tools = self.visible(app, policies, &ctx, Method::ToolsCall, &app.tools, |t| &t.name);
                self.page(app, "tools", params, &tools, |t| t.definition.clone())
            }
            Method::PromptsList => {
                let prompts = self.visible(app, policies, &ctx, Method::PromptsGet, &app.prompts, |p| &p.name);
                self.page(app, "prompts", params, &prompts, |p| p.definition.clone())
            }
            Method::ResourcesList => {
                let resources = self.visible(app, policies, &ctx, Method::ResourcesRead, &app.resources, |r| &r.uri);
                self.page(app, "resources", params, &resources, |r| r.definition.clone())
            }
            Method::ResourceTemplatesList => {
                let templates =
                    self.visible(app, policies, &ctx, Method::ResourcesRead, &app.templates, |t| &t.template);
                self.page(app, "resourceTemplates", params, &templates, |t| t.definition.clone())
            }
            Method::ToolsCall => self.call_tool(app, operation, ctx, params, audit, allowed).await,
            Method::PromptsGet => self.get_prompt(app, operation, ctx, params).await,
            Method::ResourcesRead => self.read_resource(app, ctx, params).await,
            Method::Complete => self.complete(app, policies, ctx, params).await,
            Method::Listen
            | Method::Initialize
            | Method::Ping
            | Method::SetLogLevel
            | Method::Subscribe
            | Method::Unsubscribe
            | Method::SessionStream
            | Method::SessionNotification
            | Method::SessionAnswer
            | Method::SessionDelete => Err(ProtocolError::Internal),
            Method::TasksGet | Method::TasksUpdate | Method::TasksCancel => {
                self.task_method(app, operation.method(), ctx, params).await
            }
        }
    }

    pub(super) fn task_service(&self) -> Result<&Arc<TaskService>, ProtocolError> {
        self.tasks.as_ref().ok_or(ProtocolError::Internal)
    }

    /// Every version this server speaks: 2026-07-28, then the enabled 2025-era ones (an
    /// auto-negotiating client picks the newest it knows).
    pub(crate) fn supported_versions(&self) -> Vec<String> {
        let mut versions: Vec<String> = palisade_wire::SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect();
        if self.config.legacy.enabled {
            versions.extend(self.config.legacy.versions.iter().cloned());
        }
        versions
    }

    pub(super) fn cache_scope(&self) -> &'static str {
        self.cache_scope
    }
}

/// Stage 9's addition to a result: `resultType` (when the handler did not set one) and
/// serverInfo.
pub(super) fn decorate(app: &App, mut result: Value) -> Value {
    if let Value::Object(map) = &mut result {
        map.entry("resultType").or_insert_with(|| json!("complete"));
        let meta = map.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(meta) = meta {
            meta.insert(meta_keys::SERVER_INFO.into(), json!({ "name": app.name, "version": app.version }));
        }
    }
    result
}
