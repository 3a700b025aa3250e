//! `[[upstreams]]` (and the sandbox identities of `[gateway]`): as written ([`RawUpstream`]) and
//! validated ([`UpstreamSettings`], [`StdioSettings`]), with the exchange limits and protocol
//! choice the client applies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use crate::config_error::{GatewayConfigError, bad};
use crate::credentials::CredentialConfig;
use crate::credentials::settings::{RawCredential, check_scope, validate_credential};
use crate::names::check_label;

/// Limits applied to every exchange with one upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamLimits {
    /// Longest wait for a TCP (and TLS) connection (default 5 s).
    pub connect_timeout: Duration,
    /// Longest a request may take, from sending to the last byte of its answer, event streams
    /// included (default 30 s).
    pub request_timeout: Duration,
    /// Most bytes read of one answer, of one event of a change stream, or of one stdout frame of
    /// a stdio server (default 4 MiB); a larger one fails that call or closes that stream.
    pub max_response_bytes: usize,
    /// Most items one listing may have over all its pages (default 10,000; more is an error).
    pub max_list_items: usize,
    /// Most pages one listing may take (default 100; more is an error).
    pub max_list_pages: usize,
    /// Most callers' requests in flight to the upstream at once (default: no cap); past it a
    /// call is refused at once as rate limited.
    pub in_flight: InFlightCap,
}

/// The cap on callers' requests in flight to one upstream (`max_in_flight`), shared by the
/// clones of its settings and of its client.
#[derive(Debug, Clone, Default)]
pub struct InFlightCap {
    permits: Option<(usize, std::sync::Arc<tokio::sync::Semaphore>)>,
}

impl InFlightCap {
    /// A cap of `max` requests at once.
    pub fn new(max: usize) -> Self {
        Self { permits: Some((max, std::sync::Arc::new(tokio::sync::Semaphore::new(max)))) }
    }

    /// The cap, when there is one.
    pub fn max(&self) -> Option<usize> {
        self.permits.as_ref().map(|(max, _)| *max)
    }

    /// A permit for one request, held until it is answered: `Some(None)` without a cap,
    /// `None` when the cap is reached.
    pub(crate) fn try_start(&self) -> Option<Option<tokio::sync::OwnedSemaphorePermit>> {
        match &self.permits {
            None => Some(None),
            Some((_, semaphore)) => semaphore.clone().try_acquire_owned().ok().map(Some),
        }
    }
}

/// Two caps are equal when they allow the same number (a reloaded file's cap is the running one
/// when its `max_in_flight` is: the running permits are kept).
impl PartialEq for InFlightCap {
    fn eq(&self, other: &Self) -> bool {
        self.max() == other.max()
    }
}

impl Eq for InFlightCap {}

impl Default for UpstreamLimits {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            max_response_bytes: 4 * 1024 * 1024,
            max_list_items: 10_000,
            max_list_pages: 100,
            in_flight: InFlightCap::default(),
        }
    }
}

/// Which protocol era to speak to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolChoice {
    /// `server/discover` first; the 2025 handshake when the upstream does not know it.
    Auto,
    /// 2026-07-28 only.
    Modern,
    /// The 2025 handshake only: 2025-11-25, then 2025-06-18.
    Legacy,
}

