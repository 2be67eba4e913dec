//! The description cannot drift: the committed file is the generated one,
//! the server serves the same, and its promises about headers hold.

use reqwest::StatusCode;
use serde_json::json;

use super::{committed, document};
use crate::suite::support::server::TestServer;

#[test]
fn the_committed_description_is_the_one_the_code_makes() {
    let committed = std::fs::read_to_string(committed()).expect("docs/openapi.json");
    // Compared parsed first, for a readable failure, then byte for byte.
    let parsed: serde_json::Value = serde_json::from_str(&committed).expect("docs/openapi.json is JSON");
    let stale = "docs/openapi.json is stale: regenerate it with `cargo run -- openapi > docs/openapi.json`";
    assert_eq!(parsed, document(), "{stale}");
    assert_eq!(committed, keel::server::openapi_json(), "{stale}");
}

#[test]
fn every_route_is_described_with_its_errors_and_the_version() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], keel::server::API_VERSION);
    let paths: Vec<&str> = doc["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .map(String::as_str)
        .collect();
    for path in [
        "/v1/sessions",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}/fork",
        "/v1/sessions/{id}/submissions",
        "/v1/sessions/{id}/events",
        "/v1/sessions/{id}/events/stream",
        "/v1/sessions/{id}/ws",
        "/v1/usage",
        "/v1/models",
        "/v1/openapi.json",
        "/healthz",
        "/readyz",
        "/metrics",
    ] {
        assert!(paths.contains(&path), "{path} is not described: {paths:?}");
    }
    // Each error response names exactly its codes.
    let submit = &doc["paths"]["/v1/sessions/{id}/submissions"]["post"];
    let codes = &submit["responses"]["409"]["content"]["application/json"]["schema"]["properties"]["error"]["allOf"][1]
        ["properties"]["code"]["enum"];
    for code in ["queue_full", "session_busy", "idempotency_key_reused"] {
        assert!(
            codes.as_array().expect("codes").contains(&json!(code)),
            "{code}: {codes}"
        );
    }
    assert_eq!(submit["parameters"][1]["name"], "Idempotency-Key");
    let created = &doc["paths"]["/v1/sessions"]["post"]["responses"]["201"];
    assert!(created["headers"]["Location"].is_object(), "{created}");
    for link in ["submit", "events", "fork", "delete"] {
        assert_eq!(
            created["links"][link]["parameters"]["id"], "$response.body#/id",
            "{link}"
        );
    }
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["scheme"], "bearer");
    assert_eq!(schemes["query_token"]["in"], "query");
    // Every event type is a schema of its own.
    let variants = doc["components"]["schemas"]["EventMsg"]["oneOf"]
        .as_array()
        .expect("EventMsg variants")
        .len();
    assert_eq!(variants, 27, "one schema per EventMsg variant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_serves_the_description_without_a_token_and_names_its_version_on_every_answer() {
    let mut server = TestServer::start(|config, _| config.token = Some("contract-token".to_owned())).await;
    let api = &server.api;
    let served = api.get("/v1/openapi.json").await;
    assert_eq!(served.status, StatusCode::OK);
    assert_eq!(served.body, document());

    // Errors too: a client reads the version before it reads a body.
    for path in ["/v1/openapi.json", "/v1/sessions", "/healthz", "/no/such/route"] {
        let response = api.client.get(api.url(path)).send().await.expect("answer");
        assert_eq!(
            response
                .headers()
                .get("keel-api-version")
                .and_then(|value| value.to_str().ok()),
            Some(keel::server::API_VERSION),
            "{path} answered {}",
            response.status()
        );
    }
    server.api.token = Some("contract-token".to_owned());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_or_forked_session_is_found_at_its_location() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    let api = &server.api;
    for id in ["plain", "with space/and slash"] {
        let request = api
            .client
            .post(api.url("/v1/sessions"))
            .json(&json!({"id": id, "model": model}));
        let response = request.send().await.expect("create");
        assert_eq!(response.status(), StatusCode::CREATED);
        let location = response.headers()["location"].to_str().expect("ASCII").to_owned();
        let shown = api.get(&location).await;
        assert_eq!(shown.status, StatusCode::OK, "{location}");
        assert_eq!(shown.body["id"], id, "{location}");
    }
    let fork = api
        .client
        .post(api.url("/v1/sessions/plain/fork"))
        .json(&json!({"at_sequence": 1, "id": "plain-fork"}))
        .send()
        .await
        .expect("fork");
    assert_eq!(fork.status(), StatusCode::CREATED);
    assert_eq!(fork.headers()["location"], "/v1/sessions/plain-fork");
    server.stop().await;
}
