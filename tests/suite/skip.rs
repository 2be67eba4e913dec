//! The skip rule of `support::skip` seen from outside: a skipped test says
//! so where a person running `cargo test` sees it, and a required one fails.

use std::process::{Command, Output};

/// Runs one test of this binary by its full name, outside CI, with `envs`.
fn run_one(test: &str, envs: &[(&str, &str)]) -> Output {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args([test, "--exact", "--test-threads", "1"])
        .env_remove("CI")
        .env_remove("KEEL_REQUIRE_BROWSER_TESTS")
        .env_remove("KEEL_REQUIRE_MCP_TESTS")
        .env_remove("KEEL_SKIP_BROWSER_TESTS")
        .envs(envs.iter().copied())
        .output()
        .expect("run the test binary")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn a_skipped_test_says_so_in_the_output_and_a_required_one_fails() {
    let web = run_one(
        "suite::web_ui::web_ui_interrupts_a_slow_turn",
        &[("KEEL_SKIP_BROWSER_TESTS", "1")],
    );
    assert!(web.status.success(), "{}", text(&web));
    assert!(
        text(&web).contains("SKIPPED web_ui_interrupts_a_slow_turn"),
        "the skip shows in the output: {}",
        text(&web)
    );

    let missing = [("KEEL_MCP_NODE_MODULES", "/nonexistent/node_modules")];
    for test in [
        "suite::mcp::calls_return_the_servers_text_and_placeholders_for_other_content",
        "suite::cli::tools::mcp_servers_from_keel_toml_serve_the_session_and_end_with_it",
    ] {
        let skipped = run_one(test, &missing);
        assert!(skipped.status.success(), "{test}: {}", text(&skipped));
        let name = test.rsplit("::").next().expect("name");
        assert!(
            text(&skipped).contains(&format!("SKIPPED {name}")) && text(&skipped).contains("npm ci --prefix .ci/node"),
            "{test}: the skip and the way to install show in the output: {}",
            text(&skipped)
        );
    }
    // Where they are required, missing packages fail the test.
    let required = run_one(
        "suite::mcp::calls_return_the_servers_text_and_placeholders_for_other_content",
        &[missing[0], ("KEEL_REQUIRE_MCP_TESTS", "1")],
    );
    assert!(!required.status.success(), "{}", text(&required));
    assert!(
        text(&required).contains("npm ci --prefix .ci/node"),
        "{}",
        text(&required)
    );
}