/// One `[[upstreams]]` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// DNS-label style id.
    pub id: String,
    /// The upstream's Streamable HTTP endpoint (or `command` for a local stdio server).
    pub url: Option<String>,
    /// stdio: the program to run — an absolute path, or a bare name looked up in the gateway's
    /// `PATH` when the configuration is read.
    pub command: Option<String>,
    /// stdio: its arguments, exactly.
    #[serde(default)]
    pub args: Vec<String>,
    /// stdio: names of environment variables passed from the gateway's environment.
    #[serde(default)]
    pub env: Vec<String>,
    /// stdio: environment variables whose value is read from a file (name → file).
    #[serde(default)]
    pub env_files: BTreeMap<String, PathBuf>,
    /// stdio: the working directory (default the private `/tmp`).
    pub cwd: Option<PathBuf>,
    /// stdio: directories visible inside the sandbox, read-only unless `rw = true`.
    #[serde(default)]
    pub grants: Vec<RawGrant>,
    /// stdio: whether the process may reach the network (default false: its own loopback only).
    pub network: Option<bool>,
    /// stdio: `bubblewrap` (default) or `none` (unconfined; warned about at every start).
    pub confinement: Option<String>,
    /// stdio: one process for every caller (only for servers declared stateless). Default false:
    /// one process per caller.
    pub shared: Option<bool>,
    /// stdio: most processes running at once for this upstream (per-caller ones). Default 16.
    pub max_processes: Option<u64>,
    /// stdio: a per-caller process unused this long is stopped. Default 300.
    pub idle_secs: Option<u64>,
    /// stdio: resource limits of each process.
    pub limits: Option<RawLimits>,
    /// Prefix of its exposed names; default the id; `""` exposes its names unprefixed.
    pub prefix: Option<String>,
    /// `auto` (default), `2026-07-28`, or `2025` (the 2025-11-25 / 2025-06-18 handshake).
    pub protocol: Option<String>,
    /// Seconds to connect. Default 5.
    pub connect_timeout_secs: Option<u64>,
    /// Seconds for one request, start to end. Default 30.
    pub request_timeout_secs: Option<u64>,
    /// Largest upstream response body, event-stream event or stdio stdout frame, bytes. Default
    /// 4 MiB.
    pub max_response_bytes: Option<u64>,
    /// Most callers' requests in flight to it at once (1–100000). Default: no cap.
    pub max_in_flight: Option<u64>,
    /// Scopes a caller needs for every tool, prompt and resource of this upstream.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Extra scopes per tool (upstream name → scopes).
    #[serde(default)]
    pub tool_scopes: BTreeMap<String, Vec<String>>,
    /// Tools (upstream names) never exposed.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Tools (upstream names) that need a human confirmation bound to the call's arguments.
    #[serde(default)]
    pub confirm: Vec<String>,
    /// Tools (upstream names) exempt from the confirmation a `destructiveHint` asks for.
    #[serde(default)]
    pub no_confirm: Vec<String>,
    /// Tools (upstream names) that run as the caller's durable task when the caller asks for one
    /// (besides those whose definition declares `execution.taskSupport`).
    #[serde(default)]
    pub tasks: Vec<String>,
    /// The gateway's own credential toward it. Default none.
    #[serde(default)]
    pub credential: RawCredential,
    /// What the upstream may ask the caller during a call. Default: elicitation relayed,
    /// sampling refused, no roots.
    #[serde(default)]
    pub client_requests: RawClientRequests,
}

/// `[upstreams.client_requests]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientRequests {
    /// Relay `elicitation/create` to the caller. Default true.
    pub elicitation: Option<bool>,
    /// Relay `sampling/createMessage` to the caller (it spends the caller's model). Default
    /// false.
    pub sampling: Option<bool>,
    /// The roots `roots/list` answers (`file://` URIs of absolute directories). Default none:
    /// the request is refused; the caller's own roots are never asked for.
    #[serde(default)]
    pub roots: Vec<String>,
    /// Relay `roots/list` to the caller instead (its own paths reach the upstream). Default
    /// false; not with `roots`.
    pub caller_roots: Option<bool>,
}

/// What an upstream may ask the caller during a call, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRequests {
    /// `elicitation/create` is relayed to the caller.
    pub elicitation: bool,
    /// `sampling/createMessage` is relayed to the caller.
    pub sampling: bool,
    /// What `roots/list` answers, in order (the gateway answers it itself).
    pub roots: Vec<Url>,
    /// `roots/list` is relayed to the caller (never with `roots`).
    pub caller_roots: bool,
}

impl Default for ClientRequests {
    fn default() -> Self {
        Self { elicitation: true, sampling: false, roots: Vec::new(), caller_roots: false }
    }
}

