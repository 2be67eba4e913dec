//! The two stages of `keel sandbox-exec` (see the module above): the
//! supervisor, which creates the namespaces and watches the command from
//! outside them, and the confiner, which restricts itself inside them and
//! becomes the command.
//!
//! Both run before any other thread of the process exists (Landlock
//! restricts only the calling thread, and a user namespace can only be
//! entered by a single-threaded process), so the binary dispatches them
//! before starting its async runtime.
//!
//! The supervisor starts the confiner from [`SELF_EXE`], the kernel's
//! reference to the running binary, never from a path: a command may
//! write the path the binary was started from (a `keel` inside the
//! workspace, or under `/tmp`), and must not decide what the next sandbox
//! runs.

use std::ffi::{OsStr, OsString};
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, getuid};

use super::init::{Ended, end_by, exit_as, run_as_init};
use super::landlock::{self, Applied};
use super::limits::{self, Cgroup, CgroupLimits, Limits};
use super::namespaces::{self, MountPlan, Namespaces};
use super::private_mounts;
use super::reaper::{self, Waited};
use super::{
    LAUNCHER_SUBCOMMAND, LaunchOptions, NETWORK_BLOCKED, SandboxError, SandboxPolicy, SandboxReads, SandboxStatus,
    USUAL_SOCKET_DIRECTORIES, option_arguments, privileges, seccomp, status_report_line,
};

/// The running binary, as the kernel knows it (`/proc/self/exe`, resolved
/// by the process that executes it: Keel's child, a copy of Keel). It
/// names the binary's file itself, so replacing the file at its path (a
/// rename over it; writing into it is refused while it runs) changes
/// nothing. Use it as [`ShellConfig::launcher`](crate::workspace::ShellConfig::launcher).
pub const SELF_EXE: &str = "/proc/self/exe";

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
    /// Directories of database sockets to cover, besides
    /// [`USUAL_SOCKET_DIRECTORIES`].
    pub sockets: Vec<PathBuf>,
    /// Directories of workspaces, of which the command sees only its own.
    pub private_roots: Vec<PathBuf>,
    /// What the command may read.
    pub reads: SandboxReads,
    /// The call's resource limits.
    pub limits: Limits,
    /// Whether to try namespaces at all; without them the launcher uses its
    /// fallback (Landlock, seccomp and a subreaper), as on a host that
    /// allows none.
    pub namespaces: bool,
    /// Whether to hide only other sessions' workspaces and Keel's protected
    /// paths ([`super::apart::exec_apart`]) instead of applying a policy.
    pub apart_only: bool,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// Where the supervisor put the confiner: the flags it passes on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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
    /// What else the supervisor did to the mounts, for the status line
    /// (`3 protected paths covered`, `minimal /dev`, `private /tmp`, …).
    pub mount_notes: Vec<String>,
    /// What the call's cgroup limits, if it has one.
    pub cgroup: Option<CgroupLimits>,
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
            sockets: &self.sockets,
            private_roots: &self.private_roots,
            reads: self.reads,
            limits: self.limits,
        }
    }

    /// Whether the command may use the network: when asked for, and always
    /// under full access, which restricts nothing.
    fn network_allowed(&self) -> bool {
        self.network || self.policy == SandboxPolicy::FullAccess
    }

    /// The places the command may write: under workspace-write the
    /// workspace and, in namespaces, the call's private `/tmp` and
    /// `/dev/shm` (without them, the shared temporary directory).
    fn writable(&self, in_namespaces: bool) -> Vec<PathBuf> {
        if self.policy != SandboxPolicy::WorkspaceWrite {
            return Vec::new();
        }
        let mut places = vec![private_mounts::real_path(&self.workspace)];
        if in_namespaces {
            places.extend(["/tmp", "/dev/shm"].map(PathBuf::from));
        } else {
            places.push(private_mounts::real_path(&std::env::temp_dir()));
        }
        places
    }

    /// Every socket directory to cover.
    fn socket_directories(&self) -> Vec<PathBuf> {
        let mut all: Vec<PathBuf> = USUAL_SOCKET_DIRECTORIES.iter().map(PathBuf::from).collect();
        all.extend(self.sockets.iter().cloned());
        all
    }
}

/// Refuses to run the command: says why on stderr, exit code 126.
fn refuse(policy: SandboxPolicy, error: impl std::fmt::Display) -> ExitCode {
    eprintln!("keel sandbox-exec: cannot apply the {policy} sandbox, so the command was not run: {error}");
    ExitCode::from(126)
}

