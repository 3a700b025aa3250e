//! Integration tests of `palisade-server`, one test binary: the request path through
//! `Server::handle_request` and over real HTTP, with real tokens, on SQLite and PostgreSQL
//! (`DATABASE_URL`), the kill switch against a real reference authority, cancellation, and the
//! HTTP transport against slow, idle and malformed clients over real sockets (`transport`).

#![allow(clippy::unwrap_used)]

mod builder;
mod cancellation;
mod common;
mod delegation;
mod examples;
mod handles;
mod hardening;
mod killswitch;
mod one_clock;
mod pipeline_order;
mod sessions;
mod snapshots;
mod tasks;
mod transport;
