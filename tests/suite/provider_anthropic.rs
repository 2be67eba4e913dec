//! The Anthropic Messages adapter over real HTTP on loopback: what it sends,
//! how it reads streams split anywhere, tool calls, thinking, usage, retries
//! and failures, and whole turns through an agent. The streams are fixtures
//! written after Anthropic's streaming reference (`tests/fixtures/anthropic`).

use std::sync::Arc;
use std::time::Duration;

use keel::agent::{ModelEvent, ModelOutput, ModelRequest};
use keel::model::{RequestParameters, ToolSpec};
use keel::protocol::{AbortReason, TranscriptItem};
use keel::provider::anthropic::Anthropic;
use keel::provider::http::{RetryPolicy, Secret};
use keel::provider::{ProviderError, ProviderSettings};
use keel::store::SqliteCheckpoint;
use keel::{Agent, CheckpointStore, Error, EventMsg, Model, Op};
use serde_json::{Value, json};

use crate::suite::support::http_server::{Part, Reply, ScriptedServer};
use crate::suite::support::{agent::*, events::*, model::*, provider::*, store::*, wait::*};

const SESSION: &str = "anthropic-session";
const KEY: &str = "sk-ant-api03-keel-test-key-do-not-show";

const TEXT: &[u8] = include_bytes!("../fixtures/anthropic/text.sse");
const TOOL_CALLS: &[u8] = include_bytes!("../fixtures/anthropic/tool_calls.sse");
const THINKING_CLOCK: &[u8] = include_bytes!("../fixtures/anthropic/thinking_clock.sse");
const CLOCK_CALL: &[u8] = include_bytes!("../fixtures/anthropic/clock_call.sse");
const ANSWER: &[u8] = include_bytes!("../fixtures/anthropic/answer.sse");
const ERROR_MID_STREAM: &[u8] = include_bytes!("../fixtures/anthropic/error_mid_stream.sse");
const ERROR_AT_START: &[u8] = include_bytes!("../fixtures/anthropic/error_at_start.sse");
const PARTIAL: &[u8] = include_bytes!("../fixtures/anthropic/partial.sse");
const MESSAGE_START: &[u8] = include_bytes!("../fixtures/anthropic/message_start.sse");
const MAX_TOKENS_TOOL: &[u8] = include_bytes!("../fixtures/anthropic/max_tokens_tool.sse");
const MALFORMED: &[u8] = include_bytes!("../fixtures/anthropic/malformed.sse");
const ERROR_401: &str = include_str!("../fixtures/anthropic/error_401.json");
const ERROR_429: &str = include_str!("../fixtures/anthropic/error_429.json");
const ERROR_529: &str = include_str!("../fixtures/anthropic/error_529.json");

/// The text `text.sse` streams, in its three deltas.
const TEXT_DELTAS: [&str; 3] = ["Héllo", ", wörld ", "🌍 — 日本語"];

/// Settings for the scripted server, with a key and quick retries.
fn settings(server: &ScriptedServer) -> ProviderSettings {
    let mut settings = ProviderSettings::new("anthropic", "claude-sonnet-4-5", server.url());
    settings.api_key = Some(Secret::new(KEY));
    settings.http.retry = RetryPolicy {
        max_retries: 2,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        max_retry_after: Duration::from_secs(5),
    };
    settings
}

fn model(settings: ProviderSettings) -> Anthropic {
    Anthropic::new(settings).expect("build the adapter")
}

/// What one call of the model returned and streamed.
struct Called {
    result: keel::Result<ModelOutput>,
    events: Vec<ModelEvent>,
}

impl Called {
    fn output(&self) -> &ModelOutput {
        match &self.result {
            Ok(output) => output,
            Err(error) => panic!("expected an answer, got: {error}"),
        }
    }

    fn provider_error(&self) -> &ProviderError {
        match &self.result {
            Err(Error::Provider(error)) => error,
            other => panic!("expected a provider error, got {other:?}"),
        }
    }

    fn text(&self) -> Vec<&str> {
        text_deltas(&self.events)
    }
}

