//! Models: what produces the assistant's side of a turn.
//!
//! A [`Model`] gets the history and a [`ModelEventSink`], streams what it
//! generates into the sink as it goes, and returns the complete
//! [`ModelOutput`]. The sink is synchronous and never blocks: the runtime
//! coalesces and records what it receives, and applies back-pressure by not
//! polling the model's future while the recorder is congested.

mod script;
mod spec;

use std::sync::Arc;

pub use futures::future::BoxFuture;
pub use script::ScriptedModel;
pub use spec::model_from_spec;

use crate::Result;
use crate::protocol::TranscriptItem;

/// Something a model streams while it works.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelEvent {
    /// A piece of the assistant's text.
    TextDelta(String),
}

/// Where a model streams its [`ModelEvent`]s. Cloneable and synchronous.
///
/// Once the response has completed or been cancelled, every call fails with
/// `agent stopped: model event sink closed`; a model should stop then.
pub type ModelEventSink = Arc<dyn Fn(ModelEvent) -> Result<()> + Send + Sync>;

/// What a model is asked to respond to.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ModelRequest<'a> {
    /// The session.
    pub session_id: &'a str,
    /// The turn this step belongs to.
    pub turn_id: &'a str,
    /// The conversation so far, oldest first, including this turn's input.
    pub history: &'a [TranscriptItem],
    /// How many model calls the session made before this one; survives restarts.
    pub call_index: u64,
}

/// A model's complete response to one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelOutput {
    /// The assistant's message.
    pub text: String,
}

impl ModelOutput {
    /// A response that is just text.
    pub fn text(text: impl Into<String>) -> Self {
        Self { text: text.into() }
    }
}

/// A language model, or anything that answers like one.
pub trait Model: Send + Sync {
    /// Responds to `request`, streaming into `events` as output is produced.
    /// Dropping the returned future cancels the work.
    fn respond<'a>(&'a self, request: ModelRequest<'a>, events: ModelEventSink) -> BoxFuture<'a, Result<ModelOutput>>;

    /// A short name for logs and session listings (for example `script:a.jsonl`).
    fn name(&self) -> String {
        "model".to_owned()
    }
}
