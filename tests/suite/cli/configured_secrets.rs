//! Every configured secret is redacted from what a session stores from the
//! moment the configuration is loaded, not only once the model that uses
//! it is built: `[models]` headers and named keys, MCP `env` and `headers`,
//! and the server's own token.

use std::io::Write;
use std::process::Stdio;

use crate::suite::support::process::{Cli, session_of, stderr};
use crate::suite::support::server::{Scratch, ServeProcess};

const HEADER: &str = "hdr-secret-0123456789abcdef";
const NAMED_KEY: &str = "sk-named-0123456789abcdef";
const MCP_ENV: &str = "mcp-env-secret-0123456789";
const MCP_HEADER: &str = "mcp-header-secret-0123456789";

/// The stored events of `session`, as JSON text.
fn stored(cli: &Cli, session: &str) -> String {
    serde_json::to_string(&cli.events(session)).expect("events")
}

#[test]
fn a_session_whose_model_is_never_built_stores_no_configured_secret() {
    let cli = Cli::new();
    std::fs::write(
        cli.dir.path().join("keel.toml"),
        format!(
            "[models.later]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             api_key_env = \"LATER_KEY\"\nheaders = {{ \"X-Team-Secret\" = \"{HEADER}\" }}\n\n\
             [mcp.servers.off]\ncommand = \"/nonexistent/mcp\"\nenv = {{ TOKEN = \"{MCP_ENV}\" }}\nenabled = false\n\n\
             [mcp.servers.remote]\nurl = \"http://127.0.0.1:9/mcp\"\n\
             headers = {{ Authorization = \"Token {MCP_HEADER}\" }}\nenabled = false\n"
        ),
    )
    .expect("config");
    // A file of the workspace that happens to hold them (a note, a log).
    std::fs::write(
        cli.dir.path().join("notes.txt"),
        format!("{HEADER}\n{NAMED_KEY}\n{MCP_ENV}\n{MCP_HEADER}\n"),
    )
    .expect("notes");
    let call =
        serde_json::json!({"tool_calls": [{"id": "call-1", "name": "read_file", "arguments": {"path": "notes.txt"}}]});
    let script = cli.script("s.jsonl", &[&call.to_string(), r#"{"text": "read"}"#]);
    let output = cli
        .command(&[
            "run",
            "--json",
            "--approve",
            "auto",
            "--model",
            &format!("script:{}", script.display()),
            "read the notes",
        ])
        .env("LATER_KEY", NAMED_KEY)
        .output()
        .expect("run keel");
    assert!(output.status.success(), "{}", stderr(&output));
    let session = session_of(&super::parse_events(&output.stdout));
    let stored = stored(&cli, &session);
    assert!(stored.contains("[redacted]"), "{stored}");
    for secret in [HEADER, NAMED_KEY, MCP_ENV, MCP_HEADER] {
        assert!(!stored.contains(secret), "{secret} stored: {stored}");
    }
}

#[test]
fn the_servers_token_is_redacted_from_what_its_sessions_store() {
    let scratch = Scratch::new();
    let token = "serve-token-0123456789abcdef";
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write the token");
    let token_path = token_file.display().to_string();
    let cli = Cli::new();
    let scripts = cli.dir.path().display().to_string();
    let server = ServeProcess::start(&scratch, &["--token-file", &token_path, "--script-dir", &scripts]);
    let script = cli.script(
        "s.jsonl",
        &[&serde_json::json!({"text": format!("the token is {token}")}).to_string()],
    );
    let mut child = cli
        .command(&[
            "chat",
            "--server",
            &server.api.base,
            "--token-file",
            &token_path,
            "--model",
            &format!("script:{}", script.display()),
            "--no-tools",
        ])
        .env("HOME", cli.dir.path().join("home"))
        .env("XDG_DATA_HOME", cli.dir.path().join("data"))
        .env_remove("KEEL_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel chat");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"say it\n")
        .expect("write");
    let output = child.wait_with_output().expect("keel chat");
    assert!(output.status.success(), "{}", stderr(&output));
    let err = stderr(&output);
    let session = err
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("session "))
        .unwrap_or_else(|| panic!("no session line in {err:?}"));
    let events = super::chat::served_events(&cli, &scratch, session);
    let stored = serde_json::to_string(&events).expect("events as JSON");
    assert!(stored.contains("the token is [redacted]"), "{stored}");
    assert!(!stored.contains(token), "{stored}");
}
