//! The OpenAI Responses adapter over real HTTP on loopback: the request it
//! sends (the whole history, stateless), the semantic event streams it reads
//! (written from OpenAI's API reference, split anywhere), function calls,
//! reasoning items sent back unchanged, usage, retries, failures mid-stream,
//! incomplete responses, stalls, cuts, interrupts, and whole multi-step
//! turns through the agent.

use std::sync::Arc;
use std::time::Duration;

use keel::agent::{ModelEvent, ModelOutput, ModelRequest};
use keel::model::{RequestParameters, ToolCall, ToolSpec};
use keel::protocol::{AbortReason, TokenUsage, TranscriptItem};
use keel::provider::http::{RetryPolicy, Secret};
use keel::provider::openai_responses::OpenAiResponses;
use keel::provider::{ProviderError, ProviderSettings};
use keel::store::SqliteCheckpoint;
use keel::tools::ToolSet;
use keel::{Agent, CheckpointStore, Error, EventMsg, Model, Op, RecordedEvent};
use serde_json::{Value, json};

use crate::suite::support::http_server::{Part, Reply, Request, ScriptedServer};
use crate::suite::support::{agent::*, events::*, model::*, provider::*, store::*, wait::*};

const SESSION: &str = "openai-responses-session";
const KEY: &str = "sk-test-responses-0123456789abcdef9xyz";
const INSTRUCTIONS: &str = "You are a terse assistant. Use the clock for the time.";

/// A plain answer, multi-byte characters in every delta.
const TEXT: &[u8] = include_bytes!("../fixtures/openai-responses/text.sse");
/// Its deltas, as the fixture sends them.
const TEXT_DELTAS: [&str; 4] = ["Hé", "llo, wörld! 🌍", " Ça va? ", "日本語も。"];
/// A message, then two function calls with arguments in pieces.
const TOOL_CALLS: &[u8] = include_bytes!("../fixtures/openai-responses/tool_calls.sse");
/// A reasoning item (two summary parts, encrypted content), then a `clock` call.
const REASONING_CALL: &[u8] = include_bytes!("../fixtures/openai-responses/reasoning_call.sse");
/// A single `clock` call.
const CLOCK_CALL: &[u8] = include_bytes!("../fixtures/openai-responses/clock_call.sse");
/// The answer after the clock ran.
const ANSWER: &[u8] = include_bytes!("../fixtures/openai-responses/answer.sse");
/// Text, then `response.failed` (server_error).
const FAILED_AFTER_TEXT: &[u8] = include_bytes!("../fixtures/openai-responses/failed_after_text.sse");
/// Text, then an `error` event (server_error).
const ERROR_AFTER_TEXT: &[u8] = include_bytes!("../fixtures/openai-responses/error_after_text.sse");
/// An `error` event (rate_limit_exceeded) before any output.
const ERROR_RATE_LIMITED: &[u8] = include_bytes!("../fixtures/openai-responses/error_rate_limited.sse");
/// Text cut short by `max_output_tokens`: `response.incomplete`.
const INCOMPLETE: &[u8] = include_bytes!("../fixtures/openai-responses/incomplete.sse");
/// OpenAI's error bodies.
const ERROR_401: &str = include_str!("../fixtures/openai-responses/error_401.json");
const ERROR_429: &str = include_str!("../fixtures/openai-responses/error_429.json");
const ERROR_ENCRYPTED_CONTENT: &str = include_str!("../fixtures/openai-responses/error_encrypted_content.json");

// Helpers.

/// Settings for the scripted server: a key, quick retries.
fn settings(server: &ScriptedServer) -> ProviderSettings {
    let mut settings = ProviderSettings::new("openai", "gpt-4.1-mini", server.url() + "/v1");
    settings.api_key = Some(Secret::new(KEY));
    settings.http.retry = RetryPolicy {
        max_retries: 2,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        max_retry_after: Duration::from_secs(5),
    };
    settings
}

