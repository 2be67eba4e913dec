//! Keel: a durable agent runtime.
//!
//! Every session is a durable log. Clients submit [`Op`]s through a bounded
//! queue; the runtime drives turns (model steps, streamed text); every
//! [`Event`] it produces is written to the session's store *before* any client
//! sees it, under a gap-free per-session sequence.
//!
//! The crate is organised by concept:
//!
//! | module | owns |
//! |---|---|
//! | [`protocol`] | the wire types: ops in, events out, transcript items |
//! | [`store`] | the [`CheckpointStore`] trait and its SQLite implementation |
//! | [`model`] | the [`Model`] trait, its streaming sink, the scripted model |
//! | [`provider`] | models over HTTP: OpenAI Chat, OpenAI Responses, Anthropic |
//! | [`config`] | `keel.toml` and model specs |
//! | [`tools`] | the [`tools::Tool`] trait, tool sets, built-in tools |
//! | [`agent`] | submission queue, event recorder, turn loop, [`Agent`] |
//! | [`server`] | `keel serve`: the HTTP API, multi-session hosting, event fan-out |
//! | [`bench`] | the workloads behind `keel bench` and `cargo bench` |

pub mod agent;
pub mod bench;
pub mod chaos;
pub mod config;
mod error;
pub mod model;
pub mod protocol;
pub mod provider;
pub mod server;
pub mod store;
#[doc(hidden)]
pub mod testing;
pub mod tools;

pub use agent::{Agent, AgentConfig, create_agent};
pub use error::{Error, Result};
pub use model::Model;
pub use protocol::{Event, EventMsg, Op, RecordedEvent};
pub use store::CheckpointStore;
