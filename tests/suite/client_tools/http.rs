//! Client tools over the native HTTP API, against a real server: the
//! declaration, the request in the log, the result that completes the turn,
//! and the refusals of bad results.

use keel::protocol::{EventMsg, RecordedEvent};
use serde_json::{Value, json};

use crate::suite::support::api::Resume;
use crate::suite::support::events::{ends_turn, kinds};
use crate::suite::support::server::TestServer;

/// The declaration of one client tool, `pick_color`.
pub(super) fn pick_color() -> Value {
    json!({
        "name": "pick_color",
        "description": "Asks the user to pick a color.",
        "parameters": {"type": "object", "properties": {"hint": {"type": "string"}}, "required": ["hint"]}
    })
}

/// A scripted model step calling `pick_color` as `call_id`.
pub(super) fn calls_pick_color(call_id: &str) -> String {
    json!({"tool_calls": [{"id": call_id, "name": "pick_color", "arguments": {"hint": "warm"}}]}).to_string()
}

/// The `client_tool_result` op's body.
pub(super) fn result(call_id: &str, output: &str) -> Value {
    json!({"op": {"type": "client_tool_result", "call_id": call_id, "output": output, "is_error": false}})
}

/// The `client_tool_requested` event of `events`, if any.
pub(super) fn requested(events: &[RecordedEvent]) -> Option<&RecordedEvent> {
    events
        .iter()
        .find(|event| matches!(event.msg, EventMsg::ClientToolRequested(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_client_tool_is_requested_and_its_result_completes_the_turn() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server
        .scratch
        .script("s.jsonl", &[&calls_pick_color("call-1"), r#"{"text": "red it is"}"#]);
    let created = server
        .api
        .create(json!({"id": "picker", "model": model, "client_tools": [pick_color()]}))
        .await;
    assert_eq!(created["client_tools"], json!([pick_color()]), "{created}");
    let mut stream = server.api.stream("picker", Resume::Start).await;
    server.api.say("picker", "pick one").await;
    let events = stream.until(|event| event.msg.kind() == "client_tool_requested").await;
    let EventMsg::ClientToolRequested(request) = &requested(&events).expect("requested").msg else {
        unreachable!()
    };
    assert_eq!(request.call_id, "call-1");
    assert_eq!(request.name, "pick_color");
    assert_eq!(request.arguments, r#"{"hint":"warm"}"#);
    let expires = request.expires_at_ms.expect("a deadline by default");
    let in_ten_minutes = keel::protocol::now_ms() + 600_000;
    assert!(
        expires <= in_ten_minutes && expires + 60_000 > in_ten_minutes,
        "{expires}"
    );
    // `tool_call_started` comes right before it, in the same commit.
    let kinds_seen = kinds(&events);
    assert_eq!(
        &kinds_seen[kinds_seen.len() - 2..],
        ["tool_call_started", "client_tool_requested"]
    );
    let started = &events[events.len() - 2];
    assert_eq!(started.sequence + 1, events[events.len() - 1].sequence);

    let shown = server.api.session("picker").await;
    assert_eq!(shown["state"], "awaiting_client_tool", "{shown}");
    assert_eq!(shown["pending_client_tools"], json!(["call-1"]));

    let reply = server.api.submit("picker", result("call-1", "red")).await;
    assert_eq!(reply.status, reqwest::StatusCode::ACCEPTED, "{}", reply.body);
    let submission_id = reply.body["submission_id"].as_str().expect("id").to_owned();
    let events = stream.until(ends_turn).await;
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"), "{:?}", kinds(&events));
    let completed = events
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(done) => Some((event, done)),
            _ => None,
        })
        .expect("the call completed");
    assert_eq!(
        (completed.1.call_id.as_str(), completed.1.output.as_str()),
        ("call-1", "red")
    );
    assert!(!completed.1.is_error);
    assert_eq!(completed.0.submission_id.as_deref(), Some(submission_id.as_str()));
    let shown = server.api.session("picker").await;
    assert_eq!(shown["state"], "idle", "{shown}");
    assert_eq!(shown["pending_client_tools"], json!([]));
    server.stop().await;
}
