//! The gateway's own credential toward each upstream (control C7): none, a static secret, OAuth
//! 2.0 client credentials, or RFC 8693 token exchange. Never the caller's token: the caller's
//! token is only ever sent to the configured authorization server, in a token-exchange request.
//!
//! Secrets are read once, when the credential is built, into zeroizing buffers whose `Debug`
//! shows nothing; errors name where a secret comes from (a file path, an environment variable),
//! never its value. Tokens from an authorization server are cached until 30 s before they expire;
//! concurrent callers that need the same token share one request (single flight).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine as _;
use palisade_base::clock::Clock;
use reqwest::header::{HeaderName, HeaderValue};
use url::Url;
use zeroize::Zeroizing;

pub(crate) mod settings;

use crate::secret::Secret;
pub use crate::secret::{CredentialError, MAX_SECRET_BYTES, SecretSource};
use crate::user_oauth::token::{form_encode, refusal_text};
use crate::user_oauth::{UserCaller, UserOAuth};
pub use settings::{ClientAuth, CredentialConfig};

/// The largest token-endpoint response body read.
pub const MAX_TOKEN_RESPONSE_BYTES: usize = 64 * 1024;
/// How long one token request may take, connection included.
pub const TOKEN_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A token is used until this long before it expires, then fetched again.
pub const EXPIRY_SKEW_MS: i64 = 30_000;
/// The lifetime assumed when a token response has no `expires_in`.
pub const DEFAULT_EXPIRES_IN_SECS: u64 = 300;
/// The longest lifetime believed, whatever `expires_in` says.
pub const MAX_EXPIRES_IN_SECS: u64 = 24 * 60 * 60;
/// The most callers whose exchanged tokens are cached at once, per upstream.
pub const MAX_EXCHANGE_CACHE_ENTRIES: usize = 10_000;

const GRANT_CLIENT_CREDENTIALS: &str = "client_credentials";
const GRANT_TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const TOKEN_TYPE_ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";

/// Who the upstream request is made for.
#[derive(Clone, Copy)]
pub struct CallerContext<'a> {
    /// The caller's partition key (issuer, subject, tenant, client), for per-principal caches.
    pub partition: &'a str,
    /// The caller's verified bearer token: only token exchange reads it, and only sends it to
    /// the authorization server.
    pub subject_token: Option<&'a str>,
    /// The person making the call and their MCP client, for per-user credentials (`None` for
    /// the gateway's own requests: listings, health).
    pub user: Option<&'a UserCaller>,
}

impl std::fmt::Debug for CallerContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerContext").field("partition", &self.partition).finish_non_exhaustive()
    }
}

/// One upstream's credential source.
#[derive(Debug)]
pub struct UpstreamCredential {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    None,
    Static { header: HeaderName, value: Secret },
    ClientCredentials(ClientCredentials),
    TokenExchange(TokenExchange),
    UserOAuth { oauth: Arc<UserOAuth>, upstream: String },
}

impl UpstreamCredential {
    /// No credential.
    pub fn none() -> Self {
        Self { kind: Kind::None }
    }

    /// A per-user credential of `upstream`, served by `oauth`.
    pub fn user_oauth(oauth: Arc<UserOAuth>, upstream: &str) -> Self {
        Self { kind: Kind::UserOAuth { oauth, upstream: upstream.to_owned() } }
    }

