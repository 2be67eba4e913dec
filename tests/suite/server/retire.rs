//! The end of a session's life: deleting it (and its workspace), over the
//! API and the CLI, while it runs.

use keel::store::{CheckpointStore, SqliteCheckpoint};
use reqwest::StatusCode;
use serde_json::json;

use crate::suite::support::api::Resume;
use crate::suite::support::server::{TestServer, slow_chunks};
use crate::suite::support::wait::wait_until_async;

/// Rows left in the tables that hold a session's data, for the session
/// with this id (`0` for every table once it is gone).
fn rows_of(db: &std::path::Path, session_id: &str) -> [i64; 4] {
    let conn = rusqlite::Connection::open(db).expect("open the database");
    let key: Option<i64> = conn
        .query_row("SELECT key FROM sessions WHERE id = ?1", [session_id], |row| row.get(0))
        .ok();
    let Some(key) = key else { return [0; 4] };
    let count = |table: &str| -> i64 {
        conn.query_row(
            &format!("SELECT count(*) FROM {table} WHERE session_key = ?1"),
            [key],
            |row| row.get(0),
        )
        .expect("count")
    };
    [1, count("log"), count("queued_submissions"), count("submission_keys")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_running_session_removes_its_log_queue_keys_and_workspace() {
    let server = TestServer::start(|_, _| {}).await;
    let slow = server
        .scratch
        .script("slow.jsonl", &[&slow_chunks(200, 20), r#"{"text": "Second."}"#]);
    let other = server.scratch.script("other.jsonl", &[r#"{"text": "Kept."}"#]);
    server.api.create(json!({"id": "doomed", "model": slow})).await;
    server.api.create(json!({"id": "kept", "model": other})).await;
    server.api.say("kept", "Hello").await;
    server.api.wait_idle("kept").await;

    // A turn runs, and a keyed submission waits behind it.
    let mut stream = server.api.stream("doomed", Resume::Start).await;
    server.api.say("doomed", "Start a long answer").await;
    stream
        .until(|event| matches!(event.msg, keel::protocol::EventMsg::AssistantContentDelta(_)))
        .await;
    let queued = server
        .api
        .send(
            server
                .api
                .client
                .post(server.api.url("/v1/sessions/doomed/submissions"))
                .header("idempotency-key", "k-1")
                .json(&json!({"op": {"type": "user_input", "text": "Then this"}, "on_busy": "queue"})),
        )
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{}", queued.body);
    let before = rows_of(&server.scratch.db(), "doomed");
    assert!(
        before[0] == 1 && before[1] > 0 && before[2] == 1 && before[3] == 1,
        "{before:?}"
    );
    let workspace = server.scratch.workspaces().join("doomed");
    assert!(workspace.is_dir());

    let deleted = server
        .api
        .send(
            server
                .api
                .client
                .delete(server.api.url("/v1/sessions/doomed?workspace=true")),
        )
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);

    assert_eq!(
        rows_of(&server.scratch.db(), "doomed"),
        [0; 4],
        "every row of the session is gone"
    );
    assert!(!workspace.exists(), "the workspace was removed");
    // It is not loaded again by a later request: it is simply unknown.
    assert_eq!(
        server.api.get("/v1/sessions/doomed").await.status,
        StatusCode::NOT_FOUND
    );
    let submit = server
        .api
        .submit("doomed", json!({"op": {"type": "user_input", "text": "Hi"}}))
        .await;
    assert_eq!(submit.status, StatusCode::NOT_FOUND, "{}", submit.body);
    let again = server
        .api
        .send(server.api.client.delete(server.api.url("/v1/sessions/doomed")))
        .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "{}", again.body);
    assert_eq!(again.code(), "not_found");

    // Without `workspace=true` the directory stays; other sessions are untouched.
    let kept_rows = rows_of(&server.scratch.db(), "kept");
    assert!(kept_rows[0] == 1 && kept_rows[1] > 0, "{kept_rows:?}");
    assert_eq!(server.api.session("kept").await["turns_completed"], 1);
    let scratch = server.stop().await;
    let store = SqliteCheckpoint::new(scratch.db()).expect("open");
    assert!(store.session_summary("doomed").await.expect("read").is_none());
    assert!(store.load("kept").await.expect("read").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_without_the_workspace_flag_keeps_the_directory() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    server.api.create(json!({"id": "plain", "model": model})).await;
    let deleted = server
        .api
        .send(server.api.client.delete(server.api.url("/v1/sessions/plain")))
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    assert!(server.scratch.workspaces().join("plain").is_dir());
    assert_eq!(server.api.get("/v1/sessions/plain").await.status, StatusCode::NOT_FOUND);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_titled_by_its_first_message_and_can_be_renamed() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script(
        "s.jsonl",
        &[r#"{"text": "One."}"#, r#"{"text": "Two."}"#, r#"{"text": "Three."}"#],
    );
    server.api.create(json!({"id": "titled", "model": model})).await;
    assert_eq!(server.api.session("titled").await["title"], serde_json::Value::Null);
    server
        .api
        .say("titled", "\n  Plan a trip to Lisbon  \nfor two people")
        .await;
    server.api.wait_idle("titled").await;
    server.api.say("titled", "A second message").await;
    server.api.wait_idle("titled").await;
    assert_eq!(server.api.session("titled").await["title"], "Plan a trip to Lisbon");
    let listed = server.api.get("/v1/sessions").await;
    assert_eq!(
        listed.body["sessions"][0]["title"], "Plan a trip to Lisbon",
        "{}",
        listed.body
    );

    let renamed = server
        .api
        .patch("/v1/sessions/titled", &json!({"title": "Lisbon"}))
        .await;
    assert_eq!(renamed.status, StatusCode::OK, "{}", renamed.body);
    assert_eq!(renamed.body["title"], "Lisbon");
    let blank = server.api.patch("/v1/sessions/titled", &json!({"title": "  "})).await;
    assert_eq!(blank.status, StatusCode::BAD_REQUEST, "{}", blank.body);
    let unknown = server.api.patch("/v1/sessions/nope", &json!({"title": "x"})).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.body);

    // The rename is stored: a later message does not retitle it, and it
    // survives a restart.
    server.api.say("titled", "Third").await;
    server.api.wait_idle("titled").await;
    let scratch = server.stop().await;
    let server = TestServer::start_in(scratch, |_, _| {}).await;
    assert_eq!(server.api.session("titled").await["title"], "Lisbon");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_backup_copies_the_database_consistently_while_the_server_writes() {
    use std::os::unix::fs::PermissionsExt;
    let server = TestServer::start(|_, _| {}).await;
    let slow = server.scratch.script("slow.jsonl", &[&slow_chunks(100, 10)]);
    let done = server.scratch.script("done.jsonl", &[r#"{"text": "Done."}"#]);
    server.api.create(json!({"id": "finished", "model": done})).await;
    server.api.say("finished", "Hello").await;
    server.api.wait_idle("finished").await;
    server.api.create(json!({"id": "busy", "model": slow})).await;
    let mut stream = server.api.stream("busy", Resume::Start).await;
    server.api.say("busy", "Write a lot").await;
    stream
        .until(|event| matches!(event.msg, keel::protocol::EventMsg::AssistantContentDelta(_)))
        .await;

    // The turn is still streaming (and committing) while the copy is taken.
    let copy = server.scratch.dir.path().join("copy.sqlite3");
    let db = server.scratch.db();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "backup",
            "--db",
            db.to_str().expect("utf-8"),
            copy.to_str().expect("utf-8"),
        ])
        .output()
        .await
        .expect("run keel backup");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(
        server.api.session("busy").await["state"],
        "running",
        "the copy was taken mid-turn"
    );
    let mode = std::fs::metadata(&copy).expect("the copy").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the copy is private");
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "backup",
            "--db",
            db.to_str().expect("utf-8"),
            copy.to_str().expect("utf-8"),
        ])
        .output()
        .expect("run keel backup");
    assert!(!again.status.success(), "an existing file is not overwritten");

    let store = SqliteCheckpoint::new(&copy).expect("the copy is a Keel database");
    let finished = store.load("finished").await.expect("read").expect("in the copy");
    assert_eq!(finished.checkpoint.turns_completed, 1);
    for session in ["finished", "busy"] {
        let events = store.events_after(session, 0, 10_000).await.expect("events");
        let sequences: Vec<u64> = events.iter().map(|event| event.sequence).collect();
        let expected: Vec<u64> = (1..=sequences.len() as u64).collect();
        assert_eq!(sequences, expected, "gap-free log of {session} in the copy");
        let summary = store.session_summary(session).await.expect("read").expect("summary");
        assert_eq!(
            summary.last_sequence,
            sequences.len() as u64,
            "checkpoint matches the log"
        );
    }
    store.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_deletes_sessions_idle_past_the_retention_in_the_background() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    for id in ["stale", "fresh"] {
        server.api.create(json!({"id": id, "model": model})).await;
    }
    let scratch = server.stop().await;
    // "stale" was last written 3 days ago.
    {
        let conn = rusqlite::Connection::open(scratch.db()).expect("open");
        let three_days_ago = keel::protocol::now_ms() - 3 * 24 * 3600 * 1000;
        conn.execute(
            "UPDATE sessions SET updated_at_ms = ?1 WHERE id = 'stale'",
            [three_days_ago as i64],
        )
        .expect("backdate");
    }
    let server = TestServer::start_in(scratch, |config, _| {
        config.keel.server.retention_days = Some(2);
        config.retention_sweep = std::time::Duration::from_millis(50);
    })
    .await;
    wait_until_async(
        "the stale session to be deleted",
        std::time::Duration::from_secs(10),
        async || server.api.get("/v1/sessions/stale").await.status == StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(rows_of(&server.scratch.db(), "stale"), [0; 4]);
    // A few more sweeps leave the session written today alone. Kept: the
    // test proves nothing happens to it within this window.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(server.api.session("fresh").await["id"], "fresh");
    server.stop().await;
}
