//! Whole turns through each provider adapter, over real HTTP on loopback, in
//! which one model step asks for three tool calls at once, streamed in the
//! provider's own wire format with the arguments in pieces: a read that runs
//! without asking, a write that waits for the user's approval, and a read of
//! a missing file that fails. The runtime waits for the decision before any
//! call runs, runs the calls one after the other in call order (a write is
//! not parallel safe), and sends the three calls and their three results
//! back in the provider's format; the model then answers and the turn ends.

use std::sync::Arc;
use std::time::Duration;

use keel::model::ToolCall;
use keel::protocol::{ApprovalDecision, TokenUsage, TranscriptItem};
use keel::provider::ProviderSettings;
use keel::provider::anthropic::Anthropic;
use keel::provider::http::{RetryPolicy, Secret};
use keel::provider::openai_chat::OpenAiChat;
use keel::provider::openai_responses::OpenAiResponses;
use keel::store::SqliteCheckpoint;
use keel::tools::workspace::{self, WorkspaceToolsConfig};
use keel::tools::{ApprovalRules, ToolSet};
use keel::{Agent, CheckpointStore, EventMsg, Model, Op, RecordedEvent};
use serde_json::{Value, json};

use crate::suite::support::http_server::{Reply, Request, ScriptedServer};
use crate::suite::support::provider::{token_usages, usage};
use crate::suite::support::{agent::*, events::*, model::*, store::*, wait::*};

const SESSION: &str = "provider-tool-turns";
const INSTRUCTIONS: &str = "You work on the files of the workspace.";
const PROMPT: &str = "Read notes.txt, write out.txt, then look at missing.txt.";

/// What `notes.txt` holds; the test writes it before the turn.
const NOTES: &str = "buy milk\ncall Ada\n";
/// What the model asks `write_file` to put in `out.txt`.
const OUT: &str = "Milk bought.\nAda called.\n";

/// The arguments of the three calls, as the model writes them.
const READ_NOTES: &str = r#"{"path": "notes.txt"}"#;
const WRITE_OUT: &str = r#"{"path": "out.txt", "content": "Milk bought.\nAda called.\n"}"#;
const READ_MISSING: &str = r#"{"path": "missing.txt"}"#;

/// The result of a call the user denied.
const DENIED: &str = "denied by user: the user did not allow this tool call";

/// The second step's answer, in its two deltas.
const ANSWER: [&str; 2] = ["All ", "done."];

/// The workspace tools the model is offered, as the API lists them (sorted
/// by name).
const TOOL_NAMES: [&str; 5] = ["edit_file", "list_dir", "read_file", "search", "write_file"];

// The three calls and the turn around them.

/// The three calls of the first step, with the provider's call ids.
fn three_calls(ids: [&str; 3]) -> Vec<ToolCall> {
    [
        ("read_file", READ_NOTES),
        ("write_file", WRITE_OUT),
        ("read_file", READ_MISSING),
    ]
    .into_iter()
    .zip(ids)
    .map(|((name, arguments), id)| ToolCall {
        call_id: id.to_owned(),
        name: name.to_owned(),
        arguments: arguments.to_owned(),
    })
    .collect()
}

/// `text` in three pieces, cut at character boundaries, as a provider
/// streams arguments.
fn pieces(text: &str) -> Vec<String> {
    let cuts: Vec<usize> = [text.len() / 3, 2 * text.len() / 3]
        .into_iter()
        .map(|mut cut| {
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            cut
        })
        .collect();
    let pieces = vec![
        text[..cuts[0]].to_owned(),
        text[cuts[0]..cuts[1]].to_owned(),
        text[cuts[1]..].to_owned(),
    ];
    assert!(pieces.iter().all(|piece| !piece.is_empty()), "{pieces:?}");
    pieces
}

/// A streamed body sent in small chunks, so chunk ends fall mid-event.
fn split(body: &str) -> Reply {
    Reply::sse_in_pieces(body.as_bytes(), 23)
}

