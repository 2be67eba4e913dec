//! A keel server for a test: in this process on a loopback port, or the
//! `keel serve` binary as a process, each over a scratch directory.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel::protocol::RecordedEvent;
use keel::server::{ServeError, ServerConfig, serve};
use keel::store::{CheckpointStore, SqliteCheckpoint};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::api::Api;
use super::process::wait_exit;
use super::store::stored_events;
use super::wait::{HANG_GUARD, guard};

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

    /// Writes a script of `lines` (each a JSON value) and returns its
    /// model spec.
    pub(crate) fn script_of(&self, name: &str, lines: &[serde_json::Value]) -> String {
        let lines: Vec<String> = lines.iter().map(serde_json::Value::to_string).collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        self.script(name, &refs)
    }

    /// Every stored event of a session, read from the database file.
    pub(crate) async fn stored(&self, session_id: &str) -> Vec<RecordedEvent> {
        let store = SqliteCheckpoint::new(self.db()).expect("open the database");
        stored_events(&store, session_id).await
    }
}

/// A new directory outside `/tmp` (in `/var/tmp`), which a restricted
/// command's private `/tmp` would otherwise hide by accident: what a
/// sandbox test must see covered (or not) on purpose. The build's own
/// temporary directory may lie under `/tmp` (a clone there).
pub(crate) fn outside_tmp(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .expect("a directory in /var/tmp")
}

/// A script line streaming `count` chunks `delay_ms` apart.
pub(crate) fn slow_chunks(count: usize, delay_ms: u64) -> String {
    let chunks: Vec<String> = (0..count).map(|index| format!("c{index} ")).collect();
    json!({"chunks": chunks, "delay_ms": delay_ms}).to_string()
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
        let sqlite = Arc::new(SqliteCheckpoint::new(scratch.db()).expect("open the store"));
        let store: Arc<dyn CheckpointStore> = sqlite.clone();
        let mut config = ServerConfig::new(store);
        config.webhooks = Some(sqlite);
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
            .recv_timeout(HANG_GUARD)
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
            .arg("--create")
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

    /// What the process has written to stderr so far, line by line.
    pub(crate) fn logged(&self) -> Vec<String> {
        self.stderr.lock().expect("lines").clone()
    }

    /// The process id, to read the process's state under `/proc`.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub(crate) fn terminate(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let status = wait_exit(&mut self.child, HANG_GUARD).expect("keel serve did not exit after SIGTERM");
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

/// A loopback port that was free a moment ago, for a server that must be
/// told its port before it starts.
pub(crate) fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// The bytes that the loopback sockets on server `port` were sent and the
/// server has not read yet (the kernel's receive queues, from
/// `/proc/net/tcp`); only the connection from client port `peer` if given.
/// `None` when there is no such socket (any more).
pub(crate) fn unread_by_server(port: u16, peer: Option<u16>) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let port_of = |address: &str| {
        address
            .rsplit_once(':')
            .and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
    };
    let mut found = None;
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, local, remote, _, queues, ..] = fields[..] else {
            continue;
        };
        // A listening socket has remote port 0 and nothing to read.
        let remote_port = port_of(remote);
        if port_of(local) != Some(port) || remote_port == Some(0) || peer.is_some_and(|peer| remote_port != Some(peer))
        {
            continue;
        }
        let unread = queues
            .split_once(':')
            .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok())
            .expect("a receive queue");
        *found.get_or_insert(0) += unread;
    }
    found
}
