//! The gateway's MCP client toward one upstream over Streamable HTTP, in both protocol eras:
//! 2026-07-28 (every request carries its `_meta`, `server/discover`, `subscriptions/listen`) and
//! 2025-11-25 / 2025-06-18 (`initialize`, `Mcp-Session-Id`, the GET stream), hardened against an
//! upstream that is down, slow, hostile or broken.
//!
//! - One `reqwest` client per upstream: no redirects, no cookies, no proxy, a connect timeout,
//!   a total deadline per request ([`UpstreamLimits::request_timeout`]), every answer read as a
//!   stream under a hard byte cap (reading stops at the cap: [`UpstreamError::TooLarge`]).
//! - Request ids are this client's own counter; an answer is accepted only as a JSON-RPC 2.0
//!   response to the id that was sent ([`UpstreamError::Protocol`] otherwise).
//! - The headers an upstream receives are only: `Content-Type`, `Accept`,
//!   `MCP-Protocol-Version`, the `Mcp-Method` / `Mcp-Name` / `Mcp-Param-*` values derived from
//!   the params actually sent, the session id this client holds, and the upstream credential's
//!   headers. Nothing of the caller's request headers is ever copied.
//! - 2025-era sessions are per caller partition ([`crate::credentials::CallerContext::partition`])
//!   and declared capabilities, never shared between partitions; a request's `_meta` log level
//!   is set on its session with `logging/setLevel`; the gateway's own listings and change
//!   stream use the partition `""`.
//! - Health ([`UpstreamClient::health`]): unavailability, timeouts, 5xx statuses and protocol
//!   errors count as failures; from the second consecutive one the upstream is in backoff
//!   (1 s, doubling to 60 s) and calls are refused at once ([`UpstreamError::Unhealthy`]).
//! - Server-to-client requests on a call's event stream go to the call's [`asks::Asks`] channel
//!   ([`UpstreamRequest::asks`]; the gateway decides, relays or answers); on the change stream,
//!   or without a channel, they are answered -32601 "not supported through this gateway".
//!   `ping` is answered.
//!
//! Limitations, by design of this version:
//! - Of the notifications on a request's event stream, only `notifications/progress` and
//!   `notifications/message` are relayed to the caller.
//! - Cancelling a request ([`UpstreamRequest::cancel`]) closes its HTTP exchange, which is
//!   cancellation on the 2026-07-28 wire; a 2025-era upstream is not sent
//!   `notifications/cancelled`.
//! - `Mcp-Param-*` headers are derived from the `x-mcp-header` declarations of the upstream's
//!   last tools listing ([`UpstreamClient::list`] with [`ListKind::Tools`]); a tool whose
//!   declarations are invalid gets none.

pub mod asks;
pub(crate) use asks::Relays;
mod bounds;
mod health;
mod http;
pub mod launch;
mod legacy;
mod messages;
pub mod packages;
pub(crate) mod settings;
mod sse;
pub mod stdio;
mod subscriptions;
#[cfg(test)]
mod tests;
mod types;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use palisade_wire::{PROTOCOL_VERSION, meta_keys};
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use bounds::{
    CHANGE_STREAM_BURST, CHANGE_STREAM_MAX_BYTES, CHANGE_STREAM_PER_SECOND, DropReport, MAX_CONCURRENT_REFUSALS,
    MAX_STDERR_LINE,
};
pub use health::HealthReport;

use crate::credentials::{CallerContext, CredentialError, UpstreamCredential};
use health::Health;
use http::{Body, Incoming, Outgoing, Refusal, Transport};
use legacy::{GATEWAY_PARTITION, Session, Sessions};
use messages::{
    MAX_SAFE_INTEGER, check_complete, discovered, header_declarations, instructions, legacy_params, log_level,
    method_headers, modern_params,
};
pub use settings::{InFlightCap, ProtocolChoice, UpstreamLimits};
pub use subscriptions::Subscribing;
pub use types::{
    Change, Era, LIST_CHANGED, ListCache, ListKind, RELAYED_METHODS, UpstreamError, UpstreamInfo, UpstreamReply,
    UpstreamRequest,
};

/// An MCP client toward one upstream, over Streamable HTTP or to a local stdio server
/// ([`stdio`]). Cheap to clone: clones share the connection pool (or processes), sessions and
/// health.
#[derive(Clone)]
pub struct UpstreamClient {
    link: Link,
}

/// How the upstream is reached.
#[derive(Clone)]
enum Link {
    Http(Arc<Inner>),
    Stdio(Arc<stdio::StdioLink>),
}

