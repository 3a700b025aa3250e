//! The console page: what it shows is gathered once per request ([`gather`] → [`View`]) and
//! written as HTML ([`console_page`]), every value an upstream, a user or the store supplied
//! escaped (upstream definitions with their hidden characters as markers, as on the review
//! page). Tables fold into labelled cards on a narrow screen (the style sheet's media query), so
//! the page reads on a phone without scrolling sideways.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use palisade_base::time::format_rfc3339_ms;
use palisade_killswitch::TargetKind;
use palisade_killswitch::authority::TargetStatus;
use palisade_store::{ConnectionRow, DelegationRow, StoredAuditRecord};

use super::charts::{Chart, chart_html, charts};
use super::samples::ChainStatus;
use super::{AUDIT_ROWS, Console, LISTED_ROWS};
use crate::gateway::{PinEntry, UpstreamStatus, summarize};
use crate::review::{awaiting, change_html, revealed_html};
use crate::web::{Page, escape};

/// The console's style, after the surface's: cards that fold tables on a narrow screen, charts
/// in a grid.
const STYLE: &str = "body{max-width:80rem}nav{display:flex;flex-wrap:wrap;gap:.25rem 1rem;margin:.5rem 0 1rem}\
section{margin:1.5rem 0}table{border-collapse:collapse;width:100%;font-size:.9rem}\
th,td{border-bottom:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top;overflow-wrap:anywhere}th{overflow-wrap:normal}\
.ok{color:#1a5e20}.bad{color:#9b1c1c;font-weight:600}.charts{display:grid;\
grid-template-columns:repeat(auto-fill,minmax(min(100%,20rem),1fr));gap:1rem}figure.chart{margin:0}\
svg.chart{width:100%;height:7rem;display:block}svg.swatch{width:.7rem;height:.7rem}ul.legend{list-style:none;\
padding:0;margin:.3rem 0;font-size:.85rem;overflow-wrap:anywhere}details{border:1px solid #ccc;border-radius:6px;\
padding:.5rem .75rem;margin:.5rem 0}summary{cursor:pointer;overflow-wrap:anywhere}header p{margin:.25rem 0}\
form.inline button{font-size:.9rem}@media (max-width:40rem){body{margin:1rem auto}table,tbody,tr,td{display:block}\
thead{display:none}tr{border:1px solid #ddd;border-radius:6px;margin:.5rem 0;padding:.25rem}td{border:0;\
padding:.15rem .4rem}td::before{content:attr(data-label) \": \";font-weight:600}}";

/// An awaiting definition as the page shows it.
#[derive(Debug)]
pub struct Awaiting {
    /// The pin id.
    pub pin_id: String,
    /// `tool`, `prompt`, …
    pub kind: String,
    /// Its name (or the upstream's id for a launch).
    pub name: String,
    /// Its upstream.
    pub upstream: String,
    /// `pending` or `held`.
    pub state: &'static str,
    /// The findings and the diff or definition, as HTML ([`change_html`]).
    pub change: String,
}

/// The kill switch as the page shows it.
#[derive(Debug)]
pub enum KillView {
    /// No kill switch runs.
    Off,
    /// The states live at an external authority this process does not share.
    External,
    /// The states stored at the authority, each with the target's name when it can be named.
    States(Vec<(Option<String>, TargetStatus)>),
    /// The authority's database could not be read.
    Unreadable(String),
}

/// Everything the page shows, gathered for one request.
#[derive(Debug)]
pub struct View {
    /// When it was gathered.
    pub now_ms: i64,
    /// Every upstream's standing.
    pub upstreams: Vec<UpstreamStatus>,
    /// Definitions by state per upstream.
    pub counts: BTreeMap<String, BTreeMap<&'static str, usize>>,
    /// Pending and held definitions (or why they could not be read).
    pub awaiting: Result<Vec<Awaiting>, String>,
    /// Whether the review page is on.
    pub review_page: bool,
    /// The kill switch.
    pub kill_switch: KillView,
    /// Per-user upstream connections.
    pub connections: Result<Vec<ConnectionRow>, String>,
    /// Delegation capabilities.
    pub delegations: Result<Vec<DelegationRow>, String>,
    /// The newest audit records.
    pub audit: Result<Vec<StoredAuditRecord>, String>,
    /// The chains' last verification.
    pub chain: Option<ChainStatus>,
    /// The charts, and the sampled time span.
    pub charts: Vec<Chart>,
    /// First and last sample (Unix milliseconds), and how many.
    pub sampled: (i64, i64, usize),
}