fn model(settings: ProviderSettings) -> OpenAiResponses {
    OpenAiResponses::new(settings).expect("build the adapter")
}

/// Calls the model once with `history` (no instructions, no tools);
/// returns the result and everything streamed into the sink.
async fn respond(model: &OpenAiResponses, history: &[TranscriptItem]) -> (keel::Result<ModelOutput>, Vec<ModelEvent>) {
    respond_with(model, ModelRequest::new("session", "turn", history, 0)).await
}

async fn respond_with(
    model: &OpenAiResponses,
    request: ModelRequest<'_>,
) -> (keel::Result<ModelOutput>, Vec<ModelEvent>) {
    call_model(model, request).await
}

fn hello() -> Vec<TranscriptItem> {
    vec![user_item("Say hello")]
}

/// The provider error of a failed call.
fn provider_error(result: keel::Result<ModelOutput>) -> ProviderError {
    match result {
        Err(Error::Provider(error)) => error,
        other => panic!("expected a provider error, got {other:?}"),
    }
}

/// The SSE blocks (events) of a fixture, each without its blank line.
fn blocks(body: &[u8]) -> Vec<String> {
    std::str::from_utf8(body)
        .expect("fixtures are UTF-8")
        .split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

/// The `event:` name of a block.
fn name_of(block: &str) -> &str {
    block
        .lines()
        .find_map(|line| line.strip_prefix("event: "))
        .unwrap_or_default()
}

/// The fixture without the events named in `names`.
fn without(body: &[u8], names: &[&str]) -> Vec<u8> {
    blocks(body)
        .into_iter()
        .filter(|block| !names.contains(&name_of(block)))
        .map(|block| block + "\n\n")
        .collect::<String>()
        .into_bytes()
}

/// The fixture up to and including the `nth` (from 1) event named `name`.
fn through(body: &[u8], name: &str, nth: usize) -> Vec<u8> {
    let mut seen = 0;
    let mut out = String::new();
    for block in blocks(body) {
        out.push_str(&block);
        out.push_str("\n\n");
        if name_of(&block) == name {
            seen += 1;
            if seen == nth {
                return out.into_bytes();
            }
        }
    }
    panic!("the fixture has no {nth}th {name}");
}

/// The data of every event in a fixture, as JSON.
fn fixture_events(body: &[u8]) -> Vec<Value> {
    blocks(body)
        .iter()
        .map(|block| {
            let data = block
                .lines()
                .find_map(|line| line.strip_prefix("data: "))
                .expect("a data line");
            serde_json::from_str(data).expect("fixture data is JSON")
        })
        .collect()
}

/// The finished reasoning item of a fixture, exactly as the API sent it.
fn reasoning_item_of(body: &[u8]) -> Value {
    fixture_events(body)
        .into_iter()
        .find(|event| event["type"] == "response.output_item.done" && event["item"]["type"] == "reasoning")
        .map(|event| event["item"].clone())
        .expect("a reasoning item")
}

/// The `input` of a recorded request.
fn input_of(request: &Request) -> Vec<Value> {
    request.json()["input"].as_array().expect("input is an array").clone()
}

/// Event kinds with runs of streamed deltas collapsed into one, so that
/// assertions do not depend on how the deltas were grouped.
fn squashed(events: &[RecordedEvent]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for kind in kinds(events) {
        let delta = kind == "assistant_content_delta" || kind == "reasoning_delta";
        if !(delta && out.last() == Some(&kind)) {
            out.push(kind);
        }
    }
    out
}

/// An agent on `model` with the built-in tools and instructions, recording
/// every delta as it arrives. Its `session_started` has been read.
async fn start_agent_on(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: OpenAiResponses) -> Agent {
    provider_agent(db, store, SESSION, Arc::new(model), INSTRUCTIONS).await
}

/// The `error` event's message among `events`.
fn error_message(events: &[RecordedEvent]) -> String {
    error_messages(events).first().expect("an error event").to_string()
}

/// The `token_usage` events among `events`: (this step, session total).
fn usages(events: &[RecordedEvent]) -> Vec<(TokenUsage, TokenUsage)> {
    token_usages(events)
        .into_iter()
        .map(|(_, usage, total)| (usage, total))
        .collect()
}

fn usage(input: u64, cached: u64, output: u64, reasoning: u64) -> TokenUsage {
    TokenUsage {
        input_tokens: input,
        cached_input_tokens: cached,
        output_tokens: output,
        reasoning_tokens: reasoning,
    }
}

/// The session's transcript as stored.
async fn stored_transcript(db: &TestDb) -> Vec<TranscriptItem> {
    guard("load", db.open().load(SESSION))
        .await
        .expect("load the session")
        .expect("the session exists")
        .transcript
}

// Plain text.

#[tokio::test]
async fn text_streams_the_same_in_any_split_with_lf_or_crlf_line_ends() {
    let crlf = String::from_utf8(TEXT.to_vec())
        .unwrap()
        .replace('\n', "\r\n")
        .into_bytes();
    for (body, line_ends) in [(TEXT.to_vec(), "LF"), (crlf, "CRLF")] {
        for piece in [1, 5, 64] {
            let server = ScriptedServer::start(vec![Reply::sse_in_pieces(&body, piece)]).await;
            let model = model(settings(&server));
            let (result, events) = respond(&model, &hello()).await;
            let output = result.unwrap_or_else(|error| panic!("{line_ends}, pieces of {piece}: {error}"));

            assert_eq!(text_deltas(&events), TEXT_DELTAS, "{line_ends}, pieces of {piece}");
            assert_eq!(output.text, TEXT_DELTAS.concat());
            assert!(output.tool_calls.is_empty() && output.reasoning.is_empty());
            assert_eq!(output.usage, Some(usage(25, 8, 12, 0)));
            assert_eq!(server.requests().len(), 1);
        }
    }
}

#[tokio::test]
async fn a_text_request_is_a_stateless_streamed_post_with_the_key() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(TEXT, 64)]).await;
    let mut settings = settings(&server);
    settings
        .headers
        .push(("openai-organization".to_owned(), Secret::new("org-keel-test")));
    let model = model(settings);
    assert_eq!(model.name(), "openai:gpt-4.1-mini");
    let (result, _) = respond(&model, &hello()).await;
    let output = result.expect("a response");
    // The response's id and dated model, for the step's span.
    assert_eq!(
        output.response_id.as_deref(),
        Some("resp_68a1b2c3d4e5f60718293a4b5c6d7e8f")
    );
    assert_eq!(output.response_model.as_deref(), Some("gpt-4.1-mini-2025-04-14"));

    let requests = server.requests();
    let request = &requests[0];
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/v1/responses")
    );
    assert_eq!(request.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(request.header("openai-organization"), Some("org-keel-test"));
    assert_eq!(request.header("accept"), Some("text/event-stream"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    // No instructions, no tools, no limits: those keys are left out.
    assert_eq!(
        request.json(),
        json!({
            "model": "gpt-4.1-mini",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello"}]}],
            "stream": true,
            "store": false,
            "include": ["reasoning.encrypted_content"],
        })
    );
}

#[tokio::test]
async fn keep_alive_comments_are_ignored() {
    let body = String::from_utf8(TEXT.to_vec()).unwrap();
    let body = format!(": keep-alive\n\n{}", body.replace("event: ", ": keep-alive\n\nevent: ")) + ": keep-alive\n\n";
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(body.as_bytes(), 7)]).await;
    let (result, events) = respond(&model(settings(&server)), &hello()).await;
    assert_eq!(result.expect("a response").text, TEXT_DELTAS.concat());
    assert_eq!(text_deltas(&events), TEXT_DELTAS);
}