/// Most roots one upstream may be granted.
const MAX_ROOTS: usize = 64;

fn validate_client_requests(
    raw: RawClientRequests,
    key: &dyn Fn(&str) -> String,
) -> Result<ClientRequests, GatewayConfigError> {
    let defaults = ClientRequests::default();
    if raw.roots.len() > MAX_ROOTS {
        return Err(bad(key("client_requests.roots"), format!("at most {MAX_ROOTS} roots")));
    }
    let mut roots = Vec::with_capacity(raw.roots.len());
    for text in &raw.roots {
        let url = Url::parse(text).map_err(|_| bad(key("client_requests.roots"), format!("{text:?} is not a URI")))?;
        let absolute_file = url.scheme() == "file"
            && url.host_str().is_none_or(str::is_empty)
            && url.path().starts_with('/')
            && url.query().is_none()
            && url.fragment().is_none();
        if !absolute_file {
            return Err(bad(
                key("client_requests.roots"),
                format!("{text:?} must be a file:// URI of an absolute path, without query or fragment"),
            ));
        }
        if roots.contains(&url) {
            return Err(bad(key("client_requests.roots"), format!("{text:?} is listed twice")));
        }
        roots.push(url);
    }
    let caller_roots = raw.caller_roots.unwrap_or(defaults.caller_roots);
    if caller_roots && !roots.is_empty() {
        return Err(bad(key("client_requests.caller_roots"), "either the granted roots or the caller's, not both"));
    }
    Ok(ClientRequests {
        elicitation: raw.elicitation.unwrap_or(defaults.elicitation),
        sampling: raw.sampling.unwrap_or(defaults.sampling),
        roots,
        caller_roots,
    })
}

/// One `grants` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGrant {
    /// An absolute directory.
    pub path: PathBuf,
    /// Writable inside the sandbox. Default false.
    pub rw: Option<bool>,
}

/// `[upstreams.limits]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Address space, MiB. Default 4096.
    pub memory_mib: Option<u64>,
    /// Processes and threads. Default 128.
    pub processes: Option<u64>,
    /// CPU seconds over the process's life. Default 3600.
    pub cpu_secs: Option<u64>,
    /// Open files. Default 1024.
    pub open_files: Option<u64>,
}

/// The sandbox's identities (used when the gateway runs as root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxSettings {
    /// The first uid handed out; each running process has its own.
    pub uid_base: u32,
    /// The gid of every process.
    pub gid: u32,
}

/// A local stdio server's launch, as configured (resolved and hashed by [`crate::upstream::launch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioSettings {
    /// The program as written: absolute, or a bare name looked up in `PATH`.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables passed from the gateway's environment, by name.
    pub env: Vec<String>,
    /// Variables read from files, by name.
    pub env_files: BTreeMap<String, PathBuf>,
    /// The working directory inside the sandbox.
    pub cwd: PathBuf,
    /// The directories it sees.
    pub grants: Vec<Grant>,
    /// Whether it may reach the network.
    pub network: bool,
    /// Whether it is confined.
    pub confinement: Confinement,
    /// One process for every caller.
    pub shared: bool,
    /// Most processes at once.
    pub max_processes: usize,
    /// Idle per-caller processes stop after this.
    pub idle: Duration,
    /// Each process's resource limits.
    pub limits: ProcessLimits,
    /// The paths the gateway protects ([`GatewaySettings::protected_paths`]): an argument may not
    /// name one (it would be hashed and shown). Not part of the launch.
    pub protected: Vec<PathBuf>,
    /// The `PATH` a bare `command` is looked up on: the gateway's, read with the configuration
    /// (a command that shows the running gateway's launches sets the running gateway's with
    /// [`GatewaySettings::set_search_path`]). Not part of the launch; its result is.
    pub search_path: Option<String>,
}

/// One directory a stdio process sees.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    /// Absolute, without `.` or `..` components.
    pub path: PathBuf,
    /// Writable.
    pub rw: bool,
}

