//! The one option table ([`OPTIONS`]): every option's file key, environment variable, flag,
//! default and meaning, and what reads it: the environment overlay ([`apply_env`]), the
//! configuration flags ([`ConfigFlags`]) and the option list ([`options_markdown`]).

use std::path::PathBuf;

use super::auth::{RawDevIssuer, RawDevIssuerTable};
use super::error::{ConfigError, bad};
use super::file::RawConfig;
use super::keys;

/// `true`/`false` (also `1`/`0`, `on`/`off`), any case, for an environment override.
pub(crate) fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "on" => Ok(true),
        "false" | "0" | "off" => Ok(false),
        _ => Err(bad(key, "must be true or false")),
    }
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
    /// audit log): `Settings::protected_option_paths` gives its value.
    pub protected: bool,
    /// Applies an environment or flag value; `None` when the option has neither.
    pub(super) set: Option<Setter>,
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
    APP = opt(keys::APP, Kind::Text, "The application to serve: `demo` (the tea shop) or `conformance` (the fixture of the official conformance suite).")
        .env("PALISADE_APP", set!(text app)).flag("app", set!(text app)).default("demo");
    LISTEN = opt(keys::LISTEN, Kind::Text, "The HTTP listen address (IP and port). Without authentication only loopback addresses are allowed.")
        .env("PALISADE_LISTEN", set!(text listen)).flag("listen", set!(text listen)).default("127.0.0.1:8080");
    METRICS_LISTEN = opt(keys::METRICS_LISTEN, Kind::Text, "A private HTTP listener (IP and port) serving `/metrics`, `/healthz`, `/readyz` and `/readyz/detail` with no authentication: bind it to loopback or an internal address. Unset: `/metrics` is served nowhere. Not with `--stdio`.")
        .env("PALISADE_METRICS_LISTEN", set!(text metrics_listen)).flag("metrics-listen", set!(text metrics_listen));
    PUBLIC_URL = opt(keys::PUBLIC_URL, Kind::Text, "The canonical resource URI of this server: the audience tokens must be issued for, and the origin of the development issuer.")
        .env("PALISADE_PUBLIC_URL", set!(text public_url)).flag("public-url", set!(text public_url)).described("`http://<listen>/mcp`");
    DATA_DIR = opt(keys::DATA_DIR, Kind::Path, "Directory for the embedded database, generated keys and the server secret.")
        .env("PALISADE_DATA_DIR", set!(path data_dir)).flag("data-dir", set!(path data_dir)).default("palisade-data")
        .protected();
    STORE = opt(keys::STORE, Kind::Text, "The store: `sqlite:<path>` or `postgres://…`.")
        .env("PALISADE_STORE", set!(text store)).flag("store", set!(text store)).described("`sqlite:<data_dir>/palisade.db`");
    SECRET_FILE = opt(keys::SECRET_FILE, Kind::Path, "File holding the 32-byte server secret (64 hex characters), generated on first run.")
        .env("PALISADE_SECRET_FILE", set!(path secret_file)).described("`<data_dir>/server-secret`")
        .protected();
    WATCH_CONFIG = opt(keys::WATCH_CONFIG, Kind::Bool, "Reload the configuration when its file changes (read every second; applied once unchanged for a second). `SIGHUP` and `palisade reload` reload it either way. Only `[[upstreams]]` reloads: a change of any other key is refused, naming it.")
        .env("PALISADE_WATCH_CONFIG", set!(bool watch_config)).default("true");
    EVENTS_REDIS = opt(keys::EVENTS_REDIS, Kind::Text, "A Redis or Valkey URL (`redis://…`, `rediss://…`) through which instances sharing a store hand each other their server events (list changes, resource updates, task changes, revocations) for their listen streams, on a channel named by `public_url`. Unset: events reach only the instance that raised them.")
        .env("PALISADE_EVENTS_REDIS", set!(text events_redis));
    LIMITS_MAX_BODY_BYTES = opt(keys::LIMITS_MAX_BODY_BYTES, Kind::Integer, "Largest request body (HTTP) or line (stdio), in bytes (1024–67108864).")
        .env("PALISADE_MAX_BODY_BYTES", set!(usize limits.max_body_bytes)).flag("max-body-bytes", set!(usize limits.max_body_bytes)).default("1048576");
    LIMITS_REQUEST_TIMEOUT_SECS = opt(keys::LIMITS_REQUEST_TIMEOUT_SECS, Kind::Integer, "Per-request timeout in seconds (1–600).")
        .env("PALISADE_REQUEST_TIMEOUT_SECS", set!(u64 limits.request_timeout_secs)).flag("request-timeout-secs", set!(u64 limits.request_timeout_secs)).default("60");
    LIMITS_PAGE_SIZE = opt(keys::LIMITS_PAGE_SIZE, Kind::Integer, "Items per page of every list method (1–1000).")
        .flag("page-size", set!(usize limits.page_size)).default("100");
    LIMITS_HEADER_READ_TIMEOUT_SECS = opt(keys::LIMITS_HEADER_READ_TIMEOUT_SECS, Kind::Integer, "Seconds a client has to send a request's whole header section (1–300), else the connection is closed.")
        .env("PALISADE_LIMITS_HEADER_READ_TIMEOUT_SECS", set!(u64 limits.header_read_timeout_secs)).default("10");
    LIMITS_BODY_READ_TIMEOUT_SECS = opt(keys::LIMITS_BODY_READ_TIMEOUT_SECS, Kind::Integer, "Seconds a request's whole body has to arrive in once the headers are in (1–600), else `408`.")
        .env("PALISADE_LIMITS_BODY_READ_TIMEOUT_SECS", set!(u64 limits.body_read_timeout_secs)).default("30");
    LIMITS_IDLE_TIMEOUT_SECS = opt(keys::LIMITS_IDLE_TIMEOUT_SECS, Kind::Integer, "Seconds an HTTP connection may stay open with no request in flight (1–3600); an open SSE stream is a request in flight.")
        .env("PALISADE_LIMITS_IDLE_TIMEOUT_SECS", set!(u64 limits.idle_timeout_secs)).default("60");
    LIMITS_MAX_CONNECTIONS = opt(keys::LIMITS_MAX_CONNECTIONS, Kind::Integer, "Most HTTP connections open at once (1–100000); at the cap the server stops accepting until one closes.")
        .env("PALISADE_LIMITS_MAX_CONNECTIONS", set!(usize limits.max_connections)).default("1024");
    LIMITS_MAX_STREAMS_PER_PRINCIPAL = opt(keys::LIMITS_MAX_STREAMS_PER_PRINCIPAL, Kind::Integer, "Most open listen and GET streams per principal on one instance (1–1000).")
        .env("PALISADE_LIMITS_MAX_STREAMS_PER_PRINCIPAL", set!(usize limits.max_streams_per_principal)).default("8");
    LIMITS_MAX_LISTEN_FILTER_ENTRIES = opt(keys::LIMITS_MAX_LISTEN_FILTER_ENTRIES, Kind::Integer, "Most entries of one listen filter list, `taskIds` or `resourceSubscriptions` (1–10000).")
        .env("PALISADE_LIMITS_MAX_LISTEN_FILTER_ENTRIES", set!(usize limits.max_listen_filter_entries)).default("100");
    HTTP_ALLOWED_HOSTS = opt(keys::HTTP_ALLOWED_HOSTS, Kind::List, "Extra accepted `Host` values, e.g. `mcp.example.com` (the flag is repeatable and adds to the file's list).")
        .flag("allow-host", set!(append http.allowed_hosts));
    HTTP_ALLOWED_ORIGINS = opt(keys::HTTP_ALLOWED_ORIGINS, Kind::List, "Extra accepted `Origin` values, e.g. `https://app.example.com` (the flag is repeatable and adds to the file's list).")
        .flag("allow-origin", set!(append http.allowed_origins));
    AUTH_MODE = opt(keys::AUTH_MODE, Kind::Text, "How callers are authenticated: `bearer` or `none` (loopback and stdio only).")
        .env("PALISADE_AUTH_MODE", set!(text auth.mode)).flag("auth", set!(text auth.mode)).described("`bearer` for the demo, `none` for the conformance fixture");
    AUTH_DEV_ISSUER = opt(keys::AUTH_DEV_ISSUER, Kind::Bool, "The development issuer (`palisade dev token`, and its authorization server, which gives anyone a token): `true`, `false`, or the `[auth.dev_issuer]` table below. Allowed only when `listen` and `public_url` are loopback.")
        .env("PALISADE_DEV_ISSUER", set_dev_issuer).described("on for the demo on loopback without issuers; off for the gateway");
    AUTH_DEV_ISSUER_ENABLED = opt(keys::AUTH_DEV_ISSUER_ENABLED, Kind::Bool, "The development issuer on or off, in the table form.")
        .described("on for the demo on loopback without issuers; off for the gateway");
    AUTH_DEV_ISSUER_AUTO_APPROVE = opt(keys::AUTH_DEV_ISSUER_AUTO_APPROVE, Kind::Bool, "Approve every authorization request with the defaults, without the page (tests and scripts). Loopback listeners only.")
        .env("PALISADE_DEV_ISSUER_AUTO_APPROVE", set_dev_auto_approve).default("false");
    AUTH_DEV_ISSUER_DEFAULT_SUBJECT = opt(keys::AUTH_DEV_ISSUER_DEFAULT_SUBJECT, Kind::Text, "Subject pre-filled on the page (and granted by `auto_approve`): 1–64 letters, digits or `. _ @ -`.")
        .default("alice");
    AUTH_DEV_ISSUER_DEFAULT_TENANT = opt(keys::AUTH_DEV_ISSUER_DEFAULT_TENANT, Kind::Text, "Tenant pre-filled on the page (and granted by `auto_approve`).")
        .default("acme");
    AUTH_DEV_ISSUER_ACCESS_TOKEN_TTL_SECS = opt(keys::AUTH_DEV_ISSUER_ACCESS_TOKEN_TTL_SECS, Kind::Integer, "Lifetime of the access tokens it issues, in seconds (60–3600).")
        .default("300");
    AUTH_DEV_ISSUER_CLIENT_METADATA_ALLOW_LOOPBACK = opt(keys::AUTH_DEV_ISSUER_CLIENT_METADATA_ALLOW_LOOPBACK, Kind::Bool, "Tests only: client metadata documents may be fetched from loopback addresses (and over plain http there). Loopback listeners only.")
        .default("false");
    AUTH_DEV_ISSUER_CLIENT_METADATA_CA_FILE = opt(keys::AUTH_DEV_ISSUER_CLIENT_METADATA_CA_FILE, Kind::Path, "Tests only: extra trust anchors (PEM) for fetching client metadata documents.");
    AUTH_LEEWAY_SECS = opt(keys::AUTH_LEEWAY_SECS, Kind::Integer, "Clock-skew leeway for token times, in seconds (at most 60).")
        .default("30");
    AUTH_REQUIRED_TYP = opt(keys::AUTH_REQUIRED_TYP, Kind::Text, "Required JOSE `typ` of tokens, e.g. `at+jwt`.");
    AUTH_TENANT_CLAIM = opt(keys::AUTH_TENANT_CLAIM, Kind::Text, "The claim naming the tenant.")
        .default("tenant");
    AUTH_CLIENT_CLAIM = opt(keys::AUTH_CLIENT_CLAIM, Kind::Text, "The claim naming the OAuth client.")
        .default("client_id");
    AUTH_TOKEN_CACHE_CAPACITY = opt(keys::AUTH_TOKEN_CACHE_CAPACITY, Kind::Integer, "Verified tokens remembered, keyed by their SHA-256 and never past `exp`; 0 disables the cache.")
        .env("PALISADE_TOKEN_CACHE_CAPACITY", set!(usize auth.token_cache_capacity)).default("10000");
    AUTH_JWKS_ALLOW_LOOPBACK = opt(keys::AUTH_JWKS_ALLOW_LOOPBACK, Kind::Bool, "Development only: issuers' JWKS may be fetched from loopback addresses (and over plain http there). Loopback listeners only.")
        .default("false");
    AUTH_JWKS_ALLOWED_NETWORKS = opt(keys::AUTH_JWKS_ALLOWED_NETWORKS, Kind::List, "CIDR networks, e.g. `10.20.0.0/16`, that JWKS may be fetched from although they are private or otherwise special: a deliberately internal issuer. Everything else must be a public address.");
    AUTH_JWKS_PROXY = opt(keys::AUTH_JWKS_PROXY, Kind::Text, "An HTTP CONNECT proxy, `http://host:port`, for JWKS fetches. It resolves the issuers' names itself, so it must refuse internal destinations.");
    AUTH_ISSUERS = opt(keys::AUTH_ISSUERS, Kind::Table, "Trusted external issuers: `[[auth.issuers]]` tables with the three keys below. Bearer mode needs at least one, or (on loopback) the development issuer.");
    AUTH_ISSUERS_ISSUER = opt(keys::AUTH_ISSUERS_ISSUER, Kind::Text, "The issuer identifier (`iss`).");
    AUTH_ISSUERS_JWKS_URL = opt(keys::AUTH_ISSUERS_JWKS_URL, Kind::Text, "Its JWKS URL.");
    AUTH_ISSUERS_ALGORITHMS = opt(keys::AUTH_ISSUERS_ALGORITHMS, Kind::List, "The algorithms accepted from it: `ES256`, `EdDSA`, `RS256`.");
    HANDLES_SUBJECT_KEY_FILE = opt(keys::HANDLES_SUBJECT_KEY_FILE, Kind::Path, "File holding the 32-byte handle subject key (64 hex characters), generated on first run.")
        .env("PALISADE_HANDLES_SUBJECT_KEY_FILE", set!(path handles.subject_key_file)).described("`<data_dir>/handle-subject-key`")
        .protected();
    HANDLES_SUBJECT_KEY = opt(keys::HANDLES_SUBJECT_KEY, Kind::Text, "Environment only: the handle subject key itself (64 hex characters), instead of the file.")
        .variable("PALISADE_HANDLES_SUBJECT_KEY").env_only();
    HANDLES_RETENTION_SECS = opt(keys::HANDLES_RETENTION_SECS, Kind::Integer, "How long expired or revoked handle rows are kept before the retention job deletes them, in seconds (60–31536000).")
        .default("86400");
    HANDLES_POLICIES = opt(keys::HANDLES_POLICIES, Kind::Table, "Per object type handle policy, overriding the application's: a table with the four keys below.");
    HANDLES_POLICIES_TTL_SECS = opt(keys::HANDLES_POLICIES_TTL_SECS, Kind::Integer, "Handle lifetime in seconds.");
    HANDLES_POLICIES_ALLOWED_SCOPES = opt(keys::HANDLES_POLICIES_ALLOWED_SCOPES, Kind::List, "Scopes a handle of this type may grant.");
    HANDLES_POLICIES_MAX_SCOPES = opt(keys::HANDLES_POLICIES_MAX_SCOPES, Kind::Integer, "Most scopes per handle.");
    HANDLES_POLICIES_POLICY_VERSION = opt(keys::HANDLES_POLICIES_POLICY_VERSION, Kind::Integer, "The policy version; raising it invalidates older handles.");
    DELEGATION_ENABLED = opt(keys::DELEGATION_ENABLED, Kind::Bool, "Accept delegation capabilities (a sub-agent acting for a user under a capability that only narrows) and offer the tools `palisade_delegate`, `palisade_delegation_revoke` and `palisade_delegation_approve`.")
        .env("PALISADE_DELEGATION_ENABLED", set!(bool delegation.enabled)).default("false");
    DELEGATION_MAX_DEPTH = opt(keys::DELEGATION_MAX_DEPTH, Kind::Integer, "Deepest delegation chain (a root capability is depth 0), 1–16.")
        .env("PALISADE_DELEGATION_MAX_DEPTH", set!(u64 delegation.max_depth)).default("3");
    DELEGATION_MAX_CALLS = opt(keys::DELEGATION_MAX_CALLS, Kind::Integer, "Largest call budget of a root capability (a child's is reserved from its parent's), 1–1000000.")
        .env("PALISADE_DELEGATION_MAX_CALLS", set!(u64 delegation.max_calls)).default("1000");
    DELEGATION_MAX_LIFETIME_SECS = opt(keys::DELEGATION_MAX_LIFETIME_SECS, Kind::Integer, "Longest lifetime of a capability in seconds (60–2592000); a child never outlives its parent.")
        .env("PALISADE_DELEGATION_MAX_LIFETIME_SECS", set!(u64 delegation.max_lifetime_secs)).default("3600");
    POLICIES_FILES = opt(keys::POLICIES_FILES, Kind::List, "Operator policy files (Cedar): each a `.cedar` file or `DIR/*.cedar`. With any configured, every tool call, prompt, resource read, completion, listen stream and task operation needs a policy that permits it and none that forbids it; `palisade policy check` validates them against the registry's generated schema. Unset: the scope rules only.");
    POLICIES_GROUP_CLAIMS = opt(keys::POLICIES_GROUP_CLAIMS, Kind::List, "Token claims holding the caller's groups or roles (each a string, space-separated, or an array of strings): the principal's `Palisade::Group` parents and `principal.groups`.");
    POLICIES_MAX_ARGUMENT_DEPTH = opt(keys::POLICIES_MAX_ARGUMENT_DEPTH, Kind::Integer, "Deepest nesting of records and sets in a policy's `context.arguments` (1–8); deeper declared arguments are left out of the view.")
        .default("3");
    POLICIES_MAX_ARGUMENT_BYTES = opt(keys::POLICIES_MAX_ARGUMENT_BYTES, Kind::Integer, "Longest argument string a policy sees, in bytes (1–1048576); with policies on, a call with a longer one is refused, never cut.")
        .default("4096");
    POLICIES_MAX_ARGUMENT_ENTRIES = opt(keys::POLICIES_MAX_ARGUMENT_ENTRIES, Kind::Integer, "Most members of one argument array or object a policy sees (1–10000); with policies on, a call with more is refused.")
        .default("64");
    POLICIES_REQUIRE_SIGNED = opt(keys::POLICIES_REQUIRE_SIGNED, Kind::Bool, "Every policy file needs `FILE.sig`, a signature of the kill switch's policy root key (`palisade policy sign-files`); an unsigned or changed file stops the start and refuses a reload. Needs the kill switch (`dev` or an authority). Changes only at a restart.")
        .default("false");
    RATE_LIMIT_STORE = opt(keys::RATE_LIMIT_STORE, Kind::Text, "Where rate limits count: `local` (each instance on its own) or `redis` (every instance of the deployment together, one atomic script per check).")
        .env("PALISADE_RATE_LIMIT_STORE", set!(text rate_limit.store)).default("local");
    RATE_LIMIT_REDIS_URL = opt(keys::RATE_LIMIT_REDIS_URL, Kind::Text, "The Redis or Valkey URL (`redis://…`, `rediss://…`) of `store = \"redis\"`.")
        .env("PALISADE_RATE_LIMIT_REDIS_URL", set!(text rate_limit.redis_url)).described("`events_redis`");
    RATE_LIMIT_TIMEOUT_MS = opt(keys::RATE_LIMIT_TIMEOUT_MS, Kind::Integer, "Longest wait for the Redis store's answer to one check, in milliseconds (1–5000); longer counts as a failure.")
        .env("PALISADE_RATE_LIMIT_TIMEOUT_MS", set!(u64 rate_limit.timeout_ms)).default("50");
    RATE_LIMIT_ON_STORE_FAILURE = opt(keys::RATE_LIMIT_ON_STORE_FAILURE, Kind::Text, "When the Redis store is down or slow: `refuse` the request (503, fail closed) or count it in this instance under the same rules (`local`: the deployment then allows up to one limit per instance).")
        .env("PALISADE_RATE_LIMIT_ON_STORE_FAILURE", set!(text rate_limit.on_store_failure)).default("refuse");
    RATE_LIMITS = opt(keys::RATE_LIMITS, Kind::Table, "Rate limits and quotas: `[[rate_limits]]` tables with the keys below. A request passes only if every rule that applies lets it; a refusal is HTTP 429 with `Retry-After` (a JSON-RPC error -32034 whose data carries the wait on stdio).");
    RATE_LIMITS_NAME = opt(keys::RATE_LIMITS_NAME, Kind::Text, "A unique name (a-z, 0-9, `_`, `-`; the metrics' `limit` label).");
    RATE_LIMITS_KEY = opt(keys::RATE_LIMITS_KEY, Kind::List, "What the state is keyed on, any of `subject`, `tenant`, `client`, `tool`, `upstream`, `agent` (the delegated agent); the rule applies to requests that have every one. Empty: one state for all.");
    RATE_LIMITS_METHODS = opt(keys::RATE_LIMITS_METHODS, Kind::List, "The methods counted, e.g. `[\"tools/call\"]`. Empty: every method.");
    RATE_LIMITS_TOOLS = opt(keys::RATE_LIMITS_TOOLS, Kind::List, "Only calls of these tools are counted. Empty: any.");
    RATE_LIMITS_UPSTREAMS = opt(keys::RATE_LIMITS_UPSTREAMS, Kind::List, "Only operations relayed from these upstreams are counted (the gateway). Empty: any.");
    RATE_LIMITS_RATE = opt(keys::RATE_LIMITS_RATE, Kind::Integer, "Requests per `per_secs` (a GCRA: one timestamp per key), 1–1000000.");
    RATE_LIMITS_PER_SECS = opt(keys::RATE_LIMITS_PER_SECS, Kind::Integer, "The rate's period in seconds.")
        .described("`1`");
    RATE_LIMITS_BURST = opt(keys::RATE_LIMITS_BURST, Kind::Integer, "Requests allowed at once before the rate applies.")
        .described("`rate`");
    RATE_LIMITS_QUOTA = opt(keys::RATE_LIMITS_QUOTA, Kind::Integer, "Requests per quota window.");
    RATE_LIMITS_QUOTA_WINDOW_SECS = opt(keys::RATE_LIMITS_QUOTA_WINDOW_SECS, Kind::Integer, "The quota's window in seconds, aligned to the Unix epoch (86400: a UTC day).")
        .described("`86400`");
    LEGACY_ENABLED = opt(keys::LEGACY_ENABLED, Kind::Bool, "Serve the 2025-era session wire (`initialize`, `Mcp-Session-Id`) beside 2026-07-28.")
        .default("true");
    LEGACY_VERSIONS = opt(keys::LEGACY_VERSIONS, Kind::List, "The earlier revisions accepted, newest first.")
        .described("`[\"2025-11-25\", \"2025-06-18\"]`");
    LEGACY_IDLE_TIMEOUT_SECS = opt(keys::LEGACY_IDLE_TIMEOUT_SECS, Kind::Integer, "A session dies after this many seconds without a request (10–86400).")
        .default("1800");
    LEGACY_ABSOLUTE_TIMEOUT_SECS = opt(keys::LEGACY_ABSOLUTE_TIMEOUT_SECS, Kind::Integer, "A session dies this many seconds after `initialize` (at least the idle timeout, at most 604800).")
        .default("43200");
    KILLSWITCH_MODE = opt(keys::KILLSWITCH_MODE, Kind::Text, "`off`, `dev` (generated keys and an in-process development authority in the data directory) or `authority` (an external authority: the files below).")
        .env("PALISADE_KILLSWITCH_MODE", set!(text killswitch.mode)).described("`dev` for the demo, `off` for the conformance fixture");
    KILLSWITCH_SERVER_RELEASE = opt(keys::KILLSWITCH_SERVER_RELEASE, Kind::Text, "The release this server reports as its `server_release` target (1–128 characters).")
        .described("the binary's version");
    KILLSWITCH_ROOT_PUBLIC_KEY = opt(keys::KILLSWITCH_ROOT_PUBLIC_KEY, Kind::Path, "Authority mode: the policy root public key file.");
    KILLSWITCH_POLICY = opt(keys::KILLSWITCH_POLICY, Kind::Path, "Authority mode: the signed policy envelope file.");
    KILLSWITCH_KEY_TRUST_ROOT = opt(keys::KILLSWITCH_KEY_TRUST_ROOT, Kind::Path, "Authority mode: the key trust root directory (holds the authority public key the policy pins).");
    KILLSWITCH_AUTHORITY_URL = opt(keys::KILLSWITCH_AUTHORITY_URL, Kind::Text, "Authority mode: the authority's `https://host:port` URL.");
    KILLSWITCH_AUTHORITY_CA = opt(keys::KILLSWITCH_AUTHORITY_CA, Kind::Path, "Authority mode: CA bundle (PEM), the only trust anchors for the authority's certificate.");
    KILLSWITCH_CLIENT_CERT = opt(keys::KILLSWITCH_CLIENT_CERT, Kind::Path, "Authority mode: this server's client certificate chain (PEM).");
    KILLSWITCH_CLIENT_KEY = opt(keys::KILLSWITCH_CLIENT_KEY, Kind::Path, "Authority mode: this server's client key (PEM).")
        .protected();
    KILLSWITCH_GENERATION_STORE = opt(keys::KILLSWITCH_GENERATION_STORE, Kind::Text, "Authority mode: where accepted generations are kept, `sqlite:<path>` or `redis://…`.")
        .described("`sqlite:<data_dir>/killswitch-generations.db`");
    KILLSWITCH_TARGET_KEY_FILE = opt(keys::KILLSWITCH_TARGET_KEY_FILE, Kind::Path, "Authority mode: the 32-byte target key file (shared with the authority's operators).")
        .protected();
    KILLSWITCH_AUTHORITY_DB = opt(keys::KILLSWITCH_AUTHORITY_DB, Kind::Path, "The authority's SQLite database, when this server shares it (the demo's orders then redeem commit tokens in their own transaction); also the default of `palisade authority disable|enable|status --db`.")
        .protected();
    KILLSWITCH_STREAM_RECHECK_SECS = opt(keys::KILLSWITCH_STREAM_RECHECK_SECS, Kind::Integer, "How often open listen and GET streams re-check their targets, in seconds (1–3600); a refusal ends the stream.")
        .env("PALISADE_KILLSWITCH_STREAM_RECHECK_SECS", set!(u64 killswitch.stream_recheck_secs)).default("5");
    KILLSWITCH_REPLAY_WINDOW_MS = opt(keys::KILLSWITCH_REPLAY_WINDOW_MS, Kind::Integer, "How long a head this instance accepted is answered from memory when it comes again, without the generation store, in milliseconds (0–60000; 0: every answer goes to the store). Another instance's higher generation is seen at most this late (SECURITY.md).")
        .env("PALISADE_KILLSWITCH_REPLAY_WINDOW_MS", set!(u64 killswitch.replay_window_ms)).default("1000");
    KILLSWITCH_AUTHORITY_ENVELOPE = opt(keys::KILLSWITCH_AUTHORITY_ENVELOPE, Kind::Text, "`batch` (many callers' queries under one signed Merkle root) or `single` (the v2 envelope, one signed head per target, for authorities without the batch endpoint).")
        .default("batch");
    TELEMETRY_OTLP_ENDPOINT = opt(keys::TELEMETRY_OTLP_ENDPOINT, Kind::Text, "OTLP/HTTP (protobuf) collector base URL, http or https, e.g. `http://127.0.0.1:4318`; `/v1/traces` is appended unless the path ends with it. Unset: no trace export.")
        .env("PALISADE_TELEMETRY_OTLP_ENDPOINT", set!(text telemetry.otlp_endpoint));
    TELEMETRY_SERVICE_NAME = opt(keys::TELEMETRY_SERVICE_NAME, Kind::Text, "`service.name` of the exported spans.")
        .env("PALISADE_TELEMETRY_SERVICE_NAME", set!(text telemetry.service_name)).default("palisade");
    TELEMETRY_SAMPLING_RATIO = opt(keys::TELEMETRY_SAMPLING_RATIO, Kind::Number, "Fraction of new traces sampled, 0.0–1.0; a continued trace follows the caller's sampled flag.")
        .env("PALISADE_TELEMETRY_SAMPLING_RATIO", set!(f64 telemetry.sampling_ratio)).default("1.0");
    TELEMETRY_OTLP_HEADERS_FILE = opt(keys::TELEMETRY_OTLP_HEADERS_FILE, Kind::Path, "A file of `Name: value` lines sent as headers to the collector (credentials).")
        .env("PALISADE_TELEMETRY_OTLP_HEADERS_FILE", set!(path telemetry.otlp_headers_file))
        .protected();
    TELEMETRY_OTLP_HEADERS = opt(keys::TELEMETRY_OTLP_HEADERS, Kind::Text, "Environment only: headers for the collector as `name=value` pairs, comma-separated (credentials never go in the file).")
        .env("PALISADE_TELEMETRY_OTLP_HEADERS", set!(text telemetry.otlp_headers)).env_only();
    TELEMETRY_CONTINUE_INCOMING_TRACES = opt(keys::TELEMETRY_CONTINUE_INCOMING_TRACES, Kind::Bool, "Continue a request's `_meta.traceparent` (its trace id becomes the audit trace id); `false` starts a trace per request.")
        .env("PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES", set!(bool telemetry.continue_incoming_traces)).default("true");
    AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS = opt(keys::AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS, Kind::Integer, "How often refusals made before the pipeline (transport limits, Host/Origin) are written to the audit log, aggregated, in seconds (1–3600).")
        .env("PALISADE_AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS", set!(u64 audit.transport_refusal_interval_secs)).default("10");
    AUDIT_SEGMENT_DIR = opt(keys::AUDIT_SEGMENT_DIR, Kind::Path, "This instance's local audit segment: the request path writes its own audit chain here before a handler runs, and a shipper moves the records into the store in batches. One per instance (never shared); unshipped records are shipped at the next start.")
        .env("PALISADE_AUDIT_SEGMENT_DIR", set!(path audit.segment_dir)).described("`<data_dir>/audit-segment`")
        .protected();
    AUDIT_DURABILITY = opt(keys::AUDIT_DURABILITY, Kind::Text, "When an audit record counts as written: `process` (written to the segment file: survives the process being killed) or `power` (also `fdatasync`ed, group-committed: survives a power loss).")
        .env("PALISADE_AUDIT_DURABILITY", set!(text audit.durability)).default("process");
    AUDIT_CHECKPOINT_INTERVAL_SECS = opt(keys::AUDIT_CHECKPOINT_INTERVAL_SECS, Kind::Integer, "How often one instance signs a checkpoint over every audit chain's head, when any changed, in seconds (1–3600): records newer than the last checkpoint are the window in which a deleted tail goes unnoticed.")
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

/// The file keys the environment and `flags` set, each with where its value came from (the
/// variable, or `--flag`), in the order they are applied: a validation error of one of these keys
/// then says the value was not the file's.
pub(crate) fn overrides(flags: &ConfigFlags, env: &dyn Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    let from_env = OPTIONS.iter().filter_map(|spec| {
        let name = spec.env.filter(|name| spec.set.is_some() && env(name).is_some())?;
        Some((spec.key, name.to_owned()))
    });
    let from_flags = flags.0.iter().filter_map(|(spec, _)| Some((spec.key, format!("--{}", spec.flag?))));
    from_env.chain(from_flags).collect()
}

/// The configuration flags of [`OPTIONS`] given on a command line (`--listen`, `--store`, …);
/// `serve` and `dev token` both flatten them in, so both resolve the same settings.
#[derive(Debug, Clone, Default)]
pub struct ConfigFlags(pub(super) Vec<(&'static OptionSpec, String)>);

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
