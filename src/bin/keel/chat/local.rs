//! A chat on the local database: the session runs in this process.

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::Context;
use keel::agent::{Agent, BusyPolicy, SessionHandle, SubmitOptions, create_agent, fork_session, point_before_turn};
use keel::protocol::{EventMsg, Op, RecordedEvent, new_id};
use keel::store::CheckpointStore;

use crate::db::Hold;

use super::client_calls::waiting_calls;
use super::client_tools::specs;
use super::commands::Unrecoverable;
use super::switch::SwitchableModel;
use super::{BOT_ID, ChatArgs, Opened, Session};
use crate::session::{Opening, StoredSettings, agent_config, project_docs, session_instructions};

/// A session opened in this process.
pub(crate) struct LocalSession {
    agent: Agent,
    handle: SessionHandle,
    store: Arc<dyn CheckpointStore>,
    /// The session's model, which `/model` replaces.
    model: Arc<SwitchableModel>,
    /// Keeps a `keel serve` from starting on the database (and taking this
    /// session) while the chat runs.
    _hold: Option<Hold>,
}

/// Events read per page of a resumed session's history.
const HISTORY_PAGE: usize = 1000;

/// Opens (or creates) the session, reading its history first.
pub(super) async fn open(args: &ChatArgs) -> anyhow::Result<Opened> {
    // Everything that can be wrong with the input is checked before any
    // session work starts.
    let keel_config = args.model.config()?;
    let workspace = args.tools.workspace()?;
    // Resuming needs the database that has the session: none is created.
    let Opening {
        store,
        id,
        stored,
        model,
        spec,
        hold,
    } = Opening::prepare(
        &args.db,
        &args.model,
        &keel_config,
        args.session.as_deref(),
        args.new_session.as_deref(),
        false,
    )
    .await?;
    let mut history = Vec::new();
    if args.session.is_some() {
        loop {
            let after = history.last().map_or(0, |event: &RecordedEvent| event.sequence);
            let page = store.events_after(&id, after, HISTORY_PAGE).await?;
            if page.is_empty() {
                break;
            }
            history.extend(page);
        }
    }
    let instructions = session_instructions(
        &keel_config,
        BOT_ID,
        args.system.as_deref(),
        stored.instructions,
        args.session.is_some(),
        &args.tools,
    );
    let project_docs = project_docs(&keel_config, BOT_ID, &args.tools, &workspace);
    let model = Arc::new(SwitchableModel::new(model));
    let mut config = agent_config(
        id,
        Arc::clone(&store),
        Arc::clone(&model) as Arc<dyn keel::Model>,
        &keel_config,
        &args.tools,
        workspace,
    )
    .await;
    let fork_store = Arc::clone(&store);
    config.session_context.bot_id = BOT_ID.to_owned();
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
    // Declared at every opening: the chat that runs them is this one.
    config.client_tools = specs(&args.client_tools);
    config.client_tool_timeout = keel_config.tools.client_tool_timeout;
    let warnings = config.startup_warnings.len();
    let mut agent = create_agent(config).await?;

    // The opening's events come first, in one batch: `session_started`, the
    // warnings, then (for a turn the runtime left running) that turn's end.
    let mut startup = Vec::new();
    let first = agent.next_event().await.context("the session stopped as it opened")?;
    let pending_ids: HashSet<String> = match &first.msg {
        EventMsg::SessionStarted(started) => started.pending_approvals.iter().cloned().collect(),
        other => anyhow::bail!("the session opened with {} instead of session_started", other.kind()),
    };
    startup.push(first);
    for _ in 0..warnings {
        startup.push(agent.next_event().await.context("the session stopped as it opened")?);
    }
    // A turn waiting for approvals or client results goes on waiting; any
    // other the runtime left is closed as the session opens.
    let waiting = waiting_calls(&history);
    let unfinished = unfinished_turn(&history);
    if let Some(turn_id) = unfinished.filter(|_| pending_ids.is_empty() && waiting.is_empty()) {
        loop {
            let event = agent.next_event().await.context("the session stopped as it opened")?;
            let closes = event.msg.ends_turn() && event.msg.turn_id() == Some(turn_id.as_str());
            startup.push(event);
            if closes {
                break;
            }
        }
    }
    let pending = history
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ApprovalRequested(request) if pending_ids.contains(&request.call_id) => Some(request.clone()),
            _ => None,
        })
        .collect();
    let handle = agent.handle();
    Ok(Opened {
        session: Session::Local(Box::new(LocalSession {
            agent,
            handle,
            store: fork_store,
            model,
            _hold: hold,
        })),
        pending_calls: waiting,
        history,
        startup,
        pending,
    })
}

