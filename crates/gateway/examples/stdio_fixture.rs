//! A hostile stdio MCP server for the confinement tests of stdio upstreams: it speaks
//! newline-delimited JSON-RPC on stdin/stdout (MCP 2026-07-28 by default, 2025-11-25 with
//! `--legacy`) and offers tools that report who it runs as, keep per-process state, burn CPU, and
//! try to break out of its sandbox (network, files, environment, signals, processes, memory),
//! reporting what it observed for each attempt, and flood its stderr; `log` sends one `info` log
//! message when the request's level (2026-07-28: `_meta` logLevel; 2025: the level set with
//! `logging/setLevel`) lets it.
//!
//! Usage: `stdio_fixture [--legacy]`. If `FIXTURE_START_MARKER` names a path, the line
//! `started <pid>` is appended to it at start. The process exits on stdin EOF.

use std::io::{BufRead, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

/// The modern revision this fixture speaks by default.
const MODERN_VERSION: &str = "2026-07-28";
/// The 2025-era revisions `--legacy` accepts in `initialize` (the first is the default answer).
const LEGACY_VERSIONS: [&str; 2] = ["2025-11-25", "2025-06-18"];
/// `_meta` key of the server's implementation info on the 2026-07-28 wire.
const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";
/// How long each TCP connect attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How much of what was read a report carries.
const DETAIL_BYTES: usize = 200;
/// Upper bounds that keep a mistyped argument from taking the machine down when unconfined.
const MAX_FORK: u64 = 10_000;
const MAX_ALLOC_MIB: u64 = 1 << 20;
const MAX_SPIN_SECS: u64 = 3_600;
const MAX_NOISE_BYTES: u64 = 1 << 30;
const PAGE: usize = 4096;

const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INVALID_REQUEST: i64 = -32600;
const PARSE_ERROR: i64 = -32700;

/// A JSON-RPC error answer: code and message.
struct RpcError {
    code: i64,
    message: String,
}

impl RpcError {
    fn invalid_params(message: impl Into<String>) -> Self {
        Self { code: INVALID_PARAMS, message: message.into() }
    }
}

/// `_meta` key of the per-request log level on the 2026-07-28 wire.
const LOG_LEVEL_KEY: &str = "io.modelcontextprotocol/logLevel";
/// The levels at or below which an `info` message is sent.
const INFO_OR_LOWER: [&str; 2] = ["debug", "info"];

/// The fixture's whole state: which wire it speaks, the last remembered value and the level set
/// with `logging/setLevel` (2025 wire).
struct Fixture {
    legacy: bool,
    remembered: Option<String>,
    log_level: Option<String>,
}

fn main() {
    let mut legacy = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--legacy" => legacy = true,
            other => {
                eprintln!("stdio_fixture: unknown argument {other:?} (usage: stdio_fixture [--legacy])");
                std::process::exit(2);
            }
        }
    }
    write_start_marker();
    let mut fixture = Fixture { legacy, remembered: None, log_level: None };
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                eprintln!("stdio_fixture: reading stdin failed: {error}");
                break;
            }
        }
        let text = trim_line(&line);
        if text.is_empty() {
            continue;
        }
        if let Some(answer) = fixture.handle_line(text)
            && !send(&answer)
        {
            break;
        }
    }
}

/// Appends `started <pid>` to the file `FIXTURE_START_MARKER` names, if any; failures are logged.
/// The line goes out in one `write` (`writeln!` on a file may issue one per piece, and two
/// processes starting at once then interleave theirs in the shared file).
fn write_start_marker() {
    let Some(path) = std::env::var_os("FIXTURE_START_MARKER") else { return };
    let line = format!("started {}\n", std::process::id());
    let result = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(error) = result {
        eprintln!("stdio_fixture: cannot write the start marker {}: {error}", path.to_string_lossy());
    }
}

