//! `keel run`: one turn per message, streamed to the terminal.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use keel::agent::{AgentConfig, create_agent};
use keel::protocol::{ApprovalDecision, EventMsg, Op, RecordedEvent, new_id};
use keel::store::CheckpointStore;
use keel::tools::workspace::SandboxPolicy;

use crate::{DbArgs, ModelArgs, print_line};

/// How `keel run` answers approval requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ApproveMode {
    /// Ask on the terminal; deny when there is no terminal.
    Ask,
    /// Approve every request.
    Auto,
    /// Deny every request.
    Deny,
}

/// Arguments of `keel run`.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Continue this session (it must exist); a new session when omitted.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    #[command(flatten)]
    model: ModelArgs,
    /// Standing instructions for the model (a system prompt).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Offer no tools to the model (by default: the built-in tools, the
    /// workspace tools and the MCP servers of keel.toml).
    #[arg(long)]
    no_tools: bool,
    /// What shell commands may change, instead of keel.toml's `[tools]
    /// sandbox` (default workspace-write).
    #[arg(long, value_name = "POLICY")]
    sandbox: Option<SandboxPolicy>,
    /// The session's working directory, to which the file tools are
    /// confined [default: the current directory].
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// The most model calls one turn may make.
    #[arg(long, default_value_t = keel::agent::DEFAULT_MAX_STEPS, value_name = "N")]
    max_steps: u32,
    /// What to do with tool calls that keel.toml's `[approvals]` says to ask
    /// about: ask on the terminal (denied when there is none), approve them
    /// all, or deny them all. Calls the policy denies stay denied.
    #[arg(long, value_enum, default_value_t = ApproveMode::Ask, value_name = "MODE")]
    approve: ApproveMode,
    /// The bot a new session belongs to.
    #[arg(long, default_value = "keel-cli", value_name = "ID")]
    bot: String,
    /// Print every recorded event as one JSON line instead of the text.
    #[arg(long)]
    json: bool,
    /// The messages, one turn each, in order; `-` reads one from stdin.
    #[arg(required = true, value_name = "MESSAGE")]
    messages: Vec<String>,
}

pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    // Everything that can be wrong with the input is checked before any
    // session work starts.
    let (keel_config, model) = args.model.load()?;
    let workspace = match &args.workspace {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let workspace = workspace
        .canonicalize()
        .with_context(|| format!("cannot use {} as the workspace", workspace.display()))?;
    let mut args = args;
    for message in args.messages.iter_mut().filter(|message| *message == "-") {
        *message = std::io::read_to_string(std::io::stdin()).context("cannot read the message from stdin")?;
    }
    for message in &args.messages {
        Op::UserInput { text: message.clone() }
            .validate()
            .map_err(|error| anyhow::anyhow!("invalid message: {error}"))?;
    }
    let store: Arc<dyn CheckpointStore> = Arc::new(args.db.open(true).await?);
    let session_id = match &args.session {
        Some(id) => {
            if store.load(id).await?.is_none() {
                bail!("unknown session '{id}' (omit --session to start a new one)");
            }
            id.clone()
        }
        None => new_id(),
    };
    let mut config = AgentConfig::new(session_id.clone(), store, model);
    config.workspace = workspace;
    config.session_context.bot_id = args.bot.clone();
    config.instructions = args.system.clone();
    config.max_steps = args.max_steps;
    config.approvals = keel_config.approvals.clone();
    if !args.no_tools {
        let mut tools_config = keel_config.tools.clone();
        if let Some(policy) = args.sandbox {
            tools_config.sandbox = policy;
        }
        // The shell's commands are started through this binary's hidden
        // `sandbox-exec` command, which applies the sandbox and then execs.
        let launcher = std::env::current_exe().ok();
        keel_config.install_tools(&mut config, &tools_config, launcher).await;
    }
    let mut agent = create_agent(config).await?;
    if !args.json {
        eprintln!("session {session_id}");
    }

    let mut printer = Printer {
        json: args.json,
        line_open: false,
    };
    let mut all_completed = true;
    let mut interrupted = false;
    for message in args.messages {
        let submitted = agent.sender().submit_wait(Op::UserInput { text: message }).await?;
        let mut turn_id: Option<String> = None;
        loop {
            let event = tokio::select! {
                event = agent.next_event() => event,
                _ = tokio::signal::ctrl_c() => {
                    if interrupted {
                        // A second Ctrl-C: leave now. The turn is closed
                        // (runtime_stopped) when the session is next opened.
                        eprintln!("interrupted");
                        return Ok(ExitCode::from(130));
                    }
                    // Interrupt the running turn; its abort event ends the loop.
                    interrupted = true;
                    agent.sender().submit(Op::Interrupt { turn_id: turn_id.clone() })?;
                    continue;
                }
            };
            let Some(event) = event else {
                bail!("the session stopped before the turn ended");
            };
            printer.print(&event)?;
            let ours = event.submission_id.as_deref() == Some(submitted.id.as_str());
            match &event.msg {
                EventMsg::TurnStarted(started) if ours => turn_id = Some(started.turn_id.clone()),
                EventMsg::ApprovalRequested(request) => {
                    let decision = decide(args.approve, request).await;
                    agent.sender().submit(Op::Approval {
                        call_id: request.call_id.clone(),
                        decision,
                    })?;
                }
                EventMsg::SubmissionRejected(rejected) if ours => bail!("message rejected: {}", rejected.reason),
                msg if msg.ends_turn() && msg.turn_id() == turn_id.as_deref() && turn_id.is_some() => {
                    all_completed &= matches!(msg, EventMsg::TurnComplete(_));
                    break;
                }
                _ => {}
            }
        }
        if !all_completed {
            break;
        }
    }

    agent.sender().submit_wait(Op::Shutdown).await?;
    while let Some(event) = agent.next_event().await {
        printer.print(&event)?;
    }
    agent.shutdown().await?;
    Ok(match (all_completed, interrupted) {
        (true, _) => ExitCode::SUCCESS,
        (false, true) => ExitCode::from(130),
        (false, false) => ExitCode::FAILURE,
    })
}

