//! The model event sink of one model step: coalescing and closing.
//!
//! A provider can emit thousands of tiny deltas a second. The sink gathers
//! them and records one `assistant_content_delta` per window (a time window
//! or a size, whichever comes first), so a fast provider cannot flood the
//! recorder. The sink never blocks: if the recorder cannot take a delta it
//! fails, the step is marked saturated and the turn ends with an error.
//!
//! Once the step ends (completed, cancelled or dropped) the sink is closed
//! and every later call fails with `agent stopped: model event sink closed`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::recorder::{EventRecorder, RECORDER_EVENT_BYTE_BUDGET, WeakEventRecorder, try_send_event};
use keel_model::{ModelEvent, ModelEventSink};
use keel_protocol::{AssistantContentDeltaEvent, Event, EventMsg, ReasoningDeltaEvent};
use keel_protocol::{Error, Result};

/// The most output one completed model step may produce, counted as JSON
/// (its text, reasoning and tool calls with their arguments, plus its last
/// delta not yet recorded). The recorder's byte budget less room for the
/// events' envelopes, so that the batch recording a step (last delta,
/// message, usage, turn end) or a call's start always fits in it; a step
/// over it fails with an `error` event and `turn_aborted` (`model_failed`)
/// and none of its output joins the history.
pub const MAX_STEP_OUTPUT_BYTES: usize = RECORDER_EVENT_BYTE_BUDGET - 256 * 1024;

/// The most streamed text a step keeps in memory (for the history of a turn
/// cut short). Text past it is still streamed and recorded as deltas, but a
/// step that long can neither complete nor join the history, so it is not
/// kept: what a step holds stays bounded whatever the provider sends.
pub(super) const MAX_STREAMED_TEXT_BYTES: usize = RECORDER_EVENT_BYTE_BUDGET;

/// How streamed text is grouped into recorded deltas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamingOptions {
    /// Record buffered text at the latest this long after its first byte
    /// arrived. Zero records every delta as it comes.
    pub coalesce_window: Duration,
    /// Record buffered text as soon as it reaches this many bytes.
    pub coalesce_bytes: usize,
}

impl Default for StreamingOptions {
    fn default() -> Self {
        Self {
            coalesce_window: Duration::from_millis(40),
            coalesce_bytes: 16 * 1024,
        }
    }
}

impl StreamingOptions {
    /// Every delta is recorded on its own, as it arrives.
    pub fn per_delta() -> Self {
        Self {
            coalesce_window: Duration::ZERO,
            coalesce_bytes: 0,
        }
    }
}

/// Which stream a pending delta belongs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum DeltaKind {
    #[default]
    Content,
    Reasoning,
}

#[derive(Default)]
struct State {
    closed: bool,
    /// Set when the recorder refused a delta; the step must end.
    saturated: Option<String>,

    /// Text received but not yet recorded, all of one kind.
    pending: String,
    pending_kind: DeltaKind,
    /// When the oldest pending byte arrived.
    pending_since: Option<Instant>,
    /// All content (not reasoning) text streamed in this step, while it is
    /// within [`MAX_STREAMED_TEXT_BYTES`].
    streamed: String,
    /// Set once the step's text passed that bound: `streamed` was let go.
    streamed_dropped: bool,
}

/// The shared state behind one step's sink.
pub(crate) struct StepStream {
    state: Mutex<State>,
    /// Wakes the turn loop when a flush deadline is set, the recorder becomes
    /// congested (so the loop stops polling the model) or the sink fails.
    wake: Notify,
    /// Weak, so that a sink a model kept does not keep the recorder (and the
    /// session's event stream) alive after the session stopped.
    recorder: WeakEventRecorder,
    turn_id: String,
    submission_id: Option<String>,
    options: StreamingOptions,
}

