//! One turn: take the queued input, run model steps (and the tool calls they
//! ask for) until the model answers, close the turn.
//!
//! A turn always ends with exactly one closing event: `turn_complete`, or
//! `turn_aborted` with a reason. Each step of it is recorded together with
//! the checkpoint write that describes it, so a restart finds either a
//! closed turn or a turn marked in flight, which it then closes itself.
//! Every tool call the history holds gets a result, even when the turn is
//! interrupted in the middle of the calls.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::compaction::CompactEnd;
use super::control::{ControlLane, During, Wake};
use super::recovery::unanswered_calls;
use super::session::step_message_id;
use super::session::{Session, Turn};
use super::step_gate::StepVerdict;
use super::stream::{CloseOnDrop, ClosedStream, MAX_STEP_OUTPUT_BYTES, StepStream, output_bytes, step_too_large};
use super::tool_phase::ToolsEnd;
use keel_model::{ModelOutput, ModelRequest};
use keel_protocol::Result;
use keel_protocol::{
    AbortReason, AssistantMessageEvent, CompactionReason, ErrorEvent, Event, EventMsg, ModelStepStartedEvent, Op,
    QueueMode, Submission, TokenUsageEvent, TranscriptItem, TurnAbortedEvent, TurnCompleteEvent, TurnRolledBackEvent,
    TurnStartedEvent, UserMessageEvent, WarningEvent, new_id, now_ms,
};
use keel_secrets::{redact, redact_owned};
use keel_store::{LastTurn, TurnExecution};

/// How a model step ended.
enum StepEnd {
    Completed(ModelOutput),
    Failed(String),
    Interrupted(Submission),
    Saturated(String),
    /// Completed with more output than a step may hold.
    TooLarge(String),
    /// The provider refused the request as too long for the model's context.
    ContextExceeded(String),
}

/// Why a turn ends early.
enum Abort {
    Failed(String),
    /// The step's output was too large to record: a model failure whose
    /// streamed text stays out of the history.
    TooLarge(String),
    Interrupted(Submission),
    Saturated(String),
    /// The host's [`StepGate`](super::StepGate) stopped it before a step.
    Budget(String),
}

impl Session {
    /// Runs a turn for `first` and, in [`QueueMode::Merge`], every user
    /// message queued up to the cutoff.
    pub(super) async fn run_turn(&mut self, first: Submission) -> Result<()> {
        let traceparent = first.traceparent.clone();
        let inputs = self.take_inputs(first).await;
        self.start_turn(inputs, Vec::new(), None, traceparent.as_deref()).await
    }

    /// Rolls the last turn back and runs its user messages again, for a
    /// `regenerate` op. The rollback and the new turn's start commit
    /// together, so a crash cannot leave the messages rolled back and not
    /// re-run.
    pub(super) async fn regenerate(&mut self, submission: Submission) -> Result<()> {
        let Some(last) = self.checkpoint.last_turn.clone() else {
            return self.reject(&submission, "there is no turn to regenerate").await;
        };
        let from = usize::try_from(last.history_from).unwrap_or(usize::MAX);
        let Some(rolled_back) = self.transcript.get(from..) else {
            let reason = format!(
                "turn '{}' started at history item {from}, past the history's {} items",
                last.turn_id,
                self.transcript.len()
            );
            return self.reject(&submission, &reason).await;
        };
        let messages: Vec<String> = rolled_back
            .iter()
            .filter_map(|item| match item {
                TranscriptItem::UserMessage { text } => Some(text.clone()),
                _ => None,
            })
            .collect();
        if messages.is_empty() {
            return self
                .reject(&submission, "the last turn has no user message to answer again")
                .await;
        }
        let items_removed = rolled_back.len() as u64;
        self.transcript.truncate(from);
        // A summary that covers part of the undone turn goes with it.
        let compaction_undone = self
            .checkpoint
            .compaction
            .as_ref()
            .is_some_and(|compaction| compaction.replaced_to > last.history_from);
        if compaction_undone {
            self.checkpoint.compaction = None;
        }
        self.checkpoint.last_turn = None;
        tracing::info!(session_id = %self.session_id, turn_id = %last.turn_id, items_removed, "rolled back the last turn");
        let rollback = Event {
            submission_id: Some(submission.id.clone()),
            msg: EventMsg::TurnRolledBack(TurnRolledBackEvent {
                rolled_back_turn_id: last.turn_id,
                history_from: last.history_from,
                items_removed,
                compaction_undone,
            }),
        };
        let inputs = messages.into_iter().map(|text| (submission.id.clone(), text)).collect();
        self.start_turn(
            inputs,
            vec![rollback],
            Some(last.history_from),
            submission.traceparent.as_deref(),
        )
        .await
    }

