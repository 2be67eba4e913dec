//! Keel's agent runtime: one durable session per [`Agent`].
//!
//! [`create_agent`] opens (or resumes) a session on a store and starts its
//! task; ops go in through [`Agent::sender`] (a bounded queue plus a small
//! control lane for interrupts, steers and approvals) and recorded events come
//! out of [`Agent::next_event`], each one committed to the store before it is
//! delivered. Inside: the submission queue, the event recorder
//! (persist-then-deliver with group commit and back-pressure), the turn engine
//! (model steps, streaming, tool calls and approvals, compaction), crash
//! recovery when a session is opened, and [`SessionHandle`] for hosts.
//!
//! It must not know HTTP, `keel.toml`, terminals or which provider a model
//! talks to: it has no dependency on `keel-server`, `keel-config` or
//! `keel-providers`, and gets a [`Model`], a [`CheckpointStore`] and a tool
//! set from whoever embeds it.

mod agent;
pub mod telemetry;

pub use agent::*;
