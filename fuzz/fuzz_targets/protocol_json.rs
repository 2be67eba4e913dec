//! Fuzz target: `keel::testing::fuzzing::protocol_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel::testing::fuzzing::protocol_json(data));
