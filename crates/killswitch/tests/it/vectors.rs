//! Test vectors of the batched envelope (`tests/vectors/batch-v1.json`): the leaf, node and
//! signed-payload encodings, RFC 9162 roots and inclusion paths for trees of 1 to 7 leaves. The
//! committed file is checked against the library, and the library against hand-built bytes and
//! hand-derived RFC 9162 shapes (sibling order pinned: Roughtime drafts flipped it).
//! `PALISADE_WRITE_VECTORS=1 cargo test -p palisade-killswitch --test it vectors` rewrites the file
//! (a deliberate wire change), then checks it like any run.

use aws_lc_rs::digest;
use palisade_killswitch::batch::{
    BATCH_SCHEMA_VERSION, BATCH_SIGNING_CONTEXT, BatchPayload, Hash, LEAF_DOMAIN, hash_hex, inclusion_path, key_id,
    leaf_hash, leaf_hash_bytes, node_hash, root_from_path, sign_batch, signing_message, tree_root, verify_batch,
};
use palisade_killswitch::envelope::{EnvelopeError, sign_envelope};
use palisade_killswitch::head::{HeadPayload, HeadQuery};
use palisade_killswitch::{Ed25519SigningKey, Phase, TargetDigest, TargetKind, TargetState};
use serde_json::{Value, json};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/batch-v1.json");
const SEED: [u8; 32] = [7; 32];

fn sha(parts: &[&[u8]]) -> Hash {
    let mut context = digest::Context::new(&digest::SHA256);
    for part in parts {
        context.update(part);
    }
    context.finish().as_ref().try_into().unwrap()
}

fn target(kind: TargetKind, fill: char) -> TargetDigest {
    TargetDigest { kind, digest: fill.to_string().repeat(64) }
}

fn query() -> HeadQuery {
    HeadQuery {
        schema_version: "palisade.mcp-disable-query.v2".to_owned(),
        policy_digest: "a".repeat(64),
        policy_generation: 3,
        query_nonce: "0123456789abcdef".repeat(4),
        phase: Phase::PreSideEffect,
        targets: vec![target(TargetKind::ServerRelease, 'b'), target(TargetKind::Tool, 'c')],
    }
}

fn heads(query: &HeadQuery) -> Vec<HeadPayload> {
    query
        .targets
        .iter()
        .enumerate()
        .map(|(index, target)| HeadPayload {
            authority: "disable-authority.example".to_owned(),
            commit_token: Some(format!("{index}").repeat(64)),
            expires_at: "2026-12-01T00:00:30.000Z".to_owned(),
            generation: 1 + u64::try_from(index).unwrap(),
            issued_at: "2026-12-01T00:00:00.000Z".to_owned(),
            phase: query.phase,
            policy_digest: query.policy_digest.clone(),
            policy_generation: query.policy_generation,
            query_nonce: query.query_nonce.clone(),
            reason_code: "default_enable".to_owned(),
            schema_version: "aidefend.mcp-disable-head.v2".to_owned(),
            state: TargetState::Enable,
            target: target.clone(),
        })
        .collect()
}

/// Leaf i of the tree vectors: the leaf of query bytes `q<i>` with one head `h<i>`.
fn tree_leaf(index: usize) -> Hash {
    leaf_hash_bytes(format!("q{index}").as_bytes(), &[format!("h{index}").into_bytes()])
}

fn payload(root: &Hash) -> BatchPayload {
    let key = Ed25519SigningKey::from_seed(&SEED);
    BatchPayload {
        authority: "disable-authority.example".to_owned(),
        batch_id: "f".repeat(32),
        issued_at: "2026-12-01T00:00:00.000Z".to_owned(),
        key_id: key_id(&key.verifying_key()),
        root: hash_hex(root),
        schema_version: BATCH_SCHEMA_VERSION.to_owned(),
        tree_size: 7,
    }
}