// Function calls.

#[tokio::test]
async fn several_function_calls_in_one_step_are_assembled_from_their_argument_deltas() {
    let expected = vec![
        ToolCall {
            call_id: "call_pRsN7wQ1kT2xY3zA4bC5dE6f".into(),
            name: "clock".into(),
            arguments: r#"{"tz":"Europe/Paris"}"#.into(),
        },
        ToolCall {
            call_id: "call_tKyO8mL9nB0vC1xZ2aS3dF4g".into(),
            name: "clock".into(),
            arguments: r#"{"tz":"Asia/Tokyo"}"#.into(),
        },
    ];
    // As sent, and with only the deltas to go by (no `.done` events that
    // repeat the whole arguments).
    let deltas_only = without(
        TOOL_CALLS,
        &["response.function_call_arguments.done", "response.output_item.done"],
    );
    for body in [TOOL_CALLS.to_vec(), deltas_only] {
        let server = ScriptedServer::start(vec![Reply::sse_in_pieces(&body, 3)]).await;
        let (result, events) = respond(&model(settings(&server)), &hello()).await;
        let output = result.expect("a response");
        assert_eq!(output.tool_calls, expected);
        assert_eq!(output.text, "Let me check both.");
        assert_eq!(text_deltas(&events), ["Let me ", "check both."]);
        assert_eq!(output.usage, Some(usage(310, 0, 58, 0)));
    }
}

