//! Reload without restart: the configuration file read again, validated whole, and applied as
//! one new snapshot — or refused, changing nothing, with the reason in the log, in an audit
//! record (`stage = "reload"`, operation `config/reload`) and in `palisade reload`'s answer.
//!
//! [`Reloader::reload`] is the one path every trigger takes: `SIGHUP`, a change of the file
//! (polled every second; applied once it has been the same for one poll, so a half-written file
//! is not read), and `palisade reload` through the control socket ([`control`]). Reloads run one
//! at a time. A reload:
//!
//! 1. reads the file and resolves it exactly as the start did (the same environment and flags);
//!    an invalid file is refused with its key and reason;
//! 2. refuses any change outside [`diff::RELOADABLE`] (listen addresses, store, issuers, keys,
//!    `[gateway]`, `[pins]`, `[web]`, …), naming each key: those take effect only at a restart;
//! 3. builds the reloadable sections other than the upstreams ([`Sections::prepare`]): the policy
//!    files read (and their signatures checked, with `require_signed`), the rate limiters built
//!    (each unchanged rule keeping its state);
//! 4. publishes the registry and the policy set as one snapshot: the gateway builds its new
//!    `[[upstreams]]`' registry ([`palisade_gateway::Gateway::reload`]) and the policies are
//!    validated against it before both are published with `Server::publish_with_policies`;
//!    without a gateway the policies are validated against the registry in force and published
//!    with `Server::publish_policies`. A policy naming a tool the registry lacks refuses the
//!    reload. Open listen and GET streams re-check what their caller may see, and are told of a
//!    list change only when their view changed;
//! 5. swaps the rate limits in ([`Sections::swap`]).

pub mod control;
pub mod diff;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use palisade_base::clock::{Clock as _, SystemClock};
use palisade_server::policy::view::ViewLimits;
use palisade_server::policy::{Policies, PolicySource};
use palisade_server::rate_limits::RateLimits;
use palisade_server::{App, Server};
use palisade_store::{AuditRecord, Decision, Store};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::settings::{ConfigError, Settings, read_config};

/// Resolves a text of the configuration file as the start resolved it (its environment and flags).
pub type Resolve = Box<dyn Fn(&str) -> Result<Settings, ConfigError> + Send + Sync>;

/// Where a reload reads its configuration: the file the instance started with, and how the
/// start resolved it (its environment and flags), for a text read now.
pub struct ReloadSource {
    /// The configuration file.
    pub config: PathBuf,
    /// The text the running settings were resolved from.
    pub text: String,
    /// Resolves a text of the file as the start resolved it.
    pub resolve: Resolve,
}

/// What asked for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// `SIGHUP`.
    Signal,
    /// The configuration file changed.
    FileChange,
    /// `palisade reload`, through the control socket.
    Command,
}

impl Trigger {
    /// `sighup`, `file` or `command` (the log's and the audit record's spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Signal => "sighup",
            Self::FileChange => "file",
            Self::Command => "command",
        }
    }
}

/// A reload's result, as `palisade reload` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Whether the new configuration is the one running now.
    pub applied: bool,
    /// What changed, or why nothing did.
    pub message: String,
}

/// The reloadable sections other than the gateway's upstreams, built from a new configuration
/// before anything is published: **the one place** where the operator's policy set
/// (`[policies]`) and rate limiters (`[[rate_limits]]`) are built and replaced on a reload. A
/// section added here must also be listed in [`diff::RELOADABLE`], and name its files in
/// [`Sections::files`] so a change of them reloads.
pub struct Sections {
    /// The policy files read and checked (`None`: no policies), with the view's bounds.
    policies: Option<(Vec<PolicySource>, ViewLimits)>,
    limits: Arc<RateLimits>,
}

