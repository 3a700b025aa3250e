//! Signed checkpoints over every chain's head, and verifying the whole log against them.
//!
//! A checkpoint signs (Ed25519, a deployment key) the Merkle root in RFC 9162 shape over every
//! chain's head — leaf `chain id (32 ASCII bytes) || seq (u64 big-endian) || hash` — with the
//! number of chains and records, the time, its own sequence number and the hash of the checkpoint
//! before it. Stored with it is the delta: the heads that changed since the previous checkpoint,
//! from which a verifier rebuilds the leaves. One instance at a time signs (a lease in the store
//! that any instance takes over once it runs out); [`verify_log`] walks the checkpoints and then
//! every chain, so that deleting, editing, reordering or truncating anything a checkpoint covers
//! is found, as is a chain that disappeared or went backwards.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::digest;
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use crate::store::StoredCheckpoint;
use crate::{AuditStore, ChainHead, ChainReport, CheckpointedHeads, StoreError, is_chain_id};

/// Most checkpoints read per page while verifying.
const CHECKPOINT_PAGE: u32 = 1000;

/// What a checkpoint signs. Field order is the canonical (sorted) key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointBody {
    /// When it was signed, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Chains with at least one record.
    pub chains: u64,
    /// The signing key's id: the first 16 hex characters of SHA-256 over the public key.
    pub key: String,
    /// SHA-256 (hex) of the previous checkpoint's body; 64 zeros for the first.
    pub prev: String,
    /// Records over every chain (the sum of the heads' sequence numbers).
    pub records: u64,
    /// The Merkle root (hex) over every chain's head.
    pub root: String,
    /// This checkpoint's sequence number.
    pub seq: u64,
    /// Format version: 1.
    pub v: u32,
}

impl CheckpointBody {
    fn canonical(&self) -> String {
        // Fields are declared in key order, ASCII strings and integers below 2^53: serde_json's
        // compact output is the RFC 8785 form.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// SHA-256 (hex) of a checkpoint's body: the next checkpoint's `prev`.
pub fn checkpoint_hash(body: &str) -> String {
    palisade_base::hex::hex(digest::digest(&digest::SHA256, body.as_bytes()).as_ref())
}

/// The deployment key that signs checkpoints.
#[derive(Clone)]
pub struct CheckpointKey {
    signing: SigningKey,
}

impl std::fmt::Debug for CheckpointKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("CheckpointKey").field("id", &key_id(&self.verifying())).finish()
    }
}

impl CheckpointKey {
    /// The key of a 32-byte Ed25519 seed (e.g. derived from the deployment's server secret).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        CheckpointKey { signing: SigningKey::from_bytes(&seed) }
    }

    /// The public half, which verifies checkpoints.
    pub fn verifying(&self) -> VerifyingKey {
        self.signing.verifying_key()
    }
}

/// A key's id: the first 16 hex characters of SHA-256 over its 32 public bytes.
pub fn key_id(key: &VerifyingKey) -> String {
    let mut id = palisade_base::hex::hex(digest::digest(&digest::SHA256, key.as_bytes()).as_ref());
    id.truncate(16);
    id
}

/// The RFC 9162 Merkle tree hash over `heads` (sorted by chain id by the caller).
pub fn merkle_root<'a>(heads: impl ExactSizeIterator<Item = (&'a str, u64, &'a [u8; 32])>) -> [u8; 32] {
    let leaves: Vec<[u8; 32]> = heads
        .map(|(chain, seq, hash)| {
            let mut context = digest::Context::new(&digest::SHA256);
            context.update(&[0x00]);
            context.update(chain.as_bytes());
            context.update(&seq.to_be_bytes());
            context.update(hash);
            finish(context)
        })
        .collect();
    let node = |left: &[u8; 32], right: &[u8; 32]| {
        let mut context = digest::Context::new(&digest::SHA256);
        context.update(&[0x01]);
        context.update(left);
        context.update(right);
        finish(context)
    };
    // No chain yet: SHA-256 of the empty string, as RFC 9162 defines the empty tree.
    palisade_base::merkle::tree_root(&leaves, &node).unwrap_or_else(|| finish(digest::Context::new(&digest::SHA256)))
}

fn finish(context: digest::Context) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(context.finish().as_ref());
    out
}

fn encode_delta(heads: &[ChainHead]) -> String {
    let entries: Vec<(&str, u64, String)> =
        heads.iter().map(|head| (head.chain.as_str(), head.seq, palisade_base::hex::hex(&head.hash))).collect();
    serde_json::to_string(&entries).unwrap_or_default()
}

