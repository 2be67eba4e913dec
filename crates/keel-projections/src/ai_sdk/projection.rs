//! One turn of a session's log as UI message chunks, computed incrementally
//! from its events.

use std::collections::{HashMap, HashSet};

use keel_protocol::{AbortReason, ApprovalDecision, EventMsg, RecordedEvent};

use super::chunk::Chunk;

/// Which turn a projection shows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// This turn.
    Turn(String),
    /// The turn a submission starts or joins (not known yet).
    Submission(String),
}

/// What the projection is waiting for from the client: an approval or a
/// client tool's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// An `approval` op.
    Approval,
    /// A `client_tool_result` op.
    ClientTool,
}

/// A turn seen as one assistant message of the UI message stream.
///
/// Feed it the session's events in order ([`Self::push`]); it returns the
/// chunks each adds. It ignores the events of other turns, so it can be fed
/// the log from any point before its turn starts. Pure: the same events
/// give the same chunks, on any node and after any restart.
#[derive(Debug, Clone)]
pub struct Projection {
    target: Target,
    /// Whether `start` was sent (and not ended by a `finish`).
    started: bool,
    step_open: bool,
    step: u32,
    /// The current step's assistant message id.
    message_id: String,
    /// The open text part, and the text it streamed so far.
    text_open: bool,
    streamed: String,
    reasoning_open: bool,
    /// Calls whose `tool-input-available` was sent.
    announced: HashSet<String>,
    /// Calls the user denied: their error result is the denial.
    denied: HashSet<String>,
    /// Calls waiting for the client, and for what.
    waiting: HashMap<String, Wait>,
    /// Calls answered in this turn, by the sequence of the answer's event.
    answered: HashMap<String, u64>,
    errored: bool,
    finished: bool,
}

impl Projection {
    /// The projection of turn `turn_id`.
    pub fn of_turn(turn_id: &str) -> Self {
        Self::new(Target::Turn(turn_id.to_owned()))
    }

    /// The projection of the turn that submission `submission_id` starts
    /// (or joins): found by the `turn_started` or `user_message` it causes.
    pub fn of_submission(submission_id: &str) -> Self {
        Self::new(Target::Submission(submission_id.to_owned()))
    }

    fn new(target: Target) -> Self {
        Self {
            target,
            started: false,
            step_open: false,
            step: 0,
            message_id: String::new(),
            text_open: false,
            streamed: String::new(),
            reasoning_open: false,
            announced: HashSet::new(),
            denied: HashSet::new(),
            waiting: HashMap::new(),
            answered: HashMap::new(),
            errored: false,
            finished: false,
        }
    }

    /// The turn shown, once known.
    pub fn turn_id(&self) -> Option<&str> {
        match &self.target {
            Target::Turn(id) => Some(id),
            Target::Submission(_) => None,
        }
    }

    /// Whether the turn ended: nothing follows but `[DONE]`.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether a message is open: `start` sent, and neither a finish nor a
    /// [`Self::pause`] since.
    pub fn is_open(&self) -> bool {
        self.started && !self.finished
    }

    /// The calls the turn waits on the client for.
    pub fn waiting(&self) -> &HashMap<String, Wait> {
        &self.waiting
    }

    /// The sequence of the event that answered `call_id` in this turn (its
    /// decision, or its client result), if one did.
    pub fn answered_at(&self, call_id: &str) -> Option<u64> {
        self.answered.get(call_id).copied()
    }

