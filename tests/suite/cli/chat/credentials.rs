//! `keel chat` against a server that wants a credential: an API key or a
//! JWT given with `--api-key` or `KEEL_API_KEY` is sent as the bearer, and
//! a refusal says what is wrong with it.

use std::process::Stdio;

use super::session_line;
use crate::suite::support::process::{Cli, assert_one_line_error, stderr, stdout};
use crate::suite::support::server::{Scratch, ServeProcess};

/// A server wanting `token`, letting clients use `cli`'s scripts.
fn serve_with_token(scratch: &Scratch, cli: &Cli, token: &str) -> ServeProcess {
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write the token");
    let token_path = token_file.display().to_string();
    let scripts = cli.dir.path().display().to_string();
    ServeProcess::start(scratch, &["--token-file", &token_path, "--script-dir", &scripts])
}

#[test]
fn against_a_server_the_chat_sends_the_api_key_as_the_bearer() {
    let scratch = Scratch::new();
    let cli = Cli::new();
    let server = serve_with_token(&scratch, &cli, "chat-key");
    let model = cli.model(&[r#"{"text": "keyed"}"#]);
    let base = server.api.base.clone();

    let output = cli.chat_piped(
        &[
            "--server",
            &base,
            "--api-key",
            "chat-key",
            "--model",
            &model,
            "--no-tools",
        ],
        "hi\n",
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "keyed\n");

    let by_env = cli
        .chat(&["--server", &base, "--session", &session_line(&output)])
        .env("KEEL_API_KEY", "chat-key")
        .stdin(Stdio::null())
        .output()
        .expect("run keel chat");
    assert_eq!(by_env.status.code(), Some(0), "{}", stderr(&by_env));
    assert_eq!(stdout(&by_env), "> hi\nkeyed\n");

    let refused = cli.chat_piped(
        &["--server", &base, "--api-key", "not-the-key", "--model", &model],
        "hi\n",
    );
    assert_one_line_error(&refused, "401");
    assert!(stderr(&refused).contains("--api-key"), "{}", stderr(&refused));

    let local = cli.chat_piped(&["--api-key", "chat-key", "--model", &model], "hi\n");
    assert_one_line_error(&local, "--api-key is for a server's API");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_server_a_key_without_the_submit_scope_is_told_so() {
    let scratch = Scratch::new();
    let cli = Cli::new();
    let mut server = serve_with_token(&scratch, &cli, "chat-operator");
    server.api.token = Some("chat-operator".to_owned());
    let made = server
        .api
        .post(
            "/v1/keys",
            &serde_json::json!({"tenant": "acme", "name": "viewer", "scopes": ["read"]}),
        )
        .await;
    assert_eq!(made.status, reqwest::StatusCode::CREATED, "{}", made.body);
    let key = made.body["key"].as_str().expect("key").to_owned();
    let model = cli.model(&[r#"{"text": "never"}"#]);
    let base = server.api.base.clone();

    let refused = tokio::task::spawn_blocking(move || {
        cli.chat_piped(&["--server", &base, "--api-key", &key, "--model", &model], "hi\n")
    })
    .await
    .expect("run keel chat");
    assert_one_line_error(&refused, "this key lacks the `submit` scope");
    assert!(
        stderr(&refused).contains("missing_scope_submit"),
        "{}",
        stderr(&refused)
    );
}
