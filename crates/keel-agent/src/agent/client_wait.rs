//! The calls of a step to tools the client executes.
//!
//! The server never runs them. Each is recorded as `tool_call_started` and
//! `client_tool_requested` (with its deadline) in one commit with the turn's
//! state, so the wait survives a restart and a node take-over; the turn
//! then waits on the control lane, like an approval, until every call has
//! its result: the client's (`client_tool_result`), a timeout's, or an
//! interrupt's. Each result is recorded as `tool_call_completed` with the
//! history item it adds.

use std::time::Duration;

use super::control::{During, Wake};
use super::session::{Session, Turn};
use keel_model::{ToolCall, ToolSpec};
use keel_protocol::Result;
use keel_protocol::{ClientToolRequestedEvent, EventMsg, Submission, ToolCallStartedEvent, now_ms};
use keel_store::TurnExecution;
use keel_tools::ToolOutcome;

/// What a waiting call is answered when an interrupt ends the wait.
const INTERRUPTED_WAIT: &str = "interrupted: the turn was interrupted before the client answered this call";

/// What ended one wait on the control lane.
enum ClientWake {
    /// A submission the waiting caller must act on, or none (settled).
    Lane(Box<Option<Wake>>),
    /// The earliest deadline passed.
    Expired,
}

impl Session {
    /// Whether the model's call of `name` is one the client executes: a
    /// declared client tool that no tool of the server shadows.
    pub(super) fn is_client_tool(&self, name: &str) -> bool {
        self.tools.get(name).is_none() && self.client_tools.iter().any(|tool| tool.name == name)
    }

    /// The tools offered to the model: the server's, then the client's
    /// (a name the server's tools took meanwhile, an MCP tool that appeared,
    /// stays the server's).
    pub(super) fn offered_tools(&self) -> Vec<ToolSpec> {
        let mut specs = self.tools.specs();
        specs.extend(
            self.client_tools
                .iter()
                .filter(|tool| self.tools.get(&tool.name).is_none())
                .map(|tool| ToolSpec {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters: tool.parameters.clone(),
                }),
        );
        specs
    }

    /// Requests the calls of `calls` (the step's client calls) not
    /// requested yet (a resumed turn has requested them), and waits until
    /// every one has its result. Returns the interrupt that ended the wait,
    /// if one did; every call still waiting then has an error result.
    pub(super) async fn await_client(&mut self, turn: &mut Turn, calls: &[&ToolCall]) -> Result<Option<Submission>> {
        self.request_client_calls(turn, calls).await?;
        self.status.set_awaiting_client(&turn.execution.awaiting_client);
        while !turn.execution.awaiting_client.is_empty() {
            let deadline = turn.execution.next_client_deadline_ms();
            let woken = {
                let mut lane = self.control_lane();
                let during = During::ClientTool {
                    turn_id: turn.id(),
                    calls: &turn.execution.awaiting_client,
                };
                tokio::select! {
                    biased;
                    submission = lane.recv() => ClientWake::Lane(Box::new(lane.settle(submission, during).await?)),
                    () = sleep_until_ms(deadline.unwrap_or(u64::MAX)), if deadline.is_some() => ClientWake::Expired,
                }
            };
            let woken = match woken {
                ClientWake::Lane(wake) => *wake,
                ClientWake::Expired => {
                    self.expire_client_calls(turn, calls).await?;
                    continue;
                }
            };
            match woken {
                None | Some(Wake::Decided { .. }) => {}
                Some(Wake::Answered {
                    submission,
                    call_id,
                    output,
                    is_error,
                }) => {
                    let outcome = ToolOutcome { output, is_error };
                    self.answer_client_call(turn, calls, &call_id, outcome, Some(submission.id))
                        .await?;
                }
                Some(Wake::Interrupted(by)) => {
                    for call_id in turn.execution.awaiting_client.clone() {
                        let outcome = ToolOutcome::error(INTERRUPTED_WAIT);
                        self.answer_client_call(turn, calls, &call_id, outcome, None).await?;
                    }
                    return Ok(Some(by));
                }
            }
        }
        Ok(None)
    }