fn decode_delta(text: &str) -> Option<Vec<(String, u64, [u8; 32])>> {
    let entries: Vec<(String, u64, String)> = serde_json::from_str(text).ok()?;
    let mut out = Vec::with_capacity(entries.len());
    for (chain, seq, hash) in entries {
        if !is_chain_id(&chain) || seq == 0 {
            return None;
        }
        out.push((chain, seq, palisade_base::hex::decode32(&hash)?));
    }
    // Sorted and without duplicates, as signers write it.
    out.windows(2).all(|pair| pair[0].0 < pair[1].0).then_some(out)
}

/// Signs a checkpoint over the store's current heads if any changed since the latest one (or
/// none exists yet and some chain has records), holding the signer lease as `holder`.
/// `Ok(Some(seq))`: checkpoint `seq` was stored; `Ok(None)`: not this instance's turn, or
/// nothing new.
pub async fn checkpoint_once(
    store: &dyn AuditStore,
    key: &CheckpointKey,
    holder: &str,
    now_ms: u64,
    lease: Duration,
) -> Result<Option<u64>, StoreError> {
    let now = i64::try_from(now_ms).map_err(|_| StoreError::InvalidRecord { reason: "time out of range" })?;
    let until = now.saturating_add(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX));
    if !store.claim_checkpointer(holder, now, until).await? {
        return Ok(None);
    }
    let heads = store.chain_heads().await?;
    let latest = store.latest_checkpoint().await?;
    let delta: Vec<ChainHead> = heads.iter().filter(|head| head.seq != head.checkpointed_seq).cloned().collect();
    if delta.is_empty() {
        return Ok(None);
    }
    let (seq, prev) = match &latest {
        Some(latest) => (latest.seq + 1, checkpoint_hash(&latest.body)),
        None => (1, "0".repeat(64)),
    };
    let root = merkle_root(heads.iter().map(|head| (head.chain.as_str(), head.seq, &head.hash)));
    let body = CheckpointBody {
        at_ms: now_ms,
        chains: heads.len() as u64,
        key: key_id(&key.verifying()),
        prev,
        records: heads.iter().map(|head| head.seq).sum(),
        root: palisade_base::hex::hex(&root),
        seq,
        v: 1,
    };
    let text = body.canonical();
    let signature = key.signing.sign(text.as_bytes()).to_bytes().to_vec();
    let checkpoint = StoredCheckpoint { seq, at_ms: now_ms, body: text, signature, delta: encode_delta(&delta) };
    let hash = checkpoint_hash(&checkpoint.body);
    if store.add_checkpoint(checkpoint, delta).await? {
        // The log line is a witness outside the store: an operator who ships logs elsewhere can
        // later show a checkpoint the store no longer has.
        tracing::info!(seq, chains = body.chains, records = body.records, root = %body.root, %hash, "audit checkpoint signed");
        Ok(Some(seq))
    } else {
        Ok(None)
    }
}

/// Signs checkpoints in the background (see [`checkpoint_once`]) until stopped.
#[derive(Debug)]
pub struct Checkpointer {
    stop: watch::Sender<bool>,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    /// Tries every `every` (at least 100 ms) to sign a checkpoint as `holder`; the lease lasts
    /// three intervals (at least 3 s), so another instance takes over that long after this one
    /// stops. Failures are logged and tried again at the next tick. Call inside a Tokio runtime.
    pub fn spawn(store: Arc<dyn AuditStore>, key: CheckpointKey, holder: String, every: Duration) -> Self {
        let every = every.max(Duration::from_millis(100));
        let lease = (every * 3).max(Duration::from_secs(3));
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let last = tokio::select! {
                    _ = ticker.tick() => false,
                    _ = stopped.changed() => true,
                };
                // The last turn at shutdown covers what the writer shipped while stopping.
                let turn = checkpoint_once(store.as_ref(), &key, &holder, now_ms(), lease);
                match tokio::time::timeout(Duration::from_secs(3), turn).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => tracing::warn!(%error, "could not sign an audit checkpoint; trying again"),
                    Err(_) => tracing::warn!("signing an audit checkpoint timed out; trying again"),
                }
                if last {
                    return;
                }
            }
        });
        Checkpointer { stop, task: std::sync::Mutex::new(Some(task)) }
    }

    /// Signs a last checkpoint if it is this instance's turn (call after the writer has shipped
    /// what it could) and stops; the lease runs out on its own.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let task = match self.task.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

fn now_ms() -> u64 {
    use palisade_base::clock::Clock as _;
    u64::try_from(palisade_base::clock::SystemClock.now_ms()).unwrap_or(0)
}

/// The newest checkpoint [`verify_log`] accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSummary {
    /// Its sequence number.
    pub seq: u64,
    /// When it was signed.
    pub at_ms: u64,
    /// Chains it covers.
    pub chains: u64,
    /// Records it covers.
    pub records: u64,
    /// SHA-256 (hex) of its body: compare with a copy kept elsewhere (the signer's log line).
    pub hash: String,
}

