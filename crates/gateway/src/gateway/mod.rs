//! The gateway as an application on Palisade's server runtime: it lists every upstream, pins
//! each definition (control C6), and publishes the *approved* ones as the server's registry,
//! each relayed tool, prompt and resource forwarding to its upstream with the gateway's own
//! credential (control C7). Requests to it pass the same pipeline as any application's.
//!
//! - [`Gateway::refresh`] re-lists one upstream; `Gateway::rebuild` recomputes every pin's
//!   state from the store and publishes the resulting [`App`] (clients hear `list_changed`).
//! - [`Gateway::spawn`] runs the loops: each upstream re-listed every `[pins] relist_secs` and on
//!   its own `list_changed`; reviewers' decisions read every `decision_poll_secs`.
//! - Resource updates: the upstreams are asked for the resources the server's streams listen
//!   for, and their updates handed on under the exposed URI (`gateway/subscriptions.rs`).
//! - [`Gateway::reload`] replaces the upstreams (the [`Roster`]) with a new configuration's, as one
//!   registry published whole or not at all (`gateway/reload.rs`).
//! - Metrics per upstream and the gateway's readiness (ready while one upstream serves):
//!   `gateway/series.rs` ([`Gateway::metrics`]).
//! - A stdio upstream is listed only while its launch ([`LaunchSpec`]) is the
//!   approved one: [`Gateway::refresh`] resolves it (re-hashing the executable), records it as
//!   the upstream's `launch` pin and, unless that pin is approved, starts nothing and serves
//!   nothing of the upstream.
//!
//! **Architecture Invariant:** a definition is served only while its current digest is the
//! approved one (with a valid reviewer signature when `require_signed`), its exposed name is
//! unambiguous, the operator's policy does not deny it, and the signed kill-switch registry
//! lists it. Anything else is absent from lists and answers as unknown; the operator sees why
//! in [`Gateway::report`], the log and the audit record of the state change.

mod asks;
mod loops;
mod offers;
mod reconcile;
mod relay;
mod reload;
mod series;
mod subscriptions;

pub use reload::ReloadReport;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use palisade_base::clock::Clock;
use palisade_server::ListFreshness;
use palisade_server::metrics::Metrics;
use palisade_store::Store;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::churn::Churn;
use crate::config::{GatewaySettings, UpstreamSettings};
use crate::credentials::{CredentialConfig, UpstreamCredential};
use crate::names::Namer;
use crate::pins::DefinitionKind;
use crate::ui::UiResource;
use crate::upstream::stdio::SandboxIdentities;
use crate::upstream::{HealthReport, ListCache, UpstreamClient, UpstreamInfo};
use crate::user_oauth::UserOAuth;

/// Whether the signed kill-switch registry lists an operation key (`tools/call:<name>`).
pub type CoverageCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// An upstream's client or credential could not be built.
    #[error("upstream {upstream}: {reason}")]
    Upstream {
        /// The upstream id.
        upstream: String,
        /// What failed (never a secret).
        reason: String,
    },
    /// The pin store failed.
    #[error("pin store: {0}")]
    Store(#[from] palisade_store::StoreError),
    /// The web surface's pages cannot be built (never a secret).
    #[error("web: {0}")]
    Web(String),
    /// A reload was refused (nothing changed).
    #[error("{0}")]
    Reload(String),
}

/// One upstream as the gateway runs it.
struct Upstream {
    settings: UpstreamSettings,
    client: UpstreamClient,
    namer: Namer,
    listing: Mutex<Option<Arc<Listing>>>,
    /// Why the last listing failed (`None` after a success).
    listing_error: Mutex<Option<String>>,
    /// A stdio upstream's launch pin, as last evaluated.
    launch: Mutex<Option<PinEntry>>,
    /// The per-user OAuth client, for a `user_oauth` upstream.
    oauth: Option<Arc<UserOAuth>>,
    /// Its metrics.
    series: series::UpstreamSeries,
    /// The resources (upstream URIs) the gateway's callers listen for now, which the gateway
    /// subscribes to there (`gateway/subscriptions.rs`).
    wanted: tokio::sync::watch::Sender<BTreeSet<String>>,
    /// Its calls waiting for their callers' answers to its questions.
    parked: asks::ParkedCalls,
    /// Stops its loops (cancelled when a reload retires it, and at the gateway's shutdown).
    stop: CancellationToken,
}