impl Sections {
    /// Reads every reloadable section of `settings` (the policy files and their signatures, the
    /// limiters built with the state of the rules `server` runs now): an error refuses the
    /// whole reload.
    fn prepare(settings: &Settings, server: &Server) -> Result<Self, String> {
        let policies = match settings.policies.enabled() {
            true => {
                Some((crate::policies::read(&settings.policies).map_err(|e| e.to_string())?, settings.policies.limits))
            }
            false => None,
        };
        let limits = crate::rate_limits::build(settings, Some(&server.rate_limits()))
            .map_err(|error| format!("rate_limits: {error:#}"))?;
        Ok(Self { policies, limits: Arc::new(limits) })
    }

    /// The policy set for `app`, validated against it (every problem at its file and line).
    fn policies_for(&self, app: &App) -> Result<Option<Policies>, String> {
        match &self.policies {
            Some((sources, limits)) => Policies::load(sources, *limits, app).map(Some).map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }

    /// Replaces the running rate limits with these (after the snapshot was published).
    fn swap(self, server: &Server) {
        server.set_rate_limits(self.limits);
    }

    /// The files these sections were read from, watched with the configuration file: every
    /// policy file (and its signature, with `require_signed`).
    fn files(settings: &Settings) -> Vec<PathBuf> {
        let Ok(sources) = crate::policies::read_sources(&settings.policies.files) else {
            return settings.policies.files.clone();
        };
        let mut files = Vec::new();
        for source in sources {
            let path = PathBuf::from(source.name);
            if settings.policies.signed_by.is_some() {
                files.push(crate::policies::signature_path(&path));
            }
            files.push(path);
        }
        files
    }
}

/// Longest `detail` of a reload's audit record.
const MAX_DETAIL: usize = 900;

/// How often the watched files are read.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Applies reloads, one at a time.
pub struct Reloader {
    source: ReloadSource,
    server: Arc<Server>,
    gateway: Option<palisade_gateway::Gateway>,
    store: Arc<dyn Store>,
    /// The file's text and its table as last applied; the files watched.
    current: tokio::sync::Mutex<Applied>,
}

struct Applied {
    table: toml::Table,
    watched: Vec<PathBuf>,
    /// The watched files' contents as the last reload (or the start) found them.
    seen: Vec<Option<Vec<u8>>>,
}

/// The contents of `paths` (`None`: unreadable now).
fn read_all(paths: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    paths.iter().map(|path| std::fs::read(path).ok()).collect()
}

impl Reloader {
    /// A reloader of the instance `settings` (resolved from `source.text`) describe.
    pub fn new(
        source: ReloadSource,
        settings: &Settings,
        server: Arc<Server>,
        gateway: Option<palisade_gateway::Gateway>,
        store: Arc<dyn Store>,
    ) -> anyhow::Result<Self> {
        let table = source.text.parse::<toml::Table>()?;
        let mut watched = vec![source.config.clone()];
        watched.extend(Sections::files(settings));
        let mut seen = read_all(&watched);
        // The text the start resolved, whatever the file holds now.
        seen[0] = Some(source.text.clone().into_bytes());
        let current = tokio::sync::Mutex::new(Applied { table, watched, seen });
        Ok(Self { source, server, gateway, store, current })
    }

    /// Reads the configuration again and applies it whole, or nothing (see the module's steps);
    /// logged and audited either way.
    pub async fn reload(&self, trigger: Trigger) -> Outcome {
        let mut applied = self.current.lock().await;
        // Read before the reload reads them: a change made meanwhile is seen by the watch.
        applied.seen = read_all(&applied.watched);
        let outcome = match self.apply(&mut applied).await {
            Ok(summary) => {
                tracing::info!(trigger = trigger.as_str(), %summary, "configuration reloaded");
                Outcome { applied: true, message: format!("reloaded: {summary}") }
            }
            Err(reason) => {
                tracing::error!(trigger = trigger.as_str(), %reason, "configuration not reloaded: nothing changed");
                Outcome { applied: false, message: format!("not reloaded, nothing changed: {reason}") }
            }
        };
        self.audit(trigger, &outcome).await;
        outcome
    }