/// Where the checkpoints first fail to verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointBreak {
    /// The checkpoint's sequence number (the one expected, for a missing one).
    pub seq: u64,
    /// What is wrong.
    pub reason: &'static str,
}

/// What [`verify_log`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogReport {
    /// The walk of every chain, with every checkpointed hash compared.
    pub chains: ChainReport,
    /// Checkpoints verified.
    pub checkpoints: u64,
    /// The newest of them.
    pub last: Option<CheckpointSummary>,
    /// The first checkpoint that does not verify, if any (the chain walk then uses only the
    /// checkpoints before it).
    pub checkpoint_break: Option<CheckpointBreak>,
}

impl LogReport {
    /// True when every checkpoint and every chain verified.
    pub fn is_intact(&self) -> bool {
        self.checkpoint_break.is_none() && self.chains.is_intact()
    }
}

/// Verifies every checkpoint (sequence without gaps, each linked to the one before, signed by
/// `key`, its root recomputed from the heads its and the earlier deltas name, heads never going
/// backwards) and then every chain, comparing each checkpointed head with its stored record.
pub async fn verify_log(store: &dyn AuditStore, key: &VerifyingKey) -> Result<LogReport, StoreError> {
    let expected_key = key_id(key);
    let mut leaves: BTreeMap<String, (u64, [u8; 32])> = BTreeMap::new();
    let mut checkpointed = CheckpointedHeads::new();
    let mut prev = "0".repeat(64);
    let mut count = 0u64;
    let mut last = None;
    let mut checkpoint_break = None;
    let mut after = 0u64;
    'pages: loop {
        let page = store.checkpoints(after, CHECKPOINT_PAGE).await?;
        let full = page.len() == CHECKPOINT_PAGE as usize;
        for checkpoint in page {
            let expected_seq = after + 1;
            after = checkpoint.seq;
            let fail = |seq, reason| Some(CheckpointBreak { seq, reason });
            if checkpoint.seq != expected_seq {
                checkpoint_break = fail(expected_seq, "checkpoint missing (deleted)");
                break 'pages;
            }
            let body: CheckpointBody = match serde_json::from_str(&checkpoint.body) {
                Ok(body) => body,
                Err(_) => {
                    checkpoint_break = fail(checkpoint.seq, "body is not a checkpoint");
                    break 'pages;
                }
            };
            let problem = if body.canonical() != checkpoint.body {
                Some("body is not in canonical form")
            } else if body.v != 1 {
                Some("unknown checkpoint version")
            } else if body.seq != checkpoint.seq || body.at_ms != checkpoint.at_ms {
                Some("stored columns differ from the signed body")
            } else if body.key != expected_key {
                Some("signed by another key")
            } else if !signature_ok(key, &checkpoint) {
                Some("signature does not verify")
            } else if body.prev != prev {
                Some("does not link to the previous checkpoint")
            } else {
                None
            };
            if let Some(reason) = problem {
                checkpoint_break = fail(checkpoint.seq, reason);
                break 'pages;
            }
            let Some(delta) = decode_delta(&checkpoint.delta) else {
                checkpoint_break = fail(checkpoint.seq, "delta is malformed");
                break 'pages;
            };
            let mut backwards = false;
            for (chain, seq, hash) in &delta {
                if leaves.get(chain).is_some_and(|(before, _)| *before >= *seq) {
                    backwards = true;
                }
                leaves.insert(chain.clone(), (*seq, *hash));
            }
            let root = merkle_root(leaves.iter().map(|(chain, (seq, hash))| (chain.as_str(), *seq, hash)));
            let records: u64 = leaves.values().map(|(seq, _)| *seq).sum();
            let problem = if backwards {
                Some("a chain's head goes backwards")
            } else if palisade_base::hex::hex(&root) != body.root {
                Some("root does not match the heads its deltas name")
            } else if body.chains != leaves.len() as u64 || body.records != records {
                Some("chain or record count does not match the heads")
            } else {
                None
            };
            if let Some(reason) = problem {
                checkpoint_break = fail(checkpoint.seq, reason);
                break 'pages;
            }
            for (chain, seq, hash) in delta {
                checkpointed.entry(chain).or_default().insert(seq, hash);
            }
            prev = checkpoint_hash(&checkpoint.body);
            count += 1;
            last = Some(CheckpointSummary {
                seq: body.seq,
                at_ms: body.at_ms,
                chains: body.chains,
                records: body.records,
                hash: prev.clone(),
            });
        }
        if !full {
            break;
        }
    }
    let chains = store.verify_chain_against(checkpointed).await?;
    Ok(LogReport { chains, checkpoints: count, last, checkpoint_break })
}