    /// Resolves secrets now (a missing one is an error naming its source, never a value) and
    /// builds the credential for the upstream whose canonical resource URI is `resource`.
    pub fn from_config(
        config: &CredentialConfig,
        resource: &Url,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CredentialError> {
        if resource.fragment().is_some() {
            return Err(CredentialError::Config("the upstream resource URI must not have a fragment"));
        }
        let kind = match config {
            CredentialConfig::None => Kind::None,
            CredentialConfig::Static { header, prefix, secret } => {
                let name = HeaderName::from_bytes(header.as_bytes())
                    .map_err(|_| CredentialError::Config("the static credential's header is not a header name"))?;
                if is_reserved_header(&name) {
                    return Err(CredentialError::Config(
                        "the static credential's header is one the gateway sets itself (Host, Content-*, \
                         Accept, Connection, Transfer-Encoding, Mcp-*)",
                    ));
                }
                let secret = secret.read()?;
                let value = Secret(Zeroizing::new(format!("{prefix}{}", secret.expose())));
                if HeaderValue::from_str(value.expose()).is_err() {
                    return Err(CredentialError::Secret {
                        origin: secret_origin(config),
                        reason: "cannot be sent in a header (with its prefix)",
                    });
                }
                Kind::Static { header: name, value }
            }
            CredentialConfig::ClientCredentials { token_url, client_id, client_secret, scopes, max_scopes, auth } => {
                let endpoint = TokenEndpoint::new(token_url, client_id, client_secret, *auth, clock)?;
                let scopes = scope_set(scopes)?;
                let mut max = scope_set(max_scopes)?;
                max.extend(scopes.iter().cloned());
                Kind::ClientCredentials(ClientCredentials {
                    endpoint,
                    resource: resource.as_str().to_owned(),
                    max_scopes: max,
                    scopes: Mutex::new(ScopeState { current: scopes, tried: HashSet::new() }),
                    slot: Slot::default(),
                })
            }
            CredentialConfig::TokenExchange { token_url, client_id, client_secret, scopes, auth } => {
                let endpoint = TokenEndpoint::new(token_url, client_id, client_secret, *auth, clock)?;
                Kind::TokenExchange(TokenExchange {
                    endpoint,
                    resource: resource.as_str().to_owned(),
                    scopes: scope_string(&scope_set(scopes)?),
                    cache: Mutex::new(HashMap::new()),
                    own: Slot::default(),
                })
            }
            CredentialConfig::UserOAuth { .. } => {
                return Err(CredentialError::Config(
                    "a user_oauth credential needs the gateway's web surface ([web] and [web.sign_in])",
                ));
            }
        };
        Ok(Self { kind })
    }

    /// `"none"`, `"static"`, `"client_credentials"` or `"token_exchange"`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::None => "none",
            Kind::Static { .. } => "static",
            Kind::ClientCredentials(_) => "client_credentials",
            Kind::TokenExchange(_) => "token_exchange",
            Kind::UserOAuth { .. } => "user_oauth",
        }
    }

    /// The headers to add to one upstream request.
    pub async fn apply(&self, caller: CallerContext<'_>) -> Result<Vec<(HeaderName, HeaderValue)>, CredentialError> {
        let value = match &self.kind {
            Kind::None => return Ok(Vec::new()),
            Kind::Static { header, value } => return Ok(vec![(header.clone(), sensitive_value(value.expose())?)]),
            Kind::ClientCredentials(cc) => cc.token().await?,
            Kind::TokenExchange(te) => te.token(caller).await?,
            Kind::UserOAuth { oauth, upstream } => {
                // The gateway's own requests (listings) go without a person's token.
                let Some(user) = caller.user else { return Ok(Vec::new()) };
                let token = oauth.access_token(user, upstream).await?;
                let header = Zeroizing::new(format!("Bearer {}", token.as_str()));
                return Ok(vec![(reqwest::header::AUTHORIZATION, sensitive_value(&header)?)]);
            }
        };
        let header = Zeroizing::new(format!("Bearer {}", value.expose()));
        Ok(vec![(reqwest::header::AUTHORIZATION, sensitive_value(&header)?)])
    }

    /// The upstream answered 403 `insufficient_scope` naming `scopes`: whether a retry with a
    /// wider credential is worth it. Only client credentials step up, only within the configured
    /// maximum, and only once per resulting scope set: the scope set becomes current ∪ `scopes`
    /// and the cached token is dropped.
    pub async fn step_up(&self, scopes: &[String]) -> bool {
        match &self.kind {
            Kind::ClientCredentials(cc) => cc.step_up(scopes),
            _ => false,
        }
    }

    /// Whether the credential is each person's own (`user_oauth`).
    pub fn is_per_user(&self) -> bool {
        matches!(self.kind, Kind::UserOAuth { .. })
    }

    /// The upstream answered 401 to a request made with `caller`'s per-user token: the
    /// connection is dropped (the next call asks the person to connect again) and the
    /// challenge's `resource_metadata` URL is kept for discovery. Nothing for other kinds.
    pub async fn rejected(&self, caller: CallerContext<'_>, resource_metadata: Option<&str>) {
        if let (Kind::UserOAuth { oauth, upstream }, Some(user)) = (&self.kind, caller.user) {
            oauth.rejected(&user.person, upstream, resource_metadata).await;
        }
    }
}

