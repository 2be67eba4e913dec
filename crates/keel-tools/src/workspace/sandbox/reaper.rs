//! The supervisor's waiting and killing: it waits for the command without
//! a thread (a thread cannot be started once the PID namespace is
//! unshared), wakes when the command ends, when it is asked to stop
//! (`SIGTERM`, `SIGINT`, `SIGHUP`) or when Keel, its parent, is gone, and
//! kills whatever the command left behind.

use std::os::fd::AsFd;
use std::process::{Child, ExitStatus};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpid, getppid};

/// How often the supervisor checks that Keel is still its parent.
const PARENT_POLL: Duration = Duration::from_millis(100);

/// Signals that ask the supervisor to stop the command.
fn stop_signals() -> SigSet {
    let mut set = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        set.add(signal);
    }
    set
}

/// Blocks the stop signals in the calling thread, so that they are read
/// from a descriptor instead of ending the supervisor before it cleaned
/// up. Children do not inherit the mask: the standard library resets it
/// before executing a program.
pub(super) fn block_stop_signals() -> Option<SignalFd> {
    let set = stop_signals();
    set.thread_block().ok()?;
    SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).ok()
}

/// Unblocks the stop signals again (before the supervisor ends the way the
/// command ended, by raising its signal).
pub(super) fn unblock_stop_signals() {
    let _ = stop_signals().thread_unblock();
}

/// How the wait ended.
pub(super) enum Waited {
    /// The command ended by itself.
    Exited(ExitStatus),
    /// The supervisor was asked to stop, or Keel is gone: the command must
    /// be killed.
    Stop(Signal),
}

/// Waits for `child` to end, for a stop signal on `signals`, or for the
/// parent to change (Keel died and the supervisor was handed to another
/// process).
pub(super) fn wait(child: &mut Child, signals: Option<&SignalFd>) -> std::io::Result<Waited> {
    let parent = getppid();
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let pidfd = pid.and_then(|pid| rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok());
    // Without a pidfd (kernels before 5.3) the command's end is noticed by
    // polling, so the poll interval is short.
    let interval = if pidfd.is_some() {
        PARENT_POLL
    } else {
        Duration::from_millis(5)
    };
    let timeout = PollTimeout::try_from(interval).unwrap_or(PollTimeout::NONE);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Waited::Exited(status));
        }
        if let Some(signal) = signals.and_then(|signals| signals.read_signal().ok().flatten()) {
            let signal = i32::try_from(signal.ssi_signo)
                .ok()
                .and_then(|number| Signal::try_from(number).ok())
                .unwrap_or(Signal::SIGTERM);
            return Ok(Waited::Stop(signal));
        }
        if getppid() != parent {
            return Ok(Waited::Stop(Signal::SIGKILL));
        }
        let mut fds = Vec::with_capacity(2);
        if let Some(pidfd) = &pidfd {
            fds.push(PollFd::new(pidfd.as_fd(), PollFlags::POLLIN));
        }
        if let Some(signals) = signals {
            fds.push(PollFd::new(signals.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(error) => return Err(error.into()),
        }
    }
}

/// Kills every descendant of this process, which must be a subreaper (so
/// that orphans of the command, `setsid` and double forks included, are
/// its children): kills its children, reaps them, and repeats with the
/// orphans they leave, until none is left. Bounded, so a process that
/// forks faster than it is killed cannot hold the supervisor forever.
pub(super) fn kill_descendants() {
    let me = getpid();
    for _ in 0..1000 {
        reap_zombies();
        let children = children_of(me);
        if children.is_empty() {
            return;
        }
        for child in children {
            let _ = kill(child, Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Reaps every child that has ended, without waiting.
fn reap_zombies() {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// The live children of `parent`, from `/proc`.
fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read(entry.path().join("stat")).ok()?;
            (parent_in_stat(&stat)? == parent.as_raw()).then_some(Pid::from_raw(pid))
        })
        .collect()
}

/// The parent PID in a `/proc/PID/stat` line: the second field after the
/// command name, which is in parentheses and may itself hold spaces and
/// parentheses, so the line is read from the last `)`.
fn parent_in_stat(stat: &[u8]) -> Option<i32> {
    let close = stat.iter().rposition(|byte| *byte == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        // A zombie is reaped, not killed.
        return None;
    }
    fields.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_read_after_the_command_name() {
        assert_eq!(parent_in_stat(b"42 (sh) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_in_stat(b"42 (a) b) (c) R 9 1 1"), Some(9));
        assert_eq!(parent_in_stat(b"42 (gone) Z 7 1 1"), None);
        assert_eq!(parent_in_stat(b"garbage"), None);
    }
}