fn trim_line(line: &[u8]) -> &[u8] {
    let mut end = line.len();
    while end > 0 && matches!(line[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    &line[..end]
}

/// Writes one message as one line on stdout; false when stdout is gone.
fn send(message: &Value) -> bool {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let written =
        serde_json::to_writer(&mut out, message).is_ok() && out.write_all(b"\n").is_ok() && out.flush().is_ok();
    if !written {
        eprintln!("stdio_fixture: stdout is closed");
    }
    written
}

fn error_response(id: Value, error: RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": error.code, "message": error.message}})
}

impl Fixture {
    /// One incoming line → the answer to send, if any (notifications get none).
    fn handle_line(&mut self, text: &[u8]) -> Option<Value> {
        let message: Value = match serde_json::from_slice(text) {
            Ok(message) => message,
            Err(error) => {
                return Some(error_response(
                    Value::Null,
                    RpcError { code: PARSE_ERROR, message: format!("parse error: {error}") },
                ));
            }
        };
        let Value::Object(message) = message else {
            return Some(error_response(
                Value::Null,
                RpcError { code: INVALID_REQUEST, message: "a message must be a JSON object".into() },
            ));
        };
        let Some(id) = message.get("id").cloned() else {
            // A notification (notifications/initialized, notifications/cancelled, ...): ignored.
            return None;
        };
        if message.get("result").is_some() || message.get("error").is_some() {
            // A response to nothing we sent: ignored.
            return None;
        }
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            return Some(error_response(
                id,
                RpcError { code: INVALID_REQUEST, message: "method must be a string".into() },
            ));
        };
        let params = match message.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(params)) => params.clone(),
            Some(_) => {
                return Some(error_response(id, RpcError::invalid_params("params must be an object")));
            }
        };
        Some(match self.dispatch(method, &params) {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(error) => error_response(id, error),
        })
    }

    fn dispatch(&mut self, method: &str, params: &Map<String, Value>) -> Result<Value, RpcError> {
        match method {
            "ping" => Ok(json!({})),
            "server/discover" if !self.legacy => Ok(json!({
                "resultType": "complete",
                "supportedVersions": [MODERN_VERSION],
                "capabilities": {"tools": {}, "logging": {}},
                "_meta": {SERVER_INFO_KEY: server_info()},
            })),
            "initialize" if self.legacy => {
                let requested = params.get("protocolVersion").and_then(Value::as_str);
                let version = match requested {
                    Some(version) if LEGACY_VERSIONS.contains(&version) => version,
                    _ => LEGACY_VERSIONS[0],
                };
                Ok(json!({
                    "protocolVersion": version,
                    "capabilities": {"tools": {}, "logging": {}},
                    "serverInfo": server_info(),
                }))
            }
            "logging/setLevel" if self.legacy => {
                let level = params
                    .get("level")
                    .and_then(Value::as_str)
                    .ok_or_else(|| RpcError::invalid_params("logging/setLevel needs a string `level`"))?;
                self.log_level = Some(level.to_owned());
                Ok(json!({}))
            }
            "tools/list" => Ok(self.complete(json!({"tools": tool_definitions()}))),
            "tools/call" => {
                let report = self.call_tool(params)?;
                let text = report.to_string();
                Ok(self.complete(json!({
                    "content": [{"type": "text", "text": text}],
                    "structuredContent": report,
                })))
            }
            other => Err(RpcError { code: METHOD_NOT_FOUND, message: format!("method not found: {other}") }),
        }
    }

    /// Adds `resultType: "complete"` on the 2026-07-28 wire, where every result carries one.
    fn complete(&self, mut result: Value) -> Value {
        if !self.legacy
            && let Value::Object(fields) = &mut result
        {
            fields.insert("resultType".into(), json!("complete"));
        }
        result
    }

    fn call_tool(&mut self, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::invalid_params("tools/call needs a string `name`"))?;
        let empty = Map::new();
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(arguments)) => arguments,
            Some(_) => return Err(RpcError::invalid_params("`arguments` must be an object")),
        };
        match name {
            "whoami" => Ok(whoami()),
            "remember" => {
                let value = required_string(arguments, "value")?;
                self.remembered = Some(value);
                Ok(json!({"stored": true}))
            }
            "recall" => Ok(json!({"value": self.remembered})),
            "probe" => probe(arguments),
            "spin" => {
                let secs = optional_u64(arguments, "secs", MAX_SPIN_SECS)?.unwrap_or(0);
                spin(secs);
                Ok(json!({"spun_secs": secs}))
            }
            "echo" => Ok(json!({"text": required_string(arguments, "text")?})),
            "noise" => {
                let bytes = optional_u64(arguments, "stderr_bytes", MAX_NOISE_BYTES)?.unwrap_or(0);
                Ok(json!({"stderr_bytes": noise(bytes)}))
            }
            "log" => {
                let level = if self.legacy {
                    self.log_level.clone()
                } else {
                    params
                        .get("_meta")
                        .and_then(|meta| meta.get(LOG_LEVEL_KEY))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                };
                let logs = level.as_deref().is_some_and(|level| INFO_OR_LOWER.contains(&level));
                if logs {
                    let message = json!({"level": "info", "logger": "fixture", "data": "logged"});
                    send(&json!({"jsonrpc": "2.0", "method": "notifications/message", "params": message}));
                }
                Ok(json!({"logged": logs, "level": level}))
            }
            other => Err(RpcError::invalid_params(format!("unknown tool: {other}"))),
        }
    }
}

