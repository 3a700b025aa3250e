//! Stage 6, handles: every handle argument the called tool declares, resolved with all per-use
//! checks (owner, expiry, revocation, policy version, scope, object version, the application's
//! authorization) by the handle service. Any failure is one generic `-32602`; a store outage
//! `503`; the handler never runs. The audit trail gets the handles' digest prefixes and policy
//! versions, never a raw handle.
//!
//! Holds the handle service (when the server has one); knows the application's declarations;
//! nothing about transports.

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value};

use crate::audit::AuditTrail;
use crate::auth::VerifiedPrincipal;
use crate::handles::{HandleError, HandleService, ResolvedHandle};
use crate::method::{Method, OperationKey};
use crate::registry::App;

/// Stage 6: the handle service, when the server has one.
pub(crate) struct Handles {
    handles: Option<Arc<HandleService>>,
}

impl Handles {
    /// The stage for `handles`.
    pub(crate) fn new(handles: Option<Arc<HandleService>>) -> Self {
        Self { handles }
    }

    /// Stage 6: resolves the handle arguments the called tool declares. Any failure is one generic
    /// error (the audit record says which argument, by digest prefix only); a store outage is
    /// `503`. Tools without handle arguments pass through.
    pub(super) async fn resolve(
        &self,
        app: &App,
        operation: &OperationKey,
        principal: &Arc<VerifiedPrincipal>,
        params: &Map<String, Value>,
        audit: &mut AuditTrail<'_>,
    ) -> Result<BTreeMap<String, ResolvedHandle>, ProtocolError> {
        let mut resolved = BTreeMap::new();
        let declared = match (operation.method(), operation.target()) {
            (Method::ToolsCall, Some(name)) => app.tool(name).map(|t| t.handle_args.as_slice()).unwrap_or(&[]),
            _ => &[],
        };
        if declared.is_empty() {
            return Ok(resolved);
        }
        let Some(service) = &self.handles else {
            tracing::error!(operation = %operation, "a tool declares handle arguments but the server has no handle service");
            return Err(ProtocolError::Unavailable);
        };
        let mut details = Vec::new();
        let mut versions = Vec::new();
        for argument in declared {
            let raw = params.get("arguments").and_then(|a| a.get(&argument.name)).and_then(Value::as_str);
            let outcome = match raw {
                // Under a delegation capability only the handles it lists: the same one answer.
                Some(raw)
                    if principal.delegation().is_some_and(|capability| {
                        !capability.grant().allows_handle(&crate::handles::handle_digest(raw))
                    }) =>
                {
                    let prefix = crate::handles::handle_digest(raw);
                    details.push(format!(
                        "{}={} outside-capability",
                        argument.name,
                        palisade_store::hex_prefix(&prefix)
                    ));
                    Err(HandleError::Denied)
                }
                Some(raw) => {
                    let prefix = crate::handles::handle_digest(raw);
                    details.push(format!("{}={}", argument.name, palisade_store::hex_prefix(&prefix)));
                    service.resolve(principal, raw, &argument.object_type, &argument.required_scope).await
                }
                None => {
                    details.push(format!("{}=missing", argument.name));
                    Err(HandleError::Denied)
                }
            };
            audit.detail = Some(details.join(" "));
            let handle = outcome?;
            versions.push(format!("{}:{}", handle.object_type, handle.policy_version));
            audit.policy_version = Some(versions.join(" "));
            resolved.insert(argument.name.clone(), handle);
        }
        Ok(resolved)
    }
}
