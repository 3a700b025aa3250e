//! `[web]`: as written ([`RawWeb`]) and validated ([`WebSettings`]), with the connect page's
//! sign-in provider ([`SignInSettings`]) that the table names.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;
use url::Url;

use crate::config_error::{GatewayConfigError, bad};
use crate::secret::SecretSource;

/// Default lifetime of every flow step (connect link, sign-in, authorization `state`).
pub const DEFAULT_FLOW_TTL_SECS: u64 = 600;

/// Default seconds between two samples of the console's charts.
pub const DEFAULT_CONSOLE_SAMPLE_SECS: u64 = 10;

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
    /// File of the console's operator accounts, one `name token` a line: enables `/console`.
    pub operators_file: Option<PathBuf>,
    /// Seconds between two samples of the console's metrics charts. Default 10 (1..=300).
    pub console_sample_secs: Option<u64>,
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

/// The validated `[web]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebSettings {
    /// Where the HTTPS listener binds: a loopback address unless `allow_remote = true`.
    pub listen: SocketAddr,
    /// The surface's `https` origin (path `/`): the base of every absolute link and the only
    /// `Origin` a form may be posted from.
    pub public_url: Url,
    /// PEM certificate chain of the listener.
    pub tls_cert_file: PathBuf,
    /// PEM private key of the listener.
    pub tls_key_file: PathBuf,
    /// The operator's credential for the review page (`None`: no review page).
    pub review_token: Option<SecretSource>,
    /// The console's operator accounts (`None`: no console).
    pub operators_file: Option<PathBuf>,
    /// Seconds between two samples of the console's charts (1..=300).
    pub console_sample_secs: u64,
    /// The identity provider of the `user_oauth` connect page (`None`: no connect page).
    pub sign_in: Option<SignInSettings>,
    /// Lifetime of every connect-flow step, in seconds (1..=600).
    pub flow_ttl_secs: u64,
}

/// The gateway's identity provider, through which a person signs in on the connect page (OIDC
/// authorization code with PKCE). Its issuer must be the issuer of the callers' tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignInSettings {
    /// The issuer identifier, exactly as the callers' tokens state it.
    pub issuer: String,
    /// The gateway's client id there.
    pub client_id: String,
    /// Its secret (`client_secret_basic`); `None` for a public client.
    pub client_secret: Option<SecretSource>,
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
    let operators_file = match raw.operators_file {
        Some(path) if path.as_os_str().is_empty() => return Err(bad("web.operators_file", "must not be empty")),
        other => other,
    };
    let console_sample_secs = match raw.console_sample_secs.unwrap_or(DEFAULT_CONSOLE_SAMPLE_SECS) {
        secs @ 1..=300 => secs,
        _ => return Err(bad("web.console_sample_secs", "must be 1..=300")),
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
    Ok(WebSettings {
        listen,
        public_url,
        tls_cert_file,
        tls_key_file,
        review_token,
        operators_file,
        console_sample_secs,
        sign_in,
        flow_ttl_secs,
    })
}