/// Calls `model` once with `history`, `instructions` and `tools`.
async fn call(model: &Anthropic, history: &[TranscriptItem], instructions: Option<&str>, tools: &[ToolSpec]) -> Called {
    let mut request = ModelRequest::new(SESSION, "turn-1", history, 0);
    request.instructions = instructions;
    request.tools = tools;
    let (result, events) = call_model(model, request).await;
    Called { result, events }
}

/// Calls `model` with one user message.
async fn ask(model: &Anthropic, text: &str) -> Called {
    call(model, &[user_item(text)], None, &[]).await
}

/// The `messages` of the `n`-th request the server received.
fn sent_messages(server: &ScriptedServer, n: usize) -> Value {
    server.requests()[n].json()["messages"].clone()
}

/// An agent on `model`, with the built-in tools and per-delta streaming.
async fn start_agent_on(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: Anthropic) -> Agent {
    provider_agent(db, store, SESSION, Arc::new(model), "Answer briefly.").await
}

/// Asserts that `KEY` appears in no stored event of the session.
async fn assert_key_absent(store: &SqliteCheckpoint) {
    let stored = stored_events(store, SESSION).await;
    assert!(!stored.is_empty());
    let json = serde_json::to_string(&stored).expect("serialize");
    assert!(!json.contains(KEY), "the API key leaked into the events: {json}");
}

/// What the session's store holds.
async fn load(store: &SqliteCheckpoint) -> keel::store::SessionState {
    guard("load the session", store.load(SESSION))
        .await
        .expect("load")
        .expect("the session exists")
}

// 1. Streams.

#[tokio::test]
async fn text_streams_whole_whatever_the_pieces_and_line_ends() {
    let crlf = String::from_utf8(TEXT.to_vec()).expect("UTF-8").replace('\n', "\r\n");
    let variants: Vec<(&str, &[u8], usize)> = vec![
        ("LF, 1-byte pieces", TEXT, 1),
        ("LF, 5-byte pieces", TEXT, 5),
        ("LF, 64-byte pieces", TEXT, 64),
        ("CRLF, 1-byte pieces", crlf.as_bytes(), 1),
        ("CRLF, 5-byte pieces", crlf.as_bytes(), 5),
    ];
    for (variant, body, piece) in variants {
        let server = ScriptedServer::start(vec![Reply::sse_in_pieces(body, piece)]).await;
        let model = model(settings(&server));
        let called = ask(&model, "Say hello").await;
        let output = called.output();
        // Each text delta reaches the sink whole, as soon as it arrives.
        assert_eq!(called.text(), TEXT_DELTAS, "{variant}");
        assert_eq!(output.text, TEXT_DELTAS.concat(), "{variant}");
        assert!(output.tool_calls.is_empty() && output.reasoning.is_empty(), "{variant}");
        assert_eq!(output.usage, Some(usage(25, 0, 15)), "{variant}");
        // The message's id and dated model, from `message_start`.
        assert_eq!(
            output.response_id.as_deref(),
            Some("msg_01XFDUDYJgAACzvnptvVoYEL"),
            "{variant}"
        );
        assert_eq!(
            output.response_model.as_deref(),
            Some("claude-sonnet-4-5-20250929"),
            "{variant}"
        );
        assert_eq!(server.requests().len(), 1, "{variant}");
    }
}

#[tokio::test]
async fn a_request_without_settings_gets_the_default_max_tokens_and_no_optional_fields() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(TEXT, 64)]).await;
    let mut settings = settings(&server);
    settings.api_key = None;
    let model = model(settings);
    assert_eq!(model.name(), "anthropic:claude-sonnet-4-5");
    ask(&model, "Say hello").await.output();
    let request = &server.requests()[0];
    assert_eq!(request.header("x-api-key"), None, "no key, no key header");
    assert_eq!(
        request.json(),
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 4096,
            // The end of the history is the prompt cache's breakpoint.
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Say hello", "cache_control": {"type": "ephemeral"}},
            ]}],
            "stream": true,
        })
    ); // A step's span reports the limit the body carries, default or not.
    assert_eq!(
        model.request_parameters(),
        RequestParameters {
            max_tokens: Some(4096),
            temperature: None
        }
    );
}