/// How a stdio process is confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// bubblewrap: namespaces, a read-only system view, the grants, no capabilities.
    Bubblewrap,
    /// Not at all (the operator's explicit choice).
    None,
}

impl Confinement {
    /// As written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bubblewrap => "bubblewrap",
            Self::None => "none",
        }
    }
}

/// Resource limits of one stdio process (rlimits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLimits {
    /// RLIMIT_AS, bytes.
    pub memory_bytes: u64,
    /// RLIMIT_NPROC.
    pub processes: u64,
    /// RLIMIT_CPU, seconds.
    pub cpu_secs: u64,
    /// RLIMIT_NOFILE.
    pub open_files: u64,
}

/// One validated upstream.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    /// Its id.
    pub id: String,
    /// Its endpoint (also its canonical resource URI for OAuth); `stdio:<id>` for a stdio
    /// upstream.
    pub url: Url,
    /// The launch of a local stdio server (`None`: Streamable HTTP at `url`).
    pub stdio: Option<StdioSettings>,
    /// The prefix of its exposed names (`None`: unprefixed).
    pub prefix: Option<String>,
    /// Which protocol era to speak.
    pub protocol: ProtocolChoice,
    /// Timeouts and sizes.
    pub limits: UpstreamLimits,
    /// Scopes for everything it exposes.
    pub scopes: Vec<String>,
    /// Extra scopes per tool.
    pub tool_scopes: BTreeMap<String, Vec<String>>,
    /// Tools never exposed.
    pub deny: BTreeSet<String>,
    /// Tools that need confirmation.
    pub confirm: BTreeSet<String>,
    /// Tools exempt from the `destructiveHint` confirmation.
    pub no_confirm: BTreeSet<String>,
    /// Tools that may run as the caller's task.
    pub tasks: BTreeSet<String>,
    /// Its credential.
    pub credential: CredentialConfig,
    /// What it may ask the caller during a call.
    pub client_requests: ClientRequests,
}

impl UpstreamSettings {
    /// The per-tool rules (`deny`, `confirm`, `no_confirm`, `tasks`, `tool_scopes`) that name a
    /// tool `listed` does not contain, as a sentence each: a rule that matches nothing protects
    /// nothing (a misspelt or renamed tool), so the gateway warns at start and `gateway status`
    /// shows it.
    pub fn unmatched_tool_rules<'a>(&self, listed: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let listed: BTreeSet<&str> = listed.into_iter().collect();
        let rules = [
            ("deny", self.deny.iter().collect::<Vec<_>>()),
            ("confirm", self.confirm.iter().collect()),
            ("no_confirm", self.no_confirm.iter().collect()),
            ("tasks", self.tasks.iter().collect()),
            ("tool_scopes", self.tool_scopes.keys().collect()),
        ];
        let mut unmatched = Vec::new();
        for (key, names) in rules {
            for name in names.into_iter().filter(|name| !listed.contains(name.as_str())) {
                unmatched.push(format!("{key} names {name:?}, which this upstream does not list: it matches nothing"));
            }
        }
        unmatched
    }
}

/// Largest accepted `max_response_bytes` (256 MiB).
const MAX_RESPONSE_CAP: u64 = 256 * 1024 * 1024;

