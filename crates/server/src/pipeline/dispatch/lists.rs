//! Stage 8 for the lists (`tools/list`, `prompts/list`, `resources/list`,
//! `resources/templates/list`: filtered to what the caller's policies let it use, paginated
//! with sealed cursors) and `server/discover`.

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::Dispatch;
use crate::context::RequestContext;
use crate::method::Method;
use crate::policy::PolicyRequest;
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
        ctx: &RequestContext,
        method: Method,
        items: &'a [T],
        name: impl Fn(&T) -> &String,
    ) -> Vec<&'a T> {
        let Some(policies) = self.policies.load_full() else { return items.iter().collect() };
        let legacy = ctx.meta.protocol_version.starts_with("2025");
        let request = PolicyRequest {
            principal: crate::pipeline::policy::principal_view(&ctx.principal),
            method,
            target: None,
            arguments: None,
            era: crate::pipeline::policy::era(legacy),
            now_ms: self.clock.now_unsigned_ms(),
        };
        items
            .iter()
            .filter(|item| policies.visible(app, &PolicyRequest { target: Some(name(item)), ..request.clone() }))
            .collect()
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
