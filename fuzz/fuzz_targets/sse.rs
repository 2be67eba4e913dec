//! Fuzz target: `keel_testing::fuzzing::sse`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_testing::fuzzing::sse(data));
