//! The OpenAI Chat Completions adapter over real HTTP on loopback: the
//! request it sends, the streams it reads (captured from llama.cpp servers
//! and written from OpenAI's API reference, split anywhere), tool calls,
//! usage, retries, failures mid-stream, stalls, cuts and interrupts, and a
//! whole multi-step turn through the agent.

use std::sync::Arc;
use std::time::Duration;

use keel::agent::{ModelEvent, ModelOutput, ModelRequest};
use keel::model::{RequestParameters, ToolSpec};
use keel::protocol::{AbortReason, TokenUsage, TranscriptItem};
use keel::provider::http::Secret;
use keel::provider::openai_chat::OpenAiChat;
use keel::provider::{ProviderError, ProviderSettings};
use keel::store::SqliteCheckpoint;
use keel::tools::ToolSet;
use keel::{Agent, CheckpointStore, Error, EventMsg, Model, Op, RecordedEvent};
use serde_json::{Value, json};

use crate::suite::support::http_server::{Part, Reply, Request, ScriptedServer};
use crate::suite::support::{agent::*, events::*, model::*, provider::*, store::*, wait::*};

const SESSION: &str = "openai-chat-session";
const KEY: &str = "sk-test-0123456789abcdef";

const LLAMA_SERVER_TEXT: &[u8] = include_bytes!("../fixtures/openai-chat/llama-server-text.sse");
const LLAMA_SERVER_TOOL_CALL: &[u8] = include_bytes!("../fixtures/openai-chat/llama-server-tool-call.sse");
const LLAMA_SERVER_TOOL_CALL_REQUEST: &[u8] =
    include_bytes!("../fixtures/openai-chat/llama-server-tool-call.request.json");
const LLAMA_CPP_PYTHON_TEXT: &[u8] = include_bytes!("../fixtures/openai-chat/llama-cpp-python-text.sse");
const PARALLEL_TOOL_CALLS: &[u8] = include_bytes!("../fixtures/openai-chat/openai-parallel-tool-calls.sse");
const TEXT_USAGE: &[u8] = include_bytes!("../fixtures/openai-chat/openai-text-usage.sse");
const UTF8: &[u8] = include_bytes!("../fixtures/openai-chat/openai-utf8.sse");

/// OpenAI's answer to a wrong key (its documented error body).
const INVALID_KEY_BODY: &str = r#"{"error": {"message": "Incorrect API key provided: sk-test-***cdef. You can find your API key at https://platform.openai.com/account/api-keys.", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}"#;

// Helpers.

/// Settings for the scripted server, with a key, an extra header and quick
/// retries (the back-off is not what these tests are about).
fn settings(server: &ScriptedServer) -> ProviderSettings {
    let mut settings = ProviderSettings::new("openai", "gpt-4.1-mini", server.url() + "/v1");
    settings.api_key = Some(Secret::new(KEY));
    settings.headers = vec![("OpenAI-Organization".to_owned(), Secret::new("org-keel"))];
    settings.http.retry.initial_backoff = Duration::from_millis(1);
    settings.http.retry.max_backoff = Duration::from_millis(5);
    settings
}

fn model(settings: ProviderSettings) -> Arc<OpenAiChat> {
    Arc::new(OpenAiChat::new(settings).expect("build the adapter"))
}

/// Calls the model once, directly; returns its result and what it streamed.
async fn respond(
    model: &OpenAiChat,
    instructions: Option<&str>,
    history: &[TranscriptItem],
    tools: &[ToolSpec],
) -> (keel::Result<ModelOutput>, Vec<ModelEvent>) {
    let mut request = ModelRequest::new(SESSION, "turn-1", history, 0);
    request.instructions = instructions;
    request.tools = tools;
    call_model(model, request).await
}

/// Asks for an answer to "hello" and expects one.
async fn answer(model: &OpenAiChat) -> (ModelOutput, Vec<ModelEvent>) {
    let (result, events) = respond(model, None, &[user_item("hello")], &[]).await;
    (result.expect("a response"), events)
}

/// Asks for an answer to "hello" and expects a provider error.
async fn failure(model: &OpenAiChat) -> (ProviderError, Vec<ModelEvent>) {
    match respond(model, None, &[user_item("hello")], &[]).await {
        (Err(Error::Provider(error)), events) => (error, events),
        (other, _) => panic!("expected a provider error, got {other:?}"),
    }
}

/// One `data:` event of a chunk shaped like OpenAI's, with `choices` as given.
fn event_of(choices: Value, usage: Value) -> String {
    let chunk = json!({
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1_767_225_600,
        "model": "gpt-4.1-mini-2025-04-14",
        "system_fingerprint": "fp_test",
        "choices": choices,
        "usage": usage,
    });
    format!("data: {chunk}\n\n")
}

fn delta_event(delta: Value) -> String {
    event_of(
        json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]),
        Value::Null,
    )
}

fn text_event(text: &str) -> String {
    delta_event(json!({"content": text}))
}

fn finish_event(reason: &str) -> String {
    event_of(
        json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason}]),
        Value::Null,
    )
}

