//! `[auth]`: how callers are authenticated, the development issuer (and its authorization
//! server), token verification settings and the trusted external issuers.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::error::{ConfigError, bad};
use super::keys;
use super::server::AppChoice;

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
    pub(crate) fn enabled(&self) -> Option<bool> {
        match self {
            Self::Enabled(on) => Some(*on),
            Self::Table(table) => table.enabled,
        }
    }

    pub(crate) fn table(&self) -> RawDevIssuerTable {
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

/// Validated `[auth]`.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// Authentication mode.
    pub mode: AuthMode,
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
}

/// Validates `[auth]` for `app` listening on `listen` as `public_url`.
pub fn validate(
    raw: RawAuth,
    app: AppChoice,
    listen: SocketAddr,
    public_url: &str,
) -> Result<AuthSettings, ConfigError> {
    let default_mode = if matches!(app, AppChoice::Demo | AppChoice::Gateway) { "bearer" } else { "none" };
    let mode = match raw.mode.as_deref().unwrap_or(default_mode) {
        "bearer" => AuthMode::Bearer,
        "none" => AuthMode::None,
        other => return Err(bad(keys::AUTH_MODE, format!("unknown mode `{other}`; expected bearer or none"))),
    };
    let (dev_issuer, dev_issuer_why) = dev_issuer(&raw, app, listen, public_url)?;
    let dev_authorization = dev_authorization(&raw, listen)?;
    let jwks_allow_loopback = raw.jwks_allow_loopback.unwrap_or(false);
    if jwks_allow_loopback && !listen.ip().is_loopback() {
        return Err(bad(keys::AUTH_JWKS_ALLOW_LOOPBACK, "is allowed on a loopback listener only"));
    }
    let leeway_secs = raw.leeway_secs.unwrap_or(30);
    if leeway_secs > palisade_auth::MAX_LEEWAY_SECS {
        return Err(bad(keys::AUTH_LEEWAY_SECS, format!("must be at most {}", palisade_auth::MAX_LEEWAY_SECS)));
    }
    let token_cache_capacity = raw.token_cache_capacity.unwrap_or(10_000);
    if token_cache_capacity > palisade_auth::MAX_CACHE_CAPACITY {
        return Err(bad(
            keys::AUTH_TOKEN_CACHE_CAPACITY,
            format!("must be at most {}", palisade_auth::MAX_CACHE_CAPACITY),
        ));
    }
    let issuers = issuers(raw.issuers)?;
    if mode == AuthMode::Bearer && issuers.is_empty() && !dev_issuer {
        return Err(bad(
            keys::AUTH_ISSUERS,
            "bearer mode needs at least one [[auth.issuers]] entry (or, for development on loopback, auth.dev_issuer = true)",
        ));
    }
    if mode == AuthMode::None && !listen.ip().is_loopback() {
        return Err(bad(keys::LISTEN, "an unauthenticated server may listen on loopback addresses only"));
    }
    Ok(AuthSettings {
        mode,
        dev_issuer,
        dev_issuer_why,
        dev_authorization,
        leeway_secs,
        required_typ: raw.required_typ,
        tenant_claim: raw.tenant_claim.unwrap_or_else(|| "tenant".into()),
        client_claim: raw.client_claim.unwrap_or_else(|| "client_id".into()),
        token_cache_capacity,
        jwks_allow_loopback,
        jwks_allowed_networks: raw.jwks_allowed_networks,
        jwks_proxy: raw.jwks_proxy,
        issuers,
    })
}

/// Whether the development issuer runs, and why. It mints a token for any subject, tenant and
/// scope to whoever asks: it runs by default only for the demo on loopback without real issuers,
/// never by default for the gateway, and never where anyone but this machine can reach it.
fn dev_issuer(
    raw: &RawAuth,
    app: AppChoice,
    listen: SocketAddr,
    public_url: &str,
) -> Result<(bool, &'static str), ConfigError> {
    let loopback_only = listen.ip().is_loopback() && url_host_is_loopback(public_url);
    Ok(match raw.dev_issuer.as_ref().and_then(RawDevIssuer::enabled) {
        Some(true) if !loopback_only => {
            return Err(bad(
                keys::AUTH_DEV_ISSUER,
                "the development issuer mints tokens for anyone who asks: it is allowed only when both `listen` and \
                 `public_url` are loopback addresses",
            ));
        }
        Some(true) if raw.issuers.is_empty() => (true, "on (auth.dev_issuer = true)"),
        Some(true) => (true, "on beside the configured issuers (auth.dev_issuer = true names it deliberately)"),
        Some(false) => (false, "off (auth.dev_issuer = false)"),
        None => match app {
            AppChoice::Gateway => {
                (false, "off (never on by default for the gateway; auth.dev_issuer = true on loopback for development)")
            }
            _ if !raw.issuers.is_empty() => (false, "off (real issuers are configured)"),
            _ if !loopback_only => (false, "off (the listener or public_url is not loopback)"),
            AppChoice::Demo => (true, "on (the demo's default on loopback)"),
            AppChoice::Conformance => (false, "off"),
        },
    })
}

/// The development authorization server's settings (`[auth.dev_issuer]`).
fn dev_authorization(raw: &RawAuth, listen: SocketAddr) -> Result<DevAuthorization, ConfigError> {
    let dev_table = raw.dev_issuer.as_ref().map(RawDevIssuer::table).unwrap_or_default();
    let dev_authorization = DevAuthorization {
        auto_approve: dev_table.auto_approve.unwrap_or(false),
        default_subject: dev_table.default_subject.unwrap_or_else(|| "alice".into()),
        default_tenant: dev_table.default_tenant.unwrap_or_else(|| "acme".into()),
        access_token_ttl_secs: dev_table.access_token_ttl_secs.unwrap_or(300),
        client_metadata_allow_loopback: dev_table.client_metadata_allow_loopback.unwrap_or(false),
        client_metadata_ca_file: dev_table.client_metadata_ca_file,
    };
    if !(60..=3600).contains(&dev_authorization.access_token_ttl_secs) {
        return Err(bad(keys::AUTH_DEV_ISSUER_ACCESS_TOKEN_TTL_SECS, "must be between 60 and 3600"));
    }
    for (key, value) in [
        (keys::AUTH_DEV_ISSUER_DEFAULT_SUBJECT, &dev_authorization.default_subject),
        (keys::AUTH_DEV_ISSUER_DEFAULT_TENANT, &dev_authorization.default_tenant),
    ] {
        let ok = (1..=64).contains(&value.len())
            && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'));
        if !ok {
            return Err(bad(key, "must be 1 to 64 letters, digits or . _ @ -"));
        }
    }
    // Approving without a person, or fetching from loopback, is for tests on this machine only.
    if dev_authorization.auto_approve && !listen.ip().is_loopback() {
        return Err(bad(keys::AUTH_DEV_ISSUER_AUTO_APPROVE, "is allowed on a loopback listener only"));
    }
    if dev_authorization.client_metadata_allow_loopback && !listen.ip().is_loopback() {
        return Err(bad(
            keys::AUTH_DEV_ISSUER_CLIENT_METADATA_ALLOW_LOOPBACK,
            "is allowed on a loopback listener only",
        ));
    }
    Ok(dev_authorization)
}

/// The `[[auth.issuers]]`, each with at least one allowed algorithm.
fn issuers(raw: Vec<RawIssuer>) -> Result<Vec<Issuer>, ConfigError> {
    let mut issuers = Vec::new();
    for (index, issuer) in raw.into_iter().enumerate() {
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
    Ok(issuers)
}
