//! The wait for a client's result costs no live session and survives the
//! server: a waiting session unloads, a killed server's successor takes
//! the answer, and a deadline passing while the session is unloaded still
//! answers the call.

use std::time::Duration;

use keel::protocol::EventMsg;
use serde_json::json;

use super::http::{calls_pick_color, pick_color, result};
use crate::suite::support::api::Resume;
use crate::suite::support::events::{ends_turn, kinds, tool_results};
use crate::suite::support::server::{Scratch, ServeProcess, TestServer};
use crate::suite::support::wait::{HANG_GUARD, wait_until_async};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_session_unloads_and_the_answer_completes_it_after_reloading() {
    let server = TestServer::start(|config, _| config.idle_unload = Duration::from_millis(200)).await;
    let model = server
        .scratch
        .script("s.jsonl", &[&calls_pick_color("call-1"), r#"{"text": "red it is"}"#]);
    server
        .api
        .create(json!({"id": "rester", "model": model, "client_tools": [pick_color()]}))
        .await;
    let mut stream = server.api.stream("rester", Resume::Start).await;
    server.api.say("rester", "pick one").await;
    stream.until(|event| event.msg.kind() == "client_tool_requested").await;
    drop(stream);
    wait_until_async("the waiting session to unload", HANG_GUARD, async || {
        server.api.session("rester").await["live"] == false
    })
    .await;
    let shown = server.api.session("rester").await;
    assert_eq!(shown["state"], "awaiting_client_tool", "{shown}");
    assert_eq!(shown["pending_client_tools"], json!(["call-1"]));

    let after = shown["last_sequence"].as_u64().expect("sequence");
    let mut stream = server.api.stream("rester", Resume::After(after)).await;
    let reply = server.api.submit("rester", result("call-1", "red")).await;
    assert_eq!(reply.status, reqwest::StatusCode::ACCEPTED, "{}", reply.body);
    let events = stream.until(ends_turn).await;
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"), "{:?}", kinds(&events));
    assert_eq!(tool_results(&events), [("call-1".to_owned(), "red".to_owned(), false)]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passing_while_the_session_is_unloaded_answers_the_call_as_an_error() {
    let server = TestServer::start(|config, _| config.idle_unload = Duration::from_millis(200)).await;
    let model = server.scratch.script(
        "s.jsonl",
        &[&calls_pick_color("call-1"), r#"{"text": "no color then"}"#],
    );
    server
        .api
        .create(json!({"id": "late", "model": model, "client_tools": [pick_color()], "client_tool_timeout_secs": 2}))
        .await;
    let mut stream = server.api.stream("late", Resume::Start).await;
    server.api.say("late", "pick one").await;
    let before = stream.until(|event| event.msg.kind() == "client_tool_requested").await;
    drop(stream);
    wait_until_async("the waiting session to unload", HANG_GUARD, async || {
        server.api.session("late").await["live"] == false
    })
    .await;
    let after = before.last().expect("requested").sequence;
    wait_until_async("the timed-out turn to end", HANG_GUARD, async || {
        server.api.session("late").await["turns_completed"] == 1
    })
    .await;
    let log = server.api.get(&format!("/v1/sessions/late/events?after={after}")).await;
    let events: Vec<keel::protocol::RecordedEvent> =
        serde_json::from_value(log.body["events"].clone()).expect("events");
    assert_eq!(
        tool_results(&events),
        [(
            "call-1".to_owned(),
            "the client did not answer within 2 s".to_owned(),
            true
        )]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_when_the_server_is_killed_is_answered_after_the_restart() {
    let scratch = Scratch::new();
    let model = scratch.script("s.jsonl", &[&calls_pick_color("call-1"), r#"{"text": "red it is"}"#]);
    let first = ServeProcess::start(&scratch, &[]);
    first
        .api
        .create(json!({"id": "killed", "model": model, "client_tools": [pick_color()]}))
        .await;
    let mut stream = first.api.stream("killed", Resume::Start).await;
    first.api.say("killed", "pick one").await;
    let before = stream.until(|event| event.msg.kind() == "client_tool_requested").await;
    let turn_id = before
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::ClientToolRequested(request) => Some(request.turn_id.clone()),
            _ => None,
        })
        .expect("requested");
    drop(stream);
    tokio::task::spawn_blocking(move || first.crash()).await.expect("crash");

    let second = ServeProcess::start(&scratch, &[]);
    let shown = second.api.session("killed").await;
    assert_eq!(shown["state"], "awaiting_client_tool", "{shown}");
    assert_eq!(shown["pending_client_tools"], json!(["call-1"]));
    let mut stream = second
        .api
        .stream("killed", Resume::After(before.last().expect("event").sequence))
        .await;
    let reply = second.api.submit("killed", result("call-1", "red")).await;
    assert_eq!(reply.status, reqwest::StatusCode::ACCEPTED, "{}", reply.body);
    let events = stream.until(ends_turn).await;
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"), "{:?}", kinds(&events));
    assert!(
        !kinds(&events).contains(&"turn_aborted"),
        "the waiting turn goes on: {:?}",
        kinds(&events)
    );
    assert!(
        events
            .iter()
            .filter(|event| event.msg.turn_id().is_some())
            .all(|event| event.msg.turn_id() == Some(turn_id.as_str()))
    );
    assert_eq!(tool_results(&events), [("call-1".to_owned(), "red".to_owned(), false)]);
    let (status, _) = tokio::task::spawn_blocking(move || second.terminate())
        .await
        .expect("stop");
    assert!(status.success());
}
