//! The authorization server's bounded in-memory records (clients, pending consents, grants, codes,
//! refresh tokens), their caps, and the request checks and helpers that need no server.

use std::collections::{HashMap, HashSet};

use aws_lc_rs::digest::{SHA256, digest};
use palisade_base::limit::Limits;
use serde_json::{Map, Value};
use url::Url;

use super::http::{AuditEvent, HttpResponse};

/// How long a pending consent (the page shown, not yet answered) stays valid.
pub(super) const CONSENT_TTL_SECS: u64 = 600;
/// How long a fetched client metadata document is reused.
pub(super) const CLIENT_METADATA_CACHE_SECS: u64 = 300;
/// Bounds of the in-memory tables: past them the oldest entries go first.
pub(super) const MAX_CLIENTS: usize = 1000;
pub(super) const MAX_PENDING: usize = 1000;
pub(super) const MAX_CODES: usize = 1000;
pub(super) const MAX_REFRESH_TOKENS: usize = 10_000;
/// Largest registration request body.
pub(super) const MAX_REGISTRATION_BYTES: usize = 16 * 1024;
/// Most redirect URIs of one client.
pub(super) const MAX_REDIRECT_URIS: usize = 10;
/// Name of the CSRF cookie set with the consent page.
pub(super) const CSRF_COOKIE: &str = "palisade_dev_csrf";
/// Registrations (RFC 7591) one source may make: 20 at once, then one every 3 s; all sources
/// together 200 at once, then 5 a second. Past them: 429 before the request is read.
pub(super) const REGISTRATION_LIMITS: Limits =
    Limits { burst: 20, refill_ms: 3000, total_burst: 200, total_refill_ms: 200, max_sources: 4096 };

/// A registered or fetched client.
#[derive(Debug, Clone)]
pub(super) struct Client {
    pub(super) name: Option<String>,
    pub(super) redirect_uris: Vec<String>,
    /// Unix seconds until which an access token issued to it is valid (0: none issued).
    pub(super) tokens_until: u64,
    /// Unix seconds after which a fetched document is fetched again (`None`: registered).
    pub(super) refetch_after: Option<u64>,
    pub(super) created: u64,
}

/// A validated authorization request.
#[derive(Debug, Clone)]
pub(super) struct AuthorizationRequest {
    pub(super) client_id: String,
    pub(super) client_name: Option<String>,
    pub(super) redirect_uri: String,
    pub(super) state: Option<String>,
    pub(super) code_challenge: String,
    pub(super) scopes: Vec<String>,
}

#[derive(Debug)]
pub(super) struct Pending {
    pub(super) request: AuthorizationRequest,
    pub(super) csrf: String,
    pub(super) expires: u64,
}

#[derive(Debug, Clone)]
pub(super) struct Grant {
    pub(super) client_id: String,
    pub(super) subject: String,
    pub(super) tenant: String,
    pub(super) scopes: Vec<String>,
}

#[derive(Debug)]
pub(super) struct Code {
    pub(super) grant: Grant,
    pub(super) redirect_uri: String,
    pub(super) code_challenge: String,
    pub(super) expires: u64,
    /// Set once redeemed: the refresh-token family it produced.
    pub(super) redeemed_family: Option<u64>,
}

#[derive(Debug)]
pub(super) struct Refresh {
    pub(super) grant: Grant,
    pub(super) family: u64,
    pub(super) expires: u64,
    pub(super) used: bool,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) clients: HashMap<String, Client>,
    pub(super) pending: HashMap<String, Pending>,
    pub(super) codes: HashMap<[u8; 32], Code>,
    pub(super) refresh: HashMap<[u8; 32], Refresh>,
    pub(super) revoked_families: std::collections::HashSet<u64>,
    pub(super) next_family: u64,
}

/// A refusal of an authorization request: shown as a page (the client or its redirect URI is
/// not trusted), or sent back to the client's redirect URI.
pub(super) enum AuthorizeRefusal {
    /// Status, the audit reason, the message.
    Page(u16, &'static str, &'static str),
    Redirect {
        request: Box<AuthorizationRequest>,
        error: &'static str,
        description: &'static str,
    },
}

/// A client from registration or metadata-document members: redirect URIs (required, each
/// absolute, https or http on a loopback host or a private-use scheme, no fragment), public
/// client only, code flow only.
pub(super) fn client_from_metadata(document: &Map<String, Value>) -> Result<Client, (&'static str, &'static str)> {
    let invalid = |why| ("invalid_client_metadata", why);
    let uris = document
        .get("redirect_uris")
        .and_then(Value::as_array)
        .filter(|uris| !uris.is_empty() && uris.len() <= MAX_REDIRECT_URIS)
        .ok_or(("invalid_redirect_uri", "redirect_uris: 1 to 10 URIs required"))?;
    let mut redirect_uris = Vec::new();
    for uri in uris {
        let uri = uri.as_str().ok_or(("invalid_redirect_uri", "redirect_uris must be strings"))?;
        if !acceptable_redirect_uri(uri) {
            return Err((
                "invalid_redirect_uri",
                "redirect URIs must be https, http on loopback, or a private-use scheme",
            ));
        }
        redirect_uris.push(uri.to_owned());
    }
    match document.get("token_endpoint_auth_method") {
        None => {}
        Some(Value::String(method)) if method == "none" => {}
        Some(_) => return Err(invalid("only public clients (token_endpoint_auth_method none) are supported")),
    }
    if let Some(types) = document.get("response_types") {
        let ok = types.as_array().is_some_and(|t| t.iter().all(|v| v.as_str() == Some("code")));
        if !ok {
            return Err(invalid("only response_type code is supported"));
        }
    }
    if let Some(types) = document.get("grant_types") {
        let ok = types
            .as_array()
            .is_some_and(|t| t.iter().all(|v| matches!(v.as_str(), Some("authorization_code" | "refresh_token"))));
        if !ok {
            return Err(invalid("only the authorization_code and refresh_token grants are supported"));
        }
    }
    let name = match document.get("client_name") {
        None => None,
        Some(Value::String(name)) if name.chars().count() <= 200 => Some(name.clone()),
        Some(_) => return Err(invalid("client_name must be a string of at most 200 characters")),
    };
    Ok(Client { name, redirect_uris, tokens_until: 0, refetch_after: None, created: 0 })
}

