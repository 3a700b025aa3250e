//! Reports: a progress line per check, the summary table, and the `--format` files (JSON with
//! stable ids is the source; JUnit, Markdown and SARIF are rendered from it); the baseline of
//! accepted findings; the exit code. Every rendered text passes the run's redactor, and what a
//! target controls is shown through [`crate::escape`] in every format.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::check::{Check, Outcome, Severity, Verdict};
use crate::escape::{markdown_cell, visible};
use crate::identity::{Identity, Redactor};
use crate::rules::{CAUSES, Rule};
pub use crate::rules::{NO_AUTHENTICATION, follows_from_no_authentication};

/// A report file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// JSON with stable ids (the source of the others).
    Json,
    /// JUnit XML (one testcase per check).
    Junit,
    /// A Markdown table.
    Markdown,
    /// SARIF 2.1.0 (one result per failure or warning).
    Sarif,
}

/// One accepted finding: a FAIL or an INCONCLUSIVE someone looked at and judged.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Accepted {
    /// The check id.
    pub id: String,
    /// The verdict accepted (`fail` unless said): only a FAIL or an INCONCLUSIVE can be.
    #[serde(default = "fail")]
    pub verdict: Verdict,
    /// Why it is accepted, in one line (shown beside the finding).
    pub reason: String,
    /// The human judgement of the finding (required: [`Baseline::load`] refuses an entry without).
    #[serde(default)]
    pub judgement: Option<Judgement>,
    /// What the target did (for a false positive: what the verifier got wrong).
    #[serde(default)]
    pub evidence: String,
    /// The spec clause or seed control a real FAIL breaks.
    #[serde(default)]
    pub breaks: String,
}

fn fail() -> Verdict {
    Verdict::Fail
}

/// A human judgement of an accepted finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Judgement {
    /// A FAIL: the target really breaks the requirement. An INCONCLUSIVE: the target really
    /// refused or broke the check's positive control, so nothing can be concluded.
    #[serde(rename = "real")]
    Real,
    /// The verdict is the verifier's mistake (the check is to be fixed, not the target).
    #[serde(rename = "false positive")]
    FalsePositive,
}

/// A baseline file: `[[accepted]]` entries of `id`, `verdict` (`fail` or `inconclusive`),
/// `reason`, `judgement` (`real` or `false positive`), `evidence` and, for a real FAIL, `breaks`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// The accepted findings.
    #[serde(default)]
    pub accepted: Vec<Accepted>,
}

impl Baseline {
    /// Reads a baseline file: every entry judged, with its evidence, one entry per check.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|error| format!("baseline {}: {error}", path.display()))?;
        Self::parse(&text).map_err(|error| format!("baseline {}: {error}", path.display()))
    }

    /// Parses a baseline's text (see [`Baseline::load`]).
    pub fn parse(text: &str) -> Result<Self, String> {
        let baseline: Self = toml::from_str(text).map_err(|error| error.message().to_owned())?;
        for (n, entry) in baseline.accepted.iter().enumerate() {
            let at = format!("entry {} ({})", n + 1, visible(&entry.id));
            let missing = |field: &str, value: &str| {
                if value.trim().is_empty() { Err(format!("{at} has no {field}")) } else { Ok(()) }
            };
            missing("reason", &entry.reason)?;
            if !matches!(entry.verdict, Verdict::Fail | Verdict::Inconclusive) {
                return Err(format!(
                    "{at}: verdict {:?}: only a fail or an inconclusive can be accepted",
                    entry.verdict
                ));
            }
            let judgement = entry.judgement.ok_or_else(|| {
                format!("{at} has no judgement: add judgement = \"real\" or \"false positive\", with its evidence")
            })?;
            missing("evidence (what the target did, or what the verifier got wrong)", &entry.evidence)?;
            if judgement == Judgement::Real && entry.verdict == Verdict::Fail {
                missing("breaks (the spec clause or seed control a real FAIL breaks)", &entry.breaks)?;
            }
            if baseline.accepted[..n].iter().any(|earlier| earlier.id == entry.id) {
                return Err(format!("{at}: the check is accepted twice"));
            }
        }
        Ok(baseline)
    }

    /// The reason of the entry accepting `verdict` for check `id`, if any.
    fn reason(&self, id: &str, verdict: Verdict) -> Option<&str> {
        self.accepted.iter().find(|entry| entry.id == id && entry.verdict == verdict).map(|entry| entry.reason.as_str())
    }
}

