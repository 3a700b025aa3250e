//! Configuration: a TOML file, then `PALISADE_*` environment overrides, then command-line flags,
//! parsed into raw types and validated once into [`Settings`], which cannot be invalid. A bad
//! value is reported with the name of its key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use palisade_server::{HandlePolicy, LegacyConfig};

use serde::Deserialize;

/// A configuration error, naming the offending key.
#[derive(Debug, thiserror::Error)]
#[error("config: {key}: {reason}")]
pub struct ConfigError {
    /// The key, dotted (`auth.leeway_secs`) or as an environment variable.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

fn bad(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError { key: key.to_owned(), reason: reason.into() }
}

/// The file as written. Every key is optional; unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `demo` or `conformance`.
    pub app: Option<String>,
    /// HTTP listen address.
    pub listen: Option<String>,
    /// The private listener serving `/metrics`. Unset: none.
    pub metrics_listen: Option<String>,
    /// The canonical resource URI of this server (tokens' audience). Default
    /// `http://<listen>/mcp`.
    pub public_url: Option<String>,
    /// Directory for the embedded database, generated keys and the server secret.
    pub data_dir: Option<PathBuf>,
    /// Store URL: `sqlite:<path>` or `postgres://…`. Default `sqlite:<data_dir>/palisade.db`.
    pub store: Option<String>,
    /// File holding the 32-byte server secret (64 hex characters). Default
    /// `<data_dir>/server-secret`, generated on first run.
    pub secret_file: Option<PathBuf>,
    /// Redis or Valkey through which instances fan their server events out to each other.
    pub events_redis: Option<String>,
    /// Limits.
    #[serde(default)]
    pub limits: RawLimits,
    /// HTTP allow-lists.
    #[serde(default)]
    pub http: RawHttp,
    /// Authentication.
    #[serde(default)]
    pub auth: RawAuth,
    /// Explicit application handles.
    #[serde(default)]
    pub handles: RawHandles,
    /// The kill switch.
    #[serde(default)]
    pub killswitch: RawKillSwitch,
    /// The 2025-era session wire beside 2026-07-28.
    #[serde(default)]
    pub legacy: RawLegacy,
    /// OpenTelemetry trace export.
    #[serde(default)]
    pub telemetry: RawTelemetry,
    /// The audit log.
    #[serde(default)]
    pub audit: RawAudit,
    /// `[delegation]`
    #[serde(default)]
    pub delegation: RawDelegation,
    /// The gateway (`app = "gateway"`, `palisade gateway`): names.
    #[serde(default)]
    pub gateway: palisade_gateway::config::RawGateway,
    /// The gateway: pin re-checking and review.
    #[serde(default)]
    pub pins: palisade_gateway::config::RawPins,
    /// The gateway: the MCP servers it fronts.
    #[serde(default)]
    pub upstreams: Vec<palisade_gateway::config::RawUpstream>,
    /// The gateway: the HTTPS listener of its browser pages (the pin review page).
    pub web: Option<palisade_gateway::config::RawWeb>,
}

/// `[audit]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAudit {
    /// How often the HTTP transport's aggregated refusals are written to the audit log, in
    /// seconds. Default 10.
    pub transport_refusal_interval_secs: Option<u64>,
    /// The instance's local audit segment directory. Default `<data_dir>/audit-segment`.
    pub segment_dir: Option<PathBuf>,
    /// `process` (default) or `power`.
    pub durability: Option<String>,
    /// How often a checkpoint is signed (when anything changed), in seconds. Default 1.
    pub checkpoint_interval_secs: Option<u64>,
}

/// `[delegation]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDelegation {
    /// Accept delegation capabilities and offer the delegation tools. Default false.
    pub enabled: Option<bool>,
    /// Deepest chain (a root is depth 0). Default 3.
    pub max_depth: Option<u64>,
    /// Largest call budget of a root capability. Default 1000.
    pub max_calls: Option<u64>,
    /// Longest lifetime of a capability, in seconds. Default 3600.
    pub max_lifetime_secs: Option<u64>,
}

/// `[telemetry]`. Collector credentials are never read from the file: see
/// `PALISADE_TELEMETRY_OTLP_HEADERS` and `otlp_headers_file`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// OTLP/HTTP (protobuf) collector base URL, e.g. `http://127.0.0.1:4318`; `/v1/traces` is
    /// appended unless the path already ends with it. Unset: no export.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans. Default `palisade`.
    pub service_name: Option<String>,
    /// Fraction of new traces sampled, 0.0–1.0. Default 1.0. A continued trace follows the
    /// caller's sampled flag.
    pub sampling_ratio: Option<f64>,
    /// A file of `Name: value` lines sent as headers to the collector (credentials).
    pub otlp_headers_file: Option<PathBuf>,
    /// Whether a request's `_meta.traceparent` is continued (its trace id becomes the audit
    /// trace id). Default `true`; `false` starts a trace per request.
    pub continue_incoming_traces: Option<bool>,
    /// `PALISADE_TELEMETRY_OTLP_HEADERS` (environment only): `name=value` pairs, comma-separated.
    #[serde(skip)]
    pub otlp_headers: Option<String>,
}

/// `[legacy]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLegacy {
    /// Serve `initialize` and `Mcp-Session-Id` sessions (2025-11-25, 2025-06-18). Default on.
    pub enabled: Option<bool>,
    /// The revisions accepted, newest first. Default `["2025-11-25", "2025-06-18"]`.
    pub versions: Option<Vec<String>>,
    /// A session dies after this many seconds without a request. Default 1800.
    pub idle_timeout_secs: Option<u64>,
    /// A session dies this many seconds after `initialize`. Default 43200.
    pub absolute_timeout_secs: Option<u64>,
}

/// `[killswitch]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKillSwitch {
    /// `off`, `dev` (generated keys and an in-process development authority in the data
    /// directory) or `authority` (an external authority; the files below). Default: `dev` for
    /// the demo, `off` for the conformance fixture.
    pub mode: Option<String>,
    /// The release this server reports as its `server_release` target. Default: the binary's
    /// version.
    pub server_release: Option<String>,
    /// The policy root public key file.
    pub root_public_key: Option<PathBuf>,
    /// The signed policy envelope file.
    pub policy: Option<PathBuf>,
    /// The key trust root directory (holds the authority public key the policy pins).
    pub key_trust_root: Option<PathBuf>,
    /// The authority's `https://host:port` URL.
    pub authority_url: Option<String>,
    /// CA bundle (PEM): the only trust anchors for the authority's certificate.
    pub authority_ca: Option<PathBuf>,
    /// This server's client certificate chain (PEM).
    pub client_cert: Option<PathBuf>,
    /// This server's client key (PEM).
    pub client_key: Option<PathBuf>,
    /// Generation store: `sqlite:<path>` or `redis://…`. Default `sqlite:<data_dir>/killswitch-generations.db`.
    pub generation_store: Option<String>,
    /// The 32-byte target key file (shared with the authority's operators).
    pub target_key_file: Option<PathBuf>,
    /// The authority's SQLite database, when this server shares it (the demo's orders then
    /// redeem commit tokens in their own transaction); also the default of
    /// `palisade authority disable|enable|status --db`.
    pub authority_db: Option<PathBuf>,
    /// How often open listen streams and GET streams re-check their targets, in seconds
    /// (1–3600, default 5); a refusal (DISABLE or any doubt) ends the stream.
    pub stream_recheck_secs: Option<u64>,
    /// `batch` (default: many callers' queries under one signature) or `single` (the v2
    /// envelope, one signed head per target, for authorities without the batch endpoint).
    pub authority_envelope: Option<String>,
}

/// `[handles]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHandles {
    /// File holding the 32-byte subject key (64 hex characters). Default
    /// `<data_dir>/handle-subject-key`, generated on first run. `PALISADE_HANDLES_SUBJECT_KEY`
    /// (64 hex characters) overrides the file.
    pub subject_key_file: Option<PathBuf>,
    /// How long expired or revoked handle rows are kept before the retention job deletes them.
    pub retention_secs: Option<u64>,
    /// Per object type policy, overriding the application's defaults.
    #[serde(default)]
    pub policies: BTreeMap<String, RawHandlePolicy>,
}

/// `[handles.policies.<object type>]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHandlePolicy {
    /// Handle lifetime.
    pub ttl_secs: u64,
    /// Scopes a handle of this type may grant.
    pub allowed_scopes: Vec<String>,
    /// Most scopes per handle.
    pub max_scopes: usize,
    /// Raising it invalidates older handles.
    pub policy_version: i64,
}

/// `[limits]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Largest request body / stdio line.
    pub max_body_bytes: Option<usize>,
    /// Per-request timeout.
    pub request_timeout_secs: Option<u64>,
    /// Items per list page.
    pub page_size: Option<usize>,
    /// Seconds a client has to send a request's whole header section. Default 10.
    pub header_read_timeout_secs: Option<u64>,
    /// Seconds a request's whole body has to arrive in (else 408). Default 30.
    pub body_read_timeout_secs: Option<u64>,
    /// Seconds an HTTP connection may stay open with no request in flight. Default 60.
    pub idle_timeout_secs: Option<u64>,
    /// Most HTTP connections open at once. Default 1024.
    pub max_connections: Option<usize>,
    /// Most open listen and GET streams per principal on one instance. Default 8.
    pub max_streams_per_principal: Option<usize>,
    /// Most entries of one listen filter list (`taskIds`, `resourceSubscriptions`). Default 100.
    pub max_listen_filter_entries: Option<usize>,
}

/// `[http]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    /// Extra accepted `Host` values.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Extra accepted `Origin` values.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
}

/// `[auth]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    /// `bearer` or `none`. Default: `bearer` for the demo, `none` for the conformance fixture.
    pub mode: Option<String>,
    /// The development issuer (`palisade dev token`, and its authorization server): `true` /
    /// `false`, or a `[auth.dev_issuer]` table. Default: on for the demo.
    pub dev_issuer: Option<RawDevIssuer>,
    /// Clock-skew leeway in seconds (at most 60).
    pub leeway_secs: Option<u64>,
    /// Required JOSE `typ`, e.g. `at+jwt`.
    pub required_typ: Option<String>,
    /// Claim naming the tenant.
    pub tenant_claim: Option<String>,
    /// Claim naming the OAuth client.
    pub client_claim: Option<String>,
    /// Verified tokens remembered (keyed by their SHA-256, never past `exp`); 0 disables.
    pub token_cache_capacity: Option<usize>,
    /// Development only: JWKS may be fetched from loopback addresses (plain http there).
    /// Refused on a non-loopback listener.
    pub jwks_allow_loopback: Option<bool>,
    /// CIDR networks a JWKS may be fetched from although they are private (internal issuers).
    #[serde(default)]
    pub jwks_allowed_networks: Vec<String>,
    /// An HTTP CONNECT proxy for JWKS fetches.
    pub jwks_proxy: Option<String>,
    /// Trusted external issuers.
    #[serde(default)]
    pub issuers: Vec<RawIssuer>,
}

/// `[auth] dev_issuer = true|false`, or the `[auth.dev_issuer]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawDevIssuer {
    /// `dev_issuer = true|false`.
    Enabled(bool),
    /// `[auth.dev_issuer]`.
    Table(RawDevIssuerTable),
}

/// `true`/`false` or the table, with the table's own errors (an unknown key, a bad value) kept:
/// an untagged enum would answer every mistake with "did not match any variant".
impl<'de> Deserialize<'de> for RawDevIssuer {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = RawDevIssuer;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("true, false or an [auth.dev_issuer] table")
            }
            fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<RawDevIssuer, E> {
                Ok(RawDevIssuer::Enabled(on))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawDevIssuer, A::Error> {
                RawDevIssuerTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawDevIssuer::Table)
            }
        }
        deserializer.deserialize_any(Either)
    }
}

/// `[auth.dev_issuer]`: the development issuer and its authorization server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDevIssuerTable {
    /// On or off. Default: on for the demo.
    pub enabled: Option<bool>,
    /// Approve every authorization request with the defaults, without the page (tests and
    /// scripts). Refused on a non-loopback listener.
    pub auto_approve: Option<bool>,
    /// Subject pre-filled on the page (and granted by `auto_approve`). Default `alice`.
    pub default_subject: Option<String>,
    /// Tenant pre-filled on the page (and granted by `auto_approve`). Default `acme`.
    pub default_tenant: Option<String>,
    /// Lifetime of access tokens in seconds (60–3600). Default 300.
    pub access_token_ttl_secs: Option<u64>,
    /// Tests only: client metadata documents may be fetched from loopback addresses (and over
    /// plain http there). Refused on a non-loopback listener.
    pub client_metadata_allow_loopback: Option<bool>,
    /// Tests only: extra trust anchors (PEM) for fetching client metadata documents.
    pub client_metadata_ca_file: Option<PathBuf>,
}

impl RawDevIssuer {
    fn enabled(&self) -> Option<bool> {
        match self {
            Self::Enabled(on) => Some(*on),
            Self::Table(table) => table.enabled,
        }
    }

    fn table(&self) -> RawDevIssuerTable {
        match self {
            Self::Enabled(_) => RawDevIssuerTable::default(),
            Self::Table(table) => table.clone(),
        }
    }
}

/// The development authorization server's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevAuthorization {
    /// Skip the page.
    pub auto_approve: bool,
    /// Pre-filled subject.
    pub default_subject: String,
    /// Pre-filled tenant.
    pub default_tenant: String,
    /// Access-token lifetime.
    pub access_token_ttl_secs: u64,
    /// Loopback client metadata documents allowed (tests).
    pub client_metadata_allow_loopback: bool,
    /// Extra trust anchors for client metadata documents (tests).
    pub client_metadata_ca_file: Option<PathBuf>,
}

/// `[[auth.issuers]]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIssuer {
    /// Issuer identifier (`iss`).
    pub issuer: String,
    /// JWKS URL.
    pub jwks_url: String,
    /// Accepted algorithms: ES256, EdDSA, RS256.
    pub algorithms: Vec<String>,
}

/// Which application to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppChoice {
    /// The demo shop.
    Demo,
    /// The conformance fixture.
    Conformance,
    /// The gateway in front of the configured `[[upstreams]]`.
    Gateway,
}

/// How callers are authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMode {
    /// No authentication (loopback and stdio only).
    None,
    /// Bearer JWTs from the configured issuers (and the dev issuer when enabled).
    Bearer,
}