pub(crate) fn validate_upstream(index: usize, raw: RawUpstream) -> Result<UpstreamSettings, GatewayConfigError> {
    let key = |field: &str| format!("upstreams[{index}].{field}");
    check_label(&raw.id).map_err(|reason| bad(key("id"), reason))?;
    let (url, stdio) = match (&raw.url, &raw.command) {
        (Some(_), Some(_)) => return Err(bad(key("command"), "give either url (HTTP) or command (stdio), not both")),
        (None, None) => return Err(bad(key("url"), "is required (or command, for a local stdio server)")),
        (Some(url), None) => {
            refuse_stdio_fields(&raw, &key)?;
            (validate_url(url, &key)?, None)
        }
        (None, Some(_)) => {
            if raw.credential.kind.as_deref().is_some_and(|kind| kind != "none") {
                return Err(bad(
                    key("credential.kind"),
                    "a stdio upstream takes its secrets from env or env_files, not a credential",
                ));
            }
            let url = Url::parse(&format!("stdio:{}", raw.id)).map_err(|_| bad(key("id"), "not usable in a URL"))?;
            (url, Some(validate_stdio(&raw, &key)?))
        }
    };
    let prefix = match raw.prefix {
        None => Some(raw.id.clone()),
        Some(prefix) if prefix.is_empty() => None,
        Some(prefix) => {
            check_label(&prefix).map_err(|reason| bad(key("prefix"), reason))?;
            Some(prefix)
        }
    };
    let protocol = match raw.protocol.as_deref() {
        None | Some("auto") => ProtocolChoice::Auto,
        Some("2026-07-28") => ProtocolChoice::Modern,
        Some("2025") => ProtocolChoice::Legacy,
        Some(_) => return Err(bad(key("protocol"), "must be \"auto\", \"2026-07-28\" or \"2025\"")),
    };
    let defaults = UpstreamLimits::default();
    let timeout = |field: &str, value: Option<u64>, default: Duration| match value {
        None => Ok(default),
        Some(0) => Err(bad(key(field), "must be at least 1")),
        Some(n) if n > 3_600 => Err(bad(key(field), "must be at most 3600")),
        Some(n) => Ok(Duration::from_secs(n)),
    };
    let mut limits = defaults.clone();
    limits.connect_timeout = timeout("connect_timeout_secs", raw.connect_timeout_secs, defaults.connect_timeout)?;
    limits.request_timeout = timeout("request_timeout_secs", raw.request_timeout_secs, defaults.request_timeout)?;
    if let Some(bytes) = raw.max_response_bytes {
        if !(1024..=MAX_RESPONSE_CAP).contains(&bytes) {
            return Err(bad(key("max_response_bytes"), format!("must be between 1024 and {MAX_RESPONSE_CAP}")));
        }
        limits.max_response_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    }
    if let Some(max) = raw.max_in_flight {
        if !(1..=100_000).contains(&max) {
            return Err(bad(key("max_in_flight"), "must be between 1 and 100000"));
        }
        limits.in_flight = InFlightCap::new(usize::try_from(max).unwrap_or(100_000));
    }
    for scope in raw.scopes.iter().chain(raw.tool_scopes.values().flatten()) {
        check_scope(scope).map_err(|reason| bad(key("scopes"), reason))?;
    }
    let credential = validate_credential(&key("credential"), raw.credential)?;
    let client_requests = validate_client_requests(raw.client_requests, &key)?;
    Ok(UpstreamSettings {
        id: raw.id,
        url,
        stdio,
        prefix,
        protocol,
        limits,
        scopes: raw.scopes,
        tool_scopes: raw.tool_scopes,
        deny: raw.deny.into_iter().collect(),
        confirm: raw.confirm.into_iter().collect(),
        no_confirm: raw.no_confirm.into_iter().collect(),
        tasks: raw.tasks.into_iter().collect(),
        credential,
        client_requests,
    })
}

fn validate_url(text: &str, key: &dyn Fn(&str) -> String) -> Result<Url, GatewayConfigError> {
    let url = Url::parse(text).map_err(|_| bad(key("url"), "not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(bad(key("url"), "must be an http or https URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(key("url"), "must not carry credentials (use [upstreams.credential])"));
    }
    if url.fragment().is_some() {
        return Err(bad(key("url"), "must not have a fragment"));
    }
    Ok(url)
}

