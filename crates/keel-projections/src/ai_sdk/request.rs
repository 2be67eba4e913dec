//! The body `DefaultChatTransport` posts (`id`, `messages`, `trigger`,
//! `messageId`), read into what it asks of the session.

use std::collections::HashMap;

use keel_protocol::{ApprovalDecision, Op};
use serde::Deserialize;

use super::projection::Wait;

/// Why a chat request cannot be acted on. Nothing is stored for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The body is not a chat request (missing or mistyped fields).
    #[error("not an AI SDK chat request: {0}")]
    Malformed(String),
    /// A message part of a type the UI message format does not have, or one
    /// Keel cannot take (files, system messages).
    #[error("{0}")]
    UnsupportedPart(String),
    /// The request answers nothing the session waits for, or answers a call
    /// that is not waiting.
    #[error("{0}")]
    NotWaiting(String),
}

/// What `sendMessages` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// `submit-message`: a new user message, or the answers the last
    /// assistant message carries.
    Submit,
    /// `regenerate-message`: the last answer again.
    Regenerate,
}

/// A chat request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The chat's id (the session's thread).
    pub id: String,
    /// What the client asks.
    pub trigger: Trigger,
    /// The message a regeneration replaces (`messageId`), when given.
    pub message_id: Option<String>,
    /// The messages, oldest first.
    pub messages: Vec<UiMessage>,
}

/// A message of the chat, reduced to what Keel reads.
#[derive(Debug, Clone, PartialEq)]
pub struct UiMessage {
    /// The client's id for it.
    pub id: String,
    /// Whether the user wrote it (else the assistant).
    pub from_user: bool,
    /// Its text parts, joined.
    pub text: String,
    /// Its tool parts.
    pub tools: Vec<ToolPart>,
}

/// A tool call part of an assistant message, in the state the client left it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPart {
    /// The call.
    pub call_id: String,
    /// The client's answer in this part, if it holds one.
    pub answer: Option<Answer>,
}

/// An answer the client gave to a waiting call.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// `addToolApprovalResponse`: the part is `approval-responded`.
    Approval {
        /// Whether the call may run.
        approved: bool,
    },
    /// `addToolOutput`: the part is `output-available` or `output-error`.
    Output {
        /// The result (JSON text unless it was a string), or the error.
        output: String,
        /// Whether it is an error.
        is_error: bool,
    },
}

/// What a request asks of the session.
#[derive(Debug, Clone, PartialEq)]
pub enum Intent {
    /// A new user message, keyed by its id (a resent message is the same
    /// submission).
    UserMessage {
        /// The message's id: the submission's `Idempotency-Key`.
        message_id: String,
        /// Its text.
        text: String,
    },
    /// Answer the last turn again.
    Regenerate,
    /// Answers to calls of the running turn, in the last assistant message.
    Answers(Vec<ToolPart>),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRequest {
    id: String,
    messages: Vec<RawMessage>,
    trigger: String,
    #[serde(default)]
    message_id: Option<String>,
    // The transport's `body` option may add fields; they are not Keel's.
}

#[derive(Deserialize)]
struct RawMessage {
    id: String,
    role: String,
    parts: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawToolPart {
    tool_call_id: String,
    state: String,
    #[serde(default)]
    output: Option<serde_json::Value>,
    #[serde(default)]
    error_text: Option<String>,
    #[serde(default)]
    approval: Option<RawApproval>,
}

#[derive(Deserialize)]
struct RawApproval {
    #[serde(default)]
    approved: Option<bool>,
}

impl ChatRequest {
    /// Reads a request body.
    pub fn from_value(body: serde_json::Value) -> Result<Self, RequestError> {
        let raw: RawRequest =
            serde_json::from_value(body).map_err(|error| RequestError::Malformed(error.to_string()))?;
        let trigger = match raw.trigger.as_str() {
            "submit-message" => Trigger::Submit,
            "regenerate-message" => Trigger::Regenerate,
            other => {
                return Err(RequestError::Malformed(format!(
                    "`trigger` is `submit-message` or `regenerate-message`, not `{other}`"
                )));
            }
        };
        let messages = raw.messages.into_iter().map(message).collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            id: raw.id,
            trigger,
            message_id: raw.message_id,
            messages,
        })
    }

    /// What the request asks: the trailing message decides.
    pub fn intent(&self) -> Result<Intent, RequestError> {
        if self.trigger == Trigger::Regenerate {
            return Ok(Intent::Regenerate);
        }
        let Some(last) = self.messages.last() else {
            return Err(RequestError::Malformed("`messages` is empty".to_owned()));
        };
        if last.from_user {
            if last.text.trim().is_empty() {
                return Err(RequestError::Malformed(format!(
                    "the user message '{}' has no text",
                    last.id
                )));
            }
            return Ok(Intent::UserMessage {
                message_id: last.id.clone(),
                text: last.text.clone(),
            });
        }
        let answers: Vec<ToolPart> = last
            .tools
            .iter()
            .filter(|part| part.answer.is_some())
            .cloned()
            .collect();
        Ok(Intent::Answers(answers))
    }

    /// The messages before the trailing one.
    pub fn history(&self) -> &[UiMessage] {
        self.messages.split_last().map_or(&[], |(_, rest)| rest)
    }
}