fn workspace_tools() -> ToolSet {
    let mut set = ToolSet::new();
    for tool in workspace::tools(WorkspaceToolsConfig {
        write: true,
        shell: None,
    }) {
        set.add(tool);
    }
    set
}

/// An agent on `model` with the workspace tools, the default approval rules
/// (reading tools run, the others ask) and per-delta streaming; its
/// `session_started` is already read.
async fn agent_on(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: Arc<dyn Model>) -> Agent {
    let mut config = session_config(db, SESSION, store, model);
    config.tools = workspace_tools();
    config.approvals = ApprovalRules::default();
    config.instructions = Some(INSTRUCTIONS.to_owned());
    config.streaming = keel::agent::StreamingOptions::per_delta();
    start_session(config).await
}

/// A finished turn.
struct ToolTurn {
    db: TestDb,
    store: Arc<SqliteCheckpoint>,
    /// Every event of the turn, `turn_started` to its end.
    events: Vec<RecordedEvent>,
    /// The id of the approval op's submission.
    decision_id: String,
    requests: Vec<Request>,
}

/// Writes `notes.txt`, asks for the turn, waits for the write's approval
/// request, checks that nothing ran before it, answers with `decision` and
/// reads the turn to its end.
async fn run_turn(
    server: &ScriptedServer,
    model: Arc<dyn Model>,
    calls: &[ToolCall],
    decision: ApprovalDecision,
) -> ToolTurn {
    let db = TestDb::new();
    std::fs::write(db.workspace().join("notes.txt"), NOTES).expect("write notes.txt");
    let store = db.open();
    let mut agent = agent_on(&db, &store, model).await;
    agent.sender().submit(user(PROMPT)).expect("submit");
    let mut events = read_until(&mut agent, |event| {
        event.msg.kind() == "approval_requested" || event.msg.ends_turn()
    })
    .await;
    let Some(EventMsg::ApprovalRequested(asked)) = events.last().map(|event| &event.msg) else {
        panic!("expected an approval request, got {:?}", kinds(&events))
    };
    assert_eq!(
        (asked.call_id.as_str(), asked.name.as_str(), asked.arguments.as_str()),
        (calls[1].call_id.as_str(), "write_file", WRITE_OUT),
        "only the write asks"
    );
    assert_eq!(
        kinds(&events)
            .iter()
            .filter(|kind| **kind == "approval_requested")
            .count(),
        1
    );
    // While the write waits, nothing runs, not even the reads.
    assert!(!kinds(&events).contains(&"tool_call_started"), "{:?}", kinds(&events));
    assert!(!db.workspace().join("out.txt").exists());
    assert_eq!(server.requests().len(), 1);

    let decided = agent
        .sender()
        .submit(Op::Approval {
            call_id: calls[1].call_id.clone(),
            decision,
        })
        .expect("decide");
    events.extend(read_turn(&mut agent).await);
    shutdown(agent).await;
    ToolTurn {
        db,
        store,
        events,
        decision_id: decided.id,
        requests: server.requests(),
    }
}

/// The `tool_call_started` events: (call id, name, arguments).
fn started(events: &[RecordedEvent]) -> Vec<(String, String, String)> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ToolCallStarted(call) => Some((call.call_id.clone(), call.name.clone(), call.arguments.clone())),
            _ => None,
        })
        .collect()
}

/// The `tool_call_completed` events: (call id, output, is_error).
fn completed(events: &[RecordedEvent]) -> Vec<(String, String, bool)> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(done) => Some((done.call_id.clone(), done.output.clone(), done.is_error)),
            _ => None,
        })
        .collect()
}

