//! The chunks of the AI SDK's UI message stream (protocol v1), as the `ai`
//! package's `uiMessageChunkSchema` defines them: one JSON object per SSE
//! `data:` line.

use serde::Serialize;

/// One chunk of a UI message stream. Serialized with its `type` tag in
/// kebab case and its fields in camel case, as the `ai` package reads them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum Chunk {
    /// A new assistant message begins (the turn's id is its id).
    Start {
        /// The assistant message's id.
        message_id: String,
    },
    /// A model step begins.
    StartStep,
    /// A model step ended.
    FinishStep,
    /// A text part begins.
    TextStart {
        /// The part's id.
        id: String,
    },
    /// Text appended to an open text part.
    TextDelta {
        /// The part's id.
        id: String,
        /// The text.
        delta: String,
    },
    /// A text part is complete.
    TextEnd {
        /// The part's id.
        id: String,
    },
    /// A reasoning part begins.
    ReasoningStart {
        /// The part's id.
        id: String,
    },
    /// Reasoning text appended to an open reasoning part.
    ReasoningDelta {
        /// The part's id.
        id: String,
        /// The text.
        delta: String,
    },
    /// A reasoning part is complete.
    ReasoningEnd {
        /// The part's id.
        id: String,
    },
    /// A tool call with its complete input.
    ToolInputAvailable {
        /// The call's id.
        tool_call_id: String,
        /// The tool.
        tool_name: String,
        /// The arguments: parsed JSON, or the model's text when it is not JSON.
        input: serde_json::Value,
    },
    /// A call waits for the user's decision.
    ToolApprovalRequest {
        /// The approval's id (the call's id: stable across streams).
        approval_id: String,
        /// The call.
        tool_call_id: String,
    },
    /// The user decided about a call.
    ToolApprovalResponse {
        /// The approval's id.
        approval_id: String,
        /// Whether the call may run.
        approved: bool,
    },
    /// A call's result.
    ToolOutputAvailable {
        /// The call.
        tool_call_id: String,
        /// The result, as the tool wrote it.
        output: serde_json::Value,
    },
    /// A call failed.
    ToolOutputError {
        /// The call.
        tool_call_id: String,
        /// The error message.
        error_text: String,
    },
    /// A call the user denied.
    ToolOutputDenied {
        /// The call.
        tool_call_id: String,
    },
    /// Something failed.
    Error {
        /// What failed.
        error_text: String,
    },
    /// The message (for now) is complete.
    Finish {
        /// Why it ended: `stop`, `length`, `tool-calls` (it waits for the
        /// client), `error`.
        finish_reason: &'static str,
    },
    /// The turn was stopped.
    Abort {
        /// Why.
        reason: String,
    },
}

impl Chunk {
    /// The chunk's JSON, as one SSE `data:` line carries it.
    pub fn to_json(&self) -> String {
        // A derived `Serialize` of strings and JSON values cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The last `data:` line of every UI message stream.
pub const DONE: &str = "[DONE]";
