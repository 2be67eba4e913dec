//! Crash recovery: what opening a session does with the work a stopped
//! runtime left behind.
//!
//! A turn left in flight is closed (`turn_aborted`, reason
//! `runtime_stopped`), unless it was waiting for the user's approval or
//! for the client's result of a tool call, which goes on waiting. Its tool calls without a result get one, saying whether
//! they may have run; the text its last step streamed joins the history,
//! marked cut; and the messages stored but not taken up are queued again.

use std::collections::HashSet;
use std::ops::ControlFlow;

use super::recorder::EventRecorder;
use super::stream::MAX_STREAMED_TEXT_BYTES;
use super::submission::{Inbox, SubmissionSender, submission_channel};
use keel_model::ToolCall;
use keel_protocol::Result;
use keel_protocol::{AbortReason, Event, EventMsg, Op, ToolCallCompletedEvent, TranscriptItem, TurnAbortedEvent};
use keel_store::{Checkpoint, CheckpointStore, CheckpointWrite, QueuedSubmission, TurnExecution, walk_back};

/// A turn found in flight when the session was opened, sorted by what
/// becomes of it.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    /// Waiting for the user's approval or a client's result: it goes on
    /// waiting.
    pub(super) resume: Option<TurnExecution>,
    /// Stopped with the runtime: it is closed (see [`close_stale_turn`]).
    pub(super) stale: Option<TurnExecution>,
}

impl InFlight {
    /// Sorts the turn `execution` (if any) the store says is in flight.
    pub(super) fn sort(execution: Option<TurnExecution>) -> Self {
        match execution {
            Some(execution) if !execution.awaiting_approval.is_empty() || !execution.awaiting_client.is_empty() => {
                Self {
                    resume: Some(execution),
                    stale: None,
                }
            }
            stale => Self { resume: None, stale },
        }
    }
}

/// What closing a stale turn records: its events and the checkpoint write
/// that closes it, in one append.
pub(super) struct Closing {
    /// The calls' results, then `turn_aborted`.
    pub(super) events: Vec<Event>,
    /// The checkpoint without the turn, with the history it gained.
    pub(super) write: CheckpointWrite,
}

/// Closes `execution`, a turn a stopped runtime left in flight: answers
/// its unanswered calls, rebuilds the text it streamed, and adds both to
/// `transcript`.
pub(super) async fn close_stale_turn(
    store: &dyn CheckpointStore,
    session_id: &str,
    checkpoint: &Checkpoint,
    transcript: &mut Vec<TranscriptItem>,
    execution: TurnExecution,
) -> Result<Closing> {
    tracing::warn!(%session_id, turn_id = %execution.turn_id, "closing a turn left in flight by a stopped runtime");
    let submission_id = execution.submission_ids.first().cloned();
    let (mut events, mut results) = answer_unanswered_calls(transcript, &execution, submission_id.as_deref());
    // Text streamed before the stop was seen by the user: the model
    // sees it too, marked cut, as after an interrupt.
    let cut = streamed_before_stop(store, session_id, &execution.turn_id).await?;
    results.extend(cut.map(|text| TranscriptItem::AssistantMessage {
        text,
        interrupted: true,
    }));
    transcript.extend(results.iter().cloned());
    events.push(Event {
        submission_id,
        msg: EventMsg::TurnAborted(TurnAbortedEvent {
            turn_id: execution.turn_id,
            reason: AbortReason::RuntimeStopped,
            message: "the runtime stopped while this turn was running (process exit or crash); \
                      it was closed when the session was reopened"
                .to_owned(),
        }),
    });
    let write = CheckpointWrite {
        checkpoint: checkpoint.clone(),
        transcript_delta: results,
        execution: None,
        history_cut: None,
    };
    Ok(Closing { events, write })
}

/// The result of a call whose start was committed by a runtime that then
/// stopped: it may have run, so it is never started again.
pub(super) const MAY_HAVE_RUN: &str =
    "interrupted: the runtime stopped during this call; the tool may or may not have completed";

