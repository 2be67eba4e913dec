use std::cell::Cell;

use serde_json::{Value, json};

use super::*;
use keel_protocol::{Op, RecordedEvent};

/// A log made of `msgs` (each `{"type": ..., ...}`), numbered from 1, every
/// event caused by submission `s1`.
fn log(msgs: Vec<Value>) -> Vec<RecordedEvent> {
    let sequence = Cell::new(0);
    msgs.into_iter()
        .map(|msg| {
            sequence.set(sequence.get() + 1);
            serde_json::from_value(json!({
                "sequence": sequence.get(), "recorded_at_ms": 0, "submission_id": "s1", "msg": msg
            }))
            .expect("an event")
        })
        .collect()
}

fn project(projection: &mut Projection, events: &[RecordedEvent]) -> Vec<Value> {
    events
        .iter()
        .flat_map(|event| projection.push(event))
        .map(|chunk| serde_json::to_value(chunk).expect("json"))
        .collect()
}

fn text_turn() -> Vec<Value> {
    vec![
        json!({"type": "turn_started", "turn_id": "t1"}),
        json!({"type": "user_message", "turn_id": "t1", "text": "hi"}),
        json!({"type": "model_step_started", "turn_id": "t1", "step": 1, "message_id": "t1-1"}),
        json!({"type": "assistant_content_delta", "turn_id": "t1", "delta": "Hel"}),
        json!({"type": "assistant_content_delta", "turn_id": "t1", "delta": "lo"}),
        json!({"type": "assistant_message", "turn_id": "t1", "text": "Hello", "message_id": "t1-1"}),
        json!({"type": "turn_complete", "turn_id": "t1"}),
    ]
}

#[test]
fn a_text_turn_is_one_message_with_one_text_part() {
    let chunks = project(&mut Projection::of_turn("t1"), &log(text_turn()));
    assert_eq!(
        chunks,
        vec![
            json!({"type": "start", "messageId": "t1"}),
            json!({"type": "start-step"}),
            json!({"type": "text-start", "id": "t1-1"}),
            json!({"type": "text-delta", "id": "t1-1", "delta": "Hel"}),
            json!({"type": "text-delta", "id": "t1-1", "delta": "lo"}),
            json!({"type": "text-end", "id": "t1-1"}),
            json!({"type": "finish-step"}),
            json!({"type": "finish", "finishReason": "stop"}),
        ]
    );
}

#[test]
fn a_message_not_streamed_is_sent_once_and_only_what_deltas_missed() {
    let mut msgs = text_turn();
    msgs.remove(4); // the second delta never made the log
    let chunks = project(&mut Projection::of_turn("t1"), &log(msgs));
    let text: String = chunks
        .iter()
        .filter(|chunk| chunk["type"] == "text-delta")
        .map(|chunk| chunk["delta"].as_str().expect("delta"))
        .collect();
    assert_eq!(text, "Hello");
}

#[test]
fn a_submissions_turn_is_found_by_its_events_and_others_are_ignored() {
    let mut msgs = vec![
        json!({"type": "turn_started", "turn_id": "t0"}),
        json!({"type": "assistant_content_delta", "turn_id": "t0", "delta": "old"}),
    ];
    msgs.extend(text_turn());
    let mut events = log(msgs);
    events[0].event.submission_id = Some("s0".into());
    events[1].event.submission_id = Some("s0".into());
    let mut projection = Projection::of_submission("s1");
    let chunks = project(&mut projection, &events);
    assert_eq!(chunks[0], json!({"type": "start", "messageId": "t1"}));
    assert!(!chunks.iter().any(|chunk| chunk["delta"] == "old"));
    assert!(projection.is_finished());
    assert_eq!(projection.turn_id(), Some("t1"));
}

#[test]
fn a_turn_cut_by_a_crash_ends_with_an_error_and_nothing_after() {
    let mut msgs = text_turn();
    msgs.truncate(4);
    msgs.push(
        json!({"type": "turn_aborted", "turn_id": "t1", "reason": "runtime_stopped", "message": "the runtime stopped"}),
    );
    msgs.push(json!({"type": "turn_started", "turn_id": "t2"}));
    let mut projection = Projection::of_turn("t1");
    let chunks = project(&mut projection, &log(msgs));
    assert_eq!(
        chunks[3..],
        [
            json!({"type": "text-delta", "id": "t1-1", "delta": "Hel"}),
            json!({"type": "text-end", "id": "t1-1"}),
            json!({"type": "finish-step"}),
            json!({"type": "error", "errorText": "the runtime stopped"}),
            json!({"type": "finish", "finishReason": "error"}),
        ]
    );
    assert!(projection.is_finished());
}

#[test]
fn an_interrupt_is_an_abort() {
    let mut msgs = text_turn();
    msgs.truncate(3);
    msgs.push(json!({"type": "turn_aborted", "turn_id": "t1", "reason": "interrupted", "message": "interrupted"}));
    let chunks = project(&mut Projection::of_turn("t1"), &log(msgs));
    assert_eq!(chunks.last(), Some(&json!({"type": "abort", "reason": "interrupted"})));
}

