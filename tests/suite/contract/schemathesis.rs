//! schemathesis (PyPI, pinned in `.ci/python`) against a real `keel serve`
//! with a token: every phase (examples, coverage, fuzzing, stateful), every
//! check. Only the two endless routes are left out (they never answer
//! whole); `streamed.rs` checks them against the description instead.

use std::process::Command;

use super::{committed, outside_tool};
use crate::suite::support::server::{Scratch, ServeProcess};

/// How long schemathesis may run, in seconds: its fuzzing and stateful
/// phases repeat until this is spent.
const BUDGET_SECS: &str = "150";

#[test]
fn schemathesis_finds_no_failure_against_a_live_server() {
    let test = "contract::schemathesis::schemathesis_finds_no_failure_against_a_live_server";
    let Some(schemathesis) = outside_tool(
        test,
        ".ci/python/venv/bin/schemathesis",
        "python3 -m venv .ci/python/venv && .ci/python/venv/bin/pip install -r .ci/python/requirements.txt",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    let token = "contract-schemathesis-token";
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, token).expect("write the token");
    let model = scratch.script("hello.jsonl", &[r#"{"text": "Hello!"}"#]);
    let server = ServeProcess::start(
        &scratch,
        &[
            "--model",
            &model,
            "--token-file",
            token_file.to_str().expect("UTF-8 path"),
        ],
    );
    let output = Command::new(schemathesis)
        .arg("run")
        .arg(committed())
        .args(["--url", &server.api.base])
        .args(["--header", &format!("Authorization: Bearer {token}")])
        .args(["--checks", "all"])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        .args(["--exclude-operation-id", "stream_events"])
        .args(["--exclude-operation-id", "connect_websocket"])
        .args(["--max-time", BUDGET_SECS])
        .args(["--workers", "2"])
        .arg("--no-color")
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .env("SCHEMATHESIS_HOOKS", "")
        .current_dir(scratch.dir.path())
        .output()
        .expect("run schemathesis");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let (status, stderr) = server.terminate();
    // The summary, where a person reading the test output looks for it.
    let summary = printed.rsplit("SUMMARY").next().unwrap_or_default();
    eprintln!("schemathesis summary:{summary}");
    assert!(
        output.status.success(),
        "schemathesis failed:\n{printed}\nkeel serve: {stderr:?}"
    );
    assert!(printed.contains("No issues found"), "{printed}");
    assert!(!printed.contains("WARNINGS"), "schemathesis warned:\n{printed}");
    assert!(status.success(), "keel serve exited {status}: {stderr:?}");
    assert!(!stderr.iter().any(|line| line.contains("panicked")), "{stderr:?}");
}
