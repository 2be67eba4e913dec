//! The pinned Python environment (`.ci/python/venv`), where the tests find
//! third-party judges (PyJWT, the Standard Webhooks library).

use std::path::{Path, PathBuf};

use super::skip;

/// Set in CI (and by `.ci/run`): tests that need the Python environment
/// may not be skipped for want of it.
pub(crate) const REQUIRE: &str = "KEEL_REQUIRE_CLIENT_TESTS";

/// The virtual environment's Python, or `None` (announced) when a run may
/// skip `test` without it.
pub(crate) fn venv_python(test: &str) -> Option<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/python/venv/bin/python");
    if python.is_file() {
        return Some(python);
    }
    let how = "make it: python3 -m venv .ci/python/venv; .ci/python/venv/bin/pip install --require-hashes \
               -r .ci/python/requirements.txt";
    assert!(
        skip::may_skip(REQUIRE),
        "{} is missing and this run requires it (CI or {REQUIRE}): {how}",
        python.display()
    );
    skip::announce(
        test,
        &format!("{} is missing, so {test} does NOT run here; {how}", python.display()),
    );
    None
}
