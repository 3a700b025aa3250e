//! Discovery of an upstream's authorization server, every document fetched through the egress
//! guard: RFC 9728 protected-resource metadata (the `resource_metadata` URL of the upstream's
//! 401 challenge first, then the well-known locations), then RFC 8414 authorization-server
//! metadata whose `issuer` must be the very string the resource named (or the OpenID discovery
//! document at the same locations). Every endpoint is checked before it is kept: a browser is
//! only ever sent to an https (or, under the development flag, loopback http) URL built by
//! Palisade, and a server that does not offer PKCE S256 is refused.

use palisade_auth::egress::{EgressError, EgressGuard};
use serde_json::Value;
use url::Url;

use super::OAuthError;

/// What the upstream says of itself (RFC 9728 §2), checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProtectedResource {
    /// Its `resource`: equal to the upstream's canonical URI.
    pub resource: String,
    /// The first authorization server it lists (the issuer identifier, as written).
    pub issuer: String,
    /// The scopes it documents (informational).
    pub scopes_supported: Vec<String>,
}

/// An authorization server's metadata (RFC 8414 §2), checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AuthorizationServer {
    /// Its issuer identifier, exactly as the resource listed it and the metadata states it.
    pub issuer: String,
    /// Where the browser goes (https, or loopback http under the development flag).
    pub authorization_endpoint: Url,
    /// Where codes and refresh tokens are redeemed.
    pub token_endpoint: Url,
    /// RFC 7591 registration, when offered.
    pub registration_endpoint: Option<Url>,
    /// Whether it accepts a Client ID Metadata Document URL as `client_id`.
    pub client_id_metadata_documents: bool,
    /// Whether it says it sends RFC 9207 `iss` with authorization responses.
    pub iss_parameter: bool,
    /// The client authentication methods it takes at the token endpoint.
    pub token_auth_methods: Vec<String>,
}

/// The RFC 9728 §3.1 well-known locations of `resource`'s metadata: the path-inserted one, then
/// the host's root document.
pub(crate) fn resource_metadata_urls(resource: &Url) -> Vec<Url> {
    let mut urls = Vec::new();
    let path = resource.path().trim_end_matches('/');
    let mut base = resource.clone();
    base.set_query(None);
    base.set_fragment(None);
    if !path.is_empty() {
        let mut url = base.clone();
        url.set_path(&format!("/.well-known/oauth-protected-resource{path}"));
        urls.push(url);
    }
    let mut root = base;
    root.set_path("/.well-known/oauth-protected-resource");
    urls.push(root);
    urls
}

/// The locations of an issuer's metadata, in the order the MCP authorization spec gives: RFC 8414
/// path-inserted, OpenID path-inserted, OpenID path-appended (for an issuer without a path: the
/// two root documents).
pub(crate) fn authorization_server_metadata_urls(issuer: &Url) -> Vec<Url> {
    let path = issuer.path().trim_end_matches('/');
    let at = |well_known: &str| {
        let mut url = issuer.clone();
        url.set_query(None);
        url.set_fragment(None);
        url.set_path(well_known);
        url
    };
    if path.is_empty() {
        vec![at("/.well-known/oauth-authorization-server"), at("/.well-known/openid-configuration")]
    } else {
        vec![
            at(&format!("/.well-known/oauth-authorization-server{path}")),
            at(&format!("/.well-known/openid-configuration{path}")),
            at(&format!("{path}/.well-known/openid-configuration")),
        ]
    }
}

/// Fetches and checks the upstream's protected-resource metadata from the RFC 9728 §3.1
/// well-known locations, in order. The document's `resource` must be the upstream's URI (RFC
/// 9728 §3.3), and it must list an authorization server.
pub(crate) async fn protected_resource(guard: &EgressGuard, resource: &Url) -> Result<ProtectedResource, OAuthError> {
    protected_resource_from(guard, resource, resource_metadata_urls(resource)).await
}

/// The same from `hint` alone: the `resource_metadata` URL of an upstream's 401 challenge. Its
/// refusal (guard, unreachable, missing, a document that fails its checks) is the caller's to
/// handle: the hint is untrusted, and the well-known locations stay the fallback.
pub(crate) async fn protected_resource_at(
    guard: &EgressGuard,
    resource: &Url,
    hint: &Url,
) -> Result<ProtectedResource, OAuthError> {
    protected_resource_from(guard, resource, vec![hint.clone()]).await
}

