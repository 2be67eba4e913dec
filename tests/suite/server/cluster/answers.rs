//! The same answer from every node: a submission sent to a node that does
//! not run its session is answered what the owner would have answered (the
//! `202` with the sequence of its `submission_queued`, or the owner's
//! `409`), a retry of its key is answered as the first time on any node,
//! and an owner that does not answer in time is `503 owner_unavailable`
//! everywhere, with the submission's real answer for a later retry.

use std::time::{Duration, Instant};

use keel::protocol::RecordedEvent;
use keel::store::postgres::local::LocalPostgres;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{Cluster, SHORT_LEASE_MS, assert_log_sound, signal, stream_until};
use crate::suite::support::api::{Api, Reply, Resume};
use crate::suite::support::server::slow_chunks;
use crate::suite::support::wait::{guard, wait_for_async, wait_until_async};

/// Submits a user message with a busy policy and an idempotency key;
/// returns the reply and its `Retry-After` header.
async fn submit_as(api: &Api, session_id: &str, text: &str, on_busy: &str, key: &str) -> (Reply, Option<String>) {
    let mut request = api
        .client
        .post(api.url(&format!("/v1/sessions/{session_id}/submissions")))
        .header("idempotency-key", key)
        .json(&json!({"op": {"type": "user_input", "text": text}, "on_busy": on_busy}));
    if let Some(token) = &api.token {
        request = request.bearer_auth(token);
    }
    let response = guard("a submission", request.send())
        .await
        .expect("send the submission");
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let bytes = response.bytes().await.expect("read the body");
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (Reply { status, body }, retry_after)
}

/// The JSON of an event's `msg`.
fn msg(event: &RecordedEvent) -> Value {
    serde_json::to_value(&event.msg).expect("event JSON")
}

/// The `submission_queued` events of submission `id` in `log`.
fn queued_of<'a>(log: &'a [RecordedEvent], id: &str) -> Vec<&'a RecordedEvent> {
    log.iter()
        .filter(|event| event.msg.kind() == "submission_queued" && event.submission_id.as_deref() == Some(id))
        .collect()
}

/// Two nodes, the session on node 0 with a turn running: node 1 answers a
/// queued message `202` with the sequence of its own `submission_queued`
/// and a `reject` one `409 session_busy`, as node 0 does; once the session
/// is idle, each key retried on either node is answered exactly as the
/// first time, and a rejected key is never queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_answers_a_submission_as_its_owner_does() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let cluster = Cluster::start(postgres, 2, SHORT_LEASE_MS, &[]);
    let script = cluster.scratch.script(
        "s.jsonl",
        &[
            &slow_chunks(60, 50),
            r#"{"text": "The queued one ran."}"#,
            r#"{"text": "Spare."}"#,
        ],
    );
    cluster.api(0).create(json!({"id": "s", "model": script})).await;
    let mut watch = cluster.api(1).stream("s", Resume::Start).await;
    cluster.api(0).say("s", "a long answer, please").await;
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "assistant_content_delta"
    })
    .await;

    let (queued, _) = submit_as(cluster.api(1), "s", "and then this", "queue", "q-1").await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{}", queued.body);
    assert_eq!(queued.body["duplicate"], false);
    let (relayed_reject, _) = submit_as(cluster.api(1), "s", "not now", "reject", "r-1").await;
    assert_eq!(relayed_reject.status, StatusCode::CONFLICT, "{}", relayed_reject.body);
    assert_eq!(relayed_reject.code(), "session_busy", "{}", relayed_reject.body);
    let (owner_reject, _) = submit_as(cluster.api(0), "s", "not now either", "reject", "r-0").await;
    assert_eq!(owner_reject.status, StatusCode::CONFLICT, "{}", owner_reject.body);
    assert_eq!(
        relayed_reject.body, owner_reject.body,
        "the relayed refusal is the owner's"
    );

    guard("both turns", watch.turns(2)).await;
    cluster.api(0).wait_idle("s").await;
    let log = cluster.log("s").await;
    let id = queued.body["submission_id"].as_str().expect("an id");
    let events = queued_of(&log, id);
    assert_eq!(events.len(), 1, "queued once");
    assert_eq!(
        queued.body["sequence"].as_u64(),
        Some(events[0].sequence),
        "the sequence of its submission_queued"
    );

    // Retried later, on either node: answered as the first time.
    for node in 0..2 {
        let (again, _) = submit_as(cluster.api(node), "s", "and then this", "queue", "q-1").await;
        assert_eq!(again.status, StatusCode::ACCEPTED, "node {node}: {}", again.body);
        assert_eq!(again.body["submission_id"], queued.body["submission_id"], "node {node}");
        assert_eq!(again.body["sequence"], queued.body["sequence"], "node {node}");
        assert_eq!(again.body["duplicate"], true, "node {node}");
        for (key, text, first) in [
            ("r-1", "not now", &relayed_reject),
            ("r-0", "not now either", &owner_reject),
        ] {
            let (again, _) = submit_as(cluster.api(node), "s", text, "reject", key).await;
            assert_eq!(
                (again.status, &again.body),
                (first.status, &first.body),
                "node {node}, key {key}: refused as the first time"
            );
        }
    }
    let log = cluster.log("s").await;
    assert_log_sound(&log);
    assert!(
        log.iter().all(|event| !msg(event)["text"]
            .as_str()
            .is_some_and(|text| text.starts_with("not now"))),
        "a rejected message never ran"
    );
    assert_eq!(queued_of(&log, id).len(), 1, "a retry queues nothing");
    let rejected = log
        .iter()
        .filter(|event| event.msg.kind() == "submission_rejected")
        .count();
    assert_eq!(rejected, 2, "each refusal recorded once");
}

