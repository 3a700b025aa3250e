//! Prometheus metrics: request counts by outcome, decision counts by stage, transport refusals
//! by reason, and a latency histogram, rendered in the text exposition format at `/metrics`.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::refusals::Reason;

/// Upper bounds of the latency histogram buckets, in seconds.
const BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// The server's metrics.
#[derive(Default)]
pub struct Metrics {
    responses_ok: AtomicU64,
    responses_error: AtomicU64,
    decisions: Mutex<Vec<(String, &'static str, u64)>>,
    latency_buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_micros: AtomicU64,
    transport_refusals: [AtomicU64; Reason::ALL.len()],
}

impl Metrics {
    /// Counts one finished request and its latency.
    pub fn observe_request(&self, ok: bool, elapsed: Duration) {
        if ok { &self.responses_ok } else { &self.responses_error }.fetch_add(1, Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&self.latency_buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_micros.fetch_add(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Counts one decision of a stage.
    pub fn observe_decision(&self, stage: &str, decision: &'static str) {
        let mut decisions = self.decisions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match decisions.iter_mut().find(|(s, d, _)| s == stage && *d == decision) {
            Some(entry) => entry.2 += 1,
            None => decisions.push((stage.to_owned(), decision, 1)),
        }
    }

    /// Counts one request the HTTP transport refused before the pipeline.
    pub(crate) fn observe_transport_refusal(&self, reason: Reason) {
        self.transport_refusals[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP palisade_requests_total MCP requests answered, by outcome.");
        let _ = writeln!(out, "# TYPE palisade_requests_total counter");
        let _ =
            writeln!(out, "palisade_requests_total{{outcome=\"ok\"}} {}", self.responses_ok.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "palisade_requests_total{{outcome=\"error\"}} {}",
            self.responses_error.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP palisade_decisions_total Pipeline decisions, by stage and decision.");
        let _ = writeln!(out, "# TYPE palisade_decisions_total counter");
        let decisions = self.decisions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (stage, decision, count) in decisions.iter() {
            let _ = writeln!(out, "palisade_decisions_total{{stage=\"{stage}\",decision=\"{decision}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "# HELP palisade_transport_refusals_total Requests the HTTP transport refused before the pipeline, by reason."
        );
        let _ = writeln!(out, "# TYPE palisade_transport_refusals_total counter");
        for (reason, count) in Reason::ALL.iter().zip(&self.transport_refusals) {
            let count = count.load(Ordering::Relaxed);
            let _ = writeln!(out, "palisade_transport_refusals_total{{reason=\"{}\"}} {count}", reason.as_str());
        }
        let _ = writeln!(out, "# HELP palisade_request_duration_seconds Time from a parsed request to its answer.");
        let _ = writeln!(out, "# TYPE palisade_request_duration_seconds histogram");
        for (bound, bucket) in BUCKETS.iter().zip(&self.latency_buckets) {
            let _ = writeln!(
                out,
                "palisade_request_duration_seconds_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(out, "palisade_request_duration_seconds_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.latency_sum_micros.load(Ordering::Relaxed) as f64 / 1_000_000.0;
        let _ = writeln!(out, "palisade_request_duration_seconds_sum {sum}");
        let _ = writeln!(out, "palisade_request_duration_seconds_count {count}");
        out
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
        metrics.observe_transport_refusal(Reason::Origin);
        let text = metrics.render();
        assert!(text.contains("palisade_requests_total{outcome=\"ok\"} 1"));
        assert!(text.contains("palisade_requests_total{outcome=\"error\"} 1"));
        assert!(text.contains("palisade_decisions_total{stage=\"authenticate\",decision=\"deny\"} 2"));
        assert!(text.contains("palisade_request_duration_seconds_bucket{le=\"0.0005\"} 1"));
        assert!(text.contains("palisade_request_duration_seconds_bucket{le=\"0.05\"} 2"));
        assert!(text.contains("palisade_request_duration_seconds_count 2"));
        assert!(text.contains("palisade_transport_refusals_total{reason=\"origin\"} 1"));
        assert!(text.contains("palisade_transport_refusals_total{reason=\"host\"} 0"));
    }
}