/// Checks the decision, the calls and their results (read notes, `decision`
/// for the write, missing file) and `out.txt`; returns the three results as
/// the transcript holds them.
fn check_calls(turn: &ToolTurn, calls: &[ToolCall], decision: ApprovalDecision) -> Vec<TranscriptItem> {
    let decided = turn
        .events
        .iter()
        .find(|event| event.msg.kind() == "approval_decided")
        .expect("an approval_decided event");
    let EventMsg::ApprovalDecided(decided_msg) = &decided.msg else {
        unreachable!()
    };
    assert_eq!(
        (decided_msg.call_id.as_str(), decided_msg.decision),
        (calls[1].call_id.as_str(), decision)
    );
    assert_eq!(decided.submission_id.as_deref(), Some(turn.decision_id.as_str()));

    let expected_started: Vec<(String, String, String)> = calls
        .iter()
        .map(|call| (call.call_id.clone(), call.name.clone(), call.arguments.clone()))
        .collect();
    assert_eq!(
        started(&turn.events),
        expected_started,
        "every call starts, in call order"
    );

    let results = completed(&turn.events);
    let ids: Vec<&str> = results.iter().map(|(id, _, _)| id.as_str()).collect();
    let call_ids: Vec<&str> = calls.iter().map(|call| call.call_id.as_str()).collect();
    assert_eq!(ids, call_ids, "results in call order");

    let (_, notes, notes_failed) = &results[0];
    assert!(!notes_failed, "{notes}");
    assert!(
        notes.contains("buy milk") && notes.contains("call Ada"),
        "the read gives the notes: {notes}"
    );

    let (_, write, write_failed) = &results[1];
    let out = turn.db.workspace().join("out.txt");
    match decision {
        ApprovalDecision::Deny => {
            assert!(write_failed, "{write}");
            assert_eq!(write, DENIED);
            assert!(!out.exists(), "a denied write writes nothing");
        }
        _ => {
            assert!(!write_failed, "{write}");
            assert!(write.contains("out.txt"), "{write}");
            assert_eq!(std::fs::read_to_string(&out).expect("out.txt is written"), OUT);
        }
    }

    let (_, missing, missing_failed) = &results[2];
    assert!(missing_failed, "reading a missing file fails: {missing}");
    assert!(
        missing.contains("'missing.txt' does not exist"),
        "the error names the file: {missing}"
    );

    results
        .into_iter()
        .map(|(call_id, output, is_error)| TranscriptItem::ToolResult {
            call_id,
            output,
            is_error,
        })
        .collect()
}

/// The calls as transcript items.
fn call_items(calls: &[ToolCall]) -> Vec<TranscriptItem> {
    calls
        .iter()
        .map(|call| TranscriptItem::ToolCall {
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        })
        .collect()
}

/// The output of a transcript's `ToolResult`.
/// A result's text as protocols without an error flag (Chat Completions,
/// Responses) send it: a failed call says so in words.
fn flagged_output_of(result: &TranscriptItem) -> String {
    match result {
        TranscriptItem::ToolResult {
            output, is_error: true, ..
        } => format!("Error: {output}"),
        other => output_of(other).to_owned(),
    }
}

fn output_of(result: &TranscriptItem) -> &str {
    match result {
        TranscriptItem::ToolResult { output, .. } => output,
        other => panic!("expected a tool result, got {other:?}"),
    }
}

/// Checks what the store holds after the turn: the history, in order.
async fn check_transcript(turn: &ToolTurn, expected: Vec<TranscriptItem>) {
    let state = guard("load the session", turn.store.load(SESSION))
        .await
        .expect("load")
        .expect("the session exists");
    assert_eq!(state.transcript, expected);
    assert!(state.execution.is_none(), "the turn is closed");
}

/// Checks the two requests' method, path and offered tools (whose names
/// `names` finds in the body).
fn check_requests(turn: &ToolTurn, path: &str, names: impl Fn(&Value) -> Vec<String>) {
    assert_eq!(turn.requests.len(), 2, "one request per model step");
    for request in &turn.requests {
        assert_eq!((request.method.as_str(), request.path.as_str()), ("POST", path));
        assert_eq!(names(&request.json()), TOOL_NAMES);
    }
}

/// Checks the two steps' token usage and the session totals.
fn check_usage(events: &[RecordedEvent], first: TokenUsage, second: TokenUsage) {
    let mut total = first;
    total.add(&second);
    assert_eq!(token_usages(events), [(1, first, first), (2, second, total)]);
}

