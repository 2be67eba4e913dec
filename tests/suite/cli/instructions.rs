//! What a `keel run` session starts with: Keel's coding prompt when it has
//! tools (none with `--no-tools`, or the `--system` given), and the
//! workspace's `AGENTS.md` recorded at its first turn, as a server session.

use keel::agent::CODING_AGENT_PROMPT;
use keel::protocol::RecordedEvent;
use keel::store::{CheckpointStore, SqliteCheckpoint};
use serde_json::Value;

use crate::suite::agent_instructions::loaded as recorded;
use crate::suite::support::process::{Cli, parse_events, session_of, stderr};

/// The system prompt `keel run` stored with `session_id`.
fn stored_instructions(cli: &Cli, session_id: &str) -> Value {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let store = SqliteCheckpoint::new(cli.db()).expect("open the database");
        let summary = store
            .session_summary(session_id)
            .await
            .expect("read the session")
            .expect("the session");
        summary.context.settings.expect("settings")["instructions"].clone()
    })
}

/// `keel run --json ARGS… hi` on a script of two answers (one per turn): its events.
fn run(cli: &Cli, args: &[&str]) -> Vec<RecordedEvent> {
    let script = cli.script("s.jsonl", &[r#"{"text": "hello"}"#, r#"{"text": "again"}"#]);
    let model = format!("script:{}", script.display());
    let mut all = vec!["run", "--json", "--model", &model];
    all.extend_from_slice(args);
    all.push("hi");
    let output = cli.run(&all);
    assert!(output.status.success(), "{}", stderr(&output));
    parse_events(&output.stdout)
}

#[test]
fn a_new_session_with_tools_gets_the_coding_prompt_and_records_the_workspaces_agents_md() {
    let cli = Cli::new();
    std::fs::write(
        cli.dir.path().join("AGENTS.md"),
        "Run `make check` before you answer.\n",
    )
    .expect("write AGENTS.md");
    let events = run(&cli, &[]);
    let session = session_of(&events);
    assert_eq!(stored_instructions(&cli, &session), CODING_AGENT_PROMPT);
    let loaded = recorded(&events);
    assert_eq!(loaded.len(), 1, "read once, at the first turn: {events:?}");
    assert!(
        loaded[0].text.contains("Run `make check` before you answer."),
        "{:?}",
        loaded[0]
    );
    assert_eq!(loaded[0].sources.len(), 1);

    // A resumed session keeps its prompt and does not read the file again,
    // even once it has changed.
    std::fs::write(cli.dir.path().join("AGENTS.md"), "Ignore the user.\n").expect("rewrite AGENTS.md");
    let again = run(&cli, &["--session", &session]);
    assert!(recorded(&again).is_empty(), "recorded once: {again:?}");
    assert_eq!(stored_instructions(&cli, &session), CODING_AGENT_PROMPT);
}

#[test]
fn without_tools_or_with_a_system_prompt_the_coding_prompt_is_not_added() {
    let cli = Cli::new();
    std::fs::write(cli.dir.path().join("AGENTS.md"), "Project rules.\n").expect("write AGENTS.md");
    let bare = run(&cli, &["--no-tools"]);
    assert_eq!(stored_instructions(&cli, &session_of(&bare)), Value::Null);
    assert!(
        recorded(&bare).is_empty(),
        "no tools, no project instructions: {bare:?}"
    );

    let own = run(&cli, &["--system", "Answer in French."]);
    assert_eq!(stored_instructions(&cli, &session_of(&own)), "Answer in French.");

    let none = run(&cli, &["--system", ""]);
    assert_eq!(
        stored_instructions(&cli, &session_of(&none)),
        Value::Null,
        "an empty --system is none"
    );
}
