//! Helpers for the server tests: an in-process server on a loopback port,
//! the `keel serve` binary as a process, an HTTP client, an SSE reader.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel::protocol::RecordedEvent;
use keel::provider::sse::{SseEvent, SseParser};
use keel::server::{ServeError, ServerConfig, serve};
use keel::store::{CheckpointStore, SqliteCheckpoint};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub(crate) use crate::suite::support::started_turn_id;
use crate::suite::support::{guard, stored_events};

/// A scratch directory: the database, the sessions' workspaces, scripts.
pub(crate) struct Scratch {
    pub(crate) dir: tempfile::TempDir,
}

impl Scratch {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temporary directory"),
        }
    }

    pub(crate) fn db(&self) -> PathBuf {
        self.dir.path().join("keel.sqlite3")
    }

    pub(crate) fn workspaces(&self) -> PathBuf {
        self.dir.path().join("workspaces")
    }

    /// Writes a script and returns its model spec.
    pub(crate) fn script(&self, name: &str, lines: &[&str]) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, lines.join("\n")).expect("write the script");
        format!("script:{}", path.display())
    }

    /// Every stored event of a session, read from the database file.
    pub(crate) async fn stored(&self, session_id: &str) -> Vec<RecordedEvent> {
        let store = SqliteCheckpoint::new(self.db()).expect("open the database");
        stored_events(&store, session_id).await
    }
}

/// A script line streaming `count` chunks `delay_ms` apart.
pub(crate) fn slow_chunks(count: usize, delay_ms: u64) -> String {
    let chunks: Vec<String> = (0..count).map(|index| format!("c{index} ")).collect();
    json!({"chunks": chunks, "delay_ms": delay_ms}).to_string()
}

/// An HTTP client for one server.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) client: reqwest::Client,
    pub(crate) token: Option<String>,
}

/// A response: status and JSON body (`Value::Null` when not JSON).
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) body: Value,
}

impl Reply {
    /// The error code of an error body.
    pub(crate) fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

impl Api {
    pub(crate) fn new(base: String) -> Self {
        Self {
            base,
            client: reqwest::Client::new(),
            token: None,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    pub(crate) async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = guard("an HTTP request", self.authorize(request).send())
            .await
            .expect("send the request");
        let status = response.status();
        let bytes = response.bytes().await.expect("read the body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply { status, body }
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        self.send(self.client.get(self.url(path))).await
    }

    pub(crate) async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(self.client.post(self.url(path)).json(body)).await
    }

    pub(crate) async fn patch(&self, path: &str, body: &Value) -> Reply {
        self.send(self.client.patch(self.url(path)).json(body)).await
    }

    /// Creates a session; it must answer `201`.
    pub(crate) async fn create(&self, body: Value) -> Value {
        let reply = self.post("/v1/sessions", &body).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        reply.body
    }

    /// Submits a user message; it must answer `202`.
    pub(crate) async fn say(&self, session_id: &str, text: &str) -> Value {
        let reply = self
            .submit(session_id, json!({"op": {"type": "user_input", "text": text}}))
            .await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        reply.body
    }

    pub(crate) async fn submit(&self, session_id: &str, body: Value) -> Reply {
        self.post(&format!("/v1/sessions/{session_id}/submissions"), &body)
            .await
    }

    /// The session as `GET /v1/sessions/{id}` shows it.
    pub(crate) async fn session(&self, session_id: &str) -> Value {
        let reply = self.get(&format!("/v1/sessions/{session_id}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        reply.body
    }

    /// An event stream of the session from `after`.
    pub(crate) async fn stream(&self, session_id: &str, after: Resume) -> SseStream {
        let path = format!("/v1/sessions/{session_id}/events/stream");
        let request = match after {
            Resume::Start => self.client.get(self.url(&path)),
            Resume::After(after) => self.client.get(self.url(&format!("{path}?after={after}"))),
            Resume::LastEventId(id) => self.client.get(self.url(&path)).header("last-event-id", id.to_string()),
        }
        .header("accept", "text/event-stream");
        let response = guard("opening an event stream", self.authorize(request).send())
            .await
            .expect("open the event stream");
        assert_eq!(response.status(), StatusCode::OK);
        SseStream::new(response)
    }

    /// The server's metrics text.
    pub(crate) async fn metrics(&self) -> String {
        let response = guard(
            "GET /metrics",
            self.authorize(self.client.get(self.url("/metrics"))).send(),
        )
        .await
        .expect("GET /metrics");
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.expect("metrics text")
    }

    /// Waits until the session's `state` is `idle` and nothing is queued.
    pub(crate) async fn wait_idle(&self, session_id: &str) {
        guard("the session to become idle", async {
            loop {
                let session = self.session(session_id).await;
                if session["state"] == "idle" && session["queued"] == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
}

/// Where a stream resumes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Resume {
    Start,
    After(u64),
    LastEventId(u64),
}

/// An event stream being read.
pub(crate) struct SseStream {
    response: reqwest::Response,
    parser: SseParser,
    ready: VecDeque<SseEvent>,
}

impl SseStream {
    pub(crate) fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            parser: SseParser::new(64 * 1024 * 1024),
            ready: VecDeque::new(),
        }
    }

    /// The next event, or `None` when the stream ended.
    pub(crate) async fn next(&mut self) -> Option<RecordedEvent> {
        guard("the next streamed event", async {
            loop {
                if let Some(event) = self.ready.pop_front() {
                    let recorded: RecordedEvent = serde_json::from_str(&event.data).expect("event JSON");
                    assert_eq!(
                        event.event.as_deref(),
                        Some(recorded.msg.kind()),
                        "the SSE event name is the type"
                    );
                    return Some(recorded);
                }
                let chunk = self.response.chunk().await.ok()??;
                let mut events = Vec::new();
                self.parser.push(&chunk, &mut events).expect("a well-formed stream");
                self.ready.extend(events);
            }
        })
        .await
    }

    /// Reads up to and including the first event `stop` picks.
    pub(crate) async fn until(&mut self, mut stop: impl FnMut(&RecordedEvent) -> bool) -> Vec<RecordedEvent> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await.expect("the stream ended early");
            let done = stop(&event);
            events.push(event);
            if done {
                return events;
            }
        }
    }

    /// Reads up to and including the `n`th event that ends a turn.
    pub(crate) async fn turns(&mut self, n: usize) -> Vec<RecordedEvent> {
        let mut seen = 0;
        self.until(move |event| {
            if event.msg.ends_turn() {
                seen += 1;
            }
            seen == n
        })
        .await
    }
}

/// The sequences of `events`.
pub(crate) fn sequences(events: &[RecordedEvent]) -> Vec<u64> {
    events.iter().map(|event| event.sequence).collect()
}

/// The `type`s of `events`.
pub(crate) fn kinds(events: &[RecordedEvent]) -> Vec<&'static str> {
    events.iter().map(|event| event.msg.kind()).collect()
}

/// Whether `event` ends a turn.
pub(crate) fn ends_turn(event: &RecordedEvent) -> bool {
    event.msg.ends_turn()
}

/// A server running in this process on a loopback port.
pub(crate) struct TestServer {
    pub(crate) scratch: Scratch,
    pub(crate) api: Api,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl TestServer {
    /// A server with the defaults, tuned by `configure`.
    pub(crate) async fn start(configure: impl FnOnce(&mut ServerConfig, &Scratch)) -> Self {
        Self::start_in(Scratch::new(), configure).await
    }

    pub(crate) async fn start_in(scratch: Scratch, configure: impl FnOnce(&mut ServerConfig, &Scratch)) -> Self {
        let store: Arc<dyn CheckpointStore> = Arc::new(SqliteCheckpoint::new(scratch.db()).expect("open the store"));
        let mut config = ServerConfig::new(store);
        config.workspace_root = scratch.workspaces();
        // Tests write their scripts into the scratch directory and name
        // them in requests; the server lets clients use scripts from there.
        config.keel.server.script_dir = Some(scratch.dir.path().to_path_buf());
        config.launcher = Some(PathBuf::from(env!("CARGO_BIN_EXE_keel")));
        config.shutdown_grace = Duration::from_secs(2);
        // Keep-alive writes also notice closed connections sooner.
        config.keep_alive = Duration::from_secs(1);
        configure(&mut config, &scratch);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, config, async move {
            let _ = stop.await;
        }));
        Self {
            scratch,
            api: Api::new(base),
            shutdown: Some(shutdown),
            task: Some(task),
        }
    }

