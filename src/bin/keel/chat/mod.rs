//! `keel chat`: an interactive chat in a session, on the local database or
//! against a `keel serve` server.
//!
//! Each line typed is one message, submitted durably (`on_busy: queue`);
//! the answer streams as it arrives, tool calls and their results show as
//! lines on stderr, and approvals are asked inline. With stdin not a
//! terminal, lines are read from stdin, one message each, every turn runs to
//! its end before the next, and the output is plain text.
//!
//! - `local`: a session on the SQLite database, in this process;
//! - `remote`: a session of a server, over its HTTP API;
//! - `render`: printing events (the spinner, the history of a resumed session);
//! - `input`: the line editor with its history, or plain lines from stdin;
//! - `line`: what a typed line asks for (a message or a `/` command);
//! - `session`: one interface over a local and a remote session;
//! - `commands`: what each line does, and going on after a failed one;
//! - `served`: going through the server that serves the database;
//! - `switch`: the local session's model, which `/model` replaces;
//! - `client_tools`: the test tools `--client-tool` offers the model, which
//!   the chat runs itself; `client_calls`: answering their calls.
//!
//! Following a turn's events is [`crate::turn`]'s, shared with `keel run`.

mod client_calls;
mod client_tools;
mod commands;
mod credential;
mod input;
mod line;
mod local;
mod remote;
mod render;
mod served;
mod session;
mod switch;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use keel::protocol::{ApprovalDecision, ApprovalRequestedEvent, ClientToolRequestedEvent, EventMsg, Op, RecordedEvent};

use self::client_calls::Answered;
use self::client_tools::ClientTool;

use self::commands::Next;
use self::input::{Input, Read};
use self::line::Line;
use self::render::Renderer;
use self::session::Session;
use crate::console::{ApproveMode, decide_without_asking};
use crate::db::DbArgs;
use crate::interrupts::{Interrupts, Terminations};
use crate::session::ToolArgs;
use crate::terminal::terminal_safe;
use crate::turn::{Outcome, Step, TurnTracker, Until};
use crate::{ModelArgs, print_line};

/// The bot new chat sessions belong to.
const BOT_ID: &str = "keel-chat";

/// Arguments of `keel chat`.
#[derive(Args, Debug, Clone)]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Resume this session (it must exist), printing its conversation so
    /// far, with its own model unless --model is given; a new session when
    /// omitted.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Start a new session under this id (it must not exist yet).
    #[arg(long, value_name = "ID", conflicts_with = "session")]
    new_session: Option<String>,
    /// Chat in a session of the `keel serve` server at this URL (for
    /// example http://127.0.0.1:7777) instead of the local database.
    #[arg(long, value_name = "URL", conflicts_with_all = ["config", "workspace"])]
    server: Option<String>,
    /// A file holding the server's bearer token, with --server or on a
    /// database a server serves [default: $KEEL_TOKEN].
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    token_file: Option<PathBuf>,
    /// An API key (`keel keys create`) or a JWT from the server's identity
    /// provider, sent as the bearer credential, with --server or on a
    /// database a server serves [default: $KEEL_API_KEY, which keeps it out
    /// of the process list].
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    #[command(flatten)]
    model: ModelArgs,
    /// Standing instructions for the model (a system prompt) of a new
    /// session, or of a resumed local one for this chat.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// What to do with tool calls that need approval: ask inline (denied
    /// when stdin is not a terminal), approve them all, or deny them all.
    #[arg(long, value_enum, default_value_t = ApproveMode::Ask, value_name = "MODE")]
    approve: ApproveMode,
    #[command(flatten)]
    tools: ToolArgs,
    /// Offer the model this test tool as a client tool of the session, run
    /// by the chat itself: local_time (this machine's clock), echo (sends
    /// its text back) or ask_user (asks you; in a script, the next line of
    /// input is the answer). Repeat for more than one; a resumed session
    /// gets them declared anew.
    #[arg(long = "client-tool", value_enum, value_name = "TOOL")]
    client_tools: Vec<ClientTool>,
    /// Where the line editor keeps the lines typed, across chats [default:
    /// <data dir>/keel/chat_history].
    #[arg(long, env = "KEEL_CHAT_HISTORY", value_name = "FILE")]
    history: Option<PathBuf>,
}

