//! A session's log read as an AG-UI thread: its messages, the tool calls
//! waiting for the client (approvals, client tools), and the idempotency
//! keys its user messages came with. Built incrementally, one event at a
//! time, so the run projection and the request checks read the same state.

use std::collections::{HashMap, HashSet};

use keel_protocol::{EventMsg, RecordedEvent};

use super::events::{FunctionCall, Message, ToolCall};

/// What a waiting tool call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitKind {
    /// A decision (`approval_requested`): answered by an `approval` op.
    Approval,
    /// A client tool's result (`client_tool_requested`): answered by a
    /// `client_tool_result` op.
    ClientTool,
}

/// A tool call of the open turn that waits for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// The call.
    pub call_id: String,
    /// Its turn.
    pub turn_id: String,
    /// What it waits for.
    pub kind: WaitKind,
    /// The tool.
    pub name: String,
}

/// A session's log as an AG-UI thread, up to the last event applied.
#[derive(Debug, Default, Clone)]
pub struct Thread {
    /// The messages, each with the turn that wrote it.
    messages: Vec<(String, Message)>,
    /// Submission id -> the idempotency key it was sent with.
    keys: HashMap<String, String>,
    /// The tool calls shown already (requested for approval or started).
    announced: HashSet<String>,
    /// The calls waiting for the client, in the order they were asked.
    waits: Vec<Wait>,
    /// The open turn.
    turn: Option<String>,
    /// The message id of the open turn's current model step.
    step_message: Option<String>,
    /// The text the current step has streamed, as the assistant message
    /// the run stream shows (with its turn), until its complete message
    /// comes. A client may have kept any beginning of it already: a page
    /// that lost its run (a crash) sends it on before the turn is closed.
    streaming: Option<(String, Message)>,
    /// Assistant messages a turn broke off (a cancel, a crash): they hold
    /// only the text streamed before, of which a client may have kept any
    /// beginning, or nothing.
    broken_off: HashSet<String>,
    /// The last sequence applied.
    last_sequence: u64,
}

impl Thread {
    /// An empty thread (a session with no events).
    pub fn new() -> Self {
        Self::default()
    }

