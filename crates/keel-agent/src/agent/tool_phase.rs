//! The tool calls of one model step: policies, approvals, execution.
//!
//! Each call is first judged: it runs (policy `auto`, or the tool was
//! approved for the session), is refused (policy `deny`), or waits for the
//! user (policy `ask`). Calls that wait are recorded as `approval_requested`
//! together with the turn's state, so the wait survives a restart; the turn
//! then waits on the control lane for `approval` ops (an interrupt ends it).
//! Then the calls run: all at once when every one of them is parallel safe,
//! otherwise in order. Each call is durable (`tool_call_started`) before it
//! runs; its result is recorded with the history it joins, in the order of
//! the calls, whatever order they finish in. While they run, the progress
//! they report is recorded as `tool_call_progress` events. Calls of tools
//! the client executes wait for the client after the approvals are decided
//! and before the server's calls run (see `client_wait`); their results
//! join the history as they arrive.

use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};

use super::control::{ControlLane, During, Wake};
use super::recorder::EventRecorder;
use super::session::{Session, Turn};
use keel_model::ToolCall;
use keel_protocol::{
    ApprovalDecidedEvent, ApprovalDecision, ApprovalRequestedEvent, Event, EventMsg, Submission,
    ToolCallCompletedEvent, ToolCallProgressEvent, ToolCallStartedEvent, ToolsChangedEvent, TranscriptItem,
};
use keel_protocol::{Error, Result};
use keel_secrets::redact_owned;
use keel_tools::{ApprovalPolicy, ProgressBoard, ProgressSink, ToolContext, ToolOutcome, ToolProgress};

/// The least time between two recordings of progress: a server reporting
/// every millisecond must not fill the log. What arrives meanwhile is
/// coalesced to each call's latest report.
const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// The progress reports of a step's calls, and when they may next be recorded.
struct ProgressFeed {
    board: std::sync::Arc<ProgressBoard>,
    next_at: tokio::time::Instant,
}

impl ProgressFeed {
    /// Resolves when reports may be recorded and there are some.
    async fn ready(&self) {
        tokio::time::sleep_until(self.next_at).await;
        self.board.changed().await;
    }
}

/// What the user is told when they denied a call (or interrupted the wait).
const DENIED_BY_USER: &str = "denied by user: the user did not allow this tool call";

/// How the tool calls of a step ended.
pub(super) enum ToolsEnd {
    /// Every call has its result; the turn goes on.
    Done,
    /// An interrupt stopped them (every call still got a result).
    Interrupted(Submission),
}

/// What is to happen to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Run,
    Refuse(String),
    Ask,
    /// The client executes it: it waits for the client's result.
    Client,
}

impl Session {
    /// Takes in the changes of the session's tools (an MCP server's
    /// `tools/list_changed`) before a model step, and records them.
    pub(super) async fn refresh_tools(&mut self, turn: &Turn) -> Result<()> {
        let before = self.tools.names();
        if !self.tools.refresh().await {
            return Ok(());
        }
        let tools = self.tools.names();
        if tools == before {
            return Ok(());
        }
        let added = tools.iter().filter(|name| !before.contains(name)).cloned().collect();
        let removed = before.iter().filter(|name| !tools.contains(name)).cloned().collect();
        let changed = turn.event(EventMsg::ToolsChanged(ToolsChangedEvent {
            turn_id: turn.id().to_owned(),
            tools,
            added,
            removed,
        }));
        self.recorder.append(vec![changed], None).await
    }