/// What one listing of an upstream returned, as sent.
struct Listing {
    info: UpstreamInfo,
    tools: Vec<Value>,
    prompts: Vec<Value>,
    resources: Vec<Value>,
    templates: Vec<Value>,
    /// The UI resources its tools link to (upstream URI → what reading it found, or why it
    /// cannot be pinned), read as the listing is made.
    ui: BTreeMap<String, Result<UiResource, String>>,
    /// What the upstream said of its lists' caching, the most restrictive of them.
    cache: ListCache,
    /// When it was made (the gateway's clock, ms).
    listed_at_ms: i64,
}

impl Listing {
    /// Whether `other` lists exactly the same definitions (and instructions, UI contents and
    /// capabilities: what the gateway offers depends on them, [`offers`]).
    fn same_as(&self, other: &Listing) -> bool {
        self.info.instructions == other.info.instructions
            && self.info.capabilities == other.info.capabilities
            && self.tools == other.tools
            && self.prompts == other.prompts
            && self.resources == other.resources
            && self.templates == other.templates
            && self.ui == other.ui
    }

    /// Until when (ms) the upstream says its lists stay fresh (`None`: no bound).
    fn fresh_until_ms(&self) -> Option<i64> {
        let ttl = i64::try_from(self.cache.ttl_ms?).unwrap_or(i64::MAX);
        Some(self.listed_at_ms.saturating_add(ttl))
    }
}

/// What re-listing one upstream found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refreshed {
    /// The same definitions as the previous listing.
    Unchanged,
    /// Something differs (or it is the first listing).
    Changed,
    /// The listing failed; the previous one is kept.
    Failed,
}

impl Refreshed {
    /// `unchanged`, `changed` or `failed` (the log's spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unchanged => "unchanged",
            Self::Changed => "changed",
            Self::Failed => "failed",
        }
    }
}

/// One definition's standing, for `pins list`, `gateway status` and the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PinEntry {
    /// The pin's id.
    pub pin_id: String,
    /// The upstream's id.
    pub upstream: String,
    /// `tool`, `prompt`, …
    pub kind: &'static str,
    /// The upstream's own name (or URI).
    pub name: String,
    /// The name (or URI) clients see, when it can be exposed.
    pub exposed: Option<String>,
    /// The current digest.
    pub digest: String,
    /// Its pin state.
    pub state: &'static str,
    /// Whether clients can list and call it now.
    pub served: bool,
    /// Why it is not served, when it is not.
    pub reason: Option<String>,
}

/// One upstream's standing.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamStatus {
    /// Its id.
    pub id: String,
    /// Its URL.
    pub url: String,
    /// `2026-07-28`, the negotiated 2025 version, or `null` before the first connection.
    pub protocol: Option<String>,
    /// Health and backoff.
    pub health: HealthReport,
    /// Why its last listing failed (`None` after a success).
    pub listing_error: Option<String>,
    /// Definitions served / listed.
    pub served: usize,
    /// Definitions listed.
    pub listed: usize,
    /// A stdio upstream's launch: its pin id, digest, state and why it does not run.
    pub launch: Option<PinEntry>,
    /// A stdio upstream's running processes.
    pub processes: Option<usize>,
    /// Its per-tool rules that match no listed tool
    /// ([`crate::config::UpstreamSettings::unmatched_tool_rules`]; empty before a listing).
    pub unmatched_rules: Vec<String>,
}

/// Where the loops publish: the server and its kill-switch registry's check.
struct Attached {
    server: Arc<palisade_server::Server>,
    coverage: Option<CoverageCheck>,
}

/// The upstreams the gateway serves and the settings they come from: replaced whole by a
/// [`Gateway::reload`], read as one snapshot by each rebuild.
struct Roster {
    settings: Arc<GatewaySettings>,
    upstreams: Vec<Arc<Upstream>>,
}

