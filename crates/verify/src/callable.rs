//! Which listed tools a check may call: one rule, [`permit`], for every module.
//!
//! - A tool annotated `destructiveHint: true` is never called, whatever else it says.
//! - Nor is a tool whose name has a word that consumes, destroys or acts beyond the run
//!   ([`NEVER_WORDS`]: delete, wipe, reset, revoke, checkout, pay, send, deploy, …), nor one not
//!   annotated read-only whose description has such a word (`Deletes …`, `Sends …`).
//! - Of the rest, a tool annotated `readOnlyHint: true` may be called in any run; any other
//!   only with `--allow-mutations`. (An absent `destructiveHint`, which the spec defaults to
//!   `true` for a tool not annotated read-only, is left to the name and description: otherwise
//!   no unannotated tool could be called at all.)
//!
//! A module may call fewer tools than the rule permits, never more: a listed tool is named in a
//! `tools/call` only through a [`CallableTool`], which only [`permit`] makes. (A name no listing
//! holds, made up to test how an unlisted tool is refused, is not a listed tool.)

use serde_json::Value;

/// Words that mark a tool as consuming, destroying or acting beyond the run: a tool whose name
/// has one as a word (`checkout_all`, `wipeEverything`) is never called.
pub const NEVER_WORDS: &[&str] = &[
    "delete",
    "remove",
    "wipe",
    "drop",
    "destroy",
    "purge",
    "erase",
    "reset",
    "kill",
    "terminate",
    "revoke",
    "cancel",
    "truncate",
    "format",
    "overwrite",
    "shutdown",
    "uninstall",
    "disable",
    "suspend",
    "checkout",
    "buy",
    "purchase",
    "pay",
    "order",
    "charge",
    "refund",
    "sell",
    "transfer",
    "withdraw",
    "send",
    "publish",
    "deploy",
    "submit",
];

/// Stems found anywhere in a name run together (`deleteeverything`, `wipeall`): long or
/// distinctive enough not to occur inside an innocent word.
const NEVER_STEMS: &[&str] = &[
    "delete",
    "destroy",
    "wipe",
    "purge",
    "erase",
    "truncate",
    "checkout",
    "purchase",
    "withdraw",
    "shutdown",
    "terminate",
    "uninstall",
    "overwrite",
    "transfer",
    "revoke",
    "refund",
];

/// Words of [`NEVER_WORDS`] not looked for in descriptions: plain English uses them for other
/// things ("in order to", "the format of", "free of charge").
const NOT_IN_DESCRIPTIONS: &[&str] = &["order", "format", "charge"];

/// Endings of a word in a description that still say the same act (`Deletes`, `Removed`,
/// `Sending`).
const ENDINGS: &[&str] = &["", "s", "es", "d", "ed", "ing"];

/// A listed tool a check may call: made only by [`permit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallableTool {
    name: String,
    read_only: bool,
}

impl CallableTool {
    /// The tool's name, as the target listed it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the target annotates it `readOnlyHint: true` (callable without
    /// `--allow-mutations`).
    pub fn read_only(&self) -> bool {
        self.read_only
    }
}

/// Why a listed tool is not called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotCallable {
    /// The listing has no string `name`.
    #[error("the listed tool has no name")]
    NoName,
    /// Annotated `destructiveHint: true`.
    #[error("{0:?} is annotated destructiveHint: true: never called")]
    Destructive(String),
    /// Its name (or, when it is not annotated read-only, its description) has a word of
    /// [`NEVER_WORDS`].
    #[error("{0:?} looks consuming or destructive ({1:?}): never called")]
    Consuming(String, String),
    /// Not annotated `readOnlyHint: true`, and `--allow-mutations` was not given.
    #[error("{0:?} is not annotated readOnlyHint: true: called only with --allow-mutations")]
    NeedsMutations(String),
}

