//! The clock budgets' rolling days are counted by.

use std::time::Duration;

/// The server's clock for budgets: the system's, moved forward by an
/// offset that only tests set (`keel serve`'s hidden
/// `--test-clock-offset-secs`), so a test can see the next day's window
/// open without waiting a day.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetClock {
    offset: Duration,
}

impl BudgetClock {
    /// The system's clock moved forward by `offset` (test use only).
    pub fn ahead_by(offset: Duration) -> Self {
        Self { offset }
    }

    /// Its time, in ms since the Unix epoch.
    pub(crate) fn now_ms(&self) -> u64 {
        let offset = u64::try_from(self.offset.as_millis()).unwrap_or(u64::MAX);
        keel_protocol::now_ms().saturating_add(offset)
    }
}