/// A result for every tool call of the stale turn that has none, so the
/// history sent to the provider stays well formed: its event and its
/// history item. A call whose start was committed may have run; one that
/// never started did not, and the model is told which (an older
/// checkpoint does not say: may have).
fn answer_unanswered_calls(
    transcript: &[TranscriptItem],
    execution: &TurnExecution,
    submission_id: Option<&str>,
) -> (Vec<Event>, Vec<TranscriptItem>) {
    let unanswered = unanswered_calls(transcript);
    let mut events = Vec::with_capacity(unanswered.len() + 1);
    let mut results = Vec::with_capacity(unanswered.len());
    for ToolCall { call_id, .. } in unanswered {
        let never_started = execution
            .started_calls
            .as_ref()
            .is_some_and(|started| !started.contains(&call_id));
        let output = if never_started {
            "not run: the runtime stopped before this call started"
        } else {
            MAY_HAVE_RUN
        };
        events.push(Event {
            submission_id: submission_id.map(str::to_owned),
            msg: EventMsg::ToolCallCompleted(ToolCallCompletedEvent {
                turn_id: execution.turn_id.clone(),
                call_id: call_id.clone(),
                output: output.to_owned(),
                is_error: true,
            }),
        });
        results.push(TranscriptItem::ToolResult {
            call_id,
            output: output.to_owned(),
            is_error: true,
        });
    }
    (events, results)
}

/// Opens the submission queue with the messages stored durably but not
/// taken up before the runtime stopped queued again, first, under their
/// ids. They kept their places when accepted, so the queue has room for
/// them (it is made larger if it was made smaller). Each is expected to be
/// settled by `recorder`.
pub(super) fn requeue(
    queued: Vec<QueuedSubmission>,
    capacity: usize,
    recorder: &EventRecorder,
) -> Result<(SubmissionSender, Inbox)> {
    let (sender, inbox) = submission_channel(capacity.max(queued.len()));
    for stored in queued {
        let op = match stored.op {
            Op::Steer { text } => Op::UserInput { text },
            op => op,
        };
        let reservation = sender.reserve(&op)?;
        recorder.expect_settlement(stored.id.clone());
        sender.send_reserved(reservation, stored.id, op, None, stored.traceparent);
    }
    Ok((sender, inbox))
}

/// The tool calls at the end of `transcript` that have no result yet, in
/// order: those of the step a turn was in when it stopped.
pub(super) fn unanswered_calls(transcript: &[TranscriptItem]) -> Vec<ToolCall> {
    let answered = answered_calls(transcript);
    transcript
        .iter()
        .filter_map(|item| match item {
            TranscriptItem::ToolCall {
                call_id,
                name,
                arguments,
            } if !answered.contains(call_id.as_str()) => Some(ToolCall {
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// The ids of the calls in `transcript` that have a result.
pub(super) fn answered_calls(transcript: &[TranscriptItem]) -> HashSet<&str> {
    transcript
        .iter()
        .filter_map(|item| match item {
            TranscriptItem::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect()
}

/// The text the last model step of turn `turn_id` streamed before the
/// runtime stopped, rebuilt from its recorded deltas, so that what the user
/// saw joins the history (marked interrupted) like after an interrupt.
/// `None` when that step completed (its text is in the history already),
/// streamed nothing, or streamed more than a step keeps in memory.
async fn streamed_before_stop(store: &dyn CheckpointStore, session_id: &str, turn_id: &str) -> Result<Option<String>> {
    // Newest first: the deltas after the turn's last `model_step_started`.
    let mut parts: Vec<String> = Vec::new();
    let mut bytes = 0usize;
    let mut text = None;
    walk_back(store, session_id, |event| {
        if event.msg.turn_id() != Some(turn_id) {
            return ControlFlow::Continue(());
        }
        match &event.msg {
            EventMsg::AssistantContentDelta(delta) => {
                bytes = bytes.saturating_add(delta.delta.len());
                if bytes > MAX_STREAMED_TEXT_BYTES {
                    return ControlFlow::Break(());
                }
                parts.push(delta.delta.clone());
                ControlFlow::Continue(())
            }
            EventMsg::ModelStepStarted(_) => {
                parts.reverse();
                let joined = parts.concat();
                text = (!joined.is_empty()).then_some(joined);
                ControlFlow::Break(())
            }
            EventMsg::AssistantMessage(_) | EventMsg::TurnStarted(_) => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        }
    })
    .await?;
    Ok(text)
}
