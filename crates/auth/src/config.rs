//! Resource-server configuration: the raw, deserializable `ResourceServerConfig` and its
//! validation into `ValidatedConfig`, a form that cannot be invalid (every URL checked, algorithm
//! allow-lists limited to ES256/EdDSA/RS256, leeway bounded, static key sets parsed).

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;

use jsonwebtoken::Algorithm;
use jsonwebtoken::jwk::JwkSet;
use serde::Deserialize;
use url::{Host, Url};

use crate::egress::EgressError;
use crate::jws::JwsAlgorithm;
use crate::keys::{KeySet, KeySetError};

/// Largest accepted clock-skew leeway, in seconds.
pub const MAX_LEEWAY_SECS: u64 = 60;
/// Largest accepted verified-token cache capacity.
pub const MAX_CACHE_CAPACITY: usize = 1_000_000;

/// How this server checks bearer tokens (control C1). Validated by
/// [`crate::TokenVerifier::new`]; see [`ConfigError`] for what is refused.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceServerConfig {
    /// This server's canonical resource URI (RFC 8707/9728). A token's `aud` must contain exactly
    /// this string. https, or http on a loopback host; no fragment.
    pub resource: String,
    /// Where this server's Protected Resource Metadata is served; advertised in every challenge.
    pub resource_metadata_url: String,
    /// Optional human-readable name published as `resource_name` in the metadata.
    #[serde(default)]
    pub resource_name: Option<String>,
    /// Trusted issuers (authorization servers), each with its keys and algorithm allow-list.
    /// At least one.
    pub issuers: Vec<IssuerConfig>,
    /// Clock-skew allowance for `exp`, `nbf` and `iat`, in seconds; at most [`MAX_LEEWAY_SECS`].
    #[serde(default = "default_leeway_secs")]
    pub leeway_secs: u64,
    /// If set, the JOSE header `typ` must equal this (case-insensitively, with or without an
    /// `application/` prefix), e.g. `"at+jwt"` for RFC 9068 access tokens.
    #[serde(default)]
    pub required_typ: Option<String>,
    /// Claim holding the tenant id. Default `"tenant"`.
    #[serde(default = "default_tenant_claim")]
    pub tenant_claim: String,
    /// Claim holding the OAuth client id. Default `"client_id"`; `azp` is the fallback.
    #[serde(default = "default_client_claim")]
    pub client_claim: String,
    /// Claims holding the caller's groups or roles (a string, space-separated, or an array of
    /// strings each), e.g. `["groups", "roles"]`; operator policies see them as the principal's
    /// groups. Default none.
    #[serde(default)]
    pub group_claims: Vec<String>,
    /// Scopes this resource understands; published in metadata and in 401 challenges.
    #[serde(default)]
    pub scopes_supported: Vec<String>,
    /// Maximum number of verified tokens remembered (0 disables the cache); at most
    /// [`MAX_CACHE_CAPACITY`].
    #[serde(default = "default_cache_capacity")]
    pub cache_capacity: usize,
    /// The development flag of the JWKS fetch: plain http to a loopback host, and loopback
    /// addresses, are allowed (a local issuer in tests or development). Default off.
    #[serde(default)]
    pub jwks_allow_loopback: bool,
    /// The operator's allow-list for JWKS fetches: CIDR networks (`10.20.0.0/16`, `fd00:1::/48`)
    /// that may be reached although they are private or otherwise special (a deliberately
    /// internal issuer). Default none.
    #[serde(default)]
    pub jwks_allowed_networks: Vec<String>,
    /// An HTTP CONNECT proxy (`http://host:port`, no credentials) for JWKS fetches. The proxy
    /// resolves the issuer's host name itself and must refuse internal destinations. Default none.
    #[serde(default)]
    pub jwks_proxy: Option<String>,
}

/// One trusted issuer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// The issuer identifier; a token's `iss` must equal it exactly. https (or http on a loopback
    /// host) URL without query or fragment.
    pub issuer: String,
    /// Where the issuer's signing keys come from.
    pub jwks: JwksSource,
    /// Algorithms accepted from this issuer: a non-empty subset of ES256, EdDSA and RS256.
    pub algorithms: Vec<Algorithm>,
}

