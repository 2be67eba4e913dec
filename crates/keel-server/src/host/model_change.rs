//! Changing a stored session's settings (`PATCH /v1/sessions/{id}` with
//! `model` or `client_tools`): between turns only, with the session
//! unloaded, so that the next load builds the new model and tools and no
//! runtime writes a checkpoint with the old settings over the new ones.

use super::Host;
use super::pump::CloseMode;
use crate::error::ApiError;
use crate::settings::SessionSettings;
use keel_protocol::{ClientToolSpec, Event, EventMsg, ModelChangedEvent};
use keel_store::{AppendBatch, CheckpointStoreExt, CheckpointWrite, EncodedEvent, SessionSummary};

/// A change of a session's settings, already checked.
pub(crate) enum SettingsChange {
    /// A new model spec, recorded as `model_changed`.
    Model(String),
    /// A new list of client tools, replacing the session's.
    ClientTools(Vec<ClientToolSpec>),
}

impl SettingsChange {
    /// Applies the change to `settings`; the event recording it, if any.
    fn apply(&self, settings: &mut SessionSettings, from: Option<String>) -> Option<Event> {
        match self {
            Self::Model(spec) => {
                settings.model = Some(spec.clone());
                Some(Event {
                    submission_id: None,
                    msg: EventMsg::ModelChanged(ModelChangedEvent {
                        previous: from,
                        model: spec.clone(),
                    }),
                })
            }
            Self::ClientTools(tools) => {
                settings.client_tools = tools.clone();
                None
            }
        }
    }

    /// Whether the session has this already.
    fn is_had(&self, settings: &SessionSettings, from: Option<&str>) -> bool {
        match self {
            Self::Model(spec) => from == Some(spec.as_str()) && settings.model.is_some(),
            Self::ClientTools(tools) => settings.client_tools == *tools,
        }
    }
}

impl Host {
    /// Stores `spec` (already checked) as the model of `session_id` and
    /// records a `model_changed` event; nothing when it is the model the
    /// session has. `404` for an unknown session, `409 session_busy` while
    /// a turn is in flight or submissions wait (the turn would go on with
    /// another model than it started with), `409 session_elsewhere` when
    /// another node runs it.
    pub(crate) async fn change_model(&self, session_id: &str, spec: &str) -> Result<(), ApiError> {
        self.change_settings(session_id, SettingsChange::Model(spec.to_owned()))
            .await
    }

    /// Makes `change` to the stored settings of `session_id`, under the
    /// rules of [`Self::change_model`] (a turn goes on with the tools it
    /// started with, as with its model).
    pub(crate) async fn change_settings(&self, session_id: &str, change: SettingsChange) -> Result<(), ApiError> {
        let slot = self.open_slot(session_id)?;
        let result = async {
            let mut live = self.lock_open(&slot).await?;
            if let Some(session) = live.as_ref().filter(|session| !session.stopped()) {
                let status = session.handle.status();
                if status.busy
                    || status.queued > 0
                    || !status.awaiting_approval.is_empty()
                    || !status.awaiting_client.is_empty()
                {
                    return Err(busy(session_id));
                }
            }
            let summary = self
                .store
                .session_summary(session_id)
                .await?
                .ok_or_else(|| ApiError::unknown_session(session_id))?;
            if in_flight(&summary) {
                return Err(busy(session_id));
            }
            let settings = SessionSettings::stored(session_id, &summary.context)?;
            let from = self.factory.model_spec(&settings);
            if change.is_had(&settings, from.as_deref()) {
                return Ok(());
            }
            // The runtime goes first: it would write its settings back.
            if let Some(session) = live.take() {
                self.unload(session, Some(CloseMode::Graceful)).await;
            }
            let claimed = self.claim(session_id, &summary.context.tenant).await?;
            let written = self.write_settings(session_id, claimed.as_ref(), from, &change).await;
            if let Some(lease) = &claimed {
                self.release(lease).await;
            }
            if let Some(last_sequence) = written? {
                self.hubs.poke(session_id, last_sequence, None);
            }
            Ok(())
        }
        .await;
        self.forget_slot(session_id, slot);
        result
    }

    /// Writes the new settings and the event recording them (if any) in
    /// one batch, under the session's lease (this node's claim, or one
    /// taken here); returns the event's sequence.
    async fn write_settings(
        &self,
        session_id: &str,
        claimed: Option<&keel_store::Lease>,
        from: Option<String>,
        change: &SettingsChange,
    ) -> Result<Option<u64>, ApiError> {
        let lease = match claimed {
            Some(lease) => lease.epoch,
            None => self.store.acquire(session_id).await?,
        };
        let state = self
            .store
            .load(session_id)
            .await?
            .ok_or_else(|| ApiError::unknown_session(session_id))?;
        if state.execution.is_some() || !state.queued.is_empty() {
            return Err(busy(session_id));
        }
        let mut checkpoint = state.checkpoint;
        let mut settings = SessionSettings::stored(session_id, &checkpoint.session_context)?;
        let event = change.apply(&mut settings, from);
        checkpoint.session_context.settings = Some(settings.to_value());
        let batch = AppendBatch {
            events: event.iter().map(EncodedEvent::encode).collect::<Result<_, _>>()?,
            checkpoint: Some(CheckpointWrite::new(&checkpoint, &[], None)),
            lease: Some(lease),
        };
        let receipt = self.store.append(session_id, batch).await?;
        match change {
            SettingsChange::Model(spec) => tracing::info!(session_id, model = %spec, "session model changed"),
            SettingsChange::ClientTools(tools) => {
                tracing::info!(session_id, client_tools = tools.len(), "session client tools changed");
            }
        }
        Ok(event.map(|_| receipt.first_sequence))
    }
}

/// Whether the stored session has a turn in flight or one waiting.
fn in_flight(summary: &SessionSummary) -> bool {
    summary.running_turn_id.is_some() || !summary.awaiting_approval.is_empty()
}

/// `409 session_busy` for a settings change in the middle of a turn.
fn busy(session_id: &str) -> ApiError {
    ApiError::SessionBusy(format!(
        "session '{session_id}' has a turn in flight (running, or waiting for an approval or a client tool's \
         result) or submissions waiting; its model and client tools can be changed once they are done (a turn \
         is answered with one model and one set of tools from start to end)"
    ))
}
