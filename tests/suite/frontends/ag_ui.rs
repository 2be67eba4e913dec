//! AG-UI 1.0 through `@ag-ui/client`'s `HttpAgent` (pinned in `.ci/node`):
//! a real `keel serve` (SQLite, and three nodes on one PostgreSQL), driven
//! by `tests/node/ag_ui/runs.mjs`, whose `runAgent()` verifies the order of
//! the events itself and whose events must each parse with `@ag-ui/core`'s
//! schema. What the client assembles is compared with the stored log.
//!
//! Outside CI, a machine without Node.js or `.ci/node`'s packages passes
//! these with a `SKIPPED` line; in CI (`CI` or `KEEL_REQUIRE_CLIENT_TESTS`)
//! they fail instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use keel::store::postgres::local::LocalPostgres;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::Api;
use crate::suite::support::server::{Scratch, ServeProcess};
use crate::suite::support::skip;
use crate::suite::web_ui::{log_of, of_kind};

/// The test family's variable that forbids skipping.
const REQUIRE: &str = "KEEL_REQUIRE_CLIENT_TESTS";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `.ci/node/node_modules` when it has `@ag-ui/client` and node runs;
/// `None` (said loudly) where the test may be skipped.
fn node_modules(test: &str) -> Option<PathBuf> {
    let modules = repo().join(".ci/node/node_modules");
    let node = Command::new("node").arg("--version").output();
    let ready = node.is_ok_and(|output| output.status.success())
        && modules.join("@ag-ui/client/package.json").is_file()
        && modules.join("@ag-ui/core/package.json").is_file();
    if ready {
        return Some(modules);
    }
    let how = "install Node.js 20 and run `npm ci --prefix .ci/node` (the install step of .ci/run)";
    assert!(
        skip::may_skip(REQUIRE),
        "the AG-UI tests need node and @ag-ui/client in .ci/node, and this run requires them (CI or {REQUIRE}): {how}"
    );
    skip::announce(
        test,
        &format!("node or @ag-ui/client is missing, so AG-UI is NOT tested here; {how}"),
    );
    None
}

/// Runs `runs.mjs` with `params`; the JSON of its `RESULT` line.
fn drive(modules: &Path, params: &Value) -> Value {
    let script = repo().join("tests/node/ag_ui/runs.mjs");
    let output = Command::new("node")
        .arg(&script)
        .arg(params.to_string())
        .env("KEEL_NODE_MODULES", modules)
        .env("SUPPRESS_TRANSFORMATION_WARNINGS", "1")
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let text = format!(
        "--- stdout\n{stdout}--- stderr\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "runs.mjs failed ({}):\n{text}", output.status);
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("RESULT "))
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_else(|| panic!("runs.mjs printed no RESULT:\n{text}"))
}