    /// Starts a turn for `inputs` (`(submission id, text)` pairs), recording
    /// `prelude` and cutting the history to `history_cut` items in the same
    /// commit, and drives it to its end.
    async fn start_turn(
        &mut self,
        inputs: Vec<(String, String)>,
        prelude: Vec<Event>,
        history_cut: Option<u64>,
        traceparent: Option<&str>,
    ) -> Result<()> {
        let turn = Turn {
            submission_id: inputs[0].0.clone(),
            execution: TurnExecution {
                turn_id: new_id(),
                submission_ids: inputs.iter().map(|(id, _)| id.clone()).collect(),
                started_at_ms: now_ms(),
                step: 1,
                awaiting_approval: Vec::new(),
                decisions: BTreeMap::new(),
                started_calls: Some(Vec::new()),
                awaiting_client: Vec::new(),
                client_deadlines: BTreeMap::new(),
                trace: Some(crate::telemetry::turn_trace(traceparent)),
            },
        };
        let span = turn_log_span(&self.session_id, &turn);
        self.begin_turn(turn, inputs, prelude, history_cut)
            .instrument(span)
            .await
    }

    /// Records a new turn's start, with `prelude`, its inputs and the
    /// history cut, and drives it to its end.
    async fn begin_turn(
        &mut self,
        turn: Turn,
        inputs: Vec<(String, String)>,
        prelude: Vec<Event>,
        history_cut: Option<u64>,
    ) -> Result<()> {
        self.status.begin_turn(turn.id());
        let mut events = prelude;
        events.extend(self.read_project_instructions().await);
        self.checkpoint.last_turn = Some(LastTurn {
            turn_id: turn.id().to_owned(),
            history_from: self.transcript.len() as u64,
        });
        events.push(turn.event(EventMsg::TurnStarted(TurnStartedEvent {
            turn_id: turn.id().to_owned(),
            trace_id: turn.execution.trace.as_ref().map(|trace| trace.trace_id.clone()),
        })));
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
        let mut write = self.checkpoint_write(history, Some(&turn.execution));
        write.history_cut = history_cut;
        self.recorder.append(events, Some(write)).await?;

        self.drive_turn(turn).await
    }

    /// Goes on with a turn that was waiting for approvals (or for a client's
    /// results) when the session
    /// was last closed: the calls of its step that have no result yet are
    /// decided (the pending ones by the user) and run, then the turn goes on.
    pub(super) async fn resume_turn(&mut self, execution: TurnExecution) -> Result<()> {
        let submission_id = execution.submission_ids.first().cloned().unwrap_or_default();
        self.status.begin_turn(&execution.turn_id);
        let mut turn = Turn {
            execution,
            submission_id,
        };
        let calls = unanswered_calls(&self.transcript);
        if let ToolsEnd::Interrupted(interrupt) = self.tool_phase(&mut turn, &calls).await? {
            return self
                .abort_turn(&turn, Abort::Interrupted(interrupt), ClosedStream::empty())
                .await;
        }
        if turn.execution.step >= self.max_steps {
            return self.end_at_step_limit(&turn).await;
        }
        turn.execution.step += 1;
        let span = turn_log_span(&self.session_id, &turn);
        self.drive_turn(turn).instrument(span).await
    }