/// The decision for a tool call that needs approval: per `mode`, or asked
/// on the terminal. Without a terminal to ask on, the call is denied.
async fn decide(mode: ApproveMode, request: &keel::protocol::ApprovalRequestedEvent) -> ApprovalDecision {
    use std::io::IsTerminal;
    match mode {
        ApproveMode::Auto => return ApprovalDecision::Approve,
        ApproveMode::Deny => return ApprovalDecision::Deny,
        ApproveMode::Ask => {}
    }
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        eprintln!(
            "[denied {}: no terminal to ask on; pass --approve auto to allow tool calls]",
            request.name
        );
        return ApprovalDecision::Deny;
    }
    eprint!(
        "Allow {} {}? [y]es / [n]o / [a]lways: ",
        request.name,
        shorten(&request.arguments, 200)
    );
    let answer = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await;
    match answer
        .ok()
        .and_then(Result::ok)
        .map(|line| line.trim().to_ascii_lowercase())
        .as_deref()
    {
        Some("y" | "yes") => ApprovalDecision::Approve,
        Some("a" | "always") => ApprovalDecision::ApproveForSession,
        _ => ApprovalDecision::Deny,
    }
}

/// `text` cut to `max` characters, on one line.
fn shorten(text: &str, max: usize) -> String {
    let flat = text.replace('\n', " ");
    match flat.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &flat[..end]),
        None => flat,
    }
}

/// Renders events as streamed text (or JSON lines).
struct Printer {
    json: bool,
    /// Streamed text was printed without its final newline yet.
    line_open: bool,
}

impl Printer {
    fn print(&mut self, event: &RecordedEvent) -> anyhow::Result<()> {
        if self.json {
            return print_line(&serde_json::to_string(event)?);
        }
        match &event.msg {
            EventMsg::AssistantContentDelta(delta) => {
                let mut out = std::io::stdout().lock();
                // A closed pipe only means nobody reads the text any more.
                let _ = out.write_all(delta.delta.as_bytes()).and_then(|()| out.flush());
                self.line_open = !delta.delta.ends_with('\n');
            }
            EventMsg::AssistantMessage(_) | EventMsg::TurnComplete(_) if self.line_open => {
                self.line_open = false;
                print_line("")?;
            }
            EventMsg::TurnAborted(aborted) => {
                self.close_line()?;
                eprintln!(
                    "turn aborted ({}): {}",
                    serde_json::to_value(aborted.reason)?.as_str().unwrap_or("?"),
                    aborted.message
                );
            }
            EventMsg::Error(error) => {
                self.close_line()?;
                eprintln!("error: {}", error.message);
            }
            EventMsg::ToolCallStarted(call) => {
                self.close_line()?;
                eprintln!("[tool {} {}]", call.name, shorten(&call.arguments, 200));
            }
            EventMsg::ApprovalRequested(request) => {
                self.close_line()?;
                eprintln!(
                    "[approval needed: {} {}]",
                    request.name,
                    shorten(&request.arguments, 200)
                );
            }
            EventMsg::ToolCallCompleted(done) => {
                let label = if done.is_error { "tool error" } else { "tool result" };
                eprintln!("[{label}: {}]", shorten(&done.output, 200));
            }
            EventMsg::Warning(warning) => {
                self.close_line()?;
                eprintln!("warning: {}", warning.message);
            }
            _ => {}
        }
        Ok(())
    }

    fn close_line(&mut self) -> anyhow::Result<()> {
        if std::mem::take(&mut self.line_open) {
            print_line("")?;
        }
        Ok(())
    }
}
