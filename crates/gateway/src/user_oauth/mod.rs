//! Per-user upstream credentials (`credential.kind = "user_oauth"`, controls C8 and C9): the
//! gateway as a careful OAuth client of each upstream's own authorization server, for each person
//! separately. The caller's token never travels upstream, and the third party's credentials never
//! pass through the MCP client: when a call needs a connection the person does not have, the
//! gateway answers with a URL-mode elicitation pointing to its own connect page ([`pages`]),
//! where the person signs in through the gateway's identity provider (and must be the person who
//! made the call), approves the MCP client on Palisade's consent page, and is sent to the third
//! party's authorization endpoint.
//!
//! - [`discovery`]: RFC 9728 → RFC 8414, every document through the egress guard.
//! - [`token`]: code exchange with PKCE and RFC 8707 `resource`, refresh with rotation, RFC 7591.
//! - [`vault`]: AES-256-GCM at rest, bound to the person and the upstream.
//!
//! **Invariant:** a stored token is only ever opened for the person and upstream it was sealed
//! for, and only sent to that upstream; every flow step (connect link, sign-in, authorization
//! `state`) is one-time, expires after the flow lifetime (10 minutes by default) and is bound to
//! the person who started it.

pub(crate) mod discovery;
pub mod pages;
pub(crate) mod token;
pub(crate) mod vault;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use aws_lc_rs::digest::{SHA256, digest};
use aws_lc_rs::hmac;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use palisade_auth::egress::{EgressError, EgressGuard, EgressPolicy};
use palisade_base::clock::Clock;
use palisade_server::auth::VerifiedPrincipal;
use palisade_server::events::{EventBus, ServerEvent};
use palisade_server::handles::PrincipalEvent;
use palisade_server::secret::{ServerSecret, fill_random};
use palisade_store::{ConnectionRow, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use url::Url;
use zeroize::Zeroizing;

use crate::secret::{CredentialError, Secret};
use crate::web::PageKeys;
pub use crate::web::settings::{DEFAULT_FLOW_TTL_SECS, SignInSettings};
use discovery::AuthorizationServer;
use token::{ClientIdentity, Grant, Tokens};
use vault::Vault;

/// An access token is used until this long before it expires, then refreshed.
const EXPIRY_SKEW_MS: i64 = 30_000;
/// How long discovered metadata is reused before it is fetched again.
const DISCOVERY_TTL_MS: i64 = 10 * 60 * 1000;
/// Most connections read for one principal event or one listing.
pub const MAX_CONNECTIONS_LISTED: u32 = 10_000;

/// How often expired flow rows are deleted.
const FLOW_PURGE_PERIOD: std::time::Duration = std::time::Duration::from_secs(300);

/// Why a step of the OAuth client failed. Messages name what was wrong and where (a URL without
/// its query), never a token, a code, a verifier or a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OAuthError {
    /// Discovery found nothing usable, or a document failed its checks.
    #[error("discovery: {0}")]
    Discovery(String),
    /// The egress guard refused a URL the server side supplied.
    #[error("refused to fetch {url}: {error}")]
    Egress {
        /// The URL, without query.
        url: String,
        /// The guard's verdict.
        error: EgressError,
    },
    /// A server could not be reached or did not answer in time.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// Registration at the authorization server failed.
    #[error("client registration: {0}")]
    Registration(&'static str),
    /// A token request failed or its response was refused.
    #[error("token: {0}")]
    Token(&'static str),
    /// The authorization server refused the grant (`invalid_grant`): the connection must be
    /// made again.
    #[error("the authorization server refused the grant")]
    GrantRefused,
    /// The authorization response's issuer is not the one the request was sent to (RFC 9207).
    #[error("the authorization response comes from another issuer (RFC 9207)")]
    IssuerMismatch,
    /// The store failed (fail closed).
    #[error("store: {0}")]
    Store(String),
    /// The request cannot be served (fixed text).
    #[error("{0}")]
    Refused(&'static str),
}

impl OAuthError {
    /// The error without the URL it may name, for a log line about an untrusted URL.
    fn without_url(&self) -> String {
        match self {
            Self::Egress { error, .. } => format!("refused by the egress guard ({error})"),
            Self::Unreachable(_) => "unreachable".into(),
            other => other.to_string(),
        }
    }
}

impl From<StoreError> for OAuthError {
    fn from(error: StoreError) -> Self {
        Self::Store(error.to_string())
    }
}

/// How the per-user OAuth client runs.
#[derive(Debug, Clone)]
pub struct UserOAuthSettings {
    /// The web surface's public base URL (https): connect links, redirect URIs and the Client ID
    /// Metadata Document are built under it.
    pub public_url: Url,
    /// The identity provider of the connect page.
    pub sign_in: SignInSettings,
    /// How every URL a server or document supplied is fetched.
    pub egress: EgressPolicy,
    /// Lifetime of every flow step, in seconds (at most 600).
    pub flow_ttl_secs: u64,
    /// The client name Palisade registers with and states in its metadata document.
    pub client_name: String,
}

/// One `user_oauth` upstream: its canonical resource URI and the scopes asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamOAuth {
    /// The upstream's id.
    pub id: String,
    /// Its canonical URI: RFC 8707 `resource` and the expected RFC 9728 `resource`.
    pub resource: Url,
    /// The scopes asked for at first (minimal).
    pub scopes: BTreeSet<String>,
    /// The most a step-up on `insufficient_scope` may ask for (includes `scopes`).
    pub max_scopes: BTreeSet<String>,
}

impl UpstreamOAuth {
    /// The scopes a connect link asks for: the configured first ones, plus those of an
    /// `insufficient_scope` answer (`extra`) that the configured maximum allows; the rest are
    /// dropped (never asked for).
    pub fn scopes_to_ask(&self, extra: Option<&[String]>) -> Vec<String> {
        let mut scopes = self.scopes.clone();
        scopes.extend(extra.unwrap_or_default().iter().filter(|scope| self.max_scopes.contains(*scope)).cloned());
        scopes.into_iter().collect()
    }
}

/// The person a connection belongs to: issuer, subject and tenant of the caller (the MCP client
/// is approved separately, per person, on the consent page).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    /// The token's issuer.
    pub issuer: String,
    /// The token's subject.
    pub subject: String,
    /// The tenant, when the token names one.
    pub tenant: Option<String>,
}

impl Person {
    /// The person behind a verified principal.
    pub fn of(principal: &VerifiedPrincipal) -> Self {
        Self {
            issuer: principal.issuer().to_owned(),
            subject: principal.subject().to_owned(),
            tenant: principal.tenant().map(str::to_owned),
        }
    }

    /// How operators see the person (`issuer subject [tenant]`).
    pub fn label(&self) -> String {
        serde_json::json!({ "issuer": self.issuer, "subject": self.subject, "tenant": self.tenant }).to_string()
    }
}

/// Who calls through a `user_oauth` upstream: the person, and the MCP client (the caller token's
/// client id) the person must have approved for that upstream on the consent page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserCaller {
    /// The person.
    pub person: Person,
    /// The MCP client's id ("" when the token names none).
    pub client_id: String,
}

