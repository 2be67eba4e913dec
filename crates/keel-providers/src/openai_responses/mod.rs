//! OpenAI Responses: `POST {base}/responses` with `stream: true`.
//!
//! **Request.** Keel's history becomes `input` items: user messages
//! (`input_text`), assistant messages (`output_text`), `function_call` and
//! `function_call_output` items, and the reasoning items this protocol
//! produced, sent back exactly as the API gave them (reasoning of other
//! providers is skipped). Tools are flat `function` tools.
//!
//! Earlier assistant output goes back in the shape the API produced it:
//! messages with `status` and `annotations`, function calls with `status`,
//! and, for every server but OpenAI's own (which refuses ids of items it did
//! not store), an `id`, as strict implementations (vLLM, Azure) require. A
//! failed tool result, which has no error field here, starts with `Error:`.
//!
//! **Statelessness.** Keel owns the conversation, so every request carries
//! the whole history and sets `store: false`: nothing is kept on OpenAI's
//! side and `previous_response_id` is never used. A reasoning model's
//! reasoning items can then only be sent back if they carry their encrypted
//! content, so the request asks for `include: ["reasoning.encrypted_content"]`.
//! Models without reasoning (`gpt-4.1`, `gpt-4o`) refuse that with a 400
//! ("Encrypted content is not supported with this model"); the adapter then
//! drops `include` for good and sends the request again at once.
//!
//! **Response.** Semantic SSE events, each a JSON object with a `type`:
//! text deltas are forwarded at once, reasoning summary (and reasoning text)
//! deltas as reasoning, function call arguments are assembled per output
//! item, finished reasoning items are kept whole, and `response.completed`
//! (with the usage) ends the response. `response.failed`, `error` events and
//! `response.incomplete` are errors; a body that ends without one of the
//! three terminal events is [`ProviderError::Truncated`].
//!
//! **Incomplete responses.** `response.incomplete` (for example the
//! `max_output_tokens` limit) is reported as an error naming the reason, not
//! as an answer: the text may stop mid-sentence and a function call's
//! arguments mid-object, and running such a call or presenting the text as
//! the final answer would be wrong. The text already streamed stays in the
//! session (the runtime keeps it, marked interrupted). It is not retried:
//! the same request would stop at the same limit.

mod stream;

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value, json};

use self::stream::ResponsesDecoder;
use crate::frame::{HttpModel, WireFormat, bearer_headers};
use crate::http::Secret;
use crate::sse::SseEvent;
use crate::{ProviderError, ProviderSettings};
use keel_model::{ModelRequest, ToolSpec};
use keel_protocol::TranscriptItem;

/// The `provider` of the reasoning items this adapter keeps; only these are
/// sent back to it.
pub const REASONING_PROVIDER: &str = "openai-responses";

/// A model behind the OpenAI Responses API.
pub type OpenAiResponses = HttpModel<Responses>;

/// The Responses wire format.
#[derive(Debug, Default)]
pub struct Responses {
    /// Set once the endpoint refused `include: ["reasoning.encrypted_content"]`
    /// (a model without reasoning); later requests leave it out.
    without_encrypted_reasoning: AtomicBool,
}

impl WireFormat for Responses {
    type Decoder = ResponsesDecoder;

    const PATH: &'static str = "/responses";

    const PROVIDER: &'static str = "openai";

    fn headers(&self, settings: &ProviderSettings) -> Vec<(String, Secret)> {
        bearer_headers(settings)
    }

    fn body(&self, settings: &ProviderSettings, request: &ModelRequest<'_>) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(settings.model));
        let item_ids = !crate::is_openai_itself(&settings.base_url);
        body.insert("input".into(), Value::Array(input_items(request.history, item_ids)));
        if let Some(instructions) = request.instructions {
            body.insert("instructions".into(), json!(instructions));
        }
        if !request.tools.is_empty() {
            body.insert("tools".into(), Value::Array(request.tools.iter().map(tool).collect()));
        }
        body.insert("stream".into(), json!(true));
        body.insert("store".into(), json!(false));
        if !self.without_encrypted_reasoning.load(Ordering::Relaxed) {
            body.insert("include".into(), json!(["reasoning.encrypted_content"]));
        }
        if let Some(max) = settings.max_output_tokens {
            body.insert("max_output_tokens".into(), json!(max));
        }
        if let Some(temperature) = settings.temperature {
            body.insert("temperature".into(), json!(temperature));
        }
        Value::Object(body)
    }

    fn events_of_complete(&self, answer: Value) -> Vec<SseEvent> {
        events_of_complete(&answer)
    }

    fn decoder(&self, settings: &ProviderSettings) -> ResponsesDecoder {
        ResponsesDecoder::new(&settings.name)
    }

    /// A refusal of the encrypted reasoning is answered by sending the
    /// request again without it, and every later one too.
    fn adapt_to_refusal(&self, settings: &ProviderSettings, error: &ProviderError) -> bool {
        if !refuses_encrypted_reasoning(error) {
            return false;
        }
        tracing::info!(
            model = %settings.model,
            "the model has no encrypted reasoning; asking without it from now on"
        );
        self.without_encrypted_reasoning.store(true, Ordering::Relaxed);
        true
    }
}

/// The events a stream would have carried for a complete, non-streamed
/// `response` object (or an error): each output item done, then the
/// terminal event its `status` names.
fn events_of_complete(response: &Value) -> Vec<SseEvent> {
    let event = |data: Value| SseEvent {
        event: None,
        data: data.to_string(),
    };
    if response.get("output").is_none()
        && let Some(error) = response.get("error").filter(|error| error.is_object())
    {
        return vec![event(json!({"type": "error", "error": error}))];
    }
    let items = response.get("output").and_then(Value::as_array).into_iter().flatten();
    let mut events: Vec<SseEvent> = items
        .enumerate()
        .map(|(index, item)| event(json!({"type": "response.output_item.done", "output_index": index, "item": item})))
        .collect();
    let terminal = match response.get("status").and_then(Value::as_str) {
        Some("incomplete") => "response.incomplete",
        Some("failed") => "response.failed",
        _ => "response.completed",
    };
    events.push(event(json!({"type": terminal, "response": response})));
    events
}