#[tokio::test]
async fn a_multi_step_turn_runs_the_clock_and_sends_its_output_back() {
    let db = TestDb::new();
    let store = db.open();
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(CLOCK_CALL, 16),
        Reply::sse_in_pieces(ANSWER, 16),
    ])
    .await;
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    agent.sender().submit(user("What time is it?")).expect("submit");
    let turn = read_turn(&mut agent).await;

    assert_eq!(
        squashed(&turn),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "token_usage",
            "tool_call_started",
            "tool_call_completed",
            "model_step_started",
            "assistant_content_delta",
            "assistant_message",
            "token_usage",
            "turn_complete",
        ]
    );
    assert_eq!(deltas(&turn), ["The clock ", "says it is ", "noon, UTC."]);
    assert_eq!(assistant_text(&turn), "The clock says it is noon, UTC.");
    let (call_id, output) = turn
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(done) => Some((done.call_id.clone(), done.output.clone())),
            _ => None,
        })
        .expect("tool_call_completed");
    assert_eq!(call_id, "call_Ck1Lm2Nn3Oo4Pp5Qq6Rr7Ss8");
    let clock: Value = serde_json::from_str(&output).expect("the clock answers JSON");
    assert!(clock["utc"].is_string(), "{clock}");

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    for request in &requests {
        let body = request.json();
        assert_eq!(body["instructions"], INSTRUCTIONS);
        assert_eq!(body["tools"][0]["name"], "clock");
        assert_eq!(body["tools"][0]["type"], "function");
    }
    assert_eq!(
        input_of(&requests[1]),
        [
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it?"}]}),
            json!({"type": "function_call", "id": "fc_Ck1Lm2Nn3Oo4Pp5Qq6Rr7Ss8", "status": "completed", "call_id": call_id, "name": "clock", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": call_id, "output": output}),
        ]
    );
    shutdown(agent).await;
}

// Reasoning and usage.

#[tokio::test]
async fn reasoning_is_streamed_kept_in_the_history_and_sent_back_unchanged() {
    let db = TestDb::new();
    let store = db.open();
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(REASONING_CALL, 32),
        Reply::sse_in_pieces(ANSWER, 32),
        Reply::sse_in_pieces(TEXT, 32),
    ])
    .await;
    let mut settings = settings(&server);
    settings.model = "o4-mini".to_owned();
    let mut agent = start_agent_on(&db, &store, model(settings)).await;
    agent.sender().submit(user("What time is it?")).expect("submit");
    let turn = read_turn(&mut agent).await;
    assert_eq!(
        squashed(&turn)[..6],
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "reasoning_delta",
            "token_usage",
            "tool_call_started",
        ]
    );
    let reasoning: String = turn
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ReasoningDelta(delta) => Some(delta.delta.as_str()),
            _ => None,
        })
        .collect();
    // Two summary parts, a paragraph apart.
    assert_eq!(
        reasoning,
        "**Checking the time**\n\nThe user wants the current time; I should call the clock tool.\n\n\
         **Answering**\n\nThen I report it in UTC."
    );
    assert_eq!(usages(&turn)[0].0, usage(402, 384, 150, 128));

    // The next step and the next turn both send the item back as it came.
    let item = reasoning_item_of(REASONING_CALL);
    assert!(
        item["encrypted_content"]
            .as_str()
            .is_some_and(|content| content.len() > 40)
    );
    agent.sender().submit(user("Thanks")).expect("submit");
    read_turn(&mut agent).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(input_of(&requests[1])[1], item);
    assert_eq!(input_of(&requests[1])[2]["type"], "function_call");
    assert_eq!(input_of(&requests[2])[1], item);
    assert_eq!(
        input_of(&requests[2]).len(),
        6,
        "user, reasoning, call, output, answer, user"
    );
    shutdown(agent).await;

    assert_eq!(
        stored_transcript(&db).await[1],
        TranscriptItem::Reasoning {
            provider: "openai-responses".to_owned(),
            data: item,
        }
    );
}