/// Writes `bytes` bytes of `x` to stderr, no newline; how many were written.
fn noise(bytes: u64) -> u64 {
    let chunk = [b'x'; 64 * 1024];
    let stderr = std::io::stderr();
    let mut err = stderr.lock();
    let mut written = 0u64;
    while written < bytes {
        let n = usize::try_from((bytes - written).min(chunk.len() as u64)).unwrap_or(chunk.len());
        if err.write_all(&chunk[..n]).is_err() {
            break;
        }
        written += n as u64;
    }
    let _ = err.flush();
    written
}

fn server_info() -> Value {
    json!({"name": "stdio-fixture", "version": "1"})
}

fn tool_definitions() -> Value {
    let strings = json!({"type": "array", "items": {"type": "string"}});
    json!([
        {
            "name": "whoami",
            "description": "Reports the process's pid, uid, gid, ppid, environment variable names, cwd and hostname.",
            "inputSchema": {"type": "object", "properties": {}},
        },
        {
            "name": "log",
            "description": "Sends one info log message when the request's log level lets it.",
            "inputSchema": {"type": "object", "properties": {}},
        },
        {
            "name": "remember",
            "description": "Stores a string in this process's memory.",
            "inputSchema": {
                "type": "object",
                "properties": {"value": {"type": "string"}},
                "required": ["value"],
            },
        },
        {
            "name": "recall",
            "description": "Returns the last remembered string, or null.",
            "inputSchema": {"type": "object", "properties": {}},
        },
        {
            "name": "probe",
            "description": "Attempts each named escape (network, files, environment, signals, processes, memory, symlinks) and reports what happened.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "tcp": strings,
                    "resolve": strings,
                    "read": strings,
                    "write": strings,
                    "list": strings,
                    "env": strings,
                    "kill": {"type": "array", "items": {"type": "integer"}},
                    "fork": {"type": "integer", "minimum": 0},
                    "alloc_mib": {"type": "integer", "minimum": 0},
                    "symlink": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"link": {"type": "string"}, "target": {"type": "string"}},
                            "required": ["link", "target"],
                        },
                    },
                },
            },
        },
        {
            "name": "spin",
            "description": "Burns CPU for the given number of seconds.",
            "inputSchema": {
                "type": "object",
                "properties": {"secs": {"type": "integer", "minimum": 0}},
                "required": ["secs"],
            },
        },
        {
            "name": "noise",
            "description": "Writes the given number of bytes to stderr, without a newline.",
            "inputSchema": {
                "type": "object",
                "properties": {"stderr_bytes": {"type": "integer", "minimum": 0}},
                "required": ["stderr_bytes"],
            },
        },
        {
            "name": "echo",
            "description": "Returns the text it was given.",
            "inputSchema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    ])
}

fn required_string(arguments: &Map<String, Value>, name: &str) -> Result<String, RpcError> {
    match arguments.get(name) {
        Some(Value::String(value)) => Ok(value.clone()),
        Some(_) => Err(RpcError::invalid_params(format!("`{name}` must be a string"))),
        None => Err(RpcError::invalid_params(format!("`{name}` is required"))),
    }
}

fn optional_u64(arguments: &Map<String, Value>, name: &str, max: u64) -> Result<Option<u64>, RpcError> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_u64() {
            Some(number) if number <= max => Ok(Some(number)),
            _ => Err(RpcError::invalid_params(format!("`{name}` must be an integer from 0 to {max}"))),
        },
    }
}

fn optional_strings(arguments: &Map<String, Value>, name: &str) -> Result<Option<Vec<String>>, RpcError> {
    let wrong = || RpcError::invalid_params(format!("`{name}` must be an array of strings"));
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned).ok_or_else(wrong))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(wrong()),
    }
}

fn whoami() -> Value {
    let mut env: Vec<String> = std::env::vars_os().map(|(name, _)| name.to_string_lossy().into_owned()).collect();
    env.sort();
    let cwd = match std::env::current_dir() {
        Ok(dir) => dir.to_string_lossy().into_owned(),
        Err(error) => format!("error: {error}"),
    };
    let hostname = match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(name) => name.trim_end().to_owned(),
        Err(error) => format!("error: {error}"),
    };
    let ppid = rustix::process::getppid().map(|pid| pid.as_raw_pid());
    json!({
        "pid": std::process::id(),
        "uid": rustix::process::getuid().as_raw(),
        "gid": rustix::process::getgid().as_raw(),
        "ppid": ppid,
        "env": env,
        "cwd": cwd,
        "hostname": hostname,
    })
}

