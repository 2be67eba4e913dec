//! A chat against a `keel serve` server, over its HTTP API (docs/http-api.md):
//! `POST /v1/sessions` (or `GET /v1/sessions/{id}` to resume), the log read
//! forwards for the history, `POST …/submissions` for messages (with an
//! idempotency key, so a retried request queues nothing twice), interrupts
//! and approvals, and the events followed over SSE, resumed after a dropped
//! connection with `Last-Event-ID`. The chat's client tools are declared
//! with the new session, or with `PATCH /v1/sessions/{id}` on a resumed one.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use futures::StreamExt;
use keel::protocol::{ClientToolSpec, EventMsg, Op, RecordedEvent, new_id};
use keel::provider::sse::SseParser;
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::client_calls::waiting_calls;
use super::client_tools::specs;
use super::commands::Unrecoverable;
use super::{BOT_ID, ChatArgs, Opened, Session};

/// How long to wait for a connection, and for an ordinary request.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an ordinary request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Events per page of the history (the API's most).
const HISTORY_PAGE: usize = 1000;

/// The largest SSE event accepted (a message is at most 1 MiB, tool outputs
/// are bounded; JSON escaping can double that).
const MAX_EVENT_BYTES: usize = 8 << 20;

/// How often a lost event stream is reconnected before giving up, and the
/// longest pause between attempts.
const STREAM_ATTEMPTS: u32 = 8;
/// The longest pause between reconnection attempts.
const STREAM_MAX_BACKOFF: Duration = Duration::from_secs(4);

/// Events buffered between the stream and the chat; a full buffer stops
/// reading the socket, so the server slows down instead of memory growing.
const EVENT_BUFFER: usize = 256;

/// How the server is reached.
#[derive(Clone)]
struct Api {
    client: reqwest::Client,
    base: Url,
    token: Option<String>,
}

/// The parts of a session as the API shows it that the chat needs.
#[derive(Debug, Deserialize)]
struct SessionView {
    id: String,
    state: String,
    #[serde(default)]
    queued: usize,
    #[serde(default)]
    pending_approvals: Vec<String>,
    /// The tools its clients execute, as declared.
    #[serde(default)]
    client_tools: Vec<ClientToolSpec>,
}

impl SessionView {
    /// Whether a turn runs, waits for approval, or messages wait.
    fn busy(&self) -> bool {
        self.state != "idle" || self.queued > 0
    }
}

/// A page of `GET …/events`.
#[derive(Debug, Deserialize)]
struct EventsPage {
    events: Vec<RecordedEvent>,
    has_more: bool,
}

/// The answer to an accepted submission.
#[derive(Debug, Deserialize)]
struct AcceptedView {
    submission_id: String,
}

/// An error answer: `{"error": {"code", "message"}}`.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

/// What an error answer says.
#[derive(Debug, Deserialize)]
struct ErrorDetail {
    code: String,
    message: String,
}

/// A session of a server.
pub(crate) struct RemoteSession {
    api: Api,
    id: String,
    events: mpsc::Receiver<anyhow::Result<RecordedEvent>>,
    stream: tokio::task::JoinHandle<()>,
}