/// Source of an issuer's JSON Web Key Set.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JwksSource {
    /// Fetched through the egress guard: over https to a public address (http, and loopback
    /// addresses, only with [`ResourceServerConfig::jwks_allow_loopback`]; internal networks only
    /// when listed in [`ResourceServerConfig::jwks_allowed_networks`]), cached and refreshed per
    /// [`crate::JwksPolicy`].
    Url(String),
    /// Fixed keys (e.g. the development issuer's). Must contain at least one usable key.
    Static(JwkSet),
}

fn default_leeway_secs() -> u64 {
    30
}
fn default_tenant_claim() -> String {
    "tenant".to_owned()
}
fn default_client_claim() -> String {
    "client_id".to_owned()
}
fn default_cache_capacity() -> usize {
    10_000
}

impl ResourceServerConfig {
    /// A configuration with defaults: 30 s leeway, no `typ` requirement, tenant claim `tenant`,
    /// client claim `client_id`, no scopes, a 10 000-entry cache.
    pub fn new(
        resource: impl Into<String>,
        resource_metadata_url: impl Into<String>,
        issuers: Vec<IssuerConfig>,
    ) -> Self {
        Self {
            resource: resource.into(),
            resource_metadata_url: resource_metadata_url.into(),
            resource_name: None,
            issuers,
            leeway_secs: default_leeway_secs(),
            required_typ: None,
            tenant_claim: default_tenant_claim(),
            client_claim: default_client_claim(),
            group_claims: Vec::new(),
            scopes_supported: Vec::new(),
            cache_capacity: default_cache_capacity(),
            jwks_allow_loopback: false,
            jwks_allowed_networks: Vec::new(),
            jwks_proxy: None,
        }
    }
}

/// What is wrong with a URL in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    /// Not an absolute URL.
    #[error("not an absolute URL")]
    NotAUrl,
    /// Scheme other than https or http.
    #[error("scheme must be https")]
    UnsupportedScheme,
    /// Plain http to a host that is not a loopback IP or `localhost`.
    #[error("plain http is only allowed for loopback hosts")]
    PlainHttpNotLoopback,
    /// Has a `#fragment`.
    #[error("must not have a fragment")]
    HasFragment,
    /// Has a `?query` where none is allowed (issuer identifiers).
    #[error("must not have a query")]
    HasQuery,
    /// Embeds a user name or password.
    #[error("must not embed credentials")]
    HasCredentials,
}

