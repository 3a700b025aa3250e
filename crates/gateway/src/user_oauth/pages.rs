//! The person's side of a `user_oauth` connection, on the gateway's web surface
//! ([`crate::web`]): the connect page a URL-mode elicitation points to, sign-in through the
//! gateway's identity provider, Palisade's own consent page, the callback of the upstream's
//! authorization server, and Palisade's Client ID Metadata Document.
//!
//! ```text
//! GET  /connect/{id}       the elicitation's link: sign in (if needed), then the consent page
//! GET  /signin/callback    back from the identity provider: must be the person who asked (else 403)
//! POST /connect/{id}       consent: CSRF token, exact redirect_uri; approve → the third party
//! GET  /oauth/callback     back from the third party: one-time `state`, RFC 9207 `iss`, tokens stored
//! GET  /oauth/client.json  Palisade's Client ID Metadata Document
//! ```
//!
//! What each step refuses, and why:
//! - A connect link, a sign-in `state` and an authorization `state` are each one-time rows of the
//!   store, keyed by the SHA-256 of a 256-bit random id, expiring after the flow lifetime (10
//!   minutes by default). The authorization `state` is stored only after consent.
//! - The identity provider's `sub` and issuer must be the caller's who asked to connect (the
//!   MCP spec's phishing rule): another person gets 403 and nothing is connected. The sign-in is
//!   bound to the browser that started it (a `__Host-` cookie, login CSRF).
//! - The consent page names the MCP client (its client id, as the caller's token says, and its
//!   name from its metadata document when the id is one), the upstream, the scopes and the
//!   redirect URI. Its form carries a CSRF token bound to the browser session and the link, and
//!   the redirect URI, compared to the registered one as an exact string. Approval is recorded
//!   per person, upstream and client id (approved once, revocable); the page is skipped only
//!   when that record exists *and* the browser holds a consent cookie bound to the same client
//!   id and person.
//! - Every page is unframeable and every POST same-origin ([`crate::web::surface`]).
//! - The browser is only ever sent to an authorization URL built here from checked metadata
//!   (https, or loopback http under the development flag).
//! - Every refusal (`<step>/<reason>`: `connect/link_unknown`, `consent/csrf`,
//!   `consent/redirect_uri`, `signin/another_person`, `callback/state_unknown`,
//!   `callback/issuer_mismatch`, …) and every grant (`signin/signed_in`, `consent/approved`,
//!   `consent/remembered`, `callback/connected`) is on the audit record
//!   ([`crate::web::WebAudit`]); a grant that cannot be recorded is not made.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_base::hex::hex;
use palisade_store::StoreError;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::discovery::{self, AuthorizationServer};
use super::token::{self, ClientIdentity, Grant};
use super::{CONNECT, ConnectFlow, OAuthError, Person, UserOAuth, id_digest, pkce_challenge, random_id};
use crate::web::{Form, Page, SeeOther, WebAudit, error_page, escape, host_cookie, read_cookie};

/// The store's flow kind of a sign-in at the identity provider.
const SIGN_IN: &str = "signin";
/// The store's flow kind of an authorization request at the upstream's server.
const AUTHORIZE: &str = "authorize";
/// The browser session after sign-in (signed: issuer, subject, expiry).
const SESSION_COOKIE: &str = "palisade_session";
/// Binds a sign-in to the browser that started it.
const SIGN_IN_COOKIE: &str = "palisade_signin";
/// The consent cookie, bound to the approved client id and the person.
const CONSENT_COOKIE: &str = "palisade_consent";
/// How long a browser session lasts.
const SESSION_TTL_SECS: u64 = 3600;
/// How long the consent cookie lasts.
const CONSENT_COOKIE_TTL_SECS: u64 = 30 * 24 * 3600;
/// The key the identity provider's metadata is cached under (no upstream id has a NUL).
const SIGN_IN_CACHE_KEY: &str = "\u{0}sign-in";

/// A sign-in's row: the link it continues, its PKCE verifier and nonce, and the digest of the
/// browser cookie it is bound to.
#[derive(Serialize, Deserialize)]
struct SignInFlow {
    connect: String,
    verifier: String,
    nonce: String,
    browser: String,
}