fn secret_origin(config: &CredentialConfig) -> String {
    match config {
        CredentialConfig::Static { secret, .. } => secret.origin(),
        CredentialConfig::ClientCredentials { client_secret, .. }
        | CredentialConfig::TokenExchange { client_secret, .. } => client_secret.origin(),
        CredentialConfig::None | CredentialConfig::UserOAuth { .. } => String::new(),
    }
}

/// Headers the upstream client sets itself: a credential may not replace them.
fn is_reserved_header(name: &HeaderName) -> bool {
    let name = name.as_str();
    matches!(name, "host" | "connection" | "transfer-encoding" | "te" | "upgrade" | "accept" | "keep-alive")
        || name.starts_with("content-")
        || name.starts_with("mcp-")
}

fn sensitive_value(text: &str) -> Result<HeaderValue, CredentialError> {
    let mut value = HeaderValue::from_str(text)
        .map_err(|_| CredentialError::Unavailable("the credential is not a header value"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// RFC 6749 §3.3 scope-token: %x21 / %x23-5B / %x5D-7E, at least one.
fn scope_set(scopes: &[String]) -> Result<BTreeSet<String>, CredentialError> {
    for scope in scopes {
        let valid = !scope.is_empty() && scope.bytes().all(|byte| matches!(byte, 0x21 | 0x23..=0x5B | 0x5D..=0x7E));
        if !valid {
            return Err(CredentialError::Config("a scope is empty or has characters RFC 6749 §3.3 does not allow"));
        }
    }
    Ok(scopes.iter().cloned().collect())
}

fn scope_string(scopes: &BTreeSet<String>) -> String {
    scopes.iter().map(String::as_str).collect::<Vec<_>>().join(" ")
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (plain assignments).
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A token from the authorization server, with the time it stops being used.
struct Cached {
    token: Arc<Secret>,
    /// Milliseconds since the epoch after which the token is fetched again.
    use_until_ms: i64,
    /// What the token was fetched for (the client-credentials scope set), checked on use.
    tag: String,
}

impl Cached {
    fn fresh(&self, now_ms: i64) -> Option<Arc<Secret>> {
        (now_ms < self.use_until_ms).then(|| self.token.clone())
    }
}

/// The token endpoint and the gateway's client authentication there.
struct TokenEndpoint {
    url: Url,
    client_id: String,
    client_secret: Secret,
    auth: ClientAuth,
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for TokenEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEndpoint")
            .field("url", &self.url.as_str())
            .field("client_id", &self.client_id)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl TokenEndpoint {
    fn new(
        url: &Url,
        client_id: &str,
        secret: &SecretSource,
        auth: ClientAuth,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CredentialError> {
        check_token_url(url)?;
        if client_id.is_empty() || client_id.chars().any(char::is_control) {
            return Err(CredentialError::Config("the client id is empty or has control characters"));
        }
        let client_secret = secret.read()?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(TOKEN_REQUEST_TIMEOUT)
            .connect_timeout(TOKEN_REQUEST_TIMEOUT)
            .user_agent(concat!("palisade-gateway/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|_| CredentialError::Config("the HTTP client for the token endpoint could not be built"))?;
        Ok(Self { url: url.clone(), client_id: client_id.to_owned(), client_secret, auth, http, clock })
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The form body of a token request and, for Basic authentication, its `Authorization`
    /// value (built before any await: the form serializer is not `Send`).
    fn form(&self, params: &[(&str, &str)]) -> Result<(Zeroizing<String>, Option<HeaderValue>), CredentialError> {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in params {
            form.append_pair(name, value);
        }
        let authorization = match self.auth {
            ClientAuth::Post => {
                form.append_pair("client_id", &self.client_id);
                form.append_pair("client_secret", self.client_secret.expose());
                None
            }
            ClientAuth::Basic => {
                // RFC 6749 §2.3.1: both parts form-encoded before Base64.
                let pair = Zeroizing::new(format!(
                    "{}:{}",
                    form_encode(&self.client_id),
                    &*Zeroizing::new(form_encode(self.client_secret.expose()))
                ));
                let basic = Zeroizing::new(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair.as_bytes())
                ));
                Some(sensitive_value(&basic)?)
            }
        };
        Ok((Zeroizing::new(form.finish()), authorization))
    }

    /// One token request with these grant parameters; the client authentication is added here.
    async fn request(&self, params: &[(&str, &str)]) -> Result<TokenResponse, CredentialError> {
        let (body, authorization) = self.form(params)?;
        let mut request = self.http.post(self.url.clone()).header(reqwest::header::ACCEPT, "application/json");
        if let Some(authorization) = authorization {
            request = request.header(reqwest::header::AUTHORIZATION, authorization);
        }
        let response = request
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body.as_bytes().to_vec())
            .send()
            .await
            .map_err(|error| {
                CredentialError::Unavailable(if error.is_timeout() {
                    "the authorization server did not answer in time"
                } else {
                    "the authorization server could not be reached"
                })
            })?;
        let status = response.status();
        let body = read_capped(response).await?;
        if status.is_redirection() {
            return Err(CredentialError::Unavailable("the authorization server answered with a redirect"));
        }
        if !status.is_success() {
            return Err(CredentialError::Unavailable(refusal_text(&body)));
        }
        TokenResponse::parse(&body)
    }
}

fn check_token_url(url: &Url) -> Result<(), CredentialError> {
    if !url.username().is_empty() || url.password().is_some() {
        return Err(CredentialError::Config("the token URL must not carry credentials"));
    }
    if url.fragment().is_some() {
        return Err(CredentialError::Config("the token URL must not have a fragment"));
    }
    let loopback = match url.host() {
        Some(url::Host::Ipv4(address)) => address.is_loopback(),
        Some(url::Host::Ipv6(address)) => address.is_loopback(),
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => return Err(CredentialError::Config("the token URL has no host")),
    };
    match url.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        _ => Err(CredentialError::Config("the token URL must be https (http only on a loopback address)")),
    }
}

/// Reads at most [`MAX_TOKEN_RESPONSE_BYTES`] of the body; more is an error.
async fn read_capped(mut response: reqwest::Response) -> Result<Zeroizing<Vec<u8>>, CredentialError> {
    if response.content_length().is_some_and(|length| length > MAX_TOKEN_RESPONSE_BYTES as u64) {
        return Err(CredentialError::Unavailable("the token response is too large"));
    }
    let mut body = Zeroizing::new(Vec::new());
    loop {
        let chunk = response.chunk().await.map_err(|error| {
            CredentialError::Unavailable(if error.is_timeout() {
                "the authorization server did not answer in time"
            } else {
                "the token response could not be read"
            })
        })?;
        let Some(chunk) = chunk else {
            return Ok(body);
        };
        if body.len() + chunk.len() > MAX_TOKEN_RESPONSE_BYTES {
            return Err(CredentialError::Unavailable("the token response is too large"));
        }
        body.extend_from_slice(&chunk);
    }
}

/// A successful token response (RFC 6749 §5.1, RFC 8693 §2.2.1), checked.
struct TokenResponse {
    access_token: Secret,
    expires_in_secs: u64,
}

impl TokenResponse {
    fn parse(body: &[u8]) -> Result<Self, CredentialError> {
        #[derive(serde::Deserialize)]
        struct Body {
            access_token: String,
            token_type: String,
            expires_in: Option<u64>,
            issued_token_type: Option<String>,
        }
        let malformed = CredentialError::Unavailable("the token response is malformed");
        let parsed: Body = serde_json::from_slice(body).map_err(|_| malformed.clone())?;
        let access_token = Zeroizing::new(parsed.access_token);
        if !parsed.token_type.eq_ignore_ascii_case("bearer") {
            return Err(CredentialError::Unavailable("the token response is not a bearer token"));
        }
        if parsed.issued_token_type.as_deref().is_some_and(|kind| kind != TOKEN_TYPE_ACCESS_TOKEN) {
            return Err(CredentialError::Unavailable("the token exchange issued something other than an access token"));
        }
        // RFC 6750 §2.1 b64token: what may follow "Bearer ".
        let token_ok = !access_token.is_empty()
            && access_token.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-._~+/=".contains(&byte));
        if !token_ok {
            return Err(malformed);
        }
        Ok(Self {
            access_token: Secret(access_token),
            expires_in_secs: parsed.expires_in.unwrap_or(DEFAULT_EXPIRES_IN_SECS).min(MAX_EXPIRES_IN_SECS),
        })
    }

    /// The cache entry for this token, obtained at `fetched_ms`, used until [`EXPIRY_SKEW_MS`]
    /// before it expires (and never after `not_after_ms`).
    fn into_cached(self, fetched_ms: i64, not_after_ms: Option<i64>, tag: String) -> Cached {
        let lifetime_ms = i64::try_from(self.expires_in_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        let mut use_until_ms = fetched_ms.saturating_add(lifetime_ms).saturating_sub(EXPIRY_SKEW_MS);
        if let Some(not_after_ms) = not_after_ms {
            use_until_ms = use_until_ms.min(not_after_ms.saturating_sub(EXPIRY_SKEW_MS));
        }
        Cached { token: Arc::new(self.access_token), use_until_ms, tag }
    }
}

/// One cached token and the single flight that refreshes it: concurrent callers that find no
/// fresh token wait for one request and share its result, success or failure.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    /// Held while a token is being fetched.
    fetch: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct SlotState {
    token: Option<Cached>,
    /// Fetches completed so far (a waiter that sees this move knows a fetch ran meanwhile).
    attempts: u64,
    /// How the last fetch failed, if it did.
    failure: Option<CredentialError>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("cached", &lock(&self.state).token.is_some()).finish_non_exhaustive()
    }
}

impl Slot {
    fn fresh(&self, now_ms: i64, tag: &str) -> Option<Arc<Secret>> {
        lock(&self.state).token.as_ref().filter(|cached| cached.tag == tag).and_then(|cached| cached.fresh(now_ms))
    }

    fn clear(&self) {
        lock(&self.state).token = None;
    }

    /// The fresh token for `tag`, or the result of `fetch` — run by one caller at a time; callers
    /// that waited for a fetch that failed get its error instead of asking again.
    async fn get<F, Fut>(&self, clock: &dyn Clock, tag: &str, fetch: F) -> Result<Arc<Secret>, CredentialError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Cached, CredentialError>>,
    {
        if let Some(token) = self.fresh(clock.now_ms(), tag) {
            return Ok(token);
        }
        let seen = lock(&self.state).attempts;
        let _flight = self.fetch.lock().await;
        if let Some(token) = self.fresh(clock.now_ms(), tag) {
            return Ok(token);
        }
        {
            let state = lock(&self.state);
            if state.attempts != seen
                && let Some(failure) = &state.failure
            {
                return Err(failure.clone());
            }
        }
        let result = fetch().await;
        let mut state = lock(&self.state);
        state.attempts = state.attempts.wrapping_add(1);
        match result {
            Ok(cached) => {
                let token = cached.token.clone();
                state.failure = None;
                state.token = Some(cached);
                Ok(token)
            }
            Err(error) => {
                state.failure = Some(error.clone());
                Err(error)
            }
        }
    }
}

/// Client credentials: one token per upstream, for the current scope set.
#[derive(Debug)]
struct ClientCredentials {
    endpoint: TokenEndpoint,
    resource: String,
    max_scopes: BTreeSet<String>,
    scopes: Mutex<ScopeState>,
    /// The token, tagged with the scope set it was issued for.
    slot: Slot,
}

#[derive(Debug)]
struct ScopeState {
    current: BTreeSet<String>,
    /// Scope sets a step-up has already moved to (each at most once).
    tried: HashSet<BTreeSet<String>>,
}

impl ClientCredentials {
    async fn token(&self) -> Result<Arc<Secret>, CredentialError> {
        let scopes = scope_string(&lock(&self.scopes).current);
        self.slot
            .get(self.endpoint.clock.as_ref(), &scopes, || async {
                let mut params = vec![("grant_type", GRANT_CLIENT_CREDENTIALS), ("resource", self.resource.as_str())];
                if !scopes.is_empty() {
                    params.push(("scope", scopes.as_str()));
                }
                let fetched_ms = self.endpoint.now_ms();
                // Tagged with the scopes asked for: after a step-up it no longer matches.
                Ok(self.endpoint.request(&params).await?.into_cached(fetched_ms, None, scopes.clone()))
            })
            .await
    }

    fn step_up(&self, scopes: &[String]) -> bool {
        if scopes.is_empty() || !scopes.iter().all(|scope| self.max_scopes.contains(scope)) {
            return false;
        }
        let mut state = lock(&self.scopes);
        let mut wider = state.current.clone();
        wider.extend(scopes.iter().cloned());
        if wider == state.current || state.tried.contains(&wider) {
            return false;
        }
        state.tried.insert(wider.clone());
        state.current = wider;
        self.slot.clear();
        true
    }
}

/// Token exchange: one token per caller partition.
struct TokenExchange {
    endpoint: TokenEndpoint,
    resource: String,
    scopes: String,
    cache: Mutex<HashMap<String, Arc<Slot>>>,
    /// The gateway's own token (client credentials), for its listings.
    own: Slot,
}

impl std::fmt::Debug for TokenExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenExchange")
            .field("endpoint", &self.endpoint)
            .field("resource", &self.resource)
            .field("scopes", &self.scopes)
            .field("cached_partitions", &lock(&self.cache).len())
            .finish()
    }
}

impl TokenExchange {
    /// This partition's slot, created if missing; the cache stays within
    /// [`MAX_EXCHANGE_CACHE_ENTRIES`] (expired entries go first, then arbitrary ones).
    fn slot(&self, partition: &str) -> Arc<Slot> {
        let mut cache = lock(&self.cache);
        if let Some(slot) = cache.get(partition) {
            return slot.clone();
        }
        if cache.len() >= MAX_EXCHANGE_CACHE_ENTRIES {
            let now_ms = self.endpoint.now_ms();
            cache.retain(|_, slot| slot.fresh(now_ms, "").is_some());
            while cache.len() >= MAX_EXCHANGE_CACHE_ENTRIES {
                let Some(key) = cache.keys().next().cloned() else { break };
                cache.remove(&key);
            }
        }
        let slot = Arc::new(Slot::default());
        cache.insert(partition.to_owned(), slot.clone());
        slot
    }

    async fn token(&self, caller: CallerContext<'_>) -> Result<Arc<Secret>, CredentialError> {
        // The gateway's own requests (its listings and change stream, partition "", which no
        // caller's partition key can be) are made as the gateway itself: a client-credentials
        // grant at the same endpoint for the same resource, never with anyone's token.
        if caller.partition.is_empty() {
            return self
                .own
                .get(self.endpoint.clock.as_ref(), "", || async {
                    let mut params =
                        vec![("grant_type", GRANT_CLIENT_CREDENTIALS), ("resource", self.resource.as_str())];
                    if !self.scopes.is_empty() {
                        params.push(("scope", self.scopes.as_str()));
                    }
                    let fetched_ms = self.endpoint.now_ms();
                    Ok(self.endpoint.request(&params).await?.into_cached(fetched_ms, None, String::new()))
                })
                .await;
        }
        let subject_token =
            caller.subject_token.filter(|token| !token.is_empty()).ok_or(CredentialError::NoCallerToken)?;
        let slot = self.slot(caller.partition);
        slot.get(self.endpoint.clock.as_ref(), "", || async {
            let mut params = vec![
                ("grant_type", GRANT_TOKEN_EXCHANGE),
                ("subject_token", subject_token),
                ("subject_token_type", TOKEN_TYPE_ACCESS_TOKEN),
                ("requested_token_type", TOKEN_TYPE_ACCESS_TOKEN),
                ("resource", self.resource.as_str()),
            ];
            if !self.scopes.is_empty() {
                params.push(("scope", self.scopes.as_str()));
            }
            let fetched_ms = self.endpoint.now_ms();
            let response = self.endpoint.request(&params).await?;
            Ok(response.into_cached(fetched_ms, jwt_expiry_ms(subject_token), String::new()))
        })
        .await
    }
}

/// The `exp` of a JWT caller token (already verified by the authentication stage), in
/// milliseconds: an exchanged token is not used past the token it was exchanged for. `None` for
/// an opaque token.
fn jwt_expiry_ms(token: &str) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct Claims {
        exp: Option<i64>,
    }
    let payload = token.split('.').nth(1)?;
    let bytes = Zeroizing::new(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?);
    let claims: Claims = serde_json::from_slice(&bytes).ok()?;
    claims.exp.map(|exp| exp.saturating_mul(1000))
}
