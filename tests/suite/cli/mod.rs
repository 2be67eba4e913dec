//! The `keel` binary, run as a user would: real processes, real database files.

use std::process::{Command, Stdio};

use keel::protocol::{AbortReason, EventMsg, RecordedEvent};

use crate::suite::support::events::assert_gapless;
use crate::suite::support::process::{Cli, Running, assert_one_line_error, parse_events, session_of, stderr, stdout};

#[test]
fn run_streams_each_answer_and_exits_zero() {
    let cli = Cli::new();
    let script = cli.script(
        "s.jsonl",
        &[
            r#"{"text": "Hello there."}"#,
            r#"{"chunks": ["One, ", "two."], "delay_ms": 5}"#,
        ],
    );
    let output = cli.run(&["run", "--model", &format!("script:{}", script.display()), "hi", "count"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output), "Hello there.\nOne, two.\n");
    assert!(stderr(&output).starts_with("session "), "{}", stderr(&output));
}

#[test]
fn run_json_prints_every_recorded_event_in_order() {
    let cli = Cli::new();
    let script = cli.script("s.jsonl", &[r#"{"chunks": ["a", "b"]}"#]);
    let output = cli.run(&[
        "run",
        "--json",
        "--model",
        &format!("script:{}", script.display()),
        "hi",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let events = parse_events(&output.stdout);
    assert_gapless(&events, 1);
    let kinds: Vec<&str> = events.iter().map(|event| event.msg.kind()).collect();
    assert_eq!(kinds[0], "session_started");
    // The first turn records the project instructions it read (none here).
    assert_eq!(
        kinds[1..5],
        [
            "instructions_loaded",
            "turn_started",
            "user_message",
            "model_step_started"
        ]
    );
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["assistant_message", "turn_complete", "shutdown_complete"]
    );
    let streamed: String = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantContentDelta(delta) => Some(delta.delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(streamed, "ab");
    // What was printed is exactly what is stored.
    assert_eq!(cli.events(&session_of(&events)), events);
}

#[test]
fn a_second_process_resumes_the_session_and_the_script_position() {
    let cli = Cli::new();
    let script = cli.script(
        "s.jsonl",
        &[r#"{"text": "first answer"}"#, r#"{"text": "second answer"}"#],
    );
    let model = format!("script:{}", script.display());
    let first = cli.run(&["run", "--json", "--model", &model, "one"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let session = session_of(&parse_events(&first.stdout));
    let second = cli.run(&["run", "--session", &session, "--model", &model, "two"]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(stdout(&second), "second answer\n");
    let events = cli.events(&session);
    assert_gapless(&events, 1);
    let resumed: Vec<bool> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::SessionStarted(started) => Some(started.resumed),
            _ => None,
        })
        .collect();
    assert_eq!(resumed, [false, true]);
}

#[test]
fn a_killed_process_leaves_a_turn_that_the_next_process_closes() {
    let cli = Cli::new();
    let slow =
        r#"{"chunks": ["one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight "], "delay_ms": 300}"#;
    let script = cli.script("s.jsonl", &[slow, r#"{"text": "after the crash"}"#]);
    let model = format!("script:{}", script.display());
    // Wait until some streamed text is durable (it is printed only after its commit).
    let running = Running::start(&cli, &["run", "--json", "--model", &model, "tell me a story"], |msg| {
        matches!(msg, EventMsg::AssistantContentDelta(_))
    });
    let seen = running.crash();
    let session = session_of(&seen);
    let crashed_turn = seen
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::TurnStarted(started) => Some(started.turn_id.clone()),
            _ => None,
        })
        .expect("turn started before the kill");

    let after = cli.run(&["run", "--session", &session, "--model", &model, "are you there?"]);
    assert!(after.status.success(), "{}", stderr(&after));
    assert_eq!(stdout(&after), "after the crash\n");

    let events = cli.events(&session);
    assert_gapless(&events, 1);
    // Everything delivered before the kill is in the log, unchanged.
    assert_eq!(events[..seen.len()], seen[..]);
    let closing: Vec<&EventMsg> = events
        .iter()
        .map(|event| &event.msg)
        .filter(|msg| msg.ends_turn() && msg.turn_id() == Some(crashed_turn.as_str()))
        .collect();
    assert_eq!(closing.len(), 1, "the crashed turn is closed exactly once: {closing:?}");
    assert!(
        matches!(closing[0], EventMsg::TurnAborted(aborted) if aborted.reason == AbortReason::RuntimeStopped),
        "{closing:?}"
    );
}

#[test]
fn run_reads_a_message_from_stdin() {
    let cli = Cli::new();
    let script = cli.script("s.jsonl", &[r#"{"text": "got it"}"#]);
    let mut child = cli
        .command(&["run", "--json", "--model", &format!("script:{}", script.display()), "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), b"a message\nover two lines").expect("write");
    let output = child.wait_with_output().expect("keel output");
    assert!(output.status.success(), "{}", stderr(&output));
    let events = parse_events(&output.stdout);
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.msg, EventMsg::UserMessage(m) if m.text == "a message\nover two lines")),
        "{events:?}"
    );
}

#[test]
fn ctrl_c_interrupts_the_running_turn_and_keeps_what_streamed() {
    let cli = Cli::new();
    let slow = r#"{"chunks": ["one ", "two ", "three ", "four ", "five ", "six "], "delay_ms": 300}"#;
    let script = cli.script("s.jsonl", &[slow]);
    let model = format!("script:{}", script.display());
    let Running {
        mut child,
        lines,
        seen: mut events,
    } = Running::start(&cli, &["run", "--json", "--model", &model, "go"], |msg| {
        matches!(msg, EventMsg::AssistantContentDelta(_))
    });
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    events.extend(lines.map(|line| serde_json::from_str::<RecordedEvent>(&line.expect("line")).expect("event json")));
    assert_eq!(child.wait().expect("reap keel").code(), Some(130));
    let aborted = events
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::TurnAborted(aborted) => Some(aborted.reason),
            _ => None,
        })
        .expect("the turn was aborted");
    assert_eq!(aborted, AbortReason::Interrupted);
    assert!(
        !events
            .iter()
            .any(|event| matches!(event.msg, EventMsg::TurnComplete(_)))
    );
    assert_eq!(events.last().map(|event| event.msg.kind()), Some("shutdown_complete"));
    assert_eq!(
        cli.events(&session_of(&events)),
        events,
        "what was printed is what is stored"
    );
}

#[test]
fn a_scripted_tool_call_runs_the_clock_and_feeds_the_next_step() {
    let cli = Cli::new();
    let script = cli.script(
        "s.jsonl",
        &[
            r#"{"tool_calls": [{"name": "clock", "arguments": {}}]}"#,
            r#"{"text": "It is now."}"#,
        ],
    );
    let output = cli.run(&[
        "run",
        "--json",
        "--model",
        &format!("script:{}", script.display()),
        "time?",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let events = parse_events(&output.stdout);
    let kinds: Vec<&str> = events.iter().map(|event| event.msg.kind()).collect();
    let started = kinds
        .iter()
        .position(|kind| *kind == "tool_call_started")
        .expect("a tool call");
    assert_eq!(kinds[started + 1], "tool_call_completed");
    assert_eq!(kinds[started + 2], "model_step_started");
    let output_text = events
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(done) if !done.is_error => Some(done.output.clone()),
            _ => None,
        })
        .expect("the clock answered");
    assert!(output_text.contains("unix_ms"), "{output_text}");

    // Without tools, the same call is an error result and the turn goes on.
    let again = cli.run(&[
        "run",
        "--json",
        "--no-tools",
        "--model",
        &format!("script:{}", script.display()),
        "time?",
    ]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(parse_events(&again.stdout).iter().any(
        |event| matches!(&event.msg, EventMsg::ToolCallCompleted(done) if done.is_error && done.output.contains("unknown tool"))
    ));
}

#[test]
fn models_come_from_keel_toml_and_missing_ones_are_one_line_errors() {
    let cli = Cli::new();
    let script = cli.script("s.jsonl", &[r#"{"text": "from the config"}"#]);
    std::fs::write(
        cli.dir.path().join("keel.toml"),
        format!(
            "model = \"scripted\"\n[models.scripted]\nprovider = \"script\"\nmodel = {:?}\n",
            script.display().to_string()
        ),
    )
    .expect("write keel.toml");
    let output = cli
        .command(&["run", "hi"])
        .env_remove("KEEL_CONFIG")
        .output()
        .expect("run keel");
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output), "from the config\n");

    std::fs::remove_file(cli.dir.path().join("keel.toml")).expect("remove keel.toml");
    let no_model = cli
        .command(&["run", "hi"])
        .env_remove("KEEL_CONFIG")
        .output()
        .expect("run keel");
    assert_one_line_error(&no_model, "no model");
    let no_key = cli
        .command(&["run", "--model", "openai:gpt-4.1-mini", "hi"])
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .expect("run keel");
    assert_one_line_error(&no_key, "set OPENAI_API_KEY");
}

#[test]
fn events_pages_backwards_through_the_log() {
    let cli = Cli::new();
    let script = cli.script("s.jsonl", &[r#"{"text": "x"}"#]);
    let first = cli.run(&[
        "run",
        "--json",
        "--model",
        &format!("script:{}", script.display()),
        "hi",
    ]);
    let all = parse_events(&first.stdout);
    let session = session_of(&all);
    let newest = cli.run(&["events", "--session", &session, "--json", "--limit", "3"]);
    assert_eq!(parse_events(&newest.stdout), all[all.len() - 3..]);
    let before = all[all.len() - 3].sequence.to_string();
    let older = cli.run(&[
        "events",
        "--session",
        &session,
        "--json",
        "--limit",
        "2",
        "--before",
        &before,
    ]);
    assert_eq!(parse_events(&older.stdout), all[all.len() - 5..all.len() - 3]);
    let human = cli.run(&["events", "--session", &session]);
    let text = stdout(&human);
    assert_eq!(text.lines().count(), all.len());
    assert!(text.contains("turn_complete") && text.contains("\"x\""), "{text}");
}

#[test]
fn sessions_lists_what_was_run() {
    let cli = Cli::new();
    let script = cli.script("s.jsonl", &[r#"{"text": "x"}"#]);
    let run = cli.run(&[
        "run",
        "--json",
        "--bot",
        "support-bot",
        "--model",
        &format!("script:{}", script.display()),
        "hi",
    ]);
    let session = session_of(&parse_events(&run.stdout));
    let listed = cli.run(&["sessions", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let line = stdout(&listed);
    let summary: serde_json::Value = serde_json::from_str(line.trim()).expect("one session");
    assert_eq!(summary["session_id"], session.as_str());
    assert_eq!(summary["bot_id"], "support-bot");
    assert_eq!(summary["running_turn_id"], serde_json::Value::Null);
}

#[test]
fn a_failing_model_turn_is_recorded_and_exits_non_zero() {
    let cli = Cli::new();
    let script = cli.script("s.jsonl", &[r#"{"error": "the model is down"}"#]);
    let output = cli.run(&[
        "run",
        "--json",
        "--model",
        &format!("script:{}", script.display()),
        "hi",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let events = parse_events(&output.stdout);
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.msg, EventMsg::Error(error) if error.message.contains("the model is down")))
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.msg, EventMsg::TurnAborted(a) if a.reason == AbortReason::ModelFailed))
    );
}

#[test]
fn bad_input_gives_one_line_errors_and_touches_nothing() {
    let cli = Cli::new();
    let missing = cli.run(&["run", "--model", "script:nope.jsonl", "hi"]);
    assert_one_line_error(&missing, "nope.jsonl");
    assert!(!cli.db().exists(), "no database is created when the input is bad");

    let bad = cli.script("bad.jsonl", &[r#"{"text": "ok"}"#, "{not json"]);
    assert_one_line_error(
        &cli.run(&["run", "--model", &format!("script:{}", bad.display()), "hi"]),
        "line 2",
    );
    assert_one_line_error(
        &cli.run(&["run", "--model", "telepathy:v1", "hi"]),
        "unknown model provider 'telepathy'",
    );
    assert_one_line_error(&cli.run(&["run", "--model", "no-provider", "hi"]), "provider");
    let good = cli.script("good.jsonl", &[r#"{"text": "ok"}"#]);
    let model = format!("script:{}", good.display());
    let huge = "x".repeat(keel::protocol::MAX_MESSAGE_BYTES + 1);
    let mut child = cli
        .command(&["run", "--model", &model, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel");
    let mut stdin = child.stdin.take().expect("stdin");
    // keel may refuse before reading everything; a broken pipe is fine.
    let _ = std::io::Write::write_all(&mut stdin, huge.as_bytes());
    drop(stdin);
    assert_one_line_error(&child.wait_with_output().expect("keel output"), "limit");
    assert!(!cli.db().exists());

    assert_one_line_error(&cli.run(&["events", "--session", "s"]), "no database");
    assert_one_line_error(
        &cli.run(&["run", "--session", "ghost", "--model", &model, "hi"]),
        "unknown session 'ghost'",
    );
    assert_one_line_error(&cli.run(&["events", "--session", "ghost"]), "unknown session 'ghost'");

    let garbage = cli.dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![0x5a; 8192]).expect("write garbage");
    let output = cli
        .command(&["sessions"])
        .env("KEEL_DB", &garbage)
        .output()
        .expect("run keel");
    assert_one_line_error(&output, "not a keel database");
    assert_eq!(
        std::fs::read(&garbage).expect("read garbage"),
        vec![0x5a; 8192],
        "the file is left as it was"
    );
}

#[test]
fn bench_turns_prints_a_table_and_a_json_summary() {
    let cli = Cli::new();
    let output = cli.run(&["bench", "turns", "-S", "2", "-T", "3", "-K", "4", "-B", "8"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let last = text.lines().last().expect("output");
    let report: serde_json::Value = serde_json::from_str(last).expect("last line is JSON");
    for key in [
        "turns_per_s",
        "chunks_per_s",
        "turn_latency_mean_ms",
        "turn_latency_p99_ms",
        "db_on_disk_bytes",
        "peak_rss_mib",
    ] {
        assert!(
            report[key].as_f64().is_some_and(|value| value > 0.0),
            "{key} in {report}"
        );
    }
    assert!(text.starts_with("| S | T | K | B |"), "{text}");
}

#[test]
fn bench_serve_checks_every_subscriber_and_reports_each_run() {
    let cli = Cli::new();
    let output = cli.run(&[
        "bench", "serve", "-S", "2", "-T", "3", "-K", "4", "-B", "8", "-W", "3", "--repeat", "1",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let last = text.lines().last().expect("output");
    let summary: serde_json::Value = serde_json::from_str(last).expect("last line is JSON");
    let runs = summary["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 6, "{summary}");
    for (run, (subscribers, stalled)) in
        runs.iter()
            .zip([(1, false), (2, false), (2, true), (1, false), (1, false), (1, false)])
    {
        let report = &run["reports"][0];
        assert_eq!(report["subscribers"], subscribers, "{run}");
        assert_eq!(report["stalled"], stalled, "{run}");
        assert!(report["turns_per_s"].as_f64().is_some_and(|value| value > 0.0), "{run}");
        // session_started, then per turn (three and a warm-up) at least
        // submission_queued, turn_started, user_message, a delta and
        // turn_complete, then shutdown_complete: every subscriber saw all of
        // them, gap-free (the bench fails otherwise).
        assert!(
            report["events_per_subscriber"]
                .as_u64()
                .is_some_and(|events| events >= 22),
            "{run}"
        );
    }
    assert!(text.contains("| in-process (baseline) |"), "{text}");
    // The last run posts a webhook per turn (three and a warm-up, two
    // sessions), each timed from its event's commit.
    let hooked = &runs[3]["reports"][0];
    assert_eq!(hooked["webhook_deliveries"], 8, "{hooked}");
    assert!(
        hooked["webhook_p99_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
        "{hooked}"
    );
    assert_eq!(runs[0]["reports"][0]["webhook_deliveries"], 0);
    assert!(text.contains("a webhook per turn / none:"), "{text}");
    // The last one exports its spans: per session a turn span and a model
    // span for each of four turns.
    let traced = &runs[4]["reports"][0];
    assert!(
        traced["spans_exported"].as_u64().is_some_and(|spans| spans >= 16),
        "{traced}"
    );
    assert_eq!(runs[0]["reports"][0]["spans_exported"], 0);
    // The last one has a budget watch the turns' tenant: every turn is
    // admitted (a slot taken and given back each time) and runs.
    assert_eq!(runs[5]["run"], "HTTP + SSE, a budget watching", "{summary}");
    assert!(text.contains("a budget watching / none"), "{text}");
}

#[test]
fn bench_memory_runs_a_server_process_and_reports_what_sessions_and_streams_cost() {
    let cli = Cli::new();
    let output = cli.run(&["bench", "memory", "-N", "40", "--warm-up", "5", "--repeat", "1"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.starts_with("| run | sessions |"), "{text}");
    let last = text.lines().last().expect("output");
    let reports: serde_json::Value = serde_json::from_str(last).expect("last line is JSON");
    let report = &reports[0];
    assert_eq!(report["sessions"], 40, "{report}");
    // A server holds some MiB after its warm-up, and its resident set does
    // not shrink as sessions and streams are added (the readings are of
    // the server, not of this process or of nothing).
    let base = report["base_rss_kib"].as_u64().expect("base");
    let sessions = report["sessions_rss_kib"].as_u64().expect("sessions");
    let streams = report["streams_rss_kib"].as_u64().expect("streams");
    assert!(base > 4 * 1024, "{report}");
    assert!(base <= sessions && sessions <= streams, "{report}");
    assert!(
        report["per_session_kib"].as_f64().is_some_and(|kib| kib > 0.0),
        "{report}"
    );
}

#[test]
fn bench_serve_nodes_runs_server_processes_and_counts_what_each_turn_costs_the_database() {
    let Some(postgres) = keel::store::postgres::local::LocalPostgres::shared() else {
        return;
    };
    let cli = Cli::new();
    let url = postgres.fresh_database();
    let args = [
        "bench", "serve", "--nodes", "2", "-S", "2", "-T", "20", "-K", "4", "-B", "16", "--repeat", "1", "--db", &url,
    ];
    let output = cli.run(&args);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let last = text.lines().last().expect("output");
    let runs: serde_json::Value = serde_json::from_str(last).expect("last line is JSON");
    let (single, pair) = (&runs["runs"][0]["reports"][0], &runs["runs"][1]["reports"][0]);
    assert_eq!(
        (single["nodes"].as_u64(), pair["nodes"].as_u64()),
        (Some(1), Some(2)),
        "{runs}"
    );
    for report in [single, pair] {
        let posts = report["posts_same"].as_u64().unwrap_or(0) + report["posts_relayed"].as_u64().unwrap_or(0);
        assert_eq!(posts, 40, "{report}");
        // The nodes are processes of their own: their CPU time is read (in
        // clock ticks of 10 ms: enough turns that one node's cost at least
        // one), and the database's transactions are counted (a turn can
        // cost less than one: sessions share group commits, and a
        // submission's access check reads nothing on the node that runs
        // its session).
        assert!(
            report["keel_cpu_ms_per_turn"].as_f64().is_some_and(|ms| ms > 0.0),
            "{report}"
        );
        assert!(
            report["transactions_per_turn"]
                .as_f64()
                .is_some_and(|count| count > 0.0),
            "{report}"
        );
        assert!(
            report["events_per_stream"].as_u64().is_some_and(|count| count > 0),
            "{report}"
        );
    }
    assert_eq!(single["posts_relayed"], 0, "{single}");
    assert!(pair["posts_relayed"].as_u64().is_some_and(|count| count > 0), "{pair}");
    assert_eq!(
        (pair["streams_same"].as_u64(), pair["streams_cross"].as_u64()),
        (Some(2), Some(2)),
        "{pair}"
    );
    assert!(
        pair["cross_minus_same_p50_ms"].is_number() && pair["accept_relayed_p50_ms"].is_number(),
        "{pair}"
    );
    assert!(
        single["accept_relayed_p50_ms"].is_null() && single["streams_cross"] == 0,
        "{single}"
    );
}

#[test]
fn bench_tail_reads_exactly_the_last_events_of_a_log_of_small_rows() {
    let cli = Cli::new();
    let output = cli.run(&["bench", "tail", "-N", "500", "--reads", "5"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.starts_with("| backend | events (rows) |"), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(text.lines().last().expect("output")).expect("last line is JSON");
    assert_eq!(report["events"], 500, "{report}");
    for key in ["newest_page_ms", "tail_after_ms", "head_after_ms", "tail_vs_newest"] {
        assert!(
            report[key].as_f64().is_some_and(|value| value > 0.0),
            "{key} in {report}"
        );
    }
}

mod chat;
mod configured_secrets;
mod conveniences;
mod fork;
mod instructions;
mod lifecycle;
mod operators;
mod postgres;
mod secrets;
mod shutdown;
mod terminal;
mod tools;

#[test]
fn a_session_keeps_its_model_and_can_be_created_under_a_chosen_id() {
    let cli = Cli::new();
    let script = cli.script(
        "s.jsonl",
        &[
            r#"{"text": "first answer"}"#,
            r#"{"text": "second answer"}"#,
            r#"{"text": "third answer"}"#,
        ],
    );
    let model = format!("script:{}", script.display());
    let first = cli.run(&["run", "--new-session", "demo", "--model", &model, "one"]);
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(stdout(&first), "first answer\n");
    assert!(stderr(&first).contains("session demo"), "{}", stderr(&first));
    // No --model: the session's own model answers.
    let second = cli.run(&["run", "--session", "demo", "second"]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(stdout(&second), "second answer\n");
    let mut chat = cli
        .command(&["chat", "--session", "demo"])
        .env_remove("KEEL_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keel chat");
    {
        use std::io::Write;
        let mut stdin = chat.stdin.take().expect("stdin");
        stdin.write_all(b"third\n").expect("write stdin");
    }
    let third = chat.wait_with_output().expect("keel chat");
    assert!(third.status.success(), "{}", stderr(&third));
    assert!(stdout(&third).contains("third answer"), "{}", stdout(&third));
    let events = cli.events("demo");
    assert_gapless(&events, 1);
    assert_eq!(session_of(&events), "demo");

    // The id is taken now: a second --new-session is refused, naming it.
    let again = cli.run(&["run", "--new-session", "demo", "--model", &model, "four"]);
    assert_one_line_error(&again, "demo");
    assert_eq!(cli.events("demo").len(), events.len(), "nothing was written");
    let both = cli.run(&["run", "--session", "demo", "--new-session", "other", "five"]);
    assert!(!both.status.success());
}

/// A streamed Chat Completions answer saying `text`.
fn chat_completion_reply(text: &str) -> crate::suite::support::http_server::Reply {
    let delta = serde_json::json!({
        "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": null}],
    });
    let finish = serde_json::json!({
        "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    });
    let body = format!("data: {delta}\n\ndata: {finish}\n\ndata: [DONE]\n\n");
    crate::suite::support::http_server::Reply::sse_in_pieces(body.as_bytes(), 1 << 16)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_spec_caps_output_and_chat_takes_a_system_prompt() {
    use crate::suite::support::http_server::ScriptedServer;
    let server = ScriptedServer::start(vec![
        chat_completion_reply("capped"),
        chat_completion_reply("brief"),
        chat_completion_reply("again"),
    ])
    .await;
    let cli = Cli::new();
    let base = format!("{}/v1", server.url());
    let run = |args: Vec<String>, input: Option<&'static str>| {
        let mut command = cli.command(&args.iter().map(String::as_str).collect::<Vec<_>>());
        command
            .env("OPENAI_BASE_URL", &base)
            .env_remove("OPENAI_API_KEY")
            .env_remove("KEEL_CONFIG")
            .env("XDG_CONFIG_HOME", cli.dir.path().join("config"))
            .env("XDG_DATA_HOME", cli.dir.path().join("data"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        async move {
            tokio::task::spawn_blocking(move || {
                let mut child = command.spawn().expect("spawn keel");
                let mut stdin = child.stdin.take().expect("stdin");
                if let Some(input) = input {
                    std::io::Write::write_all(&mut stdin, input.as_bytes()).expect("write stdin");
                }
                drop(stdin);
                child.wait_with_output().expect("keel output")
            })
            .await
            .expect("join")
        }
    };
    let spec = "openai:m?max_output_tokens=7&temperature=0.5".to_owned();
    let output = run(
        vec![
            "run".into(),
            "--no-tools".into(),
            "--model".into(),
            spec.clone(),
            "hi".into(),
        ],
        None,
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output), "capped\n");
    let output = run(
        vec![
            "chat".into(),
            "--no-tools".into(),
            "--new-session".into(),
            "chatty".into(),
            "--model".into(),
            "openai:m".into(),
            "--system".into(),
            "Answer in one word.".into(),
        ],
        Some("hello\n"),
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("brief"), "{}", stdout(&output));
    // Resumed, the chat keeps its system prompt.
    let output = run(
        vec!["chat".into(), "--no-tools".into(), "--session".into(), "chatty".into()],
        Some("again\n"),
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));

    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    let capped = requests[0].json();
    assert_eq!(capped["model"], "m", "the options are not part of the model name");
    assert_eq!(capped["max_tokens"], 7, "{capped}");
    assert_eq!(capped["temperature"], 0.5, "{capped}");
    for request in &requests[1..] {
        let body = request.json();
        assert_eq!(body["model"], "m");
        assert!(body.get("max_tokens").is_none(), "{body}");
        assert_eq!(
            body["messages"][0],
            serde_json::json!({"role": "system", "content": "Answer in one word."}),
            "{body}"
        );
    }

    // A bad option is a one-line error naming it, before anything is stored.
    let fresh = Cli::new();
    let bad = fresh.run(&["run", "--model", "openai:m?max_output_tokens=lots", "hi"]);
    assert_one_line_error(&bad, "max_output_tokens");
    let unknown = fresh.run(&["run", "--model", "openai:m?colour=blue", "hi"]);
    assert_one_line_error(&unknown, "colour");
    assert!(!fresh.db().exists());
}

#[test]
fn keel_toml_errors_name_the_file_line_and_column() {
    let cli = Cli::new();
    let cases = [
        // An unknown key, on line 3.
        (
            "model = \"x\"\n[models.x]\nprovder = \"openai\"\nmodel = \"m\"\n",
            "keel.toml:3:1",
            "provder",
        ),
        // A value of the wrong type, on line 4 after the `=`.
        (
            "[models.x]\nprovider = \"openai\"\nmodel = \"m\"\ntemperature = \"hot\"\n",
            "keel.toml:4:15",
            "temperature",
        ),
        // Broken syntax: an unterminated string on line 2.
        ("model = \"x\"\nmodel2 = \"oops\n", "keel.toml:2:", "string"),
    ];
    for (text, place, needle) in cases {
        std::fs::write(cli.dir.path().join("keel.toml"), text).expect("write keel.toml");
        let output = cli
            .command(&["run", "--model", "script:none.jsonl", "hi"])
            .env_remove("KEEL_CONFIG")
            .output()
            .expect("run keel");
        assert_one_line_error(&output, place);
        assert_one_line_error(&output, needle);
    }
    // An explicit --config is named as given.
    let elsewhere = cli.dir.path().join("conf").join("other.toml");
    std::fs::create_dir_all(elsewhere.parent().expect("parent")).expect("mkdir");
    std::fs::write(&elsewhere, "[tools]\nshell = 3\n").expect("write other.toml");
    let output = cli
        .command(&["run", "--config", &elsewhere.display().to_string(), "hi"])
        .output()
        .expect("run keel");
    assert_one_line_error(&output, &format!("{}:2:9", elsewhere.display()));
    assert!(!cli.db().exists(), "nothing was stored");
}