/// One check in a report.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The check.
    pub check: Check,
    /// Its outcome.
    pub outcome: Outcome,
    /// The baseline's reason, when the check is baselined.
    pub baselined: Option<String>,
    /// The root cause this check's finding is grouped under, if any ([`Report::root_causes`]).
    pub root_cause: Option<&'static str>,
}

/// A cause several findings share: they are shown under it in every format, each keeping its
/// own verdict.
#[derive(Debug, Clone)]
pub struct RootCause {
    /// Its stable id (`auth.none`).
    pub id: &'static str,
    /// One line saying what it is.
    pub title: &'static str,
    /// What to fix.
    pub help: &'static str,
    /// How much it matters (the worst of its checks').
    pub severity: Severity,
    /// What was seen.
    pub detail: String,
    /// The checks grouped under it, in report order.
    pub checks: Vec<&'static str>,
}

/// A run's report.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target URL.
    pub target: String,
    /// When the report was made (RFC 3339, UTC).
    pub date: String,
    /// When the target does not speak 2026-07-28: the one line saying so.
    pub protocol: Option<String>,
    /// When the target does not speak the 2025-era session wire the `sessions` module needs:
    /// the one line saying so.
    pub session_wire: Option<String>,
    /// Which program each operator command ran, and how it was found.
    pub programs: Vec<String>,
    /// The identities the run used, as reports show them (names and declared claims; never a
    /// token).
    pub identities: Vec<String>,
    /// Every check, in catalogue order.
    pub entries: Vec<Entry>,
    /// Causes several findings share (their checks are grouped under them).
    pub root_causes: Vec<RootCause>,
    /// Baseline entries that no longer match a finding: the check's verdict is not the one
    /// accepted now (it passes, or fails where an INCONCLUSIVE was accepted), or it did not run.
    pub stale: Vec<Accepted>,
    redactor: Redactor,
}

impl Report {
    /// A report of `results`, applying `baseline`.
    pub fn new(target: &str, results: Vec<(Check, Outcome)>, baseline: &Baseline, redactor: Redactor) -> Self {
        let entries: Vec<Entry> = results
            .into_iter()
            .map(|(check, outcome)| {
                let baselined = baseline.reason(check.id, outcome.verdict).map(str::to_owned);
                Entry { check, outcome, baselined, root_cause: None }
            })
            .collect();
        let stale = baseline
            .accepted
            .iter()
            .filter(|accepted| {
                entries
                    .iter()
                    .find(|entry| entry.check.id == accepted.id)
                    .is_none_or(|entry| entry.outcome.verdict != accepted.verdict)
            })
            .cloned()
            .collect();
        let now_ms = palisade_base::clock::Clock::now_ms(&palisade_base::clock::SystemClock);
        let date = palisade_base::time::format_rfc3339_ms(now_ms);
        Self {
            target: target.to_owned(),
            date,
            protocol: None,
            session_wire: None,
            programs: Vec::new(),
            identities: Vec::new(),
            entries,
            root_causes: Vec::new(),
            stale,
            redactor,
        }
    }

    /// Groups the FAILs that follow from a target needing no authentication at all under the
    /// root cause [`NO_AUTHENTICATION`], when `served` says what an unauthenticated request got
    /// (`None`: it was refused, and nothing is grouped).
    pub fn with_no_authentication(mut self, served: Option<String>) -> Self {
        let Some(served) = served else { return self };
        let mut checks = Vec::new();
        let mut severity = Severity::Low;
        for entry in &mut self.entries {
            if entry.outcome.verdict == Verdict::Fail && follows_from_no_authentication(entry.check.id) {
                entry.root_cause = Some(NO_AUTHENTICATION);
                checks.push(entry.check.id);
                severity = severity.max(entry.check.severity);
            }
        }
        if let (false, Some(cause)) = (checks.is_empty(), crate::rules::cause(NO_AUTHENTICATION)) {
            self.root_causes.push(RootCause {
                id: cause.id,
                title: cause.title,
                help: cause.help,
                severity,
                detail: format!(
                    "a request with no token was served ({served}); the {} checks below fail because of it",
                    checks.len()
                ),
                checks,
            });
        }
        self
    }

