//! libFuzzer target: the `Authorization` header and JWT verification of `palisade-auth`, on raw
//! header bytes and on real ES256 tokens mutated by the input (see `src/bearer.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::bearer_token(data));
