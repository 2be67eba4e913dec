//! The server workload: durable streaming turns driven over HTTP, watched
//! over server-sent events, against the same turns run in-process.
//!
//! A real `keel serve` (the library's [`serve`](keel_server::serve)) answers on loopback over a
//! SQLite file with the durable default. S sessions run concurrently, each T
//! turns in order: a `POST …/submissions` (answered `202` once the message is
//! stored), then the session's first subscriber waits for the turn's
//! `turn_complete`. The scripted model streams K chunks per answer. Each
//! session has W subscribers on `…/events/stream`; with `stalled`, one of
//! them never reads until every turn is done, and is then drained and
//! checked: it must get every event, in order, without a gap, although it fell
//! behind the live buffer. Every subscriber checks the same.

use std::time::Instant;

use futures::StreamExt;
use serde::Serialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;

use super::auth::{self, BenchAuth};
use super::database::{BenchDatabase, BenchStore, Grouping};
use super::frontends::{BenchVia, Thread, TurnTimes, protocol_turn};
use super::http::{
    BenchServer, WireEvent, check, create_session, events_read, http_client_with, http_error, io_error, join_sessions,
    next_turn_event, read_events, read_stream, write_script,
};
use super::stats::percentile;
use super::webhook_sink::WebhookSink;
use keel_protocol::{Error, Result};
use keel_server::ServerConfig;
use keel_store::Synchronous;

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
    /// The credential every request carries.
    pub auth: BenchAuth,
    /// How the turns are driven and watched: the native API, or a
    /// front-end protocol's stream (then no event-stream subscriber).
    pub via: BenchVia,
    /// Whether an endpoint receives a webhook for every `turn_complete`
    /// (posted to a receiver in this process).
    pub webhook: bool,
    /// Whether every turn's spans are exported over OTLP (to a receiver in
    /// this process that answers at once).
    pub traces: bool,
    /// Whether a budget watches the turns' tenant (one no turn spends, with
    /// a concurrency cap no burst reaches): what admission and the step
    /// gate cost, each turn's slot taken and given back included.
    pub budgets: bool,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ServeReport {
    /// Sessions.
    pub sessions: usize,
    /// Turns per session.
    pub turns: usize,
    /// Reading subscribers per session (none when a protocol's stream
    /// watched the turns).
    pub subscribers: usize,
    /// Whether each session also had a stalled subscriber.
    pub stalled: bool,
    /// The credential every request carried.
    pub auth: &'static str,
    /// How the turns were driven.
    pub via: &'static str,
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
    /// Webhook deliveries received (with [`ServeParams::webhook`]).
    pub webhook_deliveries: usize,
    /// Median time from an event's commit to its delivery's arrival.
    pub webhook_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub webhook_p99_ms: Option<f64>,
    /// Spans the server exported (with [`ServeParams::traces`]).
    pub spans_exported: u64,
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
    let credentials = auth::prepare(params.auth, &mut config, database.access(), scratch.path()).await?;
    if params.budgets {
        config.access = Some(database.access());
        let budget = keel_config::BudgetConfig {
            total_tokens: Some(u64::MAX / 4),
            max_concurrent_turns: Some(params.sessions as u64 * 2),
            ..keel_config::BudgetConfig::default()
        };
        config
            .keel
            .tenants
            .entry(credentials.tenant.to_owned())
            .or_default()
            .budget = Some(budget);
    }
    let traces_sink = if params.traces {
        let sink = WebhookSink::start().await?;
        config.keel.telemetry.endpoint = Some(sink.base.clone());
        Some(sink)
    } else {
        None
    };
    // As `keel serve` does: the outbox is there, with or without an
    // endpoint.
    config.webhooks = Some(database.webhooks());
    let sink = if params.webhook {
        config.keel.webhooks.allow_http = true;
        config.keel.webhooks.allow_private = vec![
            "127.0.0.1/32"
                .parse()
                .map_err(|_| Error::Config("a network".to_owned()))?,
        ];
        Some(WebhookSink::start().await?)
    } else {
        None
    };
    let server = BenchServer::start(config).await?;
    let base = server.base.clone();
    let client = http_client_with(credentials.bearer.as_deref())?;
    let operator = http_client_with(credentials.operator.as_deref())?;
    if let Some(sink) = &sink {
        let endpoint = serde_json::json!({"url": sink.url, "event_types": ["turn_complete"]});
        check(
            operator
                .post(format!("{base}/v1/webhooks"))
                .json(&endpoint)
                .send()
                .await,
        )
        .await?;
    }

    let mut sessions = Vec::new();
    for _ in 0..params.sessions {
        sessions.push(BenchSession::open(&client, &base, params, credentials.bearer.as_deref()).await?);
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
        // Shutting a session down is the operator's (`admin`), whatever
        // credential drove its turns.
        events_per_subscriber = session.finish(&operator, &base).await?;
    }
    // A subscriber notices it fell behind when it reads again, so this is
    // read after the stalled ones were drained.
    let catch_ups = catch_ups(&operator, &base).await?;
    let spans_exported = match &traces_sink {
        // The exporter posts a batch at most half a second after a span.
        Some(_) => {
            tokio::time::sleep(std::time::Duration::from_millis(700)).await;
            counter(&operator, &base, "keel_spans_exported_total").await?
        }
        None => 0,
    };
    // Every turn's delivery (the warm-up's included) has arrived.
    let latencies = match &sink {
        Some(sink) => {
            let expected = params.sessions * (params.turns + 1);
            let deadline = Instant::now() + std::time::Duration::from_secs(60);
            while sink.latencies().len() < expected && Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            sink.latencies()
        }
        None => Vec::new(),
    };
    server.stop("the bench server").await?;
    database.close().await;

    let column = |pick: fn(&TurnTimes) -> f64| times.iter().map(pick).collect::<Vec<_>>();
    let accept = column(|times| times.accept_ms);
    Ok(ServeReport {
        sessions: params.sessions,
        turns: params.turns,
        subscribers: match params.via {
            BenchVia::Native => params.subscribers.max(1),
            _ => 0,
        },
        stalled: params.stalled,
        auth: params.auth.name(),
        via: params.via.name(),
        wall_s: wall.as_secs_f64(),
        turns_per_s: times.len() as f64 / wall.as_secs_f64(),
        accept_p50_ms: percentile(&accept, 50.0),
        accept_p99_ms: percentile(&accept, 99.0),
        first_delta_p50_ms: percentile(&column(|times| times.first_delta_ms), 50.0),
        turn_p50_ms: percentile(&column(|times| times.turn_ms), 50.0),
        events_per_subscriber,
        catch_ups,
        webhook_deliveries: latencies.len(),
        webhook_p50_ms: (!latencies.is_empty()).then(|| percentile(&latencies, 50.0)),
        webhook_p99_ms: (!latencies.is_empty()).then(|| percentile(&latencies, 99.0)),
        spans_exported,
    })
}