    /// Records `tool_call_started` and `client_tool_requested` for each of
    /// `calls` not requested or answered yet, with the turn's state, in one
    /// commit: durable before the client is asked.
    async fn request_client_calls(&mut self, turn: &mut Turn, calls: &[&ToolCall]) -> Result<()> {
        let answered = super::recovery::answered_calls(&self.transcript);
        let fresh: Vec<&ToolCall> = calls
            .iter()
            .copied()
            .filter(|call| !answered.contains(call.call_id.as_str()))
            .filter(|call| !turn.execution.awaiting_client.contains(&call.call_id))
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let expires_at_ms = self
            .client_tool_timeout
            .map(|timeout| now.saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)));
        let mut events = Vec::with_capacity(fresh.len() * 2);
        for call in fresh {
            record_requested(&mut turn.execution, call, expires_at_ms);
            events.push(turn.event(EventMsg::ToolCallStarted(ToolCallStartedEvent {
                turn_id: turn.id().to_owned(),
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            })));
            events.push(turn.event(EventMsg::ClientToolRequested(ClientToolRequestedEvent {
                turn_id: turn.id().to_owned(),
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                expires_at_ms,
            })));
        }
        // Shown as waiting once the request is committed, never before. A
        // result the client sends as soon as it sees the request finds the
        // call waiting in the stored summary, committed with the request,
        // and waits on the control lane until the task takes it.
        let write = self.checkpoint_write(Vec::new(), Some(&turn.execution));
        self.recorder.commit(events, Some(write)).await?;
        self.status.set_awaiting_client(&turn.execution.awaiting_client);
        Ok(())
    }

    /// Answers every waiting call whose deadline passed with an error.
    async fn expire_client_calls(&mut self, turn: &mut Turn, calls: &[&ToolCall]) -> Result<()> {
        let now = now_ms();
        let expired: Vec<String> = turn
            .execution
            .awaiting_client
            .iter()
            .filter(|call_id| {
                turn.execution
                    .client_deadlines
                    .get(*call_id)
                    .is_some_and(|at| *at <= now)
            })
            .cloned()
            .collect();
        for call_id in expired {
            let message = match self.client_tool_timeout {
                Some(timeout) => format!("the client did not answer within {}", spoken(timeout)),
                None => "the client did not answer before the call's deadline".to_owned(),
            };
            tracing::info!(session_id = %self.session_id, %call_id, "a client tool call timed out");
            self.answer_client_call(turn, calls, &call_id, ToolOutcome::error(message), None)
                .await?;
        }
        Ok(())
    }

    /// Records the result of the waiting call `call_id` (`submission_id`:
    /// the op that brought it; the turn's otherwise) with the turn's state.
    async fn answer_client_call(
        &mut self,
        turn: &mut Turn,
        calls: &[&ToolCall],
        call_id: &str,
        outcome: ToolOutcome,
        submission_id: Option<String>,
    ) -> Result<()> {
        turn.execution.awaiting_client.retain(|waiting| waiting != call_id);
        turn.execution.client_deadlines.remove(call_id);
        if let Some(call) = calls.iter().find(|call| call.call_id == call_id) {
            self.record_result_of(turn, call, outcome, submission_id).await?;
            // No longer shown as waiting once the result is in the log.
            self.recorder.flush().await?;
        }
        self.status.set_awaiting_client(&turn.execution.awaiting_client);
        Ok(())
    }
}

/// Notes in the turn's state that `call` is started and waits for the client.
fn record_requested(execution: &mut TurnExecution, call: &ToolCall, expires_at_ms: Option<u64>) {
    execution
        .started_calls
        .get_or_insert_with(Vec::new)
        .push(call.call_id.clone());
    execution.awaiting_client.push(call.call_id.clone());
    if let Some(at) = expires_at_ms {
        execution.client_deadlines.insert(call.call_id.clone(), at);
    }
}

/// A timeout as the model is told it: whole seconds, or milliseconds
/// under one second.
fn spoken(timeout: Duration) -> String {
    match timeout.as_secs() {
        0 => format!("{} ms", timeout.as_millis()),
        secs => format!("{secs} s"),
    }
}

/// Sleeps until the wall-clock time `at_ms` (milliseconds since the Unix
/// epoch): deadlines are stored as such, to hold across restarts and nodes.
async fn sleep_until_ms(at_ms: u64) {
    let now = now_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}
