//! Logging and optional OpenTelemetry trace export for `serve`.
//!
//! Logs go to stderr, filtered by `PALISADE_LOG` ([`LogFormat`]: readable text on a terminal,
//! JSON lines otherwise, or as `PALISADE_LOG_FORMAT=text|json` says). When `[telemetry]` names a collector, an
//! OpenTelemetry layer joins the same subscriber; it sees only the request spans and decision
//! events of [`palisade_server::telemetry`] (its own target), never other crates' spans or
//! events, and the log layer never sees those spans, so log lines are the same either way.
//!
//! Export is OTLP/HTTP protobuf through the SDK's batch processor. That processor exports on a
//! thread of its own, outside the Tokio runtime, so the HTTP client is reqwest's blocking one
//! (an async client there has no reactor and every export would fail).

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::settings::TelemetrySettings;

/// How long one export may take (connect, send, answer).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long shutdown waits for the last spans to reach the collector.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The running exporter. [`Telemetry::shutdown`] flushes what is still queued.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Builds the exporter and tracer provider. Nothing is sent until spans end.
    pub fn start(settings: &TelemetrySettings) -> anyhow::Result<Self> {
        // No redirects and no proxies: spans go to the configured collector or nowhere.
        let client = reqwest::blocking::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .connect_timeout(EXPORT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("palisade/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| anyhow::anyhow!("building the trace exporter's HTTP client: {error}"))?;
        let headers: HashMap<String, String> = settings.headers.0.iter().cloned().collect();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(settings.traces_url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .with_headers(headers)
            .build()
            .map_err(|error| anyhow::anyhow!("building the trace exporter: {error}"))?;
        let resource = Resource::builder()
            .with_service_name(settings.service_name.clone())
            .with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Reporting(exporter))
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sampling_ratio))))
            .with_resource(resource)
            .build();
        Ok(Self { provider })
    }

    /// Exports what is still queued (bounded by a timeout) and stops the exporter.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(%error, "trace export: flushing at shutdown failed");
        }
    }
}

/// The environment variable that picks the log format.
pub const LOG_FORMAT_VAR: &str = "PALISADE_LOG_FORMAT";

/// How log lines are written on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event (colours only on a terminal).
    Text,
    /// One JSON object per line, for a log collector.
    Json,
}

impl LogFormat {
    /// `PALISADE_LOG_FORMAT` (`text` or `json`) when set, else text when stderr is a terminal
    /// and JSON otherwise. Any other value is an error naming the variable and the choices.
    pub fn from_env() -> anyhow::Result<Self> {
        use std::io::IsTerminal as _;
        let value = std::env::var_os(LOG_FORMAT_VAR);
        Self::choose(value.as_ref().map(|value| value.to_string_lossy()).as_deref(), std::io::stderr().is_terminal())
    }

    fn choose(value: Option<&str>, terminal: bool) -> anyhow::Result<Self> {
        match value.map(str::trim) {
            None | Some("") => Ok(if terminal { Self::Text } else { Self::Json }),
            Some(value) if value.eq_ignore_ascii_case("text") => Ok(Self::Text),
            Some(value) if value.eq_ignore_ascii_case("json") => Ok(Self::Json),
            Some(value) => anyhow::bail!(
                "{LOG_FORMAT_VAR} = {}: expected `text` or `json`",
                palisade_base::reveal::reveal_line(value)
            ),
        }
    }
}

/// Installs the global subscriber: logs on stderr in `format`, filtered by `PALISADE_LOG`, plus
/// the trace layer when `telemetry` is on.
pub fn init(telemetry: Option<&Telemetry>, format: LogFormat) {
    subscriber(telemetry, format).init();
}

fn subscriber(telemetry: Option<&Telemetry>, format: LogFormat) -> tracing::Dispatch {
    use palisade_server::telemetry::TARGET;
    use std::io::IsTerminal as _;
    let env_filter = tracing_subscriber::EnvFilter::try_from_env("PALISADE_LOG").unwrap_or_else(|_| "info".into());
    // Request spans and their decision events are for the trace layer only.
    let not_traces = tracing_subscriber::filter::filter_fn(|metadata| metadata.target() != TARGET);
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Json => lines.json().boxed(),
        LogFormat::Text => lines.with_ansi(std::io::stderr().is_terminal()).boxed(),
    }
    .with_filter(tracing_subscriber::filter::FilterExt::and(env_filter, not_traces));
    let Some(telemetry) = telemetry else {
        // Only the log layer: the request spans' call sites are then off for good (an absent
        // optional layer would keep every call site asking at run time).
        return tracing::Dispatch::new(tracing_subscriber::registry().with(logs));
    };
    let traces = tracing_opentelemetry::layer()
        .with_tracer(telemetry.provider.tracer("palisade"))
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|metadata| metadata.target() == TARGET));
    tracing::Dispatch::new(tracing_subscriber::registry().with(logs).with(traces))
}

/// The OTLP exporter, reporting failed exports on the log (the SDK's own diagnostics are off).
#[derive(Debug)]
struct Reporting(opentelemetry_otlp::SpanExporter);

impl SpanExporter for Reporting {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.0.export(batch).await;
        if let Err(error) = &result {
            tracing::warn!(%error, spans, "trace export failed; these spans are dropped");
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use palisade_server::telemetry::TARGET;

    use super::*;

    #[test]
    fn request_spans_exist_only_for_the_trace_layer() {
        // Call sites seen before any subscriber: disabled, but with their metadata.
        let request = tracing::info_span!(target: TARGET, "probe");
        let log = tracing::info_span!("probe");
        let (request, log) = (request.metadata().unwrap(), log.metadata().unwrap());

        // Off: the request span's call site is never enabled (no per-request check at all).
        let off = subscriber(None, LogFormat::Json);
        assert!(off.register_callsite(request).is_never());
        assert!(!off.register_callsite(log).is_never());

        // On: the trace layer takes it.
        let on = Telemetry { provider: SdkTracerProvider::builder().build() };
        assert!(!subscriber(Some(&on), LogFormat::Text).register_callsite(request).is_never());
    }

    #[test]
    fn the_log_format_follows_the_variable_then_the_terminal() {
        assert_eq!(LogFormat::choose(None, true).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::choose(None, false).unwrap(), LogFormat::Json);
        assert_eq!(LogFormat::choose(Some(""), false).unwrap(), LogFormat::Json);
        assert_eq!(LogFormat::choose(Some("text"), false).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::choose(Some("JSON"), true).unwrap(), LogFormat::Json);
        let error = LogFormat::choose(Some("yaml"), true).unwrap_err().to_string();
        assert_eq!(error, "PALISADE_LOG_FORMAT = yaml: expected `text` or `json`");
    }
}