fn settings(provider: &str, model: &str, base_url: String) -> ProviderSettings {
    let mut settings = ProviderSettings::new(provider, model, base_url);
    settings.api_key = Some(Secret::new("sk-test-tool-turns"));
    settings.http.retry = RetryPolicy {
        max_retries: 0,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        max_retry_after: Duration::from_secs(1),
    };
    settings
}

// OpenAI Chat Completions: `data:` chunks whose deltas carry `tool_calls`
// by index (id and name first, then the arguments in pieces), then
// `finish_reason: tool_calls`, a usage chunk and `[DONE]`.

fn chat_chunk(choices: Value, usage: Value) -> String {
    let chunk = json!({
        "id": "chatcmpl-ToolTurns",
        "object": "chat.completion.chunk",
        "created": 1_767_225_600,
        "model": "gpt-4.1-mini-2025-04-14",
        "system_fingerprint": "fp_test",
        "choices": choices,
        "usage": usage,
    });
    format!("data: {chunk}\n\n")
}

fn chat_delta(delta: Value) -> String {
    chat_chunk(
        json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]),
        Value::Null,
    )
}

fn chat_finish(reason: &str, input: u64, output: u64) -> String {
    chat_chunk(
        json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason}]),
        Value::Null,
    ) + &chat_chunk(
        json!([]),
        json!({"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}),
    ) + "data: [DONE]\n\n"
}

fn chat_three_calls(calls: &[ToolCall]) -> Reply {
    let mut body = chat_delta(json!({"role": "assistant", "content": null, "refusal": null}));
    for (index, call) in calls.iter().enumerate() {
        body += &chat_delta(json!({"tool_calls": [{
            "index": index, "id": call.call_id, "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]}));
        for piece in pieces(&call.arguments) {
            body += &chat_delta(json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}));
        }
    }
    split(&(body + &chat_finish("tool_calls", 420, 96)))
}

fn chat_answer() -> Reply {
    let mut body = chat_delta(json!({"role": "assistant", "content": ""}));
    for piece in ANSWER {
        body += &chat_delta(json!({"content": piece}));
    }
    split(&(body + &chat_finish("stop", 610, 4)))
}

fn chat_calls() -> Vec<ToolCall> {
    three_calls(["call_R3adN0tes1", "call_Wr1teOut2", "call_R3adM1ss3"])
}

fn chat_model(server: &ScriptedServer) -> Arc<dyn Model> {
    let settings = settings("openai", "gpt-4.1-mini", server.url() + "/v1");
    Arc::new(OpenAiChat::new(settings).expect("build the adapter"))
}

/// The second request's messages: one assistant message with the three
/// calls, then one `tool` message per result, in call order.
fn chat_messages_after(calls: &[ToolCall], results: &[TranscriptItem]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|call| json!({"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}))
        .collect();
    let mut messages = vec![
        json!({"role": "system", "content": INSTRUCTIONS}),
        json!({"role": "user", "content": PROMPT}),
        json!({"role": "assistant", "content": "", "tool_calls": tool_calls}),
    ];
    for (call, result) in calls.iter().zip(results) {
        messages.push(json!({"role": "tool", "tool_call_id": call.call_id, "content": flagged_output_of(result)}));
    }
    Value::Array(messages)
}

fn chat_tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|tool| tool["function"]["name"].as_str().expect("a name").to_owned())
        .collect()
}

/// The events of an approved three-call turn from a provider that streams
/// no text before its tool calls: the calls run one at a time (the approved
/// write is not parallel-safe), each result recorded before the next starts.
const APPROVED_TURN: [&str; 18] = [
    "turn_started",
    "user_message",
    "model_step_started",
    "token_usage",
    "approval_requested",
    "approval_decided",
    "tool_call_started",
    "tool_call_completed",
    "tool_call_started",
    "tool_call_completed",
    "tool_call_started",
    "tool_call_completed",
    "model_step_started",
    "assistant_content_delta",
    "assistant_content_delta",
    "assistant_message",
    "token_usage",
    "turn_complete",
];

#[tokio::test]
async fn openai_chat_three_calls_in_one_step_read_wait_for_the_approved_write_and_fail_in_call_order() {
    let calls = chat_calls();
    let server = ScriptedServer::start(vec![chat_three_calls(&calls), chat_answer()]).await;
    let turn = run_turn(&server, chat_model(&server), &calls, ApprovalDecision::Approve).await;

    assert_eq!(kinds(&turn.events), APPROVED_TURN);
    let results = check_calls(&turn, &calls, ApprovalDecision::Approve);
    assert_eq!(deltas(&turn.events), ANSWER);
    assert_eq!(assistant_text(&turn.events), "All done.");
    check_usage(&turn.events, usage(420, 0, 96), usage(610, 0, 4));

    check_requests(&turn, "/v1/chat/completions", chat_tool_names);
    assert_eq!(
        turn.requests[0].json()["messages"],
        json!([{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": PROMPT}])
    );
    assert_eq!(
        turn.requests[1].json()["messages"],
        chat_messages_after(&calls, &results)
    );

    let mut transcript = vec![user_item(PROMPT)];
    transcript.extend(call_items(&calls));
    transcript.extend(results);
    transcript.push(assistant_item("All done.", false));
    check_transcript(&turn, transcript).await;
}

#[tokio::test]
async fn openai_chat_a_denied_write_is_answered_denied_the_reads_still_run_and_the_turn_goes_on() {
    let calls = chat_calls();
    let server = ScriptedServer::start(vec![chat_three_calls(&calls), chat_answer()]).await;
    let turn = run_turn(&server, chat_model(&server), &calls, ApprovalDecision::Deny).await;

    // With the write refused, the calls left to run are two reads, which are
    // parallel safe: all three start (the refusal is answered without
    // running), then their results are recorded in call order.
    assert_eq!(
        kinds(&turn.events),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "token_usage",
            "approval_requested",
            "approval_decided",
            "tool_call_started",
            "tool_call_started",
            "tool_call_started",
            "tool_call_completed",
            "tool_call_completed",
            "tool_call_completed",
            "model_step_started",
            "assistant_content_delta",
            "assistant_content_delta",
            "assistant_message",
            "token_usage",
            "turn_complete",
        ]
    );
    let results = check_calls(&turn, &calls, ApprovalDecision::Deny);
    assert_eq!(assistant_text(&turn.events), "All done.");

    // The model is told about the denial, in its place among the results.
    check_requests(&turn, "/v1/chat/completions", chat_tool_names);
    let messages = chat_messages_after(&calls, &results);
    assert_eq!(messages[4]["content"], format!("Error: {DENIED}"));
    assert_eq!(turn.requests[1].json()["messages"], messages);

    let mut transcript = vec![user_item(PROMPT)];
    transcript.extend(call_items(&calls));
    transcript.extend(results);
    transcript.push(assistant_item("All done.", false));
    check_transcript(&turn, transcript).await;
}

// OpenAI Responses: named semantic events. Each function call is an output
// item (`response.output_item.added`), its arguments come in
// `response.function_call_arguments.delta` events and are repeated whole by
// `.done` and `response.output_item.done`; `response.completed` closes the
// stream with the usage.

/// A `response` object as the stream events carry it.
fn response_object(id: &str, status: &str, output: Value, usage: Value) -> Value {
    json!({
        "id": id,
        "object": "response",
        "created_at": 1_754_000_000,
        "status": status,
        "error": null,
        "incomplete_details": null,
        "instructions": INSTRUCTIONS,
        "model": "gpt-4.1-mini-2025-04-14",
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "store": false,
        "tool_choice": "auto",
        "usage": usage,
    })
}

/// The events of a stream, numbered in order.
struct ResponseStream {
    body: String,
    sequence: u64,
}

impl ResponseStream {
    fn new() -> Self {
        Self {
            body: String::new(),
            sequence: 0,
        }
    }

    fn event(&mut self, name: &str, mut data: Value) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.body += &format!("event: {name}\ndata: {data}\n\n");
    }

    /// `response.created` and `response.in_progress`.
    fn open(&mut self, id: &str) {
        for name in ["response.created", "response.in_progress"] {
            self.event(
                name,
                json!({"response": response_object(id, "in_progress", json!([]), Value::Null)}),
            );
        }
    }

    /// `response.completed` with `output` and the usage.
    fn complete(mut self, id: &str, output: Vec<Value>, input: u64, cached: u64, out: u64) -> Reply {
        let usage = json!({
            "input_tokens": input,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + out,
        });
        self.event(
            "response.completed",
            json!({"response": response_object(id, "completed", Value::Array(output), usage)}),
        );
        split(&self.body)
    }
}

fn responses_three_calls(calls: &[ToolCall]) -> Reply {
    let response = "resp_ToolTurns0001";
    let mut stream = ResponseStream::new();
    stream.open(response);
    let mut output = Vec::new();
    for (index, call) in calls.iter().enumerate() {
        let item_id = format!("fc_ToolTurns{index}");
        let item = |status: &str, arguments: &str| {
            json!({
                "id": item_id, "type": "function_call", "status": status,
                "arguments": arguments, "call_id": call.call_id, "name": call.name,
            })
        };
        stream.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item("in_progress", "")}),
        );
        for piece in pieces(&call.arguments) {
            stream.event(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": piece}),
            );
        }
        stream.event(
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": index, "name": call.name, "arguments": call.arguments}),
        );
        let done = item("completed", &call.arguments);
        stream.event(
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        );
        output.push(done);
    }
    stream.complete(response, output, 512, 0, 88)
}

fn responses_answer() -> Reply {
    let response = "resp_ToolTurns0002";
    let item_id = "msg_ToolTurns0002";
    let text = ANSWER.concat();
    let part = |text: &str| json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text});
    let message = |status: &str, content: Value| json!({"id": item_id, "type": "message", "status": status, "content": content, "role": "assistant"});
    let mut stream = ResponseStream::new();
    stream.open(response);
    stream.event(
        "response.output_item.added",
        json!({"output_index": 0, "item": message("in_progress", json!([]))}),
    );
    stream.event(
        "response.content_part.added",
        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part("")}),
    );
    for delta in ANSWER {
        stream.event(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "delta": delta, "logprobs": []}),
        );
    }
    stream.event(
        "response.output_text.done",
        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
    );
    stream.event(
        "response.content_part.done",
        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part(&text)}),
    );
    let done = message("completed", json!([part(&text)]));
    stream.event("response.output_item.done", json!({"output_index": 0, "item": done}));
    stream.complete(response, vec![done], 700, 512, 5)
}