/// A counter of the server's metrics.
async fn counter(client: &reqwest::Client, base: &str, name: &str) -> Result<u64> {
    let text = check(client.get(format!("{base}/metrics")).send().await)
        .await?
        .text()
        .await
        .map_err(http_error)?;
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
        .ok_or_else(|| Error::Model(format!("the metrics have no {name}")))
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
    /// How its turns are driven.
    via: BenchVia,
    /// What a protocol client keeps between turns.
    thread: Thread,
}

impl BenchSession {
    async fn open(client: &reqwest::Client, base: &str, params: &ServeParams, bearer: Option<&str>) -> Result<Self> {
        let id = create_session(client, base).await?;
        let stream_url = format!("{base}/v1/sessions/{id}/events/stream?after=0");
        let (first_sender, events) = mpsc::unbounded_channel();
        let mut first = Some(first_sender);
        let mut readers = Vec::new();
        // A protocol's stream is the turn's only reader.
        let subscribers = match params.via {
            BenchVia::Native => params.subscribers.max(1),
            _ => 0,
        };
        for _ in 0..subscribers {
            let response = check(client.get(&stream_url).send().await).await?;
            readers.push(tokio::spawn(read_stream(response, first.take())));
        }
        let stalled = match params.stalled {
            true => Some(open_stalled(base, &format!("/v1/sessions/{id}/events/stream?after=0"), bearer).await?),
            false => None,
        };
        Ok(Self {
            id,
            events,
            readers,
            stalled,
            via: params.via,
            thread: Thread::default(),
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
        if self.via != BenchVia::Native {
            return protocol_turn(self.via, client, base, &self.id, &mut self.thread, text).await;
        }
        let started = Instant::now();
        self.submit(client, base, json!({"type": "user_input", "text": text}))
            .await?;
        let accept_ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut first_delta_ms = None;
        loop {
            let event = next_turn_event(&mut self.events).await?;
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
            counts.push(events_read(reader).await?);
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
/// that the body is the bare event stream up to the end of the connection;
/// with `bearer`, if given.
async fn open_stalled(base: &str, path: &str, bearer: Option<&str>) -> Result<TcpStream> {
    let address: std::net::SocketAddr = base
        .trim_start_matches("http://")
        .parse()
        .map_err(|error| Error::Config(format!("bad bench address {base}: {error}")))?;
    let socket = TcpSocket::new_v4().map_err(io_error)?;
    socket.set_recv_buffer_size(STALLED_RECEIVE_BUFFER).map_err(io_error)?;
    let mut stream = socket.connect(address).await.map_err(io_error)?;
    let authorization = bearer.map_or_else(String::new, |bearer| format!("Authorization: Bearer {bearer}\r\n"));
    let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\nAccept: text/event-stream\r\n{authorization}\r\n");
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
