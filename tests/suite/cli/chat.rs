//! `keel chat` as a user runs it: lines piped in by a script, and a real
//! terminal (a pty driven with rexpect) for streaming, the spinner, Ctrl-C,
//! inline approvals and the input history; on the local database and
//! against a `keel serve` process.
//!
//! Timeouts here only guard against hangs; no assertion measures time.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use keel::protocol::{AbortReason, ApprovalDecision, EventMsg, RecordedEvent};
use rexpect::process::{Signal, WaitStatus};
use rexpect::session::{Options, PtySession, spawn_with_options};

use crate::suite::support::events::{assert_gapless, user_messages};
use crate::suite::support::process::{Cli, assert_one_line_error, stderr, stdout, wait_exit};
use crate::suite::support::server::{Scratch, ServeProcess};

/// How long one expectation on the terminal may wait before the test fails.
const PTY_GUARD_MS: u64 = 30_000;

impl Cli {
    /// `keel chat ARGS` with a home, data and config directory of its own,
    /// so no user's keel.toml or history is read or written.
    pub(super) fn chat(&self, args: &[&str]) -> Command {
        let mut command = self.command(&["chat"]);
        command
            .args(args)
            .env("HOME", self.dir.path().join("home"))
            .env("XDG_DATA_HOME", self.data_home())
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env_remove("KEEL_CONFIG")
            .env_remove("KEEL_CHAT_HISTORY")
            .env_remove("KEEL_TOKEN")
            .env_remove("KEEL_API_KEY")
            .env_remove("NO_COLOR");
        command
    }

    fn data_home(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A script's model spec.
    fn model(&self, lines: &[&str]) -> String {
        format!("script:{}", self.script("s.jsonl", lines).display())
    }

    /// `keel chat ARGS` with `input` piped to stdin, run to its end.
    fn chat_piped(&self, args: &[&str], input: &str) -> Output {
        let mut child = self
            .chat(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn keel chat");
        // A chat that fails before reading (an unknown session, say) may
        // be gone before its input is written: a broken pipe is its answer.
        match child.stdin.take().expect("stdin").write_all(input.as_bytes()) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(error) => panic!("write stdin: {error}"),
        }
        child.wait_with_output().expect("keel chat output")
    }

    /// `keel chat ARGS` on a terminal.
    fn chat_pty(&self, args: &[&str]) -> Pty {
        let mut command = self.chat(args);
        command.env("TERM", "xterm");
        let options = Options::new()
            .timeout_ms(Some(PTY_GUARD_MS))
            .strip_ansi_escape_codes(true);
        let mut session = spawn_with_options(command, options).expect("spawn keel chat on a pty");
        let (_, line) = session
            .exp_regex("session [0-9a-f-]{36}")
            .expect("keel chat names its session");
        let id = line.trim_start_matches("session ").to_owned();
        Pty { session, id }
    }
}

/// `keel chat` on a pseudo-terminal.
struct Pty {
    session: PtySession,
    /// The session's id, as printed.
    id: String,
}

impl Pty {
    /// Waits for `text` on the terminal; returns what came before it.
    fn expect(&mut self, text: &str) -> String {
        match self.session.exp_string(&wire(text)) {
            Ok(before) => before,
            Err(error) => panic!("waiting for {text:?} on the terminal: {error}"),
        }
    }

    /// Waits for the prompt (the line editor is then reading keys).
    fn prompt(&mut self) -> String {
        self.expect("> ")
    }

    /// Types `text` and Enter at the prompt.
    fn type_line(&mut self, text: &str) {
        self.prompt();
        self.keys(&format!("{text}\r"));
    }

    fn keys(&mut self, keys: &str) {
        self.session.send(keys).expect("type");
        self.session.flush().expect("flush the keys");
    }

    /// Presses Ctrl-`key`.
    fn control(&mut self, key: char) {
        self.session.send_control(key).expect("send a control key");
    }

