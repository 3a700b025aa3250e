//! Review findings (control C6) beside a definition and its diff wherever a reviewer decides
//! (`palisade pins show|diff`, the review page): the findings of `palisade-definitions` (one
//! implementation, shared with `palisade verify`'s `definitions` module; its crate docs list every
//! id), read against the version last decided on and the names of the other tools this gateway
//! knows ([`ToolNames`]). They are **flags for a person, not verdicts**: they never block, hold or
//! approve anything; the reviewer's decision stays the only gate.

use std::collections::{BTreeMap, BTreeSet};

use palisade_store::PinRow;

pub use palisade_definitions::{FINDING_IDS, Finding, Severity, findings, render_text};

use crate::config::GatewaySettings;
use crate::names::{Namer, Separator};

/// Shortest tool name recognised in text (shorter ones match too much ordinary prose).
const MIN_TOOL_NAME_CHARS: usize = 3;

/// The names of the tools a gateway knows, to recognise them in another definition's text:
/// each tool pin's upstream name and the name it is exposed as (by its upstream's prefix and the
/// gateway's separator).
#[derive(Debug, Clone, Default)]
pub struct ToolNames {
    namers: BTreeMap<String, Namer>,
}

impl ToolNames {
    /// The namers of `settings`' upstreams.
    pub fn new(settings: &GatewaySettings) -> Self {
        let prefixes = settings.upstreams.iter().map(|upstream| (upstream.id.as_str(), upstream.prefix.as_deref()));
        Self::of_prefixes(prefixes, settings.separator)
    }

    /// The namers of upstreams given as (id, prefix) pairs (`None`: unprefixed).
    pub fn of_prefixes<'a>(
        upstreams: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
        separator: Separator,
    ) -> Self {
        let namers = upstreams.into_iter().map(|(id, prefix)| (id.to_owned(), Namer::new(prefix, separator))).collect();
        Self { namers }
    }

    /// The names (lower case) of every tool in `rows` other than `pin`, without `pin`'s own names.
    pub fn others(&self, rows: &[PinRow], pin: &PinRow) -> BTreeSet<String> {
        let names_of = |row: &PinRow| {
            let o = &row.observation;
            let mut names = vec![o.name.to_lowercase()];
            if let Some(exposed) = self.namers.get(&o.upstream_id).and_then(|namer| namer.expose_name(&o.name).ok()) {
                names.push(exposed.to_lowercase());
            }
            names
        };
        let own: BTreeSet<String> =
            if pin.observation.kind == "tool" { names_of(pin).into_iter().collect() } else { BTreeSet::new() };
        rows.iter()
            .filter(|row| row.observation.kind == "tool" && row.observation.pin_id != pin.observation.pin_id)
            .flat_map(names_of)
            .filter(|name| name.chars().count() >= MIN_TOOL_NAME_CHARS && !own.contains(name))
            .collect()
    }
}

/// The findings of `row`'s current definition, against the definition last decided on (if any),
/// with `other_tools` ([`ToolNames::others`]).
pub fn for_row(row: &PinRow, other_tools: &BTreeSet<String>) -> Vec<Finding> {
    let o = &row.observation;
    findings(&o.kind, &o.definition, row.decided_definition.as_deref(), other_tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_the_other_tools_upstream_and_exposed_names() {
        let row = |upstream: &str, kind: &str, name: &str| PinRow {
            observation: palisade_store::PinObservation {
                pin_id: format!("{upstream}-{kind}-{name}").replace('_', "-"),
                upstream_id: upstream.into(),
                upstream_url: format!("https://{upstream}.example/mcp"),
                kind: kind.into(),
                name: name.into(),
                digest: "ab".repeat(32),
                definition: "{}".into(),
                seen_at_ms: 0,
            },
            first_seen_ms: 0,
            decision: None,
            decided_definition: None,
        };
        let names = ToolNames::of_prefixes([("docs", Some("docs")), ("mail", None)], Separator::Underscore);
        let rows = [
            row("docs", "tool", "search"),
            row("docs", "tool", "x"),
            row("mail", "tool", "send_mail"),
            row("mail", "prompt", "greet"),
            row("docs", "tool", "add"),
        ];
        let others = names.others(&rows, &rows[4]);
        assert_eq!(
            others.into_iter().collect::<Vec<_>>(),
            ["docs_search", "docs_x", "search", "send_mail"],
            "prompts and names under three characters are not tools to recognise"
        );
        let others = names.others(&rows, &rows[0]);
        assert!(!others.contains("search") && !others.contains("docs_search"), "{others:?}");
    }
}
