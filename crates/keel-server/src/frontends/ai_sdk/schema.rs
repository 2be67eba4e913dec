//! The description of `POST /v1/ai-sdk/chat`'s body, for the OpenAPI
//! document only: the body is read by `keel_projections::ai_sdk`, and
//! these types say which of `DefaultChatTransport`'s bodies it takes.
#![allow(dead_code)] // never built: only their schemas are used

use serde::Deserialize;
use utoipa::ToSchema;

/// The body `DefaultChatTransport` posts (fields its `body` option adds
/// are ignored).
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChatBody {
    /// The chat's id: the session's thread.
    #[schema(min_length = 1, max_length = 128, pattern = r"^[ -$&-~]+$")]
    id: String,
    /// The chat's messages, oldest first; only the trailing one is read as
    /// new.
    #[schema(min_items = 1)]
    messages: Vec<ChatMessage>,
    /// What the client asks.
    trigger: ChatTrigger,
    /// The message a regeneration replaces.
    message_id: Option<String>,
}

/// `sendMessages`' trigger.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
enum ChatTrigger {
    /// A new message, or answers in the last assistant message.
    SubmitMessage,
    /// The last answer again.
    RegenerateMessage,
}

/// A message of the chat.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
enum ChatMessage {
    /// The user's.
    User(UserMessage),
    /// The assistant's (a turn).
    Assistant(AssistantMessage),
}

/// A user message: text parts only.
#[derive(Deserialize, ToSchema)]
struct UserMessage {
    /// Its id: the submission's `Idempotency-Key`.
    #[schema(min_length = 1, max_length = 128, pattern = r"^[!-~]+$")]
    id: String,
    /// `user`.
    role: UserRole,
    /// Its text.
    #[schema(min_items = 1)]
    parts: Vec<TextPart>,
}

/// An assistant message: its id is its turn's.
#[derive(Deserialize, ToSchema)]
struct AssistantMessage {
    /// Its id.
    #[schema(min_length = 1, max_length = 128, pattern = r"^[ -~]+$")]
    id: String,
    /// `assistant`.
    role: AssistantRole,
    /// Its parts.
    parts: Vec<AssistantPart>,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum UserRole {
    User,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum AssistantRole {
    Assistant,
}

/// A part of an assistant message.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
enum AssistantPart {
    /// Text.
    Text(TextPart),
    /// A step's start.
    Step(StepPart),
    /// A tool call, answered by `addToolApprovalResponse`.
    Approval(ApprovalPart),
    /// A tool call in another state (an output the client gave).
    Tool(ToolPart),
}

/// A text part.
#[derive(Deserialize, ToSchema)]
struct TextPart {
    /// `text`.
    r#type: TextType,
    /// The text (a user message needs some that is not white space).
    #[schema(pattern = r"\S")]
    text: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum TextType {
    Text,
}

/// A step's start.
#[derive(Deserialize, ToSchema)]
struct StepPart {
    /// `step-start`.
    r#type: StepType,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
enum StepType {
    StepStart,
}

/// A tool part the user answered (`approval-responded`).
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ApprovalPart {
    /// `tool-<name>`.
    #[schema(pattern = r"^tool-.")]
    r#type: String,
    /// The call.
    tool_call_id: String,
    /// `approval-responded`.
    state: ApprovalState,
    /// The answer.
    approval: Approval,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
enum ApprovalState {
    ApprovalResponded,
}

/// An approval answer.
#[derive(Deserialize, ToSchema)]
struct Approval {
    /// The approval's id (the call's).
    id: String,
    /// Whether the call may run.
    approved: bool,
}

/// A tool part in any other state.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ToolPart {
    /// `tool-<name>`.
    #[schema(pattern = r"^tool-.")]
    r#type: String,
    /// The call.
    tool_call_id: String,
    /// Where the call is.
    state: ToolState,
    /// The call's input.
    #[schema(value_type = Object)]
    input: Option<serde_json::Value>,
    /// The client's output (`output-available`).
    #[schema(value_type = Object)]
    output: Option<serde_json::Value>,
    /// The client's error (`output-error`).
    error_text: Option<String>,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
enum ToolState {
    InputStreaming,
    InputAvailable,
    ApprovalRequested,
    OutputAvailable,
    OutputError,
    OutputDenied,
}

/// One server-sent event of a UI message stream, by its SSE fields.
#[derive(Deserialize, ToSchema)]
pub(crate) struct StreamFrame {
    /// A UI message chunk's JSON (`{"type": "text-delta", …}`, as the `ai`
    /// package's `uiMessageChunkSchema` reads it), or `[DONE]` last.
    data: String,
}
