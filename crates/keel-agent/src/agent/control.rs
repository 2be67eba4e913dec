//! The control lane's rule, written once: what an interrupt, a steered
//! message, an approval or a client tool's result does, depending on what the session is doing
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
use keel_protocol::{ApprovalDecision, Event, EventMsg, Op, Submission, SubmissionRejectedEvent, TranscriptItem};

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
    /// Turn `turn_id` waits for the client's results of `calls`.
    ClientTool {
        /// The waiting turn.
        turn_id: &'a str,
        /// The ids of the calls still unanswered.
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
    /// The client answered one of the calls waiting for it.
    Answered {
        /// The `client_tool_result` op, whose id the result's event carries.
        submission: Submission,
        /// The call answered.
        call_id: String,
        /// What the client's tool returned.
        output: String,
        /// Whether the client's tool failed.
        is_error: bool,
    },
}

/// What the rule makes of one op.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Interrupt,
    Decide,
    Answer,
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
        (During::ClientTool { calls, .. }, Op::ClientToolResult { call_id, .. }) if calls.contains(call_id) => {
            Verdict::Answer
        }
        (During::Compaction, Op::Interrupt { turn_id: None }) => Verdict::Interrupt,
        (During::Turn(turn_id) | During::Approval { turn_id, .. } | During::ClientTool { turn_id, .. }, op)
            if interrupts(op, turn_id) =>
        {
            Verdict::Interrupt
        }
        (During::Turn(_) | During::Approval { .. } | During::ClientTool { .. }, Op::Steer { .. }) => Verdict::Steer,
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
    /// The session's history, to tell a client result for a call answered
    /// already from one for a call that never waited.
    pub(super) transcript: &'a [TranscriptItem],
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
            Verdict::Answer => match submission.op {
                Op::ClientToolResult {
                    ref call_id,
                    ref output,
                    is_error,
                } => Ok(Some(Wake::Answered {
                    call_id: call_id.clone(),
                    output: output.clone(),
                    is_error,
                    submission,
                })),
                _ => Ok(None),
            },
            Verdict::Steer => {
                self.steering.push(submission);
                Ok(None)
            }
            Verdict::Refuse(reason) => {
                let reason = match &submission.op {
                    Op::ClientToolResult { call_id, .. } if answered(self.transcript, call_id) => {
                        format!("client tool call {call_id} was already answered")
                    }
                    _ => reason,
                };
                refuse(self.recorder, &submission, &reason).await.map(|()| None)
            }
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

/// Whether the history holds a result for the call `call_id`.
fn answered(transcript: &[TranscriptItem], call_id: &str) -> bool {
    transcript
        .iter()
        .any(|item| matches!(item, TranscriptItem::ToolResult { call_id: id, .. } if id == call_id))
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

    fn client_result(call_id: &str) -> Op {
        Op::ClientToolResult {
            call_id: call_id.to_owned(),
            output: "done".to_owned(),
            is_error: false,
        }
    }

    #[test]
    fn a_client_result_answers_only_a_call_waiting_for_the_client() {
        let calls = ["c1".to_owned()];
        let waiting = During::ClientTool {
            turn_id: "t1",
            calls: &calls,
        };
        assert_eq!(verdict(&client_result("c1"), waiting), Verdict::Answer);
        let stray = Verdict::Refuse("no client tool call c2 is waiting for a result".to_owned());
        assert_eq!(verdict(&client_result("c2"), waiting), stray);
        let approving = During::Approval {
            turn_id: "t1",
            calls: &calls,
        };
        assert_ne!(verdict(&client_result("c1"), approving), Verdict::Answer);
        assert_ne!(verdict(&approval("c1"), waiting), Verdict::Decide);
        assert_eq!(verdict(&interrupt(Some("t1")), waiting), Verdict::Interrupt);
        assert_eq!(verdict(&steer(), waiting), Verdict::Steer);
    }

    #[test]
    fn a_result_for_a_call_answered_already_is_told_apart() {
        let transcript = [TranscriptItem::ToolResult {
            call_id: "c1".to_owned(),
            output: "done".to_owned(),
            is_error: false,
        }];
        assert!(answered(&transcript, "c1"));
        assert!(!answered(&transcript, "c2"));
    }
}
