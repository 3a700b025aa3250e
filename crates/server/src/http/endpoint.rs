//! The HTTP transport's request handlers: `POST /mcp` after the transport's own checks (Host,
//! Origin, media types, body size and arrival time, the strict JSON-RPC frame) handed on to the
//! pipeline, plus `/readyz`, `/readyz/detail`, `/metrics` and the development authorization server's paths. The
//! listeners, the accept loop and the routers that reach them are `http/mod.rs`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::{Body, HttpBody as _};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Method as HttpMethod, StatusCode, Uri, Version, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use palisade_wire::ProtocolError;
use palisade_wire::jsonrpc::{Message, parse_message};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::context::NotificationSink;
use crate::http_response::{
    HttpState, MCP_SESSION_ID, Work, accepted_kinds, refusal_response, respond, transport_headers,
};
use crate::pipeline::TransportHeaders;
use crate::refusals::Reason;

/// One request to the development authorization server: the listener's Host/Origin checks, a
/// bounded body, then [`palisade_auth::authorization_server::DevAuthorizationServer::handle`].
pub(super) async fn authorization_endpoint(
    state: Arc<HttpState>,
    authorization_server: Arc<palisade_auth::authorization_server::DevAuthorizationServer>,
    request: axum::extract::Request,
) -> Response {
    const MAX_BODY: usize = 64 * 1024;
    let (parts, body) = request.into_parts();
    if let Err((reason, response)) = check_transport(&state, &parts.uri, parts.version, &parts.headers) {
        state.refused(reason, peer_of(&parts));
        return response;
    }
    let Ok(body) = Limited::new(body, MAX_BODY).collect().await.map(http_body_util::Collected::to_bytes) else {
        return payload_too_large();
    };
    let text = |name: header::HeaderName| parts.headers.get(name).and_then(|value| value.to_str().ok());
    let peer = peer_of(&parts);
    let mut answer = authorization_server
        .handle(palisade_auth::authorization_server::HttpRequest {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query(),
            content_type: text(header::CONTENT_TYPE),
            cookie: text(header::COOKIE),
            body: &body,
            peer,
        })
        .await;
    if let Some(event) = answer.audit.take()
        && !record_authorization(&state.server, &authorization_server, event, answer.status, peer).await
    {
        // A grant that is not on the record is not handed out (fail closed, like an allow).
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")],
            r#"{"error":"temporarily_unavailable","error_description":"the audit log is unavailable"}"#,
        )
            .into_response();
    }
    let mut response = Response::new(Body::from(answer.body));
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in answer.headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// Puts one answer of the development authorization server on the audit record: a grant at once
/// (`false` when it could not be made durable), a refusal counted ([`crate::surface_audit`]).
pub(super) async fn record_authorization(
    server: &crate::Server,
    authorization_server: &palisade_auth::authorization_server::DevAuthorizationServer,
    event: palisade_auth::authorization_server::AuditEvent,
    status: u16,
    peer: Option<IpAddr>,
) -> bool {
    use crate::surface_audit::{Grant, STAGE_AUTHORIZATION_SERVER};
    let audit = server.surface_audit();
    if !event.granted {
        audit.refuse(STAGE_AUTHORIZATION_SERVER, event.endpoint, event.reason, status, peer);
        return true;
    }
    let grant = Grant {
        stage: STAGE_AUTHORIZATION_SERVER,
        endpoint: event.endpoint,
        outcome: event.reason,
        person: event.subject.as_deref().map(|subject| (authorization_server.issuer(), subject)),
        tenant: event.tenant.as_deref(),
        client: event.client_id.as_deref(),
        scopes: event.scopes,
        detail: event.detail.map(str::to_owned),
        source: peer,
    };
    audit.grant(grant).await.is_ok()
}

/// `/readyz`: `ready`, or 503 with why not in fixed words (the store, or an application that
/// cannot serve: the gateway with no upstream serving).
pub(super) async fn readyz(State(state): State<Arc<HttpState>>) -> Response {
    match state.server.readiness().await {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}

/// `/readyz/detail` on the operator's private listener: readiness as JSON with the
/// application's detail (the gateway's upstreams: state, last error, definition counts),
/// behind the same Host/Origin checks as `/metrics`. 200 when ready, 503 when not.
pub(super) async fn readyz_detail(State(state): State<Arc<HttpState>>, request: axum::extract::Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err((reason, response)) = check_transport(&state, &parts.uri, parts.version, &parts.headers) {
        state.refused(reason, peer_of(&parts));
        return response;
    }
    let detail = state.server.readiness_detail().await;
    let ready = detail.get("ready").and_then(Value::as_bool) == Some(true);
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, [(header::CACHE_CONTROL, "no-store")], axum::Json(detail)).into_response()
}

/// `/metrics`, behind the listener's Host/Origin checks (the exposition tells a rebinding page
/// what the server does; the checks make sure no such page can read it).
pub(super) async fn metrics(State(state): State<Arc<HttpState>>, request: axum::extract::Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err((reason, response)) = check_transport(&state, &parts.uri, parts.version, &parts.headers) {
        state.refused(reason, peer_of(&parts));
        return response;
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.server.metrics().render()).into_response()
}

