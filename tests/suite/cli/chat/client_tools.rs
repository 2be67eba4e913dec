//! `keel chat --client-tool`: the chat declares its test tools as the
//! session's client tools, the model (a script) calls them, and the chat
//! runs them (or asks the user) and sends the result back; on the local
//! database and against a `keel serve` process, piped and on a terminal.

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use keel::protocol::{EventMsg, RecordedEvent};
use serde_json::{Value, json};

use super::{served, served_events, session_line};
use crate::suite::support::api::Api;
use crate::suite::support::process::{Cli, stderr, stdout};
use crate::suite::support::server::{Scratch, ServeProcess};
use crate::suite::support::wait::wait_for_async;

/// A script line calling client tool `name` with `arguments`.
fn call(name: &str, arguments: Value) -> String {
    json!({"tool_calls": [{"name": name, "arguments": arguments}]}).to_string()
}

/// The script of [`the_chat_answers_each_call`]: echo, ask_user, local_time.
fn three_calls() -> Vec<String> {
    vec![
        call("echo", json!({"text": "hello back"})),
        r#"{"text": "Echoed."}"#.to_owned(),
        call("ask_user", json!({"question": "Favourite colour?"})),
        r#"{"text": "Noted."}"#.to_owned(),
        call("local_time", json!({})),
        r#"{"text": "Time told."}"#.to_owned(),
    ]
}

/// What the session recorded of each call: the `client_tool_requested`
/// names, and each completed call's (output, is_error).
fn client_calls(events: &[RecordedEvent]) -> (Vec<String>, Vec<(String, bool)>) {
    let requested = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ClientToolRequested(request) => Some(request.name.clone()),
            _ => None,
        })
        .collect();
    let completed = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(done) => Some((done.output.clone(), done.is_error)),
            _ => None,
        })
        .collect();
    (requested, completed)
}

/// Runs the three calls through a piped chat with `args`; checks what it
/// printed and answers the session's log, read by `events`.
fn the_chat_answers_each_call(cli: &Cli, args: &[&str], events: impl Fn(&str) -> Vec<RecordedEvent>) {
    let lines = three_calls();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let model = cli.model(&lines);
    let mut all = vec![
        "--model",
        &model,
        "--no-tools",
        "--client-tool",
        "echo",
        "--client-tool",
        "ask_user",
        "--client-tool",
        "local_time",
    ];
    all.extend_from_slice(args);
    let output = cli.chat_piped(&all, "say it\nask me\nblue\nwhat time is it\n");
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert_eq!(stdout(&output), "Echoed.\nNoted.\nTime told.\n");
    assert!(err.contains("[tool echo "), "the request is printed: {err}");
    assert!(err.contains("[client tool echo result: hello back]"), "{err}");
    assert!(err.contains("? Favourite colour? "), "the question is put: {err}");
    assert!(err.contains("[client tool ask_user result: blue]"), "{err}");
    assert!(err.contains("[client tool local_time result: {"), "{err}");

    let events = events(&session_line(&output));
    let (requested, completed) = client_calls(&events);
    assert_eq!(requested, ["echo", "ask_user", "local_time"]);
    assert_eq!(completed.len(), 3, "{completed:?}");
    assert_eq!(completed[0], ("hello back".to_owned(), false));
    assert_eq!(
        completed[1],
        ("blue".to_owned(), false),
        "the next line answered the question"
    );
    let time: Value = serde_json::from_str(&completed[2].0).expect("local_time answers JSON");
    assert!(time["unix_ms"].as_u64().is_some(), "{time}");
    assert!(!completed[2].1);
    let users: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::UserMessage(message) => Some(message.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        users,
        ["say it", "ask me", "what time is it"],
        "the answer is no message"
    );
}

#[test]
fn a_local_chat_runs_its_client_tools_and_sends_their_results() {
    let cli = Cli::new();
    the_chat_answers_each_call(&cli, &[], |session| cli.events(session));
}

#[test]
fn against_a_server_the_chat_declares_its_client_tools_and_answers_them() {
    let (cli, scratch, server) = served();
    let base = server.api.base.clone();
    the_chat_answers_each_call(&cli, &["--server", &base], |session| {
        served_events(&cli, &scratch, session)
    });
}

