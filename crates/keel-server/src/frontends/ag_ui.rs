//! `POST /v1/ag-ui`: AG-UI 1.0's `RunAgentInput` in, the run's AG-UI events
//! out as server-sent events, projected from the session's stored log (see
//! `keel_projections::ag_ui`).
//!
//! The stream follows the log (a [`Subscription`]), never the runtime: a
//! slow client slows only itself, and a run can be followed, or resumed, on
//! any node of a cluster.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt as _};
use keel_projections::ag_ui::{self, AgUiEvent, InputError, RunInput, RunOutcome, RunProjection, RunStart, Thread};
use keel_protocol::RecordedEvent;

use super::ag_ui_threads::Checkout;
use crate::Server;
use crate::auth::{Liveness, Principal, Scope};
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::fanout::Subscription;
use crate::host::SettingsChange;
use crate::openapi::errors::{BODY, CEILING, CREATING, LOADING, QUEUEING, route_errors};
use crate::routes::sessions::{CreateSession, create_session};
use crate::routes::{access, submissions};
use crate::settings::SessionSettings;

/// How long a run whose turn waits for the client waits for more of the
/// log before it ends: a step's requests are one commit, so what follows
/// the first is readable at once.
const SETTLE: Duration = Duration::from_millis(100);

route_errors!(
    /// What `POST /v1/ag-ui` can answer instead of the stream.
    RunErrors: BODY,
    CEILING,
    LOADING,
    CREATING,
    QUEUEING,
    [
        "history_mismatch",
        "call_not_waiting",
        "invalid_client_tool",
        "client_tool_conflict",
        "idempotency_key_reused",
        "session_elsewhere",
        "owner_unavailable",
        "conflict",
        "tenant_forbidden",
        "model_not_found",
        "missing_scope_read",
        "missing_scope_submit",
        "missing_scope_approve"
    ]
);

