//! One turn: take the queued input, run a model step, close the turn.
//!
//! A turn always ends with exactly one closing event: `turn_complete`, or
//! `turn_aborted` with a reason. Each step of it is recorded together with
//! the checkpoint write that describes it, so a restart finds either a
//! closed turn or a turn marked in flight, which it then closes itself.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tokio::time::Instant;

use super::session::Session;
use super::stream::{CloseOnDrop, ClosedStream, StepStream};
use crate::Result;
use crate::model::{ModelOutput, ModelRequest};
use crate::protocol::{
    AbortReason, AssistantMessageEvent, ErrorEvent, Event, EventMsg, ModelStepStartedEvent, Op, Submission,
    SubmissionRejectedEvent, TranscriptItem, TurnAbortedEvent, TurnCompleteEvent, TurnStartedEvent, UserMessageEvent,
    new_id, now_ms,
};
use crate::store::TurnExecution;

/// The identity of a running turn.
struct Turn {
    execution: TurnExecution,
    /// The submission that started it; the turn's events carry its id.
    submission_id: String,
}

impl Turn {
    fn id(&self) -> &str {
        &self.execution.turn_id
    }

    fn event(&self, msg: EventMsg) -> Event {
        Event {
            submission_id: Some(self.submission_id.clone()),
            msg,
        }
    }
}

/// How a model step ended.
enum StepEnd {
    Completed(ModelOutput),
    Failed(String),
    Interrupted(Submission),
    Saturated(String),
}

impl Session {
    /// Runs a turn for `first` and every user message queued up to the cutoff.
    pub(super) async fn run_turn(&mut self, first: Submission) -> Result<()> {
        let inputs = self.take_inputs(first).await;
        let turn = Turn {
            submission_id: inputs[0].0.clone(),
            execution: TurnExecution {
                turn_id: new_id(),
                submission_ids: inputs.iter().map(|(id, _)| id.clone()).collect(),
                started_at_ms: now_ms(),
            },
        };
        let mut events = vec![turn.event(EventMsg::TurnStarted(TurnStartedEvent {
            turn_id: turn.id().to_owned(),
        }))];
        let mut history = Vec::with_capacity(inputs.len());
        for (submission_id, text) in inputs {
            events.push(Event {
                submission_id: Some(submission_id),
                msg: EventMsg::UserMessage(UserMessageEvent {
                    turn_id: turn.id().to_owned(),
                    text: text.clone(),
                }),
            });
            history.push(TranscriptItem::UserMessage { text });
        }
        self.transcript.extend(history.iter().cloned());
        let write = self.checkpoint_write(history, Some(&turn.execution));
        self.recorder.append(events, Some(write)).await?;

        let (end, closed) = self.model_step(&turn, 1).await?;
        self.end_turn(&turn, end, closed).await
    }

    /// Takes `first` and the user messages queued after it up to the cutoff,
    /// as `(submission id, text)` pairs. A non-input op stops the gathering
    /// and is handled after the turn.
    async fn take_inputs(&mut self, first: Submission) -> Vec<(String, String)> {
        let cutoff = self.inbox.cutoff().unwrap_or(0);
        let mut inputs = Vec::new();
        let mut next = Some(first);
        while let Some(submission) = next.take() {
            match submission.op {
                Op::UserInput { text } => inputs.push((submission.id, text)),
                _ => {
                    self.deferred = Some(submission);
                    break;
                }
            }
            if self.inbox.last_sequence < cutoff {
                next = self.inbox.recv().await;
            }
        }
        inputs
    }

