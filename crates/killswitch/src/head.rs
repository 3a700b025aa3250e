//! The authority protocol's documents: the query a server sends once per phase, the signed head
//! the authority returns for each target, and the state digest the generation store keeps.
//!
//! ```text
//! POST /v1/disable/current-head      (mTLS; canonical JSON)
//! query:    {"schema_version":"palisade.mcp-disable-query.v2","policy_digest":…,"policy_generation":…,
//!            "query_nonce":<64 hex, fresh>,"phase":"pre_dispatch"|"pre_side_effect",
//!            "targets":[{"kind":…,"digest":…},…]}
//! response: {"heads":[<signed envelope of a head>,…]}   one per target, in query order
//! head:     {"authority","commit_token","expires_at","generation","issued_at","phase",
//!            "policy_digest","policy_generation","query_nonce","reason_code","schema_version",
//!            "state","target"}                            (schema aidefend.mcp-disable-head.v2)
//! ```

use palisade_base::canonical::CanonicalObject;
use serde::{Deserialize, Serialize};

use crate::envelope::{SignedEnvelope, sha256_hex};
use crate::target::TargetDigest;

/// The query's `schema_version` (one query covers every target of an operation).
pub const QUERY_SCHEMA_VERSION: &str = "palisade.mcp-disable-query.v2";
/// The head's `schema_version`.
pub const HEAD_SCHEMA_VERSION: &str = "aidefend.mcp-disable-head.v2";
/// Most targets one query may name.
pub const MAX_TARGETS_PER_QUERY: usize = 16;
/// The authority's head endpoint path.
pub const CURRENT_HEAD_PATH: &str = "/v1/disable/current-head";
/// The authority's redeem endpoint path.
pub const REDEEM_PATH: &str = "/v1/disable/redeem";

/// The two enforcement points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before the handler runs.
    PreDispatch,
    /// After the side-effect-free preparation, before the commit.
    PreSideEffect,
}

impl Phase {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::PreDispatch => "pre_dispatch",
            Phase::PreSideEffect => "pre_side_effect",
        }
    }
}

/// A target's authoritative state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TargetState {
    /// Operations on the target may proceed.
    #[serde(rename = "ENABLE")]
    Enable,
    /// Operations on the target are halted.
    #[serde(rename = "DISABLE")]
    Disable,
}

impl TargetState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetState::Enable => "ENABLE",
            TargetState::Disable => "DISABLE",
        }
    }
}

/// The query body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadQuery {
    /// [`QUERY_SCHEMA_VERSION`].
    pub schema_version: String,
    /// The policy's digest.
    pub policy_digest: String,
    /// The policy's generation.
    pub policy_generation: u64,
    /// A fresh 256-bit nonce, lowercase hex.
    pub query_nonce: String,
    /// The phase asked about.
    pub phase: Phase,
    /// The targets, 1 to [`MAX_TARGETS_PER_QUERY`], distinct.
    pub targets: Vec<TargetDigest>,
}

/// The response body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadResponse {
    /// One signed head per queried target, in query order.
    pub heads: Vec<SignedEnvelope>,
}

/// A head payload: exactly these fields. (`Debug` omits the commit token.)
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadPayload {
    /// The authority id.
    pub authority: String,
    /// A one-use commit token (ENABLE at `pre_side_effect` only), else `null`.
    #[serde(deserialize_with = "present_option")]
    pub commit_token: Option<String>,
    /// RFC 3339 UTC: the head is void from then on.
    pub expires_at: String,
    /// The target's current head generation (positive).
    pub generation: u64,
    /// RFC 3339 UTC: when the authority read the state.
    pub issued_at: String,
    /// The phase asked about.
    pub phase: Phase,
    /// The query's policy digest.
    pub policy_digest: String,
    /// The query's policy generation.
    pub policy_generation: u64,
    /// The query's nonce.
    pub query_nonce: String,
    /// Why the target is in this state (non-empty).
    pub reason_code: String,
    /// [`HEAD_SCHEMA_VERSION`].
    pub schema_version: String,
    /// ENABLE or DISABLE.
    pub state: TargetState,
    /// The target.
    pub target: TargetDigest,
}

