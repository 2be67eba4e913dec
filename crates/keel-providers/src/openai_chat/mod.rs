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

mod stream;

use serde_json::{Value, json};

use self::stream::ChatDecoder;
use crate::ProviderSettings;
use crate::frame::{HttpModel, WireFormat, bearer_headers};
use crate::http::Secret;
use crate::sse::SseEvent;
use keel_model::{ModelRequest, ToolSpec};
use keel_protocol::TranscriptItem;

/// A model behind the OpenAI Chat Completions API.
pub type OpenAiChat = HttpModel<ChatCompletions>;

/// The Chat Completions wire format.
#[derive(Debug, Default)]
pub struct ChatCompletions;

impl WireFormat for ChatCompletions {
    type Decoder = ChatDecoder;

    const PATH: &'static str = "/chat/completions";

    const PROVIDER: &'static str = "openai";

    fn headers(&self, settings: &ProviderSettings) -> Vec<(String, Secret)> {
        bearer_headers(settings)
    }

    fn body(&self, settings: &ProviderSettings, request: &ModelRequest<'_>) -> Value {
        let mut body = json!({
            "model": settings.model,
            "messages": messages(request.instructions, request.history),
            "stream": true,
            // Ask for the final usage chunk; without it a stream reports no tokens.
            "stream_options": {"include_usage": true},
        });
        if !request.tools.is_empty() {
            body["tools"] = tools(request.tools);
        }
        if let Some(limit) = settings.max_output_tokens {
            body[max_tokens_field(&settings.base_url)] = json!(limit);
        }
        if let Some(temperature) = settings.temperature {
            body["temperature"] = json!(temperature);
        }
        body
    }

    fn events_of_complete(&self, answer: Value) -> Vec<SseEvent> {
        events_of_complete(answer)
    }

    fn decoder(&self, settings: &ProviderSettings) -> ChatDecoder {
        ChatDecoder::new(&settings.name)
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
    if crate::is_openai_itself(base_url) {
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
                    "function": {"name": name, "arguments": crate::well_formed_arguments(arguments)},
                }));
            }
            TranscriptItem::ToolResult {
                call_id,
                output,
                is_error,
            } => {
                flush(&mut assistant, &mut messages);
                // A tool message has no error field; the text carries it.
                let content = crate::tool_result_text(output, *is_error);
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
}
