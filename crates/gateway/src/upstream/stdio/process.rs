//! One running stdio server: newline-delimited JSON-RPC on its stdin and stdout (stdout carries
//! MCP messages only), stderr logged under a size cap, answers matched to the ids this side sent,
//! progress routed by a token of this side's own, and a clean stop (stdin closed, then SIGTERM,
//! then SIGKILL). The child is killed when its handle is dropped, and bubblewrap's
//! `--die-with-parent` kills the sandbox when the gateway dies, so no server outlives it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::super::asks::{Asks, answer_frame};
use super::super::bounds::{Drops, MAX_STDERR_LINE, Overflow, read_line_bounded};
use super::super::http::{self, Body, Incoming};
use super::super::{Change, Relays, UpstreamError, lock};

/// Most bytes of one process's stderr that reach the log; the rest is counted, not logged.
const MAX_STDERR_BYTES: usize = 64 * 1024;
/// How long a stopping server has to exit after its stdin closes, and again after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Where a request's notifications go: the caller's sink, and the caller's own progress token
/// (this side sends the server a token of its own, so concurrent callers cannot collide); and,
/// on a per-caller process, where the server's requests during it go.
struct Relay {
    sink: Option<mpsc::Sender<Value>>,
    progress_token: Option<Value>,
    asks: Option<Asks>,
}

/// The state the reader task and the callers share.
struct Shared {
    pending: Mutex<HashMap<i64, oneshot::Sender<Result<Value, UpstreamError>>>>,
    relays: Mutex<HashMap<i64, Relay>>,
    /// Where list-changed notifications go (the gateway's own process only).
    changes: Option<Arc<Mutex<Option<mpsc::Sender<Change>>>>>,
    /// Whether `notifications/message` may be relayed: only when every in-flight request is the
    /// same caller's (a per-caller process).
    relay_messages: bool,
    dead: AtomicBool,
    /// Set by [`Process::stop`]: the end that follows is expected.
    stopping: AtomicBool,
    exited: CancellationToken,
    /// Its last [`STDERR_RING_LINES`] stderr lines (a JSON log record as its level, message and
    /// error; escaped, each cut to [`STDERR_TAIL_CHARS`]), from which the error of a process that
    /// ends unasked takes its cause ([`stderr_cause`]): the operator sees why it ended without
    /// reading the log.
    stderr_tail: Mutex<std::collections::VecDeque<String>>,
    /// Cancelled when its stderr has been read to the end.
    stderr_done: CancellationToken,
    /// When a request last started or was answered. The reader sets it before it removes an
    /// answered request from `pending`, so the idle reaper never sees the process not busy with
    /// the time its last request started.
    last_used: Mutex<Instant>,
}

/// How many of the last stderr lines an unexpected end's error carries.
const STDERR_TAIL_LINES: usize = 6;
/// How many of the last stderr lines are kept to find them in (a Node error is ~15 lines).
const STDERR_RING_LINES: usize = 48;
/// How many characters of each of those lines.
const STDERR_TAIL_CHARS: usize = 300;
/// How long the end of stdout waits for stderr to be read to its end before failing requests.
const STDERR_TAIL_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

impl Shared {
    /// Fails every waiting request and marks the process dead.
    fn die(&self, why: &str) {
        self.dead.store(true, Ordering::SeqCst);
        for (_, waiter) in lock(&self.pending).drain() {
            let _ = waiter.send(Err(UpstreamError::Unavailable(why.to_owned())));
        }
        if let Some(changes) = &self.changes {
            lock(changes).take();
        }
        self.exited.cancel();
    }
}

/// A running stdio server.
pub(crate) struct Process {
    upstream: String,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    child: Mutex<Option<Child>>,
    pid: Option<u32>,
    shared: Arc<Shared>,
    next_id: AtomicI64,
    /// The log level last set with `logging/setLevel` (a 2025-era per-caller process).
    level: tokio::sync::Mutex<Option<String>>,
    /// The uid it runs as, returned to the pool when it is dropped.
    pub(crate) uid: Option<u32>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process").field("upstream", &self.upstream).field("pid", &self.pid).finish_non_exhaustive()
    }
}