/// The model of these tests: an answer, a `write_file` call (which needs
/// approval under the default policy), then an answer after it.
fn script(scratch: &Scratch) -> String {
    let call = json!({"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}}]});
    scratch.script(
        "ag-ui.jsonl",
        &[
            r#"{"text": "Hello from Keel."}"#,
            &call.to_string(),
            r#"{"text": "Wrote a.txt."}"#,
        ],
    )
}

/// Three runs of one thread, each sent to `urls[i]`: a text turn, a turn
/// that stops for an approval, and the run whose `resume` approves it.
/// Checks what the client saw against the stored log, read through `api`.
async fn text_approval_and_resume(modules: &Path, urls: [String; 3], api: &Api) {
    let thread = "ag-ui-thread";
    let report = drive(
        modules,
        &json!({"thread": thread, "runs": [
            {"url": urls[0], "message": "Say hello"},
            {"url": urls[1], "message": "Write a.txt"},
            {"url": urls[2], "resume": "approve"},
        ]}),
    );
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 3, "{report:#}");
    for run in runs {
        assert_eq!(run["error"], Value::Null, "a run failed: {run:#}");
        assert_eq!(run["schemaErrors"], json!([]), "an event does not parse: {run:#}");
        assert_eq!(run["types"][0], "RUN_STARTED");
    }
    let log = log_of(api, thread).await;
    let turns: Vec<&str> = of_kind(&log, "turn_started")
        .iter()
        .map(|event| event["msg"]["turn_id"].as_str().expect("turn id"))
        .collect();
    assert_eq!(turns.len(), 2, "two turns: {log:#?}");

    // The text turn: its run is the turn, and it succeeded.
    assert_eq!(runs[0]["runId"], turns[0]);
    assert_eq!(runs[0]["outcome"], json!({"type": "success"}));
    assert!(
        runs[0]["types"]
            .as_array()
            .expect("types")
            .contains(&json!("TEXT_MESSAGE_CONTENT"))
    );

    // The approval: the run ends with the interrupt outcome for the call
    // the log waits on, while the turn stays open.
    let asked = of_kind(&log, "approval_requested");
    assert_eq!(asked.len(), 1);
    let call_id = asked[0]["msg"]["call_id"].as_str().expect("call id");
    assert_eq!(runs[1]["runId"], turns[1]);
    assert_eq!(runs[1]["outcome"]["type"], "interrupt", "{:#}", runs[1]);
    assert_eq!(runs[1]["outcome"]["interrupts"][0]["id"], call_id);
    assert_eq!(runs[1]["outcome"]["interrupts"][0]["toolCallId"], call_id);
    assert_eq!(runs[1]["outcome"]["interrupts"][0]["reason"], "tool_approval");

    // The resumed run: the rest of the same turn, approved, then success.
    assert_eq!(runs[2]["outcome"], json!({"type": "success"}), "{:#}", runs[2]);
    assert!(
        runs[2]["runId"]
            .as_str()
            .is_some_and(|run| run.starts_with(&format!("{}.", turns[1]))),
        "{:#}",
        runs[2]
    );
    let decided = of_kind(&log, "approval_decided");
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0]["msg"]["decision"], "approve");
    assert_eq!(of_kind(&log, "turn_complete").len(), 2);

    // What the client assembled is the stored conversation.
    let messages = report["messages"].as_array().expect("messages");
    let users: Vec<&Value> = messages.iter().filter(|message| message["role"] == "user").collect();
    let stored_users: Vec<&Value> = of_kind(&log, "user_message")
        .iter()
        .map(|event| &event["msg"]["text"])
        .collect();
    assert_eq!(
        users.iter().map(|message| &message["content"]).collect::<Vec<_>>(),
        stored_users
    );
    let assistants: Vec<(&Value, &Value)> = messages
        .iter()
        .filter(|message| message["role"] == "assistant" && message["content"].is_string())
        .map(|message| (&message["id"], &message["content"]))
        .collect();
    let stored_answers: Vec<(&Value, &Value)> = of_kind(&log, "assistant_message")
        .iter()
        .filter(|event| event["msg"]["text"] != "")
        .map(|event| (&event["msg"]["message_id"], &event["msg"]["text"]))
        .collect();
    assert_eq!(assistants, stored_answers);
    let calls: Vec<&Value> = messages
        .iter()
        .filter_map(|message| message["toolCalls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1, "{messages:#?}");
    assert_eq!(calls[0]["id"], call_id);
    assert_eq!(calls[0]["function"]["name"], "write_file");
    let completed = of_kind(&log, "tool_call_completed");
    let results: Vec<&Value> = messages.iter().filter(|message| message["role"] == "tool").collect();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["toolCallId"], call_id);
    assert_eq!(results[0]["content"], completed[0]["msg"]["output"]);
    assert_eq!(completed[0]["msg"]["is_error"], false);
}

/// `keel serve` node `index` on the PostgreSQL database `url`.
fn postgres_node(url: &str, scratch: &Scratch, model: &str, index: usize) -> ServeProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["serve", "--db", url, "--listen", "127.0.0.1:0", "--model", model])
        .args(["--node-id", &format!("node-{index}")])
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

