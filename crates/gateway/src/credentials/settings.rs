//! The validated credential configuration of one upstream ([`CredentialConfig`], [`ClientAuth`]):
//! where its secrets come from, never a secret.

use std::path::PathBuf;

use serde::Deserialize;
use url::Url;

use crate::config_error::{GatewayConfigError, bad};
use crate::secret::SecretSource;

/// How the gateway authenticates itself to the token endpoint (RFC 6749 §2.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// HTTP Basic with the form-encoded client id and secret (`client_secret_basic`).
    #[default]
    Basic,
    /// `client_id` and `client_secret` in the request body (`client_secret_post`).
    Post,
}

/// Validated configuration of one upstream's credential (the configuration module builds it
/// from the gateway file). It holds where secrets come from, never a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialConfig {
    /// No credential.
    None,
    /// A static secret sent as `header: <prefix><secret>`.
    Static {
        /// The header name, e.g. `Authorization` or `X-Api-Key`.
        header: String,
        /// Sent before the secret ([`CredentialConfig::default_prefix`] gives the usual one).
        prefix: String,
        /// Where the secret comes from.
        secret: SecretSource,
    },
    /// OAuth 2.0 client credentials (RFC 6749 §4.4) with RFC 8707 `resource` = the upstream's
    /// canonical URI and the minimal `scopes`; `max_scopes` bounds what a step-up may add (the
    /// bound is `scopes ∪ max_scopes`).
    ClientCredentials {
        /// The authorization server's token endpoint (https; http only on loopback).
        token_url: Url,
        /// The gateway's client id at that server.
        client_id: String,
        /// The gateway's client secret.
        client_secret: SecretSource,
        /// The scopes asked for at first.
        scopes: Vec<String>,
        /// The scopes a step-up may ask for in addition.
        max_scopes: Vec<String>,
        /// How the client authenticates.
        auth: ClientAuth,
    },
    /// RFC 8693 token exchange: the caller's verified token is the `subject_token`, sent to
    /// `token_url` only; the requested `resource` is the upstream's URI. Results are cached per
    /// caller partition (the scopes are fixed per upstream).
    TokenExchange {
        /// The authorization server's token endpoint (https; http only on loopback).
        token_url: Url,
        /// The gateway's client id at that server.
        client_id: String,
        /// The gateway's client secret.
        client_secret: SecretSource,
        /// The scopes asked for.
        scopes: Vec<String>,
        /// How the client authenticates.
        auth: ClientAuth,
    },
    /// Each person's own authorization at the upstream's authorization server (OAuth
    /// authorization code with PKCE, made on the gateway's connect page; [`crate::user_oauth`]).
    UserOAuth {
        /// The scopes asked for at first.
        scopes: Vec<String>,
        /// The scopes a step-up may ask for in addition.
        max_scopes: Vec<String>,
    },
}

impl CredentialConfig {
    /// The usual prefix for a static secret in `header`: `"Bearer "` for `Authorization`,
    /// nothing otherwise.
    pub fn default_prefix(header: &str) -> &'static str {
        if header.eq_ignore_ascii_case("authorization") { "Bearer " } else { "" }
    }
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

/// An OAuth scope token (RFC 6749 §3.3: printable ASCII without space, `"` or `\`).
pub(crate) fn check_scope(scope: &str) -> Result<(), &'static str> {
    let valid = !scope.is_empty()
        && scope.len() <= 200
        && scope.bytes().all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b));
    if valid { Ok(()) } else { Err("a scope must be a non-empty RFC 6749 scope token") }
}

pub(crate) fn validate_credential(key: &str, raw: RawCredential) -> Result<CredentialConfig, GatewayConfigError> {
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
