//! Prometheus metrics: request counts by outcome, decision counts by stage, transport refusals
//! by reason, and a latency histogram, kept by the `metrics` crate's Prometheus recorder and
//! rendered in the text exposition format for `/metrics`.
//!
//! Each [`Metrics`] owns its own `PrometheusRecorder` (never installed as the process-wide
//! recorder): one process may run several servers (tests do), and each must count only its own
//! requests. The recorder is therefore called directly through the `Recorder` trait, not through
//! the `counter!` macros, and every counter of a fixed label set is registered once and kept as a
//! handle: recording is one atomic add, with no lock and no lookup on the request path.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Histogram, Key, KeyName, Label, Level, Metadata, Recorder as _, SharedString};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::refusal_reason::Reason;

/// Upper bounds of the latency histogram buckets, in seconds.
const BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

const REQUESTS: &str = "palisade_requests_total";
const DECISIONS: &str = "palisade_decisions_total";
const TRANSPORT_REFUSALS: &str = "palisade_transport_refusals_total";
const DURATION: &str = "palisade_request_duration_seconds";
const RELAY_DROPPED: &str = "palisade_answer_relay_dropped_total";

/// The pipeline's stages, whose decision counters are kept as handles once first used. A stage
/// not listed here is still counted (through the recorder's own registry, a hashed lookup).
const STAGES: [&str; 11] = [
    "envelope",
    "authenticate",
    "session",
    "classify",
    "killswitch",
    "authorize",
    "handles",
    "audit",
    "dispatch",
    "arguments",
    "confirmation",
];

/// The decisions of [`Metrics::observe_decision`] kept as handles.
const DECISION_KINDS: [&str; 2] = ["allow", "deny"];

/// Latency samples recorded between two drains of the histogram into its buckets. Without a
/// scrape the recorder would keep every sample; draining every this many bounds that memory.
const UPKEEP_EVERY: u64 = 1024;

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The server's metrics.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    responses_ok: Counter,
    responses_error: Counter,
    latency: Histogram,
    latency_samples: AtomicU64,
    transport_refusals: [Counter; Reason::ALL.len()],
    decisions: [[OnceLock<Counter>; DECISION_KINDS.len()]; STAGES.len()],
}

impl Default for Metrics {
    fn default() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(DURATION.to_owned()), &BUCKETS)
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
        recorder.describe_histogram(
            KeyName::from_const_str(DURATION),
            None,
            SharedString::const_str("Time from a parsed request to its answer."),
        );
        let counter = |name: &'static str, labels: Vec<Label>| {
            recorder.register_counter(&Key::from_parts(name, labels), &METADATA)
        };
        let outcome = |value: &'static str| counter(REQUESTS, vec![Label::from_static_parts("outcome", value)]);
        let responses_ok = outcome("ok");
        let responses_error = outcome("error");
        let transport_refusals = Reason::ALL
            .map(|reason| counter(TRANSPORT_REFUSALS, vec![Label::from_static_parts("reason", reason.as_str())]));
        let latency = recorder.register_histogram(&Key::from_static_name(DURATION), &METADATA);
        let handle = recorder.handle();
        Self {
            recorder,
            handle,
            responses_ok,
            responses_error,
            latency,
            latency_samples: AtomicU64::new(0),
            transport_refusals,
            decisions: Default::default(),
        }
    }
}

impl Metrics {
    /// Counts one finished request and its latency.
    pub fn observe_request(&self, ok: bool, elapsed: Duration) {
        if ok { &self.responses_ok } else { &self.responses_error }.increment(1);
        self.latency.record(elapsed.as_secs_f64());
        if self.latency_samples.fetch_add(1, Ordering::Relaxed) % UPKEEP_EVERY == UPKEEP_EVERY - 1 {
            self.handle.run_upkeep();
        }
    }

    /// Counts one decision of a stage.
    pub fn observe_decision(&self, stage: &str, decision: &'static str) {
        let known =
            STAGES.iter().position(|known| *known == stage).zip(DECISION_KINDS.iter().position(|d| *d == decision));
        match known {
            Some((stage_index, decision_index)) => self.decisions[stage_index][decision_index]
                .get_or_init(|| self.decision_counter(STAGES[stage_index], DECISION_KINDS[decision_index]))
                .increment(1),
            None => self.decision_counter(stage, decision).increment(1),
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

    /// Counts one message from the answer relay channel that was dropped (oversized,
    /// malformed, or not authenticated); rare, so looked up in the recorder each time.
    pub fn observe_relay_drop(&self, reason: &'static str) {
        let key = Key::from_parts(RELAY_DROPPED, vec![Label::from_static_parts("reason", reason)]);
        self.recorder.register_counter(&key, &METADATA).increment(1);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        self.handle.render()
    }
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
        assert!(text.contains("palisade_requests_total{outcome=\"ok\"} 1"), "{text}");
        assert!(text.contains("palisade_requests_total{outcome=\"error\"} 1"), "{text}");
        assert!(text.contains("palisade_decisions_total{stage=\"authenticate\",decision=\"deny\"} 2"), "{text}");
        assert!(
            text.contains("palisade_decisions_total{stage=\"a stage of tomorrow\",decision=\"allow\"} 1"),
            "{text}"
        );
        assert!(!text.contains("stage=\"authorize\""), "a decision never made is not rendered: {text}");
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
        assert!(!other.contains("stage=\"envelope\""), "{other}");
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
}
