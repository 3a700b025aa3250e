//! Issuer key sets: static, or fetched from the issuer's JWKS URL and cached.
//!
//! Fetch rules: through the [`EgressGuard`] (https to public addresses only, each resolved
//! address checked and connected to, with the configuration's development flag, allow-list and
//! proxy), redirects refused, a whole-request timeout, and a response cap counted on the stream
//! (a missing or lying `Content-Length` does not matter). One fetch at a time per issuer (single
//! flight), and never more than one attempt per
//! [`JwksPolicy::min_refetch_interval`] per issuer, whether the attempt is a scheduled refresh,
//! an unknown-`kid` refetch, or a retry after a failure.
//!
//! Freshness rules: a set is refreshed once it is older than [`JwksPolicy::refresh_interval`].
//! If refreshing fails the old set stays in use, but only until it is
//! [`JwksPolicy::max_key_age`] old (bounded stale-if-error); after that, and whenever no key
//! matches while the last attempt failed, the issuer is unavailable and tokens are refused
//! (fail closed).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use palisade_base::clock::Clock;
use serde_json::Value;
use url::Url;

use crate::egress::{EgressError, EgressGuard, EgressPolicy, Resolver};
use crate::jws::JwsAlgorithm;
use crate::keys::{KeySet, VerificationKey};
use crate::stats::Counters;

/// Timing and size limits for fetched JWKS. The defaults suit production; tests shorten them.
#[derive(Debug, Clone)]
pub struct JwksPolicy {
    /// A fetched key set older than this is refreshed by the next verification, inline: that
    /// request waits for the fetch, concurrent ones keep using the current set (requests with no
    /// usable key, or an unknown `kid`, wait for a fetch in flight). Default 5 min.
    pub refresh_interval: Duration,
    /// A fetched key set older than this is never used, even if refreshing keeps failing: the
    /// bound on stale-if-error. Must be at least `refresh_interval`. Default 15 min.
    pub max_key_age: Duration,
    /// At most one fetch attempt per issuer within this interval (unknown-`kid` refetches,
    /// refreshes and retries after failures alike). Default 30 s.
    pub min_refetch_interval: Duration,
    /// Timeout for one whole fetch (connect, headers and body). Default 5 s.
    pub fetch_timeout: Duration,
    /// Largest JWKS response accepted, counted on the received stream. Default 64 KiB.
    pub max_response_bytes: usize,
    /// Resolves JWKS host names instead of the system resolver (tests). Default `None`.
    pub resolver: Option<Resolver>,
}

impl Default for JwksPolicy {
    fn default() -> Self {
        Self {
            refresh_interval: Duration::from_secs(300),
            max_key_age: Duration::from_secs(900),
            min_refetch_interval: Duration::from_secs(30),
            fetch_timeout: Duration::from_secs(5),
            max_response_bytes: 64 * 1024,
            resolver: None,
        }
    }
}

impl JwksPolicy {
    /// `max_key_age` raised to at least `refresh_interval`, so a set is never unusable before it
    /// is due for refresh.
    pub(crate) fn normalized(mut self) -> Self {
        if self.max_key_age < self.refresh_interval {
            self.max_key_age = self.refresh_interval;
        }
        self
    }
}

/// The egress policy of JWKS fetches: the limits of `policy`, no redirects, and the
/// configuration's development flag, allow-list and proxy.
pub(crate) fn egress_policy(
    policy: &JwksPolicy,
    allow_loopback: bool,
    allowed_networks: Vec<ipnet::IpNet>,
    proxy: Option<Url>,
) -> EgressPolicy {
    EgressPolicy {
        allow_loopback,
        allowed_networks,
        max_body_bytes: policy.max_response_bytes,
        timeout: policy.fetch_timeout,
        max_redirects: 0,
        extra_roots_pem: None,
        proxy,
        resolver: policy.resolver.clone(),
    }
}

