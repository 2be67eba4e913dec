//! The invariants a chaos run's history and store must hold at the end.

use std::collections::{BTreeMap, BTreeSet};

use super::clients::{Outcome, SessionHistory};
use keel_protocol::{ApprovalDecision, EventMsg, RecordedEvent};

/// The log's own invariants: sequences 1..N without gap or duplicate,
/// every turn started once and closed at most once, no turn's events
/// inside another's, and no tool call started twice in its turn.
pub(super) fn log(session_id: &str, log: &[RecordedEvent], violations: &mut Vec<String>) {
    for (expected, event) in (1u64..).zip(log) {
        if event.sequence != expected {
            violations.push(format!(
                "{session_id}: stored sequence {} where {expected} was due",
                event.sequence
            ));
            return;
        }
    }
    let mut open: Option<&str> = None;
    let mut started = BTreeSet::new();
    let mut closed = BTreeSet::new();
    let mut calls: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for event in log {
        if let EventMsg::ToolCallStarted(call) = &event.msg
            && let Some(first) = calls.insert((call.turn_id.as_str(), call.call_id.as_str()), event.sequence)
        {
            violations.push(format!(
                "{session_id}: call {} of turn {} started twice (at {first} and {})",
                call.call_id, call.turn_id, event.sequence
            ));
        }
        match &event.msg {
            EventMsg::TurnStarted(turn) => {
                if let Some(open) = open {
                    violations.push(format!(
                        "{session_id}: turn {} started at {} inside turn {open}",
                        turn.turn_id, event.sequence
                    ));
                }
                if !started.insert(turn.turn_id.as_str()) {
                    violations.push(format!("{session_id}: turn {} started twice", turn.turn_id));
                }
                open = Some(turn.turn_id.as_str());
            }
            msg if msg.ends_turn() => {
                let turn_id = msg.turn_id().unwrap_or_default();
                if !closed.insert(turn_id) {
                    violations.push(format!("{session_id}: turn {turn_id} closed twice"));
                }
                if open != Some(turn_id) {
                    violations.push(format!(
                        "{session_id}: turn {turn_id} closed at {} while {open:?} was open",
                        event.sequence
                    ));
                }
                open = None;
            }
            msg => {
                if let (Some(turn_id), Some(open)) = (msg.turn_id(), open)
                    && turn_id != open
                {
                    violations.push(format!(
                        "{session_id}: an event of turn {turn_id} at {} inside turn {open}",
                        event.sequence
                    ));
                }
            }
        }
    }
    if let Some(open) = open {
        violations.push(format!("{session_id}: turn {open} never closed"));
    }
}

/// What the clients saw against what is stored: every event received is
/// stored with the same content at its sequence, every acknowledged
/// submission was stored once and acted on, no key was queued twice.
pub(super) fn history(session_id: &str, history: &SessionHistory, log: &[RecordedEvent], violations: &mut Vec<String>) {
    for problem in &history.wire_violations {
        violations.push(format!("{session_id}: {problem}"));
    }
    for (sequence, received) in &history.received {
        let stored = usize::try_from(*sequence)
            .ok()
            .and_then(|sequence| sequence.checked_sub(1))
            .and_then(|index| log.get(index));
        if stored != Some(received) {
            violations.push(format!(
                "{session_id}: the event streamed at {sequence} is not the one stored there"
            ));
        }
    }
    // Events by submission, and stored-ahead submissions by key.
    let mut by_submission: BTreeMap<&str, Vec<&RecordedEvent>> = BTreeMap::new();
    let mut keys: BTreeMap<&str, usize> = BTreeMap::new();
    for event in log {
        if let Some(id) = &event.submission_id {
            by_submission.entry(id).or_default().push(event);
        }
        if let EventMsg::SubmissionQueued(queued) = &event.msg
            && let Some(key) = &queued.idempotency_key
        {
            *keys.entry(key).or_default() += 1;
        }
    }
    for (key, count) in keys {
        if count > 1 {
            violations.push(format!("{session_id}: key {key} queued {count} times"));
        }
    }
    let acknowledged: BTreeSet<(&str, bool)> = history
        .attempts
        .iter()
        .filter_map(|attempt| match &attempt.outcome {
            Outcome::Accepted { submission_id, .. } => Some((submission_id.as_str(), attempt.key.is_some())),
            _ => None,
        })
        .collect();
    for (submission_id, stored_ahead) in acknowledged {
        if !stored_ahead {
            // A control op acts at once; it need not leave a trace.
            continue;
        }
        let events = by_submission.get(submission_id).map(Vec::as_slice).unwrap_or_default();
        let queued = events
            .iter()
            .filter(|event| matches!(event.msg, EventMsg::SubmissionQueued(_)))
            .count();
        if queued != 1 {
            violations.push(format!(
                "{session_id}: acknowledged submission {submission_id} stored {queued} times"
            ));
            continue;
        }
        if events.len() < 2 {
            violations.push(format!(
                "{session_id}: acknowledged submission {submission_id} was never acted on"
            ));
        }
    }
}