async fn protected_resource_from(
    guard: &EgressGuard,
    resource: &Url,
    candidates: Vec<Url>,
) -> Result<ProtectedResource, OAuthError> {
    let mut last = OAuthError::Discovery("the upstream publishes no protected-resource metadata".into());
    for url in candidates {
        let document = match fetch_json(guard, &url).await {
            Ok(document) => document,
            Err(FetchFailure::Missing) => continue,
            Err(FetchFailure::Refused(error)) => return Err(error),
        };
        match parse_protected_resource(&document, resource) {
            Ok(metadata) => return Ok(metadata),
            Err(error) => last = error,
        }
    }
    Err(last)
}

fn parse_protected_resource(document: &Value, resource: &Url) -> Result<ProtectedResource, OAuthError> {
    let bad = |reason: &str| OAuthError::Discovery(format!("protected-resource metadata: {reason}"));
    let stated = document.get("resource").and_then(Value::as_str).ok_or_else(|| bad("no resource"))?;
    let same = Url::parse(stated).is_ok_and(|stated| &stated == resource);
    if !same {
        return Err(bad("its resource is not this upstream's URI"));
    }
    let issuer = document
        .get("authorization_servers")
        .and_then(Value::as_array)
        .and_then(|servers| servers.first())
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no authorization server listed"))?;
    let scopes_supported = string_list(document.get("scopes_supported"));
    Ok(ProtectedResource { resource: stated.to_owned(), issuer: issuer.to_owned(), scopes_supported })
}

/// Fetches and checks `issuer`'s metadata. The issuer must be an https URL (http on loopback
/// under the development flag) without query or fragment (RFC 8414 §2), and the document's
/// `issuer` must be the same string (§3.3) — otherwise the metadata is another server's.
pub(crate) async fn authorization_server(
    guard: &EgressGuard,
    issuer: &str,
    allow_loopback_http: bool,
) -> Result<AuthorizationServer, OAuthError> {
    let parsed = Url::parse(issuer).map_err(|_| OAuthError::Discovery("the issuer is not a URL".into()))?;
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(OAuthError::Discovery("the issuer has a query or fragment".into()));
    }
    check_browser_url(&parsed, allow_loopback_http)
        .map_err(|reason| OAuthError::Discovery(format!("the issuer {reason}")))?;
    for url in authorization_server_metadata_urls(&parsed) {
        let document = match fetch_json(guard, &url).await {
            Ok(document) => document,
            Err(FetchFailure::Missing) => continue,
            Err(FetchFailure::Refused(error)) => return Err(error),
        };
        return parse_authorization_server(&document, issuer, guard, allow_loopback_http);
    }
    Err(OAuthError::Discovery("the authorization server publishes no metadata".into()))
}

fn parse_authorization_server(
    document: &Value,
    issuer: &str,
    guard: &EgressGuard,
    allow_loopback_http: bool,
) -> Result<AuthorizationServer, OAuthError> {
    let bad = |reason: String| OAuthError::Discovery(format!("authorization-server metadata: {reason}"));
    if document.get("issuer").and_then(Value::as_str) != Some(issuer) {
        return Err(bad("its issuer is not the one the upstream named (RFC 8414 §3.3)".into()));
    }
    let methods = string_list(document.get("code_challenge_methods_supported"));
    if !methods.iter().any(|method| method == "S256") {
        return Err(bad("it does not offer PKCE S256".into()));
    }
    let response_types = string_list(document.get("response_types_supported"));
    if !response_types.is_empty() && !response_types.iter().any(|kind| kind == "code") {
        return Err(bad("it does not offer the authorization code flow".into()));
    }
    let endpoint = |name: &str| -> Result<Option<Url>, OAuthError> {
        let Some(text) = document.get(name).and_then(Value::as_str) else { return Ok(None) };
        let url = Url::parse(text).map_err(|_| bad(format!("{name} is not a URL")))?;
        check_browser_url(&url, allow_loopback_http).map_err(|reason| bad(format!("{name} {reason}")))?;
        if url.fragment().is_some() {
            return Err(bad(format!("{name} has a fragment")));
        }
        Ok(Some(url))
    };
    let authorization_endpoint =
        endpoint("authorization_endpoint")?.ok_or_else(|| bad("no authorization_endpoint".into()))?;
    let token_endpoint = endpoint("token_endpoint")?.ok_or_else(|| bad("no token_endpoint".into()))?;
    let registration_endpoint = endpoint("registration_endpoint")?;
    // Endpoints Palisade itself calls must also pass the guard's address rules (an IP literal is
    // judged now; a name when it is resolved for the request).
    for url in std::iter::once(&token_endpoint).chain(registration_endpoint.as_ref()) {
        guard.check_url(url).map_err(|error| bad(format!("an endpoint is not allowed: {error}")))?;
    }
    Ok(AuthorizationServer {
        issuer: issuer.to_owned(),
        authorization_endpoint,
        token_endpoint,
        registration_endpoint,
        client_id_metadata_documents: document.get("client_id_metadata_document_supported") == Some(&Value::Bool(true)),
        iss_parameter: document.get("authorization_response_iss_parameter_supported") == Some(&Value::Bool(true)),
        token_auth_methods: string_list(document.get("token_endpoint_auth_methods_supported")),
    })
}

