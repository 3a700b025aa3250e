//! The console's figures: the server's own metrics, read from its rendered text exposition every
//! interval into a bounded ring of samples (only the series the console charts, at most
//! [`MAX_SERIES`] per sample, [`RING`] samples), and the audit chain's last verification.
//!
//! The exposition is parsed here, not trusted: a label value is whatever an upstream named its
//! tool, so every label is kept as text for [`super::render`] to escape, and a line that does not
//! parse is skipped.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_base::clock::Clock;
use palisade_store::Store;
use tokio_util::sync::CancellationToken;

/// Samples kept: 90 (15 minutes at the default 10 s interval).
pub const RING: usize = 90;
/// Series kept per sample; beyond, the rest of a sample is dropped (and counted).
pub const MAX_SERIES: usize = 1024;
/// The audit chain is verified at start and then every this many samples.
const VERIFY_EVERY_SAMPLES: u64 = 30;

/// The series the console charts: the request counters and latency of the server, and every
/// per-upstream and per-tool series.
const KEPT: [&str; 4] =
    ["palisade_requests_total", "palisade_request_duration_seconds", "palisade_upstream_", "palisade_tool_"];

/// One series: its metric name and labels, as the exposition wrote them (unescaped).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Series {
    /// The metric name (`palisade_requests_total`, `…_sum`, `…_count`).
    pub name: String,
    /// The labels, in the order written.
    pub labels: Vec<(String, String)>,
}

impl Series {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    /// The labels as `key=value, …` (empty for none).
    pub fn label_text(&self) -> String {
        self.labels.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join(", ")
    }
}

/// A metric family's type, from its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only ever increases (charted as a rate).
    Counter,
    /// A value (charted as is).
    Gauge,
    /// `_sum` and `_count` (charted as the mean of each interval).
    Histogram,
}

/// One reading of the exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// When it was read (Unix milliseconds).
    pub at_ms: i64,
    /// Every kept series' value.
    pub values: BTreeMap<Series, f64>,
    /// Every kept family's type.
    pub kinds: BTreeMap<String, Kind>,
    /// Series left out past [`MAX_SERIES`].
    pub dropped: usize,
}

/// The last verification of the audit chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainStatus {
    /// When it finished (Unix milliseconds).
    pub at_ms: i64,
    /// Records and chains walked, or the first break, or why the walk could not be done.
    pub outcome: Result<palisade_store::ChainReport, String>,
}

/// The ring of samples and the chain status, shared by the sampler and the pages.
#[derive(Debug, Default)]
pub struct Samples {
    ring: Mutex<VecDeque<Sample>>,
    chain: Mutex<Option<ChainStatus>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Samples {
    /// Adds `sample`, forgetting the oldest past [`RING`].
    pub fn push(&self, sample: Sample) {
        let mut ring = lock(&self.ring);
        if ring.len() == RING {
            ring.pop_front();
        }
        ring.push_back(sample);
    }

    /// The samples, oldest first.
    pub fn all(&self) -> Vec<Sample> {
        lock(&self.ring).iter().cloned().collect()
    }

    /// Records a verification of the chains.
    pub fn set_chain(&self, status: ChainStatus) {
        *lock(&self.chain) = Some(status);
    }

    /// The last verification of the chains, if one finished.
    pub fn chain(&self) -> Option<ChainStatus> {
        lock(&self.chain).clone()
    }
}

/// Reads `text` (the Prometheus text exposition) at `at_ms`: the kept series and their types.
pub fn parse(text: &str, at_ms: i64) -> Sample {
    let mut sample = Sample { at_ms, ..Sample::default() };
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                let kind = match kind {
                    "counter" => Kind::Counter,
                    "gauge" => Kind::Gauge,
                    "histogram" | "summary" => Kind::Histogram,
                    _ => continue,
                };
                if kept(name) {
                    sample.kinds.insert(name.to_owned(), kind);
                }
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = parse_line(line) else { continue };
        if !kept(&series.name) || series.name.ends_with("_bucket") {
            continue;
        }
        if sample.values.len() >= MAX_SERIES {
            sample.dropped += 1;
            continue;
        }
        sample.values.insert(series, value);
    }
    sample
}

fn kept(name: &str) -> bool {
    KEPT.iter().any(|prefix| name.starts_with(prefix))
}

/// `name{label="value",…} value [timestamp]`; `None` when it is not that.
fn parse_line(line: &str) -> Option<(Series, f64)> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let equals = rest.find('=')?;
            let key = rest[..equals].trim();
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return None;
            }
            let quoted = rest[equals + 1..].strip_prefix('"')?;
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next()? {
                    (at, '"') => break at,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    (_, other) => value.push(other),
                }
            };
            labels.push((key.to_owned(), value));
            rest = &quoted[end + 1..];
        }
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse::<f64>().ok()?,
    };
    value.is_finite().then(|| (Series { name: name.to_owned(), labels }, value))
}

/// Samples `exposition` every `every` into `samples` until `shutdown`, and verifies `store`'s
/// audit chains at the first sample and then every [`VERIFY_EVERY_SAMPLES`] samples.
pub fn spawn_sampler(
    samples: Arc<Samples>,
    exposition: super::Exposition,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    every: Duration,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut taken: u64 = 0;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            samples.push(parse(&exposition(), clock.now_ms()));
            if taken.is_multiple_of(VERIFY_EVERY_SAMPLES) {
                let outcome = store.verify_chain().await.map_err(|error| error.to_string());
                samples.set_chain(ChainStatus { at_ms: clock.now_ms(), outcome });
            }
            taken += 1;
        }
    });
}
