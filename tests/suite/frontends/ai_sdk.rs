//! The AI SDK's UI message stream, judged by the `ai` package itself
//! (`tests/node/ai_sdk/chat.mjs`, from `.ci/node`): a real `keel serve`
//! over loopback, on SQLite and on PostgreSQL, driven by
//! `DefaultChatTransport`, every frame parsed with `uiMessageChunkSchema`,
//! and what `readUIMessageStream` assembles compared with the stored log.
//! Outside CI, a run without node or the `ai` package passes with a
//! `SKIPPED` line; in CI (`CI` or `KEEL_REQUIRE_CLIENT_TESTS`) it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use keel::store::postgres::local::LocalPostgres;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::suite::support::api::Api;
use crate::suite::support::server::{Scratch, ServeProcess, slow_chunks};
use crate::suite::support::skip;
use crate::suite::support::wait::{HANG_GUARD, wait_for_async};

/// The test family's variable that forbids skipping.
const REQUIRE: &str = "KEEL_REQUIRE_CLIENT_TESTS";
/// The token of every server here.
pub(super) const TOKEN: &str = "ai-sdk-test-token";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether node and the `ai` package are here; `false` (after saying so)
/// when the tests may skip.
pub(super) fn judges_present(test: &str) -> bool {
    let node = Command::new("node").arg("--version").output();
    let ai = repo().join(".ci/node/node_modules/ai/package.json");
    if node.is_ok_and(|output| output.status.success()) && ai.is_file() {
        return true;
    }
    let how = "install Node.js 20 and run `npm ci --prefix .ci/node` (the install step of .ci/run)";
    assert!(
        skip::may_skip(REQUIRE),
        "the AI SDK tests need node and the `ai` package: {how}"
    );
    skip::announce(
        test,
        &format!("node or .ci/node's `ai` package is missing, so the AI SDK routes are NOT tested here; {how}"),
    );
    false
}

/// Where a server stores: a SQLite file in the scratch directory, or a
/// fresh PostgreSQL database.
#[derive(Clone)]
pub(super) enum Db {
    Sqlite,
    Postgres(&'static LocalPostgres),
}

/// A `keel serve` of `db` answering with the script `lines`.
pub(super) struct Keel {
    pub(super) scratch: Scratch,
    db: String,
    create: bool,
    model: String,
    process: Option<ServeProcess>,
}

impl Keel {
    pub(super) fn start(db: &Db, lines: &[&str]) -> Self {
        let scratch = Scratch::new();
        let (db, create) = match db {
            Db::Sqlite => (scratch.db().display().to_string(), true),
            Db::Postgres(postgres) => (postgres.fresh_database(), false),
        };
        let model = scratch.script("s.jsonl", lines);
        std::fs::write(scratch.dir.path().join("token"), TOKEN).expect("write the token");
        let mut process = ServeProcess::spawn(command(&scratch, &db, create, &model));
        process.api.token = Some(TOKEN.to_owned());
        Self {
            scratch,
            db,
            create,
            model,
            process: Some(process),
        }
    }

    /// Kills the server (SIGKILL) and starts another on the same store.
    pub(super) fn crash_and_restart(&mut self) {
        let old = self.process.take().expect("a server runs");
        old.crash();
        let mut process = ServeProcess::spawn(command(&self.scratch, &self.db, self.create, &self.model));
        process.api.token = Some(TOKEN.to_owned());
        self.process = Some(process);
    }

    pub(super) fn api(&self) -> &Api {
        &self.process.as_ref().expect("a server runs").api
    }

