//! What `keel run` and `keel chat` share on the terminal: printing events as
//! text and answering approval requests.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};

use keel::protocol::{ApprovalDecision, ApprovalRequestedEvent, EventMsg, RecordedEvent};

use crate::print_line;
use crate::terminal::terminal_safe;

/// How tool calls that need approval are answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ApproveMode {
    /// Ask on the terminal; deny when there is no terminal.
    Ask,
    /// Approve every request.
    Auto,
    /// Deny every request.
    Deny,
}

/// The decision `mode` makes without asking anyone, or `None` when the user
/// is to be asked. With `ask` and no terminal to ask on (`can_ask` false)
/// the call is denied, and a line on stderr says why.
pub(crate) fn decide_without_asking(
    mode: ApproveMode,
    request: &ApprovalRequestedEvent,
    can_ask: bool,
) -> Option<ApprovalDecision> {
    match mode {
        ApproveMode::Auto => Some(ApprovalDecision::Approve),
        ApproveMode::Deny => Some(ApprovalDecision::Deny),
        ApproveMode::Ask if can_ask => None,
        ApproveMode::Ask => {
            eprintln!(
                "[denied {}: no terminal to ask on; pass --approve auto to allow tool calls]",
                terminal_safe(&request.name)
            );
            Some(ApprovalDecision::Deny)
        }
    }
}

/// The question put to the user about a call, safe to print (the tool's
/// name and arguments come from the model).
pub(crate) fn approval_question(request: &ApprovalRequestedEvent) -> String {
    let question = format!(
        "Allow {} {}? [y]es / [n]o / [a]lways: ",
        request.name,
        shorten(&request.arguments, 200)
    );
    terminal_safe(&question).into_owned()
}

/// The decision an answer to [`approval_question`] gives: anything but yes
/// or always denies.
pub(crate) fn parse_answer(answer: &str) -> ApprovalDecision {
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => ApprovalDecision::Approve,
        "a" | "always" => ApprovalDecision::ApproveForSession,
        _ => ApprovalDecision::Deny,
    }
}

/// The decision for a tool call that needs approval: per `mode`, or asked
/// on the terminal (stdin and stderr). Without a terminal the call is denied.
pub(crate) async fn decide(mode: ApproveMode, request: &ApprovalRequestedEvent) -> ApprovalDecision {
    let can_ask = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    if let Some(decision) = decide_without_asking(mode, request, can_ask) {
        return decision;
    }
    eprint!("{}", approval_question(request));
    let answer = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await;
    match answer {
        Ok(Ok(line)) => parse_answer(&line),
        _ => ApprovalDecision::Deny,
    }
}

/// `text` cut to `max` characters, on one line.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    let flat = text.replace('\n', " ");
    match flat.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &flat[..end]),
        None => flat,
    }
}

/// How a note on stderr looks on a colour terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tone {
    /// Tool calls and their results.
    Quiet,
    /// Errors and aborted turns.
    Alarm,
}

/// Renders events as streamed text (or JSON lines): the answer on stdout,
/// tool calls, decisions, warnings and errors as lines on stderr.
pub(crate) struct Printer {
    json: bool,
    /// Colour the stderr lines (ANSI escapes).
    colour: bool,
    /// Streamed text was printed without its final newline yet.
    line_open: bool,
    /// The tool of each call waiting for a decision, to name it when decided.
    awaiting: HashMap<String, String>,
}

impl Printer {
    /// A printer of text, with coloured notes when `colour` is set.
    pub(crate) fn text(colour: bool) -> Self {
        Self {
            json: false,
            colour,
            line_open: false,
            awaiting: HashMap::new(),
        }
    }

    /// A printer of one JSON line per event.
    pub(crate) fn json() -> Self {
        Self {
            json: true,
            ..Self::text(false)
        }
    }

