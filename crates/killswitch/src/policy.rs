//! The signed kill-switch policy: who the disable authority is (id and pinned key), how fresh its
//! answers must be, until when the policy holds, and the complete operation registry.
//!
//! Loading ([`Policy::load`]) verifies, in order: the envelope under the root public key; the
//! payload's exact field set and schema version; every registry entry; `not_after` in the future;
//! the authority key path (relative, inside the key trust root after resolving symlinks); the
//! authority key file's SHA-256 against the pinned digest. Monotonic acceptance of the policy
//! generation happens when the [`KillSwitch`](crate::KillSwitch) starts (it needs the generation
//! store).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use ed25519_dalek::VerifyingKey;
use palisade_base::time::parse_rfc3339_ms;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::envelope::{self, EnvelopeError, sha256_hex};
use crate::keys::{self, Ed25519SigningKey, KeyError};
use crate::target::{TargetKind, is_lower_hex};

/// The policy payload's `schema_version`.
pub const POLICY_SCHEMA_VERSION: &str = "aidefend.mcp-disable-policy.v2";

/// Largest integer a policy or head may carry (2^53 − 1: exact in every JSON implementation and
/// in the generation store's Lua numbers).
pub const MAX_SAFE_INTEGER: u64 = palisade_base::canonical::MAX_SAFE_INTEGER;

/// Whether an operation is under the kill switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Coverage {
    /// Checked before dispatch and before side effects, against the listed target kinds.
    #[serde(rename = "COVERED")]
    Covered,
    /// Explicitly outside the kill switch, for the stated technical reason.
    #[serde(rename = "NOT_APPLICABLE")]
    NotApplicable,
}

/// One registry entry. All four keys are required (`technical_reason` may be `null`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationRule {
    /// COVERED or NOT_APPLICABLE.
    pub coverage: Coverage,
    /// COVERED only: the backend must redeem the authority's commit tokens in its commit.
    pub require_commit_fence: bool,
    /// COVERED: the target kinds whose current state must be ENABLE (non-empty, unique).
    /// NOT_APPLICABLE: empty.
    pub required_target_kinds: Vec<TargetKind>,
    /// NOT_APPLICABLE: the technical architecture reason (non-blank). COVERED: `null`.
    #[serde(deserialize_with = "present_option")]
    pub technical_reason: Option<String>,
}

/// The policy payload, exactly the fields of the signed document. Unknown, missing and duplicate
/// fields are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyPayload {
    /// [`POLICY_SCHEMA_VERSION`].
    pub schema_version: String,
    /// A human label for this policy (non-empty).
    pub policy_version: String,
    /// Positive; accepted only monotonically.
    pub policy_generation: u64,
    /// The authority's id, `[A-Za-z0-9._:-]+`; every head must name it.
    pub authority: String,
    /// The authority's public key file, relative to the key trust root.
    pub authority_key_path: String,
    /// SHA-256 of that file's bytes, lowercase hex.
    pub authority_key_sha256: String,
    /// How old (since `issued_at`) an authority answer may be, in milliseconds; positive.
    pub max_authority_response_age_ms: u64,
    /// RFC 3339 UTC (`…Z`); the policy is refused from this instant on.
    pub not_after: String,
    /// The complete operation registry: operation key → rule. Non-empty.
    #[serde(deserialize_with = "unique_map")]
    pub operations: BTreeMap<String, OperationRule>,
}

