//! Transcript items: the conversation history a model sees.

use serde::{Deserialize, Serialize};

/// One item of a session's conversation history.
///
/// JSON: `{"type": "user_message", "text": "…"}` or
/// `{"type": "assistant_message", "text": "…", "interrupted": true}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
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
}