    /// Decides, runs and records the tool calls of the turn's current step.
    pub(super) async fn tool_phase(&mut self, turn: &mut Turn, calls: &[ToolCall]) -> Result<ToolsEnd> {
        let mut verdicts: Vec<Verdict> = calls.iter().map(|call| self.verdict(turn, call)).collect();
        if verdicts.contains(&Verdict::Ask) {
            if let Some(interrupt) = self.await_approvals(turn, calls, &verdicts).await? {
                let interrupted = calls
                    .iter()
                    .zip(&verdicts)
                    .map(|(call, verdict)| match verdict {
                        Verdict::Ask => (call, ToolOutcome::error(DENIED_BY_USER)),
                        _ => (call, ToolOutcome::error("not run: the turn was interrupted")),
                    })
                    .collect::<Vec<_>>();
                for (call, outcome) in interrupted {
                    self.record_started(turn, call).await?;
                    self.record_result(turn, call, outcome).await?;
                }
                return Ok(ToolsEnd::Interrupted(interrupt));
            }
            verdicts = calls.iter().map(|call| self.verdict(turn, call)).collect();
        }
        let client: Vec<&ToolCall> = calls
            .iter()
            .zip(&verdicts)
            .filter(|(_, verdict)| **verdict == Verdict::Client)
            .map(|(call, _)| call)
            .collect();
        if !client.is_empty()
            && let Some(interrupt) = self.await_client(turn, &client).await?
        {
            self.answer_not_run(turn, calls).await?;
            return Ok(ToolsEnd::Interrupted(interrupt));
        }
        self.run_calls(turn, calls, &verdicts).await
    }

    /// Judges one call from the session's rules and the decisions made.
    fn verdict(&self, turn: &Turn, call: &ToolCall) -> Verdict {
        if self.is_client_tool(&call.name) {
            return Verdict::Client;
        }
        match turn.execution.decisions.get(&call.call_id) {
            Some(ApprovalDecision::Deny) => return Verdict::Refuse(DENIED_BY_USER.to_owned()),
            Some(_) => return Verdict::Run,
            None => {}
        }
        // An unknown tool runs, to be answered "unknown tool" by the tool set.
        let Some(tool) = self.tools.get(&call.name) else {
            return Verdict::Run;
        };
        if self.checkpoint.approved_tools.contains(&call.name) {
            return Verdict::Run;
        }
        match self.approvals.policy(&call.name, tool.read_only()) {
            ApprovalPolicy::Auto => Verdict::Run,
            ApprovalPolicy::Ask => Verdict::Ask,
            ApprovalPolicy::Deny => Verdict::Refuse(format!(
                "denied by policy: the tool '{}' is not allowed in this session",
                call.name
            )),
        }
    }

    /// Records the approval requests not recorded yet (a resumed turn has
    /// them already) and waits until every one is decided. Returns the
    /// interrupt that ended the wait, if one did.
    async fn await_approvals(
        &mut self,
        turn: &mut Turn,
        calls: &[ToolCall],
        verdicts: &[Verdict],
    ) -> Result<Option<Submission>> {
        let asking: Vec<&ToolCall> = calls
            .iter()
            .zip(verdicts)
            .filter(|(_, verdict)| **verdict == Verdict::Ask)
            .map(|(call, _)| call)
            .collect();
        let requests: Vec<Event> = asking
            .iter()
            .filter(|call| !turn.execution.awaiting_approval.contains(&call.call_id))
            .map(|call| {
                turn.event(EventMsg::ApprovalRequested(ApprovalRequestedEvent {
                    turn_id: turn.id().to_owned(),
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                }))
            })
            .collect();
        turn.execution.awaiting_approval = asking.iter().map(|call| call.call_id.clone()).collect();
        if !requests.is_empty() {
            // Durable before anyone is asked: a restart finds the turn waiting.
            let write = self.checkpoint_write(Vec::new(), Some(&turn.execution));
            self.recorder.commit(requests, Some(write)).await?;
            let now = keel_protocol::now_ms();
            for call in &asking {
                self.approval_asked.entry(call.call_id.clone()).or_insert(now);
            }
        }
        // Shown once the requests are in the log, never before: a reader of
        // the session's status finds them there.
        self.status.set_awaiting_approval(&turn.execution.awaiting_approval);
        while !turn.execution.awaiting_approval.is_empty() {
            let during = During::Approval {
                turn_id: turn.id(),
                calls: &turn.execution.awaiting_approval,
            };
            match self.control_lane().wake(during).await? {
                Wake::Decided {
                    submission,
                    call_id,
                    decision,
                } => self.decide(turn, calls, submission, call_id, decision).await?,
                // Client calls are requested once the approvals are decided.
                Wake::Answered { .. } => {}
                Wake::Interrupted(submission) => {
                    self.status.set_awaiting_approval(&[]);
                    return Ok(Some(submission));
                }
            }
        }
        Ok(None)
    }

