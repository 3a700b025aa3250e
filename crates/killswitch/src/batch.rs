//! The batched envelope (`palisade.mcp-disable-batch.v1`): many callers' queries answered with
//! one signature, after Roughtime's design. Each query keeps its own fresh nonce and gets the
//! same head bodies as the single-query envelope (v2); the authority hashes every (query, heads)
//! pair into a leaf, builds an RFC 9162 Merkle tree over the batch and signs its root once.
//!
//! ```text
//! POST /v1/disable/current-heads-batch        (mTLS; canonical JSON)
//! request:  {"schema_version":"palisade.mcp-disable-batch-query.v1","queries":[<v2 query>,…]}
//! response: {"batch":<signed envelope of the batch payload>,
//!            "items":[{"heads":[<head>,…],"index":i,"path":["<64 hex>",…]},…]}   in query order
//! batch:    {"authority","batch_id","issued_at","key_id","root","schema_version","tree_size"}
//!
//! leaf(q, heads) = SHA-256(0x00 ‖ "palisade.mcp-disable-batch-leaf.v1" ‖ 0x00
//!                          ‖ u32be(len q) ‖ q ‖ u32be(count) ‖ (u32be(len h) ‖ h)…)
//!                  q, h: canonical JSON (RFC 8785) of the query and of each head payload
//! node(L, R)     = SHA-256(0x01 ‖ L ‖ R)                          (RFC 9162 §2.1.1)
//! tree           = RFC 9162 MTH: split at the largest power of two below n, no padding
//! signature      = Ed25519(BATCH_SIGNING_CONTEXT ‖ canonical JSON of the batch payload)
//! key_id         = SHA-256 of the 32-byte Ed25519 public key, lowercase hex
//! ```
//!
//! The context prefix keeps a batch signature from ever verifying as a v2 head (signed over the
//! bare payload bytes) and the other way round. The caller checks its own item: index below the
//! signed tree size, a path exactly as long as RFC 9162 §2.1.3.2 needs for that index and size,
//! the leaf recomputed from the query *it sent* and the heads it got, folded to the signed root.
//! A defect in one item fails that item's caller only.
//!
//! Own-written rather than a crate: the tree hash and the inclusion-proof check are a few dozen
//! lines over the SHA-256 this crate already uses (aws-lc-rs); the Merkle crates on offer bring
//! a second hash stack and their own leaf encodings, and ours must be pinned byte for byte
//! anyway (the test vectors in `tests/vectors/batch-v1.json`; Roughtime implementations
//! disagreed on sibling order).

use aws_lc_rs::digest;
use ed25519_dalek::{Signature, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::b64;
use crate::envelope::{EnvelopeError, SignedEnvelope};
use palisade_base::canonical::CanonicalObject;

use crate::head::{Canonical, HeadPayload, HeadQuery};
use crate::keys::Ed25519SigningKey;
use crate::target::hex;

/// The batch request's `schema_version`.
pub const BATCH_QUERY_SCHEMA_VERSION: &str = "palisade.mcp-disable-batch-query.v1";
/// The signed batch payload's `schema_version`.
pub const BATCH_SCHEMA_VERSION: &str = "palisade.mcp-disable-batch.v1";
/// Prefixed to the batch payload before signing (distinct from v2, which signs the bare head).
pub const BATCH_SIGNING_CONTEXT: &[u8] = b"palisade.mcp-disable-batch.v1 signature\0";
/// The leaf's domain label (after the RFC 9162 leaf prefix 0x00).
pub const LEAF_DOMAIN: &[u8] = b"palisade.mcp-disable-batch-leaf.v1\0";
/// The batch endpoint's path.
pub const BATCH_PATH: &str = "/v1/disable/current-heads-batch";
/// Most queries in one batch (a path is at most 10 hashes).
pub const MAX_BATCH_QUERIES: usize = 1024;

/// A 32-byte hash.
pub type Hash = [u8; 32];

/// The batch request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchQuery {
    /// [`BATCH_QUERY_SCHEMA_VERSION`].
    pub schema_version: String,
    /// The queries, each exactly a v2 query with its own nonce.
    pub queries: Vec<HeadQuery>,
}

/// The batch response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchResponse {
    /// The signed batch payload ([`BatchPayload`], signed under [`BATCH_SIGNING_CONTEXT`]).
    pub batch: SignedEnvelope,
    /// One item per query, in query order.
    pub items: Vec<BatchItem>,
}

/// One query's answer inside a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    /// The heads, one per queried target, in query order (unsigned individually).
    pub heads: Vec<HeadPayload>,
    /// The leaf's index in the tree.
    pub index: u64,
    /// The inclusion path, lowercase hex, leaf level first.
    pub path: Vec<String>,
}

/// The signed batch payload: exactly these fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchPayload {
    /// The authority id.
    pub authority: String,
    /// A fresh random id (32 lowercase hex), for logs and correlation.
    pub batch_id: String,
    /// RFC 3339 UTC: when the batch was answered.
    pub issued_at: String,
    /// [`key_id`] of the signing key.
    pub key_id: String,
    /// The tree's root, lowercase hex.
    pub root: String,
    /// [`BATCH_SCHEMA_VERSION`].
    pub schema_version: String,
    /// How many leaves the tree has.
    pub tree_size: u64,
}

