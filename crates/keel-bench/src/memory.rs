//! What a loaded idle session and an idle event stream cost in memory, as
//! an operator sees it: a real `keel serve` process, N sessions created
//! through the API with the built-in tools on and left idle, then one
//! event-stream subscriber on each, then as many bare kept-alive HTTP
//! connections (one request each), the server's resident set (`VmRSS`)
//! read after each step: the last is the floor under a stream, what any
//! idle connection costs. The client is this process, so its own memory is
//! not counted.
//!
//! The server is warmed up first (sessions and streams that are not
//! counted), so that what is measured is the marginal cost of one more,
//! not the allocator's first arenas or a one-time initialisation.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use serde::Serialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::http::{check, create_session_with, http_client_with, http_error, io_error, write_script};
use super::process::ServeProcess;
use super::stats::median;
use keel_protocol::{Error, Result};

/// Requests in flight at once while sessions are created and streams opened.
const CONCURRENCY: usize = 16;

/// How long memory is left to settle before it is read (freed memory
/// returned, background tasks done).
const SETTLE: Duration = Duration::from_millis(1500);

/// Parameters of the workload.
#[derive(Debug, Clone)]
pub struct MemoryParams {
    /// The `keel` binary to run as the server.
    pub server: PathBuf,
    /// Sessions counted (each with one stream).
    pub sessions: usize,
    /// Sessions (with streams) made before the first reading, not counted.
    pub warm_up: usize,
}

/// What one run measured, in KiB.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    /// Sessions counted.
    pub sessions: usize,
    /// The server's resident set after the warm-up.
    pub base_rss_kib: u64,
    /// After the counted sessions were created and left idle.
    pub sessions_rss_kib: u64,
    /// After a stream was opened on each of them.
    pub streams_rss_kib: u64,
    /// After as many idle kept-alive connections were opened.
    pub connections_rss_kib: u64,
    /// Per loaded idle session.
    pub per_session_kib: f64,
    /// Per idle event stream.
    pub per_stream_kib: f64,
    /// Per idle kept-alive connection that made one request.
    pub per_connection_kib: f64,
}

/// The medians of `reports`' per-session, per-stream and per-connection
/// figures.
pub fn medians(reports: &[MemoryReport]) -> (f64, f64, f64) {
    let of = |figure: fn(&MemoryReport) -> f64| median(&reports.iter().map(figure).collect::<Vec<_>>());
    (
        of(|report| report.per_session_kib),
        of(|report| report.per_stream_kib),
        of(|report| report.per_connection_kib),
    )
}

/// Runs the workload once, on a fresh server and database.
pub async fn run_memory(params: &MemoryParams) -> Result<MemoryReport> {
    if params.sessions == 0 {
        return Err(Error::Config(
            "the memory workload needs at least one session".to_owned(),
        ));
    }
    let dir = tempfile::tempdir().map_err(io_error)?;
    let script = dir.path().join("answer.jsonl");
    write_script(&script, 1, 1, 16)?;
    let server = start_server(params, dir.path(), &script).await?;
    let base = server.base.clone();
    let client = http_client_with(None)?;

    let warm = create_sessions(&client, &base, params.warm_up).await?;
    let mut streams = open_streams(&client, &base, &warm).await?;
    tokio::time::sleep(SETTLE).await;
    let base_rss_kib = server.resident_kib()?;

    let sessions = create_sessions(&client, &base, params.sessions).await?;
    tokio::time::sleep(SETTLE).await;
    let sessions_rss_kib = server.resident_kib()?;

    streams.extend(open_streams(&client, &base, &sessions).await?);
    tokio::time::sleep(SETTLE).await;
    let streams_rss_kib = server.resident_kib()?;

    let connections = open_connections(&base, params.sessions).await?;
    tokio::time::sleep(SETTLE).await;
    let connections_rss_kib = server.resident_kib()?;
    drop(connections);
    drop(streams);
    drop(server);

    let counted = params.sessions as f64;
    Ok(MemoryReport {
        sessions: params.sessions,
        base_rss_kib,
        sessions_rss_kib,
        streams_rss_kib,
        connections_rss_kib,
        per_session_kib: sessions_rss_kib.saturating_sub(base_rss_kib) as f64 / counted,
        per_stream_kib: streams_rss_kib.saturating_sub(sessions_rss_kib) as f64 / counted,
        per_connection_kib: connections_rss_kib.saturating_sub(streams_rss_kib) as f64 / counted,
    })
}

/// Starts `keel serve` on a loopback port with room for every session and
/// stream.
async fn start_server(params: &MemoryParams, dir: &Path, script: &Path) -> Result<ServeProcess> {
    let total = params.warm_up + params.sessions;
    let workspaces = dir.join("workspaces");
    std::fs::create_dir_all(&workspaces).map_err(io_error)?;
    let mut args: Vec<OsString> = vec!["--create".into(), "--db".into(), dir.join("keel.sqlite3").into()];
    args.extend(["--workspace-root".into(), workspaces.into_os_string()]);
    args.extend(["--model".into(), format!("script:{}", script.display()).into()]);
    let counts = [
        ("--store-reserve-mb", 0),
        ("--max-live-sessions", total + 64),
        ("--max-connections", 2 * total + 256),
        ("--idle-unload-secs", 86400),
        ("--header-timeout-secs", 600),
    ];
    for (flag, value) in counts {
        args.extend([flag.into(), value.to_string().into()]);
    }
    ServeProcess::start(&params.server, dir, &args).await
}

/// Creates `count` sessions with the server's default tools (the built-in
/// tools on); their ids.
async fn create_sessions(client: &reqwest::Client, base: &str, count: usize) -> Result<Vec<String>> {
    let defaults = json!({});
    futures::stream::iter(0..count)
        .map(|_| create_session_with(client, base, &defaults))
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

/// Opens an event stream on each session and reads its first chunk (the
/// session's stored events), so that each is a subscriber caught up and
/// waiting; the open responses.
async fn open_streams(client: &reqwest::Client, base: &str, sessions: &[String]) -> Result<Vec<reqwest::Response>> {
    futures::stream::iter(sessions)
        .map(|id| async move {
            let mut response = check(
                client
                    .get(format!("{base}/v1/sessions/{id}/events/stream"))
                    .header(reqwest::header::ACCEPT, "text/event-stream")
                    .send()
                    .await,
            )
            .await?;
            response
                .chunk()
                .await
                .map_err(http_error)?
                .ok_or_else(|| Error::stopped(format!("the event stream of {id} ended at once")))?;
            Ok::<_, Error>(response)
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

/// Opens `count` connections, each sending one `GET /healthz` and reading
/// its answer's head, then left open and idle (kept alive).
async fn open_connections(base: &str, count: usize) -> Result<Vec<TcpStream>> {
    let address = base
        .strip_prefix("http://")
        .ok_or_else(|| Error::Config(format!("the bench server's address {base} is not http://")))?
        .to_owned();
    futures::stream::iter(0..count)
        .map(|_| {
            let address = address.clone();
            async move {
                let mut stream = TcpStream::connect(&address).await.map_err(io_error)?;
                let request = format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\n\r\n");
                stream.write_all(request.as_bytes()).await.map_err(io_error)?;
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|window| window == b"\r\n\r\n") {
                    let read = stream.read(&mut buffer).await.map_err(io_error)?;
                    if read == 0 {
                        return Err(Error::stopped("the bench server closed a connection".to_owned()));
                    }
                    head.extend_from_slice(&buffer[..read]);
                }
                Ok(stream)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}