/// An authorization request's row, stored after consent: everything the callback checks.
#[derive(Serialize, Deserialize)]
pub(super) struct AuthorizeFlow {
    pub(super) person: Person,
    pub(super) upstream: String,
    /// The issuer the request was sent to (RFC 9207: the response's `iss` must be this).
    pub(super) issuer: String,
    /// Palisade's client id there.
    pub(super) client_id: String,
    pub(super) redirect_uri: String,
    pub(super) verifier: String,
    pub(super) scopes: Vec<String>,
}

/// The query of a redirect back to Palisade. A parameter given twice counts as absent.
#[derive(Debug, Default)]
struct Callback {
    code: Option<String>,
    state: Option<String>,
    iss: Option<String>,
    error: Option<String>,
}

impl Callback {
    fn of(uri: &Uri) -> Self {
        let pairs: Vec<(String, String)> =
            url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect();
        let one = |name: &str| {
            let mut values = pairs.iter().filter(|(key, _)| key == name).map(|(_, value)| value.clone());
            match (values.next(), values.next()) {
                (Some(value), None) => Some(value),
                _ => None,
            }
        };
        Self { code: one("code"), state: one("state"), iss: one("iss"), error: one("error") }
    }
}

/// Who the browser signed in as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SignedIn {
    issuer: String,
    subject: String,
    /// Unix seconds.
    expires: i64,
}

/// The routes of the connect flow, to be served inside [`crate::web::surface`].
pub fn routes(oauth: Arc<UserOAuth>) -> Router {
    Router::new()
        .route("/connect/{id}", get(connect_page).post(connect_decision))
        .route("/signin/callback", get(sign_in_callback))
        .route("/oauth/callback", get(oauth_callback))
        .route("/oauth/client.json", get(client_metadata))
        .with_state(oauth)
}

fn refused(status: StatusCode, message: &str) -> Response {
    error_page(status, message)
}

const LINK_GONE: &str = "This connect link is not valid: it was used already, it expired (links last 10 minutes), or it never existed. \
     Start again from your MCP client.";

impl UserOAuth {
    fn now_secs(&self) -> i64 {
        self.now_ms() / 1000
    }

    /// The browser's signed-in person, if its session cookie is ours and current.
    fn session(&self, headers: &HeaderMap) -> Option<(SignedIn, String)> {
        let value = read_cookie(headers, SESSION_COOKIE)?;
        let payload = self.keys.verify("session", &value)?;
        let signed: SignedIn = serde_json::from_slice(&payload).ok()?;
        (signed.expires > self.now_secs()).then_some((signed, value))
    }

    /// A consent cookie for `client_id` and `person`.
    fn consent_cookie(&self, person: &Person, client_id: &str) -> Option<axum::http::HeaderValue> {
        let expires = self.now_secs() + i64::try_from(CONSENT_COOKIE_TTL_SECS).unwrap_or(0);
        let key = hex(&self.person_key(person));
        let payload = json!({ "client": client_id, "person": key, "expires": expires }).to_string();
        host_cookie(CONSENT_COOKIE, &self.keys.sign("consent", payload.as_bytes()), CONSENT_COOKIE_TTL_SECS).ok()
    }

    /// Whether the browser's consent cookie was set for exactly `client_id` and `person`.
    fn consent_cookie_matches(&self, headers: &HeaderMap, person: &Person, client_id: &str) -> bool {
        let Some(value) = read_cookie(headers, CONSENT_COOKIE) else { return false };
        let Some(payload) = self.keys.verify("consent", &value) else { return false };
        let Ok(cookie) = serde_json::from_slice::<Value>(&payload) else { return false };
        cookie["client"].as_str() == Some(client_id)
            && cookie["person"].as_str() == Some(hex(&self.person_key(person)).as_str())
            && cookie["expires"].as_i64().is_some_and(|expires| expires > self.now_secs())
    }

    /// The identity provider's metadata (cached like an upstream's).
    async fn sign_in_server(&self) -> Result<AuthorizationServer, OAuthError> {
        let now = self.now_ms();
        if let Some(found) = super::lock(&self.discovered).get(SIGN_IN_CACHE_KEY)
            && now.saturating_sub(found.fetched_ms) < super::DISCOVERY_TTL_MS
        {
            return Ok(found.server.clone());
        }
        let server = discovery::authorization_server(
            &self.guard,
            &self.settings.sign_in.issuer,
            self.settings.egress.allow_loopback,
        )
        .await?;
        let found = Arc::new(super::Discovered { server: server.clone(), fetched_ms: now });
        super::lock(&self.discovered).insert(SIGN_IN_CACHE_KEY.to_owned(), found);
        Ok(server)
    }

