//! The gateway as an application on Palisade's server runtime: it lists every upstream, pins
//! each definition (control C6), and publishes the *approved* ones as the server's registry,
//! each relayed tool, prompt and resource forwarding to its upstream with the gateway's own
//! credential (control C7). Requests to it pass the same pipeline as any application's.
//!
//! - [`Gateway::refresh`] re-lists one upstream; [`Gateway::rebuild`] recomputes every pin's
//!   state from the store and publishes the resulting [`App`] (clients hear `list_changed`).
//! - [`Gateway::spawn`] runs the loops: each upstream re-listed every `[pins] relist_secs` and on
//!   its own `list_changed`; reviewers' decisions read every `decision_poll_secs`.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt as _;
use palisade_base::clock::Clock;
use palisade_server::{
    App, AppBuilder, BearerToken, CallToolResult, CompletionRef, Content, GetPromptResult, InputRequired, Origin,
    Outcome, PromptDef, PromptMessage, ProtocolError, RequestContext, ResourceContents, ResourceDef,
    ResourceTemplateDef, Server, ServerEvent, TaskSupport, ToolDef, check_tool,
};
use palisade_store::{AuditRecord, Decision, PinDecision, PinObservation, PinRow, PinVerdict, Store};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::churn::{Churn, Summary, Verdict};
use crate::config::{GatewaySettings, UpstreamSettings};
use crate::credentials::{CallerContext, CredentialConfig, CredentialError, UpstreamCredential};
use crate::names::{Namer, collisions};
use crate::pins::{DecisionView, DefinitionKind, PinState, PinSubject, canonical_text, definition_digest, evaluate};
use crate::upstream::UpstreamError;
use crate::upstream::launch::LaunchSpec;
use crate::upstream::stdio::SandboxIdentities;
use crate::upstream::{HealthReport, ListKind, UpstreamClient, UpstreamInfo, UpstreamReply, UpstreamRequest};
use crate::user_oauth::{OAuthError, UserCaller, UserOAuth};

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
}

/// What one listing of an upstream returned, as sent.
struct Listing {
    info: UpstreamInfo,
    tools: Vec<Value>,
    prompts: Vec<Value>,
    resources: Vec<Value>,
    templates: Vec<Value>,
}

impl Listing {
    /// Whether `other` lists exactly the same definitions (and instructions).
    fn same_as(&self, other: &Listing) -> bool {
        self.info.instructions == other.info.instructions
            && self.tools == other.tools
            && self.prompts == other.prompts
            && self.resources == other.resources
            && self.templates == other.templates
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

struct Inner {
    settings: GatewaySettings,
    upstreams: Vec<Arc<Upstream>>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    coverage: OnceLock<CoverageCheck>,
    server: OnceLock<Arc<Server>>,
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
}

/// The gateway: cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("upstreams", &self.inner.upstreams.len()).finish_non_exhaustive()
    }
}

impl Gateway {
    /// Builds the upstream clients and credentials (secrets are read now: a missing one is an
    /// error naming where it should come from). `coverage` is the signed kill-switch registry's
    /// check, when the server runs a kill switch (or [`Self::set_coverage`] later).
    pub fn new(
        settings: GatewaySettings,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        coverage: Option<CoverageCheck>,
    ) -> Result<Self, GatewayError> {
        Self::with_user_oauth(settings, store, clock, coverage, None)
    }

