//! The shell tool and `keel run` as the sandbox tests drive them: the
//! shell under a policy with the real `keel` binary as its launcher, a
//! scripted model that makes shell calls, and directories outside the
//! temporary directory that workspace-write lets commands write.

use std::path::{Path, PathBuf};
use std::process::Command;

use keel::tools::workspace::sandbox::SandboxPolicy;
use keel::tools::workspace::{ShellConfig, ShellTool};
use keel::tools::{Tool, ToolContext, ToolError};

use super::wait::guard;

/// The shell under `policy`, launched by the real `keel` binary.
pub(crate) fn shell(policy: SandboxPolicy, network: bool) -> ShellTool {
    ShellTool::new(ShellConfig {
        sandbox: policy,
        network,
        launcher: Some(PathBuf::from(env!("CARGO_BIN_EXE_keel"))),
        ..ShellConfig::default()
    })
}

/// Runs `command` in `workspace`; the result text whether it failed or not.
pub(crate) async fn run(tool: &ShellTool, workspace: &Path, command: &str) -> String {
    let context = ToolContext {
        session_id: "s".into(),
        workspace: workspace.to_path_buf(),
    };
    let serde_json::Value::Object(arguments) = serde_json::json!({"command": command}) else {
        unreachable!()
    };
    match guard(command, tool.call(arguments, &context)).await {
        Ok(output) => output,
        Err(ToolError::Failed(output)) => output,
        Err(other) => panic!("{command}: {other:?}"),
    }
}

/// A directory outside the temporary directory (which workspace-write
/// lets commands write), wherever the checkout is.
pub(crate) fn outside_scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(outside_the_temporary_directory()).expect("scratch dir")
}

/// A writable directory that is not under the temporary directory (which
/// the workspace-write policy lets commands write): the build's scratch
/// directory unless the checkout itself lives under `/tmp`, else `$HOME`.
pub(crate) fn outside_the_temporary_directory() -> std::path::PathBuf {
    let temporary = std::env::temp_dir().canonicalize().unwrap();
    let candidates = [
        Some(std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))),
        std::env::var_os("HOME").map(std::path::PathBuf::from),
    ];
    candidates
        .into_iter()
        .flatten()
        .filter_map(|dir| dir.canonicalize().ok())
        .find(|dir| !dir.starts_with(&temporary) && tempfile::tempdir_in(dir).is_ok())
        .expect("a writable directory outside the temporary directory (the target dir or $HOME)")
}

/// A `script:` model that makes one `shell` call per command, in order,
/// then answers `done`.
pub(crate) fn shell_script(commands: &[&str]) -> String {
    let mut script = String::new();
    for command in commands {
        let call = serde_json::json!({"tool_calls": [{"name": "shell", "arguments": {"command": command}}]});
        script.push_str(&format!("{call}\n"));
    }
    script.push_str("{\"text\": \"done\"}\n");
    script
}

/// The outputs of the tool calls in the `--json` output of `keel run`.
pub(crate) fn shell_results(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["msg"]["type"] == "tool_call_completed")
        .map(|event| event["msg"]["output"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Runs `binary run --json --approve auto --model script:s.jsonl go` in
/// `cwd` (which holds `s.jsonl`, see [`shell_script`]) with its database
/// at `db`, as user `uid` when given, with `extra` arguments; the outputs
/// of its tool calls. The run must succeed.
pub(crate) fn keel_run(binary: &Path, cwd: &Path, db: &Path, uid: Option<u32>, extra: &[&str]) -> Vec<String> {
    let mut keel = keel_run_command(binary, cwd, db, uid);
    keel.args(extra).arg("go");
    run_for_shell_results(keel)
}

/// `binary run --json --approve auto --model script:s.jsonl` in `cwd`
/// with its database at `db`, as user `uid` when given; the caller adds
/// the prompt.
pub(crate) fn keel_run_command(binary: &Path, cwd: &Path, db: &Path, uid: Option<u32>) -> Command {
    let mut keel = Command::new(binary);
    keel.args(["run", "--json", "--approve", "auto", "--model", "script:s.jsonl"])
        .env("KEEL_DB", db)
        .env("HOME", cwd)
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_CONFIG")
        .current_dir(cwd);
    if let Some(uid) = uid {
        std::os::unix::process::CommandExt::uid(&mut keel, uid);
        std::os::unix::process::CommandExt::gid(&mut keel, uid);
    }
    keel
}

/// Runs a `keel run` made by [`keel_run_command`], which must succeed;
/// the outputs of its tool calls.
pub(crate) fn run_for_shell_results(mut keel: Command) -> Vec<String> {
    let output = keel.output().expect("keel run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    shell_results(&stdout)
}

/// Hands `dir` and everything in it to `uid` (for a Keel run as that user).
pub(crate) fn chown_to(dir: &Path, uid: u32) {
    let status = Command::new("chown")
        .args(["-R", &format!("{uid}:{uid}")])
        .arg(dir)
        .status()
        .expect("chown");
    assert!(status.success());
}
