//! `[telemetry]`: OpenTelemetry trace export, its collector and the collector's headers
//! (credentials: never read from the file, never shown).

use std::path::PathBuf;

use serde::Deserialize;

use super::error::{ConfigError, bad};
use super::keys;

/// `[telemetry]`. Collector credentials are never read from the file: see
/// `PALISADE_TELEMETRY_OTLP_HEADERS` and `otlp_headers_file`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// OTLP/HTTP (protobuf) collector base URL, e.g. `http://127.0.0.1:4318`; `/v1/traces` is
    /// appended unless the path already ends with it. Unset: no export.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans. Default `palisade`.
    pub service_name: Option<String>,
    /// Fraction of new traces sampled, 0.0–1.0. Default 1.0. A continued trace follows the
    /// caller's sampled flag.
    pub sampling_ratio: Option<f64>,
    /// A file of `Name: value` lines sent as headers to the collector (credentials).
    pub otlp_headers_file: Option<PathBuf>,
    /// Whether a request's `_meta.traceparent` is continued (its trace id becomes the audit
    /// trace id). Default `true`; `false` starts a trace per request.
    pub continue_incoming_traces: Option<bool>,
    /// `PALISADE_TELEMETRY_OTLP_HEADERS` (environment only): `name=value` pairs, comma-separated.
    #[serde(skip)]
    pub otlp_headers: Option<String>,
}

/// Validated trace export settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetrySettings {
    /// The full OTLP/HTTP traces URL (`…/v1/traces`).
    pub traces_url: String,
    /// `service.name`.
    pub service_name: String,
    /// Ratio of new traces sampled.
    pub sampling_ratio: f64,
    /// Headers for the collector (secrets: never printed).
    pub headers: CollectorHeaders,
    /// Continue callers' W3C trace context.
    pub continue_incoming_traces: bool,
}

/// Collector headers. `Debug` shows the names only; values may be credentials.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CollectorHeaders(pub Vec<(String, String)>);

impl std::fmt::Debug for CollectorHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(name, _)| format!("{name}: <redacted>"))).finish()
    }
}

/// The largest header file read.
const MAX_HEADERS_FILE_BYTES: u64 = 64 * 1024;

/// Checks one collector header. Errors never echo the value.
fn collector_header(key: &str, name: &str, value: &str) -> Result<(String, String), ConfigError> {
    let name = name.trim();
    let value = value.trim();
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(bad(key, "a header name is empty or not an HTTP token"));
    }
    if value.is_empty() || !value.chars().all(|c| c == '\t' || (' '..='~').contains(&c)) {
        return Err(bad(key, format!("the value of header `{name}` is empty or not visible ASCII")));
    }
    Ok((name.to_ascii_lowercase(), value.to_owned()))
}

/// `name=value,name=value` (the environment form).
fn parse_header_pairs(key: &str, text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').ok_or_else(|| bad(key, "expected name=value pairs"))?;
            collector_header(key, name, value)
        })
        .collect()
}

/// `Name: value` lines; blank lines and `#` comments ignored (the file form).
fn parse_header_lines(key: &str, text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.trim_start().starts_with('#'))
        .map(|line| {
            let (name, value) = line.split_once(':').ok_or_else(|| bad(key, "expected `Name: value` lines"))?;
            collector_header(key, name, value)
        })
        .collect()
}

/// The traces URL of an OTLP/HTTP endpoint: http(s), a host, no credentials, query or fragment;
/// `/v1/traces` appended to a base URL.
fn traces_url(key: &str, endpoint: &str) -> Result<String, ConfigError> {
    let mut url = url::Url::parse(endpoint.trim()).map_err(|_| bad(key, "must be an absolute http(s) URL"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad(key, "must be an http:// or https:// URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(key, "must not carry credentials; use PALISADE_TELEMETRY_OTLP_HEADERS or otlp_headers_file"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad(key, "must not have a query or a fragment"));
    }
    if !url.path().ends_with("/v1/traces") {
        let path = format!("{}/v1/traces", url.path().trim_end_matches('/'));
        url.set_path(&path);
    }
    Ok(url.into())
}

/// Validates `[telemetry]`: `None` when no collector is configured.
pub fn validate(raw: RawTelemetry) -> Result<Option<TelemetrySettings>, ConfigError> {
    let service_name = raw.service_name.unwrap_or_else(|| "palisade".into());
    if service_name.trim().is_empty() || service_name.len() > 255 || service_name.chars().any(char::is_control) {
        return Err(bad(keys::TELEMETRY_SERVICE_NAME, "must be 1-255 printable characters"));
    }
    let sampling_ratio = raw.sampling_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sampling_ratio) {
        return Err(bad(keys::TELEMETRY_SAMPLING_RATIO, "must be between 0.0 and 1.0"));
    }
    let mut headers = Vec::new();
    if let Some(text) = &raw.otlp_headers {
        headers.extend(parse_header_pairs("PALISADE_TELEMETRY_OTLP_HEADERS", text)?);
    }
    if let Some(path) = &raw.otlp_headers_file {
        use std::io::Read as _;
        let key = keys::TELEMETRY_OTLP_HEADERS_FILE;
        let file = std::fs::File::open(path).map_err(|e| bad(key, format!("cannot read {}: {e}", path.display())))?;
        let mut text = String::new();
        file.take(MAX_HEADERS_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|_| bad(key, format!("{} is not readable UTF-8 text", path.display())))?;
        if text.len() as u64 > MAX_HEADERS_FILE_BYTES {
            return Err(bad(key, "is larger than 64 KiB"));
        }
        headers.extend(parse_header_lines(key, &text)?);
    }
    let Some(endpoint) = raw.otlp_endpoint else { return Ok(None) };
    Ok(Some(TelemetrySettings {
        traces_url: traces_url(keys::TELEMETRY_OTLP_ENDPOINT, &endpoint)?,
        service_name,
        sampling_ratio,
        headers: CollectorHeaders(headers),
        continue_incoming_traces: raw.continue_incoming_traces.unwrap_or(true),
    }))
}