/// The rule: whether a check may call `tool` (an entry of a `tools/list` result) in a run with
/// or without `--allow-mutations`.
pub fn permit(tool: &Value, allow_mutations: bool) -> Result<CallableTool, NotCallable> {
    let name = tool.get("name").and_then(Value::as_str).ok_or(NotCallable::NoName)?;
    let hint = |key: &str| tool.get("annotations").and_then(|a| a.get(key)).and_then(Value::as_bool);
    if hint("destructiveHint") == Some(true) {
        return Err(NotCallable::Destructive(name.to_owned()));
    }
    let read_only = hint("readOnlyHint") == Some(true);
    if let Some(word) = consuming_name(name) {
        return Err(NotCallable::Consuming(name.to_owned(), word));
    }
    if !read_only {
        let description = ["title", "description"]
            .iter()
            .filter_map(|key| tool.get(*key).and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        if let Some(word) = consuming_description(&description) {
            return Err(NotCallable::Consuming(name.to_owned(), word));
        }
        if !allow_mutations {
            return Err(NotCallable::NeedsMutations(name.to_owned()));
        }
    }
    Ok(CallableTool { name: name.to_owned(), read_only })
}

/// The tools of `tools` a check may call, in listing order, each with its listing.
pub fn permitted(tools: &[Value], allow_mutations: bool) -> Vec<(CallableTool, &Value)> {
    tools.iter().filter_map(|tool| permit(tool, allow_mutations).ok().map(|callable| (callable, tool))).collect()
}

/// The word of `name` that marks it as never callable, if any.
fn consuming_name(name: &str) -> Option<String> {
    if let Some(word) = words(name).into_iter().find(|word| NEVER_WORDS.contains(&word.as_str())) {
        return Some(word);
    }
    let compact: String = name.chars().filter(char::is_ascii_alphanumeric).collect::<String>().to_ascii_lowercase();
    NEVER_STEMS.iter().find(|stem| compact.contains(**stem)).map(|stem| (*stem).to_owned())
}

/// The word of a description that marks its tool as never callable, if any.
fn consuming_description(text: &str) -> Option<String> {
    words(text).into_iter().find(|word| {
        NEVER_WORDS.iter().filter(|never| !NOT_IN_DESCRIPTIONS.contains(never)).any(|never| inflected(word, never))
    })
}

/// Whether `word` is `verb` or one of its usual forms (`deletes`, `deleted`, `deleting`,
/// `dropped`, `paid`).
fn inflected(word: &str, verb: &str) -> bool {
    if word.strip_prefix(verb).is_some_and(|ending| ENDINGS.contains(&ending)) {
        return true;
    }
    // `deleting` (a final `e` dropped), `dropped` / `dropping` (the last consonant doubled).
    let stem = verb.strip_suffix('e').unwrap_or(verb);
    let doubled = verb.chars().last().map(|last| format!("{verb}{last}")).unwrap_or_default();
    word == format!("{stem}ing")
        || [format!("{doubled}ed"), format!("{doubled}ing")].contains(&word.to_owned())
        // The past tenses that are not `-ed`.
        || matches!((verb, word), ("pay", "paid") | ("send", "sent") | ("sell", "sold"))
}

/// The words of a name or a text, lower case: split at every character that is not an ASCII
/// letter or digit and where a lower-case letter or digit is followed by an upper-case one
/// (`basket_create`, `createBasket`, `basket.new` → two words each).
pub fn words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut previous_lower = false;
    for c in text.chars() {
        if !c.is_ascii_alphanumeric() {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            previous_lower = false;
            continue;
        }
        if c.is_ascii_uppercase() && previous_lower && !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        previous_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        word.push(c.to_ascii_lowercase());
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn verdict(tool: Value, allow_mutations: bool) -> Result<bool, NotCallable> {
        permit(&tool, allow_mutations).map(|callable| callable.read_only())
    }

    #[test]
    fn destructive_and_consuming_tools_are_never_called() {
        for mutations in [false, true] {
            let wipe = json!({ "name": "wipe_everything", "annotations": { "destructiveHint": true } });
            assert!(matches!(verdict(wipe, mutations), Err(NotCallable::Destructive(_))));
            // Destructive wins over a read-only claim.
            let liar =
                json!({ "name": "list_items", "annotations": { "readOnlyHint": true, "destructiveHint": true } });
            assert!(matches!(verdict(liar, mutations), Err(NotCallable::Destructive(_))));
            for name in ["checkout_all", "deleteAll", "basket-remove", "send.email", "PayInvoice", "wipeeverything"] {
                let tool = json!({ "name": name });
                assert!(matches!(verdict(tool, mutations), Err(NotCallable::Consuming(..))), "{name}");
                // A read-only claim does not make a consuming name callable.
                let claimed = json!({ "name": name, "annotations": { "readOnlyHint": true } });
                assert!(matches!(verdict(claimed, mutations), Err(NotCallable::Consuming(..))), "{name}");
            }
            let described = json!({ "name": "basket_finish", "description": "Places the order and pays for it" });
            assert!(matches!(verdict(described, mutations), Err(NotCallable::Consuming(_, word)) if word == "pays"));
            for text in ["Deletes every record", "Removing old rows", "Records are dropped", "The invoice is paid"] {
                let tool = json!({ "name": "tidy", "description": text });
                assert!(matches!(verdict(tool, mutations), Err(NotCallable::Consuming(..))), "{text}");
            }
        }
    }

    #[test]
    fn read_only_tools_are_callable_and_others_only_with_mutations() {
        let view = json!({ "name": "basket_view", "annotations": { "readOnlyHint": true } });
        assert_eq!(verdict(view.clone(), false), Ok(true));
        assert_eq!(verdict(view, true), Ok(true));
        // Read-only: its description is not second-guessed, and a plural is not the verb.
        let export = json!({ "name": "orders_export", "description": "Exports and sends nothing",
            "annotations": { "readOnlyHint": true } });
        assert_eq!(verdict(export, false), Ok(true));
        let create = json!({ "name": "basket_create",
            "description": "Creates an empty basket in order to shop; the format of its handle is opaque" });
        assert!(matches!(verdict(create.clone(), false), Err(NotCallable::NeedsMutations(_))));
        assert_eq!(verdict(create, true), Ok(false));
        // A word is a word: `append_note` is not `pay`, `display` is not `pay`.
        assert_eq!(verdict(json!({ "name": "append_note", "description": "Displays the payload" }), true), Ok(false));
        assert!(matches!(verdict(json!({ "title": "no name" }), true), Err(NotCallable::NoName)));
    }

    #[test]
    fn names_split_into_words() {
        assert_eq!(words("basket_create"), ["basket", "create"]);
        assert_eq!(words("createBasket"), ["create", "basket"]);
        assert_eq!(words("cart.new-v2"), ["cart", "new", "v2"]);
    }
}
