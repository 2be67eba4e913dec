//! The shell's sandbox against its own commands, as an attacker would use
//! them: the real `keel` binary as the launcher, real processes, real
//! sockets. Each test also shows the thing it forbids working where the
//! policy allows it, so none passes by breaking the shell.

use std::io::Read as _;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use keel::tools::workspace::sandbox::SandboxPolicy;

use crate::suite::support::process::keel_binary_for;
use crate::suite::support::process::processes_with;
use crate::suite::support::sandbox::{
    keel_run_command, outside_scratch, run, run_for_shell_results, shell, shell_script,
};
use crate::suite::support::wait::poll_for;

/// A perl one-liner (perl is part of every Debian system) that connects
/// to `port` on loopback and says whether it could.
fn connect_command(port: u16) -> String {
    format!(
        "perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\", Timeout => 3) \
         or die \"connect failed: $!\\n\"; print \"connected\\n\"'"
    )
}

#[tokio::test]
async fn commands_reach_no_network_unless_it_is_allowed() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    listener.set_nonblocking(true).expect("non-blocking");
    let port = listener.local_addr().expect("address").port();
    let workspace = tempfile::tempdir().expect("workspace");
    let accepted = || {
        let mut count = 0;
        while listener.accept().is_ok() {
            count += 1;
        }
        count
    };
    // As a command reaching Keel's own API on loopback would.
    for policy in [SandboxPolicy::ReadOnly, SandboxPolicy::WorkspaceWrite] {
        let output = run(&shell(policy, false), workspace.path(), &connect_command(port)).await;
        assert!(output.contains("connect failed"), "{policy}: {output}");
        assert!(output.contains("network blocked"), "{policy}: {output}");
        assert_eq!(accepted(), 0, "{policy}: a sandboxed command connected");
    }
    // The same command connects where the network is allowed.
    for (policy, network) in [
        (SandboxPolicy::WorkspaceWrite, true),
        (SandboxPolicy::FullAccess, false),
    ] {
        let output = run(&shell(policy, network), workspace.path(), &connect_command(port)).await;
        assert!(output.contains("[stdout]\nconnected\n"), "{policy}: {output}");
        assert_eq!(accepted(), 1, "{policy}");
    }
}

#[tokio::test]
async fn no_process_a_call_starts_outlives_it_under_any_policy() {
    let workspace = tempfile::tempdir().expect("workspace");
    for (index, policy) in [
        SandboxPolicy::ReadOnly,
        SandboxPolicy::WorkspaceWrite,
        SandboxPolicy::FullAccess,
    ]
    .into_iter()
    .enumerate()
    {
        // A background job, a setsid one (own session and group), and a
        // double fork (orphaned at once): the durations are markers.
        let markers = [4100 + index * 3, 4101 + index * 3, 4102 + index * 3].map(|marker| marker.to_string());
        let command = format!(
            "sleep {} & setsid sleep {} & sh -c 'sleep {} &' ; sleep 0.2; echo started",
            markers[0], markers[1], markers[2]
        );
        let output = run(&shell(policy, false), workspace.path(), &command).await;
        assert!(output.contains("[stdout]\nstarted\n"), "{policy}: {output}");
        let mut left: Vec<u32> = Vec::new();
        let ended = poll_for(Duration::from_secs(5), || {
            left = markers.iter().flat_map(|marker| processes_with(marker)).collect();
            left.is_empty().then_some(())
        });
        assert!(
            ended.is_some(),
            "{policy}: processes of a finished call are still running: {left:?}"
        );
    }
}

#[tokio::test]
async fn commands_change_no_metadata_outside_the_workspace() {
    let workspace = tempfile::tempdir().expect("workspace");
    let outside = outside_scratch();
    let target = outside.path().join("target.txt");
    std::fs::write(&target, "keep\n").expect("target");
    let before = std::fs::metadata(&target).expect("metadata");
    let inside = workspace.path().join("inside.txt");
    std::fs::write(&inside, "inside\n").expect("inside");
    // Extended attributes through the system call itself (x86-64's
    // setxattr), as no attr tool is installed everywhere.
    let setxattr = |path: &str| {
        format!(
            "perl -e 'my ($p, $n, $v) = ($ARGV[0], \"user.keel\", \"x\"); $r = syscall(188, $p, $n, $v, 1, 0); print \"xattr=\", ($r == 0 ? 0 : 1), \"\\n\"' '{path}'"
        )
    };
    let attacks = |path: &Path| {
        let path = path.display().to_string();
        format!(
            "chmod 0777 '{path}'; echo chmod=$?; touch -m -d '2001-02-03 04:05:06' '{path}'; echo touch=$?; \
             chown 65534:65534 '{path}'; echo chown=$?; {}",
            setxattr(&path)
        )
    };
    let has_xattr = |path: &Path| {
        let mut value = [0u8; 16];
        rustix::fs::getxattr(path, "user.keel", &mut value).is_ok()
    };
    for policy in [SandboxPolicy::ReadOnly, SandboxPolicy::WorkspaceWrite] {
        let output = run(&shell(policy, false), workspace.path(), &attacks(&target)).await;
        let after = std::fs::metadata(&target).expect("metadata");
        assert_eq!(after.mode(), before.mode(), "{policy}: mode changed: {output}");
        assert_eq!(after.mtime(), before.mtime(), "{policy}: times changed: {output}");
        assert_eq!(
            (after.uid(), after.gid()),
            (before.uid(), before.gid()),
            "{policy}: owner changed: {output}"
        );
        assert!(
            output.contains("chmod=1") && output.contains("touch=1"),
            "{policy}: {output}"
        );
        if cfg!(target_arch = "x86_64") {
            assert!(!has_xattr(&target), "{policy}: an extended attribute was set: {output}");
            assert!(output.contains("xattr=1"), "{policy}: {output}");
        }
    }
    // Inside the workspace, workspace-write lets the same commands work.
    let output = run(
        &shell(SandboxPolicy::WorkspaceWrite, false),
        workspace.path(),
        &format!(
            "chmod 0600 inside.txt; echo chmod=$?; touch -m -d '2001-02-03 04:05:06' inside.txt; echo touch=$?; {}",
            setxattr("inside.txt")
        ),
    )
    .await;
    assert!(output.contains("chmod=0") && output.contains("touch=0"), "{output}");
    if cfg!(target_arch = "x86_64") {
        assert!(output.contains("xattr=0") && has_xattr(&inside), "{output}");
    }
    assert_eq!(std::fs::metadata(&inside).expect("metadata").mode() & 0o777, 0o600);
}

