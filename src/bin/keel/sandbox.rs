//! `keel sandbox-exec` (hidden): the launcher the `shell` tool runs its
//! commands through. The work is in `keel::tools::workspace::sandbox::launcher`;
//! this module parses the flags and picks the stage: the supervisor (the
//! default) or, with `--confine`, the confiner it starts inside the new
//! namespaces.
//!
//! It must run before any other thread exists (Landlock restricts only the
//! calling thread, and a user namespace can only be entered by a
//! single-threaded process), so `main` dispatches it before starting the
//! async runtime. Exit codes of its own, as a shell would use them: 126
//! when the sandbox cannot be applied or the command cannot run, 127 when
//! the command is not found.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use keel::tools::workspace::sandbox::launcher::{self, Confinement, Launch};
use keel::tools::workspace::sandbox::{Limits, SandboxPolicy};

/// Arguments of `keel sandbox-exec`.
#[derive(Args, Debug)]
pub(crate) struct SandboxExecArgs {
    /// The policy: read-only, workspace-write or full-access.
    #[arg(long, default_value = "workspace-write", value_name = "POLICY")]
    policy: SandboxPolicy,
    /// The workspace, writable under workspace-write [default: the current directory].
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Let the command use the network.
    #[arg(long)]
    network: bool,
    /// A file or directory the command may not see (repeatable).
    #[arg(long, value_name = "PATH")]
    protect: Vec<PathBuf>,
    /// A directory holding the database's Unix sockets, to cover (repeatable;
    /// /run/postgresql and /var/run/postgresql always are).
    #[arg(long, value_name = "DIR")]
    cover_sockets: Vec<PathBuf>,
    /// A directory of workspaces of which the command sees only its own
    /// (repeatable).
    #[arg(long, value_name = "DIR")]
    private_root: Vec<PathBuf>,
    /// What the command may read: anywhere (but Keel's files and other
    /// workspaces), or only its workspace and the system's directories.
    #[arg(long, value_name = "READS", default_value = "anywhere", value_parser = ["anywhere", "workspace"])]
    reads: String,
    /// The most processes the command may run at once.
    #[arg(long, value_name = "N", default_value_t = Limits::default().processes)]
    max_processes: u32,
    /// The most memory the command may use, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().memory)]
    max_memory: u64,
    /// The most CPU time each process may use, in seconds [default: no limit].
    #[arg(long, value_name = "SECS")]
    max_cpu_secs: Option<u64>,
    /// The largest file the command may write, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().file_size)]
    max_file_size: u64,
    /// The size of the command's private /tmp and /dev/shm, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().tmp_size)]
    tmp_size: u64,
    /// Do not use namespaces (the fallback of hosts that allow none).
    #[arg(long, hide = true)]
    no_namespaces: bool,
    /// Print what this machine enforces for the policy (one JSON line) and exit.
    #[arg(long)]
    probe: bool,
    /// Restrict nothing but the walls between sessions: only the workspace
    /// shows under each --private-root, the --protect paths are covered (for
    /// MCP servers).
    #[arg(long, hide = true, conflicts_with = "confine")]
    apart_only: bool,
    /// Second stage: confine this process and become the command.
    #[arg(long, hide = true)]
    confine: bool,
    /// Second stage: running in new namespaces.
    #[arg(long, hide = true)]
    in_namespaces: bool,
    /// Second stage: the namespaces include a user namespace.
    #[arg(long, hide = true)]
    user_namespace: bool,
    /// Second stage: the namespaces include a network namespace.
    #[arg(long, hide = true)]
    network_namespace: bool,
    /// Second stage: the supervisor made the mounts read-only.
    #[arg(long, hide = true)]
    read_only_mounts: bool,
    /// Second stage: what else the supervisor did to the mounts (repeatable).
    #[arg(long, hide = true, value_name = "NOTE")]
    mount_note: Vec<String>,
    /// Second stage: what the call's cgroup limits (`v1,pids,memory`).
    #[arg(long, hide = true, value_name = "LIMITS")]
    cgroup: Option<String>,
    /// Second stage: why no namespaces could be created.
    #[arg(long, hide = true, value_name = "REASON")]
    no_namespaces_because: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Runs the launcher stage the flags ask for.
pub(crate) fn sandbox_exec(args: SandboxExecArgs) -> ExitCode {
    if args.probe {
        return match launcher::probe(args.policy, args.network)
            .and_then(|status| serde_json::to_string(&status).map_err(|error| error.to_string()))
        {
            Ok(json) if crate::print_line(&json).is_ok() => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
            Err(error) => {
                eprintln!("keel sandbox-exec: cannot probe the sandbox: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let workspace = match args.workspace.map_or_else(std::env::current_dir, Ok) {
        Ok(workspace) => workspace,
        Err(error) => {
            eprintln!("keel sandbox-exec: cannot read the current directory: {error}");
            return ExitCode::from(126);
        }
    };
    let launch = Launch {
        policy: args.policy,
        workspace,
        network: args.network,
        protected: args.protect,
        sockets: args.cover_sockets,
        private_roots: args.private_root,
        reads: if args.reads == "workspace" {
            keel::tools::workspace::sandbox::SandboxReads::Workspace
        } else {
            keel::tools::workspace::sandbox::SandboxReads::Anywhere
        },
        limits: Limits {
            processes: args.max_processes,
            memory: args.max_memory,
            cpu_time: args.max_cpu_secs.map(std::time::Duration::from_secs),
            file_size: args.max_file_size,
            tmp_size: args.tmp_size,
        },
        namespaces: !args.no_namespaces,
        apart_only: args.apart_only,
        command: args.command,
    };
    if launch.apart_only {
        keel::tools::workspace::sandbox::apart::exec_apart(&launch)
    } else if args.confine {
        let cgroup = match args
            .cgroup
            .as_deref()
            .map(keel::tools::workspace::sandbox::limits::CgroupLimits::parse_flag)
            .transpose()
        {
            Ok(cgroup) => cgroup,
            Err(error) => {
                eprintln!("keel sandbox-exec: {error}");
                return ExitCode::from(126);
            }
        };
        let confinement = Confinement {
            namespaces: args.in_namespaces,
            user_namespace: args.user_namespace,
            network_namespace: args.network_namespace,
            read_only_mounts: args.read_only_mounts,
            mount_notes: args.mount_note,
            cgroup,
        };
        launcher::confine_and_exec(&launch, &confinement, args.no_namespaces_because.as_deref())
    } else {
        launcher::supervise(&launch)
    }
}