#[test]
fn a_call_with_bad_arguments_is_answered_as_an_error_and_the_end_of_input_too() {
    let cli = Cli::new();
    let echo = call("echo", json!({"words": "no text"}));
    let ask = call("ask_user", json!({"question": "Anyone?"}));
    let model = cli.model(&[&echo, r#"{"text": "Bad call."}"#, &ask, r#"{"text": "Nobody."}"#]);
    let output = cli.chat_piped(
        &[
            "--model",
            &model,
            "--no-tools",
            "--client-tool",
            "echo",
            "--client-tool",
            "ask_user",
        ],
        "echo badly\nask\n",
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert!(
        err.contains("[client tool echo error: invalid arguments: 'text' is required]"),
        "{err}"
    );
    let (_, completed) = client_calls(&cli.events(&session_line(&output)));
    assert_eq!(
        completed,
        [
            ("invalid arguments: 'text' is required".to_owned(), true),
            ("the user gave no answer (the input ended)".to_owned(), true),
        ]
    );
}

#[test]
fn on_a_terminal_ask_user_puts_the_question_and_the_typed_answer_goes_back() {
    let (cli, scratch, server) = served();
    let ask = call("ask_user", json!({"question": "Which city?"}));
    let model = cli.model(&[&ask, r#"{"text": "Lovely."}"#]);
    let mut pty = cli.chat_pty(&[
        "--server",
        &server.api.base,
        "--model",
        &model,
        "--no-tools",
        "--client-tool",
        "ask_user",
    ]);
    pty.type_line("ask me something");
    pty.expect("? Which city? ");
    pty.keys("Lisbon\r");
    pty.expect("[client tool ask_user result: Lisbon]");
    pty.expect("Lovely.");
    pty.prompt();
    pty.control('d');
    let id = pty.id.clone();
    assert_eq!(pty.exit_code(), 0);
    let (requested, completed) = client_calls(&served_events(&cli, &scratch, &id));
    assert_eq!(requested, ["ask_user"]);
    assert_eq!(completed, [("Lisbon".to_owned(), false)]);
}

#[test]
fn a_call_left_waiting_is_asked_again_when_the_session_resumes_with_its_tools() {
    let (cli, scratch, server) = served();
    let ask = call("ask_user", json!({"question": "Which river?"}));
    let model = cli.model(&[&ask, r#"{"text": "A fine river."}"#]);
    let base = server.api.base.clone();
    let args = [
        "--server",
        base.as_str(),
        "--model",
        &model,
        "--no-tools",
        "--client-tool",
        "ask_user",
    ];
    // The first chat is gone (killed) while its question waits.
    let mut first = cli
        .chat(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel chat");
    let mut stdin = first.stdin.take().expect("stdin");
    stdin.write_all(b"ask me\n").expect("write stdin");
    let session = wait_for_question(&server.api.base);
    first.kill().expect("kill the first chat");
    let _ = first.wait();
    drop(stdin);

    let again = cli.chat_piped(
        &["--server", &base, "--session", &session, "--client-tool", "ask_user"],
        "Tagus\n",
    );
    let err = stderr(&again);
    assert_eq!(again.status.code(), Some(0), "{err}");
    assert!(err.contains("? Which river? "), "{err}");
    assert_eq!(stdout(&again), "> ask me\nA fine river.\n");
    let (requested, completed) = client_calls(&served_events(&cli, &scratch, &session));
    assert_eq!(requested, ["ask_user"]);
    assert_eq!(completed, [("Tagus".to_owned(), false)]);
}

/// Waits until a session of the server at `base` has a client tool call
/// waiting; its id.
fn wait_for_question(base: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let api = Api::new(base.to_owned());
        wait_for_async("a client tool call to wait", Duration::from_secs(30), async || {
            let listed = api.get("/v1/sessions").await;
            listed.body["sessions"].as_array().and_then(|sessions| {
                sessions
                    .iter()
                    .find(|session| session["state"] == "awaiting_client_tool")
                    .and_then(|session| session["id"].as_str().map(str::to_owned))
            })
        })
        .await
    })
}

#[test]
fn against_a_server_a_refused_result_prints_its_code_and_the_prompt_comes_back() {
    let scratch = Scratch::new();
    let cli = Cli::new();
    // The session answers an unanswered call as an error after a second.
    let config = scratch.dir.path().join("keel.toml");
    std::fs::write(&config, "[tools]\nclient_tool_timeout_secs = 1\n").expect("write keel.toml");
    let scripts = cli.dir.path().display().to_string();
    let config_arg = config.display().to_string();
    let server = ServeProcess::start(&scratch, &["--script-dir", &scripts, "--config", &config_arg]);
    let ask = call("ask_user", json!({"question": "Too slow?"}));
    let model = cli.model(&[&ask, r#"{"text": "No answer came."}"#, r#"{"text": "Still here."}"#]);
    let mut pty = cli.chat_pty(&[
        "--server",
        &server.api.base,
        "--model",
        &model,
        "--no-tools",
        "--client-tool",
        "ask_user",
    ]);
    pty.type_line("ask me");
    pty.expect("? Too slow? ");
    let id = pty.id.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(server.api.wait_idle(&id));
    // The call timed out meanwhile: the session no longer waits for it.
    pty.keys("late\r");
    pty.expect("(tool_call_answered)");
    pty.type_line("still there?");
    pty.expect("Still here.");
    pty.prompt();
    pty.control('d');
    assert_eq!(pty.exit_code(), 0);
    let (_, completed) = client_calls(&served_events(&cli, &scratch, &id));
    assert_eq!(completed.len(), 1, "{completed:?}");
    assert!(
        completed[0].1,
        "the timeout answered the call as an error: {completed:?}"
    );
}

#[test]
fn a_local_session_left_waiting_for_a_client_result_asks_again_when_resumed() {
    let cli = Cli::new();
    let ask = call("ask_user", json!({"question": "Which sea?"}));
    let model = cli.model(&[&ask, r#"{"text": "A calm sea."}"#]);
    let args = ["--model", model.as_str(), "--no-tools", "--client-tool", "ask_user"];
    let mut pty = cli.chat_pty(&args);
    pty.type_line("ask me");
    pty.expect("? Which sea? ");
    let id = pty.id.clone();
    // The terminal goes away without an answer: the call waits, durably.
    pty.session
        .process_mut()
        .signal(rexpect::process::Signal::SIGKILL)
        .expect("kill keel chat");
    drop(pty);

    let mut resumed = vec!["--session", id.as_str()];
    resumed.extend_from_slice(&args);
    let again = cli.chat_piped(&resumed, "Baltic\n");
    let err = stderr(&again);
    assert_eq!(again.status.code(), Some(0), "{err}");
    assert!(err.contains("? Which sea? "), "{err}");
    assert_eq!(stdout(&again), "> ask me\nA calm sea.\n");
    let events = cli.events(&id);
    let (requested, completed) = client_calls(&events);
    assert_eq!(requested, ["ask_user"]);
    assert_eq!(completed, [("Baltic".to_owned(), false)]);
    let ends: Vec<&str> = events
        .iter()
        .filter(|event| event.msg.ends_turn())
        .map(|event| event.msg.kind())
        .collect();
    assert_eq!(ends, ["turn_complete"], "the waiting turn went on, not closed");
}
