//! OpenAI Chat Completions: `POST {base}/chat/completions`, streamed.
//!
//! The most widely spoken model API: OpenAI itself, and Ollama, vLLM,
//! llama.cpp's server, llama-cpp-python, LiteLLM and OpenRouter. The
//! request carries the whole history as `messages`; the response is a
//! stream of `data: {chunk}` events ending with `data: [DONE]`.
//!
//! What a chunk may carry, and what becomes of it:
//!
//! - `choices[0].delta.content` (and `refusal`): assistant text, streamed at
//!   once;
//! - `delta.reasoning_content` (llama.cpp, vLLM, DeepSeek) or
//!   `delta.reasoning` (vLLM, Ollama, OpenRouter): visible reasoning,
//!   streamed, not kept in the history (no server asks for it back in a
//!   form all of them accept);
//! - `delta.tool_calls`: pieces of tool calls, assembled by `index`: the id,
//!   type and name arrive first, the arguments in pieces;
//! - `choices[0].finish_reason`: the response is complete;
//! - `usage` (the last chunk, with `choices: []`, because the request sets
//!   `stream_options.include_usage`): token counts;
//! - `error`: the provider failed mid-stream.
//!
//! Servers add fields of their own (`timings`, `system_fingerprint`,
//! `logprobs`, `obfuscation`); they are ignored.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Value, json};

use super::http::{EventStream, HttpClient, Secret, message_of, with_retries, within_step_deadline};
use super::sse::SseEvent;
use super::{Emitter, ProviderError, ProviderSettings, ReadError};
use keel_model::{BoxFuture, Model, ModelEventSink, ModelOutput, ModelRequest, ToolCall, ToolSpec};
use keel_protocol::Result;
use keel_protocol::{TokenUsage, TranscriptItem, new_id};

/// A model behind the OpenAI Chat Completions API.
#[derive(Debug)]
pub struct OpenAiChat {
    settings: ProviderSettings,
    http: HttpClient,
}

impl OpenAiChat {
    /// A client for the model and endpoint in `settings`.
    pub fn new(settings: ProviderSettings) -> Result<Self> {
        let http = HttpClient::new(settings.name.clone(), settings.http.clone())?;
        Ok(Self { settings, http })
    }

    fn url(&self) -> String {
        format!("{}/chat/completions", self.settings.base_url)
    }

    /// The key as a bearer token, then the configured headers (which may
    /// replace it, for gateways that authenticate differently).
    fn headers(&self) -> Vec<(String, Secret)> {
        let mut headers = Vec::with_capacity(self.settings.headers.len() + 1);
        if let Some(key) = &self.settings.api_key {
            headers.push((
                "authorization".to_owned(),
                Secret::new(format!("Bearer {}", key.expose())),
            ));
        }
        headers.extend(self.settings.headers.iter().cloned());
        headers
    }

    /// The JSON body for `request`.
    fn body(&self, request: &ModelRequest<'_>) -> Value {
        let mut body = json!({
            "model": self.settings.model,
            "messages": messages(request.instructions, request.history),
            "stream": true,
            // Ask for the final usage chunk; without it a stream reports no tokens.
            "stream_options": {"include_usage": true},
        });
        if !request.tools.is_empty() {
            body["tools"] = tools(request.tools);
        }
        if let Some(limit) = self.settings.max_output_tokens {
            body[max_tokens_field(&self.settings.base_url)] = json!(limit);
        }
        if let Some(temperature) = self.settings.temperature {
            body["temperature"] = json!(temperature);
        }
        body
    }