    fn sign_in_client(&self) -> ClientIdentity {
        ClientIdentity {
            client_id: self.settings.sign_in.client_id.clone(),
            client_secret: self.sign_in_secret.as_ref().map(|secret| secret.expose().to_owned()),
            auth_method: if self.sign_in_secret.is_some() { "client_secret_basic".into() } else { "none".into() },
        }
    }

    /// Sends the browser to the identity provider to sign in, bound to this browser.
    async fn start_sign_in(&self, connect_id: &str) -> Result<Response, OAuthError> {
        let server = self.sign_in_server().await?;
        let (verifier, nonce, state, browser) = (random_id()?, random_id()?, random_id()?, random_id()?);
        let flow = SignInFlow {
            connect: connect_id.to_owned(),
            verifier: verifier.clone(),
            nonce: nonce.clone(),
            browser: hex(&id_digest(&browser)),
        };
        let body = serde_json::to_string(&flow).map_err(|_| OAuthError::Refused("flow not serializable"))?;
        self.store.put_flow(id_digest(&state), SIGN_IN, &body, self.now_ms() + self.flow_ttl_ms()).await?;
        let mut url = server.authorization_endpoint.clone();
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.settings.sign_in.client_id)
            .append_pair("redirect_uri", &self.url("signin/callback"))
            .append_pair("scope", "openid")
            .append_pair("state", &state)
            .append_pair("nonce", &nonce)
            .append_pair("code_challenge", &pkce_challenge(&verifier))
            .append_pair("code_challenge_method", "S256");
        let cookie = host_cookie(SIGN_IN_COOKIE, &browser, self.settings.flow_ttl_secs)
            .map_err(|_| OAuthError::Refused("the sign-in cookie could not be made"))?;
        Ok(SeeOther::to(url.to_string()).cookie(cookie).into_response())
    }

    /// The consent page for `flow` (link `id`), under the browser session `session`.
    async fn consent_page(&self, audit: &WebAudit, id: &str, flow: &ConnectFlow, session: &str) -> Response {
        let Some(config) = self.upstreams.get(&flow.upstream) else {
            return audit.refused("connect", "link_unknown", StatusCode::BAD_REQUEST, LINK_GONE);
        };
        // The browser is sent to this server's authorization endpoint after approval: the form
        // may be redirected there (CSP form-action), and nowhere else.
        let discovered = match self.discover(config, false).await {
            Ok(discovered) => discovered,
            Err(error) => return failure(audit, "connect", &error),
        };
        let client_name = self.client_name(&flow.client_id).await;
        let csrf = self.keys.csrf().token(&[session, "connect", id]);
        let scopes: String =
            flow.scopes.iter().map(|scope| format!("<li><code>{}</code></li>", escape(scope))).collect();
        let client_id = if flow.client_id.is_empty() { "(none stated)".to_owned() } else { flow.client_id.clone() };
        let html = format!(
            "<h1>Connect {upstream}?</h1>\
             <p>An MCP client asks to use the upstream <strong id=\"upstream\">{upstream}</strong> as <strong>{who}</strong>.\
             If you approve, you will be sent to that upstream's own authorization server to sign in there; \
             the gateway keeps the resulting token for you (encrypted) and uses it only for this upstream.</p>\
             <dl><dt>MCP client</dt><dd id=\"client-id\">{client_id}</dd>\
             <dt>Client name</dt><dd id=\"client-name\">{client_name}</dd>\
             <dt>Upstream</dt><dd>{upstream} (<code>{resource}</code>)</dd>\
             <dt>Its authorization server</dt><dd id=\"issuer\"><code>{issuer}</code></dd>\
             <dt>Scopes at the upstream</dt><dd><ul id=\"scopes\">{scopes}</ul></dd>\
             <dt>Redirect URI</dt><dd id=\"redirect-uri\"><code>{redirect}</code></dd></dl>\
             <form method=\"post\" action=\"/connect/{id}\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <input type=\"hidden\" name=\"redirect_uri\" value=\"{redirect}\">\
             <button type=\"submit\" name=\"decision\" value=\"approve\">Approve</button> \
             <button type=\"submit\" name=\"decision\" value=\"deny\">Deny</button></form>",
            upstream = escape(&flow.upstream),
            who = escape(&flow.person.subject),
            client_id = escape(&client_id),
            client_name = escape(client_name.as_deref().unwrap_or("(not stated)")),
            resource = escape(config.resource.as_str()),
            issuer = escape(&discovered.server.issuer),
            redirect = escape(&self.redirect_uri()),
            id = escape(id),
        );
        Page::new(StatusCode::OK, &format!("Connect {}", flow.upstream), html)
            .form_action(&discovered.server.authorization_endpoint)
            .into_response()
    }

    /// The MCP client's name from its Client ID Metadata Document, when its id is an https URL
    /// (fetched through the guard; a document whose `client_id` is not that URL says nothing). A
    /// refusal is logged with the id's digest and the reason, never the URL.
    async fn client_name(&self, client_id: &str) -> Option<String> {
        discovery::client_name(&self.guard, client_id).await
    }

    /// After consent: consumes the link, stores the authorization `state` and sends the browser
    /// to the upstream's authorization endpoint (with the consent cookie).
    async fn start_authorize(&self, id: &str, flow: &ConnectFlow) -> Result<Response, OAuthError> {
        let config = self.upstreams.get(&flow.upstream).ok_or(OAuthError::Refused(LINK_GONE))?;
        let discovered = self.discover(config, false).await?;
        let server = &discovered.server;
        let client = self.client_identity(server).await?;
        // The link is spent here, once: a second approval of the same link finds nothing.
        if self.store.take_flow(id_digest(id), CONNECT, self.now_ms()).await?.is_none() {
            return Err(OAuthError::Refused(LINK_GONE));
        }
        let (verifier, state) = (random_id()?, random_id()?);
        let redirect_uri = self.redirect_uri();
        let authorize = AuthorizeFlow {
            person: flow.person.clone(),
            upstream: flow.upstream.clone(),
            issuer: server.issuer.clone(),
            client_id: client.client_id.clone(),
            redirect_uri: redirect_uri.clone(),
            verifier: verifier.clone(),
            scopes: flow.scopes.clone(),
        };
        let body = serde_json::to_string(&authorize).map_err(|_| OAuthError::Refused("flow not serializable"))?;
        self.store.put_flow(id_digest(&state), AUTHORIZE, &body, self.now_ms() + self.flow_ttl_ms()).await?;
        let mut url = server.authorization_endpoint.clone();
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("response_type", "code")
                .append_pair("client_id", &client.client_id)
                .append_pair("redirect_uri", &redirect_uri)
                .append_pair("state", &state)
                .append_pair("code_challenge", &pkce_challenge(&verifier))
                .append_pair("code_challenge_method", "S256")
                .append_pair("resource", config.resource.as_str());
            if !flow.scopes.is_empty() {
                query.append_pair("scope", &flow.scopes.join(" "));
            }
        }
        discovery::check_browser_url(&url, self.settings.egress.allow_loopback)
            .map_err(|_| OAuthError::Refused("the authorization URL is not one a browser may be sent to"))?;
        let mut redirect = SeeOther::to(url.to_string());
        if let Some(cookie) = self.consent_cookie(&flow.person, &flow.client_id) {
            redirect = redirect.cookie(cookie);
        }
        tracing::info!(upstream = %flow.upstream, issuer = %server.issuer, "user_oauth: consent given; sent to the authorization server");
        Ok(redirect.into_response())
    }
}

