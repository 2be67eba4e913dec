//! One AG-UI run projected from the log: the events of the Keel turn it
//! follows, from `RUN_STARTED` to `RUN_FINISHED` or `RUN_ERROR`.
//!
//! A run ends where the turn ends, or where the turn waits for the client
//! (an approval, a client tool): the Keel turn stays durably open, and the
//! next run, which answers the wait, streams the rest of it.

use std::collections::HashSet;

use keel_protocol::{AbortReason, EventMsg, RecordedEvent};

use super::events::{AgUiEvent, Interrupt, RunOutcome};
use super::thread::{Thread, WaitKind};

/// Which run of the thread a projection streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStart {
    /// The turn that takes up one of these submissions (the run's new user
    /// messages): the run starts with that turn.
    Submissions(HashSet<String>),
    /// The rest of the open turn `turn_id`, after the client answered the
    /// waits `answered`: the run starts at once.
    Resume {
        /// The turn resumed.
        turn_id: String,
        /// The run's id.
        run_id: String,
        /// The calls the client answered in this run's request.
        answered: HashSet<String>,
    },
}

/// The run being streamed.
#[derive(Debug, Clone)]
struct Active {
    turn_id: String,
    run_id: String,
    step: Option<String>,
    text: Option<String>,
    reasoning: Option<String>,
}

/// An AG-UI run computed from the log, one stored event at a time.
#[derive(Debug, Clone)]
pub struct RunProjection {
    thread_id: String,
    thread: Thread,
    start: RunStart,
    /// The turn seen starting that may be the run's (waiting for its user
    /// message to say so).
    candidate: Option<String>,
    active: Option<Active>,
    finished: bool,
}

impl RunProjection {
    /// A run of `thread_id`, whose log up to here is `thread`.
    pub fn new(thread_id: impl Into<String>, thread: Thread, start: RunStart) -> Self {
        Self {
            thread_id: thread_id.into(),
            thread,
            start,
            candidate: None,
            active: None,
            finished: false,
        }
    }

    /// The events to send before any stored one: a resumed run starts now.
    pub fn open(&mut self) -> Vec<AgUiEvent> {
        let RunStart::Resume { turn_id, run_id, .. } = &self.start else {
            return Vec::new();
        };
        if self.active.is_some() || self.finished {
            return Vec::new();
        }
        let (turn_id, run_id) = (turn_id.clone(), run_id.clone());
        self.activate(turn_id.clone(), run_id, Some(turn_id))
    }

    /// Whether the run has ended (its last event was sent).
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The thread as of the last event taken in.
    pub fn thread(&self) -> &Thread {
        &self.thread
    }

    /// Ends the run and takes its thread, as of the last event taken in
    /// (for the next run of the thread to start from).
    pub fn take_thread(&mut self) -> Thread {
        self.finished = true;
        std::mem::take(&mut self.thread)
    }

    /// Whether the run's turn waits for the client on a call this run has
    /// not answered: the run ends (see [`RunProjection::settle`]) once the
    /// log holds nothing more for now.
    pub fn waiting(&self) -> bool {
        !self.finished && !self.unanswered_waits().is_empty()
    }

    /// Takes in the next stored event; the AG-UI events it makes.
    pub fn push(&mut self, event: &RecordedEvent) -> Vec<AgUiEvent> {
        if self.finished {
            return Vec::new();
        }
        let announced = match &event.msg {
            EventMsg::ApprovalRequested(request) => self.thread.announced(&request.call_id),
            EventMsg::ToolCallStarted(started) => self.thread.announced(&started.call_id),
            _ => false,
        };
        self.thread.apply(event);
        let mut out = Vec::new();
        if self.active.is_none() {
            out.extend(self.await_start(event));
            if self.active.is_none() {
                return out;
            }
        }
        let Some(active) = &self.active else {
            return out;
        };
        if event.msg.turn_id() != Some(active.turn_id.as_str()) {
            return out;
        }
        out.extend(self.project(event, announced));
        out
    }

