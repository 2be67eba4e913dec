//! The provider transport shared by every adapter, over real HTTP: bounded
//! bodies and events, timeouts, refused connections, retries.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use keel::Error;
use keel::provider::ProviderError;
use keel::provider::http::{AttemptError, HttpClient, HttpSettings, RetryPolicy, with_retries};

use crate::suite::support::http_server::{Part, Reply, ScriptedServer};
use crate::suite::support::wait::guard;

fn quick_settings() -> HttpSettings {
    HttpSettings {
        idle_timeout: Duration::from_millis(300),
        response_timeout: Duration::from_millis(500),
        retry: RetryPolicy {
            max_retries: 2,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            max_retry_after: Duration::from_secs(2),
        },
        ..HttpSettings::default()
    }
}

async fn read_all(client: &HttpClient, url: &str) -> Result<Vec<String>, ProviderError> {
    let mut stream = client
        .post_events(url, &[], &serde_json::json!({"stream": true}))
        .await?;
    let mut data = Vec::new();
    while let Some(event) = stream.next().await? {
        data.push(event.data);
    }
    Ok(data)
}

#[tokio::test]
async fn a_body_past_its_bound_is_an_error_not_memory() {
    let chunk = format!("data: {}\n\n", "x".repeat(1000));
    let server = ScriptedServer::start(vec![Reply::sse(vec![Part::Bytes(chunk.repeat(20).into_bytes())])]).await;
    let client = HttpClient::new(
        "test",
        HttpSettings {
            max_response_bytes: 8 * 1024,
            ..quick_settings()
        },
    )
    .expect("client");
    let error = guard("read", read_all(&client, &server.url()))
        .await
        .expect_err("too large");
    assert_eq!(
        error,
        ProviderError::TooLarge {
            provider: "test".into(),
            limit: 8 * 1024
        }
    );
}