#[tokio::test]
async fn several_tool_calls_in_one_step_are_assembled_from_their_pieces() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(TOOL_CALLS, 3)]).await;
    let model = model(settings(&server));
    let called = ask(&model, "Weather and time in San Francisco?").await;
    let output = called.output();
    assert_eq!(output.text, "I'll look up both.");
    assert_eq!(called.text(), ["I'll look", " up both."]);
    let calls: Vec<(&str, &str, &str)> = output
        .tool_calls
        .iter()
        .map(|call| (call.call_id.as_str(), call.name.as_str(), call.arguments.as_str()))
        .collect();
    assert_eq!(
        calls,
        [
            (
                "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "get_weather",
                r#"{"location": "San Francisco, CA", "unit": "celsius"}"#,
            ),
            (
                "toolu_01BqS3Rx4vQ8gT2mN6pLk9Yw",
                "get_time",
                r#"{"timezone": "America/Los_Angeles"}"#,
            ),
        ]
    );
    assert_eq!(output.usage, Some(usage(472, 0, 89)));
}

#[tokio::test]
async fn a_malformed_event_fails_the_call_without_a_retry() {
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(MALFORMED, 64),
        Reply::sse_in_pieces(TEXT, 64),
    ])
    .await;
    let model = model(settings(&server));
    let called = ask(&model, "hi").await;
    let error = called.provider_error();
    assert!(matches!(error, ProviderError::Malformed { .. }), "{error:?}");
    assert!(
        error.to_string().starts_with("anthropic: malformed response: "),
        "{error}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_tool_call_cut_off_by_max_tokens_fails_instead_of_running() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(MAX_TOKENS_TOOL, 64)]).await;
    let mut settings = settings(&server);
    settings.max_output_tokens = Some(1024);
    let model = model(settings);
    let called = ask(&model, "Write my notes to a file").await;
    assert_eq!(called.text(), ["Writing the file."]);
    let error = called.provider_error();
    assert!(!error.is_retryable(), "{error:?}");
    assert_eq!(
        error.to_string(),
        "anthropic: the response reached its limit of 1024 output tokens in the middle of a call to 'write_file', \
         so the call was not run; raise max_output_tokens"
    );
    assert_eq!(server.requests().len(), 1);
}

// 2. What is sent.

#[tokio::test]
async fn the_request_body_merges_the_history_into_alternating_roles() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(TEXT, 64)]).await;
    let mut settings = settings(&server);
    settings.max_output_tokens = Some(1024);
    settings.temperature = Some(0.25);
    let model = model(settings);
    let redacted = json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"});
    let history = vec![
        user_item("What is the weather in Paris, and the time there?"),
        TranscriptItem::Reasoning {
            provider: "anthropic".to_owned(),
            data: redacted.clone(),
        },
        // Another provider's reasoning state means nothing to this one.
        TranscriptItem::Reasoning {
            provider: "openai-responses".to_owned(),
            data: json!({"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAAA"}),
        },
        assistant_item("Let me check both.", false),
        TranscriptItem::ToolCall {
            call_id: "toolu_01".to_owned(),
            name: "get_weather".to_owned(),
            arguments: r#"{"city": "Paris"}"#.to_owned(),
        },
        TranscriptItem::ToolCall {
            call_id: "toolu_02".to_owned(),
            name: "get_time".to_owned(),
            // Malformed: the call already failed with an error result.
            arguments: r#"{"timezone": "Europe/Par"#.to_owned(),
        },
        TranscriptItem::ToolResult {
            call_id: "toolu_01".to_owned(),
            output: "18°C, cloudy".to_owned(),
            is_error: false,
        },
        TranscriptItem::ToolResult {
            call_id: "toolu_02".to_owned(),
            output: "invalid arguments for 'get_time': not valid JSON".to_owned(),
            is_error: true,
        },
        user_item("And tomorrow?"),
    ];
    let tools = vec![
        ToolSpec {
            name: "get_weather".to_owned(),
            description: "The weather in a city.".to_owned(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        },
        ToolSpec {
            name: "get_time".to_owned(),
            description: "The time in a time zone.".to_owned(),
            parameters: json!({"type": "object", "properties": {"timezone": {"type": "string"}}}),
        },
    ];
    call(&model, &history, Some("You are terse."), &tools).await.output();
    assert_eq!(
        server.requests()[0].json(),
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "temperature": 0.25,
            "stream": true,
            // Tools, system and the history each end with a prompt-cache
            // breakpoint: the next step's request starts with all of it.
            "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
            "tools": [
                {
                    "name": "get_weather",
                    "description": "The weather in a city.",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                },
                {
                    "name": "get_time",
                    "description": "The time in a time zone.",
                    "input_schema": {"type": "object", "properties": {"timezone": {"type": "string"}}},
                    "cache_control": {"type": "ephemeral"},
                },
            ],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "What is the weather in Paris, and the time there?"},
                ]},
                {"role": "assistant", "content": [
                    redacted,
                    {"type": "text", "text": "Let me check both."},
                    {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18°C, cloudy", "is_error": false},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_02",
                        "content": "invalid arguments for 'get_time': not valid JSON",
                        "is_error": true,
                    },
                    {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}},
                ]},
            ],
        })
    );
}

