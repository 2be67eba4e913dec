//! The session task's loop: takes submissions off the inbox and runs turns,
//! until shutdown or until every sender is gone.

use super::compaction::CompactEnd;
use super::control::During;
use super::session::Session;
use keel_protocol::Result;
use keel_protocol::{CompactionReason, Event, EventMsg, Op, ShutdownCompleteEvent, Submission};

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
            // Nothing waits for them: the control lane's rule refuses them.
            Op::Interrupt { .. } | Op::Approval { .. } | Op::ClientToolResult { .. } => {
                self.control_lane().settle(submission, During::Idle).await?;
            }
            Op::Shutdown => return Ok(Some(submission)),
        }
        Ok(None)
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
