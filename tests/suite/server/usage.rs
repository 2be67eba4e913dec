//! `GET /v1/usage` and the token counters of `/metrics`.

use reqwest::StatusCode;
use serde_json::json;

use crate::suite::support::server::TestServer;
use crate::suite::support::wait::next_millisecond;

/// Every turn of the script reports the same usage.
const STEP: &str = r#"{"text": "Hi.", "usage": {"input_tokens": 7, "cached_input_tokens": 5, "output_tokens": 3}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_summed_per_session_and_per_bot_with_cached_input_over_the_api_and_in_metrics() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[STEP, STEP]);
    for (id, bot) in [("a1", "alpha"), ("a2", "alpha"), ("b1", "beta")] {
        server
            .api
            .create(json!({"id": id, "model": model, "bot_id": bot}))
            .await;
        server.api.say(id, "Hello").await;
        server.api.wait_idle(id).await;
    }

    let all = server.api.get("/v1/usage").await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.body);
    let step = json!({"input_tokens": 7, "cached_input_tokens": 5, "output_tokens": 3, "reasoning_tokens": 0});
    let twice = json!({"input_tokens": 14, "cached_input_tokens": 10, "output_tokens": 6, "reasoning_tokens": 0});
    assert_eq!(
        all.body["total"],
        json!({"input_tokens": 21, "cached_input_tokens": 15, "output_tokens": 9, "reasoning_tokens": 0})
    );
    assert_eq!(
        all.body["bots"],
        json!([
            {"bot_id": "alpha", "sessions": 2, "usage": twice},
            {"bot_id": "beta", "sessions": 1, "usage": step},
        ])
    );
    let mut sessions: Vec<(String, String)> = all.body["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|line| {
            assert_eq!(line["usage"], step, "{line}");
            (
                line["id"].as_str().expect("id").to_owned(),
                line["bot_id"].as_str().expect("bot").to_owned(),
            )
        })
        .collect();
    sessions.sort();
    assert_eq!(
        sessions,
        [("a1", "alpha"), ("a2", "alpha"), ("b1", "beta")].map(|(id, bot)| (id.to_owned(), bot.to_owned()))
    );

    let alpha = server.api.get("/v1/usage?bot_id=alpha").await;
    assert_eq!(alpha.body["total"], twice);
    assert_eq!(alpha.body["bots"].as_array().map(Vec::len), Some(1));
    assert_eq!(alpha.body["sessions"].as_array().map(Vec::len), Some(2));

    // A window opened now holds nothing until the next turn, then only it.
    next_millisecond();
    let since = keel::protocol::now_ms();
    let empty = server.api.get(&format!("/v1/usage?since={since}")).await;
    assert_eq!(empty.status, StatusCode::OK, "{}", empty.body);
    assert_eq!(empty.body["sessions"], json!([]));
    assert_eq!(empty.body["total"]["input_tokens"], 0);
    server.api.say("a1", "Again").await;
    server.api.wait_idle("a1").await;
    let recent = server.api.get(&format!("/v1/usage?since={since}&bot_id=alpha")).await;
    assert_eq!(recent.body["total"], step);
    assert_eq!(
        recent.body["sessions"],
        json!([{"id": "a1", "bot_id": "alpha", "usage": step}])
    );
    let shown = server.api.session("a1").await;
    assert_eq!(shown["usage"], twice, "the session's own total counts both turns");

    let bad = server.api.get("/v1/usage?since=yesterday").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);

    let metrics = server.api.metrics().await;
    for (bot, kind, value) in [
        ("alpha", "input", 21),
        ("alpha", "cached_input", 15),
        ("alpha", "output", 9),
        ("beta", "cached_input", 5),
    ] {
        let found = metrics.lines().any(|line| {
            line.starts_with("keel_model_tokens_total{")
                && line.contains(&format!("bot=\"{bot}\""))
                && line.contains(&format!("kind=\"{kind}\""))
                && line.ends_with(&format!(" {value}"))
        });
        assert!(found, "no {bot} {kind} {value} in\n{metrics}");
    }
    server.stop().await;
}