impl Canonical for BatchQuery {
    fn write_members(&self, object: &mut CanonicalObject<'_>) {
        object.objects("queries", &self.queries, |object, query| query.write_members(object));
        object.text("schema_version", &self.schema_version);
    }
}

impl Canonical for BatchItem {
    fn write_members(&self, object: &mut CanonicalObject<'_>) {
        object.objects("heads", &self.heads, |object, head| head.write_members(object));
        object.unsigned("index", self.index);
        object.texts("path", &self.path);
    }
}

impl Canonical for SignedEnvelope {
    fn write_members(&self, object: &mut CanonicalObject<'_>) {
        object.text("payload_b64", &self.payload_b64);
        object.text("signature_b64", &self.signature_b64);
    }
}

impl Canonical for BatchResponse {
    fn write_members(&self, object: &mut CanonicalObject<'_>) {
        object.object("batch", |batch| self.batch.write_members(batch));
        object.objects("items", &self.items, |object, item| item.write_members(object));
    }
}

impl Canonical for BatchPayload {
    fn write_members(&self, object: &mut CanonicalObject<'_>) {
        object.text("authority", &self.authority);
        object.text("batch_id", &self.batch_id);
        object.text("issued_at", &self.issued_at);
        object.text("key_id", &self.key_id);
        object.text("root", &self.root);
        object.text("schema_version", &self.schema_version);
        object.unsigned("tree_size", self.tree_size);
    }
}

fn sha256(parts: &[&[u8]]) -> Hash {
    let mut context = digest::Context::new(&digest::SHA256);
    for part in parts {
        context.update(part);
    }
    let mut out = [0_u8; 32];
    out.copy_from_slice(context.finish().as_ref());
    out
}

fn length_prefix(length: usize) -> [u8; 4] {
    // Bodies are capped far below 4 GiB; saturate rather than wrap.
    u32::try_from(length).unwrap_or(u32::MAX).to_be_bytes()
}

/// The leaf hash of one query's bytes and its heads' bytes (both canonical JSON).
pub fn leaf_hash_bytes(query: &[u8], heads: &[Vec<u8>]) -> Hash {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(5 + 2 * heads.len());
    let query_length = length_prefix(query.len());
    let count = length_prefix(heads.len());
    let head_lengths: Vec<[u8; 4]> = heads.iter().map(|head| length_prefix(head.len())).collect();
    parts.extend([&[0_u8][..], LEAF_DOMAIN, &query_length, query, &count]);
    for (length, head) in head_lengths.iter().zip(heads) {
        parts.push(length);
        parts.push(head);
    }
    sha256(&parts)
}

/// The leaf hash of a query and its heads.
pub fn leaf_hash(query: &HeadQuery, heads: &[HeadPayload]) -> Hash {
    let heads: Vec<Vec<u8>> = heads.iter().map(HeadPayload::canonical_bytes).collect();
    leaf_hash_bytes(&query.canonical_bytes(), &heads)
}

/// An interior node: SHA-256(0x01 ‖ left ‖ right).
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    sha256(&[&[1_u8], left, right])
}

/// RFC 9162 MTH over leaf hashes (`None` for an empty list: a batch is never empty).
pub fn tree_root(leaves: &[Hash]) -> Option<Hash> {
    palisade_base::merkle::tree_root(leaves, &node_hash)
}

/// RFC 9162 §2.1.3.1 PATH(index, leaves): the inclusion path, leaf level first.
pub fn inclusion_path(leaves: &[Hash], index: usize) -> Vec<Hash> {
    let mut path = Vec::new();
    collect_path(leaves, index, &mut path);
    path
}

fn collect_path(leaves: &[Hash], index: usize, path: &mut Vec<Hash>) {
    if leaves.len() <= 1 || index >= leaves.len() {
        return;
    }
    let k = palisade_base::merkle::split(leaves.len());
    if index < k {
        collect_path(&leaves[..k], index, path);
        path.extend(tree_root(&leaves[k..]));
    } else {
        collect_path(&leaves[k..], index - k, path);
        path.extend(tree_root(&leaves[..k]));
    }
}

/// Every leaf's path at once (one pass per level instead of one tree walk per leaf).
pub fn all_paths(leaves: &[Hash]) -> (Option<Hash>, Vec<Vec<Hash>>) {
    let mut paths = vec![Vec::new(); leaves.len()];
    let root = fill_paths(leaves, 0, &mut paths);
    (root, paths)
}

fn fill_paths(leaves: &[Hash], offset: usize, paths: &mut [Vec<Hash>]) -> Option<Hash> {
    match leaves {
        [] => None,
        [leaf] => Some(*leaf),
        _ => {
            let k = palisade_base::merkle::split(leaves.len());
            let left = fill_paths(&leaves[..k], offset, paths)?;
            let right = fill_paths(&leaves[k..], offset + k, paths)?;
            for path in paths.get_mut(offset..offset + k).into_iter().flatten() {
                path.push(right);
            }
            for path in paths.get_mut(offset + k..offset + leaves.len()).into_iter().flatten() {
                path.push(left);
            }
            Some(node_hash(&left, &right))
        }
    }
}

