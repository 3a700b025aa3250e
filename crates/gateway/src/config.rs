//! The gateway's configuration: `[gateway]`, `[pins]` and `[[upstreams]]` as written in TOML
//! ([`RawGateway`], [`RawPins`], [`RawUpstream`]), validated once into [`GatewaySettings`], which
//! cannot be invalid. A bad value is reported with the dotted key that holds it
//! (`upstreams[1].credential.token_url`); secrets are named by where they come from, never shown.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use crate::credentials::{ClientAuth, CredentialConfig, SecretSource};
use crate::names::{Separator, check_label};
use crate::pins::ReviewerKeys;
use crate::upstream::{ProtocolChoice, UpstreamLimits};

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

/// One `[[upstreams]]` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// DNS-label style id.
    pub id: String,
    /// The upstream's Streamable HTTP endpoint.
    pub url: String,
    /// Prefix of its exposed names; default the id; `""` exposes its names unprefixed.
    pub prefix: Option<String>,
    /// `auto` (default), `2026-07-28`, or `2025` (the 2025-11-25 / 2025-06-18 handshake).
    pub protocol: Option<String>,
    /// Seconds to connect. Default 5.
    pub connect_timeout_secs: Option<u64>,
    /// Seconds for one request, start to end. Default 30.
    pub request_timeout_secs: Option<u64>,
    /// Largest upstream response body, bytes. Default 4 MiB.
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

/// `[upstreams.credential]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCredential {
    /// `none` (default), `static`, `client_credentials`, `token_exchange`.
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
    /// client_credentials: the most an upstream's `insufficient_scope` may widen them to.
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
    /// Its endpoint (also its canonical resource URI for OAuth).
    pub url: Url,
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

/// Largest accepted `max_response_bytes` (256 MiB).
const MAX_RESPONSE_CAP: u64 = 256 * 1024 * 1024;

/// Validates the three sections. No upstreams is an error only for `palisade gateway` (the
/// caller decides); here it is allowed.
pub fn validate(
    gateway: RawGateway,
    pins: RawPins,
    upstreams: Vec<RawUpstream>,
) -> Result<GatewaySettings, GatewayConfigError> {
    let separator = match gateway.separator.as_deref() {
        None => Separator::Underscore,
        Some(text) => {
            Separator::parse(text).ok_or_else(|| bad("gateway.separator", "must be \"_\", \"__\" or \".\""))?
        }
    };
    let pins = validate_pins(pins)?;
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
    Ok(GatewaySettings { separator, pins, upstreams: out })
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
    let url = Url::parse(&raw.url).map_err(|_| bad(key("url"), "not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(bad(key("url"), "must be an http or https URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(key("url"), "must not carry credentials (use [upstreams.credential])"));
    }
    if url.fragment().is_some() {
        return Err(bad(key("url"), "must not have a fragment"));
    }
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
        _ => return Err(bad(field("kind"), "must be none, static, client_credentials or token_exchange")),
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
        }
        let file: File = toml::from_str(text).unwrap();
        validate(file.gateway, file.pins, file.upstreams)
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
    fn errors_never_show_a_secret_value() {
        let text = "[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\n[upstreams.credential]\nkind = \"static\"\nsecret_env = \"\"";
        let error = upstreams(text).unwrap_err();
        assert_eq!(error.key, "upstreams[0].credential.secret_env");
    }
}
