//! The HTTP client toward the target: one [`Probe`] is one POST (or GET) built right by default
//! (2026-07-28 `_meta`, `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`, JSON `Content-Type`,
//! both `Accept` types) so a check breaks exactly one thing; no redirects, timeouts, bounded
//! concurrency and a minimum interval between requests; JSON and SSE answers parsed; every
//! exchange written down as a redacted transcript.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use serde_json::{Map, Value, json};
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

pub use crate::exchange::Exchange;
use crate::identity::{Redactor, Token};

/// The protocol revision probes speak.
pub const PROTOCOL_VERSION: &str = palisade_wire::PROTOCOL_VERSION;

/// The most of an answer's body read (more is cut off and the answer marked truncated).
const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// The most of a body shown in a transcript.
const TRANSCRIPT_BODY: usize = 600;

/// How the target is reached.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// The MCP endpoint.
    pub url: url::Url,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// Least time between the starts of two requests.
    pub min_interval: Duration,
    /// The operator's map of what this server's refusals look like (`--refusals`), if given.
    pub refusals: Option<crate::refusals::RefusalMap>,
}

/// What a probe authenticates with.
#[derive(Clone, Debug)]
pub enum Auth {
    /// No `Authorization` header.
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(Token),
    /// An `Authorization` header verbatim (other schemes); redacted like a token.
    Raw(Token),
}

/// One request to send.
#[derive(Clone, Debug)]
pub struct Probe {
    /// The HTTP method (POST unless a check says otherwise).
    pub http_method: reqwest::Method,
    /// The JSON-RPC method.
    pub method: String,
    /// The JSON-RPC id; `None`: a fresh integer when sent.
    pub id: Option<Value>,
    /// The params (with `_meta`).
    pub params: Value,
    /// Authentication.
    pub auth: Auth,
    /// Headers set (replacing a default of the same name).
    pub headers: Vec<(String, String)>,
    /// Default headers left out.
    pub without: Vec<String>,
    /// A body sent verbatim instead of the JSON-RPC request.
    pub body: Option<Vec<u8>>,
    /// Query parameters added to the endpoint's URL (values redacted in transcripts).
    pub query: Vec<(String, String)>,
}

/// The `_meta` every 2026-07-28 request carries.
pub fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": { "name": "palisade-verify", "version": env!("CARGO_PKG_VERSION") }
    })
}

impl Probe {
    /// A well-formed request of `method` with `params` (`_meta` added unless present).
    pub fn request(method: &str, params: Value, auth: Auth) -> Self {
        let mut params: Map<String, Value> = params.as_object().cloned().unwrap_or_default();
        params.entry("_meta").or_insert_with(meta);
        Self {
            http_method: reqwest::Method::POST,
            method: method.to_owned(),
            id: None,
            params: Value::Object(params),
            auth,
            headers: Vec::new(),
            without: Vec::new(),
            body: None,
            query: Vec::new(),
        }
    }

    /// Adds a query parameter to the URL (`send` only; a credential there is redacted).
    pub fn query(mut self, name: &str, value: impl Into<String>) -> Self {
        self.query.push((name.to_owned(), value.into()));
        self
    }