    /// Groups the FAILs two or more of which share a root cause of the registry
    /// ([`crate::rules::CAUSES`]) that needs no evidence of its own (Host and Origin not
    /// validated, sessions, handles or tasks not bound to the caller); a FAIL already grouped
    /// (under [`NO_AUTHENTICATION`]) stays where it is.
    pub fn with_shared_causes(mut self) -> Self {
        for cause in CAUSES.iter().filter(|cause| !cause.needs_evidence) {
            let members: Vec<usize> = (0..self.entries.len())
                .filter(|&i| {
                    let entry = &self.entries[i];
                    entry.outcome.verdict == Verdict::Fail
                        && entry.root_cause.is_none()
                        && (cause.explains)(entry.check.id)
                })
                .collect();
            if members.len() < 2 {
                continue;
            }
            let mut severity = Severity::Low;
            let mut checks = Vec::with_capacity(members.len());
            for i in members {
                let entry = &mut self.entries[i];
                entry.root_cause = Some(cause.id);
                checks.push(entry.check.id);
                severity = severity.max(entry.check.severity);
            }
            self.root_causes.push(RootCause {
                id: cause.id,
                title: cause.title,
                help: cause.help,
                severity,
                detail: format!("the {} checks below fail for this one reason", checks.len()),
                checks,
            });
        }
        self
    }

    /// The report with the identities the run used: each one's name and the subject, tenant
    /// and client its file declares (its tokens are never shown).
    pub fn with_identities(mut self, identities: &[Identity]) -> Self {
        self.identities = identities
            .iter()
            .map(|identity| {
                let claims: Vec<String> =
                    [("subject", &identity.subject), ("tenant", &identity.tenant), ("client", &identity.client)]
                        .into_iter()
                        .filter_map(|(name, value)| value.as_ref().map(|value| format!("{name} {value}")))
                        .collect();
                let extra: Vec<&str> = [
                    identity.expired_token.as_ref().map(|_| "an expired token"),
                    identity.other_resource_token.as_ref().map(|_| "another resource's token"),
                ]
                .into_iter()
                .flatten()
                .collect();
                let mut line = identity.name.clone();
                if !claims.is_empty() {
                    line.push_str(&format!(" ({})", claims.join(", ")));
                }
                if !extra.is_empty() {
                    line.push_str(&format!(", with {}", extra.join(" and ")));
                }
                line
            })
            .collect();
        self
    }

    /// The report with the line saying the target does not speak 2026-07-28, if it does not.
    pub fn with_protocol(mut self, unspoken: Option<String>) -> Self {
        self.protocol = unspoken;
        self
    }

    /// The report with the line saying the target does not speak the 2025-era session wire, if
    /// it does not.
    pub fn with_session_wire(mut self, unspoken: Option<String>) -> Self {
        self.session_wire = unspoken;
        self
    }

    /// The report with the lines saying which program each operator command ran.
    pub fn with_programs(mut self, programs: Vec<String>) -> Self {
        self.programs = programs;
        self
    }

    /// How many checks have `verdict`.
    pub fn count(&self, verdict: Verdict) -> usize {
        self.entries.iter().filter(|entry| entry.outcome.verdict == verdict).count()
    }

    /// The FAILs no baseline accepts.
    pub fn unbaselined_failures(&self) -> usize {
        self.entries.iter().filter(|entry| entry.outcome.verdict == Verdict::Fail && entry.baselined.is_none()).count()
    }