/// Whether the signed-in browser is the person of the flow (issuer and subject).
fn is_person(signed: &SignedIn, person: &Person) -> bool {
    signed.issuer == person.issuer && signed.subject == person.subject
}

const ANOTHER_PERSON: &str = "You are signed in as a different person than the one whose MCP client asked to connect. \
     Nothing was connected. Only the person who made the request can complete it.";

/// The refusal page of a failed step at `step`, on the audit record (`issuer_mismatch` for an
/// RFC 9207 mix-up, `unavailable`, `refused`, `failed`).
fn failure(audit: &WebAudit, step: &'static str, error: &OAuthError) -> Response {
    tracing::warn!(%error, "user_oauth: a connect step failed");
    match error {
        OAuthError::Refused(message) => audit.refused(step, "refused", StatusCode::BAD_REQUEST, message),
        OAuthError::Store(_) | OAuthError::Unreachable(_) => audit.refused(
            step,
            "unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway could not complete this step; nothing was connected",
        ),
        other => {
            let reason = if matches!(other, OAuthError::IssuerMismatch) { "issuer_mismatch" } else { "failed" };
            audit.refused(step, reason, StatusCode::BAD_GATEWAY, &format!("nothing was connected: {other}"))
        }
    }
}

/// The connect link `id` (not taken: it answers until the flow completes), or the page
/// refusing it (gone, expired or never issued: 400; the store failed: 503), recorded at `step`.
async fn connect_flow(
    oauth: &UserOAuth,
    audit: &WebAudit,
    step: &'static str,
    id: &str,
) -> Result<ConnectFlow, Response> {
    let gone = || audit.refused(step, "link_unknown", StatusCode::BAD_REQUEST, LINK_GONE);
    match oauth.store.flow(id_digest(id), CONNECT, oauth.now_ms()).await {
        Ok(Some(body)) => serde_json::from_str(&body).map_err(|_| gone()),
        Ok(None) => Err(gone()),
        Err(_) => Err(audit.refused(
            step,
            "unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway could not read this link; try again",
        )),
    }
}