impl HeadPayload {
    /// The digest of the authority state alone (authority, target, generation, state, reason):
    /// what the generation store keeps. Nonce, phase, times and tokens are not part of it, so two
    /// answers about one state agree and two states at one generation conflict.
    pub fn state_digest(&self) -> String {
        let mut out = Vec::with_capacity(192);
        let mut object = CanonicalObject::new(&mut out);
        object.text("authority", &self.authority);
        object.unsigned("generation", self.generation);
        object.text("reason_code", &self.reason_code);
        object.text("state", self.state.as_str());
        object.object("target", |target| self.target.write_members(target));
        object.end();
        sha256_hex(&out)
    }

    /// RFC 8785 canonical JSON bytes: what the authority signs.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        Canonical::canonical_bytes(self)
    }
}

/// A type sent, hashed or signed as RFC 8785 canonical JSON, written straight from its fields
/// ([`CanonicalObject`]: members in sorted order, no `Value` tree). The kill switch's per-call
/// documents are: the generic route was a quarter of a covered call's CPU. Every implementation
/// is compared with the generic route ([`canonical`]) in `canonical_tests.rs`.
pub(crate) trait Canonical {
    /// Writes the members, sorted.
    fn write_members(&self, object: &mut CanonicalObject<'_>);

    /// The canonical bytes.
    fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        let mut object = CanonicalObject::new(&mut out);
        self.write_members(&mut object);
        object.end();
        out
    }
}

impl Canonical for TargetDigest {
    fn write_members(&self, object: &mut CanonicalObject<'_>) {
        object.text("digest", &self.digest);
        object.text("kind", self.kind.as_str());
    }
}

impl Canonical for HeadQuery {
    fn write_members(&self, object: &mut CanonicalObject<'_>) {
        object.text("phase", self.phase.as_str());
        object.text("policy_digest", &self.policy_digest);
        object.unsigned("policy_generation", self.policy_generation);
        object.text("query_nonce", &self.query_nonce);
        object.text("schema_version", &self.schema_version);
        object.objects("targets", &self.targets, |object, target| target.write_members(object));
    }
}

impl Canonical for HeadPayload {
    fn write_members(&self, object: &mut CanonicalObject<'_>) {
        object.text("authority", &self.authority);
        object.text_or_null("commit_token", self.commit_token.as_deref());
        object.text("expires_at", &self.expires_at);
        object.unsigned("generation", self.generation);
        object.text("issued_at", &self.issued_at);
        object.text("phase", self.phase.as_str());
        object.text("policy_digest", &self.policy_digest);
        object.unsigned("policy_generation", self.policy_generation);
        object.text("query_nonce", &self.query_nonce);
        object.text("reason_code", &self.reason_code);
        object.text("schema_version", &self.schema_version);
        object.text("state", self.state.as_str());
        object.object("target", |target| self.target.write_members(target));
    }
}

/// The redeem endpoint's body (also what a backend hands to [`crate::authority::redeem_commit_token`]).
/// (`Debug` omits the token.)
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedeemRequest {
    /// The commit token, as issued.
    pub token: String,
    /// The target it was issued for.
    pub target: TargetDigest,
    /// The head generation it was issued at.
    pub generation: u64,
}

impl std::fmt::Debug for HeadPayload {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("HeadPayload")
            .field("authority", &self.authority)
            .field("commit_token", &self.commit_token.as_ref().map(|_| "<redacted>"))
            .field("generation", &self.generation)
            .field("phase", &self.phase)
            .field("state", &self.state)
            .field("target", &self.target)
            .field("issued_at", &self.issued_at)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RedeemRequest {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RedeemRequest")
            .field("token", &"<redacted>")
            .field("target", &self.target)
            .field("generation", &self.generation)
            .finish()
    }
}

/// RFC 8785 canonical JSON bytes of a serializable value (empty if it does not serialize).
pub(crate) fn canonical<T: Serialize>(value: &T) -> Vec<u8> {
    match serde_json::to_value(value) {
        Ok(value) => palisade_base::canonical::canonical_bytes(&value),
        Err(_) => Vec::new(),
    }
}

fn present_option<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(deserializer)
}

#[cfg(test)]
#[path = "canonical_tests.rs"]
mod canonical_tests;