    /// Calls the model once, streaming into a fresh sink, while watching for
    /// interrupts, flush deadlines and recorder congestion.
    async fn model_step(&mut self, turn: &Turn, step: u32) -> Result<(StepEnd, ClosedStream)> {
        let call_index = self.checkpoint.model_calls;
        self.checkpoint.model_calls += 1;
        let started = turn.event(EventMsg::ModelStepStarted(ModelStepStartedEvent {
            turn_id: turn.id().to_owned(),
            step,
        }));
        let write = self.checkpoint_write(Vec::new(), Some(&turn.execution));
        self.recorder.append(vec![started], Some(write)).await?;

        let stream = StepStream::new(
            self.recorder.clone(),
            turn.id().to_owned(),
            Some(turn.submission_id.clone()),
            self.streaming,
        );
        let _close_on_drop = CloseOnDrop(Arc::clone(&stream));
        let request = ModelRequest {
            session_id: &self.session_id,
            turn_id: turn.id(),
            history: &self.transcript,
            call_index,
        };
        // A model can panic while building its future as well as inside it.
        let mut response =
            match std::panic::catch_unwind(AssertUnwindSafe(|| self.model.respond(request, stream.sink()))) {
                Ok(future) => AssertUnwindSafe(future).catch_unwind().boxed(),
                Err(panic) => futures::future::ready(Err(panic)).boxed(),
            };
        let (inbox, recorder) = (&mut self.inbox, &self.recorder);
        let mut control_open = true;
        let end = loop {
            let congested = recorder.is_congested();
            let deadline = stream.flush_deadline();
            tokio::select! {
                biased;
                control = inbox.recv_control(), if control_open => match control {
                    Some(submission) if interrupts(&submission.op, turn.id()) => break StepEnd::Interrupted(submission),
                    Some(submission) => {
                        let reason = format!("turn {} is not running", interrupt_target(&submission.op));
                        let rejected = Event {
                            submission_id: Some(submission.id),
                            msg: EventMsg::SubmissionRejected(SubmissionRejectedEvent { reason }),
                        };
                        recorder.append(vec![rejected], None).await?;
                    }
                    None => control_open = false,
                },
                () = stream.woken() => {
                    if let Some(reason) = stream.saturation() {
                        break StepEnd::Saturated(reason);
                    }
                }
                () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() && !congested => {
                    if stream.flush().is_err() {
                        break StepEnd::Saturated(stream.saturation().unwrap_or_default());
                    }
                }
                () = recorder.wait_for_room(), if congested => {}
                result = &mut response, if !congested => {
                    break match result {
                        _ if stream.saturation().is_some() => StepEnd::Saturated(stream.saturation().unwrap_or_default()),
                        Ok(Ok(output)) => StepEnd::Completed(output),
                        Ok(Err(error)) => StepEnd::Failed(error.to_string()),
                        Err(panic) => StepEnd::Failed(format!("the model panicked: {}", panic_message(&*panic))),
                    };
                }
            }
        };
        // Cancel the model's work before closing the sink, so nothing it
        // does on the way out is mistaken for part of the turn.
        drop(response);
        Ok((end, stream.close()))
    }

    /// Records how the turn ended, with the checkpoint that closes it.
    async fn end_turn(&mut self, turn: &Turn, end: StepEnd, closed: ClosedStream) -> Result<()> {
        let turn_id = turn.id().to_owned();
        let mut events: Vec<Event> = closed.pending.into_iter().collect();
        let partial = (!closed.streamed.is_empty()).then_some(TranscriptItem::AssistantMessage {
            text: closed.streamed,
            interrupted: true,
        });
        let aborted = |reason, message: String| {
            EventMsg::TurnAborted(TurnAbortedEvent {
                turn_id: turn_id.clone(),
                reason,
                message,
            })
        };
        let history: Vec<TranscriptItem> = match end {
            StepEnd::Completed(output) => {
                events.push(turn.event(EventMsg::AssistantMessage(AssistantMessageEvent {
                    turn_id: turn_id.clone(),
                    text: output.text.clone(),
                })));
                events.push(turn.event(EventMsg::TurnComplete(TurnCompleteEvent {
                    turn_id: turn_id.clone(),
                })));
                self.checkpoint.turns_completed += 1;
                vec![TranscriptItem::AssistantMessage {
                    text: output.text,
                    interrupted: false,
                }]
            }
            StepEnd::Failed(message) => {
                events.push(turn.event(error_msg(&turn_id, &message)));
                events.push(turn.event(aborted(AbortReason::ModelFailed, message)));
                partial.into_iter().collect()
            }
            StepEnd::Saturated(message) => {
                events.push(turn.event(error_msg(&turn_id, &message)));
                events.push(turn.event(aborted(AbortReason::RecorderSaturated, message)));
                partial.into_iter().collect()
            }
            StepEnd::Interrupted(by) => {
                events.push(Event {
                    submission_id: Some(by.id),
                    msg: aborted(AbortReason::Interrupted, "interrupted by the user".to_owned()),
                });
                partial.into_iter().collect()
            }
        };
        self.transcript.extend(history.iter().cloned());
        let write = self.checkpoint_write(history, None);
        self.recorder.append(events, Some(write)).await
    }
}

fn error_msg(turn_id: &str, message: &str) -> EventMsg {
    EventMsg::Error(ErrorEvent {
        turn_id: Some(turn_id.to_owned()),
        message: message.to_owned(),
    })
}

/// Whether an op interrupts the turn `turn_id`.
fn interrupts(op: &Op, turn_id: &str) -> bool {
    matches!(op, Op::Interrupt { turn_id: None }) || matches!(op, Op::Interrupt { turn_id: Some(id) } if id == turn_id)
}

fn interrupt_target(op: &Op) -> &str {
    match op {
        Op::Interrupt { turn_id: Some(id) } => id,
        _ => "(none)",
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("unknown panic")
}
