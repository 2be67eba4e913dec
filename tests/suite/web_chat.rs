//! The web UI's conversation pane in a real headless Chromium, as a chat app
//! reads: it follows new content unless the reader scrolled up, the message
//! box is pinned, the header is compact on a phone, the event timeline opens
//! on demand, lifecycle events are status rather than conversation, and the
//! keyboard shortcuts work. Each test starts the real `keel serve` with a
//! scripted model and runs a scenario of `tests/web/` (see [`super::web_ui`]).
//!
//! Two ignored tests are tools rather than checks, run on demand:
//! `web_ui_bench_long_session` measures opening a 2,000-message session and
//! streaming an answer into it, and `web_ui_screenshots` remakes the PNGs of
//! `docs/screenshots/`.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::web_ui::{
    answer_texts, answering, browser_test, chunks_line, log_of, of_kind, scenario, scenario_within, serve, session_of,
    slow_words,
};

/// A tall markdown answer (headings, lists, a code block), as streamed chunks.
fn tall_markdown(sections: usize) -> Vec<String> {
    let mut chunks = Vec::new();
    for index in 1..=sections {
        chunks.push(format!("## Part {index}\n\n"));
        chunks.push(format!(
            "This part of the report explains step {index} in a sentence long enough to wrap.\n\n"
        ));
        chunks.push(format!("- item {index}.a\n- item {index}.b\n\n"));
    }
    chunks.push("```rust\nfn main() {\n    println!(\"done\");\n}\n```\n".to_owned());
    chunks
}

/// A script line that streams `chunks` and then asks to write a file.
fn chunks_then_write(chunks: &[String], delay_ms: u64, path: &str) -> String {
    json!({
        "chunks": chunks,
        "delay_ms": delay_ms,
        "tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": "the report"}}],
    })
    .to_string()
}

