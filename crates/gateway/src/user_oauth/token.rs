//! Palisade's requests to an authorization server's token and registration endpoints, through
//! the egress guard (no redirect is followed, bodies capped): the authorization-code grant with
//! the PKCE verifier and RFC 8707 `resource`, refresh with rotation, and RFC 7591 registration.
//! Responses are checked before anything is kept; no error carries a token or anything the
//! server wrote besides a registered error code.

use base64::Engine as _;
use palisade_auth::egress::{EgressError, EgressGuard};
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;
use zeroize::Zeroizing;

use super::OAuthError;
use super::discovery::shown;

/// The lifetime assumed when a token response has no `expires_in`.
const DEFAULT_EXPIRES_IN_SECS: u64 = 300;
/// The longest access-token lifetime believed.
const MAX_EXPIRES_IN_SECS: u64 = 24 * 60 * 60;

/// Palisade's client identity at one authorization server.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ClientIdentity {
    /// The client id (a CIMD URL, or what registration assigned).
    pub client_id: String,
    /// The secret registration assigned, for `client_secret_basic` / `client_secret_post`.
    pub client_secret: Option<String>,
    /// `none`, `client_secret_basic` or `client_secret_post`.
    pub auth_method: String,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "<redacted>"))
            .field("auth_method", &self.auth_method)
            .finish()
    }
}

/// The tokens of one grant, as kept (sealed) in the store.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Tokens {
    pub access_token: String,
    pub refresh_token: Option<String>,
    /// Unix milliseconds after which the access token is not used.
    pub expires_at_ms: i64,
    /// The granted scopes (space-separated).
    pub scope: String,
}

impl Drop for Tokens {
    fn drop(&mut self) {
        use zeroize::Zeroize as _;
        self.access_token.zeroize();
        if let Some(refresh) = self.refresh_token.as_mut() {
            refresh.zeroize();
        }
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("expires_at_ms", &self.expires_at_ms)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// What a token request is for.
pub(crate) enum Grant<'a> {
    /// The authorization-code grant (RFC 6749 §4.1.3 + PKCE + RFC 8707).
    Code { code: &'a str, redirect_uri: &'a str, verifier: &'a str },
    /// A refresh (RFC 6749 §6 + RFC 8707).
    Refresh { refresh_token: &'a str },
}

/// One token request. `resource` is sent on every grant (RFC 8707 §2.2); a JWT access token
/// whose `aud` does not name it is refused (a token for another resource is never kept).
pub(crate) async fn request_tokens(
    guard: &EgressGuard,
    token_endpoint: &Url,
    client: &ClientIdentity,
    grant: Grant<'_>,
    resource: &str,
    now_ms: i64,
) -> Result<Tokens, OAuthError> {
    let refreshing = matches!(grant, Grant::Refresh { .. });
    let response = token_request(guard, token_endpoint, client, grant, Some(resource)).await?;
    parse_tokens(&response, resource, now_ms, refreshing)
}

/// One token request, its successful response body as sent (for a caller that reads more than
/// the tokens, such as an OpenID `id_token`). A refusal is [`OAuthError::GrantRefused`] for
/// `invalid_grant`, else the registered error code only.
pub(crate) async fn token_request(
    guard: &EgressGuard,
    token_endpoint: &Url,
    client: &ClientIdentity,
    grant: Grant<'_>,
    resource: Option<&str>,
) -> Result<Zeroizing<Vec<u8>>, OAuthError> {
    let mut pairs: Vec<(&str, &str)> = match &grant {
        Grant::Code { code, redirect_uri, verifier } => vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier),
        ],
        Grant::Refresh { refresh_token } => vec![("grant_type", "refresh_token"), ("refresh_token", refresh_token)],
    };
    if let Some(resource) = resource {
        pairs.push(("resource", resource));
    }
    let (body, headers) = client_authentication(client, &pairs)?;
    let fetched = guard
        .post(
            token_endpoint,
            "application/x-www-form-urlencoded",
            body.as_bytes().to_vec(),
            "application/json",
            &headers,
        )
        .await
        .map_err(|error| egress_error(token_endpoint, error))?;
    let response = Zeroizing::new(fetched.body);
    if fetched.status != 200 {
        let invalid_grant = serde_json::from_slice::<Value>(&response)
            .ok()
            .is_some_and(|body| body.get("error").and_then(Value::as_str) == Some("invalid_grant"));
        return Err(if invalid_grant { OAuthError::GrantRefused } else { OAuthError::Token(refusal_text(&response)) });
    }
    Ok(response)
}

/// Headers of one request.
type Headers = Vec<(HeaderName, HeaderValue)>;

/// The form body with the client authentication its method asks for, and the headers to send.
fn client_authentication(
    client: &ClientIdentity,
    pairs: &[(&str, &str)],
) -> Result<(Zeroizing<String>, Headers), OAuthError> {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        form.append_pair(name, value);
    }
    let mut headers = Vec::new();
    match (client.auth_method.as_str(), client.client_secret.as_deref()) {
        ("client_secret_basic", Some(secret)) => {
            // RFC 6749 §2.3.1: both parts form-encoded before Base64.
            let pair =
                Zeroizing::new(format!("{}:{}", form_encode(&client.client_id), &*Zeroizing::new(form_encode(secret))));
            let basic =
                Zeroizing::new(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair.as_bytes())));
            let mut value = HeaderValue::from_str(&basic)
                .map_err(|_| OAuthError::Token("the client secret is not a header value"))?;
            value.set_sensitive(true);
            headers.push((AUTHORIZATION, value));
        }
        ("client_secret_post", Some(secret)) => {
            form.append_pair("client_id", &client.client_id);
            form.append_pair("client_secret", secret);
        }
        ("none", _) => {
            form.append_pair("client_id", &client.client_id);
        }
        _ => return Err(OAuthError::Token("the client registration has no usable authentication method")),
    }
    Ok((Zeroizing::new(form.finish()), headers))
}