/// An HTTP upstream with a stdio field: a mistake the operator should hear about.
fn refuse_stdio_fields(raw: &RawUpstream, key: &dyn Fn(&str) -> String) -> Result<(), GatewayConfigError> {
    let present = [
        ("args", !raw.args.is_empty()),
        ("env", !raw.env.is_empty()),
        ("env_files", !raw.env_files.is_empty()),
        ("cwd", raw.cwd.is_some()),
        ("grants", !raw.grants.is_empty()),
        ("network", raw.network.is_some()),
        ("confinement", raw.confinement.is_some()),
        ("shared", raw.shared.is_some()),
        ("max_processes", raw.max_processes.is_some()),
        ("idle_secs", raw.idle_secs.is_some()),
        ("limits", raw.limits.is_some()),
    ];
    match present.into_iter().find(|(_, set)| *set) {
        Some((field, _)) => Err(bad(key(field), "only a stdio upstream (command) takes it")),
        None => Ok(()),
    }
}

/// An absolute path without `.`, `..` or repeated separators (what the sandbox binds is what
/// the operator read), and not the root itself.
pub(crate) fn clean_absolute(path: &std::path::Path) -> Result<PathBuf, &'static str> {
    use std::path::Component;
    let text = path.to_str().ok_or("must be valid UTF-8")?;
    if !path.is_absolute() || text.contains("//") || text.contains('\0') {
        return Err("must be an absolute path");
    }
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err("must not contain . or .. components");
            }
        }
    }
    if out == std::path::Path::new("/") {
        return Err("must not be the root directory");
    }
    Ok(out)
}

/// An environment variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most 128 bytes.
fn check_env_name(name: &str) -> Result<(), &'static str> {
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if first_ok && name.len() <= 128 && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        Ok(())
    } else {
        Err("an environment variable name is [A-Za-z_][A-Za-z0-9_]*")
    }
}

/// Names the sandbox sets itself.
pub const RESERVED_ENV: &[&str] = &["PATH", "HOME", "TMPDIR"];

fn validate_stdio(raw: &RawUpstream, key: &dyn Fn(&str) -> String) -> Result<StdioSettings, GatewayConfigError> {
    let command = raw.command.clone().unwrap_or_default();
    if command.is_empty() || command.contains('\0') {
        return Err(bad(key("command"), "must be a program name or an absolute path"));
    }
    if command.contains('/') {
        clean_absolute(std::path::Path::new(&command)).map_err(|reason| bad(key("command"), reason))?;
    }
    if let Some(index) = raw.args.iter().position(|arg| arg.contains('\0')) {
        return Err(bad(key(&format!("args[{index}]")), "must not contain a NUL byte"));
    }
    if let Some(reason) = downloading_launcher(&command, &raw.args) {
        return Err(bad(key("command"), reason));
    }
    let mut names = BTreeSet::new();
    let mut name_ok = |field: String, name: &str| -> Result<(), GatewayConfigError> {
        check_env_name(name).map_err(|reason| bad(&field, reason))?;
        if RESERVED_ENV.contains(&name) {
            return Err(bad(field, "is set by the sandbox itself"));
        }
        if !names.insert(name.to_owned()) {
            return Err(bad(field, "is given twice (env and env_files share one namespace)"));
        }
        Ok(())
    };
    for (index, name) in raw.env.iter().enumerate() {
        name_ok(key(&format!("env[{index}]")), name)?;
    }
    for (name, path) in &raw.env_files {
        let field = key(&format!("env_files.{name}"));
        name_ok(field.clone(), name)?;
        clean_absolute(path).map_err(|reason| bad(&field, reason))?;
    }
    let mut grants: Vec<Grant> = Vec::new();
    for (index, grant) in raw.grants.iter().enumerate() {
        let field = key(&format!("grants[{index}].path"));
        let path = clean_absolute(&grant.path).map_err(|reason| bad(&field, reason))?;
        if grants.iter().any(|g| g.path == path) {
            return Err(bad(field, "is granted twice"));
        }
        grants.push(Grant { path, rw: grant.rw.unwrap_or(false) });
    }
    let cwd = match &raw.cwd {
        None => PathBuf::from("/tmp"),
        Some(cwd) => {
            let cwd = clean_absolute(cwd).map_err(|reason| bad(key("cwd"), reason))?;
            if cwd != std::path::Path::new("/tmp") && !grants.iter().any(|g| cwd.starts_with(&g.path)) {
                return Err(bad(key("cwd"), "must be /tmp or inside one of the grants"));
            }
            cwd
        }
    };
    let confinement = match raw.confinement.as_deref() {
        None | Some("bubblewrap") => Confinement::Bubblewrap,
        Some("none") => Confinement::None,
        Some(_) => return Err(bad(key("confinement"), "must be \"bubblewrap\" or \"none\"")),
    };
    let ranged = |field: &str, value: Option<u64>, default: u64, min: u64, max: u64| match value.unwrap_or(default) {
        n if (min..=max).contains(&n) => Ok(n),
        _ => Err(bad(key(field), format!("must be between {min} and {max}"))),
    };
    let limits = raw.limits.clone().unwrap_or_default();
    let limits = ProcessLimits {
        memory_bytes: ranged("limits.memory_mib", limits.memory_mib, 4096, 64, 1 << 20)? * 1024 * 1024,
        processes: ranged("limits.processes", limits.processes, 128, 1, 65_536)?,
        cpu_secs: ranged("limits.cpu_secs", limits.cpu_secs, 3600, 1, 31_536_000)?,
        open_files: ranged("limits.open_files", limits.open_files, 1024, 16, 1 << 20)?,
    };
    let max_processes = ranged("max_processes", raw.max_processes, 16, 1, 10_000)?;
    let idle = ranged("idle_secs", raw.idle_secs, 300, 1, 86_400)?;
    Ok(StdioSettings {
        command,
        args: raw.args.clone(),
        env: raw.env.clone(),
        env_files: raw.env_files.clone(),
        cwd,
        grants,
        network: raw.network.unwrap_or(false),
        confinement,
        shared: raw.shared.unwrap_or(false),
        max_processes: usize::try_from(max_processes).unwrap_or(usize::MAX),
        idle: Duration::from_secs(idle),
        limits,
        protected: Vec::new(),
        search_path: std::env::var("PATH").ok(),
    })
}