/// A side effect outside Keel (a line naming its call, appended by a shell
/// call) happens at most once per stored start of that call, never for a
/// call the user denied, and, in a session that asks, never more often than
/// the call was approved.
pub(super) fn side_effects(
    session_id: &str,
    effects: &BTreeMap<String, usize>,
    log: &[RecordedEvent],
    asks: bool,
    violations: &mut Vec<String>,
) {
    let mut started: BTreeMap<&str, usize> = BTreeMap::new();
    let mut denied: BTreeMap<&str, usize> = BTreeMap::new();
    let mut approved: BTreeMap<&str, usize> = BTreeMap::new();
    for event in log {
        match &event.msg {
            EventMsg::ToolCallStarted(call) if call.name == "shell" => {
                *started.entry(call.call_id.as_str()).or_default() += 1;
            }
            EventMsg::ApprovalDecided(decided) => {
                let tally = match decided.decision {
                    ApprovalDecision::Deny => &mut denied,
                    _ => &mut approved,
                };
                *tally.entry(decided.call_id.as_str()).or_default() += 1;
            }
            _ => {}
        }
    }
    let count = |tally: &BTreeMap<&str, usize>, call_id: &str| tally.get(call_id).copied().unwrap_or(0);
    for (call_id, ran) in effects {
        let allowed = count(&started, call_id).saturating_sub(count(&denied, call_id));
        if *ran > allowed {
            violations.push(format!(
                "{session_id}: call {call_id} ran {ran} times for {} stored starts and {} denials: it ran twice, before its start was stored, or though denied",
                count(&started, call_id),
                count(&denied, call_id)
            ));
        }
        if asks && *ran > count(&approved, call_id) {
            violations.push(format!(
                "{session_id}: call {call_id} ran {ran} times for {} approvals",
                count(&approved, call_id)
            ));
        }
    }
}

/// Approvals: a call is decided only after it was asked about in the same
/// turn, and at most once per turn.
pub(super) fn approvals(session_id: &str, log: &[RecordedEvent], violations: &mut Vec<String>) {
    let mut asked = BTreeSet::new();
    let mut decided = BTreeSet::new();
    for event in log {
        match &event.msg {
            EventMsg::ApprovalRequested(request) => {
                asked.insert((request.turn_id.as_str(), request.call_id.as_str()));
            }
            EventMsg::ApprovalDecided(decision) => {
                let call = (decision.turn_id.as_str(), decision.call_id.as_str());
                if !asked.contains(&call) {
                    violations.push(format!(
                        "{session_id}: call {} of turn {} decided at {} without being asked",
                        call.1, call.0, event.sequence
                    ));
                }
                if !decided.insert(call) {
                    violations.push(format!(
                        "{session_id}: call {} of turn {} decided twice",
                        call.1, call.0
                    ));
                }
            }
            _ => {}
        }
    }
}