/// The first stage: creates the call's cgroup and the namespaces, starts
/// the confiner in them, waits for the command and cleans up after it.
/// Returns the command's exit code (or ends by the signal that killed it).
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
        return refuse(launch.policy, error);
    }
    let signals = reaper::block_stop_signals();
    // Before the namespaces: its files are opened on the host's mounts,
    // which stay writable for this process alone.
    let mut cgroup = match Cgroup::create(&launch.limits) {
        Ok(cgroup) => Some(cgroup),
        Err(reason) => {
            tracing::debug!(%reason, "no cgroup for the call");
            None
        }
    };
    let attempt = if launch.namespaces {
        namespaces::unshare(launch.network_allowed())
    } else {
        Err("turned off".to_owned())
    };
    let (mut confinement, fallback_reason) = match attempt {
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
    confinement.cgroup = cgroup.as_ref().map(Cgroup::limits);
    if !confinement.namespaces {
        // Orphans of the command become this process's children, so that
        // it can kill them all at the end.
        let _ = nix::sys::prctl::set_child_subreaper(true);
    }
    if confinement.namespaces {
        match set_up_mounts(launch) {
            Ok((read_only, notes)) => {
                confinement.read_only_mounts = read_only;
                confinement.mount_notes = notes;
            }
            Err(error) => return refuse(launch.policy, error),
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
    // Outside the command's namespaces, but its descendant: with no other
    // user, a command of the fallback could otherwise trace this process.
    let _ = nix::sys::prctl::set_dumpable(false);
    let mut confiner = Command::new(SELF_EXE);
    confiner.args(confiner_arguments(launch, &confinement, fallback_reason.as_deref()));
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
    // The confiner is born in the call's cgroup, so it is counted before
    // it can start anything.
    if let Some(group) = &mut cgroup
        && let Err(error) = group.enter()
    {
        return refuse(launch.policy, error);
    }
    let spawned = confiner.spawn();
    if let Some(group) = &mut cgroup {
        group.leave();
    }
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
    if let Some(group) = cgroup {
        group.remove();
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

/// Sets up the command's mount namespace (see [`namespaces::confine_mounts`]);
/// returns whether the mounts are read-only, and notes for the status.
fn set_up_mounts(launch: &Launch) -> Result<(bool, Vec<String>), String> {
    let restricted = launch.policy != SandboxPolicy::FullAccess;
    let writable = launch.writable(true);
    let sockets = launch.socket_directories();
    let report = namespaces::confine_mounts(&MountPlan {
        restricted,
        workspace: &launch.workspace,
        writable: &writable,
        hidden: if restricted { &launch.protected } else { &[] },
        sockets: &sockets,
        private_roots: &launch.private_roots,
        tmp_size: launch.limits.tmp_size,
    })?;
    let mut notes = Vec::new();
    if report.hidden > 0 {
        notes.push(format!("{} protected paths covered", report.hidden));
    }
    if report.private_roots > 0 {
        notes.push("other workspaces covered".into());
    }
    if let Some(dev) = report.dev {
        notes.push(
            if dev.pts {
                "minimal /dev"
            } else {
                "minimal /dev (no pts)"
            }
            .to_owned(),
        );
    }
    if restricted {
        let mut covered: Vec<String> = Vec::new();
        if report.private_tmp {
            notes.push("private /tmp".into());
            covered.push("private /tmp".into());
        } else {
            notes.push("/tmp is the workspace".into());
        }
        covered.extend(report.sockets.iter().map(|dir| dir.display().to_string()));
        notes.push(format!("database sockets covered ({})", covered.join(", ")));
    }
    Ok((report.read_only, notes))
}

/// The confiner's arguments: the same options but the protected paths
/// (the command can read PID 1's command line), the confinement, the
/// command.
fn confiner_arguments(launch: &Launch, confinement: &Confinement, fallback: Option<&str>) -> Vec<OsString> {
    let mut all: Vec<OsString> = vec![LAUNCHER_SUBCOMMAND.into(), CONFINE_FLAG.into()];
    let options = LaunchOptions {
        protected: &[],
        sockets: &[],
        private_roots: &[],
        ..launch.options()
    };
    all.extend(option_arguments(&options));
    if confinement.read_only_mounts {
        all.push("--read-only-mounts".into());
    }
    for note in &confinement.mount_notes {
        all.push("--mount-note".into());
        all.push(note.into());
    }
    if let Some(cgroup) = confinement.cgroup {
        all.push("--cgroup".into());
        all.push(cgroup.flag().into());
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
/// child (this process stays as PID 1 and reaps orphans), otherwise by
/// becoming it. Returns when the command ended (in namespaces), or when the
/// sandbox could not be applied (126) or the command could not run (126,
/// or 127 when it was not found).
pub fn confine_and_exec(launch: &Launch, confinement: &Confinement, fallback_reason: Option<&str>) -> ExitCode {
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
        Err(error) => return refuse(launch.policy, error),
    }
    become_command(program, arguments)
}

/// Replaces this process with `program`; returns only when that failed:
/// 127 when it was not found, 126 otherwise, as a shell says.
pub(super) fn become_command(program: &OsStr, arguments: &[OsString]) -> ExitCode {
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
/// Landlock and seccomp (which need none), then the rlimits; and makes this
/// process non-dumpable, so that the command (same user, no capabilities)
/// cannot trace or stop it.
fn confine(
    launch: &Launch,
    confinement: &Confinement,
    fallback_reason: Option<&str>,
) -> Result<(SandboxStatus, Option<std::fs::File>), SandboxError> {
    let restricted = launch.policy != SandboxPolicy::FullAccess;
    let mut parts: Vec<String> = Vec::new();
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
            text.push_str(", read-only mounts");
        }
        for note in &confinement.mount_notes {
            text.push_str(", ");
            text.push_str(note);
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
                "; metadata outside the workspace, Keel's files, the host's /dev and /tmp and \
                 database sockets not covered"
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
        let writable = launch.writable(confinement.namespaces);
        let writable: Vec<&Path> = writable.iter().map(PathBuf::as_path).collect();
        // The minimal /dev's terminals and devices are the command's own;
        // the host's (without namespaces) are not.
        let devices: &[&Path] = if confinement.namespaces {
            &[
                Path::new("/dev/zero"),
                Path::new("/dev/full"),
                Path::new("/dev/tty"),
                Path::new("/dev/pts"),
            ]
        } else {
            &[]
        };
        // Narrowed reads: the workspace, the writable places and the
        // system's directories.
        let mut readable: Vec<&Path> = vec![launch.workspace.as_path(), Path::new("/tmp")];
        readable.extend(writable.iter().copied());
        readable.extend(landlock::SYSTEM_DIRECTORIES.iter().map(Path::new));
        let reads = (launch.reads == SandboxReads::Workspace).then_some(readable.as_slice());
        let applied = landlock::restrict_self(launch.policy, &writable, devices, launch.network, reads)?;
        landlock_enforced = applied.enforced();
        if let Applied::Enforced { features, .. } = &applied
            && features.contains(&"tcp")
            && features.contains(&"udp")
        {
            network_blocked = true;
        }
        parts.push(applied.describe());
        if reads.is_some() && applied.enforced() {
            parts.push("reads: the workspace and the system's directories".into());
        }
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
    let rlimits = limits::apply_rlimits(&launch.limits).map_err(SandboxError::Confinement)?;
    parts.push(format!(
        "limits: {}, {rlimits}",
        limits::describe_cgroup(confinement.cgroup, &launch.limits)
    ));
    nix::sys::prctl::set_dumpable(false)
        .map_err(|error| SandboxError::Confinement(format!("cannot make the confiner non-dumpable: {error}")))?;
    if network_blocked {
        parts.push(NETWORK_BLOCKED.into());
    } else if launch.network_allowed() {
        parts.push("network allowed".into());
    } else {
        parts.push("network not blocked".into());
    }
    let status = SandboxStatus {
        policy: launch.policy,
        enforced: restricted && (confinement.read_only_mounts || landlock_enforced),
        detail: parts.join("; "),
        network_blocked,
    };
    Ok((status, report_to))
}

/// Probes what the launcher would enforce for `policy`: runs `true` under
/// it in the temporary directory (this process is the supervisor) and
/// returns the confiner's report.
pub fn probe(policy: SandboxPolicy, network: bool) -> Result<SandboxStatus, String> {
    let workspace = std::env::temp_dir();
    let options = LaunchOptions {
        policy,
        workspace: &workspace,
        network,
        protected: &[],
        sockets: &[],
        private_roots: &[],
        reads: SandboxReads::Anywhere,
        limits: Limits::default(),
    };
    let output = Command::new(SELF_EXE)
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
