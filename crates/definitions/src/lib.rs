//! What a poisoned MCP definition looks like (control C6, and the verifier's `definitions`
//! module): findings on a tool, prompt, resource, resource template or server instructions, each
//! with a stable id, a severity, a one-line summary and the exact spans it saw (hidden characters
//! shown as markers). One implementation serves both the gateway's review (`palisade pins
//! show|diff`, the review page) and `palisade verify`.
//!
//! They are **flags for a person, not verdicts**: heuristics that miss a careful attacker and can
//! flag honest text. The gateway never blocks on them (the reviewer's decision is the gate); the
//! verifier reports them. Pure: no storage, no I/O.
//!
//! | id | severity | flagged when |
//! |---|---|---|
//! | `hidden-characters` | critical (tag characters), high (bidi controls), medium (others) | any string or key holds a character [`palisade_base::reveal`] marks (controls, bidi controls, zero-width, tag characters, variation selectors, private use, unassigned); tag characters are also decoded, since a model reads them as ASCII |
//! | `model-directed-instructions` | high | text speaks to the model rather than describing the tool: "ignore previous instructions", "you must", "do not tell the user", "without asking", "secretly", `<IMPORTANT>`, `[SYSTEM]`, "system prompt", "before using this tool", "important:" … |
//! | `exfiltration` | critical | text asks for the user's data (contents, history, keys, tokens, files) to be sent somewhere (a URL, an address, a webhook) or put into an argument the user will not read (a "sidenote", a URL, a query); a recipient redirected |
//! | `invites-secrets` | high | an input property or prompt argument is named like a secret (`password`, `api_key`, `accessToken`, `seed_phrase`, …) or has `"format": "password"` |
//! | `imitates-name` | high | the definition's name reads like another tool's name (or a widely deployed server's) by look-alike letters, or mixes the letters of two scripts |
//! | `references-other-tool` | medium | text names another tool the caller knows (three characters or more), a cue to chain or replace calls |
//! | `references-secrets` | high | SSH keys (`id_rsa`, `.ssh`), `.env`, API keys, access or bearer tokens, passwords, credentials, secrets, cloud and package-manager credential files, seed phrases, `GITHUB_TOKEN`-style variables |
//! | `references-files` | medium | home-relative (`~/`, `$HOME`, `%USERPROFILE%`), absolute system (`/etc/…`, `/home/…`), drive-letter, parent-relative (`../`) paths and `file:` URIs |
//! | `references-urls` | low | `http(s)`, `ws(s)`, `(s)ftp` URLs, `www.` hosts and `data:` URIs |
//! | `meaning-changed` | high | against the version last decided on (or a baseline): new imperative sentences, new instructions, references, URLs or hidden characters, or at least half of the words of the descriptions and titles changed |
//!
//! What is read: every string value and key of the definition (with hidden characters removed,
//! so that `ig\u{200b}nore` still reads "ignore", and with its tag characters decoded), except
//! the fields that hold URLs or names by design: the top-level `name`, `uri`, `uriTemplate` and
//! `icons`, and `$schema`, `$id`, `$ref` and `mimeType` anywhere (the name is read by
//! `imitates-name` only). A launch (`kind = launch`) is the operator's own configuration: only
//! hidden characters are flagged there.
//!
//! Every summary is one line with hidden characters shown as markers
//! ([`palisade_base::reveal::reveal_line`]), safe to print to a terminal; a page escapes it as
//! HTML.
//!
//! Layers, low to high: `patterns`, `names`, `schema`, `scan`.

mod names;
mod patterns;
mod scan;
mod schema;

use std::collections::BTreeSet;

use palisade_base::reveal::{Hidden, count_by_kind, json_strings};
use serde::Serialize;
use serde_json::Value;

pub use names::{WELL_KNOWN, skeleton};
use scan::{Hit, Scan, changed_share, hidden_count, hidden_spans, hidden_summary, quote_all, spans};

