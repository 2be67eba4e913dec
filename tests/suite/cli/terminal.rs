//! What reaches the terminal: escape sequences in model text, tool output,
//! tool arguments and errors are shown escaped (`\u{1b}`), never acted on;
//! `--json` output is left exactly as it was.

use rexpect::session::{Options, spawn_with_options};

use super::chat::wire;
use crate::suite::support::process::{Cli, parse_events, session_of, stderr, stdout};
use keel::protocol::EventMsg;

/// Escape sequences a terminal acts on: an OSC 52 clipboard write, a title
/// change, a screen clear, a C1 CSI (in UTF-8) and a right-to-left override.
const RAW: [&str; 5] = [
    "\u{1b}]52;c;aGVsbG8=\u{7}",
    "\u{1b}]0;title\u{7}",
    "\u{1b}[2J",
    "\u{9b}31m",
    "\u{202e}",
];

/// The same, as they are shown.
const SHOWN: [&str; 5] = [
    "\\u{1b}]52;c;aGVsbG8=\\u{7}",
    "\\u{1b}]0;title\\u{7}",
    "\\u{1b}[2J",
    "\\u{9b}31m",
    "\\u{202e}",
];

/// A text holding every sequence in [`RAW`], ending in `END`.
fn hostile_text() -> String {
    format!("A{}B{}C{}D{}E{}F END", RAW[0], RAW[1], RAW[2], RAW[3], RAW[4])
}

/// A script line streaming [`hostile_text`] in pieces cut inside the
/// sequences, so each delta holds only part of one.
fn hostile_chunks() -> String {
    let text = hostile_text();
    let cuts = [2, 9, 22, 30, 37];
    let mut chunks = Vec::new();
    let mut from = 0;
    for cut in cuts {
        let at = text.char_indices().nth(cut).map(|(at, _)| at).expect("cut inside");
        chunks.push(text[from..at].to_owned());
        from = at;
    }
    chunks.push(text[from..].to_owned());
    serde_json::json!({"chunks": chunks}).to_string()
}

/// Fails naming the sequence if any of [`RAW`] is in `seen` (`wired`: as
/// rexpect shows bytes), or if none of [`SHOWN`] is.
fn assert_escaped(seen: &str, wired: bool, what: &str) {
    let form = |text: &str| if wired { wire(text) } else { text.to_owned() };
    for raw in RAW {
        assert!(
            !seen.contains(&form(raw)),
            "{what} passed {raw:?} through raw: {seen:?}"
        );
    }
    for shown in SHOWN {
        assert!(seen.contains(&form(shown)), "{what} does not show {shown:?}: {seen:?}");
    }
}

#[test]
fn run_shows_escape_sequences_in_model_text_escaped_and_json_keeps_them() {
    let cli = Cli::new();
    let text = serde_json::json!({"text": hostile_text()}).to_string();
    let script = cli.script("s.jsonl", &[&text, &hostile_chunks()]);
    let model = format!("script:{}", script.display());

    let output = cli.run(&["run", "--model", &model, "one", "two"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = stdout(&output);
    assert_escaped(&printed, false, "keel run (whole text)");
    let answers: Vec<&str> = printed.lines().collect();
    assert_eq!(answers.len(), 2, "{printed:?}");
    assert_eq!(
        answers[0], answers[1],
        "streamed in pieces, the text is escaped the same"
    );

    // --json: every event is the stored one, serialised as before.
    let json = cli.run(&["run", "--json", "--model", &model, "three"]);
    assert!(json.status.success(), "{}", stderr(&json));
    let events = parse_events(&json.stdout);
    let lines: Vec<String> = events
        .iter()
        .map(|event| serde_json::to_string(event).expect("json"))
        .collect();
    assert_eq!(stdout(&json), format!("{}\n", lines.join("\n")));
    assert!(
        events
            .iter()
            .any(|event| matches!(&event.msg, EventMsg::AssistantMessage(message) if message.text == hostile_text())),
        "the text is stored and printed unchanged in JSON"
    );

    // The log read back as text is escaped too.
    let session = session_of(&events);
    let log = cli.run(&["events", "--session", &session]);
    assert!(log.status.success(), "{}", stderr(&log));
    for raw in RAW {
        assert!(
            !stdout(&log).contains(raw),
            "keel events passed {raw:?}: {}",
            stdout(&log)
        );
    }
    assert!(stdout(&log).contains("\\u{9b}31m"), "{}", stdout(&log));
}

#[test]
fn run_shows_escapes_in_tool_output_arguments_and_errors_escaped() {
    let cli = Cli::new();
    // A file in the workspace holds every sequence; `read_file` returns it
    // as the tool's output (no sandbox status line in front, unlike the
    // shell's, so it is within the 200 characters a note shows). The shell
    // call's argument holds a raw C1 CSI and an override (JSON leaves them
    // raw).
    std::fs::write(cli.dir.path().join("escapes.txt"), hostile_text()).expect("escapes.txt");
    let command = format!("true # {}{}", RAW[3], RAW[4]);
    let call = serde_json::json!({"tool_calls": [
        {"id": "c1", "name": "read_file", "arguments": {"path": "escapes.txt"}},
        {"id": "c2", "name": "shell", "arguments": {"command": command}},
    ]});
    let error = serde_json::json!({"error": format!("down {}", RAW[0])});
    let script = cli.script(
        "s.jsonl",
        &[&call.to_string(), r#"{"text": "done"}"#, &error.to_string()],
    );
    let model = format!("script:{}", script.display());
    let output = cli.run(&["run", "--approve", "auto", "--model", &model, "go", "again"]);
    assert_eq!(
        output.status.code(),
        Some(1),
        "the second turn fails: {}",
        stderr(&output)
    );
    let notes = stderr(&output);
    assert!(
        notes.contains("A\\u{1b}]52;c;aGVsbG8=\\u{7}B"),
        "the file was read: {notes}"
    );
    assert!(
        notes.contains("error: model failed: down \\u{1b}]52;c;aGVsbG8=\\u{7}"),
        "{notes}"
    );
    // No colour without a terminal: any ESC at all came from the model.
    assert!(!notes.contains('\u{1b}'), "{notes:?}");
    assert_escaped(&notes, false, "keel run's notes");
}

#[test]
fn chat_on_a_terminal_shows_history_and_streamed_escapes_escaped() {
    let cli = Cli::new();
    let text = serde_json::json!({"text": hostile_text()}).to_string();
    let script = cli.script("s.jsonl", &[&text, &hostile_chunks()]);
    let model = format!("script:{}", script.display());
    // The first answer is stored; the chat shows it as history.
    let first = cli.run(&["run", "--new-session", "demo", "--model", &model, "first"]);
    assert!(first.status.success(), "{}", stderr(&first));

    let mut command = cli.chat(&["--session", "demo", "--no-tools"]);
    command.env("TERM", "xterm").env("NO_COLOR", "1");
    // Not stripped: what the terminal would be sent, byte for byte.
    let options = Options::new().timeout_ms(Some(30_000)).strip_ansi_escape_codes(false);
    let mut pty = spawn_with_options(command, options).expect("spawn keel chat on a pty");
    let history = pty.exp_string("END").expect("the history is shown");
    let rest = pty.exp_string("> ").expect("the prompt");
    let history = format!("{history}END{rest}");
    assert_escaped(&history, true, "the chat's history");
    pty.send_line("second").expect("type");
    let streamed = pty.exp_string("END").expect("the streamed answer");
    assert_escaped(&format!("{streamed}END"), true, "the chat's streamed answer");
    pty.send_control('d').expect("Ctrl-D");
    pty.exp_eof().expect("keel chat ends");
}
