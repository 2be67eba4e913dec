//! Fuzz target: `keel_testing::fuzzing::anthropic`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_testing::fuzzing::anthropic(data));
