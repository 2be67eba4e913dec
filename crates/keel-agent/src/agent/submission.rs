//! The submission queue: how ops reach a session's runtime.
//!
//! Two lanes share one sequence. User messages and shutdown wait in the
//! bounded *queue* lane, in order; interrupts take the small *control* lane
//! so they reach a running turn at once instead of waiting behind the
//! messages queued for the next turn. A full lane refuses the op with
//! [`Error::Busy`] and hands it back; nothing is buffered without bound.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use keel_protocol::{Actor, Op, Submission, new_id};
use keel_protocol::{Error, Result};

/// Room in the control lane. Interrupts are handled as soon as they arrive,
/// so a few slots are plenty.
pub const CONTROL_CAPACITY: usize = 16;

/// What the caller learns about an accepted submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The submission's id; events it causes carry it.
    pub id: String,
    /// Its sequence among this runtime's submissions.
    pub sequence: u64,
}

/// Shared between every sender and the inbox.
#[derive(Debug, Default)]
struct Sequencing {
    /// The sequence given to the newest accepted submission of either lane.
    last_accepted: u64,
    /// The sequence of the newest submission accepted into the queue lane.
    last_queued: Option<u64>,
}

/// What a lane holds: a submission, boxed. A channel allocates its first
/// block of 32 slots when it is made, so a slot the size of a pointer
/// rather than of a [`Submission`] saves 10 KiB per loaded session.
type Queued = Box<Submission>;

/// Creates a submission queue holding at most `capacity` queued ops (at least one).
pub fn submission_channel(capacity: usize) -> (SubmissionSender, Inbox) {
    let (queue, queue_rx) = mpsc::channel(capacity.max(1));
    let (control, control_rx) = mpsc::channel(CONTROL_CAPACITY);
    let sequencing = Arc::new(Mutex::new(Sequencing::default()));
    let sender = SubmissionSender {
        queue,
        control,
        sequencing: Arc::clone(&sequencing),
    };
    let inbox = Inbox {
        queue: queue_rx,
        control: control_rx,
        sequencing,
        last_sequence: 0,
    };
    (sender, inbox)
}

/// Submits ops to a session. Cloneable; the queue stays open while any
/// (strong) sender lives.
#[derive(Debug, Clone)]
pub struct SubmissionSender {
    queue: mpsc::Sender<Queued>,
    control: mpsc::Sender<Queued>,
    sequencing: Arc<Mutex<Sequencing>>,
}

impl SubmissionSender {
    /// Queues `op` without waiting. Fails with [`Error::InvalidInput`] if the
    /// op breaks the protocol's limits, [`Error::Busy`] if its lane is full,
    /// [`Error::Stopped`] if the runtime is gone.
    pub fn submit(&self, op: Op) -> Result<Submitted> {
        op.validate().map_err(Error::InvalidInput)?;
        let lane = self.lane(&op);
        match lane.try_reserve() {
            Ok(permit) => Ok(self.accept(op, |submission| permit.send(Box::new(submission)))),
            Err(mpsc::error::TrySendError::Full(())) => Err(Error::Busy(Box::new(op))),
            Err(mpsc::error::TrySendError::Closed(())) => Err(Error::stopped("submission queue is closed")),
        }
    }

    /// Queues `op`, waiting for room in its lane.
    pub async fn submit_wait(&self, op: Op) -> Result<Submitted> {
        op.validate().map_err(Error::InvalidInput)?;
        let lane = self.lane(&op);
        let permit = lane
            .reserve()
            .await
            .map_err(|_| Error::stopped("submission queue is closed"))?;
        Ok(self.accept(op, |submission| permit.send(Box::new(submission))))
    }

