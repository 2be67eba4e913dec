//! The two stages of `keel sandbox-exec` (see the module above): the
//! supervisor, which creates the namespaces and watches the command from
//! outside them, and the confiner, which restricts itself inside them and
//! becomes the command.
//!
//! Both run before any other thread of the process exists (Landlock
//! restricts only the calling thread, and a user namespace can only be
//! entered by a single-threaded process), so the binary dispatches them
//! before starting its async runtime.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, raise};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Pid, getpid, getuid};

use super::landlock::{self, Applied};
use super::namespaces::{self, Namespaces};
use super::reaper::{self, Waited};
use super::{
    LAUNCHER_SUBCOMMAND, LaunchOptions, NETWORK_BLOCKED, SandboxError, SandboxPolicy, SandboxStatus, option_arguments,
    privileges, seccomp, status_report_line,
};

/// What the launcher was asked to run, as parsed from its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The policy.
    pub policy: SandboxPolicy,
    /// The workspace.
    pub workspace: PathBuf,
    /// Whether the network is allowed.
    pub network: bool,
    /// Paths to cover.
    pub protected: Vec<PathBuf>,
    /// Whether to try namespaces at all; without them the launcher uses its
    /// fallback (Landlock, seccomp and a subreaper), as on a host that
    /// allows none.
    pub namespaces: bool,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// Where the supervisor put the confiner: the flags it passes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Confinement {
    /// Whether the confiner runs in new namespaces (PID, mount, maybe
    /// network).
    pub namespaces: bool,
    /// Whether those include a user namespace.
    pub user_namespace: bool,
    /// Whether they include a network namespace.
    pub network_namespace: bool,
    /// Whether the supervisor made the mounts read-only.
    pub read_only_mounts: bool,
    /// How many protected paths the supervisor covered.
    pub covered: usize,
}

/// The flag that makes the launcher the confiner (second stage).
pub const CONFINE_FLAG: &str = "--confine";

impl Launch {
    fn options(&self) -> LaunchOptions<'_> {
        LaunchOptions {
            policy: self.policy,
            workspace: &self.workspace,
            network: self.network,
            protected: &self.protected,
        }
    }

    /// Whether the command may use the network: when asked for, and always
    /// under full access, which restricts nothing.
    fn network_allowed(&self) -> bool {
        self.network || self.policy == SandboxPolicy::FullAccess
    }

    /// The places the command may write.
    fn writable(&self) -> Vec<PathBuf> {
        match self.policy {
            SandboxPolicy::WorkspaceWrite => vec![
                namespaces::real_path(&self.workspace),
                namespaces::real_path(&std::env::temp_dir()),
            ],
            _ => Vec::new(),
        }
    }
}

