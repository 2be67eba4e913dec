//! The commands around the runtime: `keel completions`, `keel config`,
//! `keel doctor` and `keel --version`.

use crate::suite::support::process::{Cli, stderr, stdout};

#[test]
fn completions_are_printed_for_every_shell() {
    let cli = Cli::new();
    for (shell, marker) in [
        ("bash", "complete -F _keel"),
        ("zsh", "#compdef keel"),
        ("fish", "complete -c keel"),
        ("powershell", "Register-ArgumentCompleter"),
        ("elvish", "edit:completion:arg-completer[keel]"),
    ] {
        let output = cli.run(&["completions", shell]);
        assert!(output.status.success(), "{shell}: {}", stderr(&output));
        let script = stdout(&output);
        assert!(script.contains(marker), "{shell}: {marker:?} missing");
        assert!(script.contains("doctor"), "{shell}: the subcommands are completed");
    }
    assert!(!cli.run(&["completions", "tcsh"]).status.success());
}

#[test]
fn version_names_the_commit_and_the_build_date() {
    let output = Cli::new().run(&["--version"]);
    assert!(output.status.success());
    let text = stdout(&output);
    let pattern = regex_like(&text);
    assert!(pattern, "{text:?}");
}

/// Whether `text` is `keel X.Y.Z (commit C, built YYYY-MM-DD)`.
fn regex_like(text: &str) -> bool {
    let Some(rest) = text
        .trim()
        .strip_prefix(concat!("keel ", env!("CARGO_PKG_VERSION"), " (commit "))
    else {
        return false;
    };
    let Some((commit, date)) = rest.split_once(", built ") else {
        return false;
    };
    let date = date.trim_end_matches(')');
    !commit.is_empty()
        && date.len() == 10
        && date
            .chars()
            .enumerate()
            .all(|(i, c)| if i == 4 || i == 7 { c == '-' } else { c.is_ascii_digit() })
}

/// A keel.toml with a model whose header carries a secret, an MCP server
/// whose environment does, and a model on an endpoint nothing listens on.
fn write_config(cli: &Cli) -> std::path::PathBuf {
    let path = cli.dir.path().join("keel.toml");
    std::fs::write(
        &path,
        r#"model = "local"

[models.local]
provider = "openai"
model = "llama"
base_url = "http://127.0.0.1:1/v1"
headers = { "X-Api-Key" = "hunter2-header" }

[mcp.servers.broken]
command = "/nonexistent/mcp-server"
env = { TOKEN = "hunter2-env" }
"#,
    )
    .expect("keel.toml");
    path
}

#[test]
fn config_shows_the_files_read_and_the_effective_settings_without_secrets() {
    let cli = Cli::new();
    write_config(&cli);
    let output = cli
        .command(&["config", "--json"])
        .env_remove("KEEL_CONFIG")
        .env("XDG_CONFIG_HOME", cli.dir.path().join("config"))
        .output()
        .expect("keel config");
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(!text.contains("hunter2"), "a secret was printed: {text}");
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(report["files"][0]["path"], "keel.toml");
    assert_eq!(report["files"][0]["state"], "read");
    assert_eq!(report["files"][1]["state"], "not looked at", "{report}");
    assert_eq!(report["effective"]["model"], "local");
    assert_eq!(report["effective"]["server"]["max_sandbox"], "workspace-write");
    assert_eq!(report["file"]["models"]["local"]["base_url"], "http://127.0.0.1:1/v1");
    assert_eq!(report["file"]["models"]["local"]["headers"]["X-Api-Key"], "***");

    let plain = cli
        .command(&["config"])
        .env_remove("KEEL_CONFIG")
        .output()
        .expect("keel config");
    assert!(
        stdout(&plain).contains("keel.toml (the current directory): read"),
        "{}",
        stdout(&plain)
    );
}

#[test]
fn doctor_fails_on_an_unreachable_provider_and_a_broken_mcp_server_and_says_why() {
    let cli = Cli::new();
    write_config(&cli);
    let output = cli
        .command(&["doctor", "--timeout-secs", "2"])
        .env_remove("KEEL_CONFIG")
        .output()
        .expect("keel doctor");
    let text = stdout(&output);
    assert!(!output.status.success(), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    for expected in [
        "sandbox: ",
        "ok    config: keel.toml",
        "database: ",
        "fail  model local: http://127.0.0.1:1/v1 cannot be reached",
        "fail  mcp: ",
        "'broken'",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from {text}");
    }

    // With a database in place and nothing broken configured, all is well.
    let healthy = Cli::new();
    let script = healthy.script("s.jsonl", &[r#"{"text": "hi"}"#]);
    let model = format!("script:{}", script.display());
    assert!(healthy.run(&["run", "--model", &model, "hi"]).status.success());
    let output = healthy
        .command(&["doctor"])
        .env_remove("KEEL_CONFIG")
        .env("XDG_CONFIG_HOME", healthy.dir.path().join("config"))
        .output()
        .expect("keel doctor");
    let text = stdout(&output);
    assert!(text.contains("ok    database: "), "{text}");
    assert!(text.contains(", schema version "), "{text}");
    assert!(!text.contains("fail"), "{text}");
    assert!(output.status.success(), "{text}");
}

#[test]
fn doctor_reaches_a_postgresql_database_and_says_what_is_wrong_with_a_missing_one() {
    let Some(postgres) = keel::store::postgres::local::LocalPostgres::shared() else {
        return;
    };
    let cli = Cli::new();
    let url = postgres.fresh_database();
    let output = cli
        .command(&["doctor", "--db", &url])
        .env_remove("KEEL_CONFIG")
        .output()
        .expect("keel doctor");
    let text = stdout(&output);
    assert!(text.contains("ok    database: postgres://"), "{text}");
    assert!(text.contains("reachable, schema up to date"), "{text}");

    let missing = postgres.url("no_such_database_for_doctor");
    let output = cli
        .command(&["doctor", "--db", &missing])
        .env_remove("KEEL_CONFIG")
        .output()
        .expect("keel doctor");
    let text = stdout(&output);
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("fail  database: "), "{text}");
    assert!(text.contains("the PostgreSQL database does not exist"), "{text}");
}