/// Whether every acknowledged stored-ahead submission of the session has
/// been acted on in `log` (the run waits for this after the faults).
pub(super) fn settled(history: &SessionHistory, log: &[RecordedEvent]) -> bool {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for event in log {
        if let Some(id) = &event.submission_id {
            *seen.entry(id).or_default() += 1;
        }
    }
    let turns_open = log
        .iter()
        .filter(|event| matches!(event.msg, EventMsg::TurnStarted(_)))
        .count()
        > log.iter().filter(|event| event.msg.ends_turn()).count();
    !turns_open
        && history.attempts.iter().all(|attempt| match &attempt.outcome {
            Outcome::Accepted { submission_id, .. } if attempt.key.is_some() => {
                seen.get(submission_id.as_str()).is_some_and(|count| *count >= 2)
            }
            _ => true,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::{
        ApprovalDecidedEvent, ApprovalRequestedEvent, AssistantContentDeltaEvent, BusyPolicy, Event, Op,
        SubmissionQueuedEvent, ToolCallStartedEvent, TurnCompleteEvent, TurnStartedEvent,
    };

    fn event(sequence: u64, submission_id: Option<&str>, msg: EventMsg) -> RecordedEvent {
        RecordedEvent {
            sequence,
            recorded_at_ms: 0,
            event: Event {
                submission_id: submission_id.map(str::to_owned),
                msg,
            },
        }
    }

    fn queued(sequence: u64, id: &str, key: &str) -> RecordedEvent {
        event(
            sequence,
            Some(id),
            EventMsg::SubmissionQueued(SubmissionQueuedEvent {
                op: Op::UserInput { text: "hi".into() },
                on_busy: BusyPolicy::Queue,
                idempotency_key: Some(key.to_owned()),
                submitted_by: None,
                traceparent: None,
            }),
        )
    }

    fn started(sequence: u64, id: &str, turn: &str) -> RecordedEvent {
        event(
            sequence,
            Some(id),
            EventMsg::TurnStarted(TurnStartedEvent {
                turn_id: turn.to_owned(),
                trace_id: None,
            }),
        )
    }

    fn delta(sequence: u64, turn: &str) -> RecordedEvent {
        event(
            sequence,
            None,
            EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
                turn_id: turn.to_owned(),
                delta: "x".to_owned(),
            }),
        )
    }

    fn complete(sequence: u64, turn: &str) -> RecordedEvent {
        event(
            sequence,
            None,
            EventMsg::TurnComplete(TurnCompleteEvent {
                turn_id: turn.to_owned(),
                length_limited: false,
            }),
        )
    }

    fn accepted(id: &str) -> super::super::clients::Attempt {
        super::super::clients::Attempt {
            session_id: "s".into(),
            key: Some(format!("k-{id}")),
            op: serde_json::json!({}),
            node: 0,
            outcome: Outcome::Accepted {
                submission_id: id.to_owned(),
                duplicate: false,
            },
        }
    }

    #[test]
    fn a_sound_log_and_history_have_no_violations() {
        let log = vec![
            queued(1, "a", "k-a"),
            started(2, "a", "t1"),
            delta(3, "t1"),
            complete(4, "t1"),
        ];
        let mut history = SessionHistory::default();
        history.attempts.push(accepted("a"));
        history
            .received
            .extend(log.iter().map(|event| (event.sequence, event.clone())));
        let mut violations = Vec::new();
        super::log("s", &log, &mut violations);
        super::history("s", &history, &log, &mut violations);
        side_effects("s", &BTreeMap::new(), &log, true, &mut violations);
        approvals("s", &log, &mut violations);
        assert!(violations.is_empty(), "{violations:?}");
        assert!(settled(&history, &log));
    }

    #[test]
    fn each_broken_invariant_is_reported() {
        let mut violations = Vec::new();
        // A gap.
        super::log("s", &[queued(1, "a", "k"), queued(3, "b", "k2")], &mut violations);
        assert_eq!(violations.len(), 1, "{violations:?}");
        // Interleaved turns, a turn closed twice.
        let interleaved = vec![
            started(1, "a", "t1"),
            started(2, "b", "t2"),
            delta(3, "t1"),
            complete(4, "t2"),
            complete(5, "t2"),
        ];
        violations.clear();
        super::log("s", &interleaved, &mut violations);
        assert!(violations.len() >= 3, "{violations:?}");
        // A call started twice in its turn.
        let start = |sequence, call_id: &str| {
            event(
                sequence,
                None,
                EventMsg::ToolCallStarted(ToolCallStartedEvent {
                    turn_id: "t1".into(),
                    call_id: call_id.into(),
                    name: "list_dir".into(),
                    arguments: "{}".into(),
                }),
            )
        };
        let restarted = vec![
            started(1, "a", "t1"),
            start(2, "c1"),
            start(3, "c2"),
            start(4, "c1"),
            complete(5, "t1"),
        ];
        violations.clear();
        super::log("s", &restarted, &mut violations);
        assert_eq!(violations, ["s: call c1 of turn t1 started twice (at 2 and 4)"]);
        // A key queued twice; an acknowledged submission never stored; one
        // stored but never acted on; a streamed event unlike the stored one.
        let log = vec![queued(1, "a", "k"), queued(2, "b", "k")];
        let mut history = SessionHistory::default();
        history.attempts.extend([accepted("a"), accepted("missing")]);
        history.received.insert(1, delta(1, "t9"));
        violations.clear();
        super::history("s", &history, &log, &mut violations);
        assert_eq!(violations.len(), 4, "{violations:?}");
        assert!(!settled(&history, &log));
        // A side effect without a stored start; one of a denied call; one
        // without an approval where calls need one; a decision twice, and
        // one nobody asked for.
        let call = event(
            1,
            None,
            EventMsg::ToolCallStarted(ToolCallStartedEvent {
                turn_id: "t".into(),
                call_id: "c".into(),
                name: "shell".into(),
                arguments: "{}".into(),
            }),
        );
        let decided = |sequence, call_id: &str, decision| {
            event(
                sequence,
                None,
                EventMsg::ApprovalDecided(ApprovalDecidedEvent {
                    turn_id: "t".into(),
                    call_id: call_id.into(),
                    decision,
                    decided_by: None,
                }),
            )
        };
        let twice = BTreeMap::from([("c".to_owned(), 2)]);
        violations.clear();
        side_effects("s", &twice, std::slice::from_ref(&call), false, &mut violations);
        assert_eq!(violations.len(), 1, "{violations:?}");
        let once = BTreeMap::from([("c".to_owned(), 1)]);
        let denied = vec![decided(1, "c", ApprovalDecision::Deny), call.clone()];
        violations.clear();
        side_effects("s", &once, &denied, false, &mut violations);
        assert_eq!(violations.len(), 1, "{violations:?}");
        violations.clear();
        side_effects("s", &once, std::slice::from_ref(&call), true, &mut violations);
        assert_eq!(violations.len(), 1, "{violations:?}");
        let approved = vec![decided(1, "c", ApprovalDecision::Approve), call];
        violations.clear();
        side_effects("s", &once, &approved, true, &mut violations);
        assert!(violations.is_empty(), "{violations:?}");
        let asked = event(
            1,
            None,
            EventMsg::ApprovalRequested(ApprovalRequestedEvent {
                turn_id: "t".into(),
                call_id: "c".into(),
                name: "shell".into(),
                arguments: "{}".into(),
            }),
        );
        let log = vec![
            asked,
            decided(2, "c", ApprovalDecision::Approve),
            decided(3, "c", ApprovalDecision::Approve),
            decided(4, "d", ApprovalDecision::Deny),
        ];
        violations.clear();
        approvals("s", &log, &mut violations);
        assert_eq!(violations.len(), 2, "{violations:?}");
    }
}
