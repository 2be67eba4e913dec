//! The restore drills of docs/operations.md, run as an operator would: a
//! served database is backed up while the server writes (`keel backup` for
//! SQLite, `pg_dump` for PostgreSQL), the server stops, the copy is put in
//! place under a new name and served, and every session and event that was
//! acknowledged before the backup is there, as it was.

use std::path::Path;
use std::process::{Command, Output};

use keel::store::postgres::local::LocalPostgres;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::{Api, Resume};
use crate::suite::support::server::{Scratch, ServeProcess, slow_chunks};

/// Sessions finished before the backup, each with two exchanges.
const FINISHED: [&str; 3] = ["alpha", "beta", "gamma"];

/// A session whose turn streams while the backup is taken.
const BUSY: &str = "busy";

/// Every event of `session`, paged forwards through the API, as JSON.
async fn log(api: &Api, session: &str) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        let after = events
            .last()
            .map_or(0, |event: &Value| event["sequence"].as_u64().expect("sequence"));
        let page = api
            .get(&format!("/v1/sessions/{session}/events?after={after}&limit=1000"))
            .await;
        assert_eq!(page.status, StatusCode::OK, "{session}: {}", page.body);
        events.extend(page.body["events"].as_array().expect("events").iter().cloned());
        if page.body["has_more"] != true {
            return events;
        }
    }
}