impl StepStream {
    pub(crate) fn new(
        recorder: EventRecorder,
        turn_id: String,
        submission_id: Option<String>,
        options: StreamingOptions,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            recorder: recorder.downgrade(),
            turn_id,
            submission_id,
            options,
        })
    }

    /// The sink handed to the model.
    pub(crate) fn sink(self: &Arc<Self>) -> ModelEventSink {
        let stream = Arc::clone(self);
        Arc::new(move |event| stream.push(event))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn push(&self, event: ModelEvent) -> Result<()> {
        let mut state = self.lock();
        if state.closed {
            return Err(Error::stopped("model event sink closed"));
        }
        let (kind, text) = match event {
            ModelEvent::TextDelta(text) => (DeltaKind::Content, text),
            ModelEvent::ReasoningDelta(text) => (DeltaKind::Reasoning, text),
        };
        if text.is_empty() {
            return Ok(());
        }
        if kind != state.pending_kind {
            // Deltas of the other kind are recorded first, to keep the order.
            self.flush_locked(&mut state)?;
            state.pending_kind = kind;
        }
        if kind == DeltaKind::Content && !state.streamed_dropped {
            state.streamed.push_str(&text);
        }
        state.pending.push_str(&text);
        let pushed = if state.pending.len() >= self.options.coalesce_bytes || self.options.coalesce_window.is_zero() {
            self.flush_locked(&mut state)
        } else {
            if state.pending_since.is_none() {
                state.pending_since = Some(Instant::now());
                self.wake.notify_one();
            }
            Ok(())
        };
        if pushed.is_ok() && state.streamed.len() > MAX_STREAMED_TEXT_BYTES {
            // Too long to ever be recorded as the step's message or kept in
            // the history: it goes on as deltas, no longer kept in memory.
            state.streamed = String::new();
            state.streamed_dropped = true;
        }
        pushed
    }

    /// Records the pending text now. Holding the lock keeps deltas in order.
    fn flush_locked(&self, state: &mut State) -> Result<()> {
        if state.pending.is_empty() {
            return Ok(());
        }
        let delta = std::mem::take(&mut state.pending);
        let delta_len = delta.len();
        state.pending_since = None;
        let sent = match self.recorder.upgrade() {
            Some(recorder) => {
                try_send_event(&recorder, self.delta_event(state.pending_kind, delta)).map(|()| recorder.is_congested())
            }
            None => Err(Error::stopped("event recorder is closed")),
        };
        match sent {
            Ok(congested) => {
                // The turn loop checks congestion only when woken; a model
                // that keeps streaming would otherwise keep being polled.
                if congested {
                    self.wake.notify_one();
                }
                Ok(())
            }
            Err(error) => {
                // The refused text is not in the log, so it must not enter
                // the history either (pending content is a suffix of streamed).
                if state.pending_kind == DeltaKind::Content && !state.streamed_dropped {
                    let recorded = state.streamed.len().saturating_sub(delta_len);
                    state.streamed.truncate(recorded);
                }
                state.closed = true;
                state.saturated = Some(format!("model output outran the event recorder ({error})"));
                self.wake.notify_one();
                Err(error)
            }
        }
    }

    /// When the pending text must be recorded, if there is any.
    pub(crate) fn flush_deadline(&self) -> Option<Instant> {
        self.lock()
            .pending_since
            .map(|since| since + self.options.coalesce_window)
    }

    /// Records the pending text (the window has passed).
    pub(crate) fn flush(&self) -> Result<()> {
        let mut state = self.lock();
        self.flush_locked(&mut state)
    }

    /// The error that saturated the sink, if it was.
    pub(crate) fn saturation(&self) -> Option<String> {
        self.lock().saturated.clone()
    }

    /// Resolves when the turn loop should look at the stream again.
    pub(crate) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Closes the sink. Returns the text still pending (to be recorded by the
    /// caller, which may wait for room) and everything streamed in the step.
    pub(crate) fn close(&self) -> ClosedStream {
        let mut state = self.lock();
        state.closed = true;
        state.pending_since = None;
        let pending = std::mem::take(&mut state.pending);
        ClosedStream {
            pending_bytes: if pending.is_empty() { 0 } else { json_len(&pending) },
            pending: (!pending.is_empty()).then(|| self.delta_event(state.pending_kind, pending)),
            streamed: std::mem::take(&mut state.streamed),
        }
    }

    fn delta_event(&self, kind: DeltaKind, delta: String) -> Event {
        let turn_id = self.turn_id.clone();
        Event {
            submission_id: self.submission_id.clone(),
            msg: match kind {
                DeltaKind::Content => EventMsg::AssistantContentDelta(AssistantContentDeltaEvent { turn_id, delta }),
                DeltaKind::Reasoning => EventMsg::ReasoningDelta(ReasoningDeltaEvent { turn_id, delta }),
            },
        }
    }
}

/// What was left in a stream when it closed.
#[derive(Default)]
pub(crate) struct ClosedStream {
    /// The delta event of streamed text not yet recorded, if any.
    pub(crate) pending: Option<Event>,
    /// The size of that delta's text as JSON.
    pub(crate) pending_bytes: usize,
    /// All text streamed in the step; empty when it was too long to keep.
    pub(crate) streamed: String,
}

impl ClosedStream {
    /// Nothing streamed (a turn that ends outside a model step).
    pub(crate) fn empty() -> Self {
        Self::default()
    }
}

/// The message of a step that produced `bytes` of output, past the bound.
pub(crate) fn step_too_large(bytes: usize) -> String {
    format!(
        "the model produced {bytes} bytes of output in one step, more than the {MAX_STEP_OUTPUT_BYTES} bytes \
         a step may hold; its tool calls were not run and its output is not in the history"
    )
}

/// The length of `text` written as a JSON string, quotes and escapes
/// included (as `serde_json` writes it), without writing it.
pub(crate) fn json_len(text: &str) -> usize {
    2 + text
        .bytes()
        .map(|byte| match byte {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// The size of a step's output as JSON: its text, its reasoning items and
/// its tool calls (ids, names, arguments).
pub(super) fn output_bytes(output: &keel_model::ModelOutput) -> usize {
    let calls: usize = output
        .tool_calls
        .iter()
        .map(|call| json_len(&call.call_id) + json_len(&call.name) + json_len(&call.arguments))
        .sum();
    let mut reasoning = ByteCount(0);
    for item in &output.reasoning {
        // Counting cannot fail; a value that cannot be serialized counts as 0
        // here and fails where it is recorded.
        let _ = serde_json::to_writer(&mut reasoning, item);
    }
    json_len(&output.text).saturating_add(calls).saturating_add(reasoning.0)
}

/// An `io::Write` that only counts the bytes written to it.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Closes the stream when the step's future is dropped (cancelled), so a
/// model that kept the sink cannot write into a turn that is over.
pub(crate) struct CloseOnDrop(pub(crate) Arc<StepStream>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.lock().closed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::json_len;

    #[test]
    fn json_len_is_the_length_serde_json_writes() {
        for text in [
            "",
            "plain",
            "quote \" and backslash \\",
            "\n\r\t\u{8}\u{c}",
            "\u{0}\u{1f}\u{7f}",
            "ünïcødé ✓ 🚀",
            "</script>",
        ] {
            let written = serde_json::to_string(text).expect("serialize");
            assert_eq!(json_len(text), written.len(), "{text:?}");
        }
    }
}