/// Options for [`Process::start`].
pub(crate) struct StartOptions {
    pub upstream: String,
    pub max_line_bytes: usize,
    pub changes: Option<Arc<Mutex<Option<mpsc::Sender<Change>>>>>,
    pub relay_messages: bool,
    pub uid: Option<u32>,
    /// The upstream's drop counters.
    pub drops: Arc<Drops>,
    /// The declared environment's values, by name: masked wherever stderr repeats one.
    pub secrets: Vec<(String, String)>,
}

impl Process {
    /// Spawns `command` (stdin, stdout and stderr piped) and starts reading it.
    pub(crate) fn start(
        mut command: tokio::process::Command,
        options: StartOptions,
    ) -> Result<Arc<Self>, UpstreamError> {
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|error| {
            UpstreamError::Unavailable(format!("the stdio server could not be started: {}", error.kind()))
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(UpstreamError::Unavailable("the stdio server's pipes could not be opened".into()));
        };
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            relays: Mutex::new(HashMap::new()),
            changes: options.changes,
            relay_messages: options.relay_messages,
            dead: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            exited: CancellationToken::new(),
            stderr_tail: Mutex::new(std::collections::VecDeque::with_capacity(STDERR_RING_LINES)),
            stderr_done: CancellationToken::new(),
            last_used: Mutex::new(Instant::now()),
        });
        let process = Arc::new(Self {
            upstream: options.upstream.clone(),
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            pid: child.id(),
            child: Mutex::new(Some(child)),
            shared: shared.clone(),
            next_id: AtomicI64::new(1),
            level: tokio::sync::Mutex::new(None),
            uid: options.uid,
        });
        tracing::info!(upstream = %options.upstream, pid = process.pid, uid = options.uid, "stdio server started");
        let stderr_sink =
            StderrSink { upstream: options.upstream.clone(), drops: options.drops.clone(), secrets: options.secrets };
        tokio::spawn(log_stderr(stderr_sink, stderr, shared.clone()));
        let weak = Arc::downgrade(&process);
        let limits = StdoutLimits { max_line_bytes: options.max_line_bytes, drops: options.drops };
        tokio::spawn(read_stdout(weak, shared, stdout, limits, options.upstream));
        Ok(process)
    }

    /// Whether it has exited (or broke the protocol and was given up).
    pub(crate) fn is_dead(&self) -> bool {
        self.shared.dead.load(Ordering::SeqCst)
    }

    /// Whether a request is waiting for its answer (a long call is not idleness).
    pub(crate) fn busy(&self) -> bool {
        !lock(&self.shared.pending).is_empty()
    }

    /// When it was last used.
    pub(crate) fn last_used(&self) -> Instant {
        *lock(&self.shared.last_used)
    }

    /// Cancelled when it exits.
    pub(crate) fn exited(&self) -> CancellationToken {
        self.shared.exited.clone()
    }

    /// Writes one message line.
    async fn write(&self, message: &Value) -> Result<(), UpstreamError> {
        let mut line =
            serde_json::to_vec(message).map_err(|_| UpstreamError::Protocol("unserializable message".into()))?;
        line.push(b'\n');
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(UpstreamError::Unavailable("the stdio server is stopping".into()));
        };
        let written = async {
            pipe.write_all(&line).await?;
            pipe.flush().await
        };
        written.await.map_err(|_| UpstreamError::Unavailable("the stdio server's stdin is closed".into()))
    }

    /// Sends a notification.
    pub(crate) async fn notify(&self, method: &str, params: Map<String, Value>) -> Result<(), UpstreamError> {
        let mut message = json!({"jsonrpc": "2.0", "method": method});
        if !params.is_empty() {
            message["params"] = Value::Object(params);
        }
        self.write(&message).await
    }

    /// Makes `level` the process's log level with `logging/setLevel`, unless it is already
    /// (a 2025-era server, per caller: the caller's per-request level is its session's). A
    /// refusal is not the request's: what is relayed is filtered by the caller's level anyway.
    pub(crate) async fn set_level(&self, level: &str) -> Result<(), UpstreamError> {
        let mut set = self.level.lock().await;
        if set.as_deref() == Some(level) {
            return Ok(());
        }
        let mut params = Map::new();
        params.insert("level".into(), json!(level));
        match self.request("logging/setLevel", params, Relays::NONE, None).await? {
            Body::Result(_) => *set = Some(level.to_owned()),
            Body::Error { code, .. } => {
                tracing::debug!(upstream = %self.upstream, code, "stdio server refused logging/setLevel");
            }
        }
        Ok(())
    }

    /// One request: its answer's body, checked against the id sent. `relays.notifications`
    /// receives the progress (with the caller's own token) and, on a per-caller process, the log
    /// messages the server sends while it runs; on a per-caller process, the server's requests
    /// while it runs go to `relays.asks` ([`route_request`]). Cancelling sends
    /// `notifications/cancelled`. The caller bounds the wait (the request deadline); dropping
    /// the future forgets the id.
    pub(crate) async fn request(
        &self,
        method: &str,
        mut params: Map<String, Value>,
        relays: Relays<'_>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Body, UpstreamError> {
        if self.is_dead() {
            return Err(UpstreamError::Unavailable("the stdio server has exited".into()));
        }
        *lock(&self.shared.last_used) = Instant::now();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut progress_token = None;
        if let Some(Value::Object(meta)) = params.get_mut("_meta")
            && let Some(token) = meta.remove("progressToken")
        {
            meta.insert("progressToken".into(), json!(format!("palisade-{id}")));
            progress_token = Some(token);
        }
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(id, tx);
        let asks = relays.asks.filter(|_| self.shared.relay_messages).cloned();
        if relays.notifications.is_some() || asks.is_some() {
            let sink = relays.notifications.cloned();
            lock(&self.shared.relays).insert(id, Relay { sink, progress_token, asks });
        }
        let _forget = Forget { shared: &self.shared, id };
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await?;
        let answer = match cancel {
            Some(token) => tokio::select! {
                biased;
                () = token.cancelled() => {
                    let mut cancelled = Map::new();
                    cancelled.insert("requestId".into(), json!(id));
                    let _ = self.notify("notifications/cancelled", cancelled).await;
                    return Err(UpstreamError::Cancelled);
                }
                answer = rx => answer,
            },
            None => rx.await,
        };
        *lock(&self.shared.last_used) = Instant::now();
        let frame = answer.map_err(|_| UpstreamError::Unavailable("the stdio server has exited".into()))??;
        http::response_body(frame, id)
    }

    /// Stops it: stdin closed, a grace period, SIGTERM, another, SIGKILL.
    pub(crate) async fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.stdin.lock().await.take();
        let exited = self.shared.exited.clone();
        if tokio::time::timeout(STOP_GRACE, exited.cancelled()).await.is_err() {
            if let Some(pid) = self.pid.and_then(|pid| i32::try_from(pid).ok()).and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            if tokio::time::timeout(STOP_GRACE, exited.cancelled()).await.is_err() {
                let child = lock(&self.child).take();
                if let Some(mut child) = child {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                }
            }
        }
        let child = lock(&self.child).take();
        if let Some(mut child) = child {
            let _ = child.wait().await;
        }
        tracing::info!(upstream = %self.upstream, pid = self.pid, "stdio server stopped");
    }
}

