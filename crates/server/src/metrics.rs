//! Prometheus metrics, kept by the `metrics` crate's Prometheus recorder and rendered in the
//! text exposition format for `/metrics`: requests by outcome, pipeline decisions by stage,
//! transport refusals by reason, the request latency histogram; per tool (calls by outcome,
//! refusals by stage, latency); the kill switch's check and authority latency; the audit
//! segment's shipping backlog and lag; and the series an application registers of its own (the
//! gateway's per-upstream ones) through [`Metrics::counter`], [`Metrics::gauge`],
//! [`Metrics::histogram`] and [`Metrics::on_scrape`].
//!
//! Each [`Metrics`] owns its own `PrometheusRecorder` (never installed as the process-wide
//! recorder): one process may run several servers (tests do), and each must count only its own
//! requests. The recorder is therefore called directly through the `Recorder` trait, not through
//! the `counter!` macros, and every counter of a fixed label set is registered once and kept as a
//! handle: recording is one atomic add, with no lock and no lookup on the request path. A tool's
//! series are registered at its first call and found again by name (one read lock, no
//! allocation).
//!
//! **Cardinality:** labels take values from fixed sets (stages, outcomes, reasons), the
//! registry's own tool names (bounded by the published registry, and at most
//! [`MAX_TOOL_SERIES`] tools) and the configured upstream ids, never a subject, an argument or
//! a client's string.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder as _, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::refusal_reason::Reason;

/// Upper bounds of every latency histogram's buckets (metrics named `*_seconds`), in seconds.
const BUCKETS: [f64; 15] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

const REQUESTS: &str = "palisade_requests_total";
const DECISIONS: &str = "palisade_decisions_total";
const TRANSPORT_REFUSALS: &str = "palisade_transport_refusals_total";
const DURATION: &str = "palisade_request_duration_seconds";
const RELAY_DROPPED: &str = "palisade_answer_relay_dropped_total";
const TOOL_CALLS: &str = "palisade_tool_calls_total";
const TOOL_REFUSALS: &str = "palisade_tool_refusals_total";
const TOOL_DURATION: &str = "palisade_tool_call_duration_seconds";
const KILLSWITCH_CHECK: &str = "palisade_killswitch_check_duration_seconds";
const KILLSWITCH_AUTHORITY: &str = "palisade_killswitch_authority_duration_seconds";
const AUDIT_BACKLOG: &str = "palisade_audit_shipping_backlog_bytes";
const AUDIT_LAG: &str = "palisade_audit_shipping_lag_seconds";
const AUDIT_APPEND_FAILURES: &str = "palisade_audit_append_failures_total";

/// The stages decisions are counted under. Their refusal counters exist from the start (at 0),
/// so that a dashboard's rate of refusals has a series before the first one: `rate_limit` and
/// `policy` included, for the stages that will refuse under those names. A stage not listed
/// here is still counted (through the recorder's own registry, a hashed lookup).
pub const STAGES: [&str; 14] = [
    "envelope",
    "authenticate",
    "session",
    "classify",
    "delegation",
    "killswitch",
    "authorize",
    "handles",
    "audit",
    "dispatch",
    "arguments",
    "confirmation",
    "rate_limit",
    "policy",
];

/// Why a message on the answer relay channel is dropped: too large, not the relay's format, or
/// its tag does not verify. Each counter exists from the start (at 0).
pub const RELAY_DROP_REASONS: [&str; 3] = ["oversized", "malformed", "forged"];

/// Tools with series of their own; calls of further tools are counted under `tool="(other)"`.
pub const MAX_TOOL_SERIES: usize = 2048;

/// The tool label of calls past [`MAX_TOOL_SERIES`] tools.
const OTHER_TOOLS: &str = "(other)";

/// Latency samples recorded between two drains of the histograms into their buckets. Without a
/// scrape the recorder would keep every sample; draining every this many bounds that memory.
const UPKEEP_EVERY: u64 = 1024;

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// How one tool call ended, for `palisade_tool_calls_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// A result that is not an error.
    Ok,
    /// A JSON-RPC error after the allow, or a result with `isError`.
    Error,
    /// Refused by a stage of the pipeline (counted by stage too).
    Refused,
    /// The caller cancelled it or went away before the answer.
    Cancelled,
}

