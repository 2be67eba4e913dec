//! The Python client's tests (`clients/python/tests`, pytest) against this
//! build's `keel serve`, from the virtual environment `.ci/run` makes
//! (`.ci/python/venv`, pinned by `.ci/python/requirements.txt`).

use std::path::Path;
use std::process::Command;

use crate::suite::support::skip;

const REQUIRE: &str = "KEEL_REQUIRE_CLIENT_TESTS";

#[test]
fn python_client_tests_pass_against_a_real_server() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = repo.join(".ci/python/venv/bin/python");
    if !python.is_file() {
        let how = "make it as .ci/run does: python3 -m venv .ci/python/venv; .ci/python/venv/bin/pip install \
                   --require-hashes -r .ci/python/requirements.txt; .ci/python/venv/bin/pip install \
                   --no-build-isolation --no-deps ./clients/python";
        assert!(
            skip::may_skip(REQUIRE),
            "{} is missing, and this run requires the client tests (CI or {REQUIRE}): {how}",
            python.display()
        );
        skip::announce(
            "suite::clients::python",
            &format!(
                "{} is missing, so the Python client is NOT tested here; {how}",
                python.display()
            ),
        );
        return;
    }
    let output = Command::new(&python)
        .args(["-m", "pytest", "clients/python/tests", "-q", "-p", "no:cacheprovider"])
        .current_dir(repo)
        .env("KEEL_BIN", env!("CARGO_BIN_EXE_keel"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "the Python client's tests failed ({}):\n{text}",
        output.status
    );
    println!("{text}");
}