/// Reads what the page shows. Each part that cannot be read says so in its section; the page
/// itself is always answered.
pub async fn gather(console: &Console) -> View {
    let settings = console.gateway.settings();
    let report = console.gateway.report();
    let awaiting = awaiting(console.store.as_ref(), &settings.pins, &console.names)
        .await
        .map(|rows| {
            rows.iter()
                .map(|(row, state, found)| {
                    let o = &row.observation;
                    Awaiting {
                        pin_id: o.pin_id.clone(),
                        kind: o.kind.clone(),
                        name: if o.name.is_empty() { o.upstream_id.clone() } else { o.name.clone() },
                        upstream: o.upstream_id.clone(),
                        state: state.as_str(),
                        change: change_html(row, &settings.pins, found),
                    }
                })
                .collect()
        })
        .map_err(|_| "the pins could not be read".to_owned());
    let delegations =
        console.store.delegations(None, LISTED_ROWS).await.map_err(|_| "the delegations could not be read".to_owned());
    let kill_switch = kill_view(console, &report, delegations.as_deref().unwrap_or_default()).await;
    let connections =
        console.store.connections(None, LISTED_ROWS).await.map_err(|_| "the connections could not be read".to_owned());
    let audit = console.store.recent(AUDIT_ROWS).await.map_err(|_| "the audit log could not be read".to_owned());
    let samples = console.samples.all();
    let sampled = match (samples.first(), samples.last()) {
        (Some(first), Some(last)) => (first.at_ms, last.at_ms, samples.len()),
        _ => (0, 0, 0),
    };
    View {
        now_ms: console.clock.now_ms(),
        upstreams: console.gateway.status(),
        counts: summarize(&report),
        awaiting,
        review_page: console.review_page,
        kill_switch,
        connections,
        delegations,
        audit,
        chain: console.samples.chain(),
        charts: charts(&samples),
        sampled,
    }
}

/// The states at the authority, named where this deployment can name the target: its server
/// release, its upstreams, the tools and resources it serves, the delegated agents.
async fn kill_view(console: &Console, report: &[PinEntry], delegations: &[DelegationRow]) -> KillView {
    let Some(view) = &console.kill_switch else { return KillView::Off };
    let Some(db) = &view.authority else { return KillView::External };
    let statuses = match db.status().await {
        Ok(statuses) => statuses,
        Err(error) => return KillView::Unreadable(error.to_string()),
    };
    let mut candidates: Vec<(TargetKind, String)> = vec![(TargetKind::ServerRelease, view.server_release.clone())];
    candidates.extend(console.gateway.settings().upstreams.iter().map(|u| (TargetKind::Upstream, u.id.clone())));
    for entry in report {
        let Some(exposed) = &entry.exposed else { continue };
        match entry.kind {
            "tool" => candidates.push((TargetKind::Tool, exposed.clone())),
            "resource" | "resource_template" => candidates.push((TargetKind::Resource, exposed.clone())),
            _ => {}
        }
    }
    candidates.extend(delegations.iter().map(|row| (TargetKind::Agent, row.agent.clone())));
    let names: BTreeMap<_, _> = candidates
        .into_iter()
        .map(|(kind, value)| (view.switch.target_digest(kind, &value), format!("{kind}:{value}")))
        .collect();
    KillView::States(statuses.into_iter().map(|status| (names.get(&status.target).cloned(), status)).collect())
}

/// The sign-in form.
pub fn sign_in_page(status: StatusCode, message: Option<&str>) -> Response {
    let note = message.map(|text| format!("<p id=\"error\" class=\"bad\">{}</p>", escape(text))).unwrap_or_default();
    let html = format!(
        "<h1>Palisade console</h1><p>Sign in with your operator account (<code>[web] operators_file</code>).</p>\
         {note}<form method=\"post\" action=\"/console/login\">\
         <p><label>Operator <input type=\"text\" name=\"operator\" autocomplete=\"username\" required></label></p>\
         <p><label>Token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" required></label></p>\
         <button type=\"submit\">Sign in</button></form>"
    );
    Page::new(status, "Palisade console: sign in", html).style(STYLE).into_response()
}

