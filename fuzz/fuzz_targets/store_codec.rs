//! Fuzz target: `keel_testing::fuzzing::store_codec`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_testing::fuzzing::store_codec(data));
