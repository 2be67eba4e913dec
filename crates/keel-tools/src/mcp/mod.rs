//! MCP tool servers: the tools of Model Context Protocol servers, offered to
//! the model as Keel [`Tool`]s.
//!
//! A session starts the servers of `[mcp.servers]` with [`start_servers`]
//! (each one is an [`McpServer`]: a child process spoken to over stdio, or a
//! streamable-HTTP endpoint), and adds their tools to its
//! [`ToolSet`](super::ToolSet). Each remote tool is named `{server}__{tool}`
//! when that fits the providers' rules (`[A-Za-z0-9_-]`, at most 64
//! characters); otherwise other characters become `_`, the name is cut, and
//! a hash of the full name is appended, so names stay distinct and stable.
//! A tool is described by the server, takes the server's input schema (made
//! an object schema with `properties`), and only reads, which also makes it
//! parallel safe, when the server says so (`annotations.readOnlyHint`).
//! Servers are spoken to as a client with no optional capabilities (no
//! sampling, roots or elicitation) and the `initialize` handshake; a
//! child process inherits only `PATH`, `HOME` and a few such variables,
//! never the runtime's API keys, plus its configured `env`.
//!
//! **Results.** The text content of a result is joined with newlines; an
//! image, audio clip, binary resource or resource link becomes a one-line
//! placeholder (`[image: image/png, 1234 bytes]`); an embedded text resource
//! keeps its text under a `[resource: URI]` line. A result flagged `isError`
//! is a failed call with that text; a JSON-RPC error, a reply that is not a
//! tool result, or no reply within the server's `timeout` is a failed call
//! whose message names the server and the tool.
//!
//! **Notifications.** Each call carries a progress token: the server's
//! `notifications/progress` for it go to the call's [`ProgressSink`] (the
//! agent records them as `tool_call_progress` events) and restart the
//! call's `timeout`, so a long call that keeps reporting is not cut. Log
//! messages (`notifications/message`) are logged through `tracing` at the
//! matching level, with the server's name. `notifications/tools/list_changed`
//! marks the list stale: the server, watched as a [`ToolSource`], lists its
//! tools again when the session next refreshes its set (before a model
//! step), and so does a restarted server.
//!
//! **Crashes.** When the server's process dies (or its HTTP transport
//! fails), the call under way fails with "the MCP server 'x' stopped: …". A
//! server found stopped before a call is restarted first (new process,
//! handshake; its tools are listed again at the next refresh), so that call
//! runs normally.
//!
//! **Architecture invariant:** a server has at most one live process: the
//! old one is stopped and waited for before a new one is started, and the
//! process goes away with the last [`Arc`] of its [`McpServer`] (held by its
//! tools): stdin closed, then `SIGTERM`, then `SIGKILL` to its process
//! group, then reaped, so nothing is left behind, zombies included. A
//! command ends with [`stop_all_servers`], so that this graceful stop runs
//! before the async runtime ends (which would kill the groups outright).

mod config;
mod naming;
mod process;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

// Logging is deprecated by SEP-2577, but servers in use still send it.
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam, ClientCapabilities,
    ClientConfig, ClientRequest, ContentBlock, Implementation, ProgressNotificationParam, ProgressToken,
    ProtocolVersion, RequestId, ResourceContents, ServerResult,
};
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::{ClientInitializeError, NotificationContext, Peer, PeerRequestOptions, RunningService};
use rmcp::transport::streamable_http_client::{StreamableHttpClientTransportConfig, StreamableHttpError};
use rmcp::transport::{DynamicTransportError, StreamableHttpClientTransport};
use rmcp::{ClientHandler, RoleClient, ServiceError};
use tokio::time::Instant;

pub use self::config::*;
use self::process::ServerProcess;
use super::{ProgressSink, Tool, ToolContext, ToolError, ToolSource};
use keel_model::{BoxFuture, ToolSpec};

