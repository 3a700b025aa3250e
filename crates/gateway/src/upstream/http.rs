//! One HTTP exchange with the upstream: a JSON-RPC request POSTed with the headers this client
//! derives, the answer read as JSON or as an event stream under a hard byte cap, and checked to
//! be a JSON-RPC 2.0 response to the id that was sent.

use std::sync::Arc;

use futures::StreamExt as _;
use palisade_wire::strict;
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::UpstreamError;
use super::asks::{Asks, answer_frame};
use super::bounds::{Drops, RefusalLimit};
use super::sse;

/// The content negotiation every POST sends (protocol.md §6).
pub(super) const ACCEPT_BOTH: &str = "application/json, text/event-stream";
/// The session header of the 2025-era wire.
pub(super) const SESSION_HEADER: &str = "mcp-session-id";
/// The version header.
pub(super) const VERSION_HEADER: &str = "mcp-protocol-version";
/// Longest session id accepted from an upstream.
const MAX_SESSION_ID: usize = 1024;
/// Longest error message relayed from an upstream (characters).
pub(super) const MAX_ERROR_MESSAGE: usize = 200;
/// Notifications relayed from a request's event stream to the caller.
const RELAYED_NOTIFICATIONS: &[&str] = &["notifications/progress", "notifications/message"];

/// What one exchange sends, apart from the JSON-RPC frame.
pub(super) struct Outgoing {
    /// `MCP-Protocol-Version`, when the wire calls for it.
    pub protocol_version: Option<String>,
    /// The 2025-era session id this request belongs to.
    pub session: Option<String>,
    /// `Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`.
    pub mcp_headers: Vec<(HeaderName, HeaderValue)>,
    /// The upstream credential's headers for this caller.
    pub credential: Vec<(HeaderName, HeaderValue)>,
}

/// A JSON-RPC response to the id that was sent.
#[derive(Debug)]
pub(super) enum Body {
    /// The `result` object.
    Result(Map<String, Value>),
    /// The `error` object's code and (sanitized, truncated) message; for -32021 (a missing
    /// client capability) also the `requiredCapabilities` object of its data, so the caller
    /// learns what to declare.
    Error { code: i64, message: String, required_capabilities: Option<Value> },
}

/// JSON-RPC code of a missing required client capability.
const MISSING_CAPABILITY: i64 = -32021;

/// A checked answer and what its headers said.
#[derive(Debug)]
pub(super) struct Answer {
    pub body: Body,
    /// `Mcp-Session-Id` of the answer, checked to be visible ASCII.
    pub session_id: Option<String>,
}

/// The transport shared by every exchange of one upstream.
#[derive(Clone)]
pub(super) struct Transport {
    /// The upstream's id (for the log).
    pub upstream: String,
    pub http: reqwest::Client,
    pub url: url::Url,
    pub max_response_bytes: usize,
    /// The cap on refusals of server-to-client requests in flight.
    pub refusals: Arc<RefusalLimit>,
    /// The upstream's drop counters.
    pub drops: Arc<Drops>,
}

/// A non-success status, with the `WWW-Authenticate` challenge's scopes when it was an
/// `insufficient_scope` refusal.
#[derive(Debug)]
pub(super) enum Refusal {
    /// A 401/403 `insufficient_scope` naming these scopes.
    InsufficientScope(Vec<String>),
    /// A 401 for any other reason (the credential was refused), with the challenge's RFC 9728
    /// `resource_metadata` URL when it named one.
    Unauthorized(Option<String>),
    /// Anything else that is not an answer.
    Failed(UpstreamError),
}

impl From<UpstreamError> for Refusal {
    fn from(error: UpstreamError) -> Self {
        Self::Failed(error)
    }
}

impl Transport {
    fn post(&self, out: &Outgoing, accept: &'static str) -> reqwest::RequestBuilder {
        self.with_headers(self.http.post(self.url.clone()), out, accept)
            .header(header::CONTENT_TYPE, "application/json")
    }

