//! The one registry every report format reads a check's rule from: its id, title and spec or
//! seed reference (defined once, in its module's `cases!`), its help (what to fix: one text per
//! module, defined once here) and its severity; and the root causes several findings are
//! grouped under (their ids, titles, help and which checks each one explains).

use crate::check::{Check, Severity};

/// What a report shows about one check: everything code-scanning UIs show beside a finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The check's stable id.
    pub id: &'static str,
    /// One line saying what is tested.
    pub title: &'static str,
    /// The requirement tested: the spec clause or seed section.
    pub reference: &'static str,
    /// Its module (the first label of the id).
    pub module: &'static str,
    /// What to fix when it fails.
    pub help: &'static str,
    /// How much a failure matters.
    pub severity: Severity,
}

impl Rule {
    /// The rule of `check`.
    pub fn of(check: &Check) -> Self {
        let module = module_of(check.id);
        Self {
            id: check.id,
            title: check.title,
            reference: check.requirement,
            module,
            help: module_help(module),
            severity: check.severity,
        }
    }

    /// The help as plain text: the title, what to fix, and the requirement.
    pub fn help_text(&self) -> String {
        format!("{}\n\n{}\n\nRequirement: {}", self.title, self.help, self.reference)
    }

    /// The help as Markdown.
    pub fn help_markdown(&self) -> String {
        format!("**{}** (`{}`)\n\n{}\n\n**Requirement:** {}", self.title, self.id, self.help, self.reference)
    }
}

/// The module of a check id: its first label (`transport` of `transport.origin.foreign`).
pub fn module_of(id: &str) -> &'static str {
    let label = id.split('.').next().unwrap_or_default();
    MODULE_HELP.iter().find(|(module, _)| *module == label).map_or("other", |(module, _)| module)
}

/// What to fix when a check of `module` fails.
pub fn module_help(module: &str) -> &'static str {
    MODULE_HELP.iter().find(|(name, _)| *name == module).map_or(
        "Compare the transcript of the failed case with its accepted positive control; the requirement says what is expected.",
        |(_, help)| help,
    )
}

/// One help text per module: what the checks of that module want the server to do.
const MODULE_HELP: &[(&str, &str)] = &[
    (
        "transport",
        "Validate every request before any method runs: accept only the Host and Origin values the \
         server is deployed under (DNS rebinding), bound body and header sizes, refuse JSON-RPC batches \
         and ids that are not strings or integers, require the 2026-07-28 headers (`Mcp-Method`, \
         `Mcp-Name`, `MCP-Protocol-Version`) to agree with the body, and refuse requests without a token \
         with 401 and a challenge naming `resource_metadata`.",
    ),
    (
        "auth",
        "Verify every bearer token before serving: signature with the issuer's keys only (no `alg: none`, \
         no HS256 keyed with a public key, no keys fetched from `jku`/`x5u`), expiry, and an audience that \
         is this resource; take it only from the `Authorization: Bearer` header; answer a missing or bad \
         token with 401 and a Bearer challenge whose `resource_metadata` is this resource's own document.",
    ),
    (
        "access",
        "Decide a call with the same rule that filters what the caller is listed: refuse a tool hidden from \
         a caller like an unknown one (or by authorization) before its input is validated or it runs, whatever \
         another caller is listed; and list only what the caller may call, except where a rule reads the \
         arguments (then the tool is listed and the call decides).",
    ),
    (
        "sessions",
        "Bind each 2025-era session id to the caller that opened it (subject, tenant and client of its \
         token) and check the token of every request presenting it; answer unknown or deleted ids with 404, \
         and let only the owner end a session.",
    ),
    (
        "handles",
        "Bind every handle to the caller it was issued to (subject, tenant, client and scopes) and check it \
         on every use; issue handles with at least 128 bits of entropy, refuse forged and foreign ones \
         exactly like unknown ones (no oracle), and stop honouring revoked or expired ones.",
    ),
    (
        "tasks",
        "Bind every task to the caller that created it and check it on `tasks/get`, `tasks/update` and \
         `tasks/cancel`; refuse another caller's task exactly like an unknown one (no oracle), issue \
         unguessable task ids, and keep terminal tasks terminal.",
    ),
    (
        "listen",
        "Authorize every `subscriptions/listen` on its own token, honour only the filters the caller may \
         see (its own tasks, resources that exist), acknowledge exactly what was honoured, and deliver a \
         caller's events only to that caller's streams.",
    ),
    (
        "state",
        "Protect `requestState` with integrity (an authenticated encryption or MAC keyed by the server), bind \
         it to the caller, tool, arguments and method it was issued for, give it a lifetime, and honour it \
         once.",
    ),
    (
        "definitions",
        "Review the flagged tool, prompt or resource definitions: remove hidden characters, instructions \
         addressed to the model, requests for secrets, and references that steer the model to other tools, \
         files or URLs; re-approve a definition whose meaning changed.",
    ),
    (
        "killswitch",
        "Check the kill switch's current state before every covered operation is dispatched (and before any \
         side effect), for every target kind it covers, and refuse operations the server does not list.",
    ),
    (
        "pinning",
        "Pin each upstream definition when it is approved; hold a tool whose definition changed (refused \
         like an unknown tool, its new definition never listed) until it is reviewed, and keep serving the \
         others.",
    ),
];

