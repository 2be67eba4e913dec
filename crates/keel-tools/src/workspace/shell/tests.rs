use super::*;

async fn shell(config: ShellConfig, dir: &std::path::Path, arguments: serde_json::Value) -> Result<String, ToolError> {
    let tool = ShellTool::new(config);
    tokio::time::timeout(Duration::from_secs(60), super::super::test_call(&tool, dir, arguments))
        .await
        .expect("hang guard")
}

const UNSANDBOXED: &str = "[sandbox: workspace-write, not enforced: no sandbox launcher is configured]\n";

#[tokio::test]
async fn output_and_exit_code_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("here.txt"), "").unwrap();
    let output = shell(
        ShellConfig::default(),
        dir.path(),
        serde_json::json!({"command": "ls; echo done"}),
    )
    .await
    .unwrap();
    assert_eq!(
        output,
        format!("{UNSANDBOXED}[exit code 0]\n[stdout]\nhere.txt\ndone\n")
    );
    let failed = shell(
        ShellConfig::default(),
        dir.path(),
        serde_json::json!({"command": "echo out; echo err >&2; exit 3"}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        failed,
        ToolError::Failed(format!("{UNSANDBOXED}[exit code 3]\n[stdout]\nout\n[stderr]\nerr\n"))
    );
    let quiet = shell(
        ShellConfig::default(),
        dir.path(),
        serde_json::json!({"command": "true"}),
    )
    .await
    .unwrap();
    assert_eq!(quiet, format!("{UNSANDBOXED}[exit code 0]\n[no output]\n"));
}

#[tokio::test]
async fn full_access_says_nothing_is_restricted() {
    let dir = tempfile::tempdir().unwrap();
    let config = ShellConfig {
        sandbox: SandboxPolicy::FullAccess,
        ..ShellConfig::default()
    };
    let output = shell(config, dir.path(), serde_json::json!({"command": "printf x"}))
        .await
        .unwrap();
    assert_eq!(
        output,
        "[sandbox: full-access, not enforced: the policy restricts nothing]\n[exit code 0]\n[stdout]\nx\n"
    );
    // Full access goes through the launcher too (it ends every process
    // the command started), so a missing one is named.
    let config = ShellConfig {
        sandbox: SandboxPolicy::FullAccess,
        launcher: Some(PathBuf::from("/nonexistent/keel")),
        ..ShellConfig::default()
    };
    let refused = shell(config, dir.path(), serde_json::json!({"command": "true"}))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ToolError::Failed(message) if message.starts_with("cannot start the sandbox launcher /nonexistent/keel")),
        "{refused:?}"
    );
}

#[tokio::test]
async fn long_output_is_truncated_with_a_marker() {
    let dir = tempfile::tempdir().unwrap();
    let config = ShellConfig {
        output_cap: 1000,
        ..ShellConfig::default()
    };
    let output = shell(
        config,
        dir.path(),
        serde_json::json!({"command": "head -c 5000 /dev/zero | tr '\\0' a; head -c 1500 /dev/zero | tr '\\0' b >&2"}),
    )
    .await
    .unwrap();
    assert_eq!(
        output,
        format!(
            "{UNSANDBOXED}[exit code 0]\n[stdout]\n{}\n[truncated: 4000 more bytes]\n[stderr]\n{}\n[truncated: 500 more bytes]\n",
            "a".repeat(1000),
            "b".repeat(1000)
        )
    );
}

#[tokio::test]
async fn timeouts_kill_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let failed = shell(
        ShellConfig::default(),
        dir.path(),
        serde_json::json!({"command": "echo started; sleep 30", "timeout_ms": 300}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        failed,
        ToolError::Failed(format!(
            "{UNSANDBOXED}[timed out after 300 ms; the command and every process it started were killed]\n[stdout]\nstarted\n"
        ))
    );
}

#[tokio::test]
async fn timeouts_above_the_maximum_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = ShellConfig {
        max_timeout: Duration::from_secs(2),
        ..ShellConfig::default()
    };
    let refused = shell(
        config,
        dir.path(),
        serde_json::json!({"command": "true", "timeout_ms": 2001}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        refused,
        ToolError::InvalidArguments("'timeout_ms' must be an integer from 1 to 2000".into())
    );
}

#[tokio::test]
async fn a_missing_launcher_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = ShellConfig {
        launcher: Some(PathBuf::from("/nonexistent/keel")),
        ..ShellConfig::default()
    };
    let refused = shell(config, dir.path(), serde_json::json!({"command": "true"}))
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        ToolError::Failed(
            "cannot start the sandbox launcher /nonexistent/keel: No such file or directory (os error 2)".into()
        )
    );
}

#[test]
fn the_environment_is_scrubbed() {
    let parent = [
        ("PATH", "/opt/bin:/usr/bin"),
        ("HOME", "/home/me"),
        ("LANG", "C.UTF-8"),
        ("OPENAI_API_KEY", "sk-secret"),
        ("ANTHROPIC_API_KEY", "sk-ant"),
        ("TERM", "xterm-256color"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
    ]
    .map(|(name, value)| (OsString::from(name), OsString::from(value)));
    let expected = [
        ("HOME", "/home/me"),
        ("LANG", "C.UTF-8"),
        ("PATH", "/opt/bin:/usr/bin"),
        ("TERM", "dumb"),
    ]
    .map(|(name, value)| (OsString::from(name), OsString::from(value)));
    assert_eq!(command_environment(parent), expected);
    assert_eq!(
        command_environment([]),
        [("PATH", DEFAULT_PATH), ("TERM", "dumb")].map(|(name, value)| (OsString::from(name), OsString::from(value)))
    );
}

#[test]
fn status_lines_are_taken_from_stderr_only_when_they_are_reports() {
    let status = SandboxStatus {
        policy: SandboxPolicy::ReadOnly,
        enforced: true,
        detail: "landlock ABI v5".into(),
        network_blocked: false,
    };
    let report = sandbox::status_report_line(&status);
    let mut capture = Capture::new(100, true);
    // Split anywhere, even inside the marker.
    let bytes = format!("{report}real error\n");
    let (head, tail) = bytes.as_bytes().split_at(3);
    capture.push(head);
    capture.push(tail);
    assert_eq!(capture.status, Some(status));
    assert_eq!(capture.kept, b"real error\n");

    let mut plain = Capture::new(100, true);
    plain.push(b"no report here\nmore");
    assert_eq!(plain.status, None);
    assert_eq!(plain.kept, b"no report here\nmore");

    let mut unterminated = Capture::new(100, true);
    unterminated.push(b"partial");
    assert_eq!(unterminated.kept, b"");
    futures::executor::block_on(unterminated.read(None::<tokio::io::Empty>));
    assert_eq!(unterminated.kept, b"partial");
}
