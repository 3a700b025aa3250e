//! The gateway's metrics, per upstream, in the server's recorder ([`palisade_server::metrics`]):
//! whether it is up, the latency of its requests by method, its errors by kind, its definitions
//! by pin state and a stdio upstream's processes. Counters and histograms are registered once
//! per upstream at start (the upstream ids are the configuration's: a bounded set); the gauges
//! are set from [`Gateway::status`] at each scrape. Also the gateway's readiness: ready while at
//! least one upstream serves.

use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
use palisade_server::health::Readiness;
use palisade_server::metrics::Metrics;
use serde::Serialize;
use serde_json::Value;

use super::{Gateway, Roster, UpstreamStatus};
use crate::upstream::{RELAYED_METHODS, UpstreamError};

const UP: &str = "palisade_upstream_up";
const DURATION: &str = "palisade_upstream_request_duration_seconds";
const ERRORS: &str = "palisade_upstream_errors_total";
const DEFINITIONS: &str = "palisade_upstream_definitions";
const PROCESSES: &str = "palisade_upstream_processes";

/// The `method` label of a listing (connect and every list page); relayed requests carry theirs.
const LISTING: &str = "list";

/// The kinds of [`palisade_upstream_errors_total`](ERRORS): [`UpstreamError::kind`], plus a
/// JSON-RPC error the upstream answered.
pub const ERROR_KINDS: [&str; 12] = [
    "unhealthy",
    "timeout",
    "too_large",
    "unavailable",
    "protocol",
    "status",
    "credential",
    "insufficient_scope",
    "cancelled",
    "refused",
    "busy",
    "jsonrpc_error",
];

/// The pin states counted in [`palisade_upstream_definitions`](DEFINITIONS), besides `served`.
const PIN_STATES: [&str; 4] = ["pending", "held", "approved", "rejected"];

/// One upstream's series.
pub(super) struct UpstreamSeries {
    metrics: Arc<Metrics>,
    up: Gauge,
    latency: Vec<Histogram>,
    errors: Vec<Counter>,
    served: Gauge,
    states: Vec<Gauge>,
    processes: Gauge,
}

impl UpstreamSeries {
    /// Registers the series of upstream `id`.
    pub(super) fn register(metrics: &Arc<Metrics>, id: &str) -> Self {
        let upstream = ("upstream", id);
        let latency = RELAYED_METHODS
            .iter()
            .chain(&[LISTING])
            .map(|method| {
                metrics.histogram(
                    DURATION,
                    "Requests to an upstream (relayed, by method, or its listings), answered or not.",
                    &[upstream, ("method", method)],
                )
            })
            .collect();
        let errors = ERROR_KINDS
            .iter()
            .map(|kind| {
                metrics.counter(ERRORS, "Failed requests to an upstream, by kind.", &[upstream, ("kind", kind)])
            })
            .collect();
        let definitions = |state: &str| {
            metrics.gauge(
                DEFINITIONS,
                "An upstream's listed definitions: served to clients, and by pin state.",
                &[upstream, ("state", state)],
            )
        };
        Self {
            metrics: metrics.clone(),
            up: metrics.gauge(
                UP,
                "1 while an upstream's last listing succeeded and it is not in backoff.",
                &[upstream],
            ),
            latency,
            errors,
            served: definitions("served"),
            states: PIN_STATES.iter().map(|state| definitions(state)).collect(),
            processes: metrics.gauge(
                PROCESSES,
                "A stdio upstream's running processes (0 for an HTTP one).",
                &[upstream],
            ),
        }
    }

    /// Records one request of `method` (a relayed method, or `None` for a listing) that took
    /// `elapsed`: its latency, and its error's kind when it failed.
    pub(super) fn observe<T>(&self, method: Option<&str>, elapsed: Duration, outcome: &Result<T, UpstreamError>) {
        let index = method.and_then(|method| RELAYED_METHODS.iter().position(|known| *known == method));
        let histogram = &self.latency[index.unwrap_or(RELAYED_METHODS.len())];
        self.metrics.record_seconds(histogram, elapsed);
        if let Err(error) = outcome {
            self.count_error(error.kind());
        }
    }

    /// Counts one error of `kind` (one of [`ERROR_KINDS`]).
    pub(super) fn count_error(&self, kind: &str) {
        if let Some(index) = ERROR_KINDS.iter().position(|known| *known == kind) {
            self.errors[index].increment(1);
        }
    }