    async fn apply(&self, applied: &mut Applied) -> Result<String, String> {
        let text = read_config(&self.source.config).map_err(|error| error.to_string())?;
        let table: toml::Table =
            text.parse().map_err(|error| format!("config: {}: {error}", self.source.config.display()))?;
        let settings = (self.source.resolve)(&text).map_err(|error| error.to_string())?;
        let restart = diff::restart_only_changes(&applied.table, &table);
        if !restart.is_empty() {
            return Err(format!(
                "{} changed: only [[upstreams]], [[rate_limits]] and the policy files reload; every \
                 other key takes effect at a restart (restore it, or restart the instance)",
                restart.join(", ")
            ));
        }
        let sections = Sections::prepare(&settings, &self.server)?;
        let mut summary = match (&self.gateway, settings.gateway.clone()) {
            (Some(gateway), Some(upstreams)) => gateway
                .reload(upstreams, |app| sections.policies_for(app))
                .await
                .map_err(|error| error.to_string())?
                .summary(),
            _ => {
                let policies = sections.policies_for(&self.server.app())?;
                self.server.publish_policies(policies);
                "no upstreams to reload".to_owned()
            }
        };
        match self.server.policies() {
            Some(policies) => summary.push_str(&format!("; policies {} ({})", policies.digest(), policies.len())),
            None => summary.push_str("; no policies"),
        }
        summary.push_str(&format!("; {} rate limits", sections.limits.names().count()));
        sections.swap(&self.server);
        applied.table = table;
        applied.watched = std::iter::once(self.source.config.clone()).chain(Sections::files(&settings)).collect();
        Ok(summary)
    }

    /// The reload's audit record (a failure to write it is logged: the reload stands).
    async fn audit(&self, trigger: Trigger, outcome: &Outcome) {
        let mut detail = format!("trigger={} {}", trigger.as_str(), outcome.message);
        if detail.len() > MAX_DETAIL {
            let mut end = MAX_DETAIL;
            while !detail.is_char_boundary(end) {
                end -= 1;
            }
            detail.truncate(end);
        }
        let record = AuditRecord {
            at_ms: SystemClock.now_unsigned_ms(),
            trace_id: palisade_server::audit::fresh_trace_id(),
            stage: "reload".into(),
            decision: if outcome.applied { Decision::Allow } else { Decision::Deny },
            operation: "config/reload".into(),
            principal_digest: None,
            tenant_digest: None,
            client_digest: None,
            scopes: Vec::new(),
            policy_version: None,
            code: None,
            detail: Some(detail),
        };
        if let Err(error) = self.store.append_batch(vec![record]).await {
            tracing::error!(%error, "the reload could not be audited");
        }
    }

    /// Starts the triggers: `SIGHUP` (its handler installed before this returns, so the signal
    /// no longer ends the process), the file watch (with `watch_config`) and the control socket
    /// in the data directory, until `shutdown`.
    pub async fn start(self: &Arc<Self>, settings: &Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        let (reloader, stop) = (self.clone(), shutdown.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    received = hangup.recv() => if received.is_none() { return },
                }
                reloader.reload(Trigger::Signal).await;
            }
        });
        if settings.watch_config {
            let (reloader, stop) = (self.clone(), shutdown.clone());
            tokio::spawn(async move { reloader.watch(stop).await });
        }
        control::bind(control::socket_path(&settings.data_dir), self.clone(), shutdown).await
    }

    /// Reloads when a watched file's content differs from what the last reload read and has
    /// stayed the same for one more poll. Whatever the outcome, that content was tried: only the
    /// next change tries again.
    async fn watch(&self, stop: CancellationToken) {
        let mut last = Vec::new();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(WATCH_EVERY) => {}
            }
            let (watched, seen) = {
                let applied = self.current.lock().await;
                (applied.watched.clone(), applied.seen.clone())
            };
            let now = read_all(&watched);
            if now != seen && now == last {
                self.reload(Trigger::FileChange).await;
            }
            last = now;
        }
    }
}
