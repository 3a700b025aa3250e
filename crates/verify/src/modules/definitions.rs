//! The `definitions` module: what the target's tools, prompts, resources, resource templates and
//! server instructions look like to a model, read with the findings of `palisade-definitions`
//! (the gateway's review findings: one implementation). One check per finding id; each lists
//! every definition that raises it, with the exact spans (hidden characters shown as markers).
//!
//! The definitions are listed once per run as the first identity, on 2026-07-28 when the target
//! speaks it and otherwise on a 2025-era session, so a server of either era is read. A finding of
//! medium severity or above FAILs its check; a low one (a URL) is a WARNING: the findings are
//! heuristics, and the verdict says what the text looks like, not what the server intends.
//! `--save-definitions FILE` writes what was read; `--compare-definitions FILE` reads such a file
//! and `definitions.meaning-changed` reports the definitions whose meaning changed since (a rug
//! pull), NOT TESTABLE without one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use palisade_definitions as findings;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::check::{Check, Outcome, Verdict};
use crate::modules::{Context, Module, cases, protocol_gap, sessions};
use crate::target::{Exchange, Probe};

/// Most pages of one list read.
const MAX_PAGES: usize = 20;
/// Most definitions one check's detail names.
const MAX_NAMED: usize = 10;

/// The definitions module.
pub fn module() -> Module {
    Module {
        name: "definitions",
        exclusive: false,
        cases: cases! {
            hidden: "definitions.hidden-characters", "No definition holds hidden, bidirectional, tag or control characters",
                "seed C6 (review findings); Trojan Source (CVE-2021-42574); Unicode tag smuggling", Critical;
            instructions: "definitions.model-directed-instructions", "No definition addresses instructions to the model",
                "seed C6; tool poisoning (Invariant Labs 2025); line jumping (Trail of Bits 2025)", High;
            exfiltration: "definitions.exfiltration", "No definition asks for the user's data to be sent out or smuggled into an argument",
                "seed C6; tool poisoning and shadowing (Invariant Labs 2025)", Critical;
            secrets_asked: "definitions.invites-secrets", "No input field asks the model for a secret",
                "seed C6; full-schema poisoning (CyberArk 2025); 2025-11-25 security best practices (token passthrough)", High;
            imitation: "definitions.imitates-name", "No name imitates another tool's by look-alike letters",
                "seed C6 (tool name collisions)", High;
            other_tool: "definitions.references-other-tool", "No definition names a widely deployed tool of another server",
                "seed C6 (tool shadowing)", Medium;
            secrets: "definitions.references-secrets", "No definition refers to secrets, keys or credentials",
                "seed C6", High;
            files: "definitions.references-files", "No definition refers to home, system or parent-relative paths",
                "seed C6", Medium;
            urls: "definitions.references-urls", "No definition refers to URLs (informational)",
                "seed C6", Low;
            meaning: "definitions.meaning-changed", "No definition changed meaning since the compared run",
                "seed C6 (rug pull: a definition changed after approval)", High;
        },
    }
}

/// One definition as read from the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Listed {
    /// `tool`, `prompt`, `resource`, `resource_template` or `instructions`.
    pub kind: String,
    /// Its name (a resource's URI, a template's URI template).
    pub name: String,
    /// The definition as the target listed it.
    pub definition: Value,
}

impl Listed {
    fn key(&self) -> String {
        format!("{}:{}", self.kind, self.name)
    }
}

/// What one run read: the definitions, the wire they were read on, and the exchanges.
#[derive(Debug)]
pub struct Listing {
    /// Every definition, in listing order.
    pub definitions: Vec<Listed>,
    /// `2026-07-28` or the session's version.
    pub wire: String,
    exchanges: Vec<Exchange>,
}

/// The definitions of an earlier run (`--compare-definitions`), by kind and name.
#[derive(Debug, Clone, Default)]
pub struct Compared {
    by_key: Option<BTreeMap<String, Value>>,
}

impl Compared {
    /// Reads a file written by `--save-definitions`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|error| format!("definitions {}: {error}", path.display()))?;
        let listed: Vec<Listed> = serde_json::from_str(&text).map_err(|error| {
            format!("definitions {}: not a file written by --save-definitions ({error})", path.display())
        })?;
        Ok(Self { by_key: Some(listed.into_iter().map(|listed| (listed.key(), listed.definition)).collect()) })
    }
}

