//! `keel sandbox-exec --apart-only`: how Keel starts what it runs for a
//! session outside the shell's sandbox (MCP servers), with only the walls
//! between sessions (see [`super::apart_arguments`]).

use std::process::ExitCode;

use super::launcher::{Launch, become_command};
use super::{namespaces, privileges};

/// Runs the command with only the walls between sessions (see
/// [`apart_arguments`](super::apart_arguments)): in a mount namespace of
/// its own where each directory of workspaces shows only `workspace` and
/// Keel's protected paths are covered, without the capabilities that could
/// take those covers off; the rest of the host as it is. No process of its
/// own stays: this process becomes the command, keeping its standard
/// streams and process group (an MCP server speaks over them). Where no
/// mount namespace can be made, the command runs without it and stderr
/// says so, as the shell's fallback does.
pub fn exec_apart(launch: &Launch) -> ExitCode {
    let Some((program, arguments)) = launch.command.split_first() else {
        eprintln!("keel sandbox-exec: no command given (put it after --)");
        return ExitCode::from(126);
    };
    let refuse = |error: String| {
        eprintln!("keel sandbox-exec: cannot keep the other workspaces apart, so the command was not run: {error}");
        ExitCode::from(126)
    };
    match namespaces::unshare_mounts() {
        Ok(()) => {
            // Read before the mounts change what the path leads to.
            let directory = match std::env::current_dir() {
                Ok(directory) => directory,
                Err(error) => return refuse(format!("cannot read the current directory: {error}")),
            };
            if let Err(error) = namespaces::keep_apart(&launch.workspace, &launch.private_roots, &launch.protected) {
                return refuse(error);
            }
            if let Err(error) = privileges::drop_all() {
                return refuse(error);
            }
            // Entered again through the new mounts.
            if let Err(error) = std::env::set_current_dir(&directory) {
                return refuse(format!("cannot enter {}: {error}", directory.display()));
            }
        }
        Err(reason) => {
            eprintln!(
                "keel sandbox-exec: no mount namespace ({reason}): other workspaces stay in sight of the command"
            );
        }
    }
    become_command(program, arguments)
}
