//! Redaction of everything a session commits, at the recorder.
//!
//! The recorder task sees every command of its session in order, so this is
//! the one place where all text that enters the store passes: events (the
//! model's text and deltas, tool calls and their arguments, tool outputs,
//! errors and warnings, user messages) and checkpoint writes (the history
//! items and the compaction summary). Each is redacted with
//! [`keel_secrets`] before it is stored and delivered.
//!
//! Streamed deltas are redacted across their boundaries: the end of a delta
//! that could begin a secret is held back and sent with the next delta of
//! the same stream, or as a delta of its own before the next other event
//! (the closing `assistant_message`, say) or flush. A runtime that stops between the
//! two loses the held-back end (a few bytes) from the log; the message
//! itself, in the history, is whole.
//!
//! Only a `submission_queued` event is stored as it is: it is the client's
//! submission, replayed after a crash, and must run as it was sent.

use super::command::{Command, PendingEvent};
use keel_protocol::{AssistantContentDeltaEvent, Event, EventMsg, ReasoningDeltaEvent, TranscriptItem};
use keel_secrets::{StreamRedactor, json_may_need_redaction, redact_in_place, redact_value};
use keel_store::{CheckpointWrite, EncodedEvent};

/// Which stream a delta belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Content,
    Reasoning,
}

/// The stream whose last delta's end is held back.
struct OpenStream {
    stream: Stream,
    turn_id: String,
    submission_id: Option<String>,
    redactor: StreamRedactor,
}

/// The redaction state of one session's recorder.
#[derive(Default)]
pub(super) struct Scrubber {
    open: Option<OpenStream>,
}

impl Scrubber {
    /// `command` with everything it commits redacted; a flush comes after
    /// the open stream's held-back end (a flush promises that everything
    /// sent before it is stored, and the runtime flushes only between
    /// steps, where no delta goes on).
    pub(super) fn command(&mut self, command: Command) -> impl Iterator<Item = Command> + use<> {
        let held = match &command {
            Command::Flush(_) => self.close().map(|pending| Command::Append {
                events: vec![pending],
                checkpoint: None,
                bytes: 0,
                ack: None,
            }),
            Command::Append { .. } => None,
        };
        held.into_iter().chain(std::iter::once(self.redacted(command)))
    }

    fn redacted(&mut self, command: Command) -> Command {
        match command {
            Command::Append {
                events,
                checkpoint,
                bytes,
                ack,
            } => {
                let mut scrubbed = Vec::with_capacity(events.len());
                for pending in events {
                    self.event(pending, &mut scrubbed);
                }
                let checkpoint = checkpoint.map(|mut write| {
                    scrub_checkpoint(&mut write);
                    write
                });
                // The bytes reserved for the command are released as they
                // were counted; redaction changes them by a few at most.
                Command::Append {
                    events: scrubbed,
                    checkpoint,
                    bytes,
                    ack,
                }
            }
            flush @ Command::Flush(_) => flush,
        }
    }

    /// Redacts one event into `out`: a delta through its stream's redactor
    /// (possibly emptied, when all of it is held back), any other event
    /// after the held-back end of the open stream.
    fn event(&mut self, mut pending: PendingEvent, out: &mut Vec<PendingEvent>) {
        let Some((stream, turn_id, delta)) = delta_of(&mut pending.event.msg) else {
            out.extend(self.close());
            if !matches!(pending.event.msg, EventMsg::SubmissionQueued(_)) {
                scrub_event(&mut pending);
            }
            out.push(pending);
            return;
        };
        if self
            .open
            .as_ref()
            .is_some_and(|open| open.stream != stream || open.turn_id != turn_id)
        {
            out.extend(self.close());
        }
        let open = self.open.get_or_insert_with(|| OpenStream {
            stream,
            turn_id: turn_id.to_owned(),
            submission_id: pending.event.submission_id.clone(),
            redactor: StreamRedactor::default(),
        });
        let released = open.redactor.push(delta);
        if released == *delta {
            out.push(pending);
            return;
        }
        // Held back whole: nothing to record yet, unless the event also
        // settles a queued submission.
        if released.is_empty() && pending.encoded.queue.is_none() {
            return;
        }
        *delta = released;
        reencode(&mut pending);
        out.push(pending);
    }