#[tokio::test]
async fn usage_is_recorded_per_step_and_summed_in_the_checkpoint() {
    let db = TestDb::new();
    let store = db.open();
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(TEXT, 64), Reply::sse_in_pieces(ANSWER, 64)]).await;
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    agent.sender().submit(user("one")).expect("submit");
    let first = read_turn(&mut agent).await;
    agent.sender().submit(user("two")).expect("submit");
    let second = read_turn(&mut agent).await;
    shutdown(agent).await;

    let total = usage(25 + 180, 8 + 128, 12 + 9, 0);
    assert_eq!(usages(&first), [(usage(25, 8, 12, 0), usage(25, 8, 12, 0))]);
    assert_eq!(usages(&second), [(usage(180, 128, 9, 0), total)]);
    let state = guard("load", db.open().load(SESSION))
        .await
        .expect("load")
        .expect("the session exists");
    assert_eq!(state.checkpoint.usage, total);
}

// The request.

#[tokio::test]
async fn the_request_carries_the_whole_history_instructions_tools_and_limits() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(TEXT, 64)]).await;
    let mut settings = settings(&server);
    settings.max_output_tokens = Some(256);
    settings.temperature = Some(0.25);
    let model = model(settings);
    let reasoning = json!({
        "id": "rs_0123", "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "**Two cities**"}],
        "encrypted_content": "gAAAAABopaque==",
    });
    let history = vec![
        user_item("What time is it in Paris and Tokyo?"),
        TranscriptItem::Reasoning {
            provider: "openai-responses".into(),
            data: reasoning.clone(),
        },
        assistant_item("Let me check both.", false),
        TranscriptItem::ToolCall {
            call_id: "call_a".into(),
            name: "clock".into(),
            arguments: r#"{"tz":"Europe/Paris"}"#.into(),
        },
        TranscriptItem::ToolCall {
            call_id: "call_b".into(),
            name: "lookup".into(),
            arguments: r#"{"city":"Tokyo"}"#.into(),
        },
        TranscriptItem::ToolResult {
            call_id: "call_a".into(),
            output: "12:00".into(),
            is_error: false,
        },
        TranscriptItem::ToolResult {
            call_id: "call_b".into(),
            output: "unknown city".into(),
            is_error: true,
        },
        // Another protocol's reasoning means nothing here.
        TranscriptItem::Reasoning {
            provider: "anthropic".into(),
            data: json!({"type": "thinking", "thinking": "…", "signature": "sig"}),
        },
        assistant_item("Paris: 12:00. Tokyo: I could not tell.", false),
        user_item("Thanks! And London?"),
    ];
    let tools = vec![
        ToolSet::builtin().specs().remove(0),
        ToolSpec {
            name: "lookup".into(),
            description: "Looks a city up.".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        },
    ];
    let mut request = ModelRequest::new("session", "turn", &history, 3);
    request.instructions = Some(INSTRUCTIONS);
    request.tools = &tools;
    let (result, _) = respond_with(&model, request).await;
    result.expect("a response");

    let clock = &tools[0];
    assert_eq!(
        server.requests()[0].json(),
        json!({
            "model": "gpt-4.1-mini",
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it in Paris and Tokyo?"}]},
                reasoning,
                // Replayed output has the shape the API gave it (id, status,
                // annotations), as strict servers (vLLM, Azure) require.
                {"type": "message", "role": "assistant", "id": "msg_keel_2", "status": "completed",
                 "content": [{"type": "output_text", "text": "Let me check both.", "annotations": []}]},
                {"type": "function_call", "id": "fc_a", "status": "completed", "call_id": "call_a", "name": "clock", "arguments": "{\"tz\":\"Europe/Paris\"}"},
                {"type": "function_call", "id": "fc_b", "status": "completed", "call_id": "call_b", "name": "lookup", "arguments": "{\"city\":\"Tokyo\"}"},
                {"type": "function_call_output", "call_id": "call_a", "output": "12:00"},
                // The item has no error flag: the text says the call failed.
                {"type": "function_call_output", "call_id": "call_b", "output": "Error: unknown city"},
                {"type": "message", "role": "assistant", "id": "msg_keel_8", "status": "completed",
                 "content": [{"type": "output_text", "text": "Paris: 12:00. Tokyo: I could not tell.", "annotations": []}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks! And London?"}]},
            ],
            "instructions": INSTRUCTIONS,
            "tools": [
                {"type": "function", "name": "clock", "description": clock.description, "parameters": clock.parameters, "strict": false},
                {"type": "function", "name": "lookup", "description": "Looks a city up.", "parameters": tools[1].parameters, "strict": false},
            ],
            "stream": true,
            "store": false,
            "include": ["reasoning.encrypted_content"],
            "max_output_tokens": 256,
            "temperature": 0.25,
        })
    ); // A step's span reports the parameters the body carries.
    assert_eq!(
        model.request_parameters(),
        RequestParameters {
            max_tokens: Some(256),
            temperature: Some(0.25)
        }
    );
}