/// RFC 9162 §2.1.3.2: folds `path` from `leaf` at `index` in a tree of `tree_size` leaves.
/// `None` when the index is out of range or the path is not exactly as long as required.
pub fn root_from_path(leaf: &Hash, index: u64, tree_size: u64, path: &[Hash]) -> Option<Hash> {
    if index >= tree_size {
        return None;
    }
    let (mut fn_, mut sn) = (index, tree_size - 1);
    let mut r = *leaf;
    for p in path {
        if sn == 0 {
            return None;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = node_hash(p, &r);
            while fn_ & 1 == 0 && fn_ != 0 {
                fn_ >>= 1;
                sn >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    (sn == 0).then_some(r)
}

/// The key id: SHA-256 of the raw public key, lowercase hex.
pub fn key_id(key: &VerifyingKey) -> String {
    hex(&sha256(&[key.as_bytes()]))
}

/// The exact bytes the batch signature covers.
pub fn signing_message(payload_bytes: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(BATCH_SIGNING_CONTEXT.len() + payload_bytes.len());
    message.extend_from_slice(BATCH_SIGNING_CONTEXT);
    message.extend_from_slice(payload_bytes);
    message
}

/// Signs a batch payload under [`BATCH_SIGNING_CONTEXT`].
pub fn sign_batch(payload: &BatchPayload, key: &Ed25519SigningKey) -> SignedEnvelope {
    let bytes = payload.canonical_bytes();
    let signature = key.sign(&signing_message(&bytes));
    SignedEnvelope { payload_b64: b64::encode(&bytes), signature_b64: b64::encode(&signature) }
}

/// Verifies a batch envelope (`verify_strict` over context ‖ payload) and parses its payload.
pub fn verify_batch(envelope: &SignedEnvelope, key: &VerifyingKey) -> Result<BatchPayload, EnvelopeError> {
    let bytes = b64::decode_canonical(&envelope.payload_b64)
        .map_err(|error| EnvelopeError::Base64 { field: "payload_b64", error })?;
    let signature = b64::decode_canonical(&envelope.signature_b64)
        .map_err(|error| EnvelopeError::Base64 { field: "signature_b64", error })?;
    let signature = Signature::from_slice(&signature).map_err(|_| EnvelopeError::Signature)?;
    key.verify_strict(&signing_message(&bytes), &signature).map_err(|_| EnvelopeError::Signature)?;
    // The signed bytes must be the canonical spelling of the payload (one spelling per batch).
    let payload: BatchPayload = serde_json::from_slice(&bytes).map_err(|_| EnvelopeError::Schema)?;
    if payload.canonical_bytes() != bytes {
        return Err(EnvelopeError::Schema);
    }
    Ok(payload)
}

/// Parses a 64-hex-digit hash.
pub fn parse_hash(text: &str) -> Option<Hash> {
    if text.len() != 64 || !crate::target::is_lower_hex(text, 64) {
        return None;
    }
    let mut out = [0_u8; 32];
    for (index, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * index..2 * index + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A hash as lowercase hex.
pub fn hash_hex(hash: &Hash) -> String {
    hex(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(n: u8) -> Vec<Hash> {
        (0..n).map(|i| sha256(&[&[i]])).collect()
    }

    #[test]
    fn every_path_folds_to_the_root_and_only_at_its_index_and_size() {
        for n in 1..=17_u8 {
            let leaves = leaves(n);
            let root = tree_root(&leaves).unwrap();
            let (same_root, paths) = all_paths(&leaves);
            assert_eq!(same_root, Some(root));
            let size = u64::from(n);
            for (index, leaf) in leaves.iter().enumerate() {
                let path = inclusion_path(&leaves, index);
                assert_eq!(path, paths[index], "n={n} i={index}");
                let at = u64::try_from(index).unwrap();
                assert_eq!(root_from_path(leaf, at, size, &path), Some(root), "n={n} i={index}");
                assert_eq!(root_from_path(leaf, size, size, &path), None);
                let mut longer = path.clone();
                longer.push(root);
                assert_eq!(root_from_path(leaf, at, size, &longer), None);
                if !path.is_empty() {
                    assert_eq!(root_from_path(leaf, at, size, &path[..path.len() - 1]), None);
                }
                if n > 1 {
                    let other = (index + 1) % leaves.len();
                    assert_ne!(root_from_path(&leaves[other], at, size, &path), Some(root));
                }
            }
        }
    }

    #[test]
    fn node_order_is_left_then_right() {
        let [a, b] = [sha256(&[b"a"]), sha256(&[b"b"])];
        let mut input = vec![1_u8];
        input.extend_from_slice(&a);
        input.extend_from_slice(&b);
        assert_eq!(node_hash(&a, &b), sha256(&[&input]));
        assert_eq!(tree_root(&[a, b]), Some(node_hash(&a, &b)));
        assert_eq!(inclusion_path(&[a, b], 0), vec![b]);
        assert_eq!(inclusion_path(&[a, b], 1), vec![a]);
    }
}