    /// Waits for the process to end; its exit code.
    fn exit_code(mut self) -> i32 {
        self.session.exp_eof().expect("keel chat ends");
        match self.session.process().wait().expect("reap keel chat") {
            WaitStatus::Exited(_, code) => code,
            other => panic!("keel chat did not exit normally: {other:?}"),
        }
    }
}

/// `text` as rexpect shows it: one char per byte.
pub(super) fn wire(text: &str) -> String {
    text.bytes().map(char::from).collect()
}

/// The session id `keel chat` printed first on stderr.
pub(super) fn session_line(output: &Output) -> String {
    let err = stderr(output);
    err.lines()
        .next()
        .and_then(|line| line.strip_prefix("session "))
        .unwrap_or_else(|| panic!("no session line in {err:?}"))
        .to_owned()
}

fn turn_ends(events: &[RecordedEvent]) -> Vec<&'static str> {
    events
        .iter()
        .filter(|event| event.msg.ends_turn())
        .map(|event| event.msg.kind())
        .collect()
}

fn aborts(events: &[RecordedEvent]) -> Vec<AbortReason> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::TurnAborted(aborted) => Some(aborted.reason),
            _ => None,
        })
        .collect()
}

fn decisions(events: &[RecordedEvent]) -> Vec<ApprovalDecision> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ApprovalDecided(decided) => Some(decided.decision),
            _ => None,
        })
        .collect()
}

/// A script line streaming `count` chunks slowly enough to press Ctrl-C in
/// the middle (the pause comes before each chunk).
fn slow_answer(count: usize) -> String {
    let chunks: Vec<String> = (0..count).map(|index| format!("w{index} ")).collect();
    serde_json::json!({"chunks": chunks, "delay_ms": 250}).to_string()
}

/// A script line asking to write `path`.
fn write_call(path: &str) -> String {
    serde_json::json!({"tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": "hello"}}]})
        .to_string()
}

#[test]
fn piped_lines_are_one_turn_each_with_plain_text_out() {
    let cli = Cli::new();
    let model = cli.model(&[
        r#"{"text": "Hello there."}"#,
        r#"{"chunks": ["One, ", "two."], "delay_ms": 5}"#,
    ]);
    let output = cli.chat_piped(&["--model", &model, "--no-tools"], "hi\n\ncount\n");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "Hello there.\nOne, two.\n");
    let err = stderr(&output);
    assert!(
        !err.contains('\x1b') && !err.contains('\r'),
        "plain text when not on a terminal: {err:?}"
    );

    let events = cli.events(&session_line(&output));
    assert_gapless(&events, 1);
    assert_eq!(user_messages(&events), ["hi", "count"], "a blank line is no message");
    assert_eq!(turn_ends(&events), ["turn_complete", "turn_complete"]);
}

#[test]
fn piped_chat_stops_at_a_failed_turn_and_denies_approvals() {
    let cli = Cli::new();
    let model = cli.model(&[
        &write_call("note.txt"),
        r#"{"text": "no note"}"#,
        r#"{"error": "the model is down"}"#,
    ]);
    let output = cli.chat_piped(&["--model", &model], "write a note\nfail\nnever sent\n");
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("no terminal to ask on"), "{err}");
    assert!(err.contains("the model is down"), "{err}");
    assert!(
        !cli.dir.path().join("note.txt").exists(),
        "a denied write must not happen"
    );
    let events = cli.events(&session_line(&output));
    assert_eq!(decisions(&events), [ApprovalDecision::Deny]);
    assert_eq!(user_messages(&events), ["write a note", "fail"]);
    assert_eq!(aborts(&events), [AbortReason::ModelFailed]);
}

