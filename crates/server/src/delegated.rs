//! The verified form of delegated authority a principal carries (control C10): the [`Grant`] of
//! a capability, its [`Holder`] agent, and [`Delegated`] — what the delegation stage read from the
//! ledger. Values only: no store, no principal; the service that makes them is
//! the delegation module, which also re-exports them.

use std::collections::{BTreeMap, BTreeSet};

use palisade_base::hex::hex;
use serde_json::{Value, json};

/// What a capability allows: tools, resources and prompts by exposed name, or by a pattern
/// ending in `*` (a prefix); scopes; and the handles it may use (SHA-256 hex of each handle).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// Tool names or `prefix*` patterns.
    pub tools: BTreeSet<String>,
    /// Resource URIs (or templates, as registered) or `prefix*` patterns.
    pub resources: BTreeSet<String>,
    /// Prompt names or `prefix*` patterns.
    pub prompts: BTreeSet<String>,
    /// OAuth scopes.
    pub scopes: BTreeSet<String>,
    /// SHA-256 (lowercase hex) of each handle the holder may present.
    pub handles: BTreeSet<String>,
    /// Per-tool call budgets (optional): exact tool names the grant allows, each counted apart
    /// from (and within) the overall budget.
    pub tool_calls: BTreeMap<String, i64>,
}

/// Whether a grant entry (`name` or `prefix*`) covers `name` (or a narrower entry).
fn covers(entry: &str, other: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) => other.starts_with(prefix),
        None => entry == other,
    }
}

fn all_covered(child: &BTreeSet<String>, parent: &BTreeSet<String>) -> bool {
    child.iter().all(|entry| parent.iter().any(|allowed| covers(allowed, entry)))
}

impl Grant {
    /// Whether the grant allows the tool `name`.
    pub fn allows_tool(&self, name: &str) -> bool {
        self.tools.iter().any(|entry| covers(entry, name))
    }

    /// Whether the grant allows the resource (registered URI or template) `uri`.
    pub fn allows_resource(&self, uri: &str) -> bool {
        self.resources.iter().any(|entry| covers(entry, uri))
    }

    /// Whether the grant allows the prompt `name`.
    pub fn allows_prompt(&self, name: &str) -> bool {
        self.prompts.iter().any(|entry| covers(entry, name))
    }

    /// Whether the grant allows the handle whose SHA-256 is `digest`.
    pub fn allows_handle(&self, digest: &[u8; 32]) -> bool {
        self.handles.contains(&hex(digest))
    }

    /// The first way `self` is wider than `parent`, or `None` if it is within it.
    pub fn widens(&self, parent: &Grant) -> Option<&'static str> {
        if !all_covered(&self.tools, &parent.tools) {
            return Some("a tool is outside the parent capability");
        }
        if !all_covered(&self.resources, &parent.resources) {
            return Some("a resource is outside the parent capability");
        }
        if !all_covered(&self.prompts, &parent.prompts) {
            return Some("a prompt is outside the parent capability");
        }
        if !self.scopes.is_subset(&parent.scopes) {
            return Some("a scope is outside the parent capability");
        }
        if !self.handles.is_subset(&parent.handles) {
            return Some("a handle is outside the parent capability");
        }
        // A tool the parent counts stays counted below it (its counter is reserved from the
        // parent's in the store), else the child could spend it beyond the parent's count.
        if parent.tool_calls.keys().any(|tool| self.allows_tool(tool) && !self.tool_calls.contains_key(tool)) {
            return Some("a tool the parent capability counts needs a count of its own");
        }
        None
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({ "tools": self.tools, "resources": self.resources, "prompts": self.prompts,
                "scopes": self.scopes, "handles": self.handles, "toolCalls": self.tool_calls })
    }

    pub(crate) fn from_json(value: &Value) -> Option<Self> {
        let set = |key: &str| -> Option<BTreeSet<String>> {
            value.get(key)?.as_array()?.iter().map(|item| item.as_str().map(str::to_owned)).collect()
        };
        Some(Self {
            tools: set("tools")?,
            resources: set("resources")?,
            prompts: set("prompts")?,
            scopes: set("scopes")?,
            handles: set("handles")?,
            tool_calls: match value.get("toolCalls") {
                None => BTreeMap::new(),
                Some(counts) => counts
                    .as_object()?
                    .iter()
                    .map(|(tool, count)| Some((tool.clone(), count.as_i64()?)))
                    .collect::<Option<_>>()?,
            },
        })
    }
}

/// The agent a capability is bound to: its token's issuer, subject and client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The issuer of the agent's token.
    pub issuer: String,
    /// The agent's subject (also its id for the kill switch: `agent:<subject>`).
    pub subject: String,
    /// The agent's OAuth client.
    pub client: String,
}

impl Holder {
    pub(crate) fn to_json(&self) -> Value {
        json!({ "issuer": self.issuer, "subject": self.subject, "client": self.client })
    }

    pub(crate) fn from_json(value: &Value) -> Option<Self> {
        let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        Some(Self { issuer: text("issuer")?, subject: text("subject")?, client: text("client")? })
    }
}

/// Verified delegated authority: the capability a request (or a task) runs under, as the
/// delegation stage read it from the ledger. Only this module makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegated {
    pub(crate) digest: [u8; 32],
    pub(crate) depth: u32,
    pub(crate) agents: Vec<String>,
    pub(crate) holder: Holder,
    pub(crate) grant: Grant,
    pub(crate) expires_ms: i64,
}

impl Delegated {
    /// The capability's public id: SHA-256 of its reference, lowercase hex.
    pub fn id(&self) -> String {
        hex(&self.digest)
    }

    /// Its depth in the delegation graph (a root is 0).
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The holder agent.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// Every agent of the chain, the root's holder first and this capability's holder last.
    pub fn agents(&self) -> &[String] {
        &self.agents
    }

    /// What the capability allows.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// When it expires (Unix ms).
    pub fn expires_ms(&self) -> i64 {
        self.expires_ms
    }

    pub(crate) fn digest(&self) -> &[u8; 32] {
        &self.digest
    }
}

/// The principal's own approval of one concrete delegated call, taken from the ledger (once) by
/// the pipeline before the handler runs; a handler sees it through
/// `RequestContext::approval`. No public constructor.
///
/// ```compile_fail
/// use palisade_server::delegation::VerifiedApproval;
/// let forged = VerifiedApproval { key: [0; 32] };
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedApproval {
    key: [u8; 32],
}

impl VerifiedApproval {
    /// The approval the pipeline took from the ledger under `key`.
    pub(crate) fn new(key: [u8; 32]) -> Self {
        Self { key }
    }

    /// The approval's key (`delegation::approval_key`), hex.
    pub fn key(&self) -> String {
        hex(&self.key)
    }
}

/// The stored form of a principal's delegation (for a task's row).
pub(crate) fn stored_form(delegated: &Delegated) -> Value {
    json!({ "id": delegated.id(), "holder": delegated.holder.to_json() })
}