/// A validated external issuer.
#[derive(Debug, Clone)]
pub struct Issuer {
    /// `iss`
    pub issuer: String,
    /// JWKS URL.
    pub jwks_url: String,
    /// Allowed algorithms.
    pub algorithms: Vec<palisade_auth::Algorithm>,
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The application.
    pub app: AppChoice,
    /// HTTP listen address.
    pub listen: SocketAddr,
    /// The private `/metrics` listener's address, when configured.
    pub metrics_listen: Option<SocketAddr>,
    /// Canonical resource URI.
    pub public_url: String,
    /// The Redis or Valkey URL of the event fan-out between instances, when configured.
    pub events_redis: Option<String>,
    /// Data directory.
    pub data_dir: PathBuf,
    /// Store URL.
    pub store: String,
    /// Server secret file.
    pub secret_file: PathBuf,
    /// Largest body.
    pub max_body_bytes: usize,
    /// Request timeout.
    pub request_timeout_secs: u64,
    /// Page size.
    pub page_size: usize,
    /// Header read timeout.
    pub header_read_timeout_secs: u64,
    /// Body read timeout.
    pub body_read_timeout_secs: u64,
    /// Idle connection timeout.
    pub idle_timeout_secs: u64,
    /// Connection cap.
    pub max_connections: usize,
    /// Open streams per principal.
    pub max_streams_per_principal: usize,
    /// Entries per listen filter list.
    pub max_listen_filter_entries: usize,
    /// Interval of the aggregated transport refusal records.
    pub transport_refusal_interval_secs: u64,
    /// The local audit segment directory.
    pub audit_segment_dir: PathBuf,
    /// Whether an audit append waits for `fdatasync`.
    pub audit_durability: palisade_store::segment::Durability,
    /// Interval of the checkpoint signer.
    pub audit_checkpoint_interval_secs: u64,
    /// Extra hosts.
    pub allowed_hosts: Vec<String>,
    /// Extra origins.
    pub allowed_origins: Vec<String>,
    /// Authentication mode.
    pub auth_mode: AuthMode,
    /// Whether the dev issuer is on.
    pub dev_issuer: bool,
    /// Why it is on or off (printed by `palisade config check` and at start).
    pub dev_issuer_why: &'static str,
    /// Its authorization server.
    pub dev_authorization: DevAuthorization,
    /// Leeway.
    pub leeway_secs: u64,
    /// Required `typ`.
    pub required_typ: Option<String>,
    /// Tenant claim.
    pub tenant_claim: String,
    /// Client claim.
    pub client_claim: String,
    /// Verified-token cache size (0 = off).
    pub token_cache_capacity: usize,
    /// JWKS from loopback addresses allowed (development).
    pub jwks_allow_loopback: bool,
    /// Networks JWKS may be fetched from although private (CIDR, checked by the verifier).
    pub jwks_allowed_networks: Vec<String>,
    /// The egress proxy of JWKS fetches.
    pub jwks_proxy: Option<String>,
    /// External issuers.
    pub issuers: Vec<Issuer>,
    /// The handle subject key file.
    pub handle_subject_key_file: PathBuf,
    /// Retention of dead handle rows.
    pub handle_retention: Duration,
    /// Handle policies by object type.
    pub handle_policies: BTreeMap<String, HandlePolicy>,
    /// The kill switch.
    pub killswitch: KillSwitchSettings,
    /// The 2025-era session wire.
    pub legacy: LegacyConfig,
    /// `[delegation]`: `Some` when enabled.
    pub delegation: Option<palisade_server::delegation::DelegationConfig>,
    /// Trace export, when a collector is configured.
    pub telemetry: Option<TelemetrySettings>,
    /// `telemetry.otlp_headers_file` (collector credentials), kept from stdio upstreams.
    pub telemetry_headers_file: Option<PathBuf>,
    /// The gateway's upstreams and pins (`app = "gateway"` only).
    pub gateway: Option<palisade_gateway::config::GatewaySettings>,
}

/// Validated trace export settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetrySettings {
    /// The full OTLP/HTTP traces URL (`…/v1/traces`).
    pub traces_url: String,
    /// `service.name`.
    pub service_name: String,
    /// Ratio of new traces sampled.
    pub sampling_ratio: f64,
    /// Headers for the collector (secrets: never printed).
    pub headers: CollectorHeaders,
    /// Continue callers' W3C trace context.
    pub continue_incoming_traces: bool,
}

/// Collector headers. `Debug` shows the names only; values may be credentials.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CollectorHeaders(pub Vec<(String, String)>);

impl std::fmt::Debug for CollectorHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(name, _)| format!("{name}: <redacted>"))).finish()
    }
}

/// The largest header file read.
const MAX_HEADERS_FILE_BYTES: u64 = 64 * 1024;

/// The largest accepted `limits.max_connections`.
const MAX_CONNECTIONS: usize = 100_000;

/// Checks one collector header. Errors never echo the value.
fn collector_header(key: &str, name: &str, value: &str) -> Result<(String, String), ConfigError> {
    let name = name.trim();
    let value = value.trim();
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(bad(key, "a header name is empty or not an HTTP token"));
    }
    if value.is_empty() || !value.chars().all(|c| c == '\t' || (' '..='~').contains(&c)) {
        return Err(bad(key, format!("the value of header `{name}` is empty or not visible ASCII")));
    }
    Ok((name.to_ascii_lowercase(), value.to_owned()))
}

/// `name=value,name=value` (the environment form).
fn parse_header_pairs(key: &str, text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').ok_or_else(|| bad(key, "expected name=value pairs"))?;
            collector_header(key, name, value)
        })
        .collect()
}

/// `Name: value` lines; blank lines and `#` comments ignored (the file form).
fn parse_header_lines(key: &str, text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.trim_start().starts_with('#'))
        .map(|line| {
            let (name, value) = line.split_once(':').ok_or_else(|| bad(key, "expected `Name: value` lines"))?;
            collector_header(key, name, value)
        })
        .collect()
}

/// The traces URL of an OTLP/HTTP endpoint: http(s), a host, no credentials, query or fragment;
/// `/v1/traces` appended to a base URL.
fn traces_url(key: &str, endpoint: &str) -> Result<String, ConfigError> {
    let mut url = url::Url::parse(endpoint.trim()).map_err(|_| bad(key, "must be an absolute http(s) URL"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad(key, "must be an http:// or https:// URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(key, "must not carry credentials; use PALISADE_TELEMETRY_OTLP_HEADERS or otlp_headers_file"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad(key, "must not have a query or a fragment"));
    }
    if !url.path().ends_with("/v1/traces") {
        let path = format!("{}/v1/traces", url.path().trim_end_matches('/'));
        url.set_path(&path);
    }
    Ok(url.into())
}

/// `true`/`false` (also `1`/`0`, `on`/`off`), any case, for an environment override.
fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "on" => Ok(true),
        "false" | "0" | "off" => Ok(false),
        _ => Err(bad(key, "must be true or false")),
    }
}

fn validate_telemetry(raw: RawTelemetry) -> Result<Option<TelemetrySettings>, ConfigError> {
    let service_name = raw.service_name.unwrap_or_else(|| "palisade".into());
    if service_name.trim().is_empty() || service_name.len() > 255 || service_name.chars().any(char::is_control) {
        return Err(bad(TELEMETRY_SERVICE_NAME.key, "must be 1-255 printable characters"));
    }
    let sampling_ratio = raw.sampling_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sampling_ratio) {
        return Err(bad(TELEMETRY_SAMPLING_RATIO.key, "must be between 0.0 and 1.0"));
    }
    let mut headers = Vec::new();
    if let Some(text) = &raw.otlp_headers {
        headers.extend(parse_header_pairs("PALISADE_TELEMETRY_OTLP_HEADERS", text)?);
    }
    if let Some(path) = &raw.otlp_headers_file {
        use std::io::Read as _;
        let key = TELEMETRY_OTLP_HEADERS_FILE.key;
        let file = std::fs::File::open(path).map_err(|e| bad(key, format!("cannot read {}: {e}", path.display())))?;
        let mut text = String::new();
        file.take(MAX_HEADERS_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|_| bad(key, format!("{} is not readable UTF-8 text", path.display())))?;
        if text.len() as u64 > MAX_HEADERS_FILE_BYTES {
            return Err(bad(key, "is larger than 64 KiB"));
        }
        headers.extend(parse_header_lines(key, &text)?);
    }
    let Some(endpoint) = raw.otlp_endpoint else { return Ok(None) };
    Ok(Some(TelemetrySettings {
        traces_url: traces_url(TELEMETRY_OTLP_ENDPOINT.key, &endpoint)?,
        service_name,
        sampling_ratio,
        headers: CollectorHeaders(headers),
        continue_incoming_traces: raw.continue_incoming_traces.unwrap_or(true),
    }))
}

fn validate_delegation(
    raw: RawDelegation,
) -> Result<Option<palisade_server::delegation::DelegationConfig>, ConfigError> {
    let defaults = palisade_server::delegation::DelegationConfig::default();
    let depth = raw.max_depth.unwrap_or(u64::from(defaults.max_depth));
    if !(1..=u64::from(palisade_store::MAX_DELEGATION_DEPTH)).contains(&depth) {
        return Err(bad(DELEGATION_MAX_DEPTH.key, "must be between 1 and 16"));
    }
    let calls = raw.max_calls.unwrap_or(defaults.max_calls.cast_unsigned());
    if !(1..=1_000_000).contains(&calls) {
        return Err(bad(DELEGATION_MAX_CALLS.key, "must be between 1 and 1000000"));
    }
    let lifetime = raw.max_lifetime_secs.unwrap_or(defaults.max_lifetime.as_secs());
    if !(60..=30 * 86_400).contains(&lifetime) {
        return Err(bad(DELEGATION_MAX_LIFETIME_SECS.key, "must be between 60 and 2592000"));
    }
    if !raw.enabled.unwrap_or(false) {
        return Ok(None);
    }
    Ok(Some(palisade_server::delegation::DelegationConfig {
        max_depth: u32::try_from(depth).unwrap_or(3),
        max_calls: i64::try_from(calls).unwrap_or(1000),
        max_lifetime: Duration::from_secs(lifetime),
        ..defaults
    }))
}

fn validate_legacy(raw: RawLegacy) -> Result<LegacyConfig, ConfigError> {
    let defaults = LegacyConfig::default();
    let versions = match raw.versions {
        None => defaults.versions.clone(),
        Some(versions) => {
            if versions.is_empty() {
                return Err(bad(
                    LEGACY_VERSIONS.key,
                    "must name at least one revision (or set legacy.enabled = false)",
                ));
            }
            if let Some(unknown) = versions.iter().find(|v| !palisade_wire::LEGACY_VERSIONS.contains(&v.as_str())) {
                return Err(bad(
                    LEGACY_VERSIONS.key,
                    format!("`{unknown}` is not a supported earlier revision; use 2025-11-25 or 2025-06-18"),
                ));
            }
            versions
        }
    };
    let idle = raw.idle_timeout_secs.unwrap_or(defaults.idle_timeout.as_secs());
    if !(10..=86_400).contains(&idle) {
        return Err(bad(LEGACY_IDLE_TIMEOUT_SECS.key, "must be between 10 and 86400"));
    }
    let absolute = raw.absolute_timeout_secs.unwrap_or(defaults.absolute_timeout.as_secs());
    if !(idle..=7 * 86_400).contains(&absolute) {
        return Err(bad(LEGACY_ABSOLUTE_TIMEOUT_SECS.key, "must be at least the idle timeout and at most 604800"));
    }
    Ok(LegacyConfig {
        enabled: raw.enabled.unwrap_or(defaults.enabled),
        versions,
        idle_timeout: Duration::from_secs(idle),
        absolute_timeout: Duration::from_secs(absolute),
        ..defaults
    })
}

/// How the kill switch runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillSwitchMode {
    /// No kill switch.
    Off,
    /// Generated keys, certificates and policy in `dir`, and an in-process authority on loopback.
    Dev {
        /// `<data_dir>/killswitch-dev`.
        dir: PathBuf,
    },
    /// An external authority.
    Authority(Box<ExternalAuthority>),
}

/// The files and endpoints of an external authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalAuthority {
    /// Policy root public key.
    pub root_public_key: PathBuf,
    /// Signed policy.
    pub policy: PathBuf,
    /// Key trust root.
    pub key_trust_root: PathBuf,
    /// `https://…`
    pub authority_url: String,
    /// CA bundle.
    pub authority_ca: PathBuf,
    /// Client certificate.
    pub client_cert: PathBuf,
    /// Client key.
    pub client_key: PathBuf,
    /// Generation store URL.
    pub generation_store: String,
    /// Target key file.
    pub target_key_file: PathBuf,
    /// The authority database, when shared.
    pub authority_db: Option<PathBuf>,
}

/// Validated kill-switch settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillSwitchSettings {
    /// The mode.
    pub mode: KillSwitchMode,
    /// The `server_release` target value.
    pub server_release: String,
    /// `killswitch.stream_recheck_secs`.
    pub stream_recheck: Duration,
    /// `killswitch.authority_envelope = "single"`.
    pub single_envelope: bool,
}

fn validate_killswitch(
    raw: RawKillSwitch,
    app: AppChoice,
    data_dir: &std::path::Path,
) -> Result<KillSwitchSettings, ConfigError> {
    let default_mode = if app == AppChoice::Demo { "dev" } else { "off" };
    let server_release = raw.server_release.unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned());
    if server_release.trim().is_empty() || server_release.len() > 128 {
        return Err(bad(KILLSWITCH_SERVER_RELEASE.key, "must be 1-128 characters"));
    }
    let mode = match raw.mode.as_deref().unwrap_or(default_mode) {
        "off" => KillSwitchMode::Off,
        "dev" => KillSwitchMode::Dev { dir: data_dir.join("killswitch-dev") },
        "authority" => {
            let required = |value: Option<PathBuf>, spec: &OptionSpec| {
                value.ok_or_else(|| bad(spec.key, "required in authority mode"))
            };
            let authority_url =
                raw.authority_url.ok_or_else(|| bad(KILLSWITCH_AUTHORITY_URL.key, "required in authority mode"))?;
            if !authority_url.starts_with("https://") || url::Url::parse(&authority_url).is_err() {
                return Err(bad(KILLSWITCH_AUTHORITY_URL.key, "must be an https:// URL"));
            }
            let generation_store = raw
                .generation_store
                .unwrap_or_else(|| format!("sqlite:{}", data_dir.join("killswitch-generations.db").display()));
            if !(generation_store.starts_with("sqlite:")
                || generation_store.starts_with("redis://")
                || generation_store.starts_with("rediss://"))
            {
                return Err(bad(KILLSWITCH_GENERATION_STORE.key, "must be sqlite:<path> or redis://…"));
            }
            KillSwitchMode::Authority(Box::new(ExternalAuthority {
                root_public_key: required(raw.root_public_key, &KILLSWITCH_ROOT_PUBLIC_KEY)?,
                policy: required(raw.policy, &KILLSWITCH_POLICY)?,
                key_trust_root: required(raw.key_trust_root, &KILLSWITCH_KEY_TRUST_ROOT)?,
                authority_url,
                authority_ca: required(raw.authority_ca, &KILLSWITCH_AUTHORITY_CA)?,
                client_cert: required(raw.client_cert, &KILLSWITCH_CLIENT_CERT)?,
                client_key: required(raw.client_key, &KILLSWITCH_CLIENT_KEY)?,
                generation_store,
                target_key_file: required(raw.target_key_file, &KILLSWITCH_TARGET_KEY_FILE)?,
                authority_db: raw.authority_db,
            }))
        }
        other => {
            return Err(bad(KILLSWITCH_MODE.key, format!("unknown mode `{other}`; expected off, dev or authority")));
        }
    };
    let recheck = raw.stream_recheck_secs.unwrap_or(5);
    if !(1..=3600).contains(&recheck) {
        return Err(bad(KILLSWITCH_STREAM_RECHECK_SECS.key, "must be between 1 and 3600"));
    }
    let single_envelope = match raw.authority_envelope.as_deref().unwrap_or("batch") {
        "batch" => false,
        "single" => true,
        _ => return Err(bad(KILLSWITCH_AUTHORITY_ENVELOPE.key, "must be batch or single")),
    };
    Ok(KillSwitchSettings { mode, server_release, stream_recheck: Duration::from_secs(recheck), single_envelope })
}

