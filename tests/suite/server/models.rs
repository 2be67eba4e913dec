//! A session's model: the models a server offers (`GET /v1/models`),
//! switching a session's model (`PATCH`), script paths stored absolute, and
//! a session whose model the server no longer offers refused with a `4xx`
//! that names the way out, over a restart of `keel serve`.

use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::Api;
use crate::suite::support::server::{Scratch, ServeProcess, TestServer, slow_chunks};
use crate::suite::support::wait::{HANG_GUARD, wait_until_async};

/// The types of the session's stored events, oldest first.
async fn event_types(api: &Api, session_id: &str) -> Vec<Value> {
    let reply = api.get(&format!("/v1/sessions/{session_id}/events?limit=500")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|event| event["msg"].clone())
        .collect()
}

/// The texts of the session's answers so far.
async fn answers(api: &Api, session_id: &str) -> Vec<String> {
    event_types(api, session_id)
        .await
        .into_iter()
        .filter(|msg| msg["type"] == "assistant_message")
        .filter_map(|msg| msg["text"].as_str().map(str::to_owned))
        .collect()
}

/// The text of the session's answer after its first `before`, once it has
/// one.
async fn answer_after(api: &Api, session_id: &str, before: usize) -> String {
    let mut answer = String::new();
    wait_until_async("an answer", HANG_GUARD, async || {
        let all = answers(api, session_id).await;
        answer = all.get(before).cloned().unwrap_or_default();
        all.len() > before
    })
    .await;
    answer
}