/// Removes a request's waiter and relay however its future ends.
struct Forget<'a> {
    shared: &'a Shared,
    id: i64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(&self.shared.pending).remove(&self.id);
        lock(&self.shared.relays).remove(&self.id);
    }
}

/// The bound on one stdout frame, and where an oversized one is counted.
struct StdoutLimits {
    max_line_bytes: usize,
    drops: Arc<Drops>,
}

/// Reads stdout line by line until it ends; the process is dead after. A frame over
/// `max_line_bytes` is a protocol error: reading stops at the cap (the rest is never read), the
/// process is given up and the requests waiting on it fail.
async fn read_stdout(
    process: std::sync::Weak<Process>,
    shared: Arc<Shared>,
    stdout: impl AsyncRead + Unpin,
    limits: StdoutLimits,
    upstream: String,
) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    let why = loop {
        line.clear();
        match read_line_bounded(&mut reader, &mut line, limits.max_line_bytes, Overflow::Stop, None).await {
            Ok(read) if read.discarded > 0 => {
                limits.drops.oversized_message();
                break "the stdio server wrote a message over the size limit";
            }
            Ok(read) if read.consumed == 0 => break "the stdio server closed its stdout",
            Ok(_) => {}
            Err(_) => break "the stdio server's stdout broke",
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Ok(value) = palisade_wire::strict::from_slice(&line) else {
            break "the stdio server wrote something that is not JSON on stdout";
        };
        match http::classify(value) {
            Ok(Incoming::Response(frame)) => {
                let id = frame.get("id").and_then(Value::as_i64);
                *lock(&shared.last_used) = Instant::now();
                let waiter = id.and_then(|id| lock(&shared.pending).remove(&id));
                match waiter {
                    Some(waiter) => {
                        let _ = waiter.send(Ok(frame));
                    }
                    // A late answer to a cancelled or timed-out request is dropped.
                    None => tracing::debug!(%upstream, "stdio server answered an id with no waiter"),
                }
            }
            Ok(Incoming::Notification { method, frame }) => route_notification(&shared, &method, frame).await,
            Ok(Incoming::Request { id, method, params }) => {
                let Some(process) = process.upgrade() else { break "stopped" };
                route_request(&shared, process, id, &method, params.as_ref()).await;
            }
            Err(_) => break "the stdio server wrote a message that is not JSON-RPC",
        }
    };
    let why = if shared.stopping.load(Ordering::SeqCst) {
        tracing::debug!(%upstream, reason = why, "stdio server ended as asked");
        why.to_owned()
    } else {
        // A server that fails at start says why on stderr (a missing module, a bad argument):
        // its last lines go into the one error the caller, the log and `gateway status` show.
        let _ = tokio::time::timeout(STDERR_TAIL_WAIT, shared.stderr_done.cancelled()).await;
        let tail = stderr_cause(&lock(&shared.stderr_tail).iter().cloned().collect::<Vec<_>>());
        let why = if tail.is_empty() {
            why.to_owned()
        } else {
            format!("{why}; its last stderr lines: {}", tail.join(" | "))
        };
        tracing::warn!(%upstream, reason = %why, "stdio server gone");
        why
    };
    shared.die(&why);
    if let Some(process) = process.upgrade() {
        let child = lock(&process.child).take();
        if let Some(mut child) = child {
            let _ = child.start_kill();
            match child.wait().await {
                Ok(status) => tracing::info!(%upstream, %status, "stdio server exited"),
                Err(error) => tracing::warn!(%upstream, %error, "stdio server could not be reaped"),
            }
        }
    }
}