/// Why a [`ResourceServerConfig`] was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A URL field is unusable.
    #[error("{field} {value:?}: {problem}")]
    InvalidUrl {
        /// Which field (`resource`, `resource_metadata_url`, `issuer`, `jwks url`).
        field: &'static str,
        /// The configured value.
        value: String,
        /// What is wrong with it.
        problem: UrlProblem,
    },
    /// `issuers` is empty.
    #[error("at least one issuer must be configured")]
    NoIssuers,
    /// The same issuer identifier is configured twice.
    #[error("issuer {0:?} is configured more than once")]
    DuplicateIssuer(String),
    /// An issuer has an empty algorithm list.
    #[error("issuer {0:?} has no allowed algorithms")]
    NoAlgorithms(String),
    /// An issuer allows an algorithm outside ES256/EdDSA/RS256 (HMAC, PSS, ES384, ...).
    #[error("issuer {issuer:?}: algorithm {algorithm:?} is not allowed (only ES256, EdDSA, RS256)")]
    DisallowedAlgorithm {
        /// The issuer.
        issuer: String,
        /// The refused algorithm.
        algorithm: Algorithm,
    },
    /// An issuer's static key set has no usable key.
    #[error("issuer {issuer:?}: static JWKS unusable: {source}")]
    StaticJwks {
        /// The issuer.
        issuer: String,
        /// Why the key set was refused.
        source: KeySetError,
    },
    /// `leeway_secs` exceeds [`MAX_LEEWAY_SECS`].
    #[error("leeway_secs {0} exceeds the maximum of {MAX_LEEWAY_SECS}")]
    LeewayTooLarge(u64),
    /// `cache_capacity` exceeds [`MAX_CACHE_CAPACITY`].
    #[error("cache_capacity {0} exceeds the maximum of {MAX_CACHE_CAPACITY}")]
    CacheTooLarge(usize),
    /// `required_typ` is empty or not visible ASCII.
    #[error("required_typ must be a non-empty media type")]
    InvalidRequiredTyp,
    /// `tenant_claim` or `client_claim` is empty.
    #[error("{0} must not be empty")]
    EmptyClaimName(&'static str),
    /// A `scopes_supported` entry is not an RFC 6749 scope-token.
    #[error("scopes_supported entry {0:?} is not a valid scope token")]
    InvalidScope(String),
    /// `resource_name` contains control characters.
    #[error("resource_name must not contain control characters")]
    InvalidResourceName,
    /// The HTTP client for JWKS fetches could not be built.
    #[error("cannot build the JWKS HTTP client: {0}")]
    HttpClient(String),
    /// A `jwks_allowed_networks` entry is not a CIDR network.
    #[error("jwks_allowed_networks entry {0:?} is not a CIDR network (e.g. 10.20.0.0/16)")]
    InvalidNetwork(String),
    /// `jwks_proxy` is not an http(s) URL with a host and without credentials.
    #[error("jwks_proxy {0:?} is not an http or https URL with a host (and no credentials)")]
    InvalidProxy(String),
    /// A JWKS URL the egress guard would never fetch (plain http or an IP literal in a refused
    /// range, under this configuration's development flag and allow-list).
    #[error("jwks url {url:?}: {source}{hint}")]
    JwksNotAllowed {
        /// The configured JWKS URL.
        url: String,
        /// The guard's refusal.
        source: EgressError,
        /// What would allow it, if anything should.
        hint: &'static str,
    },
}

/// A validated issuer.
pub(crate) struct ValidatedIssuer {
    pub(crate) issuer: String,
    pub(crate) algorithms: Vec<JwsAlgorithm>,
    pub(crate) jwks: ValidatedJwksSource,
}

/// A validated key source.
pub(crate) enum ValidatedJwksSource {
    Url(Url),
    Static(KeySet),
}

/// A configuration that passed every check.
pub(crate) struct ValidatedConfig {
    pub(crate) raw: ResourceServerConfig,
    pub(crate) leeway_ms: u64,
    /// Normalized (lower-case, no `application/` prefix).
    pub(crate) required_typ: Option<String>,
    pub(crate) issuers: Vec<ValidatedIssuer>,
    /// `jwks_allowed_networks`, parsed.
    pub(crate) jwks_allowed_networks: Vec<IpNet>,
    /// `jwks_proxy`, parsed.
    pub(crate) jwks_proxy: Option<Url>,
}

