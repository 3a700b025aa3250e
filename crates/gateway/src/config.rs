//! The gateway's configuration: `[gateway]`, `[pins]`, `[[upstreams]]` and `[web]` as written in
//! TOML ([`RawGateway`], [`RawPins`], [`RawUpstream`], [`RawWeb`]), validated once into
//! [`GatewaySettings`], which cannot be invalid. A bad value is reported with the dotted key that holds it
//! (`upstreams[1].credential.token_url`); secrets are named by where they come from, never shown.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use crate::credentials::{ClientAuth, CredentialConfig, SecretSource};
use crate::names::{Separator, check_label};
use crate::pins::ReviewerKeys;
use crate::upstream::{ProtocolChoice, UpstreamLimits};
use crate::user_oauth::{DEFAULT_FLOW_TTL_SECS, SignInSettings};
use crate::web::WebSettings;
use palisade_auth::egress::{EgressPolicy, parse_network, parse_proxy};

/// A configuration error, naming the offending key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config: {key}: {reason}")]
pub struct GatewayConfigError {
    /// The dotted key.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

fn bad(key: impl Into<String>, reason: impl Into<String>) -> GatewayConfigError {
    GatewayConfigError { key: key.into(), reason: reason.into() }
}

/// `[gateway]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGateway {
    /// Between prefix and upstream name: `_` (default), `__` or `.`.
    pub separator: Option<String>,
    /// The first uid of the sandboxed stdio processes when the gateway runs as root: each
    /// running process gets a uid of its own from here on. Default 600000.
    pub sandbox_uid_base: Option<u32>,
    /// The gid of every sandboxed stdio process when the gateway runs as root. Default 65534.
    pub sandbox_gid: Option<u32>,
    /// Development only: the gateway's OAuth fetches (upstream and authorization-server
    /// metadata, token and registration endpoints, the sign-in provider) may reach loopback
    /// addresses, over plain http there. Default false.
    pub egress_allow_loopback: Option<bool>,
    /// CIDR networks those fetches may reach although they are private or otherwise special
    /// (deliberately internal authorization servers).
    #[serde(default)]
    pub egress_allowed_networks: Vec<String>,
    /// An HTTP CONNECT proxy (`http://host:port`) for those fetches; it resolves names itself
    /// and must refuse internal destinations.
    pub egress_proxy: Option<String>,
}

/// `[pins]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPins {
    /// Every upstream is re-listed (and its pins re-checked) this often. Default 60.
    pub relist_secs: Option<u64>,
    /// How often reviewers' decisions are read from the store. Default 2.
    pub decision_poll_secs: Option<u64>,
    /// An approval counts only with a valid reviewer signature. Default false.
    pub require_signed: Option<bool>,
    /// Reviewer public keys: `{ name = "…", key = "<base64 Ed25519 public key>" }`.
    #[serde(default)]
    pub reviewers: Vec<RawReviewer>,
}

/// One reviewer's public key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReviewer {
    /// The reviewer's name, as given to `pins approve --reviewer`.
    pub name: String,
    /// The base64 32-byte Ed25519 public key.
    pub key: String,
}

/// `[web]` as written: the HTTPS listener of the gateway's browser pages.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeb {
    /// Where to listen. Default `127.0.0.1:8443`; a non-loopback address needs `allow_remote`.
    pub listen: Option<String>,
    /// The pages' `https` origin as a browser reaches them (`https://host[:port]/`). Required.
    pub public_url: Option<String>,
    /// PEM certificate chain of the listener. Required.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the listener. Required.
    pub tls_key_file: Option<PathBuf>,
    /// File holding the operator's review token (at least 16 characters): enables `/review`.
    pub review_token_file: Option<PathBuf>,
    /// Environment variable holding the review token (instead of the file).
    pub review_token_env: Option<String>,
    /// Listen on a non-loopback address. Default false.
    pub allow_remote: Option<bool>,
    /// `user_oauth`: the identity provider people sign in with on the connect page; it must be
    /// the issuer of the callers' tokens (the same string).
    pub sign_in_issuer: Option<String>,
    /// `user_oauth`: the gateway's client id at that provider.
    pub sign_in_client_id: Option<String>,
    /// `user_oauth`: file holding that client's secret (none: a public client).
    pub sign_in_client_secret_file: Option<PathBuf>,
    /// `user_oauth`: environment variable holding that client's secret.
    pub sign_in_client_secret_env: Option<String>,
    /// `user_oauth`: lifetime of a connect link, a sign-in and an authorization `state`, in
    /// seconds. Default 600 (the most).
    pub flow_ttl_secs: Option<u64>,
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

