//! One connection to an MCP server: starting it (a child process over
//! stdio, or streamable HTTP) and the handshake, how it stopped, and what
//! the server tells the client outside answers (progress, log messages, a
//! changed tool list).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

// Logging is deprecated by SEP-2577, but servers in use still send it.
use rmcp::model::{
    CancelledNotificationParam, ClientCapabilities, ClientConfig, Implementation, ProgressNotificationParam,
    ProgressToken, ProtocolVersion, RequestId,
};
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::{ClientInitializeError, NotificationContext, Peer, RunningService};
use rmcp::transport::streamable_http_client::{StreamableHttpClientTransportConfig, StreamableHttpError};
use rmcp::transport::{DynamicTransportError, StreamableHttpClientTransport};
use rmcp::{ClientHandler, RoleClient, ServiceError};
use tokio::time::Instant;

use super::process::ServerProcess;
use super::{McpServerConfig, McpTransport};
use crate::ProgressSink;

/// How long to wait, after the connection to a process was lost, for the
/// process to end, so the error can say how it ended. It is dead already
/// in all but odd cases (it closed its stdout and lives on).
const EXIT_NOTICE: Duration = Duration::from_secs(5);

/// The stderr lines quoted in the error of a call cut short by a crash.
const CRASH_STDERR_LINES: usize = 3;

/// The longest server log message logged, in bytes; the rest is cut.
const MAX_LOG_MESSAGE_BYTES: usize = 4096;

/// What a server tells its client outside answers: progress of calls,
/// log messages, a changed tool list. Shared by the server's connections.
pub(super) struct Notices {
    server: String,
    /// Where each running call's progress goes, by its token.
    progress: Mutex<HashMap<ProgressToken, ProgressSink>>,
    /// Set by `tools/list_changed` (or a restart); cleared by a listing.
    pub(super) tools_stale: AtomicBool,
}

impl Notices {
    pub(super) fn new(server: &str) -> Self {
        Self {
            server: server.to_owned(),
            progress: Mutex::new(HashMap::new()),
            tools_stale: AtomicBool::new(false),
        }
    }
}

/// The route of one call's progress, removed when the call ends.
pub(super) struct ProgressRoute<'a> {
    notices: &'a Notices,
    token: ProgressToken,
}

impl<'a> ProgressRoute<'a> {
    pub(super) fn new(notices: &'a Notices, token: ProgressToken) -> Self {
        if let Some(sink) = ProgressSink::current() {
            notices
                .progress
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(token.clone(), sink);
        }
        Self { notices, token }
    }
}

impl Drop for ProgressRoute<'_> {
    fn drop(&mut self) {
        self.notices
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.token);
    }
}

/// Tells the server a call was abandoned (the turn was interrupted and the
/// call's future dropped), unless disarmed by clearing `peer`.
pub(super) struct CancelOnDrop {
    pub(super) peer: Option<Peer<RoleClient>>,
    pub(super) id: RequestId,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let params = CancelledNotificationParam::new(Some(self.id.clone()), Some("the call was abandoned".to_owned()));
        runtime.spawn(async move {
            // The server may be gone already; nothing to do then.
            let _ = peer.notify_cancelled(params).await;
        });
    }
}

/// Keel as an MCP client: its introduction, and what it does with the
/// server's notifications.
#[derive(Clone)]
pub(super) struct Client {
    notices: Arc<Notices>,
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        client_config()
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        let sink = self
            .notices
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&params.progress_token)
            .cloned();
        match sink {
            Some(sink) => sink.report(params.progress, params.total, params.message),
            None => {
                tracing::debug!(server = %self.notices.server, progress = params.progress, "progress for no running call")
            }
        }
    }

    // Deprecated by SEP-2577, yet what servers in use send.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let server = &self.notices.server;
        let logger = params.logger.as_deref().unwrap_or("");
        let mut message = match &params.data {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        // The server decides the size; a log line stays a line.
        if message.len() > MAX_LOG_MESSAGE_BYTES {
            let mut end = MAX_LOG_MESSAGE_BYTES;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        match params.level {
            LoggingLevel::Debug => tracing::debug!(%server, logger, "MCP server log: {message}"),
            LoggingLevel::Info | LoggingLevel::Notice => tracing::info!(%server, logger, "MCP server log: {message}"),
            LoggingLevel::Warning => tracing::warn!(%server, logger, "MCP server log: {message}"),
            _ => tracing::error!(%server, logger, level = ?params.level, "MCP server log: {message}"),
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server = %self.notices.server, "the MCP server's tool list changed");
        self.notices.tools_stale.store(true, Ordering::SeqCst);
    }
}

/// One started server: the MCP session, and the process behind it for stdio.
pub(super) struct Connection {
    pub(super) service: RunningService<RoleClient, Client>,
    pub(super) process: Option<ServerProcess>,
}