/// Stops every MCP server process this process still runs, the graceful
/// way (stdin closed, then `SIGTERM`, then `SIGKILL` to its process
/// group), and waits until each one is reaped, at most `limit`; returns how
/// many were left. Call it at the end of a command, after its sessions shut
/// down: when the async runtime ends, the tasks that would stop the servers
/// gracefully end with it, and the servers are killed outright.
pub async fn stop_all_servers(limit: Duration) -> usize {
    process::stop_all(limit).await
}

/// How long to wait, after the connection to a process was lost, for the
/// process to end, so the error can say how it ended. It is dead already
/// in all but odd cases (it closed its stdout and lives on).
const EXIT_NOTICE: Duration = Duration::from_secs(5);

/// The stderr lines quoted in the error of a call cut short by a crash.
const CRASH_STDERR_LINES: usize = 3;

/// The longest server log message logged, in bytes; the rest is cut.
const MAX_LOG_MESSAGE_BYTES: usize = 4096;

/// Why an MCP server could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server's entry is invalid; retrying fails the same way.
    #[error("MCP server '{server}': {message}")]
    Config {
        /// The server's name.
        server: String,
        /// What is wrong.
        message: String,
    },
    /// The server could not be started, did not finish the handshake or did
    /// not list its tools in time. Retrying helps only if the cause passed.
    #[error("the MCP server '{server}' failed to start: {message}")]
    Start {
        /// The server's name.
        server: String,
        /// What went wrong, with how the process ended and the end of its
        /// stderr when there is one.
        message: String,
    },
}

impl McpError {
    /// The name of the server concerned.
    pub fn server(&self) -> &str {
        match self {
            Self::Config { server, .. } | Self::Start { server, .. } => server,
        }
    }
}

/// The MCP servers started for one session, their tools, and the servers
/// that could not be started.
pub struct McpServers {
    servers: Vec<Arc<McpServer>>,
    tools: Vec<Arc<dyn Tool>>,
    failures: Vec<McpError>,
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServers")
            .field("servers", &self.servers)
            .field("failures", &self.failures)
            .finish()
    }
}

impl McpServers {
    /// The tools of every started server, server by server (in name order);
    /// add them to the session's [`ToolSet`](super::ToolSet). They keep
    /// their servers running: drop them (and [`Self::servers`]) to stop the
    /// servers.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    /// The servers that started.
    pub fn servers(&self) -> &[Arc<McpServer>] {
        &self.servers
    }

    /// The servers that did not start (each error names its server).
    pub fn failures(&self) -> &[McpError] {
        &self.failures
    }
}

/// Starts, at the same time, every enabled server of `config` for a session
/// working in `workspace` (the servers' default directory), and returns
/// their tools.
///
/// A server that fails to start is left out, logged and reported in
/// [`McpServers::failures`]; the session goes on with the others (a broken
/// or slow tool server should not keep a session from running). A caller
/// that wants all or nothing checks that the failures are empty.
pub async fn start_servers(config: &McpConfig, workspace: &Path) -> McpServers {
    let starting = config
        .servers
        .iter()
        .filter(|(_, server)| server.enabled)
        .map(|(name, server)| McpServer::start(name, server, workspace));
    let mut servers = Vec::new();
    let mut failures = Vec::new();
    for result in futures::future::join_all(starting).await {
        match result {
            Ok(server) => servers.push(server),
            Err(error) => {
                tracing::warn!(server = error.server(), %error, "an MCP server did not start; its tools are left out");
                failures.push(error);
            }
        }
    }
    let mut names = BTreeSet::new();
    let mut tools = Vec::new();
    for server in &servers {
        for tool in server.tools() {
            let name = tool.spec().name;
            if names.insert(name.clone()) {
                tools.push(tool);
            } else {
                tracing::warn!(server = %server.name, tool = %name, "another MCP tool has this name; this one is left out");
            }
        }
    }
    McpServers {
        servers,
        tools,
        failures,
    }
}

