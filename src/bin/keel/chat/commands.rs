//! What each line typed at the prompt does: a message becomes a turn, a `/`
//! command its action; and what the chat does when one of them fails.

use anyhow::Context;
use keel::protocol::Op;

use super::line::{HELP, Line};
use super::{Chat, Finish, INTERRUPTED, open};
use crate::print_line;
use crate::terminal::terminal_safe;
use crate::turn::{Outcome, Until};

/// What the chat does after a line.
pub(super) enum Next {
    /// Prompts for the next line.
    Prompt,
    /// Leaves, as at the end of the input.
    Exit,
    /// Leaves with a failure (a turn failed in a script).
    Failed,
    /// Ends as said.
    Finish(Finish),
}

/// An error after which the chat cannot go on: the session's events no
/// longer arrive (the event stream is lost, the local session stopped).
#[derive(Debug, thiserror::Error)]
#[error("{0}; the chat cannot go on")]
pub(super) struct Unrecoverable(pub(super) String);

impl Chat {
    /// Does what `line` asks for.
    pub(super) async fn handle(&mut self, line: Line) -> anyhow::Result<Next> {
        let text = match line {
            Line::Empty => return Ok(Next::Prompt),
            Line::Exit => return Ok(Next::Exit),
            Line::Help => {
                print_line(HELP)?;
                return Ok(Next::Prompt);
            }
            Line::Session => {
                print_line(&terminal_safe(self.session.id()))?;
                return Ok(Next::Prompt);
            }
            Line::Compact => {
                let submission_id = self.session.submit_op(Op::Compact).await?;
                return self.settle(Until::Compaction(submission_id)).await;
            }
            Line::Retry => {
                let submission_id = self.session.submit_op(Op::Regenerate).await?;
                return self.settle(Until::Regeneration(submission_id)).await;
            }
            Line::Model(spec) => {
                self.change_model(spec).await?;
                return Ok(Next::Prompt);
            }
            Line::Edit(text) => {
                if text.is_empty() {
                    self.problem("/edit needs the new text: /edit TEXT")?;
                    return Ok(Next::Prompt);
                }
                // The fork starts where the session rests: what the last
                // turn left is settled first.
                if self.session.busy().await? && self.follow(Until::Idle).await? == Outcome::Leave {
                    return Ok(Next::Finish(Finish::Leave(self.leave_code())));
                }
                if !self.edit_into_fork().await? {
                    return Ok(Next::Prompt);
                }
                text
            }
            Line::Unknown(command) => {
                self.problem(&format!("unknown command {command}; /help lists the commands"))?;
                return Ok(Next::Prompt);
            }
            Line::Message(text) => text,
        };
        self.send(text).await
    }

    /// Follows a compaction or a regeneration to its end.
    async fn settle(&mut self, until: Until) -> anyhow::Result<Next> {
        self.render.waiting();
        Ok(match self.follow(until).await? {
            Outcome::Leave => Next::Finish(Finish::Leave(self.leave_code())),
            _ => Next::Prompt,
        })
    }

    /// Submits a message and follows its turn.
    async fn send(&mut self, text: String) -> anyhow::Result<Next> {
        if let Err(error) = (Op::UserInput { text: text.clone() }).validate() {
            self.problem(&format!("invalid message: {error}"))?;
            return Ok(Next::Prompt);
        }
        self.interrupts.forget();
        let submission_id = self.session.submit(text).await?;
        self.render.waiting();
        let outcome = self.follow(Until::TurnOf(submission_id)).await?;
        if let Some(code) = self.terminations.received() {
            return Ok(Next::Finish(if outcome == Outcome::Leave {
                Finish::Leave(code)
            } else {
                Finish::Code(code)
            }));
        }
        Ok(match outcome {
            Outcome::Completed => Next::Prompt,
            Outcome::Leave => Next::Finish(Finish::Leave(INTERRUPTED)),
            // At the terminal the user saw what happened and goes on.
            _ if self.interactive => Next::Prompt,
            Outcome::Interrupted => Next::Finish(Finish::Code(INTERRUPTED)),
            Outcome::Failed => Next::Failed,
        })
    }

    /// After a line failed: at the terminal, says what happened and goes on
    /// (the session is still there); in a script, or when the session's
    /// events no longer arrive, the chat ends with the error.
    pub(super) fn recover(&mut self, error: anyhow::Error) -> anyhow::Result<()> {
        if !self.interactive || error.downcast_ref::<Unrecoverable>().is_some() {
            return Err(error);
        }
        self.render.end_turn()?;
        self.render.problem(&format!("{error:#}"))
    }

    /// Forks the session just before its last turn and goes on in the fork,
    /// where the edited message is then sent; `false` (with the problem
    /// shown) when there is nothing to edit. A fork that cannot be opened
    /// is deleted again: the chat goes on where it was, with nothing left
    /// behind.
    async fn edit_into_fork(&mut self) -> anyhow::Result<bool> {
        let Some(turn_id) = self.last_turn.clone() else {
            self.problem("there is no message to edit yet")?;
            return Ok(false);
        };
        let parent = self.session.id().to_owned();
        let fork_id = self.session.fork_before(&turn_id).await?;
        let mut args = self.args.clone();
        args.session = Some(fork_id.clone());
        args.new_session = None;
        if args.server.is_some() {
            // A server's fork keeps the prompt of the session it came from.
            args.system = None;
        }
        // The fork is opened before the parent is let go: if it cannot be,
        // the chat goes on where it was.
        let opened = match open(&args).await {
            Ok(opened) => opened,
            Err(error) => {
                let removed = self.session.discard(&fork_id).await;
                let error = error.context(format!("cannot open the fork {fork_id}; still in session {parent}"));
                return Err(match removed {
                    Ok(()) => error,
                    Err(cleanup) => error.context(format!("and the fork could not be deleted: {cleanup:#}")),
                });
            }
        };
        let parent_session = std::mem::replace(&mut self.session, opened.session);
        parent_session.close().await?;
        self.args = args;
        self.last_turn = super::last_turn_started(opened.history.iter().chain(&opened.startup));
        self.render.note(&format!(
            "editing in a fork: session {fork_id} (session {parent} stays as it was)"
        ))?;
        Ok(true)
    }

    /// `/model SPEC`: the session answers with SPEC from its next turn on
    /// (on a server, its stored model changes; locally, the model of this
    /// chat's session).
    async fn change_model(&mut self, spec: String) -> anyhow::Result<()> {
        if spec.is_empty() {
            return self.problem("/model needs a model: /model SPEC (for example /model openai:gpt-4.1-mini)");
        }
        let note = if self.args.server.is_some() {
            self.session.set_model(&spec, None).await?;
            format!("model: {spec} (stored with the session)")
        } else {
            let config = self.args.model.config()?;
            let model = config
                .model(&spec)
                .with_context(|| format!("cannot use the model '{spec}'"))?;
            self.session.set_model(&spec, Some(model)).await?;
            // A later `keel chat --session` of this chat goes on with it.
            self.args.model.model = Some(spec.clone());
            format!("model: {spec} (for this chat; resume with --model {spec} to keep it)")
        };
        self.render.note(&terminal_safe(&note))
    }
}