    /// Takes in the user's decision on a call waiting for approval, and
    /// records it with the turn's state.
    async fn decide(
        &mut self,
        turn: &mut Turn,
        calls: &[ToolCall],
        submission: Submission,
        call_id: String,
        decision: ApprovalDecision,
    ) -> Result<()> {
        turn.execution.awaiting_approval.retain(|waiting| *waiting != call_id);
        turn.execution.decisions.insert(call_id.clone(), decision);
        if decision == ApprovalDecision::ApproveForSession
            && let Some(call) = calls.iter().find(|call| call.call_id == call_id)
        {
            self.checkpoint.approved_tools.insert(call.name.clone());
        }
        let decided = Event {
            submission_id: Some(submission.id),
            msg: EventMsg::ApprovalDecided(ApprovalDecidedEvent {
                turn_id: turn.id().to_owned(),
                call_id,
                decision,
                decided_by: submission.submitted_by,
            }),
        };
        let write = self.checkpoint_write(Vec::new(), Some(&turn.execution));
        // Committed before the status stops showing the call as waiting, so
        // no read sees it decided before the log does (decisions are a
        // person's pace: the wait costs nothing).
        self.recorder.commit(vec![decided], Some(write)).await?;
        self.status.set_awaiting_approval(&turn.execution.awaiting_approval);
        Ok(())
    }

    /// Runs the calls judged `Run` (refused ones get their refusal as the
    /// result), watching for interrupts, and records every result in order.
    async fn run_calls(&mut self, turn: &mut Turn, calls: &[ToolCall], verdicts: &[Verdict]) -> Result<ToolsEnd> {
        let context = ToolContext {
            session_id: self.session_id.clone(),
            workspace: self.workspace.clone(),
        };
        let tools = self.tools.clone();
        let runnable: Vec<ToolCall> = calls
            .iter()
            .zip(verdicts)
            .filter(|(_, verdict)| **verdict == Verdict::Run)
            .map(|(call, _)| call.clone())
            .collect();
        let together = runnable.len() > 1 && tools.all_parallel_safe(&runnable);
        // The calls start in order; running together, they are all started
        // (and durable) before the first one runs.
        let mut running = FuturesOrdered::new();
        let mut interrupted: Option<Submission> = None;
        let mut progress = ProgressFeed {
            board: ProgressBoard::new(),
            next_at: tokio::time::Instant::now(),
        };
        // The client's calls have their results already.
        let calls: Vec<(&ToolCall, &Verdict)> = calls
            .iter()
            .zip(verdicts)
            .filter(|(_, verdict)| **verdict != Verdict::Client)
            .collect();
        for &(call, verdict) in &calls {
            if !self.record_started(turn, call).await? {
                // Started by a runtime that stopped (its start is in the
                // log): it may have run, so it does not run again.
                running.push_back(futures::future::ready(ToolOutcome::error(super::recovery::MAY_HAVE_RUN)).boxed());
            } else {
                match verdict {
                Verdict::Refuse(reason) => {
                    running.push_back(futures::future::ready(ToolOutcome::error(reason.clone())).boxed())
                }
                // A tool could take the room the log's commits need (a
                // command filling the disk): none runs while it is short.
                _ => match self.store.low_on_space() {
                    Some(why) => running.push_back(
                        futures::future::ready(ToolOutcome::error(format!(
                            "not run: {why}; no tool runs until space is freed, so that the session's log can still be written"
                        )))
                        .boxed(),
                    ),
                    None => {
                        self.lease_still_held()?;
                        let sink = ProgressSink::new(call.call_id.clone(), std::sync::Arc::clone(&progress.board));
                        running.push_back(sink.scope(tools.run(call, &context)).boxed())
                    }
                },
                }
            }
            if together {
                continue;
            }
            // In order: this call finishes (or is interrupted) before the next starts.
            let outcome = self
                .next_outcome(turn, &mut running, &mut progress, &mut interrupted)
                .await?;
            self.record_result(turn, call, outcome).await?;
            if interrupted.is_some() {
                break;
            }
        }
        if together {
            for &(call, _) in &calls {
                let outcome = self
                    .next_outcome(turn, &mut running, &mut progress, &mut interrupted)
                    .await?;
                self.record_result(turn, call, outcome).await?;
            }
        }
        match interrupted {
            Some(interrupt) => {
                let calls: Vec<ToolCall> = calls.into_iter().map(|(call, _)| call.clone()).collect();
                self.answer_not_run(turn, &calls).await?;
                Ok(ToolsEnd::Interrupted(interrupt))
            }
            None => Ok(ToolsEnd::Done),
        }
    }