    fn with_headers(
        &self,
        mut req: reqwest::RequestBuilder,
        out: &Outgoing,
        accept: &'static str,
    ) -> reqwest::RequestBuilder {
        req = req.header(header::ACCEPT, accept);
        // The credential's headers first, so none of them can stand in for a protocol header:
        // any that names one of ours is left out.
        for (name, value) in &out.credential {
            if is_protocol_header(name) {
                continue;
            }
            req = req.header(name.clone(), value.clone());
        }
        if let Some(version) = &out.protocol_version
            && let Ok(value) = HeaderValue::from_str(version)
        {
            req = req.header(VERSION_HEADER, value);
        }
        if let Some(session) = &out.session
            && let Ok(value) = HeaderValue::from_str(session)
        {
            req = req.header(SESSION_HEADER, value);
        }
        for (name, value) in &out.mcp_headers {
            req = req.header(name.clone(), value.clone());
        }
        req
    }

    /// POSTs one request frame with id `id` and reads its answer. Server-to-client requests on
    /// the answer's stream go to `asks` (refused to the upstream without one);
    /// `notifications/progress` and `notifications/message` are relayed to `notifications`.
    pub async fn request(
        &self,
        id: i64,
        method: &str,
        params: Map<String, Value>,
        out: &Outgoing,
        notifications: Option<&mpsc::Sender<Value>>,
        asks: Option<&Asks>,
    ) -> Result<Answer, Refusal> {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let body =
            serde_json::to_vec(&frame).map_err(|_| UpstreamError::Protocol("request not serializable".into()))?;
        let response = self.post(out, ACCEPT_BOTH).body(body).send().await.map_err(send_error)?;
        let status = response.status();
        if let Some(refusal) = auth_refusal(status, response.headers()) {
            return Err(refusal);
        }
        let session_id = session_id(response.headers())?;
        // 2025-era transport: a 404 to a request that carried a session id means the session is
        // gone and the client must start a new one, whatever the body says.
        if status == reqwest::StatusCode::NOT_FOUND && out.session.is_some() {
            return Err(UpstreamError::Status(404).into());
        }
        if !status.is_success() {
            // A modern server answers many refusals as a JSON-RPC error with a 4xx status: read
            // it when it is one for our id; anything else is the status itself.
            if is_json(response.headers()) {
                let bytes = self.read_body(response).await?;
                if let Ok(value) = strict::from_slice(&bytes)
                    && let Ok(body @ Body::Error { .. }) = response_body(value, id)
                {
                    return Ok(Answer { body, session_id });
                }
            }
            return Err(UpstreamError::Status(status.as_u16()).into());
        }
        if is_json(response.headers()) {
            let bytes = self.read_body(response).await?;
            let value = strict::from_slice(&bytes).map_err(|_| protocol("answered with a body that is not JSON"))?;
            return Ok(Answer { body: response_body(value, id)?, session_id });
        }
        if is_event_stream(response.headers()) {
            let body = self.read_stream(response, id, out, notifications, asks).await?;
            return Ok(Answer { body, session_id });
        }
        Err(protocol("answered with a content type that is neither JSON nor an event stream").into())
    }

    /// POSTs one notification frame; the upstream answers 202 (any 2xx is accepted).
    pub async fn notify(&self, method: &str, params: Map<String, Value>, out: &Outgoing) -> Result<(), UpstreamError> {
        let frame = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.send_frame(&frame, out).await
    }

    async fn send_frame(&self, frame: &Value, out: &Outgoing) -> Result<(), UpstreamError> {
        let body = serde_json::to_vec(frame).map_err(|_| protocol("frame not serializable"))?;
        let response = self.post(out, ACCEPT_BOTH).body(body).send().await.map_err(send_error)?;
        let status = response.status();
        drop(response);
        if status.is_success() { Ok(()) } else { Err(UpstreamError::Status(status.as_u16())) }
    }

    /// DELETEs the session of `out` (the 2025-era way to end one); any status is accepted.
    pub async fn delete(&self, out: &Outgoing) -> Result<(), UpstreamError> {
        let response =
            self.with_headers(self.http.delete(self.url.clone()), out, ACCEPT_BOTH).send().await.map_err(send_error)?;
        drop(response);
        Ok(())
    }

