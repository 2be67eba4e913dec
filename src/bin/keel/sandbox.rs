//! `keel sandbox-exec` (hidden): the launcher the `shell` tool runs its
//! commands through. It applies a sandbox policy to itself, then runs the
//! command as its child, which inherits the restriction, and stays as the
//! supervisor of the call's process group: if Keel dies the group is killed.
//!
//! It must run before any other thread exists (Landlock restricts only the
//! calling thread), so `main` dispatches it before starting the async
//! runtime. It writes one status line to stderr before the command's own
//! output (see `keel::tools::workspace::sandbox`). Exit codes of its own,
//! as a shell would use them: 126 when the sandbox cannot be applied or the
//! command cannot run, 127 when the command is not found.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg, raise};
use nix::unistd::{getpgrp, getppid};

use clap::Args;
use keel::tools::workspace::sandbox::{self, SandboxPolicy};

/// Arguments of `keel sandbox-exec`.
#[derive(Args, Debug)]
pub(crate) struct SandboxExecArgs {
    /// The policy: read-only, workspace-write or full-access.
    #[arg(long, default_value = "workspace-write", value_name = "POLICY")]
    policy: SandboxPolicy,
    /// The workspace, writable under workspace-write [default: the current directory].
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Print whether this kernel can enforce the policy (one JSON line) and exit.
    #[arg(long)]
    probe: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Runs the launcher; returns only if the command could not be started.
pub(crate) fn sandbox_exec(args: SandboxExecArgs) -> ExitCode {
    if args.probe {
        let status = sandbox::probe(args.policy);
        return match serde_json::to_string(&status) {
            Ok(json) if crate::print_line(&json).is_ok() => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        };
    }
    let Some((program, arguments)) = args.command.split_first() else {
        eprintln!("keel sandbox-exec: no command given (put it after --)");
        return ExitCode::from(126);
    };
    let workspace = match args.workspace.map_or_else(std::env::current_dir, Ok) {
        Ok(workspace) => workspace,
        Err(error) => {
            eprintln!("keel sandbox-exec: cannot read the current directory: {error}");
            return ExitCode::from(126);
        }
    };
    match sandbox::restrict_current_process(args.policy, &workspace) {
        Ok(status) => {
            // The report goes out before the command writes anything.
            let mut stderr = std::io::stderr().lock();
            let _ = stderr.write_all(sandbox::status_report_line(&status).as_bytes());
            let _ = stderr.flush();
        }
        Err(error) => {
            eprintln!(
                "keel sandbox-exec: cannot apply the {} sandbox, so the command was not run: {error}",
                args.policy
            );
            return ExitCode::from(126);
        }
    }
    // The command runs as a child rather than in this process's place: this
    // process stays as the supervisor of the call's process group, so that
    // when Keel dies without cleaning up (SIGKILL, a crash) the group dies
    // with it instead of running on, owned by nobody.
    let mut child = match std::process::Command::new(program).args(arguments).spawn() {
        Ok(child) => child,
        Err(error) => {
            eprintln!("keel sandbox-exec: cannot run {}: {error}", program.to_string_lossy());
            return if error.kind() == std::io::ErrorKind::NotFound {
                ExitCode::from(127)
            } else {
                ExitCode::from(126)
            };
        }
    };
    watch_parent();
    match child.wait() {
        Ok(status) => exit_as(status),
        Err(error) => {
            eprintln!("keel sandbox-exec: cannot wait for the command: {error}");
            ExitCode::from(126)
        }
    }
}

/// How often the supervisor checks that Keel is still its parent.
const PARENT_POLL: Duration = Duration::from_millis(100);

/// Starts a thread that kills this process group (this process included)
/// once the parent is gone: the kernel then gives this process a new
/// parent. Polling needs no signal handler, so no unsafe code.
fn watch_parent() {
    let parent = getppid();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(PARENT_POLL);
            if getppid() != parent {
                let _ = killpg(getpgrp(), Signal::SIGKILL);
            }
        }
    });
}

/// Ends this process the way the command ended: with its exit code, or by
/// the signal that killed it, so Keel reports what happened to the command.
fn exit_as(status: std::process::ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX));
    }
    let signal = status.signal().unwrap_or(Signal::SIGKILL as i32);
    if let Ok(signal) = Signal::try_from(signal) {
        // Nothing here catches signals, so this ends the process as it
        // ended the command.
        let _ = raise(signal);
    }
    // The signal is ignored here (Rust ignores SIGPIPE) or does not end a
    // process: say which it was, as a shell would.
    ExitCode::from(u8::try_from(128 + signal).unwrap_or(u8::MAX))
}