    /// Answers the calls of `calls` left without a result after an
    /// interrupt, without running them.
    async fn answer_not_run(&mut self, turn: &mut Turn, calls: &[ToolCall]) -> Result<()> {
        let done: std::collections::HashSet<String> = self
            .transcript
            .iter()
            .filter_map(|item| match item {
                TranscriptItem::ToolResult { call_id, .. } => Some(call_id.clone()),
                _ => None,
            })
            .collect();
        for call in calls.iter().filter(|call| !done.contains(&call.call_id)) {
            self.record_started(turn, call).await?;
            self.record_result(turn, call, ToolOutcome::error("not run: the turn was interrupted"))
                .await?;
        }
        Ok(())
    }

    /// With several nodes, refuses to start a tool call once this node's
    /// lease may have lapsed (the process was paused, renewals stalled):
    /// another node may hold the session by now. The runtime stops; the
    /// call stays started but not run, and whoever opens the session next
    /// closes the turn and tells the model.
    fn lease_still_held(&self) -> Result<()> {
        match &self.lease_owner {
            Some(owner) if !owner.clock.fresh(owner.ttl) => Err(Error::Stopped(format!(
                "this node's lease on the session was last renewed {} ms ago (time to live {} ms): \
                 no tool call starts under a lease that may have lapsed",
                owner.clock.since_renewal().as_millis(),
                owner.ttl.as_millis()
            ))),
            _ => Ok(()),
        }
    }

    /// The next outcome of `running` in call order. An interrupt cancels
    /// every call still running; each of them then gets an "interrupted"
    /// result.
    async fn next_outcome(
        &mut self,
        turn: &Turn,
        running: &mut FuturesOrdered<futures::future::BoxFuture<'_, ToolOutcome>>,
        progress: &mut ProgressFeed,
        interrupted: &mut Option<Submission>,
    ) -> Result<ToolOutcome> {
        if interrupted.is_some() {
            return Ok(ToolOutcome::error("interrupted by the user"));
        }
        let recorder = &self.recorder;
        let mut lane = ControlLane {
            inbox: &mut self.inbox,
            steering: &mut self.steering,
            recorder,
            transcript: &self.transcript,
        };
        loop {
            tokio::select! {
                biased;
                submission = lane.recv() => {
                    if let Some(Wake::Interrupted(by)) = lane.settle(submission, During::Turn(turn.id())).await? {
                        *interrupted = Some(by);
                        // Dropping the calls' futures cancels them.
                        *running = FuturesOrdered::new();
                        return Ok(ToolOutcome::error("interrupted by the user"));
                    }
                }
                () = progress.ready() => {
                    record_progress(recorder, turn, progress.board.take()).await?;
                    progress.next_at = tokio::time::Instant::now() + PROGRESS_INTERVAL;
                }
                outcome = running.next() => {
                    // A call's last report goes before its result.
                    record_progress(recorder, turn, progress.board.take()).await?;
                    return Ok(outcome.unwrap_or_else(|| ToolOutcome::error("not run: the turn was interrupted")));
                }
            }
        }
    }

