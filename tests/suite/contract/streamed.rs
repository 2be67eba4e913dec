//! The two endless routes, which schemathesis cannot call whole: every
//! event of a server-sent stream and every WebSocket frame of a turn that
//! streams text, asks for approval and runs a tool must match the
//! description, as a third-party validator (`jsonschema`) reads it.

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::document;
use crate::suite::support::server::TestServer;
use crate::suite::support::wait::guard;

/// A validator for `schema`, whose `$ref`s point into the description.
fn validator(schema: &Value) -> jsonschema::Validator {
    let doc = document();
    let mut root = schema.clone();
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    root["components"] = doc["components"].clone();
    jsonschema::validator_for(&root).expect("the description's schemas compile")
}

/// Asserts that `instance` is valid under `validator`.
fn assert_valid(validator: &jsonschema::Validator, instance: &Value, what: &str) {
    let errors: Vec<String> = validator.iter_errors(instance).map(|error| error.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{what} does not match the description: {errors:?}\n{instance}"
    );
}

/// A server whose session `asker` streams text, asks to write a file, and
/// answers once the write ran.
async fn asking_server() -> TestServer {
    let server = TestServer::start(|_, _| {}).await;
    let call = json!({"chunks": ["Let me ", "write it."], "tool_calls": [{"id": "call-1", "name": "write_file", "arguments": {"path": "note.txt", "content": "hi"}}]});
    let model = server
        .scratch
        .script("s.jsonl", &[&call.to_string(), r#"{"text": "Written."}"#]);
    server
        .api
        .create(json!({"id": "asker", "model": model, "tools": {"shell": false}, "approvals": {"default": "ask"}}))
        .await;
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_streamed_event_matches_the_description() {
    let server = asking_server().await;
    let event = validator(&json!({"$ref": "#/components/schemas/RecordedEvent"}));
    let mut stream = server
        .api
        .stream("asker", crate::suite::support::api::Resume::Start)
        .await;
    server.api.say("asker", "write a note").await;
    let mut seen = Vec::new();
    let mut approved = false;
    loop {
        let sse = stream.next_sse().await.expect("the stream goes on");
        let data: Value = serde_json::from_str(&sse.data).expect("JSON data");
        assert_valid(&event, &data, "an SSE event's data");
        assert_eq!(
            sse.event.as_deref(),
            data["msg"]["type"].as_str(),
            "the SSE event name is the type"
        );
        let kind = data["msg"]["type"].as_str().expect("a type").to_owned();
        if kind == "approval_requested" && !approved {
            approved = true;
            let decision = json!({"op": {"type": "approval", "call_id": "call-1", "decision": "approve"}});
            server.api.submit("asker", decision).await;
        }
        let done = kind == "turn_complete";
        seen.push(kind);
        if done {
            break;
        }
    }
    for kind in [
        "session_started",
        "submission_queued",
        "turn_started",
        "user_message",
        "assistant_content_delta",
        "approval_requested",
        "approval_decided",
        "tool_call_started",
        "tool_call_completed",
        "assistant_message",
        "turn_complete",
    ] {
        assert!(seen.iter().any(|seen| seen == kind), "no {kind} in {seen:?}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_websocket_frame_matches_the_description() {
    let server = asking_server().await;
    let doc = document();
    let frames = &doc["paths"]["/v1/sessions/{id}/ws"]["get"]["responses"]["101"]["x-websocket-frames"];
    let client = validator(&frames["client"]);
    let from_server = validator(&frames["server"]);
    let url = format!(
        "{}/v1/sessions/asker/ws?after=0",
        server.api.base.replacen("http", "ws", 1)
    );
    let (mut socket, _) = guard("WebSocket connect", tokio_tungstenite::connect_async(url))
        .await
        .expect("connect");
    let send = async |socket: &mut tokio_tungstenite::WebSocketStream<_>, frame: Value| {
        assert_valid(&client, &frame, "a submission frame");
        socket.send(Message::text(frame.to_string())).await.expect("send");
    };
    send(
        &mut socket,
        json!({"op": {"type": "user_input", "text": "write a note"}, "request_id": "r1", "idempotency_key": "k1"}),
    )
    .await;
    // A frame the server refuses is answered by an error frame, also described.
    send(
        &mut socket,
        json!({"op": {"type": "approval", "call_id": "nope", "decision": "deny"}, "request_id": "r2"}),
    )
    .await;
    let mut replies = 0;
    loop {
        let message = guard("a WebSocket frame", socket.next())
            .await
            .expect("the socket is open")
            .expect("a frame");
        let Message::Text(text) = message else { continue };
        let frame: Value = serde_json::from_str(text.as_str()).expect("JSON");
        assert_valid(&from_server, &frame, "a server frame");
        if frame.get("request_id").is_some() {
            replies += 1;
        }
        if frame["msg"]["type"] == "approval_requested" {
            let decision =
                json!({"op": {"type": "approval", "call_id": "call-1", "decision": "approve"}, "request_id": "r3"});
            send(&mut socket, decision).await;
        }
        if frame["msg"]["type"] == "turn_complete" {
            break;
        }
    }
    assert_eq!(replies, 3, "one reply per submission frame");
    server.stop().await;
}
