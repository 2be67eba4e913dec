//! The server workload: durable streaming turns driven over HTTP, watched
//! over server-sent events, against the same turns run in-process.
//!
//! A real `keel serve` (the library's [`serve`]) answers on loopback over a
//! SQLite file with the durable default. S sessions run concurrently, each T
//! turns in order: a `POST …/submissions` (answered `202` once the message is
//! stored), then the session's first subscriber waits for the turn's
//! `turn_complete`. The scripted model streams K chunks per answer. Each
//! session has W subscribers on `…/events/stream`; with `stalled`, one of
//! them never reads until every turn is done, and is then drained and
//! checked: it must get every event, in order, without a gap, although it fell
//! behind the live buffer. Every subscriber checks the same.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};

use super::database::{BenchDatabase, BenchStore, Grouping};
use super::stats::percentile;
use keel_protocol::now_ms;
use keel_protocol::{Error, Result};
use keel_server::{ServerConfig, serve};
use keel_store::Synchronous;

/// How long a turn may go without an event before the run fails.
pub(super) const TURN_TIMEOUT: Duration = Duration::from_secs(60);

/// The stalled subscriber's socket receive buffer, in bytes (the kernel
/// may round it up).
const STALLED_RECEIVE_BUFFER: u32 = 4096;

/// Parameters of the workload.
#[derive(Debug, Clone)]
pub struct ServeParams {
    /// Concurrent sessions.
    pub sessions: usize,
    /// Turns per session, run one after the other.
    pub turns: usize,
    /// Text chunks per answer.
    pub chunks: usize,
    /// Bytes per chunk.
    pub chunk_bytes: usize,
    /// Event-stream subscribers per session (at least 1).
    pub subscribers: usize,
    /// Whether one more subscriber per session reads nothing until the end.
    pub stalled: bool,
    /// The database (a fresh temporary SQLite file by default).
    pub database: BenchDatabase,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ServeReport {
    /// Sessions.
    pub sessions: usize,
    /// Turns per session.
    pub turns: usize,
    /// Reading subscribers per session.
    pub subscribers: usize,
    /// Whether each session also had a stalled subscriber.
    pub stalled: bool,
    /// Wall time of the timed part.
    pub wall_s: f64,
    /// Completed turns per second, all sessions together.
    pub turns_per_s: f64,
    /// Median time from sending the POST to its `202`.
    pub accept_p50_ms: f64,
    /// 99th percentile of the same.
    pub accept_p99_ms: f64,
    /// Median time from sending the POST to the first text delta on the
    /// session's first event stream.
    pub first_delta_p50_ms: f64,
    /// Median time from sending the POST to `turn_complete` on that stream.
    pub turn_p50_ms: f64,
    /// Events every subscriber received (each checked gap-free).
    pub events_per_subscriber: u64,
    /// Times a subscriber fell behind the live buffer and read from the
    /// store.
    pub catch_ups: u64,
}

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

/// Runs the workload once on a fresh database and server.
pub async fn run_serve(params: &ServeParams) -> Result<ServeReport> {
    let scratch = tempfile::tempdir().map_err(|error| Error::Config(format!("cannot create a temp dir: {error}")))?;
    let script = scratch.path().join("answers.jsonl");
    // Every session uses the same script, one answer per model call; the
    // warm-up turn uses the first line.
    write_script(&script, params.turns + 1, params.chunks, params.chunk_bytes)?;
    let database = BenchStore::open(
        &params.database,
        "bench-serve.sqlite3",
        Synchronous::Full,
        Grouping::Group,
    )
    .await?;
    let mut config = ServerConfig::new(database.store());
    config.default_model = Some(format!("script:{}", script.display()));
    config.workspace_root = scratch.path().to_owned();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(io_error)?;
    let base = format!("http://{}", listener.local_addr().map_err(io_error)?);
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, config, async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .build()
        .map_err(|error| Error::Config(format!("cannot build the HTTP client: {error}")))?;

    let mut sessions = Vec::new();
    for _ in 0..params.sessions {
        sessions.push(BenchSession::open(&client, &base, params).await?);
    }
    // Warm-up: one turn per session, outside the timing.
    for session in &mut sessions {
        session.turn(&client, &base, "warm-up").await?;
    }

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (index, mut session) in sessions.into_iter().enumerate() {
        let (client, base, turns) = (client.clone(), base.clone(), params.turns);
        tasks.spawn(async move {
            let mut times = Vec::with_capacity(turns);
            for turn in 0..turns {
                times.push(
                    session
                        .turn(&client, &base, &format!("message {turn} of session {index}"))
                        .await?,
                );
            }
            Ok::<_, Error>((session, times))
        });
    }
    let (finished, times) = join_sessions(tasks).await?;
    let wall = started.elapsed();

    let mut events_per_subscriber = 0;
    for session in finished {
        events_per_subscriber = session.finish(&client, &base).await?;
    }
    // A subscriber notices it fell behind when it reads again, so this is
    // read after the stalled ones were drained.
    let catch_ups = catch_ups(&client, &base).await?;
    let _ = stop.send(());
    server
        .await
        .map_err(|error| Error::stopped(format!("the bench server failed: {error}")))?
        .map_err(|error| Error::stopped(format!("the bench server failed: {error}")))?;
    database.close().await;

    let column = |pick: fn(&TurnTimes) -> f64| times.iter().map(pick).collect::<Vec<_>>();
    let accept = column(|times| times.accept_ms);
    Ok(ServeReport {
        sessions: params.sessions,
        turns: params.turns,
        subscribers: params.subscribers.max(1),
        stalled: params.stalled,
        wall_s: wall.as_secs_f64(),
        turns_per_s: times.len() as f64 / wall.as_secs_f64(),
        accept_p50_ms: percentile(&accept, 50.0),
        accept_p99_ms: percentile(&accept, 99.0),
        first_delta_p50_ms: percentile(&column(|times| times.first_delta_ms), 50.0),
        turn_p50_ms: percentile(&column(|times| times.turn_ms), 50.0),
        events_per_subscriber,
        catch_ups,
    })
}

/// The server's `keel_subscriber_catch_ups_total`: how often a subscriber
/// fell behind the live buffer (or saw a gap) and was served from the store.
async fn catch_ups(client: &reqwest::Client, base: &str) -> Result<u64> {
    let text = check(client.get(format!("{base}/metrics")).send().await)
        .await?
        .text()
        .await
        .map_err(http_error)?;
    text.lines()
        .find_map(|line| line.strip_prefix("keel_subscriber_catch_ups_total "))
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| Error::Model("the metrics have no keel_subscriber_catch_ups_total".to_owned()))
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

/// The times of one turn, from sending its POST.
struct TurnTimes {
    accept_ms: f64,
    first_delta_ms: f64,
    turn_ms: f64,
}

/// One session under load: its id, its reading subscribers and the stalled
/// one.
struct BenchSession {
    id: String,
    /// The first subscriber's events, for timing the turns.
    events: mpsc::UnboundedReceiver<WireEvent>,
    /// The reading subscribers, each ending with how many events it saw
    /// once the session is shut down.
    readers: Vec<tokio::task::JoinHandle<Result<u64>>>,
    /// The connection of the subscriber that reads nothing until the end.
    stalled: Option<TcpStream>,
}

/// Creates a session without tools on the server at `base`; its id.
pub(super) async fn create_session(client: &reqwest::Client, base: &str) -> Result<String> {
    let body = json!({"tools": {"builtin": false, "write": false, "shell": false}});
    let created: serde_json::Value = check(client.post(format!("{base}/v1/sessions")).json(&body).send().await)
        .await?
        .json()
        .await
        .map_err(http_error)?;
    created["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::Config("the created session has no id".to_owned()))
}

impl BenchSession {
    async fn open(client: &reqwest::Client, base: &str, params: &ServeParams) -> Result<Self> {
        let id = create_session(client, base).await?;
        let stream_url = format!("{base}/v1/sessions/{id}/events/stream?after=0");
        let (first_sender, events) = mpsc::unbounded_channel();
        let mut first = Some(first_sender);
        let mut readers = Vec::new();
        for _ in 0..params.subscribers.max(1) {
            let response = check(client.get(&stream_url).send().await).await?;
            readers.push(tokio::spawn(read_stream(response, first.take())));
        }
        let stalled = match params.stalled {
            true => Some(open_stalled(base, &format!("/v1/sessions/{id}/events/stream?after=0")).await?),
            false => None,
        };
        Ok(Self {
            id,
            events,
            readers,
            stalled,
        })
    }

    /// Posts `op` to the session; `Ok` once it is answered `202`.
    async fn submit(&self, client: &reqwest::Client, base: &str, op: serde_json::Value) -> Result<()> {
        let url = format!("{base}/v1/sessions/{}/submissions", self.id);
        check(client.post(url).json(&json!({ "op": op })).send().await).await?;
        Ok(())
    }

    /// Submits `text` and waits for its turn to complete.
    async fn turn(&mut self, client: &reqwest::Client, base: &str, text: &str) -> Result<TurnTimes> {
        let started = Instant::now();
        self.submit(client, base, json!({"type": "user_input", "text": text}))
            .await?;
        let accept_ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut first_delta_ms = None;
        loop {
            let event = tokio::time::timeout(TURN_TIMEOUT, self.events.recv())
                .await
                .map_err(|_| Error::stopped(format!("no bench turn event for {TURN_TIMEOUT:?}")))?
                .ok_or_else(|| Error::stopped("the bench event stream ended during a turn"))?;
            match event.kind.as_str() {
                "assistant_content_delta" => {
                    first_delta_ms.get_or_insert_with(|| started.elapsed().as_secs_f64() * 1000.0);
                }
                "turn_complete" => break,
                "turn_aborted" => return Err(Error::Model(format!("bench turn aborted at {}", event.sequence))),
                _ => {}
            }
        }
        Ok(TurnTimes {
            accept_ms,
            first_delta_ms: first_delta_ms.unwrap_or_default(),
            turn_ms: started.elapsed().as_secs_f64() * 1000.0,
        })
    }

    /// Shuts the session down and checks that every subscriber, the
    /// stalled one included, got every event; answers how many.
    async fn finish(self, client: &reqwest::Client, base: &str) -> Result<u64> {
        self.submit(client, base, json!({"type": "shutdown"})).await?;
        let mut counts = Vec::new();
        if let Some(stalled) = self.stalled {
            counts.push(drain_stalled(stalled).await?);
        }
        for reader in self.readers {
            counts.push(
                reader
                    .await
                    .map_err(|error| Error::stopped(format!("a bench subscriber failed: {error}")))??,
            );
        }
        let first = counts.first().copied().unwrap_or_default();
        if counts.iter().any(|count| *count != first) {
            return Err(Error::Model(format!(
                "the subscribers of session '{}' saw different numbers of events: {counts:?}",
                self.id
            )));
        }
        Ok(first)
    }
}

/// Opens the stalled subscriber's stream: a socket with a small receive
/// buffer, so that the server's writes block soon, asking over HTTP/1.0 so
/// that the body is the bare event stream up to the end of the connection.
async fn open_stalled(base: &str, path: &str) -> Result<TcpStream> {
    let address: std::net::SocketAddr = base
        .trim_start_matches("http://")
        .parse()
        .map_err(|error| Error::Config(format!("bad bench address {base}: {error}")))?;
    let socket = TcpSocket::new_v4().map_err(io_error)?;
    socket.set_recv_buffer_size(STALLED_RECEIVE_BUFFER).map_err(io_error)?;
    let mut stream = socket.connect(address).await.map_err(io_error)?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\nAccept: text/event-stream\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(io_error)?;
    Ok(stream)
}

/// Reads the stalled subscriber's whole stream, checked like the others.
async fn drain_stalled(mut stream: TcpStream) -> Result<u64> {
    let mut buffer = Vec::new();
    let mut chunk = vec![0; 64 * 1024];
    let header_end = loop {
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break end + 4;
        }
        let read = stream.read(&mut chunk).await.map_err(io_error)?;
        if read == 0 {
            return Err(Error::stopped(
                "the stalled subscriber's stream ended before its headers",
            ));
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    if !buffer.starts_with(b"HTTP/1.0 200") && !buffer.starts_with(b"HTTP/1.1 200") {
        let head = String::from_utf8_lossy(&buffer[..header_end]).into_owned();
        return Err(Error::Model(format!("the stalled subscriber was answered {head}")));
    }
    buffer.drain(..header_end);
    let body = futures::stream::unfold((stream, chunk), |(mut stream, mut chunk)| async move {
        match stream.read(&mut chunk).await {
            Ok(0) => None,
            Ok(read) => Some((Ok(chunk[..read].to_vec()), (stream, chunk))),
            Err(error) => Some((Err(io_error(error)), (stream, chunk))),
        }
    });
    read_events(futures::stream::iter([Ok(buffer)]).chain(body), None).await
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
async fn read_events(
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