    /// The session's stored events' `msg`s, through the API.
    pub(super) async fn log(&self, session_id: &str) -> Vec<Value> {
        let reply = self
            .api()
            .get(&format!("/v1/sessions/{session_id}/events?after=0&limit=1000"))
            .await;
        assert!(reply.status.is_success(), "{}", reply.body);
        reply.body["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|event| event["msg"].clone())
            .collect()
    }
}

fn command(scratch: &Scratch, db: &str, create: bool, model: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command.arg("serve");
    if create {
        command.arg("--create");
    }
    command
        .args(["--db", db, "--listen", "127.0.0.1:0", "--model", model])
        .arg("--workspace-root")
        .arg(scratch.workspaces())
        .arg("--script-dir")
        .arg(scratch.dir.path())
        .arg("--token-file")
        .arg(scratch.dir.path().join("token"))
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_CONFIG")
        .env("KEEL_LOG", "warn")
        .current_dir(scratch.dir.path());
    command
}

/// A run of `chat.mjs`.
struct NodeRun {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    seen: Vec<String>,
}

impl NodeRun {
    fn start(base: &str, params: &Value) -> Self {
        let script: PathBuf = repo().join("tests/node/ai_sdk/chat.mjs");
        let mut child = tokio::process::Command::new("node")
            .arg(&script)
            .arg(base)
            .arg(params.to_string())
            .env("KEEL_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("run node");
        let stdout = child.stdout.take().expect("stdout");
        Self {
            child,
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
        }
    }

    /// The rest of the line that starts with `prefix`.
    async fn line(&mut self, prefix: &str) -> String {
        let found = tokio::time::timeout(HANG_GUARD, async {
            while let Some(line) = self.lines.next_line().await.expect("read node's output") {
                if let Some(rest) = line.strip_prefix(prefix) {
                    return Some(rest.to_owned());
                }
                self.seen.push(line);
            }
            None
        })
        .await
        .unwrap_or_else(|_| panic!("node printed no `{prefix}` line in time: {:?}", self.seen));
        found.unwrap_or_else(|| panic!("node ended without a `{prefix}` line: {:?}", self.seen))
    }

    async fn result(mut self) -> Value {
        let result = self.line("RESULT ").await;
        let status = self.child.wait().await.expect("wait for node");
        assert!(status.success(), "node failed: {status}");
        serde_json::from_str(&result).expect("RESULT json")
    }
}

async fn node(base: &str, params: Value) -> Value {
    NodeRun::start(base, &params).result().await
}

/// The texts of the message's text parts.
fn texts(message: &Value) -> Vec<String> {
    message["parts"]
        .as_array()
        .map(|parts| {
            parts
                .iter()
                .filter(|part| part["type"] == "text")
                .map(|part| part["text"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Every stream of a run was a UI message stream whose every frame the
/// SDK's schema accepts, ending with `[DONE]`.
fn assert_streams_sound(result: &Value) {
    for stream in result["streams"].as_array().expect("streams") {
        if stream["status"] == 204 {
            continue;
        }
        assert_eq!(stream["status"], 200, "{stream}");
        assert_eq!(stream["header"], "v1", "{stream}");
        assert_eq!(stream["invalid"], json!([]), "frames the schema refuses: {stream}");
        assert_eq!(stream["done"], true, "no `data: [DONE]` at the end: {stream}");
    }
}

fn of_type<'a>(log: &'a [Value], kind: &str) -> Vec<&'a Value> {
    log.iter().filter(|msg| msg["type"] == kind).collect()
}

fn chunk_types(stream: &Value) -> Vec<String> {
    stream["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .map(|chunk| chunk["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A streamed answer, a reconnect while it streams, a resent message, and
/// `204` once no turn runs.
async fn streamed_answer(db: &Db) {
    let keel = Keel::start(db, &[&slow_chunks(25, 100)]);
    let base = keel.api().base.clone();
    let params = json!({"action": "send", "chat": "chat-1", "message_id": "m1", "text": "Tell me"});
    let mut sending = NodeRun::start(&base, &params);
    sending.line("FIRST").await;
    let reconnected = node(&base, json!({"action": "reconnect", "chat": "chat-1"})).await;
    let sent = sending.result().await;
    let log = keel.log("chat-1").await;
    let answers = of_type(&log, "assistant_message");
    assert_eq!(answers.len(), 1, "{log:?}");
    let stored = answers[0]["text"].as_str().expect("text");
    for result in [&sent, &reconnected] {
        assert_streams_sound(result);
        assert_eq!(texts(&result["first"]["message"]), [stored], "{result}");
        assert_eq!(result["first"]["errors"], json!([]), "{result}");
    }
    assert_eq!(reconnected["none"], false);
    // The message is the turn, whichever stream assembled it.
    let turn_id = of_type(&log, "turn_started")[0]["turn_id"].clone();
    assert_eq!(sent["first"]["message"]["id"], turn_id);
    assert_eq!(reconnected["first"]["message"]["id"], turn_id);
    let first = &sent["streams"][0];
    assert_eq!(chunk_types(first).first().map(String::as_str), Some("start"));
    assert_eq!(
        first["chunks"].as_array().and_then(|chunks| chunks.last()),
        Some(&json!({"type": "finish", "finishReason": "stop"}))
    );

    // Idle: nothing to resume.
    let idle = node(&base, json!({"action": "reconnect", "chat": "chat-1"})).await;
    assert_eq!(idle["none"], true, "{idle}");
    assert_eq!(idle["streams"][0]["status"], 204);

    // The same message again is the same submission: the same turn.
    let resent = node(&base, params).await;
    assert_streams_sound(&resent);
    assert_eq!(texts(&resent["first"]["message"]), [stored]);
    assert_eq!(resent["first"]["message"]["id"], turn_id);
    let log = keel.log("chat-1").await;
    assert_eq!(of_type(&log, "user_message").len(), 1, "{log:?}");
    assert_eq!(of_type(&log, "turn_started").len(), 1, "{log:?}");
}

/// A `write_file` call that needs approval: the stream ends with the
/// request, and the client's answer (as `addToolApprovalResponse` leaves
/// the message) completes the turn; the same answer resent decides nothing
/// twice.
async fn approval(db: &Db) {
    let keel = Keel::start(
        db,
        &[
            r#"{"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]}"#,
            r#"{"text": "Wrote it."}"#,
        ],
    );
    let base = keel.api().base.clone();
    let result = node(&base, json!({"action": "answer", "chat": "chat-2", "resend": true})).await;
    assert_streams_sound(&result);
    let streams = result["streams"].as_array().expect("streams");
    let first = chunk_types(&streams[0]);
    assert!(first.contains(&"tool-approval-request".to_owned()), "{first:?}");
    assert_eq!(
        streams[0]["chunks"].as_array().and_then(|chunks| chunks.last()),
        Some(&json!({"type": "finish", "finishReason": "tool-calls"}))
    );
    let asked = &result["first"]["message"]["parts"];
    assert!(
        asked
            .as_array()
            .expect("parts")
            .iter()
            .any(|part| part["type"] == "tool-write_file" && part["state"] == "approval-requested"),
        "{asked}"
    );
    let log = keel.log("chat-2").await;
    let stored = of_type(&log, "assistant_message");
    assert_eq!(stored.len(), 1, "{log:?}");
    for answer in ["second", "resent"] {
        let message = &result[answer]["message"];
        assert_eq!(texts(message), [stored[0]["text"].as_str().expect("text")], "{message}");
        let tool = message["parts"]
            .as_array()
            .expect("parts")
            .iter()
            .find(|part| part["type"] == "tool-write_file")
            .expect("the tool part");
        assert_eq!(tool["state"], "output-available", "{tool}");
    }
    assert_eq!(of_type(&log, "approval_decided").len(), 1, "{log:?}");
    assert_eq!(of_type(&log, "approval_decided")[0]["decision"], "approve");
    assert_eq!(of_type(&log, "turn_complete").len(), 1, "{log:?}");
    let completed = of_type(&log, "tool_call_completed");
    assert_eq!(completed.len(), 1, "{log:?}");
    assert_eq!(completed[0]["is_error"], false, "{log:?}");
}

/// `kill -9` of Keel after the first chunk: the restarted server closes the
/// cut turn (`runtime_stopped`); what the client had assembled is what the
/// log holds, and reconnecting finds no turn running.
async fn crash(db: &Db) {
    let mut keel = Keel::start(db, &[&slow_chunks(40, 100)]);
    let base = keel.api().base.clone();
    let mut sending = NodeRun::start(&base, &json!({"action": "send", "chat": "chat-3", "message_id": "m1"}));
    sending.line("FIRST").await;
    keel.crash_and_restart();
    let cut = sending.result().await;
    let reason = wait_for_async("the cut turn closed", Duration::from_secs(20), async || {
        let log = keel.log("chat-3").await;
        of_type(&log, "turn_aborted")
            .first()
            .map(|aborted| aborted["reason"].clone())
    })
    .await;
    assert_eq!(reason, "runtime_stopped");
    let log = keel.log("chat-3").await;
    let streamed: String = of_type(&log, "assistant_content_delta")
        .iter()
        .map(|delta| delta["delta"].as_str().unwrap_or_default())
        .collect();
    let partial = texts(&cut["first"]["message"]).concat();
    assert!(
        !partial.is_empty() && streamed.starts_with(&partial),
        "{partial:?} is not what the log streamed: {streamed:?}"
    );
    let base = keel.api().base.clone();
    let after = node(&base, json!({"action": "reconnect", "chat": "chat-3"})).await;
    assert_eq!(after["none"], true, "{after}");
}

/// The stop route interrupts the turn: its stream ends with `abort`.
async fn stop(db: &Db) {
    let keel = Keel::start(db, &[&slow_chunks(40, 100)]);
    let base = keel.api().base.clone();
    let mut sending = NodeRun::start(&base, &json!({"action": "send", "chat": "chat-4", "message_id": "m1"}));
    sending.line("FIRST").await;
    let stopped = keel.api().post("/v1/ai-sdk/chat/chat-4/stop", &json!({})).await;
    assert_eq!(stopped.status.as_u16(), 202, "{}", stopped.body);
    let result = sending.result().await;
    assert_streams_sound(&result);
    let last = result["streams"][0]["chunks"]
        .as_array()
        .and_then(|chunks| chunks.last())
        .cloned();
    assert_eq!(
        last.as_ref().map(|chunk| chunk["type"].clone()),
        Some(json!("abort")),
        "{result}"
    );
    let log = keel.log("chat-4").await;
    assert_eq!(of_type(&log, "turn_aborted")[0]["reason"], "interrupted", "{log:?}");
}

/// A tool the client executes: the stream ends with its input and no
/// output, and the output `addToolOutput` leaves in the message answers
/// the call (`client_tool_result`) and completes the turn.
async fn client_tool(db: &Db) {
    let keel = Keel::start(
        db,
        &[
            r#"{"tool_calls": [{"name": "pick_color", "arguments": {"shade": "dark"}}]}"#,
            r#"{"text": "Blue it is."}"#,
        ],
    );
    // The UI message protocol cannot declare tools: the chat's session does.
    let created = keel
        .api()
        .post(
            "/v1/sessions",
            &json!({"id": "chat-5", "client_tools": [{"name": "pick_color", "description": "Asks the user for a color"}]}),
        )
        .await;
    assert_eq!(created.status.as_u16(), 201, "{}", created.body);
    let base = keel.api().base.clone();
    let params = json!({"action": "answer", "chat": "chat-5", "outputs": {"pick_color": "blue"}});
    let result = node(&base, params).await;
    assert_streams_sound(&result);
    let streams = result["streams"].as_array().expect("streams");
    let first = chunk_types(&streams[0]);
    assert!(first.contains(&"tool-input-available".to_owned()), "{first:?}");
    assert!(!first.iter().any(|kind| kind.starts_with("tool-output")), "{first:?}");
    assert_eq!(
        streams[0]["chunks"].as_array().and_then(|chunks| chunks.last()),
        Some(&json!({"type": "finish", "finishReason": "tool-calls"}))
    );
    let log = keel.log("chat-5").await;
    assert_eq!(of_type(&log, "client_tool_requested").len(), 1, "{log:?}");
    let completed = of_type(&log, "tool_call_completed");
    assert_eq!(completed.len(), 1, "{log:?}");
    assert_eq!(completed[0]["output"], "blue");
    assert_eq!(completed[0]["is_error"], false);
    let stored = of_type(&log, "assistant_message");
    assert_eq!(
        texts(&result["second"]["message"]),
        [stored[0]["text"].as_str().expect("text")]
    );
    assert_eq!(of_type(&log, "turn_complete").len(), 1, "{log:?}");
}

async fn every_check(db: Db) {
    client_tool(&db).await;
    streamed_answer(&db).await;
    approval(&db).await;
    crash(&db).await;
    stop(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ai_sdk_chats_with_keel_on_sqlite() {
    if judges_present("frontends::ai_sdk (SQLite)") {
        every_check(Db::Sqlite).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ai_sdk_chats_with_keel_on_postgres() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    if judges_present("frontends::ai_sdk (PostgreSQL)") {
        every_check(Db::Postgres(postgres)).await;
    }
}
