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
use keel::tools::workspace::sandbox::SandboxPolicy;
use keel::tools::workspace::sandbox::launcher::{self, Confinement, Launch};

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
    /// Do not use namespaces (the fallback of hosts that allow none).
    #[arg(long, hide = true)]
    no_namespaces: bool,
    /// Print what this machine enforces for the policy (one JSON line) and exit.
    #[arg(long)]
    probe: bool,
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
    /// Second stage: how many protected paths the supervisor covered.
    #[arg(long, hide = true, default_value_t = 0)]
    covered: usize,
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
        namespaces: !args.no_namespaces,
        command: args.command,
    };
    if args.confine {
        let confinement = Confinement {
            namespaces: args.in_namespaces,
            user_namespace: args.user_namespace,
            network_namespace: args.network_namespace,
            read_only_mounts: args.read_only_mounts,
            covered: args.covered,
        };
        launcher::confine_and_exec(&launch, confinement, args.no_namespaces_because.as_deref())
    } else {
        launcher::supervise(&launch)
    }
}
