//! Fuzz target: `keel::testing::fuzzing::anthropic`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel::testing::fuzzing::anthropic(data));