    /// Reads the event stream up to `[DONE]`.
    async fn read(&self, mut stream: EventStream, emitter: &mut Emitter) -> Result<ModelOutput, ReadError> {
        if let Some(completion) = stream.take_complete() {
            stream.replay(events_of_complete(completion));
        }
        let mut response = Response::default();
        loop {
            let event = match stream.next().await {
                Ok(Some(event)) => event,
                // The body ended cleanly but the response did not.
                Ok(None) => return Err(self.truncated().into()),
                // The connection broke off mid-body: for the turn that is the
                // same thing, a response that stopped before `[DONE]`.
                Err(ProviderError::Connection { message, .. }) => {
                    tracing::debug!(provider = %self.settings.name, %message, "the response body broke off");
                    return Err(self.truncated().into());
                }
                Err(error) => return Err(error.into()),
            };
            let data = event.data.trim();
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(data).map_err(|error| self.malformed(&error))?;
            if let Some(error) = self.stream_error(&chunk, event.event.as_deref()) {
                return Err(error.into());
            }
            let chunk: Chunk = serde_json::from_value(chunk).map_err(|error| self.malformed(&error))?;
            response.apply(chunk, emitter)?;
        }
        // OpenAI ends every choice with a finish reason. A `[DONE]` without
        // one means generation stopped early: llama.cpp's server, for one,
        // reports a failure mid-stream as an `error:` line (not `data:`),
        // which an event-stream reader skips, and then sends `[DONE]`.
        if !response.finished {
            return Err(self.truncated().into());
        }
        Ok(response.output())
    }

    /// The provider's error, if `chunk` is one: OpenAI's `{"error": {...}}`,
    /// vLLM's `{"object": "error", "message": ...}`, or an `error` event.
    fn stream_error(&self, chunk: &Value, event: Option<&str>) -> Option<ProviderError> {
        let has_error = chunk.get("error").is_some_and(|error| !error.is_null())
            || chunk.get("object").and_then(Value::as_str) == Some("error")
            || event == Some("error");
        if !has_error {
            return None;
        }
        let error = chunk.get("error").unwrap_or(chunk);
        Some(ProviderError::Stream {
            provider: self.settings.name.clone(),
            message: message_of(chunk).unwrap_or_else(|| "the provider reported an error".to_owned()),
            retryable: is_passing(error),
        })
    }

    fn truncated(&self) -> ProviderError {
        ProviderError::Truncated {
            provider: self.settings.name.clone(),
        }
    }

    fn malformed(&self, error: &serde_json::Error) -> ProviderError {
        ProviderError::Malformed {
            provider: self.settings.name.clone(),
            message: format!("a chunk is not valid JSON of the expected shape: {error}"),
        }
    }
}

impl super::ReadStream for OpenAiChat {
    fn read_stream(
        &self,
        stream: EventStream,
        emitter: &mut Emitter,
    ) -> impl Future<Output = Result<ModelOutput, ReadError>> + Send {
        self.read(stream, emitter)
    }
}

impl Model for OpenAiChat {
    fn respond<'a>(&'a self, request: ModelRequest<'a>, events: ModelEventSink) -> BoxFuture<'a, Result<ModelOutput>> {
        Box::pin(async move {
            self.settings.check_context(request.instructions, request.history)?;
            let (url, headers, body) = (self.url(), self.headers(), self.body(&request));
            let attempts = with_retries(&self.settings.http.retry, |_| {
                super::attempt(&self.http, self, &url, &headers, &body, std::sync::Arc::clone(&events))
            });
            within_step_deadline(&self.settings.name, &self.settings.http, attempts).await
        })
    }

    fn name(&self) -> String {
        format!("{}:{}", self.settings.name, self.settings.model)
    }

    fn context_limits(&self) -> Option<keel_model::ContextLimits> {
        self.settings.context_limits()
    }
}

/// The events a stream would have carried for a complete, non-streamed
/// `chat.completion` (or an error object): one chunk whose choices carry
/// their `message` as the `delta`, tool calls numbered, then `[DONE]`.
fn events_of_complete(mut completion: Value) -> Vec<SseEvent> {
    let choices = completion.get_mut("choices").and_then(Value::as_array_mut);
    for choice in choices.into_iter().flatten() {
        let Some(choice) = choice.as_object_mut() else { continue };
        let Some(mut message) = choice.remove("message") else {
            continue;
        };
        let calls = message.get_mut("tool_calls").and_then(Value::as_array_mut);
        for (index, call) in calls.into_iter().flatten().enumerate() {
            if call.get("index").is_none() && call.is_object() {
                call["index"] = json!(index);
            }
        }
        choice.insert("delta".to_owned(), message);
    }
    let event = |data: String| SseEvent { event: None, data };
    vec![event(completion.to_string()), event("[DONE]".to_owned())]
}