/// `[upstreams.credential]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCredential {
    /// `none` (default), `static`, `client_credentials`, `token_exchange`, `user_oauth`.
    pub kind: Option<String>,
    /// static: the header name. Default `Authorization`.
    pub header: Option<String>,
    /// static: text before the secret. Default `Bearer ` for `Authorization`, else empty.
    pub prefix: Option<String>,
    /// static: file holding the secret.
    pub secret_file: Option<PathBuf>,
    /// static: environment variable holding the secret.
    pub secret_env: Option<String>,
    /// OAuth: the authorization server's token endpoint.
    pub token_url: Option<String>,
    /// OAuth: the gateway's client id there.
    pub client_id: Option<String>,
    /// OAuth: file holding the client secret.
    pub client_secret_file: Option<PathBuf>,
    /// OAuth: environment variable holding the client secret.
    pub client_secret_env: Option<String>,
    /// OAuth: the minimal scopes asked for.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// client_credentials, user_oauth: the most an upstream's `insufficient_scope` may widen them
    /// to (for user_oauth, with the person's consent).
    #[serde(default)]
    pub max_scopes: Vec<String>,
    /// OAuth: `basic` (default) or `post` client authentication.
    pub auth: Option<String>,
}

/// The validated gateway settings.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// Between prefix and upstream name.
    pub separator: Separator,
    /// Pin re-checking and review.
    pub pins: PinSettings,
    /// The upstreams, in configuration order.
    pub upstreams: Vec<UpstreamSettings>,
    /// Who the sandboxed stdio processes run as.
    pub sandbox: SandboxSettings,
    /// Files and directories no stdio process may see: every secret file of the configuration
    /// (the embedding program adds its configuration file, data directory and key files).
    pub protected_paths: Vec<PathBuf>,
    /// The browser pages' listener (`[web]`), when configured.
    pub web: Option<WebSettings>,
    /// How the gateway fetches URLs that servers and documents supply (the per-user OAuth
    /// client's discovery, token and registration requests).
    pub egress: EgressPolicy,
}

/// The sandbox's identities (used when the gateway runs as root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxSettings {
    /// The first uid handed out; each running process has its own.
    pub uid_base: u32,
    /// The gid of every process.
    pub gid: u32,
}

/// A local stdio server's launch, as configured (resolved and hashed by [`crate::launch`]).
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

/// Validated `[pins]`.
#[derive(Debug, Clone)]
pub struct PinSettings {
    /// Re-listing interval.
    pub relist: Duration,
    /// Decision polling interval.
    pub decision_poll: Duration,
    /// Whether approvals need a reviewer signature.
    pub require_signed: bool,
    /// The reviewers' public keys.
    pub reviewers: ReviewerKeys,
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

/// Validates the sections (`web`: the `[web]` table, when the file has one). No upstreams is an
/// error only for `palisade gateway` (the caller decides); here it is allowed.
pub fn validate(
    gateway: RawGateway,
    pins: RawPins,
    upstreams: Vec<RawUpstream>,
    web: Option<RawWeb>,
) -> Result<GatewaySettings, GatewayConfigError> {
    let separator = match gateway.separator.as_deref() {
        None => Separator::Underscore,
        Some(text) => {
            Separator::parse(text).ok_or_else(|| bad("gateway.separator", "must be \"_\", \"__\" or \".\""))?
        }
    };
    let pins = validate_pins(pins)?;
    let sandbox = SandboxSettings {
        uid_base: gateway.sandbox_uid_base.unwrap_or(600_000),
        gid: gateway.sandbox_gid.unwrap_or(65_534),
    };
    if !(1_000..=4_000_000_000).contains(&sandbox.uid_base) {
        return Err(bad("gateway.sandbox_uid_base", "must be between 1000 and 4000000000"));
    }
    if sandbox.gid == 0 {
        return Err(bad("gateway.sandbox_gid", "must not be 0"));
    }
    let mut ids = BTreeSet::new();
    let mut prefixes = BTreeSet::new();
    let mut unprefixed = 0;
    let mut out = Vec::with_capacity(upstreams.len());
    for (index, raw) in upstreams.into_iter().enumerate() {
        let upstream = validate_upstream(index, raw)?;
        if !ids.insert(upstream.id.clone()) {
            return Err(bad(format!("upstreams[{index}].id"), "duplicate upstream id"));
        }
        match &upstream.prefix {
            None => {
                unprefixed += 1;
                if unprefixed > 1 {
                    return Err(bad(format!("upstreams[{index}].prefix"), "at most one upstream may be unprefixed"));
                }
            }
            Some(prefix) => {
                if !prefixes.insert(prefix.clone()) {
                    return Err(bad(format!("upstreams[{index}].prefix"), "duplicate prefix"));
                }
            }
        }
        out.push(upstream);
    }
    let mut protected_paths = Vec::new();
    for upstream in &out {
        if let CredentialConfig::Static { secret: SecretSource::File(path), .. }
        | CredentialConfig::ClientCredentials { client_secret: SecretSource::File(path), .. }
        | CredentialConfig::TokenExchange { client_secret: SecretSource::File(path), .. } = &upstream.credential
        {
            protected_paths.push(path.clone());
        }
        if let Some(stdio) = &upstream.stdio {
            protected_paths.extend(stdio.env_files.values().cloned());
        }
    }
    let web = web.map(validate_web).transpose()?;
    if let Some(web) = &web {
        protected_paths.push(web.tls_key_file.clone());
        for secret in [&web.review_token, &web.sign_in.as_ref().and_then(|sign_in| sign_in.client_secret.clone())] {
            if let Some(SecretSource::File(path)) = secret {
                protected_paths.push(path.clone());
            }
        }
    }
    if let Some(index) =
        out.iter().position(|upstream| matches!(upstream.credential, CredentialConfig::UserOAuth { .. }))
        && web.as_ref().is_none_or(|web| web.sign_in.is_none())
    {
        return Err(bad(
            format!("upstreams[{index}].credential.kind"),
            "user_oauth needs the gateway's web surface with a sign-in provider ([web] with sign_in_issuer and sign_in_client_id)",
        ));
    }
    let egress = validate_egress(&gateway)?;
    let mut settings =
        GatewaySettings { separator, pins, upstreams: out, sandbox, protected_paths: Vec::new(), web, egress };
    settings.protect(protected_paths);
    Ok(settings)
}

impl GatewaySettings {
    /// Looks every stdio upstream's bare command up on `path` (the running gateway's `PATH`)
    /// instead of this process's, so that what is resolved, hashed and pinned is what that
    /// gateway runs.
    pub fn set_search_path(&mut self, path: Option<&str>) {
        for upstream in &mut self.upstreams {
            if let Some(stdio) = upstream.stdio.as_mut() {
                stdio.search_path = path.map(str::to_owned);
            }
        }
    }

