//! One version of a definition read as a model reads it: its text pieces ([`Segment`]: every
//! string value and key, hidden characters removed, tag characters decoded into a piece of their
//! own), what the patterns of [`crate::patterns`] match in them ([`Scan`]), the hidden characters
//! it holds, and the comparison of two versions' prose.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use palisade_base::reveal::{classify, count_by_kind, count_hidden, json_strings, reveal_line_short, tag_text};
use regex::Regex;
use serde_json::Value;

use crate::Span;
use crate::patterns::{EXFILTRATION, FILES, INSTRUCTIONS, SECRETS, SENTENCE_END, URLS};

/// Most quoted matches one summary lists.
pub(crate) const MAX_QUOTED: usize = 3;
/// Longest quote of untrusted text in a summary, in characters.
const MAX_QUOTE_CHARS: usize = 80;
/// Longest quote of untrusted text in a span, in characters.
const MAX_SPAN_CHARS: usize = 160;
/// Longest JSON pointer a summary shows, in characters.
const MAX_PATH_CHARS: usize = 80;
/// The share of changed words at which the meaning counts as changed.
const CHANGED_SHARE: f32 = 0.5;
/// How long the word diff of a meaning change may search.
const WORD_DIFF_TIMEOUT: Duration = Duration::from_millis(500);

/// One matched piece of text: where, what (as shown) and its normalized form (for comparing
/// two versions).
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    pub(crate) path: String,
    pub(crate) shown: String,
    pub(crate) normalized: String,
}

/// A piece of a definition's text: its JSON pointer, its text as a model reads it (hidden
/// characters removed) and whether it is prose (a description, a title, instructions).
pub(crate) struct Segment {
    pub(crate) path: String,
    pub(crate) text: String,
    pub(crate) prose: bool,
}

/// What the text heuristics found in one version of a definition.
pub(crate) struct Scan {
    pub(crate) segments: Vec<Segment>,
    pub(crate) instructions: Vec<Hit>,
    pub(crate) exfiltration: Vec<Hit>,
    pub(crate) secrets: Vec<Hit>,
    pub(crate) files: Vec<Hit>,
    pub(crate) urls: Vec<Hit>,
    pub(crate) imperatives: Vec<Hit>,
    /// The words of its descriptions and titles.
    pub(crate) prose: String,
}

impl Scan {
    pub(crate) fn of(definition: &str) -> Self {
        let segments = segments(definition);
        let mut scan = Scan {
            instructions: Vec::new(),
            exfiltration: Vec::new(),
            secrets: Vec::new(),
            files: Vec::new(),
            urls: Vec::new(),
            imperatives: Vec::new(),
            prose: String::new(),
            segments: Vec::new(),
        };
        for segment in &segments {
            collect(&mut scan.instructions, segment, &INSTRUCTIONS);
            collect(&mut scan.exfiltration, segment, &EXFILTRATION);
            collect(&mut scan.secrets, segment, &SECRETS);
            collect(&mut scan.files, segment, &FILES);
            collect(&mut scan.urls, segment, &URLS);
            if segment.prose {
                scan.prose.push_str(&segment.text);
                scan.prose.push('\n');
                for sentence in SENTENCE_END.split(&segment.text) {
                    if is_imperative(sentence) {
                        scan.imperatives.push(hit(&segment.path, sentence.trim()));
                    }
                }
            }
        }
        scan.segments = segments;
        scan
    }

    /// The other tools' names its text mentions (as whole tokens of the name alphabet).
    pub(crate) fn tool_references(&self, other_tools: &BTreeSet<String>) -> Vec<Hit> {
        let mut out: Vec<Hit> = Vec::new();
        for segment in &self.segments {
            let tokens = segment.text.split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')));
            for token in tokens.map(|token| token.trim_matches(['.', '-'])) {
                let lower = token.to_lowercase();
                if other_tools.contains(&lower) && !out.iter().any(|seen| seen.normalized == lower) {
                    out.push(hit(&segment.path, token));
                }
            }
        }
        out
    }
}

pub(crate) fn hit(path: &str, text: &str) -> Hit {
    Hit {
        path: path.to_owned(),
        shown: text.to_owned(),
        normalized: text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase(),
    }
}

/// Every match of every pattern in `patterns` within `segment` (a pattern's first group, when
/// it has one, is the part quoted), once per normalized text.
fn collect(into: &mut Vec<Hit>, segment: &Segment, patterns: &[Regex]) {
    for pattern in patterns {
        for captures in pattern.captures_iter(&segment.text) {
            let Some(found) = captures.get(1).or_else(|| captures.get(0)) else { continue };
            let text = found.as_str().trim_matches(|c: char| c.is_whitespace() || "\"'`(),;:=".contains(c));
            let text = text.trim_end_matches(['.', '!', '?']);
            let found = hit(&segment.path, text);
            if !found.normalized.is_empty() && !into.iter().any(|seen| seen.normalized == found.normalized) {
                into.push(found);
            }
        }
    }
}