/// Lists every definition of the target as the first identity (see the module docs); `Err` says
/// why nothing could be listed.
pub(crate) async fn list(ctx: &Context) -> Result<Listing, String> {
    let discover = ctx.target.send(Probe::request("server/discover", json!({}), ctx.auth())).await;
    if protocol_gap(&discover).is_none() && discover.accepted() {
        let instructions = discover.result().and_then(|result| result.get("instructions")).cloned();
        let mut listing =
            read_lists(|method, params| ctx.target.send(Probe::request(method, params, ctx.auth()))).await?;
        push_instructions(&mut listing, instructions);
        listing.wire = crate::target::PROTOCOL_VERSION.to_owned();
        listing.exchanges.insert(0, discover);
        return Ok(listing);
    }
    let session = sessions::open_session(ctx).await?;
    let instructions = session.opened[0].result().and_then(|result| result.get("instructions")).cloned();
    let read = read_lists(|method, params| {
        ctx.target.send(sessions::legacy(method, params, ctx.auth(), Some(&session.id), &session.version))
    })
    .await;
    sessions::close(ctx, &session).await;
    let mut listing = read?;
    push_instructions(&mut listing, instructions);
    listing.wire = session.version.clone();
    Ok(listing)
}

fn push_instructions(listing: &mut Listing, instructions: Option<Value>) {
    if let Some(text) = instructions.filter(Value::is_string) {
        listing.definitions.push(Listed { kind: "instructions".into(), name: "instructions".into(), definition: text });
    }
}