#[tokio::test]
async fn requests_carry_the_key_and_version_and_no_event_shows_the_key() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(TEXT, 64)]).await;
    let mut settings = settings(&server);
    settings.headers = vec![("anthropic-beta".to_owned(), Secret::new("context-1m-2025-08-07"))];
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings)).await;
    let turn = run_turn(&mut agent, "Say hello").await;
    assert_eq!(turn.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_eq!(assistant_text(&turn), TEXT_DELTAS.concat());

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/messages");
    assert_eq!(request.header("x-api-key"), Some(KEY));
    assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("anthropic-beta"), Some("context-1m-2025-08-07"));
    assert_eq!(request.header("authorization"), None);
    assert_eq!(request.json()["system"][0]["text"], "Answer briefly.");
    assert_key_absent(&store).await;
    shutdown(agent).await;
}

#[tokio::test]
async fn a_history_that_cannot_fit_the_context_window_is_refused_before_sending() {
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(TEXT, 64)]).await;
    let mut settings = settings(&server);
    settings.context_window = Some(10);
    let model = model(settings);
    let called = ask(&model, &"long question ".repeat(20)).await;
    assert!(
        matches!(called.provider_error(), ProviderError::Request { .. }),
        "{:?}",
        called.result
    );
    assert!(server.requests().is_empty());
}

// 3. Whole turns through an agent.