    /// 0 when nothing unbaselined FAILs, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.unbaselined_failures() > 0)
    }

    /// The JSON report: the source of every other format.
    pub fn to_json(&self) -> Value {
        let checks: Vec<Value> = self
            .entries
            .iter()
            .map(|entry| {
                // Every format reads a check's rule from the one registry, through this document.
                let rule = Rule::of(&entry.check);
                json!({
                    "id": rule.id,
                    "title": rule.title,
                    "requirement": rule.reference,
                    "module": rule.module,
                    "help": rule.help,
                    "severity": rule.severity,
                    "verdict": entry.outcome.verdict,
                    "detail": entry.outcome.detail,
                    "baselined": entry.baselined,
                    "root_cause": entry.root_cause,
                    "transcript": entry.outcome.transcript,
                })
            })
            .collect();
        let stale: Vec<Value> = self.stale.iter().map(|s| json!({ "id": s.id, "reason": s.reason })).collect();
        let root_causes: Vec<Value> = self
            .root_causes
            .iter()
            .map(|cause| {
                json!({
                    "id": cause.id,
                    "title": cause.title,
                    "help": cause.help,
                    "severity": cause.severity,
                    "detail": cause.detail,
                    "checks": cause.checks,
                })
            })
            .collect();
        let value = json!({
            "tool": { "name": "palisade-verify", "version": env!("CARGO_PKG_VERSION") },
            "target": self.target,
            "date": self.date,
            "protocol": {
                "version": crate::target::PROTOCOL_VERSION,
                "spoken": self.protocol.is_none(),
                "detail": self.protocol,
            },
            "session_wire": {
                "spoken": self.session_wire.is_none(),
                "detail": self.session_wire,
            },
            "programs": self.programs,
            "identities": self.identities,
            "summary": {
                "pass": self.count(Verdict::Pass),
                "fail": self.count(Verdict::Fail),
                "warning": self.count(Verdict::Warning),
                "not_testable": self.count(Verdict::NotTestable),
                "inconclusive": self.count(Verdict::Inconclusive),
                "unbaselined_failures": self.unbaselined_failures(),
            },
            "root_causes": root_causes,
            "checks": checks,
            "stale_baseline": stale,
        });
        // Redacted string by string, before serialization: a secret holding a character JSON
        // escapes is still found, and the document stays valid.
        let mut value = value;
        redact_strings(&mut value, &self.redactor);
        value
    }

    /// The report in `format`.
    pub fn render(&self, format: Format) -> String {
        let json = self.to_json();
        let text = match format {
            Format::Json => crate::escape::json(&serde_json::to_string_pretty(&json).unwrap_or_default()).into_owned(),
            Format::Junit => junit(&json),
            Format::Markdown => markdown(&json),
            Format::Sarif => {
                crate::escape::json(&serde_json::to_string_pretty(&sarif(&json)).unwrap_or_default()).into_owned()
            }
        };
        self.redactor.redact(&text)
    }

    /// The summary table printed at the end of a run.
    pub fn summary_table(&self) -> String {
        let width = self.entries.iter().map(|entry| entry.check.id.len()).max().unwrap_or(10).max(10) + 2;
        let mut text = String::new();
        if let Some(line) = &self.protocol {
            text.push_str(&format!("{}; the checks that need it are NOT TESTABLE\n", visible(line)));
        }
        if let Some(line) = &self.session_wire {
            text.push_str(&format!("{}; the sessions checks are NOT TESTABLE\n", visible(line)));
        }
        text.push_str(&format!("{:<width$}  {:<12}  {:<8}  note\n", "check", "verdict", "severity"));
        let row = |entry: &Entry, indent: &str| {
            let note = match &entry.baselined {
                Some(reason) if entry.outcome.verdict == Verdict::Fail => format!("baselined: {reason}"),
                _ if entry.outcome.verdict == Verdict::Pass => String::new(),
                _ => entry.outcome.detail.clone(),
            };
            // Redacted before it is escaped: a secret is found as the target sent it.
            let note = visible(&self.redactor.redact(&note)).into_owned();
            let id = format!("{indent}{}", entry.check.id);
            format!(
                "{:<width$}  {:<12}  {:<8}  {}\n",
                id,
                entry.outcome.verdict.label(),
                format!("{:?}", entry.check.severity).to_ascii_lowercase(),
                note
            )
        };
        for entry in self.entries.iter().filter(|entry| entry.root_cause.is_none()) {
            text.push_str(&row(entry, ""));
        }
        for cause in &self.root_causes {
            text.push_str(&format!(
                "ROOT CAUSE {} ({}): {}: {}\n",
                cause.id,
                format!("{:?}", cause.severity).to_ascii_lowercase(),
                cause.title,
                visible(&self.redactor.redact(&cause.detail))
            ));
            for entry in self.entries.iter().filter(|entry| entry.root_cause == Some(cause.id)) {
                text.push_str(&row(entry, "  "));
            }
        }
        for stale in &self.stale {
            text.push_str(&format!("stale baseline entry: {} ({})\n", visible(&stale.id), visible(&stale.reason)));
        }
        text.push_str(&format!(
            "{} checks: {} pass, {} fail ({} unbaselined), {} warning, {} not testable, {} inconclusive\n",
            self.entries.len(),
            self.count(Verdict::Pass),
            self.count(Verdict::Fail),
            self.unbaselined_failures(),
            self.count(Verdict::Warning),
            self.count(Verdict::NotTestable),
            self.count(Verdict::Inconclusive),
        ));
        self.redactor.redact(&text)
    }
}

