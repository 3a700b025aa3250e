//! The MCP client toward a local stdio server: its processes, one per caller partition by
//! default (one for all with `shared`), started on first use only with the approved launch,
//! confined ([`sandbox`]), stopped when idle, capped in number; the era found once per upstream
//! (`server/discover`, else the 2025 `initialize` handshake, which every 2025-era process then
//! performs for itself).
//!
//! A process is launched only when the launch resolved *now* — the executable's bytes re-hashed
//! — has the digest a reviewer approved ([`StdioLink::set_approved`]); a different one is
//! refused, and the gateway is told to re-list at once ([`super::UpstreamClient::launch_changed`]),
//! so the changed launch is observed, held, and the upstream's tools withdrawn.

mod process;
pub mod sandbox;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::health::Health;
use super::http::Body;
use super::legacy::GATEWAY_PARTITION;
use super::messages::{client_info, discovered, instructions, legacy_params, log_level, modern_params};
use super::{Change, Era, ProtocolChoice, UpstreamError, UpstreamInfo, UpstreamLimits, lock};
use crate::upstream::launch::LaunchSpec;
use crate::upstream::settings::{Confinement, SandboxSettings, StdioSettings, UpstreamSettings};
use process::{Process, StartOptions};
pub use sandbox::SandboxError;
use sandbox::UidPool;

/// The uid pool every stdio upstream of one gateway shares.
#[derive(Debug, Clone)]
pub struct SandboxIdentities {
    settings: SandboxSettings,
    pool: Arc<UidPool>,
}

impl SandboxIdentities {
    /// The identities of `settings`.
    pub fn new(settings: SandboxSettings) -> Self {
        Self { settings, pool: Arc::new(UidPool::new(settings.uid_base)) }
    }
}

/// One partition's process, started once.
#[derive(Default)]
struct Slot {
    process: tokio::sync::Mutex<Option<Arc<Process>>>,
}

/// The state of one stdio upstream.
pub(super) struct StdioLink {
    pub(super) id: String,
    pub(super) url: url::Url,
    protocol: ProtocolChoice,
    pub(super) limits: UpstreamLimits,
    settings: UpstreamSettings,
    identities: SandboxIdentities,
    protected: Vec<PathBuf>,
    /// The approved launch digest (`None`: nothing may start).
    approved: Mutex<Option<String>>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    pub(super) info: Mutex<Option<Arc<UpstreamInfo>>>,
    pub(super) health: Health,
    changes: Arc<Mutex<Option<mpsc::Sender<Change>>>>,
    /// Notified when a launch was refused because it changed since its approval.
    pub(super) launch_changed: tokio::sync::Notify,
    reaper_started: AtomicBool,
    /// What the gateway's own process declares ([`super::asks::own_capabilities`]).
    pub(super) own_capabilities: Value,
}

impl std::fmt::Debug for StdioLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioLink").field("id", &self.id).finish_non_exhaustive()
    }
}

impl StdioLink {
    pub(super) fn new(
        settings: &UpstreamSettings,
        identities: SandboxIdentities,
        protected: Vec<PathBuf>,
    ) -> Result<Self, UpstreamError> {
        if settings.stdio.is_none() {
            return Err(UpstreamError::Unavailable("not a stdio upstream".into()));
        }
        Ok(Self {
            id: settings.id.clone(),
            url: settings.url.clone(),
            protocol: settings.protocol,
            limits: settings.limits.clone(),
            settings: settings.clone(),
            identities,
            protected,
            approved: Mutex::new(None),
            slots: Mutex::new(HashMap::new()),
            info: Mutex::new(None),
            health: Health::default(),
            changes: Arc::new(Mutex::new(None)),
            launch_changed: tokio::sync::Notify::new(),
            reaper_started: AtomicBool::new(false),
            own_capabilities: super::asks::own_capabilities(&settings.client_requests),
        })
    }

    fn stdio(&self) -> &StdioSettings {
        // Checked in `new`.
        self.settings.stdio.as_ref().unwrap_or_else(|| unreachable!("a stdio link has stdio settings"))
    }

    /// Sets the approved launch digest; `None` (or a new digest) stops every running process.
    pub(super) async fn set_approved(&self, digest: Option<String>) {
        let changed = {
            let mut approved = lock(&self.approved);
            let changed = *approved != digest;
            *approved = digest;
            changed
        };
        if changed {
            self.stop_all().await;
            *lock(&self.info) = None;
        }
    }

