//! The API's contract: its OpenAPI description as committed and as served,
//! judged by outside tools (Redocly's linter, schemathesis against a live
//! `keel serve`), and the two endless routes' events and frames checked
//! against it by a third-party JSON Schema validator.
//!
//! The outside tools come from `.ci/node` (npm) and `.ci/python/venv`
//! (PyPI), both pinned and installed by `.ci/run`. Outside CI a test whose
//! tools are missing passes with a `SKIPPED` line; in CI (`CI` or
//! `KEEL_REQUIRE_CLIENT_TESTS` set) it fails instead.

mod description;
mod lint;
mod schemathesis;
mod streamed;

use std::path::{Path, PathBuf};

use crate::suite::support::skip;

/// The committed description.
fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json")
}

/// The description as the code makes it, parsed.
fn document() -> serde_json::Value {
    serde_json::from_str(keel::server::openapi_json()).expect("the description is JSON")
}

/// `tool` under the repository, when installed; `None` (and the test is
/// skipped, said on the terminal) when it is not and tests may skip; a
/// failure naming the install step when they may not.
fn outside_tool(test: &str, tool: &str, install: &str) -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(tool);
    if path.exists() {
        return Some(path);
    }
    assert!(
        skip::may_skip("KEEL_REQUIRE_CLIENT_TESTS"),
        "{} is not installed: {install} (an install step of .ci/run)",
        path.display()
    );
    skip::announce(test, &format!("{tool} is not installed ({install})"));
    None
}
