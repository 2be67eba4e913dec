//! The wire protocol: what goes into a session and what comes out.
//!
//! These are plain serde types with a stable JSON shape, spoken by the CLI
//! and (later) the HTTP server. Nothing here knows about storage, async
//! runtimes or models.
//!
//! **Architecture invariant:** this module depends on serde only; behaviour
//! lives elsewhere.

pub mod error;
mod event;
mod op;
mod provider_error;
mod store_error;
mod transcript;

pub use event::*;
pub use op::*;
pub use transcript::*;

pub use error::{Error, Result};
pub use provider_error::{ProviderError, mentions_context_length};
pub use store_error::StoreError;

/// Milliseconds since the Unix epoch, the protocol's timestamp unit.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

/// A fresh, time-ordered identifier for submissions, turns and sessions.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}
