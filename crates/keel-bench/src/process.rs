//! `keel serve` as a child process of the bench, as an operator runs it:
//! its own runtime, allocator and threads, so what it costs in CPU and
//! memory is read from `/proc` apart from the client's.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::stats::status_kib;
use keel_protocol::{Error, Result};

/// How long a server gets to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a server gets to stop once asked (it drains its sessions).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `keel serve`, killed when dropped.
pub(crate) struct ServeProcess {
    child: Child,
    /// Its process id.
    pub(crate) pid: u32,
    /// Its base URL, `http://ADDR`.
    pub(crate) base: String,
}

impl ServeProcess {
    /// Runs `server serve ARGS… --listen 127.0.0.1:0` in `dir` with a quiet
    /// log and waits until it listens.
    pub(crate) async fn start(server: &Path, dir: &Path, args: &[OsString]) -> Result<Self> {
        let mut child = Command::new(server)
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .env_remove("KEEL_MODEL")
            .env_remove("KEEL_CONFIG")
            .env_remove("KEEL_DB")
            .env_remove("KEEL_CLUSTER_KEY_FILE")
            .env("KEEL_LOG", "warn")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| Error::Config(format!("cannot start {}: {error}", server.display())))?;
        let pid = child
            .id()
            .ok_or_else(|| Error::Config("the bench server exited at once".to_owned()))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| Error::Config("the bench server has no stderr".to_owned()))?;
        let mut lines = BufReader::new(stderr).lines();
        let mut said = Vec::new();
        let address = tokio::time::timeout(START_TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(address) = line.strip_prefix("keel serve listening on ") {
                    return Some(address.to_owned());
                }
                said.push(line);
            }
            None
        })
        .await
        .ok()
        .flatten()
        .ok_or_else(|| Error::Config(format!("keel serve did not start: {}", said.join("\n"))))?;
        // The rest of its log is drained, so that the server never blocks
        // on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            child,
            pid,
            base: address,
        })
    }

    /// Its resident set, in KiB.
    pub(crate) fn resident_kib(&self) -> Result<u64> {
        status_kib(&self.pid.to_string(), "VmRSS").ok_or_else(|| {
            Error::Config(format!(
                "cannot read the server's memory (Linux /proc/{}/status, VmRSS)",
                self.pid
            ))
        })
    }

    /// The CPU time (user and system, every thread) it has used, in
    /// seconds.
    pub(crate) fn cpu_s(&self) -> Result<f64> {
        cpu_s(self.pid).ok_or_else(|| {
            Error::Config(format!(
                "cannot read the server's CPU time (Linux /proc/{}/stat)",
                self.pid
            ))
        })
    }

    /// Asks it to stop (`SIGTERM`, as a service manager does) and waits;
    /// killed if it does not stop in time.
    pub(crate) async fn stop(mut self) -> Result<()> {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let pid = Pid::from_raw(i32::try_from(self.pid).unwrap_or(i32::MAX));
        // Already gone is fine: the wait below says how it ended.
        let _ = kill(pid, Signal::SIGTERM);
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(Error::Config(format!("cannot wait for the bench server: {error}"))),
            Err(_) => {
                let _ = self.child.kill().await;
                Err(Error::Config(format!(
                    "the bench server (pid {}) did not stop within {} s of SIGTERM",
                    self.pid,
                    STOP_TIMEOUT.as_secs()
                )))
            }
        }
    }
}

/// Clock ticks per second of `/proc/PID/stat`'s times (`USER_HZ`, 100 on
/// every Linux the bench runs on).
const TICKS_PER_S: f64 = 100.0;

/// The CPU time (user and system) of process `pid` in seconds, from
/// `/proc/PID/stat`, if it can be read.
pub(crate) fn cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_cpu_s(&stat)
}

/// `utime + stime` of a `/proc/PID/stat` line, in seconds. The command
/// name (field 2) is in parentheses and may hold spaces, so the fields are
/// counted from the last `)`.
fn stat_cpu_s(stat: &str) -> Option<f64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    // After the name: state (3), ppid (4), … utime (14), stime (15).
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / TICKS_PER_S)
}

/// The CPU time of every process on this machine named `name` (such as
/// `postgres`: the server and each of its backends), in seconds; `None`
/// when there is none. A process that exits in between takes its time
/// with it, so this suits long-lived processes such as pooled backends.
pub(crate) fn cpu_s_of_processes_named(name: &str) -> Option<f64> {
    let mut total = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|pid| pid.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let named = stat
            .split_once('(')
            .and_then(|(_, rest)| rest.rsplit_once(')'))
            .is_some_and(|(comm, _)| comm == name);
        if named && let Some(seconds) = stat_cpu_s(&stat) {
            *total.get_or_insert(0.0) += seconds;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_are_read_after_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 12 0 0";
        assert_eq!(stat_cpu_s(stat), Some(3.0));
        assert_eq!(stat_cpu_s("4242 (short) S 1"), None);
    }

    #[test]
    fn this_process_uses_cpu_and_is_found_by_its_name() {
        let own = cpu_s(std::process::id()).expect("this process's /proc/PID/stat");
        assert!(own >= 0.0);
        let comm = std::fs::read_to_string("/proc/self/comm").expect("/proc/self/comm");
        assert!(cpu_s_of_processes_named(comm.trim()).is_some());
        assert!(cpu_s_of_processes_named("no process is named this").is_none());
    }
}