/// Parses TOML text.
pub fn parse(text: &str) -> Result<RawConfig, ConfigError> {
    let syntax = |e: toml::de::Error| {
        let key = e.span().and_then(|span| key_at(text, span.start));
        bad(&key.unwrap_or_else(|| "(file)".to_owned()), e.message().to_owned())
    };
    let deserializer = toml::Deserializer::parse(text).map_err(syntax)?;
    // The path of the key being read when an error happened (`pins.relist_sec`,
    // `upstreams[1].prefix`): serde's own errors name only the last part.
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().message().to_owned();
        let unknown = message.strip_prefix("unknown field `").and_then(|rest| rest.split('`').next());
        let key = match unknown {
            // The path ends at the table holding the unknown key (or at the key itself).
            Some(name) if path == "." || path.is_empty() => name.to_owned(),
            Some(name) if path.ends_with(name) => path,
            Some(name) => format!("{path}.{name}"),
            None if path == "." || path.is_empty() => {
                e.inner().span().and_then(|span| key_at(text, span.start)).unwrap_or_else(|| "(file)".to_owned())
            }
            None => path,
        };
        let reason = match unknown.and_then(|name| closest(name, &expected_names(&message))) {
            Some(near) => format!("unknown key; did you mean `{near}`? ({message})"),
            None if unknown.is_some() => format!("unknown key ({message})"),
            None => message,
        };
        bad(&key, reason)
    })
}

/// The names in serde's "expected one of `a`, `b`" (or "expected `a`") tail of an error.
fn expected_names(message: &str) -> Vec<&str> {
    let Some((_, tail)) = message.split_once("expected") else { return Vec::new() };
    tail.split('`').skip(1).step_by(2).collect()
}

/// The candidate nearest to `name`, when it is close enough to be a typo of it.
fn closest<'a>(name: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|candidate| (strsim::jaro_winkler(name, candidate), *candidate))
        .filter(|(similarity, _)| *similarity >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

/// The dotted key of the `name = value` line holding byte `at` of `text`: the table header above
/// it, if any, and the name.
fn key_at(text: &str, at: usize) -> Option<String> {
    let line_start = text.get(..at)?.rfind('\n').map_or(0, |newline| newline + 1);
    let line = text.get(line_start..)?.lines().next()?;
    let (name, _) = line.split_once('=')?;
    let name = name.trim().trim_matches('"');
    if name.is_empty() || name.starts_with('[') {
        return None;
    }
    let table = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|line| line.starts_with('['))
        .map(|header| header.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    Some(match table {
        Some(table) => format!("{table}.{name}"),
        None => name.to_owned(),
    })
}

/// What an option's value is: the flag's value name and the shape tests give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string.
    Text,
    /// A file or directory path.
    Path,
    /// A non-negative integer.
    Integer,
    /// A decimal number.
    Number,
    /// `true` or `false` (in the environment also `1`/`0`, `on`/`off`).
    Bool,
    /// A list of strings (a flag is repeated, each adding one).
    List,
    /// A table (or an array of tables) whose keys are listed after it.
    Table,
}

impl Kind {
    fn value_name(self) -> &'static str {
        match self {
            Self::Text | Self::List | Self::Table => "VALUE",
            Self::Path => "PATH",
            Self::Integer | Self::Number => "N",
            Self::Bool => "BOOL",
        }
    }
}