/// Why a policy was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A policy input file could not be read.
    #[error("policy file {path} could not be read")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The root public key, the authority key or a signing key is unusable.
    #[error("policy key unusable")]
    Key(#[from] KeyError),
    /// The envelope did not verify.
    #[error("policy envelope refused")]
    Envelope(#[from] EnvelopeError),
    /// The payload is not exactly the policy schema (unknown/missing field, wrong type, bad value).
    #[error("policy payload invalid: {reason}")]
    Schema {
        /// What is wrong (a fixed phrase, may name a field or an operation key).
        reason: String,
    },
    /// `not_after` has passed.
    #[error("policy expired (not_after passed)")]
    Expired,
    /// `authority_key_path` is absolute, contains `..`/`.`, or resolves outside the trust root.
    #[error("authority key path escapes the key trust root")]
    KeyPathEscape,
    /// The authority key file's SHA-256 differs from `authority_key_sha256`.
    #[error("authority key digest differs from the pinned digest")]
    KeyDigestMismatch,
}

fn schema(reason: impl Into<String>) -> PolicyError {
    PolicyError::Schema { reason: reason.into() }
}

/// The registry is missing operations the server exposes: the server must not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("operations exposed but absent from the signed registry: {}", missing.join(", "))]
pub struct RegistryError {
    /// Exposed operation keys with no registry entry, sorted.
    pub missing: Vec<String>,
}

impl PolicyPayload {
    /// Checks everything that does not need files: schema version, field values, every rule,
    /// and `not_after` after `now_ms`. Returns `not_after` in epoch milliseconds.
    pub fn validate(&self, now_ms: i64) -> Result<i64, PolicyError> {
        if self.schema_version != POLICY_SCHEMA_VERSION {
            return Err(schema("schema_version differs"));
        }
        if self.policy_version.is_empty() {
            return Err(schema("policy_version is empty"));
        }
        if self.policy_generation == 0 || self.policy_generation > MAX_SAFE_INTEGER {
            return Err(schema("policy_generation must be a positive safe integer"));
        }
        if !is_authority_id(&self.authority) {
            return Err(schema("authority must match [A-Za-z0-9._:-]+"));
        }
        if !is_lower_hex(&self.authority_key_sha256, 64) {
            return Err(schema("authority_key_sha256 must be 64 lowercase hex digits"));
        }
        if self.max_authority_response_age_ms == 0 || self.max_authority_response_age_ms > MAX_SAFE_INTEGER {
            return Err(schema("max_authority_response_age_ms must be a positive safe integer"));
        }
        if self.operations.is_empty() {
            return Err(schema("operations is empty"));
        }
        for (operation, rule) in &self.operations {
            validate_rule(operation, rule)?;
        }
        let not_after_ms = parse_rfc3339_ms(&self.not_after).ok_or_else(|| schema("not_after is not RFC 3339 UTC"))?;
        if not_after_ms <= now_ms {
            return Err(PolicyError::Expired);
        }
        Ok(not_after_ms)
    }

    /// The payload as RFC 8785 canonical JSON bytes (sorted keys, no white space): what gets signed.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        match serde_json::to_value(self) {
            Ok(value) => palisade_base::canonical::canonical_bytes(&value),
            // Strings, integers, booleans and maps with string keys always serialize.
            Err(_) => Vec::new(),
        }
    }

    /// A registry skeleton for `palisade policy init`: every exposed operation COVERED, by
    /// `server_release`, the caller's `tenant`, `client` and delegated `agent`s, plus the operation's own kind
    /// ([`ExposedOperation::target_kinds`]: `tool` for a tool call, `prompt` for a prompt got, `resource` for a read or a
    /// subscription, `upstream` too for a relayed one), with a commit fence where the operation declares a side effect. The
    /// operator reviews it (removing a kind deliberately, or NOT_APPLICABLE with a reason) and
    /// signs it with [`sign_policy`]. Fail-safe: nothing starts out NOT_APPLICABLE, and every
    /// target an operator can name in `authority disable` is asked for by every rule.
    pub fn skeleton(header: PolicyHeader, exposed: impl IntoIterator<Item = ExposedOperation>) -> Self {
        let operations = exposed
            .into_iter()
            .map(|operation| {
                let mut kinds = vec![TargetKind::ServerRelease, TargetKind::Tenant, TargetKind::Client];
                kinds.extend(operation.target_kinds);
                kinds.push(TargetKind::Agent);
                let rule = OperationRule {
                    coverage: Coverage::Covered,
                    require_commit_fence: operation.has_side_effect,
                    required_target_kinds: kinds,
                    technical_reason: None,
                };
                (operation.key, rule)
            })
            .collect();
        Self {
            schema_version: POLICY_SCHEMA_VERSION.to_owned(),
            policy_version: header.policy_version,
            policy_generation: header.policy_generation,
            authority: header.authority,
            authority_key_path: header.authority_key_path,
            authority_key_sha256: header.authority_key_sha256,
            max_authority_response_age_ms: header.max_authority_response_age_ms,
            not_after: header.not_after,
            operations,
        }
    }
}

/// The non-registry fields of a policy, for [`PolicyPayload::skeleton`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyHeader {
    /// A human label.
    pub policy_version: String,
    /// Positive, higher than any generation signed before.
    pub policy_generation: u64,
    /// The authority id.
    pub authority: String,
    /// The authority public key file, relative to the key trust root.
    pub authority_key_path: String,
    /// SHA-256 of that file ([`file_sha256_hex`]).
    pub authority_key_sha256: String,
    /// Freshness bound for authority answers.
    pub max_authority_response_age_ms: u64,
    /// RFC 3339 UTC expiry ([`palisade_base::time::format_rfc3339_ms`]).
    pub not_after: String,
}