#[tokio::test]
async fn a_model_without_reasoning_is_asked_again_without_encrypted_content() {
    let server = ScriptedServer::start(vec![
        Reply::json(400, ERROR_ENCRYPTED_CONTENT),
        Reply::sse_in_pieces(TEXT, 64),
        Reply::sse_in_pieces(ANSWER, 64),
    ])
    .await;
    let mut settings = settings(&server);
    // The second request is not a retry: it happens even with none allowed.
    settings.http.retry.max_retries = 0;
    let model = model(settings);
    let (first, _) = respond(&model, &hello()).await;
    assert_eq!(first.expect("a response").text, TEXT_DELTAS.concat());
    let (second, _) = respond(&model, &hello()).await;
    assert_eq!(second.expect("a response").text, "The clock says it is noon, UTC.");

    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].json()["include"], json!(["reasoning.encrypted_content"]));
    for request in &requests[1..] {
        let body = request.json();
        assert_eq!(body.get("include"), None, "{body}");
        assert_eq!(body["store"], false);
    }
}

// Retries and HTTP errors.

#[tokio::test]
async fn a_429_with_retry_after_is_retried_then_succeeds() {
    let server = ScriptedServer::start(vec![
        Reply::json(429, ERROR_429).header("retry-after", "1"),
        Reply::sse_in_pieces(TEXT, 64),
    ])
    .await;
    let (result, events) = respond(&model(settings(&server)), &hello()).await;
    assert_eq!(result.expect("a response").text, TEXT_DELTAS.concat());
    assert_eq!(text_deltas(&events), TEXT_DELTAS, "streamed once");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body, requests[1].body);
}

