//! The workspace tools through a real `ToolSet`, with the real `keel` binary
//! as the shell's sandbox launcher: confinement of every path-taking tool,
//! the shell's process handling, environment and sandbox reporting.

use std::path::{Path, PathBuf};

use keel::model::ToolCall;
use keel::tools::workspace::sandbox::{self, SandboxPolicy, SandboxStatus};
use keel::tools::workspace::{ShellConfig, WorkspaceToolsConfig, tools};
use keel::tools::{ToolContext, ToolOutcome, ToolSet};

use crate::suite::support::sandbox::outside_the_temporary_directory;
use crate::suite::support::wait::{HANG_GUARD, guard, wait_until_async};

/// A workspace directory inside a scratch directory, with `outside/`
/// (holding `secret.txt`) beside it.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("ws")).expect("workspace");
        std::fs::create_dir_all(dir.path().join("outside")).expect("outside");
        std::fs::write(dir.path().join("outside/secret.txt"), "secret\n").expect("secret");
        Self { dir }
    }

    fn workspace(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    fn context(&self) -> ToolContext {
        ToolContext {
            session_id: "s".into(),
            workspace: self.workspace(),
        }
    }
}

fn launcher_config(policy: SandboxPolicy) -> ShellConfig {
    ShellConfig {
        sandbox: policy,
        launcher: Some(PathBuf::from(env!("CARGO_BIN_EXE_keel"))),
        ..ShellConfig::default()
    }
}

fn tool_set(shell: ShellConfig) -> ToolSet {
    let mut set = ToolSet::new();
    for tool in tools(WorkspaceToolsConfig {
        write: true,
        shell: Some(shell),
    }) {
        set.add(tool);
    }
    set
}

fn call(name: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall {
        call_id: "c".into(),
        name: name.into(),
        arguments: arguments.to_string(),
    }
}

async fn run(set: &ToolSet, scratch: &Scratch, name: &str, arguments: serde_json::Value) -> ToolOutcome {
    guard(name, set.run(&call(name, arguments), &scratch.context())).await
}

fn ok(outcome: ToolOutcome) -> String {
    assert!(!outcome.is_error, "expected success: {}", outcome.output);
    outcome.output
}

fn error(outcome: ToolOutcome) -> String {
    assert!(outcome.is_error, "expected an error: {}", outcome.output);
    outcome.output
}

/// The result without its first line (the sandbox status).
fn after_status(output: &str) -> &str {
    output.split_once('\n').map_or("", |(_, rest)| rest)
}

