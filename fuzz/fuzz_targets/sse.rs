//! Fuzz target: `keel::testing::fuzzing::sse`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel::testing::fuzzing::sse(data));
