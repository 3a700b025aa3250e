//! The development issuer as a small OAuth 2.1 authorization server, so that MCP clients that
//! follow the authorization spec connect to the demo by themselves. **For development only:**
//! whoever reaches the authorization page can have a token for any subject and tenant.
//!
//! It knows HTTP only as [`HttpRequest`] / [`HttpResponse`] values (method, path, query, a few
//! headers, body bytes); the server crate mounts [`DevAuthorizationServer::paths`] and hands
//! requests over.
//!
//! What it does, and refuses:
//! - **Metadata** (RFC 8414) at the path-inserted well-known URIs derived from the issuer, and the
//!   same document at the OpenID discovery locations clients also try; `issuer` is the issuer of
//!   the protected-resource metadata. JWKS at `{issuer}/jwks`.
//! - **Authorization code with PKCE S256 only** (missing or `plain` refused), exact
//!   `redirect_uri` match, `state` returned unchanged, RFC 8707 `resource` required and equal to
//!   the canonical resource URI (the token's `aud`), RFC 9207 `iss` on every authorization
//!   response. Codes are single-use, short-lived and bound to client, redirect URI, challenge and
//!   resource; a replayed code also revokes the refresh tokens it produced.
//! - **Clients:** a client id that is an https URL is a Client ID Metadata Document, fetched
//!   through the [`EgressGuard`](crate::egress::EgressGuard) (public addresses only, size and
//!   time caps) whose `client_id` must equal that URL; other client ids come from Dynamic Client
//!   Registration (RFC 7591). Public clients only (`token_endpoint_auth_method = none`).
//! - **Consent page** where the person picks subject, tenant and scopes; the form carries a CSRF
//!   token that must equal the cookie set with the page (both bound to the pending request); the
//!   page cannot be framed (`X-Frame-Options: DENY`, CSP `frame-ancestors 'none'`). With
//!   `auto_approve` the page is skipped (the demo defaults are granted), for tests and scripts;
//!   the binary refuses it on a non-loopback listener.
//! - **Token endpoint:** `authorization_code` and `refresh_token` (rotation: each refresh token
//!   works once; presenting a used one revokes its whole family). Access tokens are short-lived
//!   ES256 `at+jwt` from the development issuer's key.
//!
//! State (clients, pending consents, codes, refresh tokens) lives in memory, bounded, and is lost
//! on restart: clients then register again.

mod http;
mod state;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_lc_rs::digest::{SHA256, digest};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_base::clock::{Clock, SystemClock};
use palisade_base::html::escape;
use palisade_base::limit::SourceLimiter;
use serde_json::{Map, Value, json};
use subtle::ConstantTimeEq;
use url::Url;

use crate::dev_issuer::DevIssuer;
use crate::egress::{EgressError, EgressGuard};
pub use http::{AuditEvent, DevAuthorizationError, DevAuthorizationSettings, HttpRequest, HttpResponse};
use state::*;

/// The authorization server. Holds the development issuer's key, so it has no `Debug` of its
/// contents.
pub struct DevAuthorizationServer {
    issuer: DevIssuer,
    issuer_url: Url,
    base_path: String,
    settings: DevAuthorizationSettings,
    guard: EgressGuard,
    clock: Arc<dyn Clock>,
    rng: SystemRandom,
    state: Mutex<State>,
    registrations: SourceLimiter,
}

impl std::fmt::Debug for DevAuthorizationServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevAuthorizationServer")
            .field("issuer", &self.issuer.issuer())
            .field("resource", &self.settings.resource)
            .field("auto_approve", &self.settings.auto_approve)
            .finish_non_exhaustive()
    }
}

impl DevAuthorizationServer {
    /// The authorization server of `issuer` for the resource in `settings`.
    pub fn new(issuer: DevIssuer, settings: DevAuthorizationSettings) -> Result<Self, DevAuthorizationError> {
        let issuer_url = Url::parse(issuer.issuer()).map_err(|_| DevAuthorizationError::Issuer)?;
        let base_path = issuer_url.path().trim_end_matches('/').to_owned();
        let guard = EgressGuard::new(settings.client_metadata_egress.clone()).map_err(DevAuthorizationError::Egress)?;
        Ok(Self {
            issuer,
            issuer_url,
            base_path,
            settings,
            guard,
            clock: Arc::new(SystemClock),
            rng: SystemRandom::new(),
            state: Mutex::new(State::default()),
            registrations: SourceLimiter::new(REGISTRATION_LIMITS),
        })
    }

