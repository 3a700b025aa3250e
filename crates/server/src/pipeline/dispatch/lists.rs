//! Stage 8 for the lists (`tools/list`, `prompts/list`, `resources/list`,
//! `resources/templates/list`: filtered to what the caller's policies let it use, paginated
//! with sealed cursors) and `server/discover`.

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::Dispatch;
use crate::auth::VerifiedPrincipal;
use crate::context::RequestContext;
use crate::method::Method;
use crate::policy::{Policies, PolicyRequest};
use crate::registry::App;
use crate::tasks::TASKS_EXTENSION;

impl Dispatch {
    pub(super) fn discover(&self, app: &App) -> Value {
        let mut result = json!({
            "supportedVersions": self.supported_versions(),
            "capabilities": app.capabilities(),
            "ttlMs": self.list_ttl_ms(app),
            "cacheScope": self.list_cache_scope(app),
        });
        if let Some(instructions) = &app.instructions {
            result["instructions"] = json!(instructions);
        }
        if self.tasks.is_some() {
            result["capabilities"]["extensions"] = json!({ TASKS_EXTENSION: {} });
        }
        result
    }

    /// The definitions of `items` the caller may use by the operator's policies (`method` on
    /// each, without arguments: see `Policies::visible`); all of them without policies.
    pub(super) fn visible<'a, T>(
        &self,
        app: &App,
        policies: Option<&Policies>,
        ctx: &RequestContext,
        method: Method,
        items: &'a [T],
        name: impl Fn(&T) -> &String,
    ) -> Vec<&'a T> {
        let legacy = ctx.meta.protocol_version.starts_with("2025");
        let viewer =
            Viewer { principal: &ctx.principal, legacy, source: ctx.source, now_ms: self.clock.now_unsigned_ms() };
        viewer.filter(policies, app, method, items, name)
    }

    pub(super) fn page<T>(
        &self,
        app: &App,
        kind: &str,
        params: &Map<String, Value>,
        items: &[T],
        render: impl Fn(&T) -> Value,
    ) -> Result<Value, ProtocolError> {
        let offset = match params.get("cursor") {
            None | Some(Value::Null) => 0,
            Some(Value::String(cursor)) => {
                self.cursors.read(kind, cursor).ok_or_else(|| ProtocolError::invalid_params("invalid cursor"))?
            }
            Some(_) => return Err(ProtocolError::invalid_params("invalid cursor")),
        };
        if offset > items.len() {
            return Err(ProtocolError::invalid_params("invalid cursor"));
        }
        let end = offset.saturating_add(self.config.page_size.max(1)).min(items.len());
        let mut result = json!({
            kind: items[offset..end].iter().map(render).collect::<Vec<_>>(),
            "ttlMs": self.list_ttl_ms(app),
            "cacheScope": self.list_cache_scope(app),
        });
        if end < items.len() {
            result["nextCursor"] = json!(self.cursors.mint(kind, end));
        }
        Ok(result)
    }

    /// `ttlMs` of a list: the application's own, bounded by its [`crate::ListFreshness`].
    fn list_ttl_ms(&self, app: &App) -> u64 {
        match &app.list_freshness {
            Some(freshness) => freshness.ttl_ms(self.clock.now_ms(), app.list_ttl_ms),
            None => app.list_ttl_ms,
        }
    }

    /// `cacheScope` of a list: the server's, or `private` when a part of the list is.
    fn list_cache_scope(&self, app: &App) -> &'static str {
        if app.list_freshness.as_ref().is_some_and(|freshness| freshness.private()) {
            "private"
        } else {
            self.cache_scope()
        }
    }
}

/// One caller looking at the lists: what it may see of each under a policy set.
pub(crate) struct Viewer<'a> {
    /// The caller.
    pub(crate) principal: &'a VerifiedPrincipal,
    /// On the 2025-era session wire.
    pub(crate) legacy: bool,
    /// The caller's address, when the transport knows it.
    pub(crate) source: Option<std::net::IpAddr>,
    /// Now, by the server's clock.
    pub(crate) now_ms: u64,
}

