//! Fuzz target: `keel::testing::fuzzing::keel_toml`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel::testing::fuzzing::keel_toml(data));