/// The peer's address, when the request carries it (`serve` always adds it).
pub(super) fn peer_of(parts: &axum::http::request::Parts) -> Option<IpAddr> {
    parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(address)| address.ip())
}

pub(super) async fn mcp_endpoint(State(state): State<Arc<HttpState>>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    let peer = peer_of(&parts);
    let refuse = |reason: Reason, response: Response| {
        state.refused(reason, peer);
        response
    };
    let (method, headers) = (&parts.method, &parts.headers);
    if let Err((reason, response)) = check_transport(&state, &parts.uri, parts.version, headers) {
        return refuse(reason, response);
    }
    // Bearer tokens travel in the Authorization header only, never in the URL (the RFC 6750
    // query form is not supported): such a request is refused before anything else.
    if parts.uri.query().is_some_and(|q| q.split('&').any(|pair| pair.split('=').next() == Some("access_token"))) {
        return refuse(Reason::TokenInUrl, refusal_response(None, &ProtocolError::TokenInUrl));
    }
    let legacy = state.server.legacy_enabled();
    // The GET stream and session DELETE exist only for a 2025-era session: they carry its id.
    let with_session = legacy && headers.contains_key(&MCP_SESSION_ID);
    if with_session && method == HttpMethod::GET {
        let response = crate::legacy::get_stream(&state, headers, peer).await;
        // Its only 406 is the transport's `Accept` check; its other refusals are the pipeline's.
        if response.status() == StatusCode::NOT_ACCEPTABLE {
            state.refused(Reason::Accept, peer);
        }
        return response;
    }
    if with_session && method == HttpMethod::DELETE {
        return crate::legacy::delete_session(&state, headers).await;
    }
    if method != HttpMethod::POST {
        // No GET stream and no session DELETE in 2026-07-28.
        return refuse(Reason::Method, (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "POST")]).into_response());
    }
    let streaming = match accepted_kinds(headers) {
        Some(accepts) => accepts.event_stream,
        None => return refuse(Reason::Accept, refusal_response(None, &ProtocolError::NotAcceptable)),
    };
    if !is_json_content_type(headers) {
        return refuse(Reason::ContentType, refusal_response(None, &ProtocolError::UnsupportedMediaType));
    }
    let config = state.server.config();
    let limit = config.max_body_bytes;
    // A declared length over the limit is refused before any of it is read.
    if body.size_hint().lower() > u64::try_from(limit).unwrap_or(u64::MAX) {
        return refuse(Reason::BodyTooLarge, payload_too_large());
    }
    let bytes = match tokio::time::timeout(config.body_read_timeout, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
            return refuse(Reason::BodyTooLarge, payload_too_large());
        }
        // The body broke off (the client left, or sent a malformed chunk): nobody to refuse.
        Ok(Err(_)) => {
            let response = refusal_response(None, &ProtocolError::BodyUnreadable);
            return with_connection_close(response, parts.version);
        }
        Err(_) => {
            let response = refusal_response(None, &ProtocolError::BodyTimeout);
            return refuse(Reason::BodyTimeout, with_connection_close(response, parts.version));
        }
    };
    let parsed = parse_message(&bytes);
    if legacy && crate::legacy::is_legacy_post(headers, &bytes, parsed.as_ref().ok()) {
        let response = crate::legacy::post(&state, headers, &bytes, streaming, peer).await;
        // A frame the session wire refused as a frame (its 400), unless it was a client's answer
        // to a server request (which the strict parser refuses as a response, and the session
        // wire takes).
        if let Err(frame_error) = &parsed
            && response.status() == StatusCode::BAD_REQUEST
            && !is_client_answer(&bytes)
        {
            state.refused(frame_reason(&frame_error.error, &bytes), peer);
        }
        return response;
    }
    let request = match parsed {
        Ok(Message::Request(request)) => request,
        // No client notification is defined over HTTP in this revision: accept and ignore.
        Ok(Message::Notification(_)) => return StatusCode::ACCEPTED.into_response(),
        Err(frame_error) => {
            let response = refusal_response(frame_error.id.as_ref(), &frame_error.error);
            return refuse(frame_reason(&frame_error.error, &bytes), response);
        }
    };
    let transport_headers = TransportHeaders { source: peer, ..transport_headers(headers) };
    let server = state.server.clone();
    let queue = server.config().listen_queue;
    let (sink, notifications) = NotificationSink::channel(queue);
    let cancel = CancellationToken::new();
    // Dropped when the client goes away (response future or SSE body dropped): cancels the work.
    let guard = cancel.clone().drop_guard();
    let work = Work::new(async move {
        let started = std::time::Instant::now();
        let reply = server.handle_request(request, Some(&transport_headers), sink, cancel).await;
        server.metrics().observe_request(reply.frame.get("error").is_none(), started.elapsed());
        reply
    });
    respond(&state, streaming, work, notifications, guard).await
}

