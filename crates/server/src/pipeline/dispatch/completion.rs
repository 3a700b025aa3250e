//! Stage 8 for `completion/complete`: the reference checked to name a registered prompt or
//! resource the caller may use by the operator's policies (one answer for unknown and hidden),
//! then the application's completion handler (or the relay that forwards it).

use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::Dispatch;
use super::lists::Viewer;
use crate::context::RequestContext;
use crate::method::Method;
use crate::pipeline::params::{string_map, string_param};
use crate::policy::Policies;
use crate::registry::{App, CompletionRef};

impl Dispatch {
    /// `completion/complete`: relayed when the application relays completions, else answered
    /// by its handler.
    pub(super) async fn complete(
        &self,
        app: &Arc<App>,
        policies: Option<&Policies>,
        ctx: RequestContext,
        params: &Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        let reference = completion_ref(app, params)?;
        if !self.may_complete(app, policies, &ctx, &reference) {
            return Err(hidden(&reference));
        }
        match &app.relayed_completion {
            Some(relay) => relay(ctx.clone(), reference, params.clone()).await,
            None => complete(app, params),
        }
    }

    /// Whether the caller may use what `reference` names (its prompt, or its resource or
    /// template), as the lists decide it.
    fn may_complete(
        &self,
        app: &App,
        policies: Option<&Policies>,
        ctx: &RequestContext,
        reference: &CompletionRef,
    ) -> bool {
        let Some(policies) = policies else { return true };
        let viewer = Viewer {
            principal: &ctx.principal,
            legacy: ctx.meta.protocol_version.starts_with("2025"),
            source: ctx.source,
            now_ms: self.clock.now_unsigned_ms(),
        };
        match reference {
            CompletionRef::Prompt(name) => viewer.may_use(policies, app, Method::PromptsGet, name),
            CompletionRef::Resource(uri) if app.templates.iter().any(|t| &t.template == uri) => {
                viewer.may_use(policies, app, Method::ResourcesRead, uri)
            }
            CompletionRef::Resource(uri) => viewer.may_read(Some(policies), app, uri),
        }
    }
}

/// The refusal for a reference the caller may not use: the same as for one that does not exist.
fn hidden(reference: &CompletionRef) -> ProtocolError {
    match reference {
        CompletionRef::Prompt(_) => ProtocolError::invalid_params("unknown prompt"),
        CompletionRef::Resource(_) => ProtocolError::invalid_params("unknown resource"),
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
