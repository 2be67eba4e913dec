//! Ops: the requests a client submits to a session.

use serde::{Deserialize, Serialize};

/// The largest user message accepted, in bytes of UTF-8 text. Larger input is
/// refused before it is queued, so it can never reach the log or a model.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// A request to a session.
///
/// JSON: `{"type": "user_input", "text": "…"}`, `{"type": "interrupt",
/// "turn_id": "…"}` (`turn_id` optional), `{"type": "shutdown"}`,
/// `{"type": "approval", "call_id": "…", "decision": "approve" |
/// "approve_for_session" | "deny"}`, `{"type": "steer", "text": "…"}`,
/// `{"type": "compact"}`, `{"type": "regenerate"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
// Parsed through `OpWire`, which refuses unknown fields: a misspelt field
// would otherwise be dropped without a word (the API documents them as `400`).
#[serde(tag = "type", rename_all = "snake_case", from = "OpWire")]
pub enum Op {
    /// A user message. It starts a turn, or waits for the next one while a
    /// turn runs: by the session's queue mode, every message queued before
    /// a turn starts joins that turn (`merge`, the runtime's default), or
    /// each gets a turn of its own (`each`).
    UserInput {
        /// The message text (not only white space).
        #[cfg_attr(feature = "openapi", schema(pattern = r"\S"))]
        text: String,
    },
    /// Abort the running turn. With a `turn_id`, only that turn is aborted,
    /// so a late interrupt cannot hit the turn that followed it.
    Interrupt {
        /// The turn to abort; `None` aborts whichever turn is running.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_id: Option<String>,
    },
    /// Finish the work queued before this op, flush the log, record a final
    /// event and stop. Ops queued after it are recorded as rejected.
    Shutdown,
    /// Answers an `approval_requested` event.
    Approval {
        /// The tool call the decision is for.
        call_id: String,
        /// The decision.
        decision: ApprovalDecision,
    },
    /// A user message for the running turn: it joins the turn before the
    /// turn's next model step (the turn takes one more step for it if the
    /// model was done). With no turn running it starts one, like
    /// [`Op::UserInput`].
    Steer {
        /// The message text (not only white space).
        #[cfg_attr(feature = "openapi", schema(pattern = r"\S"))]
        text: String,
    },
    /// Compact the history now: the model summarizes its older part, which
    /// later requests carry as the summary (see `context_compacted`). Waits
    /// in the queue behind running work.
    Compact,
    /// Roll the last turn back and run its user messages again: the turn's
    /// history items leave the history (a `turn_rolled_back` event; its
    /// events stay in the log) and a new turn answers anew. Waits in the
    /// queue behind running work.
    Regenerate,
    /// Answers a `client_tool_requested` event: the result of a tool the
    /// client executed, which goes back to the model.
    ClientToolResult {
        /// The tool call answered.
        call_id: String,
        /// The result (or, with `is_error`, the error message).
        output: String,
        /// Whether the call failed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

/// [`Op`] as parsed: the same tags and fields, with unknown fields refused.
/// `Shutdown` is an empty struct here because serde ignores extra fields
/// after the tag of a unit variant.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum OpWire {
    UserInput {
        text: String,
    },
    Interrupt {
        #[serde(default)]
        turn_id: Option<String>,
    },
    Shutdown {},
    Approval {
        call_id: String,
        decision: ApprovalDecision,
    },
    Steer {
        text: String,
    },
    Compact {},
    Regenerate {},
    ClientToolResult {
        call_id: String,
        output: String,
        #[serde(default)]
        is_error: bool,
    },
}

impl From<OpWire> for Op {
    fn from(wire: OpWire) -> Self {
        match wire {
            OpWire::UserInput { text } => Op::UserInput { text },
            OpWire::Interrupt { turn_id } => Op::Interrupt { turn_id },
            OpWire::Shutdown {} => Op::Shutdown,
            OpWire::Approval { call_id, decision } => Op::Approval { call_id, decision },
            OpWire::Steer { text } => Op::Steer { text },
            OpWire::Compact {} => Op::Compact,
            OpWire::Regenerate {} => Op::Regenerate,
            OpWire::ClientToolResult {
                call_id,
                output,
                is_error,
            } => Op::ClientToolResult {
                call_id,
                output,
                is_error,
            },
        }
    }
}

/// What a user message does when the session is busy (a turn is running or
/// messages are queued). With the session idle every policy starts a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BusyPolicy {
    /// Wait for the next turn.
    #[default]
    Queue,
    /// Abort the running turn, then start a new turn with the message.
    Interrupt,
    /// Refuse the message.
    Reject,
    /// Join the running turn before its next model step ([`Op::Steer`]).
    Steer,
}

impl BusyPolicy {
    /// The policy's name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::Interrupt => "interrupt",
            Self::Reject => "reject",
            Self::Steer => "steer",
        }
    }
}

/// The longest idempotency key accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;

