//! The audit trail through a real `keel serve`: every stored submission
//! records who sent it (`submitted_by`) and every approval decision who
//! decided (`decided_by`), over HTTP and over the WebSocket, and `keel
//! events` shows them.

use std::process::Command;

use futures::{SinkExt, StreamExt};
use keel::protocol::{Actor, ActorKind, EventMsg, RecordedEvent};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::suite::support::api::Resume;
use crate::suite::support::server::{Scratch, ServeProcess};
use crate::suite::support::wait::guard;

/// Every event of `session_id`, read over the API.
async fn logged(server: &ServeProcess, session_id: &str) -> Vec<RecordedEvent> {
    let reply = server
        .api
        .get(&format!("/v1/sessions/{session_id}/events?limit=1000"))
        .await;
    serde_json::from_value(reply.body["events"].clone()).expect("events")
}

/// Sends `frame` over a WebSocket of `session_id` and returns the reply.
async fn over_websocket(server: &ServeProcess, session_id: &str, frame: Value) -> Value {
    let url = format!(
        "{}/v1/sessions/{session_id}/ws?after=0",
        server.api.base.replacen("http", "ws", 1)
    );
    let (mut socket, _) = guard("WebSocket connect", tokio_tungstenite::connect_async(url))
        .await
        .expect("connect");
    socket.send(Message::text(frame.to_string())).await.expect("send");
    loop {
        let message = guard("a frame", socket.next()).await.expect("open").expect("a frame");
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(text.as_str()).expect("JSON");
            if value.get("type").is_some() {
                return value;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_and_approvals_record_their_principal_and_keel_events_shows_it() {
    let scratch = Scratch::new();
    let call = json!({"tool_calls": [{"id": "call-1", "name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]});
    let model = scratch.script(
        "s.jsonl",
        &[&call.to_string(), r#"{"text": "written"}"#, r#"{"text": "again"}"#],
    );
    let server = ServeProcess::start(&scratch, &[]);
    server
        .api
        .create(json!({"id": "audited", "model": model, "tools": {"shell": false}, "approvals": {"default": "ask"}}))
        .await;
    let mut stream = server.api.stream("audited", Resume::Start).await;
    server.api.say("audited", "write it").await;
    stream.until(|event| event.msg.kind() == "approval_requested").await;
    let decision = json!({"op": {"type": "approval", "call_id": "call-1", "decision": "approve"}, "request_id": "d"});
    let reply = over_websocket(&server, "audited", decision).await;
    assert_eq!(reply["type"], "submission_accepted", "{reply}");
    stream.until(|event| event.msg.kind() == "turn_complete").await;
    let message = json!({"op": {"type": "user_input", "text": "and again"}, "request_id": "m"});
    let reply = over_websocket(&server, "audited", message).await;
    assert_eq!(reply["type"], "submission_accepted", "{reply}");
    stream.until(|event| event.msg.kind() == "turn_complete").await;

    let operator = Actor::operator("default");
    let events = logged(&server, "audited").await;
    let queued: Vec<Option<Actor>> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::SubmissionQueued(queued) => Some(queued.submitted_by.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        queued,
        [Some(operator.clone()), Some(operator.clone())],
        "the POST and the WebSocket's"
    );
    let decided: Vec<Option<Actor>> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ApprovalDecided(decided) => Some(decided.decided_by.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(decided, [Some(operator.clone())]);
    assert_eq!(operator.kind, ActorKind::Operator);
    drop(stream);
    let (status, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("terminate");
    assert!(status.success(), "{status}");

    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["events", "--session", "audited", "--db"])
        .arg(scratch.db())
        .env_remove("KEEL_MODEL")
        .output()
        .expect("keel events");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines = |kind: &str| printed.lines().filter(|line| line.contains(kind)).collect::<Vec<_>>();
    let queued = lines("submission_queued");
    assert_eq!(queued.len(), 2, "{printed}");
    assert!(
        queued.iter().all(|line| line.ends_with("by=default/operator:operator")),
        "{printed}"
    );
    let decided = lines("approval_decided");
    assert_eq!(decided.len(), 1, "{printed}");
    assert!(
        decided[0].ends_with("call=call-1 decision=approve by=default/operator:operator"),
        "{printed}"
    );
}