/// A server-to-client request, answered in the background (stdout keeps being read): on a
/// per-caller process, asked of the oldest in-flight request that relays them (stdio carries
/// no link from a request to the call that caused it, but every call in flight on that process
/// is the same caller's); on a shared process, or with none in flight, refused (`ping` is
/// answered).
/// An answer given at once is written before the next line is read, so a server that floods
/// requests without reading its stdin stalls itself, not the gateway.
async fn route_request(shared: &Shared, process: Arc<Process>, id: Value, method: &str, params: Option<&Value>) {
    let asks = {
        let relays = lock(&shared.relays);
        let oldest = relays.iter().filter(|(_, relay)| relay.asks.is_some()).min_by_key(|(id, _)| **id);
        oldest.and_then(|(_, relay)| relay.asks.clone())
    };
    let waits = asks.is_some() && method != "ping";
    let answer = answer_frame(id, method, params, asks.as_ref());
    if waits {
        tokio::spawn(async move {
            let frame = answer.await;
            let _ = process.write(&frame).await;
        });
    } else {
        let _ = process.write(&answer.await).await;
    }
}

/// Progress to the request whose token it carries (the caller's own token restored), log
/// messages to the in-flight requests of a per-caller process, list changes and resource updates
/// to the gateway.
async fn route_notification(shared: &Shared, method: &str, mut frame: Value) {
    if let Some(change) = Change::of(method, &frame) {
        let sender = shared.changes.as_ref().and_then(|changes| lock(changes).clone());
        if let Some(sender) = sender {
            let _ = sender.try_send(change);
        }
        return;
    }
    let targets: Vec<mpsc::Sender<Value>> = match method {
        "notifications/progress" => {
            let token = frame.pointer("/params/progressToken").and_then(Value::as_str).unwrap_or("");
            let id = token.strip_prefix("palisade-").and_then(|id| id.parse::<i64>().ok());
            let relays = lock(&shared.relays);
            let Some(relay) = id.and_then(|id| relays.get(&id)) else { return };
            let Some(original) = relay.progress_token.clone() else { return };
            if let Some(params) = frame.get_mut("params").and_then(Value::as_object_mut) {
                params.insert("progressToken".into(), original);
            }
            relay.sink.iter().cloned().collect()
        }
        "notifications/message" if shared.relay_messages => {
            lock(&shared.relays).values().filter_map(|relay| relay.sink.clone()).collect()
        }
        _ => return,
    };
    for sink in targets {
        let _ = sink.try_send(frame.clone());
    }
}

