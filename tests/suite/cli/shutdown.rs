//! How `keel run` ends: its MCP servers stopped the graceful way (stdin
//! closed first) rather than killed with the runtime, and SIGTERM or SIGHUP
//! handled like Ctrl-C (turn interrupted, session closed, servers stopped)
//! instead of killing the process on the spot.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use keel::protocol::{AbortReason, EventMsg};
use nix::sys::signal::Signal;

use crate::suite::support::process::{Cli, Running, wait_exit};
use crate::suite::support::process::{marker, processes_with};
use crate::suite::support::server::{Scratch, ServeProcess};
use crate::suite::support::wait::{HANG_GUARD, wait_until};

/// An MCP server (newline-delimited JSON-RPC on stdio) that notes in the
/// file given as its first argument how it was ended: `stdin closed` (after
/// a short delay, as a server finishing its work would) or `sigterm`. Its
/// tool `ping` answers at once, `wait` never. It starts a helper (tagged
/// with its second argument) that outlives it unless stopped.
const NOTING_SERVER: &str = r#"
const fs = require("fs");
const log = process.argv[2];
// A helper in the server's process group, left behind when it exits.
require("child_process").spawn("sh", ["-c", "sleep 60; true", process.argv[3]], { stdio: "ignore" });
const send = (message) => process.stdout.write(JSON.stringify(message) + "\n");
const reply = (id, result) => send({ jsonrpc: "2.0", id, result });
process.on("SIGTERM", () => { fs.appendFileSync(log, "sigterm\n"); process.exit(0); });
function handle(message) {
  if (message.id === undefined) return;
  const { id, method, params } = message;
  switch (method) {
    case "initialize":
      return reply(id, { protocolVersion: params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: "noting", version: "1.0.0" } });
    case "tools/list":
      return reply(id, { tools: [
        { name: "ping", inputSchema: { type: "object", properties: {} } },
        { name: "wait", inputSchema: { type: "object", properties: {} } },
      ] });
    case "tools/call":
      if (params.name === "ping") return reply(id, { content: [{ type: "text", text: "pong" }] });
      return;
  }
  send({ jsonrpc: "2.0", id, error: { code: -32601, message: "no method " + method } });
}
let buffered = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
  buffered += chunk;
  let end;
  while ((end = buffered.indexOf("\n")) >= 0) {
    const line = buffered.slice(0, end);
    buffered = buffered.slice(end + 1);
    if (line.trim()) handle(JSON.parse(line));
  }
});
process.stdin.on("end", () => setTimeout(() => { fs.appendFileSync(log, "stdin closed\n"); process.exit(0); }, 300));
"#;