fn parse_tokens(body: &[u8], resource: &str, now_ms: i64, refreshing: bool) -> Result<Tokens, OAuthError> {
    #[derive(Deserialize)]
    struct Body {
        access_token: String,
        token_type: String,
        expires_in: Option<u64>,
        refresh_token: Option<String>,
        scope: Option<String>,
    }
    let malformed = OAuthError::Token("the token response is malformed");
    let parsed: Body = serde_json::from_slice(body).map_err(|_| malformed.clone())?;
    let tokens = Tokens {
        access_token: parsed.access_token,
        refresh_token: parsed.refresh_token,
        expires_at_ms: now_ms.saturating_add(
            i64::try_from(parsed.expires_in.unwrap_or(DEFAULT_EXPIRES_IN_SECS).min(MAX_EXPIRES_IN_SECS) * 1000)
                .unwrap_or(i64::MAX),
        ),
        scope: parsed.scope.unwrap_or_default(),
    };
    if !parsed.token_type.eq_ignore_ascii_case("bearer") {
        return Err(OAuthError::Token("the token response is not a bearer token"));
    }
    // RFC 6750 §2.1 b64token: what may follow "Bearer ".
    let b64token = |token: &str| {
        !token.is_empty() && token.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-._~+/=".contains(&byte))
    };
    if !b64token(&tokens.access_token) || tokens.refresh_token.as_deref().is_some_and(|token| token.is_empty()) {
        return Err(malformed);
    }
    if tokens.scope.chars().any(char::is_control) {
        return Err(malformed);
    }
    if let Some(audiences) = jwt_audiences(&tokens.access_token)
        && !audiences.iter().any(|audience| audience == resource)
    {
        return Err(OAuthError::Token(if refreshing {
            "the refreshed token is for another resource"
        } else {
            "the token is for another resource"
        }));
    }
    Ok(tokens)
}