    /// The chunks `event` adds.
    pub fn push(&mut self, event: &RecordedEvent) -> Vec<Chunk> {
        let mut out = Vec::new();
        if self.finished || !self.locate(event, &mut out) {
            return out;
        }
        match &event.msg {
            EventMsg::TurnStarted(_) => self.resume(&mut out),
            EventMsg::UserMessage(_) => {}
            EventMsg::ModelStepStarted(step) => {
                self.close_step(&mut out);
                self.start_message(&mut out);
                self.step = step.step;
                self.message_id = step
                    .message_id
                    .clone()
                    .unwrap_or_else(|| format!("{}-{}", self.turn_id().unwrap_or_default(), step.step));
                self.open_step(&mut out);
            }
            EventMsg::AssistantContentDelta(delta) => self.text(&delta.delta, &mut out),
            EventMsg::ReasoningDelta(delta) => {
                self.resume(&mut out);
                self.close_text(&mut out);
                if !self.reasoning_open {
                    self.reasoning_open = true;
                    out.push(Chunk::ReasoningStart {
                        id: self.reasoning_id(),
                    });
                }
                out.push(Chunk::ReasoningDelta {
                    id: self.reasoning_id(),
                    delta: delta.delta.clone(),
                });
            }
            EventMsg::AssistantMessage(message) => {
                // The message is what the deltas streamed; send what they
                // missed (a model that does not stream), never twice.
                if let Some(rest) = message.text.strip_prefix(self.streamed.as_str())
                    && !rest.is_empty()
                {
                    let rest = rest.to_owned();
                    self.text(&rest, &mut out);
                }
                self.close_text(&mut out);
            }
            EventMsg::ApprovalRequested(request) => {
                self.resume(&mut out);
                self.close_parts(&mut out);
                self.announce(&request.call_id, &request.name, &request.arguments, &mut out);
                self.waiting.insert(request.call_id.clone(), Wait::Approval);
                out.push(Chunk::ToolApprovalRequest {
                    approval_id: request.call_id.clone(),
                    tool_call_id: request.call_id.clone(),
                });
            }
            EventMsg::ApprovalDecided(decided) => {
                self.resume(&mut out);
                self.waiting.remove(&decided.call_id);
                self.answered.insert(decided.call_id.clone(), event.sequence);
                let approved = decided.decision != ApprovalDecision::Deny;
                out.push(Chunk::ToolApprovalResponse {
                    approval_id: decided.call_id.clone(),
                    approved,
                });
                if !approved {
                    self.denied.insert(decided.call_id.clone());
                    out.push(Chunk::ToolOutputDenied {
                        tool_call_id: decided.call_id.clone(),
                    });
                }
            }
            EventMsg::ToolCallStarted(call) => {
                self.resume(&mut out);
                self.close_parts(&mut out);
                self.announce(&call.call_id, &call.name, &call.arguments, &mut out);
            }
            EventMsg::ClientToolRequested(request) => {
                self.resume(&mut out);
                self.close_parts(&mut out);
                self.announce(&request.call_id, &request.name, &request.arguments, &mut out);
                self.waiting.insert(request.call_id.clone(), Wait::ClientTool);
            }
            EventMsg::ToolCallCompleted(done) => {
                self.resume(&mut out);
                if self.waiting.remove(&done.call_id) == Some(Wait::ClientTool) {
                    self.answered.insert(done.call_id.clone(), event.sequence);
                }
                if !self.denied.contains(&done.call_id) {
                    out.push(if done.is_error {
                        Chunk::ToolOutputError {
                            tool_call_id: done.call_id.clone(),
                            error_text: done.output.clone(),
                        }
                    } else {
                        Chunk::ToolOutputAvailable {
                            tool_call_id: done.call_id.clone(),
                            output: serde_json::Value::String(done.output.clone()),
                        }
                    });
                }
            }
            EventMsg::Error(error) => {
                self.resume(&mut out);
                self.errored = true;
                out.push(Chunk::Error {
                    error_text: error.message.clone(),
                });
            }
            EventMsg::TurnComplete(complete) => {
                self.resume(&mut out);
                self.close_step(&mut out);
                let finish_reason = if complete.length_limited { "length" } else { "stop" };
                out.push(Chunk::Finish { finish_reason });
                self.finished = true;
            }
            EventMsg::TurnAborted(aborted) => {
                self.resume(&mut out);
                self.close_step(&mut out);
                if aborted.reason == AbortReason::Interrupted {
                    out.push(Chunk::Abort {
                        reason: aborted.message.clone(),
                    });
                } else {
                    if !self.errored {
                        out.push(Chunk::Error {
                            error_text: aborted.message.clone(),
                        });
                    }
                    out.push(Chunk::Finish { finish_reason: "error" });
                }
                self.finished = true;
            }
            EventMsg::SubmissionRejected(rejected) => {
                // Only the submission followed reaches here (see `locate`).
                out.push(Chunk::Error {
                    error_text: rejected.reason.clone(),
                });
                self.finished = true;
            }
            _ => {}
        }
        out
    }

