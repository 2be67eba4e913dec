//! The wire protocol: what goes into a session and what comes out.
//!
//! Plain serde types with a stable JSON shape: [`Op`]s in, [`Event`]s and
//! [`RecordedEvent`]s out, [`TranscriptItem`]s for the history, and the errors
//! every layer shares ([`Error`], [`StoreError`], [`ProviderError`]). The
//! CLI, the HTTP API, the store and the runtime all speak them.
//!
//! It must not know storage, async runtimes, models or HTTP: it depends on
//! serde, `thiserror` and `uuid` only, and holds no behaviour beyond
//! validating limits.

mod actor;
mod client_tool;
pub mod error;
mod event;
mod instructions;
mod name;
mod op;
mod provider_error;
mod store_error;
mod transcript;

pub use actor::{Actor, ActorKind, DEFAULT_TENANT};
#[cfg(feature = "openapi")]
pub use client_tool::described::{ClientToolParameters, JsonSchema};
pub use client_tool::{ClientToolRequestedEvent, ClientToolSpec, MAX_CLIENT_TOOL_OUTPUT_BYTES};
pub use event::*;
pub use instructions::*;
pub use name::{PATH_NAME_PATTERN, is_path_name};
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