pub(super) fn acceptable_redirect_uri(uri: &str) -> bool {
    let Ok(url) = Url::parse(uri) else { return false };
    if url.fragment().is_some() || uri.len() > 2000 {
        return false;
    }
    match url.scheme() {
        "https" => url.host().is_some(),
        "http" => match url.host() {
            Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        },
        // RFC 8252 §7.1: private-use schemes are reverse domain names.
        scheme => scheme.contains('.') && !matches!(scheme, "javascript" | "data" | "file"),
    }
}

/// The CSP `form-action` source for the consent form's redirect (browsers hold the redirect
/// after the form to it).
pub(super) fn form_target(redirect_uri: &str) -> String {
    match Url::parse(redirect_uri) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => format!(" {}", url.origin().ascii_serialization()),
        Ok(url) => format!(" {}:", url.scheme()),
        Err(_) => String::new(),
    }
}

/// Query or form parameters, refused (`None`) if a name repeats (RFC 6749 §3.1).
pub(super) fn unique_params(bytes: &[u8]) -> Option<HashMap<String, String>> {
    let mut params = HashMap::new();
    for (name, value) in url::form_urlencoded::parse(bytes) {
        if params.insert(name.into_owned(), value.into_owned()).is_some() {
            return None;
        }
    }
    Some(params)
}

pub(super) fn csrf_cookie(header: Option<&str>) -> Option<&str> {
    header?
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == CSRF_COOKIE)
        .map(|(_, v)| v)
}

pub(super) fn is_form(content_type: Option<&str>) -> bool {
    content_type
        .and_then(|ct| ct.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"))
}

pub(super) fn is_base64url(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub(super) fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

pub(super) fn is_identifier(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'))
}

pub(super) fn dedup(mut scopes: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    scopes.retain(|s| seen.insert(s.clone()));
    scopes
}

pub(super) fn sha256(text: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, text.as_bytes()).as_ref());
    out
}

pub(super) fn method_not_allowed() -> HttpResponse {
    HttpResponse::oauth_error(405, "invalid_request", "method not allowed")
}

/// The audit event of granting `grant` (`reason` `code_issued` or `issued`).
pub(super) fn grant_event(reason: &'static str, grant: &Grant, detail: Option<&'static str>) -> AuditEvent {
    AuditEvent {
        reason,
        client_id: Some(grant.client_id.clone()),
        subject: Some(grant.subject.clone()),
        tenant: Some(grant.tenant.clone()),
        scopes: grant.scopes.clone(),
        detail,
        ..AuditEvent::default()
    }
}

/// Makes room for one more client at `now` by dropping the oldest clients that are not in use:
/// none has an unexpired access token, an unredeemed code, an unused refresh token or a pending
/// consent. `false` when every client is in use (nothing is dropped).
pub(super) fn make_room(state: &mut State, now: u64) -> bool {
    if state.clients.len() < MAX_CLIENTS {
        return true;
    }
    let mut in_use: HashSet<&str> = HashSet::new();
    in_use.extend(state.pending.values().filter(|p| p.expires > now).map(|p| p.request.client_id.as_str()));
    in_use.extend(
        state
            .codes
            .values()
            .filter(|c| c.expires > now && c.redeemed_family.is_none())
            .map(|c| c.grant.client_id.as_str()),
    );
    in_use.extend(
        state
            .refresh
            .values()
            .filter(|r| r.expires > now && !r.used && !state.revoked_families.contains(&r.family))
            .map(|r| r.grant.client_id.as_str()),
    );
    let mut idle: Vec<(u64, String)> = state
        .clients
        .iter()
        .filter(|(id, client)| client.tokens_until <= now && !in_use.contains(id.as_str()))
        .map(|(id, client)| (client.created, id.clone()))
        .collect();
    let excess = state.clients.len() + 1 - MAX_CLIENTS;
    if idle.len() < excess {
        return false;
    }
    idle.sort();
    for (_, id) in idle.into_iter().take(excess) {
        state.clients.remove(&id);
    }
    true
}

/// Drops the entries with the smallest `key` until there is room for one more.
pub(super) fn evict_oldest<K: Clone + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    cap: usize,
    key: impl Fn(&V) -> u64,
) {
    while map.len() >= cap {
        let Some(oldest) = map.iter().min_by_key(|(_, v)| key(v)).map(|(k, _)| k.clone()) else { return };
        map.remove(&oldest);
    }
}