/// A remote tool as the model sees it.
#[derive(Debug)]
struct RemoteTool {
    /// The server's name for it.
    remote: String,
    spec: ToolSpec,
    read_only: bool,
}

/// One MCP server of a session: its connection (restarted when it stops)
/// and the tools it listed when it first started.
pub struct McpServer {
    name: String,
    config: McpServerConfig,
    workspace: PathBuf,
    /// The tools last listed.
    tools: RwLock<Vec<Arc<RemoteTool>>>,
    /// What the server tells the client, shared by its connections.
    notices: Arc<Notices>,
    /// The connection in use; replaced, under this lock, when it stopped.
    live: tokio::sync::Mutex<Option<Arc<Connection>>>,
    /// The id of the process last started (0 for none, or HTTP).
    pid: AtomicU32,
    starts: AtomicU64,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("transport", &self.config.transport)
            .field(
                "tools",
                &self
                    .listed()
                    .iter()
                    .map(|tool| tool.spec.name.clone())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl McpServer {
    /// Starts the server `name` described by `config` (a relative `cwd` is
    /// taken from `workspace`, the default directory), does the MCP
    /// handshake and lists its tools, all within its startup timeout.
    pub async fn start(name: &str, config: &McpServerConfig, workspace: &Path) -> Result<Arc<Self>, McpError> {
        config.check(name).map_err(|message| McpError::Config {
            server: name.to_owned(),
            message,
        })?;
        let failed = |message: String| McpError::Start {
            server: name.to_owned(),
            // One line, for the warning event a session records.
            message: message.replace(['\r', '\n'], " "),
        };
        let deadline = Instant::now() + config.startup_timeout;
        let notices = Arc::new(Notices::new(name));
        let connection = Connection::open(name, config, workspace, deadline, &notices)
            .await
            .map_err(failed)?;
        let tools = match list_tools(name, &connection, deadline, config.startup_timeout).await {
            Ok(tools) => tools,
            Err(message) => {
                connection.close().await;
                return Err(failed(message));
            }
        };
        tracing::info!(server = name, tools = tools.len(), "MCP server started");
        let server = Self {
            name: name.to_owned(),
            config: config.clone(),
            workspace: workspace.to_path_buf(),
            tools: RwLock::new(tools),
            notices,
            live: tokio::sync::Mutex::new(None),
            pid: AtomicU32::new(0),
            starts: AtomicU64::new(0),
        };
        let connection = Arc::new(connection);
        server.record_start(&connection);
        *server.live.lock().await = Some(connection);
        Ok(Arc::new(server))
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its tools (the ones last listed), as Keel tools. Each keeps the
    /// server alive.
    pub fn tools(self: &Arc<Self>) -> Vec<Arc<dyn Tool>> {
        self.listed()
            .iter()
            .map(|tool| -> Arc<dyn Tool> {
                Arc::new(McpTool {
                    server: Arc::clone(self),
                    tool: Arc::clone(tool),
                })
            })
            .collect()
    }

    /// Its tools as a [`ToolSource`]: a [`ToolSet`](super::ToolSet) watching
    /// it takes in the new list after `tools/list_changed` or a restart.
    pub fn tool_source(self: &Arc<Self>) -> Arc<dyn ToolSource> {
        Arc::new(Source(Arc::clone(self)))
    }

    fn listed(&self) -> Vec<Arc<RemoteTool>> {
        self.tools.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Lists the tools again if the server said they changed (or it was
    /// restarted); whether they differ from the ones known. A failed
    /// listing keeps the known tools until the server next says they
    /// changed or is restarted (not at every step: each try may take the
    /// server's whole timeout).
    async fn refresh_tools(&self) -> bool {
        if !self.notices.tools_stale.swap(false, Ordering::SeqCst) {
            return false;
        }
        let connection = match self.connection().await {
            Ok(connection) => connection,
            Err(why) => {
                tracing::warn!(server = %self.name, %why, "the MCP server could not be restarted to list its tools");
                return false;
            }
        };
        let deadline = Instant::now() + self.config.timeout;
        let fresh = match list_tools(&self.name, &connection, deadline, self.config.timeout).await {
            Ok(fresh) => fresh,
            Err(why) => {
                tracing::warn!(server = %self.name, %why, "the MCP server's changed tool list could not be read");
                return false;
            }
        };
        let mut tools = self.tools.write().unwrap_or_else(PoisonError::into_inner);
        let same = tools.len() == fresh.len()
            && tools
                .iter()
                .zip(&fresh)
                .all(|(old, new)| old.remote == new.remote && old.spec == new.spec && old.read_only == new.read_only);
        if !same {
            tracing::info!(server = %self.name, tools = fresh.len(), "the MCP server's tools changed");
            *tools = fresh;
        }
        !same
    }

    /// The id of the process last started for this server (it may have
    /// ended since); `None` for an HTTP server.
    pub fn process_id(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::SeqCst)).filter(|pid| *pid != 0)
    }

    /// How many times the server was started: 1, plus one per restart.
    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::SeqCst)
    }

    /// Stops the server now and waits until its process is gone. A later
    /// call starts it again.
    pub async fn shutdown(&self) {
        let mut live = self.live.lock().await;
        if let Some(connection) = live.take() {
            connection.close().await;
        }
    }

    fn record_start(&self, connection: &Connection) {
        let pid = connection.process.as_ref().map_or(0, ServerProcess::pid);
        self.pid.store(pid, Ordering::SeqCst);
        self.starts.fetch_add(1, Ordering::SeqCst);
    }

    /// The live connection; a stopped one is replaced first.
    async fn connection(&self) -> Result<Arc<Connection>, String> {
        let mut live = self.live.lock().await;
        if let Some(current) = live.as_ref() {
            match current.stopped() {
                None => return Ok(Arc::clone(current)),
                Some(why) => tracing::warn!(server = %self.name, %why, "the MCP server stopped; restarting it"),
            }
        }
        if let Some(old) = live.take() {
            old.close().await;
        }
        let deadline = Instant::now() + self.config.startup_timeout;
        let fresh =
            Arc::new(Connection::open(&self.name, &self.config, &self.workspace, deadline, &self.notices).await?);
        self.record_start(&fresh);
        // The new process may offer other tools.
        self.notices.tools_stale.store(true, Ordering::SeqCst);
        *live = Some(Arc::clone(&fresh));
        Ok(fresh)
    }

    /// Drops `connection` (if still the live one) and waits until its
    /// process is gone, so the next call starts a new one.
    async fn forget(&self, connection: &Arc<Connection>) {
        let mut live = self.live.lock().await;
        if live.as_ref().is_some_and(|current| Arc::ptr_eq(current, connection)) {
            live.take();
        }
        connection.close().await;
    }

    /// Calls the remote tool `tool`.
    async fn call(
        &self,
        tool: &RemoteTool,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ToolError> {
        let server = &self.name;
        let remote = &tool.remote;
        let connection = self.connection().await.map_err(|message| {
            ToolError::Failed(format!("the MCP server '{server}' could not be restarted: {message}"))
        })?;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new(remote.clone()).with_arguments(arguments),
        ));
        // The timeout restarts at each progress notification for the call.
        let options = PeerRequestOptions::with_timeout(self.config.timeout).reset_timeout_on_progress();
        let peer = connection.service.peer();
        let answer = match peer.send_request_with_option(request, options).await {
            Ok(handle) => {
                let _route = ProgressRoute::new(&self.notices, handle.progress_token.clone());
                let mut cancel = CancelOnDrop {
                    peer: Some(peer.clone()),
                    id: handle.id.clone(),
                };
                let answer = handle.await_response().await;
                cancel.peer = None;
                // The client handles notifications in tasks of their own,
                // spawned as they arrive: the ones read before the answer
                // (its last progress) get their turn before the route goes.
                tokio::task::yield_now().await;
                answer
            }
            Err(error) => Err(error),
        };
        let error = match answer {
            Ok(ServerResult::CallToolResult(result)) => return render(result, server, remote),
            // A result without `content` decodes as an empty one.
            Ok(ServerResult::EmptyResult(_)) => return render(CallToolResult::default(), server, remote),
            Ok(_) => ServiceError::UnexpectedResponse,
            Err(ServiceError::Timeout { .. }) => {
                return Err(ToolError::Failed(format!(
                    "the MCP server '{server}' did not answer the call to '{remote}' within {}",
                    humantime::format_duration(self.config.timeout)
                )));
            }
            Err(error) => error,
        };
        Err(ToolError::Failed(match error {
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                let why = connection.why_stopped(&error).await;
                tracing::warn!(%server, tool = %remote, %why, "the MCP server stopped during a call");
                self.forget(&connection).await;
                format!("the MCP server '{server}' stopped: {why}; it will be restarted on the next call")
            }
            ServiceError::McpError(error) => {
                format!("the MCP server '{server}' refused the call to '{remote}': {error}")
            }
            ServiceError::UnexpectedResponse => {
                format!(
                    "the MCP server '{server}' answered the call to '{remote}' with something that is not a tool result"
                )
            }
            other => format!("the call to '{remote}' on the MCP server '{server}' failed: {other}"),
        }))
    }
}

