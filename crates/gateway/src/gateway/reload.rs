//! A reload of the gateway's upstreams ([`Gateway::reload`]): a new configuration's
//! `[[upstreams]]` become one new [`Roster`], whose registry is built whole and published with
//! `Server::publish`; only when the server accepts it does the roster replace the running one.
//! Requests that started before finish on the registry (and upstream clients) they started with;
//! a retired upstream's connection or processes are closed once nothing holds it any more.
//!
//! Each upstream of the new configuration is, by id: unchanged (kept as it runs), changed in its
//! rules alone (`deny`, `confirm`, `no_confirm`, `tasks`, `scopes`, `tool_scopes`, `prefix`: the
//! same connection or processes under the new rules), changed in how it is reached (`url`, the
//! stdio launch, `protocol`, limits, credential: a new client, whose launch is resolved and
//! pinned again as a changed launch is at any time), or new (listed and pinned as at start:
//! its definitions wait for approval like any other).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use palisade_server::App;
use palisade_server::policy::Policies;
use serde::Serialize;

use super::{Gateway, GatewayError, Roster, Upstream, UpstreamMaker, lock};
use crate::config::{GatewaySettings, UpstreamSettings};

/// What a reload did, by upstream id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    /// New upstreams (listed and pinned now; their definitions need approval as at start).
    pub added: Vec<String>,
    /// Upstreams no longer served (closed once the requests that use them finished).
    pub removed: Vec<String>,
    /// Upstreams reached differently (URL, launch, protocol, limits, credential): a new client.
    pub relaunched: Vec<String>,
    /// Upstreams whose rules or prefix alone changed: the same connection, the new rules.
    pub rules_changed: Vec<String>,
    /// Upstreams exactly as before.
    pub unchanged: Vec<String>,
    /// Added or relaunched upstreams whose first listing failed (retried by their loops, as at
    /// start; nothing of them is served until one succeeds).
    pub unreachable: Vec<String>,
}

impl ReloadReport {
    /// One line: `added a; removed b; …`, or `no upstream changed`.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = [
            ("added", &self.added),
            ("removed", &self.removed),
            ("relaunched", &self.relaunched),
            ("rules changed", &self.rules_changed),
            ("unreachable", &self.unreachable),
        ]
        .into_iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(what, ids)| format!("{what}: {}", ids.join(", ")))
        .collect();
        if parts.is_empty() { "no upstream changed".to_owned() } else { parts.join("; ") }
    }

    /// Whether any upstream changed.
    pub fn changed(&self) -> bool {
        !(self.added.is_empty()
            && self.removed.is_empty()
            && self.relaunched.is_empty()
            && self.rules_changed.is_empty())
    }
}