    /// Runs model steps, and the tool calls they ask for, from the turn's
    /// current step until the turn ends.
    async fn drive_turn(&mut self, mut turn: Turn) -> Result<()> {
        // A step the provider refused as too long is compacted and tried
        // again once; a second refusal ends the turn.
        let mut retried_step = None;
        loop {
            self.take_steering(&mut turn).await?;
            if let StepVerdict::BudgetExhausted(message) = self.step_verdict().await? {
                return self
                    .abort_turn(&turn, Abort::Budget(message), ClosedStream::empty())
                    .await;
            }
            let step = turn.execution.step;
            if self.over_threshold() {
                match self.compact(Some(&turn), None, CompactionReason::Threshold).await? {
                    CompactEnd::Done => {}
                    CompactEnd::NotDone(why) => {
                        tracing::warn!(session_id = %self.session_id, %why, "the history passed the context threshold but was not compacted");
                    }
                    CompactEnd::Interrupted(by) => {
                        return self
                            .abort_turn(&turn, Abort::Interrupted(by), ClosedStream::empty())
                            .await;
                    }
                }
            }
            let (end, closed) = self.model_step(&turn, step).await?;
            if let (StepEnd::Completed(output), Some(trace)) = (&end, turn.execution.trace.as_mut()) {
                if let Some(usage) = &output.usage {
                    trace.usage.add(usage);
                }
                trace.finish_reason = Some(super::spans::finish_reason(output).to_owned());
            }
            let output = match end {
                StepEnd::Completed(output) => output,
                StepEnd::ContextExceeded(message) if retried_step != Some(step) => {
                    retried_step = Some(step);
                    match self
                        .compact(Some(&turn), None, CompactionReason::ContextLengthExceeded)
                        .await?
                    {
                        CompactEnd::Done => continue,
                        CompactEnd::NotDone(why) => {
                            let message = format!("{message} (and the history could not be compacted: {why})");
                            return self.abort_turn(&turn, Abort::Failed(message), closed).await;
                        }
                        CompactEnd::Interrupted(by) => {
                            return self.abort_turn(&turn, Abort::Interrupted(by), closed).await;
                        }
                    }
                }
                StepEnd::ContextExceeded(message) => {
                    return self.abort_turn(&turn, Abort::Failed(message), closed).await;
                }
                StepEnd::Failed(message) => return self.abort_turn(&turn, Abort::Failed(message), closed).await,
                StepEnd::Interrupted(by) => return self.abort_turn(&turn, Abort::Interrupted(by), closed).await,
                StepEnd::Saturated(message) => return self.abort_turn(&turn, Abort::Saturated(message), closed).await,
                StepEnd::TooLarge(message) => return self.abort_turn(&turn, Abort::TooLarge(message), closed).await,
            };
            let calls = output.tool_calls.clone();
            // A message steered in during the step keeps the turn going for
            // one more step, so the model sees it.
            let last_step = calls.is_empty() && (self.steering.is_empty() || step >= self.max_steps);
            self.record_step(&turn, step, output, closed, last_step).await?;
            if last_step {
                return Ok(());
            }
            if !calls.is_empty()
                && let ToolsEnd::Interrupted(interrupt) = self.tool_phase(&mut turn, &calls).await?
            {
                return self
                    .abort_turn(&turn, Abort::Interrupted(interrupt), ClosedStream::empty())
                    .await;
            }
            if step >= self.max_steps {
                return self.end_at_step_limit(&turn).await;
            }
            turn.execution.step += 1;
            turn.execution.decisions.clear();
            turn.execution.started_calls = Some(Vec::new());
            turn.execution.client_deadlines.clear();
        }
    }

    /// Records the messages steered at the turn since its last step as user
    /// messages of the turn, joining the history before the next step.
    async fn take_steering(&mut self, turn: &mut Turn) -> Result<()> {
        if self.steering.is_empty() {
            return Ok(());
        }
        let mut events = Vec::new();
        let mut history = Vec::new();
        for submission in std::mem::take(&mut self.steering) {
            let Some(text) = submission.op.message_text().map(str::to_owned) else {
                continue;
            };
            turn.execution.submission_ids.push(submission.id.clone());
            events.push(Event {
                submission_id: Some(submission.id),
                msg: EventMsg::UserMessage(UserMessageEvent {
                    turn_id: turn.id().to_owned(),
                    text: text.clone(),
                }),
            });
            history.push(TranscriptItem::UserMessage { text });
        }
        self.transcript.extend(history.iter().cloned());
        let write = self.checkpoint_write(history, Some(&turn.execution));
        self.recorder.append(events, Some(write)).await
    }

