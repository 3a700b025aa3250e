//! Palisade's leaf utilities, shared by every other crate: the one clock ([`clock`]), RFC 3339
//! timestamps ([`time`]), lower-case hex ([`hex`]), RFC 8785 canonical JSON ([`canonical`]), the
//! RFC 9162 Merkle tree shape ([`merkle`]), HTML escaping ([`html`]), untrusted text shown to a
//! reviewer with its hidden characters visible ([`reveal`]) and token buckets per source address
//! ([`limit`]).
//!
//! **Architecture Invariant:** this crate knows no HTTP, no MCP and no storage; it depends on
//! nothing of the workspace. `std::time::SystemTime::now` is read in [`clock::SystemClock`] only
//! (clippy's `disallowed-methods` refuses it everywhere else).
//!
//! Layers, low to high: `canonical`, `clock`, `hex`, `html`, `limit`, `merkle`, `reveal`, `time`.

pub mod canonical;
pub mod clock;
pub mod hex;
pub mod html;
pub mod limit;
pub mod merkle;
pub mod reveal;
pub mod time;