/// Hidden or control characters.
pub const HIDDEN_CHARACTERS: &str = "hidden-characters";
/// Text addressed to the model.
pub const MODEL_DIRECTED_INSTRUCTIONS: &str = "model-directed-instructions";
/// The user's data to be sent somewhere or smuggled into an argument.
pub const EXFILTRATION: &str = "exfiltration";
/// An input field named like a secret.
pub const INVITES_SECRETS: &str = "invites-secrets";
/// A name that reads like another's.
pub const IMITATES_NAME: &str = "imitates-name";
/// Another tool named.
pub const REFERENCES_OTHER_TOOL: &str = "references-other-tool";
/// Secrets, keys, tokens, passwords named.
pub const REFERENCES_SECRETS: &str = "references-secrets";
/// File paths named.
pub const REFERENCES_FILES: &str = "references-files";
/// URLs named.
pub const REFERENCES_URLS: &str = "references-urls";
/// The description's meaning changed since the version last decided on.
pub const MEANING_CHANGED: &str = "meaning-changed";
/// Every finding id, in the order findings are listed.
pub const FINDING_IDS: [&str; 10] = [
    HIDDEN_CHARACTERS,
    MODEL_DIRECTED_INSTRUCTIONS,
    EXFILTRATION,
    INVITES_SECRETS,
    IMITATES_NAME,
    REFERENCES_OTHER_TOOL,
    REFERENCES_SECRETS,
    REFERENCES_FILES,
    REFERENCES_URLS,
    MEANING_CHANGED,
];

/// How much a finding matters, were it what it looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth a look (a URL in a description).
    Low,
    /// A cue an attack would use (another tool named, a file path).
    Medium,
    /// What an attack looks like (instructions to the model, a secret asked for).
    High,
    /// Data leaves, or text no person can see.
    Critical,
}

impl Severity {
    /// The label used in reports.
    pub fn label(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::Critical => "critical",
        }
    }
}

/// Where a finding saw what it flags: a JSON pointer into the definition (empty: the whole text)
/// and the text there, hidden characters shown as `⟨U+XXXX⟩` markers, on one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Span {
    /// The JSON pointer (`/inputSchema/properties/note/description`).
    pub pointer: String,
    /// The text seen there, made visible.
    pub text: String,
}

/// One finding: a stable id, its severity, a one-line summary of what was seen where, and the
/// spans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// One of [`FINDING_IDS`].
    pub id: &'static str,
    /// How much it matters.
    pub severity: Severity,
    /// What was seen and where: one line, hidden characters shown as markers.
    pub summary: String,
    /// Each place it was seen.
    pub spans: Vec<Span>,
}

/// The findings of a definition of `kind` (`tool`, `prompt`, `resource`, `resource_template`,
/// `instructions`, `launch`: its canonical JSON text, or any text), against `previous` (the
/// version last decided on, if any), given the lower-case names of the other tools the caller
/// knows. Listed in [`FINDING_IDS`] order, at most one of each.
pub fn findings(kind: &str, current: &str, previous: Option<&str>, other_tools: &BTreeSet<String>) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(summary) = hidden_summary(current) {
        out.push(Finding {
            id: HIDDEN_CHARACTERS,
            severity: hidden_severity(current),
            summary,
            spans: hidden_spans(current),
        });
    }
    if kind == "launch" {
        return out;
    }
    let now = Scan::of(current);
    let parsed = serde_json::from_str::<Value>(current).ok();
    let tools = now.tool_references(other_tools);
    let mut push = |id: &'static str, severity: Severity, label: &str, items: &[Hit]| {
        if !items.is_empty() {
            out.push(Finding { id, severity, summary: format!("{label}: {}", quote_all(items)), spans: spans(items) });
        }
    };
    push(MODEL_DIRECTED_INSTRUCTIONS, Severity::High, "instructions addressed to the model", &now.instructions);
    push(EXFILTRATION, Severity::Critical, "asks for data to be sent or smuggled out", &now.exfiltration);
    if let Some(definition) = &parsed {
        let fields = schema::secret_fields(definition);
        if !fields.is_empty() {
            let hits: Vec<Hit> = fields.iter().map(|field| scan::hit(&field.pointer, &field.name)).collect();
            push(INVITES_SECRETS, Severity::High, "asks the model for a secret", &hits);
        }
        if let Some(name) = definition.get("name").and_then(Value::as_str) {
            let imitated = names::imitations(name, other_tools.iter().map(String::as_str));
            if !imitated.is_empty() {
                let hits: Vec<Hit> = imitated.iter().map(|why| scan::hit("/name", &format!("{name}: {why}"))).collect();
                push(IMITATES_NAME, Severity::High, "its name imitates another", &hits);
            }
        }
    }
    push(REFERENCES_OTHER_TOOL, Severity::Medium, "names another tool", &tools);
    push(REFERENCES_SECRETS, Severity::High, "refers to secrets", &now.secrets);
    push(REFERENCES_FILES, Severity::Medium, "refers to files", &now.files);
    push(REFERENCES_URLS, Severity::Low, "refers to URLs", &now.urls);
    if let Some(previous) = previous.filter(|previous| *previous != current)
        && let Some(finding) = meaning_changed(&now, current, previous, other_tools, &tools)
    {
        out.push(finding);
    }
    out
}