/// Whether `error` is the API refusing `include: ["reasoning.encrypted_content"]`
/// because the model does not reason.
fn refuses_encrypted_reasoning(error: &ProviderError) -> bool {
    matches!(error, ProviderError::Status { status: 400, message, .. }
        if message.to_ascii_lowercase().contains("encrypted content is not supported"))
}

/// The history as Responses `input` items.
///
/// Assistant output goes back in the shape the API gave it: messages with
/// `status` and `output_text` parts with `annotations`, function calls with
/// `status`. With `item_ids` (every server but OpenAI's own) they also get
/// an `id`, which strict implementations (vLLM, Azure) require; OpenAI
/// itself refuses ids of items it did not store, and `store` is false.
/// Keel keeps no provider item ids, so they are derived from what is kept:
/// the message's place in the history, the call's id.
fn input_items(history: &[TranscriptItem], item_ids: bool) -> Vec<Value> {
    history
        .iter()
        .enumerate()
        .filter_map(|(position, item)| match item {
            TranscriptItem::UserMessage { text } => Some(json!({
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            })),
            // An empty answer says nothing; the API gains nothing from it.
            TranscriptItem::AssistantMessage { text, .. } if text.is_empty() => None,
            TranscriptItem::AssistantMessage { text, .. } => {
                let mut item = json!({
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                });
                if item_ids {
                    item["id"] = json!(format!("msg_keel_{position}"));
                }
                Some(item)
            }
            TranscriptItem::ToolCall {
                call_id,
                name,
                arguments,
            } => {
                let mut item = json!({
                    "type": "function_call",
                    "call_id": call_id,
                    "name": name,
                    "arguments": crate::well_formed_arguments(arguments),
                    "status": "completed",
                });
                if item_ids {
                    item["id"] = json!(format!("fc_{}", call_id.trim_start_matches("call_")));
                }
                Some(item)
            }
            TranscriptItem::ToolResult {
                call_id,
                output,
                is_error,
            } => Some(json!({
                "type": "function_call_output",
                "call_id": call_id,
                // The item has no error field; the text carries it.
                "output": crate::tool_result_text(output, *is_error),
            })),
            TranscriptItem::Reasoning { provider, data } if provider == REASONING_PROVIDER => Some(data.clone()),
            TranscriptItem::Reasoning { .. } => None,
            // Context from the runtime, not the user's words: the role
            // Responses gives the application's own instructions.
            TranscriptItem::Summary { text } => Some(json!({"type": "message", "role": "developer", "content": text})),
        })
        .collect()
}

/// A tool as a Responses function tool. `strict: false` because without it
/// the API normalises the schema into strict mode, which makes every
/// optional property required; Keel's tools describe their arguments as
/// they are.
fn tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.parameters,
        "strict": false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_protocols_reasoning_and_non_empty_answers_are_sent() {
        let history = vec![
            TranscriptItem::Reasoning {
                provider: "anthropic".into(),
                data: json!({"type": "thinking"}),
            },
            TranscriptItem::AssistantMessage {
                text: String::new(),
                interrupted: false,
            },
            TranscriptItem::Reasoning {
                provider: REASONING_PROVIDER.into(),
                data: json!({"type": "reasoning", "id": "rs_1", "summary": []}),
            },
        ];
        assert_eq!(
            input_items(&history, true),
            [json!({"type": "reasoning", "id": "rs_1", "summary": []})]
        );
    }

    #[test]
    fn openai_itself_gets_no_item_ids_and_failed_results_say_so() {
        let history = vec![
            TranscriptItem::AssistantMessage {
                text: "Checking.".into(),
                interrupted: false,
            },
            TranscriptItem::ToolCall {
                call_id: "call_a".into(),
                name: "clock".into(),
                arguments: "{}".into(),
            },
            TranscriptItem::ToolResult {
                call_id: "call_a".into(),
                output: "error: no clock".into(),
                is_error: true,
            },
        ];
        assert_eq!(
            input_items(&history, false),
            [
                json!({"type": "message", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]}),
                json!({"type": "function_call", "call_id": "call_a", "name": "clock", "arguments": "{}", "status": "completed"}),
                // Already says it failed: not said twice.
                json!({"type": "function_call_output", "call_id": "call_a", "output": "error: no clock"}),
            ]
        );
        // A call cut mid-arguments goes back as a well-formed call.
        let cut = [TranscriptItem::ToolCall {
            call_id: "call_b".into(),
            name: "clock".into(),
            arguments: "{\"tz\": \"Eur".into(),
        }];
        assert_eq!(input_items(&cut, false)[0]["arguments"], "{}");
    }

    #[test]
    fn only_the_refusal_of_encrypted_reasoning_drops_the_include() {
        let status = |status: u16, message: &str| ProviderError::Status {
            provider: "openai".into(),
            status,
            message: message.into(),
            retry_after: None,
        };
        assert!(refuses_encrypted_reasoning(&status(
            400,
            "invalid_request_error: Encrypted content is not supported with this model."
        )));
        assert!(!refuses_encrypted_reasoning(&status(
            400,
            "invalid_request_error: bad tool"
        )));
        assert!(!refuses_encrypted_reasoning(&status(
            500,
            "Encrypted content is not supported with this model."
        )));
    }
}