impl UserCaller {
    /// The person and client behind a verified principal.
    pub fn of(principal: &VerifiedPrincipal) -> Self {
        Self { person: Person::of(principal), client_id: principal.client_id().unwrap_or("").to_owned() }
    }
}

/// One connection as `palisade connections list` shows it (no token).
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionView {
    /// The person (`{"issuer","subject","tenant"}`).
    pub person: serde_json::Value,
    /// The upstream id.
    pub upstream: String,
    /// The authorization server's issuer.
    pub issuer: String,
    /// Palisade's client id there.
    pub client_id: String,
    /// The granted scopes.
    pub scopes: String,
    /// Unix milliseconds.
    pub created_ms: i64,
    /// Unix milliseconds of the last refresh.
    pub updated_ms: i64,
}

/// The store's flow kind of a connect link.
pub(crate) const CONNECT: &str = "connect";

/// A connect link's row: who asked, through which MCP client, for which upstream and scopes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ConnectFlow {
    pub person: Person,
    pub client_id: String,
    pub upstream: String,
    pub scopes: Vec<String>,
}

/// What was discovered for one upstream.
#[derive(Debug, Clone)]
pub(crate) struct Discovered {
    pub server: AuthorizationServer,
    pub fetched_ms: i64,
}

/// The per-user OAuth client of the gateway. Cheap to share (`Arc`).
pub struct UserOAuth {
    settings: UserOAuthSettings,
    upstreams: HashMap<String, UpstreamOAuth>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    guard: EgressGuard,
    vault: Vault,
    person_key: hmac::Key,
    /// The pages' signed cookies and CSRF tokens.
    pub(crate) keys: PageKeys,
    sign_in_secret: Option<Secret>,
    discovered: Mutex<HashMap<String, Arc<Discovered>>>,
    /// `resource_metadata` URLs named by upstream 401 challenges, per upstream.
    hints: Mutex<HashMap<String, Hints>>,
    /// One refresh at a time per (person, upstream) on this instance; instances race through
    /// the store's compare-and-swap.
    refreshing: Mutex<HashMap<([u8; 32], String), Flight>>,
}