/// [`MEANING_CHANGED`] between `previous` and the current version (`now`, `current`).
fn meaning_changed(
    now: &Scan,
    current: &str,
    previous: &str,
    other_tools: &BTreeSet<String>,
    tools: &[Hit],
) -> Option<Finding> {
    let before = Scan::of(previous);
    let mut changes = Vec::new();
    let mut added_hits: Vec<Hit> = Vec::new();
    let new_sentences: Vec<&Hit> = now
        .imperatives
        .iter()
        .filter(|hit| !before.imperatives.iter().any(|old| old.normalized == hit.normalized))
        .collect();
    if !new_sentences.is_empty() {
        changes.push(format!("new imperative sentences: {}", quote_all(&new_sentences)));
        added_hits.extend(new_sentences.into_iter().cloned());
    }
    let before_tools = before.tool_references(other_tools);
    for (label, now_items, before_items) in [
        ("new instructions to the model", &now.instructions, &before.instructions),
        ("new requests to send data out", &now.exfiltration, &before.exfiltration),
        ("new references to other tools", &tools.to_vec(), &before_tools),
        ("new references to secrets", &now.secrets, &before.secrets),
        ("new references to files", &now.files, &before.files),
        ("new URLs", &now.urls, &before.urls),
    ] {
        let added: Vec<&Hit> =
            now_items.iter().filter(|hit| !before_items.iter().any(|old| old.normalized == hit.normalized)).collect();
        if !added.is_empty() {
            changes.push(format!("{label}: {}", quote_all(&added)));
            added_hits.extend(
                added
                    .into_iter()
                    .filter(|hit| !added_hits.iter().any(|seen| seen.normalized == hit.normalized))
                    .cloned()
                    .collect::<Vec<_>>(),
            );
        }
    }
    let (hidden_now, hidden_before) = (hidden_count(current), hidden_count(previous));
    if hidden_now > hidden_before {
        changes.push(format!("hidden characters went from {hidden_before} to {hidden_now}"));
    }
    if let Some(share) = changed_share(&before.prose, &now.prose) {
        changes.push(format!("{}% of the words of its descriptions and titles changed", (share * 100.0).round()));
        added_hits.extend(
            now.segments.iter().filter(|segment| segment.prose).map(|segment| scan::hit(&segment.path, &segment.text)),
        );
    }
    if changes.is_empty() {
        return None;
    }
    Some(Finding {
        id: MEANING_CHANGED,
        severity: Severity::High,
        summary: format!("since the version last decided on: {}", changes.join("; ")),
        spans: spans(&added_hits),
    })
}

/// Tag characters are read by a model and seen by no one: critical; bidi controls reorder what a
/// person sees: high; the rest: medium.
fn hidden_severity(definition: &str) -> Severity {
    let parsed = serde_json::from_str::<Value>(definition).ok();
    let strings: Vec<&str> = match &parsed {
        Some(value) => json_strings(value),
        None => vec![definition],
    };
    let kinds: Vec<Hidden> = strings.iter().flat_map(|text| count_by_kind(text)).map(|(kind, _)| kind).collect();
    if kinds.contains(&Hidden::Tag) {
        Severity::Critical
    } else if kinds.contains(&Hidden::Bidi) {
        Severity::High
    } else {
        Severity::Medium
    }
}

/// The findings as the CLI prints them: a heading line and one line per finding.
pub fn render_text(findings: &[Finding]) -> String {
    if findings.is_empty() {
        return "findings: none (the checks are heuristics: read the definition all the same)\n".to_owned();
    }
    let mut out = format!(
        "findings ({}; flags for the reviewer, they do not block approval):\n",
        if findings.len() == 1 { "1 flag".to_owned() } else { format!("{} flags", findings.len()) }
    );
    for finding in findings {
        out.push_str(&format!("  [{}] {}\n", finding.id, finding.summary));
    }
    out
}

#[cfg(test)]
mod tests;
