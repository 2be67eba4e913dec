//! `shell`: runs a command with `sh -c` in the workspace, bounded in time and
//! output, in a scrubbed environment, optionally sandboxed.
//!
//! With a launcher (the `keel` binary's `sandbox-exec`, see [`sandbox`]),
//! every command runs under it, whatever the policy: the command lives in a
//! PID namespace of its own (or under a subreaper), so when it ends, times
//! out, or the call's future is dropped because the turn was interrupted,
//! nothing it started survives, `setsid` and double forks included; and
//! should Keel itself be killed, the launcher notices and kills it all.
//! Keel asks the launcher to stop with `SIGTERM` (it then kills the
//! command and everything it started) and kills the launcher's process
//! group with `SIGKILL` if it has not ended a moment later.
//!
//! Without a launcher (library use), each command runs in a process group
//! of its own, killed with `SIGKILL` when the call ends; a process that
//! leaves the group on purpose, with `setsid`, escapes this. (After a
//! normal exit the group is signalled just after the shell was reaped;
//! should every member be gone and the number be reused by a new group in
//! that instant, that group would be signalled: the kernel hands out
//! numbers in sequence, so this needs a wrap-around of the PID space.)
//!
//! The environment is not inherited: a command sees only [`SHELL_PASSED_ENV`]
//! (when Keel has them) and `TERM=dumb`, so API keys and other secrets in
//! Keel's environment do not leak into commands or their output.

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::pin::pin;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::sandbox::{self, SandboxPolicy, SandboxStatus};
use super::{Arguments, Workspace};
use crate::{Tool, ToolContext, ToolError};
use keel_model::{BoxFuture, ToolSpec};

/// The variables passed from Keel's environment to every command, when set.
/// `HOME` is the real home so tools find their configuration and caches;
/// what a command may change is the sandbox's business, not the
/// environment's. Nothing else passes: no API keys, no tokens.
pub const SHELL_PASSED_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL"];

/// `PATH` for commands when Keel itself has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// How long output may still be read after the command ended and its
/// process group was killed. Only a process that left the group can keep a
/// pipe open that long; the call then ends with what was read.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// The most of a launcher's status line that is held back looking for its
/// end; a longer first line is ordinary output.
const MAX_STATUS_LINE: usize = 4096;

/// How long the launcher gets to kill the command after `SIGTERM` before
/// its process group is killed outright.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How the `shell` tool runs commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellConfig {
    /// What commands may change.
    pub sandbox: SandboxPolicy,
    /// Whether commands may use the network (the sandbox blocks it
    /// otherwise, except under full access).
    pub network: bool,
    /// The `keel` binary to launch sandboxed commands with (its hidden
    /// `sandbox-exec` subcommand). Without it, commands run unsandboxed and
    /// every result says so.
    pub launcher: Option<PathBuf>,
    /// How long a command may run when the call does not say.
    pub timeout: Duration,
    /// The longest `timeout_ms` a call may ask for.
    pub max_timeout: Duration,
    /// The most bytes kept of each of stdout and stderr; the rest is counted.
    pub output_cap: usize,
    /// The resource limits of each call (applied by the launcher).
    pub limits: sandbox::Limits,
}

impl Default for ShellConfig {
    /// Workspace-write without network, no launcher, 60 s (at most 10
    /// min), 64 KiB per stream, the default [`sandbox::Limits`].
    fn default() -> Self {
        Self {
            sandbox: SandboxPolicy::WorkspaceWrite,
            network: false,
            launcher: None,
            timeout: Duration::from_secs(60),
            max_timeout: Duration::from_secs(600),
            output_cap: 64 * 1024,
            limits: sandbox::Limits::default(),
        }
    }
}

/// Runs shell commands in the workspace.
#[derive(Debug, Clone)]
pub struct ShellTool {
    config: ShellConfig,
}

impl ShellTool {
    /// The tool, configured.
    pub fn new(config: ShellConfig) -> Self {
        Self { config }
    }

    /// How it runs commands.
    pub fn config(&self) -> &ShellConfig {
        &self.config
    }