/// A table of `rows` under `headings`; each cell carries its heading for the narrow layout.
/// Cells are HTML already escaped by the caller.
fn table(id: &str, headings: &[&str], rows: &[Vec<String>]) -> String {
    let mut html = format!("<table id=\"{id}\"><thead><tr>");
    for heading in headings {
        let _ = write!(html, "<th>{heading}</th>");
    }
    html.push_str("</tr></thead><tbody>");
    for row in rows {
        html.push_str("<tr>");
        for (heading, cell) in headings.iter().zip(row) {
            let _ = write!(html, "<td data-label=\"{heading}\">{cell}</td>");
        }
        html.push_str("</tr>");
    }
    html.push_str("</tbody></table>");
    html
}

fn time(ms: i64) -> String {
    if ms <= 0 { "—".into() } else { format_rfc3339_ms(ms) }
}

fn unreadable(message: &str) -> String {
    format!("<p class=\"bad\">{}</p>", escape(message))
}

fn upstreams_html(view: &View) -> String {
    let rows: Vec<Vec<String>> = view
        .upstreams
        .iter()
        .map(|upstream| {
            let counts = view.counts.get(&upstream.id);
            let count = |state: &str| counts.and_then(|c| c.get(state)).copied().unwrap_or(0).to_string();
            let health = if upstream.health.healthy {
                "<span class=\"ok\">healthy</span>".to_owned()
            } else {
                let error = upstream.health.last_error.as_deref().unwrap_or("failing");
                format!("<span class=\"bad\">backoff</span>: {}", escape(error))
            };
            let mut note = Vec::new();
            if let Some(error) = &upstream.listing_error {
                note.push(format!("listing failed: {}", escape(error)));
            }
            if let Some(launch) = &upstream.launch
                && let Some(reason) = &launch.reason
            {
                note.push(format!("launch {}: {}", escape(launch.state), escape(reason)));
            }
            if !upstream.unmatched_rules.is_empty() {
                note.push(format!("rules matching no tool: {}", escape(&upstream.unmatched_rules.join(", "))));
            }
            vec![
                format!("<b>{}</b><br><span class=\"muted\">{}</span>", escape(&upstream.id), escape(&upstream.url)),
                health,
                escape(upstream.protocol.as_deref().unwrap_or("not connected yet")),
                format!("{} of {}", upstream.served, upstream.listed),
                count("held"),
                count("pending"),
                count("rejected"),
                upstream.processes.map_or_else(|| "—".to_owned(), |n| n.to_string()),
                note.join("<br>"),
            ]
        })
        .collect();
    let headings = ["Upstream", "Health", "Protocol", "Served", "Held", "Pending", "Rejected", "Processes", "Notes"];
    format!("<section id=\"upstreams\"><h2>Upstreams</h2>{}</section>", table("upstream-table", &headings, &rows))
}

fn awaiting_html(view: &View) -> String {
    let mut html = String::from("<section id=\"definitions\"><h2>Awaiting a decision</h2>");
    match &view.awaiting {
        Err(message) => html.push_str(&unreadable(message)),
        Ok(rows) if rows.is_empty() => html.push_str("<p id=\"nothing-awaits\">Nothing awaits a decision.</p>"),
        Ok(rows) => {
            if !view.review_page {
                html.push_str(
                    "<p class=\"muted\">The review page is off (<code>[web] review_token_file</code>): decide with \
                     <code>palisade pins approve|reject</code>.</p>",
                );
            }
            for row in rows {
                let link = if view.review_page {
                    format!(
                        "<p><a href=\"/review#pin-{pin}\">Decide on the review page</a></p>",
                        pin = escape(&row.pin_id)
                    )
                } else {
                    String::new()
                };
                let _ = write!(
                    html,
                    "<details class=\"awaiting\" id=\"awaiting-{pin}\"><summary><strong>{state}</strong> {kind} \
                     <code>{name}</code> of {upstream}</summary><p class=\"muted\">pin <code>{pin}</code></p>\
                     {link}{change}</details>",
                    pin = escape(&row.pin_id),
                    state = row.state,
                    kind = revealed_html(&row.kind, true),
                    name = revealed_html(&row.name, true),
                    upstream = revealed_html(&row.upstream, true),
                    change = row.change,
                );
            }
        }
    }
    html.push_str("</section>");
    html
}

