//! Integration tests: boot the real `palisade` binary and talk to it over HTTP and stdio, the
//! way clients do. Every response body is validated against the official 2026-07-28 schema.

#![allow(clippy::unwrap_used)]

mod answer_relay;
mod audit_log;
mod audit_read;
mod auth;
mod client_refusals;
mod config_check;
mod delegation;
mod dev_authorization;
mod events_bridge;
mod gateway_apps;
mod gateway_asks;
mod gateway_boundary;
mod gateway_eras;
mod gateway_metrics;
mod gateway_names;
mod gateway_pins;
mod gateway_reload;
mod gateway_stdio;
mod gateway_stdio_layouts;
mod gateway_stdio_servers;
mod gateway_subscriptions;
mod gateway_web;
mod harness;
mod hostile_upstream;
mod http_bad_input;
mod http_flows;
mod killswitch;
mod policies;
mod policy_reload;
mod production_gateway;
mod protected_paths;
mod rate_limits;
mod readme_examples;
mod rmcp_client;
mod schema;
mod stdio;
mod telemetry;
mod upstream_fixture;
