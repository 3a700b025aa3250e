//! The gateway's loops: each upstream re-listed on its interval (or its lists' shorter `ttlMs`)
//! and on its own `list_changed`, its resource updates followed, a stdio upstream's launch
//! re-checked, reviewers' decisions polled, churn coalesced, the callers' resource interest
//! routed to the upstreams.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use palisade_server::{Server, ServerEvent};
use tokio_util::sync::CancellationToken;

use super::reconcile::{churn_record, fingerprint};
use super::{Attached, CoverageCheck, Gateway, Refreshed, Upstream, lock};
use crate::churn::Summary;
use crate::upstream::{Change, Subscribing};

impl Gateway {
    /// Attaches the server whose registry the gateway publishes and starts its loops; they stop
    /// when `shutdown` is cancelled. `coverage` is the server's kill-switch registry check (see
    /// [`Gateway::build_app`]), applied to every rebuild the loops make.
    pub fn spawn(&self, server: Arc<Server>, shutdown: CancellationToken, coverage: Option<CoverageCheck>) {
        if self.inner.spawned.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tracing::warn!("the gateway is already attached to a server");
            return;
        }
        let events = server.events().clone();
        let server = Arc::new(Attached { server, coverage });
        let _ = self.inner.attached.set(server.clone());
        for upstream in &self.roster().upstreams {
            self.spawn_upstream(upstream, &server);
        }
        let (gateway, on, stop) = (self.clone(), server.clone(), shutdown.clone());
        tokio::spawn(async move { gateway.decisions_loop(&on, stop).await });
        let (gateway, interest, stop) = (self.clone(), server.server.resource_interest(), shutdown.clone());
        tokio::spawn(async move { gateway.interest_loop(interest, stop).await });
        let gateway = self.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move { gateway.churn_loop(stop).await });
        if let Some(oauth) = &self.inner.oauth {
            oauth.spawn_upkeep(&events, shutdown.clone());
        }
        let gateway = self.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            gateway.inner.stopping.cancel();
            // The upstreams of the roster serving at the end (a reload stops those it retires).
            for upstream in &gateway.roster().upstreams {
                upstream.client.shutdown().await;
            }
        });
    }

    /// Starts one upstream's loops; they stop when its `stop` is cancelled (a reload retired
    /// it, or the gateway shuts down).
    pub(super) fn spawn_upstream(&self, upstream: &Arc<Upstream>, server: &Arc<Attached>) {
        let (gateway, up, on) = (self.clone(), upstream.clone(), server.clone());
        tokio::spawn(async move { gateway.relist_loop(&up, &on).await });
        let (gateway, up, on) = (self.clone(), upstream.clone(), server.clone());
        tokio::spawn(async move { gateway.changes_loop(&up, &on).await });
        if upstream.settings.stdio.is_some() {
            let (gateway, up, on) = (self.clone(), upstream.clone(), server.clone());
            tokio::spawn(async move { gateway.launch_loop(&up, &on).await });
        }
    }

    /// Re-lists `upstream` every `[pins] relist_secs`, or as soon as the `ttlMs` of its last
    /// listing runs out when that comes first ([`Gateway::relist_wait`]).
    async fn relist_loop(&self, upstream: &Arc<Upstream>, server: &Attached) {
        loop {
            tokio::select! {
                () = upstream.stop.cancelled() => return,
                () = tokio::time::sleep(self.relist_wait(upstream)) => {}
            }
            self.relist(upstream, Some(server)).await;
        }
    }

    /// A stdio upstream whose launch changed since its approval (noticed at a process start) is
    /// re-listed at once: the changed launch is recorded and held, and its tools withdrawn, without
    /// waiting for the next relisting.
    async fn launch_loop(&self, upstream: &Arc<Upstream>, server: &Attached) {
        loop {
            tokio::select! {
                () = upstream.stop.cancelled() => return,
                () = upstream.client.launch_changed() => {}
            }
            tracing::info!(upstream = %upstream.settings.id, "stdio upstream launch changed: re-listing");
            if self.relist(upstream, Some(server)).await == Refreshed::Changed {
                self.announce(server, "notifications/tools/list_changed");
            }
        }
    }

    /// Follows one upstream's change notifications: each list change is a re-listing (and pin
    /// check) before any client hears of a change; each resource update is handed on
    /// ([`Gateway::resource_updated`]). Keeps the gateway's resource subscriptions at the upstream
    /// equal to its `wanted` set: 2026-07-28, the change stream is re-opened with the new filter;
    /// 2025 era, subscribed and unsubscribed one by one (all again on a re-opened stream, whose
    /// session may be new).
    async fn changes_loop(&self, upstream: &Arc<Upstream>, server: &Attached) {
        let stop = &upstream.stop;
        let mut wanted = upstream.wanted.subscribe();
        let mut backoff = Duration::from_secs(1);
        loop {
            let resources = wanted.borrow_and_update().clone();
            let mut reopen = false;
            let changes = tokio::select! {
                () = stop.cancelled() => return,
                changes = upstream.client.changes(&resources) => changes,
            };
            match changes {
                Ok(stream) => {
                    backoff = Duration::from_secs(1);
                    let mut held = BTreeSet::new();
                    if upstream.client.subscribing() == Subscribing::ByRequest {
                        self.sync_subscriptions(upstream, &mut held, &resources).await;
                    }
                    let mut stream = std::pin::pin!(stream);
                    loop {
                        tokio::select! {
                            () = stop.cancelled() => return,
                            changed = wanted.changed() => {
                                if changed.is_err() {
                                    return;
                                }
                                let now = wanted.borrow_and_update().clone();
                                match upstream.client.subscribing() {
                                    Subscribing::InListen => {
                                        reopen = true;
                                        break;
                                    }
                                    Subscribing::ByRequest => self.sync_subscriptions(upstream, &mut held, &now).await,
                                    Subscribing::Unsupported => {}
                                }
                            }
                            next = stream.next() => match next {
                                Some(Change::ListChanged(method)) => {
                                    tracing::info!(upstream = %upstream.settings.id, %method, "upstream list changed: re-listing");
                                    self.relist(upstream, Some(server)).await;
                                    self.announce(server, &method);
                                }
                                Some(Change::ResourceUpdated(uri)) => self.resource_updated(upstream, server, &uri),
                                None => break,
                            }
                        }
                    }
                }
                Err(error) => tracing::debug!(upstream = %upstream.settings.id, %error, "change stream unavailable"),
            }
            if reopen {
                continue;
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
    fn announce(&self, to: &Attached, method: &str) {
        let event = match method {
            "notifications/tools/list_changed" => ServerEvent::ToolsListChanged,
            "notifications/prompts/list_changed" => ServerEvent::PromptsListChanged,
            "notifications/resources/list_changed" => ServerEvent::ResourcesListChanged,
            _ => return,
        };
        to.server.events().publish(event);
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
    async fn decisions_loop(&self, server: &Attached, stop: CancellationToken) {
        let every = self.settings().pins.decision_poll;
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
                        for upstream in &self.roster().upstreams {
                            if upstream.settings.stdio.is_some() {
                                self.refresh_upstream(upstream).await;
                            }
                        }
                        self.rebuild(Some(server)).await;
                    }
                }
                Err(error) => tracing::warn!(%error, "pin decisions could not be read"),
            }
        }
    }
}