/// Writes keel.toml with the noting server (tagged with `tag`) and a
/// script calling its tool `tool`; returns the model spec and the server's
/// note file.
fn setup(cli: &Cli, tag: &str, tool: &str) -> (String, PathBuf) {
    let server = cli.dir.path().join("noting.js");
    std::fs::write(&server, NOTING_SERVER).expect("write the server");
    let notes = cli.dir.path().join("notes.txt");
    std::fs::write(
        cli.dir.path().join("keel.toml"),
        format!(
            "[mcp.servers.noting]\ncommand = \"node\"\nargs = [{:?}, {:?}, {tag:?}]\n",
            server.display().to_string(),
            notes.display().to_string()
        ),
    )
    .expect("write keel.toml");
    let call =
        serde_json::json!({"tool_calls": [{"id": "call-1", "name": format!("noting__{tool}"), "arguments": {}}]});
    let script = cli.script("s.jsonl", &[&call.to_string(), r#"{"text": "done"}"#]);
    (format!("script:{}", script.display()), notes)
}

fn notes(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn keel_run_closes_its_mcp_servers_stdin_and_lets_them_exit_when_it_ends() {
    let cli = Cli::new();
    let tag = marker();
    let (model, notes_file) = setup(&cli, &tag, "ping");
    let output = cli.run(&["run", "--json", "--approve", "auto", "--model", &model, "ping it"]);
    assert!(output.status.success(), "{}", super::stderr(&output));
    // Not killed with the runtime: the server saw its stdin close and
    // finished on its own before keel exited.
    assert_eq!(notes(&notes_file), "stdin closed\n");
    assert_eq!(processes_with(&tag), Vec::<u32>::new());
}

/// Sends `signal` to `keel run` in the middle of an MCP call and checks it
/// ends like after Ctrl-C: the turn interrupted, the session closed, the
/// server stopped the graceful way, the exit code 128 + the signal.
fn signal_mid_call(signal: Signal, code: i32) {
    let cli = Cli::new();
    let tag = marker();
    let (model, notes_file) = setup(&cli, &tag, "wait");
    let mut running = Running::start(
        &cli,
        &["run", "--json", "--approve", "auto", "--model", &model, "wait for it"],
        |msg| msg.kind() == "tool_call_started",
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(running.child.id()).expect("pid"));
    nix::sys::signal::kill(pid, signal).expect("signal keel");
    let status =
        wait_exit(&mut running.child, HANG_GUARD).unwrap_or_else(|| panic!("keel run did not end after {signal}"));
    assert_eq!(status.signal(), None, "keel run was killed by {signal}");
    assert_eq!(status.code(), Some(code));
    for line in running.lines.by_ref() {
        let line = line.expect("read line");
        running.seen.push(serde_json::from_str(&line).expect("event json"));
    }
    let aborted = running.seen.iter().find_map(|event| match &event.msg {
        EventMsg::TurnAborted(aborted) => Some(aborted.reason),
        _ => None,
    });
    assert_eq!(aborted, Some(AbortReason::Interrupted));
    assert_eq!(
        running.seen.last().map(|event| event.msg.kind()),
        Some("shutdown_complete")
    );
    assert_eq!(notes(&notes_file), "stdin closed\n");
    assert_eq!(processes_with(&tag), Vec::<u32>::new());
}

#[test]
fn sigterm_to_keel_run_interrupts_the_turn_closes_the_session_and_stops_the_mcp_servers() {
    signal_mid_call(Signal::SIGTERM, 143);
}

#[test]
fn sighup_to_keel_run_interrupts_the_turn_closes_the_session_and_stops_the_mcp_servers() {
    signal_mid_call(Signal::SIGHUP, 129);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_keel_serve_shutdown_stops_the_sessions_mcp_servers_the_graceful_way() {
    let scratch = Scratch::new();
    let cli = Cli {
        dir: tempfile::tempdir_in(scratch.dir.path()).expect("temp dir"),
    };
    let tag = marker();
    let (_, notes_file) = setup(&cli, &tag, "ping");
    // The server reads keel.toml from its directory.
    std::fs::copy(cli.dir.path().join("keel.toml"), scratch.dir.path().join("keel.toml")).expect("keel.toml");
    let model = scratch.script("answer.jsonl", &[r#"{"text": "hello"}"#]);
    let server = ServeProcess::start(&scratch, &[]);
    server
        .api
        .create(serde_json::json!({"id": "with-mcp", "model": model}))
        .await;
    server.api.say("with-mcp", "hi").await;
    server.api.wait_idle("with-mcp").await;
    assert!(!processes_with(&tag).is_empty(), "the session started its MCP server");
    let (status, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("stop");
    assert!(status.success());
    assert_eq!(notes(&notes_file), "stdin closed\n");
    assert_eq!(processes_with(&tag), Vec::<u32>::new());
}

/// `keel chat` on piped stdin (kept open), its session id read from its
/// first stderr line.
struct Chat {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    session: String,
}

impl Chat {
    fn start(cli: &Cli, model: &str) -> Self {
        use std::io::BufRead;
        let mut child = cli
            .command(&["chat", "--approve", "auto", "--model", model])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn keel chat");
        let stdin = child.stdin.take().expect("stdin");
        let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
        let mut first = String::new();
        stderr.read_line(&mut first).expect("read stderr");
        let session = first
            .trim()
            .strip_prefix("session ")
            .unwrap_or_else(|| panic!("no session line: {first:?}"))
            .to_owned();
        // The rest of stderr is drained so the chat never blocks on it.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Self { child, stdin, session }
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        wait_exit(&mut self.child, HANG_GUARD).expect("keel chat did not end")
    }

    fn signal(&self, signal: Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        nix::sys::signal::kill(pid, signal).expect("signal keel chat");
    }
}

#[test]
fn sigterm_to_keel_chat_mid_call_interrupts_the_turn_and_closes_the_session() {
    use std::io::Write;
    let cli = Cli::new();
    let tag = marker();
    let (model, notes_file) = setup(&cli, &tag, "wait");
    let mut chat = Chat::start(&cli, &model);
    writeln!(chat.stdin, "wait for it").expect("write a line");
    wait_until("the call to start", HANG_GUARD, || {
        cli.events(&chat.session)
            .iter()
            .any(|event| event.msg.kind() == "tool_call_started")
    });
    chat.signal(Signal::SIGTERM);
    let status = chat.wait();
    assert_eq!(status.signal(), None, "keel chat was killed by SIGTERM");
    assert_eq!(status.code(), Some(143));
    let events = cli.events(&chat.session);
    let aborted = events.iter().find_map(|event| match &event.msg {
        EventMsg::TurnAborted(aborted) => Some(aborted.reason),
        _ => None,
    });
    assert_eq!(aborted, Some(AbortReason::Interrupted));
    assert_eq!(events.last().map(|event| event.msg.kind()), Some("shutdown_complete"));
    assert_eq!(notes(&notes_file), "stdin closed\n");
    assert_eq!(processes_with(&tag), Vec::<u32>::new());
}

#[test]
fn sighup_to_keel_chat_at_its_prompt_closes_the_session() {
    let cli = Cli::new();
    let tag = marker();
    let (model, notes_file) = setup(&cli, &tag, "ping");
    let mut chat = Chat::start(&cli, &model);
    // Waiting for a line (stdin stays open) once the session is open. The
    // chat listens for SIGHUP before it opens the session, so one sent from
    // here on is handled at the prompt, however soon.
    wait_until("the session to open", HANG_GUARD, || {
        !processes_with(&tag).is_empty() && !cli.events(&chat.session).is_empty()
    });
    chat.signal(Signal::SIGHUP);
    let status = chat.wait();
    assert_eq!(status.signal(), None, "keel chat was killed by SIGHUP");
    assert_eq!(status.code(), Some(129));
    let events = cli.events(&chat.session);
    assert_eq!(events.last().map(|event| event.msg.kind()), Some("shutdown_complete"));
    assert_eq!(notes(&notes_file), "stdin closed\n");
    assert_eq!(processes_with(&tag), Vec::<u32>::new());
}