pub(crate) fn kill_switch_html(view: &View) -> String {
    let body = match &view.kill_switch {
        KillView::Off => "<p>No kill switch runs (<code>[killswitch] mode = \"off\"</code>).</p>".to_owned(),
        KillView::External => "<p>The kill switch asks an external authority, whose states are read there \
                               (<code>palisade authority status</code> on its host).</p>"
            .to_owned(),
        KillView::Unreadable(error) => unreadable(&format!("the authority's database could not be read: {error}")),
        KillView::States(states) if states.is_empty() => {
            "<p id=\"no-switches\">No target was ever switched: everything is enabled.</p>".to_owned()
        }
        KillView::States(states) => {
            let rows: Vec<Vec<String>> = states
                .iter()
                .map(|(name, status)| {
                    let target = match name {
                        Some(name) => format!("<code>{}</code>", escape(name)),
                        None => format!(
                            "<code>{}:?</code> <span class=\"muted\">{}</span>",
                            status.target.kind,
                            escape(&status.target.digest[..16.min(status.target.digest.len())])
                        ),
                    };
                    let state = status.state.as_str();
                    let class = if state == "DISABLE" { "bad" } else { "ok" };
                    vec![
                        target,
                        format!("<span class=\"{class}\">{state}</span>"),
                        status.generation.to_string(),
                        escape(&status.reason_code),
                        time(status.updated_at_ms),
                    ]
                })
                .collect();
            let headings = ["Target", "State", "Generation", "Reason (as the operator gave it)", "Set at"];
            table("killswitch-table", &headings, &rows)
        }
    };
    format!("<section id=\"killswitch\"><h2>Kill switch</h2>{body}</section>")
}

fn connections_html(view: &View) -> String {
    let body = match &view.connections {
        Err(message) => unreadable(message),
        Ok(rows) if rows.is_empty() => "<p>No person has connected an upstream account.</p>".to_owned(),
        Ok(rows) => {
            let rows: Vec<Vec<String>> = rows
                .iter()
                .map(|row| {
                    vec![
                        escape(&row.principal),
                        escape(&row.upstream),
                        format!(
                            "{}<br><span class=\"muted\">client {}</span>",
                            escape(&row.issuer),
                            escape(&row.client_id)
                        ),
                        escape(&row.scopes),
                        time(row.created_ms),
                        time(row.updated_ms),
                        row.expires_ms.map_or_else(|| "—".to_owned(), time),
                    ]
                })
                .collect();
            let headings = ["Person", "Upstream", "Authorization server", "Scopes", "Connected", "Updated", "Expires"];
            table("connections-table", &headings, &rows)
        }
    };
    format!(
        "<section id=\"connections\"><h2>Per-user connections</h2><p class=\"muted\">Each person's own \
         authorization at a <code>user_oauth</code> upstream; the tokens are sealed and never shown.</p>{body}</section>"
    )
}

fn delegations_html(view: &View) -> String {
    let body = match &view.delegations {
        Err(message) => unreadable(message),
        Ok(rows) if rows.is_empty() => "<p>No delegation capability was minted.</p>".to_owned(),
        Ok(rows) => {
            let rows: Vec<Vec<String>> = rows
                .iter()
                .map(|row| {
                    let grant = serde_json::from_str::<serde_json::Value>(&row.body)
                        .ok()
                        .and_then(|body| body.get("grant").map(serde_json::Value::to_string))
                        .unwrap_or_default();
                    let status = match row.revoked_ms {
                        Some(at) => format!("<span class=\"bad\">revoked</span> {}", time(at)),
                        None if row.expires_ms <= view.now_ms => "expired".to_owned(),
                        None => "<span class=\"ok\">live</span>".to_owned(),
                    };
                    vec![
                        format!("<code>{}</code>", hex_prefix(&row.digest)),
                        row.parent.map_or_else(
                            || "root".to_owned(),
                            |parent| format!("<code>{}</code>", hex_prefix(&parent)),
                        ),
                        escape(&row.agent),
                        format!("<code>{}</code>", escape(&grant)),
                        format!("{} of {}", row.remaining, row.calls),
                        time(row.expires_ms),
                        status,
                    ]
                })
                .collect();
            let headings = ["Capability", "Parent", "Agent", "Grant", "Calls left", "Expires", "Status"];
            table("delegations-table", &headings, &rows)
        }
    };
    format!("<section id=\"delegations\"><h2>Delegation capabilities</h2>{body}</section>")
}

fn hex_prefix(bytes: &[u8; 32]) -> String {
    bytes[..6].iter().map(|byte| format!("{byte:02x}")).collect()
}