/// The plain progress line of one finished check (its detail already redacted), what a target
/// controls in it escaped.
pub fn progress_line(check: &Check, outcome: &Outcome) -> String {
    format!("{:<12} {}  {}", outcome.verdict.label(), check.id, visible(&outcome.detail))
}

/// Every string of `value` redacted.
fn redact_strings(value: &mut Value, redactor: &Redactor) {
    match value {
        Value::String(text) => *text = redactor.redact(text),
        Value::Array(items) => items.iter_mut().for_each(|item| redact_strings(item, redactor)),
        Value::Object(object) => object.values_mut().for_each(|item| redact_strings(item, redactor)),
        _ => {}
    }
}

/// `text` for XML character data or an attribute: [`visible`] (XML 1.0 allows no control
/// characters), then the markup characters as entities.
fn xml(text: &str) -> String {
    visible(text)
        .chars()
        .map(|c| match c {
            '&' => "&amp;".to_owned(),
            '<' => "&lt;".to_owned(),
            '>' => "&gt;".to_owned(),
            '"' => "&quot;".to_owned(),
            '\'' => "&apos;".to_owned(),
            c => c.to_string(),
        })
        .collect()
}

fn checks(json: &Value) -> &[Value] {
    json["checks"].as_array().map_or(&[], Vec::as_slice)
}

fn field<'a>(check: &'a Value, key: &str) -> &'a str {
    check[key].as_str().unwrap_or_default()
}

fn root_causes(json: &Value) -> &[Value] {
    json["root_causes"].as_array().map_or(&[], Vec::as_slice)
}

/// The checks of `json` grouped under the root cause `cause` (`None`: those under none).
fn grouped<'a>(json: &'a Value, cause: Option<&str>) -> Vec<&'a Value> {
    checks(json).iter().filter(|check| check["root_cause"].as_str() == cause).collect()
}

fn junit(json: &Value) -> String {
    let mut text = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n".to_owned();
    let properties = protocol_lines(json);
    text.push_str(&testsuite("palisade-verify", &grouped(json, None), &properties));
    // Each root cause is a suite of its own: its checks, each with its own verdict, under it.
    for cause in root_causes(json) {
        let id = field(cause, "id");
        let line = format!("{}: {} ({})", field(cause, "title"), field(cause, "detail"), field(cause, "severity"));
        let name = format!("palisade-verify root cause {id}");
        text.push_str(&testsuite(&name, &grouped(json, Some(id)), &[("root_cause", line)]));
    }
    text.push_str("</testsuites>\n");
    text
}

fn testsuite(name: &str, checks: &[&Value], properties: &[(&str, String)]) -> String {
    let failures = checks.iter().filter(|c| c["verdict"] == "fail" && c["baselined"].is_null()).count();
    let skipped = checks.iter().filter(|c| c["verdict"] == "not_testable").count();
    let mut text = format!(
        "<testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\">\n",
        xml(name),
        checks.len()
    );
    if !properties.is_empty() {
        text.push_str("<properties>");
        for (key, value) in properties {
            text.push_str(&format!("<property name=\"{}\" value=\"{}\"/>", xml(key), xml(value)));
        }
        text.push_str("</properties>\n");
        for (_, value) in properties {
            text.push_str(&format!("<system-out>{}</system-out>\n", xml(value)));
        }
    }
    for check in checks {
        let (id, detail) = (field(check, "id"), field(check, "detail"));
        let module = id.split('.').next().unwrap_or_default();
        text.push_str(&format!("<testcase classname=\"{}\" name=\"{}\">", xml(module), xml(id)));
        match field(check, "verdict") {
            "fail" if check["baselined"].is_null() => {
                text.push_str(&format!(
                    "<failure message=\"{}\">{}\n\nRequirement: {}</failure>",
                    xml(detail),
                    xml(field(check, "help")),
                    xml(field(check, "requirement"))
                ));
            }
            "not_testable" => text.push_str(&format!("<skipped message=\"{}\"/>", xml(detail))),
            verdict => text.push_str(&format!("<system-out>{}: {}</system-out>", xml(verdict), xml(detail))),
        }
        text.push_str("</testcase>\n");
    }
    text.push_str("</testsuite>\n");
    text
}

