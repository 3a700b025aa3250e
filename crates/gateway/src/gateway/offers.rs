//! What the gateway offers its callers where a capability depends on its upstreams: the rules
//! that turn the upstreams' declared capabilities and the served definitions into the
//! capabilities of `server/discover` and of the 2025 `initialize` answer (both read the
//! published [`App`](palisade_server::App)).
//!
//! - `resources.subscribe`: only when some upstream with a served resource or resource template
//!   declares `resources.subscribe: true` (updates can come only from such an upstream).
//! - `completions`: only when some upstream with a served prompt or resource template declares
//!   `completions`; a reference of an upstream that does not is answered with no values, never
//!   relayed.
//! - Everything else is the gateway's own, whatever its upstreams declare: `tools`, `prompts`
//!   and `resources` with `listChanged` (the served lists change with pins, approvals and the
//!   kill switch), `logging` (levels are applied per caller by the gateway), and the tasks
//!   extension (tasks through the gateway are the gateway's own tasks).

use serde_json::Value;

use super::{Upstream, lock};
use crate::pins::DefinitionKind;
use crate::upstream::UpstreamInfo;

/// The upstream-dependent capabilities, collected over the served definitions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Offers {
    /// Some upstream serving resources can send updates of them.
    pub(super) resource_subscriptions: bool,
}

impl Offers {
    /// Notes one served definition of `upstream`.
    pub(super) fn note(&mut self, upstream: &Upstream, kind: DefinitionKind) {
        if matches!(kind, DefinitionKind::Resource | DefinitionKind::ResourceTemplate) {
            self.resource_subscriptions |= declares(upstream, "resources", Some("subscribe"));
        }
    }
}

/// Whether `upstream`'s last listing declared `capability` (with `flag: true` inside it, when
/// named). An upstream not listed yet declares nothing.
pub(super) fn declares(upstream: &Upstream, capability: &str, flag: Option<&str>) -> bool {
    lock(&upstream.listing).as_ref().is_some_and(|listing| info_declares(&listing.info, capability, flag))
}

/// Whether `info` declares `capability` (with `flag: true` inside it, when named).
fn info_declares(info: &UpstreamInfo, capability: &str, flag: Option<&str>) -> bool {
    match (info.capabilities.get(capability), flag) {
        (Some(Value::Object(_)), None) => true,
        (Some(Value::Object(inner)), Some(flag)) => inner.get(flag) == Some(&Value::Bool(true)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::upstream::Era;

    fn info(capabilities: Value) -> UpstreamInfo {
        UpstreamInfo { era: Era::Modern, capabilities, server_info: Value::Null, instructions: None }
    }

    #[test]
    fn a_capability_counts_only_as_an_object_and_a_flag_only_when_true() {
        let declared = info(json!({
            "resources": { "subscribe": true, "listChanged": false },
            "completions": {},
            "prompts": true,
        }));
        assert!(info_declares(&declared, "resources", Some("subscribe")));
        assert!(!info_declares(&declared, "resources", Some("listChanged")));
        assert!(info_declares(&declared, "completions", None));
        assert!(!info_declares(&declared, "prompts", None), "not an object: not declared");
        assert!(!info_declares(&declared, "tools", None));
        assert!(!info_declares(&info(json!({ "resources": { "subscribe": "yes" } })), "resources", Some("subscribe")));
    }
}