/// What every link has, whatever reaches the upstream.
struct Common<'a> {
    id: &'a str,
    url: &'a url::Url,
    limits: &'a UpstreamLimits,
    health: &'a Health,
    info: &'a Mutex<Option<Arc<UpstreamInfo>>>,
}

impl Link {
    /// The one place the variants are told apart for what they share.
    fn common(&self) -> Common<'_> {
        match self {
            Self::Http(inner) => Common {
                id: &inner.id,
                url: &inner.url,
                limits: &inner.limits,
                health: &inner.health,
                info: &inner.info,
            },
            Self::Stdio(link) => {
                Common { id: &link.id, url: &link.url, limits: &link.limits, health: &link.health, info: &link.info }
            }
        }
    }
}

impl std::fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamClient")
            .field("id", &self.id())
            .field("url", &self.url().as_str())
            .finish_non_exhaustive()
    }
}

/// One `x-mcp-header` declaration: the header and the argument path it mirrors.
#[derive(Debug, Clone)]
struct HeaderParam {
    header: HeaderName,
    path: Vec<String>,
}

/// The state one client and its clones share.
pub(crate) struct Inner {
    id: String,
    url: url::Url,
    protocol: ProtocolChoice,
    limits: UpstreamLimits,
    credential: Arc<UpstreamCredential>,
    transport: Transport,
    next_id: AtomicI64,
    info: Mutex<Option<Arc<UpstreamInfo>>>,
    health: Health,
    sessions: Sessions,
    tool_headers: Mutex<HashMap<String, Vec<HeaderParam>>>,
    /// What the gateway's own session declares ([`asks::own_capabilities`]).
    own_capabilities: Mutex<Value>,
}