#[tokio::test]
async fn a_turn_runs_the_clock_tool_sends_its_result_back_and_sums_the_usage() {
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(CLOCK_CALL, 5),
        Reply::sse_in_pieces(ANSWER, 5),
    ])
    .await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    let turn = run_turn(&mut agent, "What time is it?").await;
    assert_eq!(
        kinds(&turn),
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
    let (call_id, arguments, output) = turn
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::ToolCallStarted(started) => Some((started.call_id.clone(), started.arguments.clone())),
            _ => None,
        })
        .zip(turn.iter().find_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(completed) => {
                assert!(!completed.is_error, "{completed:?}");
                Some(completed.output.clone())
            }
            _ => None,
        }))
        .map(|((id, arguments), output)| (id, arguments, output))
        .expect("a tool call");
    assert_eq!(call_id, "toolu_01A09q90qw90lq917835lq9");
    assert_eq!(arguments, "{}", "a call without parameters gets the empty object");
    assert!(output.contains("\"utc\""), "{output}");
    assert_eq!(assistant_text(&turn), "It is 12:00 UTC.");

    // Step 2 sends the call and its result back, tied by the tool_use id.
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let second = requests[1].json();
    // The stable prefix is marked for the prompt cache: system, the (last)
    // tool, and the end of the history, here the tool result.
    let ephemeral = json!({"type": "ephemeral"});
    assert_eq!(
        second["system"],
        json!([{"type": "text", "text": "Answer briefly.", "cache_control": ephemeral}])
    );
    assert_eq!(second["tools"][0]["name"], "clock");
    assert_eq!(second["tools"][0]["input_schema"]["type"], "object");
    assert_eq!(second["tools"][0]["cache_control"], ephemeral);
    assert_eq!(
        second["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "What time is it?"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "clock", "input": {}},
            ]},
            {"role": "user", "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                    "content": output,
                    "is_error": false,
                    "cache_control": ephemeral,
                },
            ]},
        ])
    );

    // Usage: the prompt is the uncached, cache-written and cache-read tokens
    // together; what the second step read from the cache is recorded.
    let step_one = usage(150, 0, 20);
    let step_two = usage(160, 150, 12);
    let total = usage(310, 150, 32);
    assert_eq!(token_usages(&turn), [(1, step_one, step_one), (2, step_two, total)]);
    shutdown(agent).await;
    assert_eq!(load(&store).await.checkpoint.usage, total);
}

#[tokio::test]
async fn thinking_is_streamed_kept_and_sent_back_first_and_unchanged() {
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(THINKING_CLOCK, 7),
        Reply::sse_in_pieces(ANSWER, 64),
    ])
    .await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    let turn = run_turn(&mut agent, "What time is it?").await;
    assert_eq!(
        kinds(&turn),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "reasoning_delta",
            "reasoning_delta",
            "assistant_content_delta",
            "assistant_message",
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
    let reasoning: Vec<&str> = turn
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ReasoningDelta(delta) => Some(delta.delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasoning,
        ["The user asks for the time.", "\nI cannot know it; the clock tool can."]
    );

    let thinking = json!({
        "type": "thinking",
        "thinking": "The user asks for the time.\nI cannot know it; the clock tool can.",
        "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds",
    });
    // Sent back on step 2 ahead of the text and the call, as it came.
    let messages = sent_messages(&server, 1);
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": [
            thinking,
            {"type": "text", "text": "Let me check the clock."},
            {"type": "tool_use", "id": "toolu_01Ckq7ZbNd3Wm5Ht8Rv2Ys4X", "name": "clock", "input": {}},
        ]})
    );
    assert_eq!(
        messages[2]["content"][0]["tool_use_id"],
        "toolu_01Ckq7ZbNd3Wm5Ht8Rv2Ys4X"
    );
    shutdown(agent).await;

    // Kept in the session's history.
    let transcript = load(&store).await.transcript;
    assert_eq!(
        transcript[1],
        TranscriptItem::Reasoning {
            provider: "anthropic".to_owned(),
            data: thinking,
        }
    );
    assert_eq!(transcript[2], assistant_item("Let me check the clock.", false));
}

// 4. Failures and retries.

#[tokio::test]
async fn a_rate_limit_with_retry_after_is_retried_then_streams_once() {
    let server = ScriptedServer::start(vec![
        Reply::json(429, ERROR_429).header("retry-after", "1"),
        Reply::sse_in_pieces(TEXT, 64),
    ])
    .await;
    let model = model(settings(&server));
    let called = ask(&model, "Say hello").await;
    assert_eq!(called.output().text, TEXT_DELTAS.concat());
    assert_eq!(called.text(), TEXT_DELTAS, "streamed once");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body, requests[1].body, "the same request again");
}