/// An option's default, as documented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Unset unless configured.
    Unset,
    /// This value, written as in the environment (a test checks it is the one applied).
    Value(&'static str),
    /// A default that depends on other settings, in words.
    Described(&'static str),
}

/// Sets an option from a string (an environment variable or a flag); `source` (the variable or
/// the flag) names it in errors.
pub type Setter = fn(&mut RawConfig, &str, &str) -> Result<(), ConfigError>;

/// One configuration option, defined once: its file key, environment variable, flag, default and
/// meaning. The environment overlay, the flags of `serve` and `dev token`, the validation errors
/// and the option list (`palisade config options`, README) all read [`OPTIONS`].
#[derive(Debug, Clone, Copy)]
pub struct OptionSpec {
    /// The dotted file key (`auth.token_cache_capacity`); also what validation errors name.
    pub key: &'static str,
    /// The `PALISADE_*` environment variable, if any.
    pub env: Option<&'static str>,
    /// The long flag (without `--`) of `serve` and `dev token`, if any.
    pub flag: Option<&'static str>,
    /// The value's shape.
    pub kind: Kind,
    /// The default.
    pub default: Fallback,
    /// What it does (one paragraph of Markdown).
    pub doc: &'static str,
    /// `false`: environment only, refused in the file (credentials).
    pub in_file: bool,
    /// A path no stdio upstream of the gateway may ever see (a secret, a key, the store, the
    /// audit log): [`Settings::protected_option_paths`] gives its value.
    pub protected: bool,
    /// Applies an environment or flag value; `None` when the option has neither.
    set: Option<Setter>,
}

const fn opt(key: &'static str, kind: Kind, doc: &'static str) -> OptionSpec {
    OptionSpec {
        key,
        env: None,
        flag: None,
        kind,
        default: Fallback::Unset,
        doc,
        in_file: true,
        protected: false,
        set: None,
    }
}

impl OptionSpec {
    const fn env(mut self, name: &'static str, set: Setter) -> Self {
        self.env = Some(name);
        self.set = Some(set);
        self
    }

    /// An environment variable the command reads itself (no [`Setter`]).
    const fn variable(mut self, name: &'static str) -> Self {
        self.env = Some(name);
        self
    }

    const fn flag(mut self, flag: &'static str, set: Setter) -> Self {
        self.flag = Some(flag);
        self.set = Some(set);
        self
    }

    const fn default(mut self, value: &'static str) -> Self {
        self.default = Fallback::Value(value);
        self
    }

    const fn described(mut self, default: &'static str) -> Self {
        self.default = Fallback::Described(default);
        self
    }

    const fn env_only(mut self) -> Self {
        self.in_file = false;
        self
    }

    /// Marks a path option as one no stdio upstream may see.
    const fn protected(mut self) -> Self {
        self.protected = true;
        self
    }
}

fn integer(source: &str, value: &str) -> Result<u64, ConfigError> {
    value.parse::<u64>().map_err(|_| bad(source, "must be a non-negative integer"))
}

fn size(source: &str, value: &str) -> Result<usize, ConfigError> {
    usize::try_from(integer(source, value)?).map_err(|_| bad(source, "too large"))
}

fn number(source: &str, value: &str) -> Result<f64, ConfigError> {
    value.trim().parse::<f64>().map_err(|_| bad(source, "must be a number"))
}

/// A [`Setter`] writing one field of [`RawConfig`], converting the string as its kind says.
macro_rules! set {
    (text $($field:ident).+) => {
        (|raw: &mut RawConfig, _: &str, v: &str| {
            raw.$($field).+ = Some(v.to_owned());
            Ok(())
        }) as Setter
    };
    (path $($field:ident).+) => {
        (|raw: &mut RawConfig, _: &str, v: &str| {
            raw.$($field).+ = Some(PathBuf::from(v));
            Ok(())
        }) as Setter
    };
    (u64 $($field:ident).+) => {
        (|raw: &mut RawConfig, source: &str, v: &str| {
            raw.$($field).+ = Some(integer(source, v)?);
            Ok(())
        }) as Setter
    };
    (usize $($field:ident).+) => {
        (|raw: &mut RawConfig, source: &str, v: &str| {
            raw.$($field).+ = Some(size(source, v)?);
            Ok(())
        }) as Setter
    };
    (f64 $($field:ident).+) => {
        (|raw: &mut RawConfig, source: &str, v: &str| {
            raw.$($field).+ = Some(number(source, v)?);
            Ok(())
        }) as Setter
    };
    (bool $($field:ident).+) => {
        (|raw: &mut RawConfig, source: &str, v: &str| {
            raw.$($field).+ = Some(parse_bool(source, v)?);
            Ok(())
        }) as Setter
    };
    (append $($field:ident).+) => {
        (|raw: &mut RawConfig, _: &str, v: &str| {
            raw.$($field).+.push(v.to_owned());
            Ok(())
        }) as Setter
    };
}

/// `PALISADE_DEV_ISSUER`: on or off, keeping a `[auth.dev_issuer]` table's other keys.
fn set_dev_issuer(raw: &mut RawConfig, source: &str, value: &str) -> Result<(), ConfigError> {
    let on = parse_bool(source, value)?;
    raw.auth.dev_issuer = Some(match raw.auth.dev_issuer.take() {
        Some(RawDevIssuer::Table(table)) => RawDevIssuer::Table(RawDevIssuerTable { enabled: Some(on), ..table }),
        _ => RawDevIssuer::Enabled(on),
    });
    Ok(())
}

/// `PALISADE_DEV_ISSUER_AUTO_APPROVE`: `auth.dev_issuer.auto_approve`, keeping `enabled`.
fn set_dev_auto_approve(raw: &mut RawConfig, source: &str, value: &str) -> Result<(), ConfigError> {
    let on = parse_bool(source, value)?;
    let mut table = raw.auth.dev_issuer.as_ref().map(RawDevIssuer::table).unwrap_or_default();
    table.enabled = table.enabled.or(raw.auth.dev_issuer.as_ref().and_then(RawDevIssuer::enabled));
    table.auto_approve = Some(on);
    raw.auth.dev_issuer = Some(RawDevIssuer::Table(table));
    Ok(())
}

/// Declares each option as a constant (validation names its key through it) and lists them all,
/// in order, in [`OPTIONS`].
macro_rules! options {
    ($($name:ident = $spec:expr;)*) => {
        $(pub const $name: OptionSpec = $spec;)*
        /// Every option, in the order they are documented and the environment is applied.
        pub const OPTIONS: &[OptionSpec] = &[$($name),*];
    };
}

options! {
    APP = opt("app", Kind::Text, "The application to serve: `demo` (the tea shop) or `conformance` (the fixture of the official conformance suite).")
        .env("PALISADE_APP", set!(text app)).flag("app", set!(text app)).default("demo");
    LISTEN = opt("listen", Kind::Text, "The HTTP listen address (IP and port). Without authentication only loopback addresses are allowed.")
        .env("PALISADE_LISTEN", set!(text listen)).flag("listen", set!(text listen)).default("127.0.0.1:8080");
    METRICS_LISTEN = opt("metrics_listen", Kind::Text, "A private HTTP listener (IP and port) serving `/metrics`, `/healthz` and `/readyz` with no authentication: bind it to loopback or an internal address. Unset: `/metrics` is served nowhere. Not with `--stdio`.")
        .env("PALISADE_METRICS_LISTEN", set!(text metrics_listen)).flag("metrics-listen", set!(text metrics_listen));
    PUBLIC_URL = opt("public_url", Kind::Text, "The canonical resource URI of this server: the audience tokens must be issued for, and the origin of the development issuer.")
        .env("PALISADE_PUBLIC_URL", set!(text public_url)).flag("public-url", set!(text public_url)).described("`http://<listen>/mcp`");
    DATA_DIR = opt("data_dir", Kind::Path, "Directory for the embedded database, generated keys and the server secret.")
        .env("PALISADE_DATA_DIR", set!(path data_dir)).flag("data-dir", set!(path data_dir)).default("palisade-data")
        .protected();
    STORE = opt("store", Kind::Text, "The store: `sqlite:<path>` or `postgres://…`.")
        .env("PALISADE_STORE", set!(text store)).flag("store", set!(text store)).described("`sqlite:<data_dir>/palisade.db`");
    SECRET_FILE = opt("secret_file", Kind::Path, "File holding the 32-byte server secret (64 hex characters), generated on first run.")
        .env("PALISADE_SECRET_FILE", set!(path secret_file)).described("`<data_dir>/server-secret`")
        .protected();
    EVENTS_REDIS = opt("events_redis", Kind::Text, "A Redis or Valkey URL (`redis://…`, `rediss://…`) through which instances sharing a store hand each other their server events (list changes, resource updates, task changes, revocations) for their listen streams, on a channel named by `public_url`. Unset: events reach only the instance that raised them.")
        .env("PALISADE_EVENTS_REDIS", set!(text events_redis));
    LIMITS_MAX_BODY_BYTES = opt("limits.max_body_bytes", Kind::Integer, "Largest request body (HTTP) or line (stdio), in bytes (1024–67108864).")
        .env("PALISADE_MAX_BODY_BYTES", set!(usize limits.max_body_bytes)).flag("max-body-bytes", set!(usize limits.max_body_bytes)).default("1048576");
    LIMITS_REQUEST_TIMEOUT_SECS = opt("limits.request_timeout_secs", Kind::Integer, "Per-request timeout in seconds (1–600).")
        .env("PALISADE_REQUEST_TIMEOUT_SECS", set!(u64 limits.request_timeout_secs)).flag("request-timeout-secs", set!(u64 limits.request_timeout_secs)).default("60");
    LIMITS_PAGE_SIZE = opt("limits.page_size", Kind::Integer, "Items per page of every list method (1–1000).")
        .flag("page-size", set!(usize limits.page_size)).default("100");
    LIMITS_HEADER_READ_TIMEOUT_SECS = opt("limits.header_read_timeout_secs", Kind::Integer, "Seconds a client has to send a request's whole header section (1–300), else the connection is closed.")
        .env("PALISADE_LIMITS_HEADER_READ_TIMEOUT_SECS", set!(u64 limits.header_read_timeout_secs)).default("10");
    LIMITS_BODY_READ_TIMEOUT_SECS = opt("limits.body_read_timeout_secs", Kind::Integer, "Seconds a request's whole body has to arrive in once the headers are in (1–600), else `408`.")
        .env("PALISADE_LIMITS_BODY_READ_TIMEOUT_SECS", set!(u64 limits.body_read_timeout_secs)).default("30");
    LIMITS_IDLE_TIMEOUT_SECS = opt("limits.idle_timeout_secs", Kind::Integer, "Seconds an HTTP connection may stay open with no request in flight (1–3600); an open SSE stream is a request in flight.")
        .env("PALISADE_LIMITS_IDLE_TIMEOUT_SECS", set!(u64 limits.idle_timeout_secs)).default("60");
    LIMITS_MAX_CONNECTIONS = opt("limits.max_connections", Kind::Integer, "Most HTTP connections open at once (1–100000); at the cap the server stops accepting until one closes.")
        .env("PALISADE_LIMITS_MAX_CONNECTIONS", set!(usize limits.max_connections)).default("1024");
    LIMITS_MAX_STREAMS_PER_PRINCIPAL = opt("limits.max_streams_per_principal", Kind::Integer, "Most open listen and GET streams per principal on one instance (1–1000).")
        .env("PALISADE_LIMITS_MAX_STREAMS_PER_PRINCIPAL", set!(usize limits.max_streams_per_principal)).default("8");
    LIMITS_MAX_LISTEN_FILTER_ENTRIES = opt("limits.max_listen_filter_entries", Kind::Integer, "Most entries of one listen filter list, `taskIds` or `resourceSubscriptions` (1–10000).")
        .env("PALISADE_LIMITS_MAX_LISTEN_FILTER_ENTRIES", set!(usize limits.max_listen_filter_entries)).default("100");
    HTTP_ALLOWED_HOSTS = opt("http.allowed_hosts", Kind::List, "Extra accepted `Host` values, e.g. `mcp.example.com` (the flag is repeatable and adds to the file's list).")
        .flag("allow-host", set!(append http.allowed_hosts));
    HTTP_ALLOWED_ORIGINS = opt("http.allowed_origins", Kind::List, "Extra accepted `Origin` values, e.g. `https://app.example.com` (the flag is repeatable and adds to the file's list).")
        .flag("allow-origin", set!(append http.allowed_origins));
    AUTH_MODE = opt("auth.mode", Kind::Text, "How callers are authenticated: `bearer` or `none` (loopback and stdio only).")
        .env("PALISADE_AUTH_MODE", set!(text auth.mode)).flag("auth", set!(text auth.mode)).described("`bearer` for the demo, `none` for the conformance fixture");
    AUTH_DEV_ISSUER = opt("auth.dev_issuer", Kind::Bool, "The development issuer (`palisade dev token`, and its authorization server, which gives anyone a token): `true`, `false`, or the `[auth.dev_issuer]` table below. Allowed only when `listen` and `public_url` are loopback.")
        .env("PALISADE_DEV_ISSUER", set_dev_issuer).described("on for the demo on loopback without issuers; off for the gateway");
    AUTH_DEV_ISSUER_ENABLED = opt("auth.dev_issuer.enabled", Kind::Bool, "The development issuer on or off, in the table form.")
        .described("on for the demo on loopback without issuers; off for the gateway");
    AUTH_DEV_ISSUER_AUTO_APPROVE = opt("auth.dev_issuer.auto_approve", Kind::Bool, "Approve every authorization request with the defaults, without the page (tests and scripts). Loopback listeners only.")
        .env("PALISADE_DEV_ISSUER_AUTO_APPROVE", set_dev_auto_approve).default("false");
    AUTH_DEV_ISSUER_DEFAULT_SUBJECT = opt("auth.dev_issuer.default_subject", Kind::Text, "Subject pre-filled on the page (and granted by `auto_approve`): 1–64 letters, digits or `. _ @ -`.")
        .default("alice");
    AUTH_DEV_ISSUER_DEFAULT_TENANT = opt("auth.dev_issuer.default_tenant", Kind::Text, "Tenant pre-filled on the page (and granted by `auto_approve`).")
        .default("acme");
    AUTH_DEV_ISSUER_ACCESS_TOKEN_TTL_SECS = opt("auth.dev_issuer.access_token_ttl_secs", Kind::Integer, "Lifetime of the access tokens it issues, in seconds (60–3600).")
        .default("300");
    AUTH_DEV_ISSUER_CLIENT_METADATA_ALLOW_LOOPBACK = opt("auth.dev_issuer.client_metadata_allow_loopback", Kind::Bool, "Tests only: client metadata documents may be fetched from loopback addresses (and over plain http there). Loopback listeners only.")
        .default("false");
    AUTH_DEV_ISSUER_CLIENT_METADATA_CA_FILE = opt("auth.dev_issuer.client_metadata_ca_file", Kind::Path, "Tests only: extra trust anchors (PEM) for fetching client metadata documents.");
    AUTH_LEEWAY_SECS = opt("auth.leeway_secs", Kind::Integer, "Clock-skew leeway for token times, in seconds (at most 60).")
        .default("30");
    AUTH_REQUIRED_TYP = opt("auth.required_typ", Kind::Text, "Required JOSE `typ` of tokens, e.g. `at+jwt`.");
    AUTH_TENANT_CLAIM = opt("auth.tenant_claim", Kind::Text, "The claim naming the tenant.")
        .default("tenant");
    AUTH_CLIENT_CLAIM = opt("auth.client_claim", Kind::Text, "The claim naming the OAuth client.")
        .default("client_id");
    AUTH_TOKEN_CACHE_CAPACITY = opt("auth.token_cache_capacity", Kind::Integer, "Verified tokens remembered, keyed by their SHA-256 and never past `exp`; 0 disables the cache.")
        .env("PALISADE_TOKEN_CACHE_CAPACITY", set!(usize auth.token_cache_capacity)).default("10000");
    AUTH_JWKS_ALLOW_LOOPBACK = opt("auth.jwks_allow_loopback", Kind::Bool, "Development only: issuers' JWKS may be fetched from loopback addresses (and over plain http there). Loopback listeners only.")
        .default("false");
    AUTH_JWKS_ALLOWED_NETWORKS = opt("auth.jwks_allowed_networks", Kind::List, "CIDR networks, e.g. `10.20.0.0/16`, that JWKS may be fetched from although they are private or otherwise special: a deliberately internal issuer. Everything else must be a public address.");
    AUTH_JWKS_PROXY = opt("auth.jwks_proxy", Kind::Text, "An HTTP CONNECT proxy, `http://host:port`, for JWKS fetches. It resolves the issuers' names itself, so it must refuse internal destinations.");
    AUTH_ISSUERS = opt("auth.issuers", Kind::Table, "Trusted external issuers: `[[auth.issuers]]` tables with the three keys below. Bearer mode needs at least one, or (on loopback) the development issuer.");
    AUTH_ISSUERS_ISSUER = opt("auth.issuers[].issuer", Kind::Text, "The issuer identifier (`iss`).");
    AUTH_ISSUERS_JWKS_URL = opt("auth.issuers[].jwks_url", Kind::Text, "Its JWKS URL.");
    AUTH_ISSUERS_ALGORITHMS = opt("auth.issuers[].algorithms", Kind::List, "The algorithms accepted from it: `ES256`, `EdDSA`, `RS256`.");
    HANDLES_SUBJECT_KEY_FILE = opt("handles.subject_key_file", Kind::Path, "File holding the 32-byte handle subject key (64 hex characters), generated on first run.")
        .env("PALISADE_HANDLES_SUBJECT_KEY_FILE", set!(path handles.subject_key_file)).described("`<data_dir>/handle-subject-key`")
        .protected();
    HANDLES_SUBJECT_KEY = opt("handles.subject_key", Kind::Text, "Environment only: the handle subject key itself (64 hex characters), instead of the file.")
        .variable("PALISADE_HANDLES_SUBJECT_KEY").env_only();
    HANDLES_RETENTION_SECS = opt("handles.retention_secs", Kind::Integer, "How long expired or revoked handle rows are kept before the retention job deletes them, in seconds (60–31536000).")
        .default("86400");
    HANDLES_POLICIES = opt("handles.policies.<type>", Kind::Table, "Per object type handle policy, overriding the application's: a table with the four keys below.");
    HANDLES_POLICIES_TTL_SECS = opt("handles.policies.<type>.ttl_secs", Kind::Integer, "Handle lifetime in seconds.");
    HANDLES_POLICIES_ALLOWED_SCOPES = opt("handles.policies.<type>.allowed_scopes", Kind::List, "Scopes a handle of this type may grant.");
    HANDLES_POLICIES_MAX_SCOPES = opt("handles.policies.<type>.max_scopes", Kind::Integer, "Most scopes per handle.");
    HANDLES_POLICIES_POLICY_VERSION = opt("handles.policies.<type>.policy_version", Kind::Integer, "The policy version; raising it invalidates older handles.");
    DELEGATION_ENABLED = opt("delegation.enabled", Kind::Bool, "Accept delegation capabilities (a sub-agent acting for a user under a capability that only narrows) and offer the tools `palisade_delegate`, `palisade_delegation_revoke` and `palisade_delegation_approve`.")
        .env("PALISADE_DELEGATION_ENABLED", set!(bool delegation.enabled)).default("false");
    DELEGATION_MAX_DEPTH = opt("delegation.max_depth", Kind::Integer, "Deepest delegation chain (a root capability is depth 0), 1–16.")
        .env("PALISADE_DELEGATION_MAX_DEPTH", set!(u64 delegation.max_depth)).default("3");
    DELEGATION_MAX_CALLS = opt("delegation.max_calls", Kind::Integer, "Largest call budget of a root capability (a child's is reserved from its parent's), 1–1000000.")
        .env("PALISADE_DELEGATION_MAX_CALLS", set!(u64 delegation.max_calls)).default("1000");
    DELEGATION_MAX_LIFETIME_SECS = opt("delegation.max_lifetime_secs", Kind::Integer, "Longest lifetime of a capability in seconds (60–2592000); a child never outlives its parent.")
        .env("PALISADE_DELEGATION_MAX_LIFETIME_SECS", set!(u64 delegation.max_lifetime_secs)).default("3600");
    LEGACY_ENABLED = opt("legacy.enabled", Kind::Bool, "Serve the 2025-era session wire (`initialize`, `Mcp-Session-Id`) beside 2026-07-28.")
        .default("true");
    LEGACY_VERSIONS = opt("legacy.versions", Kind::List, "The earlier revisions accepted, newest first.")
        .described("`[\"2025-11-25\", \"2025-06-18\"]`");
    LEGACY_IDLE_TIMEOUT_SECS = opt("legacy.idle_timeout_secs", Kind::Integer, "A session dies after this many seconds without a request (10–86400).")
        .default("1800");
    LEGACY_ABSOLUTE_TIMEOUT_SECS = opt("legacy.absolute_timeout_secs", Kind::Integer, "A session dies this many seconds after `initialize` (at least the idle timeout, at most 604800).")
        .default("43200");
    KILLSWITCH_MODE = opt("killswitch.mode", Kind::Text, "`off`, `dev` (generated keys and an in-process development authority in the data directory) or `authority` (an external authority: the files below).")
        .env("PALISADE_KILLSWITCH_MODE", set!(text killswitch.mode)).described("`dev` for the demo, `off` for the conformance fixture");
    KILLSWITCH_SERVER_RELEASE = opt("killswitch.server_release", Kind::Text, "The release this server reports as its `server_release` target (1–128 characters).")
        .described("the binary's version");
    KILLSWITCH_ROOT_PUBLIC_KEY = opt("killswitch.root_public_key", Kind::Path, "Authority mode: the policy root public key file.");
    KILLSWITCH_POLICY = opt("killswitch.policy", Kind::Path, "Authority mode: the signed policy envelope file.");
    KILLSWITCH_KEY_TRUST_ROOT = opt("killswitch.key_trust_root", Kind::Path, "Authority mode: the key trust root directory (holds the authority public key the policy pins).");
    KILLSWITCH_AUTHORITY_URL = opt("killswitch.authority_url", Kind::Text, "Authority mode: the authority's `https://host:port` URL.");
    KILLSWITCH_AUTHORITY_CA = opt("killswitch.authority_ca", Kind::Path, "Authority mode: CA bundle (PEM), the only trust anchors for the authority's certificate.");
    KILLSWITCH_CLIENT_CERT = opt("killswitch.client_cert", Kind::Path, "Authority mode: this server's client certificate chain (PEM).");
    KILLSWITCH_CLIENT_KEY = opt("killswitch.client_key", Kind::Path, "Authority mode: this server's client key (PEM).")
        .protected();
    KILLSWITCH_GENERATION_STORE = opt("killswitch.generation_store", Kind::Text, "Authority mode: where accepted generations are kept, `sqlite:<path>` or `redis://…`.")
        .described("`sqlite:<data_dir>/killswitch-generations.db`");
    KILLSWITCH_TARGET_KEY_FILE = opt("killswitch.target_key_file", Kind::Path, "Authority mode: the 32-byte target key file (shared with the authority's operators).")
        .protected();
    KILLSWITCH_AUTHORITY_DB = opt("killswitch.authority_db", Kind::Path, "The authority's SQLite database, when this server shares it (the demo's orders then redeem commit tokens in their own transaction); also the default of `palisade authority disable|enable|status --db`.")
        .protected();
    KILLSWITCH_STREAM_RECHECK_SECS = opt("killswitch.stream_recheck_secs", Kind::Integer, "How often open listen and GET streams re-check their targets, in seconds (1–3600); a refusal ends the stream.")
        .env("PALISADE_KILLSWITCH_STREAM_RECHECK_SECS", set!(u64 killswitch.stream_recheck_secs)).default("5");
    KILLSWITCH_AUTHORITY_ENVELOPE = opt("killswitch.authority_envelope", Kind::Text, "`batch` (many callers' queries under one signed Merkle root) or `single` (the v2 envelope, one signed head per target, for authorities without the batch endpoint).")
        .default("batch");
    TELEMETRY_OTLP_ENDPOINT = opt("telemetry.otlp_endpoint", Kind::Text, "OTLP/HTTP (protobuf) collector base URL, http or https, e.g. `http://127.0.0.1:4318`; `/v1/traces` is appended unless the path ends with it. Unset: no trace export.")
        .env("PALISADE_TELEMETRY_OTLP_ENDPOINT", set!(text telemetry.otlp_endpoint));
    TELEMETRY_SERVICE_NAME = opt("telemetry.service_name", Kind::Text, "`service.name` of the exported spans.")
        .env("PALISADE_TELEMETRY_SERVICE_NAME", set!(text telemetry.service_name)).default("palisade");
    TELEMETRY_SAMPLING_RATIO = opt("telemetry.sampling_ratio", Kind::Number, "Fraction of new traces sampled, 0.0–1.0; a continued trace follows the caller's sampled flag.")
        .env("PALISADE_TELEMETRY_SAMPLING_RATIO", set!(f64 telemetry.sampling_ratio)).default("1.0");
    TELEMETRY_OTLP_HEADERS_FILE = opt("telemetry.otlp_headers_file", Kind::Path, "A file of `Name: value` lines sent as headers to the collector (credentials).")
        .env("PALISADE_TELEMETRY_OTLP_HEADERS_FILE", set!(path telemetry.otlp_headers_file))
        .protected();
    TELEMETRY_OTLP_HEADERS = opt("telemetry.otlp_headers", Kind::Text, "Environment only: headers for the collector as `name=value` pairs, comma-separated (credentials never go in the file).")
        .env("PALISADE_TELEMETRY_OTLP_HEADERS", set!(text telemetry.otlp_headers)).env_only();
    TELEMETRY_CONTINUE_INCOMING_TRACES = opt("telemetry.continue_incoming_traces", Kind::Bool, "Continue a request's `_meta.traceparent` (its trace id becomes the audit trace id); `false` starts a trace per request.")
        .env("PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES", set!(bool telemetry.continue_incoming_traces)).default("true");
    AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS = opt("audit.transport_refusal_interval_secs", Kind::Integer, "How often refusals made before the pipeline (transport limits, Host/Origin) are written to the audit log, aggregated, in seconds (1–3600).")
        .env("PALISADE_AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS", set!(u64 audit.transport_refusal_interval_secs)).default("10");
    AUDIT_SEGMENT_DIR = opt("audit.segment_dir", Kind::Path, "This instance's local audit segment: the request path writes its own audit chain here before a handler runs, and a shipper moves the records into the store in batches. One per instance (never shared); unshipped records are shipped at the next start.")
        .env("PALISADE_AUDIT_SEGMENT_DIR", set!(path audit.segment_dir)).described("`<data_dir>/audit-segment`")
        .protected();
    AUDIT_DURABILITY = opt("audit.durability", Kind::Text, "When an audit record counts as written: `process` (written to the segment file: survives the process being killed) or `power` (also `fdatasync`ed, group-committed: survives a power loss).")
        .env("PALISADE_AUDIT_DURABILITY", set!(text audit.durability)).default("process");
    AUDIT_CHECKPOINT_INTERVAL_SECS = opt("audit.checkpoint_interval_secs", Kind::Integer, "How often one instance signs a checkpoint over every audit chain's head, when any changed, in seconds (1–3600): records newer than the last checkpoint are the window in which a deleted tail goes unnoticed.")
        .env("PALISADE_AUDIT_CHECKPOINT_INTERVAL_SECS", set!(u64 audit.checkpoint_interval_secs)).default("1");
}

/// Applies the `PALISADE_*` environment variables of [`OPTIONS`] over the file, in their order.
/// A value that cannot be read as its option's kind is an error naming the variable.
pub fn apply_env(raw: &mut RawConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    for spec in OPTIONS {
        if let (Some(name), Some(set)) = (spec.env, spec.set)
            && let Some(value) = env(name)
        {
            set(raw, name, &value)?;
        }
    }
    Ok(())
}

/// The configuration flags of [`OPTIONS`] given on a command line (`--listen`, `--store`, …);
/// `serve` and `dev token` both flatten them in, so both resolve the same settings.
#[derive(Debug, Clone, Default)]
pub struct ConfigFlags(Vec<(&'static OptionSpec, String)>);

impl ConfigFlags {
    /// Applies the flags over file and environment. An error names the flag.
    pub fn apply(&self, raw: &mut RawConfig) -> Result<(), ConfigError> {
        for (spec, value) in &self.0 {
            if let (Some(flag), Some(set)) = (spec.flag, spec.set) {
                set(raw, &format!("--{flag}"), value)?;
            }
        }
        Ok(())
    }
}

impl clap::FromArgMatches for ConfigFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = Self::default();
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        for spec in OPTIONS.iter().filter(|spec| spec.flag.is_some()) {
            let values = matches
                .try_get_many::<String>(spec.key)
                .map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidValue, e))?;
            self.0.extend(values.into_iter().flatten().map(|value| (spec, value.clone())));
        }
        Ok(())
    }
}

