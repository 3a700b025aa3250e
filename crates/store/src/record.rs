//! The audit record (what one decision leaves behind), its limits, and the chain hash over it:
//! `hash = SHA-256(prev_hash || RFC 8785 canonical JSON of the record)`.

use aws_lc_rs::digest;
use serde::{Deserialize, Serialize};

use palisade_base::canonical::{CanonicalObject, MAX_SAFE_INTEGER};

use crate::StoreError;

/// The `prev_hash` of the first record: 32 zero bytes.
pub const GENESIS_HASH: [u8; 32] = [0; 32];

/// Longest accepted string field, in bytes.
pub const MAX_FIELD_BYTES: usize = 4096;

/// Most scopes accepted on one record.
pub const MAX_SCOPES: usize = 256;

/// Whether the audited stage let the request through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The stage let the request through.
    Allow,
    /// The stage refused the request.
    Deny,
}

impl Decision {
    /// The stored and hashed spelling: `"allow"` or `"deny"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Deny => "deny",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "allow" => Some(Decision::Allow),
            "deny" => Some(Decision::Deny),
            _ => None,
        }
    }
}

/// One audited decision. Digests only: never a raw token, handle or secret (DESIGN.md C11).
///
/// Optional fields that are `None` are left out of the hashed canonical JSON, so a field added
/// later as an `Option` leaves the hashes of older records unchanged.
///
/// The hashed form is RFC 8785 (JCS) of the record's `Serialize` form. Its keys are ASCII and its
/// numbers integers within ±(2^53 − 1) ([`AuditRecord::validate`]), where JCS spells a number
/// exactly as its decimal integer and a string exactly as `serde_json` escapes it: the bytes are
/// the same as those of the canonical writer used before JCS, so logs written earlier verify
/// unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When the decision was made, milliseconds since the Unix epoch (at most 2^53 − 1).
    pub at_ms: u64,
    /// The request's trace id.
    pub trace_id: String,
    /// The pipeline stage that decided, e.g. `"authenticate"`, `"kill_switch.pre_dispatch"`.
    pub stage: String,
    /// Allowed or refused.
    pub decision: Decision,
    /// The server-derived operation key, e.g. `"tools/call:basket_checkout"`.
    pub operation: String,
    /// Digest of the principal (`iss#sub`), when authenticated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal_digest: Option<String>,
    /// Digest of the tenant, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_digest: Option<String>,
    /// Digest of the OAuth client, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_digest: Option<String>,
    /// Scopes the token carried (or the stage required), in the order given.
    pub scopes: Vec<String>,
    /// Policy / pin / kill-switch generation the decision was made under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<String>,
    /// The JSON-RPC error code or HTTP status sent back, for refusals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
    /// A short, client-safe reason. Never secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl AuditRecord {
    /// Checks the limits every backend enforces before anything is written: `at_ms` and `code`
    /// are within ±(2^53 − 1) (an RFC 8785 number is a double: a larger integer would be hashed
    /// rounded, and the stored column would not match it), strings are at most
    /// [`MAX_FIELD_BYTES`] and free of NUL (PostgreSQL text cannot hold it), at most
    /// [`MAX_SCOPES`] scopes. The [`AuditWriter`](crate::AuditWriter) checks this before
    /// queueing, so one bad record fails only its own caller, not its batch.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.at_ms > MAX_SAFE_INTEGER {
            return Err(StoreError::InvalidRecord { reason: "at_ms is larger than 2^53 - 1" });
        }
        if self.code.is_some_and(|code| code.unsigned_abs() > MAX_SAFE_INTEGER) {
            return Err(StoreError::InvalidRecord { reason: "code is outside -(2^53 - 1) ..= 2^53 - 1" });
        }
        if self.scopes.len() > MAX_SCOPES {
            return Err(StoreError::InvalidRecord { reason: "too many scopes" });
        }
        let required = [&self.trace_id, &self.stage, &self.operation].into_iter();
        let optional =
            [&self.principal_digest, &self.tenant_digest, &self.client_digest, &self.policy_version, &self.detail]
                .into_iter()
                .flatten();
        for field in required.chain(optional).chain(self.scopes.iter()) {
            if field.len() > MAX_FIELD_BYTES {
                return Err(StoreError::InvalidRecord { reason: "a field is longer than MAX_FIELD_BYTES" });
            }
            if field.contains('\0') {
                return Err(StoreError::InvalidRecord { reason: "a field contains a NUL character" });
            }
        }
        Ok(())
    }

    /// The bytes that are hashed: RFC 8785 canonical JSON (keys sorted, no white space) of this
    /// record.
    ///
    /// Written field by field in key order rather than through a `serde_json::Value` (a map of
    /// owned keys, then sorted): for every record [`AuditRecord::validate`] accepts, the same
    /// bytes as `palisade_base::canonical::canonical_bytes` of the record's `Serialize` form (a
    /// test holds the two together), without the allocations. (A record outside those limits,
    /// which no backend stores, keeps its integers exact here.)
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(384);
        let mut fields = CanonicalObject::new(&mut out);
        // Keys in order (ASCII: byte order is RFC 8785's UTF-16 order); a `None` option is left
        // out, as `skip_serializing_if` does.
        fields.unsigned_exact("at_ms", self.at_ms);
        fields.optional_text("client_digest", self.client_digest.as_deref());
        if let Some(code) = self.code {
            fields.signed_exact("code", code);
        }
        fields.text("decision", self.decision.as_str());
        fields.optional_text("detail", self.detail.as_deref());
        fields.text("operation", &self.operation);
        fields.optional_text("policy_version", self.policy_version.as_deref());
        fields.optional_text("principal_digest", self.principal_digest.as_deref());
        fields.texts("scopes", &self.scopes);
        fields.text("stage", &self.stage);
        fields.optional_text("tenant_digest", self.tenant_digest.as_deref());
        fields.text("trace_id", &self.trace_id);
        fields.end();
        out
    }
}

