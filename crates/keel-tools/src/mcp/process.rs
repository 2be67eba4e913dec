//! The child process of a stdio MCP server: started in its own process
//! group, watched by a reaper task that owns it, and stopped (then waited
//! for, so no zombie is left) when asked or when its handle is dropped.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::watch;

use crate::workspace::sandbox;

/// The variables a server inherits from the runtime; everything else it
/// gets comes from its `env` table. The runtime's API keys stay out.
const INHERITED_ENV: [&str; 10] = [
    "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR",
];

/// How long a stopping server gets to exit after its stdin closed, and
/// then after `SIGTERM`, before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How often a stopping server is looked at to see whether it exited.
const LEADER_POLL: Duration = Duration::from_millis(20);

/// How long to wait, after the process ended, for the rest of its stderr
/// (a grandchild may hold the pipe open).
const STDERR_DRAIN: Duration = Duration::from_secs(1);

/// The stderr lines kept for error messages, and the longest kept line.
const STDERR_TAIL_LINES: usize = 8;
const STDERR_LINE_CHARS: usize = 300;
/// Longer stderr lines are split (for the log) at this many bytes.
const STDERR_LINE_BYTES: usize = 8 * 1024;

/// Every server process of this process not yet reaped: how many, and a
/// signal that asks them all to stop. A process ends when its runtime
/// does; without waiting here first, its reaper task would be dropped
/// with the runtime and kill the group at once, with no graceful stop.
struct Registry {
    /// Reaper tasks still running.
    live: watch::Sender<usize>,
    /// Bumped to ask every server started before to stop.
    stop_all: watch::Sender<u64>,
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Registry {
    live: watch::Sender::new(0),
    stop_all: watch::Sender::new(0),
});

/// Counts a reaper task as live until it is dropped (it ended, or the
/// runtime dropped it).
struct LiveGuard;

impl LiveGuard {
    fn new() -> Self {
        REGISTRY.live.send_modify(|live| *live += 1);
        Self
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        REGISTRY.live.send_modify(|live| *live = live.saturating_sub(1));
    }
}

/// Stops every MCP server process this process started and still runs (the
/// graceful way: stdin closed, `SIGTERM`, then `SIGKILL` to its group) and
/// waits until each one has been reaped, at most `limit`. Returns how many
/// were still unreaped when the limit passed (0 normally). For the end of a
/// command: processes the runtime would otherwise kill outright as it drops
/// their reaper tasks.
pub(crate) async fn stop_all(limit: Duration) -> usize {
    REGISTRY.stop_all.send_modify(|generation| *generation += 1);
    let mut live = REGISTRY.live.subscribe();
    let reaped = tokio::time::timeout(limit, live.wait_for(|live| *live == 0)).await;
    if reaped.is_err() {
        let left = *REGISTRY.live.borrow();
        tracing::warn!(left, "MCP server processes were still running at exit");
        return left;
    }
    0
}

