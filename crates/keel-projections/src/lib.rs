//! A session's stored log, seen through the protocols front ends already
//! speak: the AI SDK's UI message stream ([`ai_sdk`]) and AG-UI 1.0
//! ([`ag_ui`]).
//!
//! Each projection is a pure, incremental function from
//! [`keel_protocol::RecordedEvent`]s to the protocol's frames: it never
//! reads anything but the log, so a stream resumed on another node, or
//! after a crash, is exactly the one that was cut. Requests in those
//! protocols' shapes are turned into Keel [`keel_protocol::Op`]s here too.
//! It must not know HTTP, the store or the runtime: the server feeds it
//! events and writes its frames.

pub mod ag_ui;
pub mod ai_sdk;