/// The person as the audit record's principal (issuer, subject).
fn person_of(person: &Person) -> Option<(&str, &str)> {
    Some((person.issuer.as_str(), person.subject.as_str()))
}

/// `upstream=<id>` (an operator's configuration id) for a record's detail.
fn upstream_detail(upstream: &str) -> Option<String> {
    Some(format!("upstream={upstream}"))
}

/// Takes the one-time flow `state` of `kind` (it answers once), parsed; `Ok(None)` when it is
/// unknown, used or expired (or unreadable), `Err` when the store failed.
async fn take_flow<T: serde::de::DeserializeOwned>(
    oauth: &UserOAuth,
    state: &str,
    kind: &str,
) -> Result<Option<T>, StoreError> {
    Ok(oauth
        .store
        .take_flow(id_digest(state), kind, oauth.now_ms())
        .await?
        .and_then(|body| serde_json::from_str(&body).ok()))
}

async fn connect_page(
    State(oauth): State<Arc<UserOAuth>>,
    audit: WebAudit,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let flow = match connect_flow(&oauth, &audit, "connect", &id).await {
        Ok(flow) => flow,
        Err(refusal) => return refusal,
    };
    let Some((signed, session)) = oauth.session(&headers).filter(|(signed, _)| signed.issuer == flow.person.issuer)
    else {
        return oauth.start_sign_in(&id).await.unwrap_or_else(|error| failure(&audit, "connect", &error));
    };
    if !is_person(&signed, &flow.person) {
        tracing::warn!(upstream = %flow.upstream, "user_oauth: a connect link was opened by another person; refused");
        return audit.refused("connect", "another_person", StatusCode::FORBIDDEN, ANOTHER_PERSON);
    }
    let approved = oauth
        .store
        .client_approved(oauth.person_key(&flow.person), &flow.upstream, &flow.client_id)
        .await
        .unwrap_or(false);
    if approved && oauth.consent_cookie_matches(&headers, &flow.person, &flow.client_id) {
        let client = Some(flow.client_id.as_str());
        if let Err(unrecorded) =
            audit.grant("consent", "remembered", person_of(&flow.person), client, upstream_detail(&flow.upstream)).await
        {
            return unrecorded;
        }
        return oauth.start_authorize(&id, &flow).await.unwrap_or_else(|error| failure(&audit, "consent", &error));
    }
    oauth.consent_page(&audit, &id, &flow, &session).await
}