    /// The thread after every event of `log`, in order.
    pub fn from_log<'a>(log: impl IntoIterator<Item = &'a RecordedEvent>) -> Self {
        let mut thread = Self::new();
        for event in log {
            thread.apply(event);
        }
        thread
    }

    /// The thread's messages, oldest first.
    pub fn messages(&self) -> Vec<Message> {
        self.messages.iter().map(|(_, message)| message.clone()).collect()
    }

    /// The thread's messages, oldest first, borrowed (what a run's history
    /// is compared with).
    /// The message the open step is streaming comes last, as far as it
    /// got.
    pub fn history(&self) -> Vec<&Message> {
        let streaming = self.streaming.iter().map(|(_, message)| message);
        self.messages
            .iter()
            .map(|(_, message)| message)
            .chain(streaming)
            .collect()
    }

    /// The calls waiting for the client.
    pub fn waits(&self) -> &[Wait] {
        &self.waits
    }

    /// The wait for `call_id`, if it waits.
    pub fn wait(&self, call_id: &str) -> Option<&Wait> {
        self.waits.iter().find(|wait| wait.call_id == call_id)
    }

    /// The open turn, if one runs (or waits).
    pub fn open_turn(&self) -> Option<&str> {
        self.turn.as_deref()
    }

    /// Whether the call was shown already (its `TOOL_CALL_*` were sent).
    pub fn announced(&self, call_id: &str) -> bool {
        self.announced.contains(call_id)
    }

    /// Whether a tool message answers `call_id` already.
    pub fn answered(&self, call_id: &str) -> bool {
        self.messages
            .iter()
            .any(|(_, message)| matches!(message, Message::Tool { tool_call_id, .. } if tool_call_id == call_id))
    }

    /// Whether an idempotency key was taken by a submission.
    pub fn key_taken(&self, key: &str) -> bool {
        self.keys.values().any(|taken| taken == key)
    }

    /// The last sequence applied (0 for none).
    pub fn last_sequence(&self) -> u64 {
        self.last_sequence
    }

    /// Whether `message` is an assistant message its turn broke off (see
    /// `broken_off`), or the one the open step is streaming: a client may
    /// hold any beginning of its text.
    pub fn broke_off(&self, message: &Message) -> bool {
        let Message::Assistant { id, .. } = message else {
            return false;
        };
        self.broken_off.contains(id)
            || matches!(&self.streaming, Some((_, Message::Assistant { id: open, .. })) if open == id)
    }

    /// The message id of the open turn's current model step.
    pub fn step_message(&self) -> Option<&str> {
        self.step_message.as_deref()
    }

    /// Takes one event in.
    pub fn apply(&mut self, event: &RecordedEvent) {
        self.last_sequence = event.sequence;
        match &event.msg {
            EventMsg::SubmissionQueued(queued) => {
                if let (Some(id), Some(key)) = (&event.submission_id, &queued.idempotency_key) {
                    self.keys.insert(id.clone(), key.clone());
                }
            }
            EventMsg::TurnStarted(started) => {
                self.turn = Some(started.turn_id.clone());
                self.step_message = None;
            }
            EventMsg::UserMessage(user) => {
                let id = event
                    .submission_id
                    .as_ref()
                    .and_then(|id| self.keys.get(id))
                    .cloned()
                    .unwrap_or_else(|| format!("{}-user-{}", user.turn_id, event.sequence));
                self.push(
                    &user.turn_id,
                    Message::User {
                        id,
                        content: user.text.clone(),
                    },
                );
            }
            EventMsg::ModelStepStarted(step) => {
                self.streaming = None;
                let id = step
                    .message_id
                    .clone()
                    .unwrap_or_else(|| format!("{}-{}", step.turn_id, step.step));
                self.step_message = Some(id);
            }
            EventMsg::AssistantContentDelta(delta) if !delta.delta.is_empty() => {
                // The id the run stream gives the text (`run.rs`).
                let id = self
                    .step_message
                    .clone()
                    .unwrap_or_else(|| format!("{}-message", delta.turn_id));
                let (_, streaming) = self.streaming.get_or_insert_with(|| {
                    let message = Message::Assistant {
                        id,
                        content: Some(String::new()),
                        tool_calls: Vec::new(),
                    };
                    (delta.turn_id.clone(), message)
                });
                if let Message::Assistant {
                    content: Some(text), ..
                } = streaming
                {
                    text.push_str(&delta.delta);
                }
            }
            EventMsg::AssistantMessage(message) if message.text.is_empty() => self.streaming = None,
            EventMsg::AssistantMessage(message) => {
                self.streaming = None;
                let id = message
                    .message_id
                    .clone()
                    .or_else(|| self.step_message.clone())
                    .unwrap_or_else(|| format!("{}-{}", message.turn_id, event.sequence));
                if let Message::Assistant { content, .. } = self.assistant(&message.turn_id, &id) {
                    *content = Some(message.text.clone());
                }
            }
            EventMsg::ApprovalRequested(request) => {
                self.announce(&request.turn_id, &request.call_id, &request.name, &request.arguments);
                self.ask(&request.turn_id, &request.call_id, &request.name, WaitKind::Approval);
            }
            EventMsg::ApprovalDecided(decided) => self.settle(&decided.call_id),
            EventMsg::ToolCallStarted(started) => {
                self.announce(&started.turn_id, &started.call_id, &started.name, &started.arguments);
            }
            EventMsg::ClientToolRequested(request) => {
                self.ask(&request.turn_id, &request.call_id, &request.name, WaitKind::ClientTool);
            }
            EventMsg::ToolCallCompleted(completed) => {
                self.settle(&completed.call_id);
                self.push(
                    &completed.turn_id,
                    Message::Tool {
                        id: format!("{}-result", completed.call_id),
                        content: completed.output.clone(),
                        tool_call_id: completed.call_id.clone(),
                        error: completed.is_error.then(|| completed.output.clone()),
                    },
                );
            }
            EventMsg::TurnComplete(_) | EventMsg::TurnAborted(_) => {
                self.keep_broken_off();
                self.turn = None;
                self.step_message = None;
                self.waits.clear();
            }
            EventMsg::TurnRolledBack(rolled) => {
                self.messages.retain(|(turn, _)| *turn != rolled.rolled_back_turn_id);
            }
            _ => {}
        }
    }

    /// Keeps the text a step streamed without its complete message (the
    /// turn ended first) as its assistant message: what the client was
    /// shown of it.
    fn keep_broken_off(&mut self) {
        let Some((turn_id, Message::Assistant { id, content: text, .. })) = self.streaming.take() else {
            return;
        };
        if let Message::Assistant { content, .. } = self.assistant(&turn_id, &id)
            && content.is_none()
        {
            *content = text;
            self.broken_off.insert(id);
        }
    }

    fn push(&mut self, turn_id: &str, message: Message) {
        self.messages.push((turn_id.to_owned(), message));
    }

    /// The assistant message `id`, made (empty) when there is none yet.
    fn assistant(&mut self, turn_id: &str, id: &str) -> &mut Message {
        let found = self
            .messages
            .iter()
            .position(|(_, message)| matches!(message, Message::Assistant { id: have, .. } if have == id));
        let index = match found {
            Some(index) => index,
            None => {
                self.push(
                    turn_id,
                    Message::Assistant {
                        id: id.to_owned(),
                        content: None,
                        tool_calls: Vec::new(),
                    },
                );
                self.messages.len() - 1
            }
        };
        &mut self.messages[index].1
    }

    /// Adds a call to its step's assistant message, once.
    fn announce(&mut self, turn_id: &str, call_id: &str, name: &str, arguments: &str) {
        if !self.announced.insert(call_id.to_owned()) {
            return;
        }
        let id = self
            .step_message
            .clone()
            .unwrap_or_else(|| format!("{turn_id}-{call_id}"));
        if let Message::Assistant { tool_calls, .. } = self.assistant(turn_id, &id) {
            tool_calls.push(ToolCall {
                id: call_id.to_owned(),
                kind: "function",
                function: FunctionCall {
                    name: name.to_owned(),
                    arguments: arguments.to_owned(),
                },
            });
        }
    }

    fn ask(&mut self, turn_id: &str, call_id: &str, name: &str, kind: WaitKind) {
        if self.wait(call_id).is_none() {
            self.waits.push(Wait {
                call_id: call_id.to_owned(),
                turn_id: turn_id.to_owned(),
                kind,
                name: name.to_owned(),
            });
        }
    }

    fn settle(&mut self, call_id: &str) {
        self.waits.retain(|wait| wait.call_id != call_id);
    }
}
