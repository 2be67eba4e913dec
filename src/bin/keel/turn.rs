//! Following a turn through the session's events, for `keel run` and `keel
//! chat`: which turn is ours, which one runs, whether what we wait for has
//! ended and how. Pure: it is fed events and says what they mean; the
//! commands do the printing, asking and sending.

use keel::protocol::{AbortReason, ApprovalRequestedEvent, Event, EventMsg};

/// What to follow the session's events until.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Until {
    /// The end of the turn that takes up this submission.
    TurnOf(String),
    /// The end of this turn.
    Turn(String),
    /// No turn running and nothing queued.
    Idle,
    /// The compaction this `compact` submission asked for (recorded, or
    /// refused).
    Compaction(String),
    /// The turn this `regenerate` submission runs (or its refusal).
    Regeneration(String),
}

impl Until {
    /// The submission whose turn is ours, if the turn is told by one.
    fn turn_submission(&self) -> Option<&str> {
        match self {
            Until::TurnOf(submission) | Until::Regeneration(submission) => Some(submission),
            _ => None,
        }
    }

    /// The submission whose refusal ends the wait, if any.
    fn submission(&self) -> Option<&str> {
        match self {
            Until::TurnOf(submission) | Until::Compaction(submission) | Until::Regeneration(submission) => {
                Some(submission)
            }
            Until::Turn(_) | Until::Idle => None,
        }
    }
}

/// How following a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The turn completed (or, following until idle, the session is idle).
    Completed,
    /// The turn was interrupted.
    Interrupted,
    /// The turn failed, or the submission was refused.
    Failed,
    /// A second Ctrl-C: leave at once.
    Leave,
}

