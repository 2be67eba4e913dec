//! `RunAgentInput` read as Keel ops: the run's new trailing user messages
//! become submissions, tool messages and `resume` entries answer the calls
//! that wait, and the history before them must be the session's.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use keel_protocol::{ApprovalDecision, ClientToolSpec, Op};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::events::Message;
use super::history::compare;
use super::thread::{Thread, WaitKind};

/// Why a request cannot run. Nothing is stored for any of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The body is not a `RunAgentInput` Keel takes (`400`).
    #[error("{0}")]
    Malformed(String),
    /// The history the client sent is not the session's (`409`).
    #[error("{0}")]
    HistoryMismatch(String),
    /// A resume entry or tool message answers a call that does not wait
    /// (`409`).
    #[error("{0}")]
    NotWaiting(String),
}

/// A message of the request, reduced to what Keel compares and takes.
/// Its texts are borrowed from the request's body where they can be (a
/// run resends the whole thread, which is only compared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputMessage<'a> {
    /// A user message.
    User {
        /// The client's id.
        id: Cow<'a, str>,
        /// Its text (its text parts, joined).
        text: Cow<'a, str>,
    },
    /// An assistant message.
    Assistant {
        /// The id.
        id: Cow<'a, str>,
        /// Its text (empty when absent).
        text: Cow<'a, str>,
    },
    /// A tool result.
    Tool {
        /// The call it answers.
        tool_call_id: Cow<'a, str>,
        /// Its text.
        text: Cow<'a, str>,
        /// Whether it reports an error.
        is_error: bool,
    },
    /// A message Keel does not keep in its history (`system`, `developer`,
    /// `reasoning`, `activity`): not compared.
    Ignored,
}

impl InputMessage<'_> {
    /// The message, owning its texts.
    pub fn into_owned(self) -> InputMessage<'static> {
        let owned = |text: Cow<'_, str>| Cow::Owned(text.into_owned());
        match self {
            InputMessage::User { id, text } => InputMessage::User {
                id: owned(id),
                text: owned(text),
            },
            InputMessage::Assistant { id, text } => InputMessage::Assistant {
                id: owned(id),
                text: owned(text),
            },
            InputMessage::Tool {
                tool_call_id,
                text,
                is_error,
            } => InputMessage::Tool {
                tool_call_id: owned(tool_call_id),
                text: owned(text),
                is_error,
            },
            InputMessage::Ignored => InputMessage::Ignored,
        }
    }

    pub(super) fn compared(&self) -> Option<(&'static str, &str)> {
        match self {
            InputMessage::User { text, .. } => Some(("user", text)),
            InputMessage::Assistant { text, .. } => Some(("assistant", text)),
            InputMessage::Tool { text, .. } => Some(("tool", text)),
            InputMessage::Ignored => None,
        }
    }
}

/// How a resume entry ends its interrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeStatus {
    /// Answered (with the payload).
    Resolved,
    /// Dismissed.
    Cancelled,
}

/// An answer to one interrupt.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeEntry {
    /// The interrupt answered (the call's id).
    pub interrupt_id: String,
    /// Whether it was answered or dismissed.
    pub status: ResumeStatus,
    /// The answer.
    #[serde(default)]
    pub payload: Option<Value>,
}

/// A `RunAgentInput`, as far as Keel reads it (`state`, `context` and
/// `forwardedProps` are accepted and not used).
#[derive(Debug, Clone, PartialEq)]
pub struct RunInput<'a> {
    /// The thread: the session.
    pub thread_id: String,
    /// The client's id for the run.
    pub run_id: String,
    /// The conversation as the client has it.
    pub messages: Vec<InputMessage<'a>>,
    /// The frontend tools, as client tools.
    pub tools: Vec<ClientToolSpec>,
    /// The answers to the last run's interrupts.
    pub resume: Vec<ResumeEntry>,
}

/// A `RunAgentInput` body as read from the wire, before [`read`] checks
/// it. A server deserializes the request into it directly: a run resends
/// the whole thread, and reading each message into its few fields, rather
/// than into a JSON tree first, is most of what a long thread costs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentBody<'a> {
    thread_id: String,
    run_id: String,
    #[serde(borrow)]
    messages: Vec<WireMessage<'a>>,
    #[serde(default)]
    tools: Option<Vec<WireTool>>,
    #[serde(default)]
    resume: Option<Vec<ResumeEntry>>,
}