/// `SHA-256(prev_hash || canonical JSON of record)`: the hash stored with `record`, and the
/// `prev_hash` of the record after it. Public so that an external verifier can recompute a chain.
pub fn chain_hash(prev_hash: &[u8; 32], record: &AuditRecord) -> [u8; 32] {
    let canonical = record.canonical_bytes();
    let mut context = digest::Context::new(&digest::SHA256);
    context.update(prev_hash);
    context.update(&canonical);
    let mut hash = [0u8; 32];
    hash.copy_from_slice(context.finish().as_ref());
    hash
}

/// A record as stored: its chain, its place in it and the hashes that link it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAuditRecord {
    /// The chain (its writer's id: 32 lowercase hex characters).
    pub chain: String,
    /// Position in the chain, from 1, without gaps.
    pub seq: u64,
    /// The record.
    pub record: AuditRecord,
    /// The hash of the record at `seq - 1` ([`GENESIS_HASH`] for `seq == 1`).
    pub prev_hash: [u8; 32],
    /// `SHA-256(prev_hash || canonical JSON of record)`.
    pub hash: [u8; 32],
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AuditRecord {
        AuditRecord {
            at_ms: 1_764_000_000_000,
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            stage: "authorize".into(),
            decision: Decision::Deny,
            operation: "tools/call:basket_checkout".into(),
            principal_digest: Some("p:1f2e".into()),
            tenant_digest: None,
            client_digest: None,
            scopes: vec!["mcp:tools".into()],
            policy_version: Some("7".into()),
            code: Some(403),
            detail: Some("insufficient_scope".into()),
        }
    }

    #[test]
    fn canonical_form_sorts_keys_and_omits_absent_options() {
        let bytes = sample().canonical_bytes();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            r#"{"at_ms":1764000000000,"code":403,"decision":"deny","detail":"insufficient_scope","operation":"tools/call:basket_checkout","policy_version":"7","principal_digest":"p:1f2e","scopes":["mcp:tools"],"stage":"authorize","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}"#
        );
    }

    /// The direct writer and RFC 8785 (`palisade_base::canonical`) of the `Serialize` output agree
    /// byte for byte, over every option present or absent, the integer bounds, and strings with
    /// every control character, quotes, non-ASCII, non-BMP and private-use characters: a stored
    /// chain keeps verifying whichever computed its hashes, and an external JCS verifier agrees.
    #[test]
    fn direct_canonical_bytes_equal_rfc_8785() {
        let controls: String = (0u32..0x20).filter_map(char::from_u32).collect();
        let awkward = [
            "",
            "plain",
            "quote \" and backslash \\ and slash /",
            "control \u{1}\u{1f}\n\t\r\u{8}\u{c}",
            controls.as_str(),
            "Ünïcödé ☕ 🦀",
            "</script>&'",
            "\u{7f}\u{80}\u{2028}\u{2029}",
            "\u{e000}\u{fb33}\u{ffff}\u{10000}\u{1f600}\u{10ffff}",
        ];
        let safe = MAX_SAFE_INTEGER;
        let safe_signed = i64::try_from(safe).unwrap();
        let mut checked = 0;
        for (index, text) in awkward.iter().enumerate() {
            for mask in 0u32..64 {
                let some = |bit: u32| mask & (1 << bit) != 0;
                let record = AuditRecord {
                    at_ms: [0, 1, 1_764_000_000_000, safe][index % 4],
                    trace_id: (*text).to_owned(),
                    stage: format!("stage{text}"),
                    decision: if some(0) { Decision::Allow } else { Decision::Deny },
                    operation: format!("tools/call:{text}"),
                    principal_digest: some(1).then(|| format!("p{text}")),
                    tenant_digest: some(2).then(|| (*text).to_owned()),
                    client_digest: some(3).then(|| format!("c{text}")),
                    scopes: (0..(mask as usize % 3)).map(|n| format!("{text}{n}")).collect(),
                    policy_version: some(4).then(|| format!("v{text}")),
                    code: some(5).then_some([-32603, 0, 403, -safe_signed, safe_signed][mask as usize % 5]),
                    detail: some(1).then(|| format!("detail {text}")),
                };
                let value = serde_json::to_value(&record).unwrap();
                assert_eq!(
                    String::from_utf8(record.canonical_bytes()).unwrap(),
                    String::from_utf8(palisade_base::canonical::canonical_bytes(&value)).unwrap(),
                    "record {record:?}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, awkward.len() * 64);
    }

    /// Hashes of a chain as the writer computed them before the canonical form was RFC 8785
    /// (recomputed independently: sorted keys, `serde_json` escaping, SHA-256 chained from
    /// [`GENESIS_HASH`]). They must never change: logs already written verify against them.
    #[test]
    fn hashes_of_logs_written_before_rfc_8785_are_unchanged() {
        let second = AuditRecord {
            at_ms: 1_764_000_000_001,
            trace_id: "00000000000000000000000000000002".into(),
            stage: "kill_switch.pre_dispatch".into(),
            decision: Decision::Allow,
            operation: "tools/call:café 🦀".into(),
            principal_digest: Some("p\u{1}\u{1f}\n\"\\".into()),
            tenant_digest: Some("\u{e000}\u{ffff}\u{10000}".into()),
            client_digest: Some("</script>\u{7f}\u{2028}".into()),
            scopes: vec!["shop:read".into(), "ünï".into()],
            policy_version: None,
            code: Some(-32602),
            detail: None,
        };
        let third = AuditRecord {
            at_ms: MAX_SAFE_INTEGER,
            trace_id: "t".into(),
            stage: "s".into(),
            decision: Decision::Allow,
            operation: "o".into(),
            principal_digest: None,
            tenant_digest: None,
            client_digest: None,
            scopes: Vec::new(),
            policy_version: None,
            code: None,
            detail: None,
        };
        let expected = [
            "a9ca51788b59a86d0cdee76b0473f89cd454d6d83e4f2457d0925f75fb969b0e",
            "9fbc4e4e58ad9a945b25140bdab9c2ad5e8d66828f399d46698fa6860a15f6f3",
            "1dd57cceead7d92535f02609412c644401f754f64a2218db94c59f5faffa01e2",
        ];
        let mut prev = GENESIS_HASH;
        for (record, expected) in [sample(), second, third].iter().zip(expected) {
            assert!(record.validate().is_ok());
            prev = chain_hash(&prev, record);
            assert_eq!(palisade_base::hex::hex(&prev), expected, "{record:?}");
        }
    }

    /// A record with an integer JCS would round is refused before anything is written, and the
    /// direct writer still spells such an integer exactly (what it always did), so nothing that
    /// was hashed before changes.
    #[test]
    fn integers_beyond_2_pow_53_are_refused_and_never_rounded() {
        let mut late = sample();
        late.at_ms = MAX_SAFE_INTEGER + 1;
        assert!(matches!(late.validate(), Err(StoreError::InvalidRecord { .. })));
        for code in [i64::MIN, i64::MAX, -(1 << 53), 1 << 53] {
            let mut coded = sample();
            coded.code = Some(code);
            assert!(matches!(coded.validate(), Err(StoreError::InvalidRecord { .. })), "{code}");
        }
        let mut edge = sample();
        edge.code = Some(-((1 << 53) - 1));
        assert!(edge.validate().is_ok());
        late.at_ms = u64::try_from(i64::MAX).unwrap();
        let text = String::from_utf8(late.canonical_bytes()).unwrap();
        assert!(text.starts_with(r#"{"at_ms":9223372036854775807,"#), "{text}");
    }

    #[test]
    fn hash_depends_on_the_previous_hash_and_every_field() {
        let record = sample();
        let first = chain_hash(&GENESIS_HASH, &record);
        assert_ne!(chain_hash(&first, &record), first);
        let mut edited = record.clone();
        edited.decision = Decision::Allow;
        assert_ne!(chain_hash(&GENESIS_HASH, &edited), first);
    }

    #[test]
    fn hash_matches_an_independent_sha256() {
        let record = sample();
        let mut input = GENESIS_HASH.to_vec();
        input.extend(record.canonical_bytes());
        let expected = digest::digest(&digest::SHA256, &input);
        assert_eq!(chain_hash(&GENESIS_HASH, &record).as_slice(), expected.as_ref());
    }

    #[test]
    fn validate_refuses_what_a_backend_cannot_store() {
        assert!(sample().validate().is_ok());
        let mut nul = sample();
        nul.trace_id = "a\0b".into();
        assert!(matches!(nul.validate(), Err(StoreError::InvalidRecord { .. })));
        let mut late = sample();
        late.at_ms = u64::MAX;
        assert!(matches!(late.validate(), Err(StoreError::InvalidRecord { .. })));
        let mut long = sample();
        long.detail = Some("x".repeat(MAX_FIELD_BYTES + 1));
        assert!(matches!(long.validate(), Err(StoreError::InvalidRecord { .. })));
        let mut scopes = sample();
        scopes.scopes = vec!["s".into(); MAX_SCOPES + 1];
        assert!(matches!(scopes.validate(), Err(StoreError::InvalidRecord { .. })));
    }
}
