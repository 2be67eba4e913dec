//! The `keel` binary run as a user would: a scratch directory with its
//! database, commands in it, their output read back, and processes that
//! are waited for with a bound or killed to simulate a crash.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use keel::protocol::{EventMsg, RecordedEvent};

use super::wait::poll_for;

/// A scratch directory with a database path and helpers to run `keel` in it.
pub(crate) struct Cli {
    pub(crate) dir: tempfile::TempDir,
}

impl Cli {
    /// A fresh scratch directory.
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// The database file `keel` is pointed at (`KEEL_DB`).
    pub(crate) fn db(&self) -> PathBuf {
        self.dir.path().join("keel.sqlite3")
    }

    /// Writes a model script of `lines` and returns its path.
    pub(crate) fn script(&self, name: &str, lines: &[&str]) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, lines.join("\n")).expect("write script");
        path
    }

    /// `keel args…` in the scratch directory, on its database, with no
    /// model from the environment.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .args(args)
            .env("KEEL_DB", self.db())
            .env_remove("KEEL_MODEL")
            .current_dir(self.dir.path());
        command
    }

    /// Runs `keel args…` to the end.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run keel")
    }

    /// Every stored event of `session`, as `keel events --json` prints them.
    pub(crate) fn events(&self, session: &str) -> Vec<RecordedEvent> {
        let output = self.run(&["events", "--session", session, "--json", "--limit", "10000"]);
        assert!(output.status.success(), "keel events failed: {}", stderr(&output));
        parse_events(&output.stdout)
    }
}

/// What a finished command printed on stdout.
pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What a finished command printed on stderr.
pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The events of `keel … --json` output, one JSON object a line.
pub(crate) fn parse_events(bytes: &[u8]) -> Vec<RecordedEvent> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("bad event line {line:?}: {error}")))
        .collect()
}

/// The session id that the first event (`session_started`) names.
pub(crate) fn session_of(events: &[RecordedEvent]) -> String {
    match &events[0].msg {
        EventMsg::SessionStarted(started) => started.session_id.clone(),
        other => panic!("first event is {other:?}, not session_started"),
    }
}

/// `keel run --json …` started in the background, read up to and including
/// the first event that `stop_at` picks (printed only once it is durable).
pub(crate) struct Running {
    pub(crate) child: std::process::Child,
    pub(crate) lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    pub(crate) seen: Vec<RecordedEvent>,
}

impl Running {
    #[expect(clippy::zombie_processes, reason = "the caller reaps the child it is given")]
    pub(crate) fn start(cli: &Cli, args: &[&str], stop_at: impl Fn(&EventMsg) -> bool) -> Self {
        let mut child = cli
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn keel");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut seen = Vec::new();
        loop {
            let line = lines.next().expect("keel ended early").expect("read line");
            let event: RecordedEvent = serde_json::from_str(&line).expect("event json");
            let stop = stop_at(&event.msg);
            seen.push(event);
            if stop {
                return Self { child, lines, seen };
            }
        }
    }

    /// Kills the process (SIGKILL: a crash) and reaps it.
    pub(crate) fn crash(mut self) -> Vec<RecordedEvent> {
        self.child.kill().expect("kill keel");
        self.child.wait().expect("reap keel");
        self.seen
    }
}

/// Asserts a failed command printed exactly one line of error, naming `needle`.
pub(crate) fn assert_one_line_error(output: &Output, needle: &str) {
    assert!(
        !output.status.success(),
        "expected failure, got success: {}",
        stdout(output)
    );
    let err = stderr(output);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got {err:?}");
    assert!(lines[0].starts_with("error: "), "{err:?}");
    assert!(lines[0].contains(needle), "{err:?} should mention {needle:?}");
    assert!(!err.contains("panicked"), "{err:?}");
}

/// Waits up to `timeout` for `child` to exit; `None` if it still runs, so
/// that the caller can kill it and say what hung.
pub(crate) fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    poll_for(timeout, || child.try_wait().expect("wait for the child"))
}

/// The `keel` binary, as user `uid` can run it: the build's own, or for
/// another user a copy in `dir` (which that user must own), since the
/// checkout may lie under a directory only its owner can enter.
pub(crate) fn keel_binary_for(uid: Option<u32>, dir: &Path) -> PathBuf {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    if uid.is_none() {
        return binary;
    }
    let copy = dir.join("keel-binary");
    std::fs::copy(&binary, &copy).expect("copy the keel binary");
    copy
}

/// A word no other process has on its command line, to find this test's
/// server processes among all of the machine's.
pub(crate) fn marker() -> String {
    format!("keel-mcp-test-{}", uuid::Uuid::now_v7())
}

/// The processes whose command line has `marker` as an argument.
pub(crate) fn processes_with(marker: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            cmdline
                .split(|byte| *byte == 0)
                .any(|arg| arg == marker.as_bytes())
                .then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}
