//! `keel completions SHELL`: the shell's completion script for `keel`, on
//! stdout, generated from the command line's own definition (clap_complete).

use std::process::ExitCode;

use clap::{Args, CommandFactory};
use clap_complete::Shell;

/// Arguments of `keel completions`.
#[derive(Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell: bash, zsh, fish, powershell or elvish.
    #[arg(value_enum, value_name = "SHELL")]
    shell: Shell,
}

/// Prints the completion script.
pub(crate) fn completions(args: &CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut command = crate::Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "keel", &mut script);
    crate::print_line(String::from_utf8_lossy(&script).trim_end())?;
    Ok(ExitCode::SUCCESS)
}
