//! The console's charts: series from the sampled ring ([`super::samples`]) turned into small
//! line charts drawn as inline SVG on the server, so the page needs no script and the CSP
//! stays `default-src 'none'`. Counters are charted as rates per second, histograms as the mean
//! of each interval, gauges as they are. Every label is escaped where it is written.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::samples::{Kind, Sample, Series};
use crate::web::escape;

/// Lines drawn per chart; the rest are counted under it.
pub const MAX_LINES: usize = 6;
/// The line colours, in order (distinguishable, readable on white).
const COLOURS: [&str; MAX_LINES] = ["#1f5fa8", "#b3461b", "#2a7d2e", "#7a3ea1", "#8a6d00", "#137a7a"];
const WIDTH: f64 = 320.0;
const HEIGHT: f64 = 110.0;
const REQUESTS: &str = "palisade_requests_total";
const DURATION: &str = "palisade_request_duration_seconds";

/// One line of a chart: its label and its points (Unix milliseconds, value).
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// What it is (labels as written by the exposition: escape before use).
    pub label: String,
    /// The points, oldest first.
    pub points: Vec<(i64, f64)>,
}

/// One chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Its id in the page (`chart-<metric>`).
    pub id: String,
    /// Its title.
    pub title: String,
    /// The unit of its values.
    pub unit: &'static str,
    /// Its lines (at most [`MAX_LINES`]).
    pub lines: Vec<Line>,
    /// Lines left out.
    pub more: usize,
}

/// The per-interval change of `series` between consecutive samples, per second (counter resets
/// count from zero).
fn rates(samples: &[Sample], series: &Series) -> Vec<(i64, f64)> {
    samples
        .windows(2)
        .filter_map(|pair| {
            let (before, after) = (&pair[0], &pair[1]);
            let now = *after.values.get(series)?;
            let then = before.values.get(series).copied().unwrap_or(0.0);
            let secs = (after.at_ms - before.at_ms) as f64 / 1000.0;
            let delta = if now >= then { now - then } else { now };
            (secs > 0.0).then(|| (after.at_ms, delta / secs))
        })
        .collect()
}

/// The mean of each interval of histogram `name` with `labels`: Δsum / Δcount (no point for an
/// interval without observations).
fn means(samples: &[Sample], name: &str, labels: &[(String, String)], scale: f64) -> Vec<(i64, f64)> {
    let sum = Series { name: format!("{name}_sum"), labels: labels.to_vec() };
    let count = Series { name: format!("{name}_count"), labels: labels.to_vec() };
    samples
        .windows(2)
        .filter_map(|pair| {
            let delta = |series: &Series| {
                let now = *pair[1].values.get(series)?;
                let then = pair[0].values.get(series).copied().unwrap_or(0.0);
                Some(if now >= then { now - then } else { now })
            };
            let (sum, count) = (delta(&sum)?, delta(&count)?);
            (count > 0.0).then(|| (pair[1].at_ms, sum / count * scale))
        })
        .collect()
}

/// Every series named `name` seen in any sample.
fn series_named<'a>(samples: &'a [Sample], name: &'a str) -> impl Iterator<Item = Series> + 'a {
    let mut seen: Vec<Series> = Vec::new();
    for sample in samples {
        for series in sample.values.keys().filter(|series| series.name == name) {
            if !seen.contains(series) {
                seen.push(series.clone());
            }
        }
    }
    seen.into_iter()
}

/// A chart of `lines`, keeping the [`MAX_LINES`] with the largest last values.
fn chart(id: &str, title: String, unit: &'static str, mut lines: Vec<Line>) -> Chart {
    let last = |line: &Line| line.points.last().map_or(0.0, |point| point.1);
    lines.sort_by(|a, b| last(b).total_cmp(&last(a)).then_with(|| a.label.cmp(&b.label)));
    let more = lines.len().saturating_sub(MAX_LINES);
    lines.truncate(MAX_LINES);
    Chart { id: format!("chart-{id}"), title, unit, lines, more }
}