    /// Stops every process.
    pub(super) async fn stop_all(&self) {
        let slots: Vec<Arc<Slot>> = lock(&self.slots).drain().map(|(_, slot)| slot).collect();
        for slot in slots {
            if let Some(process) = slot.process.lock().await.take() {
                self.retire(&process).await;
            }
        }
    }

    async fn retire(&self, process: &Process) {
        process.stop().await;
        if let Some(uid) = process.uid {
            self.identities.pool.give_back(uid);
        }
    }

    /// The partition whose process serves `partition`'s requests.
    fn key<'a>(&self, partition: &'a str) -> &'a str {
        if self.stdio().shared { GATEWAY_PARTITION } else { partition }
    }

    /// The running process of `partition`, started (and, on the 2025 wire, initialized) when
    /// there is none.
    async fn process(
        self: &Arc<Self>,
        partition: &str,
        capabilities: Option<&Value>,
    ) -> Result<Arc<Process>, UpstreamError> {
        let key = self.key(partition).to_owned();
        let slot = {
            let mut slots = lock(&self.slots);
            if !slots.contains_key(&key) {
                let running = slots.len();
                if running >= self.stdio().max_processes {
                    return Err(UpstreamError::Refused(format!(
                        "the upstream's limit of {} processes is reached",
                        self.stdio().max_processes
                    )));
                }
            }
            slots.entry(key.clone()).or_default().clone()
        };
        let mut current = slot.process.lock().await;
        if let Some(process) = current.as_ref()
            && !process.is_dead()
        {
            return Ok(process.clone());
        }
        if let Some(dead) = current.take() {
            self.retire(&dead).await;
        }
        let started = self.launch(&key).await;
        let process = match started {
            Ok(process) => process,
            Err(error) => {
                drop(current);
                lock(&self.slots).remove(&key);
                return Err(error);
            }
        };
        let era = lock(&self.info).as_ref().map(|info| info.era.clone());
        if let Some(Era::Legacy(version)) = era {
            let versions = [version.as_str()];
            let handshake =
                tokio::time::timeout(self.limits.connect_timeout, initialize(&process, &versions, capabilities));
            match handshake.await.unwrap_or(Err(UpstreamError::Timeout)) {
                Ok(_) => {}
                Err(error) => {
                    self.retire(&process).await;
                    drop(current);
                    lock(&self.slots).remove(&key);
                    return Err(error);
                }
            }
        }
        *current = Some(process.clone());
        self.start_reaper();
        Ok(process)
    }

    /// Starts one process with the approved launch, re-resolved now.
    async fn launch(self: &Arc<Self>, key: &str) -> Result<Arc<Process>, UpstreamError> {
        let approved = lock(&self.approved).clone();
        let Some(approved) = approved else {
            return Err(UpstreamError::Refused("the upstream's launch is not approved".into()));
        };
        let settings = self.settings.clone();
        let resolved = tokio::task::spawn_blocking(move || {
            let path = settings.stdio.as_ref().and_then(|stdio| stdio.search_path.clone());
            LaunchSpec::resolve(&settings, path.as_deref()).map(|spec| {
                spec.and_then(|spec| {
                    let digest = spec.digest()?;
                    Ok((spec, digest))
                })
            })
        })
        .await
        .map_err(|_| UpstreamError::Unavailable("the launch could not be resolved".into()))?;
        let (spec, digest) = match resolved {
            Some(Ok(pair)) => pair,
            Some(Err(error)) => return Err(UpstreamError::Unavailable(error.to_string())),
            None => return Err(UpstreamError::Unavailable("not a stdio upstream".into())),
        };
        if digest != approved {
            tracing::warn!(upstream = %self.id, "the launch changed since it was approved (command, arguments, grants, limits or the executable's bytes): not started");
            self.launch_changed.notify_one();
            return Err(UpstreamError::Refused("the launch changed since it was approved".into()));
        }
        if spec.settings.confinement == Confinement::None {
            tracing::warn!(upstream = %self.id, "starting a stdio server WITHOUT CONFINEMENT (confinement = \"none\"): it runs with the gateway's access");
        }
        let env = sandbox::environment(&spec, &|name| std::env::var(name).ok())
            .map_err(|error| UpstreamError::Unavailable(error.to_string()))?;
        let secrets: Vec<(String, String)> = env.iter().skip(sandbox::FIXED_ENV).cloned().collect();
        let confined = spec.settings.confinement == Confinement::Bubblewrap;
        let uid = if confined && sandbox::running_as_root() {
            Some(self.identities.pool.take().map_err(|error| UpstreamError::Unavailable(error.to_string()))?)
        } else {
            None
        };
        let started = sandbox::command(&spec, &self.identities.settings, uid, &self.protected, env)
            .map_err(|error| UpstreamError::Unavailable(error.to_string()))
            .and_then(|command| {
                Process::start(
                    command,
                    StartOptions {
                        upstream: self.id.clone(),
                        max_line_bytes: self.limits.max_response_bytes,
                        changes: (key == GATEWAY_PARTITION).then(|| self.changes.clone()),
                        relay_messages: !spec.settings.shared,
                        uid,
                        drops: self.health.drops.clone(),
                        secrets,
                    },
                )
            });
        if started.is_err()
            && let Some(uid) = uid
        {
            self.identities.pool.give_back(uid);
        }
        started
    }

    /// Stops per-caller processes idle for longer than `idle_secs` (the gateway's own one, which
    /// lists and follows changes, stays).
    fn start_reaper(self: &Arc<Self>) {
        if self.reaper_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let link: Weak<Self> = Arc::downgrade(self);
        let idle = self.stdio().idle;
        let every = (idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(30));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(link) = link.upgrade() else { return };
                let slots: Vec<(String, Arc<Slot>)> =
                    lock(&link.slots).iter().map(|(key, slot)| (key.clone(), slot.clone())).collect();
                for (key, slot) in slots {
                    if key == GATEWAY_PARTITION {
                        continue;
                    }
                    let Ok(mut current) = slot.process.try_lock() else { continue };
                    let stale =
                        current.as_ref().is_some_and(|p| p.is_dead() || (!p.busy() && p.last_used().elapsed() >= idle));
                    if stale && let Some(process) = current.take() {
                        drop(current);
                        lock(&link.slots).remove(&key);
                        tracing::info!(upstream = %link.id, "stopping an idle stdio server");
                        link.retire(&process).await;
                    }
                }
            }
        });
    }

    /// How many processes run now.
    pub(super) fn running(&self) -> usize {
        lock(&self.slots).len()
    }

    /// Learns the era on the gateway's own process: `server/discover` (Auto, Modern), else the
    /// 2025 handshake (Auto, Legacy).
    pub(super) async fn connect(self: &Arc<Self>) -> Result<UpstreamInfo, UpstreamError> {
        let process = self.process(GATEWAY_PARTITION, Some(&self.own_capabilities)).await?;
        let discover = || async {
            let params = modern_params(Map::new(), None)?;
            let body = tokio::time::timeout(
                self.limits.connect_timeout,
                process.request("server/discover", params, super::Relays::NONE, None),
            )
            .await
            .unwrap_or(Err(UpstreamError::Timeout))?;
            match body {
                Body::Result(result) => discovered(&result),
                Body::Error { code, .. } => {
                    Err(UpstreamError::Protocol(format!("refused server/discover (code {code})")))
                }
            }
        };
        let info = match self.protocol {
            ProtocolChoice::Modern => discover().await?,
            ProtocolChoice::Legacy => self.legacy_connect(&process).await?,
            ProtocolChoice::Auto => match discover().await {
                Ok(info) => info,
                // A process that died answering is not a legacy server.
                Err(error) if process.is_dead() => return Err(error),
                Err(_) => self.legacy_connect(&process).await?,
            },
        };
        *lock(&self.info) = Some(Arc::new(info.clone()));
        Ok(info)
    }

    async fn legacy_connect(&self, process: &Process) -> Result<UpstreamInfo, UpstreamError> {
        let handshake = initialize(process, palisade_wire::LEGACY_VERSIONS, Some(&self.own_capabilities));
        let (version, result) = tokio::time::timeout(self.limits.connect_timeout, handshake)
            .await
            .unwrap_or(Err(UpstreamError::Timeout))?;
        Ok(UpstreamInfo {
            era: Era::Legacy(version),
            capabilities: result.get("capabilities").cloned().unwrap_or_else(|| json!({})),
            server_info: result.get("serverInfo").cloned().unwrap_or(Value::Null),
            instructions: instructions(&result)?,
        })
    }

    /// One request in the caller partition's process.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn call(
        self: &Arc<Self>,
        info: &UpstreamInfo,
        method: &str,
        params: Map<String, Value>,
        partition: &str,
        capabilities: Option<&Value>,
        relays: super::Relays<'_>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Body, UpstreamError> {
        // A 2025-era per-caller process: the caller's per-request log level is the process's
        // own (a shared process relays no log messages, so it is left alone).
        let level = match &info.era {
            Era::Legacy(_)
                if !self.stdio().shared && info.capabilities.get("logging").is_some_and(Value::is_object) =>
            {
                log_level(&params)
            }
            _ => None,
        };
        let params = match &info.era {
            Era::Modern => modern_params(params, capabilities)?,
            Era::Legacy(_) => legacy_params(params)?,
        };
        // The gateway's own process (and a shared one) declares what the configuration relays.
        let capabilities =
            if self.key(partition) == GATEWAY_PARTITION { Some(&self.own_capabilities) } else { capabilities };
        let run = async {
            let process = self.process(partition, capabilities).await?;
            if let Some(level) = &level {
                process.set_level(level).await?;
            }
            process.request(method, params, relays, cancel).await
        };
        let outcome =
            tokio::time::timeout(self.limits.request_timeout, run).await.unwrap_or(Err(UpstreamError::Timeout));
        match &outcome {
            Ok(_) => self.health.success(),
            Err(error) if error.is_upstream_failure() => self.health.failure(error.to_string()),
            Err(_) => {}
        }
        outcome
    }

    /// The gateway process's change notifications: list changes and the updates of the
    /// resources subscribed (2026-07-28: after a `subscriptions/listen` for what the capabilities
    /// advertise and `resources`, cancelled when the stream is dropped). Ends when that process
    /// exits.
    pub(super) async fn changes(
        self: &Arc<Self>,
        info: &UpstreamInfo,
        resources: &BTreeSet<String>,
    ) -> Result<BoxStream<'static, Change>, UpstreamError> {
        let process = self.process(GATEWAY_PARTITION, Some(&self.own_capabilities)).await?;
        let (tx, mut rx) = mpsc::channel::<Change>(16);
        *lock(&self.changes) = Some(tx);
        let dropped = CancellationToken::new();
        if info.era == Era::Modern {
            let filter = crate::upstream::subscriptions::listen_filter(info, resources);
            if !filter.is_empty() {
                let mut params = Map::new();
                params.insert("notifications".into(), Value::Object(filter));
                let params = modern_params(params, None)?;
                let listener = process.clone();
                let cancel = dropped.clone();
                // The listen request stays open for the process's life, or until the stream is
                // dropped (a changed filter re-opens it); its answer is not awaited.
                tokio::spawn(async move {
                    let exited = listener.exited();
                    tokio::select! {
                        _ = listener.request("subscriptions/listen", params, super::Relays::NONE, Some(&cancel)) => {}
                        () = exited.cancelled() => {}
                    }
                });
            }
        }
        let exited = process.exited();
        let guard = dropped.drop_guard();
        let stream = futures::stream::poll_fn(move |cx| {
            let _listening = &guard;
            rx.poll_recv(cx)
        })
        .take_until(async move { exited.cancelled().await });
        Ok(stream.boxed())
    }
}

