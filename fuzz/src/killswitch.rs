//! The `killswitch` property: what `palisade-killswitch` reads from the disable authority and the
//! policy file — signed head envelopes, head payloads, signed policies and policy payloads, signed
//! batch payloads and Merkle inclusion paths.
//!
//! One fixture per process, from fixed Ed25519 seeds: the policy root key, the authority key and a
//! stranger's key (that never signs anything), a key trust root holding only the authority's
//! public key file (`fuzz/target/killswitch-trust-root/`, git-ignored), and one head, one policy
//! and one batch payload, each signed by its key.
//!
//! The first input byte picks a check (modulo 6); the rest is its input:
//!
//! - 0: a head envelope as sent: it verifies under the authority key only if its payload is the
//!   one head the authority signed, never under the stranger's key; as a head payload, a parse
//!   that succeeds round-trips through its canonical bytes;
//! - 1: edits to the signed head envelope: still verifies only with the signed payload;
//! - 2: a policy envelope file: it loads only if it is the signed policy; as a policy payload, a
//!   parse that succeeds round-trips through its canonical bytes and validates without panicking;
//! - 3: edits to the signed policy envelope: loads only as the signed policy;
//! - 4: a policy payload signed by the root key (`$KEY_SHA256` in it stands for the digest of
//!   the authority's key file, so seeds can pin the right key): loading (schema, registry rules,
//!   expiry, key path inside the trust root, pinned key digest) never panics, and a policy that
//!   loads names the authority's key and round-trips;
//! - 5: edits to the signed batch envelope (it verifies only with the signed batch payload, never
//!   under another key), and a Merkle tree of leaves cut from the input: every leaf's inclusion
//!   path leads to the root, at its own index only, and a path with one bit flipped does not.

use std::path::PathBuf;
use std::sync::OnceLock;

use palisade_killswitch::batch::{
    self, BATCH_SCHEMA_VERSION, BatchPayload, inclusion_path, leaf_hash_bytes, root_from_path, tree_root,
};
use palisade_killswitch::envelope::{SignedEnvelope, envelope_bytes, sha256_hex, sign_envelope, verify_envelope};
use palisade_killswitch::head::{HEAD_SCHEMA_VERSION, HeadPayload};
use palisade_killswitch::{
    Ed25519SigningKey, ExposedOperation, Phase, Policy, PolicyHeader, PolicyPayload, TargetDigest, TargetKind,
    TargetState, sign_policy,
};

use crate::server::edit;

/// The fixture's "now": 2027-01-15T08:00:00Z, in ms.
const NOW_MS: i64 = 1_800_000_000_000;
/// The authority key file's name inside the trust root.
const AUTHORITY_KEY_FILE: &str = "authority.pub";

struct Fixture {
    root: Ed25519SigningKey,
    authority: Ed25519SigningKey,
    stranger: Ed25519SigningKey,
    trust_root: PathBuf,
    key_file_sha256: String,
    head: HeadPayload,
    head_bytes: Vec<u8>,
    head_envelope: Vec<u8>,
    policy_digest: String,
    policy_envelope: Vec<u8>,
    batch: BatchPayload,
    batch_envelope: Vec<u8>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(build)
}

