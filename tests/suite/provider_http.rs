//! The provider transport shared by every adapter, over real HTTP: bounded
//! bodies and events, timeouts, refused connections, retries.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use keel::Error;
use keel::provider::ProviderError;
use keel::provider::http::{AttemptError, HttpClient, HttpSettings, RetryPolicy, with_retries};

use super::http_server::{Part, Reply, ScriptedServer};
use super::support::guard;

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
    let db = super::support::TestDb::new();
    let store: Arc<dyn keel::CheckpointStore> = db.open();
    let mut config = AgentConfig::new("s", store, model);
    config.streaming = keel::agent::StreamingOptions::per_delta();
    let mut agent = super::support::start_with(config).await;
    agent.sender().submit(super::support::user("hi")).expect("submit");
    super::support::read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    assert_eq!(server.abandoned(), 0);
    drop(agent);
    guard("the request is cancelled", server.wait_abandoned(1)).await;
}
