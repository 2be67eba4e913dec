//! Reading what the user types: a line editor (rustyline) with a saved
//! history when stdin and stdout are terminals, otherwise plain lines from
//! stdin.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;

use anyhow::Context;
use keel::protocol::ApprovalDecision;
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::{
    Cmd, ConditionalEventHandler, Editor, Event, EventContext, EventHandler, KeyEvent, Movement, RepeatCount,
};
use tokio::sync::mpsc;

use crate::console::parse_answer;
use crate::interrupts::Interrupts;

/// The prompt for a message.
const PROMPT: &str = "> ";

/// Lines of input history kept.
const HISTORY_LINES: usize = 1000;

/// What reading a line gave.
pub(super) enum Read {
    /// A line, without its end.
    Line(String),
    /// The end of the input (Ctrl-D at an empty prompt).
    Eof,
    /// Ctrl-C at an empty prompt (or SIGINT while waiting for a line).
    Interrupted,
}

/// Where lines come from.
pub(super) enum Input {
    /// Boxed: the editor is large, and there is one per chat.
    Editor(Box<LineEditor>),
    /// Plain lines, for scripts.
    Lines(Lines),
}

impl Input {
    /// The line editor on the terminal, with the history saved in `history`
    /// (if any) loaded.
    pub(super) fn editor(history: Option<PathBuf>) -> anyhow::Result<Self> {
        Ok(Input::Editor(Box::new(LineEditor::open(history)?)))
    }

    /// Plain lines from stdin.
    pub(super) fn lines() -> Self {
        Input::Lines(Lines::spawn())
    }

    /// The next line typed. The line editor sees Ctrl-C as a key; plain
    /// lines are interrupted by SIGINT from `interrupts`.
    pub(super) async fn read(&mut self, interrupts: &mut Interrupts) -> anyhow::Result<Read> {
        match self {
            Input::Editor(editor) => editor.readline(PROMPT.to_owned()).await,
            Input::Lines(lines) => lines.read(interrupts).await,
        }
    }

    /// Adds a line to the saved history (only the line editor keeps one).
    pub(super) fn remember(&mut self, line: &str) {
        if let Input::Editor(editor) = self {
            editor.remember(line);
        }
    }

    /// Whether a question can be put to the user.
    pub(super) fn can_ask(&self) -> bool {
        match self {
            Input::Editor(_) => true,
            Input::Lines(lines) => lines.terminal,
        }
    }

    /// Asks `question`; `None` when the user pressed Ctrl-C instead of
    /// answering. The end of the input denies.
    pub(super) async fn ask(
        &mut self,
        question: &str,
        interrupts: &mut Interrupts,
    ) -> anyhow::Result<Option<ApprovalDecision>> {
        Ok(match self.question(question, interrupts).await? {
            Read::Line(answer) => Some(parse_answer(&answer)),
            Read::Eof => Some(ApprovalDecision::Deny),
            Read::Interrupted => None,
        })
    }

    /// Puts `question` and reads the answer: on the terminal with the line
    /// editor; from a script, the next line of stdin.
    pub(super) async fn question(&mut self, question: &str, interrupts: &mut Interrupts) -> anyhow::Result<Read> {
        match self {
            Input::Editor(editor) => editor.readline(question.to_owned()).await,
            Input::Lines(lines) => {
                eprint!("{question}");
                lines.read(interrupts).await
            }
        }
    }
}

/// Ctrl-C clears a line that has text, and interrupts at an empty one.
struct CtrlC;

impl ConditionalEventHandler for CtrlC {
    fn handle(&self, _: &Event, _: RepeatCount, _: bool, context: &EventContext<'_>) -> Option<Cmd> {
        if context.line().is_empty() {
            Some(Cmd::Interrupt)
        } else {
            Some(Cmd::Kill(Movement::WholeLine))
        }
    }
}

/// The line editor. It reads on a blocking thread, so it is taken out while
/// a line is read and put back after.
pub(super) struct LineEditor {
    editor: Option<Editor<(), DefaultHistory>>,
    /// Where the history is saved.
    history: Option<PathBuf>,
}

impl LineEditor {
    /// The editor, Ctrl-C bound, with `history` loaded when it exists.
    fn open(history: Option<PathBuf>) -> anyhow::Result<Self> {
        let config = rustyline::Config::builder()
            .max_history_size(HISTORY_LINES)
            .context("cannot set up the line editor")?
            .auto_add_history(false)
            .build();
        let mut editor: Editor<(), DefaultHistory> =
            Editor::with_config(config).context("cannot set up the line editor")?;
        editor.bind_sequence(KeyEvent::ctrl('C'), EventHandler::Conditional(Box::new(CtrlC)));
        if let Some(path) = &history {
            // No saved history yet is the usual first run.
            let _ = editor.load_history(path);
        }
        Ok(Self {
            editor: Some(editor),
            history,
        })
    }

    /// Reads a line after `prompt`, on a blocking thread (the terminal is in
    /// raw mode meanwhile, so Ctrl-C arrives as a key, not a signal).
    async fn readline(&mut self, prompt: String) -> anyhow::Result<Read> {
        let mut editor = self.editor.take().context("the line editor is busy")?;
        let (editor, read) = tokio::task::spawn_blocking(move || {
            let read = editor.readline(&prompt);
            (editor, read)
        })
        .await
        .context("the line editor failed")?;
        self.editor = Some(editor);
        match read {
            Ok(line) => Ok(Read::Line(line)),
            Err(ReadlineError::Eof) => Ok(Read::Eof),
            Err(ReadlineError::Interrupted) => Ok(Read::Interrupted),
            Err(error) => Err(error).context("cannot read from the terminal"),
        }
    }

    /// Adds `line` to the history and appends it to the saved file; a
    /// history that cannot be saved is not worth stopping the chat for.
    fn remember(&mut self, line: &str) {
        let Some(editor) = &mut self.editor else {
            return;
        };
        if !matches!(editor.add_history_entry(line), Ok(true)) {
            return;
        }
        if let Some(path) = &self.history {
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Err(error) = editor.append_history(path) {
                tracing::debug!(%error, path = %path.display(), "cannot save the chat history");
            }
        }
    }
}

/// Lines from stdin, read by a thread of their own (one line ahead).
pub(super) struct Lines {
    lines: mpsc::Receiver<std::io::Result<String>>,
    /// Whether stdin and stderr are terminals, so a question can be asked.
    terminal: bool,
}

impl Lines {
    /// Starts the reading thread.
    fn spawn() -> Self {
        let (sender, lines) = mpsc::channel(1);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let failed = line.is_err();
                if sender.blocking_send(line).is_err() || failed {
                    break;
                }
            }
        });
        Self {
            lines,
            terminal: std::io::stdin().is_terminal() && std::io::stderr().is_terminal(),
        }
    }

    /// The next line; `Interrupted` on Ctrl-C while waiting for it.
    async fn read(&mut self, interrupts: &mut Interrupts) -> anyhow::Result<Read> {
        tokio::select! {
            line = self.lines.recv() => match line {
                Some(Ok(line)) => Ok(Read::Line(line)),
                Some(Err(error)) => Err(error).context("cannot read stdin"),
                None => Ok(Read::Eof),
            },
            () = interrupts.next() => Ok(Read::Interrupted),
        }
    }
}
