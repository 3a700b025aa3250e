//! Stage 8, dispatch: the operation's work, once the allow decision is on the record. Lists
//! (paginated with sealed cursors), `server/discover`, completions, prompts and resource reads,
//! and `tools/call`: its MRTR round opened and verified, arguments validated against the tool's
//! `inputSchema`, handle arguments removed (the handler reads `ctx.handle(name)`), the
//! confirmation step of a needs-confirmation tool ([`super::confirm`]), then the handler through
//! [`crate::execute::run_tool`] — or, for a task-capable tool called with the tasks extension, a
//! durable task whose worker runs the same cleared handler. `tasks/*` go to the task service.
//!
//! Knows the application snapshot it is handed and the services; never the transport.

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_wire::{ProtocolError, meta_keys};
use serde_json::{Map, Value, json};

use super::params::{string_map, string_param};
use crate::audit::{Allowed, AuditStage, AuditTrail};
use crate::context::{Outcome, RequestContext};
use crate::method::{Method, OperationKey};
use crate::registry::{App, CompletionRef, TaskSupport};
use crate::server::Server;
use crate::tasks::{TASKS_EXTENSION, TaskCall, TaskService, missing_tasks_capability};

impl Server {
    /// Stage 8. Takes the stage-7 proof by value: nothing here runs unless the allow decision
    /// is on the record.
    pub(super) async fn dispatch(
        &self,
        app: &Arc<App>,
        operation: &OperationKey,
        mut ctx: RequestContext,
        params: &Map<String, Value>,
        audit: &AuditTrail<'_>,
        allowed: Allowed,
    ) -> Result<Value, ProtocolError> {
        match operation.method() {
            Method::Discover => Ok(self.discover(app)),
            Method::ToolsList => self.page(app, "tools", params, &app.tools, |t| t.definition.clone()),
            Method::PromptsList => self.page(app, "prompts", params, &app.prompts, |p| p.definition.clone()),
            Method::ResourcesList => self.page(app, "resources", params, &app.resources, |r| r.definition.clone()),
            Method::ResourceTemplatesList => {
                self.page(app, "resourceTemplates", params, &app.templates, |t| t.definition.clone())
            }
            Method::ToolsCall => {
                let tool = operation.target().and_then(|name| app.tool(name)).ok_or(ProtocolError::Internal)?;
                let mut arguments = match params.get("arguments") {
                    None | Some(Value::Null) => Map::new(),
                    Some(Value::Object(arguments)) => arguments.clone(),
                    Some(_) => return Err(ProtocolError::invalid_params("arguments must be an object")),
                };
                self.prepare_round(&mut ctx, Method::ToolsCall, params)?;
                if let Some(validator) = &tool.validator {
                    let instance = Value::Object(arguments.clone());
                    // Named by where in the tool's schema each check failed (the server's own
                    // text): a validator's message would quote the client's values back.
                    let problems: Vec<String> =
                        validator.iter_errors(&instance).take(5).map(|e| e.schema_path().to_string()).collect();
                    if !problems.is_empty() {
                        // A tool error the model can read, and a refusal on the record.
                        audit.deny(AuditStage::Arguments, Some(ProtocolError::invalid_params("").code())).await;
                        let result =
                            crate::CallToolResult::error(format!("invalid arguments: {}", problems.join("; ")));
                        return Ok(result.into_value());
                    }
                }
                // Task-capable tools: a task when the request declares the extension; a tool that
                // only runs as a task refuses a request that does not (before any handler runs).
                // Never on the 2025-era wire, whatever its session's capabilities say: durable
                // tasks are the 2026-07-28 extension.
                let modern = palisade_wire::SUPPORTED_VERSIONS.contains(&ctx.meta.protocol_version.as_str());
                let as_task = tool.task_support != TaskSupport::Forbidden
                    && self.tasks.is_some()
                    && modern
                    && ctx.meta.has_extension(TASKS_EXTENSION);
                if tool.task_support == TaskSupport::Required && !as_task {
                    if !modern {
                        return Err(ProtocolError::invalid_params(
                            "this tool runs only as a durable task, which needs the 2026-07-28 wire",
                        ));
                    }
                    return Err(missing_tasks_capability());
                }
                // Handles were resolved in stage 6: the handler (and a confirmation question) gets
                // the objects, never the raw handles.
                for argument in &tool.handle_args {
                    arguments.remove(&argument.name);
                }
                if tool.needs_confirmation
                    && let Some(answer) = self.confirmation(&mut ctx, tool, params, &arguments, audit).await?
                {
                    return Ok(answer);
                }
                if as_task {
                    return self.create_task(app, operation, tool, ctx, params, arguments).await;
                }
                let outcome = crate::execute::run_tool(&tool.handler, ctx.clone(), arguments, allowed).await?;
                let outcome = match outcome {
                    // Later rounds of a confirmed call carry the confirmation forward.
                    Outcome::InputRequired(mut input) if tool.needs_confirmation => {
                        let app_state = input.state.take().unwrap_or(Value::Null);
                        input.state =
                            Some(json!({ "confirmed": true, "app": app_state, "n": crate::audit::fresh_trace_id() }));
                        Outcome::InputRequired(input)
                    }
                    outcome => outcome,
                };
                self.finish_round(&ctx, Method::ToolsCall, params, outcome.map_complete(|r| r.into_value()))
            }
            Method::PromptsGet => {
                let prompt = operation.target().and_then(|name| app.prompt(name)).ok_or(ProtocolError::Internal)?;
                let arguments = string_map(params.get("arguments"))?;
                let missing = prompt.missing_required(&arguments);
                if !missing.is_empty() {
                    return Err(ProtocolError::invalid_params(format!(
                        "missing required arguments: {}",
                        missing.join(", ")
                    )));
                }
                self.prepare_round(&mut ctx, Method::PromptsGet, params)?;
                let outcome = (prompt.handler)(ctx.clone(), arguments).await?;
                self.finish_round(&ctx, Method::PromptsGet, params, outcome.map_complete(|r| r.to_value()))
            }
            Method::ResourcesRead => {
                let uri = string_param(params, "uri")?.to_owned();
                self.prepare_round(&mut ctx, Method::ResourcesRead, params)?;
                let (reader, vars, ttl_ms) = if let Some(resource) = app.resources.iter().find(|r| r.uri == uri) {
                    (resource.reader.clone(), BTreeMap::new(), resource.ttl_ms)
                } else {
                    let (template, vars) = app
                        .templates
                        .iter()
                        .find_map(|t| t.match_uri(&uri).map(|vars| (t, vars)))
                        .ok_or_else(|| ProtocolError::ResourceNotFound { uri: uri.clone() })?;
                    (template.reader.clone(), vars, template.ttl_ms)
                };
                let outcome = reader(ctx.clone(), uri.clone(), vars).await?;
                let cache_scope = self.cache_scope();
                let outcome = outcome.map_complete(|contents| {
                    json!({
                        "contents": contents.iter().map(crate::ResourceContents::to_value).collect::<Vec<_>>(),
                        "ttlMs": ttl_ms,
                        "cacheScope": cache_scope,
                    })
                });
                if let Outcome::Complete(result) = &outcome
                    && result["contents"].as_array().is_none_or(Vec::is_empty)
                {
                    return Err(ProtocolError::ResourceNotFound { uri });
                }
                self.finish_round(&ctx, Method::ResourcesRead, params, outcome)
            }
            Method::Complete => match &app.relayed_completion {
                Some(relay) => {
                    let reference = completion_ref(app, params)?;
                    relay(ctx.clone(), reference, params.clone()).await
                }
                None => complete(app, params),
            },
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
            Method::TasksGet => self.task_service()?.get(&ctx.principal, params).await,
            Method::TasksUpdate => self.task_service()?.update(app, &self.events, &ctx.principal, params).await,
            Method::TasksCancel => self.task_service()?.cancel(&self.events, &ctx.principal, params).await,
        }
    }

