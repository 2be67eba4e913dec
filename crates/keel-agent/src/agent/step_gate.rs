//! A host's say before each model step: a turn whose budget is spent stops
//! there, closed as `turn_aborted` with reason `budget_exhausted`, instead
//! of calling the model once more.
//!
//! The runtime knows nothing of budgets: the host (the server) installs a
//! [`StepGate`] that knows what the session may still spend. The gate is
//! asked after everything the turn recorded so far is committed, so usage
//! counted by the store includes the step before.

use keel_model::BoxFuture;

use super::session::Session;
use keel_protocol::Result;

/// What a [`StepGate`] says about the next model step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepVerdict {
    /// The step may run.
    Go,
    /// The turn stops before the step; the text says why (the message of
    /// its `turn_aborted`).
    BudgetExhausted(String),
}

/// Asked before each model step of a session's turns (see
/// [`crate::AgentConfig::step_gate`]).
pub trait StepGate: Send + Sync {
    /// Whether the gate has anything to say about `session_id` now: cheap
    /// and synchronous, so a session it does not watch never waits for
    /// its commits before a step.
    fn watches(&self, session_id: &str) -> bool {
        let _ = session_id;
        true
    }

    /// Whether the next model step of `session_id` may run.
    fn before_step<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, StepVerdict>;
}

impl Session {
    /// The gate's verdict on the next step ([`StepVerdict::Go`] without a
    /// gate). What the turn recorded so far is committed first, so the
    /// gate sees the last step's usage.
    pub(super) async fn step_verdict(&self) -> Result<StepVerdict> {
        let Some(gate) = self.step_gate.as_ref().filter(|gate| gate.watches(&self.session_id)) else {
            return Ok(StepVerdict::Go);
        };
        self.recorder.flush().await?;
        Ok(gate.before_step(&self.session_id).await)
    }
}