/// The turn the log leaves open (started, never completed or aborted).
fn unfinished_turn(history: &[RecordedEvent]) -> Option<String> {
    let mut open = None;
    for event in history {
        match &event.msg {
            EventMsg::TurnStarted(started) => open = Some(started.turn_id.clone()),
            msg if msg.ends_turn() && msg.turn_id() == open.as_deref() => open = None,
            _ => {}
        }
    }
    open
}

impl LocalSession {
    /// The session's id.
    pub(super) fn id(&self) -> &str {
        self.agent.session_id()
    }

    /// Submits a message durably, queued behind a running turn; its
    /// submission id.
    pub(super) async fn submit(&mut self, text: String) -> anyhow::Result<String> {
        let options = SubmitOptions {
            on_busy: BusyPolicy::Queue,
            ..SubmitOptions::default()
        };
        let accepted = self.handle.submit_durable(Op::UserInput { text }, options).await?;
        Ok(accepted.submission_id)
    }

    /// Queues an op that is neither a message nor a control (`compact`,
    /// `regenerate`), durably; returns its submission id.
    pub(super) async fn submit_op(&mut self, op: Op) -> anyhow::Result<String> {
        let accepted = self.handle.submit_durable(op, SubmitOptions::default()).await?;
        Ok(accepted.submission_id)
    }

    /// Forks the session just before turn `turn_id`; the fork's id.
    pub(super) async fn fork_before(&mut self, turn_id: &str) -> anyhow::Result<String> {
        let parent = self.agent.session_id().to_owned();
        let point = point_before_turn(self.store.as_ref(), &parent, turn_id).await?;
        let id = new_id();
        fork_session(self.store.as_ref(), &parent, point, &id).await?;
        Ok(id)
    }

    /// Sends an interrupt or an approval on the control lane.
    pub(super) async fn control(&mut self, op: Op) -> anyhow::Result<()> {
        match self.agent.sender().submit(op) {
            // A step may ask for more approvals than the lane holds: every
            // decision must arrive, and the session takes them one at a time.
            Err(keel::Error::Busy(op)) if matches!(*op, Op::Approval { .. }) => {
                self.agent.sender().submit_wait(*op).await?;
                Ok(())
            }
            // A full control lane: interrupts are already on their way.
            Ok(_) | Err(keel::Error::Busy(_)) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// The next event, once stored.
    pub(super) async fn next_event(&mut self) -> anyhow::Result<RecordedEvent> {
        self.agent
            .next_event()
            .await
            .ok_or_else(|| Unrecoverable("the session stopped before the turn ended".to_owned()).into())
    }

    /// Answers with `model` from the next model call on.
    pub(super) fn set_model(&self, model: Arc<dyn keel::Model>) {
        self.model.set(model);
    }

    /// Deletes session `id` (a fork this chat made and could not open).
    pub(super) async fn discard(&self, id: &str) -> anyhow::Result<()> {
        use keel::store::CheckpointStoreExt;
        self.store.delete_session(id).await?;
        Ok(())
    }

    /// Whether a turn runs or messages wait.
    pub(super) fn busy(&self) -> bool {
        self.handle.status().busy
    }

    /// Stops the session after what is queued.
    pub(super) async fn close(self) -> anyhow::Result<()> {
        let Self {
            agent, handle, _hold, ..
        } = self;
        drop(handle);
        agent.shutdown().await?;
        // Released only once the session is shut down.
        drop(_hold);
        Ok(())
    }
}
