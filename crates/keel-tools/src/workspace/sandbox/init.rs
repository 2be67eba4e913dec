//! PID 1 of a sandboxed command's PID namespace (the confiner, once it
//! has confined itself), and how the command's end travels back to the
//! supervisor and out of it.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitCode, ExitStatus};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, raise};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Pid, getpid};

/// How the command ended, as the confiner reports it to the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// It exited with this code.
    Code(u8),
    /// It was killed by this signal.
    Signal(Signal),
}

impl Ended {
    fn of(status: WaitStatus) -> Option<Self> {
        match status {
            WaitStatus::Exited(_, code) => Some(Self::Code(u8::try_from(code).unwrap_or(u8::MAX))),
            WaitStatus::Signaled(_, signal, _) => Some(Self::Signal(signal)),
            _ => None,
        }
    }

    fn to_text(self) -> String {
        match self {
            Self::Code(code) => format!("code {code}"),
            Self::Signal(signal) => format!("signal {}", signal as i32),
        }
    }

    pub(super) fn parse(text: &str) -> Option<Self> {
        let (kind, number) = text.trim().split_once(' ')?;
        match kind {
            "code" => number.parse().ok().map(Self::Code),
            "signal" => number
                .parse::<i32>()
                .ok()
                .and_then(|number| Signal::try_from(number).ok())
                .map(Self::Signal),
            _ => None,
        }
    }
}

/// PID 1 of the command's namespace: starts the command as its child,
/// reaps every orphan until the command ends, kills what is left, tells
/// the supervisor how the command ended and exits; the kernel then ends
/// the namespace. The command is not PID 1 itself, so that it can be
/// ended by its own signals as anywhere else.
pub(super) fn run_as_init(program: &OsString, arguments: &[OsString], report: Option<std::fs::File>) -> ExitCode {
    let child = match Command::new(program)
        .args(arguments)
        .stdin(std::process::Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            eprintln!("keel sandbox-exec: cannot run {}: {error}", program.to_string_lossy());
            return if error.kind() == std::io::ErrorKind::NotFound {
                ExitCode::from(127)
            } else {
                ExitCode::from(126)
            };
        }
    };
    let command = i32::try_from(child.id()).ok().map(Pid::from_raw);
    let ended = loop {
        match waitpid(None, None) {
            Ok(status) if status.pid() == command => break Ended::of(status),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => break None,
        }
    };
    // Only PID 1 of a PID namespace may do this: it ends every other
    // process of the namespace, and nothing outside it.
    if getpid().as_raw() == 1 {
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        while waitpid(None, None).is_ok() {}
    }
    let ended = ended.unwrap_or(Ended::Code(126));
    if let Some(mut report) = report {
        let _ = report.write_all(ended.to_text().as_bytes());
    }
    match ended {
        Ended::Code(code) => ExitCode::from(code),
        Ended::Signal(signal) => ExitCode::from(u8::try_from(128 + signal as i32).unwrap_or(u8::MAX)),
    }
}

/// Ends this process by `signal`: the command's, or the one that asked the
/// supervisor to stop (`SIGKILL` when it lost its parent).
pub(super) fn end_by(signal: Signal) -> ExitCode {
    let _ = raise(signal);
    ExitCode::from(u8::try_from(128 + signal as i32).unwrap_or(u8::MAX))
}

/// Ends this process the way the command ended: with its exit code, or by
/// the signal that killed it, so Keel reports what happened to the command.
pub(super) fn exit_as(status: ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX));
    }
    let signal = status.signal().unwrap_or(Signal::SIGKILL as i32);
    if let Ok(signal) = Signal::try_from(signal) {
        // Nothing here catches signals, so this ends the process as it
        // ended the command.
        let _ = raise(signal);
    }
    // The signal is ignored here (Rust ignores SIGPIPE) or does not end a
    // process: say which it was, as a shell would.
    ExitCode::from(u8::try_from(128 + signal).unwrap_or(u8::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_round_trip_as_text() {
        for ended in [Ended::Code(0), Ended::Code(143), Ended::Signal(Signal::SIGTERM)] {
            assert_eq!(Ended::parse(&ended.to_text()), Some(ended));
        }
        assert_eq!(Ended::parse(""), None);
        assert_eq!(Ended::parse("signal 999"), None);
        assert_eq!(Ended::parse("code x"), None);
    }
}