impl Connection {
    /// Starts the server and does the handshake, before `deadline`.
    pub(super) async fn open(
        server: &str,
        config: &McpServerConfig,
        (workspace, launcher): (&Path, Option<&Path>),
        deadline: Instant,
        notices: &Arc<Notices>,
    ) -> Result<Self, String> {
        let client = Client {
            notices: Arc::clone(notices),
        };
        let within = humantime::format_duration(config.startup_timeout);
        match &config.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let cwd = cwd
                    .as_ref()
                    .map_or_else(|| workspace.to_path_buf(), |dir| workspace.join(dir));
                let (process, stdout, stdin) =
                    ServerProcess::spawn(server, (command, args), env, (&cwd, workspace), launcher)
                        .map_err(|error| format!("cannot run '{command}' (in {}): {error}", cwd.display()))?;
                let handshake = tokio::time::timeout_at(deadline, rmcp::serve_client(client.clone(), (stdout, stdin)));
                let mut message = match handshake.await {
                    Ok(Ok(service)) => {
                        return Ok(Self {
                            service,
                            process: Some(process),
                        });
                    }
                    Ok(Err(error)) => {
                        let mut message = format!("the MCP handshake failed: {}", handshake_error(&error));
                        // Most often the process ended; say how.
                        if let Some(ended) = process.wait_ended(EXIT_NOTICE).await {
                            message.push_str(&format!("; the process ended ({ended})"));
                        }
                        message
                    }
                    Err(_) => format!("no answer to the MCP handshake within {within}"),
                };
                process.stop().await;
                if let Some(tail) = process.stderr_tail(usize::MAX) {
                    message.push_str(&format!("; its stderr ended with: {tail}"));
                }
                Err(message)
            }
            McpTransport::Http { url, headers } => {
                let mut custom = HashMap::with_capacity(headers.len());
                for (name, value) in headers {
                    let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|error| format!("invalid header name '{name}': {error}"))?;
                    let mut value = reqwest::header::HeaderValue::from_str(value)
                        .map_err(|error| format!("invalid value for header '{name}': {error}"))?;
                    value.set_sensitive(true);
                    custom.insert(name, value);
                }
                let transport = StreamableHttpClientTransport::from_config(
                    StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom),
                );
                match tokio::time::timeout_at(deadline, rmcp::serve_client(client.clone(), transport)).await {
                    Ok(Ok(service)) => Ok(Self { service, process: None }),
                    Ok(Err(error)) => Err(format!(
                        "the MCP handshake with {url} failed: {}",
                        handshake_error(&error)
                    )),
                    Err(_) => Err(format!("{url} did not answer the MCP handshake within {within}")),
                }
            }
        }
    }

    /// Why the connection can no longer be used, if it cannot.
    pub(super) fn stopped(&self) -> Option<String> {
        if let Some(ended) = self.process.as_ref().and_then(ServerProcess::ended) {
            return Some(format!("the process ended ({ended})"));
        }
        (self.service.is_closed() || self.service.peer().is_transport_closed())
            .then(|| "the connection closed".to_owned())
    }

    /// Why a call lost the connection with `error`.
    pub(super) async fn why_stopped(&self, error: &ServiceError) -> String {
        if let Some(process) = &self.process
            && let Some(ended) = process.wait_ended(EXIT_NOTICE).await
        {
            return match process.stderr_tail(CRASH_STDERR_LINES) {
                Some(tail) => format!("the process ended ({ended}); its stderr ended with: {tail}"),
                None => format!("the process ended ({ended})"),
            };
        }
        match error {
            ServiceError::TransportSend(error) => error_text(error),
            _ => "the connection closed".to_owned(),
        }
    }

    /// Ends the MCP session and, for stdio, waits until the process is gone.
    pub(super) async fn close(&self) {
        // The service loop then closes the transport: the child's stdin.
        self.service.cancellation_token().cancel();
        if let Some(process) = &self.process {
            process.stop().await;
        }
    }
}

/// How Keel introduces itself: no optional client capabilities (no
/// sampling, roots or elicitation), and the `initialize` handshake.
fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("keel", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

/// Why a handshake failed, without the transport's type name.
fn handshake_error(error: &ClientInitializeError) -> String {
    match error {
        ClientInitializeError::TransportError { error, context } => format!("{context}: {}", error_text(error)),
        other => other.to_string(),
    }
}

/// An error and its sources, `: `-separated, each said once, without
/// the transport's type name.
fn error_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(transport) = error.downcast_ref::<DynamicTransportError>() {
            current = Some(transport.error.as_ref());
            continue;
        }
        // The HTTP client's error does not name its cause as a source.
        if let Some(StreamableHttpError::Client(client)) = error.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            current = Some(client);
            continue;
        }
        let text = error.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        current = error.source();
    }
    parts.join(": ")
}