/// One step asking for more approvals than the control lane holds (16):
/// every decision reaches the session and the turn completes.
#[test]
fn piped_chat_answers_a_step_of_more_approvals_than_the_control_lane_holds() {
    let cli = Cli::new();
    let calls: Vec<serde_json::Value> = (0..40)
        .map(|index| {
            serde_json::json!({"id": format!("write-{index}"), "name": "write_file",
                "arguments": {"path": format!("file-{index}.txt"), "content": "x"}})
        })
        .collect();
    let step = serde_json::json!({ "tool_calls": calls }).to_string();
    let model = cli.model(&[&step, r#"{"text": "all written"}"#]);
    let mut child = cli
        .chat(&["--model", &model, "--approve", "auto"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel chat");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"write 40 files\n")
        .expect("write stdin");
    // A decision lost to a full lane leaves the turn waiting for ever.
    if wait_exit(&mut child, std::time::Duration::from_secs(60)).is_none() {
        let _ = child.kill();
        panic!("keel chat hung: an approval decision was lost");
    }
    let output = child.wait_with_output().expect("keel chat output");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "all written\n");
    let events = cli.events(&session_line(&output));
    assert_eq!(decisions(&events), vec![ApprovalDecision::Approve; 40]);
    for index in 0..40 {
        assert!(
            cli.dir.path().join(format!("file-{index}.txt")).exists(),
            "file {index}"
        );
    }
}

#[test]
fn resuming_a_session_prints_its_history_and_continues_its_log() {
    let cli = Cli::new();
    let model = cli.model(&[r#"{"text": "first answer"}"#, r#"{"text": "second answer"}"#]);
    let first = cli.chat_piped(&["--model", &model, "--no-tools"], "one\n");
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let session = session_line(&first);
    let before = cli.events(&session);

    let second = cli.chat_piped(&["--session", &session, "--model", &model, "--no-tools"], "two\n");
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert_eq!(session_line(&second), session);
    assert_eq!(stdout(&second), "> one\nfirst answer\nsecond answer\n");

    let events = cli.events(&session);
    assert_gapless(&events, 1);
    assert_eq!(events[..before.len()], before[..], "the earlier log is unchanged");
    assert_eq!(user_messages(&events), ["one", "two"]);
    assert_eq!(turn_ends(&events), ["turn_complete", "turn_complete"]);
}

#[test]
fn an_unknown_session_is_a_one_line_error() {
    let cli = Cli::new();
    let model = cli.model(&[r#"{"text": "x"}"#]);
    let no_db = cli.chat_piped(&["--session", "ghost", "--model", &model], "hi\n");
    assert_one_line_error(&no_db, "no database");
    assert!(!cli.db().exists(), "resuming creates no database");

    let first = cli.chat_piped(&["--model", &model, "--no-tools"], "hi\n");
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let output = cli.chat_piped(&["--session", "ghost", "--model", &model], "hi\n");
    assert_one_line_error(&output, "unknown session 'ghost'");
}

#[test]
fn on_a_terminal_the_answer_streams_after_a_spinner() {
    let cli = Cli::new();
    // The pause before the only chunk leaves the spinner time to show.
    let model = cli.model(&[r#"{"chunks": ["Hello from the pty."], "delay_ms": 2000}"#]);
    let mut pty = cli.chat_pty(&["--model", &model, "--no-tools"]);
    pty.type_line("hi");
    let before_spinner = pty.expect(SPINNER_FIRST_FRAME);
    assert!(!before_spinner.contains("Hello"), "{before_spinner:?}");
    pty.expect("Hello from the pty.");
    pty.prompt();
    pty.control('d');
    let id = pty.id.clone();
    assert_eq!(pty.exit_code(), 0);
    let events = cli.events(&id);
    assert_eq!(user_messages(&events), ["hi"]);
    assert_eq!(turn_ends(&events), ["turn_complete"]);
}

/// The first frame of the spinner.
const SPINNER_FIRST_FRAME: &str = "⠋";

#[test]
fn ctrl_c_interrupts_the_turn_and_a_second_at_the_prompt_leaves() {
    let cli = Cli::new();
    let model = cli.model(&[&slow_answer(40), r#"{"text": "still here"}"#]);
    let mut pty = cli.chat_pty(&["--model", &model, "--no-tools"]);
    pty.type_line("tell me a story");
    pty.expect("w0 ");
    pty.control('c');
    pty.expect("turn aborted (interrupted)");
    // The chat goes on in the same session.
    pty.type_line("are you there?");
    pty.expect("still here");
    pty.prompt();
    pty.control('c');
    let id = pty.id.clone();
    assert_eq!(pty.exit_code(), 0);

    let events = cli.events(&id);
    assert_gapless(&events, 1);
    assert_eq!(aborts(&events), [AbortReason::Interrupted]);
    assert_eq!(turn_ends(&events), ["turn_aborted", "turn_complete"]);
    assert_eq!(user_messages(&events), ["tell me a story", "are you there?"]);
}

#[test]
fn approvals_are_asked_inline_and_answered_with_y_or_n() {
    let cli = Cli::new();
    let model = cli.model(&[
        &write_call("yes.txt"),
        r#"{"text": "wrote it"}"#,
        &write_call("no.txt"),
        r#"{"text": "did not write it"}"#,
    ]);
    let mut pty = cli.chat_pty(&["--model", &model]);
    pty.type_line("write yes.txt");
    pty.expect("Allow write_file");
    pty.expect("[y]es / [n]o / [a]lways: ");
    pty.keys("y\r");
    pty.expect("[approved write_file]");
    // Tool calls and their results show as lines of their own.
    pty.expect("[tool write_file");
    pty.expect("[tool result:");
    pty.expect("wrote it");
    pty.type_line("write no.txt");
    pty.expect("Allow write_file");
    pty.expect("[y]es / [n]o / [a]lways: ");
    pty.keys("n\r");
    pty.expect("[denied write_file]");
    pty.expect("did not write it");
    pty.prompt();
    pty.control('d');
    let id = pty.id.clone();
    assert_eq!(pty.exit_code(), 0);

    assert_eq!(
        std::fs::read_to_string(cli.dir.path().join("yes.txt")).expect("the approved write"),
        "hello"
    );
    assert!(
        !cli.dir.path().join("no.txt").exists(),
        "a denied write must not happen"
    );
    let events = cli.events(&id);
    assert_eq!(decisions(&events), [ApprovalDecision::Approve, ApprovalDecision::Deny]);
    assert_eq!(turn_ends(&events), ["turn_complete", "turn_complete"]);
}

#[test]
fn up_recalls_earlier_lines_and_the_history_outlives_the_process() {
    let cli = Cli::new();
    let model = cli.model(&[r#"{"text": "answer one"}"#, r#"{"text": "answer two"}"#]);
    let up = "\x1b[A";
    let mut pty = cli.chat_pty(&["--model", &model, "--no-tools"]);
    pty.type_line("first line");
    pty.expect("answer one");
    // Up recalls the line just sent.
    pty.prompt();
    pty.keys(&format!("{up}\r"));
    pty.expect("answer two");
    pty.prompt();
    pty.control('d');
    let id = pty.id.clone();
    assert_eq!(pty.exit_code(), 0);

    // The history lives in the data directory, for the next chat.
    let saved = std::fs::read_to_string(cli.data_home().join("keel").join("chat_history")).expect("the history file");
    assert!(saved.contains("first line"), "{saved:?}");

    // A new chat (a resumed one would print "> " lines of its history).
    let mut pty = cli.chat_pty(&["--model", &model, "--no-tools"]);
    let second = pty.id.clone();
    pty.type_line("second line");
    pty.expect("answer one");
    pty.prompt();
    pty.keys(&format!("{up}{up}\r"));
    pty.expect("answer two");
    pty.prompt();
    pty.control('d');
    assert_eq!(pty.exit_code(), 0);

    assert_eq!(user_messages(&cli.events(&id)), ["first line", "first line"]);
    assert_eq!(user_messages(&cli.events(&second)), ["second line", "first line"]);
}

#[test]
fn the_history_file_can_be_chosen() {
    let cli = Cli::new();
    let model = cli.model(&[r#"{"text": "noted"}"#]);
    let history = cli.dir.path().join("my_history");
    let mut command_args = vec!["--model", model.as_str(), "--no-tools"];
    let history_arg = history.display().to_string();
    command_args.extend(["--history", history_arg.as_str()]);
    let mut pty = cli.chat_pty(&command_args);
    pty.type_line("remember me");
    pty.expect("noted");
    pty.prompt();
    pty.control('d');
    assert_eq!(pty.exit_code(), 0);
    let saved = std::fs::read_to_string(&history).expect("the history file");
    assert!(saved.contains("remember me"), "{saved:?}");
    assert!(!cli.data_home().join("keel").join("chat_history").exists());
}

/// `keel serve` on a loopback port, and a scratch directory for `keel chat`.
fn served() -> (Cli, Scratch, ServeProcess) {
    let scratch = Scratch::new();
    let cli = Cli::new();
    // The chat names scripts in its own scratch directory: the server lets
    // clients use scripts from there.
    let scripts = cli.dir.path().display().to_string();
    let server = ServeProcess::start(&scratch, &["--script-dir", &scripts]);
    (cli, scratch, server)
}

/// The stored log of a session of the server, read by `keel events`.
pub(super) fn served_events(cli: &Cli, scratch: &Scratch, session: &str) -> Vec<RecordedEvent> {
    let db = scratch.db().display().to_string();
    let output = cli.run(&[
        "events",
        "--db",
        &db,
        "--session",
        session,
        "--json",
        "--limit",
        "10000",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    super::parse_events(&output.stdout)
}

#[test]
fn against_a_server_piped_lines_are_turns_and_a_session_resumes() {
    let (cli, scratch, server) = served();
    let model = cli.model(&[
        r#"{"text": "Hello there."}"#,
        r#"{"chunks": ["One, ", "two."], "delay_ms": 5}"#,
        r#"{"text": "Three."}"#,
    ]);
    let base = server.api.base.clone();
    let output = cli.chat_piped(&["--server", &base, "--model", &model, "--no-tools"], "hi\ncount\n");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "Hello there.\nOne, two.\n");
    let session = session_line(&output);

    let again = cli.chat_piped(&["--server", &base, "--session", &session], "more\n");
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(stdout(&again), "> hi\nHello there.\n> count\nOne, two.\nThree.\n");

    let events = served_events(&cli, &scratch, &session);
    assert_gapless(&events, 1);
    assert_eq!(user_messages(&events), ["hi", "count", "more"]);
    assert_eq!(turn_ends(&events), ["turn_complete", "turn_complete", "turn_complete"]);
}

#[test]
fn against_a_server_an_unknown_session_is_a_one_line_error() {
    let (cli, _scratch, server) = served();
    let output = cli.chat_piped(&["--server", &server.api.base, "--session", "ghost"], "hi\n");
    assert_one_line_error(&output, "unknown session 'ghost' on the server");

    let nobody = cli.chat_piped(&["--server", "http://127.0.0.1:1"], "hi\n");
    assert_one_line_error(&nobody, "cannot reach the server");
}

#[test]
fn against_a_server_ctrl_c_interrupts_the_turn() {
    let (cli, scratch, server) = served();
    let model = cli.model(&[&slow_answer(40), r#"{"text": "still here"}"#]);
    let mut pty = cli.chat_pty(&["--server", &server.api.base, "--model", &model, "--no-tools"]);
    pty.type_line("tell me a story");
    pty.expect("w0 ");
    pty.control('c');
    pty.expect("turn aborted (interrupted)");
    pty.type_line("are you there?");
    pty.expect("still here");
    pty.prompt();
    pty.control('d');
    let id = pty.id.clone();
    assert_eq!(pty.exit_code(), 0);

    let events = served_events(&cli, &scratch, &id);
    assert_eq!(aborts(&events), [AbortReason::Interrupted]);
    assert_eq!(turn_ends(&events), ["turn_aborted", "turn_complete"]);
}

#[test]
fn a_question_left_unanswered_is_asked_again_when_the_session_resumes() {
    let cli = Cli::new();
    let model = cli.model(&[&write_call("later.txt"), r#"{"text": "wrote it later"}"#]);
    let mut pty = cli.chat_pty(&["--model", &model]);
    pty.type_line("write later.txt");
    pty.expect("[y]es / [n]o / [a]lways: ");
    let id = pty.id.clone();
    // The terminal goes away without an answer.
    pty.session
        .process_mut()
        .signal(Signal::SIGKILL)
        .expect("kill keel chat");
    drop(pty);

    let mut pty = cli.chat_pty(&["--session", &id, "--model", &model]);
    pty.expect("Allow write_file");
    pty.expect("[y]es / [n]o / [a]lways: ");
    pty.keys("y\r");
    pty.expect("wrote it later");
    pty.prompt();
    pty.control('d');
    assert_eq!(pty.exit_code(), 0);

    assert!(
        cli.dir.path().join("later.txt").exists(),
        "the write approved on resume ran"
    );
    let events = cli.events(&id);
    assert_gapless(&events, 1);
    assert_eq!(decisions(&events), [ApprovalDecision::Approve]);
    assert_eq!(turn_ends(&events), ["turn_complete"]);
}

#[test]
fn against_a_server_approvals_are_asked_inline() {
    let (cli, scratch, server) = served();
    let model = cli.model(&[&write_call("yes.txt"), r#"{"text": "wrote it"}"#]);
    let mut pty = cli.chat_pty(&["--server", &server.api.base, "--model", &model]);
    pty.type_line("write yes.txt");
    pty.expect("Allow write_file");
    pty.expect("[y]es / [n]o / [a]lways: ");
    pty.keys("y\r");
    pty.expect("[approved write_file]");
    pty.expect("wrote it");
    pty.prompt();
    pty.control('d');
    let id = pty.id.clone();
    assert_eq!(pty.exit_code(), 0);

    // The server's session works in its own directory under the root.
    let written = scratch.workspaces().join(&id).join("yes.txt");
    assert_eq!(std::fs::read_to_string(&written).expect("the approved write"), "hello");
    let events = served_events(&cli, &scratch, &id);
    assert_eq!(decisions(&events), [ApprovalDecision::Approve]);
    assert_eq!(turn_ends(&events), ["turn_complete"]);
}

#[test]
fn sigint_ends_a_piped_chat_after_interrupting_its_turn() {
    let cli = Cli::new();
    let model = cli.model(&[&slow_answer(40), r#"{"text": "never asked"}"#]);
    let mut child = cli
        .chat(&["--model", &model, "--no-tools"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel chat");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"tell me a story\nnot sent\n")
        .expect("write stdin");
    // Wait until the answer streams: the turn runs.
    let mut out = child.stdout.take().expect("stdout");
    let mut streamed = Vec::new();
    while !String::from_utf8_lossy(&streamed).contains("w0 ") {
        let mut chunk = [0u8; 256];
        let read = std::io::Read::read(&mut out, &mut chunk).expect("read stdout");
        assert!(read > 0, "keel chat ended before answering");
        streamed.extend_from_slice(&chunk[..read]);
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let output = child.wait_with_output().expect("keel chat output");
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("turn aborted (interrupted)"),
        "{}",
        stderr(&output)
    );

    let events = cli.events(&session_line(&output));
    assert_gapless(&events, 1);
    assert_eq!(aborts(&events), [AbortReason::Interrupted]);
    assert_eq!(
        user_messages(&events),
        ["tell me a story"],
        "nothing after the interrupt is sent"
    );
}

#[test]
fn slash_commands_print_the_session_and_help_and_double_slash_sends_a_slash() {
    let cli = Cli::new();
    let model = cli.model(&[r#"{"text": "a path"}"#]);
    let output = cli.chat_piped(&["--model", &model, "--no-tools"], "/session\n/help\n//etc/hosts?\n");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let session = session_line(&output);
    let out = stdout(&output);
    assert!(out.starts_with(&format!("{session}\n")), "{out}");
    assert!(out.contains("/exit"), "the help lists the commands: {out}");
    assert!(out.ends_with("a path\n"), "{out}");
    assert_eq!(user_messages(&cli.events(&session)), ["/etc/hosts?"]);

    // In a script an unknown command ends the chat: what follows may not make sense.
    let unknown = cli.chat_piped(&["--model", &model, "--no-tools"], "/nope\nhi\n");
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("unknown command /nope"),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn against_a_server_with_a_token_the_chat_sends_it_and_a_missing_one_is_explained() {
    let scratch = Scratch::new();
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, "chat-token\n").expect("write the token");
    let token_path = token_file.display().to_string();
    let cli = Cli::new();
    let scripts = cli.dir.path().display().to_string();
    let server = ServeProcess::start(&scratch, &["--token-file", &token_path, "--script-dir", &scripts]);
    let model = cli.model(&[r#"{"text": "authorized"}"#]);
    let base = server.api.base.clone();

    let output = cli.chat_piped(
        &[
            "--server",
            &base,
            "--token-file",
            &token_path,
            "--model",
            &model,
            "--no-tools",
        ],
        "hi\n",
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "authorized\n");

    let by_env = cli
        .chat(&["--server", &base, "--session", &session_line(&output)])
        .env("KEEL_TOKEN", "chat-token")
        .stdin(Stdio::null())
        .output()
        .expect("run keel chat");
    assert_eq!(by_env.status.code(), Some(0), "{}", stderr(&by_env));
    assert_eq!(stdout(&by_env), "> hi\nauthorized\n");

    let without = cli.chat_piped(&["--server", &base, "--model", &model], "hi\n");
    assert_one_line_error(&without, "401");
    assert!(stderr(&without).contains("--token-file"), "{}", stderr(&without));
}

#[test]
fn against_a_server_a_new_session_takes_a_chosen_id_and_a_system_prompt() {
    let (cli, scratch, server) = served();
    let model = cli.model(&[r#"{"text": "Named."}"#]);
    let base = server.api.base.clone();
    let output = cli.chat_piped(
        &[
            "--server",
            &base,
            "--new-session",
            "picked",
            "--system",
            "Be terse.",
            "--model",
            &model,
            "--no-tools",
        ],
        "hi\n",
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(session_line(&output), "picked");
    let db = scratch.db().display().to_string();
    let listed = cli.run(&["sessions", "--json", "--db", &db]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let view: serde_json::Value = serde_json::from_str(stdout(&listed).trim()).expect("one session");
    assert_eq!(view["session_id"], "picked", "{view}");
    assert_eq!(view["context"]["settings"]["instructions"], "Be terse.", "{view}");
    // The id is taken now.
    let again = cli.chat_piped(
        &["--server", &base, "--new-session", "picked", "--model", &model],
        "hi\n",
    );
    assert_one_line_error(&again, "conflict");
}

fn compactions(events: &[RecordedEvent]) -> Vec<(String, u64)> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ContextCompacted(compacted) => Some((compacted.summary.clone(), compacted.replaced_to)),
            _ => None,
        })
        .collect()
}

#[test]
fn slash_compact_compacts_the_history_locally_and_against_a_server() {
    let (cli, scratch, server) = served();
    let model = cli.model(&[
        r#"{"text": "One."}"#,
        r#"{"text": "Two."}"#,
        r#"{"text": "they said hi and there", "summary": true}"#,
        r#"{"text": "Three."}"#,
    ]);
    let input = "/compact\nhi\nthere\n/compact\nagain\n";
    let local = cli.chat_piped(&["--model", &model, "--no-tools"], input);
    assert_eq!(local.status.code(), Some(0), "{}", stderr(&local));
    assert_eq!(stdout(&local), "One.\nTwo.\nThree.\n");
    let err = stderr(&local);
    assert!(
        err.contains("not compacted: there is no older history to compact"),
        "{err}"
    );
    assert!(err.contains("[history compacted"), "{err}");
    let events = cli.events(&session_line(&local));
    assert_gapless(&events, 1);
    assert_eq!(compactions(&events), [("they said hi and there".to_owned(), 2)]);
    assert_eq!(
        user_messages(&events),
        ["hi", "there", "again"],
        "the log keeps every message"
    );

    let base = server.api.base.clone();
    let remote = cli.chat_piped(&["--server", &base, "--model", &model, "--no-tools"], input);
    assert_eq!(remote.status.code(), Some(0), "{}", stderr(&remote));
    assert_eq!(stdout(&remote), "One.\nTwo.\nThree.\n");
    assert!(stderr(&remote).contains("[history compacted"), "{}", stderr(&remote));
    let events = served_events(&cli, &scratch, &session_line(&remote));
    assert_eq!(compactions(&events), [("they said hi and there".to_owned(), 2)]);
}

/// The fork an `/edit` went on in, from its note on stderr.
fn edited_fork(output: &Output) -> String {
    let err = stderr(output);
    err.lines()
        .find_map(|line| line.strip_prefix("editing in a fork: session "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no fork note in {err:?}"))
        .to_owned()
}

fn rolled_back_turns(events: &[RecordedEvent]) -> usize {
    events
        .iter()
        .filter(|event| matches!(event.msg, EventMsg::TurnRolledBack(_)))
        .count()
}

#[test]
fn slash_retry_answers_again_and_slash_edit_goes_on_in_a_fork_locally_and_against_a_server() {
    let (cli, scratch, server) = served();
    // A fork's scripted model starts the script again (its own model calls
    // count from 0).
    let model = cli.model(&[r#"{"text": "One."}"#, r#"{"text": "Two."}"#, r#"{"text": "Three."}"#]);
    let input = "hi\n/retry\n/edit hello instead\nmore\n";
    let local = cli.chat_piped(&["--model", &model, "--no-tools"], input);
    assert_eq!(local.status.code(), Some(0), "{}", stderr(&local));
    assert_eq!(stdout(&local), "One.\nTwo.\nOne.\nTwo.\n");
    assert!(
        stderr(&local).contains("[the last answer was rolled back"),
        "{}",
        stderr(&local)
    );
    let parent = session_line(&local);
    let events = cli.events(&parent);
    assert_gapless(&events, 1);
    assert_eq!(rolled_back_turns(&events), 1);
    assert_eq!(user_messages(&events), ["hi", "hi"], "the log keeps the undone turn");
    let fork = edited_fork(&local);
    let forked = cli.events(&fork);
    assert_eq!(forked[0].msg.kind(), "session_forked");
    assert_eq!(user_messages(&forked), ["hello instead", "more"]);
    let store = keel::store::SqliteCheckpoint::new(cli.db()).expect("open");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let history = |id: &str| {
        runtime
            .block_on(keel::CheckpointStore::load(&store, id))
            .expect("load")
            .expect("stored")
            .transcript
            .len()
    };
    assert_eq!(history(&parent), 2, "hi and its second answer");
    assert_eq!(history(&fork), 4, "the edited message, more, and their answers");

    // Nothing to regenerate: refused with the reason, and the chat goes on
    // (as after a refused /compact).
    let refused = cli.chat_piped(&["--model", &model, "--no-tools"], "/retry\nhi\n");
    assert_eq!(refused.status.code(), Some(0), "{}", stderr(&refused));
    assert_eq!(stdout(&refused), "One.\n");
    assert!(
        stderr(&refused).contains("not regenerated: there is no turn to regenerate"),
        "{}",
        stderr(&refused)
    );

    let base = server.api.base.clone();
    let remote = cli.chat_piped(&["--server", &base, "--model", &model, "--no-tools"], input);
    assert_eq!(remote.status.code(), Some(0), "{}", stderr(&remote));
    assert_eq!(stdout(&remote), "One.\nTwo.\nOne.\nTwo.\n");
    let events = served_events(&cli, &scratch, &session_line(&remote));
    assert_eq!(rolled_back_turns(&events), 1);
    let forked = served_events(&cli, &scratch, &edited_fork(&remote));
    assert_eq!(user_messages(&forked), ["hello instead", "more"]);
}

mod client_tools;
mod credentials;
mod recovery;
