//! Keel: a durable agent runtime.
//!
//! Every session is a durable log. Clients submit [`Op`]s through a bounded
//! queue; the runtime drives turns (model steps, streamed text, tool calls);
//! every [`Event`] it produces is written to the session's store *before* any
//! client sees it, under a gap-free per-session sequence.
//!
//! This crate is the front door: it re-exports the workspace's crates under
//! one name and holds the `keel` command. Embed the runtime with
//! `default-features = false` and you get the agent, the SQLite store, the
//! model providers and the tools, without an HTTP server, a terminal or
//! PostgreSQL:
//!
//! | module | crate | owns |
//! |---|---|---|
//! | [`protocol`] | `keel-protocol` | the wire types (ops in, events out, transcript items) and the errors |
//! | [`secrets`] | `keel-secrets` | the secrets registry and redaction |
//! | [`store`] | `keel-store` | the [`CheckpointStore`] contract, its SQLite backend and (feature `postgres`) its PostgreSQL one |
//! | [`model`] | `keel-model` | the [`Model`] trait, its streaming sink, the scripted model |
//! | [`provider`] | `keel-providers` | models over HTTP: OpenAI Chat, OpenAI Responses, Anthropic |
//! | [`tools`] | `keel-tools` | the tool trait, tool sets, workspace tools, the sandbox, MCP |
//! | [`agent`] | `keel-agent` | submission queue, event recorder, turn loop, [`Agent`] |
//! | [`config`] | `keel-config` | `keel.toml` and model specs |
//! | [`server`] | `keel-server` | `keel serve` (feature `server`): the HTTP API, hosting, fan-out |
//! | [`bench`](mod@bench), [`chaos`] | `keel-bench`, `keel-chaos` | `keel bench` and `keel chaos` (feature `cli`) |
//!
//! Features: `server` (the HTTP API), `postgres` (the PostgreSQL store) and
//! `cli` (the `keel` command, with both; the default).
//!
//! The facade holds no logic of its own: each layer's rules live in its
//! crate, and a layer's "never" is a dependency its crate does not have.
//! `examples/embed.rs` shows the library in use: a session on SQLite, a
//! tool call approved in code, events streamed as they are stored, and the
//! session resumed after a restart.

pub use keel_agent as agent;
#[cfg(feature = "cli")]
pub use keel_bench as bench;
#[cfg(feature = "cli")]
pub use keel_chaos as chaos;
pub use keel_config as config;
pub use keel_model as model;
pub use keel_protocol as protocol;
pub use keel_providers as provider;
pub use keel_secrets as secrets;
#[cfg(feature = "server")]
pub use keel_server as server;
pub use keel_store as store;
pub use keel_tools as tools;

pub use keel_agent::{Agent, AgentConfig, create_agent};
pub use keel_model::Model;
pub use keel_protocol::{Error, Event, EventMsg, Op, RecordedEvent, Result};
pub use keel_store::{CheckpointStore, CheckpointStoreExt};
