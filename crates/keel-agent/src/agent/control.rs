//! The control lane's rule, written once: what an interrupt, a steered
//! message or an approval does, depending on what the session is doing
//! when it arrives.
//!
//! Every place that waits (a model step, a step's tool calls, the wait for
//! approvals, a compaction, the idle session) takes control submissions
//! through [`ControlLane`] and hands each to [`ControlLane::settle`], which
//! keeps steered messages for the turn's next step, refuses the ops nothing
//! waits for, and returns a [`Wake`] when the waiting caller must act.
//! `shutdown` is not a control op: it waits in the queue lane behind the
//! running turn, and the idle session acts on it.

use super::recorder::EventRecorder;
use super::submission::Inbox;
use keel_protocol::Result;
use keel_protocol::{ApprovalDecision, Event, EventMsg, Op, Submission, SubmissionRejectedEvent};

/// What the session is doing while a control submission arrives.
#[derive(Debug, Clone, Copy)]
pub(super) enum During<'a> {
    /// Nothing runs: the session waits for its next submission.
    Idle,
    /// A compaction asked for by the `compact` op, between turns: only an
    /// interrupt aimed at no particular turn stops it.
    Compaction,
    /// Turn `0` runs: a model step, its tool calls, or a compaction before
    /// a step.
    Turn(&'a str),
    /// Turn `turn_id` waits for the user's decision on `calls`.
    Approval {
        /// The waiting turn.
        turn_id: &'a str,
        /// The ids of the calls still undecided.
        calls: &'a [String],
    },
}

/// What the waiting caller must do about a control submission.
#[derive(Debug)]
pub(super) enum Wake {
    /// The submission interrupts what waits: stop it; it closes as
    /// interrupted by this submission.
    Interrupted(Submission),
    /// The user decided on one of the calls waiting for approval.
    Decided {
        /// The `approval` op, whose id the decision's event carries.
        submission: Submission,
        /// The call decided on.
        call_id: String,
        /// What the user decided.
        decision: ApprovalDecision,
    },
}

/// What the rule makes of one op.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Interrupt,
    Decide,
    Steer,
    Refuse(String),
}

/// The rule: what `op` does `during` what the session is doing.
fn verdict(op: &Op, during: During<'_>) -> Verdict {
    match (during, op) {
        (During::Idle, Op::Interrupt { .. }) => Verdict::Refuse("no turn is running".to_owned()),
        // Idle, a steered message is taken up as the next turn's input.
        (During::Idle, Op::Steer { .. }) => Verdict::Steer,
        (During::Approval { calls, .. }, Op::Approval { call_id, .. }) if calls.contains(call_id) => Verdict::Decide,
        (During::Compaction, Op::Interrupt { turn_id: None }) => Verdict::Interrupt,
        (During::Turn(turn_id) | During::Approval { turn_id, .. }, op) if interrupts(op, turn_id) => Verdict::Interrupt,
        (During::Turn(_) | During::Approval { .. }, Op::Steer { .. }) => Verdict::Steer,
        (_, op) => Verdict::Refuse(stray_reason(op)),
    }
}

/// The parts of a session the rule acts on, borrowed apart from the rest so
/// that a wait can hold them while a model call borrows the session.
pub(super) struct ControlLane<'a> {
    /// Where control submissions arrive.
    pub(super) inbox: &'a mut Inbox,
    /// Messages steered at the running turn, for its next step.
    pub(super) steering: &'a mut Vec<Submission>,
    /// Where refusals are recorded.
    pub(super) recorder: &'a EventRecorder,
}

impl ControlLane<'_> {
    /// The next control submission. Once every sender is gone it never
    /// resolves: what waits then ends on its own (the runtime is being
    /// dropped). Cancel safe, for `select!`.
    pub(super) async fn recv(&mut self) -> Submission {
        match self.inbox.recv_control().await {
            Some(submission) => submission,
            None => std::future::pending().await,
        }
    }

    /// Applies the rule to `submission` arriving `during` what the session
    /// does: a steered message is kept, an op nothing waits for is refused
    /// (recorded), and what the caller must act on is returned.
    pub(super) async fn settle(&mut self, submission: Submission, during: During<'_>) -> Result<Option<Wake>> {
        match verdict(&submission.op, during) {
            Verdict::Interrupt => Ok(Some(Wake::Interrupted(submission))),
            Verdict::Decide => match submission.op {
                Op::Approval { ref call_id, decision } => Ok(Some(Wake::Decided {
                    call_id: call_id.clone(),
                    decision,
                    submission,
                })),
                _ => Ok(None),
            },
            Verdict::Steer => {
                self.steering.push(submission);
                Ok(None)
            }
            Verdict::Refuse(reason) => refuse(self.recorder, &submission, &reason).await.map(|()| None),
        }
    }

    /// Waits for the next control submission that wakes the caller,
    /// settling the others on the way (see [`Self::settle`]).
    pub(super) async fn wake(&mut self, during: During<'_>) -> Result<Wake> {
        loop {
            let submission = self.recv().await;
            if let Some(wake) = self.settle(submission, during).await? {
                return Ok(wake);
            }
        }
    }
}