    /// The end of a run whose turn waits for the client: called when the
    /// log holds nothing more for now (every call the turn asks about in
    /// one step is recorded in one commit).
    pub fn settle(&mut self) -> Vec<AgUiEvent> {
        let waits = self.unanswered_waits();
        if self.finished || waits.is_empty() {
            return Vec::new();
        }
        let Some(active) = &self.active else {
            return Vec::new();
        };
        let (thread_id, run_id) = (self.thread_id.clone(), active.run_id.clone());
        let outcome = if waits.iter().any(|wait| wait.kind == WaitKind::Approval) {
            RunOutcome::Interrupt {
                interrupts: waits
                    .iter()
                    .map(|wait| match wait.kind {
                        WaitKind::Approval => Interrupt {
                            id: wait.call_id.clone(),
                            reason: "tool_approval".to_owned(),
                            message: format!("Allow the tool '{}' to run?", wait.name),
                            tool_call_id: wait.call_id.clone(),
                        },
                        WaitKind::ClientTool => Interrupt {
                            id: wait.call_id.clone(),
                            reason: "client_tool".to_owned(),
                            message: format!("Run the client tool '{}' and send its result.", wait.name),
                            tool_call_id: wait.call_id.clone(),
                        },
                    })
                    .collect(),
            }
        } else {
            RunOutcome::Success {
                pending_tool_call_ids: waits.iter().map(|wait| wait.call_id.clone()).collect(),
            }
        };
        let mut out = self.close_all();
        out.push(AgUiEvent::RunFinished {
            thread_id,
            run_id,
            outcome,
        });
        self.finished = true;
        out
    }

    fn unanswered_waits(&self) -> Vec<super::thread::Wait> {
        let Some(active) = &self.active else {
            return Vec::new();
        };
        let answered = match &self.start {
            RunStart::Resume { answered, .. } => Some(answered),
            RunStart::Submissions(_) => None,
        };
        self.thread
            .waits()
            .iter()
            .filter(|wait| wait.turn_id == active.turn_id)
            .filter(|wait| answered.is_none_or(|answered| !answered.contains(&wait.call_id)))
            .cloned()
            .collect()
    }

    /// Before the run's turn starts: finds it.
    fn await_start(&mut self, event: &RecordedEvent) -> Vec<AgUiEvent> {
        let RunStart::Submissions(ours) = &self.start else {
            return Vec::new();
        };
        let ours_now = event.submission_id.as_ref().is_some_and(|id| ours.contains(id));
        match &event.msg {
            EventMsg::TurnStarted(started) => self.candidate = Some(started.turn_id.clone()),
            EventMsg::UserMessage(user) if ours_now && self.candidate.as_deref() == Some(&user.turn_id) => {
                let turn_id = user.turn_id.clone();
                return self.activate(turn_id.clone(), turn_id, None);
            }
            EventMsg::SubmissionRejected(rejected) if ours_now => {
                self.finished = true;
                return vec![AgUiEvent::RunError {
                    message: rejected.reason.clone(),
                    code: "submission_rejected".to_owned(),
                }];
            }
            _ => {}
        }
        Vec::new()
    }

    fn activate(&mut self, turn_id: String, run_id: String, parent: Option<String>) -> Vec<AgUiEvent> {
        self.active = Some(Active {
            turn_id,
            run_id: run_id.clone(),
            step: None,
            text: None,
            reasoning: None,
        });
        vec![AgUiEvent::RunStarted {
            thread_id: self.thread_id.clone(),
            run_id,
            parent_run_id: parent,
        }]
    }

    /// One event of the run's turn.
    fn project(&mut self, event: &RecordedEvent, announced: bool) -> Vec<AgUiEvent> {
        let mut out = Vec::new();
        match &event.msg {
            EventMsg::ModelStepStarted(step) => {
                out.extend(self.close_step());
                let name = format!("step-{}", step.step);
                out.push(AgUiEvent::StepStarted {
                    step_name: name.clone(),
                });
                if let Some(active) = &mut self.active {
                    active.step = Some(name);
                }
            }
            EventMsg::AssistantContentDelta(delta) if !delta.delta.is_empty() => {
                out.extend(self.close_reasoning());
                let id = self.message_id();
                if let Some(active) = &mut self.active
                    && active.text.is_none()
                {
                    active.text = Some(id.clone());
                    out.push(AgUiEvent::TextMessageStart {
                        message_id: id.clone(),
                        role: "assistant",
                    });
                }
                out.push(AgUiEvent::TextMessageContent {
                    message_id: id,
                    delta: delta.delta.clone(),
                });
            }
            EventMsg::ReasoningDelta(delta) if !delta.delta.is_empty() => {
                let id = format!("{}-reasoning", self.message_id());
                if let Some(active) = &mut self.active
                    && active.reasoning.is_none()
                {
                    active.reasoning = Some(id.clone());
                    out.push(AgUiEvent::ReasoningStart { message_id: id.clone() });
                    out.push(AgUiEvent::ReasoningMessageStart {
                        message_id: id.clone(),
                        role: "reasoning",
                    });
                }
                out.push(AgUiEvent::ReasoningMessageContent {
                    message_id: id,
                    delta: delta.delta.clone(),
                });
            }
            EventMsg::AssistantMessage(message) => {
                out.extend(self.close_reasoning());
                let streamed = self.active.as_ref().is_some_and(|active| active.text.is_some());
                if streamed {
                    out.extend(self.close_text());
                } else if !message.text.is_empty() {
                    let id = message.message_id.clone().unwrap_or_else(|| self.message_id());
                    out.push(AgUiEvent::TextMessageStart {
                        message_id: id.clone(),
                        role: "assistant",
                    });
                    out.push(AgUiEvent::TextMessageContent {
                        message_id: id.clone(),
                        delta: message.text.clone(),
                    });
                    out.push(AgUiEvent::TextMessageEnd { message_id: id });
                }
            }
            EventMsg::ApprovalRequested(request) if !announced => {
                out.extend(self.announce(&request.call_id, &request.name, &request.arguments));
            }
            EventMsg::ToolCallStarted(started) if !announced => {
                out.extend(self.announce(&started.call_id, &started.name, &started.arguments));
            }
            EventMsg::ToolCallCompleted(completed) => {
                out.extend(self.close_reasoning());
                out.extend(self.close_text());
                out.push(AgUiEvent::ToolCallResult {
                    message_id: format!("{}-result", completed.call_id),
                    tool_call_id: completed.call_id.clone(),
                    content: completed.output.clone(),
                    role: "tool",
                });
            }
            EventMsg::TurnComplete(_) => {
                out.extend(self.close_all());
                out.push(self.finish(RunOutcome::Success {
                    pending_tool_call_ids: Vec::new(),
                }));
            }
            EventMsg::TurnAborted(aborted) => {
                out.extend(self.close_all());
                if aborted.reason == AbortReason::Interrupted {
                    out.push(self.finish(RunOutcome::Cancelled));
                } else {
                    self.finished = true;
                    out.push(AgUiEvent::RunError {
                        message: aborted.message.clone(),
                        code: abort_code(aborted.reason).to_owned(),
                    });
                }
            }
            _ => {}
        }
        out
    }

