//! libFuzzer target: JWK Set documents loaded as an issuer's keys by `palisade-auth`: a token
//! verifies only under the key that signed it (see `src/jwks.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::jwks(data));