/// Why `command args` names a launcher that downloads the server when it starts (`npx`, `uvx`,
/// `bunx`, `pipx run`, `npm exec`, `pnpm dlx`, `yarn dlx`, `bun x`, `uv tool run`), or `None`.
/// Such a launch cannot be pinned (what runs is whatever the registry serves that day), finds no
/// network inside the sandbox, and `npx` without `-y` waits for an answer on a terminal: the
/// operator installs the server once and names its executable instead.
fn downloading_launcher(command: &str, args: &[String]) -> Option<String> {
    let program = command.rsplit('/').next().unwrap_or(command);
    let first = args.first().map(String::as_str);
    let second = args.get(1).map(String::as_str);
    let ecosystem = match (program, first, second) {
        ("npx", _, _) | ("npm", Some("exec" | "x"), _) | ("pnpm" | "yarn", Some("dlx"), _) => "node",
        ("bunx", _, _) | ("bun", Some("x"), _) => "bun",
        ("uvx", _, _) | ("pipx", Some("run"), _) | ("uv", Some("tool"), Some("run")) => "python",
        _ => return None,
    };
    let install = match ecosystem {
        "node" => {
            "install the server once (`npm install -g --prefix /opt/mcp <package>@<version>`) and name its executable \
             (`command = \"/opt/mcp/bin/<name>\"`)"
        }
        "bun" => "install the server once (`bun install -g <package>`) and name its executable as `command`",
        _ => {
            "install the server once into a virtual environment (`uv tool install <package>`, or `python3 -m venv \
             /opt/mcp/venv && /opt/mcp/venv/bin/pip install <package>`) and name its executable as `command`"
        }
    };
    Some(format!(
        "{program} downloads the server each time it starts: such a launch cannot be pinned, finds no network in the \
         sandbox{}; {install}",
        if program == "npx" { ", and without -y waits for an answer on a terminal" } else { "" }
    ))
}