fn chain_html(chain: Option<&ChainStatus>) -> String {
    match chain {
        None => "<p id=\"chain-status\">Chain status: not verified yet (the first verification runs with the first \
                 sample).</p>"
            .to_owned(),
        Some(ChainStatus { at_ms, outcome: Ok(report) }) if report.is_intact() => format!(
            "<p id=\"chain-status\" class=\"ok\">Chain status: intact — {} records in {} chains verified at {}.</p>",
            report.records,
            report.chains,
            time(*at_ms)
        ),
        Some(ChainStatus { at_ms, outcome: Ok(report) }) => format!(
            "<p id=\"chain-status\" class=\"bad\">Chain status: NOT INTACT — {} (verified at {}; run <code>palisade \
             audit verify</code>).</p>",
            escape(&report.first_break.as_ref().map(ToString::to_string).unwrap_or_default()),
            time(*at_ms)
        ),
        Some(ChainStatus { at_ms, outcome: Err(error) }) => format!(
            "<p id=\"chain-status\" class=\"bad\">Chain status: could not be verified at {}: {}.</p>",
            time(*at_ms),
            escape(error)
        ),
    }
}

fn audit_html(view: &View) -> String {
    let body = match &view.audit {
        Err(message) => unreadable(message),
        Ok(records) if records.is_empty() => "<p>The audit log is empty.</p>".to_owned(),
        Ok(records) => {
            let rows: Vec<Vec<String>> = records
                .iter()
                .map(|stored| {
                    let record = &stored.record;
                    let decision = record.decision.as_str();
                    let class = if decision == "deny" { "bad" } else { "ok" };
                    vec![
                        time(i64::try_from(record.at_ms).unwrap_or(i64::MAX)),
                        escape(&record.stage),
                        format!("<span class=\"{class}\">{decision}</span>"),
                        format!("<code>{}</code>", escape(&record.operation)),
                        record.code.map_or_else(String::new, |code| code.to_string()),
                        escape(record.detail.as_deref().unwrap_or("")),
                    ]
                })
                .collect();
            table("audit-table", &["Time", "Stage", "Decision", "Operation", "Code", "Detail"], &rows)
        }
    };
    format!(
        "<section id=\"audit\"><h2>Audit tail</h2>{}<p class=\"muted\">The newest {AUDIT_ROWS} records; \
         <code>palisade audit</code> reads the rest.</p>{body}</section>",
        chain_html(view.chain.as_ref())
    )
}

fn metrics_html(view: &View) -> String {
    let (from, to, count) = view.sampled;
    let span = if count == 0 {
        "No sample yet.".to_owned()
    } else {
        format!("{count} samples from {} to {}.", time(from), time(to))
    };
    let charts: String = view.charts.iter().map(|chart| chart_html(chart, from, to)).collect();
    format!(
        "<section id=\"metrics\"><h2>Metrics</h2><p class=\"muted\">The server's own metrics, sampled: {span}</p>\
         <div class=\"charts\">{charts}</div></section>"
    )
}

/// The console of `view` for `operator`, with the sign-out form's CSRF token `logout`.
pub fn console_page(view: &View, operator: &str, logout: &str) -> Page {
    let nav = [
        ("upstreams", "Upstreams"),
        ("definitions", "Awaiting"),
        ("killswitch", "Kill switch"),
        ("connections", "Connections"),
        ("delegations", "Delegations"),
        ("audit", "Audit"),
        ("metrics", "Metrics"),
    ]
    .iter()
    .map(|(id, label)| format!("<a href=\"#{id}\">{label}</a>"))
    .collect::<String>();
    let html = format!(
        "<header><h1>Palisade console</h1><p>Signed in as <strong id=\"operator\">{operator}</strong> at {now}. \
         Read-only: decisions are made on the review page.</p>\
         <form class=\"inline\" method=\"post\" action=\"/console/logout\"><input type=\"hidden\" name=\"csrf\" \
         value=\"{logout}\"><button type=\"submit\">Sign out</button></form><nav>{nav}</nav></header>\
         {upstreams}{awaiting}{kill}{connections}{delegations}{audit}{metrics}",
        operator = escape(operator),
        now = time(view.now_ms),
        logout = escape(logout),
        upstreams = upstreams_html(view),
        awaiting = awaiting_html(view),
        kill = kill_switch_html(view),
        connections = connections_html(view),
        delegations = delegations_html(view),
        audit = audit_html(view),
        metrics = metrics_html(view),
    );
    Page::new(StatusCode::OK, "Palisade console", html).style(STYLE)
}
