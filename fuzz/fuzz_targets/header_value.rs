//! libFuzzer target: `Mcp-*` header value decoding and the encode/decode round trip.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::header_value(data));