    /// Sets (or replaces) a header.
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// Adds a header without replacing one of the same name (a repeated header).
    pub fn append(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// Uses this JSON-RPC id (any JSON value, for malformed-id cases).
    pub fn id(mut self, id: Value) -> Self {
        self.id = Some(id);
        self
    }

    /// Leaves a default header out.
    pub fn without(mut self, name: &str) -> Self {
        self.without.push(name.to_ascii_lowercase());
        self
    }

    /// Sends `body` verbatim.
    pub fn body(mut self, body: Vec<u8>) -> Self {
        self.body = Some(body);
        self
    }

    /// Changes the HTTP method.
    pub fn http_method(mut self, method: reqwest::Method) -> Self {
        self.http_method = method;
        self
    }

    /// The JSON-RPC request this probe sends (unless a body replaces it).
    pub fn frame(&self) -> Value {
        json!({ "jsonrpc": "2.0", "id": self.id, "method": self.method, "params": self.params })
    }

    /// The `Mcp-Name` the method routes by, from the params.
    fn name(&self) -> Option<&str> {
        let key = match self.method.as_str() {
            "tools/call" | "prompts/get" => "name",
            "resources/read" => "uri",
            "tasks/get" | "tasks/update" | "tasks/cancel" => "taskId",
            _ => return None,
        };
        self.params.get(key).and_then(Value::as_str)
    }

    /// Every header to send, defaults first, then the overrides.
    fn all_headers(&self) -> Vec<(String, String)> {
        let mut headers = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            ("accept".to_owned(), "application/json, text/event-stream".to_owned()),
            ("mcp-protocol-version".to_owned(), PROTOCOL_VERSION.to_owned()),
            ("mcp-method".to_owned(), palisade_wire::header::encode_value(&self.method)),
        ];
        if let Some(name) = self.name() {
            headers.push(("mcp-name".to_owned(), palisade_wire::header::encode_value(name)));
        }
        match &self.auth {
            Auth::None => {}
            Auth::Bearer(token) => headers.push(("authorization".to_owned(), format!("Bearer {}", token.expose()))),
            Auth::Raw(value) => headers.push(("authorization".to_owned(), value.expose().to_owned())),
        }
        headers.retain(|(name, _)| {
            !self.without.contains(name) && !self.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
        });
        headers.extend(self.headers.iter().cloned());
        headers
    }
}

/// The target and the limits every request passes.
pub struct Target {
    http: reqwest::Client,
    config: TargetConfig,
    permits: Semaphore,
    next_start: Mutex<Instant>,
    redactor: Arc<Redactor>,
    ids: AtomicU64,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("url", &self.config.url.as_str()).finish_non_exhaustive()
    }
}