fn build() -> Fixture {
    let root = Ed25519SigningKey::from_seed(&[1; 32]);
    let authority = Ed25519SigningKey::from_seed(&[2; 32]);
    let stranger = Ed25519SigningKey::from_seed(&[3; 32]);

    let trust_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target").join("killswitch-trust-root");
    std::fs::create_dir_all(&trust_root).expect("the trust root folder");
    let key_file = format!("{}\n", authority.public_key_base64());
    std::fs::write(trust_root.join(AUTHORITY_KEY_FILE), &key_file).expect("the authority key file");

    let head = HeadPayload {
        authority: "fuzz-authority".to_owned(),
        commit_token: None,
        expires_at: "2027-01-15T08:00:30.000Z".to_owned(),
        generation: 3,
        issued_at: "2027-01-15T08:00:00.000Z".to_owned(),
        phase: Phase::PreDispatch,
        policy_digest: "ab".repeat(32),
        policy_generation: 1,
        query_nonce: "cd".repeat(32),
        reason_code: "operator".to_owned(),
        schema_version: HEAD_SCHEMA_VERSION.to_owned(),
        state: TargetState::Enable,
        target: TargetDigest { kind: TargetKind::Tenant, digest: "ef".repeat(32) },
    };
    let head_bytes = head.canonical_bytes();
    let head_envelope = envelope_bytes(&sign_envelope(&head_bytes, &authority));

    let header = PolicyHeader {
        policy_version: "fuzz".to_owned(),
        policy_generation: 1,
        authority: "fuzz-authority".to_owned(),
        authority_key_path: AUTHORITY_KEY_FILE.to_owned(),
        authority_key_sha256: sha256_hex(key_file.as_bytes()),
        max_authority_response_age_ms: 30_000,
        not_after: "2030-01-01T00:00:00Z".to_owned(),
    };
    let exposed = [
        ExposedOperation { key: "tools/list".to_owned(), has_side_effect: false, target_kinds: vec![] },
        ExposedOperation {
            key: "tools/call:checkout".to_owned(),
            has_side_effect: true,
            target_kinds: vec![TargetKind::Tool],
        },
    ];
    let policy = PolicyPayload::skeleton(header, exposed);
    let policy_bytes = policy.canonical_bytes();
    let policy_envelope = sign_policy(&policy_bytes, &root, NOW_MS).expect("the fixture policy is valid");
    let loaded = Policy::from_envelope(&policy_envelope, &root.verifying_key(), &trust_root, NOW_MS)
        .expect("the fixture policy loads");
    assert_eq!(loaded.digest(), sha256_hex(&policy_bytes));

    let leaves = [leaf_hash_bytes(b"query-0", &[head_bytes.clone()]), leaf_hash_bytes(b"query-1", &[])];
    let batch = BatchPayload {
        authority: "fuzz-authority".to_owned(),
        batch_id: "01".repeat(16),
        issued_at: "2027-01-15T08:00:00.000Z".to_owned(),
        key_id: batch::key_id(&authority.verifying_key()),
        root: batch::hash_hex(&tree_root(&leaves).expect("two leaves have a root")),
        schema_version: BATCH_SCHEMA_VERSION.to_owned(),
        tree_size: 2,
    };
    let batch_envelope = envelope_bytes(&batch::sign_batch(&batch, &authority));

    Fixture {
        root,
        authority,
        stranger,
        trust_root,
        key_file_sha256: sha256_hex(key_file.as_bytes()),
        head,
        head_bytes,
        head_envelope,
        policy_digest: loaded.digest().to_owned(),
        policy_envelope,
        batch,
        batch_envelope,
    }
}

/// The property; see the module documentation.
pub fn killswitch(data: &[u8]) {
    let fx = fixture();
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 6 {
        0 => {
            fx.check_head_envelope(rest);
            head_payload_round_trip(rest);
        }
        1 => fx.check_head_envelope(&edit(&fx.head_envelope, rest)),
        2 => {
            fx.check_policy_envelope(rest);
            policy_payload_round_trip(rest);
        }
        3 => fx.check_policy_envelope(&edit(&fx.policy_envelope, rest)),
        4 => fx.check_signed_policy_payload(rest),
        _ => {
            fx.check_batch_envelope(&edit(&fx.batch_envelope, rest));
            merkle(rest);
        }
    }
}

impl Fixture {
    fn check_head_envelope(&self, raw: &[u8]) {
        if let Ok(verified) = verify_envelope(raw, &self.authority.verifying_key()) {
            assert_eq!(
                verified.bytes, self.head_bytes,
                "an envelope verified with a payload the authority never signed"
            );
            assert_eq!(verified.digest, sha256_hex(&self.head_bytes));
            let head: HeadPayload = serde_json::from_slice(&verified.bytes).expect("the signed head parses");
            assert!(head == self.head, "the signed head parsed differently");
        }
        assert!(
            verify_envelope(raw, &self.stranger.verifying_key()).is_err(),
            "verified under a key that never signed"
        );
    }

    fn check_policy_envelope(&self, raw: &[u8]) {
        if let Ok(policy) = Policy::from_envelope(raw, &self.root.verifying_key(), &self.trust_root, NOW_MS) {
            assert_eq!(policy.digest(), self.policy_digest, "a policy loaded that the root never signed");
        }
        let stranger = Policy::from_envelope(raw, &self.stranger.verifying_key(), &self.trust_root, NOW_MS);
        assert!(stranger.is_err(), "a policy loaded under a key that never signed");
    }

    fn check_signed_policy_payload(&self, template: &[u8]) {
        let payload = String::from_utf8_lossy(template).replace("$KEY_SHA256", &self.key_file_sha256);
        let payload = payload.as_bytes();
        let envelope = envelope_bytes(&sign_envelope(payload, &self.root));
        let Ok(policy) = Policy::from_envelope(&envelope, &self.root.verifying_key(), &self.trust_root, NOW_MS) else {
            return;
        };
        assert!(policy.authority_key() == &self.authority.verifying_key(), "a policy pinned another authority key");
        assert_eq!(policy.digest(), sha256_hex(payload));
        assert!(!policy.is_expired(NOW_MS), "an expired policy loaded");
        let again: PolicyPayload = serde_json::from_slice(&policy.payload().canonical_bytes())
            .expect("a loaded policy's canonical form parses");
        assert_eq!(&again, policy.payload(), "a loaded policy does not round-trip");
    }

