//! libFuzzer target: one inbound JSON-RPC frame through `parse_message` and `_meta` validation.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::jsonrpc_frame(data));
