//! The bearer token: required off loopback, checked on every API request.

use std::sync::Arc;

use keel::server::{ServeError, ServerConfig, serve};
use keel::store::{CheckpointStore, SqliteCheckpoint};
use reqwest::StatusCode;
use serde_json::json;

use crate::suite::support::http_server::{Reply as HttpReply, ScriptedServer};
use crate::suite::support::server::{Scratch, ServeProcess, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_refuses_to_listen_off_loopback_without_a_token() {
    let scratch = Scratch::new();
    let store: Arc<dyn CheckpointStore> = Arc::new(SqliteCheckpoint::new(scratch.db()).expect("store"));
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.expect("bind");
    let refused = serve(listener, ServerConfig::new(store), std::future::pending()).await;
    assert!(matches!(refused, Err(ServeError::TokenRequired(_))), "{refused:?}");

    // The binary says so in one line and exits non-zero.
    let output = ServeProcess::command(&scratch, &["--listen", "0.0.0.0:0"])
        .output()
        .expect("run keel serve");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("error: refusing to listen on 0.0.0.0:"),
        "{stderr}"
    );
    assert!(lines[0].contains("--token-file"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_every_api_request_needs_it() {
    let mut server = TestServer::start(|config, _| config.token = Some("s3cret-token".to_owned())).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    let api = server.api.clone();

    let missing = api.get("/v1/sessions").await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_eq!(missing.code(), "unauthorized");
    let wrong = api
        .send(api.client.get(api.url("/v1/sessions")).bearer_auth("s3cret-tokeN"))
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(!wrong.body.to_string().contains("s3cret"), "the token is never echoed");
    let create_without = api.post("/v1/sessions", &json!({"id": "s", "model": model})).await;
    assert_eq!(create_without.status, StatusCode::UNAUTHORIZED);
    let metrics = api.get("/metrics").await;
    assert_eq!(metrics.status, StatusCode::UNAUTHORIZED);
    // Not in the query either, except where browsers need it.
    let query = api.get("/v1/sessions?access_token=s3cret-token").await;
    assert_eq!(query.status, StatusCode::UNAUTHORIZED);

    // Health, readiness and the UI need no token.
    for path in ["/healthz", "/readyz", "/", "/assets/app.js", "/assets/app.css"] {
        let response = api.client.get(api.url(path)).send().await.expect("request");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }

    server.api.token = Some("s3cret-token".to_owned());
    server.api.create(json!({"id": "s", "model": model})).await;
    assert_eq!(server.api.get("/v1/sessions").await.status, StatusCode::OK);
    server.api.metrics().await;
    // The event stream and the WebSocket take `?access_token=`.
    let stream = api
        .client
        .get(api.url("/v1/sessions/s/events/stream?access_token=s3cret-token"))
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), StatusCode::OK);
    drop(stream);
    let wrong_stream = api
        .client
        .get(api.url("/v1/sessions/s/events/stream?access_token=nope"))
        .send()
        .await
        .expect("stream");
    assert_eq!(wrong_stream.status(), StatusCode::UNAUTHORIZED);
    let ws_url = format!(
        "{}/v1/sessions/s/ws?access_token=s3cret-token",
        api.base.replacen("http", "ws", 1)
    );
    let (socket, _) = tokio_tungstenite::connect_async(ws_url)
        .await
        .expect("WebSocket with a query token");
    drop(socket);
    let ws_wrong = format!("{}/v1/sessions/s/ws", api.base.replacen("http", "ws", 1));
    assert!(tokio_tungstenite::connect_async(ws_wrong).await.is_err());
    server.stop().await;
}

#[test]
fn the_binary_listens_off_loopback_with_a_token_file() {
    let scratch = Scratch::new();
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, "file-token\n").expect("write the token");
    let process = ServeProcess::start(
        &scratch,
        &[
            "--listen",
            "0.0.0.0:0",
            "--token-file",
            token_file.to_str().expect("path"),
        ],
    );
    // Reach it over loopback.
    let base = process.api.base.replace("0.0.0.0", "127.0.0.1");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = reqwest::Client::new();
        let without = client.get(format!("{base}/v1/sessions")).send().await.expect("request");
        assert_eq!(without.status(), StatusCode::UNAUTHORIZED);
        let with = client
            .get(format!("{base}/v1/sessions"))
            .bearer_auth("file-token")
            .send()
            .await
            .expect("request");
        assert_eq!(with.status(), StatusCode::OK);
    });
    let (status, stderr) = process.terminate();
    assert!(status.success(), "{stderr:?}");
    assert!(!stderr.join("\n").contains("file-token"), "the token is never logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neither_the_provider_key_nor_the_token_appears_in_responses_events_metrics_or_logs() {
    const KEY: &str = "sk-test-7f3a9c0e2b5d41e8a6c9f0d2b4e6a8c1";
    const TOKEN: &str = "server-token-5b0e9d7c3a1f4e6b8d2c";
    // The provider refuses the request, so the key's path ends in an error
    // that is recorded, answered and logged: everywhere it could leak.
    let provider = ScriptedServer::start(vec![HttpReply::json(
        401,
        r#"{"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error", "code": "invalid_api_key"}}"#,
    )])
    .await;
    let scratch = Scratch::new();
    let token_file = scratch.dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
    let token_file = token_file.to_str().expect("utf-8 path").to_owned();
    let mut command = ServeProcess::command(&scratch, &["--token-file", &token_file]);
    command
        .env("OPENAI_API_KEY", KEY)
        .env("OPENAI_BASE_URL", provider.url() + "/v1")
        .env("KEEL_LOG", "trace");
    let mut server = ServeProcess::spawn(command);
    server.api.token = Some(TOKEN.to_owned());
    let api = &server.api;

    let created = api.create(json!({"id": "keyed", "model": "openai:gpt-4.1-mini"})).await;
    api.say("keyed", "Hello").await;
    let mut stream = api.stream("keyed", crate::suite::support::api::Resume::Start).await;
    let events = stream.until(crate::suite::support::events::ends_turn).await;
    assert_eq!(
        events.last().map(|event| event.msg.kind()),
        Some("turn_aborted"),
        "the refused request ends the turn"
    );
    let requests = provider.requests();
    assert_eq!(
        requests.first().and_then(|request| request.header("authorization")),
        Some(format!("Bearer {KEY}").as_str()),
        "the key was sent to the provider, so the checks below can fail"
    );

    // A browser's stream carries the token in its query.
    let in_query = api
        .client
        .get(api.url(&format!(
            "/v1/sessions/keyed/events/stream?after=0&access_token={TOKEN}"
        )))
        .send()
        .await
        .expect("a stream with the token in its query");
    assert_eq!(in_query.status(), reqwest::StatusCode::OK);
    drop(in_query);

    let mut seen = vec![created.to_string(), serde_json::to_string(&events).expect("events")];
    for path in ["/v1/sessions/keyed", "/v1/sessions", "/v1/sessions/keyed/events"] {
        seen.push(api.get(path).await.body.to_string());
    }
    seen.push(api.metrics().await);
    let (status, logs) = server.terminate();
    assert!(status.success(), "{status:?}");
    assert!(logs.len() > 2, "the server logged at trace level: {logs:?}");
    assert!(
        !logs.iter().any(|line| line.contains('\u{1b}')),
        "logs to a pipe are plain text: {logs:?}"
    );
    seen.extend(logs);
    let stored = serde_json::to_string(&scratch.stored("keyed").await).expect("stored");
    seen.push(stored);
    for text in &seen {
        assert!(
            !text.contains(KEY) && !text.contains(&KEY[8..]),
            "the key leaked: {text}"
        );
        assert!(!text.contains(TOKEN), "the token leaked: {text}");
    }
}