fn usage_event(input: u64, output: u64) -> String {
    event_of(
        json!([]),
        json!({"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}),
    )
}

const DONE: &str = "data: [DONE]\n\n";

/// A reply streaming `events`, one chunk each.
fn stream(events: &[String]) -> Reply {
    Reply::sse(
        events
            .iter()
            .map(|event| Part::Bytes(event.clone().into_bytes()))
            .collect(),
    )
}

/// A complete text answer.
fn text_reply(pieces: &[&str]) -> Reply {
    let mut events: Vec<String> = pieces.iter().map(|piece| text_event(piece)).collect();
    events.push(finish_event("stop"));
    events.push(DONE.to_owned());
    stream(&events)
}

/// The same stream with CRLF line endings.
fn crlf(body: &[u8]) -> Vec<u8> {
    let mut converted = Vec::with_capacity(body.len() * 2);
    for &byte in body {
        if byte == b'\n' {
            converted.push(b'\r');
        }
        converted.push(byte);
    }
    converted
}

/// The text of a fixture's content deltas, read independently of the adapter.
fn fixture_text(body: &[u8]) -> (String, usize) {
    let mut text = String::new();
    let mut pieces = 0;
    for line in std::str::from_utf8(body).expect("UTF-8 fixture").lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).expect("fixture JSON");
        for choice in chunk["choices"].as_array().expect("choices") {
            if let Some(piece) = choice["delta"]["content"].as_str().filter(|piece| !piece.is_empty()) {
                text.push_str(piece);
                pieces += 1;
            }
        }
    }
    (text, pieces)
}

fn calls_of(output: &ModelOutput) -> Vec<(&str, &str, &str)> {
    output
        .tool_calls
        .iter()
        .map(|call| (call.call_id.as_str(), call.name.as_str(), call.arguments.as_str()))
        .collect()
}

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".to_owned(),
        description: "Get the current weather for a city".to_owned(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    }
}

/// An agent on `model` with the built-in tools and instructions.
async fn start_agent_on(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: Arc<dyn Model>) -> Agent {
    provider_agent(db, store, SESSION, model, "You are terse.").await
}

fn error_message(events: &[RecordedEvent]) -> String {
    error_messages(events).first().expect("an error event").to_string()
}

async fn stored_state(store: &SqliteCheckpoint) -> keel::store::SessionState {
    guard("load the session", store.load(SESSION))
        .await
        .expect("load")
        .expect("the session exists")
}

// 1. The request and plain text.