    /// Opens a GET event stream (the 2025-era server stream) on `out.session`.
    pub async fn open_get_stream(&self, out: &Outgoing) -> Result<reqwest::Response, UpstreamError> {
        let response = self
            .with_headers(self.http.get(self.url.clone()), out, "text/event-stream")
            .send()
            .await
            .map_err(send_error)?;
        let status = response.status();
        if !status.is_success() {
            return Err(UpstreamError::Status(status.as_u16()));
        }
        if !is_event_stream(response.headers()) {
            return Err(protocol("answered the stream request with a content type other than an event stream"));
        }
        Ok(response)
    }

    /// Opens a POST whose answer is a long-lived event stream (`subscriptions/listen`).
    pub async fn open_post_stream(
        &self,
        id: i64,
        method: &str,
        params: Map<String, Value>,
        out: &Outgoing,
    ) -> Result<reqwest::Response, UpstreamError> {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let body = serde_json::to_vec(&frame).map_err(|_| protocol("request not serializable"))?;
        let response = self.post(out, ACCEPT_BOTH).body(body).send().await.map_err(send_error)?;
        let status = response.status();
        if !status.is_success() {
            return Err(UpstreamError::Status(status.as_u16()));
        }
        if !is_event_stream(response.headers()) {
            return Err(protocol("answered the listen request without an event stream"));
        }
        Ok(response)
    }

    /// A whole JSON body under the cap; a larger one is refused, logged and counted.
    async fn read_body(&self, response: reqwest::Response) -> Result<Vec<u8>, UpstreamError> {
        let read = read_capped(response, self.max_response_bytes).await;
        if matches!(read, Err(UpstreamError::TooLarge)) {
            self.drops.oversized_message();
            tracing::warn!(upstream = %self.upstream, cap = self.max_response_bytes, "upstream's answer passed the size limit: the call fails");
        }
        read
    }

    async fn read_stream(
        &self,
        response: reqwest::Response,
        id: i64,
        out: &Outgoing,
        notifications: Option<&mpsc::Sender<Value>>,
        asks: Option<&Asks>,
    ) -> Result<Body, UpstreamError> {
        let cap = self.max_response_bytes;
        let mut parser = sse::Parser::new(cap);
        let mut total = 0usize;
        let mut stream = response.bytes_stream();
        loop {
            let Some(chunk) = stream.next().await else {
                return Err(protocol("the event stream ended before the response"));
            };
            let chunk = chunk.map_err(body_error)?;
            total = total.saturating_add(chunk.len());
            if total > cap || parser.push(&chunk).is_err() {
                self.drops.oversized_message();
                tracing::warn!(upstream = %self.upstream, cap, "upstream's event stream passed the size limit: the call fails");
                return Err(UpstreamError::TooLarge);
            }
            while let Some(event) = parser.next_event() {
                if !event.is_message() || event.data.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let value = strict::from_slice(&event.data).map_err(|_| protocol("sent an event that is not JSON"))?;
                match classify(value)? {
                    Incoming::Response(value) => return response_body(value, id),
                    Incoming::Notification { method, frame } => {
                        if let Some(tx) = notifications
                            && RELAYED_NOTIFICATIONS.contains(&method.as_str())
                        {
                            // A caller that stopped listening only misses the notification.
                            let _ = tx.send(frame).await;
                        }
                    }
                    Incoming::Request { id, method, params } => {
                        self.answer_server_request(id, &method, params.as_ref(), out, asks);
                    }
                }
            }
        }
    }

    /// Answers a server-to-client request in the background (the stream keeps being read
    /// meanwhile): `ping` at once; sampling, elicitation and roots as the gateway answers them
    /// through `asks` (the call's own channel), or -32601 without one. The answer is POSTed on
    /// the session of `out`. At most [`super::bounds::MAX_CONCURRENT_REFUSALS`] answers of one
    /// upstream are being sent at once (one connection each at most); an answer past that is
    /// dropped unsent, and counted.
    pub fn answer_server_request(
        &self,
        id: Value,
        method: &str,
        params: Option<&Value>,
        out: &Outgoing,
        asks: Option<&Asks>,
    ) {
        let answer = answer_frame(id, method, params, asks);
        let transport = self.clone();
        let out = Outgoing {
            protocol_version: out.protocol_version.clone(),
            session: out.session.clone(),
            mcp_headers: Vec::new(),
            credential: out.credential.clone(),
        };
        tokio::spawn(async move {
            let frame = answer.await;
            let Some(permit) = transport.refusals.try_start(&transport.upstream, &transport.drops) else { return };
            // Best effort, bounded by the client's connect timeout and the upstream's answer.
            let send = transport.send_frame(&frame, &out);
            if tokio::time::timeout(std::time::Duration::from_secs(10), send).await.is_err() {
                tracing::debug!(upstream = %transport.upstream, "upstream did not take the answer to its request in time");
            }
            drop(permit);
        });
    }
}