#[tokio::test]
async fn a_401_aborts_the_turn_with_the_providers_message_and_is_not_retried() {
    let db = TestDb::new();
    let store = db.open();
    let server = ScriptedServer::start(vec![Reply::json(401, ERROR_401)]).await;
    let model = model(settings(&server));
    assert!(!format!("{model:?}").contains(KEY), "the key stays out of debug output");
    let mut agent = start_agent_on(&db, &store, model).await;
    agent.sender().submit(user("hello")).expect("submit");
    let turn = read_turn(&mut agent).await;
    shutdown(agent).await;

    assert_eq!(
        kinds(&turn),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "error",
            "turn_aborted"
        ]
    );
    let message = error_message(&turn);
    assert!(
        message.starts_with("openai: HTTP 401: ") && message.contains("Incorrect API key provided"),
        "{message}"
    );
    assert!(!message.contains(KEY), "{message}");
    assert_eq!(abort_of(&turn), (AbortReason::ModelFailed, message));
    assert_eq!(server.requests().len(), 1, "a 401 is not retried");
    assert_eq!(
        server.requests()[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
}

// Failures inside the stream.

#[tokio::test]
async fn a_failed_response_after_text_keeps_the_text_and_is_not_retried() {
    let db = TestDb::new();
    let store = db.open();
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(FAILED_AFTER_TEXT, 16)]).await;
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    agent.sender().submit(user("hello")).expect("submit");
    let turn = read_turn(&mut agent).await;
    shutdown(agent).await;

    assert_eq!(
        squashed(&turn),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "error",
            "turn_aborted",
        ]
    );
    assert_eq!(deltas(&turn).concat(), "Partial answer");
    let message = error_message(&turn);
    assert!(
        message.starts_with("openai: server_error: An error occurred while processing your request."),
        "{message}"
    );
    assert_eq!(abort_of(&turn).0, AbortReason::ModelFailed);
    assert_eq!(
        server.requests().len(),
        1,
        "server_error is passing, but text was streamed"
    );
    assert_eq!(
        stored_transcript(&db).await.last(),
        Some(&assistant_item("Partial answer", true))
    );
}

#[tokio::test]
async fn an_error_event_mid_stream_fails_the_response_without_retry() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(ERROR_AFTER_TEXT, 16)]).await;
    let (result, events) = respond(&model(settings(&server)), &hello()).await;
    assert_eq!(
        provider_error(result),
        ProviderError::Stream {
            provider: "openai".into(),
            message: "server_error: The server had an error while processing your request. Sorry about that!".into(),
            retryable: true,
        }
    );
    assert_eq!(text_deltas(&events), ["Some text"]);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_passing_error_event_before_any_output_is_retried() {
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(ERROR_RATE_LIMITED, 16),
        Reply::sse_in_pieces(TEXT, 16),
    ])
    .await;
    let (result, events) = respond(&model(settings(&server)), &hello()).await;
    assert_eq!(result.expect("a response").text, TEXT_DELTAS.concat());
    assert_eq!(text_deltas(&events), TEXT_DELTAS);
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn an_incomplete_response_is_an_error_naming_the_reason() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(INCOMPLETE, 16)]).await;
    let (result, events) = respond(&model(settings(&server)), &hello()).await;
    assert_eq!(
        provider_error(result),
        ProviderError::Stream {
            provider: "openai".into(),
            message: "the response is incomplete (max_output_tokens): the model stopped before it finished".into(),
            retryable: false,
        }
    );
    assert_eq!(text_deltas(&events), ["Once upon a time, ", "in a land far"]);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn malformed_json_is_reported_and_not_retried() {
    let body = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":\n\n";
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(body, 64)]).await;
    let (result, _) = respond(&model(settings(&server)), &hello()).await;
    let error = provider_error(result);
    assert!(
        matches!(&error, ProviderError::Malformed { provider, .. } if provider == "openai"),
        "{error:?}"
    );
    assert_eq!(server.requests().len(), 1);
}