/// Whether a browser may be sent to `url`, or Palisade may call it as an OAuth endpoint: https,
/// or http to a loopback host when `allow_loopback_http` (the development flag); no user or
/// password. `javascript:`, `data:`, `file:` and every other scheme are refused.
pub(crate) fn check_browser_url(url: &Url, allow_loopback_http: bool) -> Result<(), &'static str> {
    if !url.username().is_empty() || url.password().is_some() {
        return Err("carries credentials");
    }
    let host = url.host().ok_or("has no host")?;
    match url.scheme() {
        "https" => Ok(()),
        "http" => {
            let loopback = match host {
                url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
                url::Host::Ipv4(address) => address.is_loopback(),
                url::Host::Ipv6(address) => address.is_loopback(),
            };
            if loopback && allow_loopback_http { Ok(()) } else { Err("is not https") }
        }
        _ => Err("is not an https URL"),
    }
}

/// Largest metadata document of an MCP client read for its name.
pub(crate) const MAX_CLIENT_DOCUMENT_BYTES: usize = 5 * 1024;

/// The MCP client's name for the consent page ([`client_document_name`]); a refusal is logged
/// with the SHA-256 of the client id and the reason, never the URL, and the page shows the name
/// as not stated.
pub(crate) async fn client_name(guard: &EgressGuard, client_id: &str) -> Option<String> {
    client_document_name(guard, client_id).await.unwrap_or_else(|reason| {
        tracing::warn!(
            client_id_sha256 = %palisade_base::hex::hex(&super::id_digest(client_id)),
            %reason,
            "user_oauth: the MCP client's metadata document was refused; the consent page shows its name as not stated"
        );
        None
    })
}

/// The MCP client's name from its Client ID Metadata Document: `Ok(None)` when its id is not an
/// https URL (there is nothing to fetch) or the document names none; `Err` with the reason (a
/// fixed category, never the URL or the response) when the fetch was refused or the document
/// says nothing of this client.
pub(crate) async fn client_document_name(guard: &EgressGuard, client_id: &str) -> Result<Option<String>, String> {
    let Some(url) = Url::parse(client_id).ok().filter(|url| url.scheme() == "https") else { return Ok(None) };
    let fetched = guard.get(&url, "application/json").await.map_err(|error| match error {
        EgressError::Transport | EgressError::Timeout => format!("unreachable ({error})"),
        other => format!("refused by the egress guard ({other})"),
    })?;
    if fetched.status != 200 {
        return Err(format!("answered HTTP {}", fetched.status));
    }
    if fetched.body.len() > MAX_CLIENT_DOCUMENT_BYTES {
        return Err("the document is too large".into());
    }
    let document: Value = serde_json::from_slice(&fetched.body).map_err(|_| "the document is not JSON".to_owned())?;
    if document.get("client_id").and_then(Value::as_str) != Some(client_id) {
        return Err("the document's client_id is not the URL it was fetched from".into());
    }
    Ok(document.get("client_name").and_then(Value::as_str).map(|name| name.chars().take(200).collect()))
}

enum FetchFailure {
    /// Not there (404/410 or not JSON): try the next location.
    Missing,
    /// Refused by the guard or failed: stop.
    Refused(OAuthError),
}

async fn fetch_json(guard: &EgressGuard, url: &Url) -> Result<Value, FetchFailure> {
    let fetched = guard.get(url, "application/json").await.map_err(|error| match error {
        EgressError::Transport | EgressError::Timeout => {
            FetchFailure::Refused(OAuthError::Unreachable(format!("{}: {error}", shown(url))))
        }
        other => FetchFailure::Refused(OAuthError::Egress { url: shown(url), error: other }),
    })?;
    if fetched.status != 200 {
        return Err(FetchFailure::Missing);
    }
    match serde_json::from_slice::<Value>(&fetched.body) {
        Ok(document @ Value::Object(_)) => Ok(document),
        _ => Err(FetchFailure::Missing),
    }
}

/// A URL as errors show it: scheme, host, port and path (no query: it may carry anything).
pub(crate) fn shown(url: &Url) -> String {
    let mut shown = url.clone();
    shown.set_query(None);
    shown.set_fragment(None);
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.to_string()
}

fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn well_known_locations_follow_rfc_9728_and_8414() {
        let resource = Url::parse("https://files.example/mcp").unwrap();
        let urls: Vec<String> = resource_metadata_urls(&resource).iter().map(Url::to_string).collect();
        assert_eq!(
            urls,
            [
                "https://files.example/.well-known/oauth-protected-resource/mcp",
                "https://files.example/.well-known/oauth-protected-resource"
            ]
        );
        let issuer = Url::parse("https://as.example/tenant1").unwrap();
        let urls: Vec<String> = authorization_server_metadata_urls(&issuer).iter().map(Url::to_string).collect();
        assert_eq!(
            urls,
            [
                "https://as.example/.well-known/oauth-authorization-server/tenant1",
                "https://as.example/.well-known/openid-configuration/tenant1",
                "https://as.example/tenant1/.well-known/openid-configuration"
            ]
        );
        let root = Url::parse("https://as.example").unwrap();
        assert_eq!(authorization_server_metadata_urls(&root).len(), 2);
    }

    #[test]
    fn protected_resource_metadata_must_name_this_upstream() {
        let resource = Url::parse("https://files.example/mcp").unwrap();
        let ok = json!({ "resource": "https://files.example/mcp", "authorization_servers": ["https://as.example"] });
        assert_eq!(parse_protected_resource(&ok, &resource).unwrap().issuer, "https://as.example");
        for bad in [
            json!({ "resource": "https://other.example/mcp", "authorization_servers": ["https://as.example"] }),
            json!({ "resource": "https://files.example/mcp2", "authorization_servers": ["https://as.example"] }),
            json!({ "resource": "https://files.example/mcp", "authorization_servers": [] }),
            json!({ "authorization_servers": ["https://as.example"] }),
        ] {
            assert!(parse_protected_resource(&bad, &resource).is_err(), "{bad}");
        }
    }

    #[test]
    fn browser_urls_are_https_or_development_loopback_only() {
        let check = |text: &str, dev: bool| check_browser_url(&Url::parse(text).unwrap(), dev);
        assert!(check("https://as.example/authorize", false).is_ok());
        assert!(check("http://127.0.0.1:9000/authorize", true).is_ok());
        assert!(check("http://localhost:9000/authorize", true).is_ok());
        assert!(check("http://127.0.0.1:9000/authorize", false).is_err());
        assert!(check("http://as.example/authorize", true).is_err());
        assert!(check("javascript:alert(1)", true).is_err());
        assert!(check("file:///etc/passwd", true).is_err());
        assert!(check("data:text/html,<p>x", true).is_err());
        assert!(check("https://user:pw@as.example/authorize", true).is_err());
    }

    fn metadata(issuer: &str) -> Value {
        json!({
            "issuer": issuer,
            "authorization_endpoint": format!("{issuer}/authorize"),
            "token_endpoint": format!("{issuer}/token"),
            "code_challenge_methods_supported": ["S256"],
            "response_types_supported": ["code"],
        })
    }

    #[test]
    fn authorization_server_metadata_is_checked() {
        let guard = EgressGuard::new(palisade_auth::egress::EgressPolicy::default()).unwrap();
        let issuer = "https://as.example";
        assert!(parse_authorization_server(&metadata(issuer), issuer, &guard, false).is_ok());
        let mut other_issuer = metadata(issuer);
        other_issuer["issuer"] = json!("https://evil.example");
        let mut trailing = metadata(issuer);
        trailing["issuer"] = json!("https://as.example/");
        let mut plain_only = metadata(issuer);
        plain_only["code_challenge_methods_supported"] = json!(["plain"]);
        let mut no_pkce = metadata(issuer);
        no_pkce.as_object_mut().unwrap().remove("code_challenge_methods_supported");
        let mut script = metadata(issuer);
        script["authorization_endpoint"] = json!("javascript:alert(1)");
        let mut file = metadata(issuer);
        file["authorization_endpoint"] = json!("file:///etc/passwd");
        let mut metadata_ip = metadata(issuer);
        metadata_ip["token_endpoint"] = json!("https://169.254.169.254/token");
        let mut mapped = metadata(issuer);
        mapped["registration_endpoint"] = json!("https://[::ffff:127.0.0.1]/register");
        for (name, bad) in [
            ("another issuer", other_issuer),
            ("the issuer with a trailing slash", trailing),
            ("plain PKCE only", plain_only),
            ("no PKCE", no_pkce),
            ("a javascript: authorization URL", script),
            ("a file: authorization URL", file),
            ("a token endpoint at the metadata address", metadata_ip),
            ("a registration endpoint on mapped loopback", mapped),
        ] {
            assert!(parse_authorization_server(&bad, issuer, &guard, false).is_err(), "{name}");
        }
    }
}
