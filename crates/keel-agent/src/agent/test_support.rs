//! Helpers for the agent's unit tests (the seed reaches them through `use super::*`).

use std::path::Path;
pub(crate) use std::sync::{Arc, Mutex};

use super::AgentConfig;
use keel_model::{Model, ModelOutput};
use keel_protocol::Op;
use keel_store::{CheckpointStore, SessionContext};

/// A user message op.
pub(crate) fn user_op(text: impl Into<String>) -> Op {
    Op::UserInput { text: text.into() }
}

/// A model output that is just `text`.
pub(crate) fn scripted_message(text: &str) -> ModelOutput {
    ModelOutput::text(text)
}

/// A configuration for `session_id` of `bot_id`, working in `workspace`.
pub(crate) fn config_with_model(
    workspace: &Path,
    store: Arc<dyn CheckpointStore>,
    session_id: &str,
    bot_id: &str,
    model: Arc<dyn Model>,
) -> AgentConfig {
    let mut config = AgentConfig::new(session_id, store, model);
    config.workspace = workspace.to_path_buf();
    config.session_context = SessionContext {
        bot_id: bot_id.to_owned(),
        ..SessionContext::default()
    };
    config
}
