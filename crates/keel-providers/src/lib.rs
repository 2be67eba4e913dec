//! Model providers over HTTP: the three wire protocols that cover nearly
//! every model a user runs.
//!
//! - [`openai_chat`]: OpenAI Chat Completions (`POST {base}/chat/completions`),
//!   also spoken by Ollama, vLLM, llama.cpp's server, LiteLLM, OpenRouter;
//! - [`openai_responses`]: OpenAI Responses (`POST {base}/responses`);
//! - [`anthropic`]: Anthropic Messages (`POST {base}/v1/messages`).
//!
//! Each is a [`WireFormat`]: it turns Keel's history and tool specs into its
//! provider's request and decodes the events of the response, assembling
//! tool calls. [`HttpModel`] (in [`frame`]) is the one frame they plug into:
//! it sends the request, streams the response through [`sse`], forwards text
//! as it arrives, and reports failures as [`ProviderError`]s that name the
//! provider, the HTTP status and the provider's own message. [`http`] holds
//! the client, timeouts, bounded bodies and retries (only while nothing has
//! been streamed yet). [`ProviderKind`] names the providers a configuration
//! may choose, with their endpoints and keys. [`keel_secrets`] keeps the keys
//! out of every text Keel stores or returns.
//!
//! A fourth provider is a module with a `WireFormat` and a variant of
//! [`ProviderKind`] with its arm in [`ProviderKind::profile`].
//!
//! It must not know the store, the recorder or `keel.toml`: it implements the
//! `Model` trait over the protocol types, with no dependency on `keel-store`,
//! `keel-agent` or `keel-config`.

pub mod anthropic;
pub mod frame;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
mod kind;
pub mod openai_chat;
pub mod openai_responses;
pub mod sse;

use self::http::{HttpSettings, Secret};
pub use frame::{Decoded, Emitter, HttpModel, ReadError, StreamDecoder, WireFormat};
pub use keel_model::{ProviderError, mentions_context_length};
use keel_protocol::TranscriptItem;
pub use kind::{ProviderKind, ProviderProfile};

/// What one provider endpoint needs: where, which model, how to authenticate.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    /// The provider's name in messages (`openai`, `anthropic`, `ollama`, or
    /// the model's name in `keel.toml`).
    pub name: String,
    /// The model to ask for.
    pub model: String,
    /// The API's base URL, without a trailing slash (for example
    /// `https://api.openai.com/v1` or `https://api.anthropic.com`).
    pub base_url: String,
    /// The API key, if the endpoint needs one.
    pub api_key: Option<Secret>,
    /// Extra request headers.
    pub headers: Vec<(String, Secret)>,
    /// The most tokens the model may generate per request.
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// The model's context window in tokens; a request whose history would
    /// not fit (estimated) is refused before it is sent.
    pub context_window: Option<u32>,
    /// The share of the context window past which the history is compacted
    /// before a request (see [`keel_model::ContextLimits`]).
    pub compact_threshold: f64,
    /// Timeouts, bounds and retries.
    pub http: HttpSettings,
}

impl ProviderSettings {
    /// Settings for `model` at `base_url`, with defaults for the rest.
    pub fn new(name: impl Into<String>, model: impl Into<String>, base_url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            model: model.into(),
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            api_key: None,
            headers: Vec::new(),
            max_output_tokens: None,
            temperature: None,
            context_window: None,
            compact_threshold: keel_model::DEFAULT_COMPACT_THRESHOLD,
            http: HttpSettings::default(),
        }
    }

    /// The model's name in messages and logs: `provider:model`.
    pub fn display_name(&self) -> String {
        format!("{}:{}", self.name, self.model)
    }

    /// The limits the runtime compacts the history by: the configured
    /// window, else the known window of the model.
    pub fn context_limits(&self) -> Option<keel_model::ContextLimits> {
        let window = self
            .context_window
            .map(u64::from)
            .or_else(|| keel_model::known_context_window(&self.model))?;
        Some(keel_model::ContextLimits {
            window,
            threshold: self.compact_threshold,
        })
    }

    /// Refuses a request whose history clearly cannot fit the context window
    /// (estimated at four bytes a token), instead of sending it to fail.
    pub fn check_context(&self, instructions: Option<&str>, history: &[TranscriptItem]) -> Result<(), ProviderError> {
        let Some(window) = self.context_window else {
            return Ok(());
        };
        let bytes: usize = instructions.map_or(0, str::len)
            + history
                .iter()
                .map(|item| match item {
                    TranscriptItem::UserMessage { text }
                    | TranscriptItem::AssistantMessage { text, .. }
                    | TranscriptItem::Summary { text } => text.len(),
                    TranscriptItem::ToolCall { arguments, .. } => arguments.len(),
                    TranscriptItem::ToolResult { output, .. } => output.len(),
                    TranscriptItem::Reasoning { data, .. } => data.to_string().len(),
                })
                .sum::<usize>();
        let estimated = bytes / 4;
        if estimated > window as usize {
            return Err(ProviderError::Request {
                provider: self.name.clone(),
                message: format!(
                    "the conversation (about {estimated} tokens) does not fit the model's context window of {window} tokens"
                ),
            });
        }
        Ok(())
    }
}

/// A tool result's text for protocols without an error flag (Chat
/// Completions, Responses): a failed call says so in words, so the model
/// cannot take an error message for the tool's output.
pub(crate) fn tool_result_text(output: &str, is_error: bool) -> String {
    if !is_error || output.trim_start().to_ascii_lowercase().starts_with("error") {
        return output.to_owned();
    }
    format!("Error: {output}")
}

/// A tool call's arguments as history sent back to a provider: the text as
/// the model wrote it when it is a JSON object, else `{}`. Arguments cut off
/// by the output limit (`{"path": "no`) failed the call with an error
/// result the model reads next; sent back verbatim they make some servers
/// (llama.cpp's) refuse every later request of the session.
pub(crate) fn well_formed_arguments(arguments: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(serde_json::Value::Object(_)) => arguments.to_owned(),
        _ => "{}".to_owned(),
    }
}

/// Whether `base_url` is OpenAI's own API, which has its own dialect where
/// compatible servers differ (field names, item ids).
pub(crate) fn is_openai_itself(base_url: &str) -> bool {
    reqwest::Url::parse(base_url)
        .ok()
        .is_some_and(|url| url.host_str() == Some("api.openai.com"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_objects_go_back_as_arguments() {
        assert_eq!(well_formed_arguments(r#"{"a": 1}"#), r#"{"a": 1}"#);
        for cut in ["{", r#"{"path": "no"#, "", "[1]", "3", "null"] {
            assert_eq!(well_formed_arguments(cut), "{}", "{cut:?}");
        }
    }

    #[test]
    fn a_failed_result_says_so_once() {
        assert_eq!(tool_result_text("no such file", true), "Error: no such file");
        assert_eq!(tool_result_text("error: no such file", true), "error: no such file");
        assert_eq!(tool_result_text("fine", false), "fine");
    }
}
