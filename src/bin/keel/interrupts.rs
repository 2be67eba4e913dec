//! Ctrl-C outside the line editor: one SIGINT listener for a whole command
//! (`keel chat`, `keel run`), so a signal that arrives while no one is
//! waiting for it is not lost (a fresh `ctrl_c()` per wait would miss it).
//! SIGTERM and SIGHUP have a listener of their own, [`Terminations`]: they
//! interrupt like Ctrl-C but then end the command, and the line editor,
//! which sees Ctrl-C as a key, must not swallow them.

use anyhow::Context;
use futures::FutureExt;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// The command's SIGINT listener.
pub(crate) struct Interrupts(Signal);

impl Interrupts {
    /// Starts listening; from here on SIGINT no longer ends the process.
    pub(crate) fn listen() -> anyhow::Result<Self> {
        let listener = signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?;
        Ok(Self(listener))
    }

    /// Waits for the next Ctrl-C (or one that came since the last wait).
    pub(crate) async fn next(&mut self) {
        if self.0.recv().await.is_none() {
            // The signal driver is gone: no Ctrl-C will come.
            std::future::pending::<()>().await;
        }
    }

    /// Drops a Ctrl-C that came while nothing ran (between the end of a turn
    /// and the next prompt), so it does not interrupt the next turn.
    pub(crate) fn forget(&mut self) {
        while let Some(Some(())) = self.0.recv().now_or_never() {}
    }
}

/// The command's SIGTERM and SIGHUP listener (a systemd stop, a closed
/// terminal): treated like Ctrl-C, the running turn interrupted, but then
/// the command ends, closing its session and stopping its MCP servers,
/// instead of the process dying on the spot.
pub(crate) struct Terminations {
    terminate: Signal,
    hangup: Signal,
    /// The exit code of the first signal received (128 + its number).
    received: Option<u8>,
}

impl Terminations {
    /// Starts listening; from here on SIGTERM and SIGHUP no longer end the
    /// process.
    pub(crate) fn listen() -> anyhow::Result<Self> {
        Ok(Self {
            terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
            hangup: signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?,
            received: None,
        })
    }

    /// Waits for the next SIGTERM or SIGHUP; returns the exit code it calls
    /// for (143 or 129).
    pub(crate) async fn next(&mut self) -> u8 {
        let code = tokio::select! {
            Some(()) = self.terminate.recv() => 128 + 15,
            Some(()) = self.hangup.recv() => 128 + 1,
            else => std::future::pending::<u8>().await,
        };
        self.received.get_or_insert(code);
        code
    }

    /// The exit code of the first signal received, if one was.
    pub(crate) fn received(&self) -> Option<u8> {
        self.received
    }
}