#[tokio::test]
async fn openai_responses_three_calls_in_one_step_read_wait_for_the_approved_write_and_fail_in_call_order() {
    let calls = three_calls([
        "call_pRsN7wQ1kT2xY3zA4bC5dE6f",
        "call_tKyO8mL9nB0vC1xZ2aS3dF4g",
        "call_Ck1Lm2Nn3Oo4Pp5Qq6Rr7Ss8",
    ]);
    let server = ScriptedServer::start(vec![responses_three_calls(&calls), responses_answer()]).await;
    let settings = settings("openai", "gpt-4.1-mini", server.url() + "/v1");
    let model = Arc::new(OpenAiResponses::new(settings).expect("build the adapter"));
    let turn = run_turn(&server, model, &calls, ApprovalDecision::Approve).await;

    assert_eq!(kinds(&turn.events), APPROVED_TURN);
    let results = check_calls(&turn, &calls, ApprovalDecision::Approve);
    assert_eq!(deltas(&turn.events), ANSWER);
    assert_eq!(assistant_text(&turn.events), "All done.");
    check_usage(&turn.events, usage(512, 0, 88), usage(700, 512, 5));

    check_requests(&turn, "/v1/responses", |body| {
        body["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .map(|tool| tool["name"].as_str().expect("a name").to_owned())
            .collect()
    });
    let question = json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]});
    assert_eq!(turn.requests[0].json()["input"], json!([question]));
    // The calls as `function_call` items, then their outputs as
    // `function_call_output` items tied by `call_id`, in call order.
    let mut input = vec![question];
    for call in &calls {
        input.push(json!({
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
            "id": format!("fc_{}", call.call_id.trim_start_matches("call_")),
            "status": "completed",
        }));
    }
    for (call, result) in calls.iter().zip(&results) {
        input.push(
            json!({"type": "function_call_output", "call_id": call.call_id, "output": flagged_output_of(result)}),
        );
    }
    assert_eq!(turn.requests[1].json()["input"], Value::Array(input));
    for request in &turn.requests {
        assert_eq!(request.json()["instructions"], INSTRUCTIONS);
        assert_eq!(
            request.json()["store"],
            false,
            "stateless: the whole history every time"
        );
    }

    let mut transcript = vec![user_item(PROMPT)];
    transcript.extend(call_items(&calls));
    transcript.extend(results);
    transcript.push(assistant_item("All done.", false));
    check_transcript(&turn, transcript).await;
}