#[tokio::test]
async fn an_event_past_its_bound_is_malformed() {
    let event = format!("data: {}\n\n", "y".repeat(5000));
    let server = ScriptedServer::start(vec![Reply::sse(vec![Part::Bytes(event.into_bytes())])]).await;
    let client = HttpClient::new(
        "test",
        HttpSettings {
            max_event_bytes: 1024,
            ..quick_settings()
        },
    )
    .expect("client");
    let error = guard("read", read_all(&client, &server.url()))
        .await
        .expect_err("event too large");
    assert!(
        matches!(&error, ProviderError::Malformed { message, .. } if message.contains("1024")),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_and_a_silent_stream_stalls() {
    // Accepts connections and never sends a byte.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let client = HttpClient::new("test", quick_settings()).expect("client");
    let error = guard("read", read_all(&client, &format!("http://{address}")))
        .await
        .expect_err("no answer");
    assert!(matches!(error, ProviderError::Stalled { .. }), "{error:?}");

    let server = ScriptedServer::start(vec![Reply::sse(vec![
        Part::Bytes(b"data: one\n\n".to_vec()),
        Part::Stall,
    ])])
    .await;
    let error = guard("read", read_all(&client, &server.url()))
        .await
        .expect_err("stall");
    assert!(error.to_string().contains("stalled"), "{error}");
}

#[tokio::test]
async fn a_refused_connection_is_retried_then_reported() {
    // A port nobody listens on.
    let address = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address")
    };
    let client = HttpClient::new("test", quick_settings()).expect("client");
    let attempts = Arc::new(AtomicU32::new(0));
    let result: Result<Vec<String>, Error> = with_retries(&client.settings().retry, |_| {
        let (client, attempts) = (&client, Arc::clone(&attempts));
        async move {
            attempts.fetch_add(1, Ordering::SeqCst);
            read_all(client, &format!("http://{address}"))
                .await
                .map_err(|error| AttemptError::Provider { error, streamed: false })
        }
    })
    .await;
    let error = result.expect_err("nobody listens");
    assert_eq!(attempts.load(Ordering::SeqCst), 3, "the first try and two retries");
    assert!(error.to_string().starts_with("test: connection failed"), "{error}");
}

#[tokio::test]
async fn nothing_is_retried_once_output_was_streamed_or_when_the_wait_asked_is_too_long() {
    let client = HttpClient::new("test", quick_settings()).expect("client");
    let attempts = AtomicU32::new(0);
    let streamed: Result<(), Error> = with_retries(&client.settings().retry, |_| {
        attempts.fetch_add(1, Ordering::SeqCst);
        async {
            Err(AttemptError::Provider {
                error: ProviderError::Connection {
                    provider: "test".into(),
                    message: "reset".into(),
                },
                streamed: true,
            })
        }
    })
    .await;
    assert!(streamed.is_err());
    assert_eq!(attempts.load(Ordering::SeqCst), 1);

    let server = ScriptedServer::start(vec![
        Reply::json(429, r#"{"error": {"message": "slow down", "type": "rate_limit"}}"#).header("retry-after", "3600"),
    ])
    .await;
    let error = guard("read", read_all(&client, &server.url()))
        .await
        .expect_err("rate limited");
    assert_eq!(error.retry_after(), Some(Duration::from_secs(3600)));
    let attempts = AtomicU32::new(0);
    let waited: Result<(), Error> = with_retries(&client.settings().retry, |_| {
        attempts.fetch_add(1, Ordering::SeqCst);
        let error = error.clone();
        async move { Err(AttemptError::Provider { error, streamed: false }) }
    })
    .await;
    assert_eq!(attempts.load(Ordering::SeqCst), 1, "an hour's wait is not waited for");
    assert_eq!(
        waited.expect_err("rate limited").to_string(),
        "test: HTTP 429: rate_limit: slow down"
    );
}

#[tokio::test]
async fn dropping_the_agent_cancels_its_model_request_at_once() {
    use keel::agent::AgentConfig;
    use keel::provider::ProviderSettings;
    use keel::provider::openai_chat::OpenAiChat;

    let first =
        "data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"Hello\"}, \"finish_reason\": null}]}\n\n";
    let server = ScriptedServer::start(vec![Reply::sse(vec![
        Part::Bytes(first.as_bytes().to_vec()),
        Part::Stall,
    ])])
    .await;
    let mut settings = ProviderSettings::new("openai", "gpt-4.1-mini", format!("{}/v1", server.url()));
    settings.http = quick_settings();
    settings.http.idle_timeout = Duration::from_secs(60);
    let model = Arc::new(OpenAiChat::new(settings).expect("model"));
    let db = crate::suite::support::store::TestDb::new();
    let store: Arc<dyn keel::CheckpointStore> = db.open();
    let mut config = AgentConfig::new("s", store, model);
    config.streaming = keel::agent::StreamingOptions::per_delta();
    let mut agent = crate::suite::support::agent::start_with(config).await;
    agent
        .sender()
        .submit(crate::suite::support::agent::user("hi"))
        .expect("submit");
    crate::suite::support::agent::read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    assert_eq!(server.abandoned(), 0);
    drop(agent);
    guard("the request is cancelled", server.wait_abandoned(1)).await;
}

// Answers that are not what a streamed request expects, and deadlines.

/// The three adapters on `server`, with quick retries and `http` settings.
fn adapters(server: &ScriptedServer, http: &HttpSettings) -> Vec<(&'static str, Arc<dyn keel::Model>)> {
    use keel::provider::ProviderSettings;
    use keel::provider::anthropic::Anthropic;
    use keel::provider::openai_chat::OpenAiChat;
    use keel::provider::openai_responses::OpenAiResponses;

    let settings = |name: &str, base: String| {
        let mut settings = ProviderSettings::new(name, "m", base);
        settings.http = http.clone();
        settings
    };
    vec![
        (
            "chat",
            Arc::new(OpenAiChat::new(settings("chat", format!("{}/v1", server.url()))).expect("chat")),
        ),
        (
            "responses",
            Arc::new(OpenAiResponses::new(settings("responses", format!("{}/v1", server.url()))).expect("responses")),
        ),
        (
            "anthropic",
            Arc::new(Anthropic::new(settings("anthropic", server.url())).expect("anthropic")),
        ),
    ]
}

async fn ask(model: &dyn keel::Model) -> (keel::Result<keel::agent::ModelOutput>, Vec<keel::agent::ModelEvent>) {
    let history = [crate::suite::support::model::user_item("What time is it?")];
    let request = keel::agent::ModelRequest::new("s", "t", &history, 0);
    crate::suite::support::provider::call_model(model, request).await
}

#[tokio::test]
async fn a_complete_json_answer_to_a_streamed_request_is_read_as_the_answer() {
    // The non-streamed bodies each API documents, as LiteLLM sends them to
    // a streamed request.
    let chat = r#"{"id": "chatcmpl-1", "object": "chat.completion", "created": 1767225600, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "It is noon.",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}]},
            "logprobs": null, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}"#;
    let responses = r#"{"id": "resp_1", "object": "response", "status": "completed", "model": "m",
        "output": [
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "It is noon.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "call_1", "name": "clock", "arguments": "{}"}
        ],
        "usage": {"input_tokens": 9, "output_tokens": 4, "total_tokens": 13}}"#;
    let anthropic = r#"{"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "It is noon."},
                    {"type": "tool_use", "id": "call_1", "name": "clock", "input": {}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 9, "output_tokens": 4}}"#;
    let server = ScriptedServer::start(vec![
        Reply::json(200, chat),
        Reply::json(200, responses),
        Reply::json(200, anthropic),
    ])
    .await;
    for (name, model) in adapters(&server, &quick_settings()) {
        let (result, events) = ask(&*model).await;
        let output = result.unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(output.text, "It is noon.", "{name}");
        assert_eq!(
            crate::suite::support::provider::text_deltas(&events),
            ["It is noon."],
            "{name}"
        );
        let calls: Vec<(&str, &str, &str)> = output
            .tool_calls
            .iter()
            .map(|call| (call.call_id.as_str(), call.name.as_str(), call.arguments.as_str()))
            .collect();
        assert_eq!(calls, [("call_1", "clock", "{}")], "{name}");
        let usage = output.usage.unwrap_or_else(|| panic!("{name}: usage"));
        assert_eq!((usage.input_tokens, usage.output_tokens), (9, 4), "{name}");
    }
    assert_eq!(server.requests().len(), 3, "nothing retried");
}

