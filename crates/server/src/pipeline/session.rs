//! Stage 2b, the session (2025-era wire only): after authentication, the session named by
//! `Mcp-Session-Id` must be a live session of *this* principal (id digest + owner + idle and
//! absolute expiry in one store statement); its negotiated version, client capabilities and log
//! level become the request's `_meta`. `initialize` makes the session instead; `ping`,
//! `logging/setLevel` and `resources/subscribe|unsubscribe` change only the caller's own row.
//! The session wire's requests that are not JSON-RPC requests are admitted in `admission.rs`.
//!
//! Holds the session service, the accepted versions and the clock. A session is never proof of
//! identity.

use std::sync::Arc;

use palisade_wire::{LogLevel, ProtocolError, Request, RequestMeta, meta_keys};
use serde_json::{Map, Value, json};

use super::params::string_param;
use super::wire::{LegacyWire, TransportHeaders, plain_header};
use crate::auth::VerifiedPrincipal;
use crate::clock::Clock;
use crate::context::RequestContext;
use crate::method::Method;
use crate::registry::App;
use crate::sessions::{Admitted, SessionId, SessionService};
use crate::store_errors::store_refusal;

/// Stage 2b (and the session methods stage 8 runs): the session service, when the server has
/// one, the versions `initialize` accepts and the clock sessions expire by.
pub(crate) struct Session {
    sessions: Option<Arc<SessionService>>,
    versions: Vec<String>,
    pub(super) clock: Arc<dyn Clock>,
}

impl Session {
    /// The stage for `sessions`, accepting `versions` at `initialize`.
    pub(crate) fn new(sessions: Option<Arc<SessionService>>, versions: Vec<String>, clock: Arc<dyn Clock>) -> Self {
        Self { sessions, versions, clock }
    }

    /// The session service, when the server has one.
    pub(crate) fn sessions(&self) -> Option<&Arc<SessionService>> {
        self.sessions.as_ref()
    }

    /// Stage 2b: the request's `_meta` — the envelope's on the 2026-07-28 wire; on the 2025-era
    /// wire from the `initialize` params or from the caller's live session.
    pub(super) async fn session_meta(
        &self,
        method: Method,
        meta: Option<RequestMeta>,
        request: &Request,
        headers: Option<&TransportHeaders>,
        legacy: Option<&LegacyWire<'_>>,
        principal: &VerifiedPrincipal,
    ) -> Result<(RequestMeta, Option<Admitted>), ProtocolError> {
        match (meta, legacy) {
            (Some(meta), _) => Ok((meta, None)),
            (None, Some(wire)) => self.legacy_session(method, request, headers, wire.session, principal).await,
            (None, None) => Err(ProtocolError::Internal),
        }
    }

