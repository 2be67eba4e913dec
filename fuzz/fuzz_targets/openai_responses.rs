//! Fuzz target: `keel_testing::fuzzing::openai_responses`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_testing::fuzzing::openai_responses(data));