/// The 2025 handshake on one process: `initialize` offering `versions` in order (the first
/// accepted wins), then `notifications/initialized`. Returns the version and the result.
async fn initialize(
    process: &Process,
    versions: &[&str],
    capabilities: Option<&Value>,
) -> Result<(String, Map<String, Value>), UpstreamError> {
    let capabilities = capabilities.filter(|c| c.is_object()).cloned().unwrap_or_else(|| json!({}));
    for version in versions {
        let mut params = Map::new();
        params.insert("protocolVersion".into(), json!(version));
        params.insert("capabilities".into(), capabilities.clone());
        params.insert("clientInfo".into(), client_info());
        let result = match process.request("initialize", params, super::Relays::NONE, None).await? {
            Body::Result(result) => result,
            Body::Error { code, .. } => {
                return Err(UpstreamError::Protocol(format!("refused initialize (code {code})")));
            }
        };
        let Some(agreed) = result.get("protocolVersion").and_then(Value::as_str) else {
            return Err(UpstreamError::Protocol("answered initialize without a protocolVersion".into()));
        };
        if agreed == *version || versions.contains(&agreed) {
            process.notify("notifications/initialized", Map::new()).await?;
            return Ok((agreed.to_owned(), result));
        }
    }
    Err(UpstreamError::Protocol("agreed on no 2025-era version this gateway speaks".into()))
}