async fn connect_decision(
    State(oauth): State<Arc<UserOAuth>>,
    audit: WebAudit,
    Path(id): Path<String>,
    headers: HeaderMap,
    form: Form,
) -> Response {
    let Some((signed, session)) = oauth.session(&headers) else {
        return audit.refused(
            "consent",
            "no_session",
            StatusCode::FORBIDDEN,
            "sign in first: open the connect link again",
        );
    };
    let valid_csrf = form.one("csrf").is_some_and(|token| oauth.keys.csrf().check(&[&session, "connect", &id], token));
    if !valid_csrf {
        return audit.refused(
            "consent",
            "csrf",
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or wrong; nothing was done",
        );
    }
    let flow = match connect_flow(&oauth, &audit, "consent", &id).await {
        Ok(flow) => flow,
        Err(refusal) => return refusal,
    };
    if !is_person(&signed, &flow.person) {
        return audit.refused("consent", "another_person", StatusCode::FORBIDDEN, ANOTHER_PERSON);
    }
    match form.one("decision") {
        Some("deny") => {
            // The person's own refusal: counted like every refusal.
            audit.refuse("consent", "denied", StatusCode::OK);
            let _ = oauth.store.take_flow(id_digest(&id), CONNECT, oauth.now_ms()).await;
            return Page::new(
                StatusCode::OK,
                "Not connected",
                format!("<h1>Not connected</h1><p id=\"denied\">{} was not connected.</p>", escape(&flow.upstream)),
            )
            .into_response();
        }
        Some("approve") => {}
        _ => return audit.refused("consent", "no_decision", StatusCode::BAD_REQUEST, "the form has no decision"),
    }
    // Exact string comparison: no normalization of case, slashes or encoding.
    if form.one("redirect_uri") != Some(oauth.redirect_uri().as_str()) {
        return audit.refused(
            "consent",
            "redirect_uri",
            StatusCode::BAD_REQUEST,
            "the redirect URI is not the registered one; nothing was done",
        );
    }
    // On the record before the approval is stored.
    let client = Some(flow.client_id.as_str());
    if let Err(unrecorded) =
        audit.grant("consent", "approved", person_of(&flow.person), client, upstream_detail(&flow.upstream)).await
    {
        return unrecorded;
    }
    let key = oauth.person_key(&flow.person);
    if let Err(error) = oauth.store.approve_client(key, &flow.upstream, &flow.client_id, oauth.now_ms()).await {
        return failure(&audit, "consent", &OAuthError::from(error));
    }
    oauth.start_authorize(&id, &flow).await.unwrap_or_else(|error| failure(&audit, "consent", &error))
}

async fn sign_in_callback(
    State(oauth): State<Arc<UserOAuth>>,
    audit: WebAudit,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let callback = Callback::of(&uri);
    let Some(state) = callback.state.as_deref() else {
        return audit.refused("signin", "state_missing", StatusCode::BAD_REQUEST, "the sign-in answer has no state");
    };
    let Ok(flow) = take_flow::<SignInFlow>(&oauth, state, SIGN_IN).await else {
        return audit.refused(
            "signin",
            "unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway could not read this sign-in; try again",
        );
    };
    let Some(flow) = flow else {
        return audit.refused(
            "signin",
            "state_unknown",
            StatusCode::BAD_REQUEST,
            "this sign-in is unknown, was completed already, or expired",
        );
    };
    let browser = read_cookie(&headers, SIGN_IN_COOKIE).map(|cookie| hex(&id_digest(&cookie)));
    if browser.as_deref() != Some(flow.browser.as_str()) {
        return audit.refused(
            "signin",
            "another_browser",
            StatusCode::FORBIDDEN,
            "this sign-in was started in another browser; nothing was done",
        );
    }
    if callback.error.is_some() {
        return audit.refused(
            "signin",
            "provider_error",
            StatusCode::BAD_REQUEST,
            "the sign-in was not completed at the identity provider",
        );
    }
    let Some(code) = callback.code.as_deref() else {
        return audit.refused("signin", "code_missing", StatusCode::BAD_REQUEST, "the sign-in answer has no code");
    };
    let signed = match oauth.finish_sign_in(code, callback.iss.as_deref(), &flow).await {
        Ok(signed) => signed,
        Err(error) => return failure(&audit, "signin", &error),
    };
    let connect = match connect_flow(&oauth, &audit, "signin", &flow.connect).await {
        Ok(flow) => flow,
        Err(refusal) => return refusal,
    };
    if !is_person(&signed, &connect.person) {
        tracing::warn!(upstream = %connect.upstream, "user_oauth: another person signed in for a connect link; refused");
        return audit.refused("signin", "another_person", StatusCode::FORBIDDEN, ANOTHER_PERSON);
    }
    let payload = serde_json::to_vec(&signed).unwrap_or_default();
    let session = host_cookie(SESSION_COOKIE, &oauth.keys.sign("session", &payload), SESSION_TTL_SECS);
    let clear = crate::web::clear_host_cookie(SIGN_IN_COOKIE);
    match (session, clear) {
        (Ok(session), Ok(clear)) => {
            let person = Some((signed.issuer.as_str(), signed.subject.as_str()));
            if let Err(unrecorded) =
                audit.grant("signin", "signed_in", person, None, upstream_detail(&connect.upstream)).await
            {
                return unrecorded;
            }
            SeeOther::to(format!("/connect/{}", flow.connect)).cookie(session).cookie(clear).into_response()
        }
        _ => refused(StatusCode::INTERNAL_SERVER_ERROR, "the session cookie could not be made"),
    }
}