/// The first stage: creates the namespaces, starts the confiner in them,
/// waits for the command and cleans up after it. Returns the command's
/// exit code (or ends by the signal that killed it).
pub fn supervise(launch: &Launch) -> ExitCode {
    if launch.command.is_empty() {
        eprintln!("keel sandbox-exec: no command given (put it after --)");
        return ExitCode::from(126);
    }
    if let Err(error) = std::fs::read_dir(&launch.workspace) {
        let error = SandboxError::Workspace {
            path: launch.workspace.display().to_string(),
            message: error.to_string(),
        };
        eprintln!(
            "keel sandbox-exec: cannot apply the {} sandbox, so the command was not run: {error}",
            launch.policy
        );
        return ExitCode::from(126);
    }
    let signals = reaper::block_stop_signals();
    let attempt = if launch.namespaces {
        namespaces::unshare(launch.network_allowed())
    } else {
        Err("turned off".to_owned())
    };
    let (confinement, fallback_reason) = match attempt {
        Ok(Namespaces { user, network }) => (
            Confinement {
                namespaces: true,
                user_namespace: user,
                network_namespace: network,
                ..Confinement::default()
            },
            None,
        ),
        Err(reason) => (Confinement::default(), Some(reason)),
    };
    if !confinement.namespaces {
        // Orphans of the command become this process's children, so that
        // it can kill them all at the end.
        let _ = nix::sys::prctl::set_child_subreaper(true);
    }
    let mut mounts = None;
    if confinement.namespaces {
        let restricted = launch.policy != SandboxPolicy::FullAccess;
        let hidden: &[PathBuf] = if restricted { &launch.protected } else { &[] };
        match namespaces::confine_mounts(restricted, &launch.writable(), hidden) {
            Ok(report) => mounts = Some(report),
            Err(error) => {
                eprintln!(
                    "keel sandbox-exec: cannot apply the {} sandbox, so the command was not run: {error}",
                    launch.policy
                );
                return ExitCode::from(126);
            }
        }
        // The working directory still points into the mount beneath the
        // writable bind: enter the workspace again through the new one.
        if let Err(error) = std::env::set_current_dir(&launch.workspace) {
            eprintln!("keel sandbox-exec: cannot enter the workspace: {error}");
            return ExitCode::from(126);
        }
    }
    if confinement.user_namespace
        && let Err(error) = privileges::pass_on_to_child()
    {
        eprintln!("keel sandbox-exec: cannot hand the confiner its capabilities: {error}");
        return ExitCode::from(126);
    }
    let program = match std::env::current_exe() {
        Ok(program) => program,
        Err(error) => {
            eprintln!("keel sandbox-exec: cannot find the keel binary: {error}");
            return ExitCode::from(126);
        }
    };
    let mut confiner = Command::new(program);
    confiner.args(confiner_arguments(
        launch,
        confinement,
        mounts.as_ref(),
        fallback_reason.as_deref(),
    ));
    // In namespaces the confiner stays as PID 1 and tells how the command
    // ended through a pipe given as its standard input (the command gets
    // an empty one), since PID 1 cannot end by the command's signal.
    let mut report = None;
    if confinement.namespaces {
        match std::io::pipe() {
            Ok((reader, writer)) => {
                confiner.stdin(writer);
                report = Some(reader);
            }
            Err(error) => {
                eprintln!("keel sandbox-exec: cannot create a pipe: {error}");
                return ExitCode::from(126);
            }
        }
    }
    // Asking for the same user makes the standard library start the child
    // with fork (as posix_spawn cannot change users): the kernel refuses
    // the shared address space of posix_spawn's vfork across PID
    // namespaces.
    confiner.uid(getuid().as_raw());
    let spawned = confiner.spawn();
    // The confiner holds the pipe's writing end now; this copy must go, so
    // that reading sees the end once the confiner is gone.
    drop(confiner);
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            eprintln!("keel sandbox-exec: cannot start the sandboxed process: {error}");
            return ExitCode::from(126);
        }
    };
    let waited = reaper::wait(&mut child, signals.as_ref());
    let status = match waited {
        Ok(Waited::Exited(status)) => Some(status),
        Ok(Waited::Stop(_)) | Err(_) => {
            // In a PID namespace, killing its first process kills them all.
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            child.wait().ok()
        }
    };
    if !confinement.namespaces {
        reaper::kill_descendants();
    }
    reaper::unblock_stop_signals();
    let ended = report.and_then(|mut reader| {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut reader, &mut text).ok()?;
        Ended::parse(&text)
    });
    match (waited, status) {
        (Ok(Waited::Stop(signal)), _) => end_by(signal),
        (_, Some(_)) if ended.is_some() => match ended {
            Some(Ended::Code(code)) => ExitCode::from(code),
            Some(Ended::Signal(signal)) => end_by(signal),
            None => ExitCode::from(126),
        },
        (_, Some(status)) => exit_as(status),
        (Err(error), None) => {
            eprintln!("keel sandbox-exec: cannot wait for the command: {error}");
            ExitCode::from(126)
        }
        (Ok(Waited::Exited(_)), None) => ExitCode::from(126),
    }
}

/// The confiner's arguments: the same options but the protected paths
/// (the command can read PID 1's command line), the confinement, the
/// command.
fn confiner_arguments(
    launch: &Launch,
    confinement: Confinement,
    mounts: Option<&namespaces::MountReport>,
    fallback: Option<&str>,
) -> Vec<OsString> {
    let mut all: Vec<OsString> = vec![LAUNCHER_SUBCOMMAND.into(), CONFINE_FLAG.into()];
    let options = LaunchOptions {
        protected: &[],
        ..launch.options()
    };
    all.extend(option_arguments(&options));
    if let Some(mounts) = mounts {
        if mounts.read_only {
            all.push("--read-only-mounts".into());
        }
        all.push("--covered".into());
        all.push(mounts.hidden.to_string().into());
    }
    if confinement.namespaces {
        all.push("--in-namespaces".into());
    }
    if confinement.user_namespace {
        all.push("--user-namespace".into());
    }
    if confinement.network_namespace {
        all.push("--network-namespace".into());
    }
    if let Some(reason) = fallback {
        all.push("--no-namespaces-because".into());
        all.push(reason.into());
    }
    all.push("--".into());
    all.extend(launch.command.iter().cloned());
    all
}