    /// [`Self::new`], with the per-user OAuth client that serves the `user_oauth` upstreams
    /// (required when there is one).
    pub fn with_user_oauth(
        settings: GatewaySettings,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        coverage: Option<CoverageCheck>,
        oauth: Option<Arc<UserOAuth>>,
    ) -> Result<Self, GatewayError> {
        let coverage_cell = OnceLock::new();
        if let Some(check) = coverage {
            let _ = coverage_cell.set(check);
        }
        let mut upstreams = Vec::with_capacity(settings.upstreams.len());
        let identities = SandboxIdentities::new(settings.sandbox);
        // The unprefixed upstream's namer keeps out of every prefixed upstream's namespace.
        let prefixes: Vec<String> = settings.upstreams.iter().filter_map(|u| u.prefix.clone()).collect();
        for upstream in &settings.upstreams {
            let fail = |reason: String| GatewayError::Upstream { upstream: upstream.id.clone(), reason };
            let per_user = matches!(upstream.credential, CredentialConfig::UserOAuth { .. });
            let upstream_oauth = match (&oauth, per_user) {
                (Some(oauth), true) if oauth.serves(&upstream.id) => Some(oauth.clone()),
                (_, true) => {
                    return Err(fail(
                        "its user_oauth credential needs the gateway's web surface ([web], [web.sign_in])".into(),
                    ));
                }
                (_, false) => None,
            };
            let client = if upstream.stdio.is_some() {
                UpstreamClient::stdio(upstream, identities.clone(), settings.protected_paths.clone())
            } else {
                let credential = match &upstream_oauth {
                    Some(oauth) => UpstreamCredential::user_oauth(oauth.clone(), &upstream.id),
                    None => UpstreamCredential::from_config(&upstream.credential, &upstream.url, clock.clone())
                        .map_err(|error| fail(error.to_string()))?,
                };
                UpstreamClient::new(
                    &upstream.id,
                    upstream.url.clone(),
                    upstream.protocol,
                    upstream.limits.clone(),
                    Arc::new(credential),
                )
            }
            .map_err(|error| fail(error.to_string()))?;
            upstreams.push(Arc::new(Upstream {
                namer: Namer::new(upstream.prefix.as_deref(), settings.separator).reserving(&prefixes),
                settings: upstream.clone(),
                client,
                listing: Mutex::new(None),
                listing_error: Mutex::new(None),
                launch: Mutex::new(None),
                oauth: upstream_oauth,
            }));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                settings,
                upstreams,
                store,
                clock,
                coverage: coverage_cell,
                server: OnceLock::new(),
                rebuilding: tokio::sync::Mutex::new(()),
                rebuild_wanted: std::sync::atomic::AtomicBool::new(false),
                observed: Mutex::new(HashMap::new()),
                report: Mutex::new(Vec::new()),
                decisions_seen: Mutex::new(0),
                churn: Mutex::new(Churn::default()),
                oauth,
            }),
        })
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
        let source = self.inner.settings.web.as_ref().and_then(|web| web.review_token.as_ref());
        if let Some(source) = source {
            let token = source.read().map_err(|error| GatewayError::Web(error.to_string()))?;
            if token.expose().chars().count() < crate::review::MIN_TOKEN_CHARS {
                return Err(GatewayError::Web("the review token must have at least 16 characters".into()));
            }
            let review = crate::review::Review::new(
                self.inner.store.clone(),
                self.inner.clock.clone(),
                self.inner.settings.pins.clone(),
                crate::findings::ToolNames::new(&self.inner.settings),
                token,
                secret,
            );
            routes = routes.merge(crate::review::routes(Arc::new(review)));
        }
        Ok(routes)
    }

    /// Sets the signed kill-switch registry's check (once; the kill switch starts after the
    /// gateway's first listing, whose operations it must cover).
    pub fn set_coverage(&self, check: CoverageCheck) {
        if self.inner.coverage.set(check).is_err() {
            tracing::warn!("the gateway's kill-switch coverage was already set");
        }
    }

    /// Lists every upstream once (connecting first); an upstream that fails keeps its previous
    /// listing (or none) and is reported, never failing the others.
    pub async fn refresh_all(&self) {
        let refreshes = (0..self.inner.upstreams.len()).map(|index| self.refresh(index));
        futures::future::join_all(refreshes).await;
    }

    /// Re-lists upstream `index` (its definitions are not re-pinned until a rebuild).
    pub async fn refresh(&self, index: usize) -> Refreshed {
        let Some(upstream) = self.inner.upstreams.get(index) else { return Refreshed::Failed };
        if let Err(reason) = self.gate_launch(upstream).await {
            let had = lock(&upstream.listing).take().is_some();
            let repeated = lock(&upstream.listing_error).replace(reason.clone()).as_ref() == Some(&reason);
            if !repeated {
                tracing::warn!(upstream = %upstream.settings.id, %reason,
                    "stdio upstream not started (`palisade upstreams show {}` shows its launch)", upstream.settings.id);
            }
            return if had { Refreshed::Changed } else { Refreshed::Failed };
        }
        match list_upstream(upstream).await {
            Ok(listing) => {
                let mut current = lock(&upstream.listing);
                let changed = current.as_deref().is_none_or(|old| !old.same_as(&listing));
                *current = Some(Arc::new(listing));
                *lock(&upstream.listing_error) = None;
                if changed { Refreshed::Changed } else { Refreshed::Unchanged }
            }
            Err(error) => {
                *lock(&upstream.listing_error) = Some(error.to_string());
                tracing::warn!(upstream = %upstream.settings.id, %error, "upstream listing failed; keeping the previous one");
                Refreshed::Failed
            }
        }
    }

    /// A stdio upstream's launch, resolved now (the executable re-hashed), recorded as its
    /// `launch` pin and evaluated: `Ok` when it is the approved one (the client may start
    /// processes), else why not (every process is stopped). HTTP upstreams: `Ok`.
    async fn gate_launch(&self, upstream: &Upstream) -> Result<(), String> {
        let settings = upstream.settings.clone();
        let resolved = tokio::task::spawn_blocking(move || {
            let path = settings.stdio.as_ref().and_then(|stdio| stdio.search_path.clone());
            LaunchSpec::resolve(&settings, path.as_deref())
        })
        .await
        .map_err(|_| "the launch could not be resolved".to_owned())?;
        let spec = match resolved {
            None => return Ok(()),
            Some(Ok(spec)) => spec,
            Some(Err(error)) => {
                upstream.client.set_launch_approved(None).await;
                *lock(&upstream.launch) = None;
                return Err(format!("its launch cannot be resolved: {error}"));
            }
        };
        let subject = spec.subject();
        let pin_id = subject.pin_id();
        let observation = match spec.observation(self.inner.clock.now_ms()) {
            Ok(observation) => observation,
            Err(error) => {
                upstream.client.set_launch_approved(None).await;
                return Err(error.to_string());
            }
        };
        let digest = observation.digest.clone();
        let stored = async {
            if lock(&self.inner.observed).get(&pin_id) != Some(&digest) {
                self.inner.store.observe_pins(vec![observation]).await?;
                lock(&self.inner.observed).insert(pin_id.clone(), digest.clone());
            }
            self.inner.store.pin(&pin_id).await
        };
        let row = match stored.await {
            Ok(row) => row,
            Err(error) => {
                // The store cannot confirm an approval: fail closed.
                upstream.client.set_launch_approved(None).await;
                return Err(format!("its launch approval cannot be read: {error}"));
            }
        };
        let decision = self.decision_view(&subject, row.as_ref());
        let state = evaluate(&digest, decision, self.inner.settings.pins.require_signed);
        let reason = match state {
            PinState::Approved => None,
            PinState::Held => Some("its launch changed after it was approved: review it again".to_owned()),
            PinState::Rejected => Some("its launch was rejected by a reviewer".to_owned()),
            PinState::Pending => Some("its launch was never approved".to_owned()),
        };
        *lock(&upstream.launch) = Some(PinEntry {
            pin_id,
            upstream: upstream.settings.id.clone(),
            kind: DefinitionKind::Launch.as_str(),
            name: String::new(),
            exposed: None,
            digest: digest.clone(),
            state: state.as_str(),
            served: reason.is_none(),
            reason: reason.clone(),
        });
        match reason {
            None => {
                upstream.client.set_launch_approved(Some(digest)).await;
                Ok(())
            }
            Some(reason) => {
                upstream.client.set_launch_approved(None).await;
                Err(reason)
            }
        }
    }

    /// A pin's latest decision as [`evaluate`] reads it (its signature checked).
    fn decision_view<'a>(&self, subject: &PinSubject, row: Option<&'a PinRow>) -> Option<DecisionView<'a>> {
        let reviewers = &self.inner.settings.pins.reviewers;
        row.and_then(|row| row.decision.as_ref()).map(|decision| DecisionView {
            approved: decision.verdict == PinVerdict::Approved,
            digest: &decision.digest,
            signature_valid: decision
                .signature
                .as_deref()
                .is_some_and(|signature| reviewers.verify(&decision.reviewer, subject, &decision.digest, signature)),
        })
    }

    /// Re-lists upstream `index` and, when what it lists changed, rebuilds the registry: an
    /// upstream listing the same definitions as before costs one listing and nothing else.
    pub async fn relist(&self, index: usize) -> Refreshed {
        let started = std::time::Instant::now();
        let outcome = self.refresh(index).await;
        if outcome == Refreshed::Changed {
            self.rebuild().await;
        }
        if let Some(upstream) = self.inner.upstreams.get(index) {
            tracing::debug!(upstream = %upstream.settings.id, ?outcome, elapsed_ms = started.elapsed().as_millis() as u64, "re-listed");
        }
        outcome
    }

    /// Computes every pin's state (writing changed definitions to the store first) and the
    /// application of everything that may be served.
    pub async fn build_app(&self) -> Result<App, GatewayError> {
        let definitions = self.collect();
        self.observe(&definitions).await?;
        let rows = self.inner.store.pins(None).await?;
        *lock(&self.inner.decisions_seen) = fingerprint(rows.iter().filter_map(|row| row.decision.as_ref()));
        let rows: HashMap<&str, &PinRow> = rows.iter().map(|row| (row.observation.pin_id.as_str(), row)).collect();
        let mut entries = Vec::with_capacity(definitions.len());
        for definition in &definitions {
            let row = rows.get(definition.pin_id.as_str()).copied();
            entries.push(self.entry(definition, row));
        }
        self.hold_ambiguous(&definitions, &mut entries);
        let (app, mut entries) = self.assemble(&definitions, entries)?;
        entries.extend(self.inner.upstreams.iter().filter_map(|upstream| lock(&upstream.launch).clone()));
        self.record_transitions(&entries).await;
        *lock(&self.inner.report) = entries;
        Ok(app)
    }

    /// [`Self::build_app`] and publishes it on the attached server (without one: builds only).
    /// Requests that arrive while a rebuild runs are merged into one more rebuild after it, so N
    /// upstreams changing at once cost two rebuilds, not N.
    pub async fn rebuild(&self) {
        use std::sync::atomic::Ordering;
        self.inner.rebuild_wanted.store(true, Ordering::SeqCst);
        loop {
            let Ok(one) = self.inner.rebuilding.try_lock() else { return };
            while self.inner.rebuild_wanted.swap(false, Ordering::SeqCst) {
                self.rebuild_once().await;
            }
            drop(one);
            // A request that came between the last swap and the unlock is not lost.
            if !self.inner.rebuild_wanted.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    async fn rebuild_once(&self) {
        match self.build_app().await {
            Ok(app) => {
                if let Some(server) = self.inner.server.get()
                    && let Err(error) = server.publish(app)
                {
                    tracing::error!(%error, "the gateway's new registry was refused; the previous one keeps serving");
                }
            }
            Err(error) => {
                tracing::error!(%error, "pin states could not be computed; the previous registry keeps serving")
            }
        }
    }

    /// The pin report of the last build.
    pub fn report(&self) -> Vec<PinEntry> {
        lock(&self.inner.report).clone()
    }

    /// Every upstream's standing.
    pub fn status(&self) -> Vec<UpstreamStatus> {
        let report = self.report();
        self.inner
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

    /// Attaches the server whose registry the gateway publishes and starts its loops; they stop
    /// when `shutdown` is cancelled.
    pub fn spawn(&self, server: Arc<Server>, shutdown: CancellationToken) {
        if self.inner.server.set(server).is_err() {
            tracing::warn!("the gateway is already attached to a server");
            return;
        }
        for index in 0..self.inner.upstreams.len() {
            let gateway = self.clone();
            let stop = shutdown.clone();
            tokio::spawn(async move { gateway.relist_loop(index, stop).await });
            let gateway = self.clone();
            let stop = shutdown.clone();
            tokio::spawn(async move { gateway.changes_loop(index, stop).await });
            if self.inner.upstreams[index].settings.stdio.is_some() {
                let gateway = self.clone();
                let stop = shutdown.clone();
                tokio::spawn(async move { gateway.launch_loop(index, stop).await });
            }
        }
        let gateway = self.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move { gateway.decisions_loop(stop).await });
        let gateway = self.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move { gateway.churn_loop(stop).await });
        if let (Some(oauth), Some(server)) = (&self.inner.oauth, self.inner.server.get()) {
            oauth.spawn_upkeep(server.events(), shutdown.clone());
        }
        let upstreams = self.inner.upstreams.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            for upstream in upstreams {
                upstream.client.shutdown().await;
            }
        });
    }

    async fn relist_loop(&self, index: usize, stop: CancellationToken) {
        let every = self.inner.settings.pins.relist;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            self.relist(index).await;
        }
    }

    /// A stdio upstream whose launch changed since its approval (noticed at a process start) is
    /// re-listed at once: the changed launch is recorded and held, and its tools withdrawn, without
    /// waiting for the next relisting.
    async fn launch_loop(&self, index: usize, stop: CancellationToken) {
        let Some(upstream) = self.inner.upstreams.get(index).cloned() else { return };
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = upstream.client.launch_changed() => {}
            }
            tracing::info!(upstream = %upstream.settings.id, "stdio upstream launch changed: re-listing");
            if self.relist(index).await == Refreshed::Changed {
                self.announce("notifications/tools/list_changed");
            }
        }
    }

    /// Follows one upstream's change notifications: each is a re-listing (and pin check)
    /// before any client hears of a change.
    async fn changes_loop(&self, index: usize, stop: CancellationToken) {
        let Some(upstream) = self.inner.upstreams.get(index).cloned() else { return };
        let mut backoff = Duration::from_secs(1);
        loop {
            match upstream.client.changes().await {
                Ok(stream) => {
                    backoff = Duration::from_secs(1);
                    let mut stream = std::pin::pin!(stream);
                    loop {
                        tokio::select! {
                            () = stop.cancelled() => return,
                            next = stream.next() => match next {
                                Some(method) => {
                                    tracing::info!(upstream = %upstream.settings.id, %method, "upstream list changed: re-listing");
                                    self.relist(index).await;
                                    self.announce(&method);
                                }
                                None => break,
                            }
                        }
                    }
                }
                Err(error) => tracing::debug!(upstream = %upstream.settings.id, %error, "change stream unavailable"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(60));
        }
    }

    /// Passes an upstream's change announcement on to the gateway's clients once the re-listing
    /// (and its pin check) is done: what they list then is what the gateway serves, whether or
    /// not the change made a definition served.
    fn announce(&self, method: &str) {
        let Some(server) = self.inner.server.get() else { return };
        let event = match method {
            "notifications/tools/list_changed" => ServerEvent::ToolsListChanged,
            "notifications/prompts/list_changed" => ServerEvent::PromptsListChanged,
            "notifications/resources/list_changed" => ServerEvent::ResourcesListChanged,
            _ => return,
        };
        server.events().publish(event);
    }

    /// Writes the churn summaries whose window has elapsed, four times a window (so one is written
    /// at most a quarter window late).
    async fn churn_loop(&self, stop: CancellationToken) {
        let every = Duration::from_millis(crate::churn::WINDOW_MS / 4);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let due = lock(&self.inner.churn).due(self.inner.clock.now_unsigned_ms(), false);
            self.write_churn(due).await;
        }
    }

    /// Writes every churn count not yet on the record, whether or not its window has elapsed:
    /// for the gateway's shutdown, after its listener stopped.
    pub async fn flush_churn(&self) {
        let due = lock(&self.inner.churn).due(self.inner.clock.now_unsigned_ms(), true);
        self.write_churn(due).await;
    }

    async fn write_churn(&self, summaries: Vec<Summary>) {
        if summaries.is_empty() {
            return;
        }
        let now = self.inner.clock.now_unsigned_ms();
        let records = summaries.iter().map(|summary| churn_record(summary, now)).collect();
        if let Err(error) = self.inner.store.append_batch(records).await {
            tracing::error!(%error, "pin churn counts could not be audited");
        }
    }

    /// Reviewers decide from the CLI, in another process: their decisions reach the registry
    /// within one poll.
    async fn decisions_loop(&self, stop: CancellationToken) {
        let every = self.inner.settings.pins.decision_poll;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            match self.inner.store.pin_decisions().await {
                Ok(decisions) => {
                    let seen = *lock(&self.inner.decisions_seen);
                    if fingerprint(decisions.iter()) != seen {
                        // A launch decision starts (or stops) a stdio upstream: re-list those.
                        for (index, upstream) in self.inner.upstreams.iter().enumerate() {
                            if upstream.settings.stdio.is_some() {
                                self.refresh(index).await;
                            }
                        }
                        self.rebuild().await;
                    }
                }
                Err(error) => tracing::warn!(%error, "pin decisions could not be read"),
            }
        }
    }

    /// Every definition every upstream last listed, with its pin identity and digest.
    fn collect(&self) -> Vec<Definition> {
        let mut out = Vec::new();
        for (index, upstream) in self.inner.upstreams.iter().enumerate() {
            let Some(listing) = lock(&upstream.listing).clone() else { continue };
            let mut push = |kind: DefinitionKind, name: Option<&str>, raw: &Value| {
                out.push(Definition::new(index, upstream, kind, name, raw));
            };
            for tool in &listing.tools {
                push(DefinitionKind::Tool, tool.get("name").and_then(Value::as_str), tool);
            }
            for prompt in &listing.prompts {
                push(DefinitionKind::Prompt, prompt.get("name").and_then(Value::as_str), prompt);
            }
            for resource in &listing.resources {
                push(DefinitionKind::Resource, resource.get("uri").and_then(Value::as_str), resource);
            }
            for template in &listing.templates {
                push(DefinitionKind::ResourceTemplate, template.get("uriTemplate").and_then(Value::as_str), template);
            }
            if let Some(instructions) = &listing.info.instructions {
                push(DefinitionKind::Instructions, Some(""), &json!(instructions));
            }
        }
        // A name an upstream lists twice has two definitions for one pin: neither is served
        // (and neither is written, so the store's batch stays valid for everyone else).
        let mut seen: HashMap<String, usize> = HashMap::new();
        for definition in &out {
            *seen.entry(definition.pin_id.clone()).or_default() += 1;
        }
        for definition in &mut out {
            if seen.get(&definition.pin_id).is_some_and(|count| *count > 1) {
                definition.digest =
                    Err(format!("the upstream lists this {} more than once", definition.subject.kind.as_str()));
            }
        }
        out
    }

    /// Writes definitions whose digest changed since the last write.
    async fn observe(&self, definitions: &[Definition]) -> Result<(), GatewayError> {
        let now = self.inner.clock.now_ms();
        let changed: Vec<PinObservation> = {
            let observed = lock(&self.inner.observed);
            definitions
                .iter()
                .filter_map(|d| {
                    let (digest, _) = d.digest.as_ref().ok()?;
                    (observed.get(&d.pin_id) != Some(digest)).then(|| d.observation(now)).flatten()
                })
                .collect()
        };
        if changed.is_empty() {
            return Ok(());
        }
        let written: Vec<(String, String)> = changed.iter().map(|o| (o.pin_id.clone(), o.digest.clone())).collect();
        self.inner.store.observe_pins(changed).await?;
        lock(&self.inner.observed).extend(written);
        Ok(())
    }

    /// One definition's pin state and whether policy lets it be served.
    fn entry(&self, definition: &Definition, row: Option<&PinRow>) -> PinEntry {
        let pins = &self.inner.settings.pins;
        let upstream = &self.inner.upstreams[definition.upstream];
        let mut entry = PinEntry {
            pin_id: definition.pin_id.clone(),
            upstream: upstream.settings.id.clone(),
            kind: definition.subject.kind.as_str(),
            name: definition.subject.name.clone(),
            exposed: None,
            digest: String::new(),
            state: PinState::Pending.as_str(),
            served: false,
            reason: None,
        };
        let (digest, _) = match &definition.digest {
            Ok(pair) => pair,
            Err(reason) => {
                entry.state = PinState::Held.as_str();
                entry.reason = Some(reason.clone());
                return entry;
            }
        };
        entry.digest = digest.clone();
        let decision = self.decision_view(&definition.subject, row);
        let state = evaluate(digest, decision, pins.require_signed);
        entry.state = state.as_str();
        match definition.expose(upstream) {
            Ok(exposed) => entry.exposed = Some(exposed),
            Err(reason) => {
                entry.reason = Some(reason);
                return entry;
            }
        }
        if definition.subject.kind == DefinitionKind::Tool && upstream.settings.deny.contains(&definition.subject.name)
        {
            entry.reason = Some("denied by the operator's policy (deny)".into());
            return entry;
        }
        if state != PinState::Approved {
            entry.reason = Some(match state {
                PinState::Held => "its definition changed after it was approved: review it again".into(),
                PinState::Rejected => "rejected by a reviewer".into(),
                _ if pins.require_signed && decision.is_some_and(|d| d.approved) => {
                    "approved without a valid reviewer signature".into()
                }
                _ => "never reviewed".into(),
            });
            return entry;
        }
        entry.served = true;
        entry
    }

    /// Exposed names claimed twice among the definitions that could be served are held: none of
    /// them is served, each with its reason. Only servable definitions (approved, exposable, not
    /// denied) claim a name: one no reviewer approved never withdraws another upstream's. An
    /// unprefixed name or URI inside another upstream's namespace never gets this far: its
    /// namer refuses to expose it ([`Namer::reserving`]), so it is held, alone, before any
    /// name is counted.
    fn hold_ambiguous(&self, definitions: &[Definition], entries: &mut [PinEntry]) {
        // Instructions have no name: each upstream's are its own section, never a collision.
        let key = |d: &Definition, e: &PinEntry| {
            (e.served && d.subject.kind != DefinitionKind::Instructions)
                .then(|| e.exposed.as_ref().map(|name| format!("{}\u{1f}{name}", d.subject.kind.namespace())))
                .flatten()
        };
        let claimed: Vec<String> = definitions.iter().zip(entries.iter()).filter_map(|(d, e)| key(d, e)).collect();
        let twice = collisions(claimed.iter().map(String::as_str));
        for (definition, entry) in definitions.iter().zip(entries.iter_mut()) {
            let Some(claim) = key(definition, entry) else { continue };
            if twice.contains(&claim) {
                let exposed = entry.exposed.as_deref().unwrap_or_default();
                entry.served = false;
                entry.reason =
                    Some(format!("exposed name {exposed:?} is claimed by more than one approved definition"));
            }
        }
    }

    /// The application of every served definition. A definition the registry refuses (its
    /// schema does not compile, …) or the signed kill-switch registry does not list is held
    /// alone, with its reason.
    fn assemble(
        &self,
        definitions: &[Definition],
        mut entries: Vec<PinEntry>,
    ) -> Result<(App, Vec<PinEntry>), GatewayError> {
        let (mut tools, mut prompts, mut resources, mut templates) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut completion_prompts, mut completion_templates) = (BTreeMap::new(), BTreeMap::new());
        let mut instructions = Vec::new();
        let covered = |key: &str| self.inner.coverage.get().is_none_or(|check| check(key));
        for (definition, entry) in definitions.iter().zip(entries.iter_mut()) {
            if !entry.served {
                continue;
            }
            let upstream = &self.inner.upstreams[definition.upstream];
            let exposed = entry.exposed.clone().unwrap_or_default();
            let origin = Origin {
                upstream: upstream.settings.id.clone(),
                audit_detail: format!(
                    "upstream={} exposed={} upstream_name={} pin={}",
                    upstream.settings.id,
                    exposed,
                    definition.subject.name,
                    &entry.digest[..12.min(entry.digest.len())]
                ),
            };
            let (list_key, operation_key) = match definition.subject.kind {
                DefinitionKind::Tool => ("tools/list", format!("tools/call:{exposed}")),
                DefinitionKind::Prompt => ("prompts/list", format!("prompts/get:{exposed}")),
                DefinitionKind::Resource | DefinitionKind::ResourceTemplate => {
                    ("resources/list", format!("resources/read:{exposed}"))
                }
                // Launches are never listed definitions (they gate the listing itself).
                DefinitionKind::Instructions | DefinitionKind::Launch => ("", String::new()),
            };
            if definition.subject.kind != DefinitionKind::Instructions
                && !(covered(&operation_key) && covered(list_key))
            {
                entry.served = false;
                entry.reason = Some(format!("the signed kill-switch registry does not list {operation_key}"));
                continue;
            }
            let Some(raw) = definition.raw.as_object() else {
                if let Value::String(text) = &definition.raw {
                    instructions.push(format!("[{}] {text}", upstream.settings.id));
                }
                continue;
            };
            let raw = raw.clone();
            match definition.subject.kind {
                DefinitionKind::Tool => match relayed_tool(upstream, &exposed, &definition.subject.name, raw, origin) {
                    Ok(tool) => tools.push(tool),
                    Err(reason) => {
                        entry.served = false;
                        entry.reason = Some(reason);
                    }
                },
                DefinitionKind::Prompt => {
                    completion_prompts.insert(exposed.clone(), (definition.upstream, definition.subject.name.clone()));
                    prompts.push(relayed_prompt(upstream, &exposed, &definition.subject.name, raw, origin));
                }
                DefinitionKind::Resource => resources.push(relayed_resource(upstream, &exposed, raw, origin)),
                DefinitionKind::ResourceTemplate => {
                    completion_templates
                        .insert(exposed.clone(), (definition.upstream, definition.subject.name.clone()));
                    templates.push(relayed_template(upstream, &exposed, raw, origin));
                }
                DefinitionKind::Instructions | DefinitionKind::Launch => {}
            }
        }
        let mut builder = App::builder("palisade-gateway", env!("CARGO_PKG_VERSION")).dynamic();
        let routes = Arc::new(CompletionRoutes {
            upstreams: self.inner.upstreams.clone(),
            prompts: completion_prompts,
            templates: completion_templates,
        });
        if !routes.is_empty() {
            builder = builder.relayed_completion(move |ctx, reference, params| {
                let routes = routes.clone();
                async move { routes.complete(&ctx, reference, params).await }
            });
        }
        builder = tools.into_iter().fold(builder, AppBuilder::tool);
        builder = prompts.into_iter().fold(builder, AppBuilder::prompt);
        builder = resources.into_iter().fold(builder, AppBuilder::resource);
        builder = templates.into_iter().fold(builder, AppBuilder::resource_template);
        if !instructions.is_empty() {
            builder = builder.instructions(instructions.join("\n\n"));
        }
        let app = builder
            .build()
            .map_err(|error| GatewayError::Upstream { upstream: "*".into(), reason: error.to_string() })?;
        Ok((app, entries))
    }

    /// Logs and audits every pin whose standing changed since the last build (a new definition,
    /// a hold, an approval taking effect, a rejection). An upstream's own changes (new or changed
    /// definitions, and what they do to the served flag) are coalesced while it churns
    /// ([`crate::churn`]); a reviewer's decision taking effect is always recorded, and closes its
    /// upstream's coalescing window.
    async fn record_transitions(&self, entries: &[PinEntry]) {
        let before: HashMap<String, (&'static str, String, bool)> = lock(&self.inner.report)
            .iter()
            .map(|entry| (entry.pin_id.clone(), (entry.state, entry.digest.clone(), entry.served)))
            .collect();
        let now = self.inner.clock.now_unsigned_ms();
        // Per upstream: (coalescible changes, whether one is a listed definition).
        let mut own: BTreeMap<&str, (Vec<&PinEntry>, bool)> = BTreeMap::new();
        let mut changed = Vec::new();
        for entry in entries {
            let previous = before.get(&entry.pin_id);
            match previous {
                Some((state, digest, served))
                    if *state == entry.state && *digest == entry.digest && *served == entry.served => {}
                // The same definition in another state: a reviewer decided.
                Some((state, digest, _)) if *digest == entry.digest && *state != entry.state => changed.push(entry),
                _ => {
                    let (list, definitions) = own.entry(entry.upstream.as_str()).or_default();
                    list.push(entry);
                    *definitions |= entry.kind != DefinitionKind::Launch.as_str();
                }
            }
        }
        let mut records = Vec::new();
        {
            let mut churn = lock(&self.inner.churn);
            // A decision took effect: its upstream's next change is recorded in full again.
            let decided: BTreeSet<&str> = changed.iter().map(|entry| entry.upstream.as_str()).collect();
            for upstream in decided {
                records.extend(churn.reset(upstream).map(|summary| churn_record(&summary, now)));
            }
            for (upstream, (list, definitions)) in own {
                let count = list.len() as u64;
                match churn.observe(upstream, count, definitions, now) {
                    Verdict::Record => changed.extend(list),
                    Verdict::Coalesce { started } => {
                        if started {
                            tracing::warn!(%upstream, window_secs = crate::churn::WINDOW_MS / 1000,
                                "upstream changes its definitions again and again: its changes are counted, \
                                 and audited as one record per window");
                        }
                        for entry in list {
                            tracing::debug!(pin = %entry.pin_id, %upstream, name = %entry.name, state = entry.state,
                                served = entry.served, "definition changed again (coalesced)");
                        }
                    }
                    Verdict::Summarize(summary) => records.push(churn_record(&summary, now)),
                }
            }
            records.extend(churn.due(now, false).iter().map(|summary| churn_record(summary, now)));
        }
        for entry in changed {
            let digest = &entry.digest[..12.min(entry.digest.len())];
            let was_served = before.get(&entry.pin_id).is_some_and(|(_, _, served)| *served);
            let reason = entry.reason.as_deref().unwrap_or("");
            if entry.served {
                tracing::info!(pin = %entry.pin_id, upstream = %entry.upstream, name = %entry.name, "definition served");
            } else if was_served || entry.state == PinState::Held.as_str() {
                // A served definition withdrawn (a rug pull, a rejection, a new collision).
                tracing::warn!(pin = %entry.pin_id, upstream = %entry.upstream, name = %entry.name, state = entry.state,
                    reason, "definition withdrawn: not served");
            } else {
                tracing::debug!(pin = %entry.pin_id, upstream = %entry.upstream, name = %entry.name, state = entry.state,
                    reason, "definition not served");
            }
            records.push(AuditRecord {
                at_ms: now,
                trace_id: palisade_server::audit::fresh_trace_id(),
                stage: "pins".into(),
                decision: if entry.served { Decision::Allow } else { Decision::Deny },
                operation: format!("pins/{}:{}", entry.kind, entry.exposed.as_deref().unwrap_or(&entry.name)),
                principal_digest: None,
                tenant_digest: None,
                client_digest: None,
                scopes: Vec::new(),
                policy_version: Some(format!("pin:{digest}")),
                code: None,
                detail: Some(format!(
                    "upstream={} pin_id={} upstream_name={} state={} served={}",
                    entry.upstream, entry.pin_id, entry.name, entry.state, entry.served
                )),
            });
        }
        let withheld = entries.iter().filter(|entry| !entry.served).count();
        if !records.is_empty() && withheld > 0 {
            tracing::info!(withheld, "definitions not served (`palisade pins list` shows why)");
        }
        if !records.is_empty()
            && let Err(error) = self.inner.store.append_batch(records).await
        {
            tracing::error!(%error, "pin state changes could not be audited");
        }
    }
}

