//! Printing a chat: the answer streamed on stdout, notes on stderr (through
//! the printer `keel run` uses), a spinner until the first token, and the
//! conversation so far of a resumed session.

use std::collections::HashSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel::protocol::{ApprovalRequestedEvent, EventMsg, RecordedEvent};

use crate::console::{Printer, Tone};
use crate::print_line;
use crate::terminal::terminal_safe;

/// Renders a chat's events.
pub(super) struct Renderer {
    printer: Printer,
    /// Show a spinner on stderr while waiting for the model.
    spinner_enabled: bool,
    spinner: Option<Spinner>,
    /// Style stdout (the history's user lines, hints).
    colour: bool,
    /// Style stderr's notes.
    colour_notes: bool,
}

impl Renderer {
    /// A renderer with a spinner (on a terminal) and colours as given.
    pub(super) fn new(spinner: bool, colour: bool, colour_notes: bool) -> Self {
        Self {
            printer: Printer::text(colour_notes),
            spinner_enabled: spinner,
            spinner: None,
            colour,
            colour_notes,
        }
    }

    /// Starts the spinner, if it is enabled and nothing is half printed.
    pub(super) fn waiting(&mut self) {
        if self.spinner_enabled && self.spinner.is_none() && !self.printer.line_open() {
            self.spinner = Some(Spinner::start());
        }
    }

    /// Stops and clears the spinner, if it runs.
    pub(super) fn stop_spinner(&mut self) {
        if let Some(spinner) = self.spinner.take() {
            spinner.stop();
        }
    }

    /// Prints one event of the session as it happens.
    pub(super) fn event(&mut self, event: &RecordedEvent) -> anyhow::Result<()> {
        match &event.msg {
            // A new model step (after tool calls): wait for it again.
            EventMsg::ModelStepStarted(_) => self.waiting(),
            EventMsg::SessionStarted(_)
            | EventMsg::TurnStarted(_)
            | EventMsg::UserMessage(_)
            | EventMsg::SubmissionQueued(_)
            | EventMsg::TokenUsage(_)
            | EventMsg::ReasoningDelta(_) => {}
            _ => {
                self.stop_spinner();
                self.printer.print(event)?;
            }
        }
        Ok(())
    }

    /// Remembers a request from the history, to name its tool when decided.
    pub(super) fn awaiting(&mut self, request: &ApprovalRequestedEvent) {
        self.printer.awaiting(request);
    }

    /// Ends a turn's output: no spinner, the streamed line closed.
    pub(super) fn end_turn(&mut self) -> anyhow::Result<()> {
        self.stop_spinner();
        self.printer.close_line()
    }

    /// Closes the streamed line, if one is open.
    pub(super) fn end_line(&mut self) -> anyhow::Result<()> {
        self.printer.close_line()
    }

    /// A complaint about what was typed.
    pub(super) fn problem(&mut self, message: &str) -> anyhow::Result<()> {
        self.end_turn()?;
        self.printer.note(Tone::Alarm, message)
    }

    /// A quiet line on stderr about what the chat did.
    pub(super) fn note(&mut self, message: &str) -> anyhow::Result<()> {
        self.end_turn()?;
        self.printer.note(Tone::Quiet, message)
    }

    /// `text` styled as a hint on stderr (`None` when there is no terminal
    /// to give hints on).
    pub(super) fn hint(&self, text: &str) -> Option<String> {
        self.spinner_enabled.then(|| {
            if self.colour_notes {
                format!("\x1b[2m{text}\x1b[0m")
            } else {
                text.to_owned()
            }
        })
    }

    /// Prints the conversation in `events` as it stands: each user message
    /// after `> `, each answer as its text (an answer cut short by its
    /// turn's end, with `[interrupted]`); turns rolled back by a regenerate
    /// are left out (the turn that replaced them follows).
    pub(super) fn history(&mut self, events: &[RecordedEvent]) -> anyhow::Result<()> {
        let rolled_back: HashSet<&str> = events
            .iter()
            .filter_map(|event| match &event.msg {
                EventMsg::TurnRolledBack(rolled) => Some(rolled.rolled_back_turn_id.as_str()),
                _ => None,
            })
            .collect();
        let mut streamed = String::new();
        for event in events {
            if event.msg.turn_id().is_some_and(|turn| rolled_back.contains(turn)) {
                continue;
            }
            match &event.msg {
                EventMsg::SessionForked(_) => self.printer.print(event)?,
                EventMsg::UserMessage(message) => {
                    let line = format!("> {}", terminal_safe(&message.text));
                    if self.colour {
                        print_line(&format!("\x1b[1m{line}\x1b[0m"))?;
                    } else {
                        print_line(&line)?;
                    }
                }
                EventMsg::ModelStepStarted(_) => streamed.clear(),
                EventMsg::AssistantContentDelta(delta) => streamed.push_str(&delta.delta),
                EventMsg::AssistantMessage(message) => {
                    streamed.clear();
                    if !message.text.is_empty() {
                        print_line(&terminal_safe(message.text.trim_end_matches('\n')))?;
                    }
                }
                EventMsg::TurnAborted(_) if !streamed.is_empty() => {
                    let text = std::mem::take(&mut streamed);
                    print_line(&format!("{} [interrupted]", terminal_safe(text.trim_end())))?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Drop for Renderer {
    fn drop(&mut self) {
        self.stop_spinner();
    }
}

/// A spinner on stderr, drawn by a task until stopped.
struct Spinner {
    /// Whether it still draws; the task draws and `stop` clears under this
    /// lock, so no frame lands after the line was cleared.
    active: Arc<Mutex<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Spinner {
    /// The frames drawn in turn.
    const FRAMES: [&'static str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

    /// Starts drawing (after a short pause).
    fn start() -> Self {
        let active = Arc::new(Mutex::new(true));
        let drawing = Arc::clone(&active);
        let task = tokio::spawn(async move {
            // A quick answer shows no spinner at all.
            let first = tokio::time::Instant::now() + Duration::from_millis(120);
            let mut ticks = tokio::time::interval_at(first, Duration::from_millis(80));
            for frame in Self::FRAMES.iter().cycle() {
                ticks.tick().await;
                let active = drawing.lock().unwrap_or_else(|poison| poison.into_inner());
                if !*active {
                    return;
                }
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r{frame} ").and_then(|()| err.flush());
            }
        });
        Self { active, task }
    }

    /// Stops drawing and clears the frame.
    fn stop(self) {
        let mut active = self.active.lock().unwrap_or_else(|poison| poison.into_inner());
        if std::mem::replace(&mut *active, false) {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K").and_then(|()| err.flush());
        }
        self.task.abort();
    }
}
