//! The TypeScript client (`clients/typescript`): its tests (Node's test
//! runner, `npm test`) start this build's `keel serve` themselves, from
//! `KEEL_BIN`. Outside CI, a run without the client's npm packages
//! installed passes with a `SKIPPED` line; in CI (`CI` or
//! `KEEL_REQUIRE_CLIENT_TESTS` set, as `.ci/run` does) it fails instead.

use std::path::Path;
use std::process::Command;

use crate::suite::support::skip;

/// The test family's variable that forbids skipping.
const REQUIRE: &str = "KEEL_REQUIRE_CLIENT_TESTS";

#[test]
fn typescript_client_tests_pass_against_keel_serve() {
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/typescript");
    let how = "install Node.js and run `npm ci --prefix clients/typescript` (the client step of .ci/run)";
    if !client.join("node_modules").is_dir() {
        assert!(
            skip::may_skip(REQUIRE),
            "clients/typescript/node_modules is missing, and this run requires the client tests (CI or {REQUIRE}): {how}"
        );
        skip::announce(
            "clients::typescript",
            &format!("clients/typescript/node_modules is missing, so the TypeScript client is NOT tested here; {how}"),
        );
        return;
    }
    let output = Command::new("npm")
        .arg("test")
        .arg("--prefix")
        .arg(&client)
        .env("KEEL_BIN", env!("CARGO_BIN_EXE_keel"))
        .output()
        .expect("run npm");
    assert!(
        output.status.success(),
        "`npm test --prefix clients/typescript` failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