    fn max_timeout_ms(&self) -> u64 {
        u64::try_from(self.config.max_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The command to spawn, and whether it goes through the launcher.
    fn command(&self, root: &std::path::Path, command: &str, timeout: Duration) -> (tokio::process::Command, bool) {
        let shell_arguments = [OsStr::new("-c"), OsStr::new(command)];
        match &self.config.launcher {
            Some(launcher) => {
                let protected = sandbox::protected_paths();
                let sockets = sandbox::socket_directories();
                let private_roots = sandbox::private_roots();
                let options = sandbox::LaunchOptions {
                    policy: self.config.sandbox,
                    workspace: root,
                    network: self.config.network,
                    protected: &protected,
                    sockets: &sockets,
                    private_roots: &private_roots,
                    reads: sandbox::reads(),
                    limits: self.config.limits.for_timeout(timeout),
                };
                let mut spawned = tokio::process::Command::new(launcher);
                spawned.args(sandbox::launcher_arguments(
                    &options,
                    OsStr::new("sh"),
                    &shell_arguments,
                ));
                (spawned, true)
            }
            None => {
                let mut spawned = tokio::process::Command::new("sh");
                spawned.args(shell_arguments);
                (spawned, false)
            }
        }
    }

    async fn run(&self, command: &str, timeout: Duration, context: &ToolContext) -> Result<String, ToolError> {
        let workspace = Workspace::new(&context.workspace)?;
        let (mut spawned, launched) = self.command(workspace.root(), command, timeout);
        spawned
            .current_dir(workspace.root())
            .env_clear()
            .envs(command_environment(std::env::vars_os()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            // A launcher is asked to stop (see `ProcessGroup`), so that it
            // can kill what the command left before it goes.
            .kill_on_drop(!launched);
        let mut child = spawned
            .spawn()
            .map_err(|error| match (&self.config.launcher, launched) {
                (Some(launcher), true) => ToolError::Failed(format!(
                    "cannot start the sandbox launcher {}: {error}",
                    launcher.display()
                )),
                _ => ToolError::Failed(format!("cannot start sh: {error}")),
            })?;
        // Dropped with the call's future: the whole group dies with it.
        let mut group = ProcessGroup {
            leader: child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw),
            launcher: launched,
        };
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let mut out = Capture::new(self.config.output_cap, false);
        let mut err = Capture::new(self.config.output_cap, launched);

        let (ended, pipes_left_open) = {
            let mut waiting = pin!(async {
                let waited = tokio::time::timeout(timeout, child.wait()).await;
                if waited.is_err() && group.launcher {
                    // The launcher kills the command and all it started.
                    group.stop();
                    let _ = tokio::time::timeout(STOP_GRACE, child.wait()).await;
                }
                // Whatever happened, nothing the command started may outlive
                // it (and keep the pipes open).
                group.kill();
                match waited {
                    Ok(Ok(status)) => Ended::Exited(status),
                    Ok(Err(error)) => Ended::Lost(error),
                    Err(_) => {
                        let _ = child.wait().await;
                        Ended::TimedOut
                    }
                }
            });
            let mut draining = pin!(async {
                tokio::join!(out.read(stdout), err.read(stderr));
            });
            let mut drained = false;
            let ended = loop {
                tokio::select! {
                    ended = &mut waiting => break ended,
                    () = &mut draining, if !drained => drained = true,
                }
            };
            if !drained {
                drained = tokio::time::timeout(DRAIN_GRACE, &mut draining).await.is_ok();
            }
            (ended, !drained)
        };

        let confirmed = err.status.take();
        if launched && confirmed.is_none() {
            return Err(unconfirmed(self.config.sandbox, &err.kept));
        }
        let status = self.sandbox_status(launched, confirmed);
        let mut report = status.line();
        report.push('\n');
        let failed = match &ended {
            Ended::Exited(status) => match (status.code(), status.signal()) {
                (Some(code), _) => {
                    let _ = writeln!(report, "[exit code {code}]");
                    code != 0
                }
                (None, Some(signal)) => {
                    let _ = writeln!(report, "[killed by signal {signal}]");
                    true
                }
                (None, None) => {
                    report.push_str("[ended without an exit code]\n");
                    true
                }
            },
            Ended::TimedOut => {
                let _ = writeln!(
                    report,
                    "[timed out after {} ms; the command and every process it started were killed]",
                    timeout.as_millis()
                );
                true
            }
            Ended::Lost(error) => {
                let _ = writeln!(report, "[lost track of the command: {error}]");
                true
            }
        };
        if out.is_empty() && err.is_empty() {
            report.push_str("[no output]\n");
        }
        out.append_to(&mut report, "stdout");
        err.append_to(&mut report, "stderr");
        if pipes_left_open {
            report
                .push_str("[a process that left the command's process group kept its output open; stopped reading]\n");
        }
        if failed {
            Err(ToolError::Failed(report))
        } else {
            Ok(report)
        }
    }

    /// The sandbox commands will run under, as far as can be known before
    /// running one: the launcher's report on a trial command (`true`),
    /// asked once per launcher, policy and network setting in a process.
    /// The launcher reports the status that really applied in the first
    /// line of each result.
    pub async fn expected_sandbox(&self) -> SandboxStatus {
        let Some(launcher) = &self.config.launcher else {
            return self.sandbox_status(false, None);
        };
        let key = (launcher.clone(), self.config.sandbox, self.config.network);
        let cached = PROBES.lock().ok().and_then(|probes| {
            probes
                .iter()
                .find(|(probed, _)| *probed == key)
                .map(|(_, status)| status.clone())
        });
        if let Some(status) = cached {
            return status;
        }
        let status = match probe_launcher(launcher, self.config.sandbox, self.config.network).await {
            Ok(status) => status,
            Err(reason) => SandboxStatus::unrestricted(self.config.sandbox, reason),
        };
        if let Ok(mut probes) = PROBES.lock() {
            probes.push((key, status.clone()));
        }
        status
    }

    fn sandbox_status(&self, launched: bool, reported: Option<SandboxStatus>) -> SandboxStatus {
        let policy = self.config.sandbox;
        if !launched {
            return SandboxStatus::unrestricted(
                policy,
                if policy == SandboxPolicy::FullAccess {
                    "the policy restricts nothing"
                } else {
                    "no sandbox launcher is configured"
                },
            );
        }
        reported
            .unwrap_or_else(|| SandboxStatus::unrestricted(policy, "the sandbox launcher did not confirm the sandbox"))
    }
}

/// The result of a call whose launcher did not report the sandbox it
/// applied: whatever ran did so unconfirmed (a failed launcher, or not the
/// launcher at all), so none of its output is returned; its stderr goes
/// to Keel's log for the operator.
fn unconfirmed(policy: SandboxPolicy, stderr: &[u8]) -> ToolError {
    let shown = &stderr[..stderr.len().min(MAX_STATUS_LINE)];
    tracing::warn!(
        stderr = %String::from_utf8_lossy(shown),
        "the sandbox launcher did not confirm the sandbox; the command's output was withheld"
    );
    let status = SandboxStatus::unrestricted(policy, "the sandbox launcher did not confirm the sandbox");
    ToolError::Failed(format!(
        "{}\n[the command's output is withheld: the launcher did not confirm the sandbox, so it may have run \
         without one; Keel's log has the launcher's error]\n",
        status.line()
    ))
}

impl Tool for ShellTool {
    fn spec(&self) -> ToolSpec {
        let sandbox = match self.config.sandbox {
            SandboxPolicy::ReadOnly => "Commands may read anything but write nothing (read-only sandbox).",
            SandboxPolicy::WorkspaceWrite => {
                "Commands may read anything but write only in the workspace and /tmp (workspace-write sandbox)."
            }
            SandboxPolicy::FullAccess => "Commands are not sandboxed.",
        };
        ToolSpec {
            name: "shell".into(),
            description: format!(
                "Runs a command with `sh -c` in the workspace directory and returns its exit code, stdout and \
                 stderr (each cut to {} KiB). {sandbox} The first line of the result says which sandbox applied \
                 and whether the system enforced it. A command times out after {} s unless timeout_ms says \
                 otherwise (at most {} s). When the command ends or times out, every process it started is \
                 killed, so background jobs do not survive the call. stdin is empty and the environment holds \
                 only {} and TERM=dumb.",
                self.config.output_cap / 1024,
                self.config.timeout.as_secs(),
                self.config.max_timeout.as_secs(),
                SHELL_PASSED_ENV.join(", "),
            ),
            parameters: crate::object_schema(
                serde_json::json!({
                    "command": {"type": "string", "minLength": 1, "description": "The shell command line, run with `sh -c`."},
                    "timeout_ms": {"type": "integer", "minimum": 1, "maximum": self.max_timeout_ms(), "description": "How long the command may run, in milliseconds."}
                }),
                &["command"],
            ),
        }
    }

    fn call<'a>(
        &'a self,
        arguments: serde_json::Map<String, serde_json::Value>,
        context: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let arguments = Arguments(&arguments);
            let command = arguments.required_str("command")?;
            if command.trim().is_empty() {
                return Err(ToolError::InvalidArguments("'command' is empty".into()));
            }
            let timeout = arguments
                .optional_u64("timeout_ms", 1, self.max_timeout_ms())?
                .map_or(self.config.timeout, Duration::from_millis);
            self.run(command, timeout, context).await
        })
    }
}