impl ChatArgs {
    /// The history file: `--history`, or one in the per-user data directory
    /// (none when there is no such directory).
    fn history(&self) -> Option<PathBuf> {
        self.history
            .clone()
            .or_else(|| dirs::data_dir().map(|dir| dir.join("keel").join("chat_history")))
    }
}

/// Runs `keel chat`.
pub(crate) async fn chat(args: ChatArgs) -> anyhow::Result<ExitCode> {
    // Listening from the start: Ctrl-C while the session opens (a slow
    // server, say) leaves.
    let mut interrupts = Interrupts::listen()?;
    // SIGTERM and SIGHUP (a closed terminal, a systemd stop) end the chat
    // the way Ctrl-C does, with the session closed and its MCP servers
    // stopped, instead of killing the process on the spot.
    let mut terminations = Terminations::listen()?;
    let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let args = served::through_server(args).await?;
    let opening = open(&args);
    let opened = tokio::select! {
        opened = opening => opened?,
        () = interrupts.next() => return Ok(ExitCode::from(INTERRUPTED)),
        code = terminations.next() => return Ok(ExitCode::from(code)),
    };
    let Opened {
        session,
        history,
        startup,
        pending,
        pending_calls,
    } = opened;
    eprintln!("session {}", terminal_safe(session.id()));
    let colour = interactive && std::env::var_os("NO_COLOR").is_none();
    let stderr_terminal = std::io::stderr().is_terminal();
    let mut render = Renderer::new(interactive && stderr_terminal, colour, colour && stderr_terminal);
    render.history(&history)?;
    for event in &startup {
        render.event(event)?;
    }
    let input = if interactive {
        if let Some(hint) = render.hint("/help lists the commands; Ctrl-D leaves") {
            eprintln!("{hint}");
        }
        Input::editor(args.history())?
    } else {
        Input::lines()
    };
    let last_turn = last_turn_started(history.iter().chain(&startup));
    let mut chat = Chat {
        session,
        approve: args.approve,
        args,
        last_turn,
        input,
        interrupts,
        terminations,
        render,
        interactive,
    };
    let finish = chat.run(pending, pending_calls).await?;
    let Chat { session, .. } = chat;
    match finish {
        // The turn is closed (runtime_stopped) when the session is next opened.
        Finish::Leave(code) => Ok(ExitCode::from(code)),
        Finish::Code(code) => {
            session.close().await?;
            Ok(ExitCode::from(code))
        }
    }
}

/// Opens the session `args` name (or a new one), locally or on a server.
async fn open(args: &ChatArgs) -> anyhow::Result<Opened> {
    match &args.server {
        Some(server) => remote::open(args, server).await,
        None => local::open(args).await,
    }
}

/// The id of the last turn started among `events`.
fn last_turn_started<'a>(events: impl IntoIterator<Item = &'a RecordedEvent>) -> Option<String> {
    events
        .into_iter()
        .filter_map(|event| match &event.msg {
            EventMsg::TurnStarted(started) => Some(started.turn_id.clone()),
            _ => None,
        })
        .last()
}

/// The exit code after Ctrl-C (128 + SIGINT).
const INTERRUPTED: u8 = 130;

/// How the chat ends.
enum Finish {
    /// Close the session, then exit with this code.
    Code(u8),
    /// Leave at once with this code (a second Ctrl-C during a turn).
    Leave(u8),
}

/// A session opened for chatting.
pub(super) struct Opened {
    pub(super) session: Session,
    /// The events of the session before it was opened (empty for a new one).
    pub(super) history: Vec<RecordedEvent>,
    /// Events of the opening to show before the first prompt (warnings, a
    /// turn closed because the runtime had stopped).
    pub(super) startup: Vec<RecordedEvent>,
    /// Approval requests of a turn that was waiting for them.
    pub(super) pending: Vec<ApprovalRequestedEvent>,
    /// Client tool calls of a turn that was waiting for their results.
    pub(super) pending_calls: Vec<ClientToolRequestedEvent>,
}

