//! `keel run`: one turn per message, streamed to the terminal.

use std::collections::VecDeque;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use keel::agent::SubmissionSender;
use keel::agent::create_agent;
use keel::protocol::Op;

use crate::ModelArgs;
use crate::console::{ApproveMode, Printer, decide};
use crate::db::DbArgs;
use crate::interrupts::{Interrupts, Terminations};
use crate::session::{Opening, StoredSettings, ToolArgs, agent_config, project_docs, session_instructions};
use crate::turn::{Outcome, Step, TurnTracker, Until};

/// Arguments of `keel run`.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Continue this session (it must exist), with its model and system
    /// prompt unless --model or --system is given; a new session when omitted.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Start a new session under this id (it must not exist yet).
    #[arg(long, value_name = "ID", conflicts_with = "session")]
    new_session: Option<String>,
    #[command(flatten)]
    model: ModelArgs,
    /// Standing instructions for the model (a system prompt).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    #[command(flatten)]
    tools: ToolArgs,
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
    let keel_config = args.model.config()?;
    let workspace = args.tools.workspace()?;
    let mut args = args;
    for message in args.messages.iter_mut().filter(|message| *message == "-") {
        *message = std::io::read_to_string(std::io::stdin()).context("cannot read the message from stdin")?;
    }
    for message in &args.messages {
        Op::UserInput { text: message.clone() }
            .validate()
            .map_err(|error| anyhow::anyhow!("invalid message: {error}"))?;
    }
    // From here on SIGTERM and SIGHUP end the command the way Ctrl-C does,
    // with the session closed and the MCP servers stopped; one that comes
    // while the session opens is acted on at the first turn.
    let mut terminations = Terminations::listen()?;
    // Its hold keeps a `keel serve` from starting on the database (and
    // taking this session) until the command ends.
    let Opening {
        store,
        id: session_id,
        stored,
        model,
        spec,
        hold: _hold,
    } = Opening::prepare(
        &args.db,
        &args.model,
        &keel_config,
        args.session.as_deref(),
        args.new_session.as_deref(),
        true,
    )
    .await?;
    let instructions = session_instructions(
        &keel_config,
        &args.bot,
        args.system.as_deref(),
        stored.instructions,
        args.session.is_some(),
        &args.tools,
    );
    let project_docs = project_docs(&keel_config, &args.bot, &args.tools, &workspace);
    let mut config = agent_config(session_id.clone(), store, model, &keel_config, &args.tools, workspace).await;
    config.session_context.bot_id = args.bot.clone();
    config.project_docs = project_docs;
    // Kept with a new session (a resumed one keeps what it was created with).
    config.session_context.settings = Some(
        StoredSettings {
            model: Some(spec),
            instructions: instructions.clone(),
        }
        .to_value(),
    );
    config.instructions = instructions;
    config.max_steps = args.max_steps;
    let mut agent = create_agent(config).await?;
    if !args.json {
        eprintln!("session {}", crate::terminal::terminal_safe(&session_id));
    }

    let mut printer = if args.json {
        Printer::json()
    } else {
        Printer::text(false)
    };
    let mut interrupts = Interrupts::listen()?;
    let mut all_completed = true;
    let mut interrupted = false;
    // Control ops (approval decisions, an interrupt) waiting for room in
    // the control lane.
    let mut control = VecDeque::new();
    for message in args.messages {
        let submitted = agent.sender().submit_wait(Op::UserInput { text: message }).await?;
        let mut turn = TurnTracker::new(Until::TurnOf(submitted.id));
        loop {
            let event = tokio::select! {
                event = agent.next_event() => event,
                code = terminations.next() => {
                    if interrupted {
                        eprintln!("stopped");
                        return Ok(ExitCode::from(code));
                    }
                    // Like Ctrl-C; no further message runs after it.
                    interrupted = true;
                    control.push_front(Op::Interrupt { turn_id: turn.ours().map(str::to_owned) });
                    send_control(agent.sender(), &mut control)?;
                    continue;
                }
                () = interrupts.next() => {
                    if interrupted {
                        // A second Ctrl-C: leave now. The turn is closed
                        // (runtime_stopped) when the session is next opened.
                        eprintln!("interrupted");
                        return Ok(ExitCode::from(130));
                    }
                    // Interrupt the running turn; its abort event ends the loop.
                    // It goes ahead of decisions still waiting for room.
                    interrupted = true;
                    control.push_front(Op::Interrupt { turn_id: turn.ours().map(str::to_owned) });
                    send_control(agent.sender(), &mut control)?;
                    continue;
                }
            };
            let Some(event) = event else {
                bail!("the session stopped before the turn ended");
            };
            printer.print(&event)?;
            match turn.observe(&event) {
                Step::Approval(request) => {
                    let decision = decide(args.approve, request).await;
                    control.push_back(Op::Approval {
                        call_id: request.call_id.clone(),
                        decision,
                    });
                }
                Step::Rejected(reason) => bail!("message rejected: {reason}"),
                Step::Ended(outcome) => {
                    all_completed &= outcome == Outcome::Completed;
                    break;
                }
                Step::Nothing | Step::Claimed(_) | Step::OtherTurnEnded => {}
            }
            send_control(agent.sender(), &mut control)?;
        }
        if !all_completed || terminations.received().is_some() {
            break;
        }
    }

    agent.sender().submit_wait(Op::Shutdown).await?;
    while let Some(event) = agent.next_event().await {
        printer.print(&event)?;
    }
    agent.shutdown().await?;
    if let Some(code) = terminations.received() {
        return Ok(ExitCode::from(code));
    }
    Ok(match (all_completed, interrupted) {
        (true, _) => ExitCode::SUCCESS,
        (false, true) => ExitCode::from(130),
        (false, false) => ExitCode::FAILURE,
    })
}

/// Sends the control ops the control lane has room for, in order. One step
/// may ask for more approvals than the lane holds
/// ([`keel::agent::submission::CONTROL_CAPACITY`]); the session takes the
/// decisions one at a time and records each (`approval_decided`), and the
/// event that brings is when the rest are tried again, so none is refused.
fn send_control(sender: &SubmissionSender, control: &mut VecDeque<Op>) -> anyhow::Result<()> {
    while let Some(op) = control.pop_front() {
        match sender.submit(op) {
            Ok(_) => {}
            Err(keel::Error::Busy(op)) => {
                control.push_front(*op);
                break;
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}