/// `keel serve` in `scratch` with `args`, started from `cwd`.
fn serve_from(scratch: &Scratch, cwd: &std::path::Path, args: &[&str]) -> ServeProcess {
    let mut command: Command = ServeProcess::command(scratch, args);
    command.current_dir(cwd);
    ServeProcess::spawn(command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quickstart_session_survives_a_restart_with_another_model() {
    let scratch = Scratch::new();
    let root = scratch.dir.path().to_path_buf();
    std::fs::create_dir_all(root.join("examples")).expect("mkdir");
    std::fs::write(
        root.join("examples/hello.jsonl"),
        r#"{"text": "Hello from the quickstart."}"#,
    )
    .expect("write");
    // The quickstart: a relative script path.
    let server = ServeProcess::start(&scratch, &["--model", "script:examples/hello.jsonl"]);
    let created = server.api.create(json!({"id": "quick"})).await;
    let stored = format!("script:{}", root.join("examples/hello.jsonl").display());
    assert_eq!(created["model"], stored, "stored absolute: {created}");
    server.api.say("quick", "Hello").await;
    assert_eq!(
        answer_after(&server.api, "quick", 0).await,
        "Hello from the quickstart."
    );
    let _ = server.terminate();

    // The operator moves on to a model of keel.toml, with a script
    // directory of its own.
    std::fs::create_dir_all(root.join("scripts")).expect("mkdir");
    let fast = root.join("fast.jsonl");
    // A script plays from the session's position in its model calls: one
    // was made.
    let lines = [r#"{"text": "unused"}"#, r#"{"text": "Answered by fast."}"#];
    std::fs::write(&fast, lines.join("\n")).expect("write");
    let config = root.join("keel.toml");
    std::fs::write(
        &config,
        format!(
            "model = \"fast\"\n[models.fast]\nprovider = \"script\"\nmodel = \"{}\"\napi_key_env = \
             \"SECRET_KEY_NAME\"\n",
            fast.display()
        ),
    )
    .expect("write keel.toml");
    let scripts = root.join("scripts").display().to_string();
    let config_arg = config.display().to_string();
    let server = ServeProcess::start(&scratch, &["--config", &config_arg, "--script-dir", &scripts]);
    let api = &server.api;

    let models = api.get("/v1/models").await;
    assert_eq!(models.status, StatusCode::OK, "{}", models.body);
    assert_eq!(models.body["default"], "fast", "{}", models.body);
    assert_eq!(models.body["models"][0]["spec"], "fast", "{}", models.body);
    assert_eq!(models.body["models"][0]["default"], true, "{}", models.body);
    assert!(!models.body.to_string().contains("SECRET_KEY_NAME"), "{}", models.body);

    // Refused with a 4xx that says why and how to fix it, on each route
    // that loads it; the stored session stays as it was.
    let say = json!({"op": {"type": "user_input", "text": "Again"}});
    let reply = api.submit("quick", say.clone()).await;
    assert!(reply.status.is_client_error(), "{}: {}", reply.status, reply.body);
    assert_eq!(reply.code(), "script_model_over_ceiling", "{}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("session 'quick' is not loaded"), "{message}");
    assert!(message.contains("PATCH /v1/sessions/{id}"), "{message}");
    assert!(message.contains("GET /v1/models"), "{message}");
    let shown = api.session("quick").await;
    assert_eq!(shown["model"], stored, "{shown}");
    assert_eq!(shown["title"], "Hello", "{shown}");

    // Switching the model makes it work again.
    let patched = api.patch("/v1/sessions/quick", &json!({"model": "fast"})).await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert_eq!(patched.body["model"], "fast", "{}", patched.body);
    let changed: Vec<Value> = event_types(api, "quick")
        .await
        .into_iter()
        .filter(|msg| msg["type"] == "model_changed")
        .collect();
    assert_eq!(
        changed,
        [json!({"type": "model_changed", "previous": stored, "model": "fast"})]
    );
    api.say("quick", "Again").await;
    assert_eq!(answer_after(api, "quick", 1).await, "Answered by fast.");
    let _ = server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_script_path_is_found_by_a_server_started_elsewhere() {
    let scratch = Scratch::new();
    let root = scratch.dir.path().to_path_buf();
    std::fs::write(
        root.join("hello.jsonl"),
        [r#"{"text": "one"}"#, r#"{"text": "two"}"#].join("\n"),
    )
    .expect("write");
    let server = ServeProcess::start(&scratch, &["--model", "script:hello.jsonl"]);
    server.api.create(json!({"id": "moved"})).await;
    let _ = server.terminate();

    // The same script named absolutely, from another directory, with a
    // script directory that does not hold it.
    std::fs::create_dir_all(root.join("scripts")).expect("mkdir");
    let elsewhere = tempfile::tempdir().expect("another directory");
    let model = format!("script:{}", root.join("hello.jsonl").display());
    let scripts = root.join("scripts").display().to_string();
    let server = serve_from(
        &scratch,
        elsewhere.path(),
        &["--model", &model, "--script-dir", &scripts],
    );
    server.api.say("moved", "hi").await;
    assert_eq!(answer_after(&server.api, "moved", 0).await, "one");
    let _ = server.terminate();
}

#[tokio::test]
async fn patch_switches_the_model_between_turns_only_and_checks_it_like_create() {
    let server = TestServer::start(|_, _| {}).await;
    let api = &server.api;
    let slow = server.scratch.script("slow.jsonl", &[&slow_chunks(40, 50)]);
    let other = server
        .scratch
        .script("other.jsonl", &[r#"{"text": "unused"}"#, r#"{"text": "other"}"#]);
    api.create(json!({"id": "s", "model": slow})).await;

    // Validation: the codes of `model` at creation.
    let reply = api.patch("/v1/sessions/s", &json!({"model": "nope:nothing"})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    assert_eq!(reply.code(), "model_not_found", "{}", reply.body);
    let reply = api
        .patch("/v1/sessions/s", &json!({"model": "script:/etc/passwd"}))
        .await;
    assert_eq!(reply.code(), "script_model_over_ceiling", "{}", reply.body);
    let reply = api.patch("/v1/sessions/s", &json!({})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    let reply = api.patch("/v1/sessions/s", &json!({"model": null})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    let reply = api.patch("/v1/sessions/nobody", &json!({"model": other})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);

    // Mid-turn: refused, the turn goes on with its model.
    api.say("s", "long answer").await;
    wait_until_async("the turn to run", HANG_GUARD, async || {
        api.session("s").await["state"] == "running"
    })
    .await;
    let reply = api.patch("/v1/sessions/s", &json!({"model": other})).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.body);
    assert_eq!(reply.code(), "session_busy", "{}", reply.body);
    api.wait_idle("s").await;

    // Between turns: title and model together, used from the next turn.
    let reply = api
        .patch("/v1/sessions/s", &json!({"model": other, "title": "Renamed"}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["model"], other.as_str(), "{}", reply.body);
    assert_eq!(reply.body["title"], "Renamed", "{}", reply.body);
    api.say("s", "short answer").await;
    assert_eq!(answer_after(api, "s", 1).await, "other");
    // The same model again records nothing.
    let reply = api.patch("/v1/sessions/s", &json!({"model": other})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let changes = event_types(api, "s")
        .await
        .into_iter()
        .filter(|msg| msg["type"] == "model_changed")
        .count();
    assert_eq!(changes, 1);
    assert_eq!(api.session("s").await["title"], "Renamed", "an explicit title wins");
    server.stop().await;
}

#[tokio::test]
async fn the_models_of_a_server_without_keel_toml_are_its_default() {
    let server = TestServer::start(|_, _| {}).await;
    let reply = server.api.get("/v1/models").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body, json!({"models": [], "default": null}));
    server.stop().await;

    let server = TestServer::start(|config, scratch| {
        config.default_model = Some(scratch.script("default.jsonl", &[r#"{"text": "hi"}"#]));
    })
    .await;
    let reply = server.api.get("/v1/models").await;
    let models = reply.body["models"].as_array().cloned().unwrap_or_default();
    assert_eq!(models.len(), 1, "{}", reply.body);
    assert_eq!(models[0]["default"], true);
    assert_eq!(models[0]["provider"], "script");
    assert_eq!(models[0]["spec"], reply.body["default"]);
    server.stop().await;
}

#[tokio::test]
async fn forks_are_titled_from_their_first_message_and_lists_follow_activity() {
    let server = TestServer::start(|config, scratch| {
        config.default_model = Some(scratch.script(
            "default.jsonl",
            &[r#"{"text": "a"}"#, r#"{"text": "b"}"#, r#"{"text": "c"}"#],
        ));
    })
    .await;
    let api = &server.api;
    api.create(json!({"id": "older"})).await;
    api.create(json!({"id": "parent"})).await;
    let long = "Please explain in detail how the write-ahead log keeps every acknowledged message";
    api.say("parent", long).await;
    api.wait_idle("parent").await;
    let title = api.session("parent").await["title"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(title, "Please explain in detail how the write-ahead log keeps…");
    let last = api.session("parent").await["last_sequence"]
        .as_u64()
        .unwrap_or_default();

    // A fork holds the conversation: its first message titles it.
    let fork = api
        .post("/v1/sessions/parent/fork", &json!({"id": "fork", "at_sequence": last}))
        .await;
    assert_eq!(fork.status, StatusCode::CREATED, "{}", fork.body);
    assert_eq!(fork.body["title"], title.as_str(), "{}", fork.body);
    // An edit of the first message: the edited message titles it.
    let turn = event_types(api, "parent")
        .await
        .into_iter()
        .find(|msg| msg["type"] == "turn_started")
        .and_then(|msg| msg["turn_id"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let edit = api
        .post(
            "/v1/sessions/parent/fork",
            &json!({"id": "edit", "before_turn": turn, "message": "A shorter question"}),
        )
        .await;
    assert_eq!(edit.status, StatusCode::CREATED, "{}", edit.body);
    api.wait_idle("edit").await;
    assert_eq!(api.session("edit").await["title"], "A shorter question");

    // `older` was created first; activity puts it first once it is used.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    api.say("older", "hi").await;
    api.wait_idle("older").await;
    let ids = |reply: &crate::suite::support::api::Reply| -> Vec<String> {
        reply.body["sessions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|session| session["id"].as_str().map(str::to_owned))
            .collect()
    };
    let by_activity = api.get("/v1/sessions?order=activity&limit=1").await;
    assert_eq!(by_activity.status, StatusCode::OK, "{}", by_activity.body);
    assert_eq!(ids(&by_activity), ["older"]);
    let cursor = by_activity.body["next_cursor"].as_str().unwrap_or_default().to_owned();
    let next = api
        .get(&format!("/v1/sessions?order=activity&limit=10&cursor={cursor}"))
        .await;
    assert_eq!(next.body["sessions"].as_array().map(Vec::len), Some(3), "{}", next.body);
    let by_creation = api.get("/v1/sessions?limit=10").await;
    assert_eq!(ids(&by_creation), ["edit", "fork", "parent", "older"]);
    // A by-activity cursor reads as its key by creation; anything else is
    // refused.
    let mixed = api.get(&format!("/v1/sessions?cursor={cursor}")).await;
    assert_eq!(mixed.status, StatusCode::OK, "{}", mixed.body);
    let bad = api.get("/v1/sessions?order=activity&cursor=1-x").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    server.stop().await;
}

/// A `keel.toml` model's context window reaches the sessions of
/// `keel serve`: past `compact_threshold` of it, the history is summarized
/// before the next step, as in `keel run`. (The server wraps each model to
/// time its requests, and the wrapper hid the model's window.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_models_context_window_compacts_the_history_past_its_threshold() {
    use crate::suite::support::http_server::{Reply, ScriptedServer};
    let answer = include_bytes!("../../fixtures/openai-chat/openai-text-usage.sse");
    // The first turn's answer, the summary, the second turn's answer.
    let upstream = ScriptedServer::start((0..3).map(|_| Reply::sse_in_pieces(answer, 64)).collect()).await;
    let scratch = Scratch::new();
    std::fs::write(
        scratch.dir.path().join("keel.toml"),
        format!(
            "[models.small]\nprovider = \"openai\"\nmodel = \"gpt-4.1-mini\"\nbase_url = \"{}/v1\"\n\
             api_key_env = \"KEEL_TEST_SMALL_KEY\"\nmax_retries = 0\ncontext_window = 4000\ncompact_threshold = 0.5\n",
            upstream.url()
        ),
    )
    .expect("keel.toml");
    let mut command = ServeProcess::command(&scratch, &["--config", "keel.toml", "--model", "small"]);
    command.env("KEEL_TEST_SMALL_KEY", "sk-keel-test");
    let server = ServeProcess::spawn(command);
    server
        .api
        .create(json!({"id": "windowed", "tools": {"shell": false}}))
        .await;
    server.api.say("windowed", "hi").await;
    server.api.wait_idle("windowed").await;
    // About 3,000 tokens: past half the window, within it.
    server.api.say("windowed", &"word ".repeat(2_400)).await;
    server.api.wait_idle("windowed").await;
    let log = server.api.get("/v1/sessions/windowed/events?limit=1000").await;
    let kinds: Vec<&str> = log.body["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|event| event["msg"]["type"].as_str())
        .collect();
    assert_eq!(
        kinds.iter().filter(|kind| **kind == "context_compacted").count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|kind| **kind == "turn_complete").count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(upstream.requests().len(), 3);
}