/// A chat under way.
struct Chat {
    session: Session,
    /// What the chat was started with; an edit opens its fork with them.
    args: ChatArgs,
    /// The last turn started, which `/edit` replaces.
    last_turn: Option<String>,
    input: Input,
    interrupts: Interrupts,
    terminations: Terminations,
    render: Renderer,
    approve: ApproveMode,
    /// The line editor, prompts and colours (stdin and stdout are terminals);
    /// otherwise plain lines in, plain text out.
    interactive: bool,
}

impl Chat {
    /// Sends the decision on an approval request.
    async fn answer(&mut self, request: &ApprovalRequestedEvent, decision: ApprovalDecision) -> anyhow::Result<()> {
        let call_id = request.call_id.clone();
        self.session.control(Op::Approval { call_id, decision }).await
    }

    /// Settles what the session was doing when it was opened, then reads
    /// and submits lines until the end of the input.
    async fn run(
        &mut self,
        pending: Vec<ApprovalRequestedEvent>,
        pending_calls: Vec<ClientToolRequestedEvent>,
    ) -> anyhow::Result<Finish> {
        let waiting_turn = (pending.first().map(|request| &request.turn_id))
            .or_else(|| pending_calls.first().map(|request| &request.turn_id))
            .cloned();
        if let Some(turn_id) = waiting_turn {
            let mut settled = true;
            for request in &pending {
                self.render.awaiting(request);
                match self.decide(request).await? {
                    Some(decision) => self.answer(request, decision).await?,
                    None => {
                        self.interrupt(Some(turn_id.clone())).await?;
                        settled = false;
                        break;
                    }
                }
            }
            for request in pending_calls.iter().filter(|_| settled) {
                if self.answer_client_tool(request).await? == Answered::Interrupted {
                    self.interrupt(Some(turn_id.clone())).await?;
                    break;
                }
            }
            if self.follow(Until::Turn(turn_id)).await? == Outcome::Leave {
                return Ok(Finish::Leave(self.leave_code()));
            }
        }
        if self.session.busy().await? && self.follow(Until::Idle).await? == Outcome::Leave {
            return Ok(Finish::Leave(self.leave_code()));
        }
        if let Some(code) = self.terminations.received() {
            return Ok(Finish::Code(code));
        }

        let mut all_completed = true;
        loop {
            let read = tokio::select! {
                read = self.input.read(&mut self.interrupts) => read?,
                code = self.terminations.next() => return Ok(Finish::Code(code)),
            };
            let line = match read {
                Read::Line(line) => line,
                Read::Eof => break,
                Read::Interrupted if self.interactive => break,
                Read::Interrupted => return Ok(Finish::Code(INTERRUPTED)),
            };
            let parsed = Line::parse(&line);
            if parsed != Line::Empty {
                self.input.remember(&line);
            }
            match self.handle(parsed).await {
                Ok(Next::Prompt) => {}
                Ok(Next::Exit) => break,
                Ok(Next::Failed) => {
                    all_completed = false;
                    break;
                }
                Ok(Next::Finish(finish)) => return Ok(finish),
                Err(error) => self.recover(error)?,
            }
        }
        if self.interactive {
            // Leave the terminal on a fresh line after the prompt.
            print_line("")?;
        }
        Ok(Finish::Code(if all_completed { 0 } else { 1 }))
    }

    /// The exit code of leaving at once: after SIGTERM or SIGHUP, theirs;
    /// else Ctrl-C's.
    fn leave_code(&self) -> u8 {
        self.terminations.received().unwrap_or(INTERRUPTED)
    }

    /// A problem with what was typed: a line on stderr at the terminal; in
    /// a script, the end (nothing after a bad line can be trusted to make
    /// sense).
    fn problem(&mut self, message: &str) -> anyhow::Result<()> {
        if !self.interactive {
            bail!("{message}");
        }
        self.render.problem(message)
    }

