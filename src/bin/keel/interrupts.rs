//! Ctrl-C outside the line editor: one SIGINT listener for a whole command
//! (`keel chat`, `keel run`), so a signal that arrives while no one is
//! waiting for it is not lost (a fresh `ctrl_c()` per wait would miss it).

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
