//! Skipping a test whose tools are missing, honestly. Stable Rust cannot
//! mark a test skipped at run time, so a skipped test passes; it must then
//! say so where a person running `cargo test` sees it, and CI (`CI`, or the
//! test family's `KEEL_REQUIRE_…` variable, as `.ci/run` sets) never skips.

use std::io::Write;

/// Whether environment variable `name` is set to something other than
/// nothing or `0`.
pub(crate) fn set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|value| !value.is_empty() && value != "0")
}

/// Whether tests may be skipped for want of their tools: not in CI, and not
/// when `require` (the family's `KEEL_REQUIRE_…` variable) is set.
pub(crate) fn may_skip(require: &str) -> bool {
    !set("CI") && !set(require)
}

/// Says on the terminal that `test` was skipped and why. Written to the
/// process's stderr itself, not with `eprintln!`, whose output the test
/// harness keeps back for passing tests: a skipped test passes, and must
/// not look like one that ran.
pub(crate) fn announce(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr().lock(), "\n!!! SKIPPED {test}: {why}\n");
}