#[test]
fn reasoning_is_its_own_part_closed_before_the_text() {
    let msgs = vec![
        json!({"type": "turn_started", "turn_id": "t1"}),
        json!({"type": "model_step_started", "turn_id": "t1", "step": 1, "message_id": "t1-1"}),
        json!({"type": "reasoning_delta", "turn_id": "t1", "delta": "think"}),
        json!({"type": "assistant_content_delta", "turn_id": "t1", "delta": "ok"}),
        json!({"type": "turn_complete", "turn_id": "t1", "length_limited": true}),
    ];
    let chunks = project(&mut Projection::of_turn("t1"), &log(msgs));
    let kinds: Vec<&str> = chunks
        .iter()
        .map(|chunk| chunk["type"].as_str().expect("type"))
        .collect();
    assert_eq!(
        kinds,
        [
            "start",
            "start-step",
            "reasoning-start",
            "reasoning-delta",
            "reasoning-end",
            "text-start",
            "text-delta",
            "text-end",
            "finish-step",
            "finish"
        ]
    );
    assert_eq!(chunks[3]["id"], "t1-1-reasoning");
    assert_eq!(chunks[9]["finishReason"], "length");
}

fn approval_turn() -> Vec<Value> {
    vec![
        json!({"type": "turn_started", "turn_id": "t1"}),
        json!({"type": "model_step_started", "turn_id": "t1", "step": 1, "message_id": "t1-1"}),
        json!({"type": "approval_requested", "turn_id": "t1", "call_id": "c1", "name": "write_file", "arguments": "{\"path\":\"a\"}"}),
        // 4: the wait; then the decision and the rest.
        json!({"type": "approval_decided", "turn_id": "t1", "call_id": "c1", "decision": "approve"}),
        json!({"type": "tool_call_started", "turn_id": "t1", "call_id": "c1", "name": "write_file", "arguments": "{\"path\":\"a\"}"}),
        json!({"type": "tool_call_completed", "turn_id": "t1", "call_id": "c1", "output": "wrote a", "is_error": false}),
        json!({"type": "model_step_started", "turn_id": "t1", "step": 2, "message_id": "t1-2"}),
        json!({"type": "assistant_content_delta", "turn_id": "t1", "delta": "done"}),
        json!({"type": "turn_complete", "turn_id": "t1"}),
    ]
}

#[test]
fn an_approval_pauses_the_message_and_the_decision_continues_it() {
    let events = log(approval_turn());
    let mut projection = Projection::of_turn("t1");
    let mut first = project(&mut projection, &events[..3]);
    assert_eq!(projection.waiting().get("c1"), Some(&Wait::Approval));
    first.extend(
        projection
            .pause()
            .iter()
            .map(|chunk| serde_json::to_value(chunk).expect("json")),
    );
    assert_eq!(
        first[2..],
        [
            json!({"type": "tool-input-available", "toolCallId": "c1", "toolName": "write_file", "input": {"path": "a"}}),
            json!({"type": "tool-approval-request", "approvalId": "c1", "toolCallId": "c1"}),
            json!({"type": "finish-step"}),
            json!({"type": "finish", "finishReason": "tool-calls"}),
        ]
    );
    let second = project(&mut projection, &events[3..]);
    assert_eq!(
        second[..5],
        [
            json!({"type": "start", "messageId": "t1"}),
            json!({"type": "start-step"}),
            json!({"type": "tool-approval-response", "approvalId": "c1", "approved": true}),
            json!({"type": "tool-output-available", "toolCallId": "c1", "output": "wrote a"}),
            json!({"type": "finish-step"}),
        ]
    );
    assert!(projection.waiting().is_empty());
    assert_eq!(projection.answered_at("c1"), Some(4));
    assert_eq!(second.last(), Some(&json!({"type": "finish", "finishReason": "stop"})));
}

#[test]
fn a_denied_call_is_denied_once_and_malformed_arguments_are_text() {
    let mut msgs = approval_turn();
    msgs[2]["arguments"] = json!("{not json");
    msgs[3]["decision"] = json!("deny");
    msgs.remove(4);
    msgs[4] =
        json!({"type": "tool_call_completed", "turn_id": "t1", "call_id": "c1", "output": "denied", "is_error": true});
    let chunks = project(&mut Projection::of_turn("t1"), &log(msgs));
    assert_eq!(chunks[2]["input"], "{not json");
    assert_eq!(
        chunks
            .iter()
            .filter(|chunk| chunk["type"] == "tool-output-denied")
            .count(),
        1
    );
    assert!(!chunks.iter().any(|chunk| chunk["type"] == "tool-output-error"));
}

