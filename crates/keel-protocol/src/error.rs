//! The runtime's error type.

use crate::Op;
use crate::StoreError;

/// A result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong when talking to the runtime.
///
/// Messages are lower case without trailing punctuation, so they compose into
/// one-line reports such as `error: agent stopped: model event sink closed`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input was refused before anything was queued or stored (too large,
    /// empty, malformed). Retrying the same input fails the same way.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The session's submission queue is full. The op is handed back; retry
    /// once the running turn has taken some of the queue.
    #[error("agent busy: submission queue is full")]
    Busy(Box<Op>),
    /// The session is busy and the submission asked to be refused then
    /// (`on_busy: reject`); the refusal is in the log.
    #[error("session busy: {0}")]
    SessionBusy(String),
    /// An idempotency key already used for another request (another op or
    /// busy policy) on this session; nothing was queued. The text names the
    /// earlier submission.
    #[error("idempotency key reused: {0}")]
    KeyReused(String),
    /// The runtime (or the part of it the caller talks to) has stopped or
    /// cannot take more work right now; the text says which.
    #[error("agent stopped: {0}")]
    Stopped(String),
    /// The checkpoint store failed. The store's data is left as it was before
    /// the failed write.
    #[error("checkpoint store failed: {0}")]
    Checkpoint(#[from] StoreError),
    /// The model failed to produce a response.
    #[error("model failed: {0}")]
    Model(String),
    /// A model provider failed; the text names the provider, the HTTP status
    /// and the provider's message. Passing failures were already retried.
    #[error(transparent)]
    Provider(#[from] crate::ProviderError),
    /// The configuration is unusable (unknown model spec, unreadable script).
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl Error {
    /// Whether the model refused the request as too long for its context
    /// (a provider's documented error, or a model's message saying so).
    pub fn is_context_length_exceeded(&self) -> bool {
        match self {
            Self::Provider(error) => error.is_context_length_exceeded(),
            Self::Model(message) => crate::mentions_context_length(message),
            _ => false,
        }
    }

    /// A [`Error::Stopped`] with the given reason.
    pub fn stopped(reason: impl Into<String>) -> Self {
        Self::Stopped(reason.into())
    }
}