/// The environment a command gets, from Keel's own `parent` environment.
fn command_environment(parent: impl IntoIterator<Item = (OsString, OsString)>) -> Vec<(OsString, OsString)> {
    let mut environment: Vec<(OsString, OsString)> = parent
        .into_iter()
        .filter(|(name, _)| SHELL_PASSED_ENV.iter().any(|passed| name == *passed))
        .collect();
    if !environment.iter().any(|(name, _)| name == "PATH") {
        environment.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    environment.push(("TERM".into(), "dumb".into()));
    environment.sort();
    environment
}

/// Launcher probes already made in this process.
type ProbeKey = (PathBuf, SandboxPolicy, bool);
static PROBES: std::sync::Mutex<Vec<(ProbeKey, SandboxStatus)>> = std::sync::Mutex::new(Vec::new());

/// Asks `launcher` what it enforces for `policy` (`keel sandbox-exec --probe`).
async fn probe_launcher(
    launcher: &std::path::Path,
    policy: SandboxPolicy,
    network: bool,
) -> Result<SandboxStatus, String> {
    let mut command = tokio::process::Command::new(launcher);
    command
        .args([sandbox::LAUNCHER_SUBCOMMAND, "--probe", "--policy", policy.as_str()])
        .env_clear()
        .envs(command_environment(std::env::vars_os()))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if network {
        command.arg("--network");
    }
    let output = command
        .output()
        .await
        .map_err(|error| format!("cannot start the sandbox launcher {}: {error}", launcher.display()))?;
    serde_json::from_slice(&output.stdout).map_err(|_| {
        format!(
            "the sandbox launcher {} could not probe the sandbox: {}",
            launcher.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )
    })
}

/// How a command ended.
enum Ended {
    Exited(std::process::ExitStatus),
    TimedOut,
    Lost(std::io::Error),
}

/// A command's process group, led by the launcher or by `sh`; killed
/// (once) when asked or when dropped.
struct ProcessGroup {
    leader: Option<Pid>,
    /// Whether the leader is the launcher, which kills the command and
    /// everything it started when asked to stop.
    launcher: bool,
}

impl ProcessGroup {
    /// Asks the launcher to stop the command.
    fn stop(&self) {
        if let (Some(leader), true) = (self.leader, self.launcher) {
            let _ = kill(leader, Signal::SIGTERM);
        }
    }

    fn kill(&mut self) {
        if let Some(group) = self.leader.take() {
            // The group may be gone already (ESRCH): nothing to do then.
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let Some(group) = self.leader else {
            return;
        };
        if self.launcher {
            // The call was dropped (an interrupted turn): the launcher is
            // asked to stop and kills what the command started; its group
            // is killed outright a moment later, should it not be done.
            self.stop();
            self.leader = None;
            std::thread::spawn(move || {
                std::thread::sleep(STOP_GRACE);
                let _ = killpg(group, Signal::SIGKILL);
            });
        } else {
            self.kill();
        }
    }
}

/// One output stream: the first `cap` bytes, and how many more there were.
struct Capture {
    kept: Vec<u8>,
    omitted: u64,
    cap: usize,
    /// The first line, held back while it may be the launcher's status
    /// report; `None` once decided (or when no report is expected).
    first_line: Option<Vec<u8>>,
    /// The launcher's report, if the first line was one.
    status: Option<SandboxStatus>,
}

impl Capture {
    fn new(cap: usize, expect_status: bool) -> Self {
        Self {
            kept: Vec::new(),
            omitted: 0,
            cap,
            first_line: expect_status.then(Vec::new),
            status: None,
        }
    }

    /// Reads `pipe` to its end (or a read error).
    async fn read(&mut self, pipe: Option<impl AsyncRead + Unpin>) {
        if let Some(mut pipe) = pipe {
            let mut buffer = vec![0; 8192];
            loop {
                match pipe.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(read) => self.push(&buffer[..read]),
                }
            }
        }
        // An unfinished first line is ordinary output after all.
        if let Some(pending) = self.first_line.take() {
            self.keep(&pending);
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let Some(first_line) = &mut self.first_line else {
            self.keep(bytes);
            return;
        };
        first_line.extend_from_slice(bytes);
        if let Some(end) = first_line.iter().position(|byte| *byte == b'\n') {
            let pending = std::mem::take(first_line);
            self.first_line = None;
            match sandbox::parse_status_report(&pending[..end]) {
                Some(status) => {
                    self.status = Some(status);
                    self.keep(&pending[end + 1..]);
                }
                None => self.keep(&pending),
            }
        } else if first_line.len() > MAX_STATUS_LINE {
            let pending = std::mem::take(first_line);
            self.first_line = None;
            self.keep(&pending);
        }
    }

    fn keep(&mut self, bytes: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        let taken = room.min(bytes.len());
        self.kept.extend_from_slice(&bytes[..taken]);
        self.omitted += (bytes.len() - taken) as u64;
    }

    fn is_empty(&self) -> bool {
        self.kept.is_empty() && self.omitted == 0
    }

    /// Adds `[name]`, the text and any truncation marker to `report`.
    fn append_to(&self, report: &mut String, name: &str) {
        if self.is_empty() {
            return;
        }
        let _ = writeln!(report, "[{name}]");
        report.push_str(&String::from_utf8_lossy(&self.kept));
        if !report.ends_with('\n') {
            report.push('\n');
        }
        if self.omitted > 0 {
            let _ = writeln!(report, "[truncated: {} more bytes]", self.omitted);
        }
    }
}

#[cfg(test)]
mod tests;