/// Reads every page of the four lists through `send`; `tools/list` must be served, the others
/// may be refused (a server without prompts).
async fn read_lists<F, Fut>(send: F) -> Result<Listing, String>
where
    F: Fn(&'static str, Value) -> Fut,
    Fut: std::future::Future<Output = Exchange>,
{
    let mut definitions = Vec::new();
    let mut exchanges = Vec::new();
    for (method, key, kind, name_field) in [
        ("tools/list", "tools", "tool", "name"),
        ("prompts/list", "prompts", "prompt", "name"),
        ("resources/list", "resources", "resource", "uri"),
        ("resources/templates/list", "resourceTemplates", "resource_template", "uriTemplate"),
    ] {
        let mut cursor: Option<String> = None;
        for page in 0..MAX_PAGES {
            let params = cursor.as_ref().map_or_else(|| json!({}), |cursor| json!({ "cursor": cursor }));
            let exchange = send(method, params).await;
            let Some(items) = exchange.result().and_then(|result| result.get(key)).and_then(Value::as_array) else {
                if method == "tools/list" && page == 0 {
                    return Err(format!("tools/list was not served ({}): nothing to read", exchange.summary()));
                }
                exchanges.push(exchange);
                break;
            };
            for item in items {
                let name = item.get(name_field).and_then(Value::as_str).unwrap_or_default().to_owned();
                definitions.push(Listed { kind: kind.to_owned(), name, definition: item.clone() });
            }
            cursor = exchange
                .result()
                .and_then(|result| result.get("nextCursor"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            exchanges.push(exchange);
            if cursor.is_none() {
                break;
            }
        }
    }
    Ok(Listing { definitions, wire: String::new(), exchanges })
}

/// Whether the target serves the tool `name` itself (lower case): under that name, or behind a
/// gateway's prefix (`files_read_text_file`, `fs-read_text_file`, `fs.read_text_file`), where the
/// upstream's own descriptions still name it unprefixed.
fn served(name: &str, own: &[String]) -> bool {
    own.iter().any(|tool| {
        tool == name
            || tool
                .strip_suffix(name)
                .is_some_and(|prefix| prefix.len() > 1 && matches!(prefix.chars().last(), Some('_' | '-' | '.')))
    })
}

/// One check: every definition's findings of `id`.
async fn judge(ctx: &Context, check: Check, id: &'static str) -> Outcome {
    let listing = match ctx.definitions().await {
        Ok(listing) => listing,
        Err(why) => return Outcome::new(&check, Verdict::Inconclusive, why.clone()),
    };
    let compared = if id == findings::MEANING_CHANGED {
        match &ctx.compared.by_key {
            Some(compared) => Some(compared),
            None => {
                return Outcome::new(
                    &check,
                    Verdict::NotTestable,
                    "needs --compare-definitions FILE (the definitions an earlier run saved with --save-definitions)",
                );
            }
        }
    } else {
        None
    };
    // The "other tools" are other servers' tools: the widely deployed names this target does not
    // serve itself. A definition naming its own server's tools (instructions that say which tool
    // to call first) is how servers document themselves, not shadowing.
    let own: Vec<String> = listing
        .definitions
        .iter()
        .filter(|listed| listed.kind == "tool")
        .map(|listed| listed.name.to_lowercase())
        .collect();
    let others: BTreeSet<String> =
        findings::WELL_KNOWN.iter().map(|name| name.to_lowercase()).filter(|name| !served(name, &own)).collect();
    let mut named = Vec::new();
    let mut worst: Option<findings::Severity> = None;
    let mut new_since = 0;
    for listed in &listing.definitions {
        let previous = match compared.map(|compared| compared.get(&listed.key())) {
            Some(Some(previous)) => Some(palisade_base::canonical::canonical_string(previous)),
            Some(None) => {
                new_since += 1;
                None
            }
            None => None,
        };
        let text = palisade_base::canonical::canonical_string(&listed.definition);
        for finding in findings::findings(&listed.kind, &text, previous.as_deref(), &others) {
            if finding.id != id {
                continue;
            }
            worst = worst.max(Some(finding.severity));
            let seen = finding
                .spans
                .first()
                .filter(|_| id == findings::HIDDEN_CHARACTERS)
                .map_or(String::new(), |span| format!(" (reads: \"{}\")", span.text));
            named.push(format!(
                "{} \"{}\" [{}]: {}{seen}",
                listed.kind,
                crate::escape::visible(&listed.name),
                finding.severity.label(),
                finding.summary
            ));
        }
    }
    let read = format!("{} definitions read on {}", listing.definitions.len(), listing.wire);
    let new_note = if new_since > 0 { format!("; {new_since} not in the compared run") } else { String::new() };
    let exchanges: Vec<&Exchange> = listing.exchanges.iter().collect();
    let Some(worst) = worst else {
        return Outcome::new(&check, Verdict::Pass, format!("{read}: none raises {id}{new_note}")).with(&exchanges);
    };
    let verdict = if worst >= findings::Severity::Medium { Verdict::Fail } else { Verdict::Warning };
    let more = named.len().saturating_sub(MAX_NAMED);
    named.truncate(MAX_NAMED);
    let mut detail = format!("{read}; {} raise {id}{new_note}: {}", named.len() + more, named.join("; "));
    if more > 0 {
        detail.push_str(&format!("; and {more} more"));
    }
    Outcome::new(&check, verdict, detail).with(&exchanges)
}

async fn hidden(ctx: &Context, check: Check) -> Outcome {
    judge(ctx, check, findings::HIDDEN_CHARACTERS).await
}
async fn instructions(ctx: &Context, check: Check) -> Outcome {
    judge(ctx, check, findings::MODEL_DIRECTED_INSTRUCTIONS).await
}
async fn exfiltration(ctx: &Context, check: Check) -> Outcome {
    judge(ctx, check, findings::EXFILTRATION).await
}
async fn secrets_asked(ctx: &Context, check: Check) -> Outcome {
    judge(ctx, check, findings::INVITES_SECRETS).await
}
async fn imitation(ctx: &Context, check: Check) -> Outcome {
    judge(ctx, check, findings::IMITATES_NAME).await
}
async fn other_tool(ctx: &Context, check: Check) -> Outcome {
    judge(ctx, check, findings::REFERENCES_OTHER_TOOL).await
}
async fn secrets(ctx: &Context, check: Check) -> Outcome {
    judge(ctx, check, findings::REFERENCES_SECRETS).await
}
async fn files(ctx: &Context, check: Check) -> Outcome {
    judge(ctx, check, findings::REFERENCES_FILES).await
}
async fn urls(ctx: &Context, check: Check) -> Outcome {
    judge(ctx, check, findings::REFERENCES_URLS).await
}
async fn meaning(ctx: &Context, check: Check) -> Outcome {
    judge(ctx, check, findings::MEANING_CHANGED).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_known_name_behind_a_gateway_prefix_is_the_targets_own_tool() {
        let own = ["files_read_text_file".to_owned(), "py-add".to_owned(), "x.search_files".to_owned()];
        assert!(served("read_text_file", &own), "prefixed with `_`");
        assert!(served("add", &own), "prefixed with `-`");
        assert!(served("search_files", &own), "prefixed with `.`");
        assert!(served("files_read_text_file", &own), "the exact name");
        // Not a prefix: another word run on, a bare separator, or another name.
        assert!(!served("read_file", &["files_unread_file".to_owned()]));
        assert!(!served("read_file", &["fileread_file".to_owned()]));
        assert!(!served("read_file", &["_read_file".to_owned()]));
        assert!(!served("write_file", &own));
    }

    #[test]
    fn one_check_per_finding_id_in_the_same_order() {
        let ids: Vec<&str> = module().cases.iter().map(|case| case.check.id).collect();
        let expected: Vec<String> = findings::FINDING_IDS.iter().map(|id| format!("definitions.{id}")).collect();
        assert_eq!(ids, expected);
    }

    #[test]
    fn a_saved_listing_is_read_back_by_kind_and_name() {
        let dir = std::env::temp_dir().join(format!("palisade-definitions-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("saved.json");
        let saved = vec![Listed { kind: "tool".into(), name: "add".into(), definition: json!({"name": "add"}) }];
        std::fs::write(&path, serde_json::to_string(&saved).unwrap()).unwrap();
        let compared = Compared::load(&path).unwrap();
        assert_eq!(compared.by_key.unwrap().get("tool:add"), Some(&json!({"name": "add"})));
        std::fs::write(&path, "{\"not\": \"a list\"}").unwrap();
        let error = Compared::load(&path).unwrap_err();
        assert!(error.contains("not a file written by --save-definitions"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