    /// Records that `call` starts, durably, before it runs: a restart then
    /// knows it may have run (and that the calls not listed as started in
    /// the same write never did).
    /// Records that `call` starts, with the turn's state saying so; `false`
    /// (nothing recorded) when the turn's state says it started already: a
    /// start is recorded, and a call run, at most once per turn, whatever a
    /// runtime that stopped left behind.
    async fn record_started(&mut self, turn: &mut Turn, call: &ToolCall) -> Result<bool> {
        if turn
            .execution
            .started_calls
            .as_ref()
            .is_some_and(|started| started.contains(&call.call_id))
        {
            tracing::warn!(session_id = %self.session_id, call_id = %call.call_id, "a call whose start is stored is not started again");
            return Ok(false);
        }
        let asked = self.approval_asked.remove(&call.call_id);
        self.tool_starts
            .insert(call.call_id.clone(), (keel_protocol::now_ms(), asked));
        turn.execution
            .started_calls
            .get_or_insert_with(Vec::new)
            .push(call.call_id.clone());
        let started = turn.event(EventMsg::ToolCallStarted(ToolCallStartedEvent {
            turn_id: turn.id().to_owned(),
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        }));
        let write = self.checkpoint_write(Vec::new(), Some(&turn.execution));
        self.recorder.commit(vec![started], Some(write)).await?;
        Ok(true)
    }

    /// Records a call's result with the history item it adds.
    async fn record_result(&mut self, turn: &Turn, call: &ToolCall, outcome: ToolOutcome) -> Result<()> {
        self.record_result_of(turn, call, outcome, None).await
    }

    /// Records a call's result with the history item it adds; its event
    /// carries `submission_id` (the op that brought the result) when given,
    /// the turn's otherwise.
    pub(super) async fn record_result_of(
        &mut self,
        turn: &Turn,
        call: &ToolCall,
        mut outcome: ToolOutcome,
        submission_id: Option<String>,
    ) -> Result<()> {
        // A command's output (`env`, a config file) may hold a provider key;
        // neither the log nor the next request carries it.
        outcome.output = redact_owned(outcome.output);
        let mut completed = turn.event(EventMsg::ToolCallCompleted(ToolCallCompletedEvent {
            turn_id: turn.id().to_owned(),
            call_id: call.call_id.clone(),
            output: outcome.output.clone(),
            is_error: outcome.is_error,
        }));
        if submission_id.is_some() {
            completed.submission_id = submission_id;
        }
        let result = TranscriptItem::ToolResult {
            call_id: call.call_id.clone(),
            output: outcome.output,
            is_error: outcome.is_error,
        };
        self.transcript.push(result.clone());
        let write = self.checkpoint_write(vec![result.clone()], Some(&turn.execution));
        self.recorder.append(vec![completed], Some(write)).await?;
        if let TranscriptItem::ToolResult { output, is_error, .. } = &result {
            self.report_tool(turn, call, output, *is_error);
        }
        Ok(())
    }
}

/// Records progress reports as `tool_call_progress` events.
async fn record_progress(recorder: &EventRecorder, turn: &Turn, reports: Vec<ToolProgress>) -> Result<()> {
    if reports.is_empty() {
        return Ok(());
    }
    let events = reports
        .into_iter()
        .map(|report| {
            turn.event(EventMsg::ToolCallProgress(ToolCallProgressEvent {
                turn_id: turn.id().to_owned(),
                call_id: report.call_id,
                progress: report.progress,
                total: report.total,
                message: report.message.map(redact_owned),
            }))
        })
        .collect();
    recorder.append(events, None).await
}
