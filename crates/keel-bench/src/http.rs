//! The client side the server workloads share: a server of the library's
//! on a loopback port, the requests they send, and reading an event
//! stream as a subscriber sees it, checked gap-free.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use keel_protocol::now_ms;
use keel_protocol::{Error, Result};
use keel_server::{ServeError, ServerConfig, serve};

/// How long a turn may go without an event before the run fails.
pub(super) const TURN_TIMEOUT: Duration = Duration::from_secs(60);

/// One event as a subscriber saw it on the wire.
pub(super) struct WireEvent {
    /// Its place in the session's log.
    pub(super) sequence: u64,
    /// Its type (`turn_complete`, …).
    pub(super) kind: String,
    /// When it was committed (the store's clock, ms since the Unix epoch),
    /// if the frame's data carried it.
    pub(super) recorded_at_ms: Option<u64>,
    /// When the bytes that completed its frame arrived.
    pub(super) received: Instant,
    /// The same on the wall clock, in ms since the Unix epoch.
    pub(super) received_unix_ms: u64,
}

/// Waits for every session's timed turns: the sessions, and every turn's
/// measure, all sessions together.
pub(super) async fn join_sessions<S: 'static, T: 'static>(
    mut tasks: tokio::task::JoinSet<Result<(S, Vec<T>)>>,
) -> Result<(Vec<S>, Vec<T>)> {
    let mut sessions = Vec::new();
    let mut measures = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (session, session_measures) =
            joined.map_err(|error| Error::stopped(format!("bench session failed: {error}")))??;
        sessions.push(session);
        measures.extend(session_measures);
    }
    Ok((sessions, measures))
}

/// Writes `answers` answers of `chunks` chunks of `chunk_bytes` bytes.
pub(super) fn write_script(path: &Path, answers: usize, chunks: usize, chunk_bytes: usize) -> Result<()> {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(io_error)?);
    for answer in 0..answers {
        let chunks: Vec<String> = (0..chunks)
            .map(|index| super::turns::chunk_text(answer, index, chunk_bytes))
            .collect();
        writeln!(file, "{}", json!({ "chunks": chunks })).map_err(io_error)?;
    }
    file.flush().map_err(io_error)
}

pub(super) fn io_error(error: std::io::Error) -> Error {
    Error::Config(format!("bench set-up failed: {error}"))
}

/// Creates a session without tools on the server at `base`; its id.
pub(super) async fn create_session(client: &reqwest::Client, base: &str) -> Result<String> {
    let body = json!({"tools": {"builtin": false, "write": false, "shell": false}});
    create_session_with(client, base, &body).await
}

/// Creates a session on the server at `base` with the `POST /v1/sessions`
/// body `body`; its id.
pub(super) async fn create_session_with(
    client: &reqwest::Client,
    base: &str,
    body: &serde_json::Value,
) -> Result<String> {
    let created: serde_json::Value = check(client.post(format!("{base}/v1/sessions")).json(body).send().await)
        .await?
        .json()
        .await
        .map_err(http_error)?;
    created["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::Config("the created session has no id".to_owned()))
}

/// Reads an event stream until the session's `shutdown_complete`, checking
/// that the sequences run 1, 2, 3, … without a gap or a duplicate; forwards
/// each event to `forward` if given. Answers how many events it read.
pub(super) async fn read_stream(
    response: reqwest::Response,
    forward: Option<mpsc::UnboundedSender<WireEvent>>,
) -> Result<u64> {
    let body = response
        .bytes_stream()
        .map(|chunk| chunk.map(|bytes| bytes.to_vec()).map_err(http_error));
    read_events(body, forward).await
}

/// [`read_stream`] over any body.
pub(super) async fn read_events(
    body: impl futures::Stream<Item = Result<Vec<u8>>>,
    forward: Option<mpsc::UnboundedSender<WireEvent>>,
) -> Result<u64> {
    let mut body = std::pin::pin!(body);
    let mut buffer: Vec<u8> = Vec::new();
    // Bytes of `buffer` already searched for a frame's end, so that a long
    // frame arriving in many pieces is not searched again from its start.
    let mut searched = 0;
    let mut last = 0;
    let (mut received, mut received_unix_ms) = (Instant::now(), now_ms());
    loop {
        let mut start = 0;
        while let Some(offset) = buffer[searched..].windows(2).position(|window| window == b"\n\n") {
            let end = searched + offset + 2;
            let frame = &buffer[start..end];
            (start, searched) = (end, end);
            let Some(event) = parse_frame(frame, received, received_unix_ms) else {
                continue; // a keep-alive comment
            };
            if event.sequence != last + 1 {
                return Err(Error::Model(format!(
                    "a bench subscriber got sequence {} after {last}",
                    event.sequence
                )));
            }
            last = event.sequence;
            let done = event.kind == "shutdown_complete";
            if let Some(forward) = &forward {
                let _ = forward.send(event);
            }
            if done {
                return Ok(last);
            }
        }
        buffer.drain(..start);
        // The last byte may be the first half of the next "\n\n".
        searched = buffer.len().saturating_sub(1);
        match body.next().await {
            Some(chunk) => {
                buffer.extend_from_slice(&chunk?);
                (received, received_unix_ms) = (Instant::now(), now_ms());
            }
            None => {
                return Err(Error::stopped(format!(
                    "a bench event stream ended after sequence {last}"
                )));
            }
        }
    }
}

/// The `id:`, `event:` and the data's `recorded_at_ms` of one
/// server-sent-events frame, received at `received`; `None` for a comment.
fn parse_frame(frame: &[u8], received: Instant, received_unix_ms: u64) -> Option<WireEvent> {
    let text = std::str::from_utf8(frame).ok()?;
    let mut sequence = None;
    let mut kind = None;
    let mut recorded_at_ms = None;
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("id:") {
            sequence = value.trim().parse().ok();
        } else if let Some(value) = line.strip_prefix("event:") {
            kind = Some(value.trim().to_owned());
        } else if let Some(value) = line.strip_prefix("data:") {
            recorded_at_ms = recorded_at_ms.or_else(|| recorded_at(value));
        }
    }
    Some(WireEvent {
        sequence: sequence?,
        kind: kind?,
        recorded_at_ms,
        received,
        received_unix_ms,
    })
}

