//! The findings measured against the corpus in `corpus/`: poisoned definitions built from
//! published tool-poisoning research (each entry names its source and technique, and the finding
//! ids it must raise) and clean definitions captured from real servers (`corpus/capture.py`).
//! Recall must be 100 % (every poisoned entry detected, every expected id raised) and the clean
//! definitions must raise nothing of medium severity or above (false-positive rate 0). A low
//! finding (`references-urls`) is informational: it says truly that a URL is there, claims no
//! attack, and is counted and shown apart. The figures are printed as the table VERIFY.md copies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use palisade_definitions::{FINDING_IDS, Severity, findings};
use serde_json::Value;

fn corpus(name: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_json::from_str::<Vec<Value>>(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The text a finding reads: a definition's canonical JSON (server instructions: the JSON string).
fn text(definition: &Value) -> String {
    palisade_base::canonical::canonical_string(definition)
}

fn lower_names(entries: &[Value]) -> BTreeSet<String> {
    entries
        .iter()
        .filter(|entry| entry["kind"] == "tool")
        .filter_map(|entry| entry["definition"]["name"].as_str())
        .map(str::to_lowercase)
        .collect()
}

#[test]
fn every_poisoned_definition_is_found_with_the_findings_its_technique_calls_for() {
    let poisoned = corpus("poisoned.json");
    assert!(poisoned.len() >= 20, "the corpus shrank");
    let mut expected_by_id: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut missed = Vec::new();
    let mut detected = 0;
    for entry in &poisoned {
        let others: BTreeSet<String> =
            entry["others"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_lowercase).collect();
        let previous = entry.get("previous").map(text);
        let found =
            findings(entry["kind"].as_str().expect("kind"), &text(&entry["definition"]), previous.as_deref(), &others);
        let ids: Vec<&str> = found.iter().map(|finding| finding.id).collect();
        if !ids.is_empty() {
            detected += 1;
        }
        for expected in entry["expect"].as_array().expect("expect") {
            let expected = expected.as_str().expect("an id");
            let id = FINDING_IDS.iter().find(|id| **id == expected).unwrap_or_else(|| panic!("unknown id {expected}"));
            let counts = expected_by_id.entry(id).or_default();
            counts.0 += 1;
            if ids.contains(&expected) {
                counts.1 += 1;
            } else {
                missed.push(format!("{}: {expected} not raised (raised {ids:?})", entry["id"]));
            }
        }
        for finding in &found {
            assert!(!finding.spans.is_empty(), "{}: {} has no span", entry["id"], finding.id);
        }
    }
    eprintln!("| finding id | expected in poisoned entries | raised | recall |");
    eprintln!("|---|---|---|---|");
    for (id, (expected, raised)) in &expected_by_id {
        eprintln!("| `{id}` | {expected} | {raised} | {:.0} % |", 100.0 * *raised as f64 / *expected as f64);
    }
    eprintln!("poisoned definitions detected: {detected} of {}", poisoned.len());
    assert!(missed.is_empty(), "missed:\n{}", missed.join("\n"));
    assert_eq!(detected, poisoned.len());
    let covered: BTreeSet<&str> = expected_by_id.keys().copied().collect();
    assert_eq!(covered, FINDING_IDS.into_iter().collect(), "every finding id has poisoned entries that call for it");
}

#[test]
fn real_servers_clean_definitions_raise_nothing() {
    let files = ["clean-server-everything.json", "clean-server-filesystem.json"];
    let servers: Vec<Vec<Value>> = files.iter().map(|file| corpus(file)).collect();
    let mut total = 0;
    let mut flagged = Vec::new();
    let mut informational = Vec::new();
    for (index, entries) in servers.iter().enumerate() {
        assert!(entries.len() >= 10, "{}: too few definitions", files[index]);
        // As behind one gateway: every other server's tools are the "other tools".
        let others: BTreeSet<String> = servers
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != index)
            .flat_map(|(_, entries)| lower_names(entries))
            .collect();
        for entry in entries {
            total += 1;
            let found = findings(entry["kind"].as_str().expect("kind"), &text(&entry["definition"]), None, &others);
            for finding in found {
                let line =
                    format!("{} {}: [{}] {}", files[index], entry["definition"]["name"], finding.id, finding.summary);
                if finding.severity >= Severity::Medium { flagged.push(line) } else { informational.push(line) }
            }
        }
    }
    eprintln!(
        "clean definitions: {total}, findings of medium severity or above: {}, informational (low): {}",
        flagged.len(),
        informational.len()
    );
    for line in &informational {
        eprintln!("  informational: {line}");
    }
    assert!(flagged.is_empty(), "false positives:\n{}", flagged.join("\n"));
}
