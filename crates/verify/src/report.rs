//! Reports: a progress line per check, the summary table, and the `--format` files (JSON with
//! stable ids is the source; JUnit, Markdown and SARIF are rendered from it); the baseline of
//! accepted findings; the exit code. Every rendered text passes the run's redactor, and what a
//! target controls is shown through [`crate::escape`] in every format.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::check::{Check, Outcome, Severity, Verdict};
use crate::escape::{markdown_cell, visible};
use crate::identity::Redactor;

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
    /// How much it matters (the worst of its checks').
    pub severity: Severity,
    /// What was seen.
    pub detail: String,
    /// The checks grouped under it, in report order.
    pub checks: Vec<&'static str>,
}

/// The root cause of a target that needs no authentication at all.
pub const NO_AUTHENTICATION: &str = "auth.none";

/// Whether a FAIL of `id` follows from a target that needs no authentication at all: every
/// `auth.*` check, the transport and listen checks of a missing or wrong token, and the
/// 2025-era session checks of a token that is not the session owner's (no token, another
/// identity's, tenant's or client's: a target that reads no token cannot tell them apart).
pub fn follows_from_no_authentication(id: &str) -> bool {
    id.starts_with("auth.")
        || id == "transport.auth.missing"
        || id.starts_with("listen.auth.")
        || matches!(
            id,
            "sessions.no_token"
                | "sessions.other_identity"
                | "sessions.other_tenant"
                | "sessions.other_client"
                | "sessions.delete.other_identity"
        )
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
    /// Which program each operator command ran, and how it was found.
    pub programs: Vec<String>,
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
            programs: Vec::new(),
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
        if !checks.is_empty() {
            self.root_causes.push(RootCause {
                id: NO_AUTHENTICATION,
                title: "The target needs no authentication at all",
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

    /// The report with the line saying the target does not speak 2026-07-28, if it does not.
    pub fn with_protocol(mut self, unspoken: Option<String>) -> Self {
        self.protocol = unspoken;
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
                json!({
                    "id": entry.check.id,
                    "title": entry.check.title,
                    "requirement": entry.check.requirement,
                    "severity": entry.check.severity,
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
            "programs": self.programs,
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
    let mut properties = Vec::new();
    if let Some(line) = protocol_line(json) {
        properties.push(("protocol", line));
    }
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
                    "<failure message=\"{}\">{}</failure>",
                    xml(detail),
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
    let mut text = format!(
        "# palisade verify report\n\n- **Target:** {}\n- **Date:** {}\n- **Verifier:** palisade-verify {}\n- **Verdicts:** {}\n\n",
        markdown_cell(json["target"].as_str().unwrap_or_default()),
        markdown_cell(json["date"].as_str().unwrap_or_default()),
        markdown_cell(json["tool"]["version"].as_str().unwrap_or_default()),
        summary_line(json),
    );
    if let Some(line) = protocol_line(json) {
        text.insert_str(text.len() - 1, &format!("- **Protocol:** {}\n", markdown_cell(&line)));
    }
    for program in json["programs"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        text.insert_str(text.len() - 1, &format!("- **Command:** {}\n", markdown_cell(program)));
    }
    // Each root cause first, its checks (each with its own verdict) under it; then the rest.
    for cause in root_causes(json) {
        let id = field(cause, "id");
        text.push_str(&format!(
            "## Root cause `{id}`: {} ({})\n\n{}\n\n",
            markdown_cell(field(cause, "title")),
            field(cause, "severity"),
            markdown_cell(field(cause, "detail"))
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

fn sarif(json: &Value) -> Value {
    let checks = checks(json);
    let location = json!([{ "physicalLocation": { "artifactLocation": { "uri": json["target"] } } }]);
    let mut rules: Vec<Value> = checks
        .iter()
        .map(|c| json!({ "id": c["id"], "shortDescription": { "text": c["title"] }, "help": { "text": c["requirement"] } }))
        .collect();
    let mut results = Vec::new();
    // A root cause is one result; the checks grouped under it are results of their own rules,
    // each with its own verdict, pointing at it (`properties.rootCause`) as notes.
    for cause in root_causes(json) {
        rules.push(json!({ "id": cause["id"], "shortDescription": { "text": cause["title"] }, "help": { "text": cause["detail"] } }));
        let members: Vec<&str> = grouped(json, cause["id"].as_str()).iter().map(|c| field(c, "id")).collect();
        results.push(json!({
            "ruleId": cause["id"],
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
        let mut result = json!({
            "ruleId": c["id"],
            "level": level,
            "message": { "text": c["detail"] },
            "locations": location,
        });
        if !c["root_cause"].is_null() {
            result["properties"] = json!({ "rootCause": c["root_cause"], "verdict": c["verdict"] });
        }
        results.push(result);
    }
    let notifications: Vec<Value> =
        protocol_line(json).into_iter().map(|line| json!({ "level": "note", "message": { "text": line } })).collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": { "name": "palisade-verify", "version": env!("CARGO_PKG_VERSION"), "rules": rules } },
            "invocations": [{ "executionSuccessful": true, "toolExecutionNotifications": notifications }],
            "results": results,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Severity;

    const PASSING: Check = Check { id: "demo.passing", title: "t", requirement: "r", severity: Severity::Low };
    const FAILING: Check = Check { id: "demo.failing", title: "t", requirement: "r", severity: Severity::High };

    fn report() -> Report {
        let results = vec![
            (PASSING, Outcome::new(&PASSING, Verdict::Pass, "fine")),
            (FAILING, Outcome::new(&FAILING, Verdict::Fail, "broken")),
        ];
        Report::new("http://127.0.0.1:9/mcp", results, &Baseline::default(), Redactor::default())
    }

    #[test]
    fn the_markdown_report_opens_with_target_date_version_and_the_verdicts() {
        let report = report();
        let markdown = report.render(Format::Markdown);
        let head: Vec<&str> = markdown.lines().take_while(|line| !line.starts_with('|')).collect();
        let head = head.join("\n");
        assert!(head.starts_with("# palisade verify report"), "{markdown}");
        assert!(head.contains("- **Target:** http://127.0.0.1:9/mcp"), "{head}");
        assert!(head.contains(&format!("- **Date:** {}", report.date)), "{head}");
        assert!(report.date.starts_with("20") && report.date.ends_with('Z'), "{}", report.date);
        assert!(head.contains(&format!("- **Verifier:** palisade-verify {}", env!("CARGO_PKG_VERSION"))), "{head}");
        assert!(
            head.contains(
                "- **Verdicts:** 2 checks: 1 pass, 1 fail (1 unbaselined), 0 warning, 0 not testable, 0 inconclusive"
            ),
            "{head}"
        );
        assert_eq!(report.to_json()["date"], report.date.as_str());
        // Which program each operator command ran, in the head and in JSON.
        let report =
            report.with_programs(vec!["--disable-command runs /usr/bin/palisade (palisade found on PATH)".into()]);
        let markdown = report.render(Format::Markdown);
        let (head, _) = markdown.split_once("\n| check |").unwrap();
        assert!(
            head.contains("- **Command:** --disable-command runs /usr/bin/palisade (palisade found on PATH)"),
            "{markdown}"
        );
        assert_eq!(
            report.to_json()["programs"][0],
            "--disable-command runs /usr/bin/palisade (palisade found on PATH)"
        );
    }
}
