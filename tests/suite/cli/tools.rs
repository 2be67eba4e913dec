//! `keel run` with tools: approvals answered from the command line, the
//! shell's sandbox, MCP servers from `keel.toml`, and a process killed in the
//! middle of a side-effecting tool call.

use std::time::Duration;

use keel::protocol::{AbortReason, ApprovalDecision, EventMsg, RecordedEvent};
use keel::tools::workspace::SandboxPolicy;
use keel::tools::workspace::sandbox::probe;

use crate::suite::mcp::{mcp_skipped, node_modules};
use crate::suite::support::events::{assert_gapless, tool_results};
use crate::suite::support::process::{Cli, Running, parse_events, session_of, stderr, stdout};
use crate::suite::support::process::{marker, processes_with};
use crate::suite::support::wait::{HANG_GUARD, poll_for, wait_until};

/// A script that calls one tool and then answers `done`.
fn one_call(cli: &Cli, name: &str, arguments: serde_json::Value) -> String {
    let call = serde_json::json!({"tool_calls": [{"id": "call-1", "name": name, "arguments": arguments}]});
    let script = cli.script("s.jsonl", &[&call.to_string(), r#"{"text": "done"}"#]);
    format!("script:{}", script.display())
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

fn count(events: &[RecordedEvent], kind: &str) -> usize {
    events.iter().filter(|event| event.msg.kind() == kind).count()
}

#[test]
fn the_approve_flag_answers_approval_requests_and_a_denied_write_changes_nothing() {
    let cli = Cli::new();
    let model = one_call(
        &cli,
        "write_file",
        serde_json::json!({"path": "note.txt", "content": "hello"}),
    );
    let note = cli.dir.path().join("note.txt");

    // Not on a terminal, `ask` cannot ask: the call is denied, and said so.
    let asked = cli.run(&["run", "--json", "--model", &model, "write a note"]);
    assert!(asked.status.success(), "{}", stderr(&asked));
    assert!(stderr(&asked).contains("no terminal to ask on"), "{}", stderr(&asked));
    let events = parse_events(&asked.stdout);
    assert_eq!(count(&events, "approval_requested"), 1);
    assert_eq!(decisions(&events), [ApprovalDecision::Deny]);
    let results = tool_results(&events);
    assert_eq!(results.len(), 1);
    assert!(results[0].1.starts_with("denied by user"), "{results:?}");
    assert!(!note.exists(), "a denied write must not happen");

    let denied = cli.run(&["run", "--json", "--approve", "deny", "--model", &model, "write a note"]);
    assert!(denied.status.success(), "{}", stderr(&denied));
    assert_eq!(decisions(&parse_events(&denied.stdout)), [ApprovalDecision::Deny]);
    assert!(!note.exists());

    let approved = cli.run(&["run", "--json", "--approve", "auto", "--model", &model, "write a note"]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    let events = parse_events(&approved.stdout);
    assert_eq!(decisions(&events), [ApprovalDecision::Approve]);
    assert_eq!(tool_results(&events).len(), 1);
    assert!(!tool_results(&events)[0].2, "{:?}", tool_results(&events));
    assert_eq!(std::fs::read_to_string(&note).expect("the note"), "hello");
}

#[test]
fn keel_toml_sets_approval_policies_and_which_tools_are_offered() {
    let cli = Cli::new();
    let model = one_call(&cli, "write_file", serde_json::json!({"path": "x.txt", "content": "x"}));
    let config = cli.dir.path().join("keel.toml");

    // A denying policy wins over --approve auto, without asking.
    std::fs::write(&config, "[approvals]\ntools = { write_file = \"deny\" }\n").expect("config");
    let output = cli.run(&["run", "--json", "--approve", "auto", "--model", &model, "go"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let events = parse_events(&output.stdout);
    assert_eq!(count(&events, "approval_requested"), 0);
    let results = tool_results(&events);
    assert!(
        results[0].2 && results[0].1.starts_with("denied by policy"),
        "{results:?}"
    );

    // An auto policy runs it without asking, even with --approve deny.
    std::fs::write(&config, "[approvals]\ntools = { write_file = \"auto\" }\n").expect("config");
    let output = cli.run(&["run", "--json", "--approve", "deny", "--model", &model, "go"]);
    let events = parse_events(&output.stdout);
    assert_eq!(count(&events, "approval_requested"), 0);
    assert!(!tool_results(&events)[0].2, "{:?}", tool_results(&events));
    assert_eq!(
        std::fs::read_to_string(cli.dir.path().join("x.txt")).expect("written"),
        "x"
    );

    // Without the writing tools the call names an unknown tool.
    std::fs::write(&config, "[tools]\nwrite = false\nshell = false\n").expect("config");
    let output = cli.run(&["run", "--json", "--approve", "auto", "--model", &model, "go"]);
    let events = parse_events(&output.stdout);
    let results = tool_results(&events);
    assert!(results[0].2 && results[0].1.contains("unknown tool"), "{results:?}");
    let EventMsg::SessionStarted(started) = &events[0].msg else {
        panic!("first event: {:?}", events[0].msg)
    };
    assert_eq!(started.sandbox, None, "no shell, no sandbox to report");

    // A bad section is a one-line error before anything runs.
    std::fs::write(&config, "[tools]\nsandbox = \"none\"\n").expect("config");
    let output = cli.run(&["run", "--model", &model, "go"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("unknown variant `none`"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn the_session_records_its_sandbox_and_a_read_only_shell_cannot_write() {
    let cli = Cli::new();
    let model = one_call(&cli, "shell", serde_json::json!({"command": "echo hi > made.txt"}));
    let output = cli.run(&[
        "run",
        "--json",
        "--approve",
        "auto",
        "--sandbox",
        "read-only",
        "--model",
        &model,
        "make a file",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let events = parse_events(&output.stdout);
    let EventMsg::SessionStarted(started) = &events[0].msg else {
        panic!("first event: {:?}", events[0].msg)
    };
    let sandbox = started.sandbox.clone().expect("the shell's sandbox is recorded");
    let expected = probe(SandboxPolicy::ReadOnly);
    assert_eq!(sandbox.policy, "read-only");
    assert_eq!(sandbox.enforced, expected.enforced, "{sandbox:?}");
    let result = &tool_results(&events)[0];
    if expected.enforced {
        assert!(result.1.starts_with("[sandbox: read-only, enforced"), "{result:?}");
        assert!(result.2, "the write fails: {result:?}");
        assert!(!cli.dir.path().join("made.txt").exists());
    } else {
        // The kernel cannot enforce it: the session says so up front.
        assert!(result.1.starts_with("[sandbox: read-only, not enforced"), "{result:?}");
        assert_eq!(count(&events, "warning"), 1);
    }
}

#[test]
fn mcp_servers_from_keel_toml_serve_the_session_and_end_with_it() {
    if mcp_skipped("mcp_servers_from_keel_toml_serve_the_session_and_end_with_it", true) {
        return;
    }
    let cli = Cli::new();
    let tag = marker();
    let index = node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
    std::fs::write(
        cli.dir.path().join("keel.toml"),
        format!(
            "[mcp.servers.everything]\ncommand = \"node\"\nargs = [{:?}, \"stdio\", {tag:?}]\n\n\
             [mcp.servers.broken]\ncommand = \"/nonexistent/mcp-server\"\n",
            index.display().to_string()
        ),
    )
    .expect("config");
    let model = one_call(&cli, "everything__echo", serde_json::json!({"message": "through keel"}));
    let output = cli.run(&["run", "--json", "--approve", "auto", "--model", &model, "echo it"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let events = parse_events(&output.stdout);
    let warnings: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::Warning(warning) => Some(warning.message.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        warnings
            .iter()
            .any(|warning| warning.starts_with("the MCP server 'broken' was left out")),
        "{warnings:?}"
    );
    assert_eq!(
        tool_results(&events),
        [("call-1".to_owned(), "Echo: through keel".to_owned(), false)]
    );
    // The server ended with the session that started it.
    assert_eq!(processes_with(&tag), Vec::<u32>::new());
}

#[test]
fn an_mcp_calls_progress_reaches_keel_run_as_events_and_outlives_the_calls_timeout() {
    let cli = Cli::new();
    let tag = marker();
    let index = node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
    // The call takes 3 s and reports every half second; the timeout is 1 s.
    std::fs::write(
        cli.dir.path().join("keel.toml"),
        format!(
            "[mcp.servers.everything]\ncommand = \"node\"\nargs = [{:?}, \"stdio\", {tag:?}]\ntimeout_secs = 1\n",
            index.display().to_string()
        ),
    )
    .expect("config");
    let model = one_call(
        &cli,
        "everything__trigger-long-running-operation",
        serde_json::json!({"duration": 3, "steps": 6}),
    );
    let output = cli.run(&["run", "--json", "--approve", "auto", "--model", &model, "go"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let events = parse_events(&output.stdout);
    assert_eq!(
        tool_results(&events),
        [(
            "call-1".to_owned(),
            "Long running operation completed. Duration: 3 seconds, Steps: 6.".to_owned(),
            false
        )]
    );
    let progress: Vec<f64> = events
        .iter()
        .filter(|event| event.msg.kind() == "tool_call_progress")
        .map(|event| {
            let value = serde_json::to_value(&event.msg).expect("serialize");
            assert_eq!(value["call_id"], "call-1", "{value}");
            assert_eq!(value["total"], 6.0, "{value}");
            value["progress"].as_f64().expect("progress")
        })
        .collect();
    // Reports are snapshots: in order, and (on a busy machine) the last may
    // be overtaken by the answer.
    assert!(progress.len() >= 5, "{progress:?}");
    assert!(progress.windows(2).all(|pair| pair[0] < pair[1]), "{progress:?}");
    assert!(progress.iter().all(|step| (1.0..=6.0).contains(step)), "{progress:?}");
}

/// Kills every process working in `dir`: a safety net, as the launcher ends
/// a killed runtime's shell commands itself (see the test below).
fn kill_processes_in(dir: &std::path::Path) {
    let dir = dir.canonicalize().expect("dir");
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else {
            continue;
        };
        if std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd == dir) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Runs `keel run` on `message` with a script whose first answer is `call`
/// (a step whose first shell call appends to `count.txt`, then sleeps) and
/// "recovered" after it; kills the runtime as soon as that call did its side
/// effect (its start is printed only once durable), kills what it left, and
/// continues the session with "again". Answers what the first run
/// delivered and the second run.
fn crash_during_first_call_then_resume(
    cli: &Cli,
    call: &serde_json::Value,
    message: &str,
) -> (Vec<RecordedEvent>, std::process::Output) {
    let script = cli.script("s.jsonl", &[&call.to_string(), r#"{"text": "recovered"}"#]);
    let model = format!("script:{}", script.display());
    let counter = cli.dir.path().join("count.txt");
    let running = Running::start(
        cli,
        &["run", "--json", "--approve", "auto", "--model", &model, message],
        |msg| matches!(msg, EventMsg::ToolCallStarted(_)),
    );
    wait_until("the command to run", HANG_GUARD, || counter.exists());
    let seen = running.crash();
    kill_processes_in(cli.dir.path());
    let session = session_of(&seen);
    let resumed = cli.run(&[
        "run",
        "--session",
        &session,
        "--approve",
        "auto",
        "--model",
        &model,
        "again",
    ]);
    (seen, resumed)
}

#[test]
fn a_runtime_killed_during_a_tool_call_never_runs_it_twice_and_answers_it_on_resume() {
    let cli = Cli::new();
    let call = serde_json::json!({"tool_calls": [
        {"id": "side-effect", "name": "shell", "arguments": {"command": "echo ran >> count.txt && exec sleep 60"}}
    ]});
    let counter = cli.dir.path().join("count.txt");
    let (seen, resumed) = crash_during_first_call_then_resume(&cli, &call, "count once");
    let session = session_of(&seen);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert_eq!(stdout(&resumed), "recovered\n");

    // Exactly one execution of the side effect.
    assert_eq!(std::fs::read_to_string(&counter).expect("counter"), "ran\n");
    let events = cli.events(&session);
    assert_gapless(&events, 1);
    assert_eq!(
        events[..seen.len()],
        seen[..],
        "what was delivered is in the log, unchanged"
    );
    // The call that never finished has exactly one result, saying so.
    let results = tool_results(&events);
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].0, "side-effect");
    assert!(results[0].2, "{results:?}");
    assert!(
        results[0].1.starts_with("interrupted:") && results[0].1.contains("may or may not have completed"),
        "{results:?}"
    );
    assert_eq!(count(&events, "tool_call_started"), 1, "the call is not started again");
    let aborted: Vec<&EventMsg> = events
        .iter()
        .map(|event| &event.msg)
        .filter(|msg| matches!(msg, EventMsg::TurnAborted(aborted) if aborted.reason == AbortReason::RuntimeStopped))
        .collect();
    assert_eq!(aborted.len(), 1, "{aborted:?}");
    // Its result comes before the crashed turn is closed, and the next turn
    // runs on that well-formed history.
    let result_at = events
        .iter()
        .position(|event| event.msg.kind() == "tool_call_completed");
    let aborted_at = events.iter().position(|event| event.msg.kind() == "turn_aborted");
    assert!(result_at < aborted_at);
    assert_eq!(count(&events, "turn_complete"), 1);
}

/// One step asking for more approvals than the control lane holds (16):
/// `--approve auto` answers every one of them and the files are written.
#[test]
fn approve_auto_answers_a_step_of_more_approvals_than_the_control_lane_holds() {
    let cli = Cli::new();
    let calls: Vec<serde_json::Value> = (0..40)
        .map(|index| {
            serde_json::json!({"id": format!("write-{index}"), "name": "write_file",
                "arguments": {"path": format!("file-{index}.txt"), "content": "x"}})
        })
        .collect();
    let step = serde_json::json!({ "tool_calls": calls });
    let script = cli.script("s.jsonl", &[&step.to_string(), r#"{"text": "all written"}"#]);
    let model = format!("script:{}", script.display());
    let output = cli.run(&[
        "run",
        "--json",
        "--approve",
        "auto",
        "--model",
        &model,
        "write 40 files",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let events = parse_events(&output.stdout);
    assert_eq!(count(&events, "approval_requested"), 40);
    assert_eq!(decisions(&events), vec![ApprovalDecision::Approve; 40]);
    assert_eq!(count(&events, "turn_complete"), 1);
    for index in 0..40 {
        assert!(
            cli.dir.path().join(format!("file-{index}.txt")).exists(),
            "file {index}"
        );
    }
}

/// A step of two calls run in order, cut during the first: the first may
/// have run, but the second never started, and its result says so.
#[test]
fn a_runtime_killed_during_the_first_of_two_calls_answers_the_second_not_run() {
    let cli = Cli::new();
    let call = serde_json::json!({"tool_calls": [
        {"id": "first", "name": "shell", "arguments": {"command": "echo ran >> count.txt && exec sleep 60"}},
        {"id": "second", "name": "shell", "arguments": {"command": "echo ran >> second.txt"}}
    ]});
    let (seen, resumed) = crash_during_first_call_then_resume(&cli, &call, "two calls");
    let session = session_of(&seen);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert!(
        !cli.dir.path().join("second.txt").exists(),
        "the second call never runs"
    );
    let events = cli.events(&session);
    assert_gapless(&events, 1);
    assert_eq!(count(&events, "tool_call_started"), 1, "only the first call started");
    let results = tool_results(&events);
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!((results[0].0.as_str(), results[1].0.as_str()), ("first", "second"));
    assert!(results[0].2 && results[1].2, "{results:?}");
    assert!(
        results[0].1.contains("may or may not have completed"),
        "the started call may have run: {results:?}"
    );
    assert!(
        results[1].1.starts_with("not run:") && !results[1].1.contains("may or may not"),
        "the call that never started was not run: {results:?}"
    );
}

#[test]
fn a_runtime_killed_during_a_shell_call_leaves_none_of_its_processes_running() {
    for (index, policy) in ["read-only", "workspace-write", "full-access"].into_iter().enumerate() {
        killed_during_a_shell_call(policy, 3001 + 2 * index);
    }
}

/// `keel run` under `policy` is killed while a shell call runs a
/// background job and one that left the command's process group and
/// session with setsid (their durations, `marker` and `marker + 1`, are
/// how they are found): neither may outlive the runtime.
fn killed_during_a_shell_call(policy: &str, marker: usize) {
    let cli = Cli::new();
    let markers = [marker.to_string(), (marker + 1).to_string()];
    let call = serde_json::json!({"tool_calls": [{"id": "long", "name": "shell", "arguments": {
        "command": format!("sleep {} & setsid sleep {} & wait", markers[0], markers[1])
    }}]});
    let script = cli.script("s.jsonl", &[&call.to_string()]);
    let model = format!("script:{}", script.display());
    let running = Running::start(
        &cli,
        &[
            "run",
            "--json",
            "--approve",
            "auto",
            "--sandbox",
            policy,
            "--model",
            &model,
            "wait a long time",
        ],
        |msg| matches!(msg, EventMsg::ToolCallStarted(_)),
    );
    let running_now = || -> Vec<u32> { markers.iter().flat_map(|marker| processes_with(marker)).collect() };
    let mut pids = Vec::new();
    let started = poll_for(HANG_GUARD, || {
        pids = running_now();
        (pids.len() == 2).then_some(())
    });
    assert!(started.is_some(), "{policy}: the command never started: {pids:?}");
    running.crash();
    // Nobody is left to kill them but the launcher watching its parent.
    let mut left = Vec::new();
    let ended = poll_for(Duration::from_secs(10), || {
        left = running_now();
        left.is_empty().then_some(())
    });
    assert!(
        ended.is_some(),
        "{policy}: the shell call's processes outlived the runtime: {left:?} (were {pids:?})"
    );
}