/// The owner paused: a submission relayed to it is answered `503
/// owner_unavailable` with `Retry-After` once the wait is over, on every
/// try; it stays relayed, so once the owner is back it is queued, once,
/// and a retry of its key on either node gets that receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_does_not_answer_in_time_is_owner_unavailable() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    // A lease long enough that nobody takes the session over meanwhile.
    let mut cluster = Cluster::start(postgres, 2, 10_000, &["--relay-wait-ms", "700"]);
    let script = cluster
        .scratch
        .script("p.jsonl", &[r#"{"text": "Hello."}"#, r#"{"text": "Back."}"#]);
    cluster.api(0).create(json!({"id": "p", "model": script})).await;
    cluster.api(0).say("p", "hello").await;
    cluster.api(0).wait_idle("p").await;

    let owner = cluster.take(0);
    signal(&owner, nix::sys::signal::Signal::SIGSTOP);
    for _ in 0..2 {
        let sent = Instant::now();
        let (paused, retry_after) = submit_as(cluster.api(1), "p", "are you there?", "queue", "p-1").await;
        assert_eq!(paused.status, StatusCode::SERVICE_UNAVAILABLE, "{}", paused.body);
        assert_eq!(paused.code(), "owner_unavailable", "{}", paused.body);
        assert_eq!(retry_after.as_deref(), Some("10"), "a retry once a take-over is due");
        assert!(sent.elapsed() >= Duration::from_millis(700), "it waited for the owner");
    }
    signal(&owner, nix::sys::signal::Signal::SIGCONT);
    cluster.nodes[0] = Some(owner);
    // Back, the owner queues what was left for it, unasked.
    wait_until_async("the owner to queue what waited", Duration::from_secs(30), async || {
        cluster
            .log("p")
            .await
            .iter()
            .any(|event| event.msg.kind() == "submission_queued" && msg(event)["idempotency_key"] == "p-1")
    })
    .await;

    let answered = wait_for_async("the owner's answer", Duration::from_secs(30), async || {
        let (reply, _) = submit_as(cluster.api(1), "p", "are you there?", "queue", "p-1").await;
        (reply.status == StatusCode::ACCEPTED).then_some(reply)
    })
    .await;
    assert_eq!(answered.body["duplicate"], true, "{}", answered.body);
    let (on_owner, _) = submit_as(cluster.api(0), "p", "are you there?", "queue", "p-1").await;
    assert_eq!(on_owner.status, StatusCode::ACCEPTED, "{}", on_owner.body);
    assert_eq!(on_owner.body, answered.body, "the same answer from the owner");
    cluster.api(0).wait_idle("p").await;
    let log = cluster.log("p").await;
    assert_log_sound(&log);
    let id = answered.body["submission_id"].as_str().expect("an id");
    let events = queued_of(&log, id);
    assert_eq!(events.len(), 1, "queued once");
    assert_eq!(answered.body["sequence"].as_u64(), Some(events[0].sequence));
    let keyed = log
        .iter()
        .filter(|event| event.msg.kind() == "submission_queued" && msg(event)["idempotency_key"] == "p-1")
        .count();
    assert_eq!(keyed, 1, "one submission for the key");
}