impl Target {
    /// A client for `config`: no redirects, no proxy, the timeout applied to each request.
    pub fn new(config: TargetConfig, redactor: Arc<Redactor>) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .build()?;
        let permits = Semaphore::new(config.concurrency.max(1));
        Ok(Self { http, config, permits, next_start: Mutex::new(Instant::now()), redactor, ids: AtomicU64::new(1) })
    }

    /// The endpoint.
    pub fn url(&self) -> &url::Url {
        &self.config.url
    }

    /// The redactor of this run.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// A fresh integer request id (unique in the run).
    pub fn next_id(&self) -> Value {
        json!(self.ids.fetch_add(1, Ordering::Relaxed))
    }

    /// Sends `probe` (a fresh integer id unless the body is given verbatim) and reads the answer.
    pub async fn send(&self, mut probe: Probe) -> Exchange {
        if probe.id.is_none() {
            probe.id = Some(self.next_id());
        }
        let _permit = self.permits.acquire().await;
        self.pace().await;
        self.exchange(probe).await
    }

    /// Notes on `exchange` a refusal of a shape the operator's refusal map does not list.
    fn mapped(&self, mut exchange: Exchange) -> Exchange {
        if let Some(map) = &self.config.refusals
            && exchange.status.is_some()
            && exchange.is_refusal()
        {
            exchange.unlisted_refusal = map.unlisted(&exchange);
        }
        exchange
    }

    /// Waits for this request's start slot (the minimum interval after the previous one).
    async fn pace(&self) {
        let wait = {
            let mut next = self.next_start.lock().await;
            let now = Instant::now();
            let start = (*next).max(now);
            *next = start + self.config.min_interval;
            start - now
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Like [`send`](Self::send), for a body the server may refuse before reading it (a
    /// declared length over its limit): on a plain `http://` target the request is written on a
    /// raw HTTP/1.1 connection while the answer is read, so an early 413 is seen even when the
    /// server closes the connection under the rest of the body. Other targets use `send`.
    pub async fn send_early_answer(&self, mut probe: Probe) -> Exchange {
        if self.config.url.scheme() != "http" {
            return self.send(probe).await;
        }
        if probe.id.is_none() {
            probe.id = Some(self.next_id());
        }
        let _permit = self.permits.acquire().await;
        self.pace().await;
        let headers = probe.all_headers();
        let body = probe.body.clone().unwrap_or_else(|| probe.frame().to_string().into_bytes());
        let url = &self.config.url;
        let authority = match (url.host_str(), url.port_or_known_default()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            _ => return self.send(probe).await,
        };
        let mut head = format!("{} {} HTTP/1.1\r\n", probe.http_method, &url[url::Position::BeforePath..]);
        if !headers.iter().any(|(name, _)| name == "host") {
            let host = &url[url::Position::BeforeHost..url::Position::AfterPort];
            head.push_str(&format!("host: {host}\r\n"));
        }
        for (name, value) in &headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("content-length: {}\r\nconnection: close\r\n\r\n", body.len()));
        let mut transcript = format!("> {} {url} (raw HTTP/1.1)\n", probe.http_method);
        for (name, value) in &headers {
            transcript.push_str(&format!("> {name}: {}\n", self.shown(name, value)));
        }
        transcript.push_str(&format!("> {}\n", self.excerpt(&body)));
        let mut exchange = Exchange::unanswered(probe.id.clone().unwrap_or(Value::Null));
        match tokio::time::timeout(self.config.timeout, raw_exchange(&authority, head.into_bytes(), body)).await {
            Err(_) => exchange.failure = Some("timed out".into()),
            Ok(Err(error)) => exchange.failure = Some(error.to_string()),
            Ok(Ok(answer)) => match parse_raw_answer(&answer) {
                Some((status, response_headers, body)) => {
                    exchange.status = Some(status);
                    exchange.headers = response_headers;
                    let content_type = exchange.header("content-type").unwrap_or_default().to_ascii_lowercase();
                    exchange.frames = parse_body(&content_type, &body);
                    self.write_answer(&mut transcript, &exchange, &body);
                }
                None => exchange.failure = Some("the answer is not HTTP/1.1".into()),
            },
        }
        self.finish(exchange, transcript)
    }

    /// Appends an answer's status, headers and body excerpt to `transcript`.
    fn write_answer(&self, transcript: &mut String, exchange: &Exchange, body: &[u8]) {
        transcript.push_str(&format!("< HTTP {}\n", exchange.status.unwrap_or_default()));
        for (name, value) in &exchange.headers {
            transcript.push_str(&format!("< {name}: {}\n", self.shown(name, value)));
        }
        transcript.push_str(&format!("< {}\n", self.excerpt(body)));
    }

    /// The exchange with its failure noted, its transcript redacted and its refusal shape
    /// checked against the operator's map.
    fn finish(&self, mut exchange: Exchange, mut transcript: String) -> Exchange {
        if let Some(failure) = &exchange.failure {
            transcript.push_str(&format!("< ({failure})\n"));
        }
        exchange.transcript = self.redactor.redact(&transcript);
        self.mapped(exchange)
    }

    /// A header value as a transcript shows it: redacted *before* it is shortened (a cut
    /// token would no longer match the redactor), and an `Authorization` credential never
    /// shown even when it is no token of the run.
    fn shown(&self, name: &str, value: &str) -> String {
        let value = self.redactor.redact(value);
        if name.eq_ignore_ascii_case("authorization") && !value.contains("[redacted") {
            let scheme = value.split(' ').next().unwrap_or_default();
            return format!("{} [redacted]", cut(scheme, 20));
        }
        if value.len() > 200 { format!("{}… ({} bytes)", cut(&value, 200), value.len()) } else { value }
    }

    /// A body as a transcript shows it: redacted, then shortened.
    fn excerpt(&self, bytes: &[u8]) -> String {
        excerpt(self.redactor.redact(&String::from_utf8_lossy(bytes)).as_bytes())
    }

    /// GETs a JSON document (a metadata document or a JWK Set) at `url` with this run's client,
    /// limits and pacing; the caller decides whether `url` may be fetched. Returns the status,
    /// the raw body and a redacted transcript.
    pub async fn fetch(&self, url: &url::Url) -> (Option<u16>, Vec<u8>, String) {
        let _permit = self.permits.acquire().await;
        self.pace().await;
        let mut transcript = format!("> GET {}\n", self.redactor.redact(url.as_str()));
        let (status, bytes) = match self.http.get(url.clone()).header("accept", "application/json").send().await {
            Err(error) => {
                transcript.push_str(&format!("< ({})\n", describe(&error)));
                (None, Vec::new())
            }
            Ok(response) => {
                let status = response.status().as_u16();
                let (bytes, failure) = read_capped(response).await;
                transcript.push_str(&format!("< HTTP {status}\n< {}\n", self.excerpt(&bytes)));
                if let Some(failure) = failure {
                    transcript.push_str(&format!("< ({failure})\n"));
                }
                (Some(status), bytes)
            }
        };
        (status, bytes, self.redactor.redact(&transcript))
    }

    /// Like [`send`](Self::send), for an answer that may be a long-lived stream
    /// (`subscriptions/listen`, a GET stream): the body is read until `window` has passed since
    /// the request started, `max_frames` JSON-RPC messages have arrived, the body ends or 1 MiB
    /// was read; then the connection is dropped (HTTP's way to end a stream). The concurrency
    /// permit is held until the answer's head arrives, not while the stream is read, so a check
    /// can act while it listens.
    pub async fn send_stream(&self, mut probe: Probe, window: Duration, max_frames: usize) -> Exchange {
        if probe.id.is_none() {
            probe.id = Some(self.next_id());
        }
        let note = format!(" (a stream, read for at most {} ms)", window.as_millis());
        let (request, mut transcript) = self.request(&probe, &note);
        let mut exchange = Exchange::unanswered(probe.id.clone().unwrap_or(Value::Null));
        let deadline = Instant::now() + window;
        let answer = {
            let _permit = self.permits.acquire().await;
            self.pace().await;
            tokio::time::timeout_at(deadline, request.send()).await
        };
        match answer {
            Err(_) => exchange.failure = Some("no answer within the window".into()),
            Ok(Err(error)) => exchange.failure = Some(describe(&error)),
            Ok(Ok(response)) => {
                exchange.status = Some(response.status().as_u16());
                exchange.headers = response
                    .headers()
                    .iter()
                    .map(|(name, value)| {
                        (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned())
                    })
                    .collect();
                if let Some(session) = exchange.header("mcp-session-id").filter(|id| id.len() >= 8) {
                    self.redactor.add(session, "session-issued");
                }
                let content_type = exchange.header("content-type").unwrap_or_default().to_ascii_lowercase();
                let streaming = content_type.starts_with("text/event-stream");
                let mut bytes = Vec::new();
                let mut chunks = response.bytes_stream();
                let mut ended = "the window ended; the stream was dropped";
                loop {
                    match tokio::time::timeout_at(deadline, chunks.next()).await {
                        Err(_) => break,
                        Ok(None) => {
                            ended = "the stream ended";
                            break;
                        }
                        Ok(Some(Err(error))) => {
                            exchange.failure = Some(format!("body broke off: {}", describe(&error)));
                            ended = "the stream broke off";
                            break;
                        }
                        Ok(Some(Ok(chunk))) => {
                            bytes.extend_from_slice(&chunk);
                            if bytes.len() > MAX_ANSWER_BYTES {
                                bytes.truncate(MAX_ANSWER_BYTES);
                                exchange.failure = Some("answer cut off at 1 MiB".into());
                                break;
                            }
                            if streaming && parse_body(&content_type, &bytes).len() >= max_frames {
                                ended = "enough messages were read; the stream was dropped";
                                break;
                            }
                        }
                    }
                }
                exchange.frames = parse_body(&content_type, &bytes);
                self.write_answer(&mut transcript, &exchange, &bytes);
                transcript.push_str(&format!("< ({ended})\n"));
            }
        }
        self.finish(exchange, transcript)
    }

    /// The HTTP request of `probe` and the start of its transcript (`note` after the request
    /// line); a query parameter's value is never shown.
    fn request(&self, probe: &Probe, note: &str) -> (reqwest::RequestBuilder, String) {
        let headers = probe.all_headers();
        let body = probe.body.clone().unwrap_or_else(|| probe.frame().to_string().into_bytes());
        let mut url = self.config.url.clone();
        let mut shown_url = self.config.url.clone();
        for (name, value) in &probe.query {
            url.query_pairs_mut().append_pair(name, value);
            shown_url.query_pairs_mut().append_pair(name, "[redacted]");
        }
        let mut transcript = format!("> {} {}{note}\n", probe.http_method, shown_url);
        for (name, value) in &headers {
            transcript.push_str(&format!("> {name}: {}\n", self.shown(name, value)));
        }
        transcript.push_str(&format!("> {}\n", self.excerpt(&body)));
        let mut request = self.http.request(probe.http_method.clone(), url);
        for (name, value) in &headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if probe.http_method == reqwest::Method::POST {
            request = request.body(body);
        }
        (request, transcript)
    }

    async fn exchange(&self, probe: Probe) -> Exchange {
        let (request, mut transcript) = self.request(&probe, "");
        let mut exchange = Exchange::unanswered(probe.id.clone().unwrap_or(Value::Null));
        match request.send().await {
            Err(error) => {
                exchange.failure = Some(describe(&error));
            }
            Ok(response) => {
                exchange.status = Some(response.status().as_u16());
                exchange.headers = response
                    .headers()
                    .iter()
                    .map(|(name, value)| {
                        (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned())
                    })
                    .collect();
                // A session id the server issues is a credential: redacted from here on,
                // whichever check it came in.
                if let Some(session) = exchange.header("mcp-session-id").filter(|id| id.len() >= 8) {
                    self.redactor.add(session, "session-issued");
                }
                let (bytes, failure) = read_capped(response).await;
                exchange.failure = failure;
                let content_type = exchange.header("content-type").unwrap_or_default().to_ascii_lowercase();
                exchange.frames = parse_body(&content_type, &bytes);
                self.write_answer(&mut transcript, &exchange, &bytes);
            }
        }
        self.finish(exchange, transcript)
    }
}

/// Writes `head` and `body` while reading the answer; returns what was read once the
/// connection ends (a write error after the server answered is expected and ignored).
async fn raw_exchange(authority: &str, head: Vec<u8>, body: Vec<u8>) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let stream = tokio::net::TcpStream::connect(authority).await?;
    let (mut reader, mut writer) = stream.into_split();
    let write = tokio::spawn(async move {
        writer.write_all(&head).await?;
        for chunk in body.chunks(64 * 1024) {
            writer.write_all(chunk).await?;
        }
        writer.flush().await
    });
    let mut answer = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    loop {
        match reader.read(&mut buffer).await {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buffer[..n]);
                if answer.len() > MAX_ANSWER_BYTES || raw_answer_complete(&answer) {
                    break;
                }
            }
            Err(error) if answer.is_empty() => {
                write.abort();
                return Err(error);
            }
            Err(_) => break,
        }
    }
    write.abort();
    Ok(answer)
}

