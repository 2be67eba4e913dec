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
//! `notifications/progress` for it go to the call's [`ProgressSink`](crate::ProgressSink) (the
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
//!
//! Here: the servers of a session and their calls. `connection`: starting
//! a server and the handshake, how it stopped, its notifications;
//! `tools`: its tools as Keel tools and a result as text; `process`: the
//! child process; `naming`: tool names and schemas; `config`: `[mcp]`.

mod config;
mod connection;
mod naming;
mod process;
mod tools;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rmcp::ServiceError;
use rmcp::model::{CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ServerResult};
use rmcp::service::PeerRequestOptions;
use tokio::time::Instant;

pub use self::config::*;
use self::connection::{CancelOnDrop, Connection, Notices, ProgressRoute};
use self::process::ServerProcess;
use self::tools::{McpTool, RemoteTool, list_tools, render};
use super::{Tool, ToolError, ToolSource};
use keel_model::BoxFuture;

/// Stops every MCP server process this process still runs, the graceful
/// way (stdin closed, then `SIGTERM`, then `SIGKILL` to its process
/// group), and waits until each one is reaped, at most `limit`; returns how
/// many were left. Call it at the end of a command, after its sessions shut
/// down: when the async runtime ends, the tasks that would stop the servers
/// gracefully end with it, and the servers are killed outright.
pub async fn stop_all_servers(limit: Duration) -> usize {
    process::stop_all(limit).await
}

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
/// their tools. With a `launcher` (the `keel` binary), each stdio server
/// sees only this session's workspace of the workspace roots, and none of
/// Keel's protected files.
///
/// A server that fails to start is left out, logged and reported in
/// [`McpServers::failures`]; the session goes on with the others (a broken
/// or slow tool server should not keep a session from running). A caller
/// that wants all or nothing checks that the failures are empty.
pub async fn start_servers(config: &McpConfig, workspace: &Path, launcher: Option<&Path>) -> McpServers {
    let starting = config
        .servers
        .iter()
        .filter(|(_, server)| server.enabled)
        .map(|(name, server)| McpServer::start(name, server, workspace, launcher));
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

/// One MCP server of a session: its connection (restarted when it stops)
/// and the tools it listed when it first started.
pub struct McpServer {
    name: String,
    config: McpServerConfig,
    workspace: PathBuf,
    /// The `keel` binary that keeps the server's view of the workspaces to
    /// its session's (see [`start_servers`]).
    launcher: Option<PathBuf>,
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
    /// handshake and lists its tools, all within its startup timeout. A
    /// `launcher` keeps other workspaces out of its sight (see
    /// [`start_servers`]).
    pub async fn start(
        name: &str,
        config: &McpServerConfig,
        workspace: &Path,
        launcher: Option<&Path>,
    ) -> Result<Arc<Self>, McpError> {
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
        let connection = Connection::open(name, config, (workspace, launcher), deadline, &notices)
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
            launcher: launcher.map(Path::to_path_buf),
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
        let host = (self.workspace.as_path(), self.launcher.as_deref());
        let fresh = Arc::new(Connection::open(&self.name, &self.config, host, deadline, &self.notices).await?);
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
