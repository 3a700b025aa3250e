//! The Cedar schema of a registry, generated: the entity model every policy is validated against
//! (namespace `Palisade`). Principals are `User`s in `Group`s; resources are the registry's
//! `Tool`s, `Prompt`s and `Resource`s (each `in` its gateway `Upstream`) and the `Server` for
//! operations without a target; each action is an MCP method; `context.arguments` is the
//! argument view ([`super::view`]) merged over every tool (or prompt) of the registry.
//!
//! Knows the registry's definitions; nothing about requests.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::view::{ViewType, merge, record_cedar};
use crate::method::Method;
use crate::registry::App;

/// The methods a policy decides, with the resource type each acts on. Lists are not decided
/// here (they are filtered per caller by the `tools/call`, `prompts/get` and `resources/read`
/// decisions), nor are the session's own methods (`initialize`, `ping`, `logging/setLevel`).
pub const DECIDED: &[(Method, &str)] = &[
    (Method::ToolsCall, "Tool"),
    (Method::PromptsGet, "Prompt"),
    (Method::ResourcesRead, "Resource"),
    (Method::Subscribe, "Resource"),
    (Method::Unsubscribe, "Resource"),
    (Method::Complete, "Server"),
    (Method::Listen, "Server"),
    (Method::TasksGet, "Server"),
    (Method::TasksUpdate, "Server"),
    (Method::TasksCancel, "Server"),
];

/// The resource type a decided method acts on, `None` when the method is not decided.
pub fn resource_type(method: Method) -> Option<&'static str> {
    DECIDED.iter().find(|(decided, _)| *decided == method).map(|(_, ty)| *ty)
}

/// What a registry offers a policy: the generated schema text, the argument views' types, and
/// the names an entity literal may use.
#[derive(Debug, Clone, Default)]
pub struct Vocabulary {
    /// The Cedar schema (Cedar syntax).
    pub schema: String,
    /// `context.arguments` of `tools/call`: every tool's typed arguments, merged.
    pub tool_arguments: BTreeMap<String, ViewType>,
    /// `context.arguments` of `prompts/get`: every prompt's arguments (strings).
    pub prompt_arguments: BTreeMap<String, ViewType>,
    /// Argument names two definitions type differently: left out of the view.
    pub conflicts: Vec<String>,
    /// Entity ids by type (`Tool`, `Prompt`, `Resource`, `Upstream`, `Server`).
    pub names: BTreeMap<&'static str, BTreeSet<String>>,
}

/// The common context of every decided action.
const COMMON_CONTEXT: &str = "era: String, time: Long, hour: Long, weekday: Long, source?: ipaddr";

impl Vocabulary {
    /// The vocabulary of `app` (argument views at most `depth` deep).
    pub fn of(app: &App, depth: usize) -> Self {
        let mut vocabulary = Self::default();
        let mut names: BTreeMap<&'static str, BTreeSet<String>> = BTreeMap::new();
        names.entry("Server").or_default().insert(app.name.clone());
        for tool in &app.tools {
            names.entry("Tool").or_default().insert(tool.name.clone());
            let members =
                tool.definition.get("inputSchema").map(|s| ViewType::of_properties(s, depth)).unwrap_or_default();
            merge(&mut vocabulary.tool_arguments, members, &mut vocabulary.conflicts);
        }
        for prompt in &app.prompts {
            names.entry("Prompt").or_default().insert(prompt.name.clone());
            let members = prompt.arguments.iter().map(|argument| (argument.name.clone(), ViewType::String)).collect();
            merge(&mut vocabulary.prompt_arguments, members, &mut vocabulary.conflicts);
        }
        for resource in &app.resources {
            names.entry("Resource").or_default().insert(resource.uri.clone());
        }
        for template in &app.templates {
            names.entry("Resource").or_default().insert(template.template.clone());
        }
        let origins = app.tools.iter().map(|t| &t.origin).chain(app.prompts.iter().map(|p| &p.origin));
        let origins =
            origins.chain(app.resources.iter().map(|r| &r.origin)).chain(app.templates.iter().map(|t| &t.origin));
        for origin in origins.flatten() {
            names.entry("Upstream").or_default().insert(origin.upstream.clone());
        }
        vocabulary.names = names;
        vocabulary.schema = vocabulary.schema_text();
        vocabulary
    }

    fn schema_text(&self) -> String {
        let mut out = String::from("namespace Palisade {\n");
        out.push_str("  entity Group;\n");
        out.push_str(
            "  entity User in [Group] = { issuer: String, subject: String, tenant: String, client: String, \
             scopes: Set<String>, groups: Set<String>, delegated: Bool, agent: String, agents: Set<String> };\n",
        );
        out.push_str("  entity Server = { name: String };\n");
        out.push_str("  entity Upstream;\n");
        out.push_str(
            "  entity Tool in [Upstream] = { name: String, upstream: String, readOnly: Bool, destructive: Bool, \
             idempotent: Bool, openWorld: Bool, confirmation: Bool, scopes: Set<String>, pin: String };\n",
        );
        out.push_str(
            "  entity Prompt in [Upstream] = { name: String, upstream: String, scopes: Set<String>, pin: String };\n",
        );
        out.push_str(
            "  entity Resource in [Upstream] = { uri: String, upstream: String, scopes: Set<String>, pin: String };\n",
        );
        for (method, resource) in DECIDED {
            let arguments = match method {
                Method::ToolsCall => format!(", arguments: {}", record_cedar(&self.tool_arguments)),
                Method::PromptsGet => format!(", arguments: {}", record_cedar(&self.prompt_arguments)),
                _ => String::new(),
            };
            out.push_str(&format!(
                "  action {} appliesTo {{ principal: [User], resource: [{resource}], context: {{ {COMMON_CONTEXT}{arguments} }} }};\n",
                Value::from(method.as_str())
            ));
        }
        out.push_str("}\n");
        out
    }
}
