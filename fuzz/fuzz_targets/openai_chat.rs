//! Fuzz target: `keel_testing::fuzzing::openai_chat`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_testing::fuzzing::openai_chat(data));