/// Where a process's stderr goes: the log under its upstream's name, its drop counters, and
/// the values masked in both.
struct StderrSink {
    upstream: String,
    drops: Arc<Drops>,
    secrets: Vec<(String, String)>,
}

/// Shortest declared value that is masked in stderr (a shorter one would mask ordinary words).
const MIN_MASKED_CHARS: usize = 6;

/// `line` with every declared value of at least [`MIN_MASKED_CHARS`] replaced by `[NAME]`: a
/// server that echoes its API key on stderr does not put it in the gateway's log or errors.
fn mask(line: &str, secrets: &[(String, String)]) -> String {
    let mut line = line.to_owned();
    for (name, value) in secrets {
        if value.chars().count() >= MIN_MASKED_CHARS && line.contains(value.as_str()) {
            line = line.replace(value.as_str(), &format!("[{name}]"));
        }
    }
    line
}

/// Logs stderr lines (declared values masked, control characters escaped, each cut to
/// [`MAX_STDERR_LINE`] bytes) up to [`MAX_STDERR_BYTES`]. Only the kept part of a line is ever
/// held: the rest of a long line, and everything past the log cap, is read through the reader's
/// fixed buffer, discarded and counted.
async fn log_stderr(sink: StderrSink, stderr: impl AsyncRead + Unpin, shared: Arc<Shared>) {
    let StderrSink { upstream, drops, secrets } = sink;
    let mut reader = BufReader::new(stderr);
    let mut logged = 0usize;
    let mut dropped = 0usize;
    let mut line = Vec::with_capacity(MAX_STDERR_LINE);
    loop {
        line.clear();
        let read =
            match read_line_bounded(&mut reader, &mut line, MAX_STDERR_LINE, Overflow::Discard, Some(&drops)).await {
                Ok(read) if read.consumed > 0 => read,
                Ok(_) | Err(_) => break,
            };
        dropped = dropped.saturating_add(read.discarded);
        let kept = read.consumed - read.discarded;
        let raw = mask(String::from_utf8_lossy(&line).trim_end(), &secrets);
        let shown = palisade_base::reveal::reveal_line_short(
            &mask(&log_record(&raw).unwrap_or_else(|| raw.clone()), &secrets),
            STDERR_TAIL_CHARS,
        );
        if !shown.is_empty() {
            let mut tail = lock(&shared.stderr_tail);
            if tail.len() == STDERR_RING_LINES {
                tail.pop_front();
            }
            tail.push_back(shown);
        }
        if logged >= MAX_STDERR_BYTES {
            dropped = dropped.saturating_add(kept);
            drops.stderr_bytes(kept);
            continue;
        }
        logged += kept;
        let text: String =
            raw.chars().map(|c| if c.is_control() { c.escape_unicode().to_string() } else { c.to_string() }).collect();
        tracing::info!(%upstream, stderr = %text, "stdio server stderr");
        if logged >= MAX_STDERR_BYTES {
            tracing::warn!(%upstream, "stdio server stderr reached its log cap; the rest is not logged");
        }
    }
    if dropped > 0 {
        tracing::warn!(%upstream, dropped_bytes = dropped, "stdio server stderr not logged");
    }
    shared.stderr_done.cancel();
}