#[tokio::test]
async fn plain_text_streams_every_delta_in_order_after_the_documented_request() {
    let server = ScriptedServer::start(vec![text_reply(&["Hel", "lo, ", "world"])]).await;
    let mut settings = settings(&server);
    settings.max_output_tokens = Some(256);
    settings.temperature = Some(0.25);
    let model = model(settings);
    assert_eq!(model.name(), "openai:gpt-4.1-mini");

    let (result, events) = respond(&model, Some("Be brief."), &[user_item("hello")], &[]).await;
    let output = result.expect("a response");
    assert_eq!(
        events,
        [
            ModelEvent::TextDelta("Hel".into()),
            ModelEvent::TextDelta("lo, ".into()),
            ModelEvent::TextDelta("world".into()),
        ]
    );
    assert_eq!(output.text, "Hello, world");
    assert!(output.tool_calls.is_empty());
    assert!(output.reasoning.is_empty());
    assert_eq!(output.usage, None);

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(request.header("openai-organization"), Some("org-keel"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("accept"), Some("text/event-stream"));
    assert_eq!(
        request.json(),
        json!({
            "model": "gpt-4.1-mini",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hello"},
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": 256,
            "temperature": 0.25,
        }),
        "no tools, no `tools` field"
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
async fn a_request_without_a_key_sends_no_authorization() {
    let server = ScriptedServer::start(vec![text_reply(&["ok"])]).await;
    let mut settings = settings(&server);
    settings.api_key = None;
    let (output, _) = answer(&model(settings)).await;
    assert_eq!(output.text, "ok");
    assert_eq!(server.requests()[0].header("authorization"), None);
}

#[tokio::test]
async fn the_request_carries_the_history_as_chat_messages() {
    let server = ScriptedServer::start(vec![text_reply(&["Tomorrow: sun."])]).await;
    let mut settings = settings(&server);
    settings.max_output_tokens = Some(1024);
    settings.temperature = Some(0.5);
    let model = model(settings);
    let history = vec![
        user_item("What's the weather in Berlin and Rome?"),
        TranscriptItem::Reasoning {
            provider: "anthropic".into(),
            data: json!({"type": "thinking", "thinking": "…", "signature": "sig"}),
        },
        assistant_item("Checking both.", false),
        TranscriptItem::ToolCall {
            call_id: "call_berlin".into(),
            name: "get_weather".into(),
            arguments: r#"{"city": "Berlin"}"#.into(),
        },
        TranscriptItem::ToolCall {
            call_id: "call_rome".into(),
            name: "get_weather".into(),
            arguments: r#"{"city": "Rome"}"#.into(),
        },
        TranscriptItem::ToolResult {
            call_id: "call_berlin".into(),
            output: "12°C, rain".into(),
            is_error: false,
        },
        TranscriptItem::ToolResult {
            call_id: "call_rome".into(),
            output: "weather service unavailable".into(),
            is_error: true,
        },
        assistant_item("Berlin: 12°C and rain. Rome: unkn", true),
        user_item("And tomorrow?"),
    ];
    let (result, _) = respond(&model, Some("You are a weather bot."), &history, &[weather_tool()]).await;
    assert_eq!(result.expect("a response").text, "Tomorrow: sun.");
    assert_eq!(
        server.requests()[0].json(),
        json!({
            "model": "gpt-4.1-mini",
            "messages": [
                {"role": "system", "content": "You are a weather bot."},
                {"role": "user", "content": "What's the weather in Berlin and Rome?"},
                {"role": "assistant", "content": "Checking both.", "tool_calls": [
                    {"id": "call_berlin", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Berlin\"}"}},
                    {"id": "call_rome", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_berlin", "content": "12°C, rain"},
                // A tool message has no error flag: the text says the call failed.
                {"role": "tool", "tool_call_id": "call_rome", "content": "Error: weather service unavailable"},
                {"role": "assistant", "content": "Berlin: 12°C and rain. Rome: unkn"},
                {"role": "user", "content": "And tomorrow?"},
            ],
            "tools": [{"type": "function", "function": {
                "name": "get_weather",
                "description": "Get the current weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            }}],
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": 1024,
            "temperature": 0.5,
        })
    );
}

#[tokio::test]
async fn the_llama_server_tool_call_request_is_rebuilt_as_llama_server_accepted_it() {
    let captured: Value = serde_json::from_slice(LLAMA_SERVER_TOOL_CALL_REQUEST).expect("fixture JSON");
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(LLAMA_SERVER_TOOL_CALL, 64)]).await;
    let mut settings = settings(&server);
    settings.model = "smollm2".to_owned();
    settings.max_output_tokens = Some(60);
    let model = model(settings);
    let call = |id: &str, city: &str| TranscriptItem::ToolCall {
        call_id: id.into(),
        name: "get_weather".into(),
        arguments: format!(r#"{{"city": "{city}"}}"#),
    };
    let history = vec![
        user_item("What is the weather in Berlin?"),
        call("call_1", "Berlin"),
        user_item("What is the weather in Rome?"),
        call("call_2", "Rome"),
        user_item("What is the weather in Paris?"),
    ];
    let (result, _) = respond(&model, None, &history, &[weather_tool()]).await;
    let output = result.expect("a response");
    assert_eq!(
        calls_of(&output),
        [(
            "ytLeLlGhlbKZ6ZBG5bpMI7Z0K55fLxm4",
            "get_weather",
            r#"{"city": "Paris"}"#
        )]
    );
    let sent = server.requests()[0].json();
    assert_eq!(sent["model"], captured["model"]);
    assert_eq!(sent["messages"], captured["messages"]);
    assert_eq!(sent["tools"], captured["tools"]);
    assert_eq!(sent["max_tokens"], captured["max_tokens"]);
}

#[tokio::test]
async fn a_history_that_cannot_fit_the_context_window_is_refused_before_sending() {
    let server = ScriptedServer::start(vec![]).await;
    let mut settings = settings(&server);
    settings.context_window = Some(10);
    let long = "word ".repeat(100);
    let (result, events) = respond(&model(settings), None, &[user_item(&long)], &[]).await;
    let error = result.expect_err("refused").to_string();
    assert!(
        error.starts_with("openai: ") && error.contains("context window of 10 tokens"),
        "{error}"
    );
    assert!(events.is_empty());
    assert!(server.requests().is_empty(), "nothing was sent");
}

// 2. Streams from real servers and from the reference, split anywhere.

#[tokio::test]
async fn llama_cpp_streams_give_the_same_answer_in_any_pieces_and_line_endings() {
    let fixtures = [
        ("llama-server-text", LLAMA_SERVER_TEXT),
        ("llama-cpp-python-text", LLAMA_CPP_PYTHON_TEXT),
        ("llama-server-tool-call", LLAMA_SERVER_TOOL_CALL),
    ];
    let mut cases = Vec::new();
    for (name, body) in fixtures {
        for (endings, body) in [("LF", body.to_vec()), ("CRLF", crlf(body))] {
            for piece in [1, 7, 64] {
                cases.push((format!("{name}, {endings}, pieces of {piece}"), body.clone(), piece));
            }
        }
    }
    let replies = cases
        .iter()
        .map(|(_, body, piece)| Reply::sse_in_pieces(body, *piece))
        .collect();
    let server = ScriptedServer::start(replies).await;
    let model = model(settings(&server));
    for (case, body, _) in &cases {
        let (output, events) = answer(&model).await;
        let (expected, pieces) = fixture_text(body);
        let deltas = text_deltas(&events);
        assert_eq!(deltas.len(), pieces, "{case}: one delta per content chunk");
        assert_eq!(deltas.concat(), expected, "{case}");
        assert_eq!(output.text, expected, "{case}");
        if case.starts_with("llama-server-tool-call") {
            assert!(expected.is_empty(), "{case}");
            assert_eq!(
                calls_of(&output),
                [(
                    "ytLeLlGhlbKZ6ZBG5bpMI7Z0K55fLxm4",
                    "get_weather",
                    r#"{"city": "Paris"}"#
                )],
                "{case}"
            );
        } else {
            assert!(expected.starts_with("The "), "{case}: {expected}");
            assert!(output.tool_calls.is_empty(), "{case}");
        }
        assert_eq!(output.usage, None, "{case}: these servers were not asked for usage");
    }
    assert_eq!(server.requests().len(), cases.len(), "no retries");
}

#[tokio::test]
async fn multi_byte_utf8_survives_splits_inside_characters() {
    let mut bodies = Vec::new();
    for body in [UTF8.to_vec(), crlf(UTF8)] {
        for piece in [1, 2, 3, 5, 7, 64] {
            bodies.push((body.clone(), piece));
        }
    }
    let server = ScriptedServer::start(
        bodies
            .iter()
            .map(|(body, piece)| Reply::sse_in_pieces(body, *piece))
            .collect(),
    )
    .await;
    let model = model(settings(&server));
    for (_, piece) in &bodies {
        let (output, events) = answer(&model).await;
        assert_eq!(
            text_deltas(&events),
            ["Grüße", " aus Köln — ", "日本語", "と", " 🌍🚀", "!"],
            "pieces of {piece}"
        );
        assert_eq!(output.text, "Grüße aus Köln — 日本語と 🌍🚀!");
    }
}

#[tokio::test]
async fn keep_alive_comments_and_empty_deltas_are_ignored() {
    let server = ScriptedServer::start(vec![stream(&[
        ": keep-alive\n\n".to_owned(),
        delta_event(json!({"role": "assistant"})),
        ":\n\n".to_owned(),
        text_event("still "),
        ": OPENROUTER PROCESSING\r\n\r\n".to_owned(),
        delta_event(json!({"content": null})),
        delta_event(json!({})),
        text_event("here"),
        finish_event("stop"),
        ": keep-alive\n\n".to_owned(),
        DONE.to_owned(),
    ])])
    .await;
    let (output, events) = answer(&model(settings(&server))).await;
    assert_eq!(
        events,
        [
            ModelEvent::TextDelta("still ".into()),
            ModelEvent::TextDelta("here".into())
        ]
    );
    assert_eq!(output.text, "still here");
}

#[tokio::test]
async fn parallel_tool_calls_are_assembled_by_index_and_usage_is_read() {
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(PARALLEL_TOOL_CALLS, 1),
        Reply::sse_in_pieces(&crlf(PARALLEL_TOOL_CALLS), 7),
        Reply::sse_in_pieces(PARALLEL_TOOL_CALLS, 4096),
    ])
    .await;
    let model = model(settings(&server));
    for _ in 0..3 {
        let (output, events) = answer(&model).await;
        assert!(events.is_empty(), "tool calls stream nothing: {events:?}");
        assert_eq!(output.text, "");
        assert_eq!(
            calls_of(&output),
            [
                ("call_Hk2mB9qW1", "get_weather", r#"{"city": "Berlin"}"#),
                ("call_Zr7tN3xP4", "get_time", r#"{"zone": "Europe/Rome"}"#),
                ("call_Qc5vJ8yL6", "clock", "{}"),
            ]
        );
        assert_eq!(
            output.usage,
            Some(TokenUsage {
                input_tokens: 182,
                cached_input_tokens: 0,
                output_tokens: 57,
                reasoning_tokens: 0,
            })
        );
    }
}

#[tokio::test]
async fn reasoning_fields_of_compatible_servers_stream_as_reasoning() {
    let server = ScriptedServer::start(vec![stream(&[
        // llama.cpp and older vLLM.
        delta_event(json!({"role": "assistant", "content": null, "reasoning_content": "Let me "})),
        // vLLM, Ollama and OpenRouter.
        delta_event(json!({"reasoning": "think."})),
        // A server sending both names for the same piece.
        delta_event(json!({"reasoning_content": " Done.", "reasoning": " Done."})),
        delta_event(json!({"content": "Answer", "reasoning_content": null})),
        finish_event("stop"),
        DONE.to_owned(),
    ])])
    .await;
    let (output, events) = answer(&model(settings(&server))).await;
    assert_eq!(
        events,
        [
            ModelEvent::ReasoningDelta("Let me ".into()),
            ModelEvent::ReasoningDelta("think.".into()),
            ModelEvent::ReasoningDelta(" Done.".into()),
            ModelEvent::TextDelta("Answer".into()),
        ]
    );
    assert_eq!(output.text, "Answer");
    assert!(
        output.reasoning.is_empty(),
        "nothing to send back to a Chat Completions server"
    );
}

#[tokio::test]
async fn a_refusal_is_the_answer() {
    let server = ScriptedServer::start(vec![stream(&[
        delta_event(json!({"role": "assistant", "content": null, "refusal": ""})),
        delta_event(json!({"refusal": "I can't help with that."})),
        finish_event("stop"),
        DONE.to_owned(),
    ])])
    .await;
    let (output, events) = answer(&model(settings(&server))).await;
    assert_eq!(events, [ModelEvent::TextDelta("I can't help with that.".into())]);
    assert_eq!(output.text, "I can't help with that.");
}

#[tokio::test]
async fn the_completions_id_and_dated_model_are_kept_for_the_steps_span() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(TEXT_USAGE, 5)]).await;
    let (output, _) = answer(&model(settings(&server))).await;
    assert_eq!(
        output.response_id.as_deref(),
        Some("chatcmpl-Uq5sR8cVrT3nOx9LyM4bA0wZe2Fg")
    );
    assert_eq!(output.response_model.as_deref(), Some("gpt-4.1-mini-2025-04-14"));
}

// 3. Usage through the agent.

#[tokio::test]
async fn usage_is_recorded_as_token_usage_and_summed_in_the_checkpoint() {
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(TEXT_USAGE, 64),
        Reply::sse_in_pieces(TEXT_USAGE, 5),
    ])
    .await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    let per_request = TokenUsage {
        input_tokens: 1200,
        cached_input_tokens: 1024,
        output_tokens: 80,
        reasoning_tokens: 64,
    };
    let mut total = TokenUsage::default();
    for text in ["first", "second"] {
        let events = run_turn(&mut agent, text).await;
        assert_eq!(
            kinds(&events),
            [
                "turn_started",
                "user_message",
                "model_step_started",
                "assistant_content_delta",
                "assistant_content_delta",
                "assistant_content_delta",
                "assistant_message",
                "token_usage",
                "turn_complete",
            ]
        );
        assert_eq!(deltas(&events), ["Hello", ", world", "!"]);
        assert_eq!(assistant_text(&events), "Hello, world!");
        total.add(&per_request);
        assert_eq!(token_usages(&events), [(1, per_request, total)]);
    }
    let state = stored_state(&store).await;
    assert_eq!(
        state.checkpoint.usage,
        TokenUsage {
            input_tokens: 2400,
            cached_input_tokens: 2048,
            output_tokens: 160,
            reasoning_tokens: 128,
        }
    );
    shutdown(agent).await;
}

// 4. Retries: only before anything was streamed.

#[tokio::test]
async fn a_rate_limit_is_retried_after_the_wait_the_provider_asks_for() {
    let rate_limited = r#"{"error": {"message": "Rate limit reached for gpt-4.1-mini on tokens per min (TPM). Please try again in 1s.", "type": "tokens", "param": null, "code": "rate_limit_exceeded"}}"#;
    let server = ScriptedServer::start(vec![
        Reply::json(429, rate_limited).header("retry-after", "1"),
        text_reply(&["after ", "waiting"]),
    ])
    .await;
    let before = keel::protocol::now_ms();
    let (output, events) = answer(&model(settings(&server))).await;
    assert_eq!(output.text, "after waiting");
    assert_eq!(text_deltas(&events), ["after ", "waiting"], "streamed once");
    // What the step's span says of it: the retry (when it started, after
    // the second the provider asked for) and the server asked.
    assert_eq!(output.retries.len(), 1, "{:?}", output.retries);
    assert!(
        output.retries[0] >= before + 900,
        "{} after {before}",
        output.retries[0]
    );
    assert_eq!(output.server_address.as_deref(), Some("127.0.0.1"));
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "one retry");
    assert_eq!(requests[0].json(), requests[1].json(), "the same request again");
}

#[tokio::test]
async fn a_server_error_is_retried_then_succeeds() {
    let server = ScriptedServer::start(vec![
        Reply::json(
            500,
            r#"{"error": {"message": "The server had an error while processing your request.", "type": "server_error", "param": null, "code": null}}"#,
        ),
        text_reply(&["recovered"]),
    ])
    .await;
    let (output, _) = answer(&model(settings(&server))).await;
    assert_eq!(output.text, "recovered");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_passing_stream_error_before_any_output_is_retried() {
    let server = ScriptedServer::start(vec![
        stream(&[
            delta_event(json!({"role": "assistant", "content": ""})),
            r#"data: {"error": {"message": "The model is overloaded.", "type": "server_error", "code": null}}"#
                .to_owned()
                + "\n\n",
        ]),
        text_reply(&["second try"]),
    ])
    .await;
    let (output, events) = answer(&model(settings(&server))).await;
    assert_eq!(output.text, "second try");
    assert_eq!(text_deltas(&events), ["second try"]);
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_rejected_key_is_an_error_event_naming_provider_status_and_message_without_retry() {
    let server = ScriptedServer::start(vec![Reply::json(401, INVALID_KEY_BODY)]).await;
    let db = TestDb::new();
    let store = db.open();
    let model = model(settings(&server));
    assert!(!format!("{model:?}").contains(KEY), "the key stays out of debug output");
    let mut agent = start_agent_on(&db, &store, model).await;
    let events = run_turn(&mut agent, "hello").await;
    assert_eq!(
        kinds(&events),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "error",
            "turn_aborted"
        ]
    );
    let message = error_message(&events);
    assert_eq!(
        message,
        "openai: HTTP 401: invalid_request_error: Incorrect API key provided: sk-test-***cdef. You can find your \
         API key at https://platform.openai.com/account/api-keys."
    );
    let (reason, aborted) = abort_of(&events);
    assert_eq!(reason, AbortReason::ModelFailed);
    assert_eq!(aborted, message);
    assert_eq!(server.requests().len(), 1, "a 401 is not retried");
    let stored = stored_events(&store, SESSION).await;
    assert!(!format!("{stored:?}").contains(KEY), "the key is in no recorded event");
    shutdown(agent).await;
}

#[tokio::test]
async fn an_error_mid_stream_after_text_ends_the_step_without_retry() {
    let server = ScriptedServer::start(vec![stream(&[
        delta_event(json!({"role": "assistant", "content": ""})),
        text_event("Partial "),
        text_event("answer"),
        r#"data: {"error": {"message": "The server had an error while processing your request. Sorry about that!", "type": "server_error", "param": null, "code": null}}"#
            .to_owned()
            + "\n\n",
    ])])
    .await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    let events = run_turn(&mut agent, "hello").await;
    assert_eq!(
        kinds(&events),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "assistant_content_delta",
            "error",
            "turn_aborted",
        ]
    );
    assert_eq!(deltas(&events), ["Partial ", "answer"]);
    let message = error_message(&events);
    assert_eq!(
        message,
        "openai: server_error: The server had an error while processing your request. Sorry about that!"
    );
    assert_eq!(abort_of(&events).0, AbortReason::ModelFailed);
    assert_eq!(server.requests().len(), 1, "streamed output is never streamed twice");
    let state = stored_state(&store).await;
    assert_eq!(
        state.transcript,
        [user_item("hello"), assistant_item("Partial answer", true)],
        "the streamed text is kept"
    );
    shutdown(agent).await;
}

// 5. Streams that end badly.

#[tokio::test]
async fn a_stream_without_done_is_truncated() {
    let started = [
        delta_event(json!({"role": "assistant", "content": ""})),
        text_event("Half an ans"),
    ];
    let cut = |tail: Vec<Part>| {
        let mut parts: Vec<Part> = started
            .iter()
            .map(|event| Part::Bytes(event.clone().into_bytes()))
            .collect();
        parts.extend(tail);
        Reply::sse(parts)
    };
    let server = ScriptedServer::start(vec![
        // The connection drops mid-body.
        cut(vec![Part::Cut]),
        // The body ends cleanly, but without `[DONE]`.
        cut(vec![]),
        // The body ends in the middle of an event.
        cut(vec![Part::Bytes(b"data: {\"choices\": [{\"index\": 0, \"del".to_vec())]),
        // `[DONE]` although no choice finished: generation stopped early.
        cut(vec![Part::Bytes(DONE.as_bytes().to_vec())]),
        // llama.cpp's way to fail mid-stream: an `error:` line, then `[DONE]`.
        cut(vec![
            Part::Bytes(
                b"error: {\"code\": 500, \"message\": \"decode failed\", \"type\": \"server_error\"}\n\n".to_vec(),
            ),
            Part::Bytes(DONE.as_bytes().to_vec()),
        ]),
    ])
    .await;
    let model = model(settings(&server));
    for case in ["cut", "clean end", "mid-event", "done without finish"] {
        let (error, events) = failure(&model).await;
        assert_eq!(text_deltas(&events), ["Half an ans"], "{case}");
        assert_eq!(
            error,
            ProviderError::Truncated {
                provider: "openai".into()
            },
            "{case}"
        );
        assert_eq!(
            error.to_string(),
            "openai: the stream ended before the response was complete"
        );
    }
    // The server's own message reaches the user, and nothing is retried
    // once text was streamed.
    let (error, events) = failure(&model).await;
    assert_eq!(text_deltas(&events), ["Half an ans"]);
    assert_eq!(error.to_string(), "openai: server_error: decode failed");
    assert_eq!(server.requests().len(), 5, "nothing retried after streaming");
}

#[tokio::test]
async fn a_stream_truncated_before_any_output_is_retried() {
    let server = ScriptedServer::start(vec![
        stream(&[delta_event(json!({"role": "assistant", "content": ""}))]),
        text_reply(&["whole"]),
    ])
    .await;
    let (output, events) = answer(&model(settings(&server))).await;
    assert_eq!(output.text, "whole");
    assert_eq!(text_deltas(&events), ["whole"]);
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn malformed_chunk_json_is_malformed_and_not_retried() {
    let server = ScriptedServer::start(vec![stream(&[
        text_event("ok so far"),
        "data: {\"choices\": [{\"delta\": {\"content\": \"x\"}\n\n".to_owned(),
    ])])
    .await;
    let (error, events) = failure(&model(settings(&server))).await;
    assert_eq!(text_deltas(&events), ["ok so far"]);
    assert!(matches!(error, ProviderError::Malformed { .. }), "{error:?}");
    assert!(error.to_string().starts_with("openai: malformed response: "), "{error}");
    assert_eq!(server.requests().len(), 1);

    // Valid JSON of the wrong shape is malformed too, and not retried even
    // though nothing was streamed.
    let server = ScriptedServer::start(vec![stream(&[r#"data: {"choices": "none"}"#.to_owned() + "\n\n"])]).await;
    let (error, events) = failure(&model(settings(&server))).await;
    assert!(events.is_empty());
    assert!(matches!(error, ProviderError::Malformed { .. }), "{error:?}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_stalled_stream_hits_the_idle_timeout() {
    let server = ScriptedServer::start(vec![
        // Stalls before any output: retried.
        Reply::sse(vec![
            Part::Bytes(delta_event(json!({"role": "assistant", "content": ""})).into_bytes()),
            Part::Stall,
        ]),
        // Stalls after output: the step fails.
        Reply::sse(vec![Part::Bytes(text_event("Let me see").into_bytes()), Part::Stall]),
    ])
    .await;
    let mut settings = settings(&server);
    // Short, since the server stalls for good; long enough that a busy machine
    // still delivers the first chunk in time.
    settings.http.idle_timeout = Duration::from_millis(500);
    settings.http.retry.max_retries = 1;
    let (error, events) = failure(&model(settings)).await;
    assert_eq!(text_deltas(&events), ["Let me see"]);
    assert!(matches!(error.cause(), ProviderError::Stalled { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        "openai: the stream stalled: no data for 0.5 s (gave up after 2 attempts)"
    );
    assert_eq!(server.requests().len(), 2, "one retry, before anything was streamed");
    guard("both stalled responses abandoned", server.wait_abandoned(2)).await;
}

#[tokio::test]
async fn an_interrupt_during_streaming_cancels_the_request() {
    let server = ScriptedServer::start(vec![Reply::sse(vec![
        Part::Bytes(delta_event(json!({"role": "assistant", "content": ""})).into_bytes()),
        Part::Bytes(text_event("Thinking about it").into_bytes()),
        Part::Stall,
    ])])
    .await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    agent.sender().submit(user("hello")).expect("submit");
    let started = read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    assert_eq!(deltas(&started), ["Thinking about it"]);
    assert_eq!(server.abandoned(), 0, "the response is still streaming");
    agent
        .sender()
        .submit(Op::Interrupt {
            turn_id: Some(started_turn_id(&started)),
        })
        .expect("interrupt");
    let end = read_turn(&mut agent).await;
    assert_eq!(kinds(&end), ["turn_aborted"]);
    assert_eq!(abort_of(&end).0, AbortReason::Interrupted);
    guard("the HTTP request is cancelled", server.wait_abandoned(1)).await;
    assert_eq!(server.requests().len(), 1);
    let state = stored_state(&store).await;
    assert_eq!(
        state.transcript,
        [user_item("hello"), assistant_item("Thinking about it", true)]
    );
    shutdown(agent).await;
}

// 6. A whole turn: tool call, tool result, answer.

#[tokio::test]
async fn a_full_turn_runs_the_tool_the_model_calls_and_sends_its_result_back() {
    let step_one = [
        delta_event(json!({"role": "assistant", "content": null})),
        delta_event(json!({"tool_calls": [
            {"index": 0, "id": "call_clock_1", "type": "function", "function": {"name": "clock", "arguments": ""}}
        ]})),
        delta_event(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]})),
        delta_event(json!({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]})),
        finish_event("tool_calls"),
        usage_event(90, 12),
        DONE.to_owned(),
    ];
    let step_two = [
        delta_event(json!({"role": "assistant", "content": ""})),
        text_event("It is "),
        text_event("now."),
        finish_event("stop"),
        usage_event(130, 4),
        DONE.to_owned(),
    ];
    let server = ScriptedServer::start(vec![stream(&step_one), stream(&step_two)]).await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    let events = run_turn(&mut agent, "What time is it?").await;
    assert_eq!(
        kinds(&events),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "token_usage",
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
    let (started, completed) = match (&events[4].msg, &events[5].msg) {
        (EventMsg::ToolCallStarted(started), EventMsg::ToolCallCompleted(completed)) => (started, completed),
        other => panic!("expected the tool call, got {other:?}"),
    };
    assert_eq!(
        (
            started.call_id.as_str(),
            started.name.as_str(),
            started.arguments.as_str()
        ),
        ("call_clock_1", "clock", "{}")
    );
    assert_eq!(completed.call_id, "call_clock_1");
    assert!(!completed.is_error, "{}", completed.output);
    assert!(completed.output.contains("unix_ms"), "{}", completed.output);
    assert_eq!(deltas(&events), ["It is ", "now."]);
    assert_eq!(assistant_text(&events), "It is now.");
    let first = TokenUsage {
        input_tokens: 90,
        output_tokens: 12,
        ..TokenUsage::default()
    };
    let second = TokenUsage {
        input_tokens: 130,
        output_tokens: 4,
        ..TokenUsage::default()
    };
    let mut total = first;
    total.add(&second);
    assert_eq!(token_usages(&events), [(1, first, first), (2, second, total)]);

    let requests: Vec<Request> = server.requests();
    assert_eq!(requests.len(), 2);
    let clock = ToolSet::builtin().specs().remove(0);
    let tools = json!([{"type": "function", "function": {
        "name": clock.name, "description": clock.description, "parameters": clock.parameters,
    }}]);
    let system = json!({"role": "system", "content": "You are terse."});
    let question = json!({"role": "user", "content": "What time is it?"});
    assert_eq!(requests[0].json()["messages"], json!([system, question]));
    assert_eq!(requests[0].json()["tools"], tools);
    assert_eq!(
        requests[1].json()["messages"],
        json!([
            system,
            question,
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_clock_1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_clock_1", "content": completed.output},
        ])
    );
    assert_eq!(requests[1].json()["tools"], tools);

    let state = stored_state(&store).await;
    assert_eq!(state.checkpoint.usage, total);
    assert_eq!(
        state.transcript,
        [
            user_item("What time is it?"),
            TranscriptItem::ToolCall {
                call_id: "call_clock_1".into(),
                name: "clock".into(),
                arguments: "{}".into(),
            },
            TranscriptItem::ToolResult {
                call_id: "call_clock_1".into(),
                output: completed.output.clone(),
                is_error: false,
            },
            assistant_item("It is now.", false),
        ]
    );
    shutdown(agent).await;
}

#[tokio::test]
async fn a_tool_call_cut_by_the_length_limit_comes_back_as_an_error_and_the_history_stays_valid_json() {
    // What llama-server sends when `max_tokens` cuts a call mid-arguments.
    let step_one = [
        delta_event(json!({"role": "assistant", "content": null})),
        delta_event(json!({"tool_calls": [
            {"index": 0, "id": "call_cut_1", "type": "function", "function": {"name": "clock", "arguments": ""}}
        ]})),
        delta_event(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"tz\": \"Eur"}}]})),
        finish_event("length"),
        DONE.to_owned(),
    ];
    let server = ScriptedServer::start(vec![stream(&step_one), text_reply(&["Sorry, ", "cut off."])]).await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    let events = run_turn(&mut agent, "What time is it in Paris?").await;
    assert_eq!(events.last().map(|event| event.msg.kind()), Some("turn_complete"));
    // The answer that closed the turn was not cut.
    assert!(
        matches!(&events.last().expect("events").msg, EventMsg::TurnComplete(done) if !done.length_limited),
        "{:?}",
        events.last()
    );

    // The cut step is recorded as such, in the turn.
    let warnings: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::Warning(warning) => Some(warning.message.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(warnings.len(), 1, "{:?}", kinds(&events));
    assert!(
        warnings[0].contains("model step 1") && warnings[0].contains("output length limit"),
        "{}",
        warnings[0]
    );
    // Nothing ran; the model is told why.
    let completed = events
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(completed) => Some(completed),
            _ => None,
        })
        .expect("the cut call is answered");
    assert!(completed.is_error, "{completed:?}");
    assert!(completed.output.contains("not valid JSON"), "{}", completed.output);

    // The next request's history is well-formed: the call's arguments are a
    // JSON object (llama-server answers 500 to anything else, for good).
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1].json()["messages"].clone();
    let assistant = messages
        .as_array()
        .expect("messages")
        .iter()
        .find(|message| message["role"] == "assistant")
        .expect("the assistant's call")
        .clone();
    let arguments = assistant["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .expect("arguments are a string");
    assert_eq!(arguments, "{}");
    let tool = messages
        .as_array()
        .expect("messages")
        .iter()
        .find(|message| message["role"] == "tool")
        .expect("the error result");
    assert_eq!(tool["tool_call_id"], "call_cut_1");
    assert!(
        tool["content"].as_str().is_some_and(|text| text.starts_with("Error: ")),
        "{tool}"
    );
    // The transcript keeps what the model wrote.
    let state = stored_state(&store).await;
    assert!(
        state.transcript.iter().any(|item| matches!(item,
            TranscriptItem::ToolCall { arguments, .. } if arguments == "{\"tz\": \"Eur")),
        "{:?}",
        state.transcript
    );
    shutdown(agent).await;
}