    /// Asks the server to shut down and waits until it has.
    pub(crate) async fn stop(mut self) -> Scratch {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take() {
            guard("the server to stop", task)
                .await
                .expect("server task")
                .expect("the server stopped cleanly");
        }
        self.scratch
    }

    /// Starts shutting down without waiting.
    pub(crate) fn begin_stop(&mut self) -> JoinHandle<Result<(), ServeError>> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        self.task.take().expect("the server runs")
    }
}

/// `keel serve` as a process.
pub(crate) struct ServeProcess {
    child: Child,
    pub(crate) api: Api,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl ServeProcess {
    /// Starts `keel serve` on a free loopback port with `args` added and
    /// waits until it listens.
    pub(crate) fn start(scratch: &Scratch, args: &[&str]) -> Self {
        Self::spawn(Self::command(scratch, args))
    }

    /// Starts `command` (one made by [`ServeProcess::command`], perhaps
    /// with more environment) and waits until it listens.
    pub(crate) fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn keel serve");
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (address_tx, address_rx) = std::sync::mpsc::channel();
        std::thread::spawn({
            let lines = Arc::clone(&lines);
            move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(address) = line.strip_prefix("keel serve listening on ") {
                        let _ = address_tx.send(address.to_owned());
                    }
                    lines.lock().expect("stderr lines").push(line);
                }
            }
        });
        let base = address_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("keel serve did not start: {:?}", lines.lock().expect("lines")));
        Self {
            child,
            api: Api::new(base),
            stderr: lines,
        }
    }

    pub(crate) fn command(scratch: &Scratch, args: &[&str]) -> Command {
        Self::command_of(std::path::Path::new(env!("CARGO_BIN_EXE_keel")), scratch, args)
    }

    /// [`ServeProcess::command`] running `binary`.
    pub(crate) fn command_of(binary: &std::path::Path, scratch: &Scratch, args: &[&str]) -> Command {
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .arg("--db")
            .arg(scratch.db())
            .arg("--workspace-root")
            .arg(scratch.workspaces())
            .args(args)
            .env_remove("KEEL_MODEL")
            .env_remove("KEEL_CONFIG")
            .env("KEEL_LOG", "warn")
            .current_dir(scratch.dir.path());
        if !args.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        // As for the in-process server: scripts are in the scratch directory.
        if !args.contains(&"--script-dir") {
            command.arg("--script-dir").arg(scratch.dir.path());
        }
        command
    }

    /// The process id, to read the process's state under `/proc`.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub(crate) fn terminate(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let status = wait_with_timeout(&mut self.child, Duration::from_secs(30));
        let lines = self.stderr.lock().expect("lines").clone();
        (status, lines)
    }

    /// Kills the process (SIGKILL: a crash) and reaps it.
    pub(crate) fn crash(mut self) {
        self.child.kill().expect("kill keel serve");
        self.child.wait().expect("reap keel serve");
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("wait for keel serve") {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "keel serve did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}
