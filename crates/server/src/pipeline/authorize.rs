//! Stage 5, authorize: the scopes an operation requires — what its registered entry requires;
//! for a listen stream, what reading every resource it names requires; for a completion, what
//! its reference requires. What a request only *names* is never looser than acting on it. The
//! check itself (`Authenticator::require_scopes`, a 403 naming every missing scope) is the auth
//! module's.
//!
//! Holds the authenticator (whose mode makes the check); knows the application's definitions;
//! nothing about handles or the kill switch.

use palisade_wire::ProtocolError;
use serde_json::{Map, Value};

use crate::auth::{Authenticator, VerifiedPrincipal};
use crate::method::{Method, OperationKey};
use crate::registry::App;

/// Stage 5: the authenticator, whose mode checks the scopes.
pub(crate) struct Authorize {
    authenticator: Authenticator,
}

impl Authorize {
    /// The stage for `authenticator` (the one stage 2 holds).
    pub(crate) fn new(authenticator: Authenticator) -> Self {
        Self { authenticator }
    }

    /// Stage 5: whether `principal` holds every scope the operation requires; the refusal
    /// names all of them, with the mode's challenge.
    pub(super) fn authorize(
        &self,
        app: &App,
        operation: &OperationKey,
        params: &Map<String, Value>,
        principal: &VerifiedPrincipal,
    ) -> Result<(), (ProtocolError, Option<String>)> {
        let required = required_scopes(app, operation, params);
        match self.authenticator.require_scopes(principal, &required) {
            Ok(()) => Ok(()),
            Err(refusal) => Err((ProtocolError::InsufficientScope { required }, refusal.challenge)),
        }
    }
}

/// Stage 5's scopes: what the operation's registered entry requires; for a listen stream,
/// what reading every resource it names requires; for a completion, what its reference
/// (the prompt, the resource) requires. What a request only *names* is never looser than
/// what acting on it is.
pub(crate) fn required_scopes(app: &App, operation: &OperationKey, params: &Map<String, Value>) -> Vec<String> {
    let mut scopes: Vec<String> = match (operation.method(), operation.target()) {
        (Method::ToolsCall, Some(name)) => app.tool(name).map(|t| t.required_scopes.clone()).unwrap_or_default(),
        (Method::PromptsGet, Some(name)) => app.prompt(name).map(|p| p.required_scopes.clone()).unwrap_or_default(),
        // Subscribing to a resource needs what reading it needs, on either wire.
        (Method::ResourcesRead | Method::Subscribe | Method::Unsubscribe, Some(target)) => {
            app.resource_scopes(target).to_vec()
        }
        (Method::Listen, _) => {
            let uris = params
                .get("notifications")
                .and_then(|filter| filter.get("resourceSubscriptions"))
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            uris.iter()
                .filter_map(Value::as_str)
                .filter_map(|uri| app.registered_resource(uri))
                .flat_map(|target| app.resource_scopes(target).iter().cloned())
                .collect()
        }
        (Method::Complete, _) => {
            let reference = params.get("ref");
            let field = |key: &str| reference.and_then(|r| r.get(key)).and_then(Value::as_str);
            match reference.and_then(|r| r.get("type")).and_then(Value::as_str) {
                Some("ref/prompt") => field("name")
                    .and_then(|name| app.prompt(name))
                    .map(|p| p.required_scopes.clone())
                    .unwrap_or_default(),
                Some("ref/resource") => field("uri")
                    .and_then(|uri| app.registered_resource(uri).or(Some(uri)))
                    .map(|target| app.resource_scopes(target).to_vec())
                    .unwrap_or_default(),
                _ => Vec::new(),
            }
        }
        _ => Vec::new(),
    };
    scopes.sort();
    scopes.dedup();
    scopes
}