pub(super) fn payload_too_large() -> Response {
    refusal_response(None, &ProtocolError::PayloadTooLarge)
}

/// Ends an HTTP/1.x connection after `response` (the rest of the request's body is not read).
/// HTTP/2 has no such header: there the stream alone ends.
pub(super) fn with_connection_close(mut response: Response, version: Version) -> Response {
    if version < Version::HTTP_2 {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The refusal reason of a frame the strict parser refused.
pub(super) fn frame_reason(error: &ProtocolError, bytes: &[u8]) -> Reason {
    if *error == ProtocolError::Parse {
        Reason::Parse
    } else if bytes.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'[') {
        Reason::Batch
    } else {
        Reason::Frame
    }
}

/// Whether a body is shaped as a client's answer to a server request (an object with an id, a
/// result or an error, and no method), which the session wire accepts.
pub(super) fn is_client_answer(bytes: &[u8]) -> bool {
    matches!(
        palisade_wire::strict::from_slice(bytes),
        Ok(Value::Object(message))
            if !message.contains_key("method")
                && message.contains_key("id")
                && (message.contains_key("result") || message.contains_key("error"))
    )
}

/// Whether a request's `Content-Type` is sent once and is `application/json` (any case),
/// optionally with parameters, a `charset` only `utf-8`. Absent, repeated or anything else
/// (`application/json-seq`, `text/json`, …) is not.
pub(super) fn is_json_content_type(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let (Some(value), None) = (values.next(), values.next()) else { return false };
    let Ok(value) = value.to_str() else { return false };
    let mut parts = value.split(';');
    let media = parts.next().unwrap_or_default().trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return false;
    }
    parts.all(|parameter| match parameter.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        Some((name, _)) => !name.trim().is_empty(),
        // `application/json;` with nothing after the separator.
        None => parameter.trim().is_empty(),
    })
}

/// Host and Origin against the allow-lists (DNS rebinding), then header count and size.
///
/// `Host` must be sent exactly once and be allowed; a request target in absolute form
/// (`POST http://host/mcp`) must name the same authority (case-insensitively). An HTTP/2
/// request may carry its authority in `:authority` alone. `Origin`, when present, must be sent
/// once and be allowed.
#[allow(clippy::result_large_err)]
pub(super) fn check_transport(
    state: &HttpState,
    uri: &Uri,
    version: Version,
    headers: &HeaderMap,
) -> Result<(), (Reason, Response)> {
    let forbidden = |reason: Reason, error: ProtocolError| (reason, refusal_response(None, &error));
    let mut hosts = headers.get_all(header::HOST).iter();
    let (host, repeated) = (hosts.next(), hosts.next().is_some());
    if repeated {
        return Err(forbidden(Reason::Host, ProtocolError::RepeatedHost));
    }
    let host = host.map(|host| host.to_str().unwrap_or_default());
    let authority = uri.authority().map(axum::http::uri::Authority::as_str);
    let host = match (host, authority) {
        (Some(host), Some(authority)) if !host.eq_ignore_ascii_case(authority) => {
            return Err(forbidden(Reason::Host, ProtocolError::HostNotAllowed));
        }
        (Some(host), _) => Some(host),
        (None, Some(authority)) if version == Version::HTTP_2 => Some(authority),
        (None, _) => None,
    };
    let allowed = |host: &str| {
        state.allowed_hosts.iter().any(|allowed| allowed.eq_ignore_ascii_case(host))
            || (state.ip_literal_hosts && is_ip_literal(host))
    };
    if !host.is_some_and(allowed) {
        return Err(forbidden(Reason::Host, ProtocolError::HostNotAllowed));
    }
    let mut origins = headers.get_all(header::ORIGIN).iter();
    if let Some(origin) = origins.next() {
        if origins.next().is_some() {
            return Err(forbidden(Reason::Origin, ProtocolError::RepeatedOrigin));
        }
        let allowed = origin.to_str().is_ok_and(|o| state.allowed_origins.iter().any(|a| a.eq_ignore_ascii_case(o)));
        if !allowed {
            return Err(forbidden(Reason::Origin, ProtocolError::OriginNotAllowed));
        }
    }
    let config = state.server.config();
    let total: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    if headers.len() > config.max_header_count || total > config.max_header_bytes {
        return Err((Reason::HeadersTooLarge, refusal_response(None, &ProtocolError::HeadersTooLarge)));
    }
    Ok(())
}

/// Whether a `Host` value is an IP address literal, with or without a port (`192.0.2.7:9464`,
/// `[2001:db8::7]:9464`, `192.0.2.7`, `[2001:db8::7]`).
pub(super) fn is_ip_literal(host: &str) -> bool {
    host.parse::<SocketAddr>().is_ok()
        || host.parse::<std::net::Ipv4Addr>().is_ok()
        || host
            .strip_prefix('[')
            .and_then(|rest| rest.strip_suffix(']'))
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
}