    /// Sets the gauges from the upstream's standing.
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    fn set(&self, status: &UpstreamStatus, states: &[usize; PIN_STATES.len()]) {
        self.up.set(if state_of(status) == State::Up { 1.0 } else { 0.0 });
        self.served.set(status.served as f64);
        for (gauge, count) in self.states.iter().zip(states) {
            gauge.set(*count as f64);
        }
        self.processes.set(status.processes.unwrap_or(0) as f64);
    }
}

/// An upstream's state for the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Its last listing succeeded and it is not in backoff.
    Up,
    /// Its last listing failed, or it is in backoff after failed requests.
    Down,
    /// A stdio upstream whose launch is not the approved one: nothing of it runs.
    LaunchNotApproved,
}

fn state_of(status: &UpstreamStatus) -> State {
    if status.launch.as_ref().is_some_and(|launch| !launch.served) {
        State::LaunchNotApproved
    } else if status.listing_error.is_some() || !status.health.healthy {
        State::Down
    } else {
        State::Up
    }
}

/// One upstream in `/readyz/detail`.
#[derive(Debug, Serialize)]
struct Detail<'a> {
    id: &'a str,
    state: State,
    /// Up and serving at least one definition.
    serving: bool,
    last_error: Option<&'a str>,
    consecutive_failures: u32,
    retry_at_ms: Option<i64>,
    protocol: Option<&'a str>,
    definitions: Definitions,
    processes: Option<usize>,
}

#[derive(Debug, Serialize)]
struct Definitions {
    listed: usize,
    served: usize,
    pending: usize,
    held: usize,
    approved: usize,
    rejected: usize,
}

fn serving(status: &UpstreamStatus) -> bool {
    state_of(status) == State::Up && status.served > 0
}

impl Gateway {
    /// The metrics recorder the gateway counts into: give it to the server
    /// ([`palisade_server::ServerBuilder::metrics`]) so that `/metrics` renders both.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Each upstream's definitions (its launch pin aside) by pin state, in [`PIN_STATES`] order.
    fn pin_states(&self, roster: &Roster) -> Vec<[usize; PIN_STATES.len()]> {
        let report = self.report();
        let launch = crate::pins::DefinitionKind::Launch.as_str();
        roster
            .upstreams
            .iter()
            .map(|upstream| {
                let mut counts = [0; PIN_STATES.len()];
                let mine = report.iter().filter(|entry| entry.upstream == upstream.settings.id && entry.kind != launch);
                for entry in mine {
                    if let Some(index) = PIN_STATES.iter().position(|state| *state == entry.state) {
                        counts[index] += 1;
                    }
                }
                counts
            })
            .collect()
    }

    /// Sets every upstream's gauges (at each scrape).
    pub(super) fn set_gauges(&self) {
        let roster = self.roster();
        let states = self.pin_states(&roster);
        for ((upstream, status), states) in roster.upstreams.iter().zip(self.status_on(&roster)).zip(&states) {
            upstream.series.set(&status, states);
        }
    }
}

impl Readiness for Gateway {
    /// Ready while at least one upstream is up and serves a definition (a gateway without
    /// upstreams has nothing to wait for).
    fn ready(&self) -> Result<(), &'static str> {
        let statuses = self.status();
        if statuses.is_empty() || statuses.iter().any(serving) { Ok(()) } else { Err("no upstream serves") }
    }

    fn detail(&self) -> Value {
        let roster = self.roster();
        let statuses = self.status_on(&roster);
        let states = self.pin_states(&roster);
        let upstreams: Vec<Detail<'_>> = statuses
            .iter()
            .zip(&states)
            .map(|(status, &[pending, held, approved, rejected])| Detail {
                id: &status.id,
                state: state_of(status),
                serving: serving(status),
                last_error: status.listing_error.as_deref().or(status.health.last_error.as_deref()),
                consecutive_failures: status.health.consecutive_failures,
                retry_at_ms: status.health.retry_at_ms,
                protocol: status.protocol.as_deref(),
                definitions: Definitions {
                    listed: status.listed,
                    served: status.served,
                    pending,
                    held,
                    approved,
                    rejected,
                },
                processes: status.processes,
            })
            .collect();
        serde_json::json!({ "upstreams": upstreams })
    }
}