    fn task_service(&self) -> Result<&Arc<TaskService>, ProtocolError> {
        self.tasks.as_ref().ok_or(ProtocolError::Internal)
    }

    /// Runs the tool's prelude (an MRTR round may come first), then creates the durable task and
    /// answers the flat `CreateTaskResult` only once it is committed.
    async fn create_task(
        &self,
        app: &Arc<App>,
        operation: &OperationKey,
        tool: &crate::registry::ToolDef,
        ctx: RequestContext,
        params: &Map<String, Value>,
        arguments: Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        if let Some(prelude) = &tool.task_prelude
            && let Some(input) = prelude(ctx.clone(), arguments.clone()).await?
        {
            return self.finish_round(&ctx, Method::ToolsCall, params, Outcome::InputRequired(input));
        }
        let service = self.task_service()?;
        let meta = params.get("_meta").cloned().unwrap_or_else(|| json!({}));
        let scopes = super::authorize::required_scopes(app, operation, params);
        let call = TaskCall { tool: tool.name.clone(), arguments, meta, scopes };
        service.create(app, &self.events, &ctx, call).await
    }

    fn discover(&self, app: &App) -> Value {
        let mut result = json!({
            "supportedVersions": self.supported_versions(),
            "capabilities": app.capabilities(),
            "ttlMs": app.list_ttl_ms,
            "cacheScope": self.cache_scope(),
        });
        if let Some(instructions) = &app.instructions {
            result["instructions"] = json!(instructions);
        }
        if self.tasks.is_some() {
            result["capabilities"]["extensions"] = json!({ TASKS_EXTENSION: {} });
        }
        result
    }