    /// Takes `first` and (in [`QueueMode::Merge`]) the user messages queued
    /// after it up to the cutoff, as `(submission id, text)` pairs. A
    /// non-input op stops the gathering and is handled after the turn.
    async fn take_inputs(&mut self, first: Submission) -> Vec<(String, String)> {
        let cutoff = self.inbox.cutoff().unwrap_or(0);
        let mut inputs = Vec::new();
        // Messages steered at a turn that ended without them come first.
        let mut steered = std::mem::take(&mut self.steering).into_iter();
        let mut next = Some(first);
        // One message per turn: the rest wait for turns of their own.
        let each = self.queue_mode == QueueMode::Each;
        while let Some(submission) = next.take() {
            match submission.op {
                Op::UserInput { text } | Op::Steer { text } => inputs.push((submission.id, text)),
                _ => {
                    self.deferred = Some(submission);
                    break;
                }
            }
            if each {
                break;
            }
            next = steered.next();
            if next.is_none() && self.inbox.last_sequence < cutoff {
                next = self.inbox.recv().await;
            }
        }
        self.steering.extend(steered);
        inputs
    }

    /// Calls the model once, streaming into a fresh sink, while watching for
    /// interrupts, flush deadlines and recorder congestion.
    async fn model_step(&mut self, turn: &Turn, step: u32) -> Result<(StepEnd, ClosedStream)> {
        let started_ms = now_ms();
        let call_index = self.begin_step(turn, step).await?;
        let stream = StepStream::new(
            self.recorder.clone(),
            turn.id().to_owned(),
            Some(turn.submission_id.clone()),
            self.streaming,
        );
        let _close_on_drop = CloseOnDrop(Arc::clone(&stream));
        let tools = self.offered_tools();
        let history = super::compaction::model_history(self.checkpoint.compaction.as_ref(), &self.transcript);
        // The estimate reads the whole history: only worth it where
        // compaction will use what the provider reports.
        let raw_estimate = self.context_limits.map(|_| self.raw_estimate(&history, &tools));
        let mut request = ModelRequest::new(&self.session_id, turn.id(), &history, call_index);
        request.instructions = self.instructions.as_deref();
        request.tools = &tools;
        // A model can panic while building its future as well as inside it.
        let mut response =
            match std::panic::catch_unwind(AssertUnwindSafe(|| self.model.respond(request, stream.sink()))) {
                Ok(future) => AssertUnwindSafe(future).catch_unwind().boxed(),
                Err(panic) => futures::future::ready(Err(panic)).boxed(),
            };
        let recorder = &self.recorder;
        let mut lane = ControlLane {
            inbox: &mut self.inbox,
            steering: &mut self.steering,
            recorder,
            transcript: &self.transcript,
        };
        let end = loop {
            let congested = recorder.is_congested();
            let deadline = stream.flush_deadline();
            tokio::select! {
                biased;
                submission = lane.recv() => {
                    if let Some(Wake::Interrupted(by)) = lane.settle(submission, During::Turn(turn.id())).await? {
                        break StepEnd::Interrupted(by);
                    }
                }
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
                        Ok(Err(error)) if error.is_context_length_exceeded() => StepEnd::ContextExceeded(error.to_string()),
                        Ok(Err(error)) => StepEnd::Failed(error.to_string()),
                        Err(panic) => StepEnd::Failed(format!("the model panicked: {}", panic_message(&*panic))),
                    };
                }
            }
        };
        // Cancel the model's work before closing the sink, so nothing it
        // does on the way out is mistaken for part of the turn.
        drop(response);
        let closed = stream.close();
        // Only now is the size of the whole output known (a call's arguments
        // are not streamed): one too large to record fails the step.
        if let (StepEnd::Completed(ModelOutput { usage: Some(usage), .. }), Some(raw_estimate)) = (&end, raw_estimate) {
            self.calibrate(raw_estimate, usage.input_tokens);
        }
        let end = match end {
            StepEnd::Completed(output) => match output_bytes(&output).saturating_add(closed.pending_bytes) {
                bytes if bytes > MAX_STEP_OUTPUT_BYTES => StepEnd::TooLarge(step_too_large(bytes)),
                _ => StepEnd::Completed(output),
            },
            other => other,
        };
        match &end {
            StepEnd::Completed(output) => self.report_step(turn, step, started_ms, Some(output), None),
            StepEnd::Interrupted(_) => self.report_step(turn, step, started_ms, None, Some("interrupted")),
            StepEnd::ContextExceeded(_) => {
                self.report_step(turn, step, started_ms, None, Some("context_length_exceeded"))
            }
            StepEnd::Saturated(_) => self.report_step(turn, step, started_ms, None, Some("recorder_saturated")),
            StepEnd::TooLarge(_) => self.report_step(turn, step, started_ms, None, Some("output_too_large")),
            StepEnd::Failed(_) => self.report_step(turn, step, started_ms, None, Some("model_failed")),
        }
        Ok((end, closed))
    }

    /// Takes in the tools' changes and records that model step `step`
    /// starts; returns the index of its model call.
    async fn begin_step(&mut self, turn: &Turn, step: u32) -> Result<u64> {
        self.refresh_tools(turn).await?;
        let call_index = self.checkpoint.model_calls;
        self.checkpoint.model_calls += 1;
        let started = turn.event(EventMsg::ModelStepStarted(ModelStepStartedEvent {
            turn_id: turn.id().to_owned(),
            step,
            message_id: Some(step_message_id(turn.id(), step)),
        }));
        let write = self.checkpoint_write(Vec::new(), Some(&turn.execution));
        self.recorder.append(vec![started], Some(write)).await?;
        Ok(call_index)
    }

    /// Records what a completed model step produced. The last step (no tool
    /// calls) also closes the turn.
    async fn record_step(
        &mut self,
        turn: &Turn,
        step: u32,
        output: ModelOutput,
        closed: ClosedStream,
        last_step: bool,
    ) -> Result<()> {
        let turn_id = turn.id().to_owned();
        let mut events: Vec<Event> = closed.pending.into_iter().collect();
        let mut history = output.reasoning;
        if last_step || !output.text.is_empty() {
            events.push(turn.event(EventMsg::AssistantMessage(AssistantMessageEvent {
                turn_id: turn_id.clone(),
                text: output.text.clone(),
                message_id: Some(step_message_id(&turn_id, step)),
            })));
            history.push(TranscriptItem::AssistantMessage {
                text: output.text,
                interrupted: false,
            });
        }
        if output.length_limited {
            // Recorded in the turn, so that a cut answer or a cut call is
            // not mistaken for a finished one.
            events.push(turn.event(EventMsg::Warning(WarningEvent {
                message: format!(
                    "model step {step} was cut off at the output length limit; its text may be incomplete \
                     and a call cut mid-arguments was not run (raise max_output_tokens)"
                ),
            })));
        }
        if let Some(usage) = output.usage {
            self.checkpoint.usage.add(&usage);
            events.push(turn.event(EventMsg::TokenUsage(TokenUsageEvent {
                turn_id: turn_id.clone(),
                step,
                usage,
                session_total: self.checkpoint.usage,
            })));
        }
        history.extend(output.tool_calls.into_iter().map(|call| TranscriptItem::ToolCall {
            call_id: call.call_id,
            name: call.name,
            arguments: call.arguments,
        }));
        let execution = if last_step {
            events.push(turn.event(EventMsg::TurnComplete(TurnCompleteEvent {
                turn_id,
                length_limited: output.length_limited,
            })));
            self.checkpoint.turns_completed += 1;
            None
        } else {
            Some(&turn.execution)
        };
        self.transcript.extend(history.iter().cloned());
        let write = self.checkpoint_write(history, execution);
        self.recorder.append(events, Some(write)).await?;
        if last_step {
            self.report_turn(turn, None);
        }
        Ok(())
    }

    /// Ends a turn whose model kept calling tools until the step limit.
    async fn end_at_step_limit(&mut self, turn: &Turn) -> Result<()> {
        let turn_id = turn.id().to_owned();
        let message = format!(
            "the turn reached its limit of {} model steps and ends without a final answer",
            self.max_steps
        );
        let events = vec![
            turn.event(error_msg(&turn_id, &message)),
            turn.event(EventMsg::TurnComplete(TurnCompleteEvent {
                turn_id,
                length_limited: false,
            })),
        ];
        self.checkpoint.turns_completed += 1;
        let write = self.checkpoint_write(Vec::new(), None);
        self.recorder.append(events, Some(write)).await?;
        self.report_turn(turn, None);
        Ok(())
    }

    /// Records why the turn ended early, with the checkpoint that closes it.
    /// Text already streamed stays in the log and joins the history, marked
    /// interrupted, unless it was too long to keep (see `MAX_STEP_OUTPUT_BYTES`).
    async fn abort_turn(&mut self, turn: &Turn, abort: Abort, closed: ClosedStream) -> Result<()> {
        let turn_id = turn.id().to_owned();
        let mut events: Vec<Event> = closed.pending.into_iter().collect();
        // Text of a step too large to record would make every later request
        // as large: it stays in the log (as deltas) but not in the history.
        let keep_text = !closed.streamed.is_empty() && !matches!(abort, Abort::TooLarge(_));
        let history: Vec<TranscriptItem> = keep_text
            .then_some(TranscriptItem::AssistantMessage {
                text: closed.streamed,
                interrupted: true,
            })
            .into_iter()
            .collect();
        let aborted = |reason, message: String| {
            EventMsg::TurnAborted(TurnAbortedEvent {
                turn_id: turn_id.clone(),
                reason,
                message,
            })
        };
        let error_type = match &abort {
            Abort::Failed(_) => "model_failed",
            Abort::TooLarge(_) => "output_too_large",
            Abort::Saturated(_) => "recorder_saturated",
            Abort::Budget(_) => "budget_exhausted",
            Abort::Interrupted(_) => "interrupted",
        };
        match abort {
            Abort::Failed(message) | Abort::TooLarge(message) => {
                // A provider's or tool's failure may echo a key.
                let message = redact_owned(message);
                events.push(turn.event(error_msg(&turn_id, &message)));
                events.push(turn.event(aborted(AbortReason::ModelFailed, message)));
            }
            Abort::Saturated(message) => {
                events.push(turn.event(error_msg(&turn_id, &message)));
                events.push(turn.event(aborted(AbortReason::RecorderSaturated, message)));
            }
            Abort::Budget(message) => events.push(turn.event(aborted(AbortReason::BudgetExhausted, message))),
            Abort::Interrupted(by) => events.push(Event {
                submission_id: Some(by.id),
                msg: aborted(AbortReason::Interrupted, "interrupted by the user".to_owned()),
            }),
        }
        self.transcript.extend(history.iter().cloned());
        let write = self.checkpoint_write(history, None);
        self.recorder.append(events, Some(write)).await?;
        self.report_turn(turn, Some(error_type));
        Ok(())
    }
}

/// The span the turn's log lines are written in: they carry its session,
/// turn and trace ids, to be found beside its trace.
fn turn_log_span(session_id: &str, turn: &Turn) -> tracing::Span {
    let trace_id = turn
        .execution
        .trace
        .as_ref()
        .map_or("", |trace| trace.trace_id.as_str());
    tracing::info_span!("turn", %session_id, turn_id = %turn.id(), %trace_id)
}

/// An `error` event; its text is redacted (see [`keel_secrets`]).
fn error_msg(turn_id: &str, message: &str) -> EventMsg {
    EventMsg::Error(ErrorEvent {
        turn_id: Some(turn_id.to_owned()),
        message: redact(message).into_owned(),
    })
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("unknown panic")
}