// Streams that end badly.

#[tokio::test]
async fn a_stream_cut_after_text_fails_and_is_not_retried() {
    let first_delta = through(TEXT, "response.output_text.delta", 1);
    let server = ScriptedServer::start(vec![Reply::sse(vec![Part::Bytes(first_delta), Part::Cut])]).await;
    let (result, events) = respond(&model(settings(&server)), &hello()).await;
    // The chunked body never got its last chunk: the connection broke.
    let error = provider_error(result);
    assert!(
        matches!(&error, ProviderError::Connection { message, .. } if message.contains("broke off")),
        "{error:?}"
    );
    assert_eq!(text_deltas(&events), ["Hé"]);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_clean_end_without_the_terminal_event_is_truncated() {
    // After text: an error, not retried.
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(&without(TEXT, &["response.completed"]), 16)]).await;
    let (result, events) = respond(&model(settings(&server)), &hello()).await;
    assert_eq!(
        provider_error(result),
        ProviderError::Truncated {
            provider: "openai".into()
        }
    );
    assert_eq!(text_deltas(&events), TEXT_DELTAS);
    assert_eq!(server.requests().len(), 1);

    // Before any output: retried.
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(&through(TEXT, "response.created", 1), 16),
        Reply::sse_in_pieces(TEXT, 16),
    ])
    .await;
    let (result, events) = respond(&model(settings(&server)), &hello()).await;
    assert_eq!(result.expect("a response").text, TEXT_DELTAS.concat());
    assert_eq!(text_deltas(&events), TEXT_DELTAS);
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_stalled_stream_hits_the_idle_timeout_and_is_retried_only_before_output() {
    let server = ScriptedServer::start(vec![
        // Stalls before any output: retried.
        Reply::sse(vec![Part::Bytes(through(TEXT, "response.in_progress", 1)), Part::Stall]),
        // Stalls after the first delta: the end.
        Reply::sse(vec![
            Part::Bytes(through(TEXT, "response.output_text.delta", 1)),
            Part::Stall,
        ]),
    ])
    .await;
    let mut settings = settings(&server);
    settings.http.idle_timeout = Duration::from_millis(300);
    let (result, events) = respond(&model(settings), &hello()).await;
    assert_eq!(
        provider_error(result),
        ProviderError::GaveUp {
            attempts: 2,
            last: Box::new(ProviderError::Stalled {
                provider: "openai".into(),
                after: Duration::from_millis(300),
            }),
        }
    );
    assert_eq!(text_deltas(&events), ["Hé"], "nothing is streamed twice");
    assert_eq!(server.requests().len(), 2);
    guard("both stalled responses abandoned", server.wait_abandoned(2)).await;
}

#[tokio::test]
async fn an_interrupt_during_streaming_cancels_the_request() {
    let db = TestDb::new();
    let store = db.open();
    let server = ScriptedServer::start(vec![Reply::sse(vec![
        Part::Bytes(through(TEXT, "response.output_text.delta", 1)),
        Part::Stall,
    ])])
    .await;
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    agent.sender().submit(user("hello")).expect("submit");
    let mut turn = read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    assert_eq!(deltas(&turn), ["Hé"]);

    agent
        .sender()
        .submit(Op::Interrupt { turn_id: None })
        .expect("interrupt");
    turn.extend(read_turn(&mut agent).await);
    assert_eq!(
        kinds(&turn),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "turn_aborted",
        ]
    );
    assert_eq!(abort_of(&turn).0, AbortReason::Interrupted);
    guard("the request was cancelled", server.wait_abandoned(1)).await;
    assert_eq!(server.requests().len(), 1);
    shutdown(agent).await;
    assert_eq!(stored_transcript(&db).await.last(), Some(&assistant_item("Hé", true)));
}