impl UserOAuth {
    /// Redeems the identity provider's code and checks its ID token: issuer, audience, expiry
    /// and nonce. Its signature is not checked: it came straight from the identity provider's
    /// token endpoint over the guarded TLS connection Palisade opened (OpenID Connect Core
    /// §3.1.3.7 allows TLS server validation in place of the signature there).
    async fn finish_sign_in(&self, code: &str, iss: Option<&str>, flow: &SignInFlow) -> Result<SignedIn, OAuthError> {
        let server = self.sign_in_server().await?;
        check_iss(iss, &server.issuer, server.iss_parameter)?;
        let redirect_uri = self.url("signin/callback");
        let grant = Grant::Code { code, redirect_uri: &redirect_uri, verifier: &flow.verifier };
        let body =
            token::token_request(&self.guard, &server.token_endpoint, &self.sign_in_client(), grant, None).await?;
        let response: Value =
            serde_json::from_slice(&body).map_err(|_| OAuthError::Token("the sign-in token response is malformed"))?;
        let id_token = response.get("id_token").and_then(Value::as_str).ok_or(OAuthError::Token("no ID token"))?;
        let payload = id_token.split('.').nth(1).ok_or(OAuthError::Token("the ID token is not a JWT"))?;
        let claims: Value = URL_SAFE_NO_PAD
            .decode(payload)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or(OAuthError::Token("the ID token is not a JWT"))?;
        let client_id = self.settings.sign_in.client_id.as_str();
        let audience_ok = match claims.get("aud") {
            Some(Value::String(one)) => one == client_id,
            Some(Value::Array(many)) => many.iter().any(|aud| aud.as_str() == Some(client_id)),
            _ => false,
        };
        if claims.get("iss").and_then(Value::as_str) != Some(server.issuer.as_str()) {
            return Err(OAuthError::Token("the ID token is from another issuer"));
        }
        if !audience_ok {
            return Err(OAuthError::Token("the ID token is for another client"));
        }
        if claims.get("nonce").and_then(Value::as_str) != Some(flow.nonce.as_str()) {
            return Err(OAuthError::Token("the ID token's nonce is not this sign-in's"));
        }
        let now = self.now_secs();
        if claims.get("exp").and_then(Value::as_i64).is_none_or(|exp| exp <= now) {
            return Err(OAuthError::Token("the ID token has expired"));
        }
        let subject = claims.get("sub").and_then(Value::as_str).filter(|sub| !sub.is_empty());
        let subject = subject.ok_or(OAuthError::Token("the ID token has no subject"))?;
        Ok(SignedIn {
            issuer: server.issuer.clone(),
            subject: subject.to_owned(),
            expires: now + i64::try_from(SESSION_TTL_SECS).unwrap_or(0),
        })
    }
}

/// RFC 9207: an `iss` in the response must be the issuer the request went to; a server that
/// says it sends `iss` must have sent it.
fn check_iss(iss: Option<&str>, expected: &str, required: bool) -> Result<(), OAuthError> {
    match iss {
        Some(iss) if iss == expected => Ok(()),
        Some(_) => Err(OAuthError::IssuerMismatch),
        None if required => Err(OAuthError::IssuerMismatch),
        None => Ok(()),
    }
}