/// A server's tools as a [`ToolSource`].
struct Source(Arc<McpServer>);

impl ToolSource for Source {
    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.0.tools()
    }

    fn refresh(&self) -> BoxFuture<'_, bool> {
        Box::pin(self.0.refresh_tools())
    }
}

/// Lists the tools of the server `name` on `connection`, before `deadline`
/// (`within` is the time that gave, for the error), as the model sees them.
async fn list_tools(
    name: &str,
    connection: &Connection,
    deadline: Instant,
    within: Duration,
) -> Result<Vec<Arc<RemoteTool>>, String> {
    let listed = match tokio::time::timeout_at(deadline, connection.service.peer().list_all_tools()).await {
        Ok(Ok(listed)) => listed,
        Ok(Err(error)) => return Err(format!("listing its tools failed: {error}")),
        Err(_) => {
            return Err(format!(
                "it did not list its tools within {}",
                humantime::format_duration(within)
            ));
        }
    };
    let mut tools: Vec<Arc<RemoteTool>> = Vec::with_capacity(listed.len());
    for tool in listed {
        let spec_name = naming::tool_name(name, &tool.name);
        if tools.iter().any(|known| known.spec.name == spec_name) {
            tracing::warn!(server = name, tool = %tool.name, "the MCP server lists this tool twice; the first is kept");
            continue;
        }
        let (parameters, problem) = naming::parameters(&tool.input_schema);
        if let Some(problem) = problem {
            tracing::warn!(server = name, tool = %tool.name, "{problem}");
        }
        let description = tool
            .description
            .as_deref()
            .filter(|text| !text.trim().is_empty())
            .map(str::to_owned)
            .or_else(|| tool.title.clone())
            .unwrap_or_else(|| format!("The tool '{}' of the MCP server '{name}'.", tool.name));
        let read_only = tool
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.read_only_hint)
            .unwrap_or(false);
        tools.push(Arc::new(RemoteTool {
            remote: tool.name.into_owned(),
            spec: ToolSpec {
                name: spec_name,
                description,
                parameters,
            },
            read_only,
        }));
    }
    Ok(tools)
}

