//! What a server session starts with: Keel's coding prompt by default, a
//! bot's `[bots.<id>]` defaults from keel.toml, the project's `AGENTS.md`
//! recorded at the first turn, and the queue mode.

use std::path::Path;

use keel::agent::CODING_AGENT_PROMPT;
use keel::config::KeelConfig;
use keel::store::{CheckpointStore, SqliteCheckpoint};
use serde_json::{Value, json};

use crate::suite::support::api::Resume;
use crate::suite::support::events::user_messages;
use crate::suite::support::server::{Scratch, TestServer, slow_chunks};

const KEEL_TOML: &str = r#"
[bots.support]
coding_agent = false
instructions = "You answer customers of Example Inc."

[bots.chatty]
coding_agent = false
"#;

async fn server() -> TestServer {
    TestServer::start(|config, _| {
        config.keel.bots = KeelConfig::parse(KEEL_TOML, Path::new("keel.toml"))
            .expect("keel.toml")
            .bots;
    })
    .await
}

/// The settings the server stored with `session_id`.
async fn stored_settings(scratch: &Scratch, session_id: &str) -> Value {
    let store = SqliteCheckpoint::new(scratch.db()).expect("open the database");
    let summary = store
        .session_summary(session_id)
        .await
        .expect("read the session")
        .expect("the session");
    summary.context.settings.expect("settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_take_the_coding_prompt_or_their_bots_settings_fixed_at_creation() {
    let server = server().await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "hi"}"#]);
    let coding = server.api.create(json!({"id": "coding", "model": model})).await;
    assert_eq!(coding["queue_mode"], "merge");
    let support = server
        .api
        .create(json!({"id": "support", "model": model, "bot_id": "support"}))
        .await;
    assert_eq!(support["queue_mode"], "each", "a chat bot answers each message");
    let chatty = server
        .api
        .create(json!({"id": "chatty", "model": model, "bot_id": "chatty", "queue_mode": "merge"}))
        .await;
    assert_eq!(chatty["queue_mode"], "merge", "the request wins");
    let own = server
        .api
        .create(json!({"id": "own", "model": model, "instructions": "Be brief."}))
        .await;
    assert_eq!(own["queue_mode"], "merge");
    let none = server
        .api
        .create(json!({"id": "none", "model": model, "instructions": ""}))
        .await;
    assert_eq!(none["id"], "none");

    let settings = stored_settings(&server.scratch, "coding").await;
    assert_eq!(settings["instructions"], CODING_AGENT_PROMPT, "stored as resolved");
    assert_eq!(settings["project_instructions"], true);
    let settings = stored_settings(&server.scratch, "support").await;
    assert_eq!(settings["instructions"], "You answer customers of Example Inc.");
    assert_eq!(
        settings["tools"],
        json!({"builtin": false, "write": false, "shell": false})
    );
    assert!(
        settings.get("project_instructions").is_none(),
        "no AGENTS.md for a chat bot"
    );
    let settings = stored_settings(&server.scratch, "chatty").await;
    assert!(
        settings.get("instructions").is_none(),
        "no prompt, and no tools: {settings}"
    );
    assert_eq!(
        stored_settings(&server.scratch, "own").await["instructions"],
        "Be brief."
    );
    assert_eq!(stored_settings(&server.scratch, "none").await["instructions"], "");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_md_is_recorded_at_the_first_turn_and_each_message_gets_its_answer() {
    let server = server().await;
    let root = server.scratch.workspaces();
    std::fs::create_dir_all(&root).expect("the workspace root");
    std::fs::write(root.join("AGENTS.md"), "Run `cargo test` before you answer.").expect("AGENTS.md");
    let model = server.scratch.script(
        "s.jsonl",
        &[&slow_chunks(10, 30), r#"{"text": "two"}"#, r#"{"text": "three"}"#],
    );
    server
        .api
        .create(json!({"id": "s", "model": model, "queue_mode": "each"}))
        .await;
    let mut stream = server.api.stream("s", Resume::Start).await;
    server.api.say("s", "one").await;
    stream
        .until(|event| event.msg.kind() == "assistant_content_delta")
        .await;
    // Both wait while the first turn runs; each gets a turn of its own.
    server.api.say("s", "two").await;
    server.api.say("s", "three").await;
    let events = stream.turns(3).await;
    let kinds: Vec<&str> = events.iter().map(|event| event.msg.kind()).collect();
    assert_eq!(
        kinds.iter().filter(|kind| **kind == "turn_complete").count(),
        3,
        "{kinds:?}"
    );
    let stored = server.scratch.stored("s").await;
    let turns: Vec<Vec<String>> = stored
        .split(|event| event.msg.ends_turn())
        .map(user_messages)
        .filter(|messages| !messages.is_empty())
        .collect();
    assert_eq!(turns, [["one"], ["two"], ["three"]]);
    let loaded: Vec<Value> = stored
        .iter()
        .filter(|event| event.msg.kind() == "instructions_loaded")
        .map(|event| serde_json::to_value(&event.msg).expect("JSON"))
        .collect();
    assert_eq!(loaded.len(), 1, "read once, at the first turn");
    assert_eq!(loaded[0]["sources"][0]["path"], "AGENTS.md");
    assert_eq!(loaded[0]["sources"][0]["bytes"], 35);
    assert!(loaded[0]["text"].as_str().expect("text").contains("cargo test"));
    server.stop().await;
}
