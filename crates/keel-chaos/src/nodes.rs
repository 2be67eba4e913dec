//! The `keel serve` processes a chaos run breaks: each on a fixed loopback
//! port (so clients find it again after a restart), its stderr appended to
//! a log file kept as evidence.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use keel_protocol::{Error, Result};

/// How long a node gets to answer `/healthz` after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How many more times a node that exits at start is started again.
const START_ATTEMPTS: usize = 5;

/// How long a node gets to exit after SIGTERM before it is killed.
const TERM_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a node.
#[derive(Debug, Clone)]
pub(super) struct NodeSpec {
    pub(super) binary: PathBuf,
    /// `--db`: a SQLite file or a PostgreSQL URL.
    pub(super) db: String,
    pub(super) dir: PathBuf,
    pub(super) lease_ttl_ms: u64,
}

/// One node: its process (when running) and its address.
pub(super) struct Node {
    pub(super) index: usize,
    pub(super) port: u16,
    child: Option<Child>,
    spec: NodeSpec,
}

/// The nodes' base URLs, read by the clients; a stopped node keeps its
/// address (requests to it fail until it is back).
pub(super) type Addresses = Arc<RwLock<Vec<String>>>;

impl Node {
    /// Starts node `index` on a free port and waits until it answers.
    pub(super) async fn start(index: usize, spec: NodeSpec, client: &reqwest::Client) -> Result<Self> {
        let port = free_port()?;
        let mut node = Self {
            index,
            port,
            child: None,
            spec,
        };
        node.restart(client).await?;
        Ok(node)
    }

    /// The node's base URL.
    pub(super) fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The running process's id.
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The node's stderr, appended across restarts.
    pub(super) fn log_path(&self) -> PathBuf {
        self.spec.dir.join(format!("node-{}.log", self.index))
    }

    /// Starts the process again (after a kill or a stop) on the same port,
    /// trying a few times: a dead node's database connections (and the
    /// hold on its node id) take a moment to go.
    pub(super) async fn restart(&mut self, client: &reqwest::Client) -> Result<()> {
        let mut attempt = 0;
        loop {
            match self.start_once(client).await {
                Ok(()) => return Ok(()),
                Err(error) if attempt < START_ATTEMPTS => {
                    attempt += 1;
                    tracing::warn!(node = self.index, %error, "a node did not start; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn start_once(&mut self, client: &reqwest::Client) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|error| setup(format!("cannot open the node log: {error}")))?;
        let child = Command::new(&self.spec.binary)
            .args(["serve", "--create", "--db", &self.spec.db])
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--node-id", &format!("chaos-{}", self.index)])
            .args(["--lease-ttl-ms", &self.spec.lease_ttl_ms.to_string()])
            .args(["--shutdown-grace-secs", "2"])
            .arg("--workspace-root")
            .arg(self.spec.dir.join("workspaces"))
            .arg("--config")
            .arg(self.spec.dir.join("keel.toml"))
            .arg("--script-dir")
            .arg(&self.spec.dir)
            .env_remove("KEEL_MODEL")
            .env_remove("KEEL_CONFIG")
            .env_remove("KEEL_DB")
            .env("KEEL_LOG", "warn")
            .current_dir(&self.spec.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| setup(format!("cannot start keel serve: {error}")))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let healthy = client
                .get(format!("{}/healthz", self.base()))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            if healthy {
                return Ok(());
            }
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                return Err(setup(format!(
                    "node {} exited at start ({status}): {}",
                    self.index,
                    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                )));
            }
            if Instant::now() > deadline {
                return Err(setup(format!("node {} did not start in time", self.index)));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: a crash. Reaps the process.
    pub(super) fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for the exit (killing it past a bound).
    pub(super) async fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        self.signal_child(&child, Signal::SIGTERM);
        let deadline = Instant::now() + TERM_TIMEOUT;
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGSTOP or SIGCONT.
    pub(super) fn signal(&self, signal: Signal) {
        if let Some(child) = &self.child {
            self.signal_child(child, signal);
        }
    }

    fn signal_child(&self, child: &Child, signal: Signal) {
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT);
        self.crash();
    }
}

/// A loopback port nobody listens on now.
fn free_port() -> Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|error| setup(format!("no free port: {error}")))?;
    listener
        .local_addr()
        .map(|address| address.port())
        .map_err(|error| setup(format!("no free port: {error}")))
}

/// A failure to set the run up (not a violation).
pub(super) fn setup(message: String) -> Error {
    Error::Config(format!("chaos run: {message}"))
}

/// Copies `from` into `to` (a directory), for evidence.
pub(super) fn keep(from: &Path, to: &Path) {
    if let Some(name) = from.file_name() {
        let _ = std::fs::copy(from, to.join(name));
    }
}
