//! Client tools over the native HTTP API, against a real server: the
//! declaration, the request in the log, the result that completes the turn,
//! and the refusals of bad results.

use keel::protocol::{EventMsg, RecordedEvent};
use serde_json::{Value, json};

use crate::suite::support::api::Resume;
use crate::suite::support::events::{ends_turn, kinds};
use crate::suite::support::server::TestServer;

/// The declaration of one client tool, `pick_color`.
pub(crate) fn pick_color() -> Value {
    json!({
        "name": "pick_color",
        "description": "Asks the user to pick a color.",
        "parameters": {"type": "object", "properties": {"hint": {"type": "string"}}, "required": ["hint"]}
    })
}

/// A scripted model step calling `pick_color` as `call_id`.
pub(crate) fn calls_pick_color(call_id: &str) -> String {
    json!({"tool_calls": [{"id": call_id, "name": "pick_color", "arguments": {"hint": "warm"}}]}).to_string()
}

/// The `client_tool_result` op's body.
pub(crate) fn result(call_id: &str, output: &str) -> Value {
    json!({"op": {"type": "client_tool_result", "call_id": call_id, "output": output, "is_error": false}})
}

/// The `client_tool_requested` event of `events`, if any.
pub(crate) fn requested(events: &[RecordedEvent]) -> Option<&RecordedEvent> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_declaration_is_refused_with_its_code_and_nothing_is_stored() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "hi"}"#]);
    let tool = |name: &str, parameters: Value| json!({"name": name, "parameters": parameters});
    let object = json!({"type": "object"});
    let cases = [
        (json!([tool("has space", object.clone())]), 400, "invalid_client_tool"),
        (
            json!([tool("pick", json!({"type": "string"}))]),
            400,
            "invalid_client_tool",
        ),
        (
            json!([tool(
                "pick",
                json!({"type": "object", "properties": {"q": {"type": 7}}})
            )]),
            400,
            "invalid_client_tool",
        ),
        (json!([tool("shell", object.clone())]), 409, "client_tool_conflict"),
        (json!([tool("read_file", object.clone())]), 409, "client_tool_conflict"),
        (
            json!([tool("pick", object.clone()), tool("pick", object.clone())]),
            409,
            "client_tool_conflict",
        ),
    ];
    for (i, (tools, status, code)) in cases.into_iter().enumerate() {
        let id = format!("bad-{i}");
        let reply = server
            .api
            .post(
                "/v1/sessions",
                &json!({"id": id, "model": model, "client_tools": tools}),
            )
            .await;
        assert_eq!(
            (reply.status.as_u16(), reply.code()),
            (status, code),
            "{tools}: {}",
            reply.body
        );
        assert_eq!(
            server.api.get(&format!("/v1/sessions/{id}")).await.status,
            404,
            "nothing stored"
        );
    }
    // A schema without `type` is an object schema.
    let created = server
        .api
        .create(json!({"id": "typeless", "model": model, "client_tools": [{"name": "pick"}]}))
        .await;
    assert_eq!(created["client_tools"][0]["parameters"]["type"], "object", "{created}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_results_are_refused_with_their_codes_and_patch_waits_for_the_turn() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server
        .scratch
        .script("s.jsonl", &[&calls_pick_color("call-1"), r#"{"text": "red it is"}"#]);
    server
        .api
        .create(json!({"id": "refuser", "model": model, "client_tools": [pick_color()]}))
        .await;
    // Nothing waits yet.
    let early = server.api.submit("refuser", result("call-1", "red")).await;
    assert_eq!(
        (early.status.as_u16(), early.code()),
        (404, "unknown_tool_call"),
        "{}",
        early.body
    );
    let mut stream = server.api.stream("refuser", Resume::Start).await;
    server.api.say("refuser", "pick one").await;
    stream.until(|event| event.msg.kind() == "client_tool_requested").await;

    let big = "x".repeat(keel::protocol::MAX_CLIENT_TOOL_OUTPUT_BYTES + 1);
    let oversize = server.api.submit("refuser", result("call-1", &big)).await;
    assert_eq!(
        (oversize.status.as_u16(), oversize.code()),
        (413, "client_tool_output_too_large"),
        "{}",
        oversize.body
    );
    let unknown = server.api.submit("refuser", result("call-9", "red")).await;
    assert_eq!((unknown.status.as_u16(), unknown.code()), (404, "unknown_tool_call"));
    let busy = server
        .api
        .patch("/v1/sessions/refuser", &json!({"client_tools": []}))
        .await;
    assert_eq!(
        (busy.status.as_u16(), busy.code()),
        (409, "session_busy"),
        "{}",
        busy.body
    );

    let reply = server.api.submit("refuser", result("call-1", "red")).await;
    assert_eq!(reply.status, reqwest::StatusCode::ACCEPTED, "{}", reply.body);
    stream.until(ends_turn).await;
    let again = server.api.submit("refuser", result("call-1", "blue")).await;
    assert_eq!(
        (again.status.as_u16(), again.code()),
        (409, "tool_call_answered"),
        "{}",
        again.body
    );

    // Nothing was stored for the refused results.
    let log = server.api.get("/v1/sessions/refuser/events?limit=1000").await;
    let events: Vec<RecordedEvent> = serde_json::from_value(log.body["events"].clone()).expect("events");
    assert!(!kinds(&events).contains(&"submission_rejected"), "{:?}", kinds(&events));
    assert_eq!(
        kinds(&events)
            .iter()
            .filter(|kind| **kind == "tool_call_completed")
            .count(),
        1
    );

    // Between turns the list is replaced.
    let bad = server
        .api
        .patch("/v1/sessions/refuser", &json!({"client_tools": [{"name": "shell"}]}))
        .await;
    assert_eq!((bad.status.as_u16(), bad.code()), (409, "client_tool_conflict"));
    let other = json!({"name": "ask_user", "description": "", "parameters": {"type": "object"}});
    let patched = server
        .api
        .patch("/v1/sessions/refuser", &json!({"client_tools": [other]}))
        .await;
    assert_eq!(patched.status, 200, "{}", patched.body);
    assert_eq!(patched.body["client_tools"], json!([other]));
    assert_eq!(server.api.session("refuser").await["client_tools"], json!([other]));
    server.stop().await;
}