/// The line saying the target does not speak 2026-07-28, when it does not.
fn protocol_line(json: &Value) -> Option<String> {
    let detail = json["protocol"]["detail"].as_str()?;
    Some(format!("{detail}; the checks that need it are NOT TESTABLE"))
}

/// The lines saying which protocol the target does not speak, keyed (`protocol`: 2026-07-28;
/// `session_wire`: the 2025-era session wire).
fn protocol_lines(json: &Value) -> Vec<(&'static str, String)> {
    let mut lines: Vec<(&str, String)> = protocol_line(json).map(|line| ("protocol", line)).into_iter().collect();
    if let Some(detail) = json["session_wire"]["detail"].as_str() {
        lines.push(("session_wire", format!("{detail}; the sessions checks are NOT TESTABLE")));
    }
    lines
}

/// The verdict summary line every format shares.
fn summary_line(json: &Value) -> String {
    let summary = &json["summary"];
    let n = |key: &str| summary[key].as_u64().unwrap_or_default();
    format!(
        "{} checks: {} pass, {} fail ({} unbaselined), {} warning, {} not testable, {} inconclusive",
        checks(json).len(),
        n("pass"),
        n("fail"),
        n("unbaselined_failures"),
        n("warning"),
        n("not_testable"),
        n("inconclusive"),
    )
}

fn markdown(json: &Value) -> String {
    // The head: what was tested, when, by which verifier, and the verdicts, before any table.
    let identities: Vec<String> =
        json["identities"].as_array().into_iter().flatten().filter_map(Value::as_str).map(markdown_cell).collect();
    let identities = if identities.is_empty() { "none given".to_owned() } else { identities.join("; ") };
    let mut text = format!(
        "# palisade verify report\n\n- **Target:** {}\n- **Date:** {}\n- **Verifier:** palisade-verify {}\n- **Identities:** {identities} (tokens redacted)\n- **Verdicts:** {}\n\n",
        markdown_cell(json["target"].as_str().unwrap_or_default()),
        markdown_cell(json["date"].as_str().unwrap_or_default()),
        markdown_cell(json["tool"]["version"].as_str().unwrap_or_default()),
        summary_line(json),
    );
    for (_, line) in protocol_lines(json) {
        text.insert_str(text.len() - 1, &format!("- **Protocol:** {}\n", markdown_cell(&line)));
    }
    for program in json["programs"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        text.insert_str(text.len() - 1, &format!("- **Command:** {}\n", markdown_cell(program)));
    }
    // Each root cause first, its checks (each with its own verdict) under it; then the rest.
    for cause in root_causes(json) {
        let id = field(cause, "id");
        text.push_str(&format!(
            "## Root cause `{id}`: {} ({})\n\n{}\n\n**What to fix:** {}\n\n",
            markdown_cell(field(cause, "title")),
            field(cause, "severity"),
            markdown_cell(field(cause, "detail")),
            markdown_cell(field(cause, "help"))
        ));
        markdown_table(&mut text, &grouped(json, Some(id)));
        text.push('\n');
    }
    if !root_causes(json).is_empty() {
        text.push_str("## Other checks\n\n");
    }
    markdown_table(&mut text, &grouped(json, None));
    text
}

fn markdown_table(text: &mut String, checks: &[&Value]) {
    text.push_str("| check | verdict | severity | detail |\n|---|---|---|---|\n");
    for check in checks {
        let verdict = match (field(check, "verdict"), check["baselined"].as_str()) {
            ("fail", Some(_)) => "fail (baselined)".to_owned(),
            (verdict, _) => verdict.to_owned(),
        };
        text.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            field(check, "id"),
            verdict,
            field(check, "severity"),
            markdown_cell(field(check, "detail"))
        ));
    }
}