#[test]
fn a_client_tool_waits_without_output_until_the_client_answers() {
    let msgs = vec![
        json!({"type": "turn_started", "turn_id": "t1"}),
        json!({"type": "model_step_started", "turn_id": "t1", "step": 1, "message_id": "t1-1"}),
        json!({"type": "tool_call_started", "turn_id": "t1", "call_id": "c9", "name": "pick_color", "arguments": "{}"}),
        json!({"type": "client_tool_requested", "turn_id": "t1", "call_id": "c9", "name": "pick_color", "arguments": "{}"}),
        json!({"type": "tool_call_completed", "turn_id": "t1", "call_id": "c9", "output": "blue", "is_error": false}),
    ];
    let events = log(msgs);
    let mut projection = Projection::of_turn("t1");
    let chunks = project(&mut projection, &events[..4]);
    assert_eq!(
        chunks
            .iter()
            .filter(|chunk| chunk["type"] == "tool-input-available")
            .count(),
        1
    );
    assert!(!chunks.iter().any(|chunk| {
        chunk["type"]
            .as_str()
            .is_some_and(|kind| kind.starts_with("tool-output"))
    }));
    assert_eq!(projection.waiting().get("c9"), Some(&Wait::ClientTool));
    project(&mut projection, &events[4..]);
    assert!(projection.waiting().is_empty());
    assert_eq!(projection.answered_at("c9"), Some(5));
}

fn body(messages: Value, trigger: &str) -> Value {
    json!({"id": "chat-1", "messages": messages, "trigger": trigger, "messageId": null, "extra": 1})
}

#[test]
fn the_trailing_user_message_is_the_submission_keyed_by_its_id() {
    let request = ChatRequest::from_value(body(
        json!([{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]),
        "submit-message",
    ))
    .expect("a request");
    assert_eq!(request.id, "chat-1");
    assert!(request.history().is_empty());
    assert_eq!(
        request.intent(),
        Ok(Intent::UserMessage {
            message_id: "m1".into(),
            text: "Hello\nthere".into()
        })
    );
    let regenerate = ChatRequest::from_value(body(json!([]), "regenerate-message")).expect("a request");
    assert_eq!(regenerate.intent(), Ok(Intent::Regenerate));
}

#[test]
fn bad_bodies_and_parts_are_refused_with_a_reason() {
    let user = |parts: Value| body(json!([{"id": "m1", "role": "user", "parts": parts}]), "submit-message");
    let cases = [
        (json!({"id": "c"}), "missing field"),
        (json!("text"), "invalid type"),
        (body(json!([]), "submit-message"), "empty"),
        (body(json!([]), "resume"), "trigger"),
        (user(json!([{"type": "banana"}])), "unknown type `banana`"),
        (
            user(json!([{"type": "file", "url": "x", "mediaType": "image/png"}])),
            "text parts only",
        ),
        (user(json!([{"type": "text"}])), "no `text`"),
        (user(json!([{"type": "text", "text": "  "}])), "no text"),
        (
            body(json!([{"id": "s", "role": "system", "parts": []}]), "submit-message"),
            "system message",
        ),
        (
            body(
                json!([{"id": "a", "role": "assistant", "parts": [{"type": "tool-x", "toolCallId": "c", "state": "odd"}]}]),
                "submit-message",
            ),
            "unknown state",
        ),
    ];
    for (value, expected) in cases {
        let error = ChatRequest::from_value(value.clone())
            .and_then(|request| request.intent())
            .expect_err("refused");
        assert!(error.to_string().contains(expected), "{value}: {error}");
    }
}

#[test]
fn answers_in_the_last_assistant_message_become_ops_for_waiting_calls_only() {
    let request = ChatRequest::from_value(body(
        json!([
            {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "go"}]},
            {"id": "t1", "role": "assistant", "parts": [
                {"type": "step-start"},
                {"type": "tool-write_file", "toolCallId": "c1", "state": "approval-responded", "input": {}, "approval": {"id": "c1", "approved": true}},
                {"type": "dynamic-tool", "toolName": "pick", "toolCallId": "c2", "state": "output-available", "input": {}, "output": {"color": "blue"}},
                {"type": "tool-old", "toolCallId": "c0", "state": "output-available", "input": {}, "output": "x"},
            ]}
        ]),
        "submit-message",
    ))
    .expect("a request");
    let Ok(Intent::Answers(parts)) = request.intent() else {
        panic!("answers")
    };
    let waiting = [("c1".to_owned(), Wait::Approval), ("c2".to_owned(), Wait::ClientTool)].into();
    let ops = answer_ops(&parts, &waiting, |_| false).expect("ops");
    assert_eq!(
        ops,
        vec![
            (
                Op::Approval {
                    call_id: "c1".into(),
                    decision: keel_protocol::ApprovalDecision::Approve
                },
                "ai-sdk-approval:c1".to_owned()
            ),
            (
                Op::ClientToolResult {
                    call_id: "c2".into(),
                    output: r#"{"color":"blue"}"#.into(),
                    is_error: false
                },
                "ai-sdk-result:c2".to_owned()
            ),
        ]
    );
    // Nothing waits: an approval is refused, unless it was given already.
    let none = std::collections::HashMap::new();
    assert!(matches!(
        answer_ops(&parts, &none, |_| false),
        Err(RequestError::NotWaiting(_))
    ));
    assert_eq!(answer_ops(&parts, &none, |call| call == "c1"), Ok(vec![]));
}