/// Records that `submission` will not be acted on, and why.
pub(super) async fn refuse(recorder: &EventRecorder, submission: &Submission, reason: &str) -> Result<()> {
    let event = Event {
        submission_id: Some(submission.id.clone()),
        msg: EventMsg::SubmissionRejected(SubmissionRejectedEvent {
            reason: reason.to_owned(),
            idempotency_key: None,
        }),
    };
    recorder.append(vec![event], None).await
}

/// Why a control op aimed at something not waiting is refused.
fn stray_reason(op: &Op) -> String {
    match op {
        Op::Approval { call_id, .. } => format!("no tool call {call_id} is waiting for approval"),
        Op::ClientToolResult { call_id, .. } => format!("no client tool call {call_id} is waiting for a result"),
        Op::Interrupt { turn_id: Some(id) } => format!("turn {id} is not running"),
        _ => "turn (none) is not running".to_owned(),
    }
}

/// Whether an op interrupts the turn `turn_id`.
fn interrupts(op: &Op, turn_id: &str) -> bool {
    matches!(op, Op::Interrupt { turn_id: None }) || matches!(op, Op::Interrupt { turn_id: Some(id) } if id == turn_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interrupt(turn_id: Option<&str>) -> Op {
        Op::Interrupt {
            turn_id: turn_id.map(str::to_owned),
        }
    }

    fn approval(call_id: &str) -> Op {
        Op::Approval {
            call_id: call_id.to_owned(),
            decision: ApprovalDecision::Approve,
        }
    }

    fn steer() -> Op {
        Op::Steer {
            text: "more".to_owned(),
        }
    }

    #[test]
    fn an_interrupt_stops_its_turn_or_any_turn() {
        for during in [
            During::Turn("t1"),
            During::Approval {
                turn_id: "t1",
                calls: &[],
            },
        ] {
            assert_eq!(verdict(&interrupt(None), during), Verdict::Interrupt);
            assert_eq!(verdict(&interrupt(Some("t1")), during), Verdict::Interrupt);
            assert_eq!(
                verdict(&interrupt(Some("t2")), during),
                Verdict::Refuse("turn t2 is not running".to_owned())
            );
        }
    }

    #[test]
    fn a_compaction_between_turns_stops_only_for_an_untargeted_interrupt() {
        assert_eq!(verdict(&interrupt(None), During::Compaction), Verdict::Interrupt);
        assert_eq!(
            verdict(&interrupt(Some("t1")), During::Compaction),
            Verdict::Refuse("turn t1 is not running".to_owned())
        );
        assert_eq!(
            verdict(&steer(), During::Compaction),
            Verdict::Refuse("turn (none) is not running".to_owned())
        );
    }

    #[test]
    fn idle_an_interrupt_or_an_approval_is_refused() {
        assert_eq!(
            verdict(&interrupt(Some("t1")), During::Idle),
            Verdict::Refuse("no turn is running".to_owned())
        );
        assert_eq!(
            verdict(&approval("c1"), During::Idle),
            Verdict::Refuse("no tool call c1 is waiting for approval".to_owned())
        );
    }

    #[test]
    fn an_approval_decides_only_a_waiting_call() {
        let calls = ["c1".to_owned()];
        let waiting = During::Approval {
            turn_id: "t1",
            calls: &calls,
        };
        assert_eq!(verdict(&approval("c1"), waiting), Verdict::Decide);
        assert_eq!(
            verdict(&approval("c2"), waiting),
            Verdict::Refuse("no tool call c2 is waiting for approval".to_owned())
        );
        assert_eq!(
            verdict(&approval("c1"), During::Turn("t1")),
            Verdict::Refuse("no tool call c1 is waiting for approval".to_owned())
        );
        assert_eq!(verdict(&steer(), waiting), Verdict::Steer);
    }
}