/// The audit record of one upstream's coalesced churn: `pins/churn:<upstream>`, with the count.
fn churn_record(summary: &Summary, now_ms: u64) -> AuditRecord {
    AuditRecord {
        at_ms: now_ms,
        trace_id: palisade_server::audit::fresh_trace_id(),
        stage: "pins".into(),
        decision: Decision::Deny,
        operation: format!("pins/churn:{}", summary.upstream),
        principal_digest: None,
        tenant_digest: None,
        client_digest: None,
        scopes: Vec::new(),
        policy_version: None,
        code: None,
        detail: Some(format!(
            "upstream={} coalesced={} since_ms={} window_secs={}",
            summary.upstream,
            summary.coalesced,
            summary.since_ms,
            crate::churn::WINDOW_MS / 1000
        )),
    }
}

/// One definition as listed, with its identity and digest.
struct Definition {
    upstream: usize,
    subject: PinSubject,
    pin_id: String,
    raw: Value,
    /// (digest, canonical text), or why it cannot be pinned.
    digest: Result<(String, String), String>,
}

impl Definition {
    fn new(upstream: usize, settings: &Upstream, kind: DefinitionKind, name: Option<&str>, raw: &Value) -> Self {
        let subject = PinSubject {
            upstream_id: settings.settings.id.clone(),
            upstream_url: settings.settings.url.to_string(),
            kind,
            name: name.unwrap_or("").to_owned(),
        };
        let digest = if name.is_none() {
            Err(format!("the {} has no name", kind.as_str()))
        } else if matches!(kind, DefinitionKind::Tool | DefinitionKind::Prompt)
            && !name.is_some_and(crate::names::is_spec_name)
        {
            // Held before it is stored: never served, never offered for review, and a name
            // with terminal escapes or invisible characters never reaches a table.
            Err(format!(
                "the {}'s name is not a valid MCP name (1 to 128 characters of A-Z a-z 0-9 _ - .): held, never served",
                kind.as_str()
            ))
        } else {
            match (definition_digest(raw), canonical_text(raw)) {
                (Ok(digest), Ok(text)) => Ok((digest, text)),
                (Err(error), _) | (_, Err(error)) => Err(format!("the definition cannot be pinned: {error}")),
            }
        };
        let mut definition = Self { upstream, pin_id: subject.pin_id(), subject, raw: raw.clone(), digest };
        // What the store would refuse (an over-long name, a definition over 1 MiB) is held here,
        // alone, instead of failing the batch of every other definition.
        if let Some(Err(error)) = definition.observation(0).map(|observation| observation.validate()) {
            definition.digest = Err(format!("the definition cannot be stored: {error}"));
        }
        definition
    }

