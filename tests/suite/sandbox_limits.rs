//! Per-call resource limits of sandboxed commands: processes, memory and
//! CPU time, held by a cgroup where the machine allows one and by rlimits
//! always; the status line says which applied. Real processes, the real
//! `keel` binary.

use std::path::PathBuf;
use std::time::Duration;

use keel::tools::workspace::sandbox::{Limits, SandboxPolicy};
use keel::tools::workspace::{ShellConfig, ShellTool};

use crate::suite::support::process::processes_with;
use crate::suite::support::sandbox::{run, shell};
use crate::suite::support::wait::wait_until;

/// The shell under workspace-write with `limits`.
fn limited(limits: Limits) -> ShellTool {
    ShellTool::new(ShellConfig {
        sandbox: SandboxPolicy::WorkspaceWrite,
        launcher: Some(PathBuf::from(env!("CARGO_BIN_EXE_keel"))),
        limits,
        ..ShellConfig::default()
    })
}

#[tokio::test]
async fn a_call_that_starts_thousands_of_processes_is_held_to_the_limit() {
    let workspace = tempfile::tempdir().expect("workspace");
    // The sleep's length marks the children.
    let bomb = "perl -e 'my $n = 0; for (1..3000) { my $p = fork; last unless defined $p; \
                if (!$p) { exec \"sleep\", \"4311\" } $n++ } print \"started $n\\n\"'";
    let output = run(&shell(SandboxPolicy::WorkspaceWrite, false), workspace.path(), bomb).await;
    let started: usize = output
        .split("started ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("{output}"));
    assert!(started < 512, "{started} processes started: {output}");
    assert!(output.contains("pids 512") || output.contains("nproc 512"), "{output}");
    // The host is fine: the processes are gone, and new ones start.
    wait_until("the call's processes to end", Duration::from_secs(10), || {
        processes_with("4311").is_empty()
    });
    let after = run(
        &shell(SandboxPolicy::WorkspaceWrite, false),
        workspace.path(),
        "echo fine",
    )
    .await;
    assert!(after.contains("[stdout]\nfine\n"), "{after}");
}

#[tokio::test]
async fn a_call_that_uses_more_memory_than_the_limit_is_stopped() {
    let workspace = tempfile::tempdir().expect("workspace");
    let tool = limited(Limits {
        memory: 96 << 20,
        ..Limits::default()
    });
    // One process asking for more than the limit.
    let one = run(
        &tool,
        workspace.path(),
        "perl -e '$x = \"a\" x (200 << 20); print \"allocated\\n\"'",
    )
    .await;
    assert!(!one.contains("allocated"), "{one}");
    assert!(one.contains("data 96 MiB"), "{one}");
    // Four processes, each under the per-process limit, together over it:
    // only a cgroup counts them together.
    let many = run(
        &tool,
        workspace.path(),
        "perl -e 'for (1..4) { if (!fork) { $x = \"a\" x (40 << 20); sleep 3; exit 0 } } \
         my $killed = 0; while (wait > 0) { $killed++ if ($? & 127) == 9 } print \"killed $killed\\n\"'",
    )
    .await;
    if many.contains("memory 96 MiB") {
        assert!(!many.contains("killed 0"), "{many}");
        assert!(many.contains("killed "), "{many}");
    } else {
        // No cgroup on this machine: the status says so.
        assert!(many.contains("no cgroup"), "{many}");
    }
}

#[tokio::test]
async fn a_call_that_spins_is_stopped_by_its_cpu_time() {
    let workspace = tempfile::tempdir().expect("workspace");
    let tool = limited(Limits {
        cpu_time: Some(Duration::from_secs(1)),
        ..Limits::default()
    });
    let output = run(&tool, workspace.path(), "perl -e '1 while 1'").await;
    // SIGXCPU.
    assert!(output.contains("cpu 1 s"), "{output}");
    assert!(
        output.contains("[killed by signal 24]") || output.contains("[exit code 152]"),
        "{output}"
    );
}

#[tokio::test]
async fn the_status_says_which_limits_applied() {
    let workspace = tempfile::tempdir().expect("workspace");
    let output = run(
        &shell(SandboxPolicy::ReadOnly, false),
        workspace.path(),
        "ulimit -c; ulimit -d",
    )
    .await;
    let status = output.lines().next().unwrap_or_default();
    assert!(status.contains("limits: "), "{status}");
    assert!(
        status.contains("data 2 GiB") && status.contains("core 0") && status.contains("cpu 61 s"),
        "{status}"
    );
    if nix::unistd::geteuid().is_root() && std::path::Path::new("/sys/fs/cgroup/pids").exists() {
        assert!(
            status.contains("cgroup v1 (pids 512, memory 2 GiB)") || status.contains("cgroup v2"),
            "{status}"
        );
    }
    assert!(output.contains("[stdout]\n0\n2097152\n"), "{output}");
}