/// One message read from an event stream.
pub(super) enum Incoming {
    /// A response (to be checked against the id sent).
    Response(Value),
    /// A notification, its method and the raw frame.
    Notification { method: String, frame: Value },
    /// A server-to-client request: its id, method and params.
    Request { id: Value, method: String, params: Option<Value> },
}

/// Tells the kinds of JSON-RPC message apart; anything that is none of them is a protocol error.
pub(super) fn classify(value: Value) -> Result<Incoming, UpstreamError> {
    let Value::Object(object) = &value else { return Err(protocol("sent a message that is not a JSON object")) };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(protocol("sent a message that is not JSON-RPC 2.0"));
    }
    match object.get("method") {
        Some(Value::String(method)) => match object.get("id") {
            None => Ok(Incoming::Notification { method: method.clone(), frame: value.clone() }),
            Some(id @ (Value::String(_) | Value::Number(_))) => {
                Ok(Incoming::Request { id: id.clone(), method: method.clone(), params: object.get("params").cloned() })
            }
            Some(_) => Err(protocol("sent a request with an invalid id")),
        },
        Some(_) => Err(protocol("sent a message with a method that is not a string")),
        None => Ok(Incoming::Response(value)),
    }
}

/// Checks a response frame: JSON-RPC 2.0, our id, exactly one of an object `result` or an
/// `error` with an integer code and a string message, nothing else.
pub(super) fn response_body(value: Value, id: i64) -> Result<Body, UpstreamError> {
    let Value::Object(mut object) = value else {
        return Err(protocol("answered with a JSON value that is not an object"));
    };
    if object.remove("jsonrpc").as_ref().and_then(Value::as_str) != Some("2.0") {
        return Err(protocol("answered with a message that is not JSON-RPC 2.0"));
    }
    if object.contains_key("method") {
        return Err(protocol("answered with a request instead of a response"));
    }
    match object.remove("id") {
        Some(Value::Number(n)) if n.as_i64() == Some(id) => {}
        Some(Value::Null) if object.contains_key("error") => {
            return Err(protocol("refused the request as unreadable"));
        }
        _ => return Err(protocol("answered an id it never received")),
    }
    let result = object.remove("result");
    let error = object.remove("error");
    if !object.is_empty() {
        return Err(protocol("answered with unknown top-level members"));
    }
    match (result, error) {
        (Some(Value::Object(result)), None) => Ok(Body::Result(result)),
        (Some(_), None) => Err(protocol("answered with a result that is not an object")),
        (None, Some(Value::Object(error))) => {
            let code = error
                .get("code")
                .and_then(Value::as_i64)
                .ok_or_else(|| protocol("answered an error without an integer code"))?;
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .ok_or_else(|| protocol("answered an error without a message"))?;
            // Only a small capabilities object of a -32021 survives; any other data is dropped.
            let required_capabilities = (code == MISSING_CAPABILITY)
                .then(|| error.get("data").and_then(|data| data.get("requiredCapabilities")))
                .flatten()
                .filter(|caps| caps.is_object() && caps.to_string().len() <= 4096)
                .cloned();
            Ok(Body::Error { code, message: sanitize_message(message), required_capabilities })
        }
        (None, Some(_)) => Err(protocol("answered with an error that is not an object")),
        (Some(_), Some(_)) => Err(protocol("answered with both a result and an error")),
        (None, None) => Err(protocol("answered with neither a result nor an error")),
    }
}

