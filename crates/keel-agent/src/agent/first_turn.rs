//! Reading a session's project instructions at its first turn: kept apart
//! from [`super::instructions`] (what is read, and how), so that module
//! stays free of the session it serves.

use keel_protocol::{Event, EventMsg, ProjectInstructions};

use super::instructions::{load_project_instructions, system_prompt};
use super::session::Session;

impl Session {
    /// At the session's first turn (when the host gave [`ProjectDocs`] and
    /// nothing was read yet), reads the project instructions, adds them to
    /// the system prompt and the checkpoint, and returns their
    /// `instructions_loaded` event, to be committed with the turn's start.
    /// Later turns, and a resumed session, read nothing: the recorded text
    /// stays.
    pub(super) async fn read_project_instructions(&mut self) -> Option<Event> {
        if self.checkpoint.project_instructions.is_some() {
            return None;
        }
        let docs = self.project_docs.clone()?;
        let workspace = self.workspace.clone();
        let loaded = tokio::task::spawn_blocking(move || load_project_instructions(&docs, &workspace))
            .await
            .unwrap_or_else(|error| ProjectInstructions {
                skipped: vec![format!("reading the project instructions failed: {error}")],
                ..ProjectInstructions::default()
            });
        tracing::info!(
            session_id = %self.session_id,
            files = loaded.sources.len(),
            bytes = loaded.text.len(),
            "project instructions read"
        );
        self.instructions = system_prompt(self.base_instructions.as_deref(), Some(&loaded));
        self.checkpoint.project_instructions = Some(loaded.clone());
        Some(Event {
            submission_id: None,
            msg: EventMsg::InstructionsLoaded(loaded),
        })
    }
}