/// Creates a session on the server (or finds the one to resume), reads its
/// history and starts following its events.
pub(super) async fn open(args: &ChatArgs, server: &str) -> anyhow::Result<Opened> {
    let token = super::credential::bearer(args)?;
    let mut base = server_url(server)?;
    if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
        bail!("invalid server URL '{server}': give http://HOST:PORT or https://…");
    }
    // Paths are added as segments; a trailing slash would leave an empty one.
    if base.path().ends_with('/') {
        let trimmed = base.path().trim_end_matches('/').to_owned();
        base.set_path(&trimmed);
    }
    let client = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .context("cannot set up the HTTP client")?;
    let api = Api { client, base, token };

    let (view, history, startup) = match &args.session {
        Some(id) => {
            if args.system.is_some() {
                bail!("a server's session keeps the system prompt it was created with: omit --system with --session");
            }
            let view = api.session(id).await?;
            let declared = specs(&args.client_tools);
            // Declared already (by an earlier chat with the same tools): no
            // change, which a session waiting for one of them would refuse.
            if !declared.is_empty() && declared != view.client_tools {
                let body = json!({ "client_tools": declared });
                api.send(api.request(Method::PATCH, &["sessions", id]).json(&body))
                    .await?;
            }
            let history = api.history(id).await?;
            (view, history, Vec::new())
        }
        None => {
            let mut body = json!({"bot_id": BOT_ID, "on_busy": "queue"});
            if let Some(id) = &args.new_session {
                body["id"] = json!(id);
            }
            if let Some(system) = &args.system {
                body["instructions"] = json!(system);
            }
            if let Some(model) = &args.model.model {
                body["model"] = json!(model);
            }
            if !args.client_tools.is_empty() {
                body["client_tools"] = json!(specs(&args.client_tools));
            }
            if args.tools.no_tools {
                body["tools"] = json!({"builtin": false, "write": false, "shell": false});
            } else if let Some(policy) = args.tools.sandbox {
                body["tools"] = json!({ "sandbox": policy });
            }
            let response = api.send(api.request(Method::POST, &["sessions"]).json(&body)).await?;
            let view: SessionView = parse(response).await?;
            // The opening's events stored so far (warnings among them), to
            // show before the first prompt; later ones come on the stream.
            let opening = api.history(&view.id).await?;
            (view, Vec::new(), opening)
        }
    };
    let pending_ids: HashSet<&str> = view.pending_approvals.iter().map(String::as_str).collect();
    let pending = history
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ApprovalRequested(request) if pending_ids.contains(request.call_id.as_str()) => {
                Some(request.clone())
            }
            _ => None,
        })
        .collect();
    let pending_calls = waiting_calls(history.iter().chain(&startup));
    // The stream goes on after what was read.
    let after = history
        .iter()
        .chain(&startup)
        .map(|event| event.sequence)
        .max()
        .unwrap_or(0);
    let (sender, events) = mpsc::channel(EVENT_BUFFER);
    let stream = tokio::spawn(follow(api.clone(), view.id.clone(), after, sender));
    Ok(Opened {
        session: Session::Remote(RemoteSession {
            api,
            id: view.id,
            events,
            stream,
        }),
        history,
        startup,
        pending,
        pending_calls,
    })
}

/// The server's base URL; `HOST:PORT` without a scheme is `http://HOST:PORT`.
fn server_url(server: &str) -> anyhow::Result<Url> {
    let given = server.trim();
    let url = if given.contains("://") {
        given.to_owned()
    } else {
        format!("http://{given}")
    };
    Url::parse(&url)
        .map_err(|error| anyhow!("invalid server URL '{server}': {error}; give http://HOST:PORT or https://…"))
}

impl Api {
    /// `{base}/v1/{segments…}`, each segment escaped.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.push("v1").extend(segments);
        }
        url
    }

    /// A request to `{base}/v1/{segments…}`, with the token.
    fn request(&self, method: Method, segments: &[&str]) -> RequestBuilder {
        self.authorized(self.client.request(method, self.url(segments)))
    }

    /// `request` with the bearer token, if there is one.
    fn authorized(&self, request: RequestBuilder) -> RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends a request, turning failures into one-line errors.
    async fn send(&self, request: RequestBuilder) -> anyhow::Result<Response> {
        let response = request
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|error| self.unreachable(&error))?;
        check(response).await
    }

    /// The error for a request that got no answer.
    fn unreachable(&self, error: &reqwest::Error) -> anyhow::Error {
        anyhow!("cannot reach the server at {}: {}", self.base, root_cause(error))
    }

    /// The session as the server shows it; a clear error when it has none
    /// by that id.
    async fn session(&self, id: &str) -> anyhow::Result<SessionView> {
        let request = self.request(Method::GET, &["sessions", id]);
        match self.send(request).await {
            Err(error)
                if error
                    .downcast_ref::<ApiError>()
                    .is_some_and(|e| e.status == StatusCode::NOT_FOUND) =>
            {
                bail!("unknown session '{id}' on the server (omit --session to start a new one)")
            }
            other => parse(other?).await,
        }
    }

    /// The session's whole log, oldest first.
    async fn history(&self, id: &str) -> anyhow::Result<Vec<RecordedEvent>> {
        let mut events: Vec<RecordedEvent> = Vec::new();
        loop {
            let after = events.last().map_or(0, |event| event.sequence);
            let mut url = self.url(&["sessions", id, "events"]);
            url.query_pairs_mut()
                .append_pair("after", &after.to_string())
                .append_pair("limit", &HISTORY_PAGE.to_string());
            let request = self.authorized(self.client.get(url));
            let page: EventsPage = parse(self.send(request).await?).await?;
            let done = !page.has_more || page.events.is_empty();
            events.extend(page.events);
            if done {
                return Ok(events);
            }
        }
    }
}

