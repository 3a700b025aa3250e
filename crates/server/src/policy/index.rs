//! The scope index of a policy set: which of its policies can apply to a request, from the
//! policies' scopes alone, so that Cedar's authorizer (which evaluates every policy it is given)
//! is handed only those. And which resources a listing may decide as one class.
//!
//! **Why dropping a policy here never changes a decision.** Cedar evaluates a policy's scope as
//! the first conjuncts of its condition (`action == A && resource in R && when …`), and a false
//! conjunct short-circuits the rest: a policy whose action or resource scope cannot hold for the
//! request is neither satisfied nor in error, so it contributes nothing to the decision. The index
//! only drops such policies, and it is conservative: a scope it does not understand keeps the
//! policy. The principal's scope is not indexed (every policy that may apply to the resource is
//! kept, whoever asks).
//!
//! **Why one decision stands for a class in a listing.** A listing decides, for one principal,
//! one action and one context (no arguments), every definition of a list. The only inputs that
//! differ between two definitions are the resource's entity: its uid, its attributes and its
//! parent (the upstream). A definition whose uid no policy names (in a scope or a condition) can
//! be told apart from another only through its attributes and parent, so two such definitions
//! with equal attributes and parent get the same decision. The identifying attributes (`name`,
//! `uri`, `pin`) are part of the class unless no policy of the set reads them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use cedar_policy::{ActionConstraint, EntityUid, Policy, PolicySet, ResourceConstraint};
use serde_json::Value;

use crate::method::Method;

/// What decides which policies of a set can apply to a resource: the method, the resource's
/// upstream (its parent), and its own id when a policy names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SliceKey {
    pub(super) method: Method,
    pub(super) upstream: Option<String>,
    pub(super) named: Option<String>,
}

/// One policy with the parts of its scope the index reads.
struct Scoped {
    policy: Policy,
    action: ActionConstraint,
    resource: ResourceConstraint,
}

/// A policy set with its scope index. Slices are made on first use and kept for the life of
/// the set (a snapshot): their number is bounded by the decided methods times the registry's
/// upstreams and named definitions, since a request reaches the index only for a registered
/// target.
pub(super) struct IndexedSet {
    /// The whole set (what `palisade policy explain` and the policy count read).
    pub(super) set: PolicySet,
    scoped: Vec<Scoped>,
    /// Ids of resources (tools, prompts, resources) some policy names as an entity literal.
    named: HashSet<String>,
    /// Whether some policy reads an identifying attribute (`name`, `uri`, `pin`).
    reads_identity: bool,
    slices: RwLock<HashMap<SliceKey, Arc<PolicySet>>>,
    /// Off only in tests: every slice is the whole set (the reference the index is checked
    /// against).
    sliced: bool,
}

impl IndexedSet {
    /// Indexes `set`.
    pub(super) fn new(set: PolicySet) -> Self {
        let mut named = HashSet::new();
        let mut reads_identity = false;
        let scoped = set
            .policies()
            .map(|policy| {
                if let Ok(json) = policy.to_json() {
                    let mut literals = Vec::new();
                    super::entity_literals(&json, &mut literals);
                    for (ty, id) in literals {
                        if matches!(ty.as_str(), "Palisade::Tool" | "Palisade::Prompt" | "Palisade::Resource") {
                            named.insert(id);
                        }
                    }
                    reads_identity |= reads_attribute(&json, &["name", "uri", "pin"]);
                } else {
                    // A policy whose form cannot be read: every attribute may matter.
                    reads_identity = true;
                }
                Scoped {
                    policy: policy.clone(),
                    action: policy.action_constraint(),
                    resource: policy.resource_constraint(),
                }
            })
            .collect();
        Self { set, scoped, named, reads_identity, slices: RwLock::new(HashMap::new()), sliced: true }
    }

    /// `set` without its index: every slice is the whole set.
    #[cfg(test)]
    pub(super) fn unsliced(set: PolicySet) -> Self {
        Self { sliced: false, ..Self::new(set) }
    }

    /// Whether a policy names the resource `id` (it is then a class of its own).
    pub(super) fn names(&self, id: &str) -> bool {
        self.named.contains(id)
    }

    /// Whether a listing class must include the identifying attributes.
    pub(super) fn reads_identity(&self) -> bool {
        self.reads_identity
    }

    /// The policies of the set that can apply to `key`'s requests (`action` and `resource` are
    /// the request's action and resource uids, `upstream` the resource's parent).
    pub(super) fn slice(
        &self,
        key: &SliceKey,
        action: &EntityUid,
        resource: &EntityUid,
        upstream: Option<&EntityUid>,
    ) -> Arc<PolicySet> {
        if !self.sliced {
            return Arc::new(self.set.clone());
        }
        if let Some(slice) = self.slices.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(key) {
            return Arc::clone(slice);
        }
        let admitted = self
            .scoped
            .iter()
            .filter(|scoped| {
                admits_action(&scoped.action, action) && admits_resource(&scoped.resource, resource, upstream)
            })
            .map(|scoped| scoped.policy.clone());
        // Ids are unique in the set, so in any part of it.
        let slice = Arc::new(PolicySet::from_policies(admitted).unwrap_or_else(|_| self.set.clone()));
        let mut slices = self.slices.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(slices.entry(key.clone()).or_insert(slice))
    }
}

fn admits_action(constraint: &ActionConstraint, action: &EntityUid) -> bool {
    match constraint {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(uid) => uid == action,
        // The schema declares no action groups, so `in [A, B]` holds only for A and B; an id
        // that is not an action of ours keeps the policy (conservative).
        ActionConstraint::In(uids) => uids.iter().any(|uid| uid == action || uid.type_name() != action.type_name()),
    }
}

fn admits_resource(constraint: &ResourceConstraint, resource: &EntityUid, upstream: Option<&EntityUid>) -> bool {
    // The hierarchy is one level deep: a tool, prompt or resource is `in` its upstream.
    let within = |uid: &EntityUid| uid == resource || Some(uid) == upstream;
    match constraint {
        ResourceConstraint::Any => true,
        ResourceConstraint::Eq(uid) => uid == resource,
        ResourceConstraint::In(uid) => within(uid),
        ResourceConstraint::Is(ty) => ty == resource.type_name(),
        ResourceConstraint::IsIn(ty, uid) => ty == resource.type_name() && within(uid),
    }
}

/// Whether the policy's JSON form reads one of `attributes` (`x.attr`, `x has attr`).
fn reads_attribute(json: &Value, attributes: &[&str]) -> bool {
    match json {
        Value::Object(object) => {
            object.get("attr").and_then(Value::as_str).is_some_and(|attr| attributes.contains(&attr))
                || object.values().any(|value| reads_attribute(value, attributes))
        }
        Value::Array(items) => items.iter().any(|value| reads_attribute(value, attributes)),
        _ => false,
    }
}
