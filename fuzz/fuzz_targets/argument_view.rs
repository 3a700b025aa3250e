//! libFuzzer target: the argument view of operator policies (`palisade-server`): conversion never
//! panics and refuses exactly what its rules say is over the limits or of the wrong type.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_fuzz::argument_view(data));