impl ValidatedConfig {
    pub(crate) fn new(raw: ResourceServerConfig) -> Result<Self, ConfigError> {
        check_url(&raw.resource, false).map_err(|problem| ConfigError::InvalidUrl {
            field: "resource",
            value: raw.resource.clone(),
            problem,
        })?;
        check_url(&raw.resource_metadata_url, false).map_err(|problem| ConfigError::InvalidUrl {
            field: "resource_metadata_url",
            value: raw.resource_metadata_url.clone(),
            problem,
        })?;
        if raw.leeway_secs > MAX_LEEWAY_SECS {
            return Err(ConfigError::LeewayTooLarge(raw.leeway_secs));
        }
        if raw.cache_capacity > MAX_CACHE_CAPACITY {
            return Err(ConfigError::CacheTooLarge(raw.cache_capacity));
        }
        let required_typ = match &raw.required_typ {
            None => None,
            Some(typ) => {
                let normalized = normalize_typ(typ);
                if normalized.is_empty() || !typ.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(ConfigError::InvalidRequiredTyp);
                }
                Some(normalized)
            }
        };
        if raw.tenant_claim.is_empty() {
            return Err(ConfigError::EmptyClaimName("tenant_claim"));
        }
        if raw.client_claim.is_empty() {
            return Err(ConfigError::EmptyClaimName("client_claim"));
        }
        if raw.group_claims.iter().any(String::is_empty) {
            return Err(ConfigError::EmptyClaimName("group_claims"));
        }
        if let Some(scope) = raw.scopes_supported.iter().find(|s| !is_scope_token(s)) {
            return Err(ConfigError::InvalidScope(scope.clone()));
        }
        if raw.resource_name.as_deref().is_some_and(|name| name.chars().any(char::is_control)) {
            return Err(ConfigError::InvalidResourceName);
        }
        if raw.issuers.is_empty() {
            return Err(ConfigError::NoIssuers);
        }
        let mut seen = HashSet::new();
        let mut issuers = Vec::with_capacity(raw.issuers.len());
        for issuer in &raw.issuers {
            if !seen.insert(issuer.issuer.as_str()) {
                return Err(ConfigError::DuplicateIssuer(issuer.issuer.clone()));
            }
            issuers.push(validate_issuer(issuer)?);
        }
        let jwks_allowed_networks = raw
            .jwks_allowed_networks
            .iter()
            .map(|cidr| crate::egress::parse_network(cidr).ok_or_else(|| ConfigError::InvalidNetwork(cidr.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        let jwks_proxy = match &raw.jwks_proxy {
            None => None,
            Some(text) => {
                Some(crate::egress::parse_proxy(text).ok_or_else(|| ConfigError::InvalidProxy(text.clone()))?)
            }
        };
        Ok(Self { leeway_ms: raw.leeway_secs * 1000, required_typ, issuers, jwks_allowed_networks, jwks_proxy, raw })
    }

    pub(crate) fn issuer_index(&self, iss: &str) -> Option<usize> {
        self.issuers.iter().position(|issuer| issuer.issuer == iss)
    }
}

fn validate_issuer(issuer: &IssuerConfig) -> Result<ValidatedIssuer, ConfigError> {
    check_url(&issuer.issuer, true).map_err(|problem| ConfigError::InvalidUrl {
        field: "issuer",
        value: issuer.issuer.clone(),
        problem,
    })?;
    if issuer.algorithms.is_empty() {
        return Err(ConfigError::NoAlgorithms(issuer.issuer.clone()));
    }
    let mut algorithms = Vec::with_capacity(issuer.algorithms.len());
    for &algorithm in &issuer.algorithms {
        let Some(alg) = JwsAlgorithm::from_jsonwebtoken(algorithm) else {
            return Err(ConfigError::DisallowedAlgorithm { issuer: issuer.issuer.clone(), algorithm });
        };
        if !algorithms.contains(&alg) {
            algorithms.push(alg);
        }
    }
    let jwks = match &issuer.jwks {
        JwksSource::Url(raw) => {
            let url = check_url(raw, false).map_err(|problem| ConfigError::InvalidUrl {
                field: "jwks url",
                value: raw.clone(),
                problem,
            })?;
            ValidatedJwksSource::Url(url)
        }
        JwksSource::Static(set) => {
            let keys = KeySet::from_jwk_set(set, &algorithms)
                .map_err(|source| ConfigError::StaticJwks { issuer: issuer.issuer.clone(), source })?;
            ValidatedJwksSource::Static(keys)
        }
    };
    Ok(ValidatedIssuer { issuer: issuer.issuer.clone(), algorithms, jwks })
}

/// https anywhere, http only to a loopback host; no credentials, no fragment (and no query when
/// `forbid_query`).
pub(crate) fn check_url(raw: &str, forbid_query: bool) -> Result<Url, UrlProblem> {
    let url = Url::parse(raw).map_err(|_| UrlProblem::NotAUrl)?;
    match url.scheme() {
        "https" => {}
        "http" => {
            let loopback = match url.host() {
                Some(Host::Domain(domain)) => domain.eq_ignore_ascii_case("localhost"),
                Some(Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
                Some(Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
                None => false,
            };
            if !loopback {
                return Err(UrlProblem::PlainHttpNotLoopback);
            }
        }
        _ => return Err(UrlProblem::UnsupportedScheme),
    }
    if url.host().is_none() {
        return Err(UrlProblem::NotAUrl);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlProblem::HasCredentials);
    }
    if url.fragment().is_some() {
        return Err(UrlProblem::HasFragment);
    }
    if forbid_query && url.query().is_some() {
        return Err(UrlProblem::HasQuery);
    }
    Ok(url)
}

/// `at+JWT`, `application/at+jwt` → `at+jwt` (RFC 7515 §4.1.9: the prefix may be omitted).
pub(crate) fn normalize_typ(typ: &str) -> String {
    let lower = typ.to_ascii_lowercase();
    match lower.strip_prefix("application/") {
        Some(rest) => rest.to_owned(),
        None => lower,
    }
}

/// RFC 6749 §3.3 `scope-token = 1*( %x21 / %x23-5B / %x5D-7E )`.
pub(crate) fn is_scope_token(scope: &str) -> bool {
    !scope.is_empty() && scope.bytes().all(|b| b == 0x21 || (0x23..=0x5B).contains(&b) || (0x5D..=0x7E).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer(url: &str, algorithms: Vec<Algorithm>) -> IssuerConfig {
        IssuerConfig { issuer: url.into(), jwks: JwksSource::Url(format!("{url}/jwks")), algorithms }
    }

    fn base() -> ResourceServerConfig {
        ResourceServerConfig::new(
            "https://mcp.example.com/mcp",
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
            vec![issuer("https://idp.example.com", vec![Algorithm::ES256])],
        )
    }

    fn refuse(cfg: ResourceServerConfig) -> ConfigError {
        match ValidatedConfig::new(cfg) {
            Ok(_) => panic!("config unexpectedly accepted"),
            Err(err) => err,
        }
    }

    #[test]
    fn defaults_validate() {
        let cfg = ValidatedConfig::new(base()).expect("valid");
        assert_eq!(cfg.leeway_ms, 30_000);
        assert_eq!(cfg.raw.tenant_claim, "tenant");
        assert_eq!(cfg.raw.client_claim, "client_id");
        assert_eq!(cfg.issuer_index("https://idp.example.com"), Some(0));
        assert_eq!(cfg.issuer_index("https://idp.example.com/"), None);
    }

    #[test]
    fn url_rules() {
        assert!(check_url("https://idp.example.com/jwks", false).is_ok());
        assert!(check_url("http://127.0.0.1:8080/jwks", false).is_ok());
        assert!(check_url("http://127.8.9.10/jwks", false).is_ok());
        assert!(check_url("http://[::1]:9/jwks", false).is_ok());
        assert!(check_url("http://localhost:9/jwks", false).is_ok());
        assert!(check_url("http://LOCALHOST:9/jwks", false).is_ok());
        assert_eq!(check_url("http://idp.example.com/jwks", false).err(), Some(UrlProblem::PlainHttpNotLoopback));
        assert_eq!(check_url("http://10.0.0.1/jwks", false).err(), Some(UrlProblem::PlainHttpNotLoopback));
        assert_eq!(check_url("http://localhost.evil.com/", false).err(), Some(UrlProblem::PlainHttpNotLoopback));
        assert_eq!(check_url("ftp://idp.example.com/", false).err(), Some(UrlProblem::UnsupportedScheme));
        assert_eq!(check_url("file:///etc/passwd", false).err(), Some(UrlProblem::UnsupportedScheme));
        assert_eq!(check_url("/relative", false).err(), Some(UrlProblem::NotAUrl));
        assert_eq!(check_url("https://u:p@idp.example.com/", false).err(), Some(UrlProblem::HasCredentials));
        assert_eq!(check_url("https://idp.example.com/#x", false).err(), Some(UrlProblem::HasFragment));
        assert_eq!(check_url("https://idp.example.com/?a=b", true).err(), Some(UrlProblem::HasQuery));
        assert!(check_url("https://idp.example.com/?a=b", false).is_ok());
    }

    #[test]
    fn refuses_hmac_and_other_algorithms() {
        for algorithm in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512, Algorithm::PS256, Algorithm::ES384] {
            let mut cfg = base();
            cfg.issuers = vec![issuer("https://idp.example.com", vec![Algorithm::ES256, algorithm])];
            assert!(matches!(refuse(cfg), ConfigError::DisallowedAlgorithm { algorithm: a, .. } if a == algorithm));
        }
        let mut cfg = base();
        cfg.issuers = vec![issuer("https://idp.example.com", vec![])];
        assert!(matches!(refuse(cfg), ConfigError::NoAlgorithms(_)));
    }

    #[test]
    fn refuses_bad_settings() {
        let mut cfg = base();
        cfg.leeway_secs = 61;
        assert!(matches!(refuse(cfg), ConfigError::LeewayTooLarge(61)));
        let mut cfg = base();
        cfg.leeway_secs = 60;
        assert!(ValidatedConfig::new(cfg).is_ok());

        let mut cfg = base();
        cfg.issuers.clear();
        assert!(matches!(refuse(cfg), ConfigError::NoIssuers));

        let mut cfg = base();
        cfg.issuers.push(issuer("https://idp.example.com", vec![Algorithm::EdDSA]));
        assert!(matches!(refuse(cfg), ConfigError::DuplicateIssuer(_)));

        let mut cfg = base();
        cfg.issuers = vec![issuer("http://idp.example.com", vec![Algorithm::ES256])];
        assert!(matches!(refuse(cfg), ConfigError::InvalidUrl { field: "issuer", .. }));

        let mut cfg = base();
        cfg.issuers[0].jwks = JwksSource::Url("http://idp.example.com/jwks".into());
        assert!(matches!(
            refuse(cfg),
            ConfigError::InvalidUrl { field: "jwks url", problem: UrlProblem::PlainHttpNotLoopback, .. }
        ));

        let mut cfg = base();
        cfg.resource = "https://mcp.example.com/mcp#frag".into();
        assert!(matches!(refuse(cfg), ConfigError::InvalidUrl { field: "resource", .. }));

        let mut cfg = base();
        cfg.scopes_supported = vec!["ok".into(), "has space".into()];
        assert!(matches!(refuse(cfg), ConfigError::InvalidScope(s) if s == "has space"));

        let mut cfg = base();
        cfg.scopes_supported = vec!["quote\"".into()];
        assert!(matches!(refuse(cfg), ConfigError::InvalidScope(_)));

        let mut cfg = base();
        cfg.required_typ = Some("application/".into());
        assert!(matches!(refuse(cfg), ConfigError::InvalidRequiredTyp));

        let mut cfg = base();
        cfg.tenant_claim = String::new();
        assert!(matches!(refuse(cfg), ConfigError::EmptyClaimName("tenant_claim")));

        let mut cfg = base();
        cfg.cache_capacity = MAX_CACHE_CAPACITY + 1;
        assert!(matches!(refuse(cfg), ConfigError::CacheTooLarge(_)));

        let mut cfg = base();
        cfg.issuers[0].jwks = JwksSource::Static(JwkSet { keys: vec![] });
        assert!(matches!(refuse(cfg), ConfigError::StaticJwks { .. }));
    }

    #[test]
    fn typ_normalization() {
        assert_eq!(normalize_typ("application/AT+JWT"), "at+jwt");
        assert_eq!(normalize_typ("at+jwt"), "at+jwt");
        assert_eq!(normalize_typ("JWT"), "jwt");
    }

    #[test]
    fn deserializes_with_defaults_and_refuses_unknown_fields() {
        let cfg: ResourceServerConfig = serde_json::from_value(serde_json::json!({
            "resource": "https://mcp.example.com/mcp",
            "resource_metadata_url": "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
            "issuers": [{ "issuer": "https://idp.example.com", "jwks": { "url": "https://idp.example.com/jwks" },
                          "algorithms": ["ES256", "EdDSA"] }],
        }))
        .expect("parses");
        assert_eq!(cfg.leeway_secs, 30);
        assert_eq!(cfg.cache_capacity, 10_000);
        assert!(ValidatedConfig::new(cfg).is_ok());

        let typo = serde_json::from_value::<ResourceServerConfig>(serde_json::json!({
            "resource": "https://mcp.example.com/mcp",
            "resource_metadata_url": "https://mcp.example.com/prm",
            "issuers": [],
            "leway_secs": 5,
        }));
        assert!(typo.is_err());
    }
}