impl Gateway {
    /// Serves the upstreams of `settings` instead of the running ones, as one registry: built
    /// from every upstream (new ones listed first) and published, or — when it cannot be built or
    /// the server refuses it — nothing changes and the error says why. Only `upstreams` (and the
    /// protected paths derived from them) are read from `settings`: the caller refuses a change to
    /// any other section, which takes effect only at a restart. `policies` makes the operator's
    /// policy set for the new registry (validated against it): published with it as one
    /// snapshot, or its error refuses the reload.
    pub async fn reload(
        &self,
        settings: GatewaySettings,
        policies: impl FnOnce(&App) -> Result<Option<Policies>, String>,
    ) -> Result<ReloadReport, GatewayError> {
        let attached = self
            .inner
            .attached
            .get()
            .cloned()
            .ok_or_else(|| GatewayError::Reload("the gateway does not serve yet".into()))?;
        // No rebuild publishes the old roster's registry over the new one.
        let one = self.inner.rebuilding.lock().await;
        let old = self.roster();
        let settings = Arc::new(GatewaySettings {
            upstreams: settings.upstreams,
            protected_paths: settings.protected_paths,
            ..(*old.settings).clone()
        });
        let protected_changed = settings.protected_paths != old.settings.protected_paths;
        let same_prefixes = prefixes(&old.settings) == prefixes(&settings);
        let maker = UpstreamMaker {
            settings: &settings,
            identities: &self.inner.identities,
            oauth: self.inner.oauth.as_ref(),
            clock: &self.inner.clock,
            metrics: &self.inner.metrics,
            stopping: &self.inner.stopping,
        };
        let mut report = ReloadReport::default();
        let (mut upstreams, mut fresh, mut started) = (Vec::new(), Vec::new(), Vec::new());
        // Old upstreams whose client the new roster keeps (never closed by this reload).
        let mut kept_clients = BTreeSet::new();
        for new in &settings.upstreams {
            let previous = old.upstreams.iter().find(|upstream| upstream.settings.id == new.id);
            match previous {
                Some(previous) if same_connection(&previous.settings, new, protected_changed) => {
                    kept_clients.insert(new.id.clone());
                    // Only the unprefixed upstream's namer reads the other upstreams' prefixes.
                    let same_namer = new.prefix.is_some() || same_prefixes;
                    if same_namer && same_rules(&previous.settings, new) {
                        report.unchanged.push(new.id.clone());
                        upstreams.push(previous.clone());
                    } else {
                        report.rules_changed.push(new.id.clone());
                        let upstream = Arc::new(maker.keep(previous, new));
                        started.push(upstream.clone());
                        upstreams.push(upstream);
                    }
                }
                _ => {
                    let upstream = match maker.make(new) {
                        Ok(upstream) => Arc::new(upstream),
                        Err(error) => {
                            drop(one);
                            close_all(&fresh).await;
                            return Err(error);
                        }
                    };
                    let list = if previous.is_some() { &mut report.relaunched } else { &mut report.added };
                    list.push(new.id.clone());
                    fresh.push(upstream.clone());
                    started.push(upstream.clone());
                    upstreams.push(upstream);
                }
            }
        }
        report.removed = old
            .upstreams
            .iter()
            .filter(|upstream| !settings.upstreams.iter().any(|new| new.id == upstream.settings.id))
            .map(|upstream| upstream.settings.id.clone())
            .collect();
        let candidate = Roster { settings, upstreams };
        futures::future::join_all(fresh.iter().map(|upstream| self.refresh_upstream(upstream))).await;
        report.unreachable = fresh
            .iter()
            .filter(|upstream| lock(&upstream.listing).is_none())
            .map(|upstream| upstream.settings.id.clone())
            .collect();
        let published = match self.build_app_on(&candidate, attached.coverage.as_ref()).await {
            Ok(app) => match policies(&app) {
                Ok(policies) => attached
                    .server
                    .publish_with_policies(app, policies)
                    .map(drop)
                    .map_err(|error| GatewayError::Reload(format!("the server refused the new registry: {error}"))),
                Err(error) => Err(GatewayError::Reload(error)),
            },
            Err(error) => Err(error),
        };
        if let Err(error) = published {
            drop(one);
            close_all(&fresh).await;
            // That build reported the candidate's pins: the running roster's are computed again.
            self.rebuild(Some(&*attached)).await;
            return Err(error);
        }
        let retired: Vec<Arc<Upstream>> = old
            .upstreams
            .iter()
            .filter(|upstream| !candidate.upstreams.iter().any(|new| Arc::ptr_eq(new, upstream)))
            .cloned()
            .collect();
        *lock(&self.inner.roster) = Arc::new(candidate);
        drop(one);
        // The new roster's upstreams are asked for what the callers listen for now, and its
        // listings bound the lists' freshness.
        let interest = attached.server.resource_interest().borrow().clone();
        self.route_interest(&interest);
        self.bound_freshness();
        for upstream in &started {
            self.spawn_upstream(upstream, &attached);
        }
        for upstream in retired {
            upstream.stop.cancel();
            if !kept_clients.contains(&upstream.settings.id) {
                tokio::spawn(close_when_drained(upstream));
            }
        }
        // A rebuild asked for while the reload held the lock runs now, on the new roster.
        if self.inner.rebuild_wanted.load(std::sync::atomic::Ordering::SeqCst) {
            self.rebuild(Some(&*attached)).await;
        }
        Ok(report)
    }
}

/// Every upstream's prefix (the unprefixed upstream's namer reserves them).
fn prefixes(settings: &GatewaySettings) -> BTreeSet<Option<String>> {
    settings.upstreams.iter().map(|upstream| upstream.prefix.clone()).collect()
}

/// Whether `new` is reached exactly as `old` is (the same client can serve it). Every field is
/// named: a new one must be sorted into connection or rules.
fn same_connection(old: &UpstreamSettings, new: &UpstreamSettings, protected_changed: bool) -> bool {
    let UpstreamSettings {
        id: _,
        url,
        stdio,
        prefix: _,
        protocol,
        limits,
        scopes: _,
        tool_scopes: _,
        deny: _,
        confirm: _,
        no_confirm: _,
        tasks: _,
        credential,
        client_requests,
    } = new;
    // A stdio process sees the protected paths it was started with.
    *url == old.url
        && *stdio == old.stdio
        && *protocol == old.protocol
        && *limits == old.limits
        && *credential == old.credential
        // The client relays (or refuses) the upstream's questions as it was built to.
        && *client_requests == old.client_requests
        && !(protected_changed && stdio.is_some())
}

/// Whether `new` has `old`'s rules and prefix.
fn same_rules(old: &UpstreamSettings, new: &UpstreamSettings) -> bool {
    old.prefix == new.prefix
        && old.scopes == new.scopes
        && old.tool_scopes == new.tool_scopes
        && old.deny == new.deny
        && old.confirm == new.confirm
        && old.no_confirm == new.no_confirm
        && old.tasks == new.tasks
}

/// Closes the clients a failed reload built.
async fn close_all(upstreams: &[Arc<Upstream>]) {
    for upstream in upstreams {
        upstream.stop.cancel();
        upstream.client.shutdown().await;
    }
}

/// Closes a retired upstream's connection (or stops its processes) once nothing holds it: the
/// registries and requests that started before the reload have finished. A request still running
/// after the upstream's request timeout (and a grace of 5 s) is cut.
async fn close_when_drained(upstream: Arc<Upstream>) {
    let deadline = tokio::time::Instant::now() + upstream.settings.limits.request_timeout + Duration::from_secs(5);
    while Arc::strong_count(&upstream) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if Arc::strong_count(&upstream) > 1 {
        tracing::warn!(upstream = %upstream.settings.id, "a request to a removed upstream outlived its timeout: closed under it");
    }
    upstream.client.shutdown().await;
    tracing::info!(upstream = %upstream.settings.id, "removed upstream closed");
}
