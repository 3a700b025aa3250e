//! The kill switch (control C5): a signed, complete operation registry; before dispatch and again
//! before side effects, a nonce-bound signed current-state answer from a disable authority;
//! monotonic generations; commit fences the backend redeems atomically with its effect. Fail
//! closed on any doubt. Also the reference disable authority.
//!
//! # Using it from the server
//!
//! ```text
//! start:    Policy::load(&PolicyFiles { root_public_key, envelope, key_trust_root }, now_ms)
//!           AuthorityClient::new(AuthorityClientConfig::from_files(url, ca, cert, key)?)
//!           SqliteGenerationStore::open(path) | RedisGenerationStore::connect(url, RedisOptions::default())
//!           TargetKey::read(path) | TargetKey::from_bytes(&[u8; 32])
//!           KillSwitch::start(KillSwitchConfig { policy, exposed_operations, authority, store,
//!                                                target_key, clock: Arc::new(SystemClock) })
//!             → refuses a registry missing an exposed operation (RegistryError { missing }),
//!               an expired policy, a lower or conflicting policy generation
//! request:  let clearance = kill_switch.pre_dispatch(op, &targets).await?;    // before the handler
//!           … side-effect-free preparation …
//!           let fence = kill_switch.pre_side_effect(op, &targets, &clearance).await?;
//!           backend commit: in ONE transaction, the effect and, for each fence.redeem_requests(),
//!           authority::redeem_commit_token(&mut tx, &request, now_ms) (shared SQLite database)
//!           or AuthorityClient::redeem(&request) before committing (separate database).
//! streams:  kill_switch.subscribe_disables() → DisableEvent { target, generation, reason_code };
//!           compare with kill_switch.target_digest(kind, value) of each stream's targets.
//! ```
//!
//! The authority answers in one of two envelopes ([`AuthorityClientConfig::envelope`]): batched
//! (the default; [`batch`]: the queries waiting at one moment go in one request, one signature
//! over a Merkle root covers them all, each caller verifies its own item) or single (v2: one
//! request per query, each head signed). Open streams re-check their targets every
//! [`KillSwitch::stream_recheck`] (`set_stream_recheck`; default 5 s).
//!
//! Operation keys are the server's `OperationKey`s: `tools/call:<tool>`, `resources/read:<uri>`,
//! `prompts/get:<name>`, or a plain method (`tools/list`). [`TargetValues`] carries the request's
//! target values by [`TargetKind`]; every kind the operation's rule requires must be present.
//! [`DispatchClearance`] and [`CommitFence`] have no public constructor: only the two phases make
//! them. Every [`KillSwitchError`] is a refusal; [`KillSwitchError::is_disabled`] tells the
//! authority's deliberate DISABLE from a doubt (authority unreachable, slow, malformed or stale
//! answer, rollback, expired policy, store error).
//!
//! # Configuration inputs
//!
//! - Policy: the root public key file, the signed envelope file, the key trust root directory
//!   (holding the authority public key file the policy names and pins).
//! - Authority client: `https://host:port` URL, CA bundle PEM (the only trust anchors), client
//!   certificate chain PEM and key PEM, timeout (default 2 s), response cap (default 64 KiB).
//! - Generation store: a SQLite path/URL, or a `redis://` URL (Valkey/Redis) for several
//!   instances; keys of one authority share one `{authority}` hash slot.
//! - Target key: 32 bytes shared by every instance and the authority's operators (a key file, or
//!   derived from the server secret).
//! - Authority (`serve`): listener, authority id (= the policy's `authority`), head signing key
//!   file, server certificate chain + key PEM, client CA PEM, SQLite database, head TTL, commit
//!   token TTL.
//!
//! # Operator tooling (library side of the CLI)
//!
//! - `palisade keys gen`: [`keys::generate_keypair_files`] (Ed25519, one base64 line per file,
//!   see [`keys`]); [`keys::generate_secret_key_file`] for the target key.
//! - `palisade policy init`: [`PolicyPayload::skeleton`] then `serde_json` to a file.
//! - `palisade policy sign`: [`sign_policy`] with [`Ed25519SigningKey::read`].
//! - `palisade authority serve`: [`authority::serve`] with [`authority::server_tls_config`],
//!   [`authority::AuthorityDb::open`].
//! - `palisade authority disable|enable --target KIND:VALUE --reason …`: [`parse_target_spec`],
//!   [`TargetKey::digest`], [`authority::AuthorityDb::disable`] / `enable`; `status`:
//!   [`authority::AuthorityDb::status`].
//!
//! **API Boundary:** raw target values never leave the server: the authority, its database and
//! the generation store see only keyed digests. No secret (signing key, target key, client key,
//! commit token) has a revealing `Debug`.
//!
//! Layers, low to high: `b64`, `keys` → `target`, `envelope` → `head`, `policy` → `batch`,
//! `generation` → `authority`, `client` → `error`, `batcher`, `killswitch` → `dev`.

// Tests may unwrap; the library may not (workspace lint `unwrap_used`).
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod authority;
mod b64;
pub mod batch;
mod batcher;
mod client;
pub mod dev;
pub mod envelope;
mod error;
pub mod generation;
pub mod head;
pub mod keys;
mod killswitch;
mod policy;
mod target;

pub use b64::Base64Error;
pub use client::{AuthorityClient, AuthorityClientConfig, AuthorityError, CommitToken, HeadEnvelope, VerifiedHead};
pub use error::KillSwitchError;
pub use generation::{
    GenerationRecord, GenerationStore, GenerationStoreError, GenerationSubject, MonotonicOutcome, RedisGenerationStore,
    RedisOptions, SqliteGenerationStore,
};
pub use head::{Phase, RedeemRequest, TargetState};
pub use keys::Ed25519SigningKey;
pub use killswitch::{
    CommitFence, DEFAULT_STREAM_RECHECK_MS, DisableEvent, DispatchClearance, FenceToken, KillSwitch, KillSwitchConfig,
};
pub use policy::{
    Coverage, ExposedOperation, MAX_SAFE_INTEGER, OperationRule, POLICY_SCHEMA_VERSION, Policy, PolicyError,
    PolicyFiles, PolicyHeader, PolicyPayload, RegistryError, file_sha256_hex, sign_policy,
};
pub use target::{TargetDigest, TargetKey, TargetKind, TargetValues, parse_target_spec};