/// `max_completion_tokens` for OpenAI itself, `max_tokens` elsewhere.
///
/// OpenAI documents `max_tokens` as deprecated in favour of
/// `max_completion_tokens` and not accepted by its reasoning models; but the
/// compatible servers read `max_tokens` (Ollama reads nothing else), so they
/// get the field they know.
fn max_tokens_field(base_url: &str) -> &'static str {
    if super::is_openai_itself(base_url) {
        "max_completion_tokens"
    } else {
        "max_tokens"
    }
}

/// The history as Chat Completions messages, after the system message.
fn messages(instructions: Option<&str>, history: &[TranscriptItem]) -> Vec<Value> {
    let mut messages = Vec::with_capacity(history.len() + 1);
    if let Some(instructions) = instructions.filter(|text| !text.is_empty()) {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    // Text and tool calls of one model step are one assistant message.
    let mut assistant: Option<Assistant> = None;
    for item in history {
        match item {
            TranscriptItem::UserMessage { text } => {
                flush(&mut assistant, &mut messages);
                messages.push(json!({"role": "user", "content": text}));
            }
            // Text of an interrupted step was seen by the user; the model
            // should know it said it.
            TranscriptItem::AssistantMessage { text, .. } => {
                let message = assistant.get_or_insert_with(Assistant::default);
                if !message.text.is_empty() && !text.is_empty() {
                    message.text.push_str("\n\n");
                }
                message.text.push_str(text);
            }
            TranscriptItem::ToolCall {
                call_id,
                name,
                arguments,
            } => {
                assistant.get_or_insert_with(Assistant::default).tool_calls.push(json!({
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": super::well_formed_arguments(arguments)},
                }));
            }
            TranscriptItem::ToolResult {
                call_id,
                output,
                is_error,
            } => {
                flush(&mut assistant, &mut messages);
                // A tool message has no error field; the text carries it.
                let content = super::tool_result_text(output, *is_error);
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}));
            }
            // Reasoning state belongs to the provider that produced it; Chat
            // Completions has no place to send it back.
            TranscriptItem::Reasoning { .. } => {}
            // Context from the runtime, not the user's words.
            TranscriptItem::Summary { text } => {
                flush(&mut assistant, &mut messages);
                messages.push(json!({"role": "system", "content": text}));
            }
        }
    }
    flush(&mut assistant, &mut messages);
    messages
}

/// An assistant message being gathered from consecutive history items.
#[derive(Default)]
struct Assistant {
    text: String,
    tool_calls: Vec<Value>,
}

fn flush(assistant: &mut Option<Assistant>, messages: &mut Vec<Value>) {
    let Some(message) = assistant.take() else { return };
    // `content` stays a string even beside tool calls: OpenAI takes "" there
    // as well as `null`, and servers that render messages through chat
    // templates (llama.cpp, llama-cpp-python) expect a string.
    let mut json = json!({"role": "assistant", "content": message.text});
    if !message.tool_calls.is_empty() {
        json["tool_calls"] = Value::Array(message.tool_calls);
    }
    messages.push(json);
}

fn tools(tools: &[ToolSpec]) -> Value {
    tools
        .iter()
        .map(|tool| {
            json!({
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            })
        })
        .collect()
}

/// Whether a stream error names a passing condition (overload, rate limit,
/// server trouble), by its type or code.
fn is_passing(error: &Value) -> bool {
    const PASSING: [&str; 7] = [
        "server_error",
        "internal_error",
        "rate_limit_exceeded",
        "rate_limit_error",
        "overloaded",
        "overloaded_error",
        "service_unavailable",
    ];
    ["type", "code"].iter().any(|field| match error.get(field) {
        Some(Value::String(kind)) => PASSING.contains(&kind.as_str()),
        Some(Value::Number(code)) => code
            .as_u64()
            .is_some_and(|code| code == 408 || code == 429 || code >= 500),
        _ => false,
    })
}

/// One `chat.completion.chunk`. Only what is used; unknown fields pass, and
/// `null` counts as absent.
#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    /// Servers disagree on the type of the reasoning fields beyond strings,
    /// so anything else is ignored rather than refused.
    #[serde(default)]
    reasoning_content: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Deserialize)]
