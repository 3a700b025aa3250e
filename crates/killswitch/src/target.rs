//! Targets: what the authority can disable (a tool, a prompt, a tenant, a server release, …), and their
//! keyed digests. Raw target values never leave the server: the authority and the generation
//! store only see `HMAC-SHA256(target_key, kind || 0x00 || value)`.

use std::collections::BTreeMap;
use std::path::Path;

use aws_lc_rs::hmac;
use serde::{Deserialize, Serialize};

use crate::keys::{KeyError, read_secret_key_file};

/// The kinds of target a policy may require for an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// The running server release.
    ServerRelease,
    /// The caller's tenant.
    Tenant,
    /// The calling OAuth client.
    Client,
    /// The tool called.
    Tool,
    /// The resource read.
    Resource,
    /// A task.
    Task,
    /// A listen subscription.
    Subscription,
    /// An upstream server (gateway).
    Upstream,
    /// An application object.
    Object,
    /// A delegated agent: the holder of a delegation capability. A request under a capability
    /// carries one value per agent of its chain (the holder and every agent it descends from), so
    /// disabling an agent stops it and everything delegated under it.
    Agent,
    /// The prompt got (`prompts/get`), by its registered name: a prompt relayed from an upstream
    /// is content that reaches the model, and an operator stops one prompt as they stop one tool.
    Prompt,
}

impl TargetKind {
    /// Every kind, in order.
    pub const ALL: [TargetKind; 11] = [
        TargetKind::ServerRelease,
        TargetKind::Tenant,
        TargetKind::Client,
        TargetKind::Tool,
        TargetKind::Resource,
        TargetKind::Task,
        TargetKind::Subscription,
        TargetKind::Upstream,
        TargetKind::Object,
        TargetKind::Agent,
        TargetKind::Prompt,
    ];

    /// The wire name (`server_release`, `tenant`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::ServerRelease => "server_release",
            TargetKind::Tenant => "tenant",
            TargetKind::Client => "client",
            TargetKind::Tool => "tool",
            TargetKind::Resource => "resource",
            TargetKind::Task => "task",
            TargetKind::Subscription => "subscription",
            TargetKind::Upstream => "upstream",
            TargetKind::Object => "object",
            TargetKind::Agent => "agent",
            TargetKind::Prompt => "prompt",
        }
    }

    /// Whether the kind names a property of the calling principal (its tenant, its client, the
    /// delegated agents it acts through), which a principal may not have. A request whose
    /// principal has no tenant has no tenant target: there is nothing of that kind to disable
    /// for it, so a rule's `tenant` (or `client`, or `agent`) kind is not asked for that request.
    /// Every other kind is derived by the server and must be present (its absence is
    /// [`crate::KillSwitchError::MissingTarget`]).
    pub fn is_principal_kind(self) -> bool {
        matches!(self, TargetKind::Tenant | TargetKind::Client | TargetKind::Agent)
    }

    /// The kind with this wire name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl std::fmt::Display for TargetKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// Parses a `KIND:VALUE` target as operators write it (`tool:basket_checkout`). The value may
/// itself contain `:`; it must not be empty.
pub fn parse_target_spec(spec: &str) -> Option<(TargetKind, String)> {
    let (kind, value) = spec.split_once(':')?;
    let kind = TargetKind::from_name(kind)?;
    (!value.is_empty()).then(|| (kind, value.to_owned()))
}

/// A target as the authority and the generation store know it: its kind and keyed digest
/// (64 lowercase hex digits).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetDigest {
    /// The kind.
    pub kind: TargetKind,
    /// `HMAC-SHA256(target_key, kind || 0x00 || value)`, lowercase hex.
    pub digest: String,
}

impl TargetDigest {
    /// Whether the digest is 64 lowercase hex digits.
    pub fn is_well_formed(&self) -> bool {
        is_lower_hex(&self.digest, 64)
    }
}

pub(crate) fn is_lower_hex(text: &str, length: usize) -> bool {
    text.len() == length && text.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
}

pub(crate) use palisade_base::hex::hex;

/// The 32-byte key target digests are made with. Every server instance and the authority's
/// operators (who name targets by value) share it. No `Debug` output of the key.
pub struct TargetKey(hmac::Key);

impl std::fmt::Debug for TargetKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("TargetKey(..)")
    }
}

impl TargetKey {
    /// A key from its 32 bytes (e.g. derived from the server secret).
    pub fn from_bytes(bytes: &[u8; 32]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// Reads a target key file (see [`crate::keys`] for the format;
    /// [`crate::keys::generate_secret_key_file`] makes one).
    pub fn read(path: &Path) -> Result<Self, KeyError> {
        let bytes = read_secret_key_file(path)?;
        Ok(Self::from_bytes(&bytes))
    }

    /// The digest of one target.
    pub fn digest(&self, kind: TargetKind, value: &str) -> TargetDigest {
        let mut context = hmac::Context::with_key(&self.0);
        context.update(kind.as_str().as_bytes());
        context.update(&[0]);
        context.update(value.as_bytes());
        TargetDigest { kind, digest: hex(context.sign().as_ref()) }
    }
}

/// The target values a request carries, by kind (the server derives them, never the client
/// alone): e.g. `tool → basket_checkout`, `tenant → acme`, `server_release → 1.4.2`. A kind
/// usually has one value; `agent` has one per agent of a delegation chain ([`push`](Self::push)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetValues(BTreeMap<TargetKind, Vec<String>>);

impl TargetValues {
    /// No values.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the value of one kind.
    #[must_use]
    pub fn with(mut self, kind: TargetKind, value: impl Into<String>) -> Self {
        self.insert(kind, value);
        self
    }

    /// Adds (or replaces) the value of one kind.
    pub fn insert(&mut self, kind: TargetKind, value: impl Into<String>) {
        self.0.insert(kind, vec![value.into()]);
    }

    /// Adds one more value of a kind (an agent of a delegation chain), keeping the others; a
    /// value already present is not added twice.
    pub fn push(&mut self, kind: TargetKind, value: impl Into<String>) {
        let value = value.into();
        let values = self.0.entry(kind).or_default();
        if !values.contains(&value) {
            values.push(value);
        }
    }

    /// The (first) value of one kind, if present and non-empty.
    pub fn get(&self, kind: TargetKind) -> Option<&str> {
        self.values(kind).next()
    }

    /// Every non-empty value of one kind, in the order they were added.
    pub fn values(&self, kind: TargetKind) -> impl Iterator<Item = &str> {
        self.0.get(&kind).into_iter().flatten().map(String::as_str).filter(|value| !value.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_keyed_and_kind_separated() {
        let key = TargetKey::from_bytes(&[7; 32]);
        let other = TargetKey::from_bytes(&[8; 32]);
        let tool = key.digest(TargetKind::Tool, "a");
        assert!(tool.is_well_formed());
        assert_ne!(tool, key.digest(TargetKind::Resource, "a"));
        assert_ne!(tool, key.digest(TargetKind::Prompt, "a"));
        assert_ne!(tool, other.digest(TargetKind::Tool, "a"));
        assert_eq!(tool, key.digest(TargetKind::Tool, "a"));
        assert_eq!(format!("{key:?}"), "TargetKey(..)");
        assert_eq!(parse_target_spec("tool:x:y"), Some((TargetKind::Tool, "x:y".to_owned())));
        assert_eq!(parse_target_spec("tool:"), None);
        assert_eq!(parse_target_spec("prompt:greet"), Some((TargetKind::Prompt, "greet".to_owned())));
        assert_eq!(parse_target_spec("nope:x"), None);
    }
}
