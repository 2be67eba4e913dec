//! Fuzz target: `keel_testing::fuzzing::protocol_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_testing::fuzzing::protocol_json(data));