    /// Takes a place for `op` in its lane without sending it yet, so the
    /// caller can store the submission first. Fails like [`Self::submit`].
    pub(crate) fn reserve(&self, op: &Op) -> Result<Reservation> {
        op.validate().map_err(Error::InvalidInput)?;
        match self.lane(op).clone().try_reserve_owned() {
            Ok(permit) => Ok(Reservation { permit }),
            Err(mpsc::error::TrySendError::Full(_)) => Err(Error::Busy(Box::new(op.clone()))),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Error::stopped("submission queue is closed")),
        }
    }

    /// Sends `op` under the id it was stored with, in the place reserved.
    pub(crate) fn send_reserved(
        &self,
        reservation: Reservation,
        id: String,
        op: Op,
        submitted_by: Option<Actor>,
        traceparent: Option<String>,
    ) -> Submitted {
        self.accept_as(id, op, submitted_by, traceparent, |submission| {
            reservation.permit.send(Box::new(submission));
        })
    }

    /// How many ops wait in the queue lane (reserved places included).
    pub fn queued(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }

    /// The sequence of the newest submission accepted into the queue lane
    /// (0 before the first).
    pub fn last_queued(&self) -> u64 {
        self.sequencing
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .last_queued
            .unwrap_or(0)
    }

    /// A sender that does not keep the queue open.
    pub fn downgrade(&self) -> WeakSubmissionSender {
        WeakSubmissionSender {
            queue: self.queue.downgrade(),
            control: self.control.downgrade(),
            sequencing: Arc::clone(&self.sequencing),
        }
    }

    fn lane(&self, op: &Op) -> &mpsc::Sender<Queued> {
        if op.is_control() { &self.control } else { &self.queue }
    }

    /// Numbers the submission and sends it while holding the sequencing lock,
    /// so sequences reach each lane in increasing order.
    fn accept(&self, op: Op, send: impl FnOnce(Submission)) -> Submitted {
        self.accept_as(new_id(), op, None, None, send)
    }

    fn accept_as(
        &self,
        id: String,
        op: Op,
        submitted_by: Option<Actor>,
        traceparent: Option<String>,
        send: impl FnOnce(Submission),
    ) -> Submitted {
        let control = op.is_control();
        let mut sequencing = self.sequencing.lock().unwrap_or_else(|poison| poison.into_inner());
        let sequence = sequencing.last_accepted + 1;
        send(Submission {
            id: id.clone(),
            sequence,
            op,
            submitted_by,
            traceparent,
        });
        sequencing.last_accepted = sequence;
        if !control {
            sequencing.last_queued = Some(sequence);
        }
        Submitted { id, sequence }
    }
}

/// A place taken in a lane by [`SubmissionSender::reserve`]; dropping it
/// gives the place back.
#[derive(Debug)]
pub(crate) struct Reservation {
    permit: mpsc::OwnedPermit<Queued>,
}

/// A [`SubmissionSender`] that does not keep the queue open.
#[derive(Debug, Clone)]
pub struct WeakSubmissionSender {
    queue: mpsc::WeakSender<Queued>,
    control: mpsc::WeakSender<Queued>,
    sequencing: Arc<Mutex<Sequencing>>,
}

impl WeakSubmissionSender {
    /// The sender again, if some strong sender still keeps the queue open.
    pub fn upgrade(&self) -> Option<SubmissionSender> {
        Some(SubmissionSender {
            queue: self.queue.upgrade()?,
            control: self.control.upgrade()?,
            sequencing: Arc::clone(&self.sequencing),
        })
    }
}

/// The receiving end of a submission queue, owned by the session's runtime.
#[derive(Debug)]
pub struct Inbox {
    queue: mpsc::Receiver<Queued>,
    control: mpsc::Receiver<Queued>,
    sequencing: Arc<Mutex<Sequencing>>,
    /// The sequence of the last submission received from the queue lane.
    pub last_sequence: u64,
}

impl Inbox {
    /// The sequence of the newest submission accepted into the queue lane so
    /// far, or `None` if there has been none. A turn takes what was queued up
    /// to this point and leaves later submissions for the next turn.
    pub fn cutoff(&self) -> Option<u64> {
        self.sequencing
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .last_queued
    }

    /// The next queued submission, or `None` once every sender is gone and
    /// the queue is empty.
    pub async fn recv(&mut self) -> Option<Submission> {
        let submission = *self.queue.recv().await?;
        self.last_sequence = submission.sequence;
        Some(submission)
    }