#[tokio::test]
async fn an_overloaded_api_is_retried_then_streams() {
    let server = ScriptedServer::start(vec![Reply::json(529, ERROR_529), Reply::sse_in_pieces(TEXT, 64)]).await;
    let model = model(settings(&server));
    let called = ask(&model, "Say hello").await;
    assert_eq!(called.output().text, TEXT_DELTAS.concat());
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn an_authentication_failure_ends_the_turn_with_the_providers_message_and_no_retry() {
    let server = ScriptedServer::start(vec![Reply::json(401, ERROR_401), Reply::sse_in_pieces(TEXT, 64)]).await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    let turn = run_turn(&mut agent, "Say hello").await;
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
    let message = "anthropic: HTTP 401: authentication_error: invalid x-api-key";
    assert_eq!(error_messages(&turn), [message]);
    assert_eq!(abort_of(&turn), (AbortReason::ModelFailed, message.to_owned()));
    assert_eq!(server.requests().len(), 1, "a refused key is not retried");
    assert_key_absent(&store).await;
    shutdown(agent).await;
}

#[tokio::test]
async fn an_error_event_after_text_ends_the_turn_without_a_retry_and_keeps_the_text() {
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(ERROR_MID_STREAM, 64),
        Reply::sse_in_pieces(TEXT, 64),
    ])
    .await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    let turn = run_turn(&mut agent, "Say something").await;
    assert_eq!(
        kinds(&turn),
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
    assert_eq!(deltas(&turn), ["Partial ", "answer"]);
    assert_eq!(error_messages(&turn), ["anthropic: overloaded_error: Overloaded"]);
    assert_eq!(abort_of(&turn).0, AbortReason::ModelFailed);
    assert_eq!(server.requests().len(), 1, "nothing is streamed twice");
    shutdown(agent).await;
    let transcript = load(&store).await.transcript;
    assert_eq!(transcript.last(), Some(&assistant_item("Partial answer", true)));
}