/// The second stage: restricts this process as far as it can, reports
/// what applied on stderr and runs the command: in namespaces as its
/// child (this process stays as PID 1, see [`run_as_init`]), otherwise by
/// becoming it. Returns when the command ended (in namespaces), or when the
/// sandbox could not be applied (126) or the command could not run (126,
/// or 127 when it was not found).
pub fn confine_and_exec(launch: &Launch, confinement: Confinement, fallback_reason: Option<&str>) -> ExitCode {
    let Some((program, arguments)) = launch.command.split_first() else {
        eprintln!("keel sandbox-exec: no command given (put it after --)");
        return ExitCode::from(126);
    };
    // Should the supervisor die, so does this process, and with it (as PID
    // 1 of its namespace) everything the command started.
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // The supervisor blocks its stop signals and a child inherits the mask
    // (so would the command and everything it starts): clear it.
    let _ = nix::sys::signal::SigSet::all().thread_unblock();
    match confine(launch, confinement, fallback_reason) {
        Ok((status, report)) => {
            // The report goes out before the command writes anything.
            let mut stderr = std::io::stderr().lock();
            let _ = stderr.write_all(status_report_line(&status).as_bytes());
            let _ = stderr.flush();
            if confinement.namespaces {
                return run_as_init(program, arguments, report);
            }
        }
        Err(error) => {
            eprintln!(
                "keel sandbox-exec: cannot apply the {} sandbox, so the command was not run: {error}",
                launch.policy
            );
            return ExitCode::from(126);
        }
    }
    let error = Command::new(program).args(arguments).exec();
    eprintln!("keel sandbox-exec: cannot run {}: {error}", program.to_string_lossy());
    if error.kind() == std::io::ErrorKind::NotFound {
        ExitCode::from(127)
    } else {
        ExitCode::from(126)
    }
}

/// Applies every layer the policy calls for, in the order each needs:
/// mounts (which need privileges), then dropping the privileges, then
/// Landlock and seccomp (which need none).
fn confine(
    launch: &Launch,
    confinement: Confinement,
    fallback_reason: Option<&str>,
) -> Result<(SandboxStatus, Option<std::fs::File>), SandboxError> {
    let restricted = launch.policy != SandboxPolicy::FullAccess;
    let mut parts: Vec<String> = Vec::new();
    let mut read_only_mounts = false;
    let mut report_to = None;
    if confinement.namespaces {
        let private_proc = namespaces::mount_private_proc();
        // The supervisor's pipe (this process's standard input), opened for
        // writing before Landlock could refuse it; closed on exec.
        report_to = std::fs::OpenOptions::new().write(true).open("/proc/self/fd/0").ok();
        let names = Namespaces {
            user: confinement.user_namespace,
            network: confinement.network_namespace,
        }
        .describe();
        let mut text = format!("namespaces ({names})");
        if confinement.read_only_mounts {
            read_only_mounts = true;
            text.push_str(", read-only mounts");
        }
        if confinement.covered > 0 {
            text.push_str(&format!(", {} protected paths covered", confinement.covered));
        }
        if !private_proc {
            text.push_str(", host /proc visible");
        }
        parts.push(text);
    } else {
        let reason = fallback_reason.unwrap_or("not attempted");
        parts.push(format!(
            "no namespaces ({reason}): a subreaper ends the command's processes{}",
            if restricted {
                "; metadata outside the workspace and Keel's files not covered"
            } else {
                ""
            }
        ));
    }
    let mut network_blocked = confinement.network_namespace;
    let mut landlock_enforced = false;
    if restricted {
        privileges::drop_all().map_err(SandboxError::Confinement)?;
        parts.push("no capabilities".into());
        let writable = launch.writable();
        let writable: Vec<&Path> = writable.iter().map(PathBuf::as_path).collect();
        let applied = landlock::restrict_self(launch.policy, &writable, launch.network)?;
        landlock_enforced = applied.enforced();
        if let Applied::Enforced { features, .. } = &applied
            && features.contains(&"tcp")
            && features.contains(&"udp")
        {
            network_blocked = true;
        }
        parts.push(applied.describe());
        if !launch.network {
            match seccomp::deny_network() {
                Ok(()) => {
                    network_blocked = true;
                    parts.push("seccomp: no network sockets".into());
                }
                Err(error) if confinement.network_namespace => parts.push(format!("no seccomp ({error})")),
                Err(error) => return Err(SandboxError::Confinement(error)),
            }
        }
    } else {
        parts.insert(0, "the policy restricts nothing".into());
    }
    if network_blocked {
        parts.push(NETWORK_BLOCKED.into());
    } else if launch.network_allowed() {
        parts.push("network allowed".into());
    } else {
        parts.push("network not blocked".into());
    }
    let status = SandboxStatus {
        policy: launch.policy,
        enforced: restricted && (read_only_mounts || landlock_enforced),
        detail: parts.join("; "),
        network_blocked,
    };
    Ok((status, report_to))
}