/// What the services an issuer's key lookup needs: the clock, the egress guard, the limits, the
/// counters.
pub(crate) struct FetchContext<'a> {
    pub(crate) clock: &'a dyn Clock,
    pub(crate) guard: Option<&'a EgressGuard>,
    pub(crate) policy: &'a JwksPolicy,
    pub(crate) counters: &'a Counters,
}

/// Why a key could not be provided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyLookupError {
    /// The issuer's current key set has no such `kid`.
    UnknownKid,
    /// No usable key set (never fetched, too stale, or the last fetch failed and the `kid` is
    /// not in what we have).
    IssuerUnavailable,
}

/// One issuer's keys.
pub(crate) enum IssuerKeys {
    Static(KeySet),
    Remote(RemoteKeys),
}

pub(crate) struct RemoteKeys {
    issuer: String,
    url: Url,
    algorithms: Vec<JwsAlgorithm>,
    state: RwLock<RemoteState>,
    /// Held for the duration of a fetch: single flight.
    fetch_lock: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct RemoteState {
    keys: Arc<KeySet>,
    /// When the current `keys` were fetched; `None` before the first success.
    fetched_at_ms: Option<u64>,
    /// When the last fetch attempt (successful or not) started.
    last_attempt_ms: Option<u64>,
    last_attempt_failed: bool,
}

impl IssuerKeys {
    pub(crate) fn remote(issuer: &str, url: Url, algorithms: Vec<JwsAlgorithm>) -> Self {
        IssuerKeys::Remote(RemoteKeys {
            issuer: issuer.to_owned(),
            url,
            algorithms,
            state: RwLock::new(RemoteState::default()),
            fetch_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// The key for `kid`, refreshing the set when due and refetching once (rate-limited) when the
    /// `kid` is unknown.
    pub(crate) async fn key(&self, ctx: &FetchContext<'_>, kid: &str) -> Result<Arc<VerificationKey>, KeyLookupError> {
        match self {
            IssuerKeys::Static(keys) => keys.get(kid).cloned().ok_or(KeyLookupError::UnknownKid),
            IssuerKeys::Remote(remote) => remote.key(ctx, kid, true).await,
        }
    }

    /// Whether `kid` still names the key with `fingerprint` (warm-cache check). Refreshes the set
    /// when due but never refetches for an unknown `kid`; `Ok(false)` sends the caller to the cold
    /// path.
    pub(crate) async fn still_publishes(
        &self,
        ctx: &FetchContext<'_>,
        kid: &str,
        fingerprint: &[u8; 32],
    ) -> Result<bool, KeyLookupError> {
        let key = match self {
            IssuerKeys::Static(keys) => keys.get(kid).cloned(),
            IssuerKeys::Remote(remote) => match remote.key(ctx, kid, false).await {
                Ok(key) => Some(key),
                Err(KeyLookupError::UnknownKid) => None,
                Err(KeyLookupError::IssuerUnavailable) => return Err(KeyLookupError::IssuerUnavailable),
            },
        };
        Ok(key.is_some_and(|key| key.fingerprint() == fingerprint))
    }
}

enum Lookup {
    Found(Arc<VerificationKey>),
    /// Not in a usable set; `last_failed` says whether the most recent fetch attempt failed.
    Missing {
        last_failed: bool,
    },
    /// No usable set at all (never fetched, or older than `max_key_age`).
    Unusable,
}

impl RemoteKeys {
    async fn key(
        &self,
        ctx: &FetchContext<'_>,
        kid: &str,
        refetch_unknown: bool,
    ) -> Result<Arc<VerificationKey>, KeyLookupError> {
        if self.refresh_due(ctx) {
            self.fetch(ctx).await;
        }
        let lookup = self.lookup(ctx, kid);
        let retry = match lookup {
            Lookup::Found(key) => return Ok(key),
            // No usable set: wait for a fetch in flight, or make one if the rate limit allows.
            Lookup::Unusable => true,
            // Unknown kid: the same, but only on the cold path (a rotation may have happened).
            Lookup::Missing { .. } => refetch_unknown,
        };
        if retry {
            // `fetch` waits for any fetch in flight, then fetches only if the limit allows.
            self.fetch(ctx).await;
        }
        match self.lookup(ctx, kid) {
            Lookup::Found(key) => Ok(key),
            Lookup::Unusable => Err(KeyLookupError::IssuerUnavailable),
            Lookup::Missing { last_failed: true } => Err(KeyLookupError::IssuerUnavailable),
            Lookup::Missing { last_failed: false } => Err(KeyLookupError::UnknownKid),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, RemoteState> {
        // A panic while holding the lock cannot leave RemoteState half-updated (every write is a
        // set of plain assignments), so a poisoned lock is still safe to read.
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn lookup(&self, ctx: &FetchContext<'_>, kid: &str) -> Lookup {
        let now = ctx.clock.now_unsigned_ms();
        let state = self.read();
        let usable = state.fetched_at_ms.is_some_and(|at| now < at.saturating_add(duration_ms(ctx.policy.max_key_age)));
        if !usable {
            return Lookup::Unusable;
        }
        match state.keys.get(kid) {
            Some(key) => Lookup::Found(Arc::clone(key)),
            None => Lookup::Missing { last_failed: state.last_attempt_failed },
        }
    }

    fn attempt_allowed_at(state: &RemoteState, now: u64, policy: &JwksPolicy) -> bool {
        state.last_attempt_ms.is_none_or(|at| now >= at.saturating_add(duration_ms(policy.min_refetch_interval)))
    }

    fn refresh_due(&self, ctx: &FetchContext<'_>) -> bool {
        let now = ctx.clock.now_unsigned_ms();
        let state = self.read();
        let stale =
            state.fetched_at_ms.is_none_or(|at| now >= at.saturating_add(duration_ms(ctx.policy.refresh_interval)));
        stale && Self::attempt_allowed_at(&state, now, ctx.policy)
    }

    /// One fetch attempt, unless one was made within `min_refetch_interval` (including by another
    /// task while we waited for the lock). Returns once no fetch is in flight.
    async fn fetch(&self, ctx: &FetchContext<'_>) {
        let _single_flight = self.fetch_lock.lock().await;
        let started = ctx.clock.now_unsigned_ms();
        {
            let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
            if !Self::attempt_allowed_at(&state, started, ctx.policy) {
                return;
            }
            state.last_attempt_ms = Some(started);
        }
        ctx.counters.jwks_fetch_attempt();
        let outcome = match ctx.guard {
            Some(guard) => fetch_key_set(guard, &self.url).await,
            None => Err(FetchError::NoClient),
        };
        let outcome = outcome.and_then(|value| {
            KeySet::from_json(&value, &self.algorithms, &self.issuer).map_err(|_| FetchError::NotAKeySet)
        });
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(keys) => {
                tracing::debug!(issuer = self.issuer.as_str(), keys = keys.len(), "JWKS fetched");
                state.keys = Arc::new(keys);
                state.fetched_at_ms = Some(started);
                state.last_attempt_failed = false;
            }
            Err(error) => {
                ctx.counters.jwks_fetch_failure();
                tracing::warn!(issuer = self.issuer.as_str(), url = %self.url, %error, "JWKS fetch failed");
                state.last_attempt_failed = true;
            }
        }
    }
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Why a JWKS fetch failed (logged only).
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("no HTTP client configured")]
    NoClient,
    #[error("request failed: {0}")]
    Egress(#[from] EgressError),
    #[error("unexpected HTTP status {0}")]
    Status(u16),
    #[error("response is not JSON")]
    NotJson,
    #[error("response is not a JWK Set")]
    NotAKeySet,
}

async fn fetch_key_set(guard: &EgressGuard, url: &Url) -> Result<Value, FetchError> {
    let fetched = guard.get(url, "application/jwk-set+json, application/json").await?;
    if fetched.status != 200 {
        return Err(FetchError::Status(fetched.status));
    }
    serde_json::from_slice(&fetched.body).map_err(|_| FetchError::NotJson)
}