/// An error the server answered with.
#[derive(Debug, thiserror::Error)]
#[error("{text}")]
struct ApiError {
    status: StatusCode,
    text: String,
}

/// `response` if it succeeded; otherwise its error, in one line.
async fn check(response: Response) -> anyhow::Result<Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let (code, message) = match serde_json::from_str::<ErrorBody>(&body) {
        Ok(ErrorBody { error }) => (error.code, error.message),
        Err(_) => (String::new(), body.trim().chars().take(200).collect()),
    };
    let text = super::credential::refusal(status, &code, &message).unwrap_or_else(|| {
        if code.is_empty() {
            format!("the server answered {status}: {message}")
        } else {
            format!("the server answered {status} ({code}): {message}")
        }
    });
    Err(ApiError { status, text }.into())
}

/// The JSON body of a successful answer.
async fn parse<T: serde::de::DeserializeOwned>(response: Response) -> anyhow::Result<T> {
    let url = response.url().path().to_owned();
    response
        .json()
        .await
        .with_context(|| format!("unexpected answer from the server to {url}"))
}

/// The innermost cause of an error (for a refused connection: "Connection
/// refused (os error 111)").
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// Follows the session's events over SSE from `after`, reconnecting with
/// `Last-Event-ID` when the connection drops; every sequence is passed on
/// once, in order. Gives up (passing the error on) after repeated failures,
/// or at once when the server refuses (401, 404).
async fn follow(api: Api, id: String, mut after: u64, events: mpsc::Sender<anyhow::Result<RecordedEvent>>) {
    let mut failures = 0;
    loop {
        let outcome = stream_once(&api, &id, &mut after, &events).await;
        let error = match outcome {
            Ok(Streamed::ReceiverGone) => return,
            Ok(Streamed::Ended { progressed }) => {
                if progressed {
                    failures = 0;
                }
                anyhow!("the server closed the event stream")
            }
            Err(Failure::Fatal(error)) => {
                let _ = events.send(Err(error)).await;
                return;
            }
            Err(Failure::Retry { error, progressed }) => {
                if progressed {
                    failures = 0;
                }
                error
            }
        };
        failures += 1;
        if failures >= STREAM_ATTEMPTS {
            let _ = events.send(Err(error.context("lost the session's event stream"))).await;
            return;
        }
        tracing::debug!(%error, failures, "reconnecting the event stream");
        let pause = Duration::from_millis(100 << failures.min(6)).min(STREAM_MAX_BACKOFF);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = events.closed() => return,
        }
    }
}

/// How one connection of the event stream ended without an error.
enum Streamed {
    /// The chat stopped listening.
    ReceiverGone,
    /// The server ended the stream.
    Ended { progressed: bool },
}

/// How one connection of the event stream failed.
enum Failure {
    /// Worth reconnecting for.
    Retry { error: anyhow::Error, progressed: bool },
    /// Not: the server refused.
    Fatal(anyhow::Error),
}

/// Reads one connection of the event stream, passing on the events after
/// `after` and moving `after` along.
async fn stream_once(
    api: &Api,
    id: &str,
    after: &mut u64,
    events: &mpsc::Sender<anyhow::Result<RecordedEvent>>,
) -> Result<Streamed, Failure> {
    let retry = |error: anyhow::Error, progressed: bool| Failure::Retry { error, progressed };
    let request = api
        .request(Method::GET, &["sessions", id, "events", "stream"])
        .header("Accept", "text/event-stream")
        .header("Last-Event-ID", after.to_string());
    let response = request
        .send()
        .await
        .map_err(|error| retry(api.unreachable(&error), false))?;
    let response = match check(response).await {
        Ok(response) => response,
        Err(error) => {
            let refused = error
                .downcast_ref::<ApiError>()
                .is_some_and(|e| e.status.is_client_error());
            return Err(if refused {
                Failure::Fatal(error)
            } else {
                retry(error, false)
            });
        }
    };
    let mut body = response.bytes_stream();
    let mut parser = SseParser::new(MAX_EVENT_BYTES);
    let mut parsed = Vec::new();
    let mut progressed = false;
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|error| retry(anyhow!("the event stream broke: {}", root_cause(&error)), progressed))?;
        parser
            .push(&chunk, &mut parsed)
            .map_err(|error| Failure::Fatal(anyhow!("bad event stream from the server: {error}")))?;
        for message in parsed.drain(..) {
            let event: RecordedEvent = serde_json::from_str(&message.data)
                .map_err(|error| Failure::Fatal(anyhow!("bad event from the server: {error}")))?;
            // After a reconnection the server resumes after `after`; never
            // pass an event on twice.
            if event.sequence <= *after {
                continue;
            }
            *after = event.sequence;
            progressed = true;
            if events.send(Ok(event)).await.is_err() {
                return Ok(Streamed::ReceiverGone);
            }
        }
    }
    Ok(Streamed::Ended { progressed })
}

