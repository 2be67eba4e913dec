//! The WebSocket: ops in, events out, resumable.

use futures::{SinkExt, StreamExt};
use keel::protocol::RecordedEvent;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::suite::support::events::sequences;
use crate::suite::support::server::{TestServer, slow_chunks};
use crate::suite::support::wait::guard;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(server: &TestServer, session_id: &str, after: u64) -> Socket {
    let url = format!(
        "{}/v1/sessions/{session_id}/ws?after={after}",
        server.api.base.replacen("http", "ws", 1)
    );
    let (socket, _) = guard("WebSocket connect", tokio_tungstenite::connect_async(url))
        .await
        .expect("connect");
    socket
}

/// What the server sent: an event, or a reply to a submission frame.
enum Frame {
    Event(Box<RecordedEvent>),
    Reply(Value),
}

async fn next_frame(socket: &mut Socket) -> Frame {
    loop {
        let message = guard("a WebSocket frame", socket.next())
            .await
            .expect("the socket is open")
            .expect("a frame");
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(text.as_str()).expect("JSON");
            // Replies have a `type` at the top level; events have a `msg`.
            return if value.get("type").is_some() {
                Frame::Reply(value)
            } else {
                Frame::Event(Box::new(serde_json::from_value(value).expect("an event")))
            };
        }
    }
}

async fn send(socket: &mut Socket, frame: Value) {
    socket.send(Message::text(frame.to_string())).await.expect("send");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_go_in_and_events_come_out_and_a_new_socket_resumes() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server
        .scratch
        .script("s.jsonl", &[&slow_chunks(20, 20), r#"{"text": "second"}"#]);
    server.api.create(json!({"id": "sock", "model": model})).await;

    let mut socket = connect(&server, "sock", 0).await;
    send(
        &mut socket,
        json!({"op": {"type": "user_input", "text": "Hi"}, "on_busy": "queue", "idempotency_key": "k1", "request_id": "r1"}),
    )
    .await;
    let mut events = Vec::new();
    let mut reply = None;
    let mut deltas = 0;
    while deltas < 5 {
        match next_frame(&mut socket).await {
            Frame::Event(event) => {
                deltas += usize::from(event.msg.kind() == "assistant_content_delta");
                events.push(*event);
            }
            Frame::Reply(value) => reply = Some(value),
        }
    }
    let reply = reply.expect("the submission was answered before its turn streamed");
    assert_eq!(reply["type"], "submission_accepted", "{reply}");
    assert_eq!(reply["request_id"], "r1");
    assert_eq!(reply["duplicate"], false);
    assert!(
        reply["submission_id"].is_string() && reply["sequence"].is_u64(),
        "{reply}"
    );

    // Bad frames are answered, not fatal.
    send(&mut socket, json!({"op": {"type": "nope"}, "request_id": "r2"})).await;
    loop {
        match next_frame(&mut socket).await {
            Frame::Event(event) => events.push(*event),
            Frame::Reply(value) => {
                assert_eq!(value["type"], "submission_error", "{value}");
                assert_eq!(value["request_id"], "r2");
                assert_eq!(value["error"]["code"], "invalid_request");
                break;
            }
        }
    }
    drop(socket);

    // A new socket from the last event seen: the rest, once each.
    let resume = events.last().expect("events").sequence;
    let mut socket = connect(&server, "sock", resume).await;
    send(
        &mut socket,
        json!({"op": {"type": "user_input", "text": "Again"}, "request_id": "r3"}),
    )
    .await;
    let mut turns_ended = 0;
    while turns_ended < 2 {
        if let Frame::Event(event) = next_frame(&mut socket).await {
            turns_ended += usize::from(event.msg.ends_turn());
            events.push(*event);
        }
    }
    let last = events.last().expect("events").sequence;
    assert_eq!(sequences(&events), (1..=last).collect::<Vec<_>>());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_drive_one_session_and_every_watcher_sees_the_same_log() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script(
        "s.jsonl",
        &[&slow_chunks(10, 20), r#"{"text": "second"}"#, r#"{"text": "third"}"#],
    );
    server.api.create(json!({"id": "shared", "model": model})).await;
    let mut watcher = server
        .api
        .stream("shared", crate::suite::support::api::Resume::Start)
        .await;

    // One client over the WebSocket, another over HTTP, while a turn runs.
    let mut socket = connect(&server, "shared", 0).await;
    send(
        &mut socket,
        json!({"op": {"type": "user_input", "text": "from the socket"}}),
    )
    .await;
    let posted = server.api.say("shared", "from HTTP").await;
    assert!(posted["submission_id"].is_string(), "{posted}");
    let mut over_socket = Vec::new();
    let mut user_messages = 0;
    while user_messages < 2
        || over_socket
            .last()
            .is_none_or(|event: &RecordedEvent| !event.msg.ends_turn())
    {
        if let Frame::Event(event) = next_frame(&mut socket).await {
            user_messages += usize::from(event.msg.kind() == "user_message");
            over_socket.push(*event);
        }
    }
    let last = over_socket.last().expect("events").sequence;
    let mut watched = Vec::new();
    while watched.last().is_none_or(|event: &RecordedEvent| event.sequence < last) {
        watched.push(watcher.next().await.expect("the watcher's stream goes on"));
    }
    assert_eq!(watched, over_socket, "both see one log, event for event");
    assert_eq!(sequences(&watched), (1..=last).collect::<Vec<_>>());
    let texts: Vec<String> = watched
        .iter()
        .filter_map(|event| match &event.msg {
            keel::protocol::EventMsg::UserMessage(message) => Some(message.text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts.contains(&"from the socket".to_owned()) && texts.contains(&"from HTTP".to_owned()));
    server.stop().await;
}
