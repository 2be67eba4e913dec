//! The OpenAPI description of AG-UI's `RunAgentInput` as Keel takes it:
//! what `@ag-ui/core`'s schema allows, narrowed to what Keel can run
//! (text content only, user message ids usable as idempotency keys).
//! Documentation only: the body is read by `keel_projections::ag_ui`.

#![allow(dead_code)]

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};

/// AG-UI's `RunAgentInput`. Other fields (`state`, `context`,
/// `forwardedProps`, `protocolVersion`, `parentRunId`) are accepted and
/// not used.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgUiRunAgentInput {
    /// The thread: the session's id (a tenant's credentials get their own
    /// namespace of threads).
    #[schema(min_length = 1, max_length = 128, pattern = r"^[ -$&-~]+$")]
    thread_id: String,
    /// The client's id for the run (Keel's runs are named by turn).
    run_id: String,
    /// The conversation: the session's history, then the new messages.
    messages: Vec<AgUiInputMessage>,
    /// Frontend tools, offered to the model as the session's client tools.
    #[schema(max_items = 64)]
    tools: Option<Vec<AgUiTool>>,
    /// Answers to the last run's interrupts.
    resume: Option<Vec<AgUiResumeEntry>>,
}

/// A message of `RunAgentInput.messages`, by `role`.
#[derive(Deserialize, ToSchema)]
#[serde(tag = "role", rename_all = "lowercase")]
pub(crate) enum AgUiInputMessage {
    /// A user message; a new one becomes a submission keyed by its id.
    User {
        /// Its id (the submission's idempotency key).
        #[schema(min_length = 1, max_length = 128, pattern = r"^[!-~]+$")]
        id: String,
        /// Its text.
        content: AgUiUserContent,
    },
    /// An assistant message, as the last runs sent it.
    Assistant {
        /// Its id.
        id: String,
        /// Its text.
        content: Option<String>,
        /// Its tool calls.
        #[serde(rename = "toolCalls")]
        #[schema(value_type = Option<Vec<Object>>)]
        tool_calls: Option<Vec<Value>>,
    },
    /// A tool result; a new one answers a waiting client tool call.
    Tool {
        /// Its id.
        id: String,
        /// The call it answers.
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        /// The result.
        content: AgUiToolContent,
        /// Set when the call failed.
        error: Option<String>,
    },
    /// Not kept in Keel's history: not compared, not used.
    System {
        /// Its id.
        id: String,
        /// Its text.
        content: String,
    },
    /// Not kept in Keel's history: not compared, not used.
    Developer {
        /// Its id.
        id: String,
        /// Its text.
        content: String,
    },
    /// Not kept in Keel's history (Keel records reasoning as events): not
    /// compared, not used.
    Reasoning {
        /// Its id.
        id: String,
        /// Its text.
        content: String,
    },
    /// Not kept in Keel's history: not compared, not used.
    Activity {
        /// Its id.
        id: String,
        /// What the activity shows.
        #[schema(value_type = Object)]
        content: Value,
    },
}

/// A user message's content: text, or text parts (other parts are
/// refused), not only white space.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum AgUiUserContent {
    /// The text.
    Text(String),
    /// Text parts, joined.
    Parts(Vec<AgUiTextPart>),
}

impl utoipa::PartialSchema for AgUiUserContent {
    fn schema() -> RefOr<Schema> {
        let text = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(r"\S"))
            .description(Some("The text (not only white space)."));
        let parts = ArrayBuilder::new()
            .items(RefOr::Ref(utoipa::openapi::Ref::from_schema_name("AgUiTextPart")))
            .min_items(Some(1))
            .description(Some("Text parts, joined."));
        OneOfBuilder::new()
            .item(text)
            .item(parts)
            .description(Some("Text, or text parts (other parts are refused)."))
            .into()
    }
}

impl ToSchema for AgUiUserContent {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((
            AgUiTextPart::name().into_owned(),
            <AgUiTextPart as utoipa::PartialSchema>::schema(),
        ));
    }
}

/// A tool message's content: text, or text parts.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum AgUiToolContent {
    /// The text.
    Text(String),
    /// Text parts, joined.
    Parts(Vec<AgUiTextPart>),
}

/// A text part.
#[derive(Deserialize, ToSchema)]
pub(crate) struct AgUiTextPart {
    /// Always `text`.
    #[serde(rename = "type")]
    #[schema(pattern = "^text$")]
    kind: String,
    /// The text.
    #[schema(pattern = r"\S")]
    text: String,
}

/// A frontend tool.
#[derive(Deserialize, ToSchema)]
pub(crate) struct AgUiTool {
    /// Its name, as the model calls it (not the name of a tool the server
    /// runs).
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    name: String,
    /// What it does.
    description: String,
    /// The JSON Schema of its arguments: an object schema, checked as a
    /// client tool's.
    #[schema(value_type = Option<keel_protocol::ClientToolParameters>)]
    parameters: Option<Value>,
}

/// An answer to one interrupt.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgUiResumeEntry {
    /// The interrupt answered: the waiting call's id.
    interrupt_id: String,
    /// `resolved` (approve, unless the payload says `false`, `"deny"`,
    /// `{"approved": false}` or `{"decision": "deny"}`) or `cancelled`
    /// (deny).
    status: AgUiResumeStatus,
    /// The answer.
    #[schema(value_type = Option<Object>)]
    payload: Option<Value>,
}

/// How a resume entry ends its interrupt.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AgUiResumeStatus {
    /// Answered.
    Resolved,
    /// Dismissed.
    Cancelled,
}