/// An upstream's error message as relayed: control characters replaced, at most 200 characters.
pub(super) fn sanitize_message(message: &str) -> String {
    message.chars().take(MAX_ERROR_MESSAGE).map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// Reads a whole body, refusing it (and reading no further) once it passes `cap` bytes.
pub(super) async fn read_capped(response: reqwest::Response, cap: usize) -> Result<Vec<u8>, UpstreamError> {
    if response.content_length().is_some_and(|length| length > cap as u64) {
        return Err(UpstreamError::TooLarge);
    }
    let mut stream = response.bytes_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(body_error)?;
        if bytes.len().saturating_add(chunk.len()) > cap {
            return Err(UpstreamError::TooLarge);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

fn protocol(why: &str) -> UpstreamError {
    UpstreamError::Protocol(why.to_owned())
}

/// A failed send, with a fixed reason (reqwest's text can carry the URL).
pub(super) fn send_error(error: reqwest::Error) -> UpstreamError {
    if error.is_timeout() {
        UpstreamError::Timeout
    } else if error.is_connect() {
        UpstreamError::Unavailable("could not connect".into())
    } else {
        UpstreamError::Unavailable("the request failed".into())
    }
}

/// A body that broke off.
pub(super) fn body_error(error: reqwest::Error) -> UpstreamError {
    if error.is_timeout() { UpstreamError::Timeout } else { UpstreamError::Unavailable("the answer broke off".into()) }
}

fn content_type(headers: &HeaderMap) -> Option<String> {
    let raw = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(raw.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
}

fn is_json(headers: &HeaderMap) -> bool {
    content_type(headers).as_deref() == Some("application/json")
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    content_type(headers).as_deref() == Some("text/event-stream")
}

fn session_id(headers: &HeaderMap) -> Result<Option<String>, UpstreamError> {
    let mut values = headers.get_all(SESSION_HEADER).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(protocol("sent more than one session id"));
    }
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_SESSION_ID || !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(protocol("sent a session id that is not visible ASCII"));
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

fn is_protocol_header(name: &HeaderName) -> bool {
    let name = name.as_str();
    matches!(name, "content-type" | "accept" | "content-length" | "host" | "transfer-encoding" | "cookie")
        || name.starts_with("mcp-")
}

/// A 401/403 with `WWW-Authenticate: Bearer error="insufficient_scope", scope="…"`, or any
/// other 401. A 403 without that challenge is not an authorization refusal: `None`, so its body
/// is read like any other refusal's (servers that answer an application refusal, such as a kill
/// switch's -32030, with a 403 still get their JSON-RPC error relayed).
fn auth_refusal(status: StatusCode, headers: &HeaderMap) -> Option<Refusal> {
    if status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN {
        return None;
    }
    let scopes = headers
        .get_all(header::WWW_AUTHENTICATE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find_map(insufficient_scope);
    Some(match scopes {
        Some(scopes) => Refusal::InsufficientScope(scopes),
        None if status == StatusCode::UNAUTHORIZED => Refusal::Unauthorized(
            headers
                .get_all(header::WWW_AUTHENTICATE)
                .iter()
                .filter_map(|value| value.to_str().ok())
                .find_map(|challenge| bearer_param(challenge, "resource_metadata")),
        ),
        None => return None,
    })
}

/// Most scopes read from one challenge, and the longest scope.
const MAX_SCOPES: usize = 32;
const MAX_SCOPE_LEN: usize = 128;

/// The scopes of a Bearer `insufficient_scope` challenge; `None` for any other challenge or a
/// scope list that is not a short list of visible-ASCII tokens.
pub(super) fn insufficient_scope(challenge: &str) -> Option<Vec<String>> {
    let rest = challenge.trim_start();
    let (scheme, rest) = rest.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let params = auth_params(rest)?;
    let error = params.iter().find(|(k, _)| k.eq_ignore_ascii_case("error")).map(|(_, v)| v.as_str());
    if error != Some("insufficient_scope") {
        return None;
    }
    let scope = params.iter().find(|(k, _)| k.eq_ignore_ascii_case("scope")).map(|(_, v)| v.as_str())?;
    let scopes: Vec<String> = scope.split(' ').filter(|s| !s.is_empty()).map(str::to_owned).collect();
    let valid = !scopes.is_empty()
        && scopes.len() <= MAX_SCOPES
        && scopes.iter().all(|s| {
            s.len() <= MAX_SCOPE_LEN && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'\\')
        });
    valid.then_some(scopes)
}

/// The value of parameter `name` in a `Bearer` challenge (case-insensitive name); `None` for
/// another scheme, a malformed challenge or no such parameter.
fn bearer_param(challenge: &str, name: &str) -> Option<String> {
    let (scheme, rest) = challenge.trim_start().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    auth_params(rest)?.into_iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value)
}

/// `key=value` or `key="quoted"` pairs separated by commas; `None` when malformed.
fn auth_params(input: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut chars = input.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ' ' || *c == ',' || *c == '\t') {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' {
                break;
            }
            key.push(c);
            chars.next();
        }
        if chars.next() != Some('=') {
            return None;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => value.push(chars.next()?),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' || c == ' ' {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        out.push((key.trim().to_owned(), value));
        if out.len() > 16 {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_bearer_challenge_parameter() {
        let hint = |challenge: &str| bearer_param(challenge, "resource_metadata");
        assert_eq!(
            hint(r#"Bearer error="invalid_token", resource_metadata="https://files.example/.well-known/oauth-protected-resource/mcp""#)
                .as_deref(),
            Some("https://files.example/.well-known/oauth-protected-resource/mcp")
        );
        assert!(hint(r#"Basic realm="x", resource_metadata="https://x""#).is_none());
        assert!(hint(r#"Bearer realm="x""#).is_none());
    }

    #[test]
    fn reads_insufficient_scope_challenges() {
        assert_eq!(
            insufficient_scope(
                r#"Bearer error="insufficient_scope", scope="files:read files:write", resource_metadata="x""#
            ),
            Some(vec!["files:read".to_owned(), "files:write".to_owned()])
        );
        assert_eq!(insufficient_scope(r#"Bearer error=insufficient_scope, scope=a"#), Some(vec!["a".to_owned()]));
        assert_eq!(insufficient_scope(r#"Bearer error="invalid_token""#), None);
        assert_eq!(insufficient_scope(r#"Basic realm="x""#), None);
        assert_eq!(insufficient_scope(r#"Bearer error="insufficient_scope", scope=""#), None);
        assert_eq!(insufficient_scope(r#"Bearer error="insufficient_scope", scope="unterminated"#), None);
        assert_eq!(insufficient_scope(""), None);
    }

    #[test]
    fn checks_response_frames() {
        let ok = response_body(json!({"jsonrpc":"2.0","id":7,"result":{"a":1}}), 7).unwrap();
        assert!(matches!(ok, Body::Result(map) if map["a"] == 1));
        let long = "é\u{7}".repeat(300);
        match response_body(json!({"jsonrpc":"2.0","id":7,"error":{"code":-1,"message":long,"data":"x"}}), 7).unwrap() {
            Body::Error { code, message, .. } => {
                assert_eq!(code, -1);
                assert_eq!(message.chars().count(), MAX_ERROR_MESSAGE);
                assert!(!message.contains('\u{7}'));
            }
            Body::Result(_) => panic!("not an error"),
        }
        for bad in [
            json!({"jsonrpc":"2.0","id":8,"result":{}}),
            json!({"jsonrpc":"2.0","id":"7","result":{}}),
            json!({"jsonrpc":"1.0","id":7,"result":{}}),
            json!({"jsonrpc":"2.0","id":7,"result":[]}),
            json!({"jsonrpc":"2.0","id":7}),
            json!({"jsonrpc":"2.0","id":7,"result":{},"error":{"code":1,"message":"x"}}),
            json!({"jsonrpc":"2.0","id":7,"error":{"code":1.5,"message":"x"}}),
            json!({"jsonrpc":"2.0","id":7,"result":{},"extra":1}),
            json!([1]),
        ] {
            assert!(matches!(response_body(bad.clone(), 7), Err(UpstreamError::Protocol(_))), "{bad}");
        }
    }
}