impl std::fmt::Debug for UserOAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserOAuth")
            .field("public_url", &self.settings.public_url.as_str())
            .field("upstreams", &self.upstreams.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The `resource_metadata` URLs an upstream's 401 challenges named. A new one is a candidate,
/// tried first at the next discovery; it is kept only once it produced valid metadata, and a
/// hint that is refused (guard, unreachable, missing, a document that fails its checks) is
/// dropped, discovery falling back to the next hint and then to the well-known locations.
#[derive(Debug, Default)]
struct Hints {
    /// Named by the latest challenge, not tried yet.
    candidate: Option<Url>,
    /// Produced valid metadata when it was last tried.
    kept: Option<Url>,
}

/// One refresh in flight for a (person, upstream): others wait on it, then re-read.
type Flight = Arc<tokio::sync::Mutex<()>>;

/// Why the per-user OAuth client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UserOAuthError {
    /// The settings cannot be used (fixed text).
    #[error("{0}")]
    Settings(&'static str),
    /// The sign-in client secret could not be read.
    #[error("{0}")]
    Secret(CredentialError),
    /// The egress guard could not be built.
    #[error("egress: {0}")]
    Egress(EgressError),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain map updates: a panic while holding the lock leaves consistent data.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// 32 random bytes, base64url: every id and `state` a flow hands out.
pub(crate) fn random_id() -> Result<String, OAuthError> {
    let mut bytes = [0u8; 32];
    fill_random(&mut bytes).map_err(|_| OAuthError::Refused("the random number generator failed"))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// SHA-256 of an id: the store keeps only digests of ids and states.
pub(crate) fn id_digest(id: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, id.as_bytes()).as_ref());
    out
}

/// The RFC 7636 S256 challenge of a verifier.
pub(crate) fn pkce_challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(digest(&SHA256, verifier.as_bytes()))
}

