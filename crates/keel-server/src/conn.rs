//! Connections: accepting them within limits, serving each over HTTP/1.1,
//! draining them at shutdown.
//!
//! Everything here happens before a request is authenticated, so every
//! resource a connection holds is bounded: the time to send a request head
//! (which hyper also counts while a kept-alive connection waits for its
//! next request, so it is the idle timeout too), the size of the head, and
//! the number of connections at once. A connection in the middle of a
//! request (an event stream) or upgraded (a WebSocket) is not timed out.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// The default time a connection gets to send a complete request head,
/// counted from when it opens or finished its previous exchange.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The default bound on connections open at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// The default bound on the size of a request head.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 32 * 1024;

/// File descriptors left for everything but client connections: the
/// database, sessions' files, tool processes' pipes, MCP servers.
const RESERVED_FDS: u64 = 256;

/// hyper's smallest read buffer.
const MIN_BUFFER: usize = 8192;

/// How connections are limited.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    pub(crate) header_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) max_header_bytes: usize,
}

/// Raises this process's soft limit on open files to its hard limit, so
/// that the connection bound, not `EMFILE`, is what refuses connections.
/// Returns the soft limit in force afterwards.
pub fn raise_open_file_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard {
        if let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::warn!(%error, soft, hard, "cannot raise the open-file limit");
            return Some(soft);
        }
        tracing::debug!(from = soft, to = hard, "raised the open-file limit");
    }
    Some(hard.max(soft))
}

/// The connection bound actually used: the configured one, kept below the
/// open-file limit so that accepting never fails for lack of descriptors.
fn connection_cap(configured: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit};
    let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return configured;
    };
    let room = usize::try_from(soft.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
    let cap = configured.min(room.max(1));
    if cap < configured {
        tracing::warn!(
            configured,
            cap,
            open_file_limit = soft,
            "the open-file limit bounds connections below the configured number"
        );
    }
    cap
}

/// Accepts connections on `listener` and serves `app` on them until
/// `stopping` resolves; then stops accepting, shuts every connection down
/// gracefully (in-flight requests are answered) and returns once all have
/// closed.
pub(crate) async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stopping: impl Future<Output = ()>,
) {
    let cap = connection_cap(limits.max_connections);
    let permits = Arc::new(Semaphore::new(cap));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(MIN_BUFFER));
    let service = TowerToHyperService::new(app);
    let (closing, closing_watch) = watch::channel(false);
    let mut stopping = std::pin::pin!(stopping);
    let mut saturated = false;
    loop {
        let permit = match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if !saturated {
                    tracing::warn!(cap, "connection bound reached; new connections wait");
                    saturated = true;
                }
                tokio::select! {
                    () = &mut stopping => break,
                    permit = Arc::clone(&permits).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        // The semaphore is never closed.
                        Err(_) => break,
                    },
                }
            }
        };
        let stream = tokio::select! {
            () = &mut stopping => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    accept_failed(&error).await;
                    continue;
                }
            },
        };
        if permits.available_permits() > 0 {
            saturated = false;
        }
        // Events are small writes that must leave at once: with Nagle's
        // algorithm on, a stream's first event after its headers waited
        // for the client's delayed ACK (40 ms on Linux).
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "TCP_NODELAY not set on a connection");
        }
        let connection = builder
            .serve_connection(TokioIo::new(stream), service.clone())
            .with_upgrades();
        let mut closing = closing_watch.clone();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                // An error means the server is gone: close as well. (The
                // guard `wait_for` returns is dropped here, not held.)
                () = async { drop(closing.wait_for(|closing| *closing).await) } => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    closing.send_replace(true);
    // Every connection holds a permit until it closes.
    let all = u32::try_from(cap).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
}

/// After a failed `accept`: nothing for a connection the peer gave up on;
/// otherwise (out of descriptors, say) log it and wait a moment rather
/// than spin.
async fn accept_failed(error: &std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accepting a connection failed");
    tokio::time::sleep(Duration::from_millis(200)).await;
}