fn build() -> Value {
    let query = query();
    let heads = heads(&query);
    let query_bytes = palisade_base::canonical::canonical_bytes(&serde_json::to_value(&query).unwrap());
    let head_bytes: Vec<String> = heads.iter().map(|head| String::from_utf8(head.canonical_bytes()).unwrap()).collect();
    let (left, right) = (sha(&[b"left"]), sha(&[b"right"]));
    let trees: Vec<Value> = (1..=7)
        .map(|size| {
            let leaves: Vec<Hash> = (0..size).map(tree_leaf).collect();
            json!({
                "size": size,
                "leaves": leaves.iter().map(hash_hex).collect::<Vec<_>>(),
                "root": hash_hex(&tree_root(&leaves).unwrap()),
                "paths": (0..size).map(|index| inclusion_path(&leaves, index).iter().map(hash_hex).collect::<Vec<_>>()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let leaves7: Vec<Hash> = (0..7).map(tree_leaf).collect();
    let payload = payload(&tree_root(&leaves7).unwrap());
    let key = Ed25519SigningKey::from_seed(&SEED);
    let envelope = sign_batch(&payload, &key);
    let payload_bytes = palisade_base::canonical::canonical_bytes(&serde_json::to_value(&payload).unwrap());
    json!({
        "description": "palisade.mcp-disable-batch.v1: leaf = SHA-256(0x00 || leaf_domain || u32be(len q) || q || u32be(n) || (u32be(len h) || h)*); node = SHA-256(0x01 || L || R); RFC 9162 tree; signature = Ed25519(signing_context || payload)",
        "leaf_domain_hex": palisade_base::hex::hex(LEAF_DOMAIN),
        "signing_context_hex": palisade_base::hex::hex(BATCH_SIGNING_CONTEXT),
        "leaf": {
            "query": String::from_utf8(query_bytes).unwrap(),
            "heads": head_bytes,
            "hash": hash_hex(&leaf_hash(&query, &heads)),
        },
        "node": { "left": hash_hex(&left), "right": hash_hex(&right), "hash": hash_hex(&node_hash(&left, &right)) },
        "trees": trees,
        "signed_payload": {
            "ed25519_seed_hex": palisade_base::hex::hex(&SEED),
            "public_key_b64": key.public_key_base64(),
            "payload": String::from_utf8(payload_bytes.clone()).unwrap(),
            "signed_message_hex": palisade_base::hex::hex(&signing_message(&payload_bytes)),
            "envelope": envelope,
        },
    })
}

#[test]
fn the_committed_vectors_match_the_library() {
    if std::env::var_os("PALISADE_WRITE_VECTORS").is_some() {
        let text = serde_json::to_string_pretty(&build()).unwrap();
        std::fs::write(FILE, format!("{text}\n")).unwrap();
    }
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(FILE).unwrap()).unwrap();
    assert_eq!(committed, build(), "the batch encodings changed: a wire break");
    // Every committed path folds to its committed root (the verifier, against the file).
    for tree in committed["trees"].as_array().unwrap() {
        let size = tree["size"].as_u64().unwrap();
        let parse = |value: &Value| palisade_killswitch::batch::parse_hash(value.as_str().unwrap()).unwrap();
        let root = parse(&tree["root"]);
        for (index, (leaf, path)) in
            tree["leaves"].as_array().unwrap().iter().zip(tree["paths"].as_array().unwrap()).enumerate()
        {
            let path: Vec<Hash> = path.as_array().unwrap().iter().map(parse).collect();
            assert_eq!(
                root_from_path(&parse(leaf), index as u64, size, &path),
                Some(root),
                "size {size} index {index}"
            );
        }
    }
    // The committed envelope verifies under the batch context.
    let envelope = serde_json::from_value(committed["signed_payload"]["envelope"].clone()).unwrap();
    let key = Ed25519SigningKey::from_seed(&SEED).verifying_key();
    assert_eq!(
        serde_json::to_value(verify_batch(&envelope, &key).unwrap()).unwrap().to_string(),
        committed["signed_payload"]["payload"].as_str().unwrap()
    );
}

#[test]
fn the_encodings_are_the_documented_bytes() {
    // Leaf: built by hand from the documented layout.
    let query = query();
    let heads = heads(&query);
    let q = palisade_base::canonical::canonical_bytes(&serde_json::to_value(&query).unwrap());
    let h: Vec<Vec<u8>> = heads.iter().map(HeadPayload::canonical_bytes).collect();
    let mut bytes = vec![0_u8];
    bytes.extend_from_slice(b"palisade.mcp-disable-batch-leaf.v1\0");
    bytes.extend_from_slice(&u32::try_from(q.len()).unwrap().to_be_bytes());
    bytes.extend_from_slice(&q);
    bytes.extend_from_slice(&2_u32.to_be_bytes());
    for head in &h {
        bytes.extend_from_slice(&u32::try_from(head.len()).unwrap().to_be_bytes());
        bytes.extend_from_slice(head);
    }
    assert_eq!(leaf_hash(&query, &heads), sha(&[&bytes]));

    // Node: 0x01, then left, then right.
    let l: Vec<Hash> = (0..5).map(tree_leaf).collect();
    let node = |a: &Hash, b: &Hash| sha(&[&[1], a, b]);
    assert_eq!(node_hash(&l[0], &l[1]), node(&l[0], &l[1]));
    // RFC 9162 shapes, derived by hand: split at the largest power of two below n, no padding.
    assert_eq!(tree_root(&l[..3]), Some(node(&node(&l[0], &l[1]), &l[2])));
    let four = node(&node(&l[0], &l[1]), &node(&l[2], &l[3]));
    assert_eq!(tree_root(&l[..5]), Some(node(&four, &l[4])));
    assert_eq!(inclusion_path(&l[..3], 0), vec![l[1], l[2]]);
    assert_eq!(inclusion_path(&l[..3], 2), vec![node(&l[0], &l[1])]);
    assert_eq!(inclusion_path(&l[..5], 4), vec![four]);
    assert_eq!(inclusion_path(&l[..5], 2), vec![l[3], node(&l[0], &l[1]), l[4]]);
    assert!(inclusion_path(&l[..1], 0).is_empty());

    // Signature: Ed25519 over the context, then the canonical payload.
    let key = Ed25519SigningKey::from_seed(&SEED);
    let payload = payload(&four);
    let envelope = sign_batch(&payload, &key);
    let payload_bytes = palisade_base::canonical::canonical_bytes(&serde_json::to_value(&payload).unwrap());
    let mut message = b"palisade.mcp-disable-batch.v1 signature\0".to_vec();
    message.extend_from_slice(&payload_bytes);
    assert_eq!(signing_message(&payload_bytes), message);
    assert_eq!(verify_batch(&envelope, &key.verifying_key()).unwrap(), payload);
    // The same payload signed the v2 way (bare bytes, no context) does not verify as a batch.
    let v2 = sign_envelope(&payload_bytes, &key);
    assert_eq!(verify_batch(&v2, &key.verifying_key()), Err(EnvelopeError::Signature));
}
