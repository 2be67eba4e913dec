//! Client tools on several nodes: a call waiting when its node dies is
//! answered through another node, which loads the session; a deadline
//! passing after the owner died is acted on by a surviving node.

use std::time::Duration;

use keel::protocol::RecordedEvent;
use keel::store::postgres::local::LocalPostgres;
use reqwest::StatusCode;
use serde_json::json;

use super::{Cluster, SHORT_LEASE_MS, TAKE_OVER_BOUND, assert_log_sound, stream_until};
use crate::suite::client_tools::http::{calls_pick_color, pick_color, result};
use crate::suite::support::api::Resume;
use crate::suite::support::events::tool_results;

/// The results of the log's tool calls.
fn results(log: &[RecordedEvent]) -> Vec<(String, String, bool)> {
    tool_results(log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_call_waits_through_its_nodes_death_and_is_answered_or_timed_out_elsewhere() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 3, SHORT_LEASE_MS, &[]);
    let model = cluster
        .scratch
        .script("pick.jsonl", &[&calls_pick_color("call-1"), r#"{"text": "red it is"}"#]);
    let late_model = cluster.scratch.script(
        "late.jsonl",
        &[&calls_pick_color("call-2"), r#"{"text": "no color then"}"#],
    );
    cluster
        .api(0)
        .create(json!({"id": "pick", "model": model, "client_tools": [pick_color()]}))
        .await;
    cluster
        .api(0)
        .create(
            json!({"id": "late", "model": late_model, "client_tools": [pick_color()], "client_tool_timeout_secs": 8}),
        )
        .await;
    let mut pick = cluster.api(2).stream("pick", Resume::Start).await;
    let mut late = cluster.api(2).stream("late", Resume::Start).await;
    cluster.api(0).say("pick", "pick one").await;
    cluster.api(0).say("late", "pick one").await;
    for stream in [&mut pick, &mut late] {
        stream_until(stream, Duration::from_secs(30), |event| {
            event.msg.kind() == "client_tool_requested"
        })
        .await;
    }
    cluster.take(0).crash();
    tokio::time::sleep(Duration::from_millis(2 * SHORT_LEASE_MS)).await;
    let shown = cluster.api(1).session("pick").await;
    assert_eq!(shown["state"], "awaiting_client_tool", "{shown}");

    // The answer, sent to another node, loads the session there.
    let reply = cluster.api(1).submit("pick", result("call-1", "red")).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    stream_until(&mut pick, TAKE_OVER_BOUND, |event| event.msg.kind() == "turn_complete").await;
    let log = cluster.log("pick").await;
    assert_log_sound(&log);
    assert_eq!(results(&log), [("call-1".to_owned(), "red".to_owned(), false)]);

    // Nobody answers the other: a surviving node times it out.
    stream_until(&mut late, TAKE_OVER_BOUND, |event| event.msg.kind() == "turn_complete").await;
    let log = cluster.log("late").await;
    assert_log_sound(&log);
    assert_eq!(
        results(&log),
        [(
            "call-2".to_owned(),
            "the client did not answer within 8 s".to_owned(),
            true
        )]
    );
    let answered = cluster.api(2).submit("late", result("call-2", "too late")).await;
    assert_eq!(answered.status, StatusCode::CONFLICT, "{}", answered.body);
}