/// A message's fields Keel reads (others are skipped unread), each kept as
/// sent so that [`message_of`] says which one is wrong.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMessage<'a> {
    #[serde(default, borrow)]
    role: Option<Loose<'a>>,
    #[serde(default, borrow)]
    id: Option<Loose<'a>>,
    #[serde(default, borrow)]
    content: Option<Loose<'a>>,
    #[serde(default, borrow)]
    tool_call_id: Option<Loose<'a>>,
    #[serde(default)]
    error: Option<Value>,
}

/// A field's value as sent: a string (borrowed from the body when it has
/// no escapes), or any other JSON, for the error that names it.
#[derive(Debug)]
enum Loose<'a> {
    Text(Cow<'a, str>),
    Other(Value),
}

impl<'de: 'a, 'a> Deserialize<'de> for Loose<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LooseVisitor(std::marker::PhantomData))
    }
}

struct LooseVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for LooseVisitor<'a> {
    type Value = Loose<'a>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Loose::Text(Cow::Borrowed(text)))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Loose::Text(Cow::Owned(text.to_owned())))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
        Ok(Loose::Text(Cow::Owned(text)))
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Self::Value, E> {
        Ok(Loose::Other(Value::Bool(value)))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        Ok(Loose::Other(Value::from(value)))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        Ok(Loose::Other(Value::from(value)))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
        Ok(Loose::Other(Value::from(value)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Loose::Other(Value::Null))
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Loose::Other(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        Loose::deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Value::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(Loose::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Value::deserialize(de::value::MapAccessDeserializer::new(map)).map(Loose::Other)
    }
}

#[derive(Deserialize)]
struct WireTool {
    name: String,
    description: String,
    #[serde(default)]
    parameters: Option<Value>,
}

/// Reads a `RunAgentInput` body (already read as JSON).
pub fn parse(body: Value) -> Result<RunInput<'static>, InputError> {
    let wire = RunAgentBody::deserialize(&body)
        .map_err(|error| InputError::Malformed(format!("not a RunAgentInput: {error}")))?;
    let input = read(wire)?;
    Ok(RunInput {
        messages: input.messages.into_iter().map(InputMessage::into_owned).collect(),
        ..input
    })
}

/// Checks a `RunAgentInput` read from the wire.
pub fn read(wire: RunAgentBody<'_>) -> Result<RunInput<'_>, InputError> {
    let messages = wire
        .messages
        .into_iter()
        .enumerate()
        .map(|(index, message)| message_of(index, message))
        .collect::<Result<Vec<_>, _>>()?;
    let resume = wire.resume.unwrap_or_default();
    let tools = wire
        .tools
        .unwrap_or_default()
        .into_iter()
        .map(|tool| {
            let parameters = match tool.parameters {
                None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
                Some(parameters @ Value::Object(_)) => parameters,
                Some(_) => {
                    return Err(InputError::Malformed(format!(
                        "the tool '{}': `parameters` is a JSON Schema object",
                        tool.name
                    )));
                }
            };
            Ok(ClientToolSpec {
                name: tool.name,
                description: tool.description,
                parameters,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RunInput {
        thread_id: wire.thread_id,
        run_id: wire.run_id,
        messages,
        tools,
        resume,
    })
}

fn message_of(index: usize, message: WireMessage<'_>) -> Result<InputMessage<'_>, InputError> {
    let at = |what: &str| InputError::Malformed(format!("messages[{index}]: {what}"));
    fn text(value: Option<Loose<'_>>) -> Option<Cow<'_, str>> {
        match value {
            Some(Loose::Text(text)) => Some(text),
            _ => None,
        }
    }
    let role = text(message.role).ok_or_else(|| at("has no `role`"))?;
    let id = text(message.id).ok_or_else(|| at("has no `id`"))?;
    let content = message.content;
    match role.as_ref() {
        "user" => Ok(InputMessage::User {
            id,
            text: content_text(index, content)?,
        }),
        "assistant" => Ok(InputMessage::Assistant {
            id,
            text: match content {
                None | Some(Loose::Other(Value::Null)) => Cow::Borrowed(""),
                Some(Loose::Text(text)) => text,
                Some(_) => return Err(at("an assistant message's `content` is text")),
            },
        }),
        "tool" => Ok(InputMessage::Tool {
            tool_call_id: text(message.tool_call_id).ok_or_else(|| at("a tool message needs `toolCallId`"))?,
            text: content_text(index, content)?,
            is_error: message.error.is_some_and(|error| !error.is_null()),
        }),
        // Not kept, but checked as AG-UI has them: text, or (an activity)
        // an object.
        "system" | "developer" | "reasoning" => match content {
            Some(Loose::Text(_)) => Ok(InputMessage::Ignored),
            _ => Err(at(&format!("a {role} message's `content` is text"))),
        },
        "activity" => match content {
            Some(Loose::Other(Value::Object(_))) => Ok(InputMessage::Ignored),
            _ => Err(at("an activity message's `content` is an object")),
        },
        other => Err(at(&format!("unknown role '{other}'"))),
    }
}

/// A message's text: a string, or text parts (other parts are refused:
/// Keel's messages are text).
fn content_text(index: usize, content: Option<Loose<'_>>) -> Result<Cow<'_, str>, InputError> {
    match content {
        Some(Loose::Text(text)) => Ok(text),
        Some(Loose::Other(Value::Array(parts))) => {
            let mut text = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => text.push_str(part.get("text").and_then(Value::as_str).unwrap_or("")),
                    Some(kind) => {
                        return Err(InputError::Malformed(format!(
                            "messages[{index}]: content parts of type '{kind}' are not supported; send text"
                        )));
                    }
                    None => {
                        return Err(InputError::Malformed(format!(
                            "messages[{index}]: a content part has no `type`"
                        )));
                    }
                }
            }
            Ok(Cow::Owned(text))
        }
        _ => Err(InputError::Malformed(format!(
            "messages[{index}]: `content` is text or a list of text parts"
        ))),
    }
}

/// What a request asks Keel to do, once checked against the thread.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Answers to waiting calls (`approval`, `client_tool_result` ops), by
    /// call id; they come first.
    pub answers: Vec<(String, Op)>,
    /// The new user messages: (the client's id, used as the idempotency
    /// key, and the text).
    pub user_messages: Vec<(String, String)>,
}

/// Checks `input` against the session's `thread` and says what to submit.
pub fn plan(input: &RunInput<'_>, thread: &Thread) -> Result<Plan, InputError> {
    let compared: Vec<&InputMessage> = input
        .messages
        .iter()
        .filter(|message| message.compared().is_some())
        .collect();
    // The new messages: the trailing user and tool messages.
    let split = compared
        .iter()
        .rposition(|message| !matches!(message, InputMessage::User { .. } | InputMessage::Tool { .. }))
        .map_or(0, |last| last + 1);
    let (history, new) = compared.split_at(split);
    let session = thread.history();
    // New messages the session has already (a retried run) are part of
    // its history: compare only what comes before the first of them.
    let cut = new
        .iter()
        .filter_map(|message| position_in(&session, message))
        .min()
        .unwrap_or(session.len());
    let history: Vec<(&str, &str)> = history.iter().filter_map(|message| message.compared()).collect();
    compare(&history, &session[..cut], |message| thread.broke_off(message)).map_err(InputError::HistoryMismatch)?;
    let mut plan = Plan::default();
    for message in new {
        match message {
            InputMessage::User { id, text } => plan.user_messages.push((id.to_string(), text.to_string())),
            InputMessage::Tool {
                tool_call_id,
                text,
                is_error,
            } => {
                if thread.answered(tool_call_id) {
                    continue;
                }
                match thread.wait(tool_call_id) {
                    Some(wait) if wait.kind == WaitKind::ClientTool => plan.answers.push((
                        tool_call_id.to_string(),
                        Op::ClientToolResult {
                            call_id: tool_call_id.to_string(),
                            output: text.to_string(),
                            is_error: *is_error,
                        },
                    )),
                    _ => return Err(not_waiting(tool_call_id)),
                }
            }
            InputMessage::Assistant { .. } | InputMessage::Ignored => {}
        }
    }
    let mut resumed = HashSet::new();
    for entry in &input.resume {
        let wait = thread
            .wait(&entry.interrupt_id)
            .ok_or_else(|| not_waiting(&entry.interrupt_id))?;
        if !resumed.insert(entry.interrupt_id.as_str()) {
            return Err(InputError::Malformed(format!(
                "`resume` answers the interrupt '{}' twice",
                entry.interrupt_id
            )));
        }
        if plan.answers.iter().any(|(call, _)| *call == entry.interrupt_id) {
            continue;
        }
        let op = match wait.kind {
            WaitKind::Approval => Op::Approval {
                call_id: wait.call_id.clone(),
                decision: decision_of(entry)?,
            },
            WaitKind::ClientTool => client_result_of(&wait.call_id, entry),
        };
        plan.answers.push((wait.call_id.clone(), op));
    }
    Ok(plan)
}

fn not_waiting(call_id: &str) -> InputError {
    InputError::NotWaiting(format!("no tool call '{call_id}' waits for an answer in this thread"))
}

/// Where the session has `message` already, for a new message a retried
/// run sends again.
fn position_in(session: &[&Message], message: &InputMessage) -> Option<usize> {
    session.iter().position(|have| match (have, message) {
        (Message::User { id, .. }, InputMessage::User { id: sent, .. }) => id == sent,
        (Message::Tool { tool_call_id, .. }, InputMessage::Tool { tool_call_id: sent, .. }) => tool_call_id == sent,
        _ => false,
    })
}

/// An approval's decision: `cancelled` denies; a resolved entry approves
/// unless its payload says otherwise (`false`, `"deny"`,
/// `{"approved": false}`, `{"decision": "deny"}`).
fn decision_of(entry: &ResumeEntry) -> Result<ApprovalDecision, InputError> {
    if entry.status == ResumeStatus::Cancelled {
        return Ok(ApprovalDecision::Deny);
    }
    let named = |name: &str| match name {
        "approve" => Ok(ApprovalDecision::Approve),
        "approve_for_session" => Ok(ApprovalDecision::ApproveForSession),
        "deny" => Ok(ApprovalDecision::Deny),
        other => Err(InputError::Malformed(format!(
            "resume '{}': the decision '{other}' is not approve, approve_for_session or deny",
            entry.interrupt_id
        ))),
    };
    let yes_no = |approved: bool| {
        if approved {
            ApprovalDecision::Approve
        } else {
            ApprovalDecision::Deny
        }
    };
    match &entry.payload {
        None | Some(Value::Null) => Ok(ApprovalDecision::Approve),
        Some(Value::Bool(approved)) => Ok(yes_no(*approved)),
        Some(Value::String(name)) => named(name),
        Some(Value::Object(fields)) => match (fields.get("decision"), fields.get("approved")) {
            (Some(Value::String(name)), _) => named(name),
            (None, Some(Value::Bool(approved))) => Ok(yes_no(*approved)),
            (None, None) => Ok(ApprovalDecision::Approve),
            _ => Err(InputError::Malformed(format!(
                "resume '{}': `decision` is a string, `approved` a boolean",
                entry.interrupt_id
            ))),
        },
        Some(_) => Err(InputError::Malformed(format!(
            "resume '{}': an approval's payload is a boolean, a decision or an object",
            entry.interrupt_id
        ))),
    }
}

/// A client tool's result from a resume entry: a string payload is the
/// output; `{"output": …, "isError": …}` names both; other JSON is the
/// output as JSON text; `cancelled` is an error result.
fn client_result_of(call_id: &str, entry: &ResumeEntry) -> Op {
    let (output, is_error) = match (&entry.status, &entry.payload) {
        (ResumeStatus::Cancelled, _) => ("the user cancelled the call".to_owned(), true),
        (_, None | Some(Value::Null)) => (String::new(), false),
        (_, Some(Value::String(text))) => (text.clone(), false),
        (_, Some(Value::Object(fields))) if fields.contains_key("output") => (
            match &fields["output"] {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            },
            fields.get("isError").and_then(Value::as_bool).unwrap_or(false),
        ),
        (_, Some(other)) => (other.to_string(), false),
    };
    Op::ClientToolResult {
        call_id: call_id.to_owned(),
        output,
        is_error,
    }
}
