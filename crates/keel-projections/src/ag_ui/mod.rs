//! AG-UI 1.0: a session's log as the events of AG-UI runs, and
//! `RunAgentInput` as Keel ops.
//!
//! A thread is a session; a run is a Keel turn (its `runId` is the turn's
//! id), or, after the turn waited for the client, the rest of it. A turn
//! that waits for an approval ends its run with the interrupt outcome; one
//! that waits for a client (frontend) tool ends it as success naming the
//! pending call. The next run's `resume` entries (or tool messages) answer
//! them, and that run streams the rest of the turn.

mod events;
mod history;
mod input;
mod run;
mod thread;

#[cfg(test)]
mod tests;

pub use events::{AgUiEvent, FunctionCall, Interrupt, Message, RunOutcome, ToolCall};
pub use input::{InputError, InputMessage, Plan, ResumeEntry, ResumeStatus, RunAgentBody, RunInput, parse, plan, read};
pub use run::{RunProjection, RunStart};
pub use thread::{Thread, Wait, WaitKind};