/// A cause several FAILs share, and which checks it explains.
#[derive(Debug, Clone, Copy)]
pub struct Cause {
    /// Its stable id.
    pub id: &'static str,
    /// One line saying what it is.
    pub title: &'static str,
    /// What to fix.
    pub help: &'static str,
    /// Whether a FAIL of a check (by id) follows from it.
    pub explains: fn(&str) -> bool,
    /// Whether the grouping needs its own evidence (a request with no token served) rather than
    /// two or more of its FAILs.
    pub needs_evidence: bool,
}

/// The root cause of a target that needs no authentication at all.
pub const NO_AUTHENTICATION: &str = "auth.none";

/// Every root cause, in the order they claim FAILs (a FAIL is grouped under the first that
/// explains it).
pub const CAUSES: &[Cause] = &[
    Cause {
        id: NO_AUTHENTICATION,
        title: "The target needs no authentication at all",
        help: "Require a valid bearer token on every request (401 with a Bearer challenge otherwise); every \
               check grouped here fails because a request with no token is served.",
        explains: follows_from_no_authentication,
        needs_evidence: true,
    },
    Cause {
        id: "transport.no_rebinding_protection",
        title: "Host and Origin are not validated (no DNS-rebinding protection)",
        help: "Accept only the Host and Origin values the server is deployed under (a foreign, look-alike, \
               `null` or repeated one is refused with 403): a web page can otherwise reach a local server.",
        explains: |id| id.starts_with("transport.host.") || id.starts_with("transport.origin."),
        needs_evidence: false,
    },
    Cause {
        id: "sessions.not_bound",
        title: "Session ids are not bound to the caller",
        help: "Check the token of every request presenting a session id against the session's owner.",
        explains: |id| {
            matches!(
                id,
                "sessions.no_token"
                    | "sessions.other_identity"
                    | "sessions.other_tenant"
                    | "sessions.other_client"
                    | "sessions.delete.other_identity"
            )
        },
        needs_evidence: false,
    },
    Cause {
        id: "handles.not_bound",
        title: "Handles are not bound to the caller",
        help: "Check the caller against the handle's owner (subject, tenant, client) on every use.",
        explains: |id| id.starts_with("handles.read.") || id.starts_with("handles.write."),
        needs_evidence: false,
    },
    Cause {
        id: "tasks.not_bound",
        title: "Tasks are not bound to the caller",
        help: "Check the caller against the task's creator on every tasks/get, tasks/update and tasks/cancel.",
        explains: |id| ["tasks.get.", "tasks.update.", "tasks.cancel."].iter().any(|prefix| id.starts_with(prefix)),
        needs_evidence: false,
    },
];

/// The root cause `id`, if it is one.
pub fn cause(id: &str) -> Option<&'static Cause> {
    CAUSES.iter().find(|cause| cause.id == id)
}

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

/// The number code-scanning UIs read as a rule's security severity (GitHub's
/// `security-severity`: 9.0 and above critical, 7.0 high, 4.0 medium, below low).
pub fn security_severity(severity: Severity) -> &'static str {
    match severity {
        Severity::Critical => "9.5",
        Severity::High => "8.0",
        Severity::Medium => "5.5",
        Severity::Low => "3.0",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_has_one_rule_with_help_and_a_reference() {
        let checks: Vec<Check> =
            crate::modules::all().into_iter().flat_map(|module| module.cases).map(|case| case.check).collect();
        for module in crate::modules::all() {
            assert!(MODULE_HELP.iter().any(|(name, _)| *name == module.name), "{} has no help", module.name);
        }
        for check in &checks {
            let rule = Rule::of(check);
            assert_ne!(rule.module, "other", "{}", check.id);
            assert!(!rule.reference.trim().is_empty(), "{} has no reference", check.id);
            assert!(rule.help_text().contains(rule.help) && rule.help_text().contains(rule.reference));
            assert!(rule.help_markdown().contains(&format!("`{}`", check.id)));
        }
        // No root cause reuses a check's id, and each explains some check of the catalogue.
        for cause in CAUSES {
            assert!(checks.iter().all(|check| check.id != cause.id), "{}", cause.id);
            assert!(checks.iter().any(|check| (cause.explains)(check.id)), "{} explains nothing", cause.id);
        }
        assert_eq!(cause(NO_AUTHENTICATION).map(|cause| cause.needs_evidence), Some(true));
    }
}
