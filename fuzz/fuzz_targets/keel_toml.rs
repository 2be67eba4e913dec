//! Fuzz target: `keel_testing::fuzzing::keel_toml`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_testing::fuzzing::keel_toml(data));