fn attempt(ok: bool, detail: impl Into<String>) -> Value {
    json!({"ok": ok, "detail": detail.into()})
}

fn failed(error: impl std::fmt::Display) -> Value {
    attempt(false, error.to_string())
}

/// The first [`DETAIL_BYTES`] bytes, lossily as text.
fn excerpt(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(DETAIL_BYTES)]).into_owned()
}

/// Checks every argument's type first (a wrong one changes nothing), then runs every attempt.
fn probe(arguments: &Map<String, Value>) -> Result<Value, RpcError> {
    const KNOWN: [&str; 10] =
        ["tcp", "resolve", "read", "write", "list", "env", "kill", "fork", "alloc_mib", "symlink"];
    if let Some(unknown) = arguments.keys().find(|key| !KNOWN.contains(&key.as_str())) {
        return Err(RpcError::invalid_params(format!("unknown probe `{unknown}` (known: {})", KNOWN.join(", "))));
    }
    let tcp = optional_strings(arguments, "tcp")?;
    let resolve = optional_strings(arguments, "resolve")?;
    let read = optional_strings(arguments, "read")?;
    let write = optional_strings(arguments, "write")?;
    let list = optional_strings(arguments, "list")?;
    let env = optional_strings(arguments, "env")?;
    let kill = kill_targets(arguments)?;
    let fork = optional_u64(arguments, "fork", MAX_FORK)?;
    let alloc_mib = optional_u64(arguments, "alloc_mib", MAX_ALLOC_MIB)?;
    let symlinks = symlink_targets(arguments)?;

    let mut report = Map::new();
    let mut each = |name: &str, targets: Option<Vec<String>>, run: fn(&str) -> Value| {
        if let Some(targets) = targets {
            let results: Map<String, Value> = targets.iter().map(|target| (target.clone(), run(target))).collect();
            report.insert(name.to_owned(), Value::Object(results));
        }
    };
    each("tcp", tcp, probe_tcp);
    each("resolve", resolve, probe_resolve);
    each("read", read, probe_read);
    each("write", write, probe_write);
    each("list", list, probe_list);
    each("env", env, probe_env);
    if let Some(pids) = kill {
        let results: Map<String, Value> = pids.iter().map(|&pid| (pid.to_string(), probe_kill(pid))).collect();
        report.insert("kill".into(), Value::Object(results));
    }
    if let Some(count) = fork {
        report.insert("fork".into(), probe_fork(count));
    }
    if let Some(mib) = alloc_mib {
        report.insert("alloc_mib".into(), probe_alloc(mib));
    }
    if let Some(links) = symlinks {
        let results: Map<String, Value> =
            links.iter().map(|(link, target)| (link.clone(), probe_symlink(link, target))).collect();
        report.insert("symlink".into(), Value::Object(results));
    }
    Ok(Value::Object(report))
}

fn kill_targets(arguments: &Map<String, Value>) -> Result<Option<Vec<i32>>, RpcError> {
    let wrong = || RpcError::invalid_params("`kill` must be an array of positive process ids");
    match arguments.get("kill") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_i64().and_then(|pid| i32::try_from(pid).ok()).filter(|pid| *pid > 0).ok_or_else(wrong))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(wrong()),
    }
}

fn symlink_targets(arguments: &Map<String, Value>) -> Result<Option<Vec<(String, String)>>, RpcError> {
    let wrong = || RpcError::invalid_params("`symlink` must be an array of {\"link\": string, \"target\": string}");
    match arguments.get("symlink") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                let link = item.get("link").and_then(Value::as_str);
                let target = item.get("target").and_then(Value::as_str);
                match (link, target) {
                    (Some(link), Some(target)) => Ok((link.to_owned(), target.to_owned())),
                    _ => Err(wrong()),
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(wrong()),
    }
}

fn probe_tcp(target: &str) -> Value {
    match target.parse::<SocketAddr>() {
        Ok(address) => connect(address),
        Err(error) => attempt(false, format!("not a socket address: {error}")),
    }
}

fn connect(address: SocketAddr) -> Value {
    match TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) {
        Ok(stream) => {
            let local = stream.local_addr().map(|local| local.to_string()).unwrap_or_default();
            attempt(true, format!("connected to {address} from {local}"))
        }
        Err(error) => attempt(false, format!("connect to {address}: {error}")),
    }
}

fn probe_resolve(target: &str) -> Value {
    let addresses: Vec<SocketAddr> = match target.to_socket_addrs() {
        Ok(addresses) => addresses.collect(),
        Err(error) => return attempt(false, format!("resolve: {error}")),
    };
    let resolved: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    let Some(first) = addresses.first() else {
        return attempt(false, "resolve: no addresses");
    };
    let mut result = connect(*first);
    if let Value::Object(fields) = &mut result {
        fields.insert("resolved".into(), json!(resolved));
    }
    result
}

