//! Fuzz target: `keel::testing::fuzzing::openai_responses`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel::testing::fuzzing::openai_responses(data));
