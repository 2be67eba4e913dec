//! What a client names becomes stored data and metric labels: bot ids are
//! bounded like session ids, and the label sets of `/metrics` stay bounded
//! however many distinct bots clients invent.

use reqwest::StatusCode;
use serde_json::json;

use crate::suite::support::server::TestServer;

/// Every turn of the script reports usage, so each bot is counted.
const STEP: &str = r#"{"text": "Hi.", "usage": {"input_tokens": 7, "output_tokens": 3}}"#;

/// The finding: 40 sessions with distinct 1.8 MB `bot_id`s took the server
/// to 494 MiB and `/metrics` to 281 MiB. Such ids are refused, wherever a
/// bot id enters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_long_or_unprintable_bot_id_is_refused_everywhere() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[STEP]);
    for n in 0..40 {
        let huge = format!("{n}{}", "b".repeat(1_800_000));
        let reply = server
            .api
            .post(
                "/v1/sessions",
                &json!({"id": format!("huge-{n}"), "model": model, "bot_id": huge}),
            )
            .await;
        assert_eq!(
            (reply.status, reply.code()),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{}",
            reply.body
        );
    }
    for bad in ["b".repeat(129), String::new(), "bot\nid".to_owned()] {
        let reply = server
            .api
            .post("/v1/sessions", &json!({"id": "bad", "model": model, "bot_id": bad}))
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad:?}: {}", reply.body);
    }
    let long = "b".repeat(1000);
    for path in [
        format!("/v1/sessions?bot_id={long}"),
        format!("/v1/usage?bot_id={long}"),
    ] {
        let reply = server.api.get(&path).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{path}: {}", reply.body);
    }
    let listed = server.api.get("/v1/sessions").await;
    assert_eq!(listed.body["sessions"], json!([]), "nothing was stored");
    // The longest id allowed is taken.
    let longest = "b".repeat(keel::agent::MAX_BOT_ID_BYTES);
    server
        .api
        .create(json!({"id": "longest", "model": model, "bot_id": longest}))
        .await;
    server.stop().await;
}

/// Valid bots beyond the metrics' budget are counted under `other`: the
/// series of `keel_model_tokens_total` stay bounded, and so does the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_bots_beyond_the_budget_share_one_label() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[STEP]);
    let bots = 40;
    for n in 0..bots {
        let id = format!("s{n}");
        let bot = format!("{n:03}-{}", "b".repeat(120));
        server
            .api
            .create(json!({"id": id, "model": model, "bot_id": bot}))
            .await;
        server.api.say(&id, "Hello").await;
        server.api.wait_idle(&id).await;
    }
    let metrics = server.api.metrics().await;
    let token_series: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("keel_model_tokens_total{"))
        .collect();
    let labelled_bots: std::collections::HashSet<&str> = token_series
        .iter()
        .filter_map(|line| line.split("bot=\"").nth(1)?.split('"').next())
        .collect();
    assert!(labelled_bots.contains("other"), "{labelled_bots:?}");
    assert!(
        labelled_bots.len() <= 33,
        "{} bots have a label of their own",
        labelled_bots.len()
    );
    assert!(metrics.len() < 64 * 1024, "/metrics is {} bytes", metrics.len());
    // Every token is still counted: under its bot or under `other`.
    let output: u64 = token_series
        .iter()
        .filter(|line| line.contains("kind=\"output\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(output, 3 * bots);
    server.stop().await;
}