/// One operation the server exposes, for [`PolicyPayload::skeleton`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposedOperation {
    /// The operation key (`tools/call:basket_checkout`, `resources/read:shop://policy`, `tools/list`).
    pub key: String,
    /// Whether it has a side effect (its skeleton entry then requires a commit fence).
    pub has_side_effect: bool,
    /// The kinds of the registered entry the operation acts on that the authority can disable
    /// (`tool`, `resource`; `upstream` for a definition the gateway relays); the skeleton
    /// requires them.
    pub target_kinds: Vec<TargetKind>,
}

fn validate_rule(operation: &str, rule: &OperationRule) -> Result<(), PolicyError> {
    if operation.is_empty() {
        return Err(schema("an operation key is empty"));
    }
    let kinds = &rule.required_target_kinds;
    let mut unique = kinds.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != kinds.len() {
        return Err(schema(format!("operation {operation}: duplicate required_target_kinds")));
    }
    match rule.coverage {
        Coverage::Covered => {
            if kinds.is_empty() || rule.technical_reason.is_some() {
                return Err(schema(format!(
                    "operation {operation}: COVERED needs target kinds and a null technical_reason"
                )));
            }
        }
        Coverage::NotApplicable => {
            let reason_ok = rule.technical_reason.as_deref().is_some_and(|reason| !reason.trim().is_empty());
            if !kinds.is_empty() || rule.require_commit_fence || !reason_ok {
                return Err(schema(format!(
                    "operation {operation}: NOT_APPLICABLE needs a technical reason, no target kinds and no fence"
                )));
            }
        }
    }
    Ok(())
}

pub(crate) fn is_authority_id(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && text.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b':' | b'-'))
}

/// Where a policy comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFiles {
    /// The root public key file (the policy signer's key; see [`crate::keys`] for the format).
    pub root_public_key: PathBuf,
    /// The signed envelope file.
    pub envelope: PathBuf,
    /// The key trust root directory: `authority_key_path` must resolve inside it.
    pub key_trust_root: PathBuf,
}

/// A verified policy. Only [`Policy::load`] / [`Policy::from_envelope`] make one.
pub struct Policy {
    payload: PolicyPayload,
    digest: String,
    not_after_ms: i64,
    authority_key: VerifyingKey,
}

impl fmt::Debug for Policy {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Policy")
            .field("policy_version", &self.payload.policy_version)
            .field("policy_generation", &self.payload.policy_generation)
            .field("authority", &self.payload.authority)
            .field("digest", &self.digest)
            .field("operations", &self.payload.operations.len())
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// Reads and verifies the policy named by `files` (see the module docs for every check).
    pub fn load(files: &PolicyFiles, now_ms: i64) -> Result<Self, PolicyError> {
        let root_key = keys::read_public_key(&files.root_public_key)?;
        let raw = std::fs::read(&files.envelope)
            .map_err(|source| PolicyError::Io { path: files.envelope.clone(), source })?;
        Self::from_envelope(&raw, &root_key, &files.key_trust_root, now_ms)
    }

    /// Verifies an envelope already in memory.
    pub fn from_envelope(
        raw_envelope: &[u8],
        root_key: &VerifyingKey,
        key_trust_root: &Path,
        now_ms: i64,
    ) -> Result<Self, PolicyError> {
        let verified = envelope::verify_envelope(raw_envelope, root_key)?;
        let payload: PolicyPayload =
            serde_json::from_slice(&verified.bytes).map_err(|error| schema(serde_reason(&error)))?;
        let not_after_ms = payload.validate(now_ms)?;
        let key_path = resolve_inside(key_trust_root, &payload.authority_key_path)?;
        let key_bytes = keys::read_file(&key_path)?;
        if sha256_hex(&key_bytes) != payload.authority_key_sha256 {
            return Err(PolicyError::KeyDigestMismatch);
        }
        let authority_key = keys::parse_public_key(&key_bytes)?;
        Ok(Self { payload, digest: verified.digest, not_after_ms, authority_key })
    }