/// A stderr line that is a JSON log record (pino, bunyan, structlog, …) as `level: message:
/// error`; `None` for any other line.
fn log_record(line: &str) -> Option<String> {
    let record = serde_json::from_str::<Map<String, Value>>(line.trim()).ok()?;
    let text = |value: &Value| match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    };
    let field = |names: &[&str]| names.iter().find_map(|name| record.get(*name).and_then(text));
    let message = field(&["msg", "message", "event"])?;
    let error = ["err", "error", "exception"].iter().find_map(|name| match record.get(*name)? {
        Value::Object(error) => error.get("message").and_then(text).or_else(|| error.get("stack").and_then(text)),
        other => text(other),
    });
    let mut shown = field(&["level", "levelname", "severity"]).map(|level| format!("{level}: ")).unwrap_or_default();
    shown.push_str(&message);
    if let Some(error) = error {
        shown.push_str(": ");
        shown.push_str(error.lines().next().unwrap_or_default());
    }
    Some(shown)
}

/// The lines of a failed start's stderr that say why it failed: Node's stack frames (`at …`),
/// its source excerpt and caret, the braces of a printed error object, a Python traceback's
/// frames, and blank lines are dropped; of the rest the last [`STDERR_TAIL_LINES`], led by the
/// last line that names an error when that one would have fallen out.
fn stderr_cause(lines: &[String]) -> Vec<String> {
    let caret = |line: &str| !line.trim().is_empty() && line.trim().chars().all(|c| matches!(c, '^' | '~'));
    let mut kept: Vec<&str> = Vec::new();
    let mut in_traceback = false;
    for (index, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        let indented = line.starts_with([' ', '\t']);
        if trimmed.starts_with("Traceback (most recent call last)") {
            in_traceback = true;
            continue;
        }
        if in_traceback && indented {
            continue;
        }
        in_traceback = false;
        let frame = indented && trimmed.starts_with("at ");
        let excerpt = lines.get(index + 1).is_some_and(|next| caret(next));
        if trimmed.is_empty() || frame || excerpt || caret(line) || matches!(trimmed, "{" | "}") {
            continue;
        }
        kept.push(trimmed);
    }
    let names_error = |line: &str| {
        line.contains("Error")
            || line.contains("ERR_")
            || line.contains("Exception")
            || line.to_lowercase().starts_with("error")
    };
    let start = kept.len().saturating_sub(STDERR_TAIL_LINES);
    let mut cause: Vec<String> = Vec::new();
    if let Some(error) = kept[..start].iter().rev().find(|line| names_error(line))
        && !kept[start..].iter().any(|line| names_error(line))
    {
        cause.push((*error).to_owned());
        cause.push("…".to_owned());
        cause.extend(kept[start + 2..].iter().map(|line| (*line).to_owned()));
    } else {
        cause.extend(kept[start..].iter().map(|line| (*line).to_owned()));
    }
    cause
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn a_node_module_error_keeps_its_cause_and_drops_the_stack() {
        let node = lines(
            "node:internal/modules/esm/resolve:873
  throw new ERR_MODULE_NOT_FOUND(packageName, fileURLToPath(base), null);
        ^

Error [ERR_MODULE_NOT_FOUND]: Cannot find package '@modelcontextprotocol/sdk' imported from /opt/mcp/dist/index.js
    at packageResolve (node:internal/modules/esm/resolve:873:9)
    at moduleResolve (node:internal/modules/esm/resolve:946:18)
    at defaultResolve (node:internal/modules/esm/resolve:1188:11)
    at ModuleLoader.defaultResolve (node:internal/modules/esm/loader:642:12)
    at #cachedDefaultResolve (node:internal/modules/esm/loader:591:25)
    at ModuleLoader.resolve (node:internal/modules/esm/loader:574:38)
    at ModuleLoader.getModuleJobForImport (node:internal/modules/esm/loader:236:38)
    at ModuleJob._link (node:internal/modules/esm/module_job:130:49) {
  code: 'ERR_MODULE_NOT_FOUND'
}

Node.js v22.20.0",
        );
        assert_eq!(
            stderr_cause(&node),
            [
                "node:internal/modules/esm/resolve:873",
                "Error [ERR_MODULE_NOT_FOUND]: Cannot find package '@modelcontextprotocol/sdk' imported from /opt/mcp/dist/index.js",
                "code: 'ERR_MODULE_NOT_FOUND'",
                "Node.js v22.20.0",
            ]
        );
    }

    #[test]
    fn declared_values_are_masked_in_stderr() {
        let secrets = vec![("API_KEY".to_owned(), "sk-live-123456".to_owned()), ("SHORT".to_owned(), "abc".to_owned())];
        assert_eq!(
            mask("auth failed for key sk-live-123456 (abc)", &secrets),
            "auth failed for key [API_KEY] (abc)",
            "a value under six characters is left alone"
        );
        let record = r#"{"level":"error","msg":"bad key sk-live-123456"}"#;
        assert_eq!(mask(&log_record(&mask(record, &secrets)).unwrap(), &secrets), "error: bad key [API_KEY]");
    }

    #[test]
    fn a_python_traceback_keeps_its_exception() {
        let python = lines(
            "Traceback (most recent call last):
  File \"/srv/server.py\", line 3, in <module>
    from mcp.server.fastmcp import FastMCP
ModuleNotFoundError: No module named 'mcp'",
        );
        assert_eq!(stderr_cause(&python), ["ModuleNotFoundError: No module named 'mcp'"]);
    }

    #[test]
    fn an_error_further_up_leads_the_last_lines_and_json_records_are_read() {
        let mut many = vec!["Error: the configuration file is missing".to_owned()];
        many.extend((0..10).map(|n| format!("shutting down {n}")));
        let cause = stderr_cause(&many);
        assert_eq!(cause[0], "Error: the configuration file is missing");
        assert_eq!(cause[1], "…");
        assert_eq!(cause.last().map(String::as_str), Some("shutting down 9"));
        assert_eq!(cause.len(), STDERR_TAIL_LINES);
        let record = r#"{"level":50,"time":1,"msg":"cannot start","err":{"message":"EACCES: permission denied, open '/data/x'","stack":"Error: EACCES\n at x"}}"#;
        assert_eq!(log_record(record).as_deref(), Some("50: cannot start: EACCES: permission denied, open '/data/x'"));
        assert_eq!(log_record("not json"), None);
        assert_eq!(log_record(r#"{"no":"message"}"#), None);
    }
}