/// The charts of `samples`: the server's request rate, error rate and mean latency, then one per
/// `palisade_upstream_*` and `palisade_tool_*` family.
pub fn charts(samples: &[Sample]) -> Vec<Chart> {
    let mut out = Vec::new();
    let requests: Vec<Series> = series_named(samples, REQUESTS).collect();
    let total: Vec<(i64, f64)> = {
        let mut by_time: BTreeMap<i64, f64> = BTreeMap::new();
        for series in &requests {
            for (at, rate) in rates(samples, series) {
                *by_time.entry(at).or_default() += rate;
            }
        }
        by_time.into_iter().collect()
    };
    out.push(chart("requests", "Requests".into(), "per second", vec![Line { label: "all".into(), points: total }]));
    let errors = requests
        .iter()
        .filter(|series| series.label("outcome") == Some("error"))
        .map(|series| Line { label: "error".into(), points: rates(samples, series) })
        .collect();
    out.push(chart("errors", "Errors".into(), "per second", errors));
    let latency = Line { label: "mean".into(), points: means(samples, DURATION, &[], 1000.0) };
    out.push(chart("latency", "Request latency".into(), "ms (mean)", vec![latency]));

    let mut families: BTreeMap<String, Kind> = BTreeMap::new();
    for sample in samples {
        for (name, kind) in &sample.kinds {
            if name.starts_with("palisade_upstream_") || name.starts_with("palisade_tool_") {
                families.insert(name.clone(), *kind);
            }
        }
    }
    for (family, kind) in families {
        let (unit, lines): (&'static str, Vec<Line>) = match kind {
            Kind::Counter => {
                let lines = series_named(samples, &family)
                    .map(|series| Line { label: series.label_text(), points: rates(samples, &series) })
                    .collect();
                ("per second", lines)
            }
            Kind::Gauge => {
                let lines = series_named(samples, &family)
                    .map(|series| {
                        let points = samples
                            .iter()
                            .filter_map(|sample| Some((sample.at_ms, *sample.values.get(&series)?)))
                            .collect();
                        Line { label: series.label_text(), points }
                    })
                    .collect();
                ("", lines)
            }
            Kind::Histogram => {
                let seconds = family.ends_with("_seconds");
                let lines = series_named(samples, &format!("{family}_count"))
                    .map(|series| Line {
                        label: series.label_text(),
                        points: means(samples, &family, &series.labels, if seconds { 1000.0 } else { 1.0 }),
                    })
                    .collect();
                (if seconds { "ms (mean)" } else { "mean" }, lines)
            }
        };
        out.push(chart(&family, family.clone(), unit, lines));
    }
    out
}

/// A number for an axis or a legend: at most 3 significant decimals.
fn figure(value: f64) -> String {
    if value == 0.0 {
        "0".into()
    } else if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 1.0 {
        format!("{value:.2}").trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        format!("{value:.3}").trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// `chart` as a `<figure>`: the title, an inline SVG of its lines over the sampled time, and a
/// legend with each line's last value.
pub fn chart_html(chart: &Chart, from_ms: i64, to_ms: i64) -> String {
    let max = chart.lines.iter().flat_map(|line| line.points.iter().map(|point| point.1)).fold(0.0_f64, f64::max);
    let top = if max > 0.0 { max * 1.1 } else { 1.0 };
    let span = (to_ms - from_ms).max(1) as f64;
    let mut svg = format!(
        "<svg class=\"chart\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{title}\" \
         preserveAspectRatio=\"none\"><rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"#fafafa\" \
         stroke=\"#ddd\"/><line x1=\"0\" y1=\"{mid}\" x2=\"{WIDTH}\" y2=\"{mid}\" stroke=\"#eee\"/>",
        title = escape(&chart.title),
        mid = HEIGHT / 2.0
    );
    for (line, colour) in chart.lines.iter().zip(COLOURS) {
        let points: Vec<String> = line
            .points
            .iter()
            .map(|(at, value)| {
                let x = ((*at - from_ms) as f64 / span * WIDTH).clamp(0.0, WIDTH);
                let y = HEIGHT - (value / top * (HEIGHT - 4.0)).clamp(0.0, HEIGHT - 4.0) - 2.0;
                format!("{x:.1},{y:.1}")
            })
            .collect();
        match points.as_slice() {
            [] => {}
            [one] => {
                let (x, y) = one.split_once(',').unwrap_or(("0", "0"));
                let _ = write!(svg, "<circle cx=\"{x}\" cy=\"{y}\" r=\"2\" fill=\"{colour}\"/>");
            }
            _ => {
                let _ = write!(
                    svg,
                    "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" \
                     vector-effect=\"non-scaling-stroke\" points=\"{}\"/>",
                    points.join(" ")
                );
            }
        }
    }
    svg.push_str("</svg>");
    let mut legend = String::new();
    for (line, colour) in chart.lines.iter().zip(COLOURS) {
        let last = line.points.last().map_or_else(|| "no data yet".to_owned(), |point| figure(point.1));
        let _ = write!(
            legend,
            "<li><svg class=\"swatch\" viewBox=\"0 0 10 10\" aria-hidden=\"true\"><rect width=\"10\" height=\"10\" \
             fill=\"{colour}\"/></svg> {} <b>{last}</b></li>",
            escape(if line.label.is_empty() { "all" } else { &line.label })
        );
    }
    if chart.lines.is_empty() {
        legend.push_str("<li class=\"muted\">no series yet</li>");
    }
    if chart.more > 0 {
        let _ = write!(legend, "<li class=\"muted\">and {} more series</li>", chart.more);
    }
    format!(
        "<figure class=\"chart\" id=\"{id}\"><figcaption>{title} <span class=\"muted\">{unit}, up to {top}</span>\
         </figcaption>{svg}<ul class=\"legend\">{legend}</ul></figure>",
        id = escape(&chart.id),
        title = escape(&chart.title),
        unit = escape(chart.unit),
        top = figure(max),
    )
}
