//! libFuzzer target: the kill switch's signed heads, policies and batches and its Merkle paths:
//! nothing verifies that the expected key did not sign (see `src/killswitch.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::killswitch(data));
