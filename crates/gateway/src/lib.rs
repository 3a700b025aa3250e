//! Palisade's gateway: MCP servers written in any language behind the same pipeline as a Rust
//! application. Its registry is the set of *approved* upstream definitions, published as a new
//! application snapshot whenever an upstream's lists change or a reviewer decides a pin.
//!
//! Layers, low to high: `churn`, `config_error`, `names`, `secret` → `pins`, `web` → `ui`,
//! `user_oauth` → `credentials` → `upstream` → `config` → `decisions`, `findings` → `review` →
//! `gateway` → `console`.
//!
//! - [`config`]: composes the `[[upstreams]]`, `[pins]`, `[gateway]` and `[web]` sections, each
//!   validated by the module that owns it (`upstream`, `pins`, `web`, `credentials`).
//! - [`names`]: exposed names and URIs, `<prefix><separator><upstream name>`, reversible.
//! - [`pins`]: definition digests (SHA-256 over RFC 8785 bytes of the definition as sent), pin
//!   states, signed approvals, readable diffs.
//! - [`ui`]: MCP Apps: a tool's UI resource pinned with the tool (its contents' digest, its
//!   declared CSP and permissions, checked and relayed as declared, never widened).
//! - [`credentials`]: the gateway's own credential per upstream; never the caller's.
//! - [`upstream`]: the MCP client toward one upstream (both eras, HTTP or stdio), its limits,
//!   health and launches.
//! - [`gateway`]: the application in its two jobs: reconciliation (listings → pin states → the
//!   published registry) and relaying (a call to an upstream and back).
//! - [`churn`]: an upstream that changes its definitions on every listing costs one audit
//!   record per minute, with the count of the changes, not one per change.
//! - [`web`]: the browser pages' HTTPS listener (`[web]`) and its primitives (headers, CSRF,
//!   `__Host-` cookies, the same-origin check).
//! - [`user_oauth`]: each person's own authorization at a `user_oauth` upstream, made on the
//!   connect page.
//! - [`review`], [`decisions`], [`findings`]: the pin review page, reviewers' decisions, and
//!   what a reviewer is shown about a definition.
//! - [`console`]: the operator console, a read-only page of the gateway's state on the same
//!   surface, with its own operator sign-in.
//!
//! **Architecture Invariant:** no byte of a caller's credential (its `Authorization`, cookies,
//! any header) is ever copied into an upstream request: upstream requests are built from
//! nothing but the relayed JSON-RPC params and the upstream's own credential.

// Tests may unwrap; the library may not (workspace lint `unwrap_used`).
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod churn;
pub mod config;
mod config_error;
pub mod console;
pub mod credentials;
pub mod decisions;
pub mod findings;
pub mod gateway;
pub mod names;
pub mod pins;
pub mod review;
mod secret;
pub mod ui;
pub mod upstream;
pub mod user_oauth;
pub mod web;

pub use upstream::launch;

pub use gateway::{Gateway, GatewayError, PinEntry, Refreshed, UpstreamStatus};
