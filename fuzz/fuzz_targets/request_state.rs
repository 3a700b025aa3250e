//! libFuzzer target: the sealed MRTR `requestState` of `palisade-server` (`StateSealer::open`): no
//! forgery, no tampered state opens, a sealed state round-trips (see `src/server.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::request_state(data));
