//! Entry points for fuzzing: each takes arbitrary bytes and must never
//! panic. The `fuzz/` cargo-fuzz project calls one per target, and the
//! stable test `tests/suite/fuzz_seeds.rs` runs them over the seed corpora
//! (`fuzz/corpus/<target>/`) and mutations of them.
//!
//! Beyond not panicking, some check what must hold of any input: the SSE
//! parser and each provider's stream decoder give the same result however
//! the bytes are split, and whatever parses as protocol JSON serializes to
//! JSON that parses to the same value.
//! A failed check panics, which the fuzzer reports as a crash.

use std::path::Path;

use keel_config::KeelConfig;
pub use keel_providers::fuzzing::{anthropic, openai_chat, openai_responses, sse};
pub use keel_server::fuzzing::protocol_json;
pub use keel_store::fuzzing::store_codec;

/// An entry point: takes any bytes, never panics.
pub type Entry = fn(&[u8]);

/// The targets, by name: the name of the fuzz target and of its corpus
/// directory, and its entry point.
pub const TARGETS: &[(&str, Entry)] = &[
    ("sse", sse),
    ("openai_chat", openai_chat),
    ("openai_responses", openai_responses),
    ("anthropic", anthropic),
    ("protocol_json", protocol_json),
    ("store_codec", store_codec),
    ("keel_toml", keel_toml),
];

/// `keel.toml` parsing, as [`KeelConfig::load`] does it after reading the
/// file; a failure's message points into the text.
pub fn keel_toml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        _ = KeelConfig::parse(text, Path::new("keel.toml"));
    }
}