    /// Adds paths no stdio upstream may see or name (the runtime adds its own secret files,
    /// data and audit directories and configuration file to the gateway's).
    pub fn protect(&mut self, paths: impl IntoIterator<Item = PathBuf>) {
        for path in paths {
            if !self.protected_paths.contains(&path) {
                self.protected_paths.push(path);
            }
        }
        for upstream in &mut self.upstreams {
            if let Some(stdio) = upstream.stdio.as_mut() {
                stdio.protected.clone_from(&self.protected_paths);
            }
        }
    }
}

/// The egress policy of the gateway's own fetches: public addresses only, https only, unless
/// the development flag or the allow-list says otherwise.
fn validate_egress(gateway: &RawGateway) -> Result<EgressPolicy, GatewayConfigError> {
    let allowed_networks = gateway
        .egress_allowed_networks
        .iter()
        .map(|cidr| {
            parse_network(cidr)
                .ok_or_else(|| bad("gateway.egress_allowed_networks", format!("{cidr:?} is not a CIDR network")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let proxy = match gateway.egress_proxy.as_deref() {
        None => None,
        Some(text) => Some(
            parse_proxy(text)
                .ok_or_else(|| bad("gateway.egress_proxy", "must be an http(s) URL with a host and no credentials"))?,
        ),
    };
    Ok(EgressPolicy {
        allow_loopback: gateway.egress_allow_loopback.unwrap_or(false),
        allowed_networks,
        proxy,
        ..EgressPolicy::default()
    })
}

/// Validates `[web]`: a loopback `listen` unless `allow_remote`, an `https` origin as
/// `public_url` (the pages live at its root: `__Host-` cookies have `Path=/`), both TLS files,
/// and at most one source of the review token.
pub fn validate_web(raw: RawWeb) -> Result<WebSettings, GatewayConfigError> {
    let listen: SocketAddr = raw
        .listen
        .as_deref()
        .unwrap_or("127.0.0.1:8443")
        .parse()
        .map_err(|_| bad("web.listen", "must be an IP address and port, e.g. 127.0.0.1:8443"))?;
    if !listen.ip().is_loopback() && !raw.allow_remote.unwrap_or(false) {
        return Err(bad("web.listen", "is not a loopback address; set web.allow_remote = true to listen on it"));
    }
    let text = raw.public_url.as_deref().ok_or_else(|| bad("web.public_url", "is required"))?;
    let public_url = Url::parse(text).map_err(|_| bad("web.public_url", "not a URL"))?;
    if public_url.scheme() != "https" || public_url.host_str().is_none() {
        return Err(bad("web.public_url", "must be an https URL with a host"));
    }
    if !public_url.username().is_empty()
        || public_url.password().is_some()
        || public_url.query().is_some()
        || public_url.fragment().is_some()
        || public_url.path() != "/"
    {
        return Err(bad("web.public_url", "must be an origin only (https://host[:port]/): the pages live at its root"));
    }
    let file = |value: Option<PathBuf>, key: &str| match value {
        Some(path) if !path.as_os_str().is_empty() => Ok(path),
        _ => Err(bad(key, "is required")),
    };
    let tls_cert_file = file(raw.tls_cert_file, "web.tls_cert_file")?;
    let tls_key_file = file(raw.tls_key_file, "web.tls_key_file")?;
    let review_token = match (raw.review_token_file, raw.review_token_env) {
        (None, None) => None,
        (Some(path), None) if !path.as_os_str().is_empty() => Some(SecretSource::File(path)),
        (Some(_), None) => return Err(bad("web.review_token_file", "must not be empty")),
        (None, Some(name)) if !name.is_empty() => Some(SecretSource::Env(name)),
        (None, Some(_)) => return Err(bad("web.review_token_env", "must not be empty")),
        (Some(_), Some(_)) => {
            return Err(bad("web.review_token_file", "give the token as a file or an environment variable, not both"));
        }
    };
    let sign_in = match (raw.sign_in_issuer, raw.sign_in_client_id) {
        (None, None) => {
            if raw.sign_in_client_secret_file.is_some() || raw.sign_in_client_secret_env.is_some() {
                return Err(bad("web.sign_in_issuer", "is required with a sign-in client secret"));
            }
            None
        }
        (Some(issuer), Some(client_id)) => {
            let parsed = Url::parse(&issuer).map_err(|_| bad("web.sign_in_issuer", "not a URL"))?;
            if parsed.query().is_some() || parsed.fragment().is_some() || parsed.host().is_none() {
                return Err(bad(
                    "web.sign_in_issuer",
                    "must be an issuer identifier (a URL without query or fragment)",
                ));
            }
            if client_id.is_empty() || client_id.chars().any(char::is_control) {
                return Err(bad("web.sign_in_client_id", "must not be empty or have control characters"));
            }
            let client_secret = match (raw.sign_in_client_secret_file, raw.sign_in_client_secret_env) {
                (None, None) => None,
                (Some(path), None) if !path.as_os_str().is_empty() => Some(SecretSource::File(path)),
                (None, Some(name)) if !name.is_empty() => Some(SecretSource::Env(name)),
                (Some(_), Some(_)) => {
                    return Err(bad(
                        "web.sign_in_client_secret_file",
                        "give the secret as a file or an environment variable, not both",
                    ));
                }
                _ => return Err(bad("web.sign_in_client_secret_file", "must not be empty")),
            };
            Some(SignInSettings { issuer, client_id, client_secret })
        }
        (None, Some(_)) => return Err(bad("web.sign_in_issuer", "is required with sign_in_client_id")),
        (Some(_), None) => return Err(bad("web.sign_in_client_id", "is required with sign_in_issuer")),
    };
    let flow_ttl_secs = match raw.flow_ttl_secs.unwrap_or(DEFAULT_FLOW_TTL_SECS) {
        secs @ 1..=DEFAULT_FLOW_TTL_SECS => secs,
        _ => return Err(bad("web.flow_ttl_secs", "must be 1..=600")),
    };
    Ok(WebSettings { listen, public_url, tls_cert_file, tls_key_file, review_token, sign_in, flow_ttl_secs })
}

fn validate_pins(raw: RawPins) -> Result<PinSettings, GatewayConfigError> {
    let secs = |key: &str, value: Option<u64>, default: u64, max: u64| match value.unwrap_or(default) {
        0 => Err(bad(key, "must be at least 1")),
        n if n > max => Err(bad(key, format!("must be at most {max}"))),
        n => Ok(Duration::from_secs(n)),
    };
    let relist = secs("pins.relist_secs", raw.relist_secs, 60, 86_400)?;
    let decision_poll = secs("pins.decision_poll_secs", raw.decision_poll_secs, 2, 3_600)?;
    let pairs: Vec<(String, String)> = raw.reviewers.into_iter().map(|r| (r.name, r.key)).collect();
    let reviewers = ReviewerKeys::from_pairs(&pairs).map_err(|error| bad("pins.reviewers", error.to_string()))?;
    let require_signed = raw.require_signed.unwrap_or(false);
    if require_signed && reviewers.is_empty() {
        return Err(bad("pins.require_signed", "needs at least one entry in pins.reviewers"));
    }
    Ok(PinSettings { relist, decision_poll, require_signed, reviewers })
}

fn validate_upstream(index: usize, raw: RawUpstream) -> Result<UpstreamSettings, GatewayConfigError> {
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
    for scope in raw.scopes.iter().chain(raw.tool_scopes.values().flatten()) {
        check_scope(scope).map_err(|reason| bad(key("scopes"), reason))?;
    }
    let credential = validate_credential(&key("credential"), raw.credential)?;
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

/// An OAuth scope token (RFC 6749 §3.3: printable ASCII without space, `"` or `\`).
fn check_scope(scope: &str) -> Result<(), &'static str> {
    let valid = !scope.is_empty()
        && scope.len() <= 200
        && scope.bytes().all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b));
    if valid { Ok(()) } else { Err("a scope must be a non-empty RFC 6749 scope token") }
}

fn validate_credential(key: &str, raw: RawCredential) -> Result<CredentialConfig, GatewayConfigError> {
    let field = |name: &str| format!("{key}.{name}");
    let kind = raw.kind.as_deref().unwrap_or("none");
    // Fields that do not belong to the chosen kind are refused: a typo must not leave an
    // upstream silently without the credential the operator meant.
    let present: Vec<&str> = [
        ("header", raw.header.is_some()),
        ("prefix", raw.prefix.is_some()),
        ("secret_file", raw.secret_file.is_some()),
        ("secret_env", raw.secret_env.is_some()),
        ("token_url", raw.token_url.is_some()),
        ("client_id", raw.client_id.is_some()),
        ("client_secret_file", raw.client_secret_file.is_some()),
        ("client_secret_env", raw.client_secret_env.is_some()),
        ("scopes", !raw.scopes.is_empty()),
        ("max_scopes", !raw.max_scopes.is_empty()),
        ("auth", raw.auth.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    let allowed: &[&str] = match kind {
        "none" => &[],
        "static" => &["header", "prefix", "secret_file", "secret_env"],
        "client_credentials" => {
            &["token_url", "client_id", "client_secret_file", "client_secret_env", "scopes", "max_scopes", "auth"]
        }
        "token_exchange" => &["token_url", "client_id", "client_secret_file", "client_secret_env", "scopes", "auth"],
        // Everything else is discovered from the upstream (RFC 9728, RFC 8414).
        "user_oauth" => &["scopes", "max_scopes"],
        _ => return Err(bad(field("kind"), "must be none, static, client_credentials, token_exchange or user_oauth")),
    };
    if let Some(stray) = present.iter().find(|name| !allowed.contains(name)) {
        return Err(bad(field(stray), format!("not used by credential kind {kind}")));
    }
    let secret = |file: Option<PathBuf>, env: Option<String>, file_key: &str| match (file, env) {
        (Some(path), None) => Ok(SecretSource::File(path)),
        (None, Some(name)) if !name.is_empty() => Ok(SecretSource::Env(name)),
        (None, Some(_)) => Err(bad(field(file_key.replace("_file", "_env").as_str()), "must not be empty")),
        (Some(_), Some(_)) => {
            Err(bad(field(file_key), "give the secret as a file or an environment variable, not both"))
        }
        (None, None) => Err(bad(field(file_key), "is required (or its _env form)")),
    };
    let oauth = |raw: &RawCredential| -> Result<(Url, String, ClientAuth), GatewayConfigError> {
        let token_url = raw.token_url.as_deref().ok_or_else(|| bad(field("token_url"), "is required"))?;
        let token_url = Url::parse(token_url).map_err(|_| bad(field("token_url"), "not a URL"))?;
        let loopback = match token_url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(name)) => name == "localhost",
            None => false,
        };
        if !(token_url.scheme() == "https" || (token_url.scheme() == "http" && loopback)) {
            return Err(bad(field("token_url"), "must be https (http only on a loopback address)"));
        }
        let client_id =
            raw.client_id.clone().filter(|id| !id.is_empty()).ok_or_else(|| bad(field("client_id"), "is required"))?;
        let auth = match raw.auth.as_deref() {
            None | Some("basic") => ClientAuth::Basic,
            Some("post") => ClientAuth::Post,
            Some(_) => return Err(bad(field("auth"), "must be basic or post")),
        };
        for scope in raw.scopes.iter().chain(&raw.max_scopes) {
            check_scope(scope).map_err(|reason| bad(field("scopes"), reason))?;
        }
        Ok((token_url, client_id, auth))
    };
    Ok(match kind {
        "static" => {
            let header = raw.header.clone().unwrap_or_else(|| "Authorization".to_owned());
            if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(bad(field("header"), "not a valid header name"));
            }
            let prefix = raw.prefix.clone().unwrap_or_else(|| {
                if header.eq_ignore_ascii_case("authorization") { "Bearer ".to_owned() } else { String::new() }
            });
            CredentialConfig::Static { header, prefix, secret: secret(raw.secret_file, raw.secret_env, "secret_file")? }
        }
        "client_credentials" => {
            let (token_url, client_id, auth) = oauth(&raw)?;
            if let Some(outside) = raw.scopes.iter().find(|s| !raw.max_scopes.is_empty() && !raw.max_scopes.contains(s))
            {
                return Err(bad(
                    field("max_scopes"),
                    format!("must include every scope in scopes (missing {outside:?})"),
                ));
            }
            CredentialConfig::ClientCredentials {
                token_url,
                client_id,
                client_secret: secret(raw.client_secret_file, raw.client_secret_env, "client_secret_file")?,
                scopes: raw.scopes,
                max_scopes: raw.max_scopes,
                auth,
            }
        }
        "user_oauth" => {
            for scope in raw.scopes.iter().chain(&raw.max_scopes) {
                check_scope(scope).map_err(|reason| bad(field("scopes"), reason))?;
            }
            CredentialConfig::UserOAuth { scopes: raw.scopes, max_scopes: raw.max_scopes }
        }
        "token_exchange" => {
            let (token_url, client_id, auth) = oauth(&raw)?;
            CredentialConfig::TokenExchange {
                token_url,
                client_id,
                client_secret: secret(raw.client_secret_file, raw.client_secret_env, "client_secret_file")?,
                scopes: raw.scopes,
                auth,
            }
        }
        _ => CredentialConfig::None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstreams(text: &str) -> Result<GatewaySettings, GatewayConfigError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            gateway: RawGateway,
            #[serde(default)]
            pins: RawPins,
            #[serde(default)]
            upstreams: Vec<RawUpstream>,
            web: Option<RawWeb>,
        }
        let file: File = toml::from_str(text).unwrap();
        validate(file.gateway, file.pins, file.upstreams, file.web)
    }

    fn key_of(text: &str) -> String {
        upstreams(text).unwrap_err().key
    }

    #[test]
    fn a_two_upstream_file_validates() {
        let settings = upstreams(
            r#"
            [[upstreams]]
            id = "files"
            url = "http://127.0.0.1:9001/mcp"
            [[upstreams]]
            id = "tickets"
            url = "https://tickets.example/mcp"
            prefix = ""
            confirm = ["close"]
            [upstreams.credential]
            kind = "client_credentials"
            token_url = "https://as.example/token"
            client_id = "gw"
            client_secret_env = "TICKETS_SECRET"
            scopes = ["tickets:read"]
            max_scopes = ["tickets:read", "tickets:write"]
            "#,
        )
        .unwrap();
        assert_eq!(settings.upstreams[0].prefix.as_deref(), Some("files"));
        assert_eq!(settings.upstreams[1].prefix, None);
        assert!(matches!(settings.upstreams[1].credential, CredentialConfig::ClientCredentials { .. }));
        assert_eq!(settings.separator, Separator::Underscore);
    }

    #[test]
    fn each_bad_value_names_its_key() {
        let one = |extra: &str| format!("[[upstreams]]\nid = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n{extra}");
        assert_eq!(key_of(&one("prefix = \"A_B\"")), "upstreams[0].prefix");
        assert_eq!(key_of(&one("protocol = \"2024\"")), "upstreams[0].protocol");
        assert_eq!(key_of(&one("request_timeout_secs = 0")), "upstreams[0].request_timeout_secs");
        assert_eq!(key_of(&one("max_response_bytes = 1")), "upstreams[0].max_response_bytes");
        assert_eq!(key_of(&one("[upstreams.credential]\nkind = \"magic\"")), "upstreams[0].credential.kind");
        assert_eq!(key_of(&one("[upstreams.credential]\nkind = \"static\"")), "upstreams[0].credential.secret_file");
        assert_eq!(
            key_of(&one("[upstreams.credential]\nkind = \"none\"\ntoken_url = \"https://x\"")),
            "upstreams[0].credential.token_url"
        );
        assert_eq!(
            key_of(&one(
                "[upstreams.credential]\nkind = \"client_credentials\"\ntoken_url = \"http://as.example/t\"\nclient_id = \"x\"\nclient_secret_env = \"S\""
            )),
            "upstreams[0].credential.token_url"
        );
        assert_eq!(key_of("[[upstreams]]\nid = \"Bad_Id\"\nurl = \"http://h/mcp\""), "upstreams[0].id");
        assert_eq!(key_of("[[upstreams]]\nid = \"a\"\nurl = \"http://u:p@h/mcp\""), "upstreams[0].url");
        assert_eq!(key_of("[[upstreams]]\nid = \"a\"\nurl = \"ftp://h/mcp\""), "upstreams[0].url");
        let two = "[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\nprefix = \"\"\n[[upstreams]]\nid = \"b\"\nurl = \"http://h/mcp\"\nprefix = \"\"";
        assert_eq!(key_of(two), "upstreams[1].prefix");
        let dup = "[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\n[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\nprefix = \"b\"";
        assert_eq!(key_of(dup), "upstreams[1].id");
        assert_eq!(key_of("[gateway]\nseparator = \"-\""), "gateway.separator");
        assert_eq!(key_of("[pins]\nrequire_signed = true"), "pins.require_signed");
        assert_eq!(key_of("[pins]\nrelist_secs = 0"), "pins.relist_secs");
    }

    #[test]
    fn a_stdio_upstream_validates_with_its_defaults() {
        let settings = upstreams(
            r#"
            [[upstreams]]
            id = "files"
            command = "node"
            args = ["server.js", "/srv/data"]
            env = ["API_KEY"]
            env_files = { TOKEN = "/run/secrets/token" }
            cwd = "/srv/data"
            grants = [{ path = "/srv/data" }, { path = "/srv/out", rw = true }]
            "#,
        )
        .unwrap();
        let upstream = &settings.upstreams[0];
        assert_eq!(upstream.url.as_str(), "stdio:files");
        let stdio = upstream.stdio.as_ref().unwrap();
        assert_eq!(stdio.confinement, Confinement::Bubblewrap, "confined unless the operator says otherwise");
        assert!(!stdio.network && !stdio.shared);
        assert_eq!(stdio.grants[1], Grant { path: "/srv/out".into(), rw: true });
        assert!(!stdio.grants[0].rw, "read-only unless marked rw");
        assert_eq!(stdio.limits.memory_bytes, 4096 * 1024 * 1024);
        assert_eq!(settings.protected_paths, vec![PathBuf::from("/run/secrets/token")], "env_files are secrets");
        assert_eq!(settings.sandbox, SandboxSettings { uid_base: 600_000, gid: 65_534 });
    }

    #[test]
    fn each_bad_stdio_value_names_its_key() {
        let one = |extra: &str| format!("[[upstreams]]\nid = \"a\"\ncommand = \"/usr/bin/env\"\n{extra}");
        assert_eq!(key_of(&one("url = \"http://h/mcp\"")), "upstreams[0].command");
        assert_eq!(key_of("[[upstreams]]\nid = \"a\""), "upstreams[0].url");
        assert_eq!(key_of("[[upstreams]]\nid = \"a\"\ncommand = \"bin/x\""), "upstreams[0].command");
        assert_eq!(key_of("[[upstreams]]\nid = \"a\"\ncommand = \"/usr/../bin/x\""), "upstreams[0].command");
        assert_eq!(key_of(&one("env = [\"A-B\"]")), "upstreams[0].env[0]");
        assert_eq!(key_of(&one("env = [\"PATH\"]")), "upstreams[0].env[0]");
        assert_eq!(key_of(&one("env = [\"A\", \"A\"]")), "upstreams[0].env[1]");
        assert_eq!(key_of(&one("env = [\"A\"]\nenv_files = { A = \"/x\" }")), "upstreams[0].env_files.A");
        assert_eq!(key_of(&one("env_files = { A = \"rel\" }")), "upstreams[0].env_files.A");
        assert_eq!(key_of(&one("grants = [{ path = \"/\" }]")), "upstreams[0].grants[0].path");
        assert_eq!(key_of(&one("grants = [{ path = \"/a/../etc\" }]")), "upstreams[0].grants[0].path");
        assert_eq!(
            key_of(&one("grants = [{ path = \"/a\" }, { path = \"/a\", rw = true }]")),
            "upstreams[0].grants[1].path"
        );
        assert_eq!(key_of(&one("cwd = \"/srv\"")), "upstreams[0].cwd");
        assert_eq!(key_of(&one("confinement = \"docker\"")), "upstreams[0].confinement");
        assert_eq!(key_of(&one("max_processes = 0")), "upstreams[0].max_processes");
        assert_eq!(key_of(&one("[upstreams.limits]\nmemory_mib = 1")), "upstreams[0].limits.memory_mib");
        assert_eq!(key_of(&one("[upstreams.credential]\nkind = \"static\"")), "upstreams[0].credential.kind");
        let http = "[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\n";
        assert_eq!(key_of(&format!("{http}grants = [{{ path = \"/a\" }}]")), "upstreams[0].grants");
        assert_eq!(key_of(&format!("{http}network = true")), "upstreams[0].network");
        assert_eq!(key_of("[gateway]\nsandbox_uid_base = 0"), "gateway.sandbox_uid_base");
    }

    #[test]
    fn errors_never_show_a_secret_value() {
        let text = "[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\n[upstreams.credential]\nkind = \"static\"\nsecret_env = \"\"";
        let error = upstreams(text).unwrap_err();
        assert_eq!(error.key, "upstreams[0].credential.secret_env");
    }

    const WEB: &str = "[web]\npublic_url = \"https://127.0.0.1:8443/\"\ntls_cert_file = \"/etc/palisade/web.crt\"\ntls_key_file = \"/etc/palisade/web.key\"\n";

    #[test]
    fn a_web_table_validates_loopback_by_default() {
        let settings = upstreams(&format!("{WEB}review_token_file = \"/etc/palisade/review-token\"\n")).unwrap();
        let web = settings.web.unwrap();
        assert_eq!(web.listen, "127.0.0.1:8443".parse().unwrap());
        assert_eq!(web.origin(), "https://127.0.0.1:8443");
        assert_eq!(web.url("/review"), "https://127.0.0.1:8443/review");
        assert_eq!(web.review_token, Some(SecretSource::File("/etc/palisade/review-token".into())));
        assert!(settings.protected_paths.contains(&PathBuf::from("/etc/palisade/web.key")), "the TLS key is a secret");
        assert!(settings.protected_paths.contains(&PathBuf::from("/etc/palisade/review-token")));
        assert!(!settings.protected_paths.contains(&PathBuf::from("/etc/palisade/web.crt")));
        assert!(upstreams("").unwrap().web.is_none(), "no [web]: no listener");
        let env = upstreams(&format!("{WEB}review_token_env = \"REVIEW_TOKEN\"\n")).unwrap();
        assert_eq!(env.web.unwrap().review_token, Some(SecretSource::Env("REVIEW_TOKEN".into())));
        let remote = upstreams(&format!("{WEB}listen = \"0.0.0.0:8443\"\nallow_remote = true\n")).unwrap();
        assert_eq!(remote.web.unwrap().listen, "0.0.0.0:8443".parse().unwrap());
        assert!(upstreams(&format!("{WEB}listen = \"[::1]:9443\"\n")).is_ok(), "IPv6 loopback");
    }

    #[test]
    fn each_bad_web_value_names_its_key() {
        for (extra, key) in [
            ("listen = \"10.0.0.1:8443\"", "web.listen"),
            ("listen = \"0.0.0.0:8443\"\nallow_remote = false", "web.listen"),
            ("listen = \"localhost:8443\"", "web.listen"),
            ("review_token_env = \"\"", "web.review_token_env"),
            ("review_token_file = \"\"", "web.review_token_file"),
            ("review_token_file = \"/t\"\nreview_token_env = \"T\"", "web.review_token_file"),
        ] {
            assert_eq!(key_of(&format!("{WEB}{extra}\n")), key, "{extra}");
        }
        let with_url =
            |url: &str| format!("[web]\npublic_url = \"{url}\"\ntls_cert_file = \"/c\"\ntls_key_file = \"/k\"\n");
        for url in [
            "http://127.0.0.1:8443/",
            "https://127.0.0.1:8443/review",
            "https://user@127.0.0.1:8443/",
            "https://127.0.0.1:8443/?a=b",
            "https://127.0.0.1:8443/#top",
            "not a url",
        ] {
            assert_eq!(key_of(&with_url(url)), "web.public_url", "{url}");
        }
        assert_eq!(key_of("[web]\ntls_cert_file = \"/c\"\ntls_key_file = \"/k\"\n"), "web.public_url");
        assert_eq!(key_of("[web]\npublic_url = \"https://h/\"\ntls_key_file = \"/k\"\n"), "web.tls_cert_file");
        assert_eq!(key_of("[web]\npublic_url = \"https://h/\"\ntls_cert_file = \"/c\"\n"), "web.tls_key_file");
    }

    #[test]
    fn per_tool_rules_naming_no_listed_tool_are_reported() {
        let text = "[[upstreams]]\nid = \"ops\"\nurl = \"https://ops.example/mcp\"\ndeny = [\"printEnv\", \"get-env\"]\n\
                    tasks = [\"slow\"]\nno_confirm = [\"x\"]\n";
        let settings = upstreams(text).unwrap();
        let upstream = &settings.upstreams[0];
        let unmatched = upstream.unmatched_tool_rules(["get-env", "slow"]);
        assert_eq!(unmatched.len(), 2, "{unmatched:?}");
        assert!(unmatched[0].starts_with("deny names \"printEnv\""), "{unmatched:?}");
        assert!(unmatched[1].starts_with("no_confirm names \"x\""), "{unmatched:?}");
        assert!(upstream.unmatched_tool_rules(["get-env", "slow", "printEnv", "x"]).is_empty());
    }

    #[test]
    fn launchers_that_download_the_server_at_start_are_refused_with_what_to_install() {
        let entry = |command: &str, args: &str| {
            format!("[[upstreams]]\nid = \"files\"\ncommand = \"{command}\"\nargs = [{args}]\n")
        };
        for (command, args) in [
            ("npx", "\"-y\", \"@modelcontextprotocol/server-filesystem\", \"/srv\""),
            ("/usr/local/bin/npx", "\"@modelcontextprotocol/server-filesystem\""),
            ("npm", "\"exec\", \"server\""),
            ("pnpm", "\"dlx\", \"server\""),
            ("uvx", "\"mcp-server-fetch\""),
            ("pipx", "\"run\", \"mcp-server-fetch\""),
            ("uv", "\"tool\", \"run\", \"mcp-server-fetch\""),
            ("bunx", "\"server\""),
        ] {
            let error = upstreams(&entry(command, args)).unwrap_err();
            assert_eq!(error.key, "upstreams[0].command", "{command} {args}");
            assert!(error.reason.contains("downloads the server each time it starts"), "{error}");
            assert!(error.reason.contains("install the server once"), "{error}");
        }
        for (command, args) in [
            ("/opt/mcp/bin/mcp-server-filesystem", "\"/srv\""),
            ("npm", "\"run\", \"start\""),
            ("uv", "\"run\", \"server.py\""),
        ] {
            assert!(upstreams(&entry(command, args)).is_ok(), "{command} {args}");
        }
    }
}
