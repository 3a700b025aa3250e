//! libFuzzer target: the pagination cursors of `palisade-server`: no forged offset, bound to the
//! list kind and the server key (see `src/server.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::cursor(data));