/// One long paragraph of `words` words, streamed `per_chunk` words a chunk.
fn long_paragraph(words: usize, per_chunk: usize, delay_ms: u64) -> String {
    let all: Vec<String> = (1..=words).map(|index| format!("word{index} ")).collect();
    let chunks: Vec<String> = all.chunks(per_chunk).map(|chunk| chunk.concat()).collect();
    json!({"chunks": chunks, "delay_ms": delay_ms}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_follows_new_content_unless_the_reader_scrolled_up() {
    let Some((tools, _browser, scratch)) =
        browser_test("web_ui_follows_new_content_unless_the_reader_scrolled_up").await
    else {
        return;
    };
    let lines = [
        chunks_then_write(&tall_markdown(14), 15, "report.txt"),
        json!({"text": "Written."}).to_string(),
        long_paragraph(1400, 20, 70),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let model = scratch.script("follow.jsonl", &lines);
    let server = serve(&scratch, &model, &[]);
    // The scripted model counts each session's calls: each run has a session.
    for phone in [false, true] {
        let outcome = scenario(
            &tools,
            "follow",
            &server.api.base,
            json!({"phone": phone, "after_tool": "Written."}),
        )
        .await;
        let id = session_of(&outcome);
        let log = log_of(&server.api, &id).await;
        assert_eq!(of_kind(&log, "approval_decided").len(), 1, "{log:#?}");
        assert_eq!(of_kind(&log, "turn_complete").len(), 2, "{log:#?}");
        let workspace = scratch.workspaces().join(&id);
        assert_eq!(
            std::fs::read_to_string(workspace.join("report.txt")).ok().as_deref(),
            Some("the report"),
            "the approval the page showed was the one decided"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_pins_the_composer_and_opens_the_timeline_on_demand() {
    let Some((tools, _browser, scratch)) =
        browser_test("web_ui_pins_the_composer_and_opens_the_timeline_on_demand").await
    else {
        return;
    };
    let long = |index: usize| {
        (1..=12)
            .map(|line| format!("Answer {index}, paragraph {line}: some words to fill the screen."))
            .collect::<Vec<_>>()
            .join("\n\n")
    };
    let answers: Vec<String> = (1..=3).map(long).collect();
    let model = answering(&scratch, "layout.jsonl", &answers);
    let server = serve(&scratch, &model, &[]);
    for phone in [false, true] {
        let outcome = scenario(
            &tools,
            "layout",
            &server.api.base,
            json!({"phone": phone, "questions": ["One?", "Two?", "Three?"]}),
        )
        .await;
        let log = log_of(&server.api, &session_of(&outcome)).await;
        assert_eq!(answer_texts(&log).len(), 3, "{log:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_keeps_lifecycle_notes_out_of_the_conversation() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_keeps_lifecycle_notes_out_of_the_conversation").await
    else {
        return;
    };
    let model_error = "the scripted model is down";
    let model = scratch.script(
        "lifecycle.jsonl",
        &[
            r#"{"text": "Hello there."}"#,
            r#"{"text": "Back again."}"#,
            &json!({ "error": model_error }).to_string(),
        ],
    );
    let server = serve(&scratch, &model, &["--idle-unload-secs", "1"]);
    let outcome = scenario(
        &tools,
        "lifecycle",
        &server.api.base,
        json!({"answers": ["Hello there.", "Back again."], "model_error": model_error}),
    )
    .await;
    let log = log_of(&server.api, &session_of(&outcome)).await;
    assert!(
        !of_kind(&log, "shutdown_complete").is_empty(),
        "the session was unloaded: {log:#?}"
    );
    let resumed = of_kind(&log, "session_started")
        .iter()
        .filter(|event| event["msg"]["resumed"] == true)
        .count();
    assert!(resumed >= 1, "and reopened: {log:#?}");
    assert_eq!(of_kind(&log, "error").len(), 1, "{log:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_keyboard_shortcuts() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_keyboard_shortcuts").await else {
        return;
    };
    let (slow, _) = slow_words(300, 40);
    let model = scratch.script("shortcuts.jsonl", &[&slow]);
    let server = serve(&scratch, &model, &[]);
    let outcome = scenario(&tools, "shortcuts", &server.api.base, json!({})).await;
    let log = log_of(&server.api, &session_of(&outcome)).await;
    let aborted = of_kind(&log, "turn_aborted");
    assert_eq!(aborted.len(), 1, "{log:#?}");
    assert_eq!(aborted[0]["msg"]["reason"], "interrupted", "Esc interrupted the turn");
}

/// The hint beside the busy policy says what a message sent during a turn
/// gets: one shared next turn (`merge`), its own answer (`each`), or what
/// interrupt and steer do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_ui_says_what_a_message_sent_during_a_turn_gets() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_says_what_a_message_sent_during_a_turn_gets").await
    else {
        return;
    };
    let model = scratch.script("queue.jsonl", &[r#"{"text": "hi"}"#]);
    let server = serve(&scratch, &model, &[]);
    let merge = server.api.create(json!({"id": "merged", "queue_mode": "merge"})).await;
    assert_eq!(merge["queue_mode"], "merge");
    let each = server
        .api
        .create(json!({"id": "one-by-one", "queue_mode": "each"}))
        .await;
    assert_eq!(each["queue_mode"], "each");
    scenario(
        &tools,
        "queue_hint",
        &server.api.base,
        json!({"merge": "merged", "each": "one-by-one"}),
    )
    .await;
}

/// How many exchanges the long session has (a user message and an answer
/// each), and how many times it is opened: `KEEL_BENCH_EXCHANGES` and
/// `KEEL_BENCH_RUNS`, or 1,000 and 3.
fn bench_sizes() -> (usize, usize) {
    let number = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    (number("KEEL_BENCH_EXCHANGES", 1000), number("KEEL_BENCH_RUNS", 3))
}

/// Measures opening a session of 2,000 messages and streaming an answer into
/// it (with `KEEL_WEB_UI_DIR`, of another copy of the UI's files, to
/// compare; see `tests/web/lib.mjs`): run with
/// `cargo test -p keel --test all web_ui_bench_long_session -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run on demand"]
async fn web_ui_bench_long_session() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_bench_long_session").await else {
        return;
    };
    let (exchanges, runs) = bench_sizes();
    let mut lines: Vec<String> = (1..=exchanges)
        .map(|index| json!({"text": format!("Answer {index}: a **short** reply with `code` in it.")}).to_string())
        .collect();
    let streamed: Vec<String> = (1..=40).map(|index| format!("chunk{index} ")).collect();
    let streamed: Vec<&str> = streamed.iter().map(String::as_str).collect();
    lines.extend((0..runs).map(|_| chunks_line(&streamed, 25)));
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let model = scratch.script("long.jsonl", &lines);
    let server = serve(&scratch, &model, &[]);
    let session = server.api.create(json!({})).await;
    let id = session["id"].as_str().expect("id").to_owned();
    for index in 1..=exchanges {
        server.api.say(&id, &format!("Question {index}")).await;
        server.api.wait_idle(&id).await;
    }
    let outcome = scenario_within(
        &tools,
        "bench_long_session",
        &server.api.base,
        json!({
            "session_id": id,
            "runs": runs,
            "answers": exchanges,
            "streamed": streamed.concat(),
            "nominal_stream_ms": streamed.len() * 25,
        }),
        Duration::from_secs(1800),
    )
    .await;
    eprintln!("BENCH {}", outcome.result);
}

/// Remakes `docs/screenshots/*.png` from a real `keel serve`: run with
/// `cargo test -p keel --test all web_ui_screenshots -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "remakes the committed screenshots, run on demand"]
async fn web_ui_screenshots() {
    let Some((tools, _browser, scratch)) = browser_test("web_ui_screenshots").await else {
        return;
    };
    let code_answer = "Here is a small HTTP health check in Rust:\n\n```rust\nuse std::time::Duration;\n\n\
                       async fn healthy(url: &str) -> bool {\n    let client = reqwest::Client::new();\n    \
                       match client.get(url).timeout(Duration::from_secs(2)).send().await {\n        \
                       Ok(reply) => reply.status().is_success(),\n        Err(_) => false,\n    }\n}\n```\n\n\
                       It answers **false** on a timeout instead of waiting forever.";
    let lines = [
        json!({"text": code_answer}).to_string(),
        json!({
            "text": "I will write the check into `health.rs`.",
            "tool_calls": [{"name": "write_file", "arguments": {"path": "health.rs", "content": "// the check\n"}}],
        })
        .to_string(),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let model = scratch.script("screens.jsonl", &lines);
    let server = serve(&scratch, &model, &[]);
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/screenshots");
    std::fs::create_dir_all(&out).expect("create docs/screenshots");
    let outcome = scenario(&tools, "screenshots", &server.api.base, json!({ "out": out })).await;
    let files: Vec<Value> = outcome.result["files"].as_array().cloned().unwrap_or_default();
    assert!(files.len() >= 4, "{}", outcome.output);
}