    fn finish(&mut self, outcome: RunOutcome) -> AgUiEvent {
        self.finished = true;
        let run_id = self
            .active
            .as_ref()
            .map(|active| active.run_id.clone())
            .unwrap_or_default();
        AgUiEvent::RunFinished {
            thread_id: self.thread_id.clone(),
            run_id,
            outcome,
        }
    }

    /// A tool call's start, arguments and end (its arguments are whole).
    fn announce(&mut self, call_id: &str, name: &str, arguments: &str) -> Vec<AgUiEvent> {
        let mut out = self.close_reasoning();
        out.extend(self.close_text());
        out.push(AgUiEvent::ToolCallStart {
            tool_call_id: call_id.to_owned(),
            tool_call_name: name.to_owned(),
            parent_message_id: Some(self.message_id()),
        });
        if !arguments.is_empty() {
            out.push(AgUiEvent::ToolCallArgs {
                tool_call_id: call_id.to_owned(),
                delta: arguments.to_owned(),
            });
        }
        out.push(AgUiEvent::ToolCallEnd {
            tool_call_id: call_id.to_owned(),
        });
        out
    }

    /// The current step's message id (the thread's, which the log gives).
    fn message_id(&self) -> String {
        match (self.thread.step_message(), &self.active) {
            (Some(id), _) => id.to_owned(),
            (None, Some(active)) => format!("{}-message", active.turn_id),
            (None, None) => String::new(),
        }
    }

    fn close_text(&mut self) -> Vec<AgUiEvent> {
        match self.active.as_mut().and_then(|active| active.text.take()) {
            Some(message_id) => vec![AgUiEvent::TextMessageEnd { message_id }],
            None => Vec::new(),
        }
    }

    fn close_reasoning(&mut self) -> Vec<AgUiEvent> {
        match self.active.as_mut().and_then(|active| active.reasoning.take()) {
            Some(message_id) => vec![
                AgUiEvent::ReasoningMessageEnd {
                    message_id: message_id.clone(),
                },
                AgUiEvent::ReasoningEnd { message_id },
            ],
            None => Vec::new(),
        }
    }

    fn close_step(&mut self) -> Vec<AgUiEvent> {
        let mut out = self.close_reasoning();
        out.extend(self.close_text());
        if let Some(step_name) = self.active.as_mut().and_then(|active| active.step.take()) {
            out.push(AgUiEvent::StepFinished { step_name });
        }
        out
    }

    fn close_all(&mut self) -> Vec<AgUiEvent> {
        self.close_step()
    }
}

/// The `RUN_ERROR` code of a turn that ended early: Keel's reason.
fn abort_code(reason: AbortReason) -> &'static str {
    match reason {
        AbortReason::Interrupted => "interrupted",
        AbortReason::RuntimeStopped => "runtime_stopped",
        AbortReason::ModelFailed => "model_failed",
        AbortReason::RecorderSaturated => "recorder_saturated",
        AbortReason::BudgetExhausted => "budget_exhausted",
    }
}