fn signature_ok(key: &VerifyingKey, checkpoint: &StoredCheckpoint) -> bool {
    let Ok(bytes) = <[u8; 64]>::try_from(checkpoint.signature.as_slice()) else { return false };
    key.verify(checkpoint.body.as_bytes(), &Signature::from_bytes(&bytes)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(n: u8) -> (String, u64, [u8; 32]) {
        (format!("{n:032x}"), u64::from(n), [n; 32])
    }

    fn root_of(leaves: &[(String, u64, [u8; 32])]) -> [u8; 32] {
        merkle_root(leaves.iter().map(|(chain, seq, hash)| (chain.as_str(), *seq, hash)))
    }

    /// RFC 9162 §2.1.1 by its definition, computed independently: MTH of n leaves splits at the
    /// largest power of two below n.
    #[test]
    fn the_merkle_root_has_the_rfc_9162_shape() {
        let leaves: Vec<_> = (1..=5).map(leaf).collect();
        let leaf_hash = |(chain, seq, hash): &(String, u64, [u8; 32])| {
            let mut data = vec![0u8];
            data.extend_from_slice(chain.as_bytes());
            data.extend_from_slice(&seq.to_be_bytes());
            data.extend_from_slice(hash);
            <[u8; 32]>::try_from(digest::digest(&digest::SHA256, &data).as_ref()).unwrap()
        };
        let node = |left: [u8; 32], right: [u8; 32]| {
            let mut data = vec![1u8];
            data.extend_from_slice(&left);
            data.extend_from_slice(&right);
            <[u8; 32]>::try_from(digest::digest(&digest::SHA256, &data).as_ref()).unwrap()
        };
        let h: Vec<[u8; 32]> = leaves.iter().map(leaf_hash).collect();
        // 5 leaves: split 4 | 1.
        let expected = node(node(node(h[0], h[1]), node(h[2], h[3])), h[4]);
        assert_eq!(root_of(&leaves), expected);
        assert_eq!(root_of(&leaves[..1]), h[0]);
        assert_eq!(root_of(&leaves[..3]), node(node(h[0], h[1]), h[2]));
        let empty: [u8; 32] = digest::digest(&digest::SHA256, b"").as_ref().try_into().unwrap();
        assert_eq!(root_of(&[]), empty);
        // Any changed leaf changes the root.
        let mut changed = leaves.clone();
        changed[3].1 += 1;
        assert_ne!(root_of(&changed), expected);
    }

    #[test]
    fn deltas_round_trip_and_malformed_ones_are_refused() {
        let heads: Vec<ChainHead> = (1..=3)
            .map(|n| {
                let (chain, seq, hash) = leaf(n);
                ChainHead { chain, seq, hash, checkpointed_seq: 0 }
            })
            .collect();
        let text = encode_delta(&heads);
        let decoded = decode_delta(&text).unwrap();
        assert_eq!(decoded, (1..=3).map(leaf).collect::<Vec<_>>());
        for bad in [
            "{}",
            "[[\"short\",1,\"00\"]]",
            &text.replace("\"0000", "\"ZZZZ"),
            // Unsorted (a duplicate or a reordering could hide a leaf).
            &encode_delta(&[heads[1].clone(), heads[0].clone()]),
            &format!("[[\"{}\",0,\"{}\"]]", leaf(1).0, "0".repeat(64)),
        ] {
            assert!(decode_delta(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_body_is_canonical_and_signed() {
        let key = CheckpointKey::from_seed([7; 32]);
        let body = CheckpointBody {
            at_ms: 5,
            chains: 1,
            key: key_id(&key.verifying()),
            prev: "0".repeat(64),
            records: 3,
            root: "ab".repeat(32),
            seq: 1,
            v: 1,
        };
        let text = body.canonical();
        assert!(text.starts_with("{\"at_ms\":5,\"chains\":1,\"key\":\""), "{text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(palisade_base::canonical::canonical_bytes(&value), text.as_bytes());
        let signature = key.signing.sign(text.as_bytes()).to_bytes().to_vec();
        let stored = StoredCheckpoint { seq: 1, at_ms: 5, body: text.clone(), signature, delta: "[]".into() };
        assert!(signature_ok(&key.verifying(), &stored));
        let other = CheckpointKey::from_seed([8; 32]);
        assert!(!signature_ok(&other.verifying(), &stored));
        let edited = StoredCheckpoint { body: text.replace("\"records\":3", "\"records\":4"), ..stored };
        assert!(!signature_ok(&key.verifying(), &edited));
    }
}