    /// Renders the session's events until `until`, answering approval
    /// requests and turning Ctrl-C into an interrupt (a second one leaves).
    async fn follow(&mut self, until: Until) -> anyhow::Result<Outcome> {
        let mut turn = TurnTracker::new(until);
        let mut interrupted = false;
        let mut poll = tokio::time::interval(Duration::from_millis(200));
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let idle_wait = matches!(turn.until(), Until::Idle);
        loop {
            let event = tokio::select! {
                event = self.session.next_event() => event?,
                _ = self.terminations.next() => {
                    // Like Ctrl-C; the chat ends once the turn has.
                    if interrupted {
                        self.render.end_turn()?;
                        eprintln!("stopped");
                        return Ok(Outcome::Leave);
                    }
                    interrupted = true;
                    self.interrupt(turn.interrupt_target()).await?;
                    continue;
                }
                () = self.interrupts.next() => {
                    if interrupted {
                        self.render.end_turn()?;
                        eprintln!("interrupted");
                        return Ok(Outcome::Leave);
                    }
                    interrupted = true;
                    self.interrupt(turn.interrupt_target()).await?;
                    continue;
                }
                _ = poll.tick(), if idle_wait => {
                    if turn.none_running() && !self.session.busy().await? {
                        return Ok(Outcome::Completed);
                    }
                    continue;
                }
            };
            self.render.event(&event)?;
            if let EventMsg::TurnStarted(started) = &event.msg {
                self.last_turn = Some(started.turn_id.clone());
            }
            // Ctrl-C at a client tool's question interrupts the turn.
            if let EventMsg::ClientToolRequested(request) = &event.msg
                && self.answer_client_tool(request).await? == Answered::Interrupted
            {
                if interrupted {
                    return Ok(Outcome::Leave);
                }
                interrupted = true;
                self.interrupt(Some(request.turn_id.clone())).await?;
            }
            match turn.observe(&event) {
                Step::Nothing => {}
                // Ctrl-C came while the message waited in the queue: it
                // meant this turn.
                Step::Claimed(turn_id) => {
                    if interrupted {
                        self.interrupt(Some(turn_id)).await?;
                    }
                }
                Step::Approval(request) => match self.decide(request).await? {
                    Some(decision) => self.answer(request, decision).await?,
                    // Ctrl-C at the question interrupts the turn.
                    None if interrupted => return Ok(Outcome::Leave),
                    None => {
                        interrupted = true;
                        self.interrupt(Some(request.turn_id.clone())).await?;
                    }
                },
                Step::Rejected(reason) => {
                    self.render.end_turn()?;
                    let what = match turn.until() {
                        Until::Compaction(_) => "not compacted",
                        Until::Regeneration(_) => "not regenerated",
                        _ => "message refused",
                    };
                    self.render.problem(&format!("{what}: {reason}"))?;
                    return Ok(Outcome::Failed);
                }
                Step::Ended(outcome) => {
                    self.render.end_turn()?;
                    return Ok(outcome);
                }
                Step::OtherTurnEnded => {
                    if idle_wait && !self.session.busy().await? {
                        self.render.end_turn()?;
                        return Ok(Outcome::Completed);
                    }
                }
            }
        }
    }

    /// Asks the session to interrupt `turn_id` (the running turn if `None`).
    async fn interrupt(&mut self, turn_id: Option<String>) -> anyhow::Result<()> {
        self.render.stop_spinner();
        self.session.control(Op::Interrupt { turn_id }).await
    }

    /// The decision for `request`: per `--approve`, or asked; `None` when
    /// the user pressed Ctrl-C at the question.
    async fn decide(&mut self, request: &ApprovalRequestedEvent) -> anyhow::Result<Option<ApprovalDecision>> {
        self.render.stop_spinner();
        self.render.end_line()?;
        if let Some(decision) = decide_without_asking(self.approve, request, self.input.can_ask()) {
            return Ok(Some(decision));
        }
        let question = crate::console::approval_question(request);
        tokio::select! {
            answer = self.input.ask(&question, &mut self.interrupts) => answer,
            // As Ctrl-C at the question: the turn is interrupted.
            _ = self.terminations.next() => Ok(None),
        }
    }
}