/// Whether `answer` holds a whole response: its head and `content-length` bytes of body.
fn raw_answer_complete(answer: &[u8]) -> bool {
    let Some((_, headers, body)) = parse_raw_answer(answer) else { return false };
    headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())
        .is_some_and(|length| body.len() >= length)
}

type RawAnswer = (u16, Vec<(String, String)>, Vec<u8>);

/// Status, headers (names lower-case) and body of an HTTP/1.1 answer (a chunked body decoded).
fn parse_raw_answer(answer: &[u8]) -> Option<RawAnswer> {
    let end = answer.windows(4).position(|window| window == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&answer[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let mut body = answer[end + 4..].to_vec();
    if headers.iter().any(|(name, value)| name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked")) {
        body = dechunk(&body);
    }
    Some((status, headers, body))
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(line_end) = data.windows(2).position(|window| window == b"\r\n") {
        let size = std::str::from_utf8(&data[..line_end])
            .ok()
            .and_then(|line| usize::from_str_radix(line.split(';').next().unwrap_or_default().trim(), 16).ok());
        let Some(size) = size.filter(|size| *size > 0) else { break };
        let start = line_end + 2;
        let Some(chunk) = data.get(start..start + size) else { break };
        body.extend_from_slice(chunk);
        data = data.get(start + size + 2..).unwrap_or_default();
    }
    body
}

/// The error's chain in one line (reqwest hides the cause behind "error sending request").
fn describe(error: &reqwest::Error) -> String {
    let mut text = if error.is_timeout() { "timed out".to_owned() } else { error.to_string() };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

async fn read_capped(response: reqwest::Response) -> (Vec<u8>, Option<String>) {
    let mut bytes = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => {
                bytes.extend_from_slice(&chunk);
                if bytes.len() > MAX_ANSWER_BYTES {
                    bytes.truncate(MAX_ANSWER_BYTES);
                    return (bytes, Some("answer cut off at 1 MiB".into()));
                }
            }
            Err(error) => return (bytes, Some(format!("body broke off: {}", describe(&error)))),
        }
    }
    (bytes, None)
}

/// The JSON-RPC messages of a body: each SSE event's data, or the one JSON document.
pub fn parse_body(content_type: &str, bytes: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(bytes);
    if content_type.starts_with("text/event-stream") {
        let mut frames = Vec::new();
        let mut data = String::new();
        for line in text.lines().chain(std::iter::once("")) {
            if line.is_empty() {
                if let Ok(frame) = serde_json::from_str::<Value>(&data) {
                    frames.push(frame);
                }
                data.clear();
            } else if let Some(rest) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
            }
        }
        frames
    } else {
        match serde_json::from_str::<Value>(&text) {
            Ok(Value::Array(items)) => items,
            Ok(frame) => vec![frame],
            Err(_) => Vec::new(),
        }
    }
}