#[tokio::test]
async fn every_tool_does_its_job() {
    let scratch = Scratch::new();
    let set = tool_set(ShellConfig::default());
    assert_eq!(
        ok(run(
            &set,
            &scratch,
            "write_file",
            serde_json::json!({"path": "src/lib.rs", "content": "fn a() {}\nfn b() {}\n"})
        )
        .await),
        "wrote 20 bytes to 'src/lib.rs' (new file)"
    );
    assert_eq!(
        ok(run(&set, &scratch, "read_file", serde_json::json!({"path": "src/lib.rs"})).await),
        "     1\tfn a() {}\n     2\tfn b() {}\n"
    );
    assert_eq!(
        ok(run(
            &set,
            &scratch,
            "edit_file",
            serde_json::json!({"path": "src/lib.rs", "old_string": "fn b() {}", "new_string": "fn b() { a() }"})
        )
        .await),
        "replaced 1 occurrence in 'src/lib.rs'"
    );
    assert_eq!(
        ok(run(&set, &scratch, "list_dir", serde_json::json!({"depth": 2})).await),
        "src/\nsrc/lib.rs  (25 bytes)\n"
    );
    assert_eq!(
        ok(run(&set, &scratch, "search", serde_json::json!({"pattern": "\\{ a\\(\\)"})).await),
        "src/lib.rs:2: fn b() { a() }\n"
    );
    assert_eq!(
        ok(run(
            &set,
            &scratch,
            "shell",
            serde_json::json!({"command": "wc -l < src/lib.rs; pwd"})
        )
        .await),
        format!(
            "[sandbox: workspace-write, not enforced: no sandbox launcher is configured]\n[exit code 0]\n[stdout]\n2\n{}\n",
            std::fs::canonicalize(scratch.workspace()).unwrap().display()
        )
    );
    let names: Vec<String> = std::fs::read_dir(scratch.workspace().join("src"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["lib.rs"], "no temporary files are left behind");
}

#[tokio::test]
async fn paths_leading_out_of_the_workspace_are_refused_by_every_tool() {
    let scratch = Scratch::new();
    let workspace = scratch.workspace();
    std::fs::create_dir_all(workspace.join("a")).unwrap();
    std::fs::write(workspace.join("a/inside.txt"), "inside\n").unwrap();
    std::os::unix::fs::symlink(scratch.outside().join("secret.txt"), workspace.join("file-link")).unwrap();
    std::os::unix::fs::symlink(scratch.outside(), workspace.join("dir-link")).unwrap();
    let set = tool_set(ShellConfig::default());

    let escapes = [
        "../outside/secret.txt",
        "/etc/passwd",
        "a/../../outside/secret.txt",
        "file-link",
        "dir-link/secret.txt",
        // Not yet existing, below a link that leads out.
        "dir-link/new/file.txt",
    ];
    for path in escapes {
        let attempts = [
            ("read_file", serde_json::json!({"path": path})),
            ("list_dir", serde_json::json!({"path": path})),
            ("search", serde_json::json!({"pattern": "secret", "path": path})),
            ("write_file", serde_json::json!({"path": path, "content": "pwned"})),
            (
                "edit_file",
                serde_json::json!({"path": path, "old_string": "secret", "new_string": "pwned"}),
            ),
        ];
        for (tool, arguments) in attempts {
            let message = error(run(&set, &scratch, tool, arguments).await);
            assert!(
                message.starts_with(&format!("'{path}' ")) && message.contains("outside the workspace"),
                "{tool} {path}: {message}"
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(scratch.outside().join("secret.txt")).unwrap(),
        "secret\n"
    );
    assert!(!scratch.outside().join("new").exists(), "nothing was created outside");

    // An absolute path inside the workspace is fine, for every tool.
    let inside = workspace.join("a/inside.txt");
    let inside = inside.to_str().unwrap();
    let dir = workspace.join("a");
    let dir = dir.to_str().unwrap();
    assert_eq!(
        ok(run(&set, &scratch, "read_file", serde_json::json!({"path": inside})).await),
        "     1\tinside\n"
    );
    assert_eq!(
        ok(run(&set, &scratch, "list_dir", serde_json::json!({"path": dir})).await),
        "a/inside.txt  (7 bytes)\n"
    );
    assert_eq!(
        ok(run(
            &set,
            &scratch,
            "search",
            serde_json::json!({"pattern": "ins", "path": dir})
        )
        .await),
        "a/inside.txt:1: inside\n"
    );
    assert_eq!(
        ok(run(
            &set,
            &scratch,
            "edit_file",
            serde_json::json!({"path": inside, "old_string": "inside", "new_string": "still inside"})
        )
        .await),
        "replaced 1 occurrence in 'a/inside.txt'"
    );
    assert_eq!(
        ok(run(
            &set,
            &scratch,
            "write_file",
            serde_json::json!({"path": inside, "content": "x"})
        )
        .await),
        "wrote 1 byte to 'a/inside.txt' (replaced 13 bytes)"
    );
}

#[tokio::test]
async fn search_respects_gitignore_and_caps_matches() {
    let scratch = Scratch::new();
    let workspace = scratch.workspace();
    std::fs::write(workspace.join(".gitignore"), "build/\n").unwrap();
    std::fs::create_dir_all(workspace.join("build")).unwrap();
    std::fs::write(workspace.join("build/generated.txt"), "needle\n").unwrap();
    let many: String = (1..=250).map(|n| format!("needle {n}\n")).collect();
    std::fs::write(workspace.join("many.txt"), many).unwrap();
    let set = tool_set(ShellConfig::default());
    let output = ok(run(&set, &scratch, "search", serde_json::json!({"pattern": "needle"})).await);
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines.len(), 201, "{output}");
    assert!(lines.iter().all(|line| !line.starts_with("build/")), "{output}");
    assert_eq!(lines[199], "many.txt:200: needle 200");
    assert_eq!(
        lines[200],
        "[stopped at 200 matches; narrow the search with path, glob or a more specific pattern]"
    );
}

#[tokio::test]
async fn the_shell_reports_whether_its_sandbox_is_enforced() {
    let scratch = Scratch::new();
    for policy in [SandboxPolicy::ReadOnly, SandboxPolicy::WorkspaceWrite] {
        let set = tool_set(launcher_config(policy));
        let output = ok(run(&set, &scratch, "shell", serde_json::json!({"command": "echo hi"})).await);
        let first = output.lines().next().unwrap();
        let status = SandboxStatus::from_line(first).expect("a status line");
        assert_eq!(status.policy, policy);
        assert_eq!(status.enforced, sandbox::probe(policy).enforced, "{first}");
        if status.enforced {
            assert!(first.starts_with(&format!("[sandbox: {policy}, enforced: ")), "{first}");
            assert!(
                first.contains("landlock ABI v") || first.contains("read-only mounts"),
                "{first}"
            );
        } else {
            assert!(
                first.starts_with(&format!("[sandbox: {policy}, not enforced: landlock unavailable")),
                "{first}"
            );
        }
        // The launcher's report is taken out of stderr.
        assert_eq!(after_status(&output), "[exit code 0]\n[stdout]\nhi\n");
    }
    let set = tool_set(launcher_config(SandboxPolicy::FullAccess));
    let output = ok(run(&set, &scratch, "shell", serde_json::json!({"command": "echo hi"})).await);
    assert!(
        output.starts_with("[sandbox: full-access, not enforced: the policy restricts nothing"),
        "{output}"
    );
    assert_eq!(after_status(&output), "[exit code 0]\n[stdout]\nhi\n");
}

#[tokio::test]
async fn read_only_commands_cannot_write_where_the_sandbox_is_enforced() {
    let scratch = Scratch::new();
    let set = tool_set(launcher_config(SandboxPolicy::ReadOnly));
    let outcome = run(
        &set,
        &scratch,
        "shell",
        serde_json::json!({"command": "echo x > written.txt; echo discarded > /dev/null && echo null-ok"}),
    )
    .await;
    let written = scratch.workspace().join("written.txt");
    if sandbox::probe(SandboxPolicy::ReadOnly).enforced {
        assert!(!written.exists(), "the read-only sandbox let a write through");
        assert!(outcome.output.contains("[stdout]\nnull-ok\n"), "{}", outcome.output);
        assert!(refused_write(&outcome.output), "{}", outcome.output);
    } else {
        // Unenforced, and said so: the write happened.
        assert!(written.exists());
        assert!(
            outcome.output.starts_with("[sandbox: read-only, not enforced: "),
            "{}",
            outcome.output
        );
    }
}

/// Whether a shell result shows a write refused by the sandbox: by
/// Landlock (permission denied) or by a read-only mount.
fn refused_write(output: &str) -> bool {
    output.contains("Permission denied") || output.contains("Read-only file system")
}

#[tokio::test]
async fn workspace_write_commands_write_only_in_the_workspace_where_enforced() {
    let scratch = Scratch::new();
    // Outside both the workspace and /tmp, which workspace-write allows.
    let elsewhere = tempfile::tempdir_in(outside_the_temporary_directory()).unwrap();
    let target = elsewhere.path().join("escaped.txt");
    let set = tool_set(launcher_config(SandboxPolicy::WorkspaceWrite));
    let command = format!("echo in > inside.txt; echo out > '{}'", target.display());
    let outcome = run(&set, &scratch, "shell", serde_json::json!({"command": command})).await;
    assert_eq!(
        std::fs::read_to_string(scratch.workspace().join("inside.txt")).unwrap(),
        "in\n"
    );
    if sandbox::probe(SandboxPolicy::WorkspaceWrite).enforced {
        assert!(
            !target.exists(),
            "the sandbox let a write outside the workspace through"
        );
        assert!(outcome.is_error && refused_write(&outcome.output), "{}", outcome.output);
    } else {
        assert!(target.exists());
    }
}

#[test]
fn the_launcher_probes_and_fails_clearly() {
    let keel = env!("CARGO_BIN_EXE_keel");
    let probe = std::process::Command::new(keel)
        .args(["sandbox-exec", "--probe", "--policy", "read-only"])
        .output()
        .unwrap();
    assert!(probe.status.success());
    let status: SandboxStatus = serde_json::from_slice(&probe.stdout).unwrap();
    let landlock = sandbox::probe(SandboxPolicy::ReadOnly);
    assert_eq!(status.policy, SandboxPolicy::ReadOnly);
    // The launcher enforces at least what Landlock alone can.
    assert!(status.enforced || !landlock.enforced, "{status:?}");
    assert!(
        status.network_blocked == status.detail.contains("network blocked"),
        "{status:?}"
    );

    let missing = std::process::Command::new(keel)
        .args(["sandbox-exec", "--policy", "read-only", "--", "no-such-command-h7"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.ends_with("keel sandbox-exec: cannot run no-such-command-h7: No such file or directory (os error 2)\n"),
        "{stderr}"
    );

    let no_workspace = std::process::Command::new(keel)
        .args([
            "sandbox-exec",
            "--policy",
            "workspace-write",
            "--workspace",
            "/no/such/workspace",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(no_workspace.status.code(), Some(126));
    let stderr = String::from_utf8_lossy(&no_workspace.stderr);
    assert!(
        stderr.starts_with("keel sandbox-exec: cannot apply the workspace-write sandbox, so the command was not run: cannot open the workspace /no/such/workspace"),
        "{stderr}"
    );
}

/// Whether `pid` has ended (gone, a zombie, or reused by something that is
/// not `sleep`).
fn ended(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let Some((name, rest)) = stat.split_once(") ") else {
        return true;
    };
    !name.ends_with("(sleep") && !name.ends_with("(sh") || rest.starts_with('Z') || rest.starts_with('X')
}

/// Waits (bounded by the hang guard) until the process in `pid_file` ended.
async fn assert_ends(pid_file: &Path) {
    let pid: i32 = std::fs::read_to_string(pid_file).unwrap().trim().parse().unwrap();
    wait_until_async(&format!("process {pid} to end"), HANG_GUARD, async || ended(pid)).await;
}

/// Waits (bounded by the hang guard) until `path` holds a line.
async fn wait_for_line(path: &Path) {
    wait_until_async(&format!("{} to be written", path.display()), HANG_GUARD, async || {
        std::fs::read_to_string(path).is_ok_and(|text| text.ends_with('\n'))
    })
    .await;
}

#[tokio::test]
async fn a_timeout_kills_the_command_and_its_children() {
    let scratch = Scratch::new();
    for shell in [ShellConfig::default(), launcher_config(SandboxPolicy::WorkspaceWrite)] {
        let set = tool_set(shell);
        let message = error(
            run(
                &set,
                &scratch,
                "shell",
                serde_json::json!({"command": "sleep 100 & echo $! > bg.pid; echo started; sleep 30", "timeout_ms": 300}),
            )
            .await,
        );
        assert_eq!(
            after_status(&message),
            "[timed out after 300 ms; the command and every process it started were killed]\n[stdout]\nstarted\n"
        );
        assert_ends(&scratch.workspace().join("bg.pid")).await;
    }
}

#[tokio::test]
async fn background_jobs_do_not_outlive_the_command() {
    let scratch = Scratch::new();
    let set = tool_set(ShellConfig::default());
    // The job keeps stdout open; the call must neither wait for it nor leave it.
    let output = ok(run(
        &set,
        &scratch,
        "shell",
        serde_json::json!({"command": "sleep 100 & echo $! > bg.pid; echo done"}),
    )
    .await);
    assert_eq!(after_status(&output), "[exit code 0]\n[stdout]\ndone\n");
    assert_ends(&scratch.workspace().join("bg.pid")).await;
}

#[tokio::test]
async fn dropping_the_call_kills_the_command() {
    let scratch = Scratch::new();
    for shell in [ShellConfig::default(), launcher_config(SandboxPolicy::WorkspaceWrite)] {
        let set = tool_set(shell);
        let context = scratch.context();
        let shell_call = call(
            "shell",
            serde_json::json!({"command": "echo $$ > sh.pid; sleep 100 & echo $! > bg.pid; wait"}),
        );
        let mut running = Box::pin(set.run(&shell_call, &context));
        let bg_pid = scratch.workspace().join("bg.pid");
        tokio::select! {
            outcome = &mut running => panic!("the command ended early: {outcome:?}"),
            () = wait_for_line(&bg_pid) => {}
        }
        wait_for_line(&scratch.workspace().join("sh.pid")).await;
        drop(running);
        assert_ends(&scratch.workspace().join("sh.pid")).await;
        assert_ends(&scratch.workspace().join("bg.pid")).await;
        std::fs::remove_file(scratch.workspace().join("sh.pid")).unwrap();
        std::fs::remove_file(scratch.workspace().join("bg.pid")).unwrap();
    }
}

#[tokio::test]
async fn output_is_truncated_with_a_marker() {
    let scratch = Scratch::new();
    let set = tool_set(ShellConfig {
        output_cap: 100,
        ..launcher_config(SandboxPolicy::WorkspaceWrite)
    });
    let message = error(
        run(
            &set,
            &scratch,
            "shell",
            serde_json::json!({"command": "seq 1 1000; echo oops >&2; exit 2"}),
        )
        .await,
    );
    let seq: String = (1..=1000).map(|n| format!("{n}\n")).collect();
    assert_eq!(
        after_status(&message),
        format!(
            "[exit code 2]\n[stdout]\n{}\n[truncated: {} more bytes]\n[stderr]\noops\n",
            &seq[..100].trim_end_matches('\n'),
            seq.len() - 100
        )
    );
}

/// Run as a child of [`commands_cannot_see_secrets`] with a fake key in its
/// environment (and on its own, with whatever the environment holds): the
/// command's environment has none of it.
#[tokio::test]
async fn commands_cannot_see_secrets_child() {
    if std::env::var_os("KEEL_TEST_SECRETS_CHILD").is_some() {
        assert_eq!(std::env::var("OPENAI_API_KEY").as_deref(), Ok("sk-fake-h7-secret"));
    }
    let scratch = Scratch::new();
    for shell in [ShellConfig::default(), launcher_config(SandboxPolicy::ReadOnly)] {
        let set = tool_set(shell);
        let output = ok(run(&set, &scratch, "shell", serde_json::json!({"command": "env | sort"})).await);
        let names: Vec<&str> = after_status(&output)
            .lines()
            .skip(2)
            .filter_map(|line| line.split_once('=').map(|(name, _)| name))
            .collect();
        let allowed = ["HOME", "LANG", "LC_ALL", "OLDPWD", "PATH", "PWD", "SHLVL", "TERM", "_"];
        assert!(names.iter().all(|name| allowed.contains(name)), "{output}");
        assert!(names.contains(&"TERM") && names.contains(&"PATH"), "{output}");
        assert!(!output.contains("sk-fake-h7-secret"), "{output}");
    }
}

#[test]
fn commands_cannot_see_secrets() {
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "suite::workspace_tools::commands_cannot_see_secrets_child",
            "--test-threads=1",
        ])
        .env("OPENAI_API_KEY", "sk-fake-h7-secret")
        .env("KEEL_TEST_SECRETS_CHILD", "1")
        .output()
        .expect("re-run this test binary with a secret in its environment");
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&child.stderr)
    );
    assert!(stdout.contains("1 passed"), "the child test did not run: {stdout}");
}

#[tokio::test]
async fn a_command_killed_by_a_signal_is_reported_alike_with_and_without_the_launcher() {
    // The launcher runs the command as its child and ends the way it ended.
    let scratch = Scratch::new();
    for shell in [ShellConfig::default(), launcher_config(SandboxPolicy::WorkspaceWrite)] {
        let set = tool_set(shell);
        let message = error(
            run(
                &set,
                &scratch,
                "shell",
                serde_json::json!({"command": "echo before; kill -TERM $$; echo after"}),
            )
            .await,
        );
        assert_eq!(after_status(&message), "[killed by signal 15]\n[stdout]\nbefore\n");
        let exited = error(run(&set, &scratch, "shell", serde_json::json!({"command": "exit 7"})).await);
        assert_eq!(after_status(&exited), "[exit code 7]\n[no output]\n");
    }
}
