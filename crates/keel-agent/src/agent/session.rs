//! The session task: takes submissions off the inbox and runs turns.
//!
//! One task per live session. It owns the inbox, the in-memory checkpoint
//! and transcript, and a recorder handle. Everything it decides is recorded
//! through the recorder, in order, together with the checkpoint writes, so
//! the store always holds a consistent prefix of the session's history.

use std::path::PathBuf;
use std::sync::Arc;

use super::compaction::CompactEnd;
use super::recorder::EventRecorder;
use super::status::StatusCell;
use super::stream::StreamingOptions;
use super::submission::Inbox;
use keel_model::{ContextLimits, Model};
use keel_protocol::Result;
use keel_protocol::{
    CompactionReason, Event, EventMsg, Op, ShutdownCompleteEvent, Submission, SubmissionRejectedEvent, TranscriptItem,
};
use keel_store::{Checkpoint, CheckpointWrite, TurnExecution};
use keel_tools::{ApprovalRules, ToolSet};

/// The state a session task owns.
pub(super) struct Session {
    pub(super) session_id: String,
    pub(super) model: Arc<dyn Model>,
    pub(super) recorder: EventRecorder,
    pub(super) inbox: Inbox,
    pub(super) checkpoint: Checkpoint,
    pub(super) transcript: Vec<TranscriptItem>,
    pub(super) streaming: StreamingOptions,
    /// The tools offered to the model.
    pub(super) tools: ToolSet,
    /// Which tool calls run, wait for the user, or are refused.
    pub(super) approvals: ApprovalRules,
    /// A turn found waiting for approvals when the session was opened; it
    /// goes on before anything else.
    pub(super) resume: Option<TurnExecution>,
    /// Standing instructions for the model.
    pub(super) instructions: Option<String>,
    /// The most model calls one turn may make.
    pub(super) max_steps: u32,
    /// The directory tools work in.
    pub(super) workspace: PathBuf,
    /// A submission taken off the queue while gathering a turn's input that
    /// was not input itself; it is handled next.
    pub(super) deferred: Option<Submission>,
    /// Messages steered at the running turn, waiting for its next model
    /// step. Any left when the turn ends start the next turn.
    pub(super) steering: Vec<Submission>,
    /// What the session is doing, for its handles.
    pub(super) status: Arc<StatusCell>,
    /// The model's context window and compaction threshold, if known.
    pub(super) context_limits: Option<ContextLimits>,
    /// Provider-reported prompt tokens over the raw estimate, from the last
    /// request that reported usage (1 until then).
    pub(super) calibration: f64,
    /// With several nodes, this node's lease on the session: no tool call
    /// starts once it may have lapsed.
    pub(super) lease_owner: Option<super::LeaseOwner>,
    /// The store, asked before each tool call whether its file system still
    /// has the room its commits need (see `CheckpointStore::low_on_space`).
    pub(super) store: std::sync::Arc<dyn keel_store::CheckpointStore>,
}

impl Session {
    /// Runs until shutdown, or until every sender is gone. Fails only when the
    /// recorder fails (the store is broken); then nothing more can be recorded.
    pub(super) async fn run(mut self) -> Result<()> {
        if let Some(execution) = self.resume.take() {
            self.status.set_working(true);
            self.resume_turn(execution).await?;
            self.status.end_turn();
        }
        loop {
            let Some(submission) = self.next_submission().await? else {
                return self.stop(None).await;
            };
            self.status.set_working(true);
            if let Some(shutdown) = self.handle(submission).await? {
                return self.stop(Some(shutdown)).await;
            }
        }
    }

    /// The next submission to act on: a deferred one, a steered message the
    /// last turn did not take, or the next from the inbox; `None` once
    /// every sender is gone. Before waiting for one, everything recorded is
    /// made durable and the session shows as idle: a host that sees it idle
    /// finds all it did in the store.
    async fn next_submission(&mut self) -> Result<Option<Submission>> {
        if let Some(submission) = self.deferred.take() {
            return Ok(Some(submission));
        }
        if !self.steering.is_empty() {
            return Ok(Some(self.steering.remove(0)));
        }
        if let Some(submission) = self.inbox.try_recv_any() {
            return Ok(Some(submission));
        }
        self.recorder.flush().await?;
        self.status.set_idle(self.inbox.last_sequence);
        tokio::select! {
            next = self.inbox.recv_any() => Ok(next),
            // A recorder that stopped (the store failed, or the session was
            // taken over) ends the session now, rather than at its next
            // submission.
            () = self.recorder.stopped() => Err(self.recorder.stop_error()),
        }
    }

    /// Acts on one submission; hands a shutdown back, for [`Self::run`]
    /// to stop the session with.
    async fn handle(&mut self, submission: Submission) -> Result<Option<Submission>> {
        match &submission.op {
            Op::UserInput { .. } | Op::Steer { .. } => {
                self.run_turn(submission).await?;
                self.status.end_turn();
            }
            Op::Regenerate => {
                self.regenerate(submission).await?;
                self.status.end_turn();
            }
            Op::Compact => {
                match self
                    .compact(None, Some(submission.id.clone()), CompactionReason::Requested)
                    .await?
                {
                    CompactEnd::Done => {}
                    CompactEnd::NotDone(why) => self.reject(&submission, &why).await?,
                    CompactEnd::Interrupted(_) => self.reject(&submission, "interrupted by the user").await?,
                }
            }
            Op::Interrupt { .. } => self.reject(&submission, "no turn is running").await?,
            Op::Approval { call_id, .. } => {
                let reason = format!("no tool call {call_id} is waiting for approval");
                self.reject(&submission, &reason).await?;
            }
            Op::Shutdown => return Ok(Some(submission)),
        }
        Ok(None)
    }

    /// Records that `submission` will not be acted on.
    pub(super) async fn reject(&self, submission: &Submission, reason: &str) -> Result<()> {
        let event = Event {
            submission_id: Some(submission.id.clone()),
            msg: EventMsg::SubmissionRejected(SubmissionRejectedEvent {
                reason: reason.to_owned(),
            }),
        };
        self.recorder.append(vec![event], None).await
    }

    /// A checkpoint write of the current state plus `transcript_delta`.
    pub(super) fn checkpoint_write(
        &self,
        transcript_delta: Vec<TranscriptItem>,
        execution: Option<&TurnExecution>,
    ) -> CheckpointWrite {
        CheckpointWrite {
            checkpoint: self.checkpoint.clone(),
            transcript_delta,
            execution: execution.cloned(),
            history_cut: None,
        }
    }

    /// Refuses new submissions, records the ones still queued as rejected,
    /// records the final event and waits until everything is durable.
    async fn stop(mut self, shutdown: Option<Submission>) -> Result<()> {
        self.inbox.close();
        while let Some(late) = self.inbox.try_recv() {
            self.reject(&late, "the session is shutting down").await?;
        }
        while let Some(late) = self.inbox.try_recv_control() {
            self.reject(&late, "the session is shutting down").await?;
        }
        for late in std::mem::take(&mut self.steering) {
            self.reject(&late, "the session is shutting down").await?;
        }
        let last = Event {
            submission_id: shutdown.map(|submission| submission.id),
            msg: EventMsg::ShutdownComplete(ShutdownCompleteEvent {}),
        };
        self.recorder.commit(vec![last], None).await?;
        Ok(())
    }
}