/// `"quote" at /path; …`, at most [`MAX_QUOTED`], then how many more.
pub(crate) fn quote_all<H: std::borrow::Borrow<Hit>>(hits: &[H]) -> String {
    let mut parts: Vec<String> = hits
        .iter()
        .take(MAX_QUOTED)
        .map(|hit| {
            let hit = hit.borrow();
            let path = if hit.path.is_empty() { "/".to_owned() } else { reveal_line_short(&hit.path, MAX_PATH_CHARS) };
            format!("\"{}\" at {path}", reveal_line_short(&hit.shown, MAX_QUOTE_CHARS))
        })
        .collect();
    if hits.len() > MAX_QUOTED {
        parts.push(format!("and {} more", hits.len() - MAX_QUOTED));
    }
    parts.join(", ")
}

/// How many hidden characters the definition's strings hold (decoded as a model reads them).
pub(crate) fn hidden_count(definition: &str) -> usize {
    palisade_base::reveal::count_hidden_json(definition)
}

/// The summary of [`crate::HIDDEN_CHARACTERS`], or `None` when there are none.
pub(crate) fn hidden_summary(definition: &str) -> Option<String> {
    let parsed = serde_json::from_str::<Value>(definition).ok();
    let strings: Vec<&str> = match &parsed {
        Some(value) => json_strings(value),
        None => vec![definition],
    };
    let total: usize = strings.iter().map(|text| count_hidden(text)).sum();
    if total == 0 {
        return None;
    }
    let mut kinds: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut order = Vec::new();
    for text in &strings {
        for (kind, n) in count_by_kind(text) {
            if !kinds.contains_key(kind.label()) {
                order.push(kind);
            }
            *kinds.entry(kind.label()).or_default() += n;
        }
    }
    order.sort();
    let by_kind: Vec<String> = order.iter().map(|kind| format!("{} {}", kinds[kind.label()], kind.label())).collect();
    let paths: Vec<String> = match &parsed {
        Some(value) => hidden_paths(value),
        None => Vec::new(),
    };
    let mut summary =
        format!("{total} hidden or control character{} ({})", if total == 1 { "" } else { "s" }, by_kind.join(", "));
    if !paths.is_empty() {
        let shown: Vec<String> =
            paths.iter().take(MAX_QUOTED).map(|path| reveal_line_short(path, MAX_PATH_CHARS)).collect();
        let more =
            if paths.len() > MAX_QUOTED { format!(" and {} more", paths.len() - MAX_QUOTED) } else { String::new() };
        summary.push_str(&format!(" at {}{more}", shown.join(", ")));
    }
    let spelled: String =
        strings.iter().map(|text| tag_text(text)).filter(|t| !t.is_empty()).collect::<Vec<_>>().join(" ");
    if !spelled.is_empty() {
        summary.push_str(&format!("; its tag characters spell \"{}\"", reveal_line_short(&spelled, MAX_QUOTE_CHARS)));
    }
    Some(summary)
}

/// The JSON pointers of the strings (or keys) that hold hidden characters.
fn hidden_paths(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(value, |path, text, _| {
        if count_hidden(text) > 0 && !out.contains(&path.to_owned()) {
            out.push(if path.is_empty() { "/".to_owned() } else { path.to_owned() });
        }
    });
    out
}