async fn oauth_callback(
    State(oauth): State<Arc<UserOAuth>>,
    audit: WebAudit,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let callback = Callback::of(&uri);
    let Some(state) = callback.state.as_deref() else {
        return audit.refused(
            "callback",
            "state_missing",
            StatusCode::BAD_REQUEST,
            "the authorization answer has no state",
        );
    };
    let Ok(flow) = take_flow::<AuthorizeFlow>(&oauth, state, AUTHORIZE).await else {
        return audit.refused(
            "callback",
            "unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway could not read this answer; try again",
        );
    };
    let Some(flow) = flow else {
        // Unknown, expired, or replayed: the state is taken once.
        return audit.refused(
            "callback",
            "state_unknown",
            StatusCode::BAD_REQUEST,
            "this authorization answer's state is unknown, was used already, or expired; nothing was connected",
        );
    };
    if !oauth.session(&headers).is_some_and(|(signed, _)| is_person(&signed, &flow.person)) {
        return audit.refused("callback", "another_person", StatusCode::FORBIDDEN, ANOTHER_PERSON);
    }
    if callback.error.is_some() {
        return audit.refused(
            "callback",
            "server_error",
            StatusCode::BAD_REQUEST,
            "the upstream's authorization server did not authorize; nothing was connected",
        );
    }
    let Some(code) = callback.code.as_deref() else {
        return audit.refused(
            "callback",
            "code_missing",
            StatusCode::BAD_REQUEST,
            "the authorization answer has no code",
        );
    };
    let connected = oauth.finish_authorize(code, callback.iss.as_deref(), &flow).await;
    if connected.is_ok() {
        let person = person_of(&flow.person);
        if let Err(unrecorded) =
            audit.grant("callback", "connected", person, None, upstream_detail(&flow.upstream)).await
        {
            // Not on the record: not connected either.
            let _ = oauth.store.delete_connection(oauth.person_key(&flow.person), &flow.upstream).await;
            return unrecorded;
        }
    }
    match connected {
        Ok(()) => Page::new(
            StatusCode::OK,
            "Connected",
            format!(
                "<h1>Connected</h1><p id=\"connected\">{} is connected. You can return to your MCP client and continue.</p>",
                escape(&flow.upstream)
            ),
        )
        .into_response(),
        Err(error) => failure(&audit, "callback", &error),
    }
}

impl UserOAuth {
    /// Checks the response's issuer against the one recorded with the verifier, redeems the code
    /// with the verifier and `resource`, and stores the tokens.
    pub(super) async fn finish_authorize(
        &self,
        code: &str,
        iss: Option<&str>,
        flow: &AuthorizeFlow,
    ) -> Result<(), OAuthError> {
        let config = self.upstreams.get(&flow.upstream).ok_or(OAuthError::Refused(LINK_GONE))?;
        let discovered = self.discover(config, false).await?;
        let server = &discovered.server;
        if server.issuer != flow.issuer {
            return Err(OAuthError::IssuerMismatch);
        }
        // Compared with the issuer recorded next to the verifier, whatever discovery says now.
        check_iss(iss, &flow.issuer, server.iss_parameter)?;
        let client = self.client_identity(server).await?;
        if client.client_id != flow.client_id {
            return Err(OAuthError::Refused("Palisade's registration changed during the flow; start again"));
        }
        let grant = Grant::Code { code, redirect_uri: &flow.redirect_uri, verifier: &flow.verifier };
        let tokens = token::request_tokens(
            &self.guard,
            &server.token_endpoint,
            &client,
            grant,
            config.resource.as_str(),
            self.now_ms(),
        )
        .await?;
        self.store_tokens(&flow.person, &flow.upstream, server, &client.client_id, &tokens).await?;
        tracing::info!(upstream = %flow.upstream, "user_oauth: connected");
        Ok(())
    }
}

async fn client_metadata(State(oauth): State<Arc<UserOAuth>>) -> Response {
    let document = json!({
        "client_id": oauth.client_metadata_url(),
        "client_name": oauth.settings.client_name,
        "redirect_uris": [oauth.redirect_uri()],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    });
    (StatusCode::OK, [(axum::http::header::CONTENT_TYPE, "application/json")], document.to_string()).into_response()
}

#[cfg(test)]
#[path = "pages_tests.rs"]
mod tests;