/// The ids of every session the server lists.
async fn listed(api: &Api) -> Vec<String> {
    let page = api.get("/v1/sessions?limit=100").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let mut ids: Vec<String> = page.body["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|session| session["id"].as_str().expect("id").to_owned())
        .collect();
    ids.sort();
    ids
}

/// Fills a served database: finished sessions with two exchanges each,
/// then the busy session's long turn, started and streaming. Returns the
/// logs as a client saw them before the backup.
async fn fill(api: &Api, slow: &str) -> Vec<(String, Vec<Value>)> {
    for session in FINISHED {
        api.create(json!({"id": session})).await;
        for text in ["Hello", "Again"] {
            api.say(session, &format!("{text}, {session}")).await;
            api.wait_idle(session).await;
        }
    }
    api.create(json!({"id": BUSY, "model": slow})).await;
    let mut stream = api.stream(BUSY, Resume::Start).await;
    api.say(BUSY, "Write a lot").await;
    stream
        .until(|event| matches!(event.msg, keel::protocol::EventMsg::AssistantContentDelta(_)))
        .await;
    let mut seen = Vec::new();
    for session in FINISHED.into_iter().chain([BUSY]) {
        seen.push((session.to_owned(), log(api, session).await));
    }
    seen
}

/// What a server writes of its own when it opens a session that a copy
/// caught mid-turn: the session's start, and the turn it closes.
const RECOVERY: [&str; 3] = ["session_started", "turn_aborted", "shutdown_complete"];

/// Checks the restored server against what clients saw before the backup
/// and against the original database as the original server left it: each
/// restored log starts with what was seen, is gap-free, is the original's
/// up to where the copy was taken (past it, only the restored server's own
/// recovery events); a restored session takes a new message and goes on
/// from its last sequence.
async fn check_restored(restored: &Api, seen: &[(String, Vec<Value>)], original: &[(String, Vec<Value>)]) {
    let mut expected: Vec<String> = seen.iter().map(|(session, _)| session.clone()).collect();
    expected.sort();
    assert_eq!(listed(restored).await, expected, "every session is restored");
    for ((session, before), (_, after)) in seen.iter().zip(original) {
        let copy = log(restored, session).await;
        assert!(
            copy.len() >= before.len(),
            "{session}: {} of {} events",
            copy.len(),
            before.len()
        );
        assert_eq!(
            &copy[..before.len()],
            &before[..],
            "{session}: what clients saw is in the copy"
        );
        for (index, event) in copy.iter().enumerate() {
            assert_eq!(event["sequence"], json!(index + 1), "{session}: gap-free");
        }
        let agreed = copy
            .iter()
            .zip(after)
            .take_while(|(copy, original)| copy == original)
            .count();
        let own: Vec<&str> = copy[agreed..]
            .iter()
            .map(|event| event["msg"]["type"].as_str().unwrap_or("?"))
            .collect();
        assert!(
            own.iter().all(|kind| RECOVERY.contains(kind)),
            "{session}: past the original's events, only the restored server's recovery: {own:?}"
        );
    }
    let last = log(restored, "alpha").await.len() as u64;
    let accepted = say_once_owned(restored, "alpha", "After the restore").await;
    restored.wait_idle("alpha").await;
    let now = log(restored, "alpha").await;
    assert!(
        accepted["sequence"].as_u64().expect("sequence") > last,
        "the log goes on: {accepted}"
    );
    assert!(
        now.iter()
            .any(|event| event["msg"]["type"] == "user_message" && event["msg"]["text"] == "After the restore"),
        "the new message is in the restored log"
    );
}

/// Submits `text` to `session` under one Idempotency-Key, retrying while
/// the server answers `503 owner_unavailable`: a copy taken while serving
/// carries the serving node's leases, and a node of a cluster waits for
/// them to expire (`--lease-ttl-ms`) before it takes a session over.
async fn say_once_owned(api: &Api, session: &str, text: &str) -> Value {
    let body = json!({"op": {"type": "user_input", "text": text}});
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let request = api
            .client
            .post(api.url(&format!("/v1/sessions/{session}/submissions")))
            .header("idempotency-key", "after-the-restore")
            .json(&body);
        let reply = api.send(request).await;
        if reply.status == StatusCode::ACCEPTED {
            return reply.body;
        }
        assert!(
            reply.status == StatusCode::SERVICE_UNAVAILABLE
                && reply.code() == "owner_unavailable"
                && std::time::Instant::now() < deadline,
            "{}: {}",
            reply.status,
            reply.body
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// The logs of `sessions` as `api` serves them.
async fn logs(api: &Api, sessions: &[(String, Vec<Value>)]) -> Vec<(String, Vec<Value>)> {
    let mut all = Vec::new();
    for (session, _) in sessions {
        all.push((session.clone(), log(api, session).await));
    }
    all
}

/// The model lines the drills use: short answers for every message.
fn answers(scratch: &Scratch) -> String {
    let lines: Vec<String> = (0..20)
        .map(|index| format!(r#"{{"text": "Answer {index}."}}"#))
        .collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    scratch.script("answers.jsonl", &lines)
}

fn succeeded(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_backup_taken_while_serving_restores_every_session_and_event() {
    let scratch = Scratch::new();
    let model = answers(&scratch);
    let slow = scratch.script("slow.jsonl", &[&slow_chunks(100, 10)]);
    let scripts = scratch.dir.path().to_str().expect("utf-8").to_owned();
    let server = ServeProcess::start(&scratch, &["--model", &model]);
    let seen = fill(&server.api, &slow).await;

    // The backup, as docs/operations.md gives it, while the turn streams.
    let copy = scratch.dir.path().join("keel-backup.sqlite3");
    let backup = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("backup")
        .arg("--db")
        .arg(scratch.db())
        .arg(&copy)
        .output()
        .expect("run keel backup");
    succeeded(&backup, "keel backup");
    assert_eq!(
        server.api.session(BUSY).await["state"],
        "running",
        "the backup was taken mid-turn"
    );
    let original = {
        server.api.wait_idle(BUSY).await;
        let original = logs(&server.api, &seen).await;
        let (status, lines) = server.terminate();
        assert!(status.success(), "{lines:?}");
        original
    };

    // Restore: the copy becomes the database of a new place, and is served.
    let elsewhere = Scratch::new();
    std::fs::copy(&copy, elsewhere.db()).expect("put the copy in place");
    let restored = ServeProcess::start(&elsewhere, &["--model", &model, "--script-dir", &scripts]);
    check_restored(&restored.api, &seen, &original).await;
    let (status, lines) = restored.terminate();
    assert!(status.success(), "{lines:?}");
}

/// `keel serve` on the PostgreSQL database `url`.
fn serve_on(url: &str, scratch: &Scratch, model: &str) -> ServeProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["serve", "--db", url, "--listen", "127.0.0.1:0", "--model", model])
        .arg("--workspace-root")
        .arg(scratch.workspaces())
        .arg("--script-dir")
        .arg(scratch.dir.path())
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_CONFIG")
        .env("KEEL_LOG", "warn")
        .current_dir(scratch.dir.path());
    ServeProcess::spawn(command)
}

/// Runs PostgreSQL client `program` of the test server's version.
fn pg_client(postgres: &LocalPostgres, program: &str, args: &[&str], file: &Path) -> Output {
    postgres
        .client(program)
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|error| panic!("run {program}: {error}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pg_dump_taken_while_serving_restores_every_session_and_event() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let url = postgres.fresh_database();
    let scratch = Scratch::new();
    let model = answers(&scratch);
    let slow = scratch.script("slow.jsonl", &[&slow_chunks(100, 10)]);
    let server = serve_on(&url, &scratch, &model);
    let seen = fill(&server.api, &slow).await;

    // As docs/operations.md gives it: a custom-format dump, while serving.
    let dump = scratch.dir.path().join("keel.dump");
    let output = pg_client(
        postgres,
        "pg_dump",
        &["--format=custom", "--dbname", &url, "--file"],
        &dump,
    );
    succeeded(&output, "pg_dump");
    assert_eq!(server.api.session(BUSY).await["state"], "running", "dumped mid-turn");
    server.api.wait_idle(BUSY).await;
    let original = logs(&server.api, &seen).await;
    let (status, lines) = server.terminate();
    assert!(status.success(), "{lines:?}");

    let restored_url = postgres.fresh_database();
    let output = pg_client(
        postgres,
        "pg_restore",
        &["--no-owner", "--exit-on-error", "--dbname", &restored_url],
        &dump,
    );
    succeeded(&output, "pg_restore");
    let restored = serve_on(&restored_url, &scratch, &model);
    check_restored(&restored.api, &seen, &original).await;
    let (status, lines) = restored.terminate();
    assert!(status.success(), "{lines:?}");
}