/// Where one exchange goes: for whom, in which session, at which version.
#[derive(Clone, Copy)]
pub(crate) struct Target<'a> {
    caller: CallerContext<'a>,
    session: Option<&'a Session>,
    version: Option<&'a str>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl UpstreamClient {
    /// A client for the upstream `id` at `url` (http or https, no credentials in the URL).
    /// Connects to nothing yet.
    pub fn new(
        id: &str,
        url: url::Url,
        protocol: ProtocolChoice,
        limits: UpstreamLimits,
        credential: Arc<UpstreamCredential>,
    ) -> Result<Self, UpstreamError> {
        let id_ok =
            !id.is_empty() && id.len() <= 63 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !id_ok {
            return Err(UpstreamError::Unavailable("the upstream id is not a DNS-label-style name".into()));
        }
        let url_ok = matches!(url.scheme(), "http" | "https")
            && url.host().is_some()
            && url.username().is_empty()
            && url.password().is_none();
        if !url_ok {
            return Err(UpstreamError::Unavailable(
                "the upstream URL must be http(s) with a host and no credentials".into(),
            ));
        }
        let limits_ok = !limits.connect_timeout.is_zero()
            && !limits.request_timeout.is_zero()
            && limits.max_response_bytes > 0
            && limits.max_list_items > 0
            && limits.max_list_pages > 0;
        if !limits_ok {
            return Err(UpstreamError::Unavailable("the upstream limits must all be positive".into()));
        }
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(limits.connect_timeout)
            .pool_max_idle_per_host(bounds::MAX_IDLE_CONNECTIONS)
            .build()
            .map_err(|_| UpstreamError::Unavailable("the HTTP client could not be built".into()))?;
        let health = Health::default();
        let transport = Transport {
            upstream: id.to_owned(),
            http,
            url: url.clone(),
            max_response_bytes: limits.max_response_bytes,
            refusals: Arc::new(bounds::RefusalLimit::new(bounds::MAX_CONCURRENT_REFUSALS)),
            drops: health.drops.clone(),
        };
        Ok(Self {
            link: Link::Http(Arc::new(Inner {
                id: id.to_owned(),
                url,
                protocol,
                limits,
                credential,
                transport,
                next_id: AtomicI64::new(1),
                info: Mutex::new(None),
                health,
                sessions: Sessions::default(),
                tool_headers: Mutex::new(HashMap::new()),
                own_capabilities: Mutex::new(json!({})),
            })),
        })
    }

    /// A client for the stdio upstream `settings` (its `stdio` set): starts nothing until a
    /// launch is approved ([`Self::set_launch_approved`]) and a request needs a process.
    /// `protected`: paths no process may see.
    pub fn stdio(
        settings: &settings::UpstreamSettings,
        identities: stdio::SandboxIdentities,
        protected: Vec<std::path::PathBuf>,
    ) -> Result<Self, UpstreamError> {
        Ok(Self { link: Link::Stdio(Arc::new(stdio::StdioLink::new(settings, identities, protected)?)) })
    }

    /// HTTP: what the upstream may ask during calls, declared on the gateway's own session
    /// ([`asks::own_capabilities`]; default none). stdio: read from its settings.
    pub fn relay_client_requests(&self, requests: &settings::ClientRequests) {
        if let Link::Http(inner) = &self.link {
            *lock(&inner.own_capabilities) = asks::own_capabilities(requests);
        }
    }

    /// What the gateway's own session or process declares.
    fn own_capabilities(&self) -> Value {
        match &self.link {
            Link::Http(inner) => lock(&inner.own_capabilities).clone(),
            Link::Stdio(link) => link.own_capabilities.clone(),
        }
    }

    /// stdio: the launch digest a reviewer approved (`None`: none; every process is stopped and
    /// none starts). A different digest stops the running processes. HTTP: nothing.
    pub async fn set_launch_approved(&self, digest: Option<String>) {
        if let Link::Stdio(link) = &self.link {
            link.set_approved(digest).await;
        }
    }

    /// stdio: resolves when a process start was refused because the launch changed since its
    /// approval (the gateway then re-lists at once). HTTP: never.
    pub async fn launch_changed(&self) {
        match &self.link {
            Link::Http(_) => std::future::pending().await,
            Link::Stdio(link) => link.launch_changed.notified().await,
        }
    }

    /// stdio: how many processes run now (`None` for HTTP).
    pub fn processes(&self) -> Option<usize> {
        match &self.link {
            Link::Http(_) => None,
            Link::Stdio(link) => Some(link.running()),
        }
    }

    /// stdio: stops every process (at shutdown). HTTP: nothing.
    pub async fn shutdown(&self) {
        if let Link::Stdio(link) = &self.link {
            link.stop_all().await;
        }
    }

    /// The upstream's id.
    pub fn id(&self) -> &str {
        self.link.common().id
    }

    /// The upstream's URL (`stdio:<id>` for a stdio upstream).
    pub fn url(&self) -> &url::Url {
        self.link.common().url
    }

    fn limits(&self) -> &UpstreamLimits {
        self.link.common().limits
    }

    fn health_state(&self) -> &Health {
        self.link.common().health
    }

    /// The connect result, connecting first when there is none.
    async fn ensure_info(&self) -> Result<Arc<UpstreamInfo>, UpstreamError> {
        match self.info() {
            Some(info) => Ok(info),
            None => self.connect().await.map(Arc::new),
        }
    }

    /// One request in the era of `info`, over the link.
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        info: &UpstreamInfo,
        method: &str,
        params: Map<String, Value>,
        caller: CallerContext<'_>,
        capabilities: Option<&Value>,
        relays: Relays<'_>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Body, UpstreamError> {
        match &self.link {
            Link::Http(inner) => inner.call(info, method, params, caller, capabilities, relays, cancel).await,
            Link::Stdio(link) => link.call(info, method, params, caller.partition, capabilities, relays, cancel).await,
        }
    }

    /// Learns the upstream's era and capabilities. Auto: POST `server/discover`; a JSON-RPC
    /// error, a 400 / 404 / 405 / 406 / 415 or a non-MCP answer → the 2025 handshake
    /// (2025-11-25, then 2025-06-18). Legacy: the handshake only. Modern: discover only.
    pub async fn connect(&self) -> Result<UpstreamInfo, UpstreamError> {
        let inner = match &self.link {
            Link::Http(inner) => inner,
            Link::Stdio(link) => return link.connect().await,
        };
        let info = match inner.protocol {
            ProtocolChoice::Modern => inner.discover().await?,
            ProtocolChoice::Legacy => inner.legacy_connect().await?,
            ProtocolChoice::Auto => match inner.discover().await {
                Ok(info) => info,
                Err(UpstreamError::Protocol(_) | UpstreamError::Status(400 | 404 | 405 | 406 | 415)) => {
                    inner.legacy_connect().await?
                }
                Err(error) => return Err(error),
            },
        };
        *lock(&inner.info) = Some(Arc::new(info.clone()));
        Ok(info)
    }

    /// What the last successful [`UpstreamClient::connect`] learned (shared by every call).
    pub fn info(&self) -> Option<Arc<UpstreamInfo>> {
        lock(self.link.common().info).clone()
    }

    /// Every item of a list, following the upstream's `nextCursor` (at most
    /// [`UpstreamLimits::max_list_pages`] pages and [`UpstreamLimits::max_list_items`] items:
    /// more is [`UpstreamError::TooLarge`], never a truncation; a repeated cursor is a protocol
    /// error), with what the upstream said of its caching (the most restrictive of its pages).
    /// Items are returned exactly as sent; an item that is not an object is a protocol error.
    /// Connects first when not yet connected.
    pub async fn list(&self, kind: ListKind) -> Result<(Vec<Value>, ListCache), UpstreamError> {
        self.check_health()?;
        let info = self.ensure_info().await?;
        let limits = self.limits();
        let caller = CallerContext { partition: GATEWAY_PARTITION, subject_token: None, user: None };
        let own = self.own_capabilities();
        let mut items = Vec::new();
        let mut cache: Option<ListCache> = None;
        let mut cursor: Option<String> = None;
        let mut seen = HashSet::new();
        for _ in 0..limits.max_list_pages {
            let mut params = Map::new();
            if let Some(cursor) = &cursor {
                params.insert("cursor".into(), json!(cursor));
            }
            let method = kind.method();
            let result = match self.call(&info, method, params, caller, Some(&own), Relays::NONE, None).await? {
                Body::Result(result) => result,
                Body::Error { code, .. } => {
                    return Err(UpstreamError::Protocol(format!("refused {method} (code {code})")));
                }
            };
            check_complete(&result)?;
            let page_cache = ListCache::of_page(&info.era, &result);
            cache = Some(cache.map_or(page_cache, |cache| cache.and(page_cache)));
            let Some(Value::Array(page)) = result.get(kind.field()) else {
                return Err(UpstreamError::Protocol(format!("answered {method} without a {} array", kind.field())));
            };
            for item in page {
                if !item.is_object() {
                    return Err(UpstreamError::Protocol(format!(
                        "listed a {} item that is not an object",
                        kind.field()
                    )));
                }
                if items.len() >= limits.max_list_items {
                    return Err(UpstreamError::TooLarge);
                }
                items.push(item.clone());
            }
            match result.get("nextCursor") {
                None | Some(Value::Null) => {
                    if kind == ListKind::Tools
                        && let Link::Http(inner) = &self.link
                    {
                        inner.remember_tool_headers(&items);
                    }
                    return Ok((items, cache.unwrap_or_default()));
                }
                Some(Value::String(next)) => {
                    if !seen.insert(next.clone()) {
                        return Err(UpstreamError::Protocol("repeated a list cursor".into()));
                    }
                    cursor = Some(next.clone());
                }
                Some(_) => return Err(UpstreamError::Protocol("sent a nextCursor that is not a string".into())),
            }
        }
        Err(UpstreamError::TooLarge)
    }

    /// `resources/read` of `uri` (in the upstream's space) as the gateway itself, as its
    /// listings are made (no caller): how an MCP App's UI is read to be pinned with its tool.
    pub async fn read_as_gateway(&self, uri: &str) -> Result<Map<String, Value>, UpstreamError> {
        self.check_health()?;
        let info = self.ensure_info().await?;
        let caller = CallerContext { partition: GATEWAY_PARTITION, subject_token: None, user: None };
        let params = Map::from_iter([("uri".to_owned(), json!(uri))]);
        match self.call(&info, "resources/read", params, caller, None, Relays::NONE, None).await? {
            Body::Result(result) => check_complete(&result).map(|()| result),
            Body::Error { code, .. } => Err(UpstreamError::Protocol(format!("refused resources/read (code {code})"))),
        }
    }

    /// One request for a caller: `request.params` as given, plus the protocol `_meta` the era
    /// needs (2026-07-28: protocol version, client info, the caller's capabilities; other
    /// `_meta` keys kept), with `Mcp-Method` / `Mcp-Name` / `Mcp-Param-*` derived from these
    /// params. 2025 era: in the caller partition's own session (opened on first use; a 404
    /// re-opens it once and retries). Connects first when not yet connected.
    pub async fn request(&self, request: UpstreamRequest<'_>) -> Result<UpstreamReply, UpstreamError> {
        self.check_health()?;
        if !RELAYED_METHODS.contains(&request.method) {
            return Err(UpstreamError::Protocol("this method is not relayed to upstreams".into()));
        }
        // The cap on requests in flight (`max_in_flight`): held until the answer is read.
        let _in_flight = self.link.common().limits.in_flight.try_start().ok_or(UpstreamError::Busy)?;
        let info = self.ensure_info().await?;
        let body = self
            .call(
                &info,
                request.method,
                request.params,
                request.caller,
                request.client_capabilities.as_ref(),
                Relays { notifications: request.notifications.as_ref(), asks: request.asks.as_ref() },
                Some(&request.cancel),
            )
            .await?;
        let result = match body {
            Body::Error { code, message, required_capabilities } => {
                return Ok(UpstreamReply::Error { code, message, required_capabilities });
            }
            Body::Result(result) => result,
        };
        match result.get("resultType") {
            None => Ok(UpstreamReply::Result(result)),
            Some(Value::String(kind)) if kind == "complete" => Ok(UpstreamReply::Result(result)),
            // The gateway never asks an upstream for a task (the caller's tasks extension is not
            // passed on: a task through the gateway is the gateway's own): an upstream task id
            // must not reach a caller.
            Some(Value::String(kind)) if kind == "task" => {
                Err(UpstreamError::Protocol("answered with a task the gateway did not ask for".into()))
            }
            Some(Value::String(kind)) if kind == "input_required" => {
                let input_requests = match result.get("inputRequests") {
                    None => Map::new(),
                    Some(Value::Object(requests)) => requests.clone(),
                    Some(_) => return Err(UpstreamError::Protocol("sent inputRequests that are not an object".into())),
                };
                let request_state = result.get("requestState").cloned();
                if input_requests.is_empty() && request_state.is_none() {
                    return Err(UpstreamError::Protocol("asked for input without requests or state".into()));
                }
                Ok(UpstreamReply::InputRequired { input_requests, request_state })
            }
            Some(_) => Err(UpstreamError::Protocol("answered with an unknown resultType".into())),
        }
    }

    /// `Err(UpstreamError::Unhealthy)` at once while the upstream is in backoff after
    /// consecutive failures (1 s doubling to 60 s, lifted by a success), so callers do not wait
    /// for every timeout.
    pub fn check_health(&self) -> Result<(), UpstreamError> {
        if self.health_state().in_backoff() { Err(UpstreamError::Unhealthy) } else { Ok(()) }
    }

    /// The upstream's health, for the operator.
    pub fn health(&self) -> HealthReport {
        self.health_state().report()
    }

    /// The upstream's change notifications ([`Change`]): the list changes ([`LIST_CHANGED`])
    /// and the updates of the subscribed resources. 2026-07-28: a gateway-owned
    /// `subscriptions/listen` for the list changes the upstream's capabilities advertise and, when
    /// it advertises `resources.subscribe`, the `resources` (upstream URIs) given (nothing to
    /// ask for: a stream that never yields); 2025 era: the GET stream of the gateway's own
    /// session (an upstream without one, 405: a stream that never yields), whose subscriptions
    /// are made apart ([`UpstreamClient::resource_subscription`]). The stream ends (`None`) when
    /// the upstream's stream ends or breaks; the caller re-opens with backoff.
    pub async fn changes(&self, resources: &BTreeSet<String>) -> Result<BoxStream<'static, Change>, UpstreamError> {
        self.check_health()?;
        let info = self.ensure_info().await?;
        let inner = match &self.link {
            Link::Http(inner) => inner,
            Link::Stdio(link) => return link.changes(&info, resources).await,
        };
        let caller = CallerContext { partition: GATEWAY_PARTITION, subject_token: None, user: None };
        let stream: BoxStream<'static, Change> = match &info.era {
            Era::Modern => {
                let filter = subscriptions::listen_filter(&info, resources);
                if filter.is_empty() {
                    return Ok(futures::stream::pending().boxed());
                }
                let mut params = Map::new();
                params.insert("notifications".into(), Value::Object(filter));
                let params = modern_params(params, None)?;
                let target = Target { caller, session: None, version: Some(PROTOCOL_VERSION) };
                let out = inner.outgoing(target, method_headers("subscriptions/listen", &params)).await?;
                let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
                let opened =
                    inner.with_deadline(inner.transport.open_post_stream(id, "subscriptions/listen", params, &out));
                let response = inner.recorded(opened.await)?;
                spawn_reader(inner.clone(), response, out, Some(id))
            }
            Era::Legacy(version) => {
                let own = lock(&inner.own_capabilities).clone();
                let session = inner.session(version, caller, Some(&own)).await?;
                let opened = match inner.open_legacy_stream(caller, &session).await {
                    Err(UpstreamError::Status(404)) => {
                        let session = inner.reopen(&session, caller, Some(&own)).await?;
                        inner.open_legacy_stream(caller, &session).await
                    }
                    other => other,
                };
                match opened {
                    Ok((response, out)) => spawn_reader(inner.clone(), response, out, None),
                    // The upstream offers no server stream: it will never say a list changed.
                    Err(UpstreamError::Status(405)) => futures::stream::pending().boxed(),
                    Err(error) => return Err(error),
                }
            }
        };
        Ok(stream)
    }
}