struct Inner {
    /// The current roster (swapped by a reload, under `rebuilding`).
    roster: Mutex<Arc<Roster>>,
    /// The uid pool every stdio upstream shares, across reloads.
    identities: SandboxIdentities,
    /// Every upstream's `stop` is a child of this: cancelled at the gateway's shutdown.
    stopping: CancellationToken,
    /// Where the loops publish, once [`Gateway::spawn`] attached a server.
    attached: std::sync::OnceLock<Arc<Attached>>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// The loops run (on the server [`Gateway::spawn`] was given; once).
    spawned: std::sync::atomic::AtomicBool,
    /// Serializes rebuilds (and their publications).
    rebuilding: tokio::sync::Mutex<()>,
    /// A rebuild was asked for since the running one started.
    rebuild_wanted: std::sync::atomic::AtomicBool,
    /// Digests last written to the store, per pin id (only changes are written).
    observed: Mutex<HashMap<String, String>>,
    /// The last report, for status and state-change records.
    report: Mutex<Vec<PinEntry>>,
    /// A fingerprint of the decisions the last rebuild saw.
    decisions_seen: Mutex<u64>,
    /// Each upstream's definition churn, coalesced in the audit log.
    churn: Mutex<Churn>,
    /// The per-user OAuth client of the `user_oauth` upstreams.
    oauth: Option<Arc<UserOAuth>>,
    /// The recorder the gateway's series are in (the server's too, [`Gateway::metrics`]).
    metrics: Arc<Metrics>,
    /// The bound its upstreams' `ttlMs` and `cacheScope` put on what its lists say, shared
    /// with every registry it publishes.
    freshness: Arc<ListFreshness>,
}

/// The gateway: cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("upstreams", &self.roster().upstreams.len()).finish_non_exhaustive()
    }
}