fn probe_read(path: &str) -> Value {
    match std::fs::read(path) {
        Ok(bytes) => {
            let mut result = attempt(true, excerpt(&bytes));
            if let Value::Object(fields) = &mut result {
                fields.insert("len".into(), json!(bytes.len()));
            }
            result
        }
        Err(error) => failed(error),
    }
}

fn probe_write(path: &str) -> Value {
    match std::fs::write(path, "x") {
        Ok(()) => attempt(true, "wrote 1 byte"),
        Err(error) => failed(error),
    }
}

fn probe_list(path: &str) -> Value {
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(error) => return failed(error),
    };
    let mut names = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => names.push(entry.file_name().to_string_lossy().into_owned()),
            Err(error) => return failed(error),
        }
    }
    names.sort();
    let text = json!(names).to_string();
    json!({"ok": true, "detail": excerpt(text.as_bytes()), "names": names})
}

fn probe_env(name: &str) -> Value {
    match std::env::var_os(name) {
        Some(value) => json!({"ok": true, "detail": format!("set, {} bytes", value.len()), "len": value.len()}),
        None => attempt(false, "not set"),
    }
}

fn probe_kill(pid: i32) -> Value {
    let Some(target) = rustix::process::Pid::from_raw(pid) else {
        return attempt(false, "not a process id");
    };
    match rustix::process::kill_process(target, rustix::process::Signal::TERM) {
        Ok(()) => attempt(true, format!("SIGTERM delivered to {pid}")),
        Err(error) => attempt(false, format!("kill {pid}: {error}")),
    }
}

/// Spawns up to `count` `/bin/sleep 30` children, stopping at the first failure, then kills and
/// reaps every one it started.
fn probe_fork(count: u64) -> Value {
    let mut children: Vec<Child> = Vec::new();
    let mut first_error = None;
    for _ in 0..count {
        let spawned = Command::new("/bin/sleep")
            .arg("30")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match spawned {
            Ok(child) => children.push(child),
            Err(error) => {
                first_error = Some(error.to_string());
                break;
            }
        }
    }
    let started = children.len();
    for child in &mut children {
        if let Err(error) = child.kill() {
            eprintln!("stdio_fixture: killing child {}: {error}", child.id());
        }
        if let Err(error) = child.wait() {
            eprintln!("stdio_fixture: reaping child {}: {error}", child.id());
        }
    }
    let detail = match &first_error {
        Some(error) => format!("started {started} of {count}, then: {error}"),
        None => format!("started {started} of {count}"),
    };
    json!({"ok": first_error.is_none(), "started": started, "detail": detail, "error": first_error})
}

/// Reserves `mib` MiB, writes to every page, then frees it.
fn probe_alloc(mib: u64) -> Value {
    let Some(bytes) = usize::try_from(mib).ok().and_then(|mib| mib.checked_mul(1 << 20)) else {
        return attempt(false, "size overflows the address space");
    };
    let mut block: Vec<u8> = Vec::new();
    if let Err(error) = block.try_reserve_exact(bytes) {
        return attempt(false, format!("reserve {mib} MiB: {error}"));
    }
    block.resize(bytes, 1);
    let mut touched: u64 = 0;
    for page in block.chunks_mut(PAGE) {
        page[0] = 2;
        touched += u64::from(std::hint::black_box(page[0]));
    }
    drop(block);
    attempt(true, format!("allocated and touched {mib} MiB ({} pages)", touched / 2))
}

fn probe_symlink(link: &str, target: &str) -> Value {
    let create = match std::os::unix::fs::symlink(target, link) {
        Ok(()) => attempt(true, format!("{link} -> {target}")),
        Err(error) => failed(error),
    };
    let read = probe_read(link);
    let ok = create["ok"] == json!(true) && read["ok"] == json!(true);
    let detail = format!(
        "create: {}; read: {}",
        create["detail"].as_str().unwrap_or_default(),
        read["detail"].as_str().unwrap_or_default()
    );
    json!({"ok": ok, "detail": detail, "create": create, "read": read})
}

/// Busy-loops for `secs` seconds of wall time (checking the clock), using the CPU throughout.
fn spin(secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    while Instant::now() < deadline {
        for _ in 0..10_000 {
            state = std::hint::black_box(state.rotate_left(5) ^ 0x2545_F491_4F6C_DD1D);
        }
    }
    std::hint::black_box(state);
}