// Anthropic Messages: `message_start`, then content blocks (a text block,
// then one `tool_use` block per call whose input streams as
// `input_json_delta` pieces), `ping`s anywhere, `message_delta` with
// `stop_reason: tool_use` and the output tokens, `message_stop`.

fn anthropic_event(name: &str, mut data: Value) -> String {
    data["type"] = json!(name);
    format!("event: {name}\ndata: {data}\n\n")
}

fn anthropic_start(id: &str, input: u64, cache_read: u64) -> String {
    anthropic_event(
        "message_start",
        json!({"message": {
            "id": id, "type": "message", "role": "assistant", "content": [],
            "model": "claude-sonnet-4-5-20250929", "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": cache_read, "output_tokens": 1},
        }}),
    )
}

fn anthropic_text_block(index: usize, deltas: &[&str]) -> String {
    let mut body = anthropic_event(
        "content_block_start",
        json!({"index": index, "content_block": {"type": "text", "text": ""}}),
    );
    for text in deltas {
        body += &anthropic_event(
            "content_block_delta",
            json!({"index": index, "delta": {"type": "text_delta", "text": text}}),
        );
    }
    body + &anthropic_event("content_block_stop", json!({"index": index}))
}

fn anthropic_end(stop_reason: &str, output: u64) -> String {
    anthropic_event(
        "message_delta",
        json!({"delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": output}}),
    ) + &anthropic_event("message_stop", json!({}))
}