#[tokio::test]
async fn an_error_event_before_any_output_is_retried() {
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(ERROR_AT_START, 64),
        Reply::sse_in_pieces(TEXT, 64),
    ])
    .await;
    let model = model(settings(&server));
    let called = ask(&model, "Say hello").await;
    assert_eq!(called.output().text, TEXT_DELTAS.concat());
    assert_eq!(called.text(), TEXT_DELTAS);
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_stream_without_message_stop_fails_and_is_retried_only_if_nothing_was_streamed() {
    // Cut off after some text: the text stays streamed, nothing is retried.
    let server = ScriptedServer::start(vec![
        Reply::sse(vec![Part::Bytes(PARTIAL.to_vec()), Part::Cut]),
        Reply::sse_in_pieces(TEXT, 64),
    ])
    .await;
    let called = ask(&model(settings(&server)), "hi").await;
    assert_eq!(called.text(), ["Partial answer"]);
    // The HTTP layer sees the body's framing end early: a broken connection.
    let error = called.provider_error();
    assert!(
        matches!(error, ProviderError::Connection { message, .. } if message.starts_with("the response body broke off")),
        "{error:?}"
    );
    assert!(
        error.to_string().starts_with("anthropic: connection failed: "),
        "{error}"
    );
    assert_eq!(server.requests().len(), 1);

    // The body ends cleanly, but without message_stop.
    let server = ScriptedServer::start(vec![Reply::sse_in_pieces(PARTIAL, 64), Reply::sse_in_pieces(TEXT, 64)]).await;
    let called = ask(&model(settings(&server)), "hi").await;
    assert_eq!(called.text(), ["Partial answer"]);
    assert_eq!(
        called.provider_error(),
        &ProviderError::Truncated {
            provider: "anthropic".to_owned()
        }
    );
    assert_eq!(server.requests().len(), 1);

    // Cut off before anything was streamed: tried again.
    let server = ScriptedServer::start(vec![
        Reply::sse(vec![Part::Bytes(MESSAGE_START.to_vec()), Part::Cut]),
        Reply::sse_in_pieces(TEXT, 64),
    ])
    .await;
    let called = ask(&model(settings(&server)), "hi").await;
    assert_eq!(called.output().text, TEXT_DELTAS.concat());
    assert_eq!(called.text(), TEXT_DELTAS);
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_stalled_stream_fails_after_the_idle_timeout() {
    // The first stall comes before any output and is retried; the second
    // comes after some text and ends the call.
    let server = ScriptedServer::start(vec![
        Reply::sse(vec![Part::Bytes(MESSAGE_START.to_vec()), Part::Stall]),
        Reply::sse(vec![Part::Bytes(PARTIAL.to_vec()), Part::Stall]),
        Reply::sse_in_pieces(TEXT, 64),
    ])
    .await;
    let mut settings = settings(&server);
    settings.http.idle_timeout = Duration::from_millis(500);
    let called = ask(&model(settings), "hi").await;
    assert_eq!(called.text(), ["Partial answer"]);
    // The second request stalled after output; the error counts both.
    assert_eq!(
        called.provider_error(),
        &ProviderError::GaveUp {
            attempts: 2,
            last: Box::new(ProviderError::Stalled {
                provider: "anthropic".to_owned(),
                after: Duration::from_millis(500),
            }),
        }
    );
    assert_eq!(server.requests().len(), 2);
    guard("both stalled responses abandoned", server.wait_abandoned(2)).await;
}

#[tokio::test]
async fn an_interrupt_during_streaming_cancels_the_request() {
    let server = ScriptedServer::start(vec![Reply::sse(vec![Part::Bytes(PARTIAL.to_vec()), Part::Stall])]).await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    agent.sender().submit(user("Tell me a long story")).expect("submit");
    let streamed = read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    assert_eq!(deltas(&streamed), ["Partial answer"]);

    let interrupt = agent
        .sender()
        .submit(Op::Interrupt { turn_id: None })
        .expect("interrupt");
    let end = read_turn(&mut agent).await;
    assert_eq!(kinds(&end), ["turn_aborted"]);
    assert_eq!(end[0].submission_id.as_deref(), Some(interrupt.id.as_str()));
    assert_eq!(abort_of(&end).0, AbortReason::Interrupted);
    guard("the cancelled response abandoned", server.wait_abandoned(1)).await;
    assert_eq!(server.requests().len(), 1);
    shutdown(agent).await;
}

/// Anthropic's documented answer to a prompt longer than the model's context.
const PROMPT_TOO_LONG: &str = r#"{"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 208123 tokens > 200000 maximum"}}"#;

#[tokio::test]
async fn prompt_too_long_compacts_the_history_once_and_retries_the_step() {
    let server = ScriptedServer::start(vec![
        Reply::sse_in_pieces(ANSWER, 64),
        Reply::json(400, PROMPT_TOO_LONG),
        Reply::sse_in_pieces(ANSWER, 64),
        Reply::sse_in_pieces(ANSWER, 64),
    ])
    .await;
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent_on(&db, &store, model(settings(&server))).await;
    run_turn(&mut agent, "What time is it?").await;
    let events = run_turn(&mut agent, "And now?").await;
    let kinds = kinds(&events);
    assert!(
        kinds.contains(&"context_compacted") && kinds.ends_with(&["turn_complete"]),
        "{kinds:?}"
    );
    assert_eq!(server.requests().len(), 4);
    let summary_request = sent_messages(&server, 2);
    let summary_request = summary_request.as_array().expect("messages");
    assert_eq!(summary_request.len(), 3, "{summary_request:?}");
    assert!(
        summary_request[2].to_string().contains("about to be shortened"),
        "{summary_request:?}"
    );
    let retried = sent_messages(&server, 3);
    let retried = retried.as_array().expect("messages");
    // The summary is context in `system`, not a user message.
    let system = server.requests()[3].json()["system"].to_string();
    assert!(system.contains("Summary of the earlier conversation"), "{system}");
    assert!(
        !retried
            .iter()
            .any(|message| message.to_string().contains("Summary of the earlier conversation")),
        "{retried:?}"
    );
    assert_eq!(retried[0]["role"], "user", "{retried:?}");
    assert!(
        retried.last().expect("a message").to_string().contains("And now?"),
        "{retried:?}"
    );
    assert!(
        !retried
            .iter()
            .any(|message| message.to_string().contains("What time is it?")),
        "{retried:?}"
    );
    shutdown(agent).await;
}
