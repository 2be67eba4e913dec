//! The operator's ceiling on what API clients may ask for (`[server]` in
//! keel.toml, `keel serve` flags) and provider keys kept out of stored
//! errors: each attack found by outside testing, over real HTTP.

use std::path::PathBuf;
use std::sync::Arc;

use keel::agent::{AgentConfig, SessionContext};
use keel::model::ScriptedModel;
use keel::protocol::EventMsg;
use keel::store::{CheckpointStore, SqliteCheckpoint};
use keel::tools::workspace::SandboxPolicy;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::agent::{shutdown, start_with};
use crate::suite::support::api::{Api, Reply};
use crate::suite::support::http_server::{Reply as Upstream, ScriptedServer};
use crate::suite::support::server::{Scratch, ServeProcess, TestServer};
use crate::suite::support::wait::guard;

const ANSWER: &str = r#"{"text": "hi"}"#;

/// The attack: an unsandboxed shell whose calls run without approval.
fn wide_open(id: &str) -> Value {
    json!({
        "id": id,
        "tools": {"shell": true, "sandbox": "full-access"},
        "approvals": {"default": "auto"},
    })
}

/// `scratch/scripts`, the script directory of these tests' servers.
fn scripts(scratch: &Scratch) -> PathBuf {
    let dir = scratch.dir.path().join("scripts");
    std::fs::create_dir_all(&dir).expect("script directory");
    dir
}

/// A server on the default ceiling but for the script directory
/// (`scratch/scripts`), whose default model is a script outside it; then
/// `configure`.
async fn server_with(configure: impl FnOnce(&mut keel::server::ServerConfig, &Scratch)) -> TestServer {
    TestServer::start(|config, scratch| {
        config.default_model = Some(scratch.script("default.jsonl", &[ANSWER]));
        config.keel.server.script_dir = Some(scripts(scratch));
        configure(config, scratch);
    })
    .await
}

async fn refused(api: &Api, body: Value, code: &str) -> Reply {
    let reply = api.post("/v1/sessions", &body).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{body}: {}", reply.body);
    assert_eq!(reply.code(), code, "{}", reply.body);
    reply
}