impl RemoteSession {
    /// The session's id.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// Submits a message, queued behind a running turn; its submission id.
    pub(super) async fn submit(&mut self, text: String) -> anyhow::Result<String> {
        // One key for every attempt: a retry after a lost answer is
        // answered with the first submission instead of queueing another.
        let key = new_id();
        let body = json!({"op": Op::UserInput { text }, "on_busy": "queue"});
        let mut attempt = 0;
        loop {
            let request = self
                .api
                .request(Method::POST, &["sessions", &self.id, "submissions"])
                .header("Idempotency-Key", &key)
                .json(&body);
            match request.timeout(REQUEST_TIMEOUT).send().await {
                Ok(response) => {
                    let accepted: AcceptedView = parse(check(response).await?).await?;
                    return Ok(accepted.submission_id);
                }
                Err(error) if attempt < 2 => {
                    attempt += 1;
                    tracing::debug!(%error, attempt, "retrying a submission");
                    tokio::time::sleep(Duration::from_millis(300 * attempt)).await;
                }
                Err(error) => return Err(self.api.unreachable(&error)),
            }
        }
    }

    /// Queues an op that is neither a message nor a control (`compact`,
    /// `regenerate`); returns its submission id.
    pub(super) async fn submit_op(&mut self, op: Op) -> anyhow::Result<String> {
        let request = self
            .api
            .request(Method::POST, &["sessions", &self.id, "submissions"])
            .json(&json!({ "op": op }));
        let accepted: AcceptedView = parse(self.api.send(request).await?).await?;
        Ok(accepted.submission_id)
    }

    /// Forks the session just before turn `turn_id`; the fork's id.
    pub(super) async fn fork_before(&mut self, turn_id: &str) -> anyhow::Result<String> {
        let request = self
            .api
            .request(Method::POST, &["sessions", &self.id, "fork"])
            .json(&json!({ "before_turn": turn_id }));
        let view: SessionView = parse(self.api.send(request).await?).await?;
        Ok(view.id)
    }

    /// Submits an interrupt or an approval.
    pub(super) async fn control(&mut self, op: Op) -> anyhow::Result<()> {
        let request = self
            .api
            .request(Method::POST, &["sessions", &self.id, "submissions"])
            .json(&json!({ "op": op }));
        self.api.send(request).await?;
        Ok(())
    }

    /// The next event from the stream; once it is lost, nothing more
    /// arrives, so its error is [`Unrecoverable`].
    pub(super) async fn next_event(&mut self) -> anyhow::Result<RecordedEvent> {
        match self.events.recv().await {
            Some(Ok(event)) => Ok(event),
            Some(Err(error)) => Err(Unrecoverable(format!("{error:#}")).into()),
            None => Err(Unrecoverable("lost the session's event stream".to_owned()).into()),
        }
    }

    /// `PATCH /v1/sessions/{id}` with the new model: checked by the server
    /// as a new session's model is.
    pub(super) async fn set_model(&mut self, spec: &str) -> anyhow::Result<()> {
        let request = self
            .api
            .request(Method::PATCH, &["sessions", &self.id])
            .json(&json!({ "model": spec }));
        self.api.send(request).await?;
        Ok(())
    }

    /// `DELETE /v1/sessions/{id}`.
    pub(super) async fn discard(&mut self, id: &str) -> anyhow::Result<()> {
        self.api
            .send(self.api.request(Method::DELETE, &["sessions", id]))
            .await?;
        Ok(())
    }

    /// Whether a turn runs or messages wait, as the server says.
    pub(super) async fn busy(&mut self) -> anyhow::Result<bool> {
        Ok(self.api.session(&self.id).await?.busy())
    }

    /// Stops following the session (it goes on on the server).
    pub(super) fn close(self) {
        self.stream.abort();
    }
}