    /// The delta holding the open stream's held-back end, if any; the
    /// stream is closed.
    fn close(&mut self) -> Option<PendingEvent> {
        let mut open = self.open.take()?;
        let rest = open.redactor.finish();
        if rest.is_empty() {
            return None;
        }
        let turn_id = open.turn_id;
        let msg = match open.stream {
            Stream::Content => EventMsg::AssistantContentDelta(AssistantContentDeltaEvent { turn_id, delta: rest }),
            Stream::Reasoning => EventMsg::ReasoningDelta(ReasoningDeltaEvent { turn_id, delta: rest }),
        };
        let event = Event {
            submission_id: open.submission_id,
            msg,
        };
        match EncodedEvent::encode(&event) {
            Ok(encoded) => Some(PendingEvent { event, encoded }),
            Err(error) => {
                tracing::error!(%error, "cannot encode the held-back end of a streamed delta");
                None
            }
        }
    }
}

/// The stream, turn and text of a delta event.
fn delta_of(msg: &mut EventMsg) -> Option<(Stream, &str, &mut String)> {
    match msg {
        EventMsg::AssistantContentDelta(delta) => Some((Stream::Content, &delta.turn_id, &mut delta.delta)),
        EventMsg::ReasoningDelta(delta) => Some((Stream::Reasoning, &delta.turn_id, &mut delta.delta)),
        _ => None,
    }
}

/// Redacts every string of an event. Its JSON is looked at first (one scan
/// of text already serialized); only an event that may hold a secret is
/// taken apart, redacted string by string, and encoded again.
fn scrub_event(pending: &mut PendingEvent) {
    if !json_may_need_redaction(&pending.encoded.json) {
        return;
    }
    let mut value = match serde_json::to_value(&pending.event) {
        Ok(value) => value,
        Err(error) => {
            tracing::error!(%error, "cannot look into an event to redact it");
            return;
        }
    };
    if !redact_value(&mut value) {
        return;
    }
    match serde_json::from_value::<Event>(value) {
        Ok(event) => {
            pending.event = event;
            reencode(pending);
        }
        // Redaction replaces text inside strings only, so the event reads
        // back; should it not, it is stored as it was, and said so.
        Err(error) => tracing::error!(%error, kind = pending.event.msg.kind(), "a redacted event does not read back"),
    }
}

/// Serializes a changed event again, keeping what it does to the queue.
fn reencode(pending: &mut PendingEvent) {
    match EncodedEvent::encode(&pending.event) {
        Ok(mut encoded) => {
            encoded.queue = pending.encoded.queue.take();
            pending.encoded = encoded;
        }
        Err(error) => tracing::error!(%error, "cannot encode a redacted event"),
    }
}

/// Redacts the history items and the summary a checkpoint write stores.
fn scrub_checkpoint(write: &mut CheckpointWrite) {
    for item in &mut write.transcript_delta {
        scrub_item(item);
    }
    if let Some(compaction) = &mut write.checkpoint.compaction {
        redact_in_place(&mut compaction.summary);
    }
}

/// Redacts the text of one history item.
fn scrub_item(item: &mut TranscriptItem) {
    match item {
        TranscriptItem::UserMessage { text }
        | TranscriptItem::AssistantMessage { text, .. }
        | TranscriptItem::Summary { text } => {
            redact_in_place(text);
        }
        TranscriptItem::ToolCall { name, arguments, .. } => {
            redact_in_place(name);
            redact_in_place(arguments);
        }
        TranscriptItem::ToolResult { output, .. } => {
            redact_in_place(output);
        }
        TranscriptItem::Reasoning { data, .. } => {
            redact_value(data);
        }
    }
}