#[tokio::test]
async fn an_answer_cut_by_the_length_limit_closes_its_turn_saying_so() {
    let cut = [
        delta_event(json!({"role": "assistant", "content": "Once upon "})),
        delta_event(json!({"content": "a time"})),
        finish_event("length"),
        DONE.to_owned(),
    ];
    let server = ScriptedServer::start(vec![stream(&cut)]).await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    let events = run_turn(&mut agent, "Tell me a long story.").await;
    match &events.last().expect("events").msg {
        EventMsg::TurnComplete(done) => assert!(done.length_limited, "{done:?}"),
        other => panic!("the turn ended with {other:?}"),
    }
    let stored = serde_json::to_value(&events.last().expect("events").msg).expect("json");
    assert_eq!(stored["length_limited"], json!(true), "{stored}");
    shutdown(agent).await;
}

// Context compaction over the wire.

/// OpenAI's documented answer to a request too long for the model.
const CONTEXT_LENGTH_BODY: &str = r#"{"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}"#;

#[tokio::test]
async fn a_context_length_error_compacts_the_history_once_and_retries_the_step() {
    let server = ScriptedServer::start(vec![
        text_reply(&["The first answer."]),
        Reply::json(400, CONTEXT_LENGTH_BODY),
        text_reply(&["The user asked a first question; it was answered."]),
        text_reply(&["The second answer."]),
    ])
    .await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    run_turn(&mut agent, "first question").await;
    let events = run_turn(&mut agent, "second question").await;
    assert_eq!(
        kinds(&events),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "context_compacted",
            "model_step_started",
            "assistant_content_delta",
            "assistant_message",
            "turn_complete"
        ]
    );
    let EventMsg::ContextCompacted(compacted) = &events[3].msg else {
        panic!("{:?}", events[3]);
    };
    assert_eq!(
        compacted.reason,
        keel::protocol::CompactionReason::ContextLengthExceeded
    );
    assert_eq!(compacted.summary, "The user asked a first question; it was answered.");
    assert_eq!((compacted.replaced_from, compacted.replaced_to), (0, 2));

    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    let contents = |request: &Request| -> Vec<String> {
        request.json()["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|message| message["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    // The summary request: the old history, then the prompt; no tools.
    let summary_request = contents(&requests[2]);
    assert_eq!(summary_request[..2], ["first question", "The first answer."]);
    assert_eq!(
        summary_request.last().map(String::as_str),
        Some(keel::agent::SUMMARY_PROMPT)
    );
    assert!(requests[2].json().get("tools").is_none(), "{}", requests[2].json());
    // The retried step: instructions, the summary, the latest message.
    let retried = contents(&requests[3]);
    assert_eq!(retried.len(), 3, "{retried:?}");
    assert_eq!(retried[0], "You are terse.");
    assert!(retried[1].starts_with(keel::agent::SUMMARY_PREFIX) && retried[1].contains("it was answered"));
    assert_eq!(retried[2], "second question");
    // The log still holds every original event.
    let state = stored_state(&store).await;
    assert_eq!(state.transcript.len(), 4);
    assert_eq!(
        state.checkpoint.compaction.map(|compaction| compaction.replaced_to),
        Some(2)
    );
    shutdown(agent).await;
}

#[tokio::test]
async fn a_second_context_length_error_ends_the_turn() {
    let server = ScriptedServer::start(vec![
        text_reply(&["The first answer."]),
        Reply::json(400, CONTEXT_LENGTH_BODY),
        text_reply(&["A summary."]),
        Reply::json(400, CONTEXT_LENGTH_BODY),
    ])
    .await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    run_turn(&mut agent, "first question").await;
    let events = run_turn(&mut agent, "second question").await;
    assert_eq!(
        kinds(&events)
            .iter()
            .filter(|kind| **kind == "context_compacted")
            .count(),
        1
    );
    assert!(error_message(&events).contains("maximum context length"), "{events:?}");
    assert_eq!(server.requests().len(), 4, "one retry only");
    shutdown(agent).await;
}
