//! An identity's token from an authorization server (an identity file's `[client_credentials]`
//! table): the OAuth 2.0 client credentials grant (RFC 6749 §4.4) with `client_secret_basic`,
//! the RFC 8707 `resource` set to the target (or the file's `resource`), and the scopes the file
//! names. The secret goes only to an `https://` token endpoint, or `http://` on a loopback host;
//! no redirect is followed; the answer is capped; no error text carries the secret or a token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

/// The `[client_credentials]` table of an identity file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCredentials {
    /// The authorization server's token endpoint.
    pub token_url: String,
    /// The client id.
    pub client_id: String,
    /// The client secret, inline.
    pub client_secret: Option<String>,
    /// The client secret in a file (relative to the identity file's directory).
    pub client_secret_file: Option<PathBuf>,
    /// The scopes asked for (space-separated); the server's default when absent.
    pub scope: Option<String>,
    /// The RFC 8707 resource; the target's URL when absent.
    pub resource: Option<String>,
}

impl std::fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// The most of a token endpoint's answer that is read.
const MAX_ANSWER: usize = 64 * 1024;

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
    token_type: Option<String>,
    error: Option<String>,
}

/// Asks the token endpoint for an access token for `target`; `dir` is the identity file's
/// directory. `Err` says what went wrong in words that carry no secret.
pub async fn client_credentials(
    grant: &ClientCredentials,
    dir: &Path,
    target: &url::Url,
    timeout: Duration,
) -> Result<String, String> {
    let url = url::Url::parse(&grant.token_url)
        .map_err(|_| "client_credentials.token_url is not an absolute URL".to_owned())?;
    let host = url.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let loopback =
        host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !(url.scheme() == "https" || (url.scheme() == "http" && loopback)) {
        return Err(
            "client_credentials.token_url must be https:// (http:// only on a loopback host): the client secret \
                    is sent to it"
                .into(),
        );
    }
    let secret = match (&grant.client_secret, &grant.client_secret_file) {
        (Some(secret), None) => secret.clone(),
        (None, Some(file)) => {
            let file = if file.is_relative() { dir.join(file) } else { file.clone() };
            std::fs::read_to_string(&file)
                .map_err(|error| format!("client_credentials.client_secret_file {}: {error}", file.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_owned()
        }
        _ => return Err("client_credentials needs exactly one of `client_secret`, `client_secret_file`".into()),
    };
    let resource = grant.resource.clone().unwrap_or_else(|| target.to_string());
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    form.append_pair("grant_type", "client_credentials").append_pair("resource", &resource);
    if let Some(scope) = &grant.scope {
        form.append_pair("scope", scope);
    }
    let body = form.finish();
    // RFC 6749 §2.3.1: the id and secret are form-encoded before they are joined and encoded.
    let encode = |value: &str| url::form_urlencoded::byte_serialize(value.as_bytes()).collect::<String>();
    let basic = STANDARD.encode(format!("{}:{}", encode(&grant.client_id), encode(&secret)));
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(timeout)
        .build()
        .map_err(|error| format!("client_credentials: the HTTP client could not be built: {error}"))?;
    let mut response = http
        .post(url)
        .header("authorization", format!("Basic {basic}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("accept", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|error| {
            let why = if error.is_timeout() { "timed out" } else { "could not be sent" };
            format!("client_credentials: the token request to {} {why}", grant.token_url)
        })?;
    let status = response.status();
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|_| "client_credentials: the answer broke off".to_owned())? {
        if bytes.len() + chunk.len() > MAX_ANSWER {
            return Err(format!("client_credentials: the answer is larger than {MAX_ANSWER} bytes"));
        }
        bytes.extend_from_slice(&chunk);
    }
    let answer: Option<TokenAnswer> = serde_json::from_slice(&bytes).ok();
    if !status.is_success() {
        // The OAuth error code is an ASCII word from a fixed list: safe to show; nothing else is.
        let code = answer
            .and_then(|a| a.error)
            .filter(|code| code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        let code = code.map_or_else(String::new, |code| format!(" ({code})"));
        return Err(format!("client_credentials: the authorization server answered HTTP {}{code}", status.as_u16()));
    }
    let answer = answer.ok_or("client_credentials: the answer is not a JSON token response")?;
    if let Some(kind) = &answer.token_type
        && !kind.eq_ignore_ascii_case("bearer")
    {
        let kind =
            if kind.len() <= 32 && kind.bytes().all(|b| b.is_ascii_alphanumeric()) { kind.as_str() } else { "?" };
        return Err(format!("client_credentials: the token is of type {kind}, not Bearer"));
    }
    answer
        .access_token
        .filter(|token| !token.is_empty())
        .ok_or_else(|| "client_credentials: the answer has no access_token".into())
}