/// Calls `each(pointer, text, key)` for every string value and every key of `value` (keys with
/// the pointer of their member), in document order, iteratively.
pub(crate) fn walk<'a>(value: &'a Value, mut each: impl FnMut(&str, &'a str, Option<&'a str>)) {
    let mut stack: Vec<(String, &'a Value, Option<&'a str>)> = vec![(String::new(), value, None)];
    while let Some((path, value, key)) = stack.pop() {
        match value {
            Value::String(text) => each(&path, text, key),
            Value::Array(items) => {
                for (index, item) in items.iter().enumerate().rev() {
                    stack.push((format!("{path}/{index}"), item, key));
                }
            }
            Value::Object(members) => {
                let mut children = Vec::new();
                for (name, item) in members {
                    let child = format!("{path}/{}", name.replace('~', "~0").replace('/', "~1"));
                    each(&child, name, None);
                    children.push((child, item, Some(name.as_str())));
                }
                stack.extend(children.into_iter().rev());
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
}

/// Fields whose strings hold URLs, names or types by design (anywhere in the definition).
const SKIPPED_ANYWHERE: [&str; 4] = ["$schema", "$id", "$ref", "mimeType"];
/// Top-level fields whose strings hold names, URIs or icons by design.
const SKIPPED_TOP: [&str; 4] = ["name", "uri", "uriTemplate", "icons"];

/// The text pieces of a definition the heuristics read (see the module docs), each with hidden
/// characters removed, and for each piece with tag characters one more piece with their ASCII.
pub(crate) fn segments(definition: &str) -> Vec<Segment> {
    let mut raw: Vec<(String, String, bool)> = Vec::new();
    match serde_json::from_str::<Value>(definition) {
        Ok(value) => {
            let object = value.is_object();
            walk(&value, |path, text, key| {
                let mut parts = path.split('/').skip(1);
                let skipped = (object && parts.next().is_some_and(|top| SKIPPED_TOP.contains(&top)))
                    || path.split('/').any(|part| SKIPPED_ANYWHERE.contains(&part));
                if !skipped {
                    let prose = path.is_empty() || matches!(key, Some("description" | "title"));
                    raw.push((path.to_owned(), text.to_owned(), prose));
                }
            });
        }
        Err(_) => raw.push((String::new(), definition.to_owned(), true)),
    }
    let mut out = Vec::with_capacity(raw.len());
    for (path, text, prose) in raw {
        let spelled = tag_text(&text);
        let visible: String = text
            .chars()
            .map(|c| if c == '\t' || c == '\r' { ' ' } else { c })
            .filter(|c| *c == '\n' || classify(*c).is_none())
            .map(|c| if c == '\u{2019}' { '\'' } else { c })
            .collect();
        out.push(Segment { path: path.clone(), text: visible, prose });
        if !spelled.is_empty() {
            out.push(Segment { path: format!("{path} (in tag characters)"), text: spelled, prose });
        }
    }
    out
}

/// Whether a sentence reads as an order: it starts with a verb in the base form a command uses,
/// or with "you must/should/need/have to/will".
pub(crate) fn is_imperative(sentence: &str) -> bool {
    const VERBS: &[&str] = &[
        "call",
        "use",
        "invoke",
        "run",
        "execute",
        "send",
        "read",
        "write",
        "include",
        "pass",
        "ignore",
        "disregard",
        "forget",
        "always",
        "never",
        "do",
        "don't",
        "dont",
        "before",
        "after",
        "first",
        "make",
        "ensure",
        "remember",
        "tell",
        "forward",
        "upload",
        "copy",
        "fetch",
        "delete",
        "remove",
        "add",
        "append",
        "attach",
        "provide",
        "output",
        "print",
        "respond",
        "reply",
        "treat",
        "pretend",
        "act",
        "assume",
        "immediately",
    ];
    let mut words =
        sentence.split_whitespace().map(|word| word.trim_matches(|c: char| !c.is_alphanumeric() && c != '\''));
    let Some(first) = words.next().map(str::to_lowercase) else { return false };
    if first == "you" {
        let second = words.next().map(str::to_lowercase).unwrap_or_default();
        return matches!(second.as_str(), "must" | "should" | "need" | "have" | "will" | "shall");
    }
    VERBS.contains(&first.as_str())
}

/// The share of words changed between two prose texts, when it is at least [`CHANGED_SHARE`]
/// and both have words.
pub(crate) fn changed_share(before: &str, now: &str) -> Option<f32> {
    if before.split_whitespace().next().is_none() || now.split_whitespace().next().is_none() {
        return None;
    }
    // One word a line, so that the ratio counts words (not the white space between them).
    let words = |text: &str| text.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>().join("\n") + "\n";
    let (before, now) = (words(before), words(now));
    let diff = similar::TextDiff::configure().timeout(WORD_DIFF_TIMEOUT).diff_lines(&before, &now);
    let share = 1.0 - diff.ratio();
    (share >= CHANGED_SHARE).then_some(share)
}

/// The spans of `hits`: each hit's pointer and its text with hidden characters shown.
pub(crate) fn spans<H: std::borrow::Borrow<Hit>>(hits: &[H]) -> Vec<Span> {
    hits.iter()
        .map(|hit| {
            let hit = hit.borrow();
            Span { pointer: hit.path.clone(), text: reveal_line_short(&hit.shown, MAX_SPAN_CHARS) }
        })
        .collect()
}

/// The spans of [`hidden_summary`]: every string (or key) holding hidden characters, whole, with
/// them shown as markers — the exact text a model reads and a person does not see.
pub(crate) fn hidden_spans(definition: &str) -> Vec<Span> {
    let Ok(value) = serde_json::from_str::<Value>(definition) else {
        return if count_hidden(definition) > 0 {
            vec![Span { pointer: String::new(), text: reveal_line_short(definition, MAX_SPAN_CHARS) }]
        } else {
            Vec::new()
        };
    };
    let mut out: Vec<Span> = Vec::new();
    walk(&value, |path, text, _| {
        if count_hidden(text) > 0 {
            out.push(Span { pointer: path.to_owned(), text: reveal_line_short(text, MAX_SPAN_CHARS) });
        }
    });
    out
}