impl clap::Args for ConfigFlags {
    fn augment_args(command: clap::Command) -> clap::Command {
        OPTIONS.iter().fold(command, |command, spec| match spec.flag {
            Some(flag) => command.arg(
                clap::Arg::new(spec.key)
                    .long(flag)
                    .value_name(spec.kind.value_name())
                    .value_parser(clap::value_parser!(String))
                    .action(if spec.kind == Kind::List { clap::ArgAction::Append } else { clap::ArgAction::Set })
                    .help(spec.doc),
            ),
            None => command,
        })
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

/// The option list as a Markdown table (`palisade config options`; README holds a copy).
pub fn options_markdown() -> String {
    let code = |text: &str| format!("`{text}`");
    let mut out = String::from("| key | environment | flag | default | what |\n|---|---|---|---|---|\n");
    for spec in OPTIONS {
        let key = if spec.in_file { code(spec.key) } else { String::new() };
        let env = spec.env.map_or_else(String::new, code);
        let flag = spec.flag.map_or_else(String::new, |flag| code(&format!("--{flag}")));
        let default = match spec.default {
            Fallback::Unset => String::new(),
            Fallback::Value(value) => code(value),
            Fallback::Described(text) => text.to_owned(),
        };
        let row = [key, env, flag, default, spec.doc.to_owned()].map(|cell| cell.replace('|', "\\|"));
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

/// Whether a URL's host is a loopback address (`localhost`, `127.0.0.0/8`, `::1`): a server
/// whose public URL is loopback is reached from this machine only.
fn url_host_is_loopback(url: &str) -> bool {
    match url::Url::parse(url).ok().and_then(|url| url.host().map(|host| host.to_owned())) {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// The gateway's sections: validated for the gateway, refused for any other application (an
/// upstream configured for an application that ignores it is a mistake the operator must see).
fn validate_gateway(
    app: AppChoice,
    gateway: palisade_gateway::config::RawGateway,
    pins: palisade_gateway::config::RawPins,
    upstreams: Vec<palisade_gateway::config::RawUpstream>,
    web: Option<palisade_gateway::config::RawWeb>,
) -> Result<Option<palisade_gateway::config::GatewaySettings>, ConfigError> {
    if app != AppChoice::Gateway {
        if !upstreams.is_empty() {
            return Err(bad("upstreams", "only the gateway uses upstreams (app = \"gateway\" or `palisade gateway`)"));
        }
        if web.is_some() {
            return Err(bad("web", "only the gateway serves web pages (app = \"gateway\" or `palisade gateway`)"));
        }
        return Ok(None);
    }
    if upstreams.is_empty() {
        return Err(bad("upstreams", "the gateway needs at least one [[upstreams]] entry"));
    }
    palisade_gateway::config::validate(gateway, pins, upstreams, web)
        .map(Some)
        .map_err(|error| ConfigError { key: error.key, reason: error.reason })
}

impl Settings {
    /// Adds the configuration file, the data directory and every key file to the paths the
    /// gateway's stdio upstreams may never see (a grant over one is refused; one under a
    /// visible system directory is masked).
    pub fn protect_from_stdio_upstreams(&mut self, config_file: Option<&std::path::Path>) {
        let mut paths: Vec<PathBuf> = self.protected_option_paths().into_iter().filter_map(|(_, path)| path).collect();
        paths.extend(config_file.map(std::path::Path::to_path_buf));
        if let Some(sqlite) = self.store.strip_prefix("sqlite://").or_else(|| self.store.strip_prefix("sqlite:")) {
            let file = sqlite.split('?').next().unwrap_or_default();
            if !file.is_empty() && file != ":memory:" {
                paths.push(PathBuf::from(file));
            }
        }
        let Some(gateway) = self.gateway.as_mut() else { return };
        gateway.protect(paths.into_iter().map(|path| std::path::absolute(&path).unwrap_or(path)));
    }
}

/// `url` with any password in it replaced (a store or Redis URL may carry one).
fn without_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("redacted"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

impl Settings {
    /// What `palisade config check` prints: what will run, on which addresses, with which
    /// issuers and upstreams, one line each (never a secret: passwords in URLs and header
    /// values are left out).
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let mut line = |label: &str, value: String| out.push_str(&format!("{:<20}{value}\n", format!("{label}:")));
        let app = match self.app {
            AppChoice::Demo => "demo (the tea shop)",
            AppChoice::Conformance => "conformance (the fixture of the official conformance suite)",
            AppChoice::Gateway => "gateway",
        };
        line("app", app.to_owned());
        line("listen", format!("http://{} (public URL {})", self.listen, self.public_url));
        line("metrics", self.metrics_listen.map_or("not served".to_owned(), |a| format!("http://{a}/metrics")));
        line("store", without_password(&self.store));
        line("data directory", self.data_dir.display().to_string());
        let auth = match self.auth_mode {
            AuthMode::None => "none (loopback and stdio only)".to_owned(),
            AuthMode::Bearer if self.issuers.is_empty() => "bearer".to_owned(),
            AuthMode::Bearer => format!(
                "bearer, issuers {}",
                self.issuers.iter().map(|issuer| issuer.issuer.as_str()).collect::<Vec<_>>().join(", ")
            ),
        };
        line("authentication", auth);
        line("development issuer", self.dev_issuer_why.to_owned());
        let killswitch = match &self.killswitch.mode {
            KillSwitchMode::Off => "off".to_owned(),
            KillSwitchMode::Dev { dir } => format!("development authority in-process ({})", dir.display()),
            KillSwitchMode::Authority(authority) => format!("authority at {}", authority.authority_url),
        };
        line("kill switch", killswitch);
        line(
            "audit",
            format!(
                "segment {}, checkpoints every {} s",
                self.audit_segment_dir.display(),
                self.audit_checkpoint_interval_secs
            ),
        );
        line("session wire", if self.legacy.enabled { self.legacy.versions.join(", ") } else { "off".to_owned() });
        line("delegation", if self.delegation.is_some() { "on" } else { "off" }.to_owned());
        let telemetry = match &self.telemetry {
            None => "off".to_owned(),
            Some(telemetry) => format!(
                "traces to {}{}",
                telemetry.traces_url,
                if telemetry.headers.0.is_empty() {
                    String::new()
                } else {
                    let names: Vec<&str> = telemetry.headers.0.iter().map(|(name, _)| name.as_str()).collect();
                    format!(" with headers {} (values not shown)", names.join(", "))
                }
            ),
        };
        line("telemetry", telemetry);
        if let Some(events) = &self.events_redis {
            line("events", without_password(events));
        }
        if let Some(gateway) = &self.gateway {
            for upstream in &gateway.upstreams {
                let target = match &upstream.stdio {
                    Some(stdio) => format!("runs {} (confinement {})", stdio.command, stdio.confinement.as_str()),
                    None => upstream.url.to_string(),
                };
                let prefix = match &upstream.prefix {
                    Some(prefix) => format!("names {prefix}{}…", gateway.separator.as_str()),
                    None => "unprefixed".to_owned(),
                };
                line("upstream", format!("{}: {target}, {prefix}", upstream.id));
            }
            if let Some(web) = &gateway.web {
                let review = if web.review_token.is_some() { "review page on" } else { "review page off" };
                let sign_in = web.sign_in.as_ref().map_or(String::new(), |s| format!(", sign-in at {}", s.issuer));
                line("web pages", format!("https://{} as {} ({review}{sign_in})", web.listen, web.public_url));
            }
        }
        out
    }

    /// The value of every option marked [`OptionSpec::protected`], by key (`None`: not set in
    /// this configuration). A test holds this list to the option table, so a new secret-file
    /// option cannot be left out of what stdio upstreams are kept from.
    pub fn protected_option_paths(&self) -> Vec<(&'static str, Option<PathBuf>)> {
        let authority = match &self.killswitch.mode {
            KillSwitchMode::Authority(authority) => Some(authority.as_ref()),
            KillSwitchMode::Off | KillSwitchMode::Dev { .. } => None,
        };
        vec![
            (DATA_DIR.key, Some(self.data_dir.clone())),
            (SECRET_FILE.key, Some(self.secret_file.clone())),
            (HANDLES_SUBJECT_KEY_FILE.key, Some(self.handle_subject_key_file.clone())),
            (AUDIT_SEGMENT_DIR.key, Some(self.audit_segment_dir.clone())),
            (KILLSWITCH_CLIENT_KEY.key, authority.map(|a| a.client_key.clone())),
            (KILLSWITCH_TARGET_KEY_FILE.key, authority.map(|a| a.target_key_file.clone())),
            (KILLSWITCH_AUTHORITY_DB.key, authority.and_then(|a| a.authority_db.clone())),
            (TELEMETRY_OTLP_HEADERS_FILE.key, self.telemetry_headers_file.clone()),
        ]
    }
}

/// Validates raw configuration into settings.
pub fn validate(raw: RawConfig) -> Result<Settings, ConfigError> {
    // A file with upstreams and no `app` is a gateway's.
    let default_app = if raw.upstreams.is_empty() { "demo" } else { "gateway" };
    let app = match raw.app.as_deref().unwrap_or(default_app) {
        "demo" => AppChoice::Demo,
        "conformance" => AppChoice::Conformance,
        "gateway" => AppChoice::Gateway,
        other => return Err(bad(APP.key, format!("unknown app `{other}`; expected demo, conformance or gateway"))),
    };
    let gateway = validate_gateway(app, raw.gateway, raw.pins, raw.upstreams, raw.web)?;
    let listen: SocketAddr = raw
        .listen
        .as_deref()
        .unwrap_or("127.0.0.1:8080")
        .parse()
        .map_err(|_| bad(LISTEN.key, "must be an IP address and port, e.g. 127.0.0.1:8080"))?;
    let metrics_listen = match raw.metrics_listen.as_deref() {
        None => None,
        Some(text) => {
            let address: SocketAddr = text
                .parse()
                .map_err(|_| bad(METRICS_LISTEN.key, "must be an IP address and port, e.g. 127.0.0.1:9090"))?;
            if address == listen && address.port() != 0 {
                return Err(bad(METRICS_LISTEN.key, "must differ from listen"));
            }
            Some(address)
        }
    };
    let public_url = raw.public_url.unwrap_or_else(|| format!("http://{listen}/mcp"));
    let events_redis = match raw.events_redis {
        None => None,
        // The URL may carry a password: the error names the key, never the value.
        Some(url) => match url::Url::parse(&url) {
            Ok(parsed) if matches!(parsed.scheme(), "redis" | "rediss") && parsed.host_str().is_some() => Some(url),
            _ => return Err(bad(EVENTS_REDIS.key, "must be a redis:// or rediss:// URL with a host")),
        },
    };
    let parsed = url::Url::parse(&public_url).map_err(|_| bad(PUBLIC_URL.key, "must be an absolute URL"))?;
    if parsed.fragment().is_some() || !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(PUBLIC_URL.key, "must be an http(s) URL without a fragment"));
    }
    let data_dir = raw.data_dir.unwrap_or_else(|| PathBuf::from("palisade-data"));
    let store = raw.store.unwrap_or_else(|| format!("sqlite:{}", data_dir.join("palisade.db").display()));
    if !(store.starts_with("sqlite:") || store.starts_with("postgres://") || store.starts_with("postgresql://")) {
        return Err(bad(STORE.key, "must be sqlite:<path> or postgres://…"));
    }
    let secret_file = raw.secret_file.unwrap_or_else(|| data_dir.join("server-secret"));
    let max_body_bytes = raw.limits.max_body_bytes.unwrap_or(1024 * 1024);
    if !(1024..=64 * 1024 * 1024).contains(&max_body_bytes) {
        return Err(bad(LIMITS_MAX_BODY_BYTES.key, "must be between 1024 and 67108864"));
    }
    let request_timeout_secs = raw.limits.request_timeout_secs.unwrap_or(60);
    if !(1..=600).contains(&request_timeout_secs) {
        return Err(bad(LIMITS_REQUEST_TIMEOUT_SECS.key, "must be between 1 and 600"));
    }
    let page_size = raw.limits.page_size.unwrap_or(100);
    if !(1..=1000).contains(&page_size) {
        return Err(bad(LIMITS_PAGE_SIZE.key, "must be between 1 and 1000"));
    }
    let seconds = |value: Option<u64>, default: u64, key: &str, max: u64| {
        let value = value.unwrap_or(default);
        if (1..=max).contains(&value) { Ok(value) } else { Err(bad(key, format!("must be between 1 and {max}"))) }
    };
    let header_read_timeout_secs =
        seconds(raw.limits.header_read_timeout_secs, 10, LIMITS_HEADER_READ_TIMEOUT_SECS.key, 300)?;
    let body_read_timeout_secs =
        seconds(raw.limits.body_read_timeout_secs, 30, LIMITS_BODY_READ_TIMEOUT_SECS.key, 600)?;
    let idle_timeout_secs = seconds(raw.limits.idle_timeout_secs, 60, LIMITS_IDLE_TIMEOUT_SECS.key, 3600)?;
    let max_connections = raw.limits.max_connections.unwrap_or(1024);
    if !(1..=MAX_CONNECTIONS).contains(&max_connections) {
        return Err(bad(LIMITS_MAX_CONNECTIONS.key, format!("must be between 1 and {MAX_CONNECTIONS}")));
    }
    let bounded = |value: Option<usize>, default: usize, key: &str, max: usize| {
        let value = value.unwrap_or(default);
        if (1..=max).contains(&value) { Ok(value) } else { Err(bad(key, format!("must be between 1 and {max}"))) }
    };
    let max_streams_per_principal =
        bounded(raw.limits.max_streams_per_principal, 8, LIMITS_MAX_STREAMS_PER_PRINCIPAL.key, 1_000)?;
    let max_listen_filter_entries =
        bounded(raw.limits.max_listen_filter_entries, 100, LIMITS_MAX_LISTEN_FILTER_ENTRIES.key, 10_000)?;
    let transport_refusal_interval_secs =
        seconds(raw.audit.transport_refusal_interval_secs, 10, AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS.key, 3600)?;
    let audit_checkpoint_interval_secs =
        seconds(raw.audit.checkpoint_interval_secs, 1, AUDIT_CHECKPOINT_INTERVAL_SECS.key, 3600)?;
    let audit_durability = match raw.audit.durability.as_deref().unwrap_or("process") {
        "process" => palisade_store::segment::Durability::Process,
        "power" => palisade_store::segment::Durability::Power,
        other => {
            return Err(bad(AUDIT_DURABILITY.key, format!("unknown durability `{other}`; expected process or power")));
        }
    };
    let default_mode = if matches!(app, AppChoice::Demo | AppChoice::Gateway) { "bearer" } else { "none" };
    let auth_mode = match raw.auth.mode.as_deref().unwrap_or(default_mode) {
        "bearer" => AuthMode::Bearer,
        "none" => AuthMode::None,
        other => return Err(bad(AUTH_MODE.key, format!("unknown mode `{other}`; expected bearer or none"))),
    };
    // The development issuer mints a token for any subject, tenant and scope to whoever asks:
    // it runs by default only for the demo on loopback without real issuers, never by default
    // for the gateway, and never where anyone but this machine can reach it.
    let loopback_only = listen.ip().is_loopback() && url_host_is_loopback(&public_url);
    let (dev_issuer, dev_issuer_why) = match raw.auth.dev_issuer.as_ref().and_then(RawDevIssuer::enabled) {
        Some(true) if !loopback_only => {
            return Err(bad(
                AUTH_DEV_ISSUER.key,
                "the development issuer mints tokens for anyone who asks: it is allowed only when both `listen` and \
                 `public_url` are loopback addresses",
            ));
        }
        Some(true) if raw.auth.issuers.is_empty() => (true, "on (auth.dev_issuer = true)"),
        Some(true) => (true, "on beside the configured issuers (auth.dev_issuer = true names it deliberately)"),
        Some(false) => (false, "off (auth.dev_issuer = false)"),
        None => match app {
            AppChoice::Gateway => {
                (false, "off (never on by default for the gateway; auth.dev_issuer = true on loopback for development)")
            }
            _ if !raw.auth.issuers.is_empty() => (false, "off (real issuers are configured)"),
            _ if !loopback_only => (false, "off (the listener or public_url is not loopback)"),
            AppChoice::Demo => (true, "on (the demo's default on loopback)"),
            AppChoice::Conformance => (false, "off"),
        },
    };
    let dev_table = raw.auth.dev_issuer.as_ref().map(RawDevIssuer::table).unwrap_or_default();
    let dev_authorization = DevAuthorization {
        auto_approve: dev_table.auto_approve.unwrap_or(false),
        default_subject: dev_table.default_subject.unwrap_or_else(|| "alice".into()),
        default_tenant: dev_table.default_tenant.unwrap_or_else(|| "acme".into()),
        access_token_ttl_secs: dev_table.access_token_ttl_secs.unwrap_or(300),
        client_metadata_allow_loopback: dev_table.client_metadata_allow_loopback.unwrap_or(false),
        client_metadata_ca_file: dev_table.client_metadata_ca_file,
    };
    if !(60..=3600).contains(&dev_authorization.access_token_ttl_secs) {
        return Err(bad(AUTH_DEV_ISSUER_ACCESS_TOKEN_TTL_SECS.key, "must be between 60 and 3600"));
    }
    for (key, value) in [
        (AUTH_DEV_ISSUER_DEFAULT_SUBJECT.key, &dev_authorization.default_subject),
        (AUTH_DEV_ISSUER_DEFAULT_TENANT.key, &dev_authorization.default_tenant),
    ] {
        let ok = (1..=64).contains(&value.len())
            && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'));
        if !ok {
            return Err(bad(key, "must be 1 to 64 letters, digits or . _ @ -"));
        }
    }
    // Approving without a person, or fetching from loopback, is for tests on this machine only.
    if dev_authorization.auto_approve && !listen.ip().is_loopback() {
        return Err(bad(AUTH_DEV_ISSUER_AUTO_APPROVE.key, "is allowed on a loopback listener only"));
    }
    if dev_authorization.client_metadata_allow_loopback && !listen.ip().is_loopback() {
        return Err(bad(AUTH_DEV_ISSUER_CLIENT_METADATA_ALLOW_LOOPBACK.key, "is allowed on a loopback listener only"));
    }
    let jwks_allow_loopback = raw.auth.jwks_allow_loopback.unwrap_or(false);
    if jwks_allow_loopback && !listen.ip().is_loopback() {
        return Err(bad(AUTH_JWKS_ALLOW_LOOPBACK.key, "is allowed on a loopback listener only"));
    }
    let leeway_secs = raw.auth.leeway_secs.unwrap_or(30);
    if leeway_secs > palisade_auth::MAX_LEEWAY_SECS {
        return Err(bad(AUTH_LEEWAY_SECS.key, format!("must be at most {}", palisade_auth::MAX_LEEWAY_SECS)));
    }
    let token_cache_capacity = raw.auth.token_cache_capacity.unwrap_or(10_000);
    if token_cache_capacity > palisade_auth::MAX_CACHE_CAPACITY {
        return Err(bad(
            AUTH_TOKEN_CACHE_CAPACITY.key,
            format!("must be at most {}", palisade_auth::MAX_CACHE_CAPACITY),
        ));
    }
    let mut issuers = Vec::new();
    for (index, issuer) in raw.auth.issuers.into_iter().enumerate() {
        let key = format!("auth.issuers[{index}].algorithms");
        let algorithms = issuer
            .algorithms
            .iter()
            .map(|name| match name.as_str() {
                "ES256" => Ok(palisade_auth::Algorithm::ES256),
                "EdDSA" => Ok(palisade_auth::Algorithm::EdDSA),
                "RS256" => Ok(palisade_auth::Algorithm::RS256),
                other => Err(bad(&key, format!("`{other}` is not allowed; use ES256, EdDSA or RS256"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if algorithms.is_empty() {
            return Err(bad(&key, "must name at least one algorithm"));
        }
        issuers.push(Issuer { issuer: issuer.issuer, jwks_url: issuer.jwks_url, algorithms });
    }
    if auth_mode == AuthMode::Bearer && issuers.is_empty() && !dev_issuer {
        return Err(bad(
            AUTH_ISSUERS.key,
            "bearer mode needs at least one [[auth.issuers]] entry (or, for development on loopback, auth.dev_issuer = true)",
        ));
    }
    if auth_mode == AuthMode::None && !listen.ip().is_loopback() {
        return Err(bad(LISTEN.key, "an unauthenticated server may listen on loopback addresses only"));
    }
    let handle_subject_key_file = raw.handles.subject_key_file.unwrap_or_else(|| data_dir.join("handle-subject-key"));
    let audit_segment_dir = raw.audit.segment_dir.unwrap_or_else(|| data_dir.join("audit-segment"));
    let retention_secs = raw.handles.retention_secs.unwrap_or(86_400);
    if !(60..=365 * 86_400).contains(&retention_secs) {
        return Err(bad(HANDLES_RETENTION_SECS.key, "must be between 60 and 31536000"));
    }
    let killswitch = validate_killswitch(raw.killswitch, app, &data_dir)?;
    let mut handle_policies = BTreeMap::new();
    for (object_type, policy) in raw.handles.policies {
        let key = format!("handles.policies.{object_type}");
        let policy = HandlePolicy {
            ttl: Duration::from_secs(policy.ttl_secs),
            allowed_scopes: policy.allowed_scopes,
            max_scopes: policy.max_scopes,
            version: policy.policy_version,
        };
        policy.validate().map_err(|why| bad(&key, why))?;
        handle_policies.insert(object_type, policy);
    }
    let legacy = validate_legacy(raw.legacy)?;
    let telemetry_headers_file = raw.telemetry.otlp_headers_file.clone();
    let telemetry = validate_telemetry(raw.telemetry)?;
    let delegation = validate_delegation(raw.delegation)?;
    Ok(Settings {
        legacy,
        delegation,
        telemetry,
        telemetry_headers_file,
        gateway,
        app,
        listen,
        metrics_listen,
        public_url,
        events_redis,
        data_dir,
        store,
        secret_file,
        max_body_bytes,
        request_timeout_secs,
        page_size,
        header_read_timeout_secs,
        body_read_timeout_secs,
        idle_timeout_secs,
        max_connections,
        max_streams_per_principal,
        max_listen_filter_entries,
        transport_refusal_interval_secs,
        audit_segment_dir,
        audit_durability,
        audit_checkpoint_interval_secs,
        allowed_hosts: raw.http.allowed_hosts,
        allowed_origins: raw.http.allowed_origins,
        auth_mode,
        dev_issuer,
        dev_issuer_why,
        dev_authorization,
        leeway_secs,
        required_typ: raw.auth.required_typ,
        tenant_claim: raw.auth.tenant_claim.unwrap_or_else(|| "tenant".into()),
        client_claim: raw.auth.client_claim.unwrap_or_else(|| "client_id".into()),
        token_cache_capacity,
        jwks_allow_loopback,
        jwks_allowed_networks: raw.auth.jwks_allowed_networks,
        jwks_proxy: raw.auth.jwks_proxy,
        issuers,
        handle_subject_key_file,
        handle_retention: Duration::from_secs(retention_secs),
        handle_policies,
        killswitch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn check(text: &str) -> Result<Settings, ConfigError> {
        let mut raw = parse(text)?;
        apply_env(&mut raw, &no_env)?;
        validate(raw)
    }

    #[test]
    fn defaults_are_the_embedded_demo() {
        let settings = check("").unwrap();
        assert_eq!(settings.app, AppChoice::Demo);
        assert_eq!(settings.auth_mode, AuthMode::Bearer);
        assert!(settings.dev_issuer);
        assert_eq!(settings.public_url, "http://127.0.0.1:8080/mcp");
        assert!(settings.store.starts_with("sqlite:"));
        assert!(matches!(settings.killswitch.mode, KillSwitchMode::Dev { .. }));
        assert_eq!(check("app = \"conformance\"").unwrap().killswitch.mode, KillSwitchMode::Off);
    }

    #[test]
    fn a_file_with_upstreams_is_a_gateway_and_only_a_gateway_takes_upstreams() {
        let upstream = "[auth]\ndev_issuer = true\n[[upstreams]]\nid = \"fx\"\nurl = \"http://127.0.0.1:9001/mcp\"\n";
        let settings = check(upstream).unwrap();
        assert_eq!(settings.app, AppChoice::Gateway);
        assert_eq!(settings.auth_mode, AuthMode::Bearer, "a gateway authenticates its callers by default");
        let gateway = settings.gateway.unwrap();
        assert_eq!(gateway.upstreams[0].id, "fx");
        assert_eq!(check(&format!("app = \"demo\"\n{upstream}")).unwrap_err().key, "upstreams");
        assert_eq!(check("app = \"gateway\"").unwrap_err().key, "upstreams");
        let bad = "[[upstreams]]\nid = \"fx\"\nurl = \"http://127.0.0.1:9001/mcp\"\nprefix = \"A\"\n";
        assert_eq!(check(bad).unwrap_err().key, "upstreams[0].prefix");
        assert!(check(&format!("{upstream}color = \"red\"\n")).is_err(), "unknown keys are refused");
    }

    /// Path options that are not secret, each with why a stdio upstream may be granted it.
    const PUBLIC_PATH_OPTIONS: &[&str] = &[
        "auth.dev_issuer.client_metadata_ca_file", // trust anchors (public certificates)
        "killswitch.root_public_key",              // a public key
        "killswitch.policy",                       // a signed, public policy
        "killswitch.key_trust_root",               // public keys
        "killswitch.authority_ca",                 // trust anchors
        "killswitch.client_cert",                  // a certificate chain (its key is protected)
    ];

    #[test]
    fn every_secret_file_option_is_kept_from_stdio_upstreams() {
        // Every path option is classified: protected, or listed above as public.
        for spec in OPTIONS.iter().filter(|spec| spec.kind == Kind::Path) {
            assert!(
                spec.protected != PUBLIC_PATH_OPTIONS.contains(&spec.key),
                "{}: a path option is either protected or listed as public, not both or neither",
                spec.key
            );
        }
        // A configuration setting every protected option to its own file.
        let dir = std::env::temp_dir().join(format!("palisade-protected-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str| dir.join(name).display().to_string();
        std::fs::write(file("otlp-headers"), "Authorization: Bearer collector-secret\n").unwrap();
        let text = format!(
            "data_dir = \"{data}\"\nsecret_file = \"{secret}\"\n[auth]\nmode = \"none\"\n\
             [handles]\nsubject_key_file = \"{subject}\"\n[audit]\nsegment_dir = \"{segment}\"\n\
             [telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\notlp_headers_file = \"{headers}\"\n\
             [killswitch]\nmode = \"authority\"\nroot_public_key = \"/k/root.pub\"\npolicy = \"/k/policy\"\n\
             key_trust_root = \"/k/trust\"\nauthority_url = \"https://authority.example\"\nauthority_ca = \"/k/ca.pem\"\n\
             client_cert = \"/k/client.pem\"\nclient_key = \"{client_key}\"\ntarget_key_file = \"{target}\"\n\
             authority_db = \"{authority_db}\"\n\
             [[upstreams]]\nid = \"files\"\ncommand = \"/bin/true\"\n",
            data = file("data"),
            secret = file("server-secret"),
            subject = file("subject-key"),
            segment = file("segment"),
            headers = file("otlp-headers"),
            client_key = file("client.key"),
            target = file("target-key"),
            authority_db = file("authority.db"),
        );
        let mut settings = check(&text).unwrap();
        settings.protect_from_stdio_upstreams(None);
        let listed = settings.protected_option_paths();
        let protected_keys: std::collections::BTreeSet<&str> =
            OPTIONS.iter().filter(|spec| spec.protected).map(|spec| spec.key).collect();
        let listed_keys: std::collections::BTreeSet<&str> = listed.iter().map(|(key, _)| *key).collect();
        assert_eq!(listed_keys, protected_keys, "Settings::protected_option_paths names every protected option");
        let gateway = settings.gateway.as_ref().unwrap();
        for (key, path) in listed {
            let path = path.unwrap_or_else(|| panic!("{key} is set in the sample but has no value"));
            assert!(path.starts_with(&dir), "{key}: {}", path.display());
            assert!(gateway.protected_paths.contains(&path), "{key} ({}) is not protected", path.display());
        }
        assert!(gateway.protected_paths.contains(&dir.join("otlp-headers")), "the collector's credentials");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_development_issuer_runs_only_on_loopback_and_never_by_default_for_the_gateway() {
        let upstream = "[[upstreams]]\nid = \"fx\"\nurl = \"http://127.0.0.1:9001/mcp\"\n";
        let issuer =
            "[[auth.issuers]]\nissuer = \"https://i\"\njwks_url = \"https://i/jwks\"\nalgorithms = [\"ES256\"]\n";
        let on = |text: &str| check(text).unwrap_or_else(|e| panic!("{text}: {e}")).dev_issuer;
        // The demo on loopback: on by default; beside real issuers or off loopback: off.
        assert!(on(""));
        assert!(!on(issuer));
        assert!(!on(&format!("listen = \"0.0.0.0:8080\"\n{issuer}")));
        assert!(!on(&format!("public_url = \"https://mcp.example.com/mcp\"\n{issuer}")));
        // The gateway: never by default, not even on loopback.
        assert!(!on(&format!("{issuer}{upstream}")));
        assert_eq!(check(upstream).unwrap_err().key, "auth.issuers");
        // Named: on loopback only, with or without real issuers.
        assert!(on(&format!("[auth]\ndev_issuer = true\n{upstream}")));
        assert!(on(&format!("[auth]\ndev_issuer = true\n{issuer}{upstream}")));
        assert!(on("listen = \"[::1]:8080\"\npublic_url = \"http://localhost:8080/mcp\"\n[auth]\ndev_issuer = true"));
        for text in [
            "listen = \"0.0.0.0:8080\"\n[auth]\ndev_issuer = true",
            "listen = \"0.0.0.0:8080\"\n[auth.dev_issuer]\nenabled = true",
            "listen = \"10.0.0.1:8080\"\n[auth]\ndev_issuer = true",
            "public_url = \"https://mcp.example.com/mcp\"\n[auth]\ndev_issuer = true",
            "public_url = \"http://127.0.0.1.example.com/mcp\"\n[auth]\ndev_issuer = true",
        ] {
            assert_eq!(check(text).unwrap_err().key, "auth.dev_issuer", "{text}");
            assert_eq!(check(&format!("{text}\n{upstream}")).unwrap_err().key, "auth.dev_issuer", "{text}");
        }
    }

    #[test]
    fn a_misspelt_key_is_named_by_its_full_path_with_the_key_it_is_close_to() {
        let upstream = "[[upstreams]]\nid = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n";
        for (text, key, near) in [
            ("[pins]\nrelist_sec = 5\n", "pins.relist_sec", Some("relist_secs")),
            (&format!("{upstream}{upstream}prefx = \"b\"\n") as &str, "upstreams[1].prefx", Some("prefix")),
            ("[auth.dev_issuer]\nauto_aprove = true\n", "auth.dev_issuer.auto_aprove", Some("auto_approve")),
            ("[auth]\ndev_isuer = true\n", "auth.dev_isuer", Some("dev_issuer")),
            ("colour = \"blue\"\n", "colour", None),
            ("[limits]\nmax_connections = -1\n", "limits.max_connections", None),
            ("[auth.dev_issuer]\nauto_approve = \"yes\"\n", "auth.dev_issuer.auto_approve", None),
        ] {
            let error = parse(text).unwrap_err();
            assert_eq!(error.key, key, "{text}: {error}");
            match near {
                Some(near) => assert!(error.reason.contains(&format!("did you mean `{near}`?")), "{text}: {error}"),
                None => assert!(!error.reason.contains("did you mean"), "{text}: {error}"),
            }
            assert!(!error.reason.contains("untagged"), "{text}: {error}");
        }
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("app = \"shop\"", "app"),
            ("listen = \"nowhere\"", "listen"),
            ("[limits]\nrequest_timeout_secs = 0", "limits.request_timeout_secs"),
            ("[limits]\npage_size = 0", "limits.page_size"),
            ("[limits]\nheader_read_timeout_secs = 0", "limits.header_read_timeout_secs"),
            ("[limits]\nheader_read_timeout_secs = 301", "limits.header_read_timeout_secs"),
            ("[limits]\nbody_read_timeout_secs = 0", "limits.body_read_timeout_secs"),
            ("[limits]\nbody_read_timeout_secs = 100000", "limits.body_read_timeout_secs"),
            ("[limits]\nidle_timeout_secs = 0", "limits.idle_timeout_secs"),
            ("[limits]\nidle_timeout_secs = 86400", "limits.idle_timeout_secs"),
            ("[limits]\nmax_connections = 0", "limits.max_connections"),
            ("[limits]\nmax_connections = 10000000", "limits.max_connections"),
            ("[limits]\nmax_connections = -1", "limits.max_connections"),
            ("[limits]\nmax_streams_per_principal = 0", "limits.max_streams_per_principal"),
            ("[limits]\nmax_listen_filter_entries = 100000", "limits.max_listen_filter_entries"),
            ("[audit]\ntransport_refusal_interval_secs = 0", "audit.transport_refusal_interval_secs"),
            ("[audit]\ntransport_refusal_interval_secs = 86400", "audit.transport_refusal_interval_secs"),
            ("[audit]\ncheckpoint_interval_secs = 0", "audit.checkpoint_interval_secs"),
            ("[audit]\ndurability = \"always\"", "audit.durability"),
            ("[audit]\nretention = 1", "audit.retention"),
            ("[auth]\nleeway_secs = 3600", "auth.leeway_secs"),
            ("[auth]\nmode = \"magic\"", "auth.mode"),
            (
                "[[auth.issuers]]\nissuer = \"https://i\"\njwks_url = \"https://i/jwks\"\nalgorithms = [\"HS256\"]",
                "auth.issuers[0].algorithms",
            ),
            ("[auth]\ndev_issuer = false", "auth.issuers"),
            ("[auth.dev_issuer]\nenabled = false", "auth.issuers"),
            ("listen = \"0.0.0.0:8080\"\n[auth.dev_issuer]\nauto_approve = true", "auth.dev_issuer.auto_approve"),
            (
                "listen = \"0.0.0.0:8080\"\n[auth.dev_issuer]\nclient_metadata_allow_loopback = true",
                "auth.dev_issuer.client_metadata_allow_loopback",
            ),
            ("listen = \"0.0.0.0:8080\"\n[auth]\njwks_allow_loopback = true", "auth.jwks_allow_loopback"),
            ("[auth.dev_issuer]\naccess_token_ttl_secs = 86400", "auth.dev_issuer.access_token_ttl_secs"),
            ("[auth.dev_issuer]\ndefault_subject = \"a b\"", "auth.dev_issuer.default_subject"),
            ("app = \"conformance\"\nlisten = \"0.0.0.0:8080\"", "listen"),
            ("store = \"mysql://x\"", "store"),
            ("unknown_key = 1", "unknown_key"),
            ("public_url = \"http://x/mcp#frag\"", "public_url"),
            ("events_redis = \"http://cache:6379\"", "events_redis"),
            ("[handles]\nretention_secs = 1", "handles.retention_secs"),
            (
                "[handles.policies.basket]\nttl_secs = 0\nallowed_scopes = [\"a\"]\nmax_scopes = 1\npolicy_version = 1",
                "handles.policies.basket",
            ),
            (
                "[handles.policies.basket]\nttl_secs = 60\nallowed_scopes = [\"a\", \"a\"]\nmax_scopes = 1\npolicy_version = 1",
                "handles.policies.basket",
            ),
            (
                "[handles.policies.basket]\nttl_secs = 60\nallowed_scopes = [\"a\"]\nmax_scopes = 1\npolicy_version = 0",
                "handles.policies.basket",
            ),
            ("[handles]\nsubject_key = \"x\"", "handles.subject_key"),
            ("[killswitch]\nmode = \"maybe\"", "killswitch.mode"),
            ("[killswitch]\nmode = \"authority\"", "killswitch.authority_url"),
            ("[killswitch]\nmode = \"authority\"\nauthority_url = \"http://a:1\"", "killswitch.authority_url"),
            ("[killswitch]\nmode = \"authority\"\nauthority_url = \"https://a:1\"", "killswitch.root_public_key"),
            (
                "[killswitch]\nmode = \"authority\"\nauthority_url = \"https://a:1\"\ngeneration_store = \"mem:\"",
                "killswitch.generation_store",
            ),
            ("[killswitch]\nserver_release = \"\"", "killswitch.server_release"),
            ("[killswitch]\nstream_recheck_secs = 0", "killswitch.stream_recheck_secs"),
            ("[killswitch]\nauthority_envelope = \"both\"", "killswitch.authority_envelope"),
            ("[legacy]\nversions = []", "legacy.versions"),
            ("[legacy]\nversions = [\"2024-11-05\"]", "legacy.versions"),
            ("[legacy]\nidle_timeout_secs = 1", "legacy.idle_timeout_secs"),
            ("[legacy]\nidle_timeout_secs = 600\nabsolute_timeout_secs = 60", "legacy.absolute_timeout_secs"),
            ("[legacy]\nsticky = true", "legacy.sticky"),
            ("[telemetry]\notlp_endpoint = \"\"", "telemetry.otlp_endpoint"),
            ("[telemetry]\notlp_endpoint = \"collector:4318\"", "telemetry.otlp_endpoint"),
            ("[telemetry]\notlp_endpoint = \"grpc://collector:4317\"", "telemetry.otlp_endpoint"),
            ("[telemetry]\notlp_endpoint = \"file:///tmp/spans\"", "telemetry.otlp_endpoint"),
            ("[telemetry]\notlp_endpoint = \"http://user:secret@collector:4318\"", "telemetry.otlp_endpoint"),
            ("[telemetry]\notlp_endpoint = \"http://collector:4318/?token=x\"", "telemetry.otlp_endpoint"),
            ("[telemetry]\nservice_name = \"\"", "telemetry.service_name"),
            ("[telemetry]\nsampling_ratio = 1.5", "telemetry.sampling_ratio"),
            ("[telemetry]\nsampling_ratio = -0.1", "telemetry.sampling_ratio"),
            ("[telemetry]\nsampling_ratio = nan", "telemetry.sampling_ratio"),
            ("[telemetry]\notlp_headers_file = \"/nonexistent/otlp-headers\"", "telemetry.otlp_headers_file"),
            // Collector credentials never come from the file itself.
            ("[telemetry]\notlp_headers = \"authorization=x\"", "telemetry.otlp_headers"),
            ("[telemetry]\nendpoint = \"http://collector:4318\"", "telemetry.endpoint"),
        ] {
            let error = check(text).unwrap_err();
            assert_eq!(error.key, key, "{text}: {error}");
        }
    }

    #[test]
    fn transport_limits_default_and_are_configurable() {
        let defaults = check("").unwrap();
        assert_eq!(
            (
                defaults.header_read_timeout_secs,
                defaults.body_read_timeout_secs,
                defaults.idle_timeout_secs,
                defaults.max_connections,
                defaults.transport_refusal_interval_secs
            ),
            (10, 30, 60, 1024, 10)
        );
        let file = "[limits]\nheader_read_timeout_secs = 5\nbody_read_timeout_secs = 20\nidle_timeout_secs = 120\n\
                    max_connections = 64\n[audit]\ntransport_refusal_interval_secs = 30";
        let custom = check(file).unwrap();
        assert_eq!(
            (
                custom.header_read_timeout_secs,
                custom.body_read_timeout_secs,
                custom.idle_timeout_secs,
                custom.max_connections,
                custom.transport_refusal_interval_secs
            ),
            (5, 20, 120, 64, 30)
        );
        let env = |key: &str| match key {
            "PALISADE_LIMITS_HEADER_READ_TIMEOUT_SECS" => Some("3".to_owned()),
            "PALISADE_LIMITS_BODY_READ_TIMEOUT_SECS" => Some("4".to_owned()),
            "PALISADE_LIMITS_IDLE_TIMEOUT_SECS" => Some("5".to_owned()),
            "PALISADE_LIMITS_MAX_CONNECTIONS" => Some("6".to_owned()),
            "PALISADE_AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS" => Some("7".to_owned()),
            _ => None,
        };
        let mut raw = parse(file).unwrap();
        apply_env(&mut raw, &env).unwrap();
        let overridden = validate(raw).unwrap();
        assert_eq!(
            (
                overridden.header_read_timeout_secs,
                overridden.body_read_timeout_secs,
                overridden.idle_timeout_secs,
                overridden.max_connections,
                overridden.transport_refusal_interval_secs
            ),
            (3, 4, 5, 6, 7)
        );
        for (key, value, expected) in [
            ("PALISADE_LIMITS_IDLE_TIMEOUT_SECS", "soon", "PALISADE_LIMITS_IDLE_TIMEOUT_SECS"),
            ("PALISADE_LIMITS_MAX_CONNECTIONS", "-3", "PALISADE_LIMITS_MAX_CONNECTIONS"),
            ("PALISADE_LIMITS_MAX_CONNECTIONS", "0", "limits.max_connections"),
            ("PALISADE_LIMITS_HEADER_READ_TIMEOUT_SECS", "0", "limits.header_read_timeout_secs"),
            ("PALISADE_AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS", "0", "audit.transport_refusal_interval_secs"),
        ] {
            let bad_env = |k: &str| (k == key).then(|| value.to_owned());
            let mut raw = RawConfig::default();
            let error = apply_env(&mut raw, &bad_env).and_then(|()| validate(raw).map(drop)).unwrap_err();
            assert_eq!(error.key, expected, "{key}={value}");
        }
    }

    #[test]
    fn the_session_wire_is_on_by_default_and_configurable() {
        let defaults = check("").unwrap().legacy;
        assert!(defaults.enabled);
        assert_eq!(defaults.versions, ["2025-11-25", "2025-06-18"]);
        let custom = check(
            "[legacy]\nenabled = false\nversions = [\"2025-06-18\"]\nidle_timeout_secs = 60\nabsolute_timeout_secs = 3600",
        )
        .unwrap()
        .legacy;
        assert!(!custom.enabled);
        assert_eq!(custom.versions, ["2025-06-18"]);
        assert_eq!((custom.idle_timeout.as_secs(), custom.absolute_timeout.as_secs()), (60, 3600));
    }

    #[test]
    fn telemetry_is_off_by_default_and_appends_the_traces_path() {
        assert_eq!(check("").unwrap().telemetry, None);
        assert_eq!(check("[telemetry]\nsampling_ratio = 0.5").unwrap().telemetry, None);
        for (endpoint, url) in [
            ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
            ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
            ("https://otel.example.com/otlp/", "https://otel.example.com/otlp/v1/traces"),
            ("https://otel.example.com/v1/traces", "https://otel.example.com/v1/traces"),
        ] {
            let settings = check(&format!("[telemetry]\notlp_endpoint = \"{endpoint}\"")).unwrap();
            let telemetry = settings.telemetry.unwrap();
            assert_eq!(telemetry.traces_url, url);
            assert_eq!(telemetry.service_name, "palisade");
            assert!((telemetry.sampling_ratio - 1.0).abs() < f64::EPSILON);
            assert!(telemetry.headers.0.is_empty());
            assert!(telemetry.continue_incoming_traces);
        }
        let off = "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\ncontinue_incoming_traces = false";
        assert!(!check(off).unwrap().telemetry.unwrap().continue_incoming_traces);
    }

    #[test]
    fn telemetry_from_the_environment_and_headers_never_shown() {
        let env = |key: &str| match key {
            "PALISADE_TELEMETRY_OTLP_ENDPOINT" => Some("http://127.0.0.1:4318".to_owned()),
            "PALISADE_TELEMETRY_SERVICE_NAME" => Some("edge".to_owned()),
            "PALISADE_TELEMETRY_SAMPLING_RATIO" => Some("0.25".to_owned()),
            "PALISADE_TELEMETRY_OTLP_HEADERS" => Some("Authorization=Bearer very-secret==, x-tenant=a".to_owned()),
            "PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES" => Some("FALSE".to_owned()),
            _ => None,
        };
        let mut raw = parse("[telemetry]\notlp_endpoint = \"https://elsewhere:4318\"").unwrap();
        apply_env(&mut raw, &env).unwrap();
        let settings = validate(raw).unwrap();
        let telemetry = settings.telemetry.clone().unwrap();
        assert_eq!(telemetry.traces_url, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(telemetry.service_name, "edge");
        assert!((telemetry.sampling_ratio - 0.25).abs() < f64::EPSILON);
        assert!(!telemetry.continue_incoming_traces);
        assert_eq!(
            telemetry.headers.0,
            [("authorization".to_owned(), "Bearer very-secret==".to_owned()), ("x-tenant".to_owned(), "a".to_owned())]
        );
        // `palisade config check` prints the settings: header names only.
        let shown = format!("{settings:#?}");
        assert!(shown.contains("authorization") && !shown.contains("very-secret"), "{shown}");

        for (key, value, expected) in [
            ("PALISADE_TELEMETRY_SAMPLING_RATIO", "often", "PALISADE_TELEMETRY_SAMPLING_RATIO"),
            ("PALISADE_TELEMETRY_SAMPLING_RATIO", "2", "telemetry.sampling_ratio"),
            ("PALISADE_TELEMETRY_OTLP_ENDPOINT", "ftp://collector", "telemetry.otlp_endpoint"),
            ("PALISADE_TELEMETRY_OTLP_HEADERS", "Bearer very-secret", "PALISADE_TELEMETRY_OTLP_HEADERS"),
            ("PALISADE_TELEMETRY_OTLP_HEADERS", "authorization=very-secret\u{7f}", "PALISADE_TELEMETRY_OTLP_HEADERS"),
            ("PALISADE_TELEMETRY_OTLP_HEADERS", "bad name=very-secret", "PALISADE_TELEMETRY_OTLP_HEADERS"),
            ("PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES", "yes", "PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES"),
        ] {
            let bad_env = |k: &str| (k == key).then(|| value.to_owned());
            let mut raw = RawConfig::default();
            let error = apply_env(&mut raw, &bad_env).and_then(|()| validate(raw).map(drop)).unwrap_err();
            assert_eq!(error.key, expected, "{key}={value}");
            assert!(!error.to_string().contains("very-secret"), "a header value is never echoed: {error}");
        }
    }

    #[test]
    fn collector_headers_from_a_file() {
        let dir = std::env::temp_dir().join(format!("palisade-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("headers");
        std::fs::write(&good, "# collector credentials\nAuthorization: Basic dXNlcjpwYXNz\n\nX-Scope-OrgID: shop\n")
            .unwrap();
        let bad = dir.join("bad-headers");
        std::fs::write(&bad, "Authorization Basic very-secret\n").unwrap();
        let config = |file: &std::path::Path| {
            format!(
                "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\notlp_headers_file = \"{}\"",
                file.display()
            )
        };
        let headers = check(&config(&good)).unwrap().telemetry.unwrap().headers;
        assert_eq!(
            headers.0,
            [
                ("authorization".to_owned(), "Basic dXNlcjpwYXNz".to_owned()),
                ("x-scope-orgid".to_owned(), "shop".to_owned())
            ]
        );
        let error = check(&config(&bad)).unwrap_err();
        assert_eq!(error.key, "telemetry.otlp_headers_file");
        assert!(!error.to_string().contains("very-secret"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn environment_overrides_the_file() {
        let env = |key: &str| match key {
            "PALISADE_APP" => Some("conformance".to_owned()),
            "PALISADE_REQUEST_TIMEOUT_SECS" => Some("5".to_owned()),
            _ => None,
        };
        let mut raw = parse("app = \"demo\"").unwrap();
        apply_env(&mut raw, &env).unwrap();
        let settings = validate(raw).unwrap();
        assert_eq!(settings.app, AppChoice::Conformance);
        assert_eq!(settings.request_timeout_secs, 5);
        assert_eq!(settings.auth_mode, AuthMode::None);
        let bad_env = |key: &str| (key == "PALISADE_REQUEST_TIMEOUT_SECS").then(|| "soon".to_owned());
        let mut raw = RawConfig::default();
        assert_eq!(apply_env(&mut raw, &bad_env).unwrap_err().key, "PALISADE_REQUEST_TIMEOUT_SECS");
        // Booleans: true/false, 1/0, on/off in any case; anything else names the key.
        for (value, expected) in [("on", Some(true)), ("OFF", Some(false)), ("1", Some(true)), ("maybe", None)] {
            let env = |key: &str| (key == "PALISADE_DEV_ISSUER").then(|| value.to_owned());
            let mut raw = RawConfig::default();
            match expected {
                Some(expected) => {
                    apply_env(&mut raw, &env).unwrap();
                    assert_eq!(raw.auth.dev_issuer, Some(RawDevIssuer::Enabled(expected)), "{value}");
                }
                None => assert_eq!(apply_env(&mut raw, &env).unwrap_err().key, "PALISADE_DEV_ISSUER"),
            }
        }
    }

    /// Collects a derived `Deserialize` struct's field names: serde hands them to
    /// `deserialize_struct`, and nothing is deserialized.
    struct FieldNames<'a>(&'a mut Vec<&'static str>);

    #[derive(Debug)]
    struct Stop;

    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("stop")
        }
    }

    impl std::error::Error for Stop {}

    impl serde::de::Error for Stop {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Stop
        }
    }

    impl<'de> serde::Deserializer<'de> for FieldNames<'_> {
        type Error = Stop;

        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }

        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0.extend(fields);
            Err(Stop)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    fn fields<T: for<'de> Deserialize<'de>>(prefix: &str) -> Vec<String> {
        let mut names = Vec::new();
        assert!(T::deserialize(FieldNames(&mut names)).is_err());
        assert!(!names.is_empty(), "{prefix}: not a struct");
        names
            .iter()
            .map(|name| if prefix.is_empty() { (*name).to_owned() } else { format!("{prefix}.{name}") })
            .collect()
    }

    /// Every key the file accepts (what serde reads) is in [`OPTIONS`], and every option of the
    /// table the file accepts is a key the file reads: one list, no drift.
    #[test]
    fn the_option_table_is_exactly_the_file_keys() {
        // The gateway's sections are file-only tables (a list of upstreams has no environment or
        // flag form): crates/gateway/src/config.rs documents them, README's gateway section shows them.
        let sections = [
            "limits",
            "http",
            "auth",
            "handles",
            "killswitch",
            "legacy",
            "telemetry",
            "audit",
            "delegation",
            "gateway",
            "pins",
            "upstreams",
            "web",
        ];
        let mut file_keys: Vec<String> =
            fields::<RawConfig>("").into_iter().filter(|key| !sections.contains(&key.as_str())).collect();
        file_keys.extend(fields::<RawLimits>("limits"));
        file_keys.extend(fields::<RawHttp>("http"));
        file_keys.extend(fields::<RawAuth>("auth"));
        file_keys.extend(fields::<RawDevIssuerTable>("auth.dev_issuer"));
        file_keys.extend(fields::<RawIssuer>("auth.issuers[]"));
        file_keys.extend(
            fields::<RawHandles>("handles")
                .into_iter()
                .map(|key| if key == "handles.policies" { "handles.policies.<type>".to_owned() } else { key }),
        );
        file_keys.extend(fields::<RawHandlePolicy>("handles.policies.<type>"));
        file_keys.extend(fields::<RawKillSwitch>("killswitch"));
        file_keys.extend(fields::<RawLegacy>("legacy"));
        file_keys.extend(fields::<RawTelemetry>("telemetry"));
        file_keys.extend(fields::<RawAudit>("audit"));
        file_keys.extend(fields::<RawDelegation>("delegation"));
        file_keys.sort();
        let mut table: Vec<String> =
            OPTIONS.iter().filter(|spec| spec.in_file).map(|spec| spec.key.to_owned()).collect();
        table.sort();
        assert_eq!(table, file_keys);
        let mut unique: Vec<&str> = OPTIONS.iter().map(|spec| spec.key).collect();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), OPTIONS.len(), "an option is listed twice");
        for name in OPTIONS.iter().filter_map(|spec| spec.env) {
            assert!(name.starts_with("PALISADE_"), "{name}");
            assert_eq!(OPTIONS.iter().filter(|spec| spec.env == Some(name)).count(), 1, "{name} twice");
        }
        // An environment-only option is refused in the file.
        for spec in OPTIONS.iter().filter(|spec| !spec.in_file) {
            let (section, name) = spec.key.rsplit_once('.').unwrap();
            assert_eq!(parse(&format!("[{section}]\n{name} = \"x\"")).unwrap_err().key, spec.key);
        }
    }

    /// A sample value of `kind`, as a string (environment, flag) and as TOML.
    fn sample(kind: Kind) -> (&'static str, &'static str) {
        match kind {
            Kind::Text | Kind::Path => ("sample", "\"sample\""),
            Kind::Integer => ("7", "7"),
            Kind::Number => ("0.5", "0.5"),
            Kind::Bool => ("true", "true"),
            Kind::List => ("sample", "[\"sample\"]"),
            Kind::Table => unreachable!("a table has no environment variable or flag"),
        }
    }

    /// `key = value` as a TOML document.
    fn toml_line(key: &str, value: &str) -> String {
        match key.rsplit_once('.') {
            Some((section, name)) => format!("[{section}]\n{name} = {value}"),
            None => format!("{key} = {value}"),
        }
    }

    /// An option's environment variable and flag set exactly what its file key sets.
    #[test]
    fn environment_and_flags_set_the_key_they_are_listed_for() {
        for spec in OPTIONS.iter().filter(|spec| spec.in_file && spec.set.is_some()) {
            let (text, toml) = sample(spec.kind);
            let from_file = format!("{:?}", parse(&toml_line(spec.key, toml)).unwrap());
            if let Some(name) = spec.env {
                let mut raw = RawConfig::default();
                apply_env(&mut raw, &|key: &str| (key == name).then(|| text.to_owned())).unwrap();
                assert_eq!(format!("{raw:?}"), from_file, "{name}");
            }
            if let Some(flag) = spec.flag {
                let mut raw = RawConfig::default();
                ConfigFlags(vec![(spec, text.to_owned())]).apply(&mut raw).unwrap();
                assert_eq!(format!("{raw:?}"), from_file, "--{flag}");
            }
        }
    }

    /// A documented default is the one applied: writing it changes nothing.
    #[test]
    fn documented_defaults_are_the_defaults() {
        let defaults = format!("{:?}", check("").unwrap());
        let mut checked = 0;
        for spec in OPTIONS {
            let Fallback::Value(value) = spec.default else { continue };
            let toml = match spec.kind {
                Kind::Text | Kind::Path => format!("\"{value}\""),
                _ => value.to_owned(),
            };
            let text = toml_line(spec.key, &toml);
            assert_eq!(format!("{:?}", check(&text).unwrap()), defaults, "{text}");
            checked += 1;
        }
        assert!(checked > 20, "{checked}");
    }

    /// The configuration flags parse through clap, and a bad one is named by its flag.
    #[test]
    fn flags_parse_and_name_themselves_in_errors() {
        use clap::{Args as _, FromArgMatches as _};
        let command = ConfigFlags::augment_args(clap::Command::new("t"));
        let args = ["t", "--listen", "127.0.0.1:9", "--allow-host", "a", "--allow-host", "b", "--page-size", "5"];
        let flags = ConfigFlags::from_arg_matches(&command.clone().get_matches_from(args)).unwrap();
        let mut raw = parse("[http]\nallowed_hosts = [\"file\"]").unwrap();
        flags.apply(&mut raw).unwrap();
        assert_eq!(raw.listen.as_deref(), Some("127.0.0.1:9"));
        assert_eq!(raw.http.allowed_hosts, ["file", "a", "b"]);
        assert_eq!(raw.limits.page_size, Some(5));
        let flags = ConfigFlags::from_arg_matches(&command.get_matches_from(["t", "--max-body-bytes", "big"])).unwrap();
        assert_eq!(flags.apply(&mut RawConfig::default()).unwrap_err().key, "--max-body-bytes");
    }

    #[test]
    fn metrics_listen_is_validated() {
        assert_eq!(check("").unwrap().metrics_listen, None);
        let settings = check("metrics_listen = \"127.0.0.1:9464\"").unwrap();
        assert_eq!(settings.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        for text in ["metrics_listen = \"nowhere\"", "listen = \"127.0.0.1:9000\"\nmetrics_listen = \"127.0.0.1:9000\""]
        {
            assert_eq!(check(text).unwrap_err().key, "metrics_listen", "{text}");
        }
        let env = |key: &str| (key == "PALISADE_METRICS_LISTEN").then(|| "10.0.0.1:9464".to_owned());
        let mut raw = RawConfig::default();
        apply_env(&mut raw, &env).unwrap();
        assert_eq!(validate(raw).unwrap().metrics_listen, Some("10.0.0.1:9464".parse().unwrap()));
    }

    /// The line before README's option list.
    const README_BEGIN: &str = "<!-- options: generated by `cargo run -p xtask -- readme-config`; edit OPTIONS in crates/palisade/src/config.rs -->";
    /// The line after it.
    const README_END: &str = "<!-- options: end -->";

    /// README's option list is [`options_markdown`]; `cargo run -p xtask -- readme-config` rewrites it.
    #[test]
    fn readme_lists_every_option() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
        let (_, rest) = readme.split_once(README_BEGIN).expect("README has the option list's begin marker");
        let (block, _) = rest.split_once(README_END).expect("README has the option list's end marker");
        assert!(
            block.trim() == options_markdown().trim(),
            "README's option list is stale: run `cargo run -p xtask -- readme-config`"
        );
    }
}