/// The `aud` of an access token that is a JWT (three base64url parts, a JSON payload); `None`
/// for an opaque token. Only compared, never trusted: the upstream verifies its own tokens.
fn jwt_audiences(token: &str) -> Option<Vec<String>> {
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = Zeroizing::new(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?);
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    Some(match claims.get("aud")? {
        Value::String(one) => vec![one.clone()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        _ => Vec::new(),
    })
}

/// RFC 7591 registration of Palisade as a client with one redirect URI. A confidential client
/// (`client_secret_basic`) when the server takes it, else a public one.
pub(crate) async fn register(
    guard: &EgressGuard,
    registration_endpoint: &Url,
    client_name: &str,
    redirect_uri: &str,
    token_auth_methods: &[String],
) -> Result<ClientIdentity, OAuthError> {
    let method = if token_auth_methods.is_empty() || token_auth_methods.iter().any(|m| m == "client_secret_basic") {
        "client_secret_basic"
    } else {
        "none"
    };
    let request = serde_json::json!({
        "client_name": client_name,
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": method,
    });
    let fetched = guard
        .post(registration_endpoint, "application/json", request.to_string().into_bytes(), "application/json", &[])
        .await
        .map_err(|error| egress_error(registration_endpoint, error))?;
    let body = Zeroizing::new(fetched.body);
    if fetched.status != 201 && fetched.status != 200 {
        return Err(OAuthError::Registration("the authorization server refused the registration"));
    }
    #[derive(Deserialize)]
    struct Registered {
        client_id: String,
        client_secret: Option<String>,
        token_endpoint_auth_method: Option<String>,
        redirect_uris: Option<Vec<String>>,
    }
    let registered: Registered = serde_json::from_slice(&body)
        .map_err(|_| OAuthError::Registration("the registration response is malformed"))?;
    if registered.client_id.is_empty() || registered.client_id.chars().any(char::is_control) {
        return Err(OAuthError::Registration("the registration response has no usable client id"));
    }
    // RFC 7591 §3.2.1: the server may change what was asked; Palisade uses only the exact
    // redirect URI it registered.
    if registered.redirect_uris.as_ref().is_some_and(|uris| uris.len() != 1 || uris[0] != redirect_uri) {
        return Err(OAuthError::Registration("the registration changed the redirect URI"));
    }
    let auth_method = registered.token_endpoint_auth_method.unwrap_or_else(|| {
        if registered.client_secret.is_some() { "client_secret_basic".into() } else { "none".into() }
    });
    if !matches!(auth_method.as_str(), "none" | "client_secret_basic" | "client_secret_post")
        || (auth_method != "none" && registered.client_secret.is_none())
    {
        return Err(OAuthError::Registration("the registration gave an authentication method Palisade cannot use"));
    }
    Ok(ClientIdentity { client_id: registered.client_id, client_secret: registered.client_secret, auth_method })
}

pub(crate) fn egress_error(url: &Url, error: EgressError) -> OAuthError {
    match error {
        EgressError::Transport | EgressError::Timeout => OAuthError::Unreachable(format!("{}: {error}", shown(url))),
        other => OAuthError::Egress { url: shown(url), error: other },
    }
}

pub(crate) fn form_encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The fixed text for a refused token request: the RFC 6749 §5.2 / RFC 8707 / RFC 8693 error
/// code when it is one of the registered ones, never `error_description` or anything else the
/// server wrote.
pub(crate) fn refusal_text(body: &[u8]) -> &'static str {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        error: Option<String>,
    }
    let code = serde_json::from_slice::<ErrorBody>(body).ok().and_then(|body| body.error);
    match code.as_deref() {
        Some("invalid_request") => "the authorization server refused the token request: invalid_request",
        Some("invalid_client") => "the authorization server refused the token request: invalid_client",
        Some("invalid_grant") => "the authorization server refused the token request: invalid_grant",
        Some("unauthorized_client") => "the authorization server refused the token request: unauthorized_client",
        Some("unsupported_grant_type") => "the authorization server refused the token request: unsupported_grant_type",
        Some("invalid_scope") => "the authorization server refused the token request: invalid_scope",
        Some("invalid_target") => "the authorization server refused the token request: invalid_target",
        Some("access_denied") => "the authorization server refused the token request: access_denied",
        Some("server_error") => "the authorization server refused the token request: server_error",
        Some("temporarily_unavailable") => {
            "the authorization server refused the token request: temporarily_unavailable"
        }
        _ => "the authorization server refused the token request",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &Value) -> String {
        let part = |value: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string());
        format!("{}.{}.c2ln", part(&serde_json::json!({"alg": "RS256"})), part(claims))
    }

    #[test]
    fn a_token_for_another_resource_is_refused() {
        let body = |token: String| {
            serde_json::json!({ "access_token": token, "token_type": "Bearer", "expires_in": 60 }).to_string()
        };
        let ours = jwt(&serde_json::json!({ "aud": "https://files.example/mcp" }));
        let theirs = jwt(&serde_json::json!({ "aud": ["https://mail.example/mcp"] }));
        assert!(parse_tokens(body(ours).as_bytes(), "https://files.example/mcp", 0, false).is_ok());
        assert_eq!(
            parse_tokens(body(theirs).as_bytes(), "https://files.example/mcp", 0, false).unwrap_err(),
            OAuthError::Token("the token is for another resource")
        );
        // An opaque token cannot be judged here; the upstream checks it.
        assert!(parse_tokens(body("opaque-token".into()).as_bytes(), "https://files.example/mcp", 0, false).is_ok());
    }

    #[test]
    fn malformed_token_responses_are_refused() {
        for body in [
            r#"{"access_token":"a b","token_type":"Bearer"}"#,
            r#"{"access_token":"abc","token_type":"mac"}"#,
            r#"{"access_token":"","token_type":"Bearer"}"#,
            r#"{"token_type":"Bearer"}"#,
            r#"{"access_token":"abc","token_type":"Bearer","refresh_token":""}"#,
            "not json",
        ] {
            assert!(parse_tokens(body.as_bytes(), "r", 0, false).is_err(), "{body}");
        }
        let tokens = parse_tokens(br#"{"access_token":"abc","token_type":"bearer","expires_in":100,"refresh_token":"r1","scope":"files:read"}"#, "r", 1000, false).unwrap();
        assert_eq!(
            (tokens.expires_at_ms, tokens.refresh_token.as_deref(), tokens.scope.as_str()),
            (101_000, Some("r1"), "files:read")
        );
        assert!(!format!("{tokens:?}").contains("abc"));
    }
}