    /// Every version this server speaks: 2026-07-28, then the enabled 2025-era ones (an
    /// auto-negotiating client picks the newest it knows).
    pub fn supported_versions(&self) -> Vec<String> {
        let mut versions: Vec<String> = palisade_wire::SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect();
        if self.config.legacy.enabled {
            versions.extend(self.config.legacy.versions.iter().cloned());
        }
        versions
    }

    pub(super) fn cache_scope(&self) -> &'static str {
        if self.authenticator.is_unauthenticated() { "public" } else { "private" }
    }

    fn page<T>(
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
            "ttlMs": app.list_ttl_ms,
            "cacheScope": self.cache_scope(),
        });
        if end < items.len() {
            result["nextCursor"] = json!(self.cursors.mint(kind, end));
        }
        Ok(result)
    }
}

/// The reference of a `completion/complete`, checked to name a registered prompt or resource.
fn completion_ref(app: &App, params: &Map<String, Value>) -> Result<CompletionRef, ProtocolError> {
    let reference =
        params.get("ref").and_then(Value::as_object).ok_or_else(|| ProtocolError::invalid_params("ref is required"))?;
    Ok(match reference.get("type").and_then(Value::as_str) {
        Some("ref/prompt") => {
            let name = string_param(reference, "name")?;
            app.prompt(name).ok_or_else(|| ProtocolError::invalid_params("unknown prompt"))?;
            CompletionRef::Prompt(name.to_owned())
        }
        Some("ref/resource") => {
            let uri = string_param(reference, "uri")?;
            let known = app.templates.iter().any(|t| t.template == uri) || app.knows_resource(uri);
            if !known {
                return Err(ProtocolError::invalid_params("unknown resource"));
            }
            CompletionRef::Resource(uri.to_owned())
        }
        _ => return Err(ProtocolError::invalid_params("ref.type must be ref/prompt or ref/resource")),
    })
}

fn complete(app: &App, params: &Map<String, Value>) -> Result<Value, ProtocolError> {
    let handler = app.completion.as_ref().ok_or(ProtocolError::Internal)?;
    let reference = completion_ref(app, params)?;
    let argument = params
        .get("argument")
        .and_then(Value::as_object)
        .ok_or_else(|| ProtocolError::invalid_params("argument is required"))?;
    let name = string_param(argument, "name")?;
    let value = string_param(argument, "value")?;
    let context = string_map(params.get("context").and_then(|c| c.get("arguments")))?;
    let mut completion = handler(&reference, name, value, &context);
    if completion.values.len() > 100 {
        completion.values.truncate(100);
        completion.has_more = true;
    }
    let mut body = json!({ "values": completion.values, "hasMore": completion.has_more });
    if let Some(total) = completion.total {
        body["total"] = json!(total);
    }
    Ok(json!({ "completion": body }))
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
