//! Stage 8 for `tools/call`: the MRTR round opened and verified, the arguments validated against
//! the tool's `inputSchema`, handle arguments removed, the confirmation step of a
//! needs-confirmation tool, then the cleared handler — or a durable task for a task-capable tool
//! called with the tasks extension.

use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::Dispatch;
use crate::audit::{Allowed, AuditStage, AuditTrail};
use crate::context::{Outcome, RequestContext};
use crate::method::{Method, OperationKey};
use crate::registry::{App, TaskSupport};
use crate::tasks::{TASKS_EXTENSION, TaskCall, missing_tasks_capability};

impl Dispatch {
    /// `tools/call`, once the allow decision is on the record (`allowed`).
    pub(super) async fn call_tool(
        &self,
        app: &Arc<App>,
        operation: &OperationKey,
        mut ctx: RequestContext,
        params: &Map<String, Value>,
        audit: &AuditTrail<'_>,
        allowed: Allowed,
    ) -> Result<Value, ProtocolError> {
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
                let result = crate::CallToolResult::error(format!("invalid arguments: {}", problems.join("; ")));
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
                input.state = Some(json!({ "confirmed": true, "app": app_state, "n": crate::audit::fresh_trace_id() }));
                Outcome::InputRequired(input)
            }
            outcome => outcome,
        };
        self.finish_round(&ctx, Method::ToolsCall, params, outcome.map_complete(|r| r.into_value()))
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
        let scopes = crate::pipeline::authorize::required_scopes(app, operation, params);
        let call = TaskCall { tool: tool.name.clone(), arguments, meta, scopes };
        service.create(app, &self.events, &ctx, call).await
    }
}