/// Posts a `RunAgentInput` to `/v1/ag-ui`.
async fn post(api: &Api, body: &Value) -> (StatusCode, String) {
    let mut request = api.client.post(api.url("/v1/ag-ui")).json(body);
    if let Some(token) = &api.token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("POST /v1/ag-ui");
    let status = response.status();
    (status, response.text().await.expect("body"))
}

/// Bad input is refused with a code and stores nothing; a retried run's
/// message makes no second turn.
async fn bad_input_stores_nothing(api: &Api, thread: &str, first_message: &Value) {
    let before = log_of(api, thread).await.len();
    let history = json!([first_message]);
    let cases = [
        (json!({"threadId": thread}), StatusCode::BAD_REQUEST, "invalid_request"),
        (
            json!({"threadId": thread, "runId": "r", "messages": [{"id": "x", "role": "robot", "content": "?"}]}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"threadId": thread, "runId": "r", "messages": [{"id": "x", "role": "user", "content": [
                {"type": "image", "source": {"type": "url", "value": "https://example.com/a.png"}}
            ]}]}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"threadId": thread, "runId": "r", "messages": [
                {"id": "m0", "role": "user", "content": "Another beginning"},
                {"id": "m1", "role": "user", "content": "Go on"}
            ]}),
            StatusCode::CONFLICT,
            "history_mismatch",
        ),
        (
            json!({"threadId": thread, "runId": "r", "messages": history, "resume": [
                {"interruptId": "no-such-call", "status": "resolved"}
            ]}),
            StatusCode::CONFLICT,
            "call_not_waiting",
        ),
    ];
    for (body, status, code) in cases {
        let (got, text) = post(api, &body).await;
        assert_eq!(got, status, "{body}: {text}");
        let error: Value = serde_json::from_str(&text).expect("a JSON error");
        assert_eq!(error["error"]["code"], code, "{body}: {text}");
    }
    // The whole history and a resume for a call that does not wait.
    let messages = log_messages(api, thread).await;
    let (got, text) = post(
        api,
        &json!({"threadId": thread, "runId": "r", "messages": messages, "resume": [
            {"interruptId": "no-such-call", "status": "resolved"}
        ]}),
    )
    .await;
    assert_eq!(got, StatusCode::CONFLICT, "{text}");
    assert!(
        text.contains("call_not_waiting") && text.contains("no-such-call"),
        "{text}"
    );
    assert_eq!(log_of(api, thread).await.len(), before, "nothing was stored");

    // The first run retried (its message again, as the client had it): the
    // stream replays that turn, and no turn is added.
    let (got, text) = post(api, &json!({"threadId": thread, "runId": "again", "messages": history})).await;
    assert_eq!(got, StatusCode::OK, "{text}");
    assert!(
        text.contains("\"RUN_FINISHED\"") && text.contains("Hello from Keel."),
        "{text}"
    );
    let log = log_of(api, thread).await;
    assert_eq!(
        of_kind(&log, "turn_started").len(),
        2,
        "no second turn for a retried message"
    );
}