impl Viewer<'_> {
    fn request(&self, method: Method) -> PolicyRequest<'static> {
        PolicyRequest {
            principal: crate::pipeline::policy::principal_view(self.principal),
            method,
            target: None,
            arguments: None,
            era: crate::pipeline::policy::era(self.legacy),
            source: self.source,
            now_ms: self.now_ms,
        }
    }

    /// The `items` (named by `name`) this caller may use by `method` under `policies` (all of
    /// them without policies).
    pub(crate) fn filter<'i, T>(
        &self,
        policies: Option<&Policies>,
        app: &App,
        method: Method,
        items: &'i [T],
        name: impl Fn(&T) -> &String,
    ) -> Vec<&'i T> {
        let Some(policies) = policies else { return items.iter().collect() };
        // One listing: the principal's entity and the context built once, one decision per
        // class of definitions no policy can tell apart.
        let mut listing = policies.listing(app, &self.request(method));
        items.iter().filter(|item| listing.visible(name(item))).collect()
    }

    /// Whether this caller may use `target` (a tool, prompt, resource or template) by `method`,
    /// as the lists decide it.
    pub(crate) fn may_use(&self, policies: &Policies, app: &App, method: Method, target: &str) -> bool {
        policies.visible(app, &PolicyRequest { target: Some(target), ..self.request(method) })
    }

    /// Whether this caller may read `uri` (a resource-update notification for it is delivered).
    pub(crate) fn may_read(&self, policies: Option<&Policies>, app: &App, uri: &str) -> bool {
        let Some(policies) = policies else { return true };
        self.may_use(policies, app, Method::ResourcesRead, app.registered_resource(uri).unwrap_or(uri))
    }

    /// A digest of what this caller sees of `list` under `policies` and `app`: with policies in
    /// force, a list change is announced to a caller only when its digest changes (what it may
    /// see, or a definition of it, changed), so a caller learns nothing of what it may not see.
    /// `None` without policies: every caller sees every definition, and every announced change
    /// is delivered (an application's own announcement, or another instance's, included).
    pub(crate) fn digest(&self, policies: Option<&Policies>, app: &App, list: ListKind) -> Option<[u8; 32]> {
        policies?;
        let mut context = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        let mut add = |definition: &Value| {
            let text = definition.to_string();
            context.update(&(text.len() as u64).to_be_bytes());
            context.update(text.as_bytes());
        };
        match list {
            ListKind::Tools => {
                for tool in self.filter(policies, app, Method::ToolsCall, &app.tools, |t| &t.name) {
                    add(&tool.definition);
                }
            }
            ListKind::Prompts => {
                for prompt in self.filter(policies, app, Method::PromptsGet, &app.prompts, |p| &p.name) {
                    add(&prompt.definition);
                }
            }
            ListKind::Resources => {
                for resource in self.filter(policies, app, Method::ResourcesRead, &app.resources, |r| &r.uri) {
                    add(&resource.definition);
                }
                for template in self.filter(policies, app, Method::ResourcesRead, &app.templates, |t| &t.template) {
                    add(&template.definition);
                }
            }
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(context.finish().as_ref());
        Some(out)
    }

    /// Whether a change of `list` announced now is news to this caller: its digest under
    /// `policies` and `app` differs from `seen` (which it replaces), or there are no policies.
    pub(crate) fn changed(
        &self,
        policies: Option<&Policies>,
        app: &App,
        list: ListKind,
        seen: &mut [Option<[u8; 32]>; 3],
    ) -> bool {
        match self.digest(policies, app, list) {
            None => true,
            Some(now) => seen[list as usize].replace(now) != Some(now),
        }
    }
}

/// One of the three lists a `list_changed` notification is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListKind {
    /// `tools/list`.
    Tools = 0,
    /// `prompts/list`.
    Prompts = 1,
    /// `resources/list` and `resources/templates/list`.
    Resources = 2,
}