/// A SARIF rule (`reportingDescriptor`) of a check or a root cause of `json`: its id, title,
/// full description, help (text and Markdown), default level and its reference, module and
/// `security-severity` as properties — all from the registry ([`crate::rules`]).
fn sarif_rule(item: &Value, module: &str) -> Value {
    let (id, title, help, reference) =
        (field(item, "id"), field(item, "title"), field(item, "help"), field(item, "requirement"));
    let severity = serde_json::from_value::<Severity>(item["severity"].clone()).unwrap_or(Severity::Low);
    let (full, text, markdown) = if reference.is_empty() {
        (title.to_owned(), format!("{title}\n\n{help}"), format!("**{title}** (`{id}`, a root cause)\n\n{help}"))
    } else {
        (
            format!("{title}. Requirement: {reference}"),
            format!("{title}\n\n{help}\n\nRequirement: {reference}"),
            format!("**{title}** (`{id}`)\n\n{help}\n\n**Requirement:** {reference}"),
        )
    };
    let level = match severity {
        Severity::Critical | Severity::High => "error",
        Severity::Medium => "warning",
        Severity::Low => "note",
    };
    let mut properties = json!({
        "tags": ["security", module],
        "security-severity": crate::rules::security_severity(severity),
        "precision": "high",
    });
    if !reference.is_empty() {
        properties["reference"] = json!(reference);
    }
    json!({
        "id": id,
        "name": id,
        "shortDescription": { "text": title },
        "fullDescription": { "text": full },
        "help": { "text": text, "markdown": markdown },
        "defaultConfiguration": { "level": level },
        "properties": properties,
    })
}

fn sarif(json: &Value) -> Value {
    let checks = checks(json);
    let location = json!([{ "physicalLocation": { "artifactLocation": { "uri": json["target"] } } }]);
    let mut rules: Vec<Value> = checks.iter().map(|c| sarif_rule(c, field(c, "module"))).collect();
    let index = |rules: &[Value], id: &str| rules.iter().position(|rule| rule["id"] == id);
    let mut results = Vec::new();
    // A root cause is one result; the checks grouped under it are results of their own rules,
    // each with its own verdict, pointing at it (`properties.rootCause`) as notes.
    for cause in root_causes(json) {
        let id = field(cause, "id");
        rules.push(sarif_rule(cause, crate::rules::module_of(id)));
        let members: Vec<&str> = grouped(json, Some(id)).iter().map(|c| field(c, "id")).collect();
        results.push(json!({
            "ruleId": id,
            "ruleIndex": index(&rules, id),
            "level": "error",
            "message": { "text": format!("{}: {} ({})", field(cause, "title"), field(cause, "detail"), members.join(", ")) },
            "locations": location,
            "properties": { "rootCause": true, "checks": members },
        }));
    }
    for c in checks.iter().filter(|c| c["verdict"] == "fail" || c["verdict"] == "warning") {
        let level = match (c["verdict"] == "fail" && c["baselined"].is_null(), c["root_cause"].is_null()) {
            (_, false) => "note",
            (true, true) => "error",
            (false, true) => "warning",
        };
        let id = field(c, "id");
        let mut result = json!({
            "ruleId": id,
            "ruleIndex": index(&rules, id),
            "level": level,
            "message": { "text": c["detail"] },
            "locations": location,
            "properties": { "verdict": c["verdict"], "severity": c["severity"] },
        });
        if !c["root_cause"].is_null() {
            result["properties"]["rootCause"] = c["root_cause"].clone();
        }
        if let Some(reason) = c["baselined"].as_str() {
            result["suppressions"] = json!([{ "kind": "external", "justification": reason }]);
        }
        results.push(result);
    }
    let notifications: Vec<Value> = protocol_lines(json)
        .into_iter()
        .map(|(_, line)| json!({ "level": "note", "message": { "text": line } }))
        .collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": {
                "name": "palisade-verify",
                "version": env!("CARGO_PKG_VERSION"),
                "rules": rules,
            } },
            "invocations": [{ "executionSuccessful": true, "toolExecutionNotifications": notifications }],
            "results": results,
        }],
    })
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