    /// Prints one event (text deltas as they come, notes as lines).
    pub(crate) fn print(&mut self, event: &RecordedEvent) -> anyhow::Result<()> {
        if self.json {
            return print_line(&serde_json::to_string(event)?);
        }
        match &event.msg {
            EventMsg::AssistantContentDelta(delta) => {
                let mut out = std::io::stdout().lock();
                // Escaped piece by piece: a control is one character, so
                // no sequence survives being split across deltas.
                let safe = terminal_safe(&delta.delta);
                // A closed pipe only means nobody reads the text any more.
                let _ = out.write_all(safe.as_bytes()).and_then(|()| out.flush());
                self.line_open = !delta.delta.ends_with('\n');
            }
            EventMsg::AssistantMessage(_) | EventMsg::TurnComplete(_) => self.close_line()?,
            EventMsg::TurnAborted(aborted) => {
                self.close_line()?;
                let reason = serde_json::to_value(aborted.reason)?;
                let line = format!("turn aborted ({}): {}", reason.as_str().unwrap_or("?"), aborted.message);
                self.note(Tone::Alarm, &line)?;
            }
            EventMsg::Error(error) => self.note(Tone::Alarm, &format!("error: {}", error.message))?,
            EventMsg::ToolCallStarted(call) => {
                self.note(
                    Tone::Quiet,
                    &format!("[tool {} {}]", call.name, shorten(&call.arguments, 200)),
                )?;
            }
            EventMsg::ApprovalRequested(request) => self.awaiting(request),
            EventMsg::ApprovalDecided(decided) => {
                let name = self.awaiting.remove(&decided.call_id).unwrap_or_default();
                let verdict = match decided.decision {
                    ApprovalDecision::Approve => "approved",
                    ApprovalDecision::ApproveForSession => "approved for the session",
                    _ => "denied",
                };
                self.note(Tone::Quiet, &format!("[{verdict} {name}]"))?;
            }
            EventMsg::ToolCallCompleted(done) => {
                let label = if done.is_error { "tool error" } else { "tool result" };
                self.note(Tone::Quiet, &format!("[{label}: {}]", shorten(&done.output, 200)))?;
            }
            EventMsg::Warning(warning) => self.note(Tone::Alarm, &format!("warning: {}", warning.message))?,
            EventMsg::TurnRolledBack(rolled) => self.note(
                Tone::Quiet,
                &format!(
                    "[the last answer was rolled back ({} history items); answering again]",
                    rolled.items_removed
                ),
            )?,
            EventMsg::SessionForked(forked) => self.note(
                Tone::Quiet,
                &format!(
                    "[forked from session {} at event {} ({} history items)]",
                    forked.parent_session_id, forked.at_sequence, forked.history_items
                ),
            )?,
            EventMsg::ContextCompacted(compacted) => self.note(
                Tone::Quiet,
                &format!(
                    "[history compacted: about {} tokens, now about {}]",
                    compacted.tokens_before, compacted.tokens_after
                ),
            )?,
            _ => {}
        }
        Ok(())
    }

    /// Remembers a request printed earlier (in another process), to name
    /// its tool when it is decided.
    pub(crate) fn awaiting(&mut self, request: &ApprovalRequestedEvent) {
        self.awaiting.insert(request.call_id.clone(), request.name.clone());
    }

    /// Whether streamed text waits for its final newline.
    pub(crate) fn line_open(&self) -> bool {
        self.line_open
    }

    /// Ends the streamed line, if one is open.
    pub(crate) fn close_line(&mut self) -> anyhow::Result<()> {
        if std::mem::take(&mut self.line_open) {
            print_line("")?;
        }
        Ok(())
    }

    /// A line on stderr, after ending the streamed line. The line is
    /// escaped ([`terminal_safe`]): notes quote tool calls, their output and
    /// errors, which the model or a tool wrote.
    pub(crate) fn note(&mut self, tone: Tone, line: &str) -> anyhow::Result<()> {
        self.close_line()?;
        let line = terminal_safe(line);
        if self.colour {
            let colour = match tone {
                Tone::Quiet => "\x1b[2m",
                Tone::Alarm => "\x1b[31m",
            };
            eprintln!("{colour}{line}\x1b[0m");
        } else {
            eprintln!("{line}");
        }
        Ok(())
    }
}
