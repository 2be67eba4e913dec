//! The sandbox's launcher against a command that attacks it: replacing
//! the binary it is started from, and tracing the confiner that watches
//! it. The real `keel` binary, real processes.

use std::path::{Path, PathBuf};

use keel::tools::workspace::sandbox::SandboxPolicy;
use keel::tools::workspace::{ShellConfig, ShellTool};

use crate::suite::support::sandbox::{keel_run, outside_scratch, run, shell, shell_script};

#[test]
fn a_command_that_replaces_the_keel_binary_does_not_run_the_next_call_unsandboxed() {
    // As `./target/release/keel run` in a project whose workspace is the
    // current directory: the binary lies in the workspace.
    let dir = tempfile::tempdir().expect("dir");
    let repo = dir.path().join("repo");
    let release = repo.join("target/release");
    std::fs::create_dir_all(&release).expect("release dir");
    let binary = release.join("keel");
    std::fs::copy(env!("CARGO_BIN_EXE_keel"), &binary).expect("copy keel");
    // A place no sandboxed command may write.
    let outside = outside_scratch();
    let proof = outside.path().join("proof");
    let replace = format!(
        "printf '#!/bin/sh\\nid > {}\\necho replaced-launcher-ran\\n' > evil && chmod +x evil && \
         mv evil target/release/keel && echo moved",
        proof.display()
    );
    std::fs::write(repo.join("s.jsonl"), shell_script(&[&replace, "echo second"])).expect("script");
    let results = keel_run(&binary, &repo, &dir.path().join("keel.sqlite3"), None, &[]);
    assert_eq!(results.len(), 2, "{results:?}");
    // The replacement happened, so the test proves something.
    assert!(results[0].contains("[stdout]\nmoved\n"), "{}", results[0]);
    assert!(
        !proof.exists(),
        "the replaced launcher ran: {:?}",
        std::fs::read_to_string(&proof)
    );
    assert!(!results[1].contains("replaced-launcher-ran"), "{}", results[1]);
    // The next call still ran, sandboxed.
    assert!(
        results[1].starts_with("[sandbox: workspace-write, enforced:") && results[1].contains("[stdout]\nsecond\n"),
        "{}",
        results[1]
    );
}

/// A launcher that runs the command without the sandbox and says nothing
/// of it, as a replaced binary would.
fn impostor(dir: &Path) -> PathBuf {
    let path = dir.join("impostor");
    std::fs::write(
        &path,
        "#!/bin/sh\necho secret-output-of-an-unconfirmed-run\necho more >&2\n",
    )
    .expect("impostor");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    path
}

#[tokio::test]
async fn a_call_whose_launcher_does_not_confirm_the_sandbox_fails_and_returns_no_output() {
    let dir = tempfile::tempdir().expect("dir");
    for policy in [
        SandboxPolicy::ReadOnly,
        SandboxPolicy::WorkspaceWrite,
        SandboxPolicy::FullAccess,
    ] {
        let tool = ShellTool::new(ShellConfig {
            sandbox: policy,
            launcher: Some(impostor(dir.path())),
            ..ShellConfig::default()
        });
        let context = keel::tools::ToolContext {
            session_id: "s".into(),
            workspace: dir.path().to_path_buf(),
        };
        let serde_json::Value::Object(arguments) = serde_json::json!({"command": "echo hi"}) else {
            unreachable!()
        };
        let result = keel::tools::Tool::call(&tool, arguments, &context).await;
        let Err(keel::tools::ToolError::Failed(text)) = result else {
            panic!("{policy}: an unconfirmed call succeeded: {result:?}");
        };
        assert!(
            !text.contains("secret-output") && !text.contains("more"),
            "{policy}: {text}"
        );
        assert!(text.contains("did not confirm the sandbox"), "{policy}: {text}");
    }
}

/// A command that tries to attach to PID 1 of its namespace (the confiner)
/// with `ptrace`, through the system call itself (x86-64: 101,
/// `PTRACE_ATTACH` = 16), and says whether it could.
const ATTACH: &str = "perl -e '$r = syscall(101, 16, 1, 0, 0); print $r == 0 ? \"attached\\n\" : \"refused: $!\\n\"'; echo still-running";

#[tokio::test]
async fn a_command_cannot_trace_its_confiner() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let workspace = tempfile::tempdir().expect("workspace");
    // Full access restricts nothing: a command of a root Keel keeps root's
    // capabilities there, tracing included.
    for policy in [SandboxPolicy::ReadOnly, SandboxPolicy::WorkspaceWrite] {
        let output = run(&shell(policy, false), workspace.path(), ATTACH).await;
        assert!(output.contains("refused:"), "{policy}: {output}");
        assert!(!output.contains("attached"), "{policy}: {output}");
        // The command still ran to its end, and normally.
        assert!(
            output.contains("still-running\n") && output.contains("[exit code 0]"),
            "{policy}: {output}"
        );
    }
}

/// `sandbox-exec --apart-only` (how MCP servers start) keeps only the walls
/// between sessions: under the root only the workspace shows, a protected
/// file is covered, the command keeps its standard streams and exit code,
/// and it *is* the launched process (Keel stops an MCP server by its
/// process group), and it cannot take the covers off (no capabilities).
#[test]
fn apart_only_shows_the_workspace_alone_and_becomes_the_command() {
    let outside = outside_scratch();
    let root = outside.path().join("root");
    let workspace = root.join("mine");
    let other = root.join("theirs");
    for dir in [&workspace, &other] {
        std::fs::create_dir_all(dir).expect("dir");
    }
    std::fs::write(workspace.join("own.txt"), "own-canary").expect("own");
    std::fs::write(other.join("secret.txt"), "other-canary").expect("other");
    let protected = outside.path().join("keel.token");
    std::fs::write(&protected, "token-canary").expect("token");
    let probe = format!(
        "read line; echo got:$line; echo pid:$$; ls -a '{root}' | sed 's/^/listed: /'; \
         cat own.txt '{other}/secret.txt' '{protected}' 2>/dev/null; \
         umount -l '{root}' 2>/dev/null && echo unmounted; exit 7",
        root = root.display(),
        other = other.display(),
        protected = protected.display()
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["sandbox-exec", "--apart-only", "--workspace"])
        .arg(&workspace)
        .arg("--private-root")
        .arg(&root)
        .arg("--protect")
        .arg(&protected)
        .args(["--", "sh", "-c", &probe])
        .current_dir(&workspace)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the launcher");
    let pid = child.id();
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), b"hello\n").expect("write stdin");
    let output = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(7), "{stdout}{stderr}");
    assert!(stdout.contains("got:hello"), "stdin did not reach it: {stdout}{stderr}");
    assert!(
        stdout.contains(&format!("pid:{pid}")),
        "not the launched process: {stdout}"
    );
    assert!(stdout.contains("own-canary"), "{stdout}{stderr}");
    assert!(stdout.contains("listed: mine"), "{stdout}{stderr}");
    for seen in ["listed: theirs", "other-canary", "token-canary", "unmounted"] {
        assert!(!stdout.contains(seen), "{seen}: {stdout}{stderr}");
    }
}
