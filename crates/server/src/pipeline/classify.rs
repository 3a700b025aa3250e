//! Stage 3, classify: the [`OperationKey`] — the method plus the *registered* tool, prompt or
//! resource it targets (the registry's own name or template, never the client's string beyond
//! picking a registered entry). Scopes, the kill switch and the audit record are keyed on it.
//!
//! Knows the method table and the application's definitions; nothing about the caller.

use palisade_wire::{ProtocolError, RequestMeta};
use serde_json::{Map, Value};

use super::params::string_param;
use crate::method::{Method, OperationKey, TargetFamily};
use crate::registry::App;
use crate::tasks::TASKS_EXTENSION;

/// Stage 3: holds nothing (the application snapshot is the request's).
pub(crate) struct Classify;

impl Classify {
    /// Stage 3: the method plus the registered entry it targets, by [`Method::target_family`].
    pub(super) fn classify(
        &self,
        app: &App,
        method: Method,
        params: &Map<String, Value>,
    ) -> Result<OperationKey, ProtocolError> {
        classify(app, method, params)
    }
}

/// Stage 3: the method plus the registered entry it targets, by [`Method::target_family`].
fn classify(app: &App, method: Method, params: &Map<String, Value>) -> Result<OperationKey, ProtocolError> {
    let (target, origin) = match method.target_family() {
        TargetFamily::Tool => {
            let name = string_param(params, "name")?;
            let tool = app.tool(name).ok_or_else(|| ProtocolError::invalid_params("unknown tool"))?;
            (Some(tool.name.clone()), tool.origin.clone())
        }
        TargetFamily::Prompt => {
            let name = string_param(params, "name")?;
            let prompt = app.prompt(name).ok_or_else(|| ProtocolError::invalid_params("unknown prompt"))?;
            (Some(prompt.name.clone()), prompt.origin.clone())
        }
        TargetFamily::Resource => {
            let uri = string_param(params, "uri")?;
            let (registered, origin) = app
                .registered_resource_origin(uri)
                .ok_or_else(|| ProtocolError::ResourceNotFound { uri: uri.to_owned() })?;
            (Some(registered.to_owned()), origin)
        }
        TargetFamily::None => (None, None),
    };
    // Any tasks/* request without the extension is -32021, before the id is looked at.
    if method.is_tasks_method() {
        let declared = RequestMeta::from_params(params).map(|meta| meta.has_extension(TASKS_EXTENSION));
        if !declared.unwrap_or(false) {
            return Err(crate::tasks::missing_tasks_capability());
        }
    }
    Ok(OperationKey::new(method, target).with_origin(origin))
}