impl CallOutcome {
    const ALL: [CallOutcome; 4] = [Self::Ok, Self::Error, Self::Refused, Self::Cancelled];

    fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Refused => "refused",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The series of one tool: calls by outcome, refusals by stage, latency.
pub struct ToolSeries {
    tool: Box<str>,
    upstream: Box<str>,
    calls: [Counter; CallOutcome::ALL.len()],
    refusals: [OnceLock<Counter>; STAGES.len()],
    latency: Histogram,
}

/// A scrape hook ([`Metrics::on_scrape`]).
type ScrapeHook = Box<dyn Fn() + Send + Sync>;

/// The server's metrics.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    responses_ok: Counter,
    responses_error: Counter,
    latency: Histogram,
    latency_samples: AtomicU64,
    transport_refusals: [Counter; Reason::ALL.len()],
    relay_drops: [Counter; RELAY_DROP_REASONS.len()],
    denials: [Counter; STAGES.len()],
    allows: [OnceLock<Counter>; STAGES.len()],
    tools: RwLock<HashMap<Box<str>, Arc<ToolSeries>>>,
    killswitch_check: Histogram,
    killswitch_authority: Histogram,
    scrape_hooks: Mutex<Vec<ScrapeHook>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &BUCKETS)
            // Only an empty bucket list is refused; this one is a constant.
            .expect("the latency buckets are not empty")
            .build_recorder();
        let describe = |name: &'static str, help: &'static str| {
            recorder.describe_counter(KeyName::from_const_str(name), None, SharedString::const_str(help));
        };
        describe(REQUESTS, "MCP requests answered, by outcome.");
        describe(DECISIONS, "Pipeline decisions, by stage and decision.");
        describe(TRANSPORT_REFUSALS, "Requests the HTTP transport refused before the pipeline, by reason.");
        describe(RELAY_DROPPED, "Messages on the answer relay channel dropped undelivered, by reason.");
        describe(TOOL_CALLS, "Tool calls, by tool, its upstream and outcome (ok, error, refused, cancelled).");
        describe(TOOL_REFUSALS, "Tool calls refused, by tool, its upstream and the refusing stage.");
        let describe_histogram = |name: &'static str, help: &'static str| {
            recorder.describe_histogram(
                KeyName::from_const_str(name),
                Some(Unit::Seconds),
                SharedString::const_str(help),
            );
        };
        describe_histogram(DURATION, "Time from a parsed request to its answer.");
        describe_histogram(TOOL_DURATION, "Time from a parsed tool call to its answer, by tool and its upstream.");
        describe_histogram(KILLSWITCH_CHECK, "Time the kill switch's check of one request took (stage 4).");
        describe_histogram(KILLSWITCH_AUTHORITY, "Round trips to the kill switch's disable authority.");
        let counter = |name: &'static str, labels: Vec<Label>| {
            recorder.register_counter(&Key::from_parts(name, labels), &METADATA)
        };
        let outcome = |value: &'static str| counter(REQUESTS, vec![Label::from_static_parts("outcome", value)]);
        let responses_ok = outcome("ok");
        let responses_error = outcome("error");
        let transport_refusals = Reason::ALL
            .map(|reason| counter(TRANSPORT_REFUSALS, vec![Label::from_static_parts("reason", reason.as_str())]));
        let relay_drops =
            RELAY_DROP_REASONS.map(|reason| counter(RELAY_DROPPED, vec![Label::from_static_parts("reason", reason)]));
        let denials = STAGES.map(|stage| {
            counter(
                DECISIONS,
                vec![Label::from_static_parts("stage", stage), Label::from_static_parts("decision", "deny")],
            )
        });
        let histogram = |name: &'static str| recorder.register_histogram(&Key::from_static_name(name), &METADATA);
        let latency = histogram(DURATION);
        let killswitch_check = histogram(KILLSWITCH_CHECK);
        let killswitch_authority = histogram(KILLSWITCH_AUTHORITY);
        let handle = recorder.handle();
        Self {
            recorder,
            handle,
            responses_ok,
            responses_error,
            latency,
            latency_samples: AtomicU64::new(0),
            transport_refusals,
            relay_drops,
            denials,
            allows: Default::default(),
            tools: RwLock::default(),
            killswitch_check,
            killswitch_authority,
            scrape_hooks: Mutex::default(),
        }
    }
}