fn message(reply: &Reply) -> &str {
    reply.body["error"]["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_client_cannot_ask_for_more_than_the_operator_allows() {
    let server = server_with(|_, _| {}).await;
    let api = &server.api;
    let reply = refused(api, wide_open("x"), "sandbox_over_ceiling").await;
    assert!(message(&reply).contains("max_sandbox"), "{}", reply.body);
    assert_eq!(
        api.get("/v1/sessions/x").await.status,
        StatusCode::NOT_FOUND,
        "nothing stored"
    );

    let reply = refused(
        api,
        json!({"approvals": {"default": "auto"}}),
        "auto_approval_over_ceiling",
    )
    .await;
    assert!(message(&reply).contains("auto_approve"), "{}", reply.body);
    for tool in ["shell", "write_file", "edit_file", "files__delete"] {
        refused(
            api,
            json!({"approvals": {"tools": {tool: "auto"}}}),
            "auto_approval_over_ceiling",
        )
        .await;
    }
    let reply = refused(api, json!({"tools": {"network": true}}), "network_over_ceiling").await;
    assert!(message(&reply).contains("allow_network"), "{}", reply.body);

    // Narrowing is always allowed, and so is auto for the reading tools.
    api.create(json!({
        "id": "narrow",
        "tools": {"sandbox": "read-only", "network": false},
        "approvals": {"default": "ask", "tools": {"read_file": "auto", "search": "auto"}},
    }))
    .await;
    // With the shell and the write tools off, `default: auto` reaches only
    // reading tools.
    api.create(json!({
        "id": "readers",
        "tools": {"shell": false, "write": false},
        "approvals": {"default": "auto"},
    }))
    .await;
    server.stop().await;

    // A tool the operator's [tools] turned off stays off.
    let server = server_with(|config, _| config.keel.tools.shell = false).await;
    let reply = refused(&server.api, json!({"tools": {"shell": true}}), "tool_over_ceiling").await;
    assert!(message(&reply).contains("[tools] shell = false"), "{}", reply.body);
    server.stop().await;

    // The operator may raise the ceiling.
    let server = server_with(|config, _| {
        config.keel.server.max_sandbox = SandboxPolicy::FullAccess;
        config.keel.server.auto_approve = vec!["*".to_owned()];
        config.keel.server.allow_network = true;
    })
    .await;
    let mut body = wide_open("raised");
    body["tools"]["network"] = json!(true);
    server.api.create(body).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_serve_takes_the_ceiling_from_its_flags_and_keel_toml() {
    let scratch = Scratch::new();
    let model = scratch.script("default.jsonl", &[ANSWER]);
    let server = ServeProcess::start(&scratch, &["--model", &model]);
    refused(&server.api, wide_open("x"), "sandbox_over_ceiling").await;
    server.crash();

    let server = ServeProcess::start(
        &scratch,
        &["--model", &model, "--max-sandbox", "full-access", "--auto-approve", "*"],
    );
    server.api.create(wide_open("by-flags")).await;
    refused(&server.api, json!({"tools": {"network": true}}), "network_over_ceiling").await;
    server.crash();

    let config = scratch.dir.path().join("keel.toml");
    std::fs::write(
        &config,
        "[server]\nmax_sandbox = \"full-access\"\nauto_approve = [\"*\"]\nallow_network = true\n",
    )
    .expect("write keel.toml");
    let config_arg = config.display().to_string();
    let server = ServeProcess::start(&scratch, &["--model", &model, "--config", &config_arg]);
    let mut body = wide_open("by-config");
    body["tools"]["network"] = json!(true);
    server.api.create(body).await;
    server.crash();

    std::fs::write(&config, "[server]\nmax_sandbx = \"full-access\"\n").expect("write keel.toml");
    let output = ServeProcess::command(&scratch, &["--model", &model, "--config", &config_arg])
        .output()
        .expect("run keel serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("unknown field `max_sandbx`"), "{stderr}");
}

#[tokio::test]
async fn script_models_from_clients_come_only_from_the_script_dir() {
    let server = server_with(|_, _| {}).await;
    let api = &server.api;
    let root = server.scratch.dir.path().to_path_buf();
    let dir = scripts(&server.scratch);
    std::fs::write(dir.join("inside.jsonl"), ANSWER).expect("write");
    std::fs::write(root.join("outside.jsonl"), ANSWER).expect("write");
    std::os::unix::fs::symlink(root.join("outside.jsonl"), dir.join("link.jsonl")).expect("symlink");

    for spec in [
        format!("script:{}", root.join("outside.jsonl").display()),
        "script:../outside.jsonl".to_owned(),
        format!("script:{}/../outside.jsonl", dir.display()),
        "script:link.jsonl".to_owned(),
        "script:/etc/passwd".to_owned(),
    ] {
        let reply = refused(api, json!({"model": spec}), "script_model_over_ceiling").await;
        assert!(message(&reply).contains("script_dir"), "{}", reply.body);
        assert!(!message(&reply).contains("root:"), "{}", reply.body);
    }
    // The operator's own default model is theirs, wherever it is.
    let default = api.create(json!({})).await;
    let default_spec = default["model"].as_str().unwrap_or_default().to_owned();
    assert!(default_spec.ends_with("default.jsonl"), "{default}");
    api.create(json!({"model": default_spec})).await;
    // Files in the directory are fine, named either way.
    api.create(json!({"model": "script:inside.jsonl"})).await;
    api.create(json!({"model": format!("script:{}", dir.join("inside.jsonl").display())}))
        .await;
    let reply = api
        .post("/v1/sessions", &json!({"model": "script:missing.jsonl"}))
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    assert_eq!(reply.code(), "model_not_found", "{}", reply.body);
    server.stop().await;

    // Without a script directory, clients name no script at all.
    let server = server_with(|config, _| config.keel.server.script_dir = None).await;
    let inside = scripts(&server.scratch).join("inside.jsonl");
    std::fs::write(&inside, ANSWER).expect("write");
    refused(
        &server.api,
        json!({"model": format!("script:{}", inside.display())}),
        "script_model_over_ceiling",
    )
    .await;
    server.api.create(json!({})).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_or_a_device_in_the_script_dir_is_refused_without_blocking_the_server() {
    let server = server_with(|_, _| {}).await;
    let api = server.api.clone();
    let dir = scripts(&server.scratch);
    let fifo = dir.join("pipe.jsonl");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.jsonl")).expect("symlink");

    // More requests than worker threads: a read that blocked a worker would
    // stall the server.
    let attempts: Vec<_> = (0..4)
        .map(|index| {
            let api = api.clone();
            let spec = if index % 2 == 0 {
                format!("script:{}", fifo.display())
            } else {
                "script:pipe.jsonl".to_owned()
            };
            tokio::spawn(async move { api.post("/v1/sessions", &json!({"model": spec})).await })
        })
        .collect();
    for attempt in attempts {
        let reply = guard("a FIFO script request", attempt).await.expect("request task");
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
        assert_eq!(reply.code(), "model_not_found", "{}", reply.body);
        assert!(message(&reply).contains("not a regular file"), "{}", reply.body);
    }
    assert_eq!(api.get("/v1/sessions").await.status, StatusCode::OK, "still answering");

    for spec in ["script:zero.jsonl", "script:/dev/zero"] {
        let reply = guard(
            "a /dev/zero script request",
            refused(&api, json!({"model": spec}), "script_model_over_ceiling"),
        )
        .await;
        assert!(message(&reply).contains("outside"), "{}", reply.body);
    }
    api.create(json!({})).await;
    server.stop().await;
}

#[tokio::test]
async fn a_malformed_script_is_reported_without_its_contents() {
    let server = server_with(|_, _| {}).await;
    let dir = scripts(&server.scratch);
    let secret = "sk-proj-NOTREALLY0123456789abcdef";
    std::fs::write(dir.join("secret.jsonl"), format!("{ANSWER}\n{{\"{secret}\": \"x\"}}\n")).expect("write");
    let reply = server
        .api
        .post("/v1/sessions", &json!({"model": "script:secret.jsonl"}))
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    assert_eq!(reply.code(), "model_not_found", "{}", reply.body);
    let text = message(&reply);
    assert!(text.contains("line 2"), "{text}");
    assert!(!text.contains(secret) && !text.contains("sk-proj"), "{text}");
    server.stop().await;
}

#[tokio::test]
async fn stored_sessions_beyond_a_lowered_ceiling_do_not_load() {
    let raised = |config: &mut keel::server::ServerConfig, _: &Scratch| {
        config.keel.server.max_sandbox = SandboxPolicy::FullAccess;
        config.keel.server.auto_approve = vec!["*".to_owned()];
    };
    let server = server_with(raised).await;
    std::fs::write(scripts(&server.scratch).join("inside.jsonl"), ANSWER).expect("write");
    server.api.create(wide_open("wide")).await;
    server
        .api
        .create(json!({"id": "scripted", "model": "script:inside.jsonl"}))
        .await;
    server
        .api
        .create(json!({"id": "narrow", "tools": {"shell": false}}))
        .await;
    let scratch = server.stop().await;

    // The same database, the default ceiling and no script directory.
    let server = TestServer::start_in(scratch, |config, scratch| {
        config.default_model = Some(scratch.script("default.jsonl", &[ANSWER]));
        config.keel.server.script_dir = None;
    })
    .await;
    let say = json!({"op": {"type": "user_input", "text": "hi"}});
    let reply = server.api.submit("wide", say.clone()).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert_eq!(reply.code(), "sandbox_over_ceiling");
    assert!(
        message(&reply).contains("session 'wide' is not loaded"),
        "{}",
        reply.body
    );
    let reply = server.api.submit("scripted", say.clone()).await;
    assert_eq!(reply.code(), "script_model_over_ceiling", "{}", reply.body);
    server.api.say("narrow", "hi").await;
    server.api.wait_idle("narrow").await;
    let scratch = server.stop().await;
    let events = scratch.stored("wide").await;
    assert!(
        !events.iter().any(|event| matches!(event.msg, EventMsg::TurnStarted(_))),
        "nothing ran"
    );
}

/// Writes a session the way `keel run` (or another application) does, with
/// `settings` in its context.
async fn store_session(scratch: &Scratch, id: &str, settings: Option<Value>) {
    let store: Arc<dyn CheckpointStore> = Arc::new(SqliteCheckpoint::new(scratch.db()).expect("open the store"));
    let path = scratch.dir.path().join("run.jsonl");
    std::fs::write(&path, ANSWER).expect("write");
    let model = Arc::new(ScriptedModel::load(&path).expect("script"));
    let mut config = AgentConfig::new(id, store, model);
    config.session_context = SessionContext {
        bot_id: "keel-run".to_owned(),
        settings,
        ..SessionContext::default()
    };
    shutdown(start_with(config).await).await;
}

#[tokio::test]
async fn stored_settings_that_do_not_parse_do_not_load_but_sessions_without_settings_do() {
    let scratch = Scratch::new();
    // Created with the shell off, then garbled: defaults would turn it on.
    store_session(
        &scratch,
        "garbled",
        Some(json!({"tools": {"shell": false, "colour": "blue"}})),
    )
    .await;
    store_session(&scratch, "from-run", None).await;
    let server = TestServer::start_in(scratch, |config, scratch| {
        config.default_model = Some(scratch.script("default.jsonl", &[ANSWER]));
    })
    .await;
    let reply = server
        .api
        .submit("garbled", json!({"op": {"type": "user_input", "text": "hi"}}))
        .await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", reply.body);
    assert!(
        message(&reply).contains("stored settings do not parse"),
        "{}",
        reply.body
    );
    server.api.say("from-run", "hi").await;
    server.api.wait_idle("from-run").await;
    let scratch = server.stop().await;
    assert!(
        !scratch
            .stored("garbled")
            .await
            .iter()
            .any(|event| matches!(event.msg, EventMsg::TurnStarted(_)))
    );
    assert!(
        scratch
            .stored("from-run")
            .await
            .iter()
            .any(|event| matches!(&event.msg, EventMsg::AssistantMessage(message) if message.text == "hi"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_error_echoing_the_key_is_stored_redacted() {
    let key = "sk-echo-test-0123456789abcdefghij";
    let body = json!({"error": {
        "message": format!("invalid model; you sent headers Authorization: Bearer {key}, content-type: application/json (key {key})"),
        "type": "invalid_request_error",
    }});
    let upstream = ScriptedServer::start(vec![Upstream::json(400, &body.to_string())]).await;
    let scratch = Scratch::new();
    let config = scratch.dir.path().join("keel.toml");
    std::fs::write(
        &config,
        format!(
            "[models.echo]\nprovider = \"openai\"\nmodel = \"gpt-test\"\nbase_url = \"{}/v1\"\napi_key_env = \
             \"KEEL_TEST_ECHO_KEY\"\nmax_retries = 0\n",
            upstream.url()
        ),
    )
    .expect("write keel.toml");
    let config_arg = config.display().to_string();
    let mut command = ServeProcess::command(&scratch, &["--config", &config_arg, "--model", "echo"]);
    command.env("KEEL_TEST_ECHO_KEY", key);
    let server = ServeProcess::spawn(command);
    server.api.create(json!({"id": "echo"})).await;
    server.api.say("echo", "hi").await;
    server.api.wait_idle("echo").await;

    let requests = upstream.requests();
    assert_eq!(
        requests.first().and_then(|request| request.header("authorization")),
        Some(format!("Bearer {key}").as_str()),
        "the key was sent"
    );
    let page = server.api.get("/v1/sessions/echo/events").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.body.to_string().contains(key), "{}", page.body);
    let (status, _) = server.terminate();
    assert!(status.success());
    let events = scratch.stored("echo").await;
    let errors: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::Error(error) => Some(error.message.as_str()),
            EventMsg::TurnAborted(aborted) => Some(aborted.message.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    for error in errors {
        assert!(error.contains("HTTP 400") && error.contains("[redacted]"), "{error}");
        assert!(!error.contains(key) && !error.contains("sk-echo"), "{error}");
    }
}