    /// What the store keeps of it (`None` when it cannot be pinned).
    fn observation(&self, now_ms: i64) -> Option<PinObservation> {
        let (digest, text) = self.digest.as_ref().ok()?;
        Some(PinObservation {
            pin_id: self.pin_id.clone(),
            upstream_id: self.subject.upstream_id.clone(),
            upstream_url: self.subject.upstream_url.clone(),
            kind: self.subject.kind.as_str().to_owned(),
            name: self.subject.name.clone(),
            digest: digest.clone(),
            definition: text.clone(),
            seen_at_ms: now_ms,
        })
    }

    /// The exposed name or URI, or why there is none.
    fn expose(&self, upstream: &Upstream) -> Result<String, String> {
        let name = &self.subject.name;
        match self.subject.kind {
            DefinitionKind::Tool | DefinitionKind::Prompt => {
                upstream.namer.expose_name(name).map_err(|e| e.to_string())
            }
            DefinitionKind::Resource | DefinitionKind::ResourceTemplate => {
                upstream.namer.expose_uri(name).map_err(|e| e.to_string())
            }
            DefinitionKind::Instructions | DefinitionKind::Launch => Ok(String::new()),
        }
    }
}

impl DefinitionKind {
    /// Names of tools, prompts and resources live in separate namespaces.
    fn namespace(self) -> &'static str {
        match self {
            DefinitionKind::Tool => "tool",
            DefinitionKind::Prompt => "prompt",
            DefinitionKind::Resource | DefinitionKind::ResourceTemplate => "resource",
            DefinitionKind::Instructions => "instructions",
            DefinitionKind::Launch => "launch",
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A fingerprint of a set of decisions (pin, digest, verdict, reviewer, signature), whatever
/// their order.
fn fingerprint<'a>(decisions: impl Iterator<Item = &'a PinDecision>) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut keyed: Vec<&PinDecision> = decisions.collect();
    keyed.sort_by(|a, b| a.pin_id.cmp(&b.pin_id));
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for decision in keyed {
        (&decision.pin_id, &decision.digest, decision.verdict.as_str(), &decision.reviewer, &decision.signature)
            .hash(&mut hasher);
    }
    hasher.finish()
}