/// The `recorded_at_ms` field of an event's JSON, found without parsing
/// the whole event.
fn recorded_at(data: &str) -> Option<u64> {
    const FIELD: &str = "\"recorded_at_ms\":";
    let start = data.find(FIELD)? + FIELD.len();
    let digits = data[start..].trim_start();
    let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// The response if it succeeded; its status and body as an error otherwise.
pub(super) async fn check(sent: reqwest::Result<reqwest::Response>) -> Result<reqwest::Response> {
    let response = sent.map_err(http_error)?;
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    Err(Error::Model(format!("the bench server answered {status}: {body}")))
}

pub(super) fn http_error(error: reqwest::Error) -> Error {
    Error::stopped(format!("bench HTTP request failed: {error}"))
}

/// A server of the library's answering on a loopback port until stopped.
pub(super) struct BenchServer {
    /// `http://` and its address.
    pub(super) base: String,
    stop: oneshot::Sender<()>,
    server: JoinHandle<std::result::Result<(), ServeError>>,
}

impl BenchServer {
    /// Serves `config` on a free loopback port.
    pub(super) async fn start(config: ServerConfig) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(io_error)?;
        let base = format!("http://{}", listener.local_addr().map_err(io_error)?);
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, config, async {
            let _ = stopped.await;
        }));
        Ok(Self { base, stop, server })
    }

    /// Shuts the server down and waits for it; a failure names it `what`.
    pub(super) async fn stop(self, what: &str) -> Result<()> {
        let _ = self.stop.send(());
        self.server
            .await
            .map_err(|error| Error::stopped(format!("{what} failed: {error}")))?
            .map_err(|error| Error::stopped(format!("{what} failed: {error}")))
    }
}

/// The HTTP client of a workload: one pool, never short of idle
/// connections.
pub(super) fn http_client() -> Result<reqwest::Client> {
    http_client_with(None)
}

/// [`http_client`] sending `bearer`, if given, on every request.
pub(super) fn http_client_with(bearer: Option<&str>) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder().pool_max_idle_per_host(usize::MAX);
    if let Some(bearer) = bearer {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {bearer}"))
            .map_err(|error| Error::Config(format!("the bench credential is not a header value: {error}")))?;
        value.set_sensitive(true);
        builder = builder.default_headers(reqwest::header::HeaderMap::from_iter([(
            reqwest::header::AUTHORIZATION,
            value,
        )]));
    }
    builder
        .build()
        .map_err(|error| Error::Config(format!("cannot build the HTTP client: {error}")))
}

/// The next event a turn waits for; an error after [`TURN_TIMEOUT`]
/// without one, or when the stream ended.
pub(super) async fn next_turn_event(events: &mut mpsc::UnboundedReceiver<WireEvent>) -> Result<WireEvent> {
    tokio::time::timeout(TURN_TIMEOUT, events.recv())
        .await
        .map_err(|_| Error::stopped(format!("no bench turn event for {TURN_TIMEOUT:?}")))?
        .ok_or_else(|| Error::stopped("the bench event stream ended during a turn"))
}

/// How many events a subscriber's reader read, once it has ended.
pub(super) async fn events_read(reader: JoinHandle<Result<u64>>) -> Result<u64> {
    reader
        .await
        .map_err(|error| Error::stopped(format!("a bench subscriber failed: {error}")))?
}