impl Metrics {
    /// Counts one finished request and its latency.
    pub fn observe_request(&self, ok: bool, elapsed: Duration) {
        if ok { &self.responses_ok } else { &self.responses_error }.increment(1);
        self.record_seconds(&self.latency, elapsed);
    }

    /// Records `elapsed` in a latency histogram of this recorder, draining every histogram into
    /// its buckets every [`UPKEEP_EVERY`] samples.
    pub fn record_seconds(&self, histogram: &Histogram, elapsed: Duration) {
        histogram.record(elapsed.as_secs_f64());
        if self.latency_samples.fetch_add(1, Ordering::Relaxed) % UPKEEP_EVERY == UPKEEP_EVERY - 1 {
            self.handle.run_upkeep();
        }
    }

    /// Counts one decision of a stage.
    pub fn observe_decision(&self, stage: &str, decision: &'static str) {
        let known = STAGES.iter().position(|known| *known == stage);
        match (known, decision) {
            (Some(index), "deny") => self.denials[index].increment(1),
            (Some(index), "allow") => {
                self.allows[index].get_or_init(|| self.decision_counter(STAGES[index], "allow")).increment(1)
            }
            _ => self.decision_counter(stage, decision).increment(1),
        }
    }

    fn decision_counter(&self, stage: &str, decision: &'static str) -> Counter {
        let labels = vec![Label::new("stage", stage.to_owned()), Label::from_static_parts("decision", decision)];
        self.recorder.register_counter(&Key::from_parts(DECISIONS, labels), &METADATA)
    }

    /// Counts one request the HTTP transport refused before the pipeline.
    pub(crate) fn observe_transport_refusal(&self, reason: Reason) {
        self.transport_refusals[reason.index()].increment(1);
    }

    /// Counts one message from the answer relay channel that was dropped, by one of
    /// [`RELAY_DROP_REASONS`] (another reason is looked up in the recorder each time).
    pub fn observe_relay_drop(&self, reason: &'static str) {
        match RELAY_DROP_REASONS.iter().position(|known| *known == reason) {
            Some(index) => self.relay_drops[index].increment(1),
            None => {
                let key = Key::from_parts(RELAY_DROPPED, vec![Label::from_static_parts("reason", reason)]);
                self.recorder.register_counter(&key, &METADATA).increment(1);
            }
        }
    }

    /// The series of the registered tool `tool` (relayed from `upstream`, for the gateway):
    /// registered at its first call, then found by name. Past [`MAX_TOOL_SERIES`] tools, one
    /// shared series counts the rest.
    pub fn tool(&self, tool: &str, upstream: Option<&str>) -> Arc<ToolSeries> {
        if let Some(series) = read(&self.tools).get(tool) {
            return series.clone();
        }
        let mut tools = self.tools.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(series) = tools.get(tool) {
            return series.clone();
        }
        let (tool, upstream) =
            if tools.len() >= MAX_TOOL_SERIES { (OTHER_TOOLS, "") } else { (tool, upstream.unwrap_or("")) };
        let series = tools.entry(tool.into()).or_insert_with(|| Arc::new(self.tool_series(tool, upstream)));
        series.clone()
    }

    fn tool_series(&self, tool: &str, upstream: &str) -> ToolSeries {
        let labels = |extra: Label| {
            vec![Label::new("tool", tool.to_owned()), Label::new("upstream", upstream.to_owned()), extra]
        };
        let calls = CallOutcome::ALL.map(|outcome| {
            let key = Key::from_parts(TOOL_CALLS, labels(Label::from_static_parts("outcome", outcome.as_str())));
            self.recorder.register_counter(&key, &METADATA)
        });
        let key = Key::from_parts(
            TOOL_DURATION,
            vec![Label::new("tool", tool.to_owned()), Label::new("upstream", upstream.to_owned())],
        );
        ToolSeries {
            tool: tool.into(),
            upstream: upstream.into(),
            calls,
            refusals: Default::default(),
            latency: self.recorder.register_histogram(&key, &METADATA),
        }
    }