/// A running (or ended) server process. Dropping it stops the process.
pub(super) struct ServerProcess {
    pid: u32,
    /// Set to `true`, or dropped, to stop the process.
    stop: watch::Sender<bool>,
    state: watch::Receiver<State>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

/// Where a process is in its life, as its reaper tells.
#[derive(Debug, Clone)]
enum State {
    Running,
    /// Reaped, with how it ended; its stderr may still be being read.
    Exited(String),
    /// Reaped and its stderr read to the end (or given up on).
    Finished(String),
}

impl State {
    fn ended(&self) -> Option<String> {
        match self {
            Self::Running => None,
            Self::Exited(how) | Self::Finished(how) => Some(how.clone()),
        }
    }
}

impl ServerProcess {
    /// Starts `command args…` for the server `server`, in `cwd`, and
    /// returns it with its stdout and stdin. With a `launcher` (the `keel`
    /// binary), the server sees, of the directories of workspaces, only
    /// the session's `workspace`, and none of Keel's protected paths (see
    /// [`sandbox::apart_arguments`]).
    pub(super) fn spawn(
        server: &str,
        (command, args): (&str, &[String]),
        env: &BTreeMap<String, String>,
        (cwd, workspace): (&Path, &Path),
        launcher: Option<&Path>,
    ) -> std::io::Result<(Self, ChildStdout, ChildStdin)> {
        let arguments: Vec<OsString> = args.iter().map(OsString::from).collect();
        let apart = launcher.and_then(|launcher| {
            let all = sandbox::apart_arguments(workspace, OsStr::new(command), &arguments)?;
            Some((launcher, all))
        });
        let mut builder = match apart {
            Some((launcher, all)) => {
                let mut builder = Command::new(launcher);
                builder.args(all);
                builder
            }
            None => {
                let mut builder = Command::new(command);
                builder.args(arguments);
                builder
            }
        };
        builder
            .env_clear()
            .envs(
                INHERITED_ENV
                    .iter()
                    .filter_map(|key| Some((*key, std::env::var_os(key)?))),
            )
            .envs(env)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so stopping it also stops what it
            // started (`npx` runs the server as a grandchild), and a Ctrl-C
            // meant for the runtime does not reach it first.
            .process_group(0)
            // The last resort when the reaper task never runs again (the
            // runtime shut down): the leader is killed when dropped.
            .kill_on_drop(true);
        let mut child = builder.spawn()?;
        let (Some(pid), Some(stdout), Some(stdin), Some(stderr)) =
            (child.id(), child.stdout.take(), child.stdin.take(), child.stderr.take())
        else {
            return Err(std::io::Error::other("the child process has no pid or pipes"));
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let reader = tokio::spawn(read_stderr(server.to_owned(), stderr, Arc::clone(&tail)));
        let (stop, stop_requested) = watch::channel(false);
        let (state_sender, state) = watch::channel(State::Running);
        let guard = GroupGuard { child, pgid: pid };
        let live = LiveGuard::new();
        let stop_all = REGISTRY.stop_all.subscribe();
        let server = server.to_owned();
        tokio::spawn(async move {
            let _live = live;
            reap(server, guard, stop_requested, stop_all, state_sender, reader).await;
        });
        Ok((
            Self {
                pid,
                stop,
                state,
                stderr: tail,
            },
            stdout,
            stdin,
        ))
    }

    /// The process id (also its process group id).
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// How the process ended (`exit status: 1`, `signal: 9 (SIGKILL)`), as
    /// soon as it has been reaped; `None` while it runs.
    pub(super) fn ended(&self) -> Option<String> {
        self.state.borrow().ended()
    }

    /// Waits up to `limit` for the process to end on its own and its stderr
    /// to be read; returns how it ended.
    pub(super) async fn wait_ended(&self, limit: Duration) -> Option<String> {
        let mut state = self.state.clone();
        let finished = tokio::time::timeout(limit, state.wait_for(|state| matches!(state, State::Finished(_))));
        drop(finished.await);
        self.ended()
    }

    /// Stops the process (stdin closed by the caller, then `SIGTERM`, then
    /// `SIGKILL`, to the whole group) and waits until it has been reaped.
    pub(super) async fn stop(&self) {
        self.stop.send_replace(true);
        let mut state = self.state.clone();
        // Fails only if the reaper is gone, which happens once it finished.
        drop(state.wait_for(|state| matches!(state, State::Finished(_))).await);
    }

    /// The last (at most `lines`) lines the process wrote to stderr, joined
    /// with ` | `, or `None` if it wrote nothing.
    pub(super) fn stderr_tail(&self, lines: usize) -> Option<String> {
        let tail = self.stderr.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let skip = tail.len().saturating_sub(lines);
        (!tail.is_empty()).then(|| {
            tail.iter()
                .skip(skip)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(" | ")
        })
    }
}

/// Owns the child; kills its whole group if dropped before it was reaped.
struct GroupGuard {
    child: Child,
    pgid: u32,
}

impl GroupGuard {
    /// Sends `signal` to the group, while its leader has not been reaped
    /// (so the group id cannot have been reused).
    fn signal(&self, signal: Signal) {
        let Ok(pgid) = i32::try_from(self.pgid) else { return };
        if self.child.id().is_some()
            && let Err(error) = killpg(Pid::from_raw(pgid), signal)
        {
            tracing::debug!(pgid, %error, ?signal, "could not signal an MCP server's process group");
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

/// The reaper task: waits for the process to end or for a stop request,
/// stops it, reaps it, drains its stderr, then publishes how it ended.
async fn reap(
    server: String,
    mut guard: GroupGuard,
    mut stop_requested: watch::Receiver<bool>,
    mut stop_all: watch::Receiver<u64>,
    state: watch::Sender<State>,
    reader: tokio::task::JoinHandle<()>,
) {
    let status = tokio::select! {
        status = guard.child.wait() => status,
        // A stop request, or the handle was dropped.
        () = async { drop(stop_requested.wait_for(|stop| *stop).await) } => stop(&mut guard).await,
        // The command is ending (`stop_all`).
        Ok(()) = stop_all.changed() => stop(&mut guard).await,
    };
    let description = match status {
        Ok(status) => describe(status),
        Err(error) => format!("could not be waited for ({error})"),
    };
    tracing::debug!(%server, pid = guard.pgid, ended = %description, "MCP server process ended");
    // Right away, in the same poll as the reaping: whoever sees the process
    // gone also sees it ended.
    state.send_replace(State::Exited(description.clone()));
    // The rest of its stderr makes the error messages complete.
    if tokio::time::timeout(STDERR_DRAIN, reader).await.is_err() {
        tracing::debug!(%server, "an MCP server's stderr stayed open after it ended");
    }
    state.send_replace(State::Finished(description));
}

/// Stops the process: it had its stdin closed (the MCP way), then gets
/// `SIGTERM`, then `SIGKILL`; returns its exit status once reaped. Once the
/// leader has exited, what it left running in its group (the server `npx`
/// started, a helper of the server's) gets `SIGTERM` too, before the leader
/// is reaped: until then its group id cannot have been reused.
async fn stop(guard: &mut GroupGuard) -> std::io::Result<ExitStatus> {
    for signal in [None, Some(Signal::SIGTERM)] {
        if let Some(signal) = signal {
            guard.signal(signal);
        }
        if leader_exits_within(guard, STOP_GRACE).await {
            guard.signal(Signal::SIGTERM);
            return guard.child.wait().await;
        }
    }
    guard.signal(Signal::SIGKILL);
    guard.child.wait().await
}

/// Whether the group's leader exits within `limit`, seen without reaping
/// it (`WNOWAIT`), so it stays a zombie holding the group id.
async fn leader_exits_within(guard: &GroupGuard, limit: Duration) -> bool {
    let Ok(pid) = i32::try_from(guard.pgid) else {
        return true;
    };
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
        match waitid(Id::Pid(Pid::from_raw(pid)), flags) {
            Ok(WaitStatus::StillAlive) => {}
            // Exited, or already reaped (then there is nothing to wait for).
            Ok(_) | Err(_) => return true,
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(LEADER_POLL).await;
    }
}

/// `exit status: 1`, `signal: 9 (SIGKILL)`.
fn describe(status: ExitStatus) -> String {
    status.to_string()
}

/// Logs the server's stderr and keeps its last lines. Reads to the end
/// whatever it gets (invalid UTF-8, endless lines), so the server never
/// blocks on a full pipe.
async fn read_stderr(server: String, stderr: ChildStderr, tail: Arc<Mutex<VecDeque<String>>>) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        let (consumed, complete) = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(chunk) => match chunk.iter().position(|byte| *byte == b'\n') {
                Some(end) => {
                    line.extend_from_slice(&chunk[..end]);
                    (end + 1, true)
                }
                None => {
                    line.extend_from_slice(chunk);
                    (chunk.len(), line.len() >= STDERR_LINE_BYTES)
                }
            },
        };
        reader.consume(consumed);
        if complete {
            keep_line(&server, &line, &tail);
            line.clear();
        }
    }
    if !line.is_empty() {
        keep_line(&server, &line, &tail);
    }
}

fn keep_line(server: &str, line: &[u8], tail: &Mutex<VecDeque<String>>) {
    let line = String::from_utf8_lossy(line);
    let line = line.trim();
    if line.is_empty() {
        return;
    }
    tracing::debug!(%server, "MCP server stderr: {line}");
    let kept: String = line.chars().take(STDERR_LINE_CHARS).collect();
    let mut tail = tail.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if tail.len() == STDERR_TAIL_LINES {
        tail.pop_front();
    }
    tail.push_back(kept);
}
