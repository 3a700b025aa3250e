//! Stage 3, classify: the [`OperationKey`] — the method plus the *registered* tool, prompt or
//! resource it targets (the registry's own name or template, never the client's string beyond
//! picking a registered entry). Scopes, the kill switch and the audit record are keyed on it.
//!
//! Knows the method table and the application's definitions; nothing about the caller.

use palisade_wire::{ProtocolError, RequestMeta};
use serde_json::{Map, Value};

use super::dispatch::string_param;
use crate::method::{Method, OperationKey, TargetFamily};
use crate::registry::App;
use crate::tasks::TASKS_EXTENSION;

/// Stage 3: the method plus the registered entry it targets, by [`Method::target_family`].
pub(super) fn classify(app: &App, method: Method, params: &Map<String, Value>) -> Result<OperationKey, ProtocolError> {
    let target = match method.target_family() {
        TargetFamily::Tool => {
            let name = string_param(params, "name")?;
            Some(app.tool(name).ok_or_else(|| ProtocolError::invalid_params("unknown tool"))?.name.clone())
        }
        TargetFamily::Prompt => {
            let name = string_param(params, "name")?;
            Some(app.prompt(name).ok_or_else(|| ProtocolError::invalid_params("unknown prompt"))?.name.clone())
        }
        TargetFamily::Resource => {
            let uri = string_param(params, "uri")?;
            let registered = app.registered_resource(uri);
            Some(registered.ok_or_else(|| ProtocolError::ResourceNotFound { uri: uri.to_owned() })?.to_owned())
        }
        TargetFamily::None => None,
    };
    // Any tasks/* request without the extension is -32021, before the id is looked at.
    if method.is_tasks_method() {
        let declared = RequestMeta::from_params(params).map(|meta| meta.has_extension(TASKS_EXTENSION));
        if !declared.unwrap_or(false) {
            return Err(crate::tasks::missing_tasks_capability());
        }
    }
    Ok(OperationKey::new(method, target))
}