impl Gateway {
    /// Builds the upstream clients and credentials (secrets are read now: a missing one is an
    /// error naming where it should come from).
    pub fn new(settings: GatewaySettings, store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Result<Self, GatewayError> {
        Self::with_user_oauth(settings, store, clock, None)
    }

    /// [`Self::new`], with the per-user OAuth client that serves the `user_oauth` upstreams
    /// (required when there is one).
    pub fn with_user_oauth(
        settings: GatewaySettings,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        oauth: Option<Arc<UserOAuth>>,
    ) -> Result<Self, GatewayError> {
        let metrics = Arc::new(Metrics::default());
        let identities = SandboxIdentities::new(settings.sandbox);
        let stopping = CancellationToken::new();
        let maker = UpstreamMaker {
            settings: &settings,
            identities: &identities,
            oauth: oauth.as_ref(),
            clock: &clock,
            metrics: &metrics,
            stopping: &stopping,
        };
        let upstreams = settings
            .upstreams
            .iter()
            .map(|upstream| maker.make(upstream).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let gateway = Self {
            inner: Arc::new(Inner {
                roster: Mutex::new(Arc::new(Roster { settings: Arc::new(settings), upstreams })),
                identities,
                stopping,
                attached: std::sync::OnceLock::new(),
                store,
                clock,
                spawned: std::sync::atomic::AtomicBool::new(false),
                rebuilding: tokio::sync::Mutex::new(()),
                rebuild_wanted: std::sync::atomic::AtomicBool::new(false),
                observed: Mutex::new(HashMap::new()),
                report: Mutex::new(Vec::new()),
                decisions_seen: Mutex::new(0),
                churn: Mutex::new(Churn::default()),
                oauth,
                metrics: metrics.clone(),
                freshness: Arc::new(ListFreshness::default()),
            }),
        };
        // The gauges are read at each scrape (the hook does not keep the gateway alive).
        let weak = Arc::downgrade(&gateway.inner);
        metrics.on_scrape(move || {
            if let Some(inner) = weak.upgrade() {
                Gateway { inner }.set_gauges();
            }
        });
        Ok(gateway)
    }

    /// The per-user OAuth client of the `user_oauth` upstreams, when there are any.
    pub fn user_oauth(&self) -> Option<&Arc<UserOAuth>> {
        self.inner.oauth.as_ref()
    }

    /// The pages of the gateway's web surface ([`crate::web`]): the connect flow of the
    /// `user_oauth` upstreams, when there are any, and the pin review page, when `[web]` has a
    /// review token (read now; at least 16 characters). Its keys derive from `secret`.
    pub fn web_routes(&self, secret: &palisade_server::secret::ServerSecret) -> Result<axum::Router, GatewayError> {
        let mut routes = axum::Router::new();
        if let Some(oauth) = &self.inner.oauth {
            routes = routes.merge(crate::user_oauth::pages::routes(oauth.clone()));
        }
        let settings = self.settings();
        let source = settings.web.as_ref().and_then(|web| web.review_token.as_ref());
        if let Some(source) = source {
            let token = source.read().map_err(|error| GatewayError::Web(error.to_string()))?;
            if token.expose().chars().count() < crate::review::MIN_TOKEN_CHARS {
                return Err(GatewayError::Web("the review token must have at least 16 characters".into()));
            }
            let review = crate::review::Review::new(
                self.inner.store.clone(),
                self.inner.clock.clone(),
                settings.pins.clone(),
                crate::findings::ToolNames::new(&settings),
                token,
                secret,
            );
            routes = routes.merge(crate::review::routes(Arc::new(review)));
        }
        Ok(routes)
    }

    /// The validated settings it runs (those of the last reload).
    pub(crate) fn settings(&self) -> Arc<GatewaySettings> {
        self.roster().settings.clone()
    }

    /// The current roster.
    fn roster(&self) -> Arc<Roster> {
        lock(&self.inner.roster).clone()
    }

    /// The store its decisions and records live in.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Its clock.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The pin report of the last build.
    pub fn report(&self) -> Vec<PinEntry> {
        lock(&self.inner.report).clone()
    }

    /// Every upstream's standing.
    pub fn status(&self) -> Vec<UpstreamStatus> {
        self.status_on(&self.roster())
    }

    /// The standing of `roster`'s upstreams.
    fn status_on(&self, roster: &Roster) -> Vec<UpstreamStatus> {
        let report = self.report();
        roster
            .upstreams
            .iter()
            .map(|upstream| {
                let id = &upstream.settings.id;
                let kind = DefinitionKind::Launch.as_str();
                let mine = report.iter().filter(|entry| &entry.upstream == id && entry.kind != kind);
                let (listed, served) = mine.fold((0, 0), |(l, s), entry| (l + 1, s + usize::from(entry.served)));
                UpstreamStatus {
                    id: id.clone(),
                    url: upstream.settings.url.to_string(),
                    protocol: upstream.client.info().map(|info| info.era.to_string()),
                    health: upstream.client.health(),
                    listing_error: lock(&upstream.listing_error).clone(),
                    served,
                    listed,
                    launch: lock(&upstream.launch).clone(),
                    processes: upstream.client.processes(),
                    unmatched_rules: lock(&upstream.listing)
                        .as_ref()
                        .map(|listing| {
                            let names = listing.tools.iter().filter_map(|tool| tool.get("name")?.as_str());
                            upstream.settings.unmatched_tool_rules(names)
                        })
                        .unwrap_or_default(),
                }
            })
            .collect()
    }
}

/// What building one upstream's client needs: shared by the start and every reload.
struct UpstreamMaker<'a> {
    settings: &'a GatewaySettings,
    identities: &'a SandboxIdentities,
    oauth: Option<&'a Arc<UserOAuth>>,
    clock: &'a Arc<dyn Clock>,
    metrics: &'a Arc<Metrics>,
    stopping: &'a CancellationToken,
}

impl UpstreamMaker<'_> {
    /// Builds one upstream's client and credential (secrets are read now: a missing one is an
    /// error naming where it should come from).
    fn make(&self, upstream: &UpstreamSettings) -> Result<Upstream, GatewayError> {
        let fail = |reason: String| GatewayError::Upstream { upstream: upstream.id.clone(), reason };
        let per_user = matches!(upstream.credential, CredentialConfig::UserOAuth { .. });
        let upstream_oauth = match (self.oauth, per_user) {
            (Some(oauth), true) if oauth.serves(&upstream.id) => Some(oauth.clone()),
            (_, true) => {
                return Err(fail(
                    "its user_oauth credential needs the gateway's web surface ([web], [web.sign_in])".into(),
                ));
            }
            (_, false) => None,
        };
        let client = if upstream.stdio.is_some() {
            UpstreamClient::stdio(upstream, self.identities.clone(), self.settings.protected_paths.clone())
        } else {
            let credential = match &upstream_oauth {
                Some(oauth) => UpstreamCredential::user_oauth(oauth.clone(), &upstream.id),
                None => UpstreamCredential::from_config(&upstream.credential, &upstream.url, self.clock.clone())
                    .map_err(|error| fail(error.to_string()))?,
            };
            UpstreamClient::new(
                &upstream.id,
                upstream.url.clone(),
                upstream.protocol,
                upstream.limits.clone(),
                Arc::new(credential),
            )
            .inspect(|client| client.relay_client_requests(&upstream.client_requests))
        }
        .map_err(|error| fail(error.to_string()))?;
        Ok(Upstream {
            namer: self.namer(upstream),
            settings: upstream.clone(),
            client,
            listing: Mutex::new(None),
            listing_error: Mutex::new(None),
            launch: Mutex::new(None),
            oauth: upstream_oauth,
            series: series::UpstreamSeries::register(self.metrics, &upstream.id),
            wanted: tokio::sync::watch::Sender::new(BTreeSet::new()),
            parked: asks::ParkedCalls::default(),
            stop: self.stopping.child_token(),
        })
    }