    /// Ends the stream while the turn waits for the client: the open step
    /// closes and the message finishes with `tool-calls`. The next event of
    /// the turn opens a new message stream (`start`, `start-step`), as the
    /// client's next request continues the same message.
    pub fn pause(&mut self) -> Vec<Chunk> {
        let mut out = Vec::new();
        if self.started && !self.finished {
            self.close_step(&mut out);
            out.push(Chunk::Finish {
                finish_reason: "tool-calls",
            });
            self.started = false;
        }
        out
    }

    /// Whether `event` belongs to the turn shown (locking onto the turn of
    /// the submission followed when it first appears, with its `start`).
    fn locate(&mut self, event: &RecordedEvent, out: &mut Vec<Chunk>) -> bool {
        match &self.target {
            Target::Turn(id) => event.msg.turn_id() == Some(id.as_str()),
            Target::Submission(submission) => {
                if event.submission_id.as_deref() != Some(submission.as_str()) {
                    return false;
                }
                if let EventMsg::SubmissionRejected(_) = event.msg {
                    return true;
                }
                let turn = match &event.msg {
                    EventMsg::TurnStarted(started) => started.turn_id.clone(),
                    EventMsg::UserMessage(message) => message.turn_id.clone(),
                    _ => return false,
                };
                self.target = Target::Turn(turn);
                self.resume(out);
                true
            }
        }
    }

    /// Sends `start` if the message is not open (the first chunk, or the
    /// first after a [`Self::pause`]), reopening the step that was open.
    fn resume(&mut self, out: &mut Vec<Chunk>) {
        if self.start_message(out) && self.step > 0 {
            self.open_step(out);
        }
    }

    /// Sends `start` if the message is not open; whether it did.
    fn start_message(&mut self, out: &mut Vec<Chunk>) -> bool {
        if self.started {
            return false;
        }
        self.started = true;
        out.push(Chunk::Start {
            message_id: self.turn_id().unwrap_or_default().to_owned(),
        });
        true
    }

    fn open_step(&mut self, out: &mut Vec<Chunk>) {
        self.step_open = true;
        self.streamed.clear();
        out.push(Chunk::StartStep);
    }

    fn text(&mut self, delta: &str, out: &mut Vec<Chunk>) {
        self.resume(out);
        self.close_reasoning(out);
        if !self.text_open {
            self.text_open = true;
            out.push(Chunk::TextStart {
                id: self.message_id.clone(),
            });
        }
        self.streamed.push_str(delta);
        out.push(Chunk::TextDelta {
            id: self.message_id.clone(),
            delta: delta.to_owned(),
        });
    }

    fn announce(&mut self, call_id: &str, name: &str, arguments: &str, out: &mut Vec<Chunk>) {
        if !self.announced.insert(call_id.to_owned()) {
            return;
        }
        // The model's text when it is not JSON: the schema takes any
        // input, and the call still goes on (the tool refuses it).
        let input = serde_json::from_str(arguments).unwrap_or_else(|_| serde_json::Value::String(arguments.to_owned()));
        out.push(Chunk::ToolInputAvailable {
            tool_call_id: call_id.to_owned(),
            tool_name: name.to_owned(),
            input,
        });
    }

    fn reasoning_id(&self) -> String {
        format!("{}-reasoning", self.message_id)
    }

    fn close_text(&mut self, out: &mut Vec<Chunk>) {
        if self.text_open {
            self.text_open = false;
            out.push(Chunk::TextEnd {
                id: self.message_id.clone(),
            });
        }
    }

    fn close_reasoning(&mut self, out: &mut Vec<Chunk>) {
        if self.reasoning_open {
            self.reasoning_open = false;
            out.push(Chunk::ReasoningEnd {
                id: self.reasoning_id(),
            });
        }
    }

    fn close_parts(&mut self, out: &mut Vec<Chunk>) {
        self.close_reasoning(out);
        self.close_text(out);
    }

    fn close_step(&mut self, out: &mut Vec<Chunk>) {
        self.close_parts(out);
        if self.step_open {
            self.step_open = false;
            out.push(Chunk::FinishStep);
        }
    }
}