/// What a server tells its client outside answers: progress of calls,
/// log messages, a changed tool list. Shared by the server's connections.
struct Notices {
    server: String,
    /// Where each running call's progress goes, by its token.
    progress: Mutex<HashMap<ProgressToken, ProgressSink>>,
    /// Set by `tools/list_changed` (or a restart); cleared by a listing.
    tools_stale: AtomicBool,
}

impl Notices {
    fn new(server: &str) -> Self {
        Self {
            server: server.to_owned(),
            progress: Mutex::new(HashMap::new()),
            tools_stale: AtomicBool::new(false),
        }
    }
}

/// The route of one call's progress, removed when the call ends.
struct ProgressRoute<'a> {
    notices: &'a Notices,
    token: ProgressToken,
}

impl<'a> ProgressRoute<'a> {
    fn new(notices: &'a Notices, token: ProgressToken) -> Self {
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
struct CancelOnDrop {
    peer: Option<Peer<RoleClient>>,
    id: RequestId,
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
struct Client {
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

/// A remote tool, as a Keel tool.
struct McpTool {
    server: Arc<McpServer>,
    tool: Arc<RemoteTool>,
}

impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.tool.spec.clone()
    }

    fn read_only(&self) -> bool {
        self.tool.read_only
    }

    fn call<'a>(
        &'a self,
        arguments: serde_json::Map<String, serde_json::Value>,
        _context: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(self.server.call(&self.tool, arguments))
    }
}

/// One started server: the MCP session, and the process behind it for stdio.
struct Connection {
    service: RunningService<RoleClient, Client>,
    process: Option<ServerProcess>,
}

impl Connection {
    /// Starts the server and does the handshake, before `deadline`.
    async fn open(
        server: &str,
        config: &McpServerConfig,
        workspace: &Path,
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
                let (process, stdout, stdin) = ServerProcess::spawn(server, command, args, env, &cwd)
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
    fn stopped(&self) -> Option<String> {
        if let Some(ended) = self.process.as_ref().and_then(ServerProcess::ended) {
            return Some(format!("the process ended ({ended})"));
        }
        (self.service.is_closed() || self.service.peer().is_transport_closed())
            .then(|| "the connection closed".to_owned())
    }

    /// Why a call lost the connection with `error`.
    async fn why_stopped(&self, error: &ServiceError) -> String {
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
    async fn close(&self) {
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

/// A tool result as text for the model; an `isError` result is a failure.
fn render(result: CallToolResult, server: &str, tool: &str) -> Result<String, ToolError> {
    let mut parts: Vec<String> = result.content.iter().map(describe).collect();
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    let text = parts.join("\n");
    if result.is_error == Some(true) {
        return Err(ToolError::Failed(if text.is_empty() {
            format!("the MCP server '{server}' reported that '{tool}' failed, without a message")
        } else {
            text
        }));
    }
    if text.is_empty() {
        return Ok("(the tool returned no content)".to_owned());
    }
    Ok(text)
}

/// One content block as text: text as it is, the rest as a placeholder line.
fn describe(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => format!("[image: {}, {} bytes]", image.mime_type, decoded_len(&image.data)),
        ContentBlock::Audio(audio) => format!("[audio: {}, {} bytes]", audio.mime_type, decoded_len(&audio.data)),
        ContentBlock::Resource(resource) => match &resource.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => format!("[resource: {uri}]\n{text}"),
            ResourceContents::BlobResourceContents {
                uri, mime_type, blob, ..
            } => format!(
                "[resource: {uri}, {}, {} bytes]",
                mime_type.as_deref().unwrap_or("binary"),
                decoded_len(blob)
            ),
            _ => "[resource of an unknown kind]".to_owned(),
        },
        ContentBlock::ResourceLink(link) => format!("[resource link: {} ({})]", link.uri, link.name),
        _ => "[content of an unknown type]".to_owned(),
    }
}

/// The size of base64 `data` once decoded.
fn decoded_len(data: &str) -> usize {
    let digits = data.bytes().filter(|byte| !byte.is_ascii_whitespace()).count();
    let padding = data.trim_end().bytes().rev().take_while(|byte| *byte == b'=').count();
    (digits * 3 / 4).saturating_sub(padding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_sizes_are_counted_once_decoded() {
        assert_eq!(decoded_len(""), 0);
        assert_eq!(decoded_len("aGk="), 2);
        assert_eq!(decoded_len("aGVsbG8="), 5);
        assert_eq!(decoded_len("aGVs\nbG8h"), 6);
    }
}