fn cut(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.len() > TRANSCRIPT_BODY {
        format!("{}… ({} bytes)", cut(&text, TRANSCRIPT_BODY), bytes.len())
    } else if text.is_empty() {
        "(empty body)".to_owned()
    } else {
        text.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_carry_the_standard_headers_and_overrides_replace_them() {
        let probe = Probe::request("resources/read", json!({ "uri": "shop://a" }), Auth::None);
        let headers = probe.all_headers();
        let get = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("mcp-method"), Some("resources/read"));
        assert_eq!(get("mcp-name"), Some("shop://a"));
        assert_eq!(get("mcp-protocol-version"), Some(PROTOCOL_VERSION));
        assert_eq!(probe.params["_meta"]["io.modelcontextprotocol/protocolVersion"], PROTOCOL_VERSION);
        let broken = probe.header("Mcp-Name", "shop://b").without("accept");
        let headers = broken.all_headers();
        assert_eq!(headers.iter().filter(|(n, _)| n == "mcp-name").count(), 1);
        assert!(headers.iter().any(|(n, v)| n == "mcp-name" && v == "shop://b"));
        assert!(!headers.iter().any(|(n, _)| n == "accept"));
    }

    #[test]
    fn acceptance_is_a_result_for_the_request_id() {
        let exchange = |frames: Vec<Value>| Exchange::answered(json!(7), 200, frames);
        assert!(exchange(vec![json!({ "jsonrpc": "2.0", "id": 7, "result": {} })]).accepted());
        assert!(!exchange(vec![json!({ "jsonrpc": "2.0", "id": 8, "result": {} })]).accepted());
        let refused = exchange(vec![json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32600 } })]);
        assert!(!refused.accepted());
        assert_eq!(refused.error_code(), Some(-32600));
        let sse = parse_body("text/event-stream", b"event: message\ndata: {\"id\":7,\"result\":{}}\n\n");
        assert!(exchange(sse).accepted());
    }
}
