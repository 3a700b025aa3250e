//! Integration tests for palisade-auth: one test binary (one link) with a module per concern.
//!
//! Tokens are forged here with raw aws-lc-rs keys so every header and claim can be bent; JWKS are
//! served by wiremock on loopback; time moves with a `ManualClock`.

mod cache;
mod challenges;
mod common;
mod dev_issuer;
mod egress;
mod jwks;
mod refusals;
