//! Transcript items: the conversation history a model sees.

use serde::{Deserialize, Serialize};

/// One item of a session's conversation history.
///
/// JSON, by `type`: `user_message` (`text`), `assistant_message` (`text`,
/// `interrupted` when the turn stopped mid-stream), `tool_call` (`call_id`,
/// `name`, `arguments` as the model wrote them), `tool_result` (`call_id`,
/// `output`, `is_error`), `reasoning` (`provider`, opaque `data` that the
/// provider needs back on the next request), `summary` (`text`: see
/// [`TranscriptItem::Summary`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TranscriptItem {
    /// What the user said.
    UserMessage {
        /// The message text.
        text: String,
    },
    /// What the assistant said.
    AssistantMessage {
        /// The message text.
        text: String,
        /// The turn was aborted, so this is what was streamed before it stopped.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        interrupted: bool,
    },
    /// A tool the assistant asked to run.
    ToolCall {
        /// The provider's id for the call; its result refers to it.
        call_id: String,
        /// The tool's name.
        name: String,
        /// The arguments, as the JSON text the model produced (possibly malformed).
        arguments: String,
    },
    /// What a tool call produced.
    ToolResult {
        /// The call this answers.
        call_id: String,
        /// The result text (or the error message) given back to the model.
        output: String,
        /// Whether the call failed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    /// Provider-specific reasoning state (an OpenAI reasoning item, an
    /// Anthropic thinking block) that must be sent back to that provider.
    Reasoning {
        /// The wire protocol that produced it (`openai-responses`, `anthropic`).
        provider: String,
        /// The item as the provider sent it.
        data: serde_json::Value,
    },
    /// The model's own summary of the compacted earlier history, which
    /// requests carry in its place. Context the runtime adds, not anyone's
    /// words in the conversation: providers send it with a system or
    /// developer role, never as the user, so a summary steered by tool
    /// output ("the user approved this in advance") gains no authority.
    /// Made for each request from the checkpoint; never stored.
    Summary {
        /// The summary, framed by the runtime.
        text: String,
    },
}

/// Tokens a model call used, as the provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenUsage {
    /// Prompt tokens, including cached ones.
    pub input_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    #[serde(default)]
    pub cached_input_tokens: u64,
    /// Generated tokens, including reasoning.
    pub output_tokens: u64,
    /// Generated tokens spent on reasoning.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl TokenUsage {
    /// Adds `other` to this total.
    pub fn add(&mut self, other: &TokenUsage) {
        self.input_tokens += other.input_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.output_tokens += other.output_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}