#[tokio::test]
async fn an_html_answer_is_not_an_event_stream_and_is_not_retried() {
    let page = "<html><body>Please sign in to the proxy</body></html>";
    let server = ScriptedServer::start(vec![
        Reply::typed(200, "text/html; charset=utf-8", page),
        Reply::typed(200, "text/html; charset=utf-8", page),
        Reply::typed(200, "text/html; charset=utf-8", page),
    ])
    .await;
    for (index, (name, model)) in adapters(&server, &quick_settings()).into_iter().enumerate() {
        let (result, events) = ask(&*model).await;
        let error = match result {
            Err(Error::Provider(error)) => error,
            other => panic!("{name}: expected a provider error, got {other:?}"),
        };
        assert_eq!(
            error,
            ProviderError::NotEventStream {
                provider: name.to_owned(),
                content_type: "text/html; charset=utf-8".to_owned(),
            }
        );
        assert!(error.to_string().contains("not an event stream"), "{error}");
        assert!(events.is_empty());
        assert_eq!(server.requests().len(), index + 1, "{name}: not retried");
    }
}

#[tokio::test]
async fn a_stream_of_keep_alives_alone_ends_at_the_step_deadline() {
    // A keep-alive every 50 ms, for ever: the idle timeout never fires.
    let mut parts = Vec::new();
    for _ in 0..400 {
        parts.push(Part::Bytes(b": keep-alive\n\n".to_vec()));
        parts.push(Part::Pause(Duration::from_millis(50)));
    }
    let server = ScriptedServer::start(vec![Reply::sse(parts)]).await;
    let http = HttpSettings {
        step_timeout: Duration::from_millis(800),
        ..quick_settings()
    };
    let (_, model) = adapters(&server, &http).remove(0);
    let started = std::time::Instant::now();
    let (result, _) = ask(&*model).await;
    let elapsed = started.elapsed();
    match result {
        Err(Error::Provider(ProviderError::Deadline { provider, after })) => {
            assert_eq!((provider.as_str(), after), ("chat", Duration::from_millis(800)));
        }
        other => panic!("expected the step deadline, got {other:?}"),
    }
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}

#[tokio::test]
async fn a_server_that_accepts_and_never_answers_is_bounded_and_the_error_counts_the_attempts() {
    // Accepts connections and never sends a byte, like a wedged llama-server.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let model = |http: HttpSettings| {
        let mut settings = keel::provider::ProviderSettings::new("local", "m", format!("http://{address}/v1"));
        settings.http = http;
        keel::provider::openai_chat::OpenAiChat::new(settings).expect("model")
    };

    // The header wait is configurable, and the final error counts the tries.
    let started = std::time::Instant::now();
    let (result, _) = ask(&model(HttpSettings {
        response_timeout: Duration::from_millis(200),
        ..quick_settings()
    }))
    .await;
    let error = result.expect_err("no answer");
    assert_eq!(
        error.to_string(),
        "local: the stream stalled: no data for 0.2 s (gave up after 3 attempts)"
    );
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());

    // The step deadline bounds the whole series, whatever the header wait.
    let started = std::time::Instant::now();
    let (result, _) = ask(&model(HttpSettings {
        response_timeout: Duration::from_secs(120),
        step_timeout: Duration::from_millis(600),
        ..quick_settings()
    }))
    .await;
    assert!(
        matches!(result, Err(Error::Provider(ProviderError::Deadline { .. }))),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}