/// How the command ended, as the confiner reports it to the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Code(u8),
    Signal(Signal),
}

impl Ended {
    fn of(status: WaitStatus) -> Option<Self> {
        match status {
            WaitStatus::Exited(_, code) => Some(Self::Code(u8::try_from(code).unwrap_or(u8::MAX))),
            WaitStatus::Signaled(_, signal, _) => Some(Self::Signal(signal)),
            _ => None,
        }
    }

    fn to_text(self) -> String {
        match self {
            Self::Code(code) => format!("code {code}"),
            Self::Signal(signal) => format!("signal {}", signal as i32),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        let (kind, number) = text.trim().split_once(' ')?;
        match kind {
            "code" => number.parse().ok().map(Self::Code),
            "signal" => number
                .parse::<i32>()
                .ok()
                .and_then(|number| Signal::try_from(number).ok())
                .map(Self::Signal),
            _ => None,
        }
    }
}

/// PID 1 of the command's namespace: starts the command as its child,
/// reaps every orphan until the command ends, kills what is left, tells
/// the supervisor how the command ended and exits; the kernel then ends
/// the namespace. The command is not PID 1 itself, so that it can be
/// ended by its own signals as anywhere else.
fn run_as_init(program: &OsString, arguments: &[OsString], report: Option<std::fs::File>) -> ExitCode {
    let child = match Command::new(program)
        .args(arguments)
        .stdin(std::process::Stdio::null())
        .spawn()
    {
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
    let command = i32::try_from(child.id()).ok().map(Pid::from_raw);
    let ended = loop {
        match waitpid(None, None) {
            Ok(status) if status.pid() == command => break Ended::of(status),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => break None,
        }
    };
    // Only PID 1 of a PID namespace may do this: it ends every other
    // process of the namespace, and nothing outside it.
    if getpid().as_raw() == 1 {
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        while waitpid(None, None).is_ok() {}
    }
    let ended = ended.unwrap_or(Ended::Code(126));
    if let Some(mut report) = report {
        let _ = report.write_all(ended.to_text().as_bytes());
    }
    match ended {
        Ended::Code(code) => ExitCode::from(code),
        Ended::Signal(signal) => ExitCode::from(u8::try_from(128 + signal as i32).unwrap_or(u8::MAX)),
    }
}

/// Ends this process by `signal`: the command's, or the one that asked the
/// supervisor to stop (`SIGKILL` when it lost its parent).
fn end_by(signal: Signal) -> ExitCode {
    let _ = raise(signal);
    ExitCode::from(u8::try_from(128 + signal as i32).unwrap_or(u8::MAX))
}

/// Ends this process the way the command ended: with its exit code, or by
/// the signal that killed it, so Keel reports what happened to the command.
fn exit_as(status: ExitStatus) -> ExitCode {
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

/// Probes what the launcher would enforce for `policy`: runs `true` under
/// it in the temporary directory (this process is the supervisor) and
/// returns the confiner's report.
pub fn probe(policy: SandboxPolicy, network: bool) -> Result<SandboxStatus, String> {
    let program = std::env::current_exe().map_err(|error| format!("cannot find the keel binary: {error}"))?;
    let workspace = std::env::temp_dir();
    let options = LaunchOptions {
        policy,
        workspace: &workspace,
        network,
        protected: &[],
    };
    let output = Command::new(program)
        .args(super::launcher_arguments(&options, "true".as_ref(), &[]))
        .current_dir(&workspace)
        .output()
        .map_err(|error| format!("cannot run the launcher: {error}"))?;
    output
        .stderr
        .split(|byte| *byte == b'\n')
        .find_map(super::parse_status_report)
        .ok_or_else(|| {
            format!(
                "the launcher reported nothing: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_round_trip_as_text() {
        for ended in [Ended::Code(0), Ended::Code(143), Ended::Signal(Signal::SIGTERM)] {
            assert_eq!(Ended::parse(&ended.to_text()), Some(ended));
        }
        assert_eq!(Ended::parse(""), None);
        assert_eq!(Ended::parse("signal 999"), None);
        assert_eq!(Ended::parse("code x"), None);
    }
}