/// The thread's messages as a client would send them back, made from the
/// stored log.
async fn log_messages(api: &Api, thread: &str) -> Value {
    let log = log_of(api, thread).await;
    let mut messages = Vec::new();
    for event in &log {
        let msg = &event["msg"];
        match msg["type"].as_str() {
            Some("user_message") => messages.push(json!({"id": format!("u{}", event["sequence"]), "role": "user", "content": msg["text"]})),
            Some("assistant_message") if msg["text"] != "" => {
                messages.push(json!({"id": msg["message_id"], "role": "assistant", "content": msg["text"]}));
            }
            Some("approval_requested") => messages.push(json!({"id": format!("a{}", event["sequence"]), "role": "assistant"})),
            Some("tool_call_completed") => messages.push(json!({
                "id": format!("t{}", event["sequence"]), "role": "tool", "toolCallId": msg["call_id"], "content": msg["output"]
            })),
            _ => {}
        }
    }
    json!(messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ag_ui_http_agent_runs_text_approval_and_resume_on_sqlite() {
    let Some(modules) = node_modules("ag_ui_http_agent_runs_text_approval_and_resume_on_sqlite") else {
        return;
    };
    let scratch = Scratch::new();
    let model = script(&scratch);
    let server = ServeProcess::start(&scratch, &["--model", &model]);
    let url = server.api.url("/v1/ag-ui");
    text_approval_and_resume(&modules, [url.clone(), url.clone(), url], &server.api).await;
    let log = log_of(&server.api, "ag-ui-thread").await;
    let first = of_kind(&log, "submission_queued")[0]["msg"]["idempotency_key"].clone();
    bad_input_stores_nothing(
        &server.api,
        "ag-ui-thread",
        &json!({"id": first, "role": "user", "content": "Say hello"}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ag_ui_resume_sent_to_another_node_of_a_postgres_cluster_finishes_the_turn() {
    let Some(modules) = node_modules("ag_ui_resume_sent_to_another_node_of_a_postgres_cluster_finishes_the_turn")
    else {
        return;
    };
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let url = postgres.fresh_database();
    let scratch = Scratch::new();
    let model = script(&scratch);
    let nodes: Vec<ServeProcess> = (0..3)
        .map(|index| postgres_node(&url, &scratch, &model, index))
        .collect();
    let urls = [0, 1, 2].map(|index| nodes[index].api.url("/v1/ag-ui"));
    text_approval_and_resume(&modules, urls, &nodes[2].api).await;
    let log = log_of(&nodes[1].api, "ag-ui-thread").await;
    let first = of_kind(&log, "submission_queued")[0]["msg"]["idempotency_key"].clone();
    bad_input_stores_nothing(
        &nodes[0].api,
        "ag-ui-thread",
        &json!({"id": first, "role": "user", "content": "Say hello"}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ag_ui_obeys_the_front_door_credentials_scopes_and_tenants() {
    let scratch = Scratch::new();
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, "ag-ui-operator\n").expect("write the token");
    let model = scratch.script("answer.jsonl", &[r#"{"text": "Hi there."}"#; 8]);
    let server = ServeProcess::start(
        &scratch,
        &["--token-file", token_file.to_str().expect("utf-8"), "--model", &model],
    );
    let anonymous = server.api.clone();
    let operator = Api {
        token: Some("ag-ui-operator".to_owned()),
        ..server.api.clone()
    };
    let hello = |thread: &str| json!({"threadId": thread, "runId": "r", "messages": [{"id": "m1", "role": "user", "content": "Hello"}]});

    let (status, text) = post(&anonymous, &hello("t1")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    let cross_site = operator
        .client
        .post(operator.url("/v1/ag-ui"))
        .bearer_auth("ag-ui-operator")
        .header("origin", "https://elsewhere.example")
        .json(&hello("t1"));
    let reply = operator.send(cross_site).await;
    assert_eq!(
        (reply.status, reply.code()),
        (StatusCode::FORBIDDEN, "forbidden_origin")
    );
    let plain = operator
        .client
        .post(operator.url("/v1/ag-ui"))
        .bearer_auth("ag-ui-operator")
        .header("content-type", "text/plain")
        .body(hello("t1").to_string());
    let reply = operator.send(plain).await;
    assert_eq!(
        (reply.status, reply.code()),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
    );

    let key = async |tenant: &str, scopes: &[&str]| {
        let reply = operator
            .post(
                "/v1/keys",
                &json!({"tenant": tenant, "name": format!("{tenant} {scopes:?}"), "scopes": scopes}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        Api {
            token: Some(reply.body["key"].as_str().expect("the key").to_owned()),
            ..server.api.clone()
        }
    };
    let reader = key("acme", &["read"]).await;
    let (status, text) = post(&reader, &hello("t1")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("missing_scope_submit"), "{text}");
    assert_eq!(operator.get("/v1/sessions/acme~t1").await.status, StatusCode::NOT_FOUND);
    // A run answers with the thread's events: `submit` alone is not
    // enough, as the description's security requirement says, and nothing
    // is made.
    let submitter = key("acme", &["submit"]).await;
    let (status, text) = post(&submitter, &hello("t1")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("missing_scope_read"), "{text}");
    assert_eq!(operator.get("/v1/sessions/acme~t1").await.status, StatusCode::NOT_FOUND);
    let description: serde_json::Value = serde_json::from_str(keel::server::openapi_json()).expect("the description");
    assert_eq!(
        description["paths"]["/v1/ag-ui"]["post"]["security"],
        json!([{"bearer": ["submit", "read"]}])
    );

    // Each tenant's thread `t1` is its own session.
    for tenant in ["acme", "beta"] {
        let writer = key(tenant, &["read", "submit"]).await;
        let (status, text) = post(&writer, &hello("t1")).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(
            text.contains("\"RUN_FINISHED\"") && text.contains("Hi there."),
            "{text}"
        );
        let session = operator.get(&format!("/v1/sessions/{tenant}~t1")).await;
        assert_eq!(session.status, StatusCode::OK, "{}", session.body);
        assert_eq!(session.body["tenant"], tenant);
        let (status, text) = post(&writer, &hello("a~b")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    }
}

/// The model of the frontend tool tests: a `get_location` call, then an
/// answer.
fn client_tool_script(scratch: &Scratch) -> String {
    let call = json!({"tool_calls": [{"name": "get_location", "arguments": {}}]});
    scratch.script(
        "client-tool.jsonl",
        &[&call.to_string(), r#"{"text": "You are in Paris."}"#],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ag_ui_frontend_tool_round_trip_through_http_agent() {
    let Some(modules) = node_modules("ag_ui_frontend_tool_round_trip_through_http_agent") else {
        return;
    };
    let scratch = Scratch::new();
    let model = client_tool_script(&scratch);
    let server = ServeProcess::start(&scratch, &["--model", &model]);
    frontend_tool_round_trip(&modules, &server.api).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ag_ui_frontend_tool_round_trip_on_postgres() {
    let Some(modules) = node_modules("ag_ui_frontend_tool_round_trip_on_postgres") else {
        return;
    };
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let url = postgres.fresh_database();
    let scratch = Scratch::new();
    let model = client_tool_script(&scratch);
    let server = postgres_node(&url, &scratch, &model, 0);
    frontend_tool_round_trip(&modules, &server.api).await;
}

/// A frontend tool through `HttpAgent`: the first run stops at the call,
/// the second answers it with a tool message, and the turn completes.
async fn frontend_tool_round_trip(modules: &Path, api: &Api) {
    let url = api.url("/v1/ag-ui");
    let tools = json!([{"name": "get_location", "description": "Where the user is.", "parameters": {"type": "object", "properties": {}}}]);
    let report = drive(
        modules,
        &json!({"thread": "tools", "runs": [
            {"url": url, "message": "Where am I?", "tools": tools},
            {"url": url, "toolResult": {"content": "Paris"}, "tools": tools},
        ]}),
    );
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{report:#}");
    for run in runs {
        assert_eq!(run["error"], Value::Null, "a run failed: {run:#}");
        assert_eq!(run["schemaErrors"], json!([]), "an event does not parse: {run:#}");
    }
    let log = log_of(api, "tools").await;
    let requested = of_kind(&log, "client_tool_requested");
    assert_eq!(requested.len(), 1, "{log:#?}");
    let call_id = requested[0]["msg"]["call_id"].as_str().expect("call id");
    // The first run stops at the frontend tool, as success naming the call.
    assert_eq!(
        runs[0]["outcome"],
        json!({"type": "success", "pendingToolCallIds": [call_id]})
    );
    // The tool message of the second run is the call's result.
    let completed = of_kind(&log, "tool_call_completed");
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0]["msg"]["call_id"], call_id);
    assert_eq!(completed[0]["msg"]["output"], "Paris");
    assert_eq!(runs[1]["outcome"], json!({"type": "success"}), "{:#}", runs[1]);
    assert_eq!(of_kind(&log, "turn_complete").len(), 1);
    let session = api.session("tools").await;
    assert_eq!(session["client_tools"][0]["name"], "get_location", "{session:#}");
    let last = report["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .expect("a message");
    assert_eq!(last["content"], "You are in Paris.");
}

/// An answer streamed slowly enough for a test to stop or kill its run
/// after the first delta.
const SLOW_STORY: &str =
    r#"{"chunks": ["Once", " upon", " a", " time", " there", " was", " a", " runtime."], "delay_ms": 250}"#;

/// Whether the page's messages (a `runs.mjs` report's) hold the
/// beginning of the slow story as an assistant message, not all of it.
fn kept_a_beginning(report: &Value) -> bool {
    report["messages"].as_array().into_iter().flatten().any(|message| {
        message["role"] == "assistant"
            && message["content"]
                .as_str()
                .is_some_and(|text| text.starts_with("Once") && !text.ends_with("runtime."))
    })
}

/// A page's stop button mid-answer: `HttpAgent` keeps the text it was
/// shown as an assistant message and sends it with the next run. The
/// thread stays open to that run (it was `409 history_mismatch` for ever
/// after: the session's history left the broken-off text out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ag_ui_a_run_stopped_mid_answer_leaves_the_thread_open_to_the_next() {
    let Some(modules) = node_modules("ag_ui_a_run_stopped_mid_answer_leaves_the_thread_open_to_the_next") else {
        return;
    };
    let scratch = Scratch::new();
    let model = scratch.script("stopped.jsonl", &[SLOW_STORY, r#"{"text": "And it went on."}"#]);
    let server = ServeProcess::start(&scratch, &["--model", &model]);
    let url = server.api.url("/v1/ag-ui");
    let thread = "ag-ui-stopped";
    let stop = server.api.url(&format!("/v1/sessions/{thread}/submissions"));
    let report = drive(
        &modules,
        &json!({"thread": thread, "runs": [
            {"url": url, "message": "Tell a story", "interruptOnText": stop},
            {"url": url, "message": "Go on"},
        ]}),
    );
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{report:#}");
    assert_eq!(runs[0]["interrupted"], 202, "{report:#}");
    assert_eq!(runs[0]["outcome"]["type"], "cancelled", "{report:#}");
    assert!(
        kept_a_beginning(&report),
        "the client keeps the beginning it was shown: {report:#}"
    );
    assert_eq!(runs[1]["error"], Value::Null, "the next run is refused: {report:#}");
    assert_eq!(runs[1]["schemaErrors"], json!([]), "{report:#}");
    assert_eq!(runs[1]["outcome"], json!({"type": "success"}), "{report:#}");
    let log = log_of(&server.api, thread).await;
    assert_eq!(of_kind(&log, "turn_aborted").len(), 1, "{log:#?}");
    assert_eq!(of_kind(&log, "turn_complete").len(), 1, "{log:#?}");
    let answers: Vec<&Value> = of_kind(&log, "assistant_message")
        .into_iter()
        .map(|event| &event["msg"]["text"])
        .collect();
    assert_eq!(answers, [&json!("And it went on.")], "{log:#?}");
}

/// docs/ag-ui.md's workaround for `@ag-ui/client` 1.0.0 when the
/// connection drops mid-run: `runAgent` rejects, and a second rejection
/// nobody handles ends a Node.js process; the documented handler keeps it
/// alive. When the client stops leaving that rejection, this test says so
/// (and the docs' section can go).
#[test]
fn ag_ui_client_dropped_connection_workaround_keeps_node_alive() {
    let Some(modules) = node_modules("ag_ui_client_dropped_connection_workaround_keeps_node_alive") else {
        return;
    };
    let script = repo().join("tests/node/ag_ui/dropped.mjs");
    let run = |handle: bool| {
        let output = Command::new("node")
            .arg(&script)
            .arg(json!({ "handle": handle }).to_string())
            .env("KEEL_NODE_MODULES", &modules)
            .output()
            .expect("run node");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let result = text
            .lines()
            .find_map(|line| line.strip_prefix("RESULT "))
            .map(|json| serde_json::from_str::<Value>(json).expect("RESULT is JSON"));
        (
            output.status,
            result,
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (status, result, stderr) = run(false);
    assert!(
        !status.success() && result.is_none() && stderr.contains("terminated"),
        "without the handler the client's stray rejection no longer ends the process ({status}): \
         docs/ag-ui.md's workaround may be obsolete\n{stderr}"
    );
    let (status, result, stderr) = run(true);
    assert!(status.success(), "{status}\n{stderr}");
    let result = result.expect("RESULT");
    assert_eq!(result["caught"], "terminated", "runAgent rejects: {result}");
    assert_eq!(result["ignored"], 1, "the one stray rejection is handled: {result}");
}

/// A node killed (`kill -9`) mid-answer: the page keeps the beginning it
/// was shown, and its next message, sent to the restarted server, goes on
/// with the thread (the check ran against a log with the cut turn still
/// open, or closed by recovery: either way it was `409`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ag_ui_a_run_cut_by_a_crash_leaves_the_thread_open_to_the_next() {
    let Some(modules) = node_modules("ag_ui_a_run_cut_by_a_crash_leaves_the_thread_open_to_the_next") else {
        return;
    };
    let scratch = Scratch::new();
    let model = scratch.script("crashed.jsonl", &[SLOW_STORY; 4]);
    let server = ServeProcess::start(&scratch, &["--model", &model]);
    let thread = "ag-ui-crashed";
    let signal = scratch.dir.path().join("text-seen");
    let first = json!({"thread": thread, "runs": [
        {"url": server.api.url("/v1/ag-ui"), "message": "Tell a story", "signalOnText": signal, "mayFail": true},
    ]});
    let page = {
        let modules = modules.clone();
        std::thread::spawn(move || drive(&modules, &first))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !signal.exists() {
        assert!(std::time::Instant::now() < deadline, "no text came");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    server.crash();
    let report = page.join().expect("the page");
    assert_ne!(report["runs"][0]["error"], Value::Null, "the run was cut: {report:#}");
    assert!(
        kept_a_beginning(&report),
        "the page keeps the beginning it was shown: {report:#}"
    );
    let kept = &report["messages"];

    let restarted = ServeProcess::start(&scratch, &["--model", &model]);
    let next = drive(
        &modules,
        &json!({"thread": thread, "messages": kept, "runs": [
            {"url": restarted.api.url("/v1/ag-ui"), "message": "Go on"},
        ]}),
    );
    let run = &next["runs"][0];
    assert_eq!(run["error"], Value::Null, "the next run is refused: {next:#}");
    assert_eq!(run["schemaErrors"], json!([]), "{next:#}");
    assert_eq!(run["outcome"], json!({"type": "success"}), "{next:#}");
    let log = log_of(&restarted.api, thread).await;
    assert_eq!(of_kind(&log, "turn_aborted").len(), 1, "{log:#?}");
    assert_eq!(of_kind(&log, "turn_complete").len(), 1, "{log:#?}");
}
