//! `keel chat` going on after what it can recover from: a server that
//! answered with an error or could not be reached keeps the prompt; `/model`
//! changes the session's model; and a database a `keel serve` serves is
//! chatted on through that server, `/edit` included.

use super::{served, served_events};
use crate::suite::support::events::user_messages;
use crate::suite::support::process::{Cli, stderr, stdout};
use crate::suite::support::server::{Scratch, ServeProcess, free_port};

/// `keel serve` on `port` of loopback, on `scratch`'s database, letting
/// clients use the scripts in `cli`'s directory.
fn serve_on(scratch: &Scratch, cli: &Cli, port: u16) -> ServeProcess {
    let listen = format!("127.0.0.1:{port}");
    let scripts = cli.dir.path().display().to_string();
    ServeProcess::start(scratch, &["--listen", &listen, "--script-dir", &scripts])
}

#[test]
fn against_a_server_a_lost_connection_is_said_and_the_chat_goes_on_once_it_is_back() {
    let scratch = Scratch::new();
    let cli = Cli::new();
    let port = free_port();
    let server = serve_on(&scratch, &cli, port);
    let model = cli.model(&[r#"{"text": "One."}"#, r#"{"text": "Two."}"#]);
    let base = server.api.base.clone();
    let mut pty = cli.chat_pty(&["--server", &base, "--model", &model, "--no-tools"]);
    pty.type_line("first");
    pty.expect("One.");
    let (status, _) = server.terminate();
    assert!(status.success());

    // The server is gone: said, and the prompt is back (the line did not
    // go to the shell).
    pty.type_line("while it is down");
    pty.expect("cannot reach the server");
    let _server = serve_on(&scratch, &cli, port);
    pty.type_line("second");
    pty.expect("Two.");
    pty.type_line("/quit");
    assert_eq!(pty.exit_code(), 0);
    let events = served_events(&cli, &scratch, &pty_id(&cli, &scratch));
    assert_eq!(user_messages(&events), ["first", "second"]);
}

/// The one session of `scratch`'s database.
fn pty_id(cli: &Cli, scratch: &Scratch) -> String {
    let db = scratch.db().display().to_string();
    let listed = cli.run(&["sessions", "--json", "--db", &db]);
    let text = stdout(&listed);
    let first: serde_json::Value = serde_json::from_str(text.lines().next().expect("a session")).expect("JSON");
    first["session_id"].as_str().expect("its id").to_owned()
}

#[test]
fn against_a_server_an_error_answer_shows_its_code_and_keeps_the_prompt() {
    let (cli, _scratch, server) = served();
    let model = cli.model(&[r#"{"text": "Still here."}"#]);
    let mut pty = cli.chat_pty(&["--server", &server.api.base, "--model", &model, "--no-tools"]);
    // A model spec the server refuses.
    pty.type_line("/model nosuchprovider:x");
    pty.expect("the server answered 4");
    pty.type_line("hello");
    pty.expect("Still here.");
    pty.type_line("/quit");
    assert_eq!(pty.exit_code(), 0);
}

#[test]
fn slash_model_switches_the_model_of_a_local_chat() {
    let cli = Cli::new();
    let first = cli.model(&[r#"{"text": "From the first."}"#]);
    // A script answers the session's n-th model call with its n-th line:
    // the second model's first line is the first call's, already made.
    let second = cli.script(
        "second.jsonl",
        &[r#"{"text": "Not asked."}"#, r#"{"text": "From the second."}"#],
    );
    let input = format!("hi\n/model script:{}\nagain\n", second.display());
    let output = cli.chat_piped(&["--model", &first, "--no-tools"], &input);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "From the first.\nFrom the second.\n");
    assert!(stderr(&output).contains("model: script:"), "{}", stderr(&output));

    // A spec that cannot be built leaves the model as it was.
    let bad = cli.chat_piped(&["--model", &first, "--no-tools"], "/model nosuchprovider:x\n");
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("unknown model provider 'nosuchprovider'"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn a_chat_on_a_served_database_goes_through_the_server_and_edit_leaves_no_orphan() {
    let (cli, scratch, server) = served();
    let model = cli.model(&[r#"{"text": "One."}"#, r#"{"text": "Two."}"#]);
    let db = scratch.db().display().to_string();
    let output = cli.chat_piped(
        &["--db", &db, "--model", &model, "--no-tools"],
        "hi\n/edit hello instead\n",
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "One.\nOne.\n");
    let err = stderr(&output);
    assert!(err.contains("is served by keel serve"), "{err}");
    assert!(err.contains("chatting through it"), "{err}");
    let parent = err
        .lines()
        .find_map(|line| line.strip_prefix("session "))
        .expect("session line")
        .to_owned();
    let fork = err
        .lines()
        .find_map(|line| line.strip_prefix("editing in a fork: session "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the fork")
        .to_owned();
    // Both sessions are the server's, each with its own conversation.
    assert_eq!(user_messages(&served_events(&cli, &scratch, &parent)), ["hi"]);
    assert_eq!(user_messages(&served_events(&cli, &scratch, &fork)), ["hello instead"]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let listed = runtime.block_on(server.api.get("/v1/sessions"));
    let count = listed.body["sessions"].as_array().map_or(0, Vec::len);
    assert_eq!(count, 2, "{}", listed.body);
}

#[test]
fn a_server_url_without_a_scheme_is_http() {
    let (cli, _scratch, server) = served();
    let model = cli.model(&[r#"{"text": "Plain."}"#]);
    let bare = server.api.base.trim_start_matches("http://").to_owned();
    let output = cli.chat_piped(&["--server", &bare, "--model", &model, "--no-tools"], "hi\n");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "Plain.\n");
}

#[test]
fn against_a_server_slash_model_changes_the_sessions_stored_model() {
    let (cli, _scratch, server) = served();
    let first = cli.model(&[r#"{"text": "From the first."}"#]);
    let second = cli.script(
        "second.jsonl",
        &[r#"{"text": "Not asked."}"#, r#"{"text": "From the second."}"#],
    );
    let spec = format!("script:{}", second.display());
    let input = format!("hi\n/model {spec}\nagain\n");
    let output = cli.chat_piped(&["--server", &server.api.base, "--model", &first, "--no-tools"], &input);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "From the first.\nFrom the second.\n");
    let id = stderr(&output)
        .lines()
        .find_map(|line| line.strip_prefix("session "))
        .expect("session line")
        .to_owned();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let shown = runtime.block_on(server.api.session(&id));
    assert_eq!(shown["model"], spec.as_str(), "{shown}");
}

#[test]
fn an_edit_whose_fork_cannot_be_opened_leaves_no_fork_and_the_chat_goes_on() {
    let cli = Cli::new();
    let model = cli.model(&[r#"{"text": "One."}"#]);
    let workspace = cli.dir.path().join("work");
    std::fs::create_dir(&workspace).expect("workspace");
    let workspace_arg = workspace.display().to_string();
    let mut pty = cli.chat_pty(&["--model", &model, "--no-tools", "--workspace", &workspace_arg]);
    pty.type_line("hi");
    pty.expect("One.");
    // The fork would work in a workspace that is gone: it cannot be opened.
    std::fs::remove_dir(&workspace).expect("remove the workspace");
    pty.type_line("/edit hello instead");
    pty.expect("cannot open the fork");
    pty.type_line("/session");
    pty.expect(&pty.id.clone());
    pty.type_line("/quit");
    assert_eq!(pty.exit_code(), 0);
    let listed = cli.run(&["sessions", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert_eq!(stdout(&listed).lines().count(), 1, "{}", stdout(&listed));
}

#[test]
fn a_chat_on_a_served_database_takes_the_servers_token_file() {
    let scratch = Scratch::new();
    let cli = Cli::new();
    let token = scratch.dir.path().join("token");
    std::fs::write(&token, "served-token\n").expect("token");
    let token_arg = token.display().to_string();
    let scripts = cli.dir.path().display().to_string();
    let _server = ServeProcess::start(&scratch, &["--token-file", &token_arg, "--script-dir", &scripts]);
    let model = cli.model(&[r#"{"text": "Authorized."}"#]);
    let db = scratch.db().display().to_string();
    let args = ["--db", db.as_str(), "--model", model.as_str(), "--no-tools"];
    let refused = cli.chat_piped(&args, "hi\n");
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("401"), "{}", stderr(&refused));
    let mut with_token = args.to_vec();
    with_token.extend(["--token-file", token_arg.as_str()]);
    let output = cli.chat_piped(&with_token, "hi\n");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "Authorized.\n");

    // Without a server, a token file has no use: said, not ignored.
    let alone = Cli::new();
    let local = alone.chat_piped(&["--token-file", &token_arg, "--model", &model], "hi\n");
    assert!(
        stderr(&local).contains("--token-file is for a server"),
        "{}",
        stderr(&local)
    );
}
