//! libFuzzer target: one inbound JSON-RPC frame through `parse_message` and `_meta` validation,
//! and the strict JSON parser against `serde_json` on the same bytes (a differential check).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::jsonrpc_frame(data));