    /// The upstream's namer: the unprefixed upstream's keeps out of every prefixed upstream's
    /// namespace.
    fn namer(&self, upstream: &UpstreamSettings) -> Namer {
        let prefixes: Vec<String> = self.settings.upstreams.iter().filter_map(|u| u.prefix.clone()).collect();
        Namer::new(upstream.prefix.as_deref(), self.settings.separator).reserving(&prefixes)
    }

    /// `old`'s client (its connection or processes, listing and health) under `upstream`'s
    /// settings and this roster's namer: for an upstream whose rules alone changed.
    fn keep(&self, old: &Upstream, upstream: &UpstreamSettings) -> Upstream {
        Upstream {
            namer: self.namer(upstream),
            settings: upstream.clone(),
            client: old.client.clone(),
            listing: Mutex::new(lock(&old.listing).clone()),
            listing_error: Mutex::new(lock(&old.listing_error).clone()),
            launch: Mutex::new(lock(&old.launch).clone()),
            oauth: old.oauth.clone(),
            series: series::UpstreamSeries::register(self.metrics, &upstream.id),
            // Until the next routing of the callers' interest: what the old one was asked for.
            wanted: tokio::sync::watch::Sender::new(old.wanted.borrow().clone()),
            // Calls parked on the kept client stay answerable.
            parked: old.parked.clone(),
            stop: self.stopping.child_token(),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Which pins exist, by state, per upstream (for `gateway status`).
pub fn summarize(entries: &[PinEntry]) -> BTreeMap<String, BTreeMap<&'static str, usize>> {
    let mut out: BTreeMap<String, BTreeMap<&'static str, usize>> = BTreeMap::new();
    for entry in entries {
        *out.entry(entry.upstream.clone()).or_default().entry(entry.state).or_default() += 1;
    }
    out
}

/// The set of exposed operation keys the gateway serves now, for `palisade policy init`.
pub fn served_operations(entries: &[PinEntry]) -> BTreeSet<String> {
    entries
        .iter()
        .filter(|entry| entry.served)
        .filter_map(|entry| {
            let exposed = entry.exposed.as_ref()?;
            Some(match entry.kind {
                "tool" => format!("tools/call:{exposed}"),
                "prompt" => format!("prompts/get:{exposed}"),
                "resource" | "resource_template" => format!("resources/read:{exposed}"),
                _ => return None,
            })
        })
        .collect()
}
