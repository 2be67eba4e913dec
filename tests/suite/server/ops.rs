//! `/healthz`, `/readyz`, `/metrics` and the web UI.

use reqwest::StatusCode;
use serde_json::json;

use crate::suite::support::api::{Resume, metric_value};
use crate::suite::support::events::ends_turn;
use crate::suite::support::server::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_say_what_happened() {
    let server = TestServer::start(|_, _| {}).await;
    let api = &server.api;
    let health = api.client.get(api.url("/healthz")).send().await.expect("healthz");
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(health.text().await.expect("body"), "ok");
    let ready = api.client.get(api.url("/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), StatusCode::OK);
    assert_eq!(ready.text().await.expect("body"), "ready");

    let model = server
        .scratch
        .script("s.jsonl", &[r#"{"chunks": ["a", "b"]}"#, r#"{"error": "boom"}"#]);
    api.create(json!({"id": "m", "model": model})).await;
    let mut stream = api.stream("m", Resume::Start).await;
    api.say("m", "one").await;
    stream.until(ends_turn).await;
    api.say("m", "two").await;
    stream.until(ends_turn).await;

    let metrics = api.metrics().await;
    for expected in [
        "keel_live_sessions 1",
        "keel_sse_subscribers 1",
        "keel_queued_submissions 0",
        "keel_model_request_seconds_count{provider=\"script\"} 2",
        "keel_model_errors_total{provider=\"script\"} 1",
        "keel_http_requests_total{route=\"/v1/sessions\",status=\"201\"} 1",
        "keel_http_requests_total{route=\"/v1/sessions/{id}/submissions\",status=\"202\"} 2",
        "keel_store_commit_seconds_bucket{le=",
        "# TYPE keel_store_commit_seconds histogram",
        "# TYPE keel_events_recorded counter",
    ] {
        assert!(metrics.contains(expected), "no {expected:?} in\n{metrics}");
    }
    let recorded = metric_value(&metrics, "keel_events_recorded_total");
    assert!(recorded >= 10.0, "{metrics}");
    assert!(
        !metrics.contains("/v1/sessions/m"),
        "routes are labelled by pattern, never by id"
    );

    let page = api.client.get(api.url("/")).send().await.expect("UI");
    assert_eq!(page.status(), StatusCode::OK);
    assert!(
        page.headers()["content-type"]
            .to_str()
            .expect("type")
            .starts_with("text/html")
    );
    assert!(page.text().await.expect("body").contains("Keel"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_unless_an_origin_is_given() {
    let closed = TestServer::start(|_, _| {}).await;
    let response = closed
        .api
        .client
        .get(closed.api.url("/v1/sessions"))
        .header("origin", "https://app.example")
        .send()
        .await
        .expect("request");
    // Not only no CORS: a request from an origin not configured is refused.
    assert_eq!(response.status(), reqwest::StatusCode::FORBIDDEN);
    assert!(response.headers().get("access-control-allow-origin").is_none());
    closed.stop().await;

    let open = TestServer::start(|config, _| config.cors_origin = Some("https://app.example".to_owned())).await;
    let preflight = open
        .api
        .client
        .request(reqwest::Method::OPTIONS, open.api.url("/v1/sessions"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization, content-type")
        .send()
        .await
        .expect("preflight");
    assert_eq!(
        preflight
            .headers()
            .get("access-control-allow-origin")
            .map(|value| value.as_bytes()),
        Some(&b"https://app.example"[..])
    );
    open.stop().await;
}