/// Reads a change stream in the background; the returned stream yields the changes it
/// carries ([`Change::of`]). `subscription`: the listen request's id every modern notification
/// must carry (and whose response ends the stream). The stream is closed (and the gateway
/// re-opens it with backoff) when it passes [`bounds::CHANGE_STREAM_MAX_BYTES`], carries
/// messages faster than [`bounds::CHANGE_STREAM_PER_SECOND`] a second after a burst of
/// [`bounds::CHANGE_STREAM_BURST`], or sends an event over `max_response_bytes`.
fn spawn_reader(
    inner: Arc<Inner>,
    response: reqwest::Response,
    out: Outgoing,
    subscription: Option<i64>,
) -> BoxStream<'static, Change> {
    let (tx, mut rx) = mpsc::channel::<Change>(16);
    tokio::spawn(async move {
        let mut parser = sse::Parser::new(inner.limits.max_response_bytes);
        let mut rate =
            bounds::RateLimit::new(bounds::CHANGE_STREAM_BURST, bounds::CHANGE_STREAM_PER_SECOND, Instant::now());
        let mut total = 0usize;
        let mut bytes = response.bytes_stream();
        let cut = |why: &str| {
            inner.health.drops.change_stream_cut();
            tracing::warn!(upstream = %inner.id, reason = why, "upstream change stream closed");
        };
        loop {
            let chunk = tokio::select! {
                () = tx.closed() => return,
                chunk = bytes.next() => chunk,
            };
            let Some(Ok(chunk)) = chunk else { return };
            total = total.saturating_add(chunk.len());
            if total > bounds::CHANGE_STREAM_MAX_BYTES {
                return cut("it passed its byte cap");
            }
            if parser.push(&chunk).is_err() {
                inner.health.drops.oversized_message();
                return cut("it sent an event over the size limit");
            }
            while let Some(event) = parser.next_event() {
                if !event.is_message() || event.data.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                if !rate.allow(Instant::now()) {
                    return cut("it sent messages faster than its rate cap");
                }
                let Ok(value) = palisade_wire::strict::from_slice(&event.data) else { return };
                match http::classify(value) {
                    Ok(Incoming::Notification { method, frame }) => {
                        let ours = subscription.is_none_or(|id| {
                            frame.pointer("/params/_meta").and_then(|meta| meta.get(meta_keys::SUBSCRIPTION_ID))
                                == Some(&json!(id))
                        });
                        let change = if ours { Change::of(&method, &frame) } else { None };
                        if let Some(change) = change
                            && tx.send(change).await.is_err()
                        {
                            return;
                        }
                    }
                    // Outside any call: answered to no caller.
                    Ok(Incoming::Request { id, method, .. }) => {
                        inner.transport.answer_server_request(id, &method, None, &out, None);
                    }
                    Ok(Incoming::Response(value)) => {
                        if subscription.is_some_and(|id| value.get("id") == Some(&json!(id))) {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        }
    });
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

impl Inner {
    /// `server/discover`.
    async fn discover(self: &Arc<Self>) -> Result<UpstreamInfo, UpstreamError> {
        let caller = CallerContext { partition: GATEWAY_PARTITION, subject_token: None, user: None };
        let params = modern_params(Map::new(), None)?;
        let target = Target { caller, session: None, version: Some(PROTOCOL_VERSION) };
        let headers = method_headers("server/discover", &params);
        let answer = self.exchange("server/discover", params, target, &headers, Relays::NONE, None).await?;
        let result = match answer.body {
            Body::Result(result) => result,
            Body::Error { code, .. } => {
                return Err(UpstreamError::Protocol(format!("refused server/discover (code {code})")));
            }
        };
        let info = discovered(&result)?;
        self.set_era(&Era::Modern);
        Ok(info)
    }

    /// The 2025 handshake on the gateway's own session.
    async fn legacy_connect(self: &Arc<Self>) -> Result<UpstreamInfo, UpstreamError> {
        let caller = CallerContext { partition: GATEWAY_PARTITION, subject_token: None, user: None };
        let own = lock(&self.own_capabilities).clone();
        let (session, result) = self.handshake(palisade_wire::LEGACY_VERSIONS, caller, Some(&own)).await?;
        let era = Era::Legacy(session.version.clone());
        self.set_era(&era);
        self.set_gateway_session(session).await;
        let capabilities = result.get("capabilities").cloned().unwrap_or_else(|| json!({}));
        let server_info = result.get("serverInfo").cloned().unwrap_or(Value::Null);
        let instructions = instructions(&result)?;
        Ok(UpstreamInfo { era, capabilities, server_info, instructions })
    }

    /// Forgets every 2025-era session when the era (or its version) changed.
    fn set_era(&self, era: &Era) {
        let previous = lock(&self.info).as_ref().map(|info| info.era.clone());
        if previous.as_ref().is_some_and(|previous| previous != era) {
            self.sessions.clear();
        }
    }

    /// The upstream credential's headers for `target`, with the rest of what is sent.
    async fn outgoing(
        &self,
        target: Target<'_>,
        mcp_headers: Vec<(HeaderName, HeaderValue)>,
    ) -> Result<Outgoing, UpstreamError> {
        let credential = self.credential.apply(target.caller).await.map_err(UpstreamError::Credential)?;
        Ok(Outgoing {
            protocol_version: target.version.map(str::to_owned),
            session: target.session.and_then(|session| session.id.clone()),
            mcp_headers,
            credential,
        })
    }

    /// Runs `future` under the request timeout.
    async fn with_deadline<T>(
        &self,
        future: impl Future<Output = Result<T, UpstreamError>>,
    ) -> Result<T, UpstreamError> {
        tokio::time::timeout(self.limits.request_timeout, future).await.unwrap_or(Err(UpstreamError::Timeout))
    }

    /// Records an outcome in the health state, and passes it on.
    fn recorded<T>(&self, outcome: Result<T, UpstreamError>) -> Result<T, UpstreamError> {
        match &outcome {
            Ok(_) => self.health.success(),
            Err(error) if error.is_upstream_failure() => self.health.failure(error.to_string()),
            Err(_) => {}
        }
        outcome
    }

    /// One request exchange: credential applied, deadline and cancellation honoured, one retry
    /// after an `insufficient_scope` refusal when the credential could step up, health recorded.
    async fn exchange(
        &self,
        method: &str,
        params: Map<String, Value>,
        target: Target<'_>,
        mcp_headers: &[(HeaderName, HeaderValue)],
        relays: Relays<'_>,
        cancel: Option<&CancellationToken>,
    ) -> Result<http::Answer, UpstreamError> {
        let run = async {
            let mut stepped_up = false;
            loop {
                let out = self.outgoing(target, mcp_headers.to_vec()).await?;
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                match self.transport.request(id, method, params.clone(), &out, relays.notifications, relays.asks).await
                {
                    Ok(answer) => return Ok(answer),
                    Err(Refusal::Failed(error)) => return Err(error),
                    Err(Refusal::InsufficientScope(scopes)) if self.credential.is_per_user() => {
                        // A person's grant is widened only by the person, on the connect page.
                        return Err(UpstreamError::Credential(CredentialError::UserAuthorizationRequired {
                            scopes: Some(scopes),
                        }));
                    }
                    Err(Refusal::InsufficientScope(scopes)) => {
                        if !stepped_up && self.credential.step_up(&scopes).await {
                            stepped_up = true;
                            continue;
                        }
                        return Err(UpstreamError::InsufficientScope(scopes));
                    }
                    Err(Refusal::Unauthorized(hint))
                        if self.credential.is_per_user() && target.caller.user.is_some() =>
                    {
                        self.credential.rejected(target.caller, hint.as_deref()).await;
                        return Err(UpstreamError::Credential(CredentialError::UserAuthorizationRequired {
                            scopes: None,
                        }));
                    }
                    Err(Refusal::Unauthorized(_)) => return Err(UpstreamError::Status(401)),
                }
            }
        };
        let outcome = match cancel {
            Some(token) => tokio::select! {
                biased;
                () = token.cancelled() => Err(UpstreamError::Cancelled),
                outcome = self.with_deadline(run) => outcome,
            },
            None => self.with_deadline(run).await,
        };
        self.recorded(outcome)
    }

    /// One notification, under the deadline, health recorded.
    async fn notify(
        &self,
        method: &str,
        target: Target<'_>,
        mcp_headers: Vec<(HeaderName, HeaderValue)>,
    ) -> Result<(), UpstreamError> {
        let run = async {
            let out = self.outgoing(target, mcp_headers).await?;
            self.transport.notify(method, Map::new(), &out).await
        };
        let outcome = self.with_deadline(run).await;
        self.recorded(outcome)
    }

    /// One request in the era of `info`: 2026-07-28 with its `_meta`; 2025 in the caller
    /// partition's session, re-opened once on a 404.
    #[allow(clippy::too_many_arguments)]
    async fn call(
        self: &Arc<Self>,
        info: &UpstreamInfo,
        method: &str,
        params: Map<String, Value>,
        caller: CallerContext<'_>,
        capabilities: Option<&Value>,
        relays: Relays<'_>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Body, UpstreamError> {
        match &info.era {
            Era::Modern => {
                let params = modern_params(params, capabilities)?;
                let headers = self.request_headers(method, &params);
                let target = Target { caller, session: None, version: Some(PROTOCOL_VERSION) };
                Ok(self.exchange(method, params, target, &headers, relays, cancel).await?.body)
            }
            Era::Legacy(version) => {
                // The 2026-07-28 per-request log level is the 2025 session's own.
                let level =
                    log_level(&params).filter(|_| info.capabilities.get("logging").is_some_and(Value::is_object));
                let params = legacy_params(params)?;
                let headers = self.request_headers(method, &params);
                let session = self.session(version, caller, capabilities).await?;
                if let Some(level) = &level {
                    self.set_level(&session, caller, capabilities, level).await?;
                }
                let target = Target { caller, session: Some(&session), version: Some(&session.version) };
                match self.exchange(method, params.clone(), target, &headers, relays, cancel).await {
                    Err(UpstreamError::Status(404)) if session.id.is_some() => {
                        let session = self.reopen(&session, caller, capabilities).await?;
                        if let Some(level) = &level {
                            self.set_level(&session, caller, capabilities, level).await?;
                        }
                        let target = Target { caller, session: Some(&session), version: Some(&session.version) };
                        Ok(self.exchange(method, params, target, &headers, relays, cancel).await?.body)
                    }
                    outcome => Ok(outcome?.body),
                }
            }
        }
    }

    /// Opens the GET stream of a 2025-era session, under the deadline (for its headers).
    async fn open_legacy_stream(
        &self,
        caller: CallerContext<'_>,
        session: &Session,
    ) -> Result<(reqwest::Response, Outgoing), UpstreamError> {
        let target = Target { caller, session: Some(session), version: Some(&session.version) };
        let run = async {
            let out = self.outgoing(target, Vec::new()).await?;
            let response = self.transport.open_get_stream(&out).await?;
            Ok((response, out))
        };
        let outcome = self.with_deadline(run).await;
        self.recorded(outcome)
    }

    /// `Mcp-Method`, `Mcp-Name` and, for `tools/call`, the `Mcp-Param-*` of the tool's
    /// declarations, all from `params`.
    fn request_headers(&self, method: &str, params: &Map<String, Value>) -> Vec<(HeaderName, HeaderValue)> {
        let mut headers = method_headers(method, params);
        if method != "tools/call" {
            return headers;
        }
        let Some(tool) = params.get("name").and_then(Value::as_str) else { return headers };
        let declarations = lock(&self.tool_headers).get(tool).cloned().unwrap_or_default();
        let arguments = params.get("arguments");
        for declaration in declarations {
            let mut value = arguments;
            for key in &declaration.path {
                value = value.and_then(|v| v.get(key));
            }
            let text = match value {
                Some(Value::String(s)) => palisade_wire::header::encode_value(s),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => match n.as_i64() {
                    Some(i) if i.unsigned_abs() <= MAX_SAFE_INTEGER => i.to_string(),
                    _ => continue,
                },
                _ => continue,
            };
            if let Ok(value) = HeaderValue::from_str(&text) {
                headers.push((declaration.header, value));
            }
        }
        headers
    }

    /// Keeps the `x-mcp-header` declarations of a tools listing.
    fn remember_tool_headers(&self, tools: &[Value]) {
        let mut map = HashMap::new();
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else { continue };
            let Some(schema) = tool.get("inputSchema") else { continue };
            let mut declarations = Vec::new();
            if header_declarations(schema, &mut Vec::new(), 0, &mut declarations).is_ok() {
                map.insert(name.to_owned(), declarations);
            }
        }
        *lock(&self.tool_headers) = map;
    }
}
