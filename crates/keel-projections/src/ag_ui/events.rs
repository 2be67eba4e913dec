//! The AG-UI 1.0 events Keel sends, as they go on the wire: a `type` tag in
//! upper snake case and camel-case fields (`@ag-ui/core`'s `EventSchema`).

use serde::Serialize;

/// An AG-UI event. Only the events Keel produces are here; each serializes
/// to the JSON object `@ag-ui/core`'s schema of that type accepts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", rename_all_fields = "camelCase")]
pub enum AgUiEvent {
    /// Opens a run.
    RunStarted {
        /// The thread (the client's id for the session).
        thread_id: String,
        /// The run: the Keel turn's id (a resumed turn's later runs add the
        /// sequence they resume at).
        run_id: String,
        /// The run this one continues, for a run that resumes a turn.
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_run_id: Option<String>,
    },
    /// Closes a run that did not fail.
    RunFinished {
        /// The thread.
        thread_id: String,
        /// The run.
        run_id: String,
        /// Why it ended.
        outcome: RunOutcome,
    },
    /// Ends a run that failed.
    RunError {
        /// What failed, for people.
        message: String,
        /// What failed, for programs (Keel's abort reason).
        code: String,
    },
    /// Opens a model step.
    StepStarted {
        /// `step-<n>`, the step's number within the turn.
        step_name: String,
    },
    /// Closes a model step.
    StepFinished {
        /// The name its `STEP_STARTED` gave.
        step_name: String,
    },
    /// Opens the assistant's text of a step.
    TextMessageStart {
        /// The step's message id.
        message_id: String,
        /// Always `assistant`.
        role: &'static str,
    },
    /// A fragment of the assistant's text.
    TextMessageContent {
        /// The step's message id.
        message_id: String,
        /// The text to append (never empty).
        delta: String,
    },
    /// Closes the assistant's text of a step.
    TextMessageEnd {
        /// The step's message id.
        message_id: String,
    },
    /// Opens a tool call.
    ToolCallStart {
        /// The provider's id for the call.
        tool_call_id: String,
        /// The tool.
        tool_call_name: String,
        /// The assistant message (model step) that made the call.
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_message_id: Option<String>,
    },
    /// The call's arguments (Keel records them whole, so in one fragment).
    ToolCallArgs {
        /// The call.
        tool_call_id: String,
        /// The arguments' JSON text.
        delta: String,
    },
    /// Closes a tool call: its arguments are complete.
    ToolCallEnd {
        /// The call.
        tool_call_id: String,
    },
    /// What a tool returned.
    ToolCallResult {
        /// The tool message's id: `<call id>-result`.
        message_id: String,
        /// The call.
        tool_call_id: String,
        /// The output (or the error message).
        content: String,
        /// Always `tool`.
        role: &'static str,
    },
    /// Opens a span of reasoning.
    ReasoningStart {
        /// `<step's message id>-reasoning`.
        message_id: String,
    },
    /// Opens a reasoning message.
    ReasoningMessageStart {
        /// The span's id.
        message_id: String,
        /// Always `reasoning`.
        role: &'static str,
    },
    /// A fragment of reasoning.
    ReasoningMessageContent {
        /// The span's id.
        message_id: String,
        /// The text to append (never empty).
        delta: String,
    },
    /// Closes a reasoning message.
    ReasoningMessageEnd {
        /// The span's id.
        message_id: String,
    },
    /// Closes a span of reasoning.
    ReasoningEnd {
        /// The span's id.
        message_id: String,
    },
    /// The thread's messages, whole.
    MessagesSnapshot {
        /// The session's history as AG-UI messages.
        messages: Vec<Message>,
    },
}

/// Why a run ended (`RUN_FINISHED.outcome`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case", rename_all_fields = "camelCase")]
pub enum RunOutcome {
    /// The turn completed, or stopped at frontend tool calls the client
    /// answers with tool messages in its next run.
    Success {
        /// The frontend (client tool) calls waiting for a result.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pending_tool_call_ids: Vec<String>,
    },
    /// The turn waits for approvals; the next run's `resume` answers them.
    Interrupt {
        /// What it waits for (at least one).
        interrupts: Vec<Interrupt>,
    },
    /// The turn was interrupted (an `interrupt` op).
    Cancelled,
}

/// Something a run waits for: a tool call needing approval.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interrupt {
    /// The interrupt's id: the call's id, which a resume entry names.
    pub id: String,
    /// `tool_approval` (or `client_tool` for a client tool call).
    pub reason: String,
    /// What to ask, for people.
    pub message: String,
    /// The call it concerns.
    pub tool_call_id: String,
}

/// A message of a thread, as AG-UI's `MessageSchema` has it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "role", rename_all = "snake_case", rename_all_fields = "camelCase")]
pub enum Message {
    /// What the user wrote.
    User {
        /// The message's id: the client's, when it came through AG-UI.
        id: String,
        /// The text.
        content: String,
    },
    /// What one model step wrote: text, tool calls or both.
    Assistant {
        /// The step's message id.
        id: String,
        /// The text, when there is any.
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// The calls it made.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// A tool call's result.
    Tool {
        /// `<call id>-result`.
        id: String,
        /// The output (or error message).
        content: String,
        /// The call.
        tool_call_id: String,
        /// The error message, when the call failed.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

/// A call an assistant message made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    /// The call's id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Its name and arguments.
    pub function: FunctionCall,
}

/// The name and arguments of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCall {
    /// The tool.
    pub name: String,
    /// The arguments' JSON text.
    pub arguments: String,
}

impl Message {
    /// The message's role, as on the wire.
    pub fn role(&self) -> &'static str {
        match self {
            Message::User { .. } => "user",
            Message::Assistant { .. } => "assistant",
            Message::Tool { .. } => "tool",
        }
    }

    /// The message's text (an assistant's absent text is empty).
    pub fn text(&self) -> &str {
        match self {
            Message::User { content, .. } | Message::Tool { content, .. } => content,
            Message::Assistant { content, .. } => content.as_deref().unwrap_or(""),
        }
    }
}