async fn list_upstream(upstream: &Upstream) -> Result<Listing, crate::upstream::UpstreamError> {
    let info = match upstream.client.info() {
        Some(info) => info,
        None => upstream.client.connect().await?,
    };
    let has = |capability: &str| info.capabilities.get(capability).is_some();
    let tools = if has("tools") { upstream.client.list(ListKind::Tools).await? } else { Vec::new() };
    let prompts = if has("prompts") { upstream.client.list(ListKind::Prompts).await? } else { Vec::new() };
    let (resources, templates) = if has("resources") {
        (upstream.client.list(ListKind::Resources).await?, upstream.client.list(ListKind::ResourceTemplates).await?)
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(Listing { info, tools, prompts, resources, templates })
}

/// Scopes as the registry's builders take them.
fn scope_refs(scopes: &[String]) -> Vec<&str> {
    scopes.iter().map(String::as_str).collect()
}

fn relayed_tool(
    upstream: &Arc<Upstream>,
    exposed: &str,
    name: &str,
    raw: Map<String, Value>,
    origin: Origin,
) -> Result<ToolDef, String> {
    let settings = &upstream.settings;
    let mut scopes = settings.scopes.clone();
    scopes.extend(settings.tool_scopes.get(name).cloned().unwrap_or_default());
    let output = match raw.get("outputSchema") {
        Some(schema) => Some(Arc::new(
            jsonschema::draft202012::new(schema).map_err(|_| "its outputSchema does not compile".to_owned())?,
        )),
        None => None,
    };
    // Annotations are information, never policy: `readOnlyHint` grants nothing; a
    // `destructiveHint` only makes the tool stricter (confirmation) unless the operator exempts it.
    let destructive = raw.get("annotations").and_then(|a| a.get("destructiveHint")) == Some(&Value::Bool(true));
    let confirm = settings.confirm.contains(name) || (destructive && !settings.no_confirm.contains(name));
    // A task-capable tool (the operator's `tasks`, or its definition's `execution.taskSupport`)
    // called with the tasks extension runs as a *Palisade* task: the task row is bound to
    // the caller (subject, tenant, client) and authorized on every get/update/cancel, and its
    // worker makes the upstream call, so callers stay partitioned whether or not the upstream
    // partitions its own tasks (the upstream never sees a task the client could name).
    let task_capable = settings.tasks.contains(name)
        || matches!(
            raw.get("execution").and_then(|e| e.get("taskSupport")).and_then(Value::as_str),
            Some("optional" | "required")
        );
    let mut builder = ToolDef::relayed(exposed, raw, origin).scopes(&scope_refs(&scopes));
    if task_capable && !confirm {
        builder = builder.task_support(TaskSupport::Optional);
    }
    if confirm {
        builder = builder.needs_confirmation();
    }
    let upstream = upstream.clone();
    let upstream_name: Arc<str> = Arc::from(name);
    let mut tool = builder.handler(move |ctx, arguments| {
        let upstream = upstream.clone();
        let upstream_name = upstream_name.clone();
        let output = output.clone();
        async move {
            let mut params = Map::new();
            params.insert("name".into(), json!(&*upstream_name));
            params.insert("arguments".into(), Value::Object(arguments));
            match forward(&upstream, &ctx, "tools/call", params).await? {
                Relayed::Result(result) => {
                    tool_result(&upstream.settings.id, result, output.as_deref()).map(Outcome::Complete)
                }
                Relayed::InputRequired(input) => Ok(Outcome::InputRequired(input)),
            }
        }
    });
    check_tool(&mut tool).map_err(|error| format!("the registry refuses it: {error}"))?;
    Ok(tool)
}

/// A tool result relayed as sent (content blocks untouched), once it passes the pinned output
/// schema.
fn tool_result(
    upstream: &str,
    mut result: Map<String, Value>,
    output: Option<&jsonschema::Validator>,
) -> Result<CallToolResult, ProtocolError> {
    let content = match result.remove("content") {
        Some(Value::Array(blocks)) => blocks.into_iter().map(Content::Raw).collect(),
        None => Vec::new(),
        Some(_) => return Err(upstream_garbage(upstream, "a tool result whose content is not an array")),
    };
    let is_error = result.get("isError") == Some(&Value::Bool(true));
    let structured_content = result.remove("structuredContent");
    if let Some(validator) = output
        && !is_error
    {
        let valid = structured_content.as_ref().is_some_and(|structured| validator.is_valid(structured));
        if !valid {
            tracing::warn!(%upstream, "upstream tool result fails its pinned outputSchema");
            return Err(upstream_garbage(upstream, "a result that does not match the tool's outputSchema"));
        }
    }
    Ok(CallToolResult { content, structured_content, is_error })
}

fn upstream_garbage(upstream: &str, what: &str) -> ProtocolError {
    tracing::warn!(%upstream, what, "upstream answer refused");
    ProtocolError::Internal
}

fn relayed_prompt(
    upstream: &Arc<Upstream>,
    exposed: &str,
    name: &str,
    raw: Map<String, Value>,
    origin: Origin,
) -> PromptDef {
    let scopes = upstream.settings.scopes.clone();
    let builder = PromptDef::relayed(exposed, raw, origin).scopes(&scope_refs(&scopes));
    let upstream = upstream.clone();
    let upstream_name: Arc<str> = Arc::from(name);
    builder.handler(move |ctx, arguments| {
        let upstream = upstream.clone();
        let upstream_name = upstream_name.clone();
        async move {
            let mut params = Map::new();
            params.insert("name".into(), json!(&*upstream_name));
            params.insert("arguments".into(), json!(arguments));
            match forward(&upstream, &ctx, "prompts/get", params).await? {
                Relayed::Result(result) => prompt_result(&upstream.settings.id, result).map(Outcome::Complete),
                Relayed::InputRequired(input) => Ok(Outcome::InputRequired(input)),
            }
        }
    })
}

fn prompt_result(upstream: &str, result: Map<String, Value>) -> Result<GetPromptResult, ProtocolError> {
    let Some(Value::Array(messages)) = result.get("messages") else {
        return Err(upstream_garbage(upstream, "a prompt result without messages"));
    };
    let mut out = Vec::with_capacity(messages.len());
    for message in messages {
        let content = message.get("content").cloned().unwrap_or(Value::Null);
        out.push(match message.get("role").and_then(Value::as_str) {
            Some("user") => PromptMessage::user(Content::Raw(content)),
            Some("assistant") => PromptMessage::assistant(Content::Raw(content)),
            _ => return Err(upstream_garbage(upstream, "a prompt message with an unknown role")),
        });
    }
    let description = result.get("description").and_then(Value::as_str).map(str::to_owned);
    Ok(GetPromptResult { description, messages: out })
}

fn relayed_resource(upstream: &Arc<Upstream>, exposed: &str, raw: Map<String, Value>, origin: Origin) -> ResourceDef {
    let scopes = upstream.settings.scopes.clone();
    let builder = ResourceDef::relayed(exposed, raw, origin).scopes(&scope_refs(&scopes));
    let upstream = upstream.clone();
    builder.reader(move |ctx, uri| {
        let upstream = upstream.clone();
        async move { read_resource(&upstream, &ctx, &uri).await }
    })
}

fn relayed_template(
    upstream: &Arc<Upstream>,
    exposed: &str,
    raw: Map<String, Value>,
    origin: Origin,
) -> ResourceTemplateDef {
    let scopes = upstream.settings.scopes.clone();
    let builder = ResourceTemplateDef::relayed(exposed, raw, origin).scopes(&scope_refs(&scopes));
    let upstream = upstream.clone();
    builder.reader(move |ctx, uri, _| {
        let upstream = upstream.clone();
        async move { read_resource(&upstream, &ctx, &uri).await }
    })
}

async fn read_resource(
    upstream: &Upstream,
    ctx: &RequestContext,
    exposed_uri: &str,
) -> Result<Outcome<Vec<ResourceContents>>, ProtocolError> {
    let Some(uri) = upstream.namer.upstream_uri(exposed_uri) else {
        return Err(ProtocolError::ResourceNotFound { uri: exposed_uri.to_owned() });
    };
    let mut params = Map::new();
    params.insert("uri".into(), json!(uri));
    let result = match forward(upstream, ctx, "resources/read", params).await? {
        Relayed::Result(result) => result,
        Relayed::InputRequired(input) => return Ok(Outcome::InputRequired(input)),
    };
    let Some(Value::Array(contents)) = result.get("contents") else {
        return Err(upstream_garbage(&upstream.settings.id, "a read result without contents"));
    };
    let mut out = Vec::with_capacity(contents.len());
    for item in contents {
        // Contents name URIs in the upstream's space: a URI that is not this upstream's own is
        // refused rather than relabelled.
        let item_uri = item.get("uri").and_then(Value::as_str).unwrap_or(uri);
        let exposed = upstream
            .namer
            .expose_uri(item_uri)
            .map_err(|_| upstream_garbage(&upstream.settings.id, "a content URI"))?;
        let mime = item.get("mimeType").and_then(Value::as_str).unwrap_or("application/octet-stream");
        if let Some(text) = item.get("text").and_then(Value::as_str) {
            out.push(ResourceContents::text(exposed, mime, text));
        } else if let Some(blob) = item.get("blob").and_then(Value::as_str) {
            use base64::Engine as _;
            let data = base64::engine::general_purpose::STANDARD
                .decode(blob)
                .map_err(|_| upstream_garbage(&upstream.settings.id, "a blob that is not base64"))?;
            out.push(ResourceContents::blob(exposed, mime, data));
        } else {
            return Err(upstream_garbage(&upstream.settings.id, "a content item without text or blob"));
        }
    }
    Ok(Outcome::Complete(out))
}

/// What a forwarded request came back with.
enum Relayed {
    Result(Map<String, Value>),
    InputRequired(InputRequired),
}

/// Forwards one request to its upstream, after the kill switch's second phase: both phases
/// run before a byte leaves for the upstream. The caller's credentials never travel: the
/// upstream request is built from `params`, the gateway's own credential and, for token
/// exchange, the caller's token sent to the authorization server only.
async fn forward(
    upstream: &Upstream,
    ctx: &RequestContext,
    method: &str,
    mut params: Map<String, Value>,
) -> Result<Relayed, ProtocolError> {
    let id = &upstream.settings.id;
    upstream.client.check_health().map_err(|error| error.to_protocol_error(id))?;
    if ctx.has_kill_switch() {
        // The fence cannot be redeemed by a server that is not ours: obtaining it is the
        // last check before the effect (SECURITY.md: the residual window after forwarding).
        let _fence = ctx.pre_side_effect().await?;
    }
    let mut meta = Map::new();
    if let Some(token) = &ctx.meta().progress_token {
        meta.insert("progressToken".into(), token.to_value());
    }
    if let Some(level) = ctx.meta().log_level {
        meta.insert(palisade_wire::meta_keys::LOG_LEVEL.into(), json!(level.as_str()));
    }
    if !meta.is_empty() {
        params.insert("_meta".into(), Value::Object(meta));
    }
    // An MRTR retry: the upstream's own state travels inside the gateway's sealed state (bound
    // to this caller, method, params and expiry by the pipeline), never as the client sent it.
    let mut connect_round = false;
    if let Some(state) = ctx.request_state() {
        if state.get("upstream").and_then(Value::as_str) != Some(id.as_str()) {
            return Err(ProtocolError::invalid_params("requestState does not belong to this operation"));
        }
        if let Some(upstream_state) = state.get("state") {
            params.insert("requestState".into(), upstream_state.clone());
        }
        connect_round = state.get("connect") == Some(&Value::Bool(true));
    }
    if connect_round {
        // The answer to Palisade's own connect request is not the upstream's to see.
        let action =
            ctx.input_responses().get(CONNECT_INPUT).and_then(|answer| answer.get("action")).and_then(Value::as_str);
        if matches!(action, Some("decline" | "cancel")) {
            return not_connected(method, id);
        }
    } else if !ctx.input_responses().is_empty() {
        params.insert("inputResponses".into(), Value::Object(ctx.input_responses().clone()));
    }
    let partition = ctx.principal().partition_key();
    let user = upstream.oauth.as_ref().map(|_| UserCaller::of(ctx.principal()));
    let caller = CallerContext {
        partition: &partition,
        subject_token: ctx.principal().bearer_token().map(BearerToken::expose),
        user: user.as_ref(),
    };
    let (notifications, mut received) = tokio::sync::mpsc::channel::<Value>(64);
    let request = UpstreamRequest {
        method,
        params,
        caller,
        client_capabilities: Some(Value::Object(upstream_capabilities(&ctx.meta().client_capabilities))),
        notifications: Some(notifications),
        cancel: ctx.cancellation().clone(),
    };
    let call = upstream.client.request(request);
    let mut call = std::pin::pin!(call);
    let reply = loop {
        tokio::select! {
            reply = &mut call => break reply,
            Some(notification) = received.recv() => ctx.relay_notification(&notification).await,
        }
    };
    while let Ok(notification) = received.try_recv() {
        ctx.relay_notification(&notification).await;
    }
    let reply = match (reply, &upstream.oauth) {
        (Err(UpstreamError::Credential(CredentialError::UserAuthorizationRequired { scopes })), Some(oauth)) => {
            return connect_request(oauth, id, ctx, scopes.as_deref()).await;
        }
        (reply, _) => reply,
    };
    match reply.map_err(|error| error.to_protocol_error(id))? {
        UpstreamReply::Result(result) => Ok(Relayed::Result(result)),
        UpstreamReply::InputRequired { input_requests, request_state } => {
            let mut input = InputRequired::new();
            for (key, request) in input_requests {
                input = input.relay(key, request);
            }
            let mut state = json!({ "upstream": id });
            if let Some(upstream_state) = request_state {
                state["state"] = upstream_state;
            }
            Ok(Relayed::InputRequired(input.with_state(state)))
        }
        UpstreamReply::Error { code, message, required_capabilities } => {
            Err(relayed_error(id, code, &message, required_capabilities))
        }
    }
}

/// The key of Palisade's own connect request among an answer's `inputRequests`.
const CONNECT_INPUT: &str = "palisade_connect";

/// The person has no usable connection to a `user_oauth` upstream: a URL-mode elicitation of
/// Palisade's connect page (a one-time link bound to the person, the MCP client and the scopes),
/// to be answered by retrying once connected. A client that cannot open URLs (no
/// `elicitation.url` capability) is told what it lacks.
async fn connect_request(
    oauth: &UserOAuth,
    id: &str,
    ctx: &RequestContext,
    scopes: Option<&[String]>,
) -> Result<Relayed, ProtocolError> {
    let url_mode = ctx.meta().client_capabilities.get("elicitation").and_then(|elicitation| elicitation.get("url"));
    if !url_mode.is_some_and(Value::is_object) {
        return Err(ProtocolError::MissingCapability { required: json!({ "elicitation": { "url": {} } }) });
    }
    let link = match oauth.connect_link(ctx.principal(), id, scopes).await {
        Ok(link) => link,
        Err(OAuthError::Refused(reason)) => return Err(ProtocolError::DelegationRefused { reason }),
        Err(error) => {
            tracing::warn!(upstream = id, %error, "user_oauth: no connect link");
            return Err(ProtocolError::Unavailable);
        }
    };
    tracing::info!(upstream = id, "user_oauth: the caller is asked to connect");
    let request = json!({ "method": "elicitation/create", "params": {
        "mode": "url",
        "message": format!(
            "The upstream \"{id}\" needs your own authorization. Open the link to sign in and connect your \
             account on the gateway's page, then continue."
        ),
        "url": link.as_str(),
    } });
    let input = InputRequired::new().relay(CONNECT_INPUT, request);
    Ok(Relayed::InputRequired(input.with_state(json!({ "upstream": id, "connect": true }))))
}

/// The person declined to connect: a tool error for a tool call, otherwise unavailable.
fn not_connected(method: &str, id: &str) -> Result<Relayed, ProtocolError> {
    if method != "tools/call" {
        return Err(ProtocolError::Unavailable);
    }
    let text = format!("Not connected: the upstream \"{id}\" needs your authorization, which was declined.");
    let result = json!({ "content": [{ "type": "text", "text": text }], "isError": true });
    match result {
        Value::Object(map) => Ok(Relayed::Result(map)),
        _ => Err(ProtocolError::Internal),
    }
}

/// The caller's declared capabilities as the upstream sees them: without the tasks extension
/// (a task through the gateway is the gateway's own, run by its worker as a plain call).
fn upstream_capabilities(declared: &Map<String, Value>) -> Map<String, Value> {
    let mut capabilities = declared.clone();
    if let Some(Value::Object(extensions)) = capabilities.get_mut("extensions") {
        extensions.remove(palisade_server::tasks::TASKS_EXTENSION);
        if extensions.is_empty() {
            capabilities.remove("extensions");
        }
    }
    capabilities
}

/// A JSON-RPC error the upstream answered, as the caller sees it: invalid params and unknown
/// resources keep their meaning; anything else is the upstream being unavailable for this call.
fn relayed_error(upstream: &str, code: i64, message: &str, required_capabilities: Option<Value>) -> ProtocolError {
    tracing::info!(%upstream, code, "upstream answered an error");
    match (code, required_capabilities) {
        (-32602, _) => ProtocolError::invalid_params(format!("upstream {upstream}: {message}")),
        (-32601, _) => ProtocolError::invalid_params(format!("upstream {upstream} does not support this method")),
        // The caller must declare what the upstream needs (elicitation, sampling, roots).
        (-32021, Some(required)) => ProtocolError::MissingCapability { required },
        _ => ProtocolError::Unavailable,
    }
}

/// Which upstream answers completions for each served prompt and resource template.
struct CompletionRoutes {
    upstreams: Vec<Arc<Upstream>>,
    /// Exposed prompt name → (upstream index, upstream name).
    prompts: BTreeMap<String, (usize, String)>,
    /// Exposed template → (upstream index, upstream template).
    templates: BTreeMap<String, (usize, String)>,
}

impl CompletionRoutes {
    fn is_empty(&self) -> bool {
        self.prompts.is_empty() && self.templates.is_empty()
    }

    /// Relays a `completion/complete` to the upstream of the prompt or template it completes,
    /// with the reference renamed to the upstream's own.
    async fn complete(
        &self,
        ctx: &RequestContext,
        reference: CompletionRef,
        mut params: Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        let (index, reference) = match &reference {
            CompletionRef::Prompt(name) => {
                let (index, upstream_name) =
                    self.prompts.get(name).ok_or(ProtocolError::invalid_params("unknown prompt"))?;
                (*index, json!({ "type": "ref/prompt", "name": upstream_name }))
            }
            CompletionRef::Resource(uri) => {
                let (index, template) =
                    self.templates.get(uri).ok_or(ProtocolError::invalid_params("unknown resource"))?;
                (*index, json!({ "type": "ref/resource", "uri": template }))
            }
        };
        let upstream = self.upstreams.get(index).ok_or(ProtocolError::Internal)?;
        params.insert("ref".into(), reference);
        params.remove("_meta");
        match forward(upstream, ctx, "completion/complete", params).await? {
            Relayed::Result(mut result) => match result.remove("completion") {
                Some(completion @ Value::Object(_)) => Ok(json!({ "completion": completion })),
                _ => Err(upstream_garbage(&upstream.settings.id, "a completion result without completion")),
            },
            Relayed::InputRequired(_) => {
                Err(upstream_garbage(&upstream.settings.id, "input requests for a completion"))
            }
        }
    }
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