/// What Claude says before the calls, in its two deltas.
const PRELUDE: [&str; 2] = ["I'll read the notes, ", "write the file and check the other."];

fn anthropic_three_calls(calls: &[ToolCall]) -> Reply {
    let mut body = anthropic_start("msg_01ToolTurnsStepOne", 900, 0);
    body += &anthropic_text_block(0, &PRELUDE);
    for (offset, call) in calls.iter().enumerate() {
        let index = offset + 1;
        body += &anthropic_event(
            "content_block_start",
            json!({"index": index, "content_block": {"type": "tool_use", "id": call.call_id, "name": call.name, "input": {}}}),
        );
        let mut partial = vec![String::new()];
        partial.extend(pieces(&call.arguments));
        for (n, piece) in partial.into_iter().enumerate() {
            body += &anthropic_event(
                "content_block_delta",
                json!({"index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}),
            );
            if n == 1 {
                body += &anthropic_event("ping", json!({}));
            }
        }
        body += &anthropic_event("content_block_stop", json!({"index": index}));
    }
    split(&(body + &anthropic_end("tool_use", 140)))
}

fn anthropic_answer() -> Reply {
    let body = anthropic_start("msg_01ToolTurnsStepTwo", 60, 900) + &anthropic_text_block(0, &ANSWER);
    split(&(body + &anthropic_end("end_turn", 6)))
}

#[tokio::test]
async fn anthropic_three_calls_in_one_step_read_wait_for_the_approved_write_and_fail_in_call_order() {
    let calls = three_calls([
        "toolu_01ReadNotesT1x1fJ34qAmk2",
        "toolu_01WriteOutBqS3Rx4vQ8gT2m",
        "toolu_01ReadMissingA09q90qw90l",
    ]);
    let server = ScriptedServer::start(vec![anthropic_three_calls(&calls), anthropic_answer()]).await;
    let settings = settings("anthropic", "claude-sonnet-4-5", server.url());
    let model = Arc::new(Anthropic::new(settings).expect("build the adapter"));
    let turn = run_turn(&server, model, &calls, ApprovalDecision::Approve).await;

    assert_eq!(
        kinds(&turn.events),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "assistant_content_delta",
            "assistant_message",
            "token_usage",
            "approval_requested",
            "approval_decided",
            "tool_call_started",
            "tool_call_completed",
            "tool_call_started",
            "tool_call_completed",
            "tool_call_started",
            "tool_call_completed",
            "model_step_started",
            "assistant_content_delta",
            "assistant_content_delta",
            "assistant_message",
            "token_usage",
            "turn_complete",
        ]
    );
    let results = check_calls(&turn, &calls, ApprovalDecision::Approve);
    let all_deltas: Vec<&str> = PRELUDE.iter().chain(&ANSWER).copied().collect();
    assert_eq!(deltas(&turn.events), all_deltas);
    let prelude = PRELUDE.concat();
    assert_eq!(assistant_text(&turn.events), prelude, "the first step's text");
    let messages: Vec<&str> = turn
        .events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantMessage(message) => Some(message.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(messages, [prelude.as_str(), "All done."]);
    // The prompt counts the cached tokens as well.
    check_usage(&turn.events, usage(900, 0, 140), usage(960, 900, 6));

    check_requests(&turn, "/v1/messages", |body| {
        body["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .map(|tool| tool["name"].as_str().expect("a name").to_owned())
            .collect()
    });
    let question = json!({"role": "user", "content": [{"type": "text", "text": PROMPT}]});
    // The end of the history is the prompt cache's breakpoint.
    let ephemeral = json!({"type": "ephemeral"});
    let mut marked_question = question.clone();
    marked_question["content"][0]["cache_control"] = ephemeral.clone();
    assert_eq!(turn.requests[0].json()["messages"], json!([marked_question]));
    // One assistant message: the text, then a `tool_use` block per call
    // (its input as JSON); one user message: a `tool_result` per call, in
    // call order, the failed one marked `is_error`.
    let mut assistant = vec![json!({"type": "text", "text": prelude})];
    for call in &calls {
        let input: Value = serde_json::from_str(&call.arguments).expect("JSON arguments");
        assistant.push(json!({"type": "tool_use", "id": call.call_id, "name": call.name, "input": input}));
    }
    let tool_results: Vec<Value> = calls
        .iter()
        .zip(&results)
        .zip([false, false, true])
        .map(|((call, result), is_error)| {
            json!({"type": "tool_result", "tool_use_id": call.call_id, "content": output_of(result), "is_error": is_error})
        })
        .collect();
    let mut tool_results = tool_results;
    if let Some(last) = tool_results.last_mut() {
        last["cache_control"] = ephemeral;
    }
    assert_eq!(
        turn.requests[1].json()["messages"],
        json!([
            question,
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": tool_results},
        ])
    );
    for request in &turn.requests {
        assert_eq!(request.json()["system"][0]["text"], INSTRUCTIONS);
    }

    let mut transcript = vec![user_item(PROMPT), assistant_item(&prelude, false)];
    transcript.extend(call_items(&calls));
    transcript.extend(results);
    transcript.push(assistant_item("All done.", false));
    check_transcript(&turn, transcript).await;
}