/// What a sandboxed command of `keel run` finds when it hunts for Keel's
/// secrets: the environment and command lines of every process it can
/// see, the database and keel.toml. `uid` runs Keel as that user.
fn hunt_for_secrets(uid: Option<u32>) {
    let dir = tempfile::tempdir().expect("dir");
    let secret = format!("sk-canary-{}", uuid::Uuid::now_v7().simple());
    let header = format!("hdr-canary-{}", uuid::Uuid::now_v7().simple());
    let message = format!("db-canary-{}", uuid::Uuid::now_v7().simple());
    let db = dir.path().join("data/keel-canary-db.sqlite3");
    std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
    std::fs::write(
        dir.path().join("keel.toml"),
        format!(
            "[models.proxy]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             headers = {{ \"X-Key\" = \"{header}\" }}\n"
        ),
    )
    .expect("config");
    // The patterns are written so that they do not match themselves in the
    // command's own command line.
    let command = String::from(
        "for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat \"$f\"; done 2>/dev/null | tr '\\0' '\\n' \
         | grep -a -o -e '[s]k-canary-[0-9a-f]*' -e '[k]eel-canary-db'; \
         grep -a -o '[d]b-canary-[0-9a-f]*' data/*.sqlite3* 2>&1; \
         grep -a -o '[h]dr-canary-[0-9a-f]*' keel.toml 2>&1; echo hunted",
    );
    std::fs::write(dir.path().join("s.jsonl"), shell_script(&[&command])).expect("script");
    let binary = keel_binary_for(uid, dir.path());
    if let Some(uid) = uid {
        let status = Command::new("chown")
            .args(["-R", &format!("{uid}:{uid}")])
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(status.success());
    }
    let mut keel = keel_run_command(&binary, dir.path(), &db, uid);
    keel.arg(&message).env("OPENAI_API_KEY", &secret);
    let result = run_for_shell_results(keel)
        .into_iter()
        .next()
        .expect("the shell call's result");
    assert!(result.contains("hunted"), "the hunt did not run: {result}");
    for (what, canary) in [
        ("the API key", &secret),
        ("the database", &message),
        ("keel.toml", &header),
    ] {
        assert!(!result.contains(canary.as_str()), "a command read {what}: {result}");
    }
    assert!(
        !result.contains("keel-canary-db\n"),
        "a command saw Keel's command line or environment: {result}"
    );
    // The hunt could have succeeded: the message is there, in plain text.
    let mut stored = Vec::new();
    for suffix in ["", "-wal"] {
        let mut path = db.as_os_str().to_os_string();
        path.push(suffix);
        if let Ok(mut file) = std::fs::File::open(&path) {
            file.read_to_end(&mut stored).expect("read the database");
        }
    }
    assert!(
        String::from_utf8_lossy(&stored).contains(&message),
        "the message is not stored in plain text, so the hunt proves nothing"
    );
}

#[test]
fn a_command_sees_neither_keels_environment_nor_its_files() {
    hunt_for_secrets(None);
}

#[test]
fn a_command_of_an_unprivileged_keel_sees_none_of_its_secrets_either() {
    if nix::unistd::geteuid().is_root() {
        hunt_for_secrets(Some(65534));
    } else {
        // Already unprivileged: the test above is this one.
        hunt_for_secrets(None);
    }
}

#[test]
fn without_namespaces_the_fallback_still_contains_the_command() {
    // As on a host that allows no namespaces: Landlock, seccomp and a
    // subreaper supervisor.
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    listener.set_nonblocking(true).expect("non-blocking");
    let port = listener.local_addr().expect("address").port();
    let workspace = tempfile::tempdir().expect("workspace");
    let outside = outside_scratch();
    let target = outside.path().join("escaped.txt");
    let command = format!(
        "setsid sleep 4201 & sh -c 'sleep 4202 &'; {}; echo out > '{}'; echo in > inside.txt; echo ran",
        connect_command(port),
        target.display()
    );
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "sandbox-exec",
            "--no-namespaces",
            "--policy",
            "workspace-write",
            "--workspace",
        ])
        .arg(workspace.path())
        .args(["--", "sh", "-c", &command])
        .current_dir(workspace.path())
        .output()
        .expect("launcher");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("ran"), "{stdout}{stderr}");
    assert!(stderr.contains("no namespaces (turned off)"), "{stderr}");
    assert!(stderr.contains("network blocked"), "{stderr}");
    assert!(stderr.contains("connect failed"), "{stderr}");
    assert!(listener.accept().is_err(), "the command connected");
    assert!(!target.exists(), "the command wrote outside the workspace");
    assert!(workspace.path().join("inside.txt").exists(), "{stderr}");
    // The subreaper killed the orphans before the launcher returned.
    let left: Vec<u32> = ["4201", "4202"]
        .iter()
        .flat_map(|marker| processes_with(marker))
        .collect();
    assert!(left.is_empty(), "processes outlived the command: {left:?}");
}