/// The ops the answers of the last assistant message make, each with its
/// `Idempotency-Key`, given the calls the running turn waits on: an answer
/// for a call that does not wait for that answer is refused, unless the
/// turn was already given it (`answered`: a resent request). At least one
/// answer must be new or resent.
pub fn answer_ops(
    parts: &[ToolPart],
    waiting: &HashMap<String, Wait>,
    answered: impl Fn(&str) -> bool,
) -> Result<Vec<(Op, String)>, RequestError> {
    let mut ops = Vec::new();
    let mut resent = false;
    for part in parts {
        let Some(answer) = &part.answer else { continue };
        let call_id = part.call_id.clone();
        let wants = match answer {
            Answer::Approval { .. } => Wait::Approval,
            Answer::Output { .. } => Wait::ClientTool,
        };
        if waiting.get(&call_id) != Some(&wants) {
            if answered(&call_id) {
                resent = true;
                continue;
            }
            // A completed call's part keeps its output: not an answer now.
            if wants == Wait::ClientTool {
                continue;
            }
            return Err(RequestError::NotWaiting(format!(
                "the tool call '{call_id}' is not waiting for an approval"
            )));
        }
        let (op, key) = match answer {
            Answer::Approval { approved } => (
                Op::Approval {
                    call_id: call_id.clone(),
                    decision: if *approved {
                        ApprovalDecision::Approve
                    } else {
                        ApprovalDecision::Deny
                    },
                },
                format!("ai-sdk-approval:{call_id}"),
            ),
            Answer::Output { output, is_error } => (
                Op::ClientToolResult {
                    call_id: call_id.clone(),
                    output: output.clone(),
                    is_error: *is_error,
                },
                format!("ai-sdk-result:{call_id}"),
            ),
        };
        ops.push((op, key));
    }
    if ops.is_empty() && !resent {
        return Err(RequestError::NotWaiting(
            "the last message is the assistant's and answers no tool call the chat waits on".to_owned(),
        ));
    }
    Ok(ops)
}

fn message(raw: RawMessage) -> Result<UiMessage, RequestError> {
    let from_user = match raw.role.as_str() {
        "user" => true,
        "assistant" => false,
        "system" => {
            return Err(RequestError::UnsupportedPart(format!(
                "message '{}' is a system message; a Keel session's instructions are set when it is created",
                raw.id
            )));
        }
        other => return Err(RequestError::Malformed(format!("unknown role `{other}`"))),
    };
    let mut text = Vec::new();
    let mut tools = Vec::new();
    for part in raw.parts {
        let kind = part
            .get("type")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned();
        match kind.as_str() {
            "text" => match part.get("text").and_then(serde_json::Value::as_str) {
                Some(part_text) => text.push(part_text.to_owned()),
                None => {
                    return Err(RequestError::Malformed(format!(
                        "a text part of message '{}' has no `text`",
                        raw.id
                    )));
                }
            },
            _ if from_user && known_part(&kind) => {
                return Err(RequestError::UnsupportedPart(format!(
                    "a user message takes text parts only; message '{}' has a `{kind}` part",
                    raw.id
                )));
            }
            "step-start" | "reasoning" | "source-url" | "source-document" => {}
            _ if kind.starts_with("data-") => {}
            _ if kind == "dynamic-tool" || (kind.starts_with("tool-") && kind.len() > 5) => {
                let part: RawToolPart = serde_json::from_value(part)
                    .map_err(|error| RequestError::Malformed(format!("a `{kind}` part: {error}")))?;
                tools.push(tool_part(part)?);
            }
            "file" | "reasoning-file" | "custom" | "steering-message" => {
                return Err(RequestError::UnsupportedPart(format!(
                    "message '{}' has a `{kind}` part, which Keel does not take",
                    raw.id
                )));
            }
            _ => {
                return Err(RequestError::UnsupportedPart(format!(
                    "message '{}' has a part of unknown type `{kind}`",
                    raw.id
                )));
            }
        }
    }
    Ok(UiMessage {
        id: raw.id,
        from_user,
        text: text.join("\n"),
        tools,
    })
}

/// Whether `kind` is a part type of the UI message format.
fn known_part(kind: &str) -> bool {
    matches!(
        kind,
        "step-start"
            | "reasoning"
            | "source-url"
            | "source-document"
            | "dynamic-tool"
            | "file"
            | "reasoning-file"
            | "custom"
            | "steering-message"
    ) || kind.starts_with("data-")
        || kind.starts_with("tool-")
}

fn tool_part(part: RawToolPart) -> Result<ToolPart, RequestError> {
    let answer = match part.state.as_str() {
        "input-streaming" | "input-available" | "approval-requested" | "output-denied" => None,
        "approval-responded" => {
            let approved = part.approval.and_then(|approval| approval.approved).ok_or_else(|| {
                RequestError::Malformed(format!(
                    "the tool part '{}' is `approval-responded` without `approval.approved`",
                    part.tool_call_id
                ))
            })?;
            Some(Answer::Approval { approved })
        }
        "output-available" => Some(Answer::Output {
            output: match part.output {
                Some(serde_json::Value::String(text)) => text,
                Some(value) => value.to_string(),
                None => String::new(),
            },
            is_error: false,
        }),
        "output-error" => Some(Answer::Output {
            output: part.error_text.unwrap_or_default(),
            is_error: true,
        }),
        other => {
            return Err(RequestError::Malformed(format!(
                "the tool part '{}' has an unknown state `{other}`",
                part.tool_call_id
            )));
        }
    };
    Ok(ToolPart {
        call_id: part.tool_call_id,
        answer,
    })
}
