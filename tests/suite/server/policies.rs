//! Double texting: a message sent while a turn runs, under each busy
//! policy; and idempotency keys.

use std::time::Duration;

use keel::protocol::RecordedEvent;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::{Resume, SseStream};
use crate::suite::support::events::{ends_turn, kinds, started_turn_id};
use crate::suite::support::server::{TestServer, slow_chunks};
use crate::suite::support::wait::{HANG_GUARD, wait_until_async};

/// The JSON of an event's `msg`.
fn msg(event: &RecordedEvent) -> Value {
    serde_json::to_value(&event.msg).expect("event JSON")
}

/// A server with a session `s` whose first turn streams slowly, already
/// running; returns the stream positioned after its first delta.
async fn busy_session(lines: &[&str]) -> (TestServer, SseStream, Vec<RecordedEvent>) {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", lines);
    server.api.create(json!({"id": "s", "model": model})).await;
    let mut stream = server.api.stream("s", Resume::Start).await;
    server.api.say("s", "first").await;
    let seen = stream
        .until(|event| event.msg.kind() == "assistant_content_delta")
        .await;
    (server, stream, seen)
}

async fn say_with(server: &TestServer, text: &str, on_busy: &str) -> (StatusCode, Value) {
    let reply = server
        .api
        .submit(
            "s",
            json!({"op": {"type": "user_input", "text": text}, "on_busy": on_busy}),
        )
        .await;
    (reply.status, reply.body)
}

/// The `submission_queued` event recorded for `accepted`.
fn queued_event<'a>(events: &'a [RecordedEvent], accepted: &Value) -> &'a RecordedEvent {
    let event = events
        .iter()
        .find(|event| event.sequence == accepted["sequence"].as_u64().expect("sequence"))
        .expect("the accepted sequence is in the log");
    assert_eq!(event.msg.kind(), "submission_queued", "{:?}", msg(event));
    assert_eq!(event.submission_id.as_deref(), accepted["submission_id"].as_str());
    event
}

