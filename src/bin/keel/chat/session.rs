//! The session a chat talks to, on the local database or on a server: one
//! interface over both.

use keel::protocol::{Op, RecordedEvent};

use super::{local, remote};

/// Where the session lives.
pub(crate) enum Session {
    /// On the local database, run by this process.
    Local(Box<local::LocalSession>),
    /// On a server, over HTTP.
    Remote(remote::RemoteSession),
}

impl Session {
    /// The session's id.
    pub(super) fn id(&self) -> &str {
        match self {
            Session::Local(session) => session.id(),
            Session::Remote(session) => session.id(),
        }
    }

    /// Submits a message durably; returns its submission id.
    pub(super) async fn submit(&mut self, text: String) -> anyhow::Result<String> {
        match self {
            Session::Local(session) => session.submit(text).await,
            Session::Remote(session) => session.submit(text).await,
        }
    }

    /// Queues an op that is neither a message nor a control; returns its
    /// submission id.
    pub(super) async fn submit_op(&mut self, op: Op) -> anyhow::Result<String> {
        match self {
            Session::Local(session) => session.submit_op(op).await,
            Session::Remote(session) => session.submit_op(op).await,
        }
    }

    /// Forks the session just before turn `turn_id`; the fork's id.
    pub(super) async fn fork_before(&mut self, turn_id: &str) -> anyhow::Result<String> {
        match self {
            Session::Local(session) => session.fork_before(turn_id).await,
            Session::Remote(session) => session.fork_before(turn_id).await,
        }
    }

    /// Submits a control op (an interrupt or an approval).
    pub(super) async fn control(&mut self, op: Op) -> anyhow::Result<()> {
        match self {
            Session::Local(session) => session.control(op).await,
            Session::Remote(session) => session.control(op).await,
        }
    }

    /// The next event, in sequence; an error when the session is gone.
    pub(super) async fn next_event(&mut self) -> anyhow::Result<RecordedEvent> {
        match self {
            Session::Local(session) => session.next_event().await,
            Session::Remote(session) => session.next_event().await,
        }
    }

    /// Whether a turn runs or messages wait.
    pub(super) async fn busy(&mut self) -> anyhow::Result<bool> {
        match self {
            Session::Local(session) => Ok(session.busy()),
            Session::Remote(session) => session.busy().await,
        }
    }

    /// Makes `spec` the session's model: on a server through `PATCH`;
    /// locally `model`, built from it.
    pub(super) async fn set_model(
        &mut self,
        spec: &str,
        model: Option<std::sync::Arc<dyn keel::Model>>,
    ) -> anyhow::Result<()> {
        match self {
            Session::Local(session) => {
                let model = model.ok_or_else(|| anyhow::anyhow!("no model built for '{spec}'"))?;
                session.set_model(model);
                Ok(())
            }
            Session::Remote(session) => session.set_model(spec).await,
        }
    }

    /// Deletes session `id`, a fork made by this chat that could not be
    /// opened, so that none is left behind.
    pub(super) async fn discard(&mut self, id: &str) -> anyhow::Result<()> {
        match self {
            Session::Local(session) => session.discard(id).await,
            Session::Remote(session) => session.discard(id).await,
        }
    }

    /// Lets go of the session: a local one is shut down after what is
    /// queued; a remote one stays on its server.
    pub(super) async fn close(self) -> anyhow::Result<()> {
        match self {
            Session::Local(session) => session.close().await,
            Session::Remote(session) => {
                session.close();
                Ok(())
            }
        }
    }
}