    /// Uses `clock` for codes, refresh tokens and the tokens minted.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.issuer = self.issuer.with_clock(clock.clone());
        self.clock = clock;
        self
    }

    /// Whether the page is skipped.
    pub fn auto_approve(&self) -> bool {
        self.settings.auto_approve
    }

    /// The issuer identifier.
    pub fn issuer(&self) -> &str {
        self.issuer.issuer()
    }

    fn endpoint(&self, name: &str) -> String {
        format!("{}{}/{name}", self.issuer_url.origin().ascii_serialization(), self.base_path)
    }

    fn metadata_paths(&self) -> Vec<String> {
        let path = &self.base_path;
        vec![
            format!("/.well-known/oauth-authorization-server{path}"),
            format!("/.well-known/openid-configuration{path}"),
            format!("{path}/.well-known/oauth-authorization-server"),
            format!("{path}/.well-known/openid-configuration"),
        ]
    }

    /// Every path this server answers, for mounting.
    pub fn paths(&self) -> Vec<String> {
        let mut paths = self.metadata_paths();
        for name in ["authorize", "token", "register", "jwks"] {
            paths.push(format!("{}/{name}", self.base_path));
        }
        paths
    }

    /// The RFC 8414 metadata document.
    pub fn metadata(&self) -> Value {
        json!({
            "issuer": self.issuer.issuer(),
            "authorization_endpoint": self.endpoint("authorize"),
            "token_endpoint": self.endpoint("token"),
            "registration_endpoint": self.endpoint("register"),
            "jwks_uri": self.endpoint("jwks"),
            "scopes_supported": self.settings.scopes_supported,
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "token_endpoint_auth_methods_supported": ["none"],
            "code_challenge_methods_supported": ["S256"],
            "authorization_response_iss_parameter_supported": true,
            "client_id_metadata_document_supported": true,
        })
    }

    /// Answers one request (404 for a path it does not serve, 405 for a method).
    pub async fn handle(&self, request: HttpRequest<'_>) -> HttpResponse {
        let path = request.path;
        if self.metadata_paths().iter().any(|p| p == path) {
            return match request.method {
                "GET" | "HEAD" => HttpResponse::json(200, &self.metadata()),
                _ => method_not_allowed(),
            };
        }
        let Some(name) = path.strip_prefix(self.base_path.as_str()).and_then(|rest| rest.strip_prefix('/')) else {
            return HttpResponse::oauth_error(404, "not_found", "no such endpoint");
        };
        let (endpoint, mut answer) = match (name, request.method) {
            ("authorize", "GET") => ("authorize", self.authorize(request.query.unwrap_or(""), request.cookie).await),
            ("authorize", "POST") => ("consent", self.consent_answer(request)),
            ("token", "POST") => ("token", self.token(request)),
            ("register", "POST") => ("register", self.register(request)),
            ("jwks", "GET" | "HEAD") => ("", HttpResponse::json(200, &json!(self.issuer.jwks()))),
            ("jwks" | "authorize" | "token" | "register", _) => ("", method_not_allowed()),
            _ => ("", HttpResponse::oauth_error(404, "not_found", "no such endpoint")),
        };
        // Only the four decision endpoints are on the audit record.
        answer.audit =
            answer.audit.take().filter(|_| !endpoint.is_empty()).map(|event| AuditEvent { endpoint, ..event });
        answer
    }

    fn now(&self) -> u64 {
        self.clock.now_secs()
    }

    fn random_token(&self) -> String {
        let mut bytes = [0u8; 32];
        // SystemRandom only fails if the OS has no entropy source; a zero token would then be
        // guessable, so such a token is never handed out: callers check for the empty string.
        if self.rng.fill(&mut bytes).is_err() {
            return String::new();
        }
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    // ---------------------------------------------------------------------------------------
    // Authorization endpoint
    // ---------------------------------------------------------------------------------------

    async fn authorize(&self, query: &str, cookie: Option<&str>) -> HttpResponse {
        let request = match self.validate_authorization(query).await {
            Ok(request) => request,
            Err(refusal) => return self.refuse_authorization(refusal),
        };
        if self.settings.auto_approve {
            let grant = Grant {
                client_id: request.client_id.clone(),
                subject: self.settings.default_subject.clone(),
                tenant: self.settings.default_tenant.clone(),
                scopes: request.scopes.clone(),
            };
            return self.issue_code(&request, grant, 302);
        }
        // The CSRF token is the browser's cookie when it has a well-formed one (several tabs
        // may be open), else a new one.
        let csrf =
            csrf_cookie(cookie).filter(|c| c.len() == 43).map(str::to_owned).unwrap_or_else(|| self.random_token());
        let id = self.random_token();
        if csrf.is_empty() || id.is_empty() {
            return HttpResponse::error_page(500, "no randomness available");
        }
        let now = self.now();
        {
            let mut state = self.lock();
            state.pending.retain(|_, pending| pending.expires > now);
            evict_oldest(&mut state.pending, MAX_PENDING, |p| p.expires);
            state.pending.insert(
                id.clone(),
                Pending { request: request.clone(), csrf: csrf.clone(), expires: now + CONSENT_TTL_SECS },
            );
        }
        let cookie = format!("{CSRF_COOKIE}={csrf}; Path={}/; HttpOnly; SameSite=Strict", self.base_path);
        let html = self.consent_page(&request, &id, &csrf);
        HttpResponse::page(200, html, &form_target(&request.redirect_uri), Some(cookie))
    }

    async fn validate_authorization(&self, query: &str) -> Result<AuthorizationRequest, AuthorizeRefusal> {
        let params = unique_params(query.as_bytes()).ok_or(AuthorizeRefusal::Page(
            400,
            "invalid_request",
            "a parameter is repeated or malformed",
        ))?;
        let get = |name: &str| params.get(name).map(String::as_str);
        let client_id =
            get("client_id").ok_or(AuthorizeRefusal::Page(400, "invalid_request", "client_id is missing"))?;
        let client = self.client(client_id).await.map_err(|why| AuthorizeRefusal::Page(400, "client_unknown", why))?;
        let redirect_uri =
            get("redirect_uri").ok_or(AuthorizeRefusal::Page(400, "invalid_request", "redirect_uri is missing"))?;
        if !client.redirect_uris.iter().any(|registered| registered == redirect_uri) {
            return Err(AuthorizeRefusal::Page(
                400,
                "redirect_uri_unregistered",
                "redirect_uri is not registered for this client",
            ));
        }
        let mut request = Box::new(AuthorizationRequest {
            client_id: client_id.to_owned(),
            client_name: client.name.clone(),
            redirect_uri: redirect_uri.to_owned(),
            state: get("state").map(str::to_owned),
            code_challenge: String::new(),
            scopes: Vec::new(),
        });
        let refuse = |request: Box<AuthorizationRequest>, error: &'static str, description: &'static str| {
            Err(AuthorizeRefusal::Redirect { request, error, description })
        };
        if get("response_type") != Some("code") {
            return refuse(request, "unsupported_response_type", "only response_type=code is supported");
        }
        match get("code_challenge_method") {
            Some("S256") => {}
            Some("plain") => return refuse(request, "invalid_request", "PKCE method plain is not allowed; use S256"),
            Some(_) => return refuse(request, "invalid_request", "unsupported PKCE method; use S256"),
            None => return refuse(request, "invalid_request", "PKCE is required (code_challenge_method=S256)"),
        }
        match get("code_challenge") {
            Some(challenge) if challenge.len() == 43 && is_base64url(challenge) => {
                request.code_challenge = challenge.to_owned();
            }
            Some(_) => return refuse(request, "invalid_request", "code_challenge is not an S256 challenge"),
            None => return refuse(request, "invalid_request", "PKCE is required (code_challenge)"),
        }
        match get("resource") {
            Some(resource) if resource == self.settings.resource => {}
            Some(_) => return refuse(request, "invalid_target", "resource names another server"),
            None => return refuse(request, "invalid_target", "resource is required"),
        }
        let scopes: Vec<String> =
            get("scope").unwrap_or("").split(' ').filter(|s| !s.is_empty()).map(str::to_owned).collect();
        if scopes.iter().any(|scope| !self.settings.scopes_supported.contains(scope)) {
            return refuse(request, "invalid_scope", "unknown scope requested");
        }
        request.scopes = if scopes.is_empty() { self.settings.default_scopes.clone() } else { dedup(scopes) };
        Ok(*request)
    }

    fn refuse_authorization(&self, refusal: AuthorizeRefusal) -> HttpResponse {
        match refusal {
            AuthorizeRefusal::Page(status, reason, message) => {
                HttpResponse::error_page(status, message).because(reason)
            }
            AuthorizeRefusal::Redirect { request, error, description } => {
                let params = [("error", error), ("error_description", description)];
                self.redirect_to_client(&request, &params, 302).because(error)
            }
        }
    }

    /// A redirect to the client's (already verified) redirect URI with `params`, `state` and `iss`.
    fn redirect_to_client(&self, request: &AuthorizationRequest, params: &[(&str, &str)], status: u16) -> HttpResponse {
        let Ok(mut location) = Url::parse(&request.redirect_uri) else {
            return HttpResponse::error_page(400, "redirect_uri is not a URL");
        };
        {
            let mut pairs = location.query_pairs_mut();
            for (name, value) in params {
                pairs.append_pair(name, value);
            }
            if let Some(state) = &request.state {
                pairs.append_pair("state", state);
            }
            pairs.append_pair("iss", self.issuer.issuer());
        }
        HttpResponse::redirect(status, location.into())
    }

    fn issue_code(&self, request: &AuthorizationRequest, grant: Grant, status: u16) -> HttpResponse {
        let code = self.random_token();
        if code.is_empty() {
            return HttpResponse::error_page(500, "no randomness available");
        }
        let now = self.now();
        {
            let mut state = self.lock();
            state.codes.retain(|_, c| c.expires > now || c.redeemed_family.is_some() && c.expires + 600 > now);
            evict_oldest(&mut state.codes, MAX_CODES, |c| c.expires);
            state.codes.insert(
                sha256(&code),
                Code {
                    grant: grant.clone(),
                    redirect_uri: request.redirect_uri.clone(),
                    code_challenge: request.code_challenge.clone(),
                    expires: now + self.settings.code_ttl_secs,
                    redeemed_family: None,
                },
            );
        }
        tracing::info!(client_id = %grant.client_id, subject = %grant.subject, tenant = %grant.tenant,
            scopes = %grant.scopes.join(" "), "development issuer: authorization granted");
        let event = grant_event("code_issued", &grant, None);
        let answer = self.redirect_to_client(request, &[("code", &code)], status);
        if answer.status == status { answer.granting(event) } else { answer }
    }

    // ---------------------------------------------------------------------------------------
    // The consent page
    // ---------------------------------------------------------------------------------------

    fn consent_page(&self, request: &AuthorizationRequest, id: &str, csrf: &str) -> String {
        let mut scopes = String::new();
        for scope in &self.settings.scopes_supported {
            let checked = if request.scopes.contains(scope) { " checked" } else { "" };
            scopes.push_str(&format!(
                "<label><input type=\"checkbox\" name=\"scope\" value=\"{s}\"{checked}> {s}</label><br>",
                s = escape(scope)
            ));
        }
        let client = match &request.client_name {
            Some(name) => format!("{} (<code>{}</code>)", escape(name), escape(&request.client_id)),
            None => format!("<code>{}</code>", escape(&request.client_id)),
        };
        format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>Authorize {title}</title>\
             <style>body{{font-family:sans-serif;max-width:40em;margin:2em auto}}\
             .warn{{background:#fee;padding:.5em;border:1px solid #c00}}</style></head><body>\
             <h1>Development issuer</h1>\
             <p class=\"warn\">Development only: anyone who reaches this page can authorize as anyone.</p>\
             <p>{client} asks for access to <code>{resource}</code>.<br>\
             The answer goes to <code>{redirect}</code>.</p>\
             <form method=\"post\" action=\"{action}\">\
             <input type=\"hidden\" name=\"request\" value=\"{id}\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <p><label>Subject <input name=\"subject\" value=\"{subject}\" required maxlength=\"64\"></label></p>\
             <p><label>Tenant <input name=\"tenant\" value=\"{tenant}\" required maxlength=\"64\"></label></p>\
             <fieldset><legend>Scopes</legend>{scopes}</fieldset>\
             <p><button type=\"submit\" name=\"decision\" value=\"approve\">Approve</button> \
             <button type=\"submit\" name=\"decision\" value=\"deny\">Deny</button></p>\
             </form></body></html>",
            title = escape(request.client_name.as_deref().unwrap_or(&request.client_id)),
            resource = escape(&self.settings.resource),
            redirect = escape(&request.redirect_uri),
            action = escape(&format!("{}/authorize", self.base_path)),
            id = escape(id),
            csrf = escape(csrf),
            subject = escape(&self.settings.default_subject),
            tenant = escape(&self.settings.default_tenant),
        )
    }

    fn consent_answer(&self, request: HttpRequest<'_>) -> HttpResponse {
        if !is_form(request.content_type) {
            return HttpResponse::error_page(415, "expected a form");
        }
        let mut single: HashMap<String, String> = HashMap::new();
        let mut scopes = Vec::new();
        for (name, value) in url::form_urlencoded::parse(request.body) {
            if name == "scope" {
                scopes.push(value.into_owned());
            } else if single.insert(name.into_owned(), value.into_owned()).is_some() {
                return HttpResponse::error_page(400, "a field is repeated");
            }
        }
        let Some(id) = single.get("request") else {
            return HttpResponse::error_page(400, "the authorization request is missing");
        };
        let now = self.now();
        let pending = {
            let mut state = self.lock();
            let Some(pending) = state.pending.get(id) else {
                return HttpResponse::error_page(400, "the authorization request is unknown or expired")
                    .because("request_unknown");
            };
            if pending.expires <= now {
                state.pending.remove(id);
                return HttpResponse::error_page(400, "the authorization request is unknown or expired")
                    .because("request_unknown");
            }
            // Both the form field and the cookie must equal the token bound to this request: a
            // page on another site can send neither (the cookie is SameSite=Strict).
            let form = single.get("csrf").map(String::as_bytes).unwrap_or_default();
            let cookie = csrf_cookie(request.cookie).map(str::as_bytes).unwrap_or_default();
            let expected = pending.csrf.as_bytes();
            let form_ok: bool = form.ct_eq(expected).into();
            let cookie_ok: bool = cookie.ct_eq(expected).into();
            if !(form_ok && cookie_ok) {
                return HttpResponse::error_page(403, "the CSRF check failed; reload the client's authorization link");
            }
            state.pending.remove(id).map(|pending| pending.request)
        };
        let Some(authorization) = pending else {
            return HttpResponse::error_page(400, "the authorization request is unknown or expired");
        };
        match single.get("decision").map(String::as_str) {
            Some("approve") => {}
            Some("deny") => {
                let params = [("error", "access_denied"), ("error_description", "the user denied the request")];
                return self.redirect_to_client(&authorization, &params, 303).because("access_denied");
            }
            _ => return HttpResponse::error_page(400, "approve or deny"),
        }
        let subject = single.get("subject").map(String::as_str).unwrap_or("");
        let tenant = single.get("tenant").map(String::as_str).unwrap_or("");
        if !is_identifier(subject) || !is_identifier(tenant) {
            return HttpResponse::error_page(400, "subject and tenant must be 1 to 64 letters, digits or . _ @ -");
        }
        if scopes.iter().any(|scope| !self.settings.scopes_supported.contains(scope)) {
            return HttpResponse::error_page(400, "unknown scope");
        }
        let grant = Grant {
            client_id: authorization.client_id.clone(),
            subject: subject.to_owned(),
            tenant: tenant.to_owned(),
            scopes: dedup(scopes),
        };
        self.issue_code(&authorization, grant, 303)
    }

    // ---------------------------------------------------------------------------------------
    // Clients: metadata documents and registration
    // ---------------------------------------------------------------------------------------

    /// The client `client_id`: fetched (a metadata document URL) or registered.
    async fn client(&self, client_id: &str) -> Result<Client, &'static str> {
        let now = self.now();
        if let Some(client) = self.lock().clients.get(client_id)
            && client.refetch_after.is_none_or(|after| after > now)
        {
            return Ok(client.clone());
        }
        if !(client_id.starts_with("https://") || client_id.starts_with("http://")) {
            return Err("unknown client_id");
        }
        let client = self.fetch_client_metadata(client_id).await?;
        let mut state = self.lock();
        // Cached only if there is room without evicting a client that is in use.
        if state.clients.contains_key(client_id) || make_room(&mut state, now) {
            let tokens_until = state.clients.get(client_id).map_or(0, |known| known.tokens_until);
            state.clients.insert(client_id.to_owned(), Client { tokens_until, ..client.clone() });
        }
        Ok(client)
    }

    /// Fetches and checks a Client ID Metadata Document.
    async fn fetch_client_metadata(&self, client_id: &str) -> Result<Client, &'static str> {
        let url = Url::parse(client_id).map_err(|_| "client_id is not a URL")?;
        if url.as_str() != client_id {
            return Err("client_id URL is not in normal form");
        }
        if url.fragment().is_some() || url.path() == "/" || url.path().is_empty() {
            return Err("client_id URL must have a path and no fragment");
        }
        let fetched = self.guard.get(&url, "application/json").await.map_err(|error| match error {
            EgressError::UrlNotAllowed(_) => "client metadata URL not allowed (https only)",
            EgressError::AddressNotAllowed(_) => "client metadata host address not allowed",
            EgressError::RedirectRefused => "client metadata document redirects",
            EgressError::TooLarge => "client metadata document too large",
            EgressError::Timeout => "client metadata document timed out",
            EgressError::Resolve | EgressError::Transport | EgressError::Config(_) => {
                "client metadata document could not be fetched"
            }
        })?;
        if fetched.status != 200 {
            return Err("client metadata document could not be fetched");
        }
        let document: Map<String, Value> =
            serde_json::from_slice(&fetched.body).map_err(|_| "client metadata document is not a JSON object")?;
        if document.get("client_id").and_then(Value::as_str) != Some(client_id) {
            return Err("client metadata document's client_id differs from its URL");
        }
        if document.contains_key("client_secret") || document.contains_key("client_secret_expires_at") {
            return Err("client metadata document must not carry a client secret");
        }
        let client = client_from_metadata(&document).map_err(|_| "client metadata document is invalid")?;
        Ok(Client { refetch_after: Some(self.now() + CLIENT_METADATA_CACHE_SECS), ..client })
    }

    fn register(&self, request: HttpRequest<'_>) -> HttpResponse {
        if self.registrations.try_take(request.peer, self.clock.now_ms()).is_err() {
            let mut answer = HttpResponse::oauth_error(429, "too_many_requests", "too many registrations; try later")
                .because("rate_limited");
            answer.headers.push(("retry-after", "3".into()));
            return answer;
        }
        if !request
            .content_type
            .is_some_and(|ct| ct.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")))
        {
            return HttpResponse::oauth_error(400, "invalid_client_metadata", "expected application/json");
        }
        if request.body.len() > MAX_REGISTRATION_BYTES {
            return HttpResponse::oauth_error(400, "invalid_client_metadata", "registration too large");
        }
        let Ok(document) = serde_json::from_slice::<Map<String, Value>>(request.body) else {
            return HttpResponse::oauth_error(400, "invalid_client_metadata", "expected a JSON object");
        };
        let client = match client_from_metadata(&document) {
            Ok(client) => client,
            Err((error, description)) => return HttpResponse::oauth_error(400, error, description),
        };
        let client_id = format!("dcr-{}", self.random_token());
        if client_id.len() < 8 {
            return HttpResponse::oauth_error(500, "server_error", "no randomness available");
        }
        let now = self.now();
        let mut answer = json!({
            "client_id": client_id,
            "client_id_issued_at": now,
            "redirect_uris": client.redirect_uris,
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        });
        if let Some(name) = &client.name {
            answer["client_name"] = json!(name);
        }
        if let Some(scope) = document.get("scope").and_then(Value::as_str) {
            answer["scope"] = json!(scope);
        }
        let mut state = self.lock();
        if !make_room(&mut state, now) {
            // Every client holds a token, a code or a pending consent: none is dropped for a newcomer.
            return HttpResponse::oauth_error(503, "temporarily_unavailable", "the client table is full; try later")
                .because("clients_full");
        }
        state.clients.insert(client_id.clone(), Client { created: now, ..client });
        HttpResponse::json(201, &answer).granting(AuditEvent {
            reason: "registered",
            client_id: Some(client_id),
            ..AuditEvent::default()
        })
    }

    // ---------------------------------------------------------------------------------------
    // Token endpoint
    // ---------------------------------------------------------------------------------------

    fn token(&self, request: HttpRequest<'_>) -> HttpResponse {
        if !is_form(request.content_type) {
            return HttpResponse::oauth_error(400, "invalid_request", "expected application/x-www-form-urlencoded");
        }
        let Some(params) = unique_params(request.body) else {
            return HttpResponse::oauth_error(400, "invalid_request", "a parameter is repeated or malformed");
        };
        if params.contains_key("client_secret") {
            return HttpResponse::oauth_error(401, "invalid_client", "clients of this issuer are public");
        }
        if let Some(resource) = params.get("resource")
            && *resource != self.settings.resource
        {
            return HttpResponse::oauth_error(400, "invalid_target", "resource names another server");
        }
        let Some(client_id) = params.get("client_id") else {
            return HttpResponse::oauth_error(401, "invalid_client", "client_id is required");
        };
        match params.get("grant_type").map(String::as_str) {
            Some("authorization_code") => self.redeem_code(&params, client_id),
            Some("refresh_token") => self.refresh(&params, client_id),
            Some(_) => HttpResponse::oauth_error(400, "unsupported_grant_type", "authorization_code or refresh_token"),
            None => HttpResponse::oauth_error(400, "invalid_request", "grant_type is required"),
        }
    }

    fn redeem_code(&self, params: &HashMap<String, String>, client_id: &str) -> HttpResponse {
        let (Some(code), Some(redirect_uri), Some(verifier)) =
            (params.get("code"), params.get("redirect_uri"), params.get("code_verifier"))
        else {
            return HttpResponse::oauth_error(
                400,
                "invalid_request",
                "code, redirect_uri and code_verifier are required",
            );
        };
        if !(43..=128).contains(&verifier.len()) || !verifier.bytes().all(is_unreserved) {
            return HttpResponse::oauth_error(400, "invalid_request", "code_verifier is malformed");
        }
        let now = self.now();
        let grant = {
            let mut guard = self.lock();
            let state = &mut *guard;
            let Some(entry) = state.codes.get_mut(&sha256(code)) else {
                return HttpResponse::oauth_error(400, "invalid_grant", "unknown code");
            };
            if let Some(family) = entry.redeemed_family {
                // A replayed code: whoever holds it may not be the client; revoke what it gave.
                state.revoked_families.insert(family);
                return HttpResponse::oauth_error(400, "invalid_grant", "code already used");
            }
            // From here the code is spent, whatever the outcome.
            let family = state.next_family;
            state.next_family += 1;
            entry.redeemed_family = Some(family);
            if entry.expires <= now {
                return HttpResponse::oauth_error(400, "invalid_grant", "code expired");
            }
            if entry.grant.client_id != client_id {
                return HttpResponse::oauth_error(400, "invalid_grant", "code was issued to another client");
            }
            if entry.redirect_uri != *redirect_uri {
                return HttpResponse::oauth_error(
                    400,
                    "invalid_grant",
                    "redirect_uri differs from the authorization request",
                );
            }
            let computed = URL_SAFE_NO_PAD.encode(digest(&SHA256, verifier.as_bytes()));
            let matches: bool = computed.as_bytes().ct_eq(entry.code_challenge.as_bytes()).into();
            if !matches {
                return HttpResponse::oauth_error(400, "invalid_grant", "code_verifier does not match the challenge");
            }
            (entry.grant.clone(), family)
        };
        self.tokens(grant.0, grant.1, "grant=authorization_code")
    }

    fn refresh(&self, params: &HashMap<String, String>, client_id: &str) -> HttpResponse {
        let Some(token) = params.get("refresh_token") else {
            return HttpResponse::oauth_error(400, "invalid_request", "refresh_token is required");
        };
        let now = self.now();
        let (grant, family) = {
            let mut guard = self.lock();
            let state = &mut *guard;
            let Some(entry) = state.refresh.get_mut(&sha256(token)) else {
                return HttpResponse::oauth_error(400, "invalid_grant", "unknown refresh token");
            };
            if entry.used {
                let family = entry.family;
                state.revoked_families.insert(family);
                return HttpResponse::oauth_error(400, "invalid_grant", "refresh token already used");
            }
            if entry.grant.client_id != client_id {
                return HttpResponse::oauth_error(400, "invalid_grant", "refresh token was issued to another client");
            }
            if entry.expires <= now {
                return HttpResponse::oauth_error(400, "invalid_grant", "refresh token expired");
            }
            entry.used = true;
            let (mut grant, family) = (entry.grant.clone(), entry.family);
            if state.revoked_families.contains(&family) {
                return HttpResponse::oauth_error(400, "invalid_grant", "refresh token revoked");
            }
            if let Some(scope) = params.get("scope") {
                let asked: Vec<String> = scope.split(' ').filter(|s| !s.is_empty()).map(str::to_owned).collect();
                if asked.iter().any(|s| !grant.scopes.contains(s)) {
                    return HttpResponse::oauth_error(400, "invalid_scope", "more scope than was granted");
                }
                grant.scopes = dedup(asked);
            }
            (grant, family)
        };
        self.tokens(grant, family, "grant=refresh_token")
    }

    /// An access token and a new refresh token of `family` for `grant`.
    fn tokens(&self, grant: Grant, family: u64, grant_detail: &'static str) -> HttpResponse {
        let scopes: Vec<&str> = grant.scopes.iter().map(String::as_str).collect();
        let ttl = self.settings.access_token_ttl_secs;
        let access = match self.issuer.mint(
            &grant.subject,
            &grant.tenant,
            &grant.client_id,
            &scopes,
            &self.settings.resource,
            ttl,
        ) {
            Ok(token) => token,
            Err(_) => return HttpResponse::oauth_error(500, "server_error", "signing failed"),
        };
        let refresh = self.random_token();
        if refresh.is_empty() {
            return HttpResponse::oauth_error(500, "server_error", "no randomness available");
        }
        let now = self.now();
        {
            let mut state = self.lock();
            state.refresh.retain(|_, r| r.expires > now);
            evict_oldest(&mut state.refresh, MAX_REFRESH_TOKENS, |r| r.expires);
            state.refresh.insert(
                sha256(&refresh),
                Refresh {
                    grant: grant.clone(),
                    family,
                    expires: now + self.settings.refresh_token_ttl_secs,
                    used: false,
                },
            );
            if let Some(client) = state.clients.get_mut(&grant.client_id) {
                client.tokens_until = client.tokens_until.max(now + ttl);
            }
        }
        let event = grant_event("issued", &grant, Some(grant_detail));
        HttpResponse::json(
            200,
            &json!({
                "access_token": access,
                "token_type": "Bearer",
                "expires_in": ttl,
                "refresh_token": refresh,
                "scope": grant.scopes.join(" "),
            }),
        )
        .granting(event)
    }
}

#[cfg(test)]
mod tests;