/// Where the user message `text` is, and its turn.
fn user_message(events: &[RecordedEvent], text: &str) -> (usize, String) {
    events
        .iter()
        .enumerate()
        .find_map(|(index, event)| {
            let body = msg(event);
            (body["type"] == "user_message" && body["text"] == text)
                .then(|| (index, body["turn_id"].as_str().expect("turn").to_owned()))
        })
        .unwrap_or_else(|| panic!("no user message {text:?} in {:?}", kinds(events)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_waits_for_the_next_turn() {
    let (server, mut stream, mut events) = busy_session(&[&slow_chunks(10, 30), r#"{"text": "second"}"#]).await;
    let (status, accepted) = say_with(&server, "later", "queue").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    events.extend(stream.turns(2).await);
    assert_eq!(msg(queued_event(&events, &accepted))["on_busy"], "queue");
    let first = started_turn_id(&events);
    let (index, turn) = user_message(&events, "later");
    assert_ne!(turn, first, "a turn of its own");
    let first_end = events
        .iter()
        .position(|event| event.msg.ends_turn())
        .expect("the first turn ended");
    assert!(first_end < index);
    assert_eq!(events[first_end].msg.kind(), "turn_complete");
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_aborts_the_running_turn_and_starts_a_new_one() {
    let (server, mut stream, mut events) = busy_session(&[&slow_chunks(100, 50), r#"{"text": "fresh"}"#]).await;
    let (status, accepted) = say_with(&server, "stop that", "interrupt").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    events.extend(stream.turns(2).await);
    let queued = queued_event(&events, &accepted);
    assert_eq!(msg(queued)["on_busy"], "interrupt");
    let first = started_turn_id(&events);
    let aborted = events
        .iter()
        .position(|event| event.msg.ends_turn() && event.msg.turn_id() == Some(first.as_str()))
        .expect("the first turn ended");
    assert_eq!(msg(&events[aborted])["type"], "turn_aborted");
    assert_eq!(msg(&events[aborted])["reason"], "interrupted");
    assert!(queued.sequence < events[aborted].sequence);
    let (index, turn) = user_message(&events, "stop that");
    assert!(index > aborted && turn != first);
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_refuses_with_409_and_the_log_says_so() {
    let (server, mut stream, mut events) = busy_session(&[&slow_chunks(10, 30)]).await;
    let (status, body) = say_with(&server, "not now", "reject").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "session_busy");
    events.extend(stream.until(ends_turn).await);
    assert_eq!(
        kinds(&events).last(),
        Some(&"turn_complete"),
        "the running turn goes on"
    );
    assert!(kinds(&events).contains(&"submission_rejected"), "{:?}", kinds(&events));
    assert!(events.iter().all(|event| msg(event)["text"] != "not now"));
    server.stop().await;
}

/// A key whose submission was refused (`on_busy: reject` while busy)
/// stays taken: retried once the session is idle, it is refused the same
/// way, never queued as a new submission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_key_stays_rejected() {
    let (server, mut stream, _) = busy_session(&[&slow_chunks(10, 30), r#"{"text": "unused"}"#]).await;
    let post = |key: &'static str| {
        let server = &server;
        async move {
            let request = server
                .api
                .client
                .post(server.api.url("/v1/sessions/s/submissions"))
                .header("idempotency-key", key)
                .json(&json!({"op": {"type": "user_input", "text": "not now"}, "on_busy": "reject"}));
            server.api.send(request).await
        }
    };
    let first = post("once-only").await;
    assert_eq!(first.status, StatusCode::CONFLICT, "{}", first.body);
    assert_eq!(first.code(), "session_busy", "{}", first.body);
    stream.until(ends_turn).await;
    server.api.wait_idle("s").await;
    let again = post("once-only").await;
    assert_eq!(
        (again.status, again.body.clone()),
        (first.status, first.body.clone()),
        "answered as the first time"
    );
    let scratch = server.stop().await;
    let stored = scratch.stored("s").await;
    assert!(
        stored.iter().all(|event| msg(event)["text"] != "not now"),
        "never queued: {:?}",
        kinds(&stored)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steer_joins_the_running_turn_before_its_next_step() {
    // The first step streams slowly and calls a tool, so there is a next step.
    let first_step = json!({
        "chunks": ["Let ", "me ", "look ", "at ", "the ", "clock."],
        "delay_ms": 50,
        "tool_calls": [{"name": "clock", "arguments": {}}]
    })
    .to_string();
    let (server, mut stream, mut events) = busy_session(&[&first_step, r#"{"text": "steered"}"#]).await;
    let (status, accepted) = say_with(&server, "use UTC", "steer").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    events.extend(stream.until(ends_turn).await);
    assert_eq!(msg(queued_event(&events, &accepted))["on_busy"], "steer");
    let first = started_turn_id(&events);
    let (index, turn) = user_message(&events, "use UTC");
    assert_eq!(turn, first, "the message joined the running turn");
    let second_step = events
        .iter()
        .position(|event| {
            let body = msg(event);
            body["type"] == "model_step_started" && body["step"] == 2
        })
        .expect("a second step");
    assert!(index < second_step, "{:?}", kinds(&events));
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"));
    assert_eq!(kinds(&events).iter().filter(|kind| **kind == "turn_started").count(), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_post_with_the_same_key_is_answered_once() {
    let server = TestServer::start(|config, _| config.idle_unload = Duration::from_millis(200)).await;
    let model = server
        .scratch
        .script("s.jsonl", &[r#"{"text": "one"}"#, r#"{"text": "two"}"#]);
    server.api.create(json!({"id": "s", "model": model})).await;
    let post = |key: &'static str, text: &'static str| {
        let api = server.api.clone();
        async move {
            api.send(
                api.client
                    .post(api.url("/v1/sessions/s/submissions"))
                    .header("idempotency-key", key)
                    .json(&json!({"op": {"type": "user_input", "text": text}})),
            )
            .await
        }
    };
    let first = post("order-42", "hello").await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    assert_eq!(first.body["duplicate"], false);
    let again = post("order-42", "hello").await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
    assert_eq!(again.body["duplicate"], true);
    assert_eq!(again.body["submission_id"], first.body["submission_id"]);
    assert_eq!(again.body["sequence"], first.body["sequence"]);
    server.api.wait_idle("s").await;

    // Still a duplicate after the session was unloaded and reloaded.
    wait_until_async("the session to unload when idle", HANG_GUARD, async || {
        server.api.session("s").await["live"] == false
    })
    .await;
    let later = post("order-42", "hello").await;
    assert_eq!(later.body["duplicate"], true, "{}", later.body);
    assert_eq!(later.body["submission_id"], first.body["submission_id"]);

    // Another key is another submission.
    let other = post("order-43", "hello again").await;
    assert_eq!(other.body["duplicate"], false);
    assert_ne!(other.body["submission_id"], first.body["submission_id"]);
    server.api.wait_idle("s").await;
    let scratch = server.stop().await;
    let stored = scratch.stored("s").await;
    let messages: Vec<Value> = stored
        .iter()
        .map(msg)
        .filter(|body| body["type"] == "user_message")
        .map(|body| body["text"].clone())
        .collect();
    assert_eq!(messages, [json!("hello"), json!("hello again")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_body_is_409() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server
        .scratch
        .script("s.jsonl", &[r#"{"text": "one"}"#, r#"{"text": "two"}"#]);
    server.api.create(json!({"id": "s", "model": model})).await;
    let post = |key: &'static str, body: Value| {
        let api = server.api.clone();
        async move {
            api.send(
                api.client
                    .post(api.url("/v1/sessions/s/submissions"))
                    .header("idempotency-key", key)
                    .json(&body),
            )
            .await
        }
    };
    let first = post("order-7", json!({"op": {"type": "user_input", "text": "buy one"}})).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    server.api.wait_idle("s").await;
    for other in [
        json!({"op": {"type": "user_input", "text": "buy two"}}),
        json!({"op": {"type": "steer", "text": "buy one"}}),
        json!({"op": {"type": "user_input", "text": "buy one"}, "on_busy": "reject"}),
    ] {
        let reply = post("order-7", other.clone()).await;
        assert_eq!(reply.status, StatusCode::CONFLICT, "{other}: {}", reply.body);
        assert_eq!(reply.code(), "idempotency_key_reused", "{}", reply.body);
        assert!(
            reply.body["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains(first.body["submission_id"].as_str().expect("id"))),
            "the message names the earlier submission: {}",
            reply.body
        );
    }
    // The same body is still a duplicate.
    let again = post("order-7", json!({"op": {"type": "user_input", "text": "buy one"}})).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
    assert_eq!(again.body["duplicate"], true);
    let scratch = server.stop().await;
    let stored = scratch.stored("s").await;
    let messages: Vec<Value> = stored
        .iter()
        .map(msg)
        .filter(|body| body["type"] == "user_message")
        .map(|body| body["text"].clone())
        .collect();
    assert_eq!(messages, [json!("buy one")], "nothing else was queued");
}