/// `POST /v1/ag-ui`.
#[utoipa::path(
    post,
    path = "/ag-ui",
    tag = "frontends",
    operation_id = "ag_ui_run",
    summary = "Run an AG-UI agent (AG-UI 1.0)",
    description = "AG-UI 1.0's `HttpAgent` endpoint. The body is a `RunAgentInput`: `threadId` names the session \
        (created on first use with the server's defaults; a tenant's credentials get their own namespace), \
        `messages` must start with the session's history (roles and texts) and may end with new user messages, \
        which become submissions keyed by their ids (a retried run makes no second turn), or tool messages \
        answering waiting client tools; `resume` entries answer the last run's interrupts (approvals). The \
        answer is the run's AG-UI events, as server-sent events (`data:` lines of JSON), projected from the \
        log: `RUN_STARTED` (the turn's id as `runId`), `STEP_*`, `TEXT_MESSAGE_*`, `TOOL_CALL_*`, \
        `TOOL_CALL_RESULT`, `REASONING_*`, then `RUN_FINISHED` (success, the interrupt outcome while approvals \
        wait, `pendingToolCallIds` while client tools wait, cancelled after an interrupt) or `RUN_ERROR`. A \
        request with nothing new answers the thread's `MESSAGES_SNAPSHOT`. See docs/ag-ui.md.",
    request_body(content = super::ag_ui_schema::AgUiRunAgentInput, description = "AG-UI's `RunAgentInput`.", content_type = "application/json"),
    security(("bearer" = ["submit", "read"])),
    responses(
        (
            status = 200,
            description = "The run's AG-UI events, one per SSE `data:` line, ending with `RUN_FINISHED` or `RUN_ERROR`.",
            content_type = "text/event-stream",
            body = Object,
        ),
        RunErrors,
    ),
)]
pub(crate) async fn run(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Extension(liveness): Extension<Liveness>,
    headers: HeaderMap,
    body: JsonBody,
) -> Result<Response, ApiError> {
    // A run is a submission that answers with the thread's events (its
    // description says `submit` and `read`), checked before the body, so a
    // missing scope is the same `403` whatever is sent.
    principal.require(Scope::Submit)?;
    principal.require(Scope::Read)?;
    let input = ag_ui::read(body.parse()?).map_err(input_error)?;
    let id = access::thread_session_id(&principal, &input.thread_id)?;
    let stored = match access::session(&server, &principal, Scope::Read, &id).await {
        Ok(stored) => Some(stored),
        Err(ApiError::NotFound(_)) => None,
        Err(error) => return Err(error),
    };
    let mut tools = input.tools.clone();
    crate::client_tools::check_declared(&server.host.factory.keel, &mut tools)?;
    let mut checkout = match &stored {
        Some(summary) => {
            server
                .ag_ui_threads
                .checkout(server.host.store.as_ref(), &id, summary.as_ref())
                .await?
        }
        None => server.ag_ui_threads.detached(&id),
    };
    let thread = checkout.thread();
    let plan = ag_ui::plan(&input, thread).map_err(input_error)?;
    for (_, op) in &plan.answers {
        principal.require(access::op_scope(op))?;
    }
    if !plan.user_messages.is_empty() {
        principal.require(Scope::Submit)?;
    }
    if plan.answers.is_empty() && plan.user_messages.is_empty() {
        return Ok(snapshot(&input, thread));
    }
    match stored {
        None => {
            let request = CreateSession {
                client_tools: (!tools.is_empty()).then_some(tools),
                ..CreateSession::default()
            };
            create_session(&server, &principal, &id, request).await?;
        }
        Some(summary) => update_client_tools(&server, &id, summary.as_ref(), tools).await?,
    }
    // A caller's trace context puts the turn it starts in its trace.
    let trace = submissions::traceparent(&headers);
    let mut early = None;
    let (after, start) = if let Some((call_id, _)) = plan.answers.first() {
        let turn_id = thread
            .wait(call_id)
            .map(|wait| wait.turn_id.clone())
            .ok_or_else(|| ApiError::Internal(format!("the waiting call '{call_id}' has no turn")))?;
        let after = thread.last_sequence();
        let answered: HashSet<String> = plan.answers.iter().map(|(call, _)| call.clone()).collect();
        for (_, op) in plan.answers {
            submissions::submit_op(&server, &id, op, None, None, principal.actor.clone(), trace.clone()).await?;
        }
        submit_messages(&server, &principal, &id, &plan.user_messages, trace).await?;
        let run_id = format!("{turn_id}.{after}");
        (
            after,
            RunStart::Resume {
                turn_id,
                run_id,
                answered,
            },
        )
    } else {
        // Subscribed before submitting, from the hub's newest event: kept
        // when that is exactly where the run starts (no store read), else
        // the subscription below reads the store from there.
        early = server.host.subscribe_from_now(&id);
        let accepted = submit_messages(&server, &principal, &id, &plan.user_messages, trace).await?;
        let first = accepted.iter().map(|(_, sequence)| *sequence).min().unwrap_or(1);
        let after = first.saturating_sub(1).min(thread.last_sequence());
        early = early.filter(|early| early.sees(after + 1) && !early.sees(after));
        let ids = accepted.into_iter().map(|(submission, _)| submission).collect();
        (after, RunStart::Submissions(ids))
    };
    let primed = if after == checkout.thread().last_sequence() {
        checkout.take()
    } else {
        thread_until(&server, &id, after).await?
    };
    let projection = RunProjection::new(input.thread_id.clone(), primed, start);
    let subscription = early.unwrap_or_else(|| server.host.subscribe(&id, after));
    let keep_alive = KeepAlive::new().interval(server.keep_alive).text("keep-alive");
    let events = stream(projection, subscription, checkout).take_until(liveness.ended());
    let mut response = Sse::new(events).keep_alive(keep_alive).into_response();
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// Makes the run's frontend tools the session's client tools when they
/// differ from the ones it has (a run without tools leaves them alone).
/// Changing them while a turn runs is `409 session_busy`.
async fn update_client_tools(
    server: &Server,
    id: &str,
    summary: Option<&keel_store::SessionSummary>,
    tools: Vec<keel_protocol::ClientToolSpec>,
) -> Result<(), ApiError> {
    if tools.is_empty() {
        return Ok(());
    }
    let current = summary
        .and_then(|summary| SessionSettings::of(&summary.context).ok())
        .map(|settings| settings.client_tools)
        .unwrap_or_default();
    if current == tools {
        return Ok(());
    }
    server
        .host
        .change_settings(id, SettingsChange::ClientTools(tools))
        .await
}

/// Submits the run's new user messages, each keyed by its id (a retried
/// run's are answered as before and queue nothing), in the caller's trace
/// when it sent one: their submission ids and the sequences of their
/// `submission_queued`.
async fn submit_messages(
    server: &Server,
    principal: &Principal,
    id: &str,
    messages: &[(String, String)],
    trace: Option<String>,
) -> Result<Vec<(String, u64)>, ApiError> {
    let mut accepted = Vec::with_capacity(messages.len());
    for (key, text) in messages {
        let op = keel_protocol::Op::UserInput { text: text.clone() };
        let answer = submissions::submit_op(
            server,
            id,
            op,
            None,
            Some(key.clone()),
            principal.actor.clone(),
            trace.clone(),
        )
        .await?;
        accepted.push((answer.submission_id, answer.sequence));
    }
    Ok(accepted)
}

/// The API error of a request the projection refuses.
fn input_error(error: InputError) -> ApiError {
    match error {
        InputError::Malformed(message) => ApiError::InvalidRequest(message),
        InputError::HistoryMismatch(message) => ApiError::ProtocolConflict {
            code: "history_mismatch",
            message,
        },
        InputError::NotWaiting(message) => ApiError::ProtocolConflict {
            code: "call_not_waiting",
            message,
        },
    }
}

/// The thread of session `id` as of sequence `until`, read from the log
/// (a retried run whose messages were stored before the thread's end).
async fn thread_until(server: &Server, id: &str, until: u64) -> Result<Thread, ApiError> {
    let mut thread = Thread::new();
    super::ag_ui_threads::bring_forward(server.host.store.as_ref(), id, &mut thread, until).await?;
    Ok(thread)
}

/// A run with nothing to do: the thread's messages, as a finished run.
fn snapshot(input: &RunInput<'_>, thread: &Thread) -> Response {
    let events = [
        AgUiEvent::RunStarted {
            thread_id: input.thread_id.clone(),
            run_id: input.run_id.clone(),
            parent_run_id: None,
        },
        AgUiEvent::MessagesSnapshot {
            messages: thread.messages(),
        },
        AgUiEvent::RunFinished {
            thread_id: input.thread_id.clone(),
            run_id: input.run_id.clone(),
            outcome: RunOutcome::Success {
                pending_tool_call_ids: Vec::new(),
            },
        },
    ];
    let frames: Vec<Result<Event, Infallible>> = events.iter().map(|event| Ok(frame(event))).collect();
    Sse::new(futures::stream::iter(frames)).into_response()
}

fn frame(event: &AgUiEvent) -> Event {
    match serde_json::to_string(event) {
        Ok(json) => Event::default().data(json),
        // The events are plain data; this cannot fail, but a frame must go out.
        Err(error) => Event::default().comment(format!("unserializable event: {error}")),
    }
}

struct Follow {
    projection: RunProjection,
    subscription: Subscription,
    ready: VecDeque<AgUiEvent>,
    /// Where the projection's thread goes when the run's stream ends
    /// (finished, or dropped with its client).
    checkout: Checkout,
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.checkout.give_back(self.projection.take_thread());
    }
}

/// The run's events: the projection fed from the log until the run ends.
fn stream(
    projection: RunProjection,
    subscription: Subscription,
    checkout: Checkout,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut ready = VecDeque::new();
    let mut projection = projection;
    ready.extend(projection.open());
    let state = Follow {
        projection,
        subscription,
        ready,
        checkout,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.ready.pop_front() {
                return Some((Ok(frame(&event)), state));
            }
            if state.projection.finished() {
                return None;
            }
            let next = if state.projection.waiting() {
                match tokio::time::timeout(SETTLE, state.subscription.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        let settled = state.projection.settle();
                        state.ready.extend(settled);
                        continue;
                    }
                }
            } else {
                state.subscription.next().await
            };
            match next {
                Ok(Some(live)) => match serde_json::from_str::<RecordedEvent>(&live.json) {
                    Ok(event) => {
                        let events = state.projection.push(&event);
                        state.ready.extend(events);
                    }
                    Err(error) => {
                        tracing::error!(%error, sequence = live.sequence, "ending an AG-UI run: an unreadable event");
                        return None;
                    }
                },
                Ok(None) => return None,
                Err(error) => {
                    tracing::error!(%error, "ending an AG-UI run");
                    return None;
                }
            }
        }
    })
}