    /// The next queued submission if one is waiting.
    pub fn try_recv(&mut self) -> Option<Submission> {
        let submission = *self.queue.try_recv().ok()?;
        self.last_sequence = submission.sequence;
        Some(submission)
    }

    /// The next submission from either lane, control first; `None` once the
    /// queue lane is closed and empty.
    pub async fn recv_any(&mut self) -> Option<Submission> {
        enum Got {
            Control(Option<Queued>),
            Queued(Option<Queued>),
        }
        loop {
            let got = tokio::select! {
                biased;
                control = self.control.recv(), if !self.control.is_closed() || !self.control.is_empty() => Got::Control(control),
                queued = self.queue.recv() => Got::Queued(queued),
            };
            match got {
                Got::Control(Some(submission)) => return Some(*submission),
                Got::Control(None) => self.control.close(),
                Got::Queued(queued) => {
                    let submission = *queued?;
                    self.last_sequence = submission.sequence;
                    return Some(submission);
                }
            }
        }
    }

    /// The next submission from either lane if one is waiting, control
    /// first (as [`Self::recv_any`] would take it).
    pub fn try_recv_any(&mut self) -> Option<Submission> {
        self.try_recv_control().or_else(|| self.try_recv())
    }

    /// The next control submission (an interrupt), or `None` once every
    /// sender is gone.
    pub async fn recv_control(&mut self) -> Option<Submission> {
        self.control.recv().await.map(|submission| *submission)
    }

    /// The next control submission if one is waiting.
    pub fn try_recv_control(&mut self) -> Option<Submission> {
        self.control.try_recv().ok().map(|submission| *submission)
    }

    /// Refuses further submissions; those already queued can still be received.
    pub fn close(&mut self) {
        self.queue.close();
        self.control.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(text: &str) -> Op {
        Op::UserInput { text: text.into() }
    }

    #[tokio::test]
    async fn interrupts_bypass_a_full_queue_and_share_the_sequence() {
        let (sender, mut inbox) = submission_channel(1);
        let first = sender.submit(text("first")).expect("queued");
        assert!(matches!(sender.submit(text("second")), Err(Error::Busy(op)) if *op == text("second")));
        let interrupt = sender
            .submit(Op::Interrupt { turn_id: None })
            .expect("control lane has room");
        assert_eq!((first.sequence, interrupt.sequence), (1, 2));
        assert_eq!(
            inbox.cutoff(),
            Some(1),
            "the interrupt is not part of the queue's cutoff"
        );
        assert_eq!(inbox.recv_control().await.map(|s| s.sequence), Some(2));
        assert_eq!(inbox.recv().await.map(|s| s.sequence), Some(1));
    }

    #[tokio::test]
    async fn submit_wait_waits_for_room_instead_of_failing() {
        let (sender, mut inbox) = submission_channel(1);
        sender.submit(text("first")).expect("queued");
        let waiting = tokio::spawn({
            let sender = sender.clone();
            async move { sender.submit_wait(text("second")).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        assert_eq!(inbox.recv().await.map(|s| s.op), Some(text("first")));
        let second = waiting.await.expect("task").expect("queued after room freed");
        assert_eq!(second.sequence, 2);
    }

    #[test]
    fn empty_messages_are_refused_before_queueing() {
        let (sender, _inbox) = submission_channel(1);
        assert!(matches!(sender.submit(text("  \n")), Err(Error::InvalidInput(_))));
        sender.submit(text("still room")).expect("the refused op took no slot");
    }

    #[tokio::test]
    async fn closed_inbox_refuses_new_submissions_but_keeps_queued_ones() {
        let (sender, mut inbox) = submission_channel(2);
        sender.submit(text("kept")).expect("queued");
        inbox.close();
        assert!(matches!(sender.submit(text("late")), Err(Error::Stopped(_))));
        assert_eq!(inbox.recv().await.map(|s| s.op), Some(text("kept")));
        assert!(inbox.recv().await.is_none());
    }
}