/// What one event means for the wait.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step<'e> {
    /// Nothing to act on.
    Nothing,
    /// Our turn became known: this one (an interrupt asked for while the
    /// submission waited in the queue is meant for it).
    Claimed(String),
    /// A tool call waits for a decision.
    Approval(&'e ApprovalRequestedEvent),
    /// Our submission was refused, for this reason.
    Rejected(&'e str),
    /// What we follow ended, this way.
    Ended(Outcome),
    /// A turn not ours ended (following until idle: time to see whether the
    /// session is).
    OtherTurnEnded,
}

/// The state of a wait for [`Until`], fed the session's events in order.
#[derive(Debug)]
pub(crate) struct TurnTracker {
    until: Until,
    /// Our turn, once known.
    ours: Option<String>,
    /// The turn running, as far as the events tell.
    running: Option<String>,
}

impl TurnTracker {
    /// A wait for `until`.
    pub(crate) fn new(until: Until) -> Self {
        let ours = match &until {
            Until::Turn(turn_id) => Some(turn_id.clone()),
            _ => None,
        };
        Self {
            running: ours.clone(),
            ours,
            until,
        }
    }

    /// What is waited for.
    pub(crate) fn until(&self) -> &Until {
        &self.until
    }

    /// Our turn, once known.
    pub(crate) fn ours(&self) -> Option<&str> {
        self.ours.as_deref()
    }

    /// The turn an interrupt is meant for: ours, else the one running.
    pub(crate) fn interrupt_target(&self) -> Option<String> {
        self.ours.clone().or_else(|| self.running.clone())
    }

    /// Whether no turn runs, as far as the events tell.
    pub(crate) fn none_running(&self) -> bool {
        self.running.is_none()
    }

    /// Takes in the next event; says what it means for the wait.
    pub(crate) fn observe<'e>(&mut self, event: &'e Event) -> Step<'e> {
        let for_us = |submission: Option<&str>| submission.is_some() && event.submission_id.as_deref() == submission;
        match &event.msg {
            EventMsg::TurnStarted(started) => {
                self.running = Some(started.turn_id.clone());
                self.claim(&started.turn_id, for_us(self.until.turn_submission()))
            }
            EventMsg::UserMessage(message) => self.claim(&message.turn_id, for_us(self.until.turn_submission())),
            EventMsg::ApprovalRequested(request) => Step::Approval(request),
            EventMsg::SubmissionRejected(rejected) if for_us(self.until.submission()) => {
                Step::Rejected(&rejected.reason)
            }
            EventMsg::ContextCompacted(_)
                if matches!(self.until, Until::Compaction(_)) && for_us(self.until.submission()) =>
            {
                Step::Ended(Outcome::Completed)
            }
            msg if msg.ends_turn() => {
                let ended = msg.turn_id();
                if self.running.as_deref() == ended {
                    self.running = None;
                }
                if self.ours.is_some() && self.ours.as_deref() == ended {
                    return Step::Ended(match msg {
                        EventMsg::TurnComplete(_) => Outcome::Completed,
                        EventMsg::TurnAborted(aborted) if aborted.reason == AbortReason::Interrupted => {
                            Outcome::Interrupted
                        }
                        _ => Outcome::Failed,
                    });
                }
                Step::OtherTurnEnded
            }
            _ => Step::Nothing,
        }
    }

    /// Takes `turn_id` as ours if the event that names it answers our
    /// submission and no turn is ours yet.
    fn claim(&mut self, turn_id: &str, for_us: bool) -> Step<'static> {
        if !for_us || self.ours.is_some() {
            return Step::Nothing;
        }
        self.ours = Some(turn_id.to_owned());
        Step::Claimed(turn_id.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel::protocol::{
        ContextCompactedEvent, SubmissionRejectedEvent, TurnAbortedEvent, TurnCompleteEvent, TurnStartedEvent,
        UserMessageEvent,
    };

    fn event(submission: Option<&str>, msg: EventMsg) -> Event {
        Event {
            submission_id: submission.map(str::to_owned),
            msg,
        }
    }

    fn started(submission: Option<&str>, turn: &str) -> Event {
        event(
            submission,
            EventMsg::TurnStarted(TurnStartedEvent {
                turn_id: turn.to_owned(),
                trace_id: None,
            }),
        )
    }

    fn complete(turn: &str) -> Event {
        event(
            None,
            EventMsg::TurnComplete(TurnCompleteEvent {
                turn_id: turn.to_owned(),
                length_limited: false,
            }),
        )
    }

    fn aborted(turn: &str, reason: AbortReason) -> Event {
        event(
            None,
            EventMsg::TurnAborted(TurnAbortedEvent {
                turn_id: turn.to_owned(),
                reason,
                message: String::new(),
            }),
        )
    }

    #[test]
    fn our_turn_is_the_one_our_submission_starts_and_others_do_not_end_the_wait() {
        let mut tracker = TurnTracker::new(Until::TurnOf("s1".into()));
        assert_eq!(tracker.observe(&started(Some("s0"), "t0")), Step::Nothing);
        assert_eq!(tracker.interrupt_target().as_deref(), Some("t0"), "the running one");
        assert_eq!(tracker.observe(&complete("t0")), Step::OtherTurnEnded);
        assert!(tracker.none_running());
        assert_eq!(tracker.observe(&started(Some("s1"), "t1")), Step::Claimed("t1".into()));
        let message = event(
            Some("s1"),
            EventMsg::UserMessage(UserMessageEvent {
                turn_id: "t1".into(),
                text: "hi".into(),
            }),
        );
        assert_eq!(tracker.observe(&message), Step::Nothing, "claimed once");
        assert_eq!(tracker.ours(), Some("t1"));
        assert_eq!(tracker.observe(&complete("t1")), Step::Ended(Outcome::Completed));
    }

    #[test]
    fn a_message_taken_up_by_a_running_turn_makes_that_turn_ours() {
        let mut tracker = TurnTracker::new(Until::TurnOf("s2".into()));
        let message = event(
            Some("s2"),
            EventMsg::UserMessage(UserMessageEvent {
                turn_id: "t1".into(),
                text: "also".into(),
            }),
        );
        assert_eq!(tracker.observe(&message), Step::Claimed("t1".into()));
        assert_eq!(
            tracker.observe(&aborted("t1", AbortReason::Interrupted)),
            Step::Ended(Outcome::Interrupted)
        );
    }

    #[test]
    fn a_known_turn_ends_interrupted_or_failed() {
        let mut tracker = TurnTracker::new(Until::Turn("t".into()));
        assert_eq!(tracker.interrupt_target().as_deref(), Some("t"));
        assert_eq!(
            tracker.observe(&aborted("t", AbortReason::RuntimeStopped)),
            Step::Ended(Outcome::Failed)
        );
    }

    #[test]
    fn refusals_and_compactions_end_only_the_wait_for_their_submission() {
        let refusal = |submission: &str| {
            event(
                Some(submission),
                EventMsg::SubmissionRejected(SubmissionRejectedEvent {
                    reason: "queue full".into(),
                    idempotency_key: None,
                }),
            )
        };
        let mut tracker = TurnTracker::new(Until::Compaction("c".into()));
        assert_eq!(tracker.observe(&refusal("other")), Step::Nothing);
        assert_eq!(tracker.observe(&refusal("c")), Step::Rejected("queue full"));
        let compacted = |submission: &str| {
            event(
                Some(submission),
                EventMsg::ContextCompacted(ContextCompactedEvent {
                    turn_id: None,
                    reason: keel::protocol::CompactionReason::Requested,
                    summary: String::new(),
                    replaced_from: 0,
                    replaced_to: 0,
                    tokens_before: 0,
                    tokens_after: 0,
                    duration_ms: 0,
                    usage: None,
                }),
            )
        };
        assert_eq!(tracker.observe(&compacted("c")), Step::Ended(Outcome::Completed));
        let mut waiting = TurnTracker::new(Until::TurnOf("c".into()));
        assert_eq!(
            waiting.observe(&compacted("c")),
            Step::Nothing,
            "no compaction was asked for"
        );
        let mut idle = TurnTracker::new(Until::Idle);
        assert_eq!(idle.observe(&refusal("c")), Step::Nothing);
        assert_eq!(idle.observe(&started(Some("c"), "t")), Step::Nothing, "no turn is ours");
    }
}