struct PromptTokensDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct CompletionTokensDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl From<Usage> for TokenUsage {
    fn from(usage: Usage) -> Self {
        TokenUsage {
            input_tokens: usage.prompt_tokens.unwrap_or(0),
            cached_input_tokens: usage
                .prompt_tokens_details
                .and_then(|details| details.cached_tokens)
                .unwrap_or(0),
            output_tokens: usage.completion_tokens.unwrap_or(0),
            reasoning_tokens: usage
                .completion_tokens_details
                .and_then(|details| details.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

/// The response as assembled so far.
#[derive(Default)]
struct Response {
    text: String,
    calls: Vec<PartialCall>,
    /// Where each wire `index` currently points in `calls`.
    by_index: HashMap<u64, usize>,
    usage: Option<TokenUsage>,
    finished: bool,
    /// The finish reason was `length`: the output limit cut the response.
    length_limited: bool,
}

/// A tool call whose pieces are still arriving.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

impl Response {
    fn apply(&mut self, chunk: Chunk, emitter: &mut Emitter) -> Result<(), keel_protocol::Error> {
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into());
        }
        // One choice was asked for (`n` is not set); others are not ours.
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.delta {
                self.apply_delta(delta, emitter)?;
            }
            if let Some(reason) = choice.finish_reason {
                self.finished = true;
                self.length_limited = reason == "length";
            }
        }
        Ok(())
    }

    fn apply_delta(&mut self, delta: Delta, emitter: &mut Emitter) -> Result<(), keel_protocol::Error> {
        // Some servers send both names for the same reasoning; take one.
        let reasoning = [&delta.reasoning_content, &delta.reasoning]
            .into_iter()
            .find_map(|field| field.as_ref().and_then(Value::as_str).filter(|text| !text.is_empty()));
        if let Some(reasoning) = reasoning {
            emitter.reasoning(reasoning)?;
        }
        // A refusal is the model's answer in place of content.
        for text in [delta.content, delta.refusal].into_iter().flatten() {
            emitter.text(&text)?;
            self.text.push_str(&text);
        }
        for call in delta.tool_calls.unwrap_or_default() {
            self.apply_call(call);
        }
        Ok(())
    }

    /// Adds a piece of a tool call to the call its `index` names. A piece
    /// with another id than the call at that index starts a new call (some
    /// servers number every complete call 0); a piece without an index
    /// continues the last call unless its id is new.
    fn apply_call(&mut self, piece: ToolCallDelta) {
        let id = piece.id.filter(|id| !id.is_empty());
        let continues = |call: &PartialCall| id.as_ref().is_none_or(|id| call.id.is_empty() || *id == call.id);
        let current = match piece.index {
            Some(index) => self.by_index.get(&index).copied(),
            None => self.calls.len().checked_sub(1),
        };
        let position = match current {
            Some(position) if continues(&self.calls[position]) => position,
            _ => {
                self.calls.push(PartialCall::default());
                self.calls.len() - 1
            }
        };
        if let Some(index) = piece.index {
            self.by_index.insert(index, position);
        }
        let call = &mut self.calls[position];
        if let Some(id) = id {
            call.id = id;
        }
        if let Some(function) = piece.function {
            // The name comes whole in one piece; some servers repeat it.
            if let Some(name) = function.name.filter(|name| *name != call.name) {
                call.name.push_str(&name);
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    fn output(self) -> ModelOutput {
        let calls = self
            .calls
            .into_iter()
            .map(|call| ToolCall {
                // Results refer to calls by id, so a call needs one even when
                // the server gave none.
                call_id: if call.id.is_empty() {
                    format!("call_{}", new_id())
                } else {
                    call.id
                },
                name: call.name,
                // A call without arguments takes the empty object.
                arguments: if call.arguments.trim().is_empty() {
                    "{}".to_owned()
                } else {
                    call.arguments
                },
            })
            .collect();
        let mut output = ModelOutput::text(self.text).with_tool_calls(calls);
        if self.length_limited {
            output = output.cut_at_length_limit();
        }
        match self.usage {
            Some(usage) => output.with_usage(usage),
            None => output,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_itself_gets_max_completion_tokens_and_other_servers_max_tokens() {
        let body = |base: &str| {
            let mut settings = ProviderSettings::new("openai", "gpt-4.1-mini", base);
            settings.max_output_tokens = Some(512);
            settings.temperature = Some(0.5);
            let model = OpenAiChat::new(settings).expect("client");
            model.body(&ModelRequest::new("s", "t", &[], 0))
        };
        let official = body("https://api.openai.com/v1");
        assert_eq!(official["max_completion_tokens"], 512);
        assert!(official.get("max_tokens").is_none());
        assert_eq!(official["temperature"], 0.5);
        assert!(official.get("tools").is_none(), "no tools, no tools field");
        for base in ["http://localhost:11434/v1", "http://127.0.0.1:8080/v1", "not a url"] {
            let other = body(base);
            assert_eq!(other["max_tokens"], 512, "{base}");
            assert!(other.get("max_completion_tokens").is_none(), "{base}");
        }
    }

    #[test]
    fn consecutive_assistant_items_form_one_message_and_foreign_reasoning_is_skipped() {
        let history = vec![
            TranscriptItem::UserMessage { text: "hi".into() },
            TranscriptItem::Reasoning {
                provider: "anthropic".into(),
                data: json!({"type": "thinking"}),
            },
            TranscriptItem::ToolCall {
                call_id: "a".into(),
                name: "clock".into(),
                arguments: "{}".into(),
            },
            TranscriptItem::ToolResult {
                call_id: "a".into(),
                output: "noon".into(),
                is_error: false,
            },
            TranscriptItem::AssistantMessage {
                text: "It is no".into(),
                interrupted: true,
            },
            TranscriptItem::UserMessage { text: "go on".into() },
        ];
        assert_eq!(
            messages(Some(""), &history),
            vec![
                json!({"role": "user", "content": "hi"}),
                json!({"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
                ]}),
                json!({"role": "tool", "tool_call_id": "a", "content": "noon"}),
                json!({"role": "assistant", "content": "It is no"}),
                json!({"role": "user", "content": "go on"}),
            ]
        );
    }

    fn piece(index: Option<u64>, id: Option<&str>, name: Option<&str>, arguments: &str) -> ToolCallDelta {
        ToolCallDelta {
            index,
            id: id.map(str::to_owned),
            function: Some(FunctionDelta {
                name: name.map(str::to_owned),
                arguments: Some(arguments.to_owned()),
            }),
        }
    }

    #[test]
    fn tool_call_pieces_are_assembled_by_index_or_by_id() {
        let mut response = Response::default();
        response.apply_call(piece(Some(0), Some("a"), Some("f"), "{\"x\""));
        response.apply_call(piece(Some(1), Some("b"), Some("g"), ""));
        response.apply_call(piece(Some(0), None, None, ": 1}"));
        // A server repeating id and name on every piece.
        response.apply_call(piece(Some(1), Some("b"), Some("g"), "{}"));
        // A server numbering every complete call 0.
        response.apply_call(piece(Some(0), Some("c"), Some("h"), "{\"y\": 2}"));
        // No index at all: continues the last call, or starts one with a new id.
        response.apply_call(piece(None, Some("d"), Some("k"), "{\"z\""));
        response.apply_call(piece(None, None, None, ": 3}"));
        // A name in two pieces.
        response.apply_call(piece(None, None, Some("ey"), ""));
        let calls = response.output().tool_calls;
        let got: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|call| (call.call_id.as_str(), call.name.as_str(), call.arguments.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "f", "{\"x\": 1}"),
                ("b", "g", "{}"),
                ("c", "h", "{\"y\": 2}"),
                ("d", "key", "{\"z\": 3}"),
            ]
        );
    }

    #[test]
    fn a_call_without_id_or_arguments_gets_both() {
        let mut response = Response::default();
        response.apply_call(piece(Some(0), None, Some("clock"), ""));
        let calls = response.output().tool_calls;
        assert_eq!(calls.len(), 1);
        assert!(calls[0].call_id.starts_with("call_"), "{:?}", calls[0]);
        assert_eq!(calls[0].arguments, "{}");
    }

    #[test]
    fn passing_stream_errors_are_told_by_type_or_code() {
        assert!(is_passing(&json!({"type": "server_error", "message": "x"})));
        assert!(is_passing(&json!({"code": "rate_limit_exceeded"})));
        assert!(is_passing(&json!({"code": 503, "message": "x"})));
        assert!(!is_passing(
            &json!({"type": "invalid_request_error", "code": "context_length_exceeded"})
        ));
        assert!(!is_passing(&json!({"message": "x"})));
    }
}