/// Checks an idempotency key: 1 to [`MAX_IDEMPOTENCY_KEY_BYTES`] printable
/// ASCII characters.
pub fn validate_idempotency_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES || !key.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(format!(
            "an idempotency key is 1 to {MAX_IDEMPOTENCY_KEY_BYTES} printable ASCII characters"
        ));
    }
    Ok(())
}

/// A user's answer to a tool call that needs approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// Run this call.
    Approve,
    /// Run this call and, for the rest of the session, every call of the
    /// same tool without asking.
    ApproveForSession,
    /// Do not run it; the model is told the user denied it.
    Deny,
}

impl Op {
    /// Checks the op against the protocol's limits before it is queued.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Op::UserInput { text } | Op::Steer { text } if text.len() > MAX_MESSAGE_BYTES => Err(format!(
                "message is {} bytes; the limit is {MAX_MESSAGE_BYTES}",
                text.len()
            )),
            Op::UserInput { text } | Op::Steer { text } if text.trim().is_empty() => Err("message is empty".into()),
            Op::ClientToolResult { output, .. } if output.len() > crate::MAX_CLIENT_TOOL_OUTPUT_BYTES => Err(format!(
                "the client tool result is {} bytes; the limit is {}",
                output.len(),
                crate::MAX_CLIENT_TOOL_OUTPUT_BYTES
            )),
            _ => Ok(()),
        }
    }

    /// Whether the op must reach a running turn at once instead of waiting
    /// in the queue behind user messages.
    pub fn is_control(&self) -> bool {
        matches!(
            self,
            Op::Interrupt { .. } | Op::Approval { .. } | Op::Steer { .. } | Op::ClientToolResult { .. }
        )
    }

    /// Whether the op is work that waits in the queue and is stored before
    /// it is acknowledged (a message, `compact`, `regenerate`), so that a
    /// crash cannot lose it.
    pub fn is_stored_ahead(&self) -> bool {
        matches!(
            self,
            Op::UserInput { .. } | Op::Steer { .. } | Op::Compact | Op::Regenerate
        )
    }

    /// The text of a user message ([`Op::UserInput`] or [`Op::Steer`]).
    pub fn message_text(&self) -> Option<&str> {
        match self {
            Op::UserInput { text } | Op::Steer { text } => Some(text),
            _ => None,
        }
    }
}

/// An accepted op with its identity: `id` is unique, `sequence` orders the
/// submissions of one runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submission {
    /// Unique id; events caused by this submission carry it.
    pub id: String,
    /// Position among the submissions accepted by this session's runtime.
    pub sequence: u64,
    /// The request itself.
    pub op: Op,
    /// Who sent it, when a server knows (the audit trail).
    pub submitted_by: Option<crate::Actor>,
    /// The caller's W3C `traceparent`, when it sent one: the turn the
    /// submission starts runs in the caller's trace.
    pub traceparent: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_ops_are_refused_by_the_parser() {
        for bad in [
            r#"{"type": "user_input"}"#,
            r#"{"type": "user_input", "text": 5}"#,
            r#"{"type": "launch_rockets"}"#,
            r#"{"text": "no type"}"#,
            r#"{"type": "user_input", "text": "unterminated"#,
            r#"{"type": "user_input", "text": "hi", "txet": "typo"}"#,
            r#"{"type": "interrupt", "turn": "t1"}"#,
            r#"{"type": "shutdown", "now": true}"#,
            r#"{"type": "compact", "keep": 3}"#,
            r#"{"type": "regenerate", "turn_id": "t"}"#,
            r#"{"type": "approval", "call_id": "c", "decision": "deny", "why": "no"}"#,
            "",
        ] {
            assert!(serde_json::from_str::<Op>(bad).is_err(), "{bad:?} must not parse");
        }
        let op: Op = serde_json::from_str(r#"{"type": "interrupt"}"#).expect("interrupt without a turn id");
        assert_eq!(op, Op::Interrupt { turn_id: None });
        for op in [
            Op::Shutdown,
            Op::Compact,
            Op::Regenerate,
            Op::Interrupt {
                turn_id: Some("t".into()),
            },
            Op::Steer { text: "s".into() },
            Op::Approval {
                call_id: "c".into(),
                decision: ApprovalDecision::ApproveForSession,
            },
        ] {
            let json = serde_json::to_string(&op).expect("serialize");
            assert_eq!(serde_json::from_str::<Op>(&json).expect("round trip"), op, "{json}");
        }
    }

    #[test]
    fn limits_are_checked_before_queueing() {
        let at_limit = Op::UserInput {
            text: "x".repeat(MAX_MESSAGE_BYTES),
        };
        assert_eq!(at_limit.validate(), Ok(()));
        let over = Op::UserInput {
            text: "é".repeat(MAX_MESSAGE_BYTES / 2 + 1),
        };
        assert!(over.validate().is_err(), "the limit counts bytes, not characters");
        assert!(Op::UserInput { text: " \t".into() }.validate().is_err());
    }
}
