//! The kill switch's integration tests: one binary. Real mTLS on loopback with certificates made
//! here, the reference authority, SQLite files and (for the Redis backend) the server `REDIS_URL`
//! names.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod authority;
mod batch;
mod fixture;
mod generation;
mod heads;
mod policy;
mod race;
mod vectors;
