//! Every kill-switch document written straight from its fields ([`Canonical`]) gives exactly the
//! bytes of the generic RFC 8785 route (`serde_json` value, then the canonicalizer), over
//! documents varied in every field: empty and escaped strings, non-ASCII, control characters,
//! `null` and present tokens, both phases and states, every target kind, integers at and above
//! 2^53 − 1, empty and long lists.

use super::*;
use crate::batch::{BatchItem, BatchPayload, BatchQuery, BatchResponse};
use crate::envelope::SignedEnvelope;
use crate::target::{TargetDigest, TargetKind};

const TEXTS: [&str; 7] =
    ["", "plain", "quote \" and \\ back", "line\nfeed\ttab\u{1}\u{1f}", "é€😀\u{7f}", "</script>", "a/b"];
const NUMBERS: [u64; 6] = [0, 1, 42, 9_007_199_254_740_991, 9_007_199_254_740_993, u64::MAX];

fn text(seed: usize) -> String {
    TEXTS[seed % TEXTS.len()].to_owned()
}

fn target(seed: usize) -> TargetDigest {
    TargetDigest { kind: TargetKind::ALL[seed % TargetKind::ALL.len()], digest: format!("{}{seed:x}", text(seed)) }
}

fn query(seed: usize) -> HeadQuery {
    HeadQuery {
        schema_version: text(seed + 1),
        policy_digest: text(seed + 2),
        policy_generation: NUMBERS[seed % NUMBERS.len()],
        query_nonce: text(seed + 3),
        phase: if seed.is_multiple_of(2) { Phase::PreDispatch } else { Phase::PreSideEffect },
        targets: (0..seed % 4).map(|n| target(seed + n)).collect(),
    }
}

fn head(seed: usize) -> HeadPayload {
    HeadPayload {
        authority: text(seed),
        commit_token: seed.is_multiple_of(3).then(|| text(seed + 4)),
        expires_at: text(seed + 1),
        generation: NUMBERS[(seed + 1) % NUMBERS.len()],
        issued_at: text(seed + 2),
        phase: if seed % 2 == 1 { Phase::PreDispatch } else { Phase::PreSideEffect },
        policy_digest: text(seed + 3),
        policy_generation: NUMBERS[(seed + 2) % NUMBERS.len()],
        query_nonce: text(seed + 5),
        reason_code: text(seed + 6),
        schema_version: text(seed + 4),
        state: if seed.is_multiple_of(2) { TargetState::Enable } else { TargetState::Disable },
        target: target(seed + 7),
    }
}

fn same<T: Canonical + serde::Serialize>(value: &T) {
    let generic = canonical(value);
    assert!(!generic.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&value.canonical_bytes()),
        String::from_utf8_lossy(&generic),
        "the direct writer differs from RFC 8785's generic route"
    );
}

#[test]
fn every_document_writes_the_generic_routes_bytes() {
    for seed in 0..64 {
        same(&target(seed));
        same(&query(seed));
        same(&head(seed));
        let heads: Vec<HeadPayload> = (0..seed % 3).map(|n| head(seed + n)).collect();
        let item = BatchItem {
            heads,
            index: NUMBERS[seed % NUMBERS.len()],
            path: (0..seed % 4).map(|n| text(seed + n)).collect(),
        };
        same(&item);
        same(&BatchQuery { schema_version: text(seed), queries: (0..seed % 3).map(|n| query(seed + n)).collect() });
        let envelope = SignedEnvelope { payload_b64: text(seed), signature_b64: text(seed + 1) };
        same(&envelope);
        same(&BatchResponse { batch: envelope, items: vec![item; seed % 3] });
        same(&BatchPayload {
            authority: text(seed),
            batch_id: text(seed + 1),
            issued_at: text(seed + 2),
            key_id: text(seed + 3),
            root: text(seed + 4),
            schema_version: text(seed + 5),
            tree_size: NUMBERS[(seed + 3) % NUMBERS.len()],
        });
    }
}

/// The state digest is the SHA-256 of the generic route's bytes of exactly its five members.
#[test]
fn the_state_digest_is_over_the_generic_routes_bytes() {
    for seed in 0..32 {
        let head = head(seed);
        let value = serde_json::json!({
            "authority": head.authority,
            "target": head.target,
            "generation": head.generation,
            "state": head.state,
            "reason_code": head.reason_code,
        });
        assert_eq!(head.state_digest(), sha256_hex(&palisade_base::canonical::canonical_bytes(&value)));
    }
}
