//! libFuzzer target: the W3C `traceparent` parser of `palisade-server`'s telemetry: what it accepts
//! is exactly what the header says, and round-trips (see `src/server.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::traceparent(data));