    /// Counts one finished call of a tool: its outcome and latency.
    pub fn observe_tool_call(&self, series: &ToolSeries, outcome: CallOutcome, elapsed: Duration) {
        series.calls[outcome as usize].increment(1);
        self.record_seconds(&series.latency, elapsed);
    }

    /// Counts one refusal of a call of a tool, by the refusing stage.
    pub fn observe_tool_refusal(&self, series: &ToolSeries, stage: &str) {
        let register = |stage: &str| {
            let labels = vec![
                Label::new("tool", series.tool.to_string()),
                Label::new("upstream", series.upstream.to_string()),
                Label::new("stage", stage.to_owned()),
            ];
            self.recorder.register_counter(&Key::from_parts(TOOL_REFUSALS, labels), &METADATA)
        };
        match STAGES.iter().position(|known| *known == stage) {
            Some(index) => series.refusals[index].get_or_init(|| register(STAGES[index])).increment(1),
            None => register(stage).increment(1),
        }
    }

    /// Records how long one check of the kill switch took (stage 4).
    pub fn observe_killswitch_check(&self, elapsed: Duration) {
        self.record_seconds(&self.killswitch_check, elapsed);
    }

    /// The histogram of round trips to the kill switch's authority, for the switch to record into.
    pub fn killswitch_authority(&self) -> Histogram {
        self.killswitch_authority.clone()
    }

    /// Registers a counter of an application's own (`name` prefixed `palisade_`, labels from a
    /// bounded set): keep the handle and increment it.
    pub fn counter(&self, name: &'static str, help: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        self.recorder.describe_counter(KeyName::from_const_str(name), None, SharedString::const_str(help));
        self.recorder.register_counter(&key(name, labels), &METADATA)
    }

    /// Registers a gauge of an application's own (see [`Metrics::counter`]).
    pub fn gauge(&self, name: &'static str, help: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        self.recorder.describe_gauge(KeyName::from_const_str(name), None, SharedString::const_str(help));
        self.recorder.register_gauge(&key(name, labels), &METADATA)
    }