    /// Refuses to start a server that exposes an operation the registry does not list.
    pub fn check_complete<'a>(&self, exposed: impl IntoIterator<Item = &'a str>) -> Result<(), RegistryError> {
        let mut missing: Vec<String> = exposed
            .into_iter()
            .filter(|operation| !self.payload.operations.contains_key(*operation))
            .map(str::to_owned)
            .collect();
        missing.sort();
        missing.dedup();
        if missing.is_empty() { Ok(()) } else { Err(RegistryError { missing }) }
    }

    /// The registry entry of an operation; `None` means the operation must be refused.
    pub fn lookup(&self, operation: &str) -> Option<&OperationRule> {
        self.payload.operations.get(operation)
    }

    /// The verified payload.
    pub fn payload(&self) -> &PolicyPayload {
        &self.payload
    }

    /// SHA-256 of the signed payload bytes, lowercase hex: the policy's identity in queries.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The policy generation.
    pub fn generation(&self) -> u64 {
        self.payload.policy_generation
    }

    /// The authority id.
    pub fn authority(&self) -> &str {
        &self.payload.authority
    }

    /// `not_after` in epoch milliseconds.
    pub fn not_after_ms(&self) -> i64 {
        self.not_after_ms
    }

    /// Whether the policy has expired at `now_ms`.
    pub fn is_expired(&self, now_ms: i64) -> bool {
        now_ms >= self.not_after_ms
    }

    /// The pinned authority public key.
    pub fn authority_key(&self) -> &VerifyingKey {
        &self.authority_key
    }
}

/// Resolves `relative` inside `root`: refuses absolute paths and any `..`/`.` component, then
/// resolves symlinks on both and requires the result to be a file strictly inside the root.
fn resolve_inside(root: &Path, relative: &str) -> Result<PathBuf, PolicyError> {
    let relative_path = Path::new(relative);
    if relative.is_empty() || relative.contains('\0') {
        return Err(PolicyError::KeyPathEscape);
    }
    if !relative_path.components().all(|component| matches!(component, Component::Normal(_))) {
        return Err(PolicyError::KeyPathEscape);
    }
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PolicyError::Io { path, source }
    };
    let root = std::fs::canonicalize(root).map_err(io_error(root))?;
    let joined = root.join(relative_path);
    let resolved = std::fs::canonicalize(&joined).map_err(io_error(&joined))?;
    if resolved == root || !resolved.starts_with(&root) {
        return Err(PolicyError::KeyPathEscape);
    }
    let metadata = std::fs::metadata(&resolved).map_err(io_error(&resolved))?;
    if !metadata.is_file() {
        return Err(PolicyError::KeyPathEscape);
    }
    Ok(resolved)
}

/// Validates a policy payload document (JSON), and signs its canonical form with `key`:
/// `palisade policy sign`. Returns the envelope as canonical JSON bytes. A payload that would be
/// refused at load (bad schema, expired) is refused here too; the authority key file is checked at
/// load time only (the signer may not have the trust root).
pub fn sign_policy(payload_json: &[u8], key: &Ed25519SigningKey, now_ms: i64) -> Result<Vec<u8>, PolicyError> {
    let payload: PolicyPayload = serde_json::from_slice(payload_json).map_err(|error| schema(serde_reason(&error)))?;
    payload.validate(now_ms)?;
    Ok(envelope::envelope_bytes(&envelope::sign_envelope(&payload.canonical_bytes(), key)))
}

/// SHA-256 of a file's bytes, lowercase hex (for `authority_key_sha256`).
pub fn file_sha256_hex(path: &Path) -> Result<String, PolicyError> {
    Ok(sha256_hex(&keys::read_file(path)?))
}

/// serde's message names the offending field or variant, never secret data (policies hold none).
fn serde_reason(error: &serde_json::Error) -> String {
    let message = error.to_string();
    message.chars().take(200).collect()
}

/// A field that must be present, possibly `null`.
fn present_option<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(deserializer)
}

/// A map that refuses duplicate keys (serde_json would otherwise keep the last).
fn unique_map<'de, D: Deserializer<'de>>(deserializer: D) -> Result<BTreeMap<String, OperationRule>, D::Error> {
    struct UniqueMap;
    impl<'de> Visitor<'de> for UniqueMap {
        type Value = BTreeMap<String, OperationRule>;
        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("an object of operation rules")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
            let mut map = BTreeMap::new();
            while let Some((key, value)) = access.next_entry::<String, OperationRule>()? {
                if map.contains_key(&key) {
                    return Err(serde::de::Error::custom(format!("duplicate operation {key}")));
                }
                map.insert(key, value);
            }
            Ok(map)
        }
    }
    deserializer.deserialize_map(UniqueMap)
}