    fn check_batch_envelope(&self, raw: &[u8]) {
        let Ok(envelope) = serde_json::from_slice::<SignedEnvelope>(raw) else { return };
        if let Ok(payload) = batch::verify_batch(&envelope, &self.authority.verifying_key()) {
            assert_eq!(payload, self.batch, "a batch verified that the authority never signed");
        }
        assert!(batch::verify_batch(&envelope, &self.stranger.verifying_key()).is_err(), "verified under another key");
        assert!(batch::verify_batch(&envelope, &self.root.verifying_key()).is_err(), "verified under another key");
    }
}

fn head_payload_round_trip(raw: &[u8]) {
    let Ok(head) = serde_json::from_slice::<HeadPayload>(raw) else { return };
    let again: HeadPayload = serde_json::from_slice(&head.canonical_bytes()).expect("canonical bytes parse");
    assert!(again == head, "a head payload does not round-trip");
    assert_eq!(again.state_digest(), head.state_digest());
}

fn policy_payload_round_trip(raw: &[u8]) {
    let Ok(policy) = serde_json::from_slice::<PolicyPayload>(raw) else { return };
    let again: PolicyPayload = serde_json::from_slice(&policy.canonical_bytes()).expect("canonical bytes parse");
    assert_eq!(again, policy, "a policy payload does not round-trip");
    let _ = policy.validate(NOW_MS);
}

/// Up to 17 distinct leaves cut from the input; every inclusion path leads to the root at its own
/// index only, and flipping one bit of a path (picked by the input) breaks it.
fn merkle(data: &[u8]) {
    let count = 1 + data.first().map_or(0, |&b| usize::from(b) % 17);
    let leaves: Vec<_> = (0..count)
        .map(|index| {
            let chunk = data.get(index * 4..).unwrap_or_default();
            let index_bytes = index.to_be_bytes();
            leaf_hash_bytes(&index_bytes, &[chunk[..chunk.len().min(4)].to_vec()])
        })
        .collect();
    let root = tree_root(&leaves).expect("a non-empty tree has a root");
    let size = u64::try_from(count).expect("a small count");
    for (index, leaf) in leaves.iter().enumerate() {
        let path = inclusion_path(&leaves, index);
        let at = u64::try_from(index).expect("a small index");
        assert_eq!(
            root_from_path(leaf, at, size, &path),
            Some(root),
            "leaf {index} of {count} does not lead to the root"
        );
        if count > 1 {
            let elsewhere = (at + 1) % size;
            assert_ne!(root_from_path(leaf, elsewhere, size, &path), Some(root), "leaf {index} proven at {elsewhere}");
        }
        if !path.is_empty() {
            let pick = data.get(index).map_or(0, |&b| usize::from(b));
            let mut flipped = path.clone();
            let step = pick % flipped.len();
            flipped[step][pick % 32] ^= 1 << (pick % 8);
            assert_ne!(root_from_path(leaf, at, size, &flipped), Some(root), "a flipped path still leads to the root");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(name: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus").join("killswitch").join(name);
        std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    }

    /// The seeds reach the accepting branches: the signed envelopes unedited verify, and the
    /// templated policy payload loads.
    #[test]
    fn the_seeds_reach_the_accepting_branches() {
        let fx = fixture();
        assert!(verify_envelope(&fx.head_envelope, &fx.authority.verifying_key()).is_ok());
        assert_eq!(seed("head_envelope_unedited"), [1]);
        assert_eq!(seed("policy_envelope_unedited"), [3]);
        let signed = seed("signed_policy_valid");
        let payload = String::from_utf8_lossy(&signed[1..]).replace("$KEY_SHA256", &fx.key_file_sha256);
        let envelope = envelope_bytes(&sign_envelope(payload.as_bytes(), &fx.root));
        let loaded = Policy::from_envelope(&envelope, &fx.root.verifying_key(), &fx.trust_root, NOW_MS);
        assert!(loaded.is_ok(), "{loaded:?}");
        for name in ["head_envelope_unedited", "policy_envelope_unedited", "signed_policy_valid", "batch_and_tree"] {
            killswitch(&seed(name));
        }
    }
}