    /// Registers a latency histogram of an application's own (`name` ends in `_seconds`; record
    /// with [`Metrics::record_seconds`]).
    pub fn histogram(&self, name: &'static str, help: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        self.recorder.describe_histogram(
            KeyName::from_const_str(name),
            Some(Unit::Seconds),
            SharedString::const_str(help),
        );
        self.recorder.register_histogram(&key(name, labels), &METADATA)
    }

    /// Runs `hook` before every rendering, to set gauges that are read rather than counted (an
    /// upstream's health, the audit backlog). A hook must not render.
    pub fn on_scrape(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.scrape_hooks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Box::new(hook));
    }

    /// Sets the audit segment's shipping gauges: bytes written and not yet in the store, and
    /// how long the oldest of them has waited (0 when nothing waits).
    pub fn set_audit_shipping(&self, backlog_bytes: u64, lag: Duration) {
        let gauge = |name: &'static str, help: &'static str| self.gauge(name, help, &[]);
        #[allow(clippy::cast_precision_loss)] // a backlog is far below 2^52 bytes
        gauge(AUDIT_BACKLOG, "Audit record bytes written to the local segment and not yet in the store.")
            .set(backlog_bytes as f64);
        gauge(AUDIT_LAG, "Seconds the oldest audit record not yet in the store has waited (0: none waits).")
            .set(lag.as_secs_f64());
    }

    /// One audit record that could not be made durable (its request refused, fail closed): the
    /// store down with the local segment's backlog full, the segment unwritable, or the writer
    /// shut down.
    pub fn observe_audit_append_failure(&self) {
        self.counter(
            AUDIT_APPEND_FAILURES,
            "Audit records that could not be made durable; each refused its request (fail closed).",
            &[],
        )
        .increment(1);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        for hook in self.scrape_hooks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
            hook();
        }
        self.handle.render()
    }
}

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    let labels: Vec<Label> = labels.iter().map(|(key, value)| Label::new(*key, (*value).to_owned())).collect();
    Key::from_parts(name, labels)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_cumulative_buckets() {
        let metrics = Metrics::default();
        metrics.observe_request(true, Duration::from_micros(300));
        metrics.observe_request(false, Duration::from_millis(30));
        metrics.observe_decision("authenticate", "deny");
        metrics.observe_decision("authenticate", "deny");
        metrics.observe_decision("a stage of tomorrow", "allow");
        metrics.observe_transport_refusal(Reason::Origin);
        metrics.observe_relay_drop("forged");
        let text = metrics.render();
        assert!(text.contains("palisade_answer_relay_dropped_total{reason=\"forged\"} 1"), "{text}");
        assert!(text.contains("palisade_answer_relay_dropped_total{reason=\"oversized\"} 0"), "{text}");
        assert!(text.contains("palisade_requests_total{outcome=\"ok\"} 1"), "{text}");
        assert!(text.contains("palisade_requests_total{outcome=\"error\"} 1"), "{text}");
        assert!(text.contains("palisade_decisions_total{stage=\"authenticate\",decision=\"deny\"} 2"), "{text}");
        assert!(
            text.contains("palisade_decisions_total{stage=\"a stage of tomorrow\",decision=\"allow\"} 1"),
            "{text}"
        );
        assert!(
            !text.contains("stage=\"authorize\",decision=\"allow\""),
            "an allow never made is not rendered: {text}"
        );
        for stage in ["authorize", "rate_limit", "policy"] {
            let zero = format!("palisade_decisions_total{{stage=\"{stage}\",decision=\"deny\"}} 0");
            assert!(text.contains(&zero), "every known stage's refusals are rendered from the start: {text}");
        }
        assert!(text.contains("palisade_request_duration_seconds_bucket{le=\"0.0005\"} 1"), "{text}");
        assert!(text.contains("palisade_request_duration_seconds_bucket{le=\"0.05\"} 2"), "{text}");
        assert!(text.contains("palisade_request_duration_seconds_bucket{le=\"+Inf\"} 2"), "{text}");
        assert!(text.contains("palisade_request_duration_seconds_count 2"), "{text}");
        assert!(text.contains("palisade_transport_refusals_total{reason=\"origin\"} 1"), "{text}");
        assert!(text.contains("palisade_transport_refusals_total{reason=\"host\"} 0"), "{text}");
        assert!(text.contains("# TYPE palisade_requests_total counter"), "{text}");
        assert!(text.contains("# TYPE palisade_request_duration_seconds histogram"), "{text}");
        assert!(text.contains("# HELP palisade_decisions_total Pipeline decisions, by stage and decision."), "{text}");
    }

    /// Two servers in one process count apart: no process-wide recorder.
    #[test]
    fn each_instance_counts_only_its_own() {
        let (one, two) = (Metrics::default(), Metrics::default());
        one.observe_request(true, Duration::from_millis(1));
        one.observe_decision("envelope", "allow");
        assert!(one.render().contains("palisade_requests_total{outcome=\"ok\"} 1"));
        let other = two.render();
        assert!(other.contains("palisade_requests_total{outcome=\"ok\"} 0"), "{other}");
        assert!(!other.contains("stage=\"envelope\",decision=\"allow\""), "{other}");
    }

    /// Samples are drained into the buckets without a scrape, and the counts stay exact.
    #[test]
    fn histogram_upkeep_keeps_every_sample() {
        let metrics = Metrics::default();
        for _ in 0..(UPKEEP_EVERY * 2 + 5) {
            metrics.observe_request(true, Duration::from_micros(100));
        }
        let text = metrics.render();
        let count = UPKEEP_EVERY * 2 + 5;
        assert!(text.contains(&format!("palisade_request_duration_seconds_count {count}")), "{text}");
        assert!(text.contains(&format!("palisade_request_duration_seconds_bucket{{le=\"0.0005\"}} {count}")), "{text}");
    }

    /// A tool's series: calls by outcome, refusals by stage (only the stages that refused it),
    /// latency; the registry's name and the upstream as labels, and past the cap one shared series.
    #[test]
    fn tools_count_calls_refusals_and_latency() {
        let metrics = Metrics::default();
        let echo = metrics.tool("everything__echo", Some("everything"));
        metrics.observe_tool_call(&echo, CallOutcome::Ok, Duration::from_millis(3));
        metrics.observe_tool_refusal(&echo, "authorize");
        metrics.observe_tool_call(&echo, CallOutcome::Refused, Duration::from_micros(200));
        let again = metrics.tool("everything__echo", Some("everything"));
        assert!(Arc::ptr_eq(&echo, &again), "registered once");
        let local = metrics.tool("local", None);
        metrics.observe_tool_call(&local, CallOutcome::Cancelled, Duration::from_millis(1));
        let text = metrics.render();
        let echo_labels = "tool=\"everything__echo\",upstream=\"everything\"";
        for line in [
            format!("palisade_tool_calls_total{{{echo_labels},outcome=\"ok\"}} 1"),
            format!("palisade_tool_calls_total{{{echo_labels},outcome=\"refused\"}} 1"),
            format!("palisade_tool_calls_total{{{echo_labels},outcome=\"error\"}} 0"),
            format!("palisade_tool_refusals_total{{{echo_labels},stage=\"authorize\"}} 1"),
            format!("palisade_tool_call_duration_seconds_count{{{echo_labels}}} 2"),
            "palisade_tool_calls_total{tool=\"local\",upstream=\"\",outcome=\"cancelled\"} 1".to_owned(),
        ] {
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(!text.contains("stage=\"killswitch\"}"), "no refusal series for a stage that never refused: {text}");
        for index in 0..MAX_TOOL_SERIES {
            metrics.tool(&format!("t{index}"), None);
        }
        let past = metrics.tool("one too many", Some("u"));
        metrics.observe_tool_call(&past, CallOutcome::Ok, Duration::from_millis(1));
        let text = metrics.render();
        assert!(!text.contains("one too many"), "{text}");
        assert!(text.contains("palisade_tool_calls_total{tool=\"(other)\",upstream=\"\",outcome=\"ok\"} 1"));
    }

    /// An application's own series, a scrape hook setting a gauge, and the audit shipping gauges.
    #[test]
    fn applications_register_their_own_series_and_scrape_hooks_run_before_rendering() {
        let metrics = Arc::new(Metrics::default());
        let errors =
            metrics.counter("palisade_upstream_errors_total", "Errors.", &[("upstream", "a"), ("kind", "timeout")]);
        errors.increment(2);
        let latency = metrics.histogram("palisade_upstream_request_duration_seconds", "Latency.", &[("upstream", "a")]);
        metrics.record_seconds(&latency, Duration::from_millis(7));
        let up = metrics.gauge("palisade_upstream_up", "Up.", &[("upstream", "a")]);
        let scrapes = Arc::new(AtomicU64::new(0));
        let seen = scrapes.clone();
        metrics.on_scrape(move || up.set(seen.fetch_add(1, Ordering::Relaxed) as f64 + 1.0));
        metrics.set_audit_shipping(512, Duration::from_millis(1500));
        metrics.observe_killswitch_check(Duration::from_millis(2));
        metrics.killswitch_authority().record(0.02);
        let text = metrics.render();
        for line in [
            "palisade_upstream_errors_total{upstream=\"a\",kind=\"timeout\"} 2",
            "palisade_upstream_request_duration_seconds_bucket{upstream=\"a\",le=\"0.01\"} 1",
            "palisade_upstream_up{upstream=\"a\"} 1",
            "palisade_audit_shipping_backlog_bytes 512",
            "palisade_audit_shipping_lag_seconds 1.5",
            "palisade_killswitch_check_duration_seconds_count 1",
            "palisade_killswitch_authority_duration_seconds_bucket{le=\"0.025\"} 1",
            "# TYPE palisade_upstream_up gauge",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(metrics.render().contains("palisade_upstream_up{upstream=\"a\"} 2"), "the hook runs at every scrape");
    }
}