impl UserOAuth {
    /// Builds the client for `upstreams` (every `user_oauth` upstream of the gateway) with keys
    /// derived from the deployment's secret, so every instance opens what another sealed.
    pub fn new(
        settings: UserOAuthSettings,
        upstreams: Vec<UpstreamOAuth>,
        store: Arc<dyn Store>,
        secret: &ServerSecret,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, UserOAuthError> {
        if settings.public_url.scheme() != "https" {
            return Err(UserOAuthError::Settings("the web surface's public URL must be https"));
        }
        if settings.flow_ttl_secs == 0 || settings.flow_ttl_secs > DEFAULT_FLOW_TTL_SECS {
            return Err(UserOAuthError::Settings("the flow lifetime must be 1..=600 seconds"));
        }
        let sign_in_secret = match &settings.sign_in.client_secret {
            Some(source) => Some(source.read().map_err(UserOAuthError::Secret)?),
            None => None,
        };
        let guard = EgressGuard::new(settings.egress.clone()).map_err(UserOAuthError::Egress)?;
        Ok(Arc::new(Self {
            upstreams: upstreams.into_iter().map(|upstream| (upstream.id.clone(), upstream)).collect(),
            store,
            clock,
            guard,
            vault: Vault::new(secret),
            person_key: secret.derive("palisade/user-oauth-person/v1"),
            keys: PageKeys::new(secret.derive("palisade/user-oauth-cookies/v1")),
            sign_in_secret,
            discovered: Mutex::new(HashMap::new()),
            hints: Mutex::new(HashMap::new()),
            refreshing: Mutex::new(HashMap::new()),
            settings,
        }))
    }

    /// The settings.
    pub fn settings(&self) -> &UserOAuthSettings {
        &self.settings
    }

    /// Whether `upstream` is one of this client's.
    pub fn serves(&self, upstream: &str) -> bool {
        self.upstreams.contains_key(upstream)
    }

    /// The keyed digest a person's rows are stored under.
    pub(crate) fn person_key(&self, person: &Person) -> [u8; 32] {
        let text = format!("{}\u{1f}{}\u{1f}{}", person.issuer, person.subject, person.tenant.as_deref().unwrap_or(""));
        let mut out = [0u8; 32];
        out.copy_from_slice(hmac::sign(&self.person_key, text.as_bytes()).as_ref());
        out
    }

    /// The redirect URI Palisade registers at every upstream's authorization server.
    pub fn redirect_uri(&self) -> String {
        self.url("oauth/callback")
    }

    /// The URL of Palisade's Client ID Metadata Document (its client id where CIMD is offered).
    pub fn client_metadata_url(&self) -> String {
        self.url("oauth/client.json")
    }

    /// An absolute URL under the public base.
    pub(crate) fn url(&self, path: &str) -> String {
        let base = self.settings.public_url.as_str().trim_end_matches('/');
        format!("{base}/{path}")
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn flow_ttl_ms(&self) -> i64 {
        i64::try_from(self.settings.flow_ttl_secs).unwrap_or(600) * 1000
    }

    /// The access token of the caller's person for `upstream`: the stored one while fresh, else
    /// refreshed (the new refresh token replaces the old in one compare-and-swap). No usable
    /// connection, or a connection the person has not approved the calling MCP client to use:
    /// [`CredentialError::UserAuthorizationRequired`] (the consent page asks). A store failure
    /// refuses (fail closed).
    pub(crate) async fn access_token(
        &self,
        caller: &UserCaller,
        upstream: &str,
    ) -> Result<Zeroizing<String>, CredentialError> {
        let Some(config) = self.upstreams.get(upstream) else {
            return Err(CredentialError::Config("the upstream is not a user_oauth upstream"));
        };
        let key = self.person_key(&caller.person);
        let needed = || CredentialError::UserAuthorizationRequired { scopes: None };
        let approved = self
            .store
            .client_approved(key, upstream, &caller.client_id)
            .await
            .map_err(|_| CredentialError::Unavailable("the connection store failed"))?;
        if !approved {
            return Err(needed());
        }
        let Some((_, tokens)) = self.load(key, upstream).await? else { return Err(needed()) };
        if self.now_ms() < tokens.expires_at_ms.saturating_sub(EXPIRY_SKEW_MS) {
            return Ok(Zeroizing::new(tokens.access_token.clone()));
        }
        if tokens.refresh_token.is_none() {
            return Err(needed());
        }
        // One refresh per (person, upstream) on this instance; the others wait and re-read.
        let flight = lock(&self.refreshing).entry((key, upstream.to_owned())).or_default().clone();
        let _guard = flight.lock().await;
        let Some((row, tokens)) = self.load(key, upstream).await? else { return Err(needed()) };
        if self.now_ms() < tokens.expires_at_ms.saturating_sub(EXPIRY_SKEW_MS) {
            return Ok(Zeroizing::new(tokens.access_token.clone()));
        }
        let refreshed = self.refresh(config, &row, &tokens).await;
        lock(&self.refreshing).remove(&(key, upstream.to_owned()));
        match refreshed {
            Ok(access) => Ok(access),
            Err(OAuthError::GrantRefused) => {
                // The refresh token is dead (revoked, or rotated by a replay elsewhere): the
                // connection must be made again.
                let _ = self.store.delete_connection(key, upstream).await;
                tracing::info!(upstream, "user_oauth: refresh refused; the connection was removed");
                Err(needed())
            }
            Err(error) => {
                tracing::warn!(upstream, %error, "user_oauth: refresh failed");
                Err(CredentialError::Unavailable("the upstream's authorization server could not refresh the token"))
            }
        }
    }

    /// The stored row and its opened tokens; a row that does not open is treated as absent (and
    /// reported), never used.
    async fn load(&self, key: [u8; 32], upstream: &str) -> Result<Option<(ConnectionRow, Tokens)>, CredentialError> {
        let row = self
            .store
            .connection(key, upstream)
            .await
            .map_err(|_| CredentialError::Unavailable("the connection store failed"))?;
        let Some(row) = row else { return Ok(None) };
        match self.open_tokens(&row) {
            Some(tokens) => Ok(Some((row, tokens))),
            None => {
                tracing::warn!(upstream, "user_oauth: a stored connection does not open under its binding; ignored");
                Ok(None)
            }
        }
    }

    fn token_binding<'a>(key: &'a [u8; 32], upstream: &'a str) -> [&'a [u8]; 3] {
        [b"palisade/user-oauth/tokens", key.as_slice(), upstream.as_bytes()]
    }

    fn open_tokens(&self, row: &ConnectionRow) -> Option<Tokens> {
        let plain = self.vault.open(&Self::token_binding(&row.principal_key, &row.upstream), &row.sealed).ok()?;
        serde_json::from_slice(&plain).ok()
    }

    fn seal_tokens(&self, key: &[u8; 32], upstream: &str, tokens: &Tokens) -> Result<Vec<u8>, OAuthError> {
        let plain =
            Zeroizing::new(serde_json::to_vec(tokens).map_err(|_| OAuthError::Refused("tokens not serializable"))?);
        self.vault.seal(&Self::token_binding(key, upstream), &plain).map_err(|_| OAuthError::Refused("sealing failed"))
    }

    async fn refresh(
        &self,
        config: &UpstreamOAuth,
        row: &ConnectionRow,
        tokens: &Tokens,
    ) -> Result<Zeroizing<String>, OAuthError> {
        let Some(refresh_token) = tokens.refresh_token.as_deref() else { return Err(OAuthError::GrantRefused) };
        let server = self.discover(config, false).await?;
        if server.server.issuer != row.issuer {
            // The upstream moved to another authorization server: its tokens are not ours to use.
            return Err(OAuthError::GrantRefused);
        }
        let client = self.client_identity(&server.server).await?;
        let now = self.now_ms();
        let mut fresh = token::request_tokens(
            &self.guard,
            &server.server.token_endpoint,
            &client,
            Grant::Refresh { refresh_token },
            config.resource.as_str(),
            now,
        )
        .await?;
        // RFC 6749 §6: without a new refresh token, the old one stays valid.
        if fresh.refresh_token.is_none() {
            fresh.refresh_token = tokens.refresh_token.clone();
        }
        if fresh.scope.is_empty() {
            fresh.scope = tokens.scope.clone();
        }
        let next = ConnectionRow {
            sealed: self.seal_tokens(&row.principal_key, &row.upstream, &fresh)?,
            scopes: fresh.scope.clone(),
            updated_ms: now,
            expires_ms: Some(fresh.expires_at_ms),
            ..row.clone()
        };
        if !self.store.replace_connection(&next, row.version).await? {
            // Another instance refreshed first: its tokens are the current ones.
            let current = self.store.connection(row.principal_key, &row.upstream).await?;
            let tokens = current.as_ref().and_then(|row| self.open_tokens(row)).ok_or(OAuthError::GrantRefused)?;
            return Ok(Zeroizing::new(tokens.access_token.clone()));
        }
        Ok(Zeroizing::new(fresh.access_token.clone()))
    }

    /// The upstream refused `person`'s token (401): the connection is removed so the next call
    /// elicits a new one, and the challenge's metadata URL is remembered for discovery.
    pub(crate) async fn rejected(&self, person: &Person, upstream: &str, resource_metadata: Option<&str>) {
        if let Some(hint) = resource_metadata.and_then(|text| Url::parse(text).ok()) {
            let mut hints = lock(&self.hints);
            let hints = hints.entry(upstream.to_owned()).or_default();
            if hints.kept.as_ref() != Some(&hint) {
                hints.candidate = Some(hint);
                lock(&self.discovered).remove(upstream);
            }
        }
        let key = self.person_key(person);
        if let Err(error) = self.store.delete_connection(key, upstream).await {
            tracing::warn!(upstream, %error, "user_oauth: a refused connection could not be removed");
        }
    }

    /// The authorization server of `config`'s upstream, discovered (and cached for ten
    /// minutes): protected-resource metadata, then the authorization server's own.
    pub(crate) async fn discover(&self, config: &UpstreamOAuth, fresh: bool) -> Result<Arc<Discovered>, OAuthError> {
        let now = self.now_ms();
        if !fresh
            && let Some(found) = lock(&self.discovered).get(&config.id)
            && now.saturating_sub(found.fetched_ms) < DISCOVERY_TTL_MS
        {
            return Ok(found.clone());
        }
        let resource = self.protected_resource(config).await?;
        let server =
            discovery::authorization_server(&self.guard, &resource.issuer, self.settings.egress.allow_loopback).await?;
        let found = Arc::new(Discovered { server, fetched_ms: now });
        lock(&self.discovered).insert(config.id.clone(), found.clone());
        Ok(found)
    }

    /// The upstream's protected-resource metadata: from its challenges' hints first (the newest
    /// candidate, then the one kept), each dropped when refused, then from the well-known
    /// locations.
    async fn protected_resource(&self, config: &UpstreamOAuth) -> Result<discovery::ProtectedResource, OAuthError> {
        let hints: Vec<Url> = {
            let hints = lock(&self.hints);
            let found = hints.get(&config.id);
            found
                .and_then(|hints| hints.candidate.clone())
                .into_iter()
                .chain(found.and_then(|hints| hints.kept.clone()))
                .collect()
        };
        let mut tried: Vec<&Url> = Vec::new();
        for hint in &hints {
            if tried.contains(&hint) {
                continue;
            }
            tried.push(hint);
            let found = discovery::protected_resource_at(&self.guard, &config.resource, hint).await;
            let mut all = lock(&self.hints);
            let kept = all.entry(config.id.clone()).or_default();
            if kept.candidate.as_ref() == Some(hint) {
                kept.candidate = None;
            }
            match found {
                Ok(metadata) => {
                    kept.kept = Some(hint.clone());
                    return Ok(metadata);
                }
                Err(error) => {
                    if kept.kept.as_ref() == Some(hint) {
                        kept.kept = None;
                    }
                    drop(all);
                    tracing::warn!(
                        upstream = %config.id,
                        hint_sha256 = %palisade_base::hex::hex(&id_digest(hint.as_str())),
                        reason = %error.without_url(),
                        "user_oauth: the resource_metadata URL of the upstream's challenge was refused and dropped; discovery falls back"
                    );
                }
            }
        }
        discovery::protected_resource(&self.guard, &config.resource).await
    }

    /// Palisade's client identity at `server`: its Client ID Metadata Document URL where the
    /// server takes one; else a registration (RFC 7591), made once per server and redirect URI
    /// and kept sealed in the store.
    pub(crate) async fn client_identity(&self, server: &AuthorizationServer) -> Result<ClientIdentity, OAuthError> {
        if server.client_id_metadata_documents {
            return Ok(ClientIdentity {
                client_id: self.client_metadata_url(),
                client_secret: None,
                auth_method: "none".into(),
            });
        }
        let redirect_uri = self.redirect_uri();
        let binding: [&[u8]; 3] =
            [b"palisade/user-oauth/registration", server.issuer.as_bytes(), redirect_uri.as_bytes()];
        if let Some(stored) = self.store.oauth_client(&server.issuer, &redirect_uri).await? {
            // Stored as a JSON string holding the base64url of the sealed registration.
            let opened = serde_json::from_str::<String>(&stored)
                .ok()
                .and_then(|encoded| URL_SAFE_NO_PAD.decode(encoded.as_bytes()).ok())
                .and_then(|sealed| self.vault.open(&binding, &sealed).ok())
                .and_then(|plain| serde_json::from_slice::<ClientIdentity>(&plain).ok());
            if let Some(identity) = opened {
                return Ok(identity);
            }
            tracing::warn!(issuer = %server.issuer, "user_oauth: a stored registration does not open; registering again");
        }
        let endpoint = server.registration_endpoint.as_ref().ok_or(OAuthError::Registration(
            "the authorization server offers neither client metadata documents nor registration",
        ))?;
        let identity = token::register(
            &self.guard,
            endpoint,
            &self.settings.client_name,
            &redirect_uri,
            &server.token_auth_methods,
        )
        .await?;
        let plain = Zeroizing::new(
            serde_json::to_vec(&identity).map_err(|_| OAuthError::Refused("registration not serializable"))?,
        );
        let sealed = self.vault.seal(&binding, &plain).map_err(|_| OAuthError::Refused("sealing failed"))?;
        let stored = Value::String(URL_SAFE_NO_PAD.encode(sealed)).to_string();
        self.store.put_oauth_client(&server.issuer, &redirect_uri, &stored, self.now_ms()).await?;
        Ok(identity)
    }

    /// A connect link for `principal` and `upstream` (a one-time id, valid for the flow
    /// lifetime, bound to the person, the MCP client and the scopes wanted). Refused for a
    /// delegated caller: an agent acting under a capability cannot connect the person's
    /// accounts.
    pub async fn connect_link(
        &self,
        principal: &VerifiedPrincipal,
        upstream: &str,
        extra_scopes: Option<&[String]>,
    ) -> Result<Url, OAuthError> {
        if principal.delegation().is_some() {
            return Err(OAuthError::Refused(
                "this upstream needs the person's own authorization; an agent acting under a delegation cannot start it",
            ));
        }
        let config = self.upstreams.get(upstream).ok_or(OAuthError::Refused("not a user_oauth upstream"))?;
        let scopes = config.scopes_to_ask(extra_scopes);
        let id = random_id()?;
        let flow = ConnectFlow {
            person: Person::of(principal),
            client_id: UserCaller::of(principal).client_id,
            upstream: upstream.to_owned(),
            scopes,
        };
        let body = serde_json::to_string(&flow).map_err(|_| OAuthError::Refused("flow not serializable"))?;
        self.store.put_flow(id_digest(&id), CONNECT, &body, self.now_ms() + self.flow_ttl_ms()).await?;
        Url::parse(&self.url(&format!("connect/{id}")))
            .map_err(|_| OAuthError::Refused("the connect link is not a URL"))
    }

    /// Every connection (of one person, when given), newest first, without tokens.
    pub async fn connections(&self, person: Option<&Person>) -> Result<Vec<ConnectionView>, OAuthError> {
        let key = person.map(|person| self.person_key(person));
        let rows = self.store.connections(key, MAX_CONNECTIONS_LISTED).await?;
        Ok(rows.into_iter().map(view).collect())
    }

    /// Removes `person`'s connection to `upstream` (or every connection of the person when
    /// `upstream` is `None`); returns how many. The upstream's authorization server is not told
    /// (RFC 7009 revocation is not offered by every server); the tokens are gone from here.
    pub async fn revoke(&self, person: &Person, upstream: Option<&str>) -> Result<u64, OAuthError> {
        let key = self.person_key(person);
        Ok(match upstream {
            Some(upstream) => u64::from(self.store.delete_connection(key, upstream).await?),
            None => self.store.delete_connections_of(key).await?,
        })
    }

    /// The principal-event hook: a person whose tokens were revoked, whose roles changed or who
    /// left a tenant loses the connections made under it; a revoked MCP client loses every
    /// person's approval (the connections stay the person's; no call through that client uses
    /// them until approved again). Returns how many rows were removed.
    pub async fn on_principal_event(&self, event: &PrincipalEvent) -> Result<u64, OAuthError> {
        if let PrincipalEvent::ClientRevoked { client } = event {
            let mut removed = 0;
            for approval in self.store.approved_clients(None, MAX_CONNECTIONS_LISTED).await? {
                if &approval.client_id == client
                    && self.store.revoke_client(approval.principal_key, &approval.upstream, client).await?
                {
                    removed += 1;
                }
            }
            return Ok(removed);
        }
        let rows = self.store.connections(None, MAX_CONNECTIONS_LISTED).await?;
        let mut removed = 0;
        for row in rows {
            let Ok(person) = serde_json::from_str::<Person>(&row.principal) else { continue };
            let hit = match event {
                PrincipalEvent::TokensRevoked { issuer, subject } | PrincipalEvent::RoleChanged { issuer, subject } => {
                    &person.issuer == issuer && &person.subject == subject
                }
                PrincipalEvent::TenantSwitched { issuer, subject, from_tenant } => {
                    &person.issuer == issuer
                        && &person.subject == subject
                        && person.tenant.as_deref() == Some(from_tenant.as_str())
                }
                PrincipalEvent::ClientRevoked { .. } => false,
            };
            if hit && self.store.delete_connection(row.principal_key, &row.upstream).await? {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The background upkeep, until `shutdown`: the principal events this instance raises (a
    /// revoked principal loses its connections, a revoked client its approvals; other instances
    /// share the store, so one instance acting is enough), and the purge of expired flow rows
    /// every five minutes.
    pub fn spawn_upkeep(self: &Arc<Self>, events: &EventBus, shutdown: CancellationToken) {
        let mut received = events.subscribe_local();
        let oauth = self.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    () = stop.cancelled() => return,
                    event = received.recv() => event,
                };
                let event = match event {
                    Ok(ServerEvent::PrincipalRevoked { issuer, subject, tenant: None }) => {
                        PrincipalEvent::TokensRevoked { issuer, subject }
                    }
                    Ok(ServerEvent::PrincipalRevoked { issuer, subject, tenant: Some(from_tenant) }) => {
                        PrincipalEvent::TenantSwitched { issuer, subject, from_tenant }
                    }
                    Ok(ServerEvent::ClientRevoked { client }) => PrincipalEvent::ClientRevoked { client },
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            missed,
                            "user_oauth: principal events were missed; their connections stay until revoked by hand"
                        );
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                match oauth.on_principal_event(&event).await {
                    Ok(removed) if removed > 0 => {
                        tracing::info!(removed, "user_oauth: principal event: connections or approvals removed")
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "user_oauth: a principal event could not be applied"),
                }
            }
        });
        let store = self.store.clone();
        let clock = self.clock.clone();
        palisade_server::periodic::spawn_periodic("oauth flow purge", FLOW_PURGE_PERIOD, shutdown, move || {
            let (store, now) = (store.clone(), clock.now_ms());
            async move {
                // Bounded batches; what is left waits for the next tick.
                for _ in 0..10 {
                    match store.purge_flows(now, 1000).await {
                        Ok(1000) => continue,
                        Ok(_) => break,
                        Err(error) => {
                            tracing::warn!(%error, "user_oauth: flow purge failed; retrying at the next tick");
                            break;
                        }
                    }
                }
            }
        });
    }

    /// Stores the tokens of a finished flow (replacing an older connection of the person).
    pub(crate) async fn store_tokens(
        &self,
        person: &Person,
        upstream: &str,
        server: &AuthorizationServer,
        client_id: &str,
        tokens: &Tokens,
    ) -> Result<(), OAuthError> {
        let key = self.person_key(person);
        let now = self.now_ms();
        let row = ConnectionRow {
            principal_key: key,
            principal: person.label(),
            upstream: upstream.to_owned(),
            issuer: server.issuer.clone(),
            client_id: client_id.to_owned(),
            scopes: tokens.scope.clone(),
            sealed: self.seal_tokens(&key, upstream, tokens)?,
            version: 1,
            created_ms: now,
            updated_ms: now,
            expires_ms: Some(tokens.expires_at_ms),
        };
        self.store.put_connection(&row).await?;
        Ok(())
    }
}

fn view(row: ConnectionRow) -> ConnectionView {
    ConnectionView {
        person: serde_json::from_str(&row.principal).unwrap_or(serde_json::Value::Null),
        upstream: row.upstream,
        issuer: row.issuer,
        client_id: row.client_id,
        scopes: row.scopes,
        created_ms: row.created_ms,
        updated_ms: row.updated_ms,
    }
}

#[cfg(test)]
mod tests;