    /// Stage 2b on the 2025-era wire: the request's `_meta`, from the `initialize` params or
    /// from the caller's live session.
    async fn legacy_session(
        &self,
        method: Method,
        request: &Request,
        headers: Option<&TransportHeaders>,
        session: Option<&SessionId>,
        principal: &VerifiedPrincipal,
    ) -> Result<(RequestMeta, Option<Admitted>), ProtocolError> {
        let params = &request.params;
        let progress_token = match params.get("_meta").and_then(|meta| meta.get(meta_keys::PROGRESS_TOKEN)) {
            None => None,
            Some(raw) => Some(
                palisade_wire::ProgressToken::from_value(raw)
                    .ok_or_else(|| ProtocolError::invalid_params("progressToken must be a string or an integer"))?,
            ),
        };
        if method == Method::Initialize {
            let requested = string_param(params, "protocolVersion")?;
            let client_capabilities = match params.get("capabilities") {
                Some(Value::Object(capabilities)) => capabilities.clone(),
                _ => return Err(ProtocolError::invalid_params("capabilities must be an object")),
            };
            let client_info = match params.get("clientInfo") {
                None | Some(Value::Null) => None,
                Some(info @ Value::Object(_)) => Some(info.clone()),
                Some(_) => return Err(ProtocolError::invalid_params("clientInfo must be an object")),
            };
            let versions = &self.versions;
            // The client's version if we speak it, else our newest (the client decides).
            let protocol_version = match versions.iter().find(|v| v.as_str() == requested) {
                Some(version) => version.clone(),
                None => versions.first().cloned().ok_or(ProtocolError::Internal)?,
            };
            let meta =
                RequestMeta { protocol_version, client_capabilities, client_info, log_level: None, progress_token };
            return Ok((meta, None));
        }
        let service = self.sessions.as_ref().ok_or_else(|| {
            tracing::error!("the 2025-era wire is on but the server has no session store");
            ProtocolError::Unavailable
        })?;
        let session = session.ok_or(ProtocolError::SessionNotFound)?;
        let admitted = service.admit(principal, session, self.clock.as_ref()).await?;
        if let Some(headers) = headers
            && let Some(version) = plain_header(&headers.protocol_version, "MCP-Protocol-Version")?
            && version != admitted.state.protocol_version
        {
            return Err(ProtocolError::HeaderMismatch(
                "MCP-Protocol-Version differs from the session's negotiated version".into(),
            ));
        }
        let client_capabilities = serde_json::from_str::<Value>(&admitted.state.client_capabilities)
            .ok()
            .and_then(|value| value.as_object().cloned())
            .ok_or_else(|| {
                tracing::error!("a stored session has unreadable client capabilities");
                ProtocolError::Internal
            })?;
        let meta = RequestMeta {
            protocol_version: admitted.state.protocol_version.clone(),
            client_capabilities,
            client_info: admitted.state.client_info.as_deref().and_then(|info| serde_json::from_str(info).ok()),
            log_level: admitted.state.log_level.as_deref().and_then(LogLevel::parse),
            progress_token,
        };
        Ok((meta, Some(admitted)))
    }

    /// `initialize`: a session bound to the caller, and the capabilities negotiated once.
    pub(super) async fn initialize(
        &self,
        app: &App,
        ctx: &RequestContext,
    ) -> Result<(Value, SessionId), ProtocolError> {
        let service = self.sessions.as_ref().ok_or_else(|| {
            tracing::error!("the 2025-era wire is on but the server has no session store");
            ProtocolError::Unavailable
        })?;
        let capabilities = Value::Object(ctx.meta.client_capabilities.clone());
        let session = service
            .create(
                &ctx.principal,
                &ctx.meta.protocol_version,
                &capabilities,
                ctx.meta.client_info.as_ref(),
                self.clock.as_ref(),
            )
            .await?;
        let mut result = json!({
            "protocolVersion": ctx.meta.protocol_version,
            "capabilities": app.capabilities(),
            "serverInfo": { "name": app.name, "version": app.version },
        });
        if let Some(instructions) = &app.instructions {
            result["instructions"] = json!(instructions);
        }
        Ok((result, session))
    }

    /// `ping`, `logging/setLevel`, `resources/subscribe` and `resources/unsubscribe`: state of
    /// the caller's own session, in the store.
    pub(super) async fn session_method(
        &self,
        method: Method,
        params: &Map<String, Value>,
        admitted: Option<&Admitted>,
    ) -> Result<Value, ProtocolError> {
        let (Some(admitted), Some(service)) = (admitted, self.sessions.as_ref()) else {
            return Err(ProtocolError::Internal);
        };
        let store = service.store();
        let now = self.clock.now_ms();
        let (digest, owner) = (admitted.digest, &admitted.owner);
        let live = match method {
            Method::Ping => true,
            Method::SetLogLevel => {
                let level = string_param(params, "level")?;
                if LogLevel::parse(level).is_none() {
                    return Err(ProtocolError::invalid_params("level is not a known log level"));
                }
                store
                    .set_session_log_level(digest, owner, level, now)
                    .await
                    .map_err(|error| store_refusal("set_session_log_level", &error))?
            }
            Method::Subscribe => store
                .subscribe_session(digest, owner, string_param(params, "uri")?, now)
                .await
                .map_err(|error| store_refusal("subscribe_session", &error))?,
            Method::Unsubscribe => store
                .unsubscribe_session(digest, owner, string_param(params, "uri")?, now)
                .await
                .map_err(|error| store_refusal("unsubscribe_session", &error))?,
            _ => return Err(ProtocolError::Internal),
        };
        if live { Ok(json!({})) } else { Err(ProtocolError::SessionNotFound) }
    }
}
